//! The tick loop and the executor: poll, rebuild state from the store, `decide`, and carry out
//! the actions. The only place where decisions turn into side effects.

use crate::cluster::{Backend, UpkeepRunner};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{Instrument, error, info, info_span, warn};

use crate::cluster::EventReason;
use crate::store::Store;
use maintd_core::repair::{Action, Capacity, Job, JobKind, Observations, Policy, decide};
use maintd_core::verdict::Outcome;

use super::live::LiveRepairs;
use super::poller::Poller;
use crate::leader::LeaderMetrics;
use crate::metrics::JobLabel;
use crate::repair::metrics::RepairMetrics;
use crate::ticker::{Ticker, Wake};

/// What the engine needs of the configuration.
#[derive(Debug, Clone, Copy)]
pub struct EngineSettings {
    pub policy: Policy,
    pub poll_interval: Duration,
    /// Cap on drains per round, when the backend supplies capacity facts.
    pub max_disruptions: usize,
    /// Cap on remedy Jobs running at once, cluster-wide.
    pub max_remedies: usize,
}

pub struct Engine {
    store: Arc<Store>,
    cluster: Backend,
    poller: Poller,
    repairs: LiveRepairs,
    settings: EngineSettings,
    /// Wakes the loop for a decision without polling (a job ended, an operator acted).
    wake: Arc<Notify>,
    metrics: RepairMetrics,
    leader_metrics: LeaderMetrics,
    leadership: Arc<crate::leader::Leadership>,
    /// Node conditions and membership (Kubernetes).
    watch: Option<Arc<crate::members::NodeView>>,
    /// The leadership term whose running jobs this replica has resumed.
    resumed_term: std::sync::atomic::AtomicU64,
    /// When the last decision completed, and why the last one did not; `/1/health` reads it.
    health: Arc<Health>,
    clock: Arc<dyn crate::clock::Clock>,
    upkeep: super::upkeep::Upkeeps,
    /// Fence flows: a node being fenced is the fencer's, never the upkeep's.
    flows: Arc<dyn crate::store::FlowStore>,
}

/// Why a decision was skipped; the next tick tries again.
#[derive(Debug, thiserror::Error)]
pub enum TickError {
    #[error("cannot read tags: {0}")]
    Tags(#[source] crate::cluster::ClusterError),
    #[error("cannot load state from {db}: {source}")]
    Store {
        db: String,
        #[source]
        source: crate::store::StoreError,
    },
    /// No drain starts without the facts that admit it.
    #[error("cannot read capacity facts: {0}")]
    Capacity(#[source] crate::cluster::ClusterError),
}

impl TickError {
    /// The `reason` label of `maintd_engine_skipped_decisions_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TickError::Tags(_) => "tags",
            TickError::Store { .. } => "store",
            TickError::Capacity(_) => "capacity",
        }
    }
}

/// Why the executor could not carry out an action; the next tick decides again from the store.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("tagging {node} with {tag}: {source}")]
    Tag {
        node: String,
        tag: String,
        #[source]
        source: crate::cluster::ClusterError,
    },
    #[error(transparent)]
    Checkpoint(#[from] crate::leader::CheckpointError),
}

impl ActionError {
    /// A stable label for `maintd_engine_action_failures_total` and the log.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ActionError::Store(_) => "store",
            ActionError::Tag { .. } => "tag",
            ActionError::Checkpoint(_) => "checkpoint",
        }
    }
}

pub use super::health::Health;

fn drains(actions: &[Action]) -> bool {
    actions.iter().any(|a| {
        matches!(a, Action::StartRound { jobs, .. }
            if jobs.iter().any(|j| matches!(j.kind, JobKind::Evacuate | JobKind::EvacuateFailover)))
    })
}

