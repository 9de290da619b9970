//! How the daemon reaches a collector: one narrow trait for its three conversations (the signed
//! report, the liveness probe, live repairs). Production speaks HTTP (`HttpLink`); the
//! simulated-time harness answers in memory, so the poller, the fencer and the engine run there
//! without a socket.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};

use crate::http::client::{GetError, KeptClient, get};
use crate::node::{NodeConfig, collector_address};
use crate::report::keyring::Keyring;
use crate::report::{SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};

mod udp;
#[cfg(test)]
pub use udp::UdpOutcome;
pub use udp::{UdpCounts, UdpPoll, UdpPolled, udp_patience};

/// A collector's answer: the HTTP status and the body, read up to the caller's cap.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: http::StatusCode,
    pub body: Vec<u8>,
}

/// Why no usable answer came back.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Nothing answered (refused, timed out, unreachable).
    #[error("no answer: {0}")]
    Down(String),
    /// An answer started but broke off.
    #[error("broken answer: {0}")]
    Broken(String),
    #[error("body is over the {cap}-byte cap")]
    TooLarge { cap: usize },
}

#[async_trait::async_trait]
pub trait CollectorLink: Send + Sync + 'static {
    /// An unsigned GET of `path` (the report, the liveness probe).
    async fn get(&self, node: &NodeConfig, path: &str, cap: usize) -> Result<Answer, LinkError>;

    /// A request signed with the cluster key for the node (live repairs, peer sets, and the
    /// liveness probe, which tells the node what the master hears and has marked).
    async fn signed(
        &self,
        node: &NodeConfig,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError>;
}

/// Collectors over HTTP. The three conversations share one [`KeptClient`], so a collector the
/// poll and the probe both ask every cycle costs one kept connection, and the daemon's
/// descriptors stay bounded whatever the fleet's size.
pub struct HttpLink {
    conns: Arc<KeptClient>,
    /// Bounds each request, connect and body included.
    timeout: Duration,
    /// Each request is signed with its node's key.
    keys: Arc<Keyring>,
}

impl HttpLink {
    pub fn new(conns: Arc<KeptClient>, keys: Arc<Keyring>, timeout: Duration) -> HttpLink {
        HttpLink {
            conns,
            keys,
            timeout,
        }
    }

    /// Sends what `build` makes, tried again twice when the connection failed without a timeout
    /// if `again` allows it: a collector under a connection flood may close a kept or fresh
    /// connection to make room, and that must not read as a silent node. Timeouts are not
    /// retried (they are the caller's deadline).
    async fn send(
        &self,
        node: &NodeConfig,
        again: bool,
        build: impl Fn(HeaderValue) -> Result<hyper::Request<Full<Bytes>>, GetError>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        let address =
            || collector_address(&node.collector).map_err(|e| GetError::Address(e.to_string()));
        let mut attempt = 0;
        loop {
            let r = self
                .conns
                .send(&node.name, address, &build, cap, self.timeout)
                .await;
            match r {
                Ok((status, body)) => return Ok(Answer { status, body }),
                Err(e) if again && attempt < 2 && e.is_retryable() => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25 * attempt)).await;
                }
                Err(GetError::TooLarge { cap }) => return Err(LinkError::TooLarge { cap }),
                Err(e @ GetError::Body(_)) => return Err(LinkError::Broken(e.to_string())),
                Err(e) => return Err(LinkError::Down(e.to_string())),
            }
        }
    }
}

#[async_trait::async_trait]
impl CollectorLink for HttpLink {
    async fn get(&self, node: &NodeConfig, path: &str, cap: usize) -> Result<Answer, LinkError> {
        self.send(node, true, |host| get(path, host), cap).await
    }

    async fn signed(
        &self,
        node: &NodeConfig,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        let body = Bytes::from(body.unwrap_or_default());
        // Only a GET is tried again, as `get` is: it changes nothing if the first one got
        // through. Each try is signed afresh (a collector accepts a signature once).
        let again = method == http::Method::GET;
        let key = self
            .keys
            .signer(&node.name)
            .map_err(|e| LinkError::Down(e.to_string()))?;
        let build = |host| {
            let ts = now_ns();
            let sig = key.sign_request(&node.name, method.as_str(), path, ts, &body);
            let mut req = hyper::Request::builder()
                .method(method.clone())
                .uri(path)
                .header(HOST, host)
                .header(TIMESTAMP_HEADER, ts)
                .header(SIGNATURE_HEADER, sig);
            if !body.is_empty() {
                req = req.header(CONTENT_TYPE, "application/json");
            }
            req.body(Full::new(body.clone()))
                .map_err(|e| GetError::Address(format!("bad request path {path:?}: {e}")))
        };
        self.send(node, again, build, cap).await
    }
}

/// Liveness probes sent at once, at most.
pub const PROBES_IN_FLIGHT: usize = 256;

/// The daemon's three conversations with the collectors, each with its own deadline: the report
/// poll, live repairs, and the fencer's liveness probe.
pub struct Links {
    /// The poll over UDP, tried first when the daemon has it on.
    pub udp: Option<Arc<UdpPoll>>,
    pub poll: std::sync::Arc<dyn CollectorLink>,
    pub repair: std::sync::Arc<dyn CollectorLink>,
    pub probe: std::sync::Arc<dyn CollectorLink>,
}

impl Links {
    /// Over HTTP, with at most `connections` connections open to collectors. The poll's and
    /// the probe's requests in flight have room beside the kept ones, so the collectors beyond
    /// the kept set connect afresh without waiting. Each probe waits its own node's patience; the
    /// probe link's deadline is the longest of them.
    pub fn http(
        keys: &Arc<Keyring>,
        poll_timeout: Duration,
        probe_max: Duration,
        connections: usize,
        poll_concurrency: usize,
    ) -> Links {
        let keep = connections.saturating_sub(poll_concurrency + PROBES_IN_FLIGHT);
        let conns = Arc::new(KeptClient::new(keep, connections));
        let link = |t| Arc::new(HttpLink::new(conns.clone(), keys.clone(), t)) as Arc<_>;
        Links {
            udp: None,
            poll: link(poll_timeout),
            repair: link(Duration::from_secs(10)),
            probe: link(probe_max),
        }
    }

    /// One link for all three (the simulated-time harness answers in memory).
    #[cfg(test)]
    pub fn same(link: std::sync::Arc<dyn CollectorLink>) -> Links {
        Links {
            udp: None,
            poll: link.clone(),
            repair: link.clone(),
            probe: link,
        }
    }
}
