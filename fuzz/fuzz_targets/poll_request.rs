//! The UDP poll on arbitrary datagrams: neither side panics, a collector accepts only a request
//! the key signed for its node, and the daemon reads only a well-formed answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use maintd::report::Key;
use maintd::report::poll::{read_answer, request, verify_request};

fuzz_target!(|data: &[u8]| {
    let key = Key::from_bytes(vec![7; 32]);
    if let Ok(asked) = verify_request(&key, "n1", data) {
        // Accepted: the same request, signed again, is byte for byte what came in.
        assert_eq!(request(&key, "n1", asked.nonce, asked.ts), data);
    }
    if let Some((_, answer)) = read_answer(data) {
        let _ = answer;
        assert!(data.len() >= 12);
    }
});
