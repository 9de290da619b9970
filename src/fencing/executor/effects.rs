//! The fencer's effects: each action the fence state machine decides, carried out. Records go
//! to the flow store at once; agent steps, marks, releases and reclaims run as tracked tasks
//! (at most one of each kind per flow), whose outcomes are written back to the flow store for
//! the next decision. Shutdown waits for them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};
use uuid::Uuid;

use super::Fencer;
use crate::cluster::EventReason;
use crate::fencing::agent::{CallEnv, CallJournal, CallSite, run_stage_recorded};
use crate::fencing::call::JournalError;
use crate::metrics::StepLabel;
use crate::sync::LockExt;
use maintd_core::fencing::machine::FlowOutcome;
use maintd_core::fencing::machine::{Call, Effect, FenceStatus, Flow, Record, StepWork};
use maintd_core::verdict::{Nanos, Outcome};

/// Effects in progress and what was already observed of each flow.
#[derive(Default)]
pub(super) struct Effects {
    /// At most one effect of each kind per flow runs at a time (transient: a restart issues
    /// them again, and each is idempotent).
    busy: Mutex<HashSet<(Uuid, FlowOutcome)>>,
    /// Stage latencies already observed per flow, so each is observed once.
    observed: Mutex<HashSet<(Uuid, &'static str)>>,
    tasks: TaskTracker,
}

impl Effects {
    fn claim(&self, flow: Uuid, kind: FlowOutcome) -> bool {
        self.busy.lock_unpoisoned().insert((flow, kind))
    }

    pub(super) fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    fn done(&self, flow: Uuid, kind: FlowOutcome) {
        self.busy.lock_unpoisoned().remove(&(flow, kind));
    }

    /// Waits (at most `limit`) for every running effect to record its outcome.
    pub(super) async fn drain(&self, limit: Duration) {
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                running = self.tasks.len(),
                "fence effects still running at shutdown; they run again after a restart"
            );
        }
    }
}

/// Writes a flow's state-changing agent calls to its record before they are made: a daemon
/// that takes over after this one stopped mid-call knows the device may have acted, and when.
/// Where the flows are shared by a checkpoint (the state on etcd), the record is shared too,
/// in a write that fails once a newer leader exists: the leader's token, checked again right
/// before each call, so a deposed leader that slept through its successor's election makes
/// no call (it stops leading instead).
struct FlowJournal {
    flows: Arc<dyn crate::store::FlowStore>,
    leadership: Arc<crate::leader::Leadership>,
    flow: Uuid,
}

#[async_trait::async_trait]
impl CallJournal for FlowJournal {
    async fn begin(&self, call: &Call) -> Result<(), JournalError> {
        self.flows
            .note_call(&self.flow, call.clone())
            .await
            .map_err(|source| JournalError::Store {
                at: self.flows.location(),
                source,
            })?;
        if self.flows.shared() {
            return Ok(());
        }
        if let Err(e) = self.leadership.share_before_effect().await {
            self.leadership
                .abdicate(format!("fence agent call not shared: {e}"));
            return Err(JournalError::Share(e));
        }
        Ok(())
    }
}

/// What persisting one record did to the flows.
pub(super) enum Persisted {
    /// A flow started or a save took: the next decision may differ, so it comes at once.
    Moved,
    /// Nothing moved (a held request, a storm).
    Kept,
    /// A save that did not take (the flow changed meanwhile, or the write failed): no effect
    /// decided from the old record runs, and deciding again at once would spin.
    Refused(uuid::Uuid),
}

