//! The live-repair conversation on the wire: the daemon's signed request to run a repair
//! command on a node, and the record the collector keeps and serves of it. Both sides use these
//! types, so they belong to the protocol rather than to either side.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum RepairState {
    Queued,
    Running,
    Done,
}

/// What the daemon sees of a live repair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LiveRepairRecord {
    pub job: String,
    pub event: String,
    pub command: String,
    pub state: RepairState,
    #[serde(rename = "exit-code")]
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub output: String,
    pub seq: u64,
}

/// A daemon's request to run a live repair.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepairRequest {
    /// Idempotency key: the same job is never run twice.
    pub job: String,
    pub event: String,
    pub command: String,
    /// The event's whole diagnose JSON, given to the command on stdin.
    pub input: maintd_core::verdict::ExactJson,
}
