//! The fencer: a fast liveness probe of every collector, and the executor of the pure fence
//! state machine (`fencing::machine`). Steps, releases and reclaims run as tasks whose outcomes are
//! written back to the store; every decision is made again from the store on the next tick.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{Instrument, error, info, info_span, warn};
use uuid::Uuid;

use crate::cluster::Cluster;
use crate::fencing::agent::{AgentRunner, run_stage};
use crate::fencing::config::{FencePlan, FencingConfig, Stage};
use crate::fencing::machine::{
    FenceAction, FencePolicy, FenceState, Liveness, PlanSummary, StageLimits, Step, decide_fencing,
};
use crate::store::{FlowOutcome, Store};
use crate::verdict::{Nanos, Outcome};

use crate::fencing::peering::{Peering, PeeringSettings};
use crate::link::CollectorLink;
use crate::metrics::{Metrics, StepLabel};
use crate::sync::LockExt;

use crate::ticker::{Ticker, Wake};

mod probe;
mod witnesses;
use probe::Seen;
use witnesses::Renewal;

fn ns(d: Duration) -> Nanos {
    d.as_nanos() as Nanos
}

fn limits(s: &Stage) -> StageLimits {
    StageLimits {
        retries: s.retries,
        retry_interval: ns(s.retry_interval),
    }
}

/// A node is silent if its collector does not answer the probe, or if a node-condition fence
/// rule holds for it (then since the condition began, whichever is earlier).
pub fn merge_liveness(
    (answers, silent_since, answered): (bool, Option<Nanos>, bool),
    fence_rule_since: Option<Nanos>,
    healthy_at: Option<Nanos>,
) -> Liveness {
    let probe_since = if answers { None } else { silent_since };
    let since = match (probe_since, fence_rule_since) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Liveness {
        reachable: answers && fence_rule_since.is_none(),
        answered: answered && fence_rule_since.is_none(),
        unreachable_since: since,
        healthy_at,
        probe_silent: !answers,
        condition_fence: fence_rule_since.is_some(),
    }
}

pub fn summarize(plan: &FencePlan) -> PlanSummary {
    PlanSummary {
        isolation: plan.isolation.as_ref().map(limits),
        power_management: plan.power_management.as_ref().map(limits),
        recovery: plan.recovery.as_ref().map(limits).unwrap_or(StageLimits {
            retries: 0,
            retry_interval: 0,
        }),
        self_fence: plan.self_fence,
    }
}

pub struct Fencer<C: Cluster> {
    pub store: Arc<Store>,
    pub cluster: Arc<C>,
    pub plans: BTreeMap<String, FencePlan>,
    pub policy: FencePolicy,
    pub runner: Arc<dyn AgentRunner>,
    pub wake: Arc<Notify>,
    pub metrics: Metrics,
    interval: Duration,
    link: Arc<dyn CollectorLink>,
    /// The nodes whose collectors are probed.
    members: Arc<crate::members::Members>,
    /// Node-condition rules that hand nodes to the fencer (Kubernetes).
    pub watch: Option<Arc<crate::members::NodeView>>,
    pub leadership: Arc<crate::leader::Leadership>,
    /// What the probe saw: reachable, since when not, and how many probes in a row went
    /// unanswered.
    seen: Mutex<BTreeMap<String, Seen>>,
    /// Effects in progress (transient: a restart simply issues them again, idempotently).
    busy: Mutex<HashSet<(Uuid, &'static str)>>,
    storm: Mutex<bool>,
    /// Stage latencies already observed per flow, so each is observed once.
    observed: Mutex<HashSet<(Uuid, &'static str)>>,
    /// Read once per probe and once per decision.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Peer sets and views: the second opinion.
    pub peering: Arc<Peering>,
    /// Each kubelet Lease's `renewTime` as last seen, when (by this clock) it last changed, and
    /// the kubelet's renew interval.
    renewals: Mutex<BTreeMap<String, Renewal>>,
    /// Nodes marked for self-fencing, told to every collector in the signed probe.
    marked: Mutex<Vec<String>>,
    /// Each node's round-trip estimate, and the probe's patience bounds.
    rtt: Mutex<BTreeMap<String, crate::fencing::rtt::RttEstimate>>,
    patience: (Duration, Duration),
    misses: u32,
    /// When the last tick ran, if it was held by a storm (for the storm-time counter).
    storm_tick: Mutex<Option<Nanos>>,
    /// The membership size last checked for a two-node cluster that can never fence.
    warned_size: Mutex<usize>,
}

impl<C: Cluster> Fencer<C> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        f: &FencingConfig,
        plans: BTreeMap<String, FencePlan>,
        store: Arc<Store>,
        cluster: Arc<C>,
        runner: Arc<dyn AgentRunner>,
        link: Arc<dyn CollectorLink>,
        metrics: Metrics,
        leadership: Arc<crate::leader::Leadership>,
        members: Arc<crate::members::Members>,
        peering: PeeringSettings,
        key: crate::report::Key,
    ) -> Fencer<C> {
        Fencer {
            store,
            cluster,
            plans,
            policy: FencePolicy {
                grace: ns(f.grace),
                storm_percent: f.storm_percent,
                max_in_flight: f.max_in_flight,
                min_interval: ns(f.min_interval),
                cooldown: ns(f.cooldown),
                paused: f.paused,
                max_restarts: f.max_restarts,
                second_opinion: f.second_opinion,
                self_fence_margin: ns(f.self_fence_margin),
            },
            runner,
            wake: Arc::new(Notify::new()),
            metrics,
            interval: f.liveness_interval,
            link,
            members,
            watch: None,
            leadership,
            seen: Mutex::new(BTreeMap::new()),
            busy: Mutex::new(HashSet::new()),
            storm: Mutex::new(false),
            observed: Mutex::new(HashSet::new()),
            clock: Arc::new(crate::clock::SystemClock),
            peering: Arc::new(Peering::new(key, peering)),
            renewals: Mutex::new(BTreeMap::new()),
            marked: Mutex::new(Vec::new()),
            rtt: Mutex::new(BTreeMap::new()),
            patience: (f.liveness_timeout, f.liveness_timeout_max),
            misses: f.liveness_misses.max(1),
            storm_tick: Mutex::new(None),
            warned_size: Mutex::new(0),
        }
    }

