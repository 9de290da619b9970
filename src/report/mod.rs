//! The wire protocol: the signed report envelope and its verification (here), the cluster key
//! (`key`), signed API requests (`request`) and peer heartbeats (`heartbeat`). The domain's
//! verdict types live in `verdict`; this module carries them.

pub mod heartbeat;
mod key;
pub mod keyring;
pub mod live;
pub mod nodekey;
pub mod operator;
pub mod peerkeys;
pub mod poll;
mod request;

pub use key::{Key, KeyError, Mac32, Verifiers, decode_mac};
pub use request::{
    DAEMON_TARGET, RequestError, SIGNATURE_HEADER, SignedRequest, TIMESTAMP_HEADER,
    check_request_headers, check_signature_only, check_signed_request,
};

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use maintd_core::verdict::{
    ExactError, ExactJson, Spans, Verdict, VerdictError, canonical_parts, canonical_spans,
    canonicalize,
};

/// Domain separators keep a signature made for one purpose from being valid for another.
const REPORT_DOMAIN: &[u8] = b"maintd-report-v1\n";

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
    #[error("signature does not verify under the node's key")]
    BadSignature,
    #[error("{0}")]
    Revoked(String),
    #[error("report is signed for node {signed:?}, but was fetched from node {expected:?}")]
    WrongNode { signed: String, expected: String },
    #[error(
        "report answers poll {answers}, not the poll {asked} just sent (delayed, replayed, or from a collector too old to answer polls)"
    )]
    Unanswered { answers: u64, asked: u64 },
    #[error("sequence {seq} is outside 1..=2^63-1")]
    SeqRange { seq: u64 },
    #[error("sequence {seq} is not above the last accepted {last} (replay?)")]
    Replay { seq: u64, last: u64 },
}

/// Distance between two timestamps in ns, without overflow whatever a client sent.
pub fn age_ns(now_ns: i64, ts: i64) -> u64 {
    now_ns.abs_diff(ts)
}

/// Ganeti mond's report envelope, extended with what makes it verifiable: the node it is for, a
/// per-collector sequence number and an HMAC over everything else.
///
/// `D` is how `data` is held: exact canonical JSON, or, while a report is verified, the raw text
/// as received (read once, with the rest).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope<D = ExactJson> {
    pub name: String,
    pub version: String,
    pub format_version: u32,
    /// When the report was signed and served, in ns since the epoch (the node's wall clock:
    /// shown, never compared with the daemon's).
    pub timestamp: i64,
    pub category: String,
    pub kind: u32,
    pub node: String,
    pub seq: u64,
    /// When the diagnose that produced `data` started, in ns since the epoch.
    #[serde(rename = "diagnosed-at")]
    pub diagnosed_at: i64,
    /// Set when the diagnose failed; `data` is then an Ok verdict with the reason in details.
    #[serde(rename = "diagnose-error")]
    pub diagnose_error: Option<String>,
    /// The diagnose's JSON as it printed it (canonical, numbers as written).
    pub data: D,
    /// The node's armed watchdog, signed with the rest: the proof the master needs before it
    /// counts a silent node as reset, once its reset is proven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<WatchdogReport>,
    /// The node's boot, signed with the rest: a fenced node returns to service only with a
    /// boot other than the one it had before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootReport>,
    /// The nonce of the poll this report answers, signed with the rest: the report is fresh
    /// because it answers the daemon's own question, whatever either clock says (0: a report
    /// served to a reader who asked nothing).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub answers: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl<D> Envelope<D> {
    fn with_data<E>(self, data: E) -> Envelope<E> {
        Envelope {
            name: self.name,
            version: self.version,
            format_version: self.format_version,
            timestamp: self.timestamp,
            category: self.category,
            kind: self.kind,
            node: self.node,
            seq: self.seq,
            diagnosed_at: self.diagnosed_at,
            diagnose_error: self.diagnose_error,
            data,
            watchdog: self.watchdog,
            boot: self.boot,
            answers: self.answers,
            signature: self.signature,
        }
    }
}

/// Where Linux keeps the id of the current boot.
pub const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Which boot a report comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BootReport {
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), new at every boot.
    pub id: uuid::Uuid,
    /// When the node booted, in ns since the epoch (its clock).
    pub at: i64,
}

/// What a collector says of its armed watchdog (in reports and peer views, signed), in ms: the
/// times the master's safe-time formula needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WatchdogReport {
    pub timeout_ms: u64,
    pub feed_interval_ms: u64,
    pub isolation_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub lost_after_ms: u64,
    /// How long a beat vouched for by a watcher that the master reaches keeps the node fed.
    #[serde(default)]
    pub master_lost_after_ms: u64,
}

