//! Bearer tokens in place of an operator key: what a token's review says, and the one question
//! the API asks of whoever checks them (the Kubernetes API, by TokenReview and
//! SubjectAccessReview). The token itself is never logged, stored or kept unhashed.

use std::future::Future;
use std::pin::Pin;

/// What the checker says of a token, for one verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenVerdict {
    /// Not a valid token.
    Unknown,
    /// A valid token whose user may not do this.
    Denied {
        user: String,
    },
    Allowed {
        user: String,
    },
}

pub type Review = Pin<Box<dyn Future<Output = Result<TokenVerdict, ReviewError>> + Send>>;

/// Whoever checks tokens could not answer (the request is then refused as unavailable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{asked}: {detail}")]
pub struct ReviewError {
    /// What was asked: `TokenReview`, `SubjectAccessReview`.
    pub asked: &'static str,
    pub detail: String,
}

/// Checks bearer tokens: who holds `token`, and whether they may `verb` (`get` for reads,
/// `operate` for commands).
pub trait TokenReviewer: Send + Sync {
    fn review(&self, token: String, verb: &'static str) -> Review;
}

/// The token of an `Authorization: Bearer` header, if the request carries one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = v.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}
