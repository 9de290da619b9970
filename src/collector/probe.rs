//! The collector's peering endpoints: the leader's signed peer set (`PUT /1/peers`) and the
//! liveness probe (`GET /1/peers`), whose signed query tells the node whether the master hears it
//! and which nodes are marked for self-fencing.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use tracing::info;

use super::Collector;
use crate::exec;
use crate::http::{ApiError, parse_json};
use crate::report::now_ns;

/// A peer set of 64 peers with long names and addresses stays well under this.
pub(super) const PEER_SET_CAP: usize = 16 * 1024;

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

/// Names the master may mark in one probe (more are ignored).
const MAX_MARKED: usize = 64;

/// The liveness probe. Anyone may read the signed view; a probe signed by the master also says
/// whether the master hears this node and which nodes it has marked for fencing, which the
/// watchdog's rules read. A forged or replayed signature is ignored, never an error: the view
/// is served either way.
pub(super) async fn peer_view(
    State(c): State<Arc<Collector>>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> Json<crate::report::heartbeat::SignedView> {
    let now = now_ns();
    if headers.contains_key(crate::report::SIGNATURE_HEADER) {
        match c.master_probe(&headers, &uri, now) {
            Ok((hears, marked)) => c.peers.master_probe(hears, marked, now),
            Err(e) => tracing::debug!(error = %e, "master probe signature refused"),
        }
    }
    Json(c.peers.view(now))
}

/// `hears=1&marked=a,b`: names that are not valid node names are dropped.
pub(super) fn probe_query(q: &str) -> (bool, std::collections::BTreeSet<String>) {
    let mut hears = false;
    let mut marked = std::collections::BTreeSet::new();
    for (k, v) in q.split('&').filter_map(|kv| kv.split_once('=')) {
        match k {
            "hears" => hears = v == "1",
            "marked" => marked.extend(
                v.split(',')
                    .filter(|n| exec::validate_name(n).is_ok())
                    .take(MAX_MARKED)
                    .map(String::from),
            ),
            _ => {}
        }
    }
    (hears, marked)
}

impl Collector {
    fn master_probe(
        &self,
        headers: &axum::http::HeaderMap,
        uri: &axum::http::Uri,
        now: i64,
    ) -> Result<(bool, std::collections::BTreeSet<String>), String> {
        let h = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let req = crate::report::SignedRequest {
            target: &self.node,
            method: "GET",
            path,
            timestamp: h(crate::report::TIMESTAMP_HEADER),
            signature: h(crate::report::SIGNATURE_HEADER),
            body: b"",
        };
        let window = self.cfg.request_window.as_secs();
        crate::report::check_signed_request(&self.key, &req, now, window)
            .map_err(|e| e.to_string())?;
        let ts = h(crate::report::TIMESTAMP_HEADER)
            .and_then(|t| t.parse().ok())
            .unwrap_or_default();
        self.replay
            .check_and_remember(req.signature.unwrap_or_default(), ts, now, window)
            .map_err(|_| "replayed or too many probes".to_string())?;
        Ok(probe_query(uri.query().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Key;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    #[test]
    fn a_probe_query_keeps_only_valid_names() {
        let (hears, marked) = probe_query("hears=1&marked=n1,../x,,n2&other=3");
        assert!(hears);
        assert_eq!(marked.into_iter().collect::<Vec<_>>(), ["n1", "n2"]);
        let (hears, marked) = probe_query("hears=0&marked=");
        assert!(!hears && marked.is_empty());
    }

    #[tokio::test]
    async fn only_a_signed_fresh_unreplayed_probe_tells_the_node_the_master_hears_or_marks_it() {
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
        let marked_path = "/1/peers?hears=1&marked=n1";
        let wrong = Key::from_bytes(vec![2; 32]);
        let stale = now_ns() - 3_600_000_000_000;
        for req in [
            probe(&wrong, "n1", marked_path, now_ns()),
            probe(&key, "n2", marked_path, now_ns()),
            probe(&key, "n1", marked_path, stale),
            Request::get(marked_path).body(Body::empty()).unwrap(),
        ] {
            let resp = c.router().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "the view is served anyway");
            let (contact, marked, _) = c.peers.feed_view(now_ns());
            assert!(contact.is_none() && !marked);
        }
        let good = probe(&key, "n1", "/1/peers?hears=1&marked=", now_ns());
        let replay = good.headers().clone();
        c.router().oneshot(good).await.unwrap();
        let (contact, marked, _) = c.peers.feed_view(now_ns());
        assert!(contact.is_some() && !marked);
        // The same signed probe again, now with the mark in its query: refused (the query is
        // signed, and the signature is taken once).
        let mut again = Request::get(marked_path).body(Body::empty()).unwrap();
        *again.headers_mut() = replay;
        c.router().oneshot(again).await.unwrap();
        assert!(!c.peers.feed_view(now_ns()).1);
        c.router()
            .oneshot(probe(&key, "n1", marked_path, now_ns()))
            .await
            .unwrap();
        assert!(c.peers.feed_view(now_ns()).1, "a signed mark is taken");
    }
}
