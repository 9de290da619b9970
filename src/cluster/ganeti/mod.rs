//! The Ganeti backend (`backend`): Ganeti's remote API (`rapi`), reached over TLS with its
//! certificate pinned (`pin`).

mod backend;
mod pin;
pub mod rapi;

pub use backend::{Ganeti, GanetiConfig, REASON_SOURCE};
pub use rapi::{JobDone, Rapi, RapiError, RapiNode, RapiSettings};
