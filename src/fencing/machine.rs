//! The pure fence state machine: candidates after the grace, storm / pause / in-flight
//! / interval / cooldown gates, and each flow's transitions through isolation → power-management
//! (verified off) → release → recovery, with retries and restarts. No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fencing::opinion::{PeerOpinion, PeerWitness};
use crate::verdict::Nanos;
use crate::verdict::Outcome;

pub fn fence_failed_tag(id: &Uuid) -> String {
    crate::tags::tag(crate::tags::TagKind::FenceFailed, id)
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
        work: StepWork,
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

/// What running a step does, decided here so that the executor only acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepWork {
    /// Self-fencing: mark the node unschedulable, so nothing new lands on it while its watchdog
    /// resets it.
    Mark,
    /// Run the stage's fence agents; first clear a self-fencing mark (`unmark`), since the
    /// node's recovery returns it to service.
    Agents { unmark: bool },
}

impl FenceAction {
    /// Runs `f`'s current step.
    pub fn run_step(f: &Flow) -> FenceAction {
        let work = match f.step {
            Step::SelfFence => StepWork::Mark,
            Step::Recovery => StepWork::Agents { unmark: f.marked },
            _ => StepWork::Agents { unmark: false },
        };
        FenceAction::RunStep {
            flow: f.id,
            node: f.node.clone(),
            step: f.step,
            work,
        }
    }
}

/// Steps recorded as running without an outcome lost their executor (a restart, or the previous
/// leader died): run them again. Every step is idempotent (off when off is still off), and the
/// executor never runs one step of a flow twice at once.
pub fn resume(flows: &[Flow]) -> Vec<FenceAction> {
    flows
        .iter()
        .filter(|f| f.status == FenceStatus::Running && f.result.is_none())
        .map(FenceAction::run_step)
        .collect()
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
        let f = Flow::new(node, since, now, step, witnesses, why);
        out.push(FenceAction::Start(f.clone()));
        // Start the first step at once rather than a tick later.
        let mut running = f.clone();
        running.go(now, step, FenceStatus::Running, "attempt 1");
        out.push(FenceAction::run_step(&running));
        out.push(FenceAction::Save(running));
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

mod flow;
mod transitions;
pub use flow::{Call, CancelRefused, Flow, Transition, Witnesses};
use transitions::advance;

#[cfg(test)]
mod tests;
