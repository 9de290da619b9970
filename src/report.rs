//! The wire protocol: the signed report envelope, HMAC keys, and signing of reports and API
//! requests. The domain's verdict types live in `verdict`; this module carries them.

use std::cmp::Ordering;
use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

use crate::verdict::{Verdict, VerdictError, canonical_json};

type HmacSha256 = Hmac<Sha256>;

/// Domain separators keep a signature made for one purpose from being valid for another.
const REPORT_DOMAIN: &[u8] = b"maintd-report-v1\n";
const REQUEST_DOMAIN: &[u8] = b"maintd-request-v1\n";

/// Header names of a signed HTTP request.
pub const TIMESTAMP_HEADER: &str = "x-maintd-timestamp";
pub const SIGNATURE_HEADER: &str = "x-maintd-signature";

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The signed data is not a valid verdict.
    #[error(transparent)]
    Verdict(#[from] VerdictError),
    #[error("report is {size} bytes, over the {cap}-byte cap")]
    TooLarge { size: usize, cap: usize },
    #[error("envelope field `{0}` is missing or has the wrong value")]
    Envelope(&'static str),
    #[error("signature does not verify under the cluster key")]
    BadSignature,
    #[error("report is signed for node {signed:?}, but was fetched from node {expected:?}")]
    WrongNode { signed: String, expected: String },
    #[error("report timestamp is {age_s:.1} s away from now (window {window_s} s)")]
    Stale { age_s: f64, window_s: u64 },
    #[error("sequence {seq} is outside 1..=2^63-1")]
    SeqRange { seq: u64 },
    #[error("sequence {seq} is not above the last accepted {last} (replay?)")]
    Replay { seq: u64, last: u64 },
}

/// The cluster HMAC key.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "key file {path} is accessible by group or others (mode {mode:o}); run chmod 600 {path}"
    )]
    Permissions { path: String, mode: u32 },
    #[error("key file {path} must hold at least 32 hex digits (16 bytes)")]
    Format { path: String },
    #[error("cannot write key file {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no random bytes: {0}")]
    Random(String),
}

impl Key {
    pub fn from_bytes(bytes: Vec<u8>) -> Key {
        Key(bytes)
    }

    /// Loads a key file, refusing one that group or others can read or write.
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let p = path.display().to_string();
        let text = crate::secret::read(path).map_err(|e| match e {
            crate::secret::SecretFileError::Read { source } => KeyError::Read {
                path: p.clone(),
                source,
            },
            crate::secret::SecretFileError::Permissions { mode } => KeyError::Permissions {
                path: p.clone(),
                mode,
            },
        })?;
        let bytes = hex::decode(text.trim()).map_err(|_| KeyError::Format { path: p.clone() })?;
        if bytes.len() < 16 {
            return Err(KeyError::Format { path: p });
        }
        Ok(Key(bytes))
    }

    /// Writes a fresh 256-bit key with mode 0600; refuses to overwrite an existing file.
    pub fn generate(path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        let write_err = |source| KeyError::Write {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_err)?;
        writeln!(f, "{}", hex::encode(bytes)).map_err(write_err)?;
        f.sync_all().map_err(write_err)
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(domain);
        for p in parts {
            mac.update(p);
        }
        mac
    }

    fn sign(&self, domain: &[u8], parts: &[&[u8]]) -> String {
        hex::encode(self.mac(domain, parts).finalize().into_bytes())
    }

    /// Constant-time comparison (hmac's `verify_slice`).
    fn verify(&self, domain: &[u8], parts: &[&[u8]], sig_hex: &str) -> bool {
        match hex::decode(sig_hex) {
            Ok(sig) => self.mac(domain, parts).verify_slice(&sig).is_ok(),
            Err(_) => false,
        }
    }

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
        let head = request_head(target, method, path, timestamp_ns);
        self.verify(REQUEST_DOMAIN, &[head.as_bytes(), body], sig_hex)
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

