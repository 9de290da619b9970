//! The report poll over UDP: one signed datagram asks a collector for its report, one datagram
//! brings the signed report back (or says it does not fit, and the poll goes over HTTP).
//!
//! A poll over TCP costs each side a system call per segment and, beyond the kept connections, a
//! handshake per cycle; a datagram each way costs one call each and one socket for the whole
//! fleet. The request is signed so that nobody but the daemon can make a collector send its
//! report (a forged or replayed request would turn collectors into amplifiers toward a spoofed
//! address); the answer needs no signature of its own, since the report inside is verified as
//! one fetched over HTTP. Its nonce only pairs it with the request that is waiting.

use super::Key;

/// Domain separator of a poll request's signature.
const POLL_DOMAIN: &[u8] = b"maintd-poll-v1\n";
const REQUEST: &[u8; 4] = b"MDP1";
const REPORT: &[u8; 4] = b"MDR1";
const ASK_HTTP: &[u8; 4] = b"MDH1";
/// Magic, nonce, timestamp, name length, name (up to 255 bytes), hex signature.
pub const MAX_REQUEST: usize = 4 + 8 + 8 + 1 + 255 + 64;
/// The largest report sent in one datagram: with the headers it stays within an Ethernet
/// frame, so no report travels in IP fragments (which a lossy path loses more often).
pub const MAX_REPORT: usize = 1400;

/// Nonces nobody off the path can guess, never 0 (a report that answers nothing): a counter
/// under a hash keyed from the system's randomness once per process (a system call for fresh
/// randomness per poll would cost more than the rest of the request).
#[derive(Default)]
pub struct Nonces {
    next: std::sync::atomic::AtomicU64,
    key: std::hash::RandomState,
}

impl Nonces {
    pub fn next(&self) -> u64 {
        use std::hash::BuildHasher;
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.key.hash_one(n).max(1)
    }
}

/// Why a poll request is refused (each is counted; none is answered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    #[error("not a poll request")]
    Shape,
    #[error("poll request for node {0:?}")]
    WrongNode(String),
    #[error("poll request signature does not verify")]
    Signature,
    #[error("poll request seen before")]
    Replay,
    #[error("more poll requests than a daemon and its standbys send")]
    Rate,
}

fn signed_parts(nonce: u64, ts: i64, node: &str) -> [Vec<u8>; 3] {
    [
        nonce.to_be_bytes().to_vec(),
        ts.to_be_bytes().to_vec(),
        node.as_bytes().to_vec(),
    ]
}

/// Whether datagram `d` claims to be a poll request (the heartbeat socket carries both).
pub fn is_request(d: &[u8]) -> bool {
    d.starts_with(REQUEST)
}

/// The datagram that asks `node` for its report.
pub fn request(key: &Key, node: &str, nonce: u64, ts: i64) -> Vec<u8> {
    let name = &node.as_bytes()[..node.len().min(255)];
    let parts = signed_parts(nonce, ts, node);
    let sig = key.sign(POLL_DOMAIN, &[&parts[0], &parts[1], &parts[2]]);
    let mut out = Vec::with_capacity(21 + name.len() + sig.len());
    out.extend_from_slice(REQUEST);
    out.extend_from_slice(&nonce.to_be_bytes());
    out.extend_from_slice(&ts.to_be_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(sig.as_bytes());
    out
}

/// A verified poll request: its nonce, to echo, and the daemon's timestamp (signed, shown, never
/// compared with this clock: the report answering the nonce is what proves it fresh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    pub nonce: u64,
    pub ts: i64,
}

/// Checks a datagram addressed to the collector of `me`: its shape, its signature and its node.
/// The replay check is the caller's: it holds the nonces seen lately, on its own clock.
pub fn verify_request(
    keys: &(impl super::Verifiers + ?Sized),
    me: &str,
    d: &[u8],
) -> Result<Asked, PollError> {
    if d.len() < 21 || d.len() > MAX_REQUEST || &d[..4] != REQUEST {
        return Err(PollError::Shape);
    }
    let nonce = u64::from_be_bytes(d[4..12].try_into().expect("8 bytes"));
    let ts = i64::from_be_bytes(d[12..20].try_into().expect("8 bytes"));
    let len = d[20] as usize;
    if d.len() != 21 + len + 64 {
        return Err(PollError::Shape);
    }
    let name = std::str::from_utf8(&d[21..21 + len]).map_err(|_| PollError::Shape)?;
    let sig = &d[21 + len..];
    // Lowercase only, as signed: one request has one encoding.
    if !sig.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(PollError::Shape);
    }
    let sig = std::str::from_utf8(sig).map_err(|_| PollError::Shape)?;
    let parts = signed_parts(nonce, ts, name);
    if !keys.any_key(&mut |k| k.verify(POLL_DOMAIN, &[&parts[0], &parts[1], &parts[2]], sig)) {
        return Err(PollError::Signature);
    }
    if name != me {
        return Err(PollError::WrongNode(name.into()));
    }
    Ok(Asked { nonce, ts })
}

