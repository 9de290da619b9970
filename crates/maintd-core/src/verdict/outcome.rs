//! How an effect ended: `Outcome`, done or failed with a kind, never both, and the wire form it
//! keeps in records written before it was an enum.

use serde::{Deserialize, Serialize};

/// How an effect (a job, a fence step attempt, a release) ended, as its executor recorded it.
/// On the wire (the database, NodeFence status, the API) it is `{ok, detail, kind?}`, as it has
/// always been: a record from any version reads back the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "wire::Outcome", into = "wire::Outcome")]
pub enum Outcome {
    Done { detail: String },
    Failed { kind: FailureKind, detail: String },
}

/// Why an effect failed: a stable label for metrics and for decisions that must tell the
/// failures apart (a device that still reports power is not a device that did not answer).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum FailureKind {
    /// A fence agent's action failed or timed out.
    Agent,
    /// The device accepted off but its status still reports power.
    StillOn,
    /// No status confirmed the power-off.
    Unconfirmed,
    /// The cluster backend (the API server, a hook) refused or failed.
    Backend,
    /// Anything else (a missing event, a collector that refused a live repair).
    Other,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Outcome {
    /// Done when `ok`, else failed for a reason of no particular kind.
    pub fn of(ok: bool, detail: impl Into<String>) -> Outcome {
        if ok {
            Outcome::done(detail)
        } else {
            Outcome::failed(detail)
        }
    }

    pub fn done(detail: impl Into<String>) -> Outcome {
        Outcome::Done {
            detail: detail.into(),
        }
    }

    pub fn failed(detail: impl Into<String>) -> Outcome {
        Outcome::failed_as(FailureKind::Other, detail)
    }

    pub fn failed_as(kind: FailureKind, detail: impl Into<String>) -> Outcome {
        Outcome::Failed {
            kind,
            detail: detail.into(),
        }
    }

    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Done { .. })
    }

    /// What happened, for people.
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Done { detail } | Outcome::Failed { detail, .. } => detail,
        }
    }

    /// The failure's kind (`None` when it succeeded).
    pub fn failure(&self) -> Option<FailureKind> {
        match self {
            Outcome::Done { .. } => None,
            Outcome::Failed { kind, .. } => Some(*kind),
        }
    }
}

impl schemars::JsonSchema for Outcome {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Outcome".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        wire::Outcome::json_schema(g)
    }
}

mod wire {
    //! The record form: `ok` with a detail and, for a failure, its kind (one recorded before
    //! kinds were reads back as `other`).

    use super::FailureKind;
    use serde::{Deserialize, Serialize};

    /// How an effect (a job, a fence step attempt, a release) ended, as its executor recorded it.
    #[derive(Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Outcome {
        pub ok: bool,
        pub detail: String,
        /// Why it failed, kept as a kind (the detail is for people); absent when it succeeded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub kind: Option<FailureKind>,
    }

    impl From<Outcome> for super::Outcome {
        fn from(w: Outcome) -> super::Outcome {
            if w.ok {
                super::Outcome::done(w.detail)
            } else {
                super::Outcome::failed_as(w.kind.unwrap_or(FailureKind::Other), w.detail)
            }
        }
    }

    impl From<super::Outcome> for Outcome {
        fn from(o: super::Outcome) -> Outcome {
            let kind = o.failure();
            match o {
                super::Outcome::Done { detail } | super::Outcome::Failed { detail, .. } => {
                    Outcome {
                        ok: kind.is_none(),
                        detail,
                        kind,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_record_form_is_unchanged() {
        let done = Outcome::done("off");
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            json!({"ok": true, "detail": "off"})
        );
        let still = Outcome::failed_as(FailureKind::StillOn, "still reports ON");
        assert_eq!(
            serde_json::to_value(&still).unwrap(),
            json!({"ok": false, "detail": "still reports ON", "kind": "still-on"})
        );
        for o in [done, still] {
            let back: Outcome = serde_json::from_value(serde_json::to_value(&o).unwrap()).unwrap();
            assert_eq!(back, o);
        }
    }

    #[test]
    fn old_records_read_back_without_contradiction() {
        // Before kinds were recorded a failure had none: it is of no particular kind.
        let old: Outcome = serde_json::from_value(json!({"ok": false, "detail": "x"})).unwrap();
        assert_eq!(old.failure(), Some(FailureKind::Other));
        // A success that (by a bug of old) carried a kind is a success: `ok` decides.
        let odd: Outcome =
            serde_json::from_value(json!({"ok": true, "detail": "y", "kind": "agent"})).unwrap();
        assert_eq!((odd.ok(), odd.failure(), odd.detail()), (true, None, "y"));
    }

    #[test]
    fn the_schema_keeps_the_record_form() {
        let s = serde_json::to_value(schemars::schema_for!(Outcome)).unwrap();
        assert_eq!(s["title"], "Outcome");
        assert_eq!(s["required"], json!(["ok", "detail"]));
        assert!(s["properties"]["kind"].is_object(), "{s:#}");
    }
}
