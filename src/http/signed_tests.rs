//! The one spelling of a signed request, as a property: every re-spelling of an accepted
//! request's headers is refused, before the request was accepted and after, and after a
//! restart that reloads the replay journal. And a bearer token in place of a signature.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use tower::ServiceExt;

use crate::report::Key;

use super::*;
use crate::report::operator::Operator;

const TARGET: &str = "maintd-daemon";

fn auth(replay: Arc<ReplayCache>, refused: Refused) -> SignedAuth {
    SignedAuth {
        keys: Arc::new(Key::from_bytes(vec![3; 32])),
        nodes: None,
        target: TARGET.into(),
        window_s: 60,
        max_body: 1024,
        body_timeout: std::time::Duration::from_secs(5),
        replay,
        refused,
        operators: None,
        reads: false,
        tokens: None,
    }
}

/// A pause route behind `auth`, answering with the name of whoever it let through.
fn router(auth: SignedAuth) -> Router {
    Router::new()
        .route(
            "/1/fencing/pause",
            axum::routing::post(
                |axum::Extension(op): axum::Extension<Operator>| async move { op.name },
            ),
        )
        .route_layer(axum::middleware::from_fn_with_state(auth, require_signed))
}

fn app(replay: Arc<ReplayCache>, refused: Refused) -> Router {
    router(auth(replay, refused))
}

async fn send(app: &Router, headers: &[(&str, &str)]) -> StatusCode {
    let mut r = Request::post("/1/fencing/pause");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    app.clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
}

/// One re-spelling of the timestamp `ts` and signature `sig`, as the headers sent; each is
/// another string than the canonical one.
fn respell(pick: u8, at: usize, ts: &str, sig: &str) -> Vec<(&'static str, String)> {
    let flip = |s: &str, i: usize| -> String {
        s.chars()
            .enumerate()
            .map(|(j, c)| if j == i { c.to_ascii_uppercase() } else { c })
            .collect()
    };
    // A position holding a letter, so that its upper case is another spelling.
    let letter = (0..sig.len())
        .map(|k| (at + k) % sig.len())
        .find(|&i| sig.as_bytes()[i].is_ascii_alphabetic())
        .expect("a MAC's hex has a letter");
    let (t, s): (String, String) = match pick {
        0 => (ts.into(), flip(sig, letter)),
        1 => (ts.into(), sig.to_uppercase()),
        2 => (ts.into(), format!("00{sig}")),
        3 => (ts.into(), format!("{sig}00")),
        4 => (ts.into(), format!("{} {}", &sig[..at], &sig[at..])),
        5 => (format!("0{ts}"), sig.into()),
        6 => (format!("+{ts}"), sig.into()),
        7 => (format!("{ts}.0"), sig.into()),
        _ => {
            // Sent twice: the genuine header and a copy of it.
            return vec![
                (TIMESTAMP_HEADER, ts.into()),
                (SIGNATURE_HEADER, sig.into()),
                (SIGNATURE_HEADER, sig.into()),
            ];
        }
    };
    vec![(TIMESTAMP_HEADER, t), (SIGNATURE_HEADER, s)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_respelling_of_an_accepted_request_is_refused_before_and_after_a_restart(
        pick in 0u8..9,
        at in 1usize..63,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let journal = dir.path().join("replay");
            let refused = Refused::default();
            let key = Key::from_bytes(vec![3; 32]);
            let ts = now_ns();
            let sig = key.sign_request(TARGET, "POST", "/1/fencing/pause", ts, b"");
            let ts = ts.to_string();
            let variant = respell(pick, at, &ts, &sig);
            let variant: Vec<(&str, &str)> =
                variant.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let canonical = [(TIMESTAMP_HEADER, ts.as_str()), (SIGNATURE_HEADER, sig.as_str())];
            let a = app(Arc::new(ReplayCache::persistent(&journal, 0).unwrap()), refused.clone());
            // Before the genuine request: the re-spelling alone is not taken.
            prop_assert_eq!(send(&a, &variant).await, StatusCode::UNAUTHORIZED);
            prop_assert_eq!(send(&a, &canonical).await, StatusCode::OK);
            prop_assert_eq!(send(&a, &variant).await, StatusCode::UNAUTHORIZED);
            prop_assert_eq!(send(&a, &canonical).await, StatusCode::UNAUTHORIZED);
            drop(a);
            let b = app(Arc::new(ReplayCache::persistent(&journal, 0).unwrap()), refused.clone());
            prop_assert_eq!(send(&b, &variant).await, StatusCode::UNAUTHORIZED);
            prop_assert_eq!(send(&b, &canonical).await, StatusCode::UNAUTHORIZED);
            let malformed = refused.get_or_create(&RefusalLabel { reason: "malformed" }).get();
            prop_assert_eq!(malformed, 3, "each re-spelling is counted as malformed");
            Ok(())
        })?;
    }
}

/// A reviewer that knows two tokens: one allowed, one denied.
struct TwoTokens;

impl crate::http::tokens::TokenReviewer for TwoTokens {
    fn review(&self, token: String, verb: &'static str) -> crate::http::tokens::Review {
        use crate::http::tokens::TokenVerdict::*;
        Box::pin(async move {
            assert_eq!(verb, "operate", "a command asks for the operate verb");
            Ok(match token.as_str() {
                "good" => Allowed {
                    user: "alice".into(),
                },
                "deny" => Denied {
                    user: "mallory".into(),
                },
                _ => Unknown,
            })
        })
    }
}

#[tokio::test]
async fn a_bearer_token_is_judged_by_its_reviewer_and_refused_where_none_is() {
    let refused = Refused::default();
    let with = |tokens: Option<Arc<dyn crate::http::tokens::TokenReviewer>>| {
        router(SignedAuth {
            tokens,
            ..auth(Arc::new(ReplayCache::default()), refused.clone())
        })
    };
    let a = with(Some(Arc::new(TwoTokens)));
    let bearer = |t: &str| format!("Bearer {t}");
    for (token, want) in [
        ("good", StatusCode::OK),
        ("deny", StatusCode::FORBIDDEN),
        ("forged", StatusCode::UNAUTHORIZED),
    ] {
        let got = send(&a, &[("authorization", &bearer(token))]).await;
        assert_eq!(got, want, "{token}");
    }
    // Where no reviewer is configured, a token is no credential at all.
    let b = with(None);
    assert_eq!(
        send(&b, &[("authorization", &bearer("good"))]).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        refused
            .get_or_create(&RefusalLabel { reason: "token" })
            .get(),
        2
    );
    assert_eq!(
        refused
            .get_or_create(&RefusalLabel {
                reason: "forbidden"
            })
            .get(),
        1
    );
}
