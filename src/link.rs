//! How the daemon reaches a collector: one narrow trait for its three conversations (the signed
//! report, the liveness probe, live repairs). Production speaks HTTP (`HttpLink`); the
//! simulated-time harness answers in memory, so the poller, the fencer and the engine run there
//! without a socket.

use std::time::Duration;

use crate::http::{BodyError, error_chain, read_capped, send_signed};
use crate::node::NodeConfig;
use crate::report::Key;

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

/// Collectors over HTTP, one client per component so each keeps its own deadline.
pub struct HttpLink {
    client: reqwest::Client,
    /// For the collectors beyond the keep-alive budget: a fresh connection each time, closed
    /// after the answer, so idle descriptors never exceed the budget.
    fresh: reqwest::Client,
    /// The collectors whose connection stays open between polls, first come, at most `keep`.
    kept: std::sync::Mutex<std::collections::HashSet<String>>,
    keep: usize,
    key: Key,
}

impl HttpLink {
    /// `timeout` bounds each request, connect included. Every collector keeps its connection.
    pub fn new(key: Key, timeout: Duration) -> HttpLink {
        HttpLink::bounded(key, timeout, usize::MAX)
    }

    /// At most `keep` collectors keep a connection open between requests. A poll visits every
    /// node in turn, so a least-recently-used pool smaller than the fleet would never hit: a
    /// fixed set keeps its connections and the others connect afresh.
    pub fn bounded(key: Key, timeout: Duration, keep: usize) -> HttpLink {
        let client = |idle| {
            reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(timeout)
                .pool_max_idle_per_host(idle)
                .build()
                .expect("a plain HTTP client always builds")
        };
        HttpLink {
            client: client(1),
            fresh: client(0),
            kept: Default::default(),
            keep,
            key,
        }
    }

    fn client_for(&self, node: &NodeConfig) -> &reqwest::Client {
        if self.keep == usize::MAX {
            return &self.client;
        }
        let mut kept = crate::sync::LockExt::lock_unpoisoned(&self.kept);
        if kept.contains(&node.name) {
            return &self.client;
        }
        if kept.len() < self.keep {
            kept.insert(node.name.clone());
            return &self.client;
        }
        &self.fresh
    }

    async fn read(resp: reqwest::Response, cap: usize) -> Result<Answer, LinkError> {
        let status = resp.status();
        match read_capped(resp, cap).await {
            Ok(body) => Ok(Answer { status, body }),
            Err(BodyError::TooLarge { cap }) => Err(LinkError::TooLarge { cap }),
            Err(BodyError::Transport(e)) => Err(LinkError::Broken(e.to_string())),
        }
    }
}

#[async_trait::async_trait]
impl CollectorLink for HttpLink {
    /// Tried again, twice, when the connection failed without a timeout: a collector under a
    /// connection flood may close a pooled or fresh connection to make room, and that must not
    /// read as a silent node. Timeouts are not retried (they are the caller's deadline).
    async fn get(&self, node: &NodeConfig, path: &str, cap: usize) -> Result<Answer, LinkError> {
        let url = node.collector_url(path);
        let client = self.client_for(node);
        let mut attempt = 0;
        loop {
            match client.get(&url).send().await {
                Err(e) if attempt < 2 && !e.is_timeout() => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25 * attempt)).await;
                }
                Err(e) => return Err(LinkError::Down(error_chain(&e))),
                Ok(resp) => return HttpLink::read(resp, cap).await,
            }
        }
    }

    async fn signed(
        &self,
        node: &NodeConfig,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        let base = node.collector_url("");
        let mut attempt = 0;
        loop {
            // Signed afresh each time (a collector accepts a signature once). Only a GET is
            // tried again, as `get` does: it changes nothing if the first one got through.
            let r = send_signed(
                &self.client,
                &self.key,
                &node.name,
                method.clone(),
                &base,
                path,
                body.clone(),
            )
            .await;
            match r {
                Err(e) if method == reqwest::Method::GET && attempt < 2 && !e.is_timeout() => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25 * attempt)).await;
                }
                Err(e) => return Err(LinkError::Down(error_chain(&e))),
                Ok(resp) => return HttpLink::read(resp, cap).await,
            }
        }
    }
}

/// The daemon's three conversations with the collectors, each with its own deadline: the report
/// poll, live repairs, and the fencer's liveness probe.
pub struct Links {
    pub poll: std::sync::Arc<dyn CollectorLink>,
    pub repair: std::sync::Arc<dyn CollectorLink>,
    pub probe: std::sync::Arc<dyn CollectorLink>,
}

impl Links {
    /// Over HTTP. Each probe waits its own node's patience; the client's deadline is the
    /// longest of them.
    /// The poll keeps at most `poll_keep` connections open between cycles.
    pub fn http(key: &Key, poll_timeout: Duration, probe_max: Duration, poll_keep: usize) -> Links {
        let link = |t| std::sync::Arc::new(HttpLink::new(key.clone(), t)) as std::sync::Arc<_>;
        Links {
            poll: std::sync::Arc::new(HttpLink::bounded(key.clone(), poll_timeout, poll_keep)),
            repair: link(Duration::from_secs(10)),
            probe: link(probe_max),
        }
    }

    /// One link for all three (the simulated-time harness answers in memory).
    #[cfg(test)]
    pub fn same(link: std::sync::Arc<dyn CollectorLink>) -> Links {
        Links {
            poll: link.clone(),
            repair: link.clone(),
            probe: link,
        }
    }
}
