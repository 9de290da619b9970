//! Repairs' shell: what carries out the decisions of `maintd_core::repair` (its `model` of
//! events, jobs, rounds and actions, `decide`, `capacity` and `conditions`). Here: `poller` (verified reports become
//! observations), `engine` (the tick loop and executor of the actions), `live` (live repairs on
//! the collector) and `upkeep` (the cluster's own work in rounds). Hook jobs run through
//! `exec::jobs`, behind the cluster backend.

pub mod engine;
pub mod health;
pub mod live;
pub mod metrics;
pub mod persisted;
pub mod poller;
pub mod upkeep;