/// Distance between two timestamps in ns, without overflow whatever a client sent.
pub fn age_ns(now_ns: i64, ts: i64) -> u64 {
    now_ns.abs_diff(ts)
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
    #[error("{SIGNATURE_HEADER} must be 64 hex digits (HMAC-SHA256)")]
    SignatureFormat,
    #[error("{TIMESTAMP_HEADER} must be an integer of nanoseconds")]
    TimestampFormat,
    #[error("request timestamp is {:.1} s away from now (window {window_s} s)", *age_ns as f64 / 1e9)]
    Stale { age_ns: u64, window_s: u64 },
    #[error("request signature does not verify under the cluster key for {target:?}")]
    Forged { target: String },
}

/// Checks what can be checked of a signed request before its body is read: both headers are
/// there, the signature is 64 hex digits, and the timestamp is within the window. Returns the
/// timestamp.
pub fn check_request_headers(
    timestamp: Option<&str>,
    signature: Option<&str>,
    now_ns: i64,
    window_s: u64,
) -> Result<i64, RequestError> {
    let (Some(ts), Some(sig)) = (timestamp, signature) else {
        return Err(RequestError::Unsigned);
    };
    if sig.len() != 64 || !sig.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(RequestError::SignatureFormat);
    }
    let ts: i64 = ts.parse().map_err(|_| RequestError::TimestampFormat)?;
    let age_ns = age_ns(now_ns, ts);
    if age_ns > window_s.saturating_mul(1_000_000_000) {
        return Err(RequestError::Stale { age_ns, window_s });
    }
    Ok(ts)
}

/// Checks a signed request's headers and signature.
pub fn check_signed_request(
    key: &Key,
    req: &SignedRequest,
    now_ns: i64,
    window_s: u64,
) -> Result<(), RequestError> {
    let ts = check_request_headers(req.timestamp, req.signature, now_ns, window_s)?;
    let sig = req.signature.unwrap_or_default();
    if !key.verify_request(req.target, req.method, req.path, ts, req.body, sig) {
        return Err(RequestError::Forged {
            target: req.target.into(),
        });
    }
    Ok(())
}

/// Ganeti mond's report envelope, extended with what makes it verifiable: the node it is for, a
/// per-collector sequence number and an HMAC over everything else.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope {
    pub name: String,
    pub version: String,
    pub format_version: u32,
    /// When the report was signed and served, in ns since the epoch.
    pub timestamp: i64,
    pub category: String,
    pub kind: u32,
    pub node: String,
    pub seq: u64,
    /// When the diagnose that produced `data` finished, in ns since the epoch.
    #[serde(rename = "diagnosed-at")]
    pub diagnosed_at: i64,
    /// Set when the diagnose failed; `data` is then an Ok verdict with the reason in details.
    #[serde(rename = "diagnose-error")]
    pub diagnose_error: Option<String>,
    pub data: Value,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

/// Largest sequence number a report may carry: the store keeps sequences as SQLite integers.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// Freshness and size rules the daemon applies to every report.
#[derive(Debug, Clone, Copy)]
pub struct VerifyRules {
    pub window_s: u64,
    pub max_bytes: usize,
}

/// A report that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedReport {
    pub envelope: Envelope,
    pub verdict: Verdict,
}

impl Envelope {
    pub fn new(
        node: &str,
        seq: u64,
        timestamp: i64,
        diagnosed_at: i64,
        verdict: &Verdict,
        error: Option<String>,
    ) -> Envelope {
        Envelope {
            name: "diagnose".into(),
            version: "B".into(),
            format_version: 1,
            timestamp,
            category: "node".into(),
            kind: 1,
            node: node.into(),
            seq,
            diagnosed_at,
            diagnose_error: error,
            data: verdict.original.clone(),
            signature: String::new(),
        }
    }

    fn signing_bytes(&self) -> String {
        let mut v = serde_json::to_value(self).expect("envelope serializes");
        if let Value::Object(m) = &mut v {
            m.remove("signature");
        }
        canonical_json(&v)
    }

    pub fn sign(mut self, key: &Key) -> Envelope {
        self.signature.clear();
        self.signature = key.sign(REPORT_DOMAIN, &[self.signing_bytes().as_bytes()]);
        self
    }

