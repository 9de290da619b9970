//! maintd: cluster maintenance and node-repair daemon. docs/ARCHITECTURE.md has the module map,
//! the path of data and where each side effect lives.
//!
//! Module map:
//! - `verdict`: the domain's verdict types (`Status`, `Verdict`, canonical JSON).
//! - `report`: the wire protocol: the signed report envelope, keys and request signatures.
//! - `clock`: the clock seam of the shells (the core is handed `now`).
//! - `config`: the one validated configuration (defaults, TOML file, flags).
//! - `node`: a managed node and its collector address.
//! - `exec`: whitelisted command lookup and bounded subprocess runs.
//! - `jobrunner`: detached hook jobs, each with a directory, resumable after a restart.
//! - `http`: JSON errors, signed-request middleware, and the bounded listener.
//! - `collector`: the node agent (`maintd collector`).
//! - `core`: the pure decision core, `decide(state, observations, now) -> actions`, with the fence
//!   state machine, evacuation admission (`capacity`) and node-condition rules (`conditions`).
//! - `secret`: reading owner-only secret files (the cluster key, agent passwords).
//! - `store`: SQLite persistence, one file per table group, and the leader's checkpoint.
//! - `cluster`: the backend traits, the inventory backend and the Kubernetes backend (`kube`).
//! - `fencing`: fence-agent configuration, the agent runner and output redaction.
//! - `daemon`: poller, engine, fencer, leadership, node membership and the HTTP API.
//! - `cli`: argument parsing, the operator commands, and `maintd bench poll|plan` (`cli::bench`).

pub mod cli;
pub mod clock;
pub mod cluster;
pub mod collector;
pub mod config;
pub mod core;
pub mod daemon;
pub mod exec;
pub mod fencing;
pub mod http;
pub mod jobrunner;
pub mod node;
pub mod report;
pub mod secret;
pub mod store;
pub mod sync;
pub mod verdict;
