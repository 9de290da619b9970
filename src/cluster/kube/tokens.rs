//! Operators' bearer tokens, checked the way kube-rbac-proxy checks them: a TokenReview says
//! whose token it is, a SubjectAccessReview whether that user may `get` (read) or `operate`
//! (command) `nodefences.maintd.io`. Answers are kept briefly under the token's hash, so a
//! reader polling the API costs the API server two calls per ten seconds, not two per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use crate::http::tokens::{Review, ReviewError, TokenReviewer, TokenVerdict};
use crate::sync::LockExt;

/// How long an answer is kept: a revoked token or binding takes effect within this.
const KEEP: Duration = Duration::from_secs(10);
/// Answers kept at most; past it the oldest go first.
const CAP: usize = 1024;

type Answers = HashMap<([u8; 32], &'static str), (Instant, TokenVerdict)>;

pub struct KubeTokens {
    client: kube::Client,
    answers: Arc<Mutex<Answers>>,
}

impl KubeTokens {
    pub fn new(client: kube::Client) -> KubeTokens {
        KubeTokens {
            client,
            answers: Default::default(),
        }
    }
}

impl TokenReviewer for KubeTokens {
    fn review(&self, token: String, verb: &'static str) -> Review {
        let client = self.client.clone();
        let answers = self.answers.clone();
        Box::pin(async move {
            let id: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if let Some((at, v)) = answers.lock_unpoisoned().get(&(id, verb))
                && at.elapsed() < KEEP
            {
                return Ok(v.clone());
            }
            let v = ask(client, token, verb).await?;
            let mut a = answers.lock_unpoisoned();
            if a.len() >= CAP {
                a.retain(|_, (at, _)| at.elapsed() < KEEP);
                if a.len() >= CAP {
                    a.clear();
                }
            }
            a.insert((id, verb), (Instant::now(), v.clone()));
            Ok(v)
        })
    }
}

async fn ask(
    client: kube::Client,
    token: String,
    verb: &'static str,
) -> Result<TokenVerdict, ReviewError> {
    let failed = |asked| {
        move |e: kube::Error| ReviewError {
            asked,
            detail: e.to_string(),
        }
    };
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(failed("TokenReview"))?;
    let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
        return Ok(TokenVerdict::Unknown);
    };
    let Some(user) = status.user else {
        return Ok(TokenVerdict::Unknown);
    };
    let Some(name) = user.username.clone().filter(|n| !n.is_empty()) else {
        return Ok(TokenVerdict::Unknown);
    };
    let access = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(name.clone()),
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            resource_attributes: Some(ResourceAttributes {
                group: Some("maintd.io".into()),
                resource: Some("nodefences".into()),
                verb: Some(verb.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answered = Api::<SubjectAccessReview>::all(client)
        .create(&PostParams::default(), &access)
        .await
        .map_err(failed("SubjectAccessReview"))?;
    Ok(if answered.status.is_some_and(|s| s.allowed) {
        TokenVerdict::Allowed { user: name }
    } else {
        TokenVerdict::Denied { user: name }
    })
}