    /// Verifies a raw report body fetched from `expected_node`. `last_seq` is the highest sequence
    /// accepted so far from that node.
    pub fn verify(
        body: &[u8],
        key: &Key,
        expected_node: &str,
        last_seq: Option<u64>,
        now_ns: i64,
        rules: VerifyRules,
    ) -> Result<VerifiedReport, ReportError> {
        if body.len() > rules.max_bytes {
            return Err(ReportError::TooLarge {
                size: body.len(),
                cap: rules.max_bytes,
            });
        }
        let env: Envelope = serde_json::from_slice(body).map_err(ReportError::Json)?;
        if env.name != "diagnose" {
            return Err(ReportError::Envelope("name"));
        }
        if env.format_version != 1 {
            return Err(ReportError::Envelope("format_version"));
        }
        if env.signature.is_empty() {
            return Err(ReportError::Envelope("signature"));
        }
        if !key.verify(
            REPORT_DOMAIN,
            &[env.signing_bytes().as_bytes()],
            &env.signature,
        ) {
            return Err(ReportError::BadSignature);
        }
        if env.node != expected_node {
            return Err(ReportError::WrongNode {
                signed: env.node,
                expected: expected_node.into(),
            });
        }
        let age = age_ns(now_ns, env.timestamp);
        if age > rules.window_s.saturating_mul(1_000_000_000) {
            return Err(ReportError::Stale {
                age_s: age as f64 / 1e9,
                window_s: rules.window_s,
            });
        }
        if env.seq == 0 || env.seq > MAX_SEQ {
            return Err(ReportError::SeqRange { seq: env.seq });
        }
        if let Some(last) = last_seq
            && env.seq.cmp(&last) != Ordering::Greater
        {
            return Err(ReportError::Replay { seq: env.seq, last });
        }
        let verdict = Verdict::from_value(env.data.clone())?;
        Ok(VerifiedReport {
            envelope: env,
            verdict,
        })
    }
}

