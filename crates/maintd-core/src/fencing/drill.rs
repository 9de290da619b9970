//! Fencing drills: a healthy, drained node is fenced on purpose through its real flow (off,
//! verified, released, on, verified, back in service on a new boot), so an operator knows every
//! node's fence path works, and how long each stage takes, before a node dies. The record, its
//! transitions (drain, fence, restore) and its stage times, and when one is due; pure.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fencing::machine::{FenceStatus, Flow};
use crate::repair::{Job, JobKind, JobStatus};
use crate::verdict::Nanos;

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum DrillStatus {
    /// The node is drained through the normal evacuation.
    Evacuating,
    /// Its fence flow runs (the request waits at the gates first).
    Fencing,
    /// Back in service: the evacuation is undone.
    Restoring,
    Passed,
    Failed,
    /// The evacuation could not move what the node runs: nothing was fenced.
    Refused,
}

impl DrillStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            DrillStatus::Passed | DrillStatus::Failed | DrillStatus::Refused
        )
    }
}

/// One measured stage of a drill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DrillStage {
    pub stage: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Drill {
    pub id: Uuid,
    pub node: String,
    pub status: DrillStatus,
    /// Numbers the drill's jobs (the store's row number).
    #[serde(default)]
    pub seq: i64,
    pub requested: Nanos,
    pub updated: Nanos,
    /// The fence flow it runs (its request's id, taken by the flow).
    pub flow: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuated_at: Option<Nanos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Nanos>,
    /// Why it waits, failed or was refused; what the evacuation said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Each stage's measured time, once passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<DrillStage>,
}

impl Drill {
    /// A drill `id` of `node` requested at `now`, whose fence flow will be `flow`.
    pub fn new(node: &str, now: Nanos, id: Uuid, flow: Uuid) -> Drill {
        Drill {
            id,
            node: node.into(),
            status: DrillStatus::Evacuating,
            seq: 0,
            requested: now,
            updated: now,
            flow,
            evacuated_at: None,
            finished: None,
            detail: None,
            stages: Vec::new(),
        }
    }

    /// Who asked for the flow, as its witnesses record it.
    pub fn requester(&self) -> String {
        format!("drill {}", self.id)
    }

    /// The backend jobs of its current step, in order: the drain (evacuate, then offline) or
    /// its undoing (online); none at the other steps. Numbered below zero, apart from the
    /// engine's jobs, and per drill.
    pub fn jobs(&self, now: Nanos) -> Vec<Job> {
        let steps: &[(JobKind, i64)] = match self.status {
            DrillStatus::Evacuating => &[(JobKind::Evacuate, 1), (JobKind::Offline, 2)],
            DrillStatus::Restoring => &[(JobKind::Online, 3)],
            _ => &[],
        };
        steps
            .iter()
            .map(|&(kind, k)| Job {
                id: -(self.seq * 4 + k),
                event: self.id,
                node: self.node.clone(),
                round: 0,
                kind,
                command: None,
                status: JobStatus::Running,
                reason: format!("fencing drill {}", self.id),
                detail: None,
                created: now,
                finished: None,
            })
            .collect()
    }

    /// Its step's jobs ended at `now`, all done or the first failed (`failed`: why): the drain
    /// hands over to the fence flow or refuses the drill, the undoing passes or fails it.
    pub fn jobs_ended(&mut self, failed: Option<String>, now: Nanos) {
        self.updated = now;
        match (failed, self.status) {
            (None, DrillStatus::Evacuating) => {
                self.status = DrillStatus::Fencing;
                self.evacuated_at = Some(now);
                self.detail = None;
            }
            (None, _) => self.finish(DrillStatus::Passed, now),
            (Some(why), DrillStatus::Evacuating) => {
                self.detail = Some(format!(
                    "the drain cannot move what the node runs, so nothing was fenced: {why}"
                ));
                self.finish(DrillStatus::Refused, now);
            }
            (Some(why), _) => {
                self.detail = Some(format!(
                    "the fence passed but undoing the drain failed: {why}"
                ));
                self.finish(DrillStatus::Failed, now);
            }
        }
    }

    /// Its fence request was held at the gates (`refused`: for good, which fails the drill).
    pub fn held(&mut self, why: &str, refused: bool, now: Nanos) {
        self.updated = now;
        self.detail = Some(why.to_string());
        if refused {
            self.finish(DrillStatus::Failed, now);
        }
    }

