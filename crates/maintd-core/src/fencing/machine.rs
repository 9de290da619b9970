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
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Step {
    Isolation,
    PowerManagement,
    /// Power the node back on after its workloads were released (`after-release = "on"`),
    /// verified by a status that reads ON.
    PowerOn,
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
    schemars::JsonSchema,
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
    /// The boot the node's latest verified report named.
    pub boot: Option<BootSeen>,
    /// When the adaptive failure detector suspects the node if it stays silent (steady clock,
    /// from the spacing of its answers): a silent collector is a candidate only once the
    /// grace has passed **and** this moment has, so a jittery or lossy link stretches the wait
    /// past the grace, never shortens it. `None` before the detector knows the link.
    pub suspected_at: Option<Nanos>,
}

/// What the master last heard of a node's boot, from its signed reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootSeen {
    /// `/proc/sys/kernel/random/boot_id`: new at every boot.
    pub id: Uuid,
    /// When the node says it booted (its clock).
    pub booted_at: Nanos,
    /// When the diagnose behind the latest verified report started (the node's clock).
    pub reported_at: Nanos,
    /// Consecutive healthy reports, each from its own diagnose, started after the boot.
    pub clean: u32,
}

/// What the return to service of a fenced node waits for besides its own reports: its other
/// witnesses, as the master observes them now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReturnFacts {
    /// The kubelet's Ready condition (Kubernetes); `None` where there is no kubelet to ask.
    pub ready: Option<bool>,
    /// When the master last saw each Lease witness (`lease:kubelet`, `lease:<ns>/<name>`)
    /// renewed, by its own clock.
    pub renewed: BTreeMap<String, Nanos>,
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
    /// Power the node back on after the release (`after-release = "on"`).
    pub power_on: Option<StageLimits>,
    pub recovery: StageLimits,
    /// The node self-fences: the last level (the only one without power-management).
    pub self_fence: bool,
    /// The node's crash kernel sends kdump notifications: its power-off waits for the kdump
    /// window.
    pub kdump: bool,
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
            Step::PowerOn => self.power_on.unwrap_or(none),
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
    /// How long power-management waits after a kdump notification, for the dump to finish.
    pub kdump_timeout: Nanos,
    /// How long after a kdump node went silent its power-off waits for a notification.
    pub kdump_window: Nanos,
    /// Healthy reports from diagnoses started after its new boot that a fenced node must
    /// deliver, in a row, before it returns to service.
    pub clean_reports: u32,
    /// A fenced node not back in service this long after its power-on (or its proven reset)
    /// fails its flow: tagged fencefailed, and said so.
    pub return_deadline: Nanos,
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
    /// Fences operators asked for that have no flow yet, oldest first.
    pub requests: Vec<FenceRequest>,
    /// The latest kdump notification from each node configured for kdump.
    pub kdump: BTreeMap<String, Nanos>,
    /// The witnesses of fenced nodes' return besides their reports (absent: none known).
    pub returns: BTreeMap<String, ReturnFacts>,
    /// This master's boot and its boot clock, read with `now`: a proven wait is kept on it.
    pub boot: crate::verdict::BootInstant,
    /// Nodes an operator put in maintenance, with why (a node tagged as waiting for the
    /// acknowledgement of its repair is in maintenance too: see [`in_maintenance`]).
    pub maintenance: BTreeMap<String, String>,
}

/// Why `node` is in maintenance, if it is: an operator said so, or a repair event evacuated it
/// and waits for its acknowledgement (its `repairready` tag stands), so a person may have
/// their hands in it. Such a node is never fenced, powered on or off, and does not count
/// toward the storm threshold.
pub fn in_maintenance(s: &FenceState, node: &str) -> Option<String> {
    if let Some(why) = s.maintenance.get(node) {
        return Some(why.clone());
    }
    awaiting_ack(s.tags.get(node)?)
}