/// Wall-clock time in ns since the epoch. Only executors and servers call this; the core gets `now`.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Status;
    use std::os::unix::fs::PermissionsExt;

    fn key() -> Key {
        Key::from_bytes(vec![7; 32])
    }
    const RULES: VerifyRules = VerifyRules {
        window_s: 30,
        max_bytes: 65536,
    };

    fn signed(node: &str, seq: u64, ts: i64) -> Vec<u8> {
        let v = Verdict::parse_bytes(br#"{"status":"evacuate","details":{"disk":"sda"}}"#).unwrap();
        serde_json::to_vec(&Envelope::new(node, seq, ts, ts, &v, None).sign(&key())).unwrap()
    }

    #[test]
    fn a_signed_report_verifies_and_tampering_is_caught() {
        let body = signed("n1", 5, 1_000);
        let r = Envelope::verify(&body, &key(), "n1", Some(4), 2_000, RULES).unwrap();
        assert_eq!(r.verdict.status, Status::Evacuate);

        let tampered = String::from_utf8(body.clone())
            .unwrap()
            .replace("sda", "sdb");
        let err = Envelope::verify(tampered.as_bytes(), &key(), "n1", None, 2_000, RULES);
        assert!(matches!(err, Err(ReportError::BadSignature)));

        let other = Key::from_bytes(vec![8; 32]);
        assert!(matches!(
            Envelope::verify(&body, &other, "n1", None, 2_000, RULES),
            Err(ReportError::BadSignature)
        ));
        assert!(matches!(
            Envelope::verify(&body, &key(), "n2", None, 2_000, RULES),
            Err(ReportError::WrongNode { .. })
        ));
        assert!(matches!(
            Envelope::verify(&body, &key(), "n1", Some(5), 2_000, RULES),
            Err(ReportError::Replay { .. })
        ));
        assert!(matches!(
            Envelope::verify(&body, &key(), "n1", None, 31_000_000_001, RULES),
            Err(ReportError::Stale { .. })
        ));
        let small = VerifyRules {
            window_s: 30,
            max_bytes: 10,
        };
        assert!(matches!(
            Envelope::verify(&body, &key(), "n1", None, 2_000, small),
            Err(ReportError::TooLarge { .. })
        ));
    }

    #[test]
    fn request_signatures_bind_target_method_path_time_and_body() {
        let k = key();
        let sig = k.sign_request("n1", "POST", "/1/events/x/cancel", 10, b"{}");
        assert!(k.verify_request("n1", "POST", "/1/events/x/cancel", 10, b"{}", &sig));
        assert!(!k.verify_request("n2", "POST", "/1/events/x/cancel", 10, b"{}", &sig));
        assert!(!k.verify_request("n1", "POST", "/1/events/y/cancel", 10, b"{}", &sig));
        assert!(!k.verify_request("n1", "POST", "/1/events/x/cancel", 11, b"{}", &sig));
        assert!(!k.verify_request("n1", "POST", "/1/events/x/cancel", 10, b"{1}", &sig));
        // Field boundaries cannot be shifted: "n1\nPOST" as a target is another head.
        let shifted = k.sign_request("n", "1\nPOST", "/p", 10, b"");
        assert!(!k.verify_request("n1", "POST", "/p", 10, b"", &shifted));
        let now = 10 + 5_000_000_000;
        let good = k.sign_request("n1", "POST", "/p", 10, b"");
        let req = |ts, sig| SignedRequest {
            target: "n1",
            method: "POST",
            path: "/p",
            timestamp: ts,
            signature: sig,
            body: b"",
        };
        assert!(check_signed_request(&k, &req(Some("10"), Some(&good)), now, 30).is_ok());
        assert!(check_signed_request(&k, &req(None, None), now, 30).is_err());
        assert!(
            check_signed_request(&k, &req(Some("10"), Some(&good)), now, 1)
                .unwrap_err()
                .to_string()
                .contains("away from now")
        );
        assert!(
            check_signed_request(&k, &req(Some("10"), Some("00")), now, 30)
                .unwrap_err()
                .to_string()
                .contains("64 hex digits")
        );
        let zeros = "0".repeat(64);
        assert!(
            check_signed_request(&k, &req(Some("10"), Some(&zeros)), now, 30)
                .unwrap_err()
                .to_string()
                .contains("does not verify")
        );
    }

    #[test]
    fn extreme_timestamps_are_refused_without_overflow() {
        let k = key();
        let zeros = "0".repeat(64);
        for (ts, now) in [
            (i64::MIN, i64::MAX),
            (i64::MAX, i64::MIN),
            (i64::MIN, 0),
            (i64::MAX, 1),
        ] {
            let t = ts.to_string();
            let e = check_request_headers(Some(&t), Some(&zeros), now, 60)
                .unwrap_err()
                .to_string();
            assert!(e.contains("away from now"), "{e}");
            let v = Verdict::builtin_ok();
            let body =
                serde_json::to_vec(&Envelope::new("n1", 1, ts, ts, &v, None).sign(&k)).unwrap();
            assert!(matches!(
                Envelope::verify(&body, &k, "n1", None, now, RULES),
                Err(ReportError::Stale { .. })
            ));
        }
        assert_eq!(age_ns(i64::MAX, i64::MIN), u64::MAX);
    }

    #[test]
    fn sequences_beyond_the_store_range_are_refused() {
        for seq in [0, MAX_SEQ + 1, u64::MAX] {
            let body = signed("n1", seq, 1_000);
            assert!(matches!(
                Envelope::verify(&body, &key(), "n1", None, 2_000, RULES),
                Err(ReportError::SeqRange { .. })
            ));
        }
        let body = signed("n1", MAX_SEQ, 1_000);
        assert!(Envelope::verify(&body, &key(), "n1", None, 2_000, RULES).is_ok());
    }

    #[test]
    fn key_file_permissions_are_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        Key::generate(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        Key::load(&p).unwrap();
        assert!(Key::generate(&p).is_err(), "must not overwrite");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(Key::load(&p).unwrap_err().to_string().contains("chmod 600"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Any JSON a diagnose may print: every float, integers beyond 64 bits, odd strings.
        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                    .prop_map(Value::from),
                "[1-9][0-9]{19,29}".prop_map(|d| serde_json::from_str(&d).unwrap()),
                "\\PC{0,12}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        #[test]
        fn the_reported_seventeen_digit_ratio_verifies() {
            let v = Verdict::parse_bytes(
                br#"{"status":"evacuate","details":{"fs-used-ratio":0.92665207135085950}}"#,
            )
            .unwrap();
            let body =
                serde_json::to_vec(&Envelope::new("n1", 1, 1_000, 1_000, &v, None).sign(&key()))
                    .unwrap();
            Envelope::verify(&body, &key(), "n1", None, 2_000, RULES).unwrap();
        }

        proptest! {
            /// Numbers as a script prints them (17 significant digits, exponents, integers past
            /// 64 bits), parsed by the collector: the report still verifies at the daemon.
            #[test]
            fn printed_numbers_verify(
                digits in "[0-9]{17}", exp in -30i32..30, int in "[1-9][0-9]{18,40}",
            ) {
                let text = format!(
                    r#"{{"status":"evacuate","details":{{"r":0.{digits},"e":1.{digits}e{exp},"i":{int},"n":-{int}}}}}"#
                );
                let v = Verdict::parse_bytes(text.as_bytes()).unwrap();
                let body = serde_json::to_vec(&Envelope::new("n1", 1, 1_000, 1_000, &v, None).sign(&key())).unwrap();
                let r = Envelope::verify(&body, &key(), "n1", None, 2_000, RULES);
                prop_assert!(r.is_ok(), "{}: {:?}", text, r.err());
            }

            /// Whatever the details hold, a genuine report verifies: what the collector signs
            /// is what the daemon recomputes from the bytes it receives.
            #[test]
            fn every_genuine_report_verifies(details in json(), seq in 1..=MAX_SEQ) {
                let v = Verdict::from_value(serde_json::json!({"status": "evacuate", "details": details})).unwrap();
                let body = serde_json::to_vec(&Envelope::new("n1", seq, 1_000, 1_000, &v, None).sign(&key())).unwrap();
                let r = Envelope::verify(&body, &key(), "n1", None, 2_000, VerifyRules { window_s: 30, max_bytes: usize::MAX });
                prop_assert!(r.is_ok(), "{:?}", r.err());
                prop_assert_eq!(r.unwrap().verdict.canonical(), v.canonical());
            }

            /// Flipping any byte of a signed report never yields a different accepted report.
            #[test]
            fn a_changed_report_never_verifies_as_another(details in json(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
                let v = Verdict::from_value(serde_json::json!({"status": "evacuate", "details": details})).unwrap();
                let mut body = serde_json::to_vec(&Envelope::new("n1", 7, 1_000, 1_000, &v, None).sign(&key())).unwrap();
                let i = at.index(body.len());
                body[i] ^= 1 << bit;
                if let Ok(r) = Envelope::verify(&body, &key(), "n1", None, 2_000, RULES) {
                    // Only a change that re-serializes to the same signed content may pass
                    // (e.g. whitespace-equivalent bytes); the content is then the original.
                    prop_assert_eq!(r.verdict.canonical(), v.canonical());
                    prop_assert_eq!(r.envelope.seq, 7);
                }
            }

            /// A request signature binds every field; nothing panics on hostile headers.
            #[test]
            fn request_signatures_bind_every_field(
                target in "\\PC{0,10}", method in "[A-Z]{1,7}", path in "/\\PC{0,20}",
                ts in any::<i64>(), body in prop::collection::vec(any::<u8>(), 0..64),
                other in "\\PC{0,10}",
            ) {
                let k = key();
                let sig = k.sign_request(&target, &method, &path, ts, &body);
                prop_assert!(k.verify_request(&target, &method, &path, ts, &body, &sig));
                if other != target {
                    prop_assert!(!k.verify_request(&other, &method, &path, ts, &body, &sig));
                }
                prop_assert!(!k.verify_request(&target, &method, &path, ts.wrapping_add(1), &body, &sig));
                let mut b2 = body.clone();
                b2.push(0);
                prop_assert!(!k.verify_request(&target, &method, &path, ts, &b2, &sig));
            }

            #[test]
            fn request_header_checks_never_panic(ts in "\\PC{0,24}", sig in "\\PC{0,70}", now in any::<i64>(), window in any::<u64>()) {
                let _ = check_request_headers(Some(&ts), Some(&sig), now, window);
            }

            #[test]
            fn report_verification_never_panics(body in prop::collection::vec(any::<u8>(), 0..512), now in any::<i64>(), last in any::<Option<u64>>()) {
                let _ = Envelope::verify(&body, &key(), "n1", last, now, RULES);
            }
        }
    }
}
