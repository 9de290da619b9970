//! Polls every collector concurrently (bounded, per-request timeout) and verifies each report:
//! size cap, HMAC, node binding, freshness and a strictly increasing sequence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tracing::{debug, warn};

use crate::config::Config;
use crate::core::{Observation, Observations};
use crate::http::{BodyError, read_capped};
use crate::report::{Envelope, Key, ReportError, VerifyRules, canonical_json, now_ns};
use crate::store::{NodeUpdate, Store, StoreError};

use super::metrics::{Metrics, ReasonLabel};
use super::nodes::Members;

#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub url: String,
}

pub struct Poller {
    client: reqwest::Client,
    key: Key,
    members: Arc<Members>,
    rules: VerifyRules,
    concurrency: usize,
    seqs: Arc<Seqs>,
    store: Arc<Store>,
    metrics: Metrics,
}

/// The last accepted report sequence per node, shared with the API's reset.
pub struct Seqs(Mutex<HashMap<String, u64>>);

impl Seqs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn get(&self, node: &str) -> Option<u64> {
        self.lock().get(node).copied()
    }
    fn set(&self, node: &str, seq: u64) {
        self.lock().insert(node.to_string(), seq);
    }
    /// Forgets `node`'s sequence in the store and in memory; returns what it was.
    pub fn reset(&self, store: &Store, node: &str) -> Result<Option<u64>, StoreError> {
        let mut m = self.lock();
        let stored = store.reset_seq(node)?;
        Ok(m.remove(node).or(stored))
    }
}

/// One poll's verdict on one node.
enum Polled {
    Verified(Box<crate::report::VerifiedReport>),
    Rejected(String),
    /// Answered, but without a report (e.g. no diagnose has run yet).
    NoReport(String),
    Down(String),
}

fn rejection_label(e: &ReportError) -> &'static str {
    match e {
        ReportError::BadSignature => "signature",
        ReportError::WrongNode { .. } => "node",
        ReportError::Stale { .. } => "stale",
        ReportError::Replay { .. } => "replay",
        ReportError::TooLarge { .. } => "size",
        _ => "malformed",
    }
}

impl Poller {
    pub fn new(
        cfg: &Config,
        members: Arc<Members>,
        key: Key,
        store: Arc<Store>,
        metrics: Metrics,
    ) -> Result<Poller, StoreError> {
        Poller::with_members(
            members,
            key,
            VerifyRules {
                window_s: cfg.daemon.report_window.as_secs(),
                max_bytes: cfg.daemon.max_report_bytes,
            },
            cfg.daemon.poll_concurrency,
            cfg.daemon.poll_timeout,
            store,
            metrics,
        )
    }

    pub fn with_members(
        members: Arc<Members>,
        key: Key,
        rules: VerifyRules,
        concurrency: usize,
        timeout: Duration,
        store: Arc<Store>,
        metrics: Metrics,
    ) -> Result<Poller, StoreError> {
        let seqs = store.last_seqs()?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_max_idle_per_host(1)
            .build()
            .expect("a plain HTTP client always builds");
        Ok(Poller {
            client,
            key,
            members,
            rules,
            concurrency,
            seqs: Arc::new(Seqs(Mutex::new(seqs))),
            store,
            metrics,
        })
    }

    pub fn seqs(&self) -> Arc<Seqs> {
        self.seqs.clone()
    }

    /// Polls every node once, records what it learned, and returns the observations.
    pub async fn poll_all(&self) -> Observations {
        let start = Instant::now();
        let targets: Vec<Target> = self
            .members
            .get()
            .iter()
            .map(|n| Target {
                name: n.name.clone(),
                url: n.collector_url("/1/report/diagnose"),
            })
            .collect();
        let targets = &targets;
        // Indices, not references, keep the stream's futures free of higher-ranked lifetimes.
        let results: Vec<(String, Polled)> = futures::stream::iter(0..targets.len())
            .map(|i| async move {
                let t = &targets[i];
                (t.name.clone(), self.poll_one(t).await)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let mut obs = Observations::new();
        let mut updates = Vec::with_capacity(results.len());
        let mut down = 0;
        for (name, p) in results {
            let mut u = NodeUpdate {
                name: name.clone(),
                ..Default::default()
            };
            let o = match p {
                Polled::Verified(r) => {
                    u.answered = true;
                    u.seq = Some(r.envelope.seq);
                    u.report = Some(canonical_json(&r.envelope.data));
                    u.diagnosed_ns = Some(r.envelope.diagnosed_at);
                    u.diagnose_error = r.envelope.diagnose_error.clone();
                    // A broken diagnose says nothing about the hardware.
                    if r.envelope.diagnose_error.is_some() {
                        Observation::Unknown
                    } else {
                        Observation::Report(r.verdict)
                    }
                }
                Polled::Rejected(why) => {
                    u.answered = true;
                    u.rejection = Some(why);
                    Observation::Unknown
                }
                Polled::NoReport(why) => {
                    u.answered = true;
                    u.error = Some(why);
                    Observation::Unknown
                }
                Polled::Down(why) => {
                    down += 1;
                    u.error = Some(why);
                    Observation::Unknown
                }
            };
            obs.reports.insert(name, o);
            updates.push(u);
        }
        if let Err(e) = self.store.record_polls(&updates, now_ns()) {
            warn!(error = %e, "cannot record poll results");
        }
        self.metrics.nodes_unreachable.set(down);
        self.metrics
            .poll_cycle_seconds
            .observe(start.elapsed().as_secs_f64());
        obs
    }

    async fn poll_one(&self, t: &Target) -> Polled {
        let resp = match self.client.get(&t.url).send().await {
            Ok(r) => r,
            Err(e) => {
                debug!(node = %t.name, error = %e, "collector did not answer");
                return Polled::Down(format!("no answer: {e}"));
            }
        };
        let status = resp.status();
        let body = match read_capped(resp, self.rules.max_bytes).await {
            Ok(b) => b,
            Err(BodyError::TooLarge { cap }) => {
                return self.reject(t, ReportError::TooLarge { size: cap + 1, cap });
            }
            Err(BodyError::Transport(e)) => return Polled::Down(format!("broken answer: {e}")),
        };
        if !status.is_success() {
            return Polled::NoReport(crate::http::error_message(status, &body));
        }
        let last = self.seqs.get(&t.name);
        match Envelope::verify(&body, &self.key, &t.name, last, now_ns(), self.rules) {
            Ok(r) => {
                // Polls of one node never overlap (one per cycle), so check-then-set is safe.
                self.seqs.set(&t.name, r.envelope.seq);
                self.metrics.reports_accepted.inc();
                Polled::Verified(Box::new(r))
            }
            Err(e) => self.reject(t, e),
        }
    }

    fn reject(&self, t: &Target, e: ReportError) -> Polled {
        warn!(node = %t.name, reason = %e, "report rejected");
        self.metrics
            .reports_rejected
            .get_or_create(&ReasonLabel {
                reason: rejection_label(&e).into(),
            })
            .inc();
        Polled::Rejected(e.to_string())
    }
}
