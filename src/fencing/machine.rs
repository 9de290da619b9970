//! The pure fence state machine: candidates after the grace, storm / pause / in-flight
//! / interval / cooldown gates, and each flow's transitions through isolation → power-management
//! (verified off) → release → recovery, with retries and restarts. No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fencing::opinion::{PeerOpinion, PeerWitness};
use crate::verdict::Nanos;
use crate::verdict::Outcome;

const FLOW_NAMESPACE: Uuid = Uuid::from_u128(0x6d61_696e_7464_4665_6e63_6500_0000_0001);

pub fn fence_failed_tag(id: &Uuid) -> String {
    format!("maintd:fencefailed:{id}")
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Step {
    Isolation,
    PowerManagement,
    /// The node's own watchdog: mark it unschedulable, wait until its reset is proven, count it
    /// reset.
    SelfFence,
    Recovery,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

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
pub enum FenceStatus {
    /// The step is due (possibly waiting for its retry time or a gate).
    New,
    /// The step's agents are running.
    Running,
    /// The step finished successfully.
    Done,
    /// The flow failed; it restarts from the beginning while restarts are left.
    Error,
    /// The flow is over.
    Final,
}

impl FenceStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub at: Nanos,
    pub step: Step,
    pub status: FenceStatus,
    pub note: String,
}

/// One agent call, as recorded for the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub at: Nanos,
    pub step: Step,
    pub method: String,
    pub agent: String,
    pub action: String,
    pub code: Option<i32>,
    pub ok: bool,
    #[serde(rename = "elapsed-ms")]
    pub elapsed_ms: u64,
    pub output: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Flow {
    pub id: Uuid,
    pub node: String,
    pub step: Step,
    pub status: FenceStatus,
    /// Failed attempts of the current step.
    pub retries: u32,
    pub restarts: u32,
    /// Outcome of the running attempt, written by the executor.
    pub result: Option<Outcome>,
    pub release_result: Option<Outcome>,
    pub reclaim_result: Option<Outcome>,
    pub next_attempt: Nanos,
    pub isolated: bool,
    /// Power-off verified: the only proof that allows a release.
    pub fenced: bool,
    pub released: bool,
    pub reclaimed: bool,
    pub canceled: bool,
    /// The fencefailed tag is on the node.
    pub tagged: bool,
    /// When the collector went silent.
    pub detected: Nanos,
    pub created: Nanos,
    pub updated: Nanos,
    pub isolated_at: Option<Nanos>,
    pub fenced_at: Option<Nanos>,
    pub released_at: Option<Nanos>,
    pub history: Vec<Transition>,
    pub calls: Vec<Call>,
    /// Self-fencing marked the node unschedulable (recovery clears it).
    #[serde(default)]
    pub marked: bool,
    /// Self-fencing: the time from the start of the quiet window to the reset (isolation +
    /// feed interval + watchdog timeout + margin, from the node's signed settings), and the
    /// moment the node has reset by: an estimate until `safe_proven`, then the proven moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_time_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_until: Option<Nanos>,
    /// The node's starving is proven: `safe_until` stands for any later leader (a starved
    /// watchdog is never fed again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub safe_proven: bool,
    /// The node's signed self-fencing settings, kept for a leader that never saw its report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_fence_times: Option<crate::fencing::selffence::SelfFenceTimes>,
    /// What declared the node dead when the flow started: recovery waits for each of them to
    /// be healthy again.
    #[serde(default = "Witnesses::legacy")]
    pub witnesses: Witnesses,
    /// Store version this copy was loaded at (a save of a stale copy is refused).
    #[serde(skip)]
    pub version: u64,
}

/// The witnesses that declared a node dead.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Witnesses {
    /// The collector stopped answering the liveness probe.
    pub collector: bool,
    /// The node-condition fence rule that held, as `Ready=Unknown for 5s`.
    pub condition: Option<String>,
    /// The watchers that had lost the node too (the second opinion), each with its view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerWitness>,
}

impl Witnesses {
    /// Flows recorded before witnesses were: the collector decided, as it then always did.
    fn legacy() -> Witnesses {
        Witnesses {
            collector: true,
            condition: None,
            peers: Vec::new(),
        }
    }

    /// Whether every witness is healthy again after the power-off at `fenced_at`: a healthy
    /// report diagnosed after it for the collector, the rule no longer holding for a condition.
    fn recovered(&self, l: &Liveness, fenced_at: Option<Nanos>) -> bool {
        let collector = !self.collector
            || l.healthy_at
                .zip(fenced_at)
                .is_some_and(|(h, t)| h > t && !l.probe_silent);
        let condition = self.condition.is_none() || !l.condition_fence;
        collector && condition
    }
}

impl Flow {
    fn go(&mut self, now: Nanos, step: Step, status: FenceStatus, note: impl Into<String>) {
        self.step = step;
        self.status = status;
        self.updated = now;
        self.history.push(Transition {
            at: now,
            step,
            status,
            note: note.into(),
        });
    }