/// The answer to a request with `nonce`: the signed report's JSON if there is one and it fits
/// in one datagram, else a note to ask over HTTP (which says why there is no report yet, or
/// carries one too large for a datagram).
pub fn answer(nonce: u64, report: Option<&[u8]>) -> Vec<u8> {
    let report = report.unwrap_or_default();
    let fits = !report.is_empty() && report.len() <= MAX_REPORT;
    let mut out = Vec::with_capacity(12 + if fits { report.len() } else { 0 });
    out.extend_from_slice(if fits { REPORT } else { ASK_HTTP });
    out.extend_from_slice(&nonce.to_be_bytes());
    if fits {
        out.extend_from_slice(report);
    }
    out
}

/// What a collector's answer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer<'a> {
    /// The signed report's JSON, still to be verified.
    Report(&'a [u8]),
    /// Ask over HTTP: no report yet, or one that does not fit in a datagram.
    AskHttp,
}

/// Reads an answer datagram: its nonce and what it says, or `None` if it is not one.
pub fn read_answer(d: &[u8]) -> Option<(u64, Answer<'_>)> {
    if d.len() < 12 {
        return None;
    }
    let nonce = u64::from_be_bytes(d[4..12].try_into().expect("8 bytes"));
    match &d[..4] {
        m if m == REPORT => Some((nonce, Answer::Report(&d[12..]))),
        m if m == ASK_HTTP && d.len() == 12 => Some((nonce, Answer::AskHttp)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn key() -> Key {
        Key::from_bytes(vec![7; 32])
    }

    #[test]
    fn a_request_verifies_for_its_node_whatever_its_timestamp() {
        for ts in [100 * S, i64::MIN, i64::MAX] {
            let d = request(&key(), "n1", 42, ts);
            assert_eq!(
                verify_request(&key(), "n1", &d),
                Ok(Asked { nonce: 42, ts })
            );
            assert_eq!(
                verify_request(&key(), "n2", &d),
                Err(PollError::WrongNode("n1".into()))
            );
        }
        let d = request(&key(), "n1", 42, 100 * S);
        let other = Key::from_bytes(vec![8; 32]);
        assert_eq!(verify_request(&other, "n1", &d), Err(PollError::Signature));
    }

    #[test]
    fn every_changed_bit_of_a_request_is_refused() {
        let d = request(&key(), "node-1", u64::MAX, -5);
        for i in 0..d.len() {
            for bit in 0..8 {
                let mut t = d.clone();
                t[i] ^= 1 << bit;
                assert!(
                    verify_request(&key(), "node-1", &t).is_err(),
                    "byte {i} bit {bit}"
                );
            }
        }
        for n in 0..d.len() {
            assert_eq!(
                verify_request(&key(), "node-1", &d[..n]),
                Err(PollError::Shape)
            );
        }
        let mut long = d.clone();
        long.push(b'0');
        assert_eq!(
            verify_request(&key(), "node-1", &long),
            Err(PollError::Shape)
        );
    }

    #[test]
    fn a_report_that_does_not_fit_or_is_not_ready_is_asked_over_http() {
        let small = br#"{"x":1}"#;
        assert_eq!(
            read_answer(&answer(9, Some(small))),
            Some((9, Answer::Report(&small[..])))
        );
        assert_eq!(read_answer(&answer(9, None)), Some((9, Answer::AskHttp)));
        let big = vec![b' '; MAX_REPORT + 1];
        let a = answer(9, Some(&big));
        assert_eq!(a.len(), 12);
        assert_eq!(read_answer(&a), Some((9, Answer::AskHttp)));
        assert_eq!(read_answer(b"MDR1"), None);
        assert_eq!(read_answer(b"XXXX12345678{}"), None);
    }
}
