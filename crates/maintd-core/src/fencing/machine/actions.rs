//! What a fence decision says: records to persist (`Record`) and effects to run once they are
//! (`Effect`), each effect carrying what it needs of its flow, so the executor acts without
//! reading the store again. `Ready` holds one decision's, split the way they are carried out.

use super::*;

/// What to persist. A successor must know of every effect before it happens, so records are
/// written (and shared by one checkpoint) before any effect of the same decision runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Record a new flow (already at its first transition's status) and say why it started.
    Start(Flow),
    /// An operator's request does not start now: `why` names the gate; a `refused` request
    /// never will (no fence configuration, a flow already on the node).
    Hold {
        request: Uuid,
        why: String,
        refused: bool,
    },
    /// Persist the flow as given (its history carries the new transition).
    Save(Flow),
    /// More nodes are silent than the storm limit allows: no power action now.
    Storm { unreachable: usize, total: usize },
}

/// What to do once the records are persisted.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Run the flow's current step.
    RunStep {
        flow: Uuid,
        node: String,
        step: Step,
        work: StepWork,
        /// The agent calls the flow has made, and where the last failed one ran (a call run as
        /// a Job goes elsewhere next time).
        calls: usize,
        failed_on: Option<String>,
    },
    /// Release the node's workloads; `attempt` keys the job so it runs once per restart.
    Release {
        flow: Uuid,
        node: String,
        attempt: u32,
    },
    /// Return the node to service: clear the release and, when `unmark`, the mark. `since`:
    /// when the node went silent (what ran on it after that says nothing of the node back).
    Reclaim {
        flow: Uuid,
        node: String,
        unmark: bool,
        since: Nanos,
    },
    /// The node answered with the boot id it had before a verified power-off: the device lied
    /// or switched another node. It stays out of service.
    Alarm {
        flow: Uuid,
        node: String,
        detail: String,
    },
    TagFailed {
        flow: Uuid,
        node: String,
        tag: String,
    },
}

/// One decision, in the order it was made: each a record or an effect.
// A record holds a whole flow and an effect a few ids; the values live for one decision in
// one Vec, so boxing the flow would only add an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum FenceAction {
    Record(Record),
    Effect(Effect),
}

impl From<Record> for FenceAction {
    fn from(r: Record) -> FenceAction {
        FenceAction::Record(r)
    }
}

impl From<Effect> for FenceAction {
    fn from(e: Effect) -> FenceAction {
        FenceAction::Effect(e)
    }
}

/// One decision split the way it is carried out: every record, then every effect.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Ready {
    pub records: Vec<Record>,
    pub effects: Vec<Effect>,
}

impl From<Vec<FenceAction>> for Ready {
    fn from(actions: Vec<FenceAction>) -> Ready {
        let mut ready = Ready::default();
        for a in actions {
            match a {
                FenceAction::Record(r) => ready.records.push(r),
                FenceAction::Effect(e) => ready.effects.push(e),
            }
        }
        ready
    }
}

impl Ready {
    /// Keeps only what concerns the nodes `keep` says yes to (and what concerns no node).
    pub fn retain_nodes(&mut self, keep: impl Fn(&str) -> bool) {
        self.records.retain(|r| match r {
            Record::Start(f) | Record::Save(f) => keep(&f.node),
            Record::Hold { .. } | Record::Storm { .. } => true,
        });
        self.effects.retain(|e| keep(e.node()));
    }
}

impl Effect {
    /// The flow an effect acts for.
    pub fn flow(&self) -> Uuid {
        match self {
            Effect::RunStep { flow, .. }
            | Effect::Release { flow, .. }
            | Effect::Reclaim { flow, .. }
            | Effect::TagFailed { flow, .. }
            | Effect::Alarm { flow, .. } => *flow,
        }
    }

    /// The node an effect acts on.
    pub fn node(&self) -> &str {
        match self {
            Effect::RunStep { node, .. }
            | Effect::Release { node, .. }
            | Effect::Reclaim { node, .. }
            | Effect::TagFailed { node, .. }
            | Effect::Alarm { node, .. } => node,
        }
    }

