//! The fencer: each tick it reads the fence flows from the flow store, gathers what the probe,
//! the node health, the condition rules and the witnesses say, hands it all to the pure fence
//! state machine (`fencing::machine`) and carries out what it decides. The probe and the
//! witnesses are in `probe` and `witnesses`; the effects (agent steps, marks, releases,
//! reclaims, tags) in `effects`. What it keeps in memory is a cache of what the collectors said
//! and of effects in progress: a restart rebuilds it, and decides again from the store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{error, info, warn};

use crate::fencing::agent::AgentRunner;
use crate::fencing::book::PlanBook;
use crate::fencing::config::{FencePlan, FencingConfig};
use crate::fencing::metrics::FencingMetrics;
use crate::fencing::peering::Peering;
use crate::link::CollectorLink;
use crate::parts::Shared;
use crate::sync::LockExt;
use crate::ticker::Ticker;
use maintd_core::fencing::machine::{
    Effect, FencePolicy, FenceState, FenceStatus, Liveness, PlanSummary, Ready, Record, Step,
    decide, merge_liveness, resume,
};
use maintd_core::verdict::Nanos;

mod drills;
mod effects;
mod holds;
mod kdump;
mod pause;
mod probe;
mod witnesses;

fn ns(d: Duration) -> Nanos {
    d.as_nanos() as Nanos
}

/// What the fencer needs of the configuration.
#[derive(Debug, Clone)]
pub struct FencerSettings {
    /// The plans in force (the file's, and the ConfigMaps' as they change).
    pub book: Arc<PlanBook>,
    pub policy: FencePolicy,
    /// How often every collector is probed (and the fence decided).
    pub interval: Duration,
    /// Bounds of each probe's patience (its node's round-trip estimate in between).
    pub patience: (Duration, Duration),
    /// Unanswered probes in a row that make a collector silent.
    pub misses: u32,
    /// How long final flows are kept.
    pub retention: Duration,
    /// Where kdump notifications are heard (when any plan has kdump).
    pub kdump_listen: std::net::SocketAddr,
    /// The ConfigMap a pause and a resume are recorded on as Events (Kubernetes).
    pub pause_events_on: String,
    /// Scheduled drills: one node every this long; zero: off.
    pub drill_every: Duration,
}

impl FencerSettings {
    pub fn new(f: &FencingConfig, book: Arc<PlanBook>) -> FencerSettings {
        FencerSettings {
            book,
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
                kdump_timeout: ns(f.kdump_timeout),
                kdump_window: ns(f.kdump_window),
                clean_reports: f.return_reports,
                return_deadline: ns(f.return_deadline),
            },
            interval: f.liveness_interval,
            patience: (f.liveness_timeout, f.liveness_timeout_max),
            misses: f.liveness_misses.max(1),
            retention: f.retention,
            kdump_listen: f.kdump_listen,
            pause_events_on: "maintd-state".into(),
            drill_every: f.drill_every,
        }
    }
}

pub struct Fencer {
    settings: FencerSettings,
    /// Each plan in force as the machine needs it, with the book's version it was derived at.
    summaries: Mutex<(u64, Arc<BTreeMap<String, PlanSummary>>)>,
    /// Each open flow's plan, as it was when the flow started: a changed configuration takes
    /// effect for the next flow, never mid-flow.
    pinned: Mutex<BTreeMap<uuid::Uuid, FencePlan>>,
    shared: Shared,
    metrics: FencingMetrics,
    runner: Arc<dyn AgentRunner>,
    link: Arc<dyn CollectorLink>,
    /// Peer sets and views: the second opinion.
    peering: Arc<Peering>,
    /// Wakes the loop for a decision now (an effect ended, a transition made the next one due).
    wake: Arc<Notify>,
    probes: probe::Probes,
    witnesses: witnesses::Renewals,
    effects: effects::Effects,
    /// The last tick held by a storm (for the log line at its start and the storm-time counter).
    storm_tick: Mutex<Option<Nanos>>,
    /// Drills whose drain or undoing runs now.
    drill_busy: Mutex<std::collections::BTreeSet<uuid::Uuid>>,
    /// The pause last seen, so each change is said once.
    last_pause: Mutex<Option<crate::store::Pause>>,
    /// When final flows past their retention were last deleted.
    pruned: Mutex<Option<Nanos>>,
    /// Whether the wait for the fence Secrets was said (once per wait).
    secrets_wait_said: Mutex<bool>,
    /// kdump notifications heard, and the listener once a plan needs it.
    kdump: kdump::Kdump,
}