    /// Runs until `shutdown`; then waits for running steps, so no fence step is abandoned.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = Ticker::new(self.interval, Some(self.wake.clone()));
        tokio::pin!(shutdown);
        while let Some(wake) = ticker.next(shutdown.as_mut()).await {
            if wake == Wake::Tick {
                self.probe().await;
            }
            self.tick().await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while !self.busy.lock_unpoisoned().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        info!("fencer stopped");
    }

    /// Every member's liveness, and the fence rule holding per node (for the flow's note).
    fn liveness(&self, now: Nanos) -> (BTreeMap<String, Liveness>, BTreeMap<String, String>) {
        let healthy: BTreeMap<String, Nanos> = match self.store.nodes() {
            Ok(rows) => rows
                .into_iter()
                .filter_map(|r| r.healthy_at().map(|t| (r.name, t)))
                .collect(),
            Err(e) => {
                warn!(error = %e, "cannot read node reports");
                BTreeMap::new()
            }
        };
        let fence_rules = self
            .watch
            .as_ref()
            .and_then(|w| w.evaluate(now))
            .map(|e| e.fence)
            .unwrap_or_default();
        let seen = self.seen.lock_unpoisoned();
        let liveness = self
            .members
            .get()
            .iter()
            .map(|n| &n.name)
            .map(|n| {
                // Not probed yet: assume reachable, so nothing is fenced on start-up alone.
                let probed = seen
                    .get(n)
                    .copied()
                    .unwrap_or_default()
                    .liveness(self.misses);
                let rule_since = fence_rules.get(n).map(|f| f.since);
                (
                    n.clone(),
                    merge_liveness(probed, rule_since, healthy.get(n).copied()),
                )
            })
            .collect();
        let rules = fence_rules.into_iter().map(|(n, f)| (n, f.rule)).collect();
        (liveness, rules)
    }