impl Fencer {
    /// Removes the tags of remedies that ran on `node` while its flow held it out of service:
    /// run against a node that was down, their verdicts say nothing about the node that
    /// returned, and a `repairfailed` tag left behind would hold its next events. Says what it
    /// removed, if anything.
    async fn clear_remedies_of_the_wait(&self, node: &str, since: Nanos) -> Option<String> {
        let events = match self.shared.store.events_with_jobs(Some(node)) {
            Ok(e) => e,
            Err(e) => {
                warn!(node = %node, error = %e, "cannot read the node's events; the tags of remedies that ran while it was fenced stay");
                return None;
            }
        };
        let mut cleared = Vec::new();
        for (e, _) in events {
            if e.remedy().is_none() || !e.tagged || e.acknowledged || e.created < since {
                continue;
            }
            match self.shared.cluster.jobs.remove_tag(node, &e.tag).await {
                Ok(true) => cleared.push(e.tag.clone()),
                Ok(false) => {}
                Err(err) => {
                    warn!(node = %node, tag = %e.tag, error = %err, "cannot remove the tag of a remedy that ran while the node was fenced")
                }
            }
        }
        if cleared.is_empty() {
            return None;
        }
        info!(node = %node, tags = ?cleared, "tags of remedies that ran while the node was fenced removed");
        Some(format!(
            "removed the tags of remedies that ran while it was fenced: {}",
            cleared.join(", ")
        ))
    }

    /// Persists one record of a decision; says what that did to the flows.
    pub(super) async fn persist(self: &Arc<Self>, r: Record) -> Persisted {
        let flows = &self.shared.flows;
        match r {
            Record::Start(mut f) => {
                // The first note says why the node is fenced: the rule, the witnesses or the
                // operator's request.
                let why = f
                    .history
                    .first()
                    .map(|t| t.note.clone())
                    .unwrap_or_default();
                info!(flow = %f.id, node = %f.node, why = %why, "fence flow started");
                self.pin(&mut f);
                self.metrics.fence.fences_started.inc();
                match flows.insert(&f).await {
                    Ok(()) => {
                        let msg = format!("{} started: {why}", maintd_core::tags::reference(&f.id));
                        self.shared
                            .cluster
                            .record(&f.node, EventReason::Fence, &msg, true)
                            .await;
                    }
                    Err(e) => {
                        error!(error = %e, at = %flows.location(), "cannot record a new fence flow")
                    }
                }
                Persisted::Moved
            }
            Record::Hold {
                request,
                why,
                refused,
            } => {
                info!(request = %request, refused, why = %why, "operator's fence request held");
                self.drill_held(&request, &why, refused, self.shared.clock.now());
                if let Err(e) = flows.hold(&request, &why, refused).await {
                    warn!(error = %e, at = %flows.location(), "cannot record why a fence request waits");
                }
                Persisted::Kept
            }
            Record::Save(f) => {
                let id = f.id;
                match self.save(f).await {
                    true => Persisted::Moved,
                    false => Persisted::Refused(id),
                }
            }
            // Nothing to write: the tick keeps the storm's span and its gauge.
            Record::Storm { .. } => Persisted::Kept,
        }
    }

