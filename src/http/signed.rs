//! The server side of signed requests: the middleware that checks every state-changing request
//! (signature, target, window, replay) before a handler sees it, the replay cache that outlives
//! a restart, and the count and log line of every refusal.

use super::hygiene::header_once;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tracing::warn;

use super::{ApiError, listener};
use crate::report::operator::{
    CLUSTER_KEY_ID, NODE_HEADER, OPERATOR_HEADER, Operator, Role, operator_target,
};
use crate::report::{
    Mac32, RequestError, SIGNATURE_HEADER, TIMESTAMP_HEADER, check_request_headers, decode_mac,
    now_ns,
};
use crate::sync::LockExt;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    pub reason: &'static str,
}

/// Refused signed requests by reason (`unsigned`, `malformed`, `stale`, `forged`, `replayed`,
/// `too-large`, `body`, `unknown-operator`, `forbidden`, `token`): `forged` covers a bad signature and
/// one made for another target; `forbidden` a genuine signature whose signer may not do this.
pub type Refused = Family<RefusalLabel, Counter>;

/// What the signature middleware checks against, for one group of routes.
#[derive(Clone)]
pub struct SignedAuth {
    /// The keys a request that names no operator may be signed with: the cluster key on the
    /// daemon; on a collector, every key it holds (two while its key is rolled over).
    pub keys: Arc<dyn crate::report::Verifiers + Send + Sync>,
    /// The daemon's keys of its nodes: a request signed with a node's key (it says
    /// `x-maintd-node`) is recognised, logged under that node's name and refused, since a node's
    /// key speaks only for that node's reports, views and heartbeats. `None` on a collector.
    pub nodes: Option<Arc<crate::report::keyring::Keyring>>,
    /// The name requests must be signed for: this node's, or [`crate::report::DAEMON_TARGET`].
    pub target: String,
    pub window_s: u64,
    /// Largest body these routes take; a larger `Content-Length` is answered 413 unread.
    pub max_body: usize,
    pub body_timeout: std::time::Duration,
    pub replay: Arc<ReplayCache>,
    /// Every refusal is counted here (and logged).
    pub refused: Refused,
    /// Who may sign here besides the cluster key: the daemon's operators. `None` on a
    /// collector, where only the cluster key signs.
    pub operators: Option<Arc<super::Operators>>,
    /// Routes that only read: the read role suffices, and the replay cache is not consulted (a
    /// read repeated changes nothing).
    pub reads: bool,
    /// Who checks bearer tokens, when they are taken here (the Kubernetes API).
    pub tokens: Option<Arc<dyn super::tokens::TokenReviewer>>,
}

impl SignedAuth {
    fn refuse(
        &self,
        reason: &'static str,
        parts: &axum::http::request::Parts,
        e: ApiError,
    ) -> ApiError {
        self.refuse_signer(reason, parts, None, e)
    }

    /// A refusal that names whose key signed (an operator, or the cluster key), once known.
    pub(super) fn refuse_signer(
        &self,
        reason: &'static str,
        parts: &axum::http::request::Parts,
        signer: Option<&str>,
        e: ApiError,
    ) -> ApiError {
        warn!(
            reason,
            method = %parts.method,
            path = parts.uri.path(),
            target = %self.target,
            signer = signer.unwrap_or("-"),
            detail = %e.message,
            "signed request refused"
        );
        self.refused.get_or_create(&RefusalLabel { reason }).inc();
        e
    }

    /// Who holds a bearer token, and whether they may send this request: the reviewer's
    /// answer. A token is not a signature, so it is not replay-checked (it is sent only over
    /// TLS, or on loopback).
    async fn token_holder(
        &self,
        parts: &axum::http::request::Parts,
        token: String,
    ) -> Result<Operator, ApiError> {
        use super::tokens::TokenVerdict;
        let Some(reviewer) = &self.tokens else {
            let e = ApiError::unauthorized("bearer tokens are not taken here: sign the request");
            return Err(self.refuse("token", parts, e));
        };
        let (verb, role) = if self.reads {
            ("get", Role::Read)
        } else {
            ("operate", Role::Operate)
        };
        match reviewer.review(token, verb).await {
            Err(e) => {
                let e = ApiError::unavailable(format!("cannot check the bearer token: {e}"));
                Err(self.refuse("token", parts, e))
            }
            Ok(TokenVerdict::Unknown) => {
                let e = ApiError::unauthorized("the bearer token is not valid");
                Err(self.refuse("token", parts, e))
            }
            Ok(TokenVerdict::Denied { user }) => {
                let e = ApiError::forbidden(format!(
                    "{user} may not {verb} nodefences.maintd.io, which {} {} needs",
                    parts.method,
                    parts.uri.path()
                ));
                Err(self.refuse_signer("forbidden", parts, Some(&user), e))
            }
            Ok(TokenVerdict::Allowed { user }) => Ok(Operator { name: user, role }),
        }
    }

