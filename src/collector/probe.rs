//! The collector's peering endpoints: the leader's signed peer set (`PUT /1/peers`) and the
//! liveness probe (`GET /1/peers`), whose signed query echoes the beat of the node's view the
//! master last took (the node's round trip with the master), numbers the probe so the view can
//! answer exactly it, and names the nodes marked for self-fencing.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use tracing::info;

use super::Collector;
use crate::exec;
use crate::http::{ApiError, parse_json};
use crate::report::now_ns;

/// The largest set stays under this: 64 peers with 64-byte names and IPv6 addresses (8 KiB),
/// three heartbeat keys each during a rollover (19 KiB) and 64 watchers (4 KiB).
pub(super) const PEER_SET_CAP: usize = 48 * 1024;

pub(super) async fn set_peers(
    State(c): State<Arc<Collector>>,
    body: Bytes,
) -> Result<Json<crate::report::heartbeat::PeerSet>, ApiError> {
    let set: crate::report::heartbeat::PeerSet = parse_json(&body)?;
    let set = c
        .peers
        .install(set)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    info!(
        epoch = set.epoch,
        peers = set.peers.len(),
        watchers = set.watchers.len(),
        "peer set installed"
    );
    Ok(Json(set))
}

/// What a verified probe of the master says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterProbe {
    /// The beat of this node's view the master last took (0: none).
    pub echo: u64,
    /// The probe's number, which the view answers.
    pub probe: u64,
    /// The nodes the master has marked for fencing.
    pub marked: std::collections::BTreeSet<String>,
    /// A probe's marks are taken only when its echo is of a view this node served within this
    /// span of its own clock.
    pub mark_window: maintd_core::verdict::Nanos,
}

/// Names the master may mark in one probe (more are ignored).
const MAX_MARKED: usize = 64;

/// The liveness probe. Anyone may read the signed view; a probe signed by the master also
/// echoes the master's last view of this node and says which nodes it has marked for fencing,
/// which the watchdog's rules read, and gets a view with a beat that answers it. A forged or
/// replayed signature is ignored, never an error: the view is served either way, without a
/// beat, so an unsigned request records nothing.
///
/// The probe's timestamp is the master's clock and is never compared with this one (a master
/// whose clock is a minute off still hears every node). What makes it count is its echo: a
/// beat this node sent, timed on its own clock. Contact counts from when that beat was sent,
/// and the marks are taken only from a probe echoing a beat sent within `request-window`, so a
/// probe played back later marks nothing.
pub(super) async fn peer_view(
    State(c): State<Arc<Collector>>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> Json<crate::report::heartbeat::SignedView> {
    let now = now_ns();
    if headers.contains_key(crate::report::SIGNATURE_HEADER) {
        match c.master_probe(&headers, &uri, now) {
            Ok(q) => {
                let mono = crate::clock::mono_ns();
                let window = i64::try_from(c.cfg.request_window.as_nanos()).unwrap_or(i64::MAX);
                let p = MasterProbe {
                    echo: q.echo,
                    probe: q.probe,
                    marked: q.marked,
                    mark_window: window,
                };
                return Json(c.peers.master_probe(p, now, mono));
            }
            Err(e) => tracing::debug!(error = %e, "master probe signature refused"),
        }
    }
    Json(c.peers.view(now))
}

/// What a signed probe says.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ProbeQuery {
    /// The beat of this node's view the master last took; 0 for none.
    pub echo: u64,
    /// The probe's number, which the view answers.
    pub probe: u64,
    pub marked: std::collections::BTreeSet<String>,
}

/// `echo=17&probe=4&marked=a,b`: names that are not valid node names are dropped, and numbers
/// that do not parse are 0 (nothing).
pub(super) fn probe_query(q: &str) -> ProbeQuery {
    let mut out = ProbeQuery::default();
    let marked = &mut out.marked;
    for (k, v) in q.split('&').filter_map(|kv| kv.split_once('=')) {
        match k {
            "echo" => out.echo = v.parse().unwrap_or(0),
            "probe" => out.probe = v.parse().unwrap_or(0),
            "marked" => marked.extend(
                v.split(',')
                    .filter(|n| exec::validate_name(n).is_ok())
                    .take(MAX_MARKED)
                    .map(String::from),
            ),
            _ => {}
        }
    }
    out
}

impl Collector {
    fn master_probe(
        &self,
        headers: &axum::http::HeaderMap,
        uri: &axum::http::Uri,
        now: i64,
    ) -> Result<ProbeQuery, ProbeRefused> {
        let h = |name| crate::http::header_once(headers, name);
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let req = crate::report::SignedRequest {
            target: &self.node,
            method: "GET",
            path,
            timestamp: h(crate::report::TIMESTAMP_HEADER)?,
            signature: h(crate::report::SIGNATURE_HEADER)?,
            body: b"",
        };
        let window = self.cfg.request_window.as_secs();
        let (_, sig) = crate::report::check_signature_only(&self.cred, &req)
            .map_err(|e| ProbeRefused::Signature(e.to_string()))?;
        // Remembered from its arrival, on this clock: the same probe is taken once.
        self.replay
            .check_and_remember(&sig, now, now, window)
            .map_err(|_| ProbeRefused::Replayed)?;
        Ok(probe_query(uri.query().unwrap_or_default()))
    }
}

