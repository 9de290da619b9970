//! Leadership: which replica acts. On Kubernetes a `coordination.k8s.io/v1` Lease elects one;
//! the leader checkpoints the decision state to a ConfigMap before every side effect and after
//! every change, and a standby imports it, so a successor resumes in-flight work instead of
//! starting it again. Elsewhere the one daemon (behind its master lock) always leads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::error;

use crate::clock::Clock;
use crate::cluster::Coordination;
use crate::store::Checkpoint;
use crate::sync::LockExt;

mod campaign;
mod election;
#[cfg(test)]
mod etcd_tests;
mod share;
pub use election::Election;
use maintd_core::verdict::Nanos;
use share::within_limit;
pub use share::{CheckpointError, LeaderMetrics};

/// Exit code of a replica that lost the lease: its supervisor restarts it as a standby.
pub const EXIT_LOST_LEADERSHIP: i32 = 12;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the leader lease ({0}); stopping so that only one replica acts")]
    Lost(String),
}

/// How long ago `t` was, on `CLOCK_BOOTTIME`.
fn span(from: Nanos, to: Nanos) -> Duration {
    Duration::from_nanos(to.saturating_sub(from).max(0) as u64)
}

pub struct Leadership {
    identity: String,
    election: Option<(Arc<dyn Coordination>, Election)>,
    /// Where the decision state is exported to and imported from.
    state: Arc<dyn Checkpoint>,
    leader: AtomicBool,
    /// Increments each time this replica becomes leader: the executors resume work per term.
    term: AtomicU64,
    holder: Mutex<Option<String>>,
    /// resourceVersion of the checkpoint last written or imported.
    state_version: Mutex<Option<String>>,
    last_written: tokio::sync::Mutex<String>,
    lost: Mutex<Option<String>>,
    lost_notify: Notify,
    /// When this replica last wrote the Lease as its holder (elected mode).
    /// When the lease was last renewed, on `CLOCK_BOOTTIME`: a replica suspended or stopped
    /// while it led sees the whole span when it wakes, and does not act.
    renewed: Mutex<Option<Nanos>>,
    /// The term, published: the executors' loops follow it and act at once when this replica
    /// becomes the leader.
    term_tx: watch::Sender<u64>,
    metrics: LeaderMetrics,
    /// What the election loop's last request to the store could not do (None once one
    /// succeeds): why no replica may be leading, for `/1/health` and `/1/leader`.
    problem: Mutex<Option<String>>,
    /// The steady clock spans are measured on (`CLOCK_BOOTTIME`-based; simulated in tests).
    clock: Arc<dyn Clock>,
}

impl Leadership {
    /// The only replica: leads from the start.
    pub fn single(identity: String, state: Arc<dyn Checkpoint>) -> Leadership {
        let l = Leadership::new(identity, None, state);
        l.leader.store(true, Ordering::SeqCst);
        l.term.store(1, Ordering::SeqCst);
        l.term_tx.send_replace(1);
        l
    }

    pub fn elected(
        coord: Arc<dyn Coordination>,
        cfg: Election,
        state: Arc<dyn Checkpoint>,
    ) -> Leadership {
        Leadership::new(cfg.identity.clone(), Some((coord, cfg)), state)
    }

    fn new(
        identity: String,
        election: Option<(Arc<dyn Coordination>, Election)>,
        state: Arc<dyn Checkpoint>,
    ) -> Leadership {
        Leadership {
            identity,
            election,
            state,
            leader: AtomicBool::new(false),
            term: AtomicU64::new(0),
            holder: Mutex::new(None),
            state_version: Mutex::new(None),
            last_written: tokio::sync::Mutex::new(String::new()),
            lost: Mutex::new(None),
            lost_notify: Notify::new(),
            renewed: Mutex::new(None),
            term_tx: watch::Sender::new(0),
            metrics: LeaderMetrics::new(),
            problem: Mutex::new(None),
            clock: Arc::new(crate::clock::SystemClock),
        }
    }