    /// Whose key signed the request, and whether they may send it: the operator it names,
    /// or the cluster key when it names none.
    fn signer(
        &self,
        parts: &axum::http::request::Parts,
        path: &str,
        ts: i64,
        body: &[u8],
        sig: &Mac32,
    ) -> Result<Operator, ApiError> {
        let method = parts.method.as_str();
        let named = header_once(&parts.headers, OPERATOR_HEADER)
            .map_err(|m| self.refuse("malformed", parts, ApiError::unauthorized(m.to_string())))?;
        let needs = if self.reads {
            Role::Read
        } else {
            Role::Operate
        };
        let node = header_once(&parts.headers, NODE_HEADER)
            .map_err(|m| self.refuse("malformed", parts, ApiError::unauthorized(m.to_string())))?;
        if let (Some(node), Some(ring)) = (node, &self.nodes) {
            let signed = super::operators::SignedParts {
                path,
                ts,
                body,
                sig,
            };
            return Err(self.node_signed(parts, ring, node, signed));
        }
        let Some(name) = named else {
            if !self
                .keys
                .any_key(&mut |k| k.verify_request_mac(&self.target, method, path, ts, body, sig))
            {
                let e = ApiError::unauthorized(format!(
                    "request signature does not verify under the cluster key for {:?}",
                    self.target
                ));
                return Err(self.refuse("forged", parts, e));
            }
            if self
                .operators
                .as_ref()
                .is_some_and(|o| !o.cluster_key_operates())
            {
                let e = ApiError::forbidden(
                    "signed with the cluster key, which every node holds: this daemon takes operator commands only from operator keys (maintd keygen --operator NAME)",
                );
                return Err(self.refuse_signer("forbidden", parts, Some(CLUSTER_KEY_ID), e));
            }
            return Ok(Operator {
                name: CLUSTER_KEY_ID.into(),
                role: Role::Operate,
            });
        };
        let Some((role, keys)) = self.operators.as_ref().and_then(|o| o.get(name)) else {
            let e = ApiError::unauthorized(format!("no operator {name:?} is known here"));
            return Err(self.refuse_signer("unknown-operator", parts, Some(name), e));
        };
        let target = operator_target(name);
        if !keys
            .iter()
            .any(|k| k.verify_request_mac(&target, method, path, ts, body, sig))
        {
            let e = ApiError::unauthorized(format!(
                "request signature does not verify under operator {name:?}'s key"
            ));
            return Err(self.refuse_signer("forged", parts, Some(name), e));
        }
        if role < needs {
            let e = ApiError::forbidden(format!(
                "operator {name:?} has the {} role; {method} {} needs {}",
                role.as_str(),
                parts.uri.path(),
                needs.as_str()
            ));
            return Err(self.refuse_signer("forbidden", parts, Some(name), e));
        }
        Ok(Operator {
            name: name.to_string(),
            role,
        })
    }
}

fn header_reason(e: &RequestError) -> &'static str {
    match e {
        RequestError::Unsigned => "unsigned",
        RequestError::SignatureFormat | RequestError::TimestampFormat => "malformed",
        RequestError::Stale { .. } => "stale",
        RequestError::Forged { .. } => "forged",
    }
}

