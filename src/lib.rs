//! maintd: cluster maintenance and node-repair daemon.
//!
//! Module map:
//! - `report`: diagnose verdicts, the signed report envelope, keys and request signatures.
//! - `config`: the one validated configuration (defaults, TOML file, flags).
//! - `exec`: whitelisted command lookup and bounded subprocess runs.
//! - `core`: the pure decision core, `decide(state, observations, now) -> actions`, with the fence
//!   state machine, evacuation admission (`capacity`) and node-condition rules (`conditions`).
//! - `store`: SQLite persistence (events, jobs, rounds, poll state, inventory tags, fence flows)
//!   and the checkpoint a Kubernetes leader shares with its standby.
//! - `cluster`: the backend trait, the inventory backend and the Kubernetes backend (`kube`).
//! - `daemon`: poller, engine, fencer, leadership, node watch and the HTTP API.
//! - `fencing`: fence-agent configuration and the agent runner.

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod collector;
pub mod config;
pub mod core;
pub mod daemon;
pub mod exec;
pub mod fencing;
pub mod http;
pub mod jobrunner;
pub mod report;
pub mod store;