    /// Follows its fence flow: once the node is back in service the stages are measured and the
    /// drain is undone; a flow that ended otherwise fails the drill. Whether it changed.
    pub fn follow(&mut self, f: &Flow, now: Nanos) -> bool {
        if self.status != DrillStatus::Fencing || f.id != self.flow {
            return false;
        }
        match (f.status, f.returned_at) {
            (FenceStatus::Final, Some(_)) => {
                self.stages = stages(self, f);
                self.status = DrillStatus::Restoring;
                self.detail = Some("back in service on a new boot".into());
                self.updated = now;
            }
            (FenceStatus::Final | FenceStatus::Error, _) => {
                self.detail = f.history.last().map(|t| t.note.clone());
                self.finish(DrillStatus::Failed, now);
            }
            _ => return false,
        }
        true
    }

    fn finish(&mut self, status: DrillStatus, now: Nanos) {
        self.status = status;
        self.finished = Some(now);
        self.updated = now;
    }
}

/// Whether a scheduled drill (one every `every`, 0: never) is due at `now`: no flow or drill
/// runs, fencing is not paused, and the last drill was requested at least `every` ago. The
/// caller still checks that every node answers.
pub fn scheduled_due(
    drills: &[Drill],
    flows: &[Flow],
    paused: bool,
    every: Nanos,
    now: Nanos,
) -> bool {
    every > 0
        && !paused
        && flows.iter().all(|f| f.status == FenceStatus::Final)
        && drills.iter().all(|d| d.status.is_final())
        && drills
            .iter()
            .map(|d| d.requested)
            .max()
            .is_none_or(|t| now.saturating_sub(t) >= every)
}

/// Which of `nodes` (those a drill can fence) to drill next: the one drilled longest ago, one
/// never drilled first, by name among equals.
pub fn next_node<'a>(
    drills: &[Drill],
    nodes: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let last_of = |node: &str| {
        drills
            .iter()
            .filter(|d| d.node == node)
            .map(|d| d.requested)
            .max()
            .unwrap_or(Nanos::MIN)
    };
    nodes.into_iter().min_by_key(|n| (last_of(n), *n))
}