    /// Carries out one effect of a decision (its records are persisted).
    pub(super) async fn act(self: &Arc<Self>, e: Effect) {
        let flows = &self.shared.flows;
        match e {
            Effect::RunStep {
                flow,
                node,
                step,
                work,
                calls,
                failed_on,
            } => {
                let me = self.clone();
                let wanted = move |f: &Flow| {
                    f.step == step && f.status == FenceStatus::Running && f.result.is_none()
                };
                self.spawn(flow, FlowOutcome::Step, wanted, async move {
                    // Where the flow's next agent call stands, as the decision read it.
                    let site = CallSite {
                        node,
                        flow: Some(flow),
                        seq: calls,
                        failed_on,
                    };
                    let (o, calls) = me.run_step(flow, site, step, work).await;
                    if !o.ok() {
                        me.metrics.fence.fence_failed(step.as_str(), &o);
                    }
                    (o, calls)
                });
            }
            Effect::Release {
                flow,
                node,
                attempt,
            } => {
                let me = self.clone();
                let wanted = |f: &Flow| !f.released() && f.release_result.is_none();
                self.spawn(flow, FlowOutcome::Release, wanted, async move {
                    (
                        me.shared
                            .cluster
                            .fences
                            .release(&node, &flow, attempt)
                            .await,
                        vec![],
                    )
                });
            }
            Effect::Reclaim {
                flow,
                node,
                unmark,
                since,
            } => {
                let me = self.clone();
                let wanted = |f: &Flow| !f.reclaimed && f.reclaim_result.is_none();
                self.spawn(flow, FlowOutcome::Reclaim, wanted, async move {
                    let cluster = &me.shared.cluster;
                    let mut o = cluster.fences.reclaim(&node, &flow).await;
                    if o.ok() && unmark {
                        let u = cluster.fences.mark_unschedulable(&node, &flow, false).await;
                        o = if u.ok() {
                            Outcome::done(format!("{}; {}", o.detail(), u.detail()))
                        } else {
                            u
                        };
                    }
                    if o.ok() {
                        me.metrics.fence.fence_returns.inc();
                        if let Some(cleared) = me.clear_remedies_of_the_wait(&node, since).await {
                            o = Outcome::done(format!("{}; {cleared}", o.detail()));
                        }
                    }
                    (o, vec![])
                });
            }
            Effect::Alarm { flow, node, detail } => {
                error!(flow = %flow, node = %node, detail = %detail, "fence alarm: the node runs the boot it had before its verified power-off");
                self.metrics
                    .fence
                    .fence_alarms
                    .get_or_create(&crate::metrics::NodeLabel { node: node.clone() })
                    .inc();
                self.shared
                    .cluster
                    .record(&node, EventReason::FenceAlarm, &detail, true)
                    .await;
            }
            Effect::TagFailed { flow, node, tag } => {
                warn!(flow = %flow, node = %node, tag = %tag, "fence flow failed for good; nothing released");
                match self.shared.cluster.jobs.add_tag(&node, &tag).await {
                    Ok(()) => {
                        if let Err(e) = flows.mark_tagged(&flow).await {
                            error!(error = %e, at = %flows.location(), "cannot record the fencefailed tag");
                        }
                    }
                    Err(e) => error!(error = %e, "cannot tag the node"),
                }
            }
        }
    }

    /// Records `f`; false when its record changed meanwhile (nothing is written then).
    pub(super) async fn save(&self, f: Flow) -> bool {
        let flows = &self.shared.flows;
        if let Some(t) = f.history.last() {
            info!(flow = %f.id, node = %f.node, step = t.step.as_str(), status = t.status.as_str(), note = %t.note, "fence transition");
        }
        match flows.save(&f).await {
            Ok(true) => {
                self.observe_stages(&f);
                if let Some(t) = f.history.last() {
                    let warning = t.status == FenceStatus::Error;
                    let msg = format!(
                        "{} {} {}: {}",
                        maintd_core::tags::reference(&f.id),
                        t.step.as_str(),
                        t.status.as_str(),
                        t.note
                    );
                    self.shared
                        .cluster
                        .record(&f.node, EventReason::Fence, &msg, warning)
                        .await;
                }
                true
            }
            // Changed meanwhile (an operator's cancel): decide again from the store.
            Ok(false) => {
                self.wake.notify_one();
                false
            }
            Err(e) => {
                error!(error = %e, at = %flows.location(), "cannot save a fence flow");
                false
            }
        }
    }

