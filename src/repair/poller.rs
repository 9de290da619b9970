//! Polls every collector concurrently (bounded, per-request timeout) and verifies each report:
//! size cap, HMAC, node binding, freshness (it answers the poll's own nonce; no clock is
//! compared) and a strictly increasing sequence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tracing::{debug, info, warn};

use crate::link::{Answer, CollectorLink, LinkError, UdpPoll, UdpPolled};
use crate::node::NodeConfig;
use crate::report::keyring::Keyring;
use crate::report::{Envelope, ReportError, VerifyRules};
use crate::store::{NodeUpdate, Store, StoreError};
use maintd_core::repair::{Observation, Observations};

use crate::members::Members;
use crate::metrics::RejectLabel;
use crate::repair::metrics::PollMetrics;
use crate::sync::LockExt;

/// What the poller needs of the configuration, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct PollSettings {
    /// The size cap every report is checked against.
    pub rules: VerifyRules,
    /// Collectors asked at the same time.
    pub concurrency: usize,
    /// Per-request deadline, connect included.
    pub timeout: Duration,
}

/// Where the report is served on a collector.
pub const REPORT_PATH: &str = "/1/report/diagnose";

pub struct Poller {
    link: Arc<dyn CollectorLink>,
    /// The poll over UDP, asked before `link` when the daemon has it.
    udp: Option<Arc<UdpPoll>>,
    /// Each node's report is checked under that node's keys.
    keys: Arc<Keyring>,
    members: Arc<Members>,
    rules: VerifyRules,
    concurrency: usize,
    seqs: Arc<Seqs>,
    /// Per node: answered at the last poll, and when a change was last logged.
    reach: Mutex<HashMap<String, (bool, Option<Instant>)>>,
    store: Arc<Store>,
    metrics: PollMetrics,
    health: Arc<crate::members::NodeHealth>,
    /// Stamps poll records.
    clock: Arc<dyn crate::clock::Clock>,
    /// The nonces of polls over HTTP (the UDP poll numbers its own): a report must answer the
    /// poll it came back to, so one captured earlier (before a restart too, while the store's
    /// sequence floors lag) is never taken for new.
    nonces: crate::report::poll::Nonces,
    /// What the store already holds, so a cycle writes only what changed.
    persisted: Mutex<super::persisted::Persisted>,
}

/// Reachability changes of one node are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The last accepted report sequence per node, shared with the API's reset.
pub struct Seqs(Mutex<HashMap<String, u64>>);

impl Seqs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.0.lock_unpoisoned()
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
    /// `first` when there was no sequence floor (a new node, or its floor was reset).
    Verified {
        report: Box<crate::report::VerifiedReport>,
        first: bool,
    },
    Rejected(String),
    /// Answered, but without a report (e.g. no diagnose has run yet).
    NoReport(String),
    Down(String),
}

fn rejection_label(e: &ReportError) -> &'static str {
    match e {
        ReportError::BadSignature => "signature",
        ReportError::WrongNode { .. } => "node",
        ReportError::Unanswered { .. } => "unanswered",
        ReportError::Replay { .. } => "replay",
        ReportError::TooLarge { .. } => "size",
        ReportError::Revoked(_) => "revoked",
        _ => "malformed",
    }
}

impl Poller {
    /// A poller that reaches the collectors through `link`, resuming from the stored sequences.
    pub fn new(
        settings: PollSettings,
        link: Arc<dyn CollectorLink>,
        keys: Arc<Keyring>,
        shared: &crate::parts::Shared,
        metrics: PollMetrics,
    ) -> Result<Poller, StoreError> {
        let PollSettings {
            rules, concurrency, ..
        } = settings;
        let seqs = shared.store.last_seqs()?;
        Ok(Poller {
            link,
            udp: None,
            keys,
            members: shared.members.clone(),
            rules,
            concurrency,
            seqs: Arc::new(Seqs(Mutex::new(seqs))),
            reach: Mutex::new(HashMap::new()),
            store: shared.store.clone(),
            metrics,
            health: shared.health.clone(),
            nonces: Default::default(),
            persisted: Default::default(),
            clock: shared.clock.clone(),
        })
    }

    /// Polls over UDP first, where `udp` is given.
    pub fn with_udp(mut self, udp: Option<Arc<UdpPoll>>) -> Poller {
        self.udp = udp;
        self
    }

    /// The names of the nodes polled now.
    pub fn member_names(&self) -> std::collections::BTreeSet<String> {
        self.members.get().iter().map(|n| n.name.clone()).collect()
    }

    pub fn seqs(&self) -> Arc<Seqs> {
        self.seqs.clone()
    }