/// Why a node with these tags is in maintenance for its repair: its `repairready` tag stands.
pub fn awaiting_ack(tags: &BTreeSet<String>) -> Option<String> {
    let ready = crate::tags::TagKind::RepairReady.as_str();
    tags.iter()
        .find(|t| crate::tags::split(t).is_some_and(|(kind, _)| kind == ready))
        .map(|t| format!("waits for the acknowledgement of its repair (remove {t} to end it)"))
}

/// An operator's request to fence a node (on Kubernetes, a NodeFence object created with
/// kubectl): once its gates pass it becomes a flow with the request's id.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceRequest {
    pub id: Uuid,
    pub node: String,
    /// Who asked, for the flow's witnesses and notes (as `NodeFence/web-3`).
    pub by: String,
    /// Why it was held last time, so an unchanged reason is not written again.
    pub held: Option<String>,
}

/// Steps recorded as running without an outcome lost their executor (a restart, or the previous
/// leader died): run them again. Every step is idempotent (off when off is still off), and the
/// executor never runs one step of a flow twice at once.
pub fn resume(flows: &[Flow]) -> Vec<Effect> {
    flows
        .iter()
        .filter(|f| f.status == FenceStatus::Running && f.result.is_none())
        .map(Effect::run_step)
        .collect()
}

/// Decides every fence action due now, split the way it is carried out: what to persist
/// first, then what to do.
pub fn decide(s: &FenceState, now: Nanos) -> Ready {
    Ready::from(decide_fencing(s, now))
}

/// A node is silent if its collector does not answer the probe, or if a node-condition fence
/// rule holds for it (then since the condition began, whichever is earlier).
pub fn merge_liveness(
    (answers, silent_since, answered): (bool, Option<Nanos>, bool),
    fence_rule_since: Option<Nanos>,
    (healthy_at, boot): (Option<Nanos>, Option<BootSeen>),
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
        boot,
        suspected_at: None,
    }
}

/// Decides every fence action due now, in the order decided (`decide` splits them).
pub fn decide_fencing(s: &FenceState, now: Nanos) -> Vec<FenceAction> {
    let mut out = Vec::new();
    // Nodes in maintenance, and nodes already fenced or waiting to return, are out of the
    // pool: their silence is known, and must not hold the next dead node's fence.
    let counted: Vec<&Liveness> = s
        .liveness
        .iter()
        .filter(|(n, _)| in_maintenance(s, n).is_none())
        .filter(|(n, _)| {
            !s.flows
                .iter()
                .any(|f| &f.node == *n && f.fenced() && f.status != FenceStatus::Final)
        })
        .map(|(_, l)| l)
        .collect();
    let total = counted.len();
    let unreachable = counted.iter().filter(|l| !l.reachable).count();
    let storm = total > 0 && unreachable * 100 > s.policy.storm_percent as usize * total;
    if storm {
        out.push(FenceAction::Record(Record::Storm { unreachable, total }));
    }
    let hold_power = storm || s.policy.paused;
    for f in &s.flows {
        advance(s, f, hold_power, now, &mut out);
    }
    let mut gates = Gates {
        in_flight: s
            .flows
            .iter()
            .filter(|f| f.in_flight(s.policy.max_restarts))
            .count(),
        last_start: s.flows.iter().map(|f| f.created).max(),
    };
    let held = if storm {
        Some(format!(
            "fencing storm: {unreachable} of {total} nodes unreachable"
        ))
    } else if s.policy.paused {
        Some("fencing is paused".to_string())
    } else {
        None
    };
    requested_flows(s, held, &mut gates, now, &mut out);
    if !hold_power {
        start_flows(s, &mut gates, now, &mut out);
    }
    out
}

mod actions;
mod back;
mod ctx;
mod flow;
mod kdump;
mod record;
mod reset;
mod start;
mod transitions;
pub use actions::{Effect, FenceAction, Ready, Record, StepWork};
pub use back::observe_report;
pub use flow::{
    Call, CancelRefused, Flow, FlowOutcome, KILLED, PENDING, Transition, Witnesses, ended,
    established,
};
pub use record::{ExecPolicy, Executor, MethodRecord, PlanRecord, StageRecord};
use start::{Gates, requested_flows, start_flows};
use transitions::advance;

#[cfg(test)]
mod tests;
