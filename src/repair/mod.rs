//! Repairs: what happens when a collector reports a problem. The pure part is `model` (events,
//! jobs, rounds, actions), `decide` (what to do now), `capacity` (may this node be evacuated) and
//! `conditions` (node-condition rules); the shell is `poller` (verified reports become
//! observations), `engine` (the tick loop and executor of the actions), `live` (live repairs on
//! the collector) and `upkeep` (the cluster's own work in rounds). Hook jobs run through
//! `exec::jobs`, behind the cluster backend.

pub mod capacity;
pub mod conditions;
pub mod decide;
pub mod engine;
pub mod health;
pub mod live;
pub mod model;
pub mod persisted;
pub mod poller;
pub mod upkeep;

#[cfg(test)]
mod tests;

pub use decide::decide;
pub use model::*;