    /// One attempt of a step, as the machine said to run it.
    async fn run_step(
        &self,
        flow: Uuid,
        mut site: CallSite,
        step: maintd_core::fencing::machine::Step,
        work: StepWork,
    ) -> (Outcome, Vec<Call>) {
        let cluster = &self.shared.cluster;
        match work {
            StepWork::Mark => (
                cluster
                    .fences
                    .mark_unschedulable(&site.node, &flow, true)
                    .await,
                vec![],
            ),
            StepWork::Agents { mark, unmark } => {
                if mark {
                    let o = cluster
                        .fences
                        .mark_unschedulable(&site.node, &flow, true)
                        .await;
                    if !o.ok() {
                        return (o, vec![]);
                    }
                }
                if unmark {
                    let o = cluster
                        .fences
                        .mark_unschedulable(&site.node, &flow, false)
                        .await;
                    if !o.ok() {
                        return (o, vec![]);
                    }
                }
                let plan = self.plan_of(&flow, &site.node);
                let stage = plan.as_ref().and_then(|p| p.stage(step));
                let clock = self.shared.clock.as_ref();
                let journal = FlowJournal {
                    flows: self.shared.flows.clone(),
                    leadership: self.shared.leadership.clone(),
                    flow,
                };
                let env = CallEnv {
                    runner: self.runner.as_ref(),
                    clock,
                    journal: &journal,
                };
                let (o, calls) = run_stage_recorded(env, &mut site, step, stage).await;
                for c in &calls {
                    info!(flow = %flow, node = %site.node, step = step.as_str(), agent = %c.agent, action = %c.action, code = ?c.code, elapsed_ms = c.elapsed_ms, "fence agent call");
                }
                (o, calls)
            }
        }
    }

    /// Per-stage latencies, each observed once, as soon as its stage is over (a flow that
    /// never releases still shows its detection, isolation and power-off times).
    fn observe_stages(&self, f: &Flow) {
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
        let mut seen = self.effects.observed.lock_unpoisoned();
        for (stage, v) in stages {
            let Some(v) = v else { continue };
            if !seen.insert((f.id, stage)) {
                continue;
            }
            self.metrics
                .fence
                .fence_stage_seconds
                .get_or_create(&StepLabel { stage })
                .observe(v);
        }
        if f.status == FenceStatus::Final {
            seen.retain(|(id, _)| *id != f.id);
        }
    }

    /// Runs `fut` as a tracked task unless an effect of its kind already runs for `flow`, or
    /// the flow as stored no longer wants it, and writes its outcome back to the flow store.
    ///
    /// The decision that asked for the effect was made from flows read at the start of a tick:
    /// an earlier run of the same effect may have ended, written its outcome and let go of its
    /// claim since. So the stored flow is read again under the claim (the outcome is written
    /// before the claim is let go), and the effect runs only if `wanted` still holds: each
    /// agent call, release and reclaim happens once per attempt.
    fn spawn(
        self: &Arc<Self>,
        flow: Uuid,
        kind: FlowOutcome,
        wanted: impl Fn(&Flow) -> bool + Send + 'static,
        fut: impl std::future::Future<Output = (Outcome, Vec<Call>)> + Send + 'static,
    ) {
        if !self.effects.claim(flow, kind) {
            return;
        }
        let me = self.clone();
        let what = kind.as_str();
        self.effects.tasks.spawn(
            async move {
                match me.shared.flows.get(&flow).await {
                    Ok(Some(f)) if wanted(&f) => {}
                    Ok(_) => {
                        debug!("fence effect already done since it was decided; not run again");
                        me.effects.done(flow, kind);
                        return;
                    }
                    Err(e) => {
                        warn!(error = %e, at = %me.shared.flows.location(), "cannot read the fence flow before its effect; decided again next time");
                        me.effects.done(flow, kind);
                        me.wake.notify_one();
                        return;
                    }
                }
                let (outcome, calls) = fut.await;
                info!(ok = outcome.ok(), detail = %outcome.detail(), "fence effect finished");
                // A step counts its failure under the step's own name (in `execute`).
                if !outcome.ok() && kind != FlowOutcome::Step {
                    me.metrics.fence.fence_failed(what, &outcome);
                }
                if let Err(e) = me.shared.flows.set_outcome(&flow, kind, outcome, calls).await {
                    error!(error = %e, at = %me.shared.flows.location(), "cannot record a fence outcome; it runs again after a restart");
                }
                me.effects.done(flow, kind);
                me.wake.notify_one();
            }
            .instrument(info_span!("fence", flow = %flow, what)),
        );
    }
}
