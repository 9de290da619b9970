//! Fencing: what happens when a node stops answering. The pure part is `machine` (the staged
//! fence state machine: isolation, power-management, recovery, storm protection); the shell is
//! `executor` (the liveness probe, and the executor of the machine's actions over the
//! `FlowStore`), `agent` (running a
//! ClusterLabs fence agent with a verified power-off), `config` (devices and stages), `readiness`
//! (status checks of every device before anything fails), `redact` (keeping secrets out of
//! agent output) and `peering` (peer sets pushed to collectors, their views read back). The
//! second opinion is pure: `watchers` (who watches whom) and `opinion` (what they say); so are
//! self-fencing's rules (`selffence`: when a node feeds its watchdog, and the proof of its
//! reset), and the probe's patience (`rtt`: a round-trip estimate per node).

pub mod agent;
pub mod agentjob;
pub mod book;
pub mod call;
pub mod config;
pub mod configmaps;
pub mod drill;
pub mod executor;
pub mod machine;
pub mod opinion;
pub mod peering;
mod peersets;
pub mod plan;
pub mod readiness;
pub mod redact;
pub mod rtt;
pub mod selffence;
pub mod watchers;
