//! Signed-request checks on arbitrary headers and bodies: never panic (timestamps at the
//! extremes included), and a signature verifies only for the exact fields it was made for.
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
        assert_eq!(key.sign_request(target, "POST", path, t, body), sig.to_ascii_lowercase());
    }
    if let Ok(t) = ts.parse::<i64>() {
        let good = key.sign_request(target, "POST", path, t, body);
        assert!(key.verify_request(target, "POST", path, t, body, &good));
        assert!(!key.verify_request(target, "PUT", path, t, body, &good));
    }
});
