//! Running fencing drills: the drain through the backend's normal evacuation (and offline), the
//! fence flow as a request through the same gates as an operator's, the stage times once the node
//! is back in service by its new boot, then the evacuation undone (online). One drill at a time.

use std::sync::Arc;

use tracing::{info, warn};

use super::Fencer;
use crate::sync::LockExt;
use maintd_core::fencing::drill::{self, Drill, DrillStatus};
use maintd_core::fencing::machine::{FenceRequest, Flow};
use maintd_core::verdict::Nanos;

impl Fencer {
    /// Why `node` cannot be drilled by its configuration, if it cannot: no fence plan, only a
    /// watchdog (which no one can trigger on a live node), or a power-off that leaves it off.
    pub fn drill_refusal(&self, node: &str) -> Option<String> {
        let plans = self.settings.book.current();
        match plans.get(node) {
            None => Some(format!("{node} has no fence configuration")),
            Some(p) if p.power_management.is_none() => Some(format!(
                "{node} only fences itself by watchdog, which a drill cannot trigger on a live node"
            )),
            Some(p) if p.power_on.is_none() => Some(format!(
                "{node}'s power-management leaves it off after the release (after-release = \"off\"): a drill would leave it off"
            )),
            Some(_) => None,
        }
    }

    /// The fence requests of drills whose node is drained and whose flow has not started.
    pub(super) fn drill_requests(&self, drills: &[Drill], flows: &[Flow]) -> Vec<FenceRequest> {
        drills
            .iter()
            .filter(|d| d.status == DrillStatus::Fencing)
            .filter(|d| !flows.iter().any(|f| f.id == d.flow))
            .map(|d| FenceRequest {
                id: d.flow,
                node: d.node.clone(),
                by: d.requester(),
                held: d.detail.clone(),
            })
            .collect()
    }

    /// A drill's request was held (`refused`: for good) by the fence gates.
    pub(super) fn drill_held(&self, request: &uuid::Uuid, why: &str, refused: bool, now: Nanos) {
        let Ok(drills) = self.shared.store.drills(16) else {
            return;
        };
        let Some(mut d) = drills.into_iter().find(|d| d.flow == *request) else {
            return;
        };
        d.held(why, refused, now);
        if d.status.is_final() {
            warn!(drill = %d.id, node = %d.node, why, "fencing drill failed: its fence was refused");
            self.drill_metrics(&d);
        }
        if let Err(e) = self.shared.store.save_drill(&d) {
            warn!(error = %e, "cannot record a fencing drill");
        }
    }

    /// Moves each drill on: starts its evacuation or its undoing (as tracked tasks), and reads
    /// its flow's end.
    pub(super) async fn advance_drills(
        self: &Arc<Self>,
        drills: &[Drill],
        flows: &[Flow],
        now: Nanos,
    ) {
        for mut d in drills.iter().filter(|d| !d.status.is_final()).cloned() {
            match d.status {
                DrillStatus::Evacuating | DrillStatus::Restoring => self.drill_jobs(d, now),
                DrillStatus::Fencing => {
                    let Some(f) = flows.iter().find(|f| f.id == d.flow) else {
                        continue;
                    };
                    if !d.follow(f, now) {
                        continue;
                    }
                    if d.status == DrillStatus::Failed {
                        warn!(drill = %d.id, node = %d.node, detail = d.detail.as_deref().unwrap_or(""), "fencing drill failed");
                        self.drill_metrics(&d);
                    }
                    if let Err(e) = self.shared.store.save_drill(&d) {
                        warn!(error = %e, "cannot record a fencing drill");
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs the drill's drain (offline) or its undoing (online) once, as a tracked task.
    fn drill_jobs(self: &Arc<Self>, d: Drill, now: Nanos) {
        if !self.drill_busy.lock_unpoisoned().insert(d.id) {
            return;
        }
        let me = self.clone();
        self.effects.tasks().spawn(async move {
            let cluster = &me.shared.cluster;
            let event = serde_json::json!({"status": "evacuate", "details": {"drill": d.id.to_string()}})
                .to_string();
            let mut failed = None;
            for job in d.jobs(now) {
                let o = cluster.jobs.run_job(&job, &event).await;
                if !o.ok() {
                    failed = Some(format!("{} failed: {}", job.kind.as_str(), o.detail()));
                    break;
                }
            }
            let mut d = d;
            d.jobs_ended(failed, me.shared.clock.now());
            match d.status {
                DrillStatus::Fencing => info!(drill = %d.id, node = %d.node, "fencing drill: node drained; its fence flow starts at the gates"),
                DrillStatus::Passed => info!(drill = %d.id, node = %d.node, stages = ?d.stages, "fencing drill passed"),
                DrillStatus::Refused => warn!(drill = %d.id, node = %d.node, detail = d.detail.as_deref().unwrap_or(""), "fencing drill refused"),
                _ => warn!(drill = %d.id, node = %d.node, detail = d.detail.as_deref().unwrap_or(""), "fencing drill failed"),
            }
            if d.status.is_final() {
                me.drill_metrics(&d);
            }
            if let Err(e) = me.shared.store.save_drill(&d) {
                warn!(error = %e, "cannot record a fencing drill");
            }
            me.drill_busy.lock_unpoisoned().remove(&d.id);
            me.wake.notify_one();
        });
    }

    /// Scheduled drills: every `drill-every`, one drill on the node drilled longest ago (never
    /// drilled first), only while no flow or drill runs, fencing is not paused and every node
    /// answers (stricter than the storm rule: no drill while any node is silent).
    pub(super) fn schedule_drill(
        &self,
        drills: &[Drill],
        flows: &[Flow],
        policy: maintd_core::fencing::machine::FencePolicy,
        now: Nanos,
    ) {
        let every = super::ns(self.settings.drill_every);
        if !drill::scheduled_due(drills, flows, policy.paused, every, now) {
            return;
        }
        let (liveness, _) = self.liveness(now);
        if liveness.values().any(|l| !l.reachable) {
            return;
        }
        let members = self.shared.members.get();
        let drillable = members
            .iter()
            .map(|m| m.name.as_str())
            .filter(|n| self.drill_refusal(n).is_none());
        let Some(node) = drill::next_node(drills, drillable) else {
            return;
        };
        let d = Drill::new(node, now, uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        match self.shared.store.insert_drill(&d) {
            Ok(d) => info!(drill = %d.id, node = %d.node, "scheduled fencing drill started"),
            Err(e) => warn!(error = %e, "cannot record a scheduled fencing drill"),
        }
    }

    fn drill_metrics(&self, d: &Drill) {
        let m = &self.metrics;
        let label = crate::metrics::NodeLabel {
            node: d.node.clone(),
        };
        m.fence
            .drill_last
            .get_or_create(&label)
            .set(d.finished.unwrap_or(d.updated) / 1_000_000_000);
        m.fence
            .drill_passed
            .get_or_create(&label)
            .set(i64::from(d.status == DrillStatus::Passed));
    }
}
