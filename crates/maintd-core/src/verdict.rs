//! The domain's shared vocabulary: a node's self-diagnose `Status` (ordered by invasiveness), the
//! validated `Verdict` with the canonical JSON that is an event's identity, an effect's `Outcome` and
//! `Nanos`. The pure decisions work on these; how they travel (envelopes, signatures) is `report`'s business.

mod exact;
mod outcome;
#[cfg(any(test, feature = "testing"))]
pub mod strategies;

pub use exact::{ExactError, ExactJson, Spans, canonical_parts, canonical_spans, canonicalize};
pub use outcome::{FailureKind, Outcome};

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why diagnose output is not a verdict.
#[derive(Debug, thiserror::Error)]
pub enum VerdictError {
    #[error("not valid JSON: {0}")]
    Json(#[source] ExactError),
    #[error("diagnose output must be a JSON object")]
    NotAnObject,
    #[error("missing field `{0}`")]
    Missing(&'static str),
    #[error("unknown field `{0}`")]
    UnknownField(String),
    #[error("unknown status {0} (expected Ok, live-repair, evacuate or evacuate-failover)")]
    UnknownStatus(String),
    #[error("`command` must be a string naming a repair command")]
    BadCommand,
    #[error("`command` is only allowed with status live-repair")]
    CommandNotAllowed,
    #[error("`remedy` must name a remedy: 1 to 40 of a-z, 0-9 and '-'")]
    BadRemedy,
    #[error("`remedy` is only allowed with status live-repair, and not beside `command`")]
    RemedyNotAllowed,
}

/// How an event's command names a remedy Job rather than a collector's repair script (whose
/// names never hold a colon).
pub const REMEDY_PREFIX: &str = "remedy:";

/// A remedy's name: it becomes part of a ConfigMap's name and a label value.
pub fn valid_remedy_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The remedy a command names (`remedy:<name>`), if it names one.
pub fn remedy_of(command: &str) -> Option<&str> {
    command.strip_prefix(REMEDY_PREFIX)
}

/// The verdict of a self-diagnose, ordered by invasiveness (Ok < live-repair < evacuate < evacuate-failover).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
pub enum Status {
    #[serde(rename = "Ok")]
    #[strum(serialize = "Ok")]
    Ok,
    #[serde(rename = "live-repair")]
    #[strum(serialize = "live-repair")]
    LiveRepair,
    #[serde(rename = "evacuate")]
    #[strum(serialize = "evacuate")]
    Evacuate,
    #[serde(rename = "evacuate-failover")]
    #[strum(serialize = "evacuate-failover")]
    EvacuateFailover,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Status> {
        s.parse().ok()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated diagnose verdict. `exact` is the object as the script printed it (canonical, its
/// numbers as written); `original` is a reading of it to look fields up in.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub status: Status,
    pub command: Option<String>,
    pub original: Value,
    pub exact: ExactJson,
}

impl Verdict {
    /// The verdict a broken or missing diagnose turns into: it never triggers an action.
    pub fn ok_with_error(reason: &str) -> Verdict {
        let original = serde_json::json!({"status": "Ok", "details": {"diagnose-error": reason}});
        Verdict {
            status: Status::Ok,
            command: None,
            exact: ExactJson::from_value(&original),
            original,
        }
    }

    pub fn builtin_ok() -> Verdict {
        let original = serde_json::json!({"status": "Ok", "details": null});
        Verdict {
            status: Status::Ok,
            command: None,
            exact: ExactJson::from_value(&original),
            original,
        }
    }

    pub fn parse_bytes(bytes: &[u8]) -> Result<Verdict, VerdictError> {
        Verdict::from_exact(ExactJson::parse(bytes).map_err(VerdictError::Json)?)
    }

    /// A verdict built in memory (a node-condition rule's): its numbers are exact already.
    pub fn from_value(value: Value) -> Result<Verdict, VerdictError> {
        Verdict::from_exact(ExactJson::from_value(&value))
    }

    /// Validates a diagnose's JSON, kept exactly as it was written.
    pub fn from_exact(exact: ExactJson) -> Result<Verdict, VerdictError> {
        let value = exact.value();
        let obj = value.as_object().ok_or(VerdictError::NotAnObject)?;
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "status" | "command" | "remedy" | "details"))
        {
            return Err(VerdictError::UnknownField(k.clone()));
        }
        let status = match obj.get("status") {
            None => return Err(VerdictError::Missing("status")),
            Some(Value::String(s)) => {
                Status::parse(s).ok_or_else(|| VerdictError::UnknownStatus(format!("{s:?}")))?
            }
            Some(other) => return Err(VerdictError::UnknownStatus(other.to_string())),
        };
        let command = match obj.get("command") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if status == Status::LiveRepair => Some(s.clone()),
            Some(Value::String(_)) => return Err(VerdictError::CommandNotAllowed),
            Some(_) => return Err(VerdictError::BadCommand),
        };
        // A remedy is a Kubernetes Job the daemon runs; it travels as the event's command.
        let command = match obj.get("remedy") {
            None | Some(Value::Null) => command,
            Some(_) if status != Status::LiveRepair || command.is_some() => {
                return Err(VerdictError::RemedyNotAllowed);
            }
            Some(Value::String(r)) if valid_remedy_name(r) => Some(format!("{REMEDY_PREFIX}{r}")),
            Some(_) => return Err(VerdictError::BadRemedy),
        };
        Ok(Verdict {
            status,
            command,
            original: value,
            exact,
        })
    }

    /// The identity of an event: the same canonical JSON is the same event.
    pub fn canonical(&self) -> String {
        self.exact.as_str().to_owned()
    }
}

/// Serializes JSON with object keys sorted and no whitespace, so equal values give equal bytes
/// whatever order a script printed them in (and whatever map type serde_json was built with).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_canonical(&map[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Instants in ns since the epoch, always passed in. A decision's `now` is the daemon's steady
/// timeline (`clock::Clock::now`): near the wall clock, but it never steps, so a span between two
/// of its instants taken by one process is a true span.
pub type Nanos = i64;

/// A moment on one boot's `CLOCK_BOOTTIME` (never steps, counts suspend), with that boot's id:
/// what a span that must survive a restart is kept as. A reading from another boot (the master
/// rebooted, or another replica leads) says nothing about now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct BootInstant {
    /// The kernel's boot id.
    #[schemars(with = "String")]
    pub boot: uuid::Uuid,
    /// ns since that boot.
    pub ns: Nanos,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"z":[1,{"y":2,"x":1}],"c":null}}"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":null,"z":[1,{"x":1,"y":2}]},"b":1}"#
        );
    }

    #[test]
    fn verdict_validation_names_the_problem() {
        let e = |s: &str| Verdict::parse_bytes(s.as_bytes()).unwrap_err().to_string();
        assert!(e("[1]").contains("object"));
        assert!(e(r#"{"details":1}"#).contains("status"));
        assert!(e(r#"{"status":"broken"}"#).contains("unknown status"));
        assert!(e(r#"{"status":"evacuate","command":"x"}"#).contains("only allowed"));
        assert!(e(r#"{"status":"live-repair","command":3}"#).contains("command"));
        assert!(e(r#"{"status":"evacuate","remedy":"x"}"#).contains("only allowed"));
        assert!(e(r#"{"status":"live-repair","remedy":"x","command":"y"}"#).contains("not beside"));
        assert!(e(r#"{"status":"live-repair","remedy":"Bad_Name"}"#).contains("a-z"));
        let v = Verdict::parse_bytes(br#"{"status":"live-repair","remedy":"reboot-bmc"}"#).unwrap();
        assert_eq!(v.command.as_deref().and_then(remedy_of), Some("reboot-bmc"));
        assert!(e(r#"{"status":"Ok","extra":1}"#).contains("extra"));
        assert!(e("not json").contains("JSON"));
        let v = Verdict::parse_bytes(br#"{"status":"live-repair","command":"fix"}"#).unwrap();
        assert_eq!(v.command.as_deref(), Some("fix"));
        assert!(Status::Ok < Status::LiveRepair && Status::Evacuate < Status::EvacuateFailover);
    }
}