    /// Runs `f`'s current step.
    pub fn run_step(f: &Flow) -> Effect {
        let work = match f.step {
            Step::SelfFence => StepWork::Mark,
            // A released node's mark stays until its return to service is proven (the
            // reclaim clears it); a flow that stood down clears it with its recovery.
            Step::Recovery => StepWork::Agents {
                mark: false,
                unmark: f.marked && !f.released(),
            },
            // Unschedulable from before the power-off until the proven return (marking again
            // on a retry changes nothing).
            Step::PowerManagement => StepWork::Agents {
                mark: true,
                unmark: false,
            },
            _ => StepWork::Agents {
                mark: false,
                unmark: false,
            },
        };
        Effect::RunStep {
            flow: f.id,
            node: f.node.clone(),
            step: f.step,
            work,
            calls: f.calls.len(),
            failed_on: f
                .calls
                .iter()
                .rev()
                .find(|c| !c.ok && c.host.is_some())
                .and_then(|c| c.host.clone()),
        }
    }

    /// Returns `f`'s node to service.
    pub fn reclaim(f: &Flow) -> Effect {
        Effect::Reclaim {
            flow: f.id,
            node: f.node.clone(),
            unmark: f.marked,
            since: f.detected,
        }
    }
}

/// What running a step does, decided here so that the executor only acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepWork {
    /// Self-fencing: mark the node unschedulable, so nothing new lands on it while its watchdog
    /// resets it.
    Mark,
    /// Run the stage's fence agents; first mark the node unschedulable (`mark`, before a
    /// power-off), or clear the mark (`unmark`, when a flow stood down before any release).
    Agents { mark: bool, unmark: bool },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(node: &str) -> Flow {
        let mut f = Flow::new(node, 1, 2, Step::PowerManagement, Witnesses::default(), "x");
        f.status = FenceStatus::Running;
        f
    }

    #[test]
    fn a_decision_splits_into_records_then_effects_in_order() {
        let (a, b) = (flow("n1"), flow("n2"));
        let ready = Ready::from(vec![
            Effect::run_step(&a).into(),
            Record::Save(a.clone()).into(),
            Effect::reclaim(&b).into(),
            Record::Start(b.clone()).into(),
        ]);
        assert_eq!(
            ready.records,
            [Record::Save(a.clone()), Record::Start(b.clone())]
        );
        assert_eq!(ready.effects, [Effect::run_step(&a), Effect::reclaim(&b)]);
    }

    #[test]
    fn an_effect_carries_what_it_needs_of_its_flow() {
        let mut f = flow("n1");
        let call = |ok, host: Option<&str>| Call {
            at: 3,
            step: Step::PowerManagement,
            method: "m".into(),
            agent: "fence_ipmilan".into(),
            action: "off".into(),
            code: Some(if ok { 0 } else { 1 }),
            ok,
            elapsed_ms: 1,
            output: String::new(),
            host: host.map(str::to_string),
            pending: false,
        };
        f.calls = vec![call(false, Some("n3")), call(true, None), call(false, None)];
        match Effect::run_step(&f) {
            Effect::RunStep {
                calls,
                failed_on,
                work,
                ..
            } => {
                assert_eq!((calls, failed_on.as_deref()), (3, Some("n3")));
                assert_eq!(
                    work,
                    StepWork::Agents {
                        mark: true,
                        unmark: false
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        f.marked = true;
        assert_eq!(
            Effect::reclaim(&f),
            Effect::Reclaim {
                flow: f.id,
                node: "n1".into(),
                unmark: true,
                since: 1,
            }
        );
    }

    #[test]
    fn what_concerns_a_refused_node_is_dropped_and_nothing_else() {
        let (a, b) = (flow("n1"), flow("n2"));
        let mut ready = Ready::from(vec![
            Record::Storm {
                unreachable: 1,
                total: 3,
            }
            .into(),
            Record::Save(a.clone()).into(),
            Record::Start(b.clone()).into(),
            Effect::run_step(&a).into(),
            Effect::run_step(&b).into(),
        ]);
        ready.retain_nodes(|n| n != "n2");
        assert_eq!(ready.records.len(), 2, "{ready:?}");
        assert_eq!(ready.effects, [Effect::run_step(&a)]);
    }
}