impl Fencer {
    pub fn new(
        settings: FencerSettings,
        shared: &Shared,
        runner: Arc<dyn AgentRunner>,
        link: Arc<dyn CollectorLink>,
        peering: Arc<Peering>,
        metrics: FencingMetrics,
    ) -> Fencer {
        Fencer {
            metrics,
            summaries: Mutex::new((u64::MAX, Arc::default())),
            pinned: Mutex::new(BTreeMap::new()),
            settings,
            shared: shared.clone(),
            runner,
            link,
            peering,
            wake: Arc::new(Notify::new()),
            probes: probe::Probes::default(),
            witnesses: witnesses::Renewals::default(),
            effects: effects::Effects::default(),
            storm_tick: Mutex::new(None),
            last_pause: Mutex::new(None),
            drill_busy: Mutex::new(Default::default()),
            pruned: Mutex::new(None),
            secrets_wait_said: Mutex::new(false),
            kdump: kdump::Kdump::default(),
        }
    }

    /// The nodes with a fence plan.
    pub fn nodes(&self) -> usize {
        self.settings.book.current().len()
    }

    /// The plan a flow runs by: the one pinned at its start, else the node's current one.
    pub(super) fn plan_of(&self, flow: &uuid::Uuid, node: &str) -> Option<FencePlan> {
        if let Some(p) = self.pinned.lock_unpoisoned().get(flow) {
            return Some(p.clone());
        }
        self.settings.book.current().get(node).cloned()
    }

    /// Records `f`'s node's current plan with the flow that starts now, and pins it.
    pub(super) fn pin(&self, f: &mut maintd_core::fencing::machine::Flow) {
        if let Some(p) = self.settings.book.current().get(&f.node) {
            f.plan = Some(p.record());
            self.pinned.lock_unpoisoned().insert(f.id, p.clone());
        }
    }

    /// The machine's view of the plans: the current ones, and each open flow's pinned plan for
    /// its node (pinning flows this process resumes to the plan they recorded, and unpinning
    /// ended ones).
    fn summaries(
        &self,
        flows: &[maintd_core::fencing::machine::Flow],
    ) -> BTreeMap<String, PlanSummary> {
        let current = {
            let mut cached = self.summaries.lock_unpoisoned();
            let v = self.settings.book.version();
            if cached.0 != v {
                let plans = self.settings.book.current();
                let s = plans
                    .iter()
                    .map(|(n, p)| (n.clone(), p.summary()))
                    .collect();
                *cached = (v, Arc::new(s));
            }
            cached.1.clone()
        };
        let mut out = (*current).clone();
        let plans = self.settings.book.current();
        let mut pins = self.pinned.lock_unpoisoned();
        pins.retain(|id, _| {
            flows
                .iter()
                .any(|f| f.id == *id && f.status != FenceStatus::Final)
        });
        for f in flows.iter().filter(|f| f.status != FenceStatus::Final) {
            if !pins.contains_key(&f.id)
                && let Some(p) = crate::fencing::plan::resumed(f, plans.get(&f.node))
            {
                pins.insert(f.id, p);
            }
            if let Some(p) = pins.get(&f.id) {
                out.insert(f.node.clone(), p.summary());
            }
        }
        out
    }

