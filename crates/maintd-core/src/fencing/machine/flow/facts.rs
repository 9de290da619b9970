//! The facts a flow establishes once (isolated, fenced, released), each kept as the moment it
//! was established or none, and written as records have always carried them: a flag beside its
//! time, so the database, NodeFence status and the API read the same as before.

use crate::verdict::Nanos;

/// The moment a record that carries a fact's flag without its time stands for. Every version
/// wrote the two together, so this only meets a hand-edited record; it reads as established
/// before anything else, which errs toward caution where a rule compares with it (a report
/// after a power-off is an alarm: any old-boot report is one).
pub const UNTIMED: Nanos = 0;

/// A fact as a record states it (its flag, its time) read as the one thing it says: the time,
/// or [`UNTIMED`] for a flag without one.
pub fn established(flag: bool, at: Option<Nanos>) -> Option<Nanos> {
    at.or(flag.then_some(UNTIMED))
}

macro_rules! fact {
    ($(#[$doc:meta])* $name:ident, $flag:literal, $at:literal) => {
        $(#[$doc])*
        pub mod $name {
            use serde::{Deserialize, Deserializer, Serialize, Serializer};

            use crate::verdict::Nanos;

            #[derive(Serialize, Deserialize)]
            struct Wire {
                #[serde(rename = $flag, default)]
                flag: bool,
                #[serde(rename = $at, default)]
                at: Option<Nanos>,
            }

            pub fn serialize<S: Serializer>(at: &Option<Nanos>, s: S) -> Result<S::Ok, S::Error> {
                Wire {
                    flag: at.is_some(),
                    at: *at,
                }
                .serialize(s)
            }

            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Nanos>, D::Error> {
                let w = Wire::deserialize(d)?;
                Ok(super::established(w.flag, w.at))
            }
        }
    };
}

fact!(
    /// `isolated` / `isolated-at`.
    isolated, "isolated", "isolated-at"
);
fact!(
    /// `fenced` / `fenced-at`.
    fenced, "fenced", "fenced-at"
);
fact!(
    /// `released` / `released-at`.
    released, "released", "released-at"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::machine::{Flow, Step, Witnesses};
    use serde_json::{Value, json};

    fn flow() -> Flow {
        Flow::new("n1", 5, 10, Step::Isolation, Witnesses::default(), "x")
    }

    #[test]
    fn a_fact_is_written_as_its_flag_and_its_time() {
        let mut f = flow();
        f.fenced_at = Some(42);
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(
            [
                &v["isolated"],
                &v["isolated-at"],
                &v["fenced"],
                &v["fenced-at"],
                &v["released"],
                &v["released-at"]
            ],
            [
                &json!(false),
                &Value::Null,
                &json!(true),
                &json!(42),
                &json!(false),
                &Value::Null
            ]
        );
        let back: Flow = serde_json::from_value(v).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn a_flag_without_its_time_reads_as_established_before_anything() {
        let mut v = serde_json::to_value(flow()).unwrap();
        v["released"] = json!(true);
        let f: Flow = serde_json::from_value(v.clone()).unwrap();
        assert_eq!((f.released_at, f.released()), (Some(UNTIMED), true));
        // A time says the fact holds, whatever a stray flag says.
        v["released"] = json!(false);
        v["released-at"] = json!(7);
        let f: Flow = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(f.released_at, Some(7));
        // A record without either (older than nothing, but hand-made ones are) has neither.
        let o = v.as_object_mut().unwrap();
        o.remove("released");
        o.remove("released-at");
        let f: Flow = serde_json::from_value(v).unwrap();
        assert!(!f.released());
    }
}
