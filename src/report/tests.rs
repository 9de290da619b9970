//! Unit and property tests of the wire protocol: reports, keys and signed requests.
use super::*;
use maintd_core::verdict::Status;
use std::os::unix::fs::PermissionsExt;

fn key() -> Key {
    Key::from_bytes(vec![7; 32])
}
const RULES: VerifyRules = VerifyRules { max_bytes: 65536 };
/// The poll every test report answers.
const ASKED: u64 = 2_000;

fn signed(node: &str, seq: u64, ts: i64) -> Vec<u8> {
    let v = Verdict::parse_bytes(br#"{"status":"evacuate","details":{"disk":"sda"}}"#).unwrap();
    serde_json::to_vec(
        &Envelope::new(node, seq, ts, ts, &v, None)
            .answering(ASKED)
            .sign(&key()),
    )
    .unwrap()
}

#[test]
fn a_signed_report_verifies_and_tampering_is_caught() {
    let body = signed("n1", 5, 1_000);
    let r = Envelope::verify(&body, &key(), "n1", Some(4), ASKED, RULES).unwrap();
    assert_eq!(r.verdict.status, Status::Evacuate);

    let tampered = String::from_utf8(body.clone())
        .unwrap()
        .replace("sda", "sdb");
    let err = Envelope::verify(tampered.as_bytes(), &key(), "n1", None, ASKED, RULES);
    assert!(matches!(err, Err(ReportError::BadSignature)));

    let other = Key::from_bytes(vec![8; 32]);
    assert!(matches!(
        Envelope::verify(&body, &other, "n1", None, ASKED, RULES),
        Err(ReportError::BadSignature)
    ));
    assert!(matches!(
        Envelope::verify(&body, &key(), "n2", None, ASKED, RULES),
        Err(ReportError::WrongNode { .. })
    ));
    assert!(matches!(
        Envelope::verify(&body, &key(), "n1", Some(5), ASKED, RULES),
        Err(ReportError::Replay { .. })
    ));
    // Fresh only as the answer to the poll just sent: another nonce is refused, however close
    // its timestamp is to anyone's clock; a report far from any clock answering it is taken.
    assert!(matches!(
        Envelope::verify(&body, &key(), "n1", None, ASKED + 1, RULES),
        Err(ReportError::Unanswered { answers: ASKED, asked }) if asked == ASKED + 1
    ));
    let unasked = serde_json::to_vec(
        &Envelope::new("n1", 5, 1_000, 1_000, &Verdict::builtin_ok(), None).sign(&key()),
    )
    .unwrap();
    assert!(matches!(
        Envelope::verify(&unasked, &key(), "n1", None, ASKED, RULES),
        Err(ReportError::Unanswered { answers: 0, .. })
    ));
    let far = signed("n1", 5, i64::MIN);
    assert!(Envelope::verify(&far, &key(), "n1", None, ASKED, RULES).is_ok());
    let small = VerifyRules { max_bytes: 10 };
    assert!(matches!(
        Envelope::verify(&body, &key(), "n1", None, ASKED, small),
        Err(ReportError::TooLarge { .. })
    ));
}

#[test]
fn a_report_served_in_canonical_form_is_checked_as_it_stands() {
    let v = Verdict::parse_bytes(br#"{"status":"evacuate","details":{"disk":"sda","n":1.50}}"#)
        .unwrap();
    let env = Envelope::new("n1", 5, 1_000, 1_000, &v, None)
        .answering(ASKED)
        .sign(&key());
    let wire = env.to_wire();
    let text = std::str::from_utf8(&wire).unwrap();
    // The signed bytes are found in the text itself, and are what the signature was made over.
    let spans = canonical_spans(text, "signature", "data").expect("served in canonical form");
    let signed = canonicalize(&serde_json::to_vec(&env).unwrap(), &["signature"]).unwrap();
    assert_eq!(spans.without.concat(), signed);
    assert_eq!(spans.part, Some(v.exact.as_str()));
    let r = Envelope::verify(&wire, &key(), "n1", None, ASKED, RULES).unwrap();
    assert_eq!(r.envelope.data, v.exact);
    // The same report in serde's field order is brought to canonical form and verifies too.
    let older = serde_json::to_vec(&env).unwrap();
    assert!(canonical_spans(std::str::from_utf8(&older).unwrap(), "signature", "data").is_none());
    assert!(Envelope::verify(&older, &key(), "n1", None, ASKED, RULES).is_ok());
    // Tampered in canonical form: caught like any other.
    let tampered = text.replace("sda", "sdb");
    assert!(matches!(
        Envelope::verify(tampered.as_bytes(), &key(), "n1", None, ASKED, RULES),
        Err(ReportError::BadSignature)
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
            .contains("64 lower-case hex digits")
    );
    // The same signature in upper case, or its timestamp with a leading zero: refused.
    let upper = good.to_uppercase();
    assert_eq!(
        check_signed_request(&k, &req(Some("10"), Some(&upper)), now, 30),
        Err(RequestError::SignatureFormat)
    );
    assert!(!k.verify_request("n1", "POST", "/p", 10, b"", &upper));
    assert_eq!(
        check_signed_request(&k, &req(Some("010"), Some(&good)), now, 30),
        Err(RequestError::TimestampFormat)
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
        // A report's timestamp is never compared with a clock, however extreme.
        let v = Verdict::builtin_ok();
        let body = serde_json::to_vec(
            &Envelope::new("n1", 1, ts, ts, &v, None)
                .answering(ASKED)
                .sign(&k),
        )
        .unwrap();
        assert!(Envelope::verify(&body, &k, "n1", None, ASKED, RULES).is_ok());
    }
    assert_eq!(age_ns(i64::MAX, i64::MIN), u64::MAX);
}

#[test]
fn sequences_beyond_the_store_range_are_refused() {
    for seq in [0, MAX_SEQ + 1, u64::MAX] {
        let body = signed("n1", seq, 1_000);
        assert!(matches!(
            Envelope::verify(&body, &key(), "n1", None, ASKED, RULES),
            Err(ReportError::SeqRange { .. })
        ));
    }
    let body = signed("n1", MAX_SEQ, 1_000);
    assert!(Envelope::verify(&body, &key(), "n1", None, ASKED, RULES).is_ok());
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

    use maintd_core::testing::json;

    #[test]
    fn the_reported_seventeen_digit_ratio_verifies() {
        let v = Verdict::parse_bytes(
            br#"{"status":"evacuate","details":{"fs-used-ratio":0.92665207135085950}}"#,
        )
        .unwrap();
        let body = serde_json::to_vec(
            &Envelope::new("n1", 1, 1_000, 1_000, &v, None)
                .answering(ASKED)
                .sign(&key()),
        )
        .unwrap();
        Envelope::verify(&body, &key(), "n1", None, ASKED, RULES).unwrap();
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
            let body = serde_json::to_vec(&Envelope::new("n1", 1, 1_000, 1_000, &v, None).answering(ASKED).sign(&key())).unwrap();
            let r = Envelope::verify(&body, &key(), "n1", None, ASKED, RULES);
            prop_assert!(r.is_ok(), "{}: {:?}", text, r.err());
            // Byte-exact: every number reaches the daemon as the script printed it.
            let got = r.unwrap().verdict.canonical();
            for n in [format!(":0.{digits}"), format!(":1.{digits}e{exp}"), format!(":{int}"), format!(":-{int}")] {
                prop_assert!(got.contains(&n), "{} lost {}", got, n);
            }
        }

        /// Whatever the details hold, a genuine report verifies: what the collector signs
        /// is what the daemon recomputes from the bytes it receives.
        #[test]
        fn every_genuine_report_verifies(details in json(), seq in 1..=MAX_SEQ, wire in any::<bool>()) {
            let v = Verdict::from_value(serde_json::json!({"status": "evacuate", "details": details})).unwrap();
            let env = Envelope::new("n1", seq, 1_000, 1_000, &v, None).answering(ASKED).sign(&key());
            // As this version serves it (canonical), and as an older one did (serde's order).
            let body = if wire { env.to_wire() } else { serde_json::to_vec(&env).unwrap() };
            let r = Envelope::verify(&body, &key(), "n1", None, 2_000, VerifyRules { max_bytes: usize::MAX });
            prop_assert!(r.is_ok(), "{:?}", r.err());
            prop_assert_eq!(r.unwrap().verdict.canonical(), v.canonical());
        }

        /// Flipping any byte of a signed report never yields a different accepted report.
        #[test]
        fn a_changed_report_never_verifies_as_another(details in json(), at in any::<prop::sample::Index>(), bit in 0u8..8, wire in any::<bool>()) {
            let v = Verdict::from_value(serde_json::json!({"status": "evacuate", "details": details})).unwrap();
            let env = Envelope::new("n1", 7, 1_000, 1_000, &v, None).answering(ASKED).sign(&key());
            let mut body = if wire { env.to_wire() } else { serde_json::to_vec(&env).unwrap() };
            let i = at.index(body.len());
            body[i] ^= 1 << bit;
            if let Ok(r) = Envelope::verify(&body, &key(), "n1", None, ASKED, RULES) {
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
        fn report_verification_never_panics(body in prop::collection::vec(any::<u8>(), 0..512), asked in any::<u64>(), last in any::<Option<u64>>()) {
            let _ = Envelope::verify(&body, &key(), "n1", last, asked, RULES);
        }
    }
}
