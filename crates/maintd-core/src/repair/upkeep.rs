//! What the backend is told when it may plan the cluster's own upkeep (Ganeti: instance repairs
//! and balancing moves): which nodes the repair events hold, and whether a round starts now.

use std::collections::BTreeSet;

use super::model::{Action, RepairStatus, State};

/// What the engine knows when it asks for a round's upkeep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpkeepPlan {
    /// Nodes with an active event or a job in the round.
    pub busy: BTreeSet<String>,
    /// Nodes with a failed event: no balancing there.
    pub failed: BTreeSet<String>,
    /// A round of events starts now (the upkeep joins it).
    pub round: bool,
}

/// `None` while a round or upkeep runs. The nodes of events that still hold them (noted,
/// pending, or completed and not acknowledged) are busy; those of failed events get no
/// balancing.
pub fn plan(state: &State, actions: &[Action], running: bool) -> Option<UpkeepPlan> {
    if running || state.round_running.is_some() {
        return None;
    }
    let mut busy = BTreeSet::new();
    let mut failed = BTreeSet::new();
    for e in &state.events {
        match e.status {
            RepairStatus::Failed => {
                failed.insert(e.node.clone());
            }
            RepairStatus::Canceled => {}
            _ if e.acknowledged => {}
            _ => {
                busy.insert(e.node.clone());
            }
        }
    }
    let mut round = false;
    for a in actions {
        if let Action::StartRound { jobs, .. } = a {
            round = true;
            busy.extend(jobs.iter().map(|j| j.node.clone()));
        }
    }
    Some(UpkeepPlan {
        busy,
        failed,
        round,
    })
}
