//! What one transition of a flow reads: the decision's state, the flow, its node's liveness
//! and plan summary, whether power actions are held, and now.

use super::{FenceState, Flow, Liveness, PlanSummary};
use crate::verdict::Nanos;

/// What every transition of one flow reads.
pub(super) struct Ctx<'a> {
    pub(super) s: &'a FenceState,
    pub(super) f: &'a Flow,
    pub(super) l: Liveness,
    pub(super) plan: &'a PlanSummary,
    pub(super) hold_power: bool,
    /// The node is in maintenance: no step of its flow runs (no agent call at all) until it
    /// leaves it.
    pub(super) maintenance: bool,
    pub(super) now: Nanos,
}
