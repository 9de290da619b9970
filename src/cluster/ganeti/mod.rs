//! The Ganeti backend (`backend`): Ganeti's remote API (`rapi`), reached over TLS with its
//! certificate pinned (`pin`); harep's instance repairs (`autorepair`) and hbal's balancing moves
//! done in rounds (`upkeep`).

pub mod autorepair;
mod backend;
mod hbal;
mod pin;
pub mod rapi;
mod repairs;
mod tasks;
mod upkeep;

pub use backend::{Ganeti, GanetiConfig, REASON_SOURCE};
pub use rapi::{JobDone, Rapi, RapiError, RapiNode, RapiSettings};
