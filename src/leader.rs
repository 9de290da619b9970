//! Leadership: which replica acts. On Kubernetes a `coordination.k8s.io/v1` Lease elects one;
//! the leader checkpoints the decision state to a ConfigMap before every side effect and after
//! every change, and a standby imports it, so a successor resumes in-flight work instead of
//! starting it again. Elsewhere the one daemon (behind its master lock) always leads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::cluster::{Coordination, LeaseRecord};
use crate::store::Checkpoint;
use crate::sync::LockExt;
use maintd_core::lease::{LeaseStep, lease_step};

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

    /// Writes the decision state to the shared checkpoint if it changed. Called before every side
    /// effect: an effect whose intent is not shared never starts. A no-op without election.
    /// Shares the decision state after a change (nothing to do when it has not changed).
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

    /// One write of the lease, timed and counted.
    async fn write_lease(
        &self,
        coord: &Arc<dyn Coordination>,
        l: &LeaseRecord,
    ) -> Result<Option<LeaseRecord>, crate::cluster::ClusterError> {
        let started = self.clock.now();
        let written = coord.write_lease(l).await;
        let result = match &written {
            Ok(Some(_)) => "ok",
            Ok(None) => "conflict",
            Err(_) => "error",
        };
        self.metrics.lease_write(result, self.since(started));
        written
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

    /// The election loop. Returns when `shutdown` resolves (releasing a held lease after a final
    /// checkpoint) or when leadership is lost.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let Some((coord, cfg)) = self.election.clone() else {
            shutdown.await;
            return;
        };
        let me = self.identity.clone();
        let lease_duration = cfg.lease_duration;
        let mut seen: Option<(Option<String>, Option<String>)> = None;
        let mut seen_at = self.clock.now();
        let mut renewed_at = self.clock.now();
        // The Lease as this replica last wrote it, while it holds it: a renewal replaces that
        // version without reading first (as client-go does), so a leader's only request per
        // retry period is its renewal. A conflict means someone else wrote: read it afresh.
        let mut own: Option<LeaseRecord> = None;
        let mut fresh = false;
        let mut ticker = crate::ticker::Ticker::new(cfg.retry_period);
        tokio::pin!(shutdown);
        info!(identity = %me, lease = %cfg.place, "leader election started");
        while ticker.next(shutdown.as_mut()).await.is_some() {
            if self.lost.lock_unpoisoned().is_some() {
                return;
            }
            let lease = match own.clone() {
                Some(l) => Some(l),
                None => match coord.get_lease(fresh).await {
                    Ok(l) => {
                        fresh = false;
                        l
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read the lease");
                        fresh = true;
                        self.check_deadline(renewed_at, cfg.renew_deadline);
                        continue;
                    }
                },
            };
            let marker = lease
                .as_ref()
                .map(|l| (l.holder.clone(), l.renew_marker.clone()));
            if marker != seen {
                seen = marker;
                seen_at = self.clock.now();
            }
            match lease_step(
                lease.as_ref().map(LeaseRecord::view),
                &me,
                self.since(seen_at),
                lease_duration,
            ) {
                LeaseStep::Renew => {
                    let mut l = lease.clone().unwrap_or_default();
                    l.duration_s = lease_duration.as_secs().max(1) as i32;
                    let sent = self.clock.now();
                    match self.write_lease(&coord, &l).await {
                        Ok(Some(written)) => {
                            own = Some(written);
                            // From when it was sent: a standby saw the write no earlier, so
                            // this replica's deadline ends before the lease can in its eyes,
                            // however late the answer came.
                            renewed_at = sent;
                            self.renewed_at(sent);
                            if !self.leads() {
                                // Our own lease from before a restart: lead again at once.
                                self.become_leader(&coord).await;
                            }
                        }
                        Ok(None) => {
                            warn!("lease renewal conflicted; reading it afresh");
                            own = None;
                            fresh = true;
                        }
                        // Whether it landed is unknown: the next attempt replaces the same
                        // version, and a conflict then reads it afresh.
                        Err(e) => warn!(error = %e, "cannot renew the lease"),
                    }
                    self.check_deadline(renewed_at, cfg.renew_deadline);
                }
                LeaseStep::Acquire { transitions } => {
                    if self.leads() {
                        self.lose("the lease lapsed while this replica led".into());
                        return;
                    }
                    let l = LeaseRecord {
                        holder: Some(me.clone()),
                        renew_marker: None,
                        duration_s: lease_duration.as_secs().max(1) as i32,
                        transitions,
                        version: lease.and_then(|l| l.version),
                        acquired: None,
                    };
                    let sent = self.clock.now();
                    match self.write_lease(&coord, &l).await {
                        Ok(Some(written)) => {
                            own = Some(written);
                            // From when it was sent: a standby saw the write no earlier, so
                            // this replica's deadline ends before the lease can in its eyes,
                            // however late the answer came.
                            renewed_at = sent;
                            self.renewed_at(sent);
                            self.become_leader(&coord).await;
                        }
                        Ok(None) => {
                            info!("another replica took the lease first");
                            fresh = true;
                        }
                        Err(e) => {
                            warn!(error = %e, "cannot take the lease");
                            fresh = true;
                        }
                    }
                }
                LeaseStep::Follow { holder } => {
                    if self.leads() {
                        self.lose(format!("{holder} holds the lease now"));
                        return;
                    }
                    own = None;
                    *self.holder.lock_unpoisoned() = Some(holder);
                    if let Err(e) = self.import(&coord, false).await {
                        warn!(error = %e, "standby cannot follow the leader's state");
                    }
                }
            }
        }
        if self.leads() {
            // Hand over at once rather than after the lease expires: last state, then the lease.
            if let Err(e) = self.checkpoint().await {
                warn!(error = %e, "final checkpoint failed");
            }
            self.leader.store(false, Ordering::SeqCst);
            if let Ok(Some(l)) = coord.get_lease(true).await
                && l.holder.as_deref() == Some(me.as_str())
            {
                let released = LeaseRecord {
                    holder: None,
                    duration_s: 1,
                    ..l
                };
                match self.write_lease(&coord, &released).await {
                    Ok(Some(_)) => info!("lease released"),
                    _ => warn!("cannot release the lease; it expires on its own"),
                }
            }
        }
    }

    fn check_deadline(&self, renewed_at: Nanos, deadline: Duration) {
        let age = if self.leads() {
            self.since(renewed_at)
        } else {
            Duration::ZERO
        };
        self.metrics.renewal_age.set(age.as_secs_f64());
        if self.leads() && self.since(renewed_at) > deadline {
            self.lose(format!("could not renew the lease for {deadline:?}"));
        }
    }

    async fn become_leader(&self, coord: &Arc<dyn Coordination>) {
        // The leader acts on the last shared state, never on what it computed as a standby.
        if let Err(e) = self.import(coord, true).await {
            error!(error = %e, "took the lease but cannot load the shared state; not acting");
            self.lose(e.to_string());
            return;
        }
        *self.holder.lock_unpoisoned() = Some(self.identity.clone());
        self.term.fetch_add(1, Ordering::SeqCst);
        self.leader.store(true, Ordering::SeqCst);
        info!(identity = %self.identity, term = self.term(), "became the leader");
        self.term_tx.send_replace(self.term());
    }
}
