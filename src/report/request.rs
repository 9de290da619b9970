//! Signed API requests: the signature over target, method, path, timestamp and body, and the
//! checks a server makes before and after it reads the body.

use super::age_ns;
use super::{Key, Mac32, Verifiers, decode_mac};

/// Domain separators keep a signature made for one purpose from being valid for another.
const REQUEST_DOMAIN: &[u8] = b"maintd-request-v1\n";

/// Header names of a signed HTTP request.
pub const TIMESTAMP_HEADER: &str = "x-maintd-timestamp";
pub const SIGNATURE_HEADER: &str = "x-maintd-signature";

impl Key {
    /// Signature of an HTTP request: the server it is meant for (a node's name, or
    /// [`DAEMON_TARGET`]), method, path, timestamp and body. Binding the target keeps a request
    /// captured on its way to one node from being valid at another.
    pub fn sign_request(
        &self,
        target: &str,
        method: &str,
        path: &str,
        timestamp_ns: i64,
        body: &[u8],
    ) -> String {
        let head = request_head(target, method, path, timestamp_ns);
        self.sign(REQUEST_DOMAIN, &[head.as_bytes(), body])
    }

    pub fn verify_request(
        &self,
        target: &str,
        method: &str,
        path: &str,
        timestamp_ns: i64,
        body: &[u8],
        sig_hex: &str,
    ) -> bool {
        decode_mac(sig_hex).is_some_and(|sig| {
            self.verify_request_mac(target, method, path, timestamp_ns, body, &sig)
        })
    }

    /// [`Key::verify_request`] of a signature already decoded.
    pub fn verify_request_mac(
        &self,
        target: &str,
        method: &str,
        path: &str,
        timestamp_ns: i64,
        body: &[u8],
        sig: &Mac32,
    ) -> bool {
        let head = request_head(target, method, path, timestamp_ns);
        self.verify_mac(REQUEST_DOMAIN, &[head.as_bytes(), body], sig)
    }
}

/// The target name under which the daemon's API verifies signed requests.
pub const DAEMON_TARGET: &str = "maintd-daemon";

/// Lengths first, so no choice of fields can shift bytes from one field into the next.
fn request_head(target: &str, method: &str, path: &str, timestamp_ns: i64) -> String {
    format!(
        "{}:{target}\n{}:{method}\n{}:{path}\n{timestamp_ns}\n",
        target.len(),
        method.len(),
        path.len()
    )
}

/// The parts of an HTTP request that its signature covers.
pub struct SignedRequest<'a> {
    /// Who verifies: this node's name, or [`DAEMON_TARGET`].
    pub target: &'a str,
    pub method: &'a str,
    /// Path and query, exactly as sent.
    pub path: &'a str,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
    pub body: &'a [u8],
}

/// Why a signed request is refused; the message is what the client is told.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("request must be signed: send {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers")]
    Unsigned,
    #[error("{SIGNATURE_HEADER} must be exactly 64 lower-case hex digits (HMAC-SHA256)")]
    SignatureFormat,
    #[error(
        "{TIMESTAMP_HEADER} must be an integer of nanoseconds, written plainly (no sign, no leading zeros)"
    )]
    TimestampFormat,
    #[error("request timestamp is {:.1} s away from now (window {window_s} s)", *age_ns as f64 / 1e9)]
    Stale { age_ns: u64, window_s: u64 },
    #[error("request signature does not verify under the cluster key for {target:?}")]
    Forged { target: String },
}

/// Checks what can be checked of a signed request before its body is read: both headers are
/// there, each in its one encoding (the signature exactly 64 lower-case hex digits, the
/// timestamp a plain integer), and the timestamp is within the window. Returns the timestamp and
/// the decoded signature.
pub fn check_request_headers(
    timestamp: Option<&str>,
    signature: Option<&str>,
    now_ns: i64,
    window_s: u64,
) -> Result<(i64, Mac32), RequestError> {
    let (ts, sig) = decode_headers(timestamp, signature)?;
    let age_ns = age_ns(now_ns, ts);
    if age_ns > window_s.saturating_mul(1_000_000_000) {
        return Err(RequestError::Stale { age_ns, window_s });
    }
    Ok((ts, sig))
}

/// Both headers, in their one encoding each.
fn decode_headers(
    timestamp: Option<&str>,
    signature: Option<&str>,
) -> Result<(i64, Mac32), RequestError> {
    let (Some(ts), Some(sig)) = (timestamp, signature) else {
        return Err(RequestError::Unsigned);
    };
    let sig = decode_mac(sig).ok_or(RequestError::SignatureFormat)?;
    Ok((decode_timestamp(ts)?, sig))
}

/// A timestamp's one spelling: what `i64`'s `Display` writes. `+5`, `05` or `-0` name the
/// same number but are refused, so no two requests differ only in how they wrote it.
fn decode_timestamp(ts: &str) -> Result<i64, RequestError> {
    match ts.parse::<i64>() {
        Ok(v) if v.to_string() == ts => Ok(v),
        _ => Err(RequestError::TimestampFormat),
    }
}

/// Checks a signed request's headers and signature, but not its timestamp against this clock:
/// for a request whose freshness is proven otherwise (the liveness probe echoes a beat of this
/// node, timed on its own clock). Returns the timestamp, as the sender's clock read it, and the
/// decoded signature.
pub fn check_signature_only(
    keys: &(impl Verifiers + ?Sized),
    req: &SignedRequest,
) -> Result<(i64, Mac32), RequestError> {
    let (ts, sig) = decode_headers(req.timestamp, req.signature)?;
    if !keys.any_key(&mut |k| {
        k.verify_request_mac(req.target, req.method, req.path, ts, req.body, &sig)
    }) {
        return Err(RequestError::Forged {
            target: req.target.into(),
        });
    }
    Ok((ts, sig))
}

/// Checks a signed request's headers and signature.
pub fn check_signed_request(
    keys: &(impl Verifiers + ?Sized),
    req: &SignedRequest,
    now_ns: i64,
    window_s: u64,
) -> Result<(), RequestError> {
    let (ts, sig) = check_request_headers(req.timestamp, req.signature, now_ns, window_s)?;
    if !keys.any_key(&mut |k| {
        k.verify_request_mac(req.target, req.method, req.path, ts, req.body, &sig)
    }) {
        return Err(RequestError::Forged {
            target: req.target.into(),
        });
    }
    Ok(())
}
