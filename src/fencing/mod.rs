//! Node fencing: configuration, fence-agent execution with verified power-off, and the fencer
//! that drives the pure state machine in `core::fence`.

pub mod agent;
pub mod config;
pub mod redact;