/// The measured stages of a drill whose flow returned the node to service: evacuation, then
/// the flow's own (start to verified off, the release, the verified power-on, boot to its
/// first report, the healthy reports and witnesses, the return), and the total.
pub fn stages(d: &Drill, f: &Flow) -> Vec<DrillStage> {
    let secs = |a: Nanos, b: Nanos| b.saturating_sub(a).max(0) as f64 / 1e9;
    let new_boot = f
        .history
        .iter()
        .find(|t| t.note.starts_with("new boot id"))
        .map(|t| t.at);
    let mut out = Vec::new();
    let mut push = |stage: &str, a: Option<Nanos>, b: Option<Nanos>| {
        if let (Some(a), Some(b)) = (a, b) {
            out.push(DrillStage {
                stage: stage.into(),
                seconds: secs(a, b),
            });
        }
    };
    push("evacuation", Some(d.requested), d.evacuated_at);
    push("power-off", Some(f.created), f.fenced_at);
    push("release", f.fenced_at, f.released_at);
    push("power-on", f.released_at, f.powered_on_at);
    push("boot", f.powered_on_at, new_boot);
    push("return", new_boot, f.returned_at);
    push("total", Some(d.requested), f.returned_at);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::machine::{Step, Witnesses};

    const S: Nanos = 1_000_000_000;

    fn drill() -> Drill {
        let mut d = Drill::new("n1", 10 * S, Uuid::from_u128(1), Uuid::from_u128(2));
        d.seq = 3;
        d
    }

    fn flow(d: &Drill) -> Flow {
        let mut f = Flow::new(
            "n1",
            20 * S,
            20 * S,
            Step::PowerManagement,
            Witnesses::default(),
            "drill",
        );
        f.id = d.flow;
        f
    }

    #[test]
    fn a_drill_drains_fences_restores_and_passes() {
        let mut d = drill();
        let jobs = d.jobs(11 * S);
        let kinds: Vec<_> = jobs.iter().map(|j| (j.kind, j.id)).collect();
        assert_eq!(kinds, [(JobKind::Evacuate, -13), (JobKind::Offline, -14)]);
        d.jobs_ended(None, 15 * S);
        assert_eq!(
            (d.status, d.evacuated_at),
            (DrillStatus::Fencing, Some(15 * S))
        );
        assert!(d.jobs(16 * S).is_empty(), "the flow, not a job, fences");
        // A running flow changes nothing; another node's flow is not this drill's.
        let mut f = flow(&d);
        assert!(!d.follow(&f, 30 * S));
        f.status = FenceStatus::Final;
        f.returned_at = Some(60 * S);
        f.fenced_at = Some(25 * S);
        let mut other = f.clone();
        other.id = Uuid::from_u128(9);
        assert!(!d.follow(&other, 61 * S));
        assert!(d.follow(&f, 61 * S));
        assert_eq!(d.status, DrillStatus::Restoring);
        let total = d.stages.iter().find(|s| s.stage == "total").unwrap();
        assert_eq!(total.seconds, 50.0);
        assert_eq!(d.jobs(62 * S)[0].kind, JobKind::Online);
        d.jobs_ended(None, 63 * S);
        assert_eq!((d.status, d.finished), (DrillStatus::Passed, Some(63 * S)));
        assert_eq!(d.detail.as_deref(), Some("back in service on a new boot"));
    }

    #[test]
    fn a_drain_that_fails_refuses_and_an_undoing_that_fails_fails() {
        let mut d = drill();
        d.jobs_ended(Some("evacuate failed: no room".into()), 12 * S);
        assert_eq!(d.status, DrillStatus::Refused);
        assert!(
            d.detail
                .as_deref()
                .unwrap()
                .contains("nothing was fenced: evacuate failed")
        );
        let mut d = drill();
        d.status = DrillStatus::Restoring;
        d.jobs_ended(Some("online failed".into()), 12 * S);
        assert_eq!((d.status, d.finished), (DrillStatus::Failed, Some(12 * S)));
    }

    #[test]
    fn a_held_request_waits_and_a_refused_one_fails_the_drill() {
        let mut d = drill();
        d.jobs_ended(None, 12 * S);
        d.held("storm", false, 13 * S);
        assert_eq!(
            (d.status, d.detail.as_deref()),
            (DrillStatus::Fencing, Some("storm"))
        );
        d.held("maintenance", true, 14 * S);
        assert_eq!((d.status, d.finished), (DrillStatus::Failed, Some(14 * S)));
        // A flow that ended in error fails it, with the flow's last word.
        let mut d = drill();
        d.jobs_ended(None, 12 * S);
        let mut f = flow(&d);
        f.status = FenceStatus::Error;
        f.history.push(crate::fencing::machine::Transition {
            at: 20 * S,
            step: f.step,
            status: f.status,
            note: "agent refused".into(),
        });
        assert!(d.follow(&f, 21 * S));
        assert_eq!(
            (d.status, d.detail.as_deref()),
            (DrillStatus::Failed, Some("agent refused"))
        );
    }

    #[test]
    fn drills_are_scheduled_one_at_a_time_longest_undrilled_first() {
        let every = 100 * S;
        assert!(scheduled_due(&[], &[], false, every, 0));
        assert!(!scheduled_due(&[], &[], false, 0, 0), "0: never");
        assert!(!scheduled_due(&[], &[], true, every, 0), "paused");
        let mut d = drill();
        assert!(
            !scheduled_due(&[d.clone()], &[], false, every, 500 * S),
            "one runs"
        );
        d.status = DrillStatus::Passed;
        assert!(
            !scheduled_due(&[d.clone()], &[], false, every, 50 * S),
            "too soon"
        );
        assert!(scheduled_due(&[d.clone()], &[], false, every, 110 * S));
        let f = flow(&d);
        assert!(
            !scheduled_due(&[d.clone()], &[f], false, every, 110 * S),
            "a flow runs"
        );
        assert_eq!(
            next_node(&[d.clone()], ["n1", "n2"]),
            Some("n2"),
            "never drilled first"
        );
        let mut e = d.clone();
        e.node = "n2".into();
        e.requested = 5 * S;
        assert_eq!(
            next_node(&[d, e], ["n1", "n2"]),
            Some("n2"),
            "drilled longest ago"
        );
        assert_eq!(
            next_node(&[], ["n3", "n2"]),
            Some("n2"),
            "by name among equals"
        );
    }
}
