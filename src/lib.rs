//! maintd: cluster maintenance and node-repair daemon, the shell around the pure core
//! (`maintd_core`: the vocabulary and every decision). docs/ARCHITECTURE.md has the module map,
//! the path of data and where each side effect lives.
//!
//! Two rooms hold the executors of the two things maintd does:
//! - `repair`: collector reports become repair events and rounds of jobs (`poller`, `engine`
//!   and `live` act on what `maintd_core::repair` decides).
//! - `fencing`: a silent node is fenced in stages (`executor`, `agent`, `config` and `redact`
//!   act on or configure what `maintd_core::fencing::machine` decides).
//!
//! What they share:
//! - `report`: the wire protocol: the signed report envelope, keys, request signatures, peer
//!   heartbeats and the live-repair request and record.
//! - `clock`: the clock seam of the shells (pure code is handed `now`); `ticker`: the periodic loop.
//! - `config`: file, environment and flags resolved once into validated per-component settings.
//! - `parts`: what every long-running part is built from (store, backend, metrics, leadership,
//!   clock, membership).
//! - `node`, `members`: a managed node; the membership and node conditions every task reads.
//! - `exec`: whitelisted command lookup and bounded subprocess runs; hook calls and detached hook
//!   jobs (`exec::hooks`, `exec::jobs`).
//! - `http`: JSON errors, signed-request middleware, and the bounded listener.
//! - `fsutil`: atomic writes of state files.
//! - `secret`: reading owner-only secret files (the cluster key, agent passwords).
//! - `sdnotify`: systemd's readiness and watchdog notifications.
//! - `store`: SQLite persistence, one file per table group; the `FlowStore` and `Checkpoint`
//!   seams.
//! - `cluster`: the backend traits, the inventory backend and the Kubernetes backend (`kube`).
//! - `leader`: which replica acts, and the checkpoint a successor resumes from.
//! - `metrics`: the Prometheus registry of the daemon.
//! - `collector`: the node agent (`maintd collector`).
//! - `daemon`: the master process: lock, the one assembly of its parts (shared with the
//!   simulated-time harness), the HTTP API, shutdown.
//! - `cli`: argument parsing, the operator commands, and, with the `bench` feature only,
//!   `maintd bench` (`cli::bench`).
//! - `sync`: lock access that survives a poisoned lock.
//! - `link`: how the daemon reaches a collector (`CollectorLink`; HTTP in production).
//! - `views`: the JSON shapes the API serves and the CLI reads.
//! - `sim` (tests only): the simulated-time harness.
//!
//! Public are the modules the binary, the integration tests, the benchmarks and the fuzz
//! targets use (`cli`, `cluster`, `config`, `http`, `repair`, `report`, `verdict`); everything
//! else is internal.

pub mod cli;
mod clock;
pub mod cluster;
mod collector;
pub mod config;
mod daemon;
mod exec;
mod fencing;
mod fsutil;
pub mod http;
mod leader;
mod link;
mod members;
mod metrics;
mod node;
mod parts;
pub mod repair;
pub mod report;
mod sdnotify;
mod secret;
#[cfg(test)]
mod sim;
mod store;
mod sync;
mod ticker;
mod views;
