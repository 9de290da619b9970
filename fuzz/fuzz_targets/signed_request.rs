//! Signed-request checks on arbitrary headers and bodies: never panic (timestamps at the
//! extremes included), a signature verifies only for the exact fields it was made for, and
//! only in its one spelling: any re-spelling of a genuine request's headers is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use maintd::report::{Key, SignedRequest, check_request_headers, check_signed_request};

fuzz_target!(|data: &[u8]| {
    let key = Key::from_bytes(vec![9; 32]);
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(5, '\n');
    let (ts, sig, target, path) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("/"),
    );
    let body = parts.next().unwrap_or("").as_bytes();
    let now = i64::from_le_bytes(data.iter().copied().chain([0; 8]).take(8).collect::<Vec<_>>().try_into().unwrap());
    let _ = check_request_headers(Some(ts), Some(sig), now, 60);
    let req = SignedRequest { target, method: "POST", path, timestamp: Some(ts), signature: Some(sig), body };
    if check_signed_request(&key, &req, now, 60).is_ok() {
        // Only possible with a real signature: re-signing the same fields must reproduce it.
        let t: i64 = ts.parse().unwrap();
        assert_eq!(t.to_string(), ts);
        assert_eq!(key.sign_request(target, "POST", path, t, body), sig);
    }
    if let Ok(t) = ts.parse::<i64>() {
        let good = key.sign_request(target, "POST", path, t, body);
        assert!(key.verify_request(target, "POST", path, t, body, &good));
        assert!(!key.verify_request(target, "PUT", path, t, body, &good));
        // The genuine request, its headers re-spelled as the input says: refused unless the
        // spelling is the canonical one.
        let canon_ts = t.to_string();
        let (ts2, sig2) = respell(data, &canon_ts, &good);
        let req = SignedRequest { target, method: "POST", path, timestamp: Some(&ts2), signature: Some(&sig2), body };
        if check_signed_request(&key, &req, t, 60).is_ok() {
            assert_eq!((ts2.as_str(), sig2.as_str()), (canon_ts.as_str(), good.as_str()));
        }
    }
});

/// A re-spelling of the timestamp and signature picked by the input's last bytes: a letter's
/// case flipped, zeros or spaces added, a sign written out, or nothing changed.
fn respell(data: &[u8], ts: &str, sig: &str) -> (String, String) {
    let pick = data.last().copied().unwrap_or(0);
    let at = data.iter().rev().nth(1).copied().unwrap_or(0) as usize % sig.len();
    let mut s = sig.to_string();
    let mut t = ts.to_string();
    match pick % 8 {
        0 => s = s.chars().enumerate().map(|(i, c)| if i == at { c.to_ascii_uppercase() } else { c }).collect(),
        1 => s = format!("0{s}"),
        2 => s = format!("{s} "),
        3 => s.insert(at, ' '),
        4 => t = format!("0{t}"),
        5 => t = format!("+{t}"),
        6 => s = s.to_uppercase(),
        _ => {}
    }
    (t, s)
}
