//! The exact JSON reading on arbitrary bytes: never panics, reads every document serde_json
//! reads, and what it writes (compact or pretty) reads back to the same document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use maintd_core::verdict::ExactJson;

fuzz_target!(|data: &[u8]| {
    let ours = ExactJson::parse(data);
    if serde_json::from_slice::<serde_json::Value>(data).is_ok() {
        assert!(ours.is_ok(), "serde_json reads it, the exact reading refused it");
    }
    if let Ok(e) = ours {
        assert_eq!(ExactJson::parse(e.as_str().as_bytes()).unwrap(), e);
        assert_eq!(ExactJson::parse(e.pretty().as_bytes()).unwrap(), e);
    }
});
