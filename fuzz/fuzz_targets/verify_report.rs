//! Report verification on arbitrary bytes: never panics, and nothing but a correctly signed
//! report for the expected node is ever accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use maintd::report::{Envelope, Key, VerifyRules};

fuzz_target!(|data: &[u8]| {
    let key = Key::from_bytes(vec![7; 32]);
    let rules = VerifyRules {
        max_bytes: 64 * 1024,
    };
    // The first bytes choose the poll answered and the last sequence, the rest is the body.
    let (asked, last, body) = match data {
        [a, b, rest @ ..] => (u64::from(*a), Some(u64::from(*b)), rest),
        _ => (0, None, data),
    };
    if let Ok(r) = Envelope::verify(body, &key, "n1", last, asked, rules) {
        // Accepted: it must re-sign to the same signature, so it really came from the key.
        let again = r.envelope.clone().sign(&key);
        assert_eq!(again.signature, r.envelope.signature);
        assert_eq!(r.envelope.node, "n1");
        assert_eq!(r.envelope.answers, asked);
    }
});