    /// Still heading for a power-off (counts against the in-flight cap).
    pub fn in_flight(&self, max_restarts: u32) -> bool {
        !self.fenced
            && match self.status {
                FenceStatus::Final => false,
                FenceStatus::Error => self.restarts < max_restarts && !self.canceled,
                _ => self.step != Step::Recovery,
            }
    }
}

/// What the liveness probe and the report poller say about a node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Liveness {
    /// Not (yet) judged silent: counts for storms and candidates.
    pub reachable: bool,
    /// The collector answered its latest probe (and no fence rule holds): only a real answer
    /// stands a flow down, never a probe or two that merely have not yet made it silent.
    pub answered: bool,
    pub unreachable_since: Option<Nanos>,
    /// When the diagnose behind the last verified, healthy (Ok, no diagnose error) report ran,
    /// by the collector's clock: a report diagnosed before a power-off proves nothing after it.
    pub healthy_at: Option<Nanos>,
    /// The collector does not answer the liveness probe.
    pub probe_silent: bool,
    /// A node-condition fence rule holds for the node (e.g. `Ready=Unknown` for its time).
    pub condition_fence: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageLimits {
    pub retries: u32,
    pub retry_interval: Nanos,
}

/// What the state machine needs of a node's fence configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSummary {
    pub isolation: Option<StageLimits>,
    pub power_management: Option<StageLimits>,
    pub recovery: StageLimits,
    /// The node self-fences: the last level (the only one without power-management).
    pub self_fence: bool,
}

/// Marking a node unschedulable is retried like an agent call.
const MARK_LIMITS: StageLimits = StageLimits {
    retries: 2,
    retry_interval: 1_000_000_000,
};

impl PlanSummary {
    fn limits(&self, step: Step) -> StageLimits {
        let none = StageLimits {
            retries: 0,
            retry_interval: 0,
        };
        match step {
            Step::Isolation => self
                .isolation
                .or(self.power_management)
                .unwrap_or(MARK_LIMITS),
            Step::PowerManagement => self.power_management.unwrap_or(none),
            Step::SelfFence => MARK_LIMITS,
            Step::Recovery => self.recovery,
        }
    }

    /// The step after isolation: power-management, else self-fencing.
    fn power_step(&self) -> Step {
        if self.power_management.is_some() || !self.self_fence {
            Step::PowerManagement
        } else {
            Step::SelfFence
        }
    }

    fn first_step(&self) -> Step {
        if self.isolation.is_some() {
            Step::Isolation
        } else {
            self.power_step()
        }
    }
}

/// What the master knows of a self-fencing node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelfFenceFacts {
    /// The settings of its armed watchdog, from its last signed view; `None` when it never
    /// reported one or its last word was "disarmed".
    pub times: Option<crate::fencing::selffence::SelfFenceTimes>,
    /// What the master received from the node and its watchers; `None` while this process does
    /// not lead or the node holds another peer set than the one its watchers come from.
    pub evidence: Option<crate::fencing::selffence::ResetEvidence>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FencePolicy {
    pub grace: Nanos,
    pub storm_percent: u32,
    pub max_in_flight: usize,
    pub min_interval: Nanos,
    pub cooldown: Nanos,
    pub paused: bool,
    pub max_restarts: u32,
    /// A silent collector alone starts nothing: its watchers must have lost the node too.
    pub second_opinion: bool,
    /// Added to each self-fencing node's proven reset time.
    pub self_fence_margin: Nanos,
}