/// Middleware for routes that change state: the request must be signed with the cluster key,
/// for this server, within the window, and not seen before. Everything that can be judged from
/// the head is judged before a byte of the body is read, so an unauthenticated client costs no
/// memory; the body is then read under a size cap and a deadline, verified, and handed on.
pub async fn require_signed(
    axum::extract::State(auth): axum::extract::State<SignedAuth>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    if let Some(token) = super::tokens::bearer(&parts.headers).map(str::to_string) {
        let mut parts = parts;
        let who = auth.token_holder(&parts, token).await?;
        parts.extensions.insert(who);
        return Ok(next
            .run(axum::extract::Request::from_parts(parts, body))
            .await);
    }
    let h = |name| {
        header_once(&parts.headers, name)
            .map_err(|m| auth.refuse("malformed", &parts, ApiError::unauthorized(m.to_string())))
    };
    let (ts, sig) = check_request_headers(
        h(TIMESTAMP_HEADER)?,
        h(SIGNATURE_HEADER)?,
        now_ns(),
        auth.window_s,
    )
    .map_err(|e| {
        auth.refuse(
            header_reason(&e),
            &parts,
            ApiError::unauthorized(e.to_string()),
        )
    })?;
    let declared = match parts.headers.get(axum::http::header::CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    let e = ApiError::bad_request("Content-Length is not a number");
                    auth.refuse("malformed", &parts, e)
                })?,
        ),
    };
    if declared.is_some_and(|l| l > auth.max_body as u64) {
        return Err(auth.refuse("too-large", &parts, ApiError::too_large(auth.max_body)));
    }
    let bytes = {
        // Waiting for an unauthenticated client's body: the connection stays evictable.
        let _idle = parts
            .extensions
            .get::<listener::ConnActivity>()
            .map(|a| a.unprotected());
        let limited = http_body_util::Limited::new(body, auth.max_body);
        match tokio::time::timeout(auth.body_timeout, http_body_util::BodyExt::collect(limited))
            .await
        {
            Err(_) => {
                let e = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request-timeout",
                    format!("the body did not arrive within {:?}", auth.body_timeout),
                );
                return Err(auth.refuse("body", &parts, e));
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(auth.refuse("too-large", &parts, ApiError::too_large(auth.max_body)));
            }
            Ok(Err(e)) => {
                let e = ApiError::bad_request(format!("cannot read the request body: {e}"));
                return Err(auth.refuse("body", &parts, e));
            }
            Ok(Ok(c)) => c.to_bytes(),
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let signer = auth.signer(&parts, path, ts, &bytes, &sig)?;
    if !auth.reads
        && let Err(e) = auth
            .replay
            .check_and_remember(&sig, ts, now_ns(), auth.window_s)
    {
        let reason = if e.status == StatusCode::UNAUTHORIZED {
            "replayed"
        } else {
            "busy"
        };
        return Err(auth.refuse_signer(reason, &parts, Some(&signer.name), e));
    }
    let mut parts = parts;
    parts.extensions.insert(signer);
    Ok(next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await)
}

/// Signatures of the signed requests accepted within the window: the same request is accepted
/// once. It is keyed on the signature's bytes, which have one encoding on the wire. Only authenticated requests enter, so only a key holder could fill it. With a journal
/// it outlives a restart: a request captured before the restart is refused after it, within
/// its window, as before.
pub struct ReplayCache {
    /// Signature -> until when it is remembered (its timestamp plus the window).
    seen: std::sync::Mutex<std::collections::HashMap<Mac32, i64>>,
    cap: usize,
    journal: Option<Journal>,
}

/// Accepted signatures, one `<until-ns> <signature>` line each, synced before the request is
/// answered; rewritten with only the live ones when it has grown.
struct Journal {
    path: PathBuf,
    file: std::sync::Mutex<(std::fs::File, usize)>,
}

impl Default for ReplayCache {
    fn default() -> Self {
        ReplayCache::new(65_536)
    }
}

impl ReplayCache {
    pub fn new(cap: usize) -> ReplayCache {
        ReplayCache {
            seen: Default::default(),
            cap,
            journal: None,
        }
    }