/// Largest sequence number a report may carry: the store keeps sequences as SQLite integers.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// The size rule the daemon applies to every report.
#[derive(Debug, Clone, Copy)]
pub struct VerifyRules {
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
            data: verdict.exact.clone(),
            watchdog: None,
            boot: None,
            answers: 0,
            signature: String::new(),
        }
    }

    /// The same report, answering the poll numbered `nonce`.
    pub fn answering(mut self, nonce: u64) -> Envelope {
        self.answers = nonce;
        self
    }

    /// What the signature covers: the envelope's canonical JSON without the signature, its
    /// numbers as written (a signed report's details are exact, not a float's reading of them).
    fn signing_bytes(body: &[u8]) -> Result<String, ReportError> {
        canonicalize(body, &["signature"]).map_err(|e| ReportError::Verdict(VerdictError::Json(e)))
    }

    pub fn sign(mut self, key: &Key) -> Envelope {
        self.signature.clear();
        let body = serde_json::to_vec(&self).expect("envelope serializes");
        // Only data nested to the very limit fails here (the envelope adds a level); its
        // signature then covers nothing and the daemon refuses the report, as the collector's
        // own check of every verdict finds before serving it.
        let bytes = Envelope::signing_bytes(&body).unwrap_or_default();
        self.signature = key.sign(REPORT_DOMAIN, &[bytes.as_bytes()]);
        self
    }

    /// The report as served: canonical JSON, its signature included, which the daemon checks
    /// as it stands instead of bringing it to canonical form first.
    pub fn to_wire(&self) -> Vec<u8> {
        let body = serde_json::to_vec(self).expect("envelope serializes");
        // Fails only where signing did (data nested to the very limit): served as it is, and
        // refused by the daemon either way.
        canonicalize(&body, &[])
            .map(String::into_bytes)
            .unwrap_or(body)
    }

    /// Verifies a raw report body fetched from `expected_node` in answer to the poll numbered
    /// `asked`. `last_seq` is the highest sequence accepted so far from that node.
    pub fn verify(
        body: &[u8],
        keys: &(impl Verifiers + ?Sized),
        expected_node: &str,
        last_seq: Option<u64>,
        asked: u64,
        rules: VerifyRules,
    ) -> Result<VerifiedReport, ReportError> {
        if body.len() > rules.max_bytes {
            return Err(ReportError::TooLarge {
                size: body.len(),
                cap: rules.max_bytes,
            });
        }
        // Read once: the fields, then one canonical pass over the text for both the signed bytes
        // and the data (serde_json has judged the grammar by then).
        let env: Envelope<&serde_json::value::RawValue> =
            serde_json::from_slice(body).map_err(ReportError::Json)?;
        if env.name != "diagnose" {
            return Err(ReportError::Envelope("name"));
        }
        if env.format_version != 1 {
            return Err(ReportError::Envelope("format_version"));
        }
        if env.signature.is_empty() {
            return Err(ReportError::Envelope("signature"));
        }
        // The body as received is what was signed: a field this version does not know still
        // counts, so nothing can be added to a signed report on the way.
        let text = std::str::from_utf8(body).map_err(|e| {
            ReportError::Verdict(VerdictError::Json(ExactError::Utf8(e.valid_up_to())))
        })?;
        // A report served in canonical form (as this version's collectors serve it) is checked
        // as it stands: the signed bytes are its text less the signature. Any other form is
        // brought to canonical form first. The signature covers the two pieces' concatenation.
        let canonical;
        let (signed, data) = match canonical_spans(text, "signature", "data") {
            Some(Spans { without, part }) => {
                let data = part.map(|p| ExactJson::assume_canonical(p.to_owned()));
                (without, data)
            }
            None => {
                let data;
                (canonical, data) = canonical_parts(text, "signature", "data")
                    .map_err(|e| ReportError::Verdict(VerdictError::Json(e)))?;
                ([canonical.as_str(), ""], data)
            }
        };
        let data = data.ok_or(ReportError::Envelope("data"))?;
        let env = env.with_data(data);
        let [before, after] = signed.map(str::as_bytes);
        if !keys.any_key(&mut |k| k.verify(REPORT_DOMAIN, &[before, after], &env.signature)) {
            return Err(ReportError::BadSignature);
        }
        if env.node != expected_node {
            return Err(ReportError::WrongNode {
                signed: env.node,
                expected: expected_node.into(),
            });
        }
        // Fresh because it answers the poll just sent: signed after the question was asked.
        if env.answers != asked {
            return Err(ReportError::Unanswered {
                answers: env.answers,
                asked,
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
        let verdict = Verdict::from_exact(env.data.clone())?;
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
mod tests;