#[derive(Debug, Clone)]
pub struct FenceState {
    /// Every flow that is not final, and final ones still inside their cooldown.
    pub flows: Vec<Flow>,
    /// Every configured node.
    pub liveness: BTreeMap<String, Liveness>,
    pub plans: BTreeMap<String, PlanSummary>,
    pub tags: BTreeMap<String, BTreeSet<String>>,
    pub policy: FencePolicy,
    /// The fence rule holding per node, as `Ready=Unknown for 5s` (Kubernetes).
    pub rules: BTreeMap<String, String>,
    /// What each silent node's watchers say (absent: not asked).
    pub opinions: BTreeMap<String, PeerOpinion>,
    /// Self-fencing nodes with a flow waiting for the proof of their reset.
    pub self_fence: BTreeMap<String, SelfFenceFacts>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FenceAction {
    Start(Flow),
    /// Persist the flow as given (its history carries the new transition).
    Save(Flow),
    RunStep {
        flow: Uuid,
        node: String,
        step: Step,
    },
    /// Release the node's workloads; `attempt` keys the job so it runs once per restart.
    Release {
        flow: Uuid,
        node: String,
        attempt: u32,
    },
    Reclaim {
        flow: Uuid,
        node: String,
    },
    TagFailed {
        flow: Uuid,
        node: String,
        tag: String,
    },
    Storm {
        unreachable: usize,
        total: usize,
    },
}

/// Decides every fence action due now.
pub fn decide_fencing(s: &FenceState, now: Nanos) -> Vec<FenceAction> {
    let mut out = Vec::new();
    let total = s.liveness.len();
    let unreachable = s.liveness.values().filter(|l| !l.reachable).count();
    let storm = total > 0 && unreachable * 100 > s.policy.storm_percent as usize * total;
    if storm {
        out.push(FenceAction::Storm { unreachable, total });
    }
    let hold_power = storm || s.policy.paused;
    for f in &s.flows {
        advance(s, f, hold_power, now, &mut out);
    }
    if !hold_power {
        start_flows(s, now, &mut out);
    }
    out
}

fn start_flows(s: &FenceState, now: Nanos, out: &mut Vec<FenceAction>) {
    let p = &s.policy;
    let mut in_flight = s
        .flows
        .iter()
        .filter(|f| f.in_flight(p.max_restarts))
        .count();
    let mut last_start = s.flows.iter().map(|f| f.created).max();
    let mut candidates: Vec<(&String, Nanos)> = s
        .liveness
        .iter()
        .filter(|(n, l)| !l.reachable && s.plans.contains_key(*n))
        .filter_map(|(n, l)| l.unreachable_since.map(|t| (n, t)))
        .filter(|(_, since)| now.saturating_sub(*since) >= p.grace)
        .collect();
    candidates.sort_by_key(|(n, since)| (*since, (*n).clone()));
    for (node, since) in candidates {
        let mine = s.flows.iter().filter(|f| &f.node == node);
        let mut busy = false;
        let mut cooling = false;
        for f in mine {
            if f.status != FenceStatus::Final {
                busy = true;
            } else if f.updated + p.cooldown > now {
                cooling = true;
            }
        }
        if busy || cooling {
            continue;
        }
        if in_flight >= p.max_in_flight {
            break;
        }
        if last_start.is_some_and(|t| now.saturating_sub(t) < p.min_interval) {
            break;
        }
        let l = s.liveness.get(node).copied().unwrap_or_default();
        let rule = s.rules.get(node).filter(|_| l.condition_fence).cloned();
        // An operator's node-condition rule decides on its own; a silent collector needs its
        // watchers' agreement.
        let opinion = s.opinions.get(node).cloned().unwrap_or_default();
        let agreed = match (&rule, &opinion) {
            (Some(_), _) => Vec::new(),
            (None, PeerOpinion::Lost { agreed }) => agreed.clone(),
            (None, _) if p.second_opinion => continue,
            (None, _) => Vec::new(),
        };
        let plan = &s.plans[node];
        let step = plan.first_step();
        let why = match &rule {
            Some(r) => format!(
                "node condition rule {r} holds for {:.1} s (grace {:.1} s){}",
                now.saturating_sub(since) as f64 / 1e9,
                p.grace as f64 / 1e9,
                if l.probe_silent {
                    "; the collector is silent too"
                } else {
                    "; the collector still answers"
                }
            ),
            None => format!(
                "collector silent for {:.1} s (grace {:.1} s){}",
                now.saturating_sub(since) as f64 / 1e9,
                p.grace as f64 / 1e9,
                agreement(&agreed)
            ),
        };
        let witnesses = Witnesses {
            collector: l.probe_silent,
            condition: rule,
            peers: agreed,
        };
        let mut f = Flow {
            id: Uuid::new_v5(&FLOW_NAMESPACE, format!("{node}\n{now}").as_bytes()),
            node: node.clone(),
            step,
            status: FenceStatus::New,
            retries: 0,
            restarts: 0,
            result: None,
            release_result: None,
            reclaim_result: None,
            next_attempt: now,
            isolated: false,
            fenced: false,
            marked: false,
            safe_time_ms: None,
            safe_until: None,
            safe_proven: false,
            self_fence_times: None,
            released: false,
            reclaimed: false,
            canceled: false,
            tagged: false,
            detected: since,
            created: now,
            updated: now,
            isolated_at: None,
            fenced_at: None,
            released_at: None,
            history: Vec::new(),
            calls: Vec::new(),
            witnesses,
            version: 0,
        };
        f.go(now, step, FenceStatus::New, why);
        out.push(FenceAction::Start(f.clone()));
        // Start the first step at once rather than a tick later.
        let mut running = f.clone();
        running.go(now, step, FenceStatus::Running, "attempt 1");
        out.push(FenceAction::Save(running));
        out.push(FenceAction::RunStep {
            flow: f.id,
            node: node.clone(),
            step,
        });
        in_flight += 1;
        last_start = Some(now);
    }
}

/// `; lost by its watchers n2 (last heard 4.1 s before), n3 (never heard)`, for the flow's note.
fn agreement(agreed: &[PeerWitness]) -> String {
    if agreed.is_empty() {
        return String::new();
    }
    let each: Vec<String> = agreed
        .iter()
        .map(|w| match w.last_heard {
            Some(h) => format!(
                "{} (last heard {:.1} s before its view)",
                w.watcher,
                w.view_at.saturating_sub(h) as f64 / 1e9
            ),
            None => format!("{} (never heard)", w.watcher),
        })
        .collect();
    format!("; lost by its watchers {}", each.join(", "))
}

mod transitions;
use transitions::advance;

#[cfg(test)]
mod tests;
