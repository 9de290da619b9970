//! Fencing: what happens when a node stops answering. The pure part is `machine` (the staged
//! fence state machine: isolation, power-management, recovery, storm protection); the shell is
//! `executor` (the liveness probe and the executor of the machine's calls), `agent` (running a
//! ClusterLabs fence agent with a verified power-off), `config` (devices and stages), `readiness`
//! (status checks of every device before anything fails) and `redact` (keeping secrets out of
//! agent output).

pub mod agent;
pub mod config;
pub mod executor;
pub mod machine;
pub mod readiness;
pub mod redact;
// Who watches whom, for the peer heartbeats of issue 13; the heartbeat sender that uses it is the
// next step, so outside the tests nothing calls it yet.
#[cfg_attr(not(test), allow(dead_code))]
pub mod watchers;