    /// Polls every node once, records what it learned, and returns the observations.
    pub async fn poll_all(&self) -> Observations {
        let start = Instant::now();
        let targets = self.members.get();
        let mut polled: Vec<Option<Polled>> = targets.iter().map(|_| None).collect();
        let mut over_http = Vec::new();
        match &self.udp {
            Some(u) => {
                let asked = u.ask_all(targets.clone()).await;
                for (i, p) in asked.into_iter().enumerate() {
                    match p {
                        UdpPolled::Report { nonce, body } => {
                            let status = http::StatusCode::OK;
                            let answer = Ok(Answer { status, body });
                            polled[i] = Some(self.judge(&targets[i], answer, nonce));
                        }
                        UdpPolled::Http => over_http.push(i),
                    }
                }
            }
            None => over_http.extend(0..targets.len()),
        }
        let targets_ref = &targets;
        // Indices, not references, keep the stream's futures free of higher-ranked lifetimes.
        let fetched: Vec<(usize, Polled)> = futures::stream::iter(over_http)
            .map(|i| async move {
                let t = &targets_ref[i];
                let nonce = self.nonces.next();
                let path = format!("{REPORT_PATH}?nonce={nonce}");
                let answer = self.link.get(t, &path, self.rules.max_bytes).await;
                (i, self.judge(t, answer, nonce))
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (i, p) in fetched {
            polled[i] = Some(p);
        }
        let results = targets.iter().zip(polled).map(|(t, p)| {
            // Every node was asked one way or the other.
            let p = p.unwrap_or_else(|| Polled::Down("not asked".into()));
            (t.name.clone(), p)
        });
        let mut obs = Observations::new();
        let mut updates = Vec::with_capacity(results.len());
        let mut down = 0;
        for (name, p) in results {
            let mut u = NodeUpdate {
                name: name.clone(),
                ..Default::default()
            };
            let o = match p {
                Polled::Verified { report: r, first } => {
                    if first {
                        self.persisted.lock_unpoisoned().forget(&name);
                    }
                    u.answered = true;
                    u.seq = Some(r.envelope.seq);
                    u.report = Some(r.envelope.data.as_str().to_owned());
                    u.diagnosed_ns = Some(r.envelope.diagnosed_at);
                    u.diagnose_error = r.envelope.diagnose_error.clone();
                    u.boot = r.envelope.boot;
                    let ok = r.verdict.status == maintd_core::verdict::Status::Ok;
                    self.health.reported(
                        &name,
                        ok && u.diagnose_error.is_none(),
                        r.envelope.diagnosed_at,
                        r.envelope.boot,
                    );
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
        self.log_changes(&updates);
        let now = self.clock.now();
        self.health.heard(&updates, now);
        let updates = self.persisted.lock_unpoisoned().select(updates, now);
        if !updates.is_empty()
            && let Err(e) = self.store.record_polls(&updates, now)
        {
            warn!(error = %e, db = %self.store.path(), "cannot record poll results");
            // Written again next cycle, whatever it says then.
            let mut persisted = self.persisted.lock_unpoisoned();
            for u in &updates {
                persisted.forget(&u.name);
            }
        }
        self.metrics.nodes_unreachable.set(down);
        self.metrics
            .poll_cycle_seconds
            .observe(start.elapsed().as_secs_f64());
        obs
    }

    /// Judges what one collector answered to the poll numbered `asked`: its report, verified,
    /// or why there is none.
    fn judge(&self, t: &NodeConfig, answer: Result<Answer, LinkError>, asked: u64) -> Polled {
        let Answer { status, body } = match answer {
            Ok(a) => a,
            Err(LinkError::TooLarge { cap }) => {
                return self.reject(t, ReportError::TooLarge { size: cap + 1, cap });
            }
            Err(e) => {
                debug!(node = %t.name, error = %e, "collector did not answer");
                self.metrics.polls_failed.inc();
                return Polled::Down(e.to_string());
            }
        };
        if !status.is_success() {
            return Polled::NoReport(crate::http::error_message(status, &body));
        }
        let keys = match self.keys.verifiers(&t.name) {
            Ok(k) => k,
            Err(e) => return self.reject(t, ReportError::Revoked(e.to_string())),
        };
        let last = self.seqs.get(&t.name);
        match Envelope::verify(&body, &keys, &t.name, last, asked, self.rules) {
            Ok(r) => {
                // Polls of one node never overlap (one per cycle), so check-then-set is safe.
                self.seqs.set(&t.name, r.envelope.seq);
                self.metrics.reports_accepted.inc();
                Polled::Verified {
                    report: Box::new(r),
                    first: last.is_none(),
                }
            }
            Err(e) => self.reject(t, e),
        }
    }

    /// Logs each node that stops or starts answering, at most once per node every
    /// [`LOG_EVERY`], so a flapping or flooded collector cannot flood the log.
    fn log_changes(&self, updates: &[NodeUpdate]) {
        let mut seen = self.reach.lock_unpoisoned();
        for u in updates {
            // Looked up before inserting: a steady fleet allocates no key per node and cycle.
            let e = match seen.get_mut(&u.name) {
                Some(e) => e,
                None => seen.entry(u.name.clone()).or_insert((true, None)),
            };
            if e.0 == u.answered {
                continue;
            }
            e.0 = u.answered;
            if e.1.is_some_and(|t: Instant| t.elapsed() < LOG_EVERY) {
                continue;
            }
            e.1 = Some(Instant::now());
            if u.answered {
                info!(node = %u.name, "collector answers again");
            } else {
                warn!(node = %u.name, error = u.error.as_deref().unwrap_or(""), "collector stopped answering");
            }
        }
    }

    fn reject(&self, t: &NodeConfig, e: ReportError) -> Polled {
        warn!(node = %t.name, reason = %e, "report rejected");
        self.metrics
            .reports_rejected
            .get_or_create(&RejectLabel {
                reason: rejection_label(&e),
                node: t.name.clone(),
            })
            .inc();
        Polled::Rejected(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::report::Key;
    use maintd_core::verdict::Verdict;

    /// A collector behind an on-path attacker: it signs a report answering the nonce in the
    /// poll's path, with the next sequence, unless the attacker plays back a captured body.
    struct Path {
        key: Key,
        seq: Mutex<u64>,
        played: Mutex<Option<Vec<u8>>>,
        captured: Mutex<Vec<Vec<u8>>>,
    }

    #[async_trait::async_trait]
    impl CollectorLink for Path {
        async fn get(&self, _: &NodeConfig, path: &str, _: usize) -> Result<Answer, LinkError> {
            let body = match self.played.lock_unpoisoned().clone() {
                Some(b) => b,
                None => {
                    let nonce = path
                        .split_once("?nonce=")
                        .and_then(|(_, n)| n.parse().ok())
                        .unwrap_or(0);
                    let mut seq = self.seq.lock_unpoisoned();
                    *seq += 1;
                    let ok = Verdict::builtin_ok();
                    let env = Envelope::new("n1", *seq, 0, 0, &ok, None).answering(nonce);
                    serde_json::to_vec(&env.sign(&self.key)).unwrap()
                }
            };
            self.captured.lock_unpoisoned().push(body.clone());
            Ok(Answer {
                status: http::StatusCode::OK,
                body,
            })
        }
        async fn signed(
            &self,
            _: &NodeConfig,
            _: http::Method,
            _: &str,
            _: Option<Vec<u8>>,
            _: usize,
        ) -> Result<Answer, LinkError> {
            Err(LinkError::Down("not used".into()))
        }
    }

    const S: i64 = 1_000_000_000;

    #[tokio::test]
    async fn only_a_report_answering_this_poll_is_taken_whatever_the_clocks_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
        let key = Key::from_bytes(vec![7; 32]);
        let members = Arc::new(Members::new(vec![NodeConfig {
            name: "n1".into(),
            collector: "127.0.0.1:1".into(),
        }]));
        let clock = Arc::new(ManualClock::new(1_000 * S));
        let mut shared = crate::parts::Shared::standalone(store.clone(), members);
        shared.clock = clock.clone();
        let settings = PollSettings {
            rules: VerifyRules {
                max_bytes: 64 * 1024,
            },
            concurrency: 4,
            timeout: Duration::from_secs(1),
        };
        let link = Arc::new(Path {
            key: key.clone(),
            seq: Mutex::new(9),
            played: Mutex::new(None),
            captured: Mutex::default(),
        });
        let accepted = |o: &Observations| matches!(o.reports["n1"], Observation::Report(_));
        let rejection = || store.nodes().unwrap().remove(0).last_rejection;
        let poller = Poller::new(
            settings.clone(),
            link.clone(),
            Keyring::arc(key.clone()),
            &shared,
            PollMetrics::register(&mut Default::default()),
        )
        .unwrap();
        // Signed at the Unix epoch by the node's clock: it answers the poll, so it is fresh.
        for _ in 0..2 {
            clock.advance(Duration::from_secs(1));
            assert!(accepted(&poller.poll_all().await));
        }
        // Only the first was written: the second said the same.
        assert_eq!(store.last_seqs().unwrap()["n1"], 10);
        let second = link.captured.lock_unpoisoned()[1].clone();

        // A restart: the new poller takes the lagging floor, 10. The captured report, seq 11,
        // is above it and was signed moments ago, and is still refused: it answers another poll.
        clock.advance(Duration::from_secs(1));
        let poller = Poller::new(
            settings,
            link.clone(),
            Keyring::arc(key.clone()),
            &shared,
            PollMetrics::register(&mut Default::default()),
        )
        .unwrap();
        *link.played.lock_unpoisoned() = Some(second);
        assert!(!accepted(&poller.poll_all().await));
        assert!(
            rejection().is_some_and(|r| r.contains("not the poll")),
            "{:?}",
            rejection()
        );
        // What the collector signs in answer now is taken, and written.
        *link.played.lock_unpoisoned() = None;
        assert!(accepted(&poller.poll_all().await));
        assert_eq!(store.last_seqs().unwrap()["n1"], 12);
        assert_eq!(
            poller
                .metrics
                .reports_rejected
                .get_or_create(&RejectLabel {
                    reason: "unanswered",
                    node: "n1".into()
                })
                .get(),
            1
        );
    }
}