/// Why a master's signed probe is answered as an unsigned one.
#[derive(Debug, thiserror::Error)]
enum ProbeRefused {
    #[error(transparent)]
    Header(#[from] crate::http::HeaderError),
    #[error("{0}")]
    Signature(String),
    #[error("replayed or too many probes")]
    Replayed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Key;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    #[test]
    fn a_probe_query_keeps_only_valid_names_and_numbers() {
        let q = probe_query("echo=17&probe=4&marked=n1,../x,,n2&other=3");
        assert_eq!((q.echo, q.probe), (17, 4));
        assert_eq!(q.marked.into_iter().collect::<Vec<_>>(), ["n1", "n2"]);
        let q = probe_query("echo=-1&probe=x&marked=");
        assert_eq!(q, ProbeQuery::default());
    }

    #[tokio::test]
    async fn only_a_signed_unreplayed_probe_echoing_a_recent_view_of_this_node_counts_and_marks() {
        let key = Key::from_bytes(vec![1; 32]);
        let (c, _state) = crate::collector::tests::collector(&key);
        let probe = |key: &Key, target: &str, path: &str, ts: i64| {
            let sig = key.sign_request(target, "GET", path, ts, b"");
            Request::get(path)
                .header(crate::report::TIMESTAMP_HEADER, ts.to_string())
                .header(crate::report::SIGNATURE_HEADER, sig)
                .body(Body::empty())
                .unwrap()
        };
        let view = |resp: axum::response::Response| async {
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            let signed: crate::report::heartbeat::SignedView =
                serde_json::from_slice(&body).unwrap();
            signed.verify(&key, "n1").unwrap()
        };
        let mono = crate::clock::mono_ns;
        let marked_path = "/1/peers?echo=0&probe=3&marked=n1";
        let wrong = Key::from_bytes(vec![2; 32]);
        for req in [
            probe(&wrong, "n1", marked_path, now_ns()),
            probe(&key, "n2", marked_path, now_ns()),
            Request::get(marked_path).body(Body::empty()).unwrap(),
        ] {
            let resp = c.router().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "the view is served anyway");
            let v = view(resp).await;
            assert_eq!(
                (v.beat, v.answers),
                (0, 0),
                "nothing to echo, nothing answered"
            );
            let (contact, marked, _) = c.peers.feed_view(mono());
            assert!(contact.is_none() && !marked);
        }
        // A signed probe gets a view with a beat that answers it; no contact yet (no echo), and
        // its marks are not taken: it echoes no view of this node. Its timestamp is an hour
        // off, which no check compares with this clock.
        let stale = now_ns() - 3_600_000_000_000;
        let unechoed = probe(&key, "n1", "/1/peers?echo=0&probe=7&marked=n1", stale);
        let v = view(c.router().oneshot(unechoed).await.unwrap()).await;
        assert_eq!(v.answers, 7);
        assert_eq!(c.peers.feed_view(mono()).0, None);
        assert!(!c.peers.feed_view(mono()).1, "no echo, no mark");
        let good = probe(&key, "n1", "/1/peers?echo=0&probe=8&marked=", now_ns());
        let replay = good.headers().clone();
        let taken = mono();
        let first = view(c.router().oneshot(good).await.unwrap()).await;
        assert_eq!(first.answers, 8);
        assert_ne!(first.beat, 0);
        assert!(c.peers.feed_view(mono()).0.is_none());
        // An echo of a beat this node never sent counts for nothing.
        let path = format!("/1/peers?echo={}&probe=9&marked=", first.beat + 1000);
        c.router()
            .oneshot(probe(&key, "n1", &path, now_ns()))
            .await
            .unwrap();
        assert!(c.peers.feed_view(mono()).0.is_none());
        // The echo of that view: contact as of when the view was taken, not when the echo came.
        let path = format!("/1/peers?echo={}&probe=10&marked=", first.beat);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let echoed_at = mono();
        c.router()
            .oneshot(probe(&key, "n1", &path, now_ns()))
            .await
            .unwrap();
        let contact = c.peers.feed_view(mono()).0.expect("contact");
        assert!(
            contact >= taken && contact < echoed_at,
            "{taken} <= {contact} < {echoed_at}"
        );
        // The same signed probe again, now with the mark in its query: refused (the query is
        // signed, and the signature is taken once).
        let mut again = Request::get(marked_path).body(Body::empty()).unwrap();
        *again.headers_mut() = replay;
        c.router().oneshot(again).await.unwrap();
        assert!(!c.peers.feed_view(mono()).1);
        // A mark echoing no view of this node is not taken; one echoing a recent view is.
        c.router()
            .oneshot(probe(&key, "n1", marked_path, now_ns()))
            .await
            .unwrap();
        assert!(!c.peers.feed_view(mono()).1, "no echo, no mark");
        let path = format!("/1/peers?echo={}&probe=11&marked=n1", first.beat);
        c.router()
            .oneshot(probe(&key, "n1", &path, stale))
            .await
            .unwrap();
        assert!(
            c.peers.feed_view(mono()).1,
            "a signed mark echoing a recent view"
        );
    }
}