impl Engine {
    pub fn new(
        settings: EngineSettings,
        poller: Poller,
        repairs: LiveRepairs,
        shared: &crate::parts::Shared,
        metrics: RepairMetrics,
    ) -> Engine {
        Engine {
            store: shared.store.clone(),
            cluster: shared.cluster.clone(),
            poller,
            repairs,
            settings,
            wake: Arc::new(Notify::new()),
            metrics,
            leader_metrics: shared.leadership.metrics().clone(),
            leadership: shared.leadership.clone(),
            watch: shared.watch.clone(),
            resumed_term: std::sync::atomic::AtomicU64::new(0),
            health: Arc::new(Health::new(shared.clock.now())),
            clock: shared.clock.clone(),
            upkeep: Default::default(),
            flows: shared.flows.clone(),
        }
    }

    /// Asks for a decision now (the API, after an operator's action).
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// The last accepted report sequences, which the API's reset clears.
    pub fn seqs(&self) -> Arc<super::poller::Seqs> {
        self.poller.seqs()
    }

    /// Runs until `shutdown` resolves. Jobs run in detached runners or on collectors, so stopping
    /// the loop never abandons one half-way: a restart picks each up from its recorded state.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = Ticker::new(self.settings.poll_interval)
            .notified_by(self.wake.clone())
            .following(self.leadership.subscribe());
        let mut obs = Observations::new();
        tokio::pin!(shutdown);
        while let Some(wake) = ticker.next(shutdown.as_mut()).await {
            if wake == Wake::Tick {
                obs = self.poller.poll_all().instrument(info_span!("poll")).await;
            }
            self.tick(&mut obs).await;
            self.health
                .turns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        info!("engine stopped");
    }

