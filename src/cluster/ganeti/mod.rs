//! The Ganeti backend: Ganeti's remote API (`rapi`), reached over TLS with its certificate
//! pinned (`pin`).

mod pin;
pub mod rapi;

pub use rapi::{JobDone, Rapi, RapiError, RapiNode, RapiSettings};