    /// The leadership term as it changes (the leader gate of the executors' loops).
    /// Measures its spans on `clock` instead of the system's steady clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Leadership {
        self.clock = clock;
        self
    }

    /// How long ago `t` was, on this leadership's steady clock.
    fn since(&self, t: Nanos) -> Duration {
        span(t, self.clock.now())
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.term_tx.subscribe()
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Leads, and (when elected) renewed the Lease within `renew-deadline`: a leader whose Lease
    /// is not fresh starts nothing, since another replica may take the Lease once it lapses.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
            && match &self.election {
                None => true,
                Some((_, cfg)) => self
                    .renewed
                    .lock_unpoisoned()
                    .is_some_and(|t| self.since(t) < cfg.renew_deadline),
            }
    }

    /// Holds leadership, fresh Lease or not (the election's own bookkeeping).
    fn leads(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    fn renewed_at(&self, sent: Nanos) {
        *self.renewed.lock_unpoisoned() = Some(sent);
    }

    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    pub fn elected_mode(&self) -> bool {
        self.election.is_some()
    }

    /// Which kind of lease elects this replica: `kubernetes`, `etcd`, or `single` (one daemon,
    /// behind its master lock).
    pub fn backend(&self) -> &'static str {
        self.election.as_ref().map_or("single", |(_, e)| e.backend)
    }

    /// Where the lease is (`Lease default/maintd`, `etcd …`).
    pub fn place(&self) -> Option<String> {
        self.election.as_ref().map(|(_, e)| e.place.clone())
    }

    /// The fencing token every write of this leader compares (etcd's term revision).
    pub fn token(&self) -> Option<i64> {
        self.election.as_ref().and_then(|(c, _)| c.token())
    }

    /// How long ago this replica last renewed its lease, on the steady clock.
    pub fn renewed_ago(&self) -> Option<Duration> {
        self.renewed.lock_unpoisoned().map(|t| self.since(t))
    }

    /// Who holds the lease, as last seen (this replica when it leads).
    pub fn holder(&self) -> Option<String> {
        if self.is_leader() {
            return Some(self.identity.clone());
        }
        self.holder.lock_unpoisoned().clone()
    }

    /// Why the last request of the election loop to the store failed, while it fails (an
    /// unreachable store, a lost quorum): no replica may be able to lead meanwhile.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock_unpoisoned().clone()
    }

    /// Resolves once leadership is lost; the daemon then exits rather than act twice.
    pub async fn lost(&self) -> String {
        loop {
            let notified = self.lost_notify.notified();
            if let Some(why) = self.lost.lock_unpoisoned().clone() {
                return why;
            }
            notified.await;
        }
    }

    /// Stops acting: an effect could not be shared with a successor. The daemon exits.
    pub fn abdicate(&self, why: String) {
        if self.election.is_some() {
            self.lose(why);
        }
    }

    fn lose(&self, why: String) {
        self.leader.store(false, Ordering::SeqCst);
        error!(reason = %why, "leadership lost");
        *self.lost.lock_unpoisoned() = Some(why);
        self.lost_notify.notify_waiters();
    }

    /// Shares the decision state after a change (nothing to do when it has not changed). A
    /// no-op without election.
    pub async fn checkpoint(&self) -> Result<(), CheckpointError> {
        self.share(false).await
    }

    /// Shares the decision state before an effect; with nothing new to share, confirms with
    /// the store of record that this replica still holds the lease as of now (not as of its
    /// last renewal), so the effect runs only after a check a successor's writes would fail.
    pub async fn share_before_effect(&self) -> Result<(), CheckpointError> {
        self.share(true).await
    }

    async fn share(&self, effect: bool) -> Result<(), CheckpointError> {
        let Some((coord, _)) = &self.election else {
            return Ok(());
        };
        if !self.is_leader() {
            return Err(CheckpointError::NotLeader);
        }
        let mut last = self.last_written.lock().await;
        let data = self.state.export().map_err(CheckpointError::Export)?;
        if *last == data {
            if !effect {
                return Ok(());
            }
            let started = self.clock.now();
            let confirmed = coord.confirm().await;
            let result = match &confirmed {
                Ok(true) => "confirmed",
                Ok(false) => "conflict",
                Err(_) => "error",
            };
            self.metrics.state_share(result, self.since(started));
            return match confirmed {
                Ok(true) => Ok(()),
                Ok(false) => {
                    self.lose(CheckpointError::Conflict.to_string());
                    Err(CheckpointError::Conflict)
                }
                Err(e) => Err(CheckpointError::Write(e)),
            };
        }
        within_limit(&data)?;
        let version = self.state_version.lock_unpoisoned().clone();
        let started = self.clock.now();
        let written = coord.put_state(version.as_deref(), &data).await;
        let result = match &written {
            Ok(Some(_)) => "written",
            Ok(None) => "conflict",
            Err(_) => "error",
        };
        self.metrics.state_share(result, self.since(started));
        match written {
            Ok(Some(v)) => {
                *self.state_version.lock_unpoisoned() = Some(v);
                *last = data;
                Ok(())
            }
            Ok(None) => {
                self.lose(CheckpointError::Conflict.to_string());
                Err(CheckpointError::Conflict)
            }
            Err(e) => Err(CheckpointError::Write(e)),
        }
    }

    /// Whether this replica leads, how its lease and shared state are written, what it
    /// dropped as a standby: registered by the daemon, counted by the engine and the fencer too.
    pub fn metrics(&self) -> &LeaderMetrics {
        &self.metrics
    }

    async fn import(
        &self,
        coord: &Arc<dyn Coordination>,
        fresh: bool,
    ) -> Result<bool, CheckpointError> {
        let Some((version, data)) = coord
            .get_state(fresh)
            .await
            .map_err(CheckpointError::Read)?
        else {
            return Ok(false);
        };
        let known = self.state_version.lock_unpoisoned().clone();
        if known.as_deref() == Some(version.as_str()) {
            return Ok(false);
        }
        if !data.is_empty() {
            self.state.import(&data).map_err(CheckpointError::Import)?;
        }
        *self.state_version.lock_unpoisoned() = Some(version);
        *self.last_written.lock().await = data;
        Ok(true)
    }
}