    /// Runs until `shutdown`; then waits for running effects, so no fence step is abandoned.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = Ticker::new(self.settings.interval)
            .notified_by(self.wake.clone())
            .following(self.shared.leadership.subscribe());
        tokio::pin!(shutdown);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let prober = tokio::spawn(self.clone().probe_loop(stopped));
        while ticker.next(shutdown.as_mut()).await.is_some() {
            self.tick().await;
        }
        let _ = stop.send(true);
        if let Err(e) = prober.await {
            error!(error = %e, "the liveness probe ended");
        }
        self.kdump.stop();
        self.effects.drain(Duration::from_secs(120)).await;
        info!("fencer stopped");
    }

    /// Every member's liveness, and the fence rule holding per node (for the flow's note).
    fn liveness(&self, now: Nanos) -> (BTreeMap<String, Liveness>, BTreeMap<String, String>) {
        let healthy = self.shared.health.all();
        let fence_rules = self
            .shared
            .watch
            .as_ref()
            .and_then(|w| w.evaluate(now))
            .map(|e| e.fence)
            .unwrap_or_default();
        let liveness = self
            .shared
            .members
            .get()
            .iter()
            .map(|n| {
                let probed = self.probes.liveness(&n.name, self.settings.misses);
                let rule_since = fence_rules.get(&n.name).map(|f| f.since);
                let h = healthy.get(&n.name).copied().unwrap_or_default();
                let mut l = merge_liveness(probed, rule_since, (h.healthy_at, h.boot));
                l.suspected_at = self.probes.suspected_at(&n.name);
                (n.name.clone(), l)
            })
            .collect();
        let rules = fence_rules.into_iter().map(|(n, f)| (n, f.rule)).collect();
        (liveness, rules)
    }

    pub async fn tick(self: &Arc<Self>) {
        if self.secrets_pending() {
            return;
        }
        let (now, boot) = self.shared.clock.now_and_boot();
        let mut policy = self.settings.policy;
        policy.paused = self.pause().await.is_some();
        let store = &self.shared.flows;
        let flows = match store.active(now.saturating_sub(policy.cooldown)).await {
            Ok(f) => f,
            Err(e) => {
                error!(error = %e, at = %store.location(), "cannot load fence flows");
                return;
            }
        };
        self.metrics.fence.count_flows(&flows);
        let tags = match self.shared.cluster.jobs.tags().await {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "cannot read tags; skipping this fence decision");
                return;
            }
        };
        let mut requests = self.requests(now).await;
        // Drills, read once per decision (the newest 1000: the schedule rotates by their
        // history); each step works from this one read.
        if self.shared.leadership.is_leader() {
            match self.shared.store.drills(1000) {
                Ok(drills) => {
                    requests.extend(self.drill_requests(&drills, &flows));
                    self.advance_drills(&drills, &flows, now).await;
                    self.schedule_drill(&drills, &flows, policy, now);
                }
                Err(e) => warn!(error = %e, "cannot read fencing drills; none moves this time"),
            }
        }
        self.listen_for_kdump().await;
        let (liveness, rules) = self.liveness(now);
        let opinions = self.opinions(&liveness, now);
        // Nodes with a flow under way: being fenced (or just fenced), so never "partitioned,
        // not fenced", whatever their watchers say.
        let fencing: std::collections::BTreeSet<String> = flows
            .iter()
            .filter(|f| f.status != FenceStatus::Final)
            .map(|f| f.node.clone())
            .collect();
        self.report_partitions(&opinions, &liveness, &fencing, now)
            .await;
        let self_fence = self.self_fence_facts(&flows);
        self.probes.set_marked(
            flows
                .iter()
                .filter(|f| f.step == Step::SelfFence && !f.fenced())
                .filter(|f| {
                    matches!(
                        f.status,
                        FenceStatus::New | FenceStatus::Running | FenceStatus::Done
                    )
                })
                .map(|f| f.node.clone())
                .collect(),
        );
        let plans = self.summaries(&flows);
        let returns = self.return_facts(&flows);
        let state = FenceState {
            maintenance: self.maintenance(now),
            returns,
            flows,
            liveness,
            rules,
            opinions,
            self_fence,
            plans,
            tags,
            policy,
            requests,
            kdump: self.kdump.heard(),
            boot,
        };
        let ready = decide(&state, now);
        if !self.shared.leadership.is_leader() {
            let n = ready
                .records
                .iter()
                .filter(|r| !matches!(r, Record::Storm { .. }))
                .count();
            self.shared
                .leadership
                .metrics()
                .standby_dropped
                .inc_by((n + ready.effects.len()) as u64);
            return;
        }
        let Ready { records, effects } = self.claim_nodes(&state.flows, ready).await;
        for e in resume(&state.flows) {
            self.act(e).await;
        }
        // Records first, then one checkpoint, then effects: a successor knows of every effect.
        let mut storm = None;
        let mut moved = false;
        // A flow whose record changed meanwhile (an operator's cancel) takes no effect decided
        // from the old one: a cancel answered 200 is never followed by the power-off.
        let mut stale = std::collections::BTreeSet::new();
        for r in records {
            if let Record::Storm { unreachable, total } = r {
                storm = Some((unreachable, total));
            }
            match self.persist(r).await {
                effects::Persisted::Moved => moved = true,
                effects::Persisted::Kept => {}
                effects::Persisted::Refused(id) => {
                    stale.insert(id);
                }
            }
        }
        let effects: Vec<Effect> = effects
            .into_iter()
            .filter(|e| !stale.contains(&e.flow()))
            .collect();
        // Flows kept in shared objects (NodeFences) are already shared by their own write.
        if !effects.is_empty()
            && !store.shared()
            && let Err(e) = self.shared.leadership.share_before_effect().await
        {
            self.shared
                .leadership
                .abdicate(format!("fence effect not shared: {e}"));
            return;
        }
        for e in effects {
            self.act(e).await;
        }
        self.count_storm(storm, now);
        self.prune(now).await;
        if moved {
            if let Err(e) = self.shared.leadership.checkpoint().await {
                warn!(error = %e, "state checkpoint failed; retried on the next change");
            }
            // A transition may make the next one due at once (isolated -> power off): decide
            // again now rather than a liveness interval later. Each save moves a flow forward,
            // so this settles.
            self.wake.notify_one();
        }
    }

    /// Operators' requests from the flow store (leader only): cancels are carried out at once
    /// with the API's rules; fences to start go to the machine with the rest.
    async fn requests(&self, now: Nanos) -> Vec<maintd_core::fencing::machine::FenceRequest> {
        if !self.shared.leadership.is_leader() {
            return Vec::new();
        }
        let store = &self.shared.flows;
        let r = match store.requests().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, at = %store.location(), "cannot read operators' fence requests");
                return Vec::new();
            }
        };
        for id in r.cancel {
            match store.cancel(&id, now).await {
                Ok(c) => {
                    info!(flow = %id, outcome = c.describe(), "operator's cancel of a fence flow")
                }
                Err(e) => warn!(flow = %id, error = %e, "cannot cancel a fence flow"),
            }
        }
        r.start
    }

    /// Deletes final flows past their retention, once a minute at most.
    async fn prune(&self, now: Nanos) {
        {
            let mut last = self.pruned.lock_unpoisoned();
            if last.is_some_and(|t| now.saturating_sub(t) < 60_000_000_000) {
                return;
            }
            *last = Some(now);
        }
        let store = &self.shared.flows;
        match store
            .prune(now.saturating_sub(ns(self.settings.retention)))
            .await
        {
            Ok(0) => {}
            Ok(n) => info!(
                deleted = n,
                "final fence flows past their retention deleted"
            ),
            Err(e) => warn!(error = %e, at = %store.location(), "cannot delete old fence flows"),
        }
    }

    /// A storm's start is logged once; its time is counted tick by tick while it lasts.
    fn count_storm(&self, storm: Option<(usize, usize)>, now: Nanos) {
        let metrics = &self.metrics;
        let mut last = self.storm_tick.lock_unpoisoned();
        match (storm, *last) {
            (Some((unreachable, total)), None) => {
                warn!(
                    unreachable,
                    total, "fencing storm: no fence starts while it lasts"
                );
            }
            (Some(_), Some(at)) => {
                let held = now.saturating_sub(at).max(0) as f64 / 1e9;
                metrics.fence.fencing_storm_seconds.inc_by(held);
            }
            (None, _) => {}
        }
        *last = storm.map(|_| now);
        metrics.fence.fencing_storm.set(storm.is_some() as i64);
    }
}
