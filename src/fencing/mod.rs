//! Fencing's shell: what carries out the decisions of `maintd_core::fencing` (the staged fence
//! state machine, the second opinion's `watchers` and `opinion`, self-fencing's `selffence`, the
//! probe's `rtt`, `drill`). Here: `executor` (the liveness probe, and the executor of the machine's actions over the
//! `FlowStore`), `agent` (running a
//! ClusterLabs fence agent with a verified power-off), `config` (devices and stages), `readiness`
//! (status checks of every device before anything fails), `redact` (keeping secrets out of
//! agent output) and `peering` (peer sets pushed to collectors, their views read back).

pub mod agent;
pub mod agentjob;
pub mod book;
pub mod call;
pub mod config;
pub mod configmaps;
pub mod executor;
pub mod metrics;
pub mod peering;
mod peersets;
pub mod plan;
pub mod readiness;
pub mod redact;