    /// Asks the backend for the round's upkeep, away from nodes being fenced, and starts it.
    async fn start_upkeep(
        self: &Arc<Self>,
        runner: &Arc<dyn UpkeepRunner>,
        mut plan: crate::cluster::UpkeepPlan,
    ) {
        // Every flow not ended (`active` keeps no ended one before `i64::MAX`).
        match self.flows.active(i64::MAX).await {
            Ok(flows) => plan.busy.extend(flows.into_iter().map(|f| f.node)),
            Err(e) => return warn!(error = %e, "cannot read the fence flows; no upkeep now"),
        }
        match runner.plan_upkeep(&plan).await {
            Ok(tasks) if !tasks.is_empty() => {
                info!(
                    tasks = tasks.len(),
                    round = plan.round,
                    "cluster upkeep started"
                );
                self.upkeep.spawn(runner, tasks, &self.wake, &self.metrics);
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot plan the cluster's upkeep; asked again next tick"),
        }
    }

    /// Jobs recorded as running lost their executor (a restart, or the previous leader died):
    /// run them again, once per leadership term. Every job is idempotent. As for a round's
    /// start, the lease is confirmed first, so a leader deposed meanwhile starts none.
    async fn resume(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        let term = self.leadership.term();
        if !self.leadership.is_leader() || self.resumed_term.load(Ordering::SeqCst) == term {
            return;
        }
        match self.store.running_jobs() {
            Ok(jobs) => {
                if !jobs.is_empty()
                    && let Err(e) = self.leadership.share_before_effect().await
                {
                    // Tried again next tick (the term is not marked resumed).
                    warn!(error = %e, "not resuming jobs: the lease is not confirmed");
                    return;
                }
                self.resumed_term.store(term, Ordering::SeqCst);
                for j in jobs {
                    info!(job = j.id, node = %j.node, kind = j.kind.as_str(), "resuming job");
                    self.clone().spawn_job(j);
                }
            }
            Err(e) => error!(error = %e, "cannot list running jobs"),
        }
    }

    /// A decision that could not be made: logged, counted under its label, and reported by
    /// `/1/health` until a later one succeeds.
    fn skip(&self, e: TickError) {
        match &e {
            TickError::Store { .. } => error!(error = %e, "skipping this decision"),
            _ => warn!(error = %e, "skipping this decision"),
        }
        self.metrics.tick_failed(e.metric_label());
        self.health.failed(e.to_string());
    }

    /// One decision: rebuild the state, decide, execute (the leader) or count (a standby).
    /// The reports come from the last poll; the conditions are evaluated now, in place, since
    /// escalation depends on the time.
    pub async fn tick(self: &Arc<Self>, obs: &mut Observations) {
        self.leader_metrics
            .leader
            .set(self.leadership.is_leader() as i64);
        self.resume().await;
        let tags = match self.cluster.jobs.tags().await {
            Ok(t) => t,
            Err(e) => return self.skip(TickError::Tags(e)),
        };
        let mut state = match self.store.load_state(self.settings.policy, tags) {
            Ok(s) => s,
            Err(source) => {
                let db = self.store.path().to_string();
                return self.skip(TickError::Store { db, source });
            }
        };
        state.members = Some(self.poller.member_names());
        state.max_remedies = Some(self.settings.max_remedies);
        state.upkeep_running = self.upkeep.running();
        let now = self.clock.now();
        state.maintenance = match self.store.maintenance(now) {
            Ok(all) => all.into_iter().map(|m| (m.node, m.reason)).collect(),
            Err(source) => {
                let db = self.store.path().to_string();
                return self.skip(TickError::Store { db, source });
            }
        };
        // Someone else working on a node (another operator's maintenance or remediation)
        // holds its events as an operator's maintenance does.
        for (node, why) in self.cluster.held_elsewhere() {
            state.maintenance.entry(node).or_insert(why);
        }
        if let Some(w) = &self.watch {
            obs.conditions = w.evaluate(now).map(|e| e.verdicts);
        }
        let obs = &*obs;
        let mut actions = decide(&state, obs, now);
        if drains(&actions) {
            // Only a round that drains needs the (large) pod and PDB lists.
            let snapshot = match &self.cluster.capacity {
                Some(c) => c.capacity().await.map(Some),
                None => Ok(None),
            };
            match snapshot {
                Ok(Some(snapshot)) => {
                    state.capacity = Some(Capacity {
                        snapshot,
                        max_disruptions: self.settings.max_disruptions,
                    });
                    actions = decide(&state, obs, now);
                }
                Ok(None) => {}
                Err(e) => return self.skip(TickError::Capacity(e)),
            }
        }
        self.health.ok(now);
        self.metrics.last_decision.set(now / 1_000_000_000);
        if !self.leadership.is_leader() {
            // A standby decides as the leader would, to be ready, and acts on nothing.
            self.leader_metrics
                .standby_dropped
                .inc_by(actions.len() as u64);
            return;
        }
        for action in &actions {
            let done = self.execute(action, now).await;
            if let Err(ActionError::Store(e)) = &done {
                self.health.wrote(now, &Err(e));
            }
            if let Err(e) = done {
                // The next tick rebuilds from the store and decides again.
                self.metrics.action_failed(e.metric_label());
                error!(error = %e, reason = e.metric_label(), ?action, "action failed");
            }
        }
        if let Some(runner) = &self.cluster.upkeep
            && let Some(plan) = super::upkeep::plan(&state, &actions, self.upkeep.running())
        {
            self.start_upkeep(runner, plan).await;
        }
        if let Err(e) = self.leadership.checkpoint().await {
            warn!(error = %e, "state checkpoint failed; retried next tick");
        }
    }

    async fn execute(self: &Arc<Self>, action: &Action, now: i64) -> Result<(), ActionError> {
        match action {
            Action::CreateEvent(e) => {
                self.store.apply(action, now)?;
                self.metrics.events_created.inc();
                info!(event = %e.id, node = %e.node, action = %e.action, "event noted");
                self.cluster
                    .record(
                        &e.node,
                        EventReason::EventNoted,
                        &format!(
                            "{} {}: {}",
                            maintd_core::tags::reference(&e.id),
                            e.action,
                            e.canonical
                        ),
                        false,
                    )
                    .await;
            }
            Action::Cancel {
                event,
                superseded_by,
            } => {
                self.store.apply(action, now)?;
                info!(event = %event, by = %superseded_by, "event superseded");
            }
            Action::Acknowledge { event } => {
                self.store.apply(action, now)?;
                info!(event = %event, "event acknowledged");
            }
            Action::Clear { event, why } => {
                self.store.apply(action, now)?;
                info!(event = %event, why = %why, "event forgotten");
            }
            Action::Forget { event, node, why } => {
                self.store.apply(action, now)?;
                warn!(event = %event, node = %node, why = %why, "event and its running jobs dropped");
            }
            Action::Note { .. } => self.store.apply(action, now)?,
            Action::Finalize {
                event,
                node,
                status,
                tag,
                ..
            } => {
                // The tag first: nobody reads `completed` (or `failed`) before the node carries
                // the tag that acknowledging removes. A tag set but not yet recorded is set again
                // (idempotently) when the same finalization is decided after a restart.
                self.set_tag(node, tag).await?;
                self.store.apply(action, now)?;
                self.store.mark_tagged(event, now)?;
                info!(event = %event, node = %node, status = status.as_str(), tag = %tag, "event finalized");
                let failed = *status == maintd_core::repair::RepairStatus::Failed;
                self.cluster
                    .record(
                        node,
                        if failed {
                            EventReason::RepairFailed
                        } else {
                            EventReason::RepairReady
                        },
                        &format!("{}: tag {tag}", maintd_core::tags::reference(event)),
                        failed,
                    )
                    .await;
            }
            Action::ApplyTag { event, node, tag } => self.tag(event, node, tag, now).await?,
            Action::StartRound { round, jobs } => {
                let jobs = self.store.start_round(*round, jobs, now)?;
                // Share the round before any job starts, so a successor resumes it rather than
                // starting another; without that, stop acting.
                if let Err(e) = self.leadership.share_before_effect().await {
                    self.leadership
                        .abdicate(format!("round {round} not shared: {e}"));
                    return Err(e.into());
                }
                info!(round, jobs = jobs.len(), "round started");
                for j in jobs {
                    self.metrics.jobs_started.inc();
                    self.clone().spawn_job(j);
                }
            }
        }
        Ok(())
    }

    async fn tag(
        &self,
        event: &uuid::Uuid,
        node: &str,
        tag: &str,
        now: i64,
    ) -> Result<(), ActionError> {
        self.set_tag(node, tag).await?;
        Ok(self.store.mark_tagged(event, now)?)
    }

    /// Sets `tag` on `node` in the cluster (idempotent), without recording it.
    async fn set_tag(&self, node: &str, tag: &str) -> Result<(), ActionError> {
        self.cluster
            .jobs
            .add_tag(node, tag)
            .await
            .map_err(|source| ActionError::Tag {
                node: node.into(),
                tag: tag.into(),
                source,
            })
    }

    fn spawn_job(self: Arc<Self>, job: Job) {
        let span = info_span!("job", job = job.id, node = %job.node, kind = job.kind.as_str(), reason = %job.reason);
        tokio::spawn(
            async move {
                let outcome = self.run_job(&job).await;
                info!(ok = outcome.ok(), detail = %outcome.detail(), "job finished");
                self.metrics
                    .jobs_finished
                    .get_or_create(&JobLabel {
                        kind: job.kind.as_str(),
                        outcome: if outcome.ok() { "succeeded" } else { "failed" },
                    })
                    .inc();
                if let Err(e) = self
                    .store
                    .finish_job(job.id, outcome.ok(), outcome.detail(), self.clock.now())
                {
                    error!(error = %e, db = %self.store.path(), "cannot record the job's end; it resumes on restart");
                }
                self.wake.notify_one();
            }
            .instrument(span),
        );
    }

    async fn run_job(&self, job: &Job) -> Outcome {
        let event = match self.store.event(&job.event) {
            Ok(Some((e, jobs, _))) => {
                let view = crate::views::Event::of_repair(&e, &jobs);
                (
                    e.clone(),
                    serde_json::to_string(&view).expect("a view serializes"),
                )
            }
            Ok(None) => return Outcome::failed("the job's event is gone"),
            Err(e) => return Outcome::failed(format!("cannot load the job's event: {e}")),
        };
        match job.kind {
            JobKind::LiveRepair => self.repairs.run(job, &event.0).await,
            _ => self.cluster.jobs.run_job(job, &event.1).await,
        }
    }
}
