//! Property-test strategies shared by the tests of what reads a diagnose's JSON (the exact form
//! here, the signed report in `report`).

use proptest::prelude::*;
use serde_json::Value;

/// Any JSON a diagnose may print: every float, integers past 64 bits (serde_json reads them as
/// floats), strings with escapes and control characters, nested arrays and objects.
pub fn json() -> impl Strategy<Value = Value> {
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
        r#"["\\\x00-\x1f\x7fé]{0,4}"#.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