    /// A cache kept in `path` too: what it holds from before a restart, still inside its
    /// window at `now`, is known again. An unreadable line is skipped (it can only be the tail
    /// of a write cut by a crash).
    pub fn persistent(path: &Path, now: i64) -> std::io::Result<ReplayCache> {
        let mut seen = std::collections::HashMap::new();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                for line in text.lines() {
                    let Some((until, sig)) = line.split_once(' ') else {
                        continue;
                    };
                    if let Ok(until) = until.parse::<i64>()
                        && until >= now
                        && let Some(sig) = decode_mac(sig)
                    {
                        seen.insert(sig, until);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let live: String = seen.iter().map(|(s, u)| line(s, *u)).collect();
        crate::fsutil::write_atomic(path, live.as_bytes())?;
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok(ReplayCache {
            cap: 65_536,
            journal: Some(Journal {
                path: path.to_path_buf(),
                file: std::sync::Mutex::new((file, seen.len())),
            }),
            seen: std::sync::Mutex::new(seen),
        })
    }

    pub fn check_and_remember(
        &self,
        sig: &Mac32,
        ts: i64,
        now: i64,
        window_s: u64,
    ) -> Result<(), ApiError> {
        let window = i64::try_from(window_s.saturating_mul(1_000_000_000)).unwrap_or(i64::MAX);
        let mut seen = self.seen.lock_unpoisoned();
        if seen.get(sig).is_some_and(|until| *until >= now) {
            return Err(ApiError::unauthorized(
                "this signed request was already accepted once (replay)",
            ));
        }
        if seen.len() >= self.cap {
            // A request stays replayable until its timestamp leaves the window on either side.
            seen.retain(|_, until| *until >= now);
            if seen.len() >= self.cap {
                return Err(ApiError::unavailable(
                    "too many signed requests within the window; try again shortly",
                ));
            }
        }
        let until = ts.saturating_add(window);
        if let Some(j) = &self.journal {
            // Remembered on disk before it is acted on, or a restart would forget it.
            j.append(sig, until, now, &mut seen).map_err(|e| {
                ApiError::internal(format!(
                    "cannot record the request against replay in {}: {e}",
                    j.path.display()
                ))
            })?;
        }
        seen.insert(*sig, until);
        Ok(())
    }
}

impl Journal {
    fn append(
        &self,
        sig: &Mac32,
        until: i64,
        now: i64,
        live: &mut std::collections::HashMap<Mac32, i64>,
    ) -> std::io::Result<()> {
        let mut f = self.file.lock_unpoisoned();
        // Expired signatures leave the memory only at the cap: look at what still lives now and
        // then, so the file is rewritten once most of it is dead.
        if f.1 > 1024 && f.1 % 256 == 0 {
            live.retain(|_, u| *u >= now);
        }
        if f.1 > 1024 + 2 * live.len() {
            let mut text: String = live.iter().map(|(s, u)| line(s, *u)).collect();
            text.push_str(&line(sig, until));
            crate::fsutil::write_atomic(&self.path, text.as_bytes())?;
            *f = (
                std::fs::OpenOptions::new().append(true).open(&self.path)?,
                live.len() + 1,
            );
            return Ok(());
        }
        f.0.write_all(line(sig, until).as_bytes())?;
        f.0.sync_data()?;
        f.1 += 1;
        Ok(())
    }
}

/// One journal line: until when, and the signature in its one encoding.
fn line(sig: &Mac32, until: i64) -> String {
    format!("{until} {}\n", hex::encode(sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn a_request_accepted_before_a_restart_is_refused_after_it_within_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay");
        let sig = [0xaa; 32];
        let c = ReplayCache::persistent(&path, 100 * S).unwrap();
        c.check_and_remember(&sig, 100 * S, 100 * S, 60).unwrap();
        assert!(c.check_and_remember(&sig, 100 * S, 101 * S, 60).is_err());
        drop(c);
        let c = ReplayCache::persistent(&path, 130 * S).unwrap();
        let e = c
            .check_and_remember(&sig, 100 * S, 130 * S, 60)
            .unwrap_err();
        assert!(e.message.contains("replay"), "{}", e.message);
        // Past its window it is forgotten (the window check refuses it anyway).
        let c = ReplayCache::persistent(&path, 200 * S).unwrap();
        assert!(c.seen.lock_unpoisoned().is_empty());
    }

    #[test]
    fn the_journal_is_compacted_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay");
        std::fs::write(&path, format!("{} {}\n12 torn", 500 * S, "b".repeat(64))).unwrap();
        let c = ReplayCache::persistent(&path, 100 * S).unwrap();
        assert_eq!(c.seen.lock_unpoisoned().len(), 1);
        for i in 0..3000u32 {
            let mut sig = [0u8; 32];
            sig[..4].copy_from_slice(&i.to_be_bytes());
            // Each one expires before the next arrives: the file must not grow without bound.
            let now = (200 + i as i64) * S;
            c.check_and_remember(&sig, now, now, 0).unwrap();
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines < 1100, "{lines} lines");
    }
}

#[cfg(test)]
#[path = "signed_tests.rs"]
mod respelled;
