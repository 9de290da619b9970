//! How the daemon reaches a collector: one narrow trait for its three conversations (the signed
//! report, the liveness probe, live repairs). Production speaks HTTP (`HttpLink`); the
//! simulated-time harness answers in memory, so the poller, the fencer and the engine run there
//! without a socket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};

use crate::http::client::{GetError, KeptClient, get};
use crate::node::{NodeConfig, collector_address};
use crate::report::{Key, SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};
use crate::sync::LockExt;

/// A collector's answer: the HTTP status and the body, read up to the caller's cap.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: reqwest::StatusCode,
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
        method: reqwest::Method,
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
    key: Key,
}

impl HttpLink {
    pub fn new(conns: Arc<KeptClient>, key: Key, timeout: Duration) -> HttpLink {
        HttpLink {
            conns,
            key,
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
        let address = || collector_address(&node.collector).map_err(|e| e.to_string());
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
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        let body = Bytes::from(body.unwrap_or_default());
        // Only a GET is tried again, as `get` is: it changes nothing if the first one got
        // through. Each try is signed afresh (a collector accepts a signature once).
        let again = method == reqwest::Method::GET;
        let build = |host| {
            let ts = now_ns();
            let sig = self
                .key
                .sign_request(&node.name, method.as_str(), path, ts, &body);
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

/// The report poll over UDP: one socket per address family for the whole fleet, a signed
/// request per node and cycle, the answer paired to its request by a random nonce. A node whose
/// collector does not answer over UDP (down, switched off, an older version, a firewall, a lost
/// datagram) is asked over HTTP only for a while, so its polls do not wait for UDP each cycle.
pub struct UdpPoll {
    v4: Arc<tokio::net::UdpSocket>,
    v6: Option<Arc<tokio::net::UdpSocket>>,
    key: Key,
    /// How long an answer is awaited before the poll goes over HTTP.
    patience: Duration,
    waiting: Waiting,
    http_only: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Each collector's address as resolved, with the text it was resolved from.
    resolved: std::sync::Mutex<HashMap<String, (String, std::net::SocketAddr)>>,
    receivers: Vec<tokio::task::AbortHandle>,
    counts: UdpCounts,
    /// Requests awaiting their answer at once, at most: no more answers arrive together than
    /// the receive buffer holds, so none is dropped for want of room.
    in_flight: tokio::sync::Semaphore,
    nonces: std::sync::atomic::AtomicU64,
    /// Keyed from the system's randomness once, per process.
    nonce_key: std::hash::RandomState,
}

/// The receive buffer asked for (the kernel may give less).
const RECEIVE_BUFFER: usize = 4 << 20;

/// What became of UDP polls: `answered`, `ask-http` and `no-answer` (both then asked over
/// HTTP), `http-only` (not asked over UDP for now), and `stray` (an answer that matched no
/// waiting request: late, duplicated or forged; dropped).
pub type UdpCounts = prometheus_client::metrics::family::Family<
    UdpOutcome,
    prometheus_client::metrics::counter::Counter,
>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UdpOutcome {
    pub outcome: &'static str,
}

fn count(counts: &UdpCounts, outcome: &'static str) {
    counts.get_or_create(&UdpOutcome { outcome }).inc();
}

/// How a UDP poll went.
#[derive(Debug, PartialEq, Eq)]
pub enum UdpPolled {
    /// The answer's signed report, still to be verified.
    Report(Vec<u8>),
    /// Ask over HTTP: the report does not fit, no answer came, or the node is asked over HTTP
    /// for now.
    Http,
}

/// How long a UDP poll waits for its answer before it asks over HTTP: a quarter of the poll's
/// deadline, at most half a second (an answer on a LAN takes well under a millisecond).
pub fn udp_patience(poll_timeout: Duration) -> Duration {
    (poll_timeout / 4).min(Duration::from_millis(500))
}

/// How long a node that did not answer over UDP is asked over HTTP only.
const HTTP_ONLY_FOR: Duration = Duration::from_secs(60);

impl UdpPoll {
    /// Binds the sockets (IPv6 only where the host has it) and starts their receivers. Must
    /// run within the runtime.
    pub fn bind(key: Key, patience: Duration, counts: UdpCounts) -> std::io::Result<UdpPoll> {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt::RcvBuf};
        let mut room = usize::MAX;
        let mut bind = |addr: &str| -> std::io::Result<Arc<tokio::net::UdpSocket>> {
            let s = std::net::UdpSocket::bind(addr)?;
            s.set_nonblocking(true)?;
            // Answers to a whole wave of requests arrive together; the kernel caps this at
            // net.core.rmem_max, and the requests in flight are bounded by what it gave.
            let _ = setsockopt(&s, RcvBuf, &RECEIVE_BUFFER);
            room = room.min(getsockopt(&s, RcvBuf).unwrap_or(RECEIVE_BUFFER / 16));
            Ok(Arc::new(tokio::net::UdpSocket::from_std(s)?))
        };
        let v4 = bind("0.0.0.0:0")?;
        let v6 = bind("[::]:0").ok();
        // Each datagram held costs the buffer about 4 KiB of kernel memory, whatever its size.
        let in_flight = (room / 4096).clamp(16, 1024);
        let waiting: Waiting = Default::default();
        let receivers = std::iter::once(&v4)
            .chain(v6.as_ref())
            .map(|s| {
                let (s, waiting, counts) = (s.clone(), waiting.clone(), counts.clone());
                tokio::spawn(receive(s, waiting, counts)).abort_handle()
            })
            .collect();
        Ok(UdpPoll {
            v4,
            v6,
            key,
            patience,
            waiting,
            http_only: Default::default(),
            resolved: Default::default(),
            receivers,
            counts,
            in_flight: tokio::sync::Semaphore::new(in_flight),
            nonces: Default::default(),
            nonce_key: Default::default(),
        })
    }

    /// A nonce nobody off the path can guess: a counter under a keyed hash (a system call for
    /// fresh randomness per poll would cost more than the rest of the request).
    fn nonce(&self) -> u64 {
        use std::hash::BuildHasher;
        let n = self
            .nonces
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.nonce_key.hash_one(n)
    }

    /// Asks `node` for its report over UDP.
    pub async fn ask(&self, node: &NodeConfig) -> UdpPolled {
        let now = std::time::Instant::now();
        if self
            .http_only
            .lock_unpoisoned()
            .get(&node.name)
            .is_some_and(|until| now < *until)
        {
            count(&self.counts, "http-only");
            return UdpPolled::Http;
        }
        let Some(addr) = self.resolve(node).await else {
            return UdpPolled::Http;
        };
        let socket = match (addr, &self.v6) {
            (std::net::SocketAddr::V4(_), _) => &self.v4,
            (std::net::SocketAddr::V6(_), Some(v6)) => v6,
            (std::net::SocketAddr::V6(_), None) => return UdpPolled::Http,
        };
        let _turn = self.in_flight.acquire().await.expect("never closed");
        let nonce = self.nonce();
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiting.lock_unpoisoned().insert(nonce, tx);
        let request = crate::report::poll::request(&self.key, &node.name, nonce, now_ns());
        let sent = socket.send_to(&request, addr).await;
        let got = match sent {
            Ok(_) => tokio::time::timeout(self.patience, rx)
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        self.waiting.lock_unpoisoned().remove(&nonce);
        let (outcome, polled) = match got {
            Some(Some(report)) => ("answered", UdpPolled::Report(report)),
            Some(None) => ("ask-http", UdpPolled::Http),
            None => {
                let until = std::time::Instant::now() + HTTP_ONLY_FOR;
                self.http_only
                    .lock_unpoisoned()
                    .insert(node.name.clone(), until);
                // Resolved again next time: the name may point elsewhere now.
                self.resolved.lock_unpoisoned().remove(&node.name);
                ("no-answer", UdpPolled::Http)
            }
        };
        count(&self.counts, outcome);
        polled
    }

    async fn resolve(&self, node: &NodeConfig) -> Option<std::net::SocketAddr> {
        if let Some((text, addr)) = self.resolved.lock_unpoisoned().get(&node.name)
            && *text == node.collector
        {
            return Some(*addr);
        }
        let hostport = collector_address(&node.collector).ok()?;
        let addr = match hostport.parse() {
            Ok(a) => a,
            Err(_) => tokio::net::lookup_host(hostport.as_str())
                .await
                .ok()?
                .next()?,
        };
        self.resolved
            .lock_unpoisoned()
            .insert(node.name.clone(), (node.collector.clone(), addr));
        Some(addr)
    }
}

impl Drop for UdpPoll {
    fn drop(&mut self) {
        for r in &self.receivers {
            r.abort();
        }
    }
}

/// The requests awaiting an answer, by nonce: each gets the report's bytes, or `None` to ask
/// over HTTP.
type Waiting = Arc<std::sync::Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Option<Vec<u8>>>>>>;

/// Hands each answer to the request waiting for its nonce; anything else is counted and dropped.
async fn receive(socket: Arc<tokio::net::UdpSocket>, waiting: Waiting, counts: UdpCounts) {
    // One byte over the largest answer, so an oversized datagram is seen as such.
    let mut buf = vec![0u8; crate::report::poll::MAX_REPORT + 13];
    loop {
        let n = match socket.recv_from(&mut buf).await {
            Ok((n, _)) => n,
            Err(_) => {
                // An ICMP error from an earlier send (a node that is down): nothing to read.
                tokio::task::yield_now().await;
                continue;
            }
        };
        // Read once here: the waiting request gets the report's bytes (or `None`: ask over
        // HTTP), copied out of the buffer once.
        let answer = match crate::report::poll::read_answer(&buf[..n]) {
            Some((nonce, a)) if n < buf.len() => Some((nonce, a)),
            _ => None,
        };
        let waiter = answer.and_then(|(nonce, a)| {
            let tx = waiting.lock_unpoisoned().remove(&nonce)?;
            Some((tx, a))
        });
        match waiter {
            Some((tx, crate::report::poll::Answer::Report(r))) => {
                let _ = tx.send(Some(r.to_vec()));
            }
            Some((tx, crate::report::poll::Answer::AskHttp)) => {
                let _ = tx.send(None);
            }
            None => count(&counts, "stray"),
        }
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
        key: &Key,
        poll_timeout: Duration,
        probe_max: Duration,
        connections: usize,
        poll_concurrency: usize,
    ) -> Links {
        let keep = connections.saturating_sub(poll_concurrency + PROBES_IN_FLIGHT);
        let conns = Arc::new(KeptClient::new(keep, connections));
        let link = |t| Arc::new(HttpLink::new(conns.clone(), key.clone(), t)) as Arc<_>;
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
