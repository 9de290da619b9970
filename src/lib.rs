//! maintd: cluster maintenance and node-repair daemon.
//!
//! Module map:
//! - `report`: diagnose verdicts, the signed report envelope, keys and request signatures.
//! - `config`: the one validated configuration (defaults, TOML file, flags).
//! - `exec`: whitelisted command lookup and bounded subprocess runs.
//! - `core`: the pure decision core, `decide(state, observations, now) -> actions`.
//! - `store`: SQLite persistence (events, jobs, rounds, poll state, inventory tags).

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