    pub async fn tick(self: &Arc<Self>) {
        let now = self.clock.now();
        let flows = match self
            .store
            .fence_flows(now.saturating_sub(self.policy.cooldown))
        {
            Ok(f) => f,
            Err(e) => {
                error!(error = %e, db = %self.store.path(), "cannot load fence flows");
                return;
            }
        };
        let tags = match self.cluster.tags().await {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot read tags; skipping this fence decision");
                return;
            }
        };
        let (liveness, rules) = self.liveness(now);
        let opinions = self.opinions(&liveness, now);
        self.report_partitions(&opinions).await;
        let self_fence = self.self_fence_facts(&flows);
        *self.marked.lock_unpoisoned() = flows
            .iter()
            .filter(|f| f.step == Step::SelfFence && !f.fenced)
            .filter(|f| {
                use crate::fencing::machine::FenceStatus::*;
                matches!(f.status, New | Running | Done)
            })
            .map(|f| f.node.clone())
            .collect();
        let state = FenceState {
            flows,
            liveness,
            rules,
            opinions,
            self_fence,
            plans: self
                .plans
                .iter()
                .map(|(n, p)| (n.clone(), summarize(p)))
                .collect(),
            tags,
            policy: self.policy,
        };
        let actions = decide_fencing(&state, now);
        if !self.leadership.is_leader() {
            let n = actions
                .iter()
                .filter(|a| !matches!(a, FenceAction::Storm { .. }))
                .count();
            self.metrics.standby_dropped.inc_by(n as u64);
            return;
        }
        // A flow running without an executor lost it (a restart, or the previous leader died):
        // run it again; agent actions are idempotent (off when off is still off).
        for f in &state.flows {
            if f.status == crate::fencing::machine::FenceStatus::Running && f.result.is_none() {
                self.clone().spawn_step(f.id, f.node.clone(), f.step);
            }
        }
        // Records first, then one checkpoint, then effects: a successor knows of every effect.
        let (records, effects): (Vec<_>, Vec<_>) = actions.into_iter().partition(|a| {
            matches!(
                a,
                FenceAction::Start(_) | FenceAction::Save(_) | FenceAction::Storm { .. }
            )
        });
        let mut storm = false;
        let mut moved = false;
        for a in records {
            moved |= matches!(a, FenceAction::Save(_) | FenceAction::Start(_));
            match a {
                FenceAction::Storm { unreachable, total } => {
                    storm = true;
                    let mut was = self.storm.lock_unpoisoned();
                    if !*was {
                        warn!(
                            unreachable,
                            total, "fencing storm: no fence starts while it lasts"
                        );
                    }
                    *was = true;
                }
                other => self.execute(other).await,
            }
        }
        if !effects.is_empty()
            && let Err(e) = self.leadership.checkpoint().await
        {
            self.leadership
                .abdicate(format!("fence effect not shared: {e}"));
            return;
        }
        for a in effects {
            self.execute(a).await;
        }
        if !storm {
            *self.storm.lock_unpoisoned() = false;
        }
        {
            let mut last = self.storm_tick.lock_unpoisoned();
            if storm {
                if let Some(at) = *last {
                    let held = now.saturating_sub(at).max(0) as f64 / 1e9;
                    self.metrics.fencing_storm_seconds.inc_by(held);
                }
                *last = Some(now);
            } else {
                *last = None;
            }
        }
        if moved {
            if let Err(e) = self.leadership.checkpoint().await {
                warn!(error = %e, "state checkpoint failed; retried on the next change");
            }
            // A transition may make the next one due at once (isolated -> power off): decide
            // again now rather than a liveness interval later. Each save moves a flow forward,
            // so this settles.
            self.wake.notify_one();
        }
        self.metrics.fencing_storm.set(storm as i64);
    }

    async fn execute(self: &Arc<Self>, a: FenceAction) {
        match a {
            FenceAction::Start(f) => {
                info!(flow = %f.id, node = %f.node, "fence flow started");
                self.metrics.fences_started.inc();
                if let Err(e) = self.store.insert_flow(&f) {
                    error!(error = %e, db = %self.store.path(), "cannot record a new fence flow");
                }
            }
            FenceAction::Save(f) => {
                if let Some(t) = f.history.last() {
                    info!(flow = %f.id, node = %f.node, step = t.step.as_str(), status = t.status.as_str(), note = %t.note, "fence transition");
                }
                match self.store.save_flow(&f) {
                    Ok(true) => {
                        self.observe_stages(&f);
                        if let Some(t) = f.history.last() {
                            let warning = t.status == crate::fencing::machine::FenceStatus::Error;
                            let msg = format!(
                                "maintd:{} {} {}: {}",
                                f.id,
                                t.step.as_str(),
                                t.status.as_str(),
                                t.note
                            );
                            self.cluster
                                .record(&f.node, "MaintdFence", &msg, warning)
                                .await;
                        }
                    }
                    // Changed meanwhile (an operator's cancel): decide again from the store.
                    Ok(false) => self.wake.notify_one(),
                    Err(e) => {
                        error!(error = %e, db = %self.store.path(), "cannot save a fence flow")
                    }
                }
            }
            FenceAction::RunStep { flow, node, step } => self.clone().spawn_step(flow, node, step),
            FenceAction::Release {
                flow,
                node,
                attempt,
            } => {
                let me = self.clone();
                self.spawn_effect(flow, "release", async move {
                    let o = me.cluster.release(&node, &flow, attempt).await;
                    (FlowOutcome::Release, o)
                });
            }
            FenceAction::Reclaim { flow, node } => {
                let me = self.clone();
                self.spawn_effect(flow, "reclaim", async move {
                    let o = me.cluster.reclaim(&node, &flow).await;
                    (FlowOutcome::Reclaim, o)
                });
            }
            FenceAction::TagFailed { flow, node, tag } => {
                warn!(flow = %flow, node = %node, tag = %tag, "fence flow failed for good; nothing released");
                match self.cluster.add_tag(&node, &tag).await {
                    Ok(()) => {
                        if let Err(e) = self.store.mark_flow_tagged(&flow) {
                            error!(error = %e, db = %self.store.path(), "cannot record the fencefailed tag");
                        }
                    }
                    Err(e) => error!(error = %e, "cannot tag the node"),
                }
            }
            FenceAction::Storm { .. } => {}
        }
    }

    /// Per-stage latencies, each observed once, as soon as its stage is over (a flow that
    /// never releases still shows its detection, isolation and power-off times).
    fn observe_stages(&self, f: &crate::fencing::machine::Flow) {
        let secs = |a: Nanos, b: Nanos| b.saturating_sub(a).max(0) as f64 / 1e9;
        let isolated = f.isolated_at;
        let start_of_power = isolated.unwrap_or(f.created);
        let stages = [
            ("detection", Some(secs(f.detected, f.created))),
            ("isolation", isolated.map(|i| secs(f.created, i))),
            ("power-off", f.fenced_at.map(|t| secs(start_of_power, t))),
            (
                "release",
                f.released_at.zip(f.fenced_at).map(|(r, t)| secs(t, r)),
            ),
            ("total", f.released_at.map(|r| secs(f.detected, r))),
        ];
        let mut seen = self.observed.lock_unpoisoned();
        for (stage, v) in stages {
            let Some(v) = v else { continue };
            if !seen.insert((f.id, stage)) {
                continue;
            }
            self.metrics
                .fence_stage_seconds
                .get_or_create(&StepLabel {
                    stage: stage.into(),
                })
                .observe(v);
        }
        if f.status == crate::fencing::machine::FenceStatus::Final {
            seen.retain(|(id, _)| *id != f.id);
        }
    }

    fn claim(&self, flow: Uuid, what: &'static str) -> bool {
        self.busy.lock_unpoisoned().insert((flow, what))
    }

    fn spawn_step(self: Arc<Self>, flow: Uuid, node: String, step: Step) {
        if !self.claim(flow, "step") {
            return;
        }
        let me = self.clone();
        self.spawn_effect_claimed(flow, "step", async move {
            if step == Step::SelfFence {
                let o = me.cluster.mark_unschedulable(&node, &flow, true).await;
                if !o.ok {
                    me.metrics.fence_failed(step.as_str());
                }
                return (FlowOutcome::Step, o, vec![]);
            }
            // A self-fencing mark is cleared before the node's recovery stage runs.
            let marked = step == Step::Recovery
                && me.store.flow(&flow).ok().flatten().is_some_and(|f| f.marked);
            if marked {
                let o = me.cluster.mark_unschedulable(&node, &flow, false).await;
                if !o.ok {
                    me.metrics.fence_failed(step.as_str());
                    return (FlowOutcome::Step, o, vec![]);
                }
            }
            let stage = me.plans.get(&node).and_then(|p| p.stage(step));
            let (o, calls) = run_stage(me.runner.as_ref(), me.clock.as_ref(), step, stage).await;
            if !o.ok {
                me.metrics.fence_failed(step.as_str());
            }
            for c in &calls {
                info!(flow = %flow, node = %node, step = step.as_str(), agent = %c.agent, action = %c.action, code = ?c.code, elapsed_ms = c.elapsed_ms, "fence agent call");
            }
            (FlowOutcome::Step, o, calls)
        });
    }

    fn spawn_effect(
        self: &Arc<Self>,
        flow: Uuid,
        what: &'static str,
        fut: impl std::future::Future<Output = (FlowOutcome, Outcome)> + Send + 'static,
    ) {
        if !self.claim(flow, what) {
            return;
        }
        self.clone().spawn_effect_claimed(flow, what, async move {
            let (w, o) = fut.await;
            (w, o, vec![])
        });
    }

    fn spawn_effect_claimed(
        self: Arc<Self>,
        flow: Uuid,
        what: &'static str,
        fut: impl std::future::Future<
            Output = (FlowOutcome, Outcome, Vec<crate::fencing::machine::Call>),
        > + Send
        + 'static,
    ) {
        tokio::spawn(
            async move {
                let (which, outcome, calls) = fut.await;
                info!(ok = outcome.ok, detail = %outcome.detail, "fence effect finished");
                // A step counts its failure under the step's own name (below).
                if !outcome.ok && what != "step" {
                    self.metrics.fence_failed(what);
                }
                if let Err(e) = self.store.set_flow_outcome(&flow, which, outcome, calls) {
                    error!(error = %e, db = %self.store.path(), "cannot record a fence outcome; it runs again after a restart");
                }
                self.busy
                    .lock_unpoisoned()
                    .remove(&(flow, what));
                self.wake.notify_one();
            }
            .instrument(info_span!("fence", flow = %flow, what)),
        );
    }
}
