//! The vocabulary of the Ganeti backend's upkeep, shared by its planners (harep's repairs,
//! hbal's moves) and its runner: what maintd does of it, a task as an `Upkeep` describes it,
//! and one RAPI write that submits a job.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What of harep's and hbal's work maintd does (both off by default).
#[derive(Debug, Clone, PartialEq)]
pub struct UpkeepSettings {
    pub repairs: bool,
    pub repair_down_after: Duration,
    pub balance: bool,
    pub balance_mond: bool,
    pub hbal: PathBuf,
    pub luxi_socket: PathBuf,
    pub interval: Duration,
}

/// One upkeep task as the backend describes it (the `op` of an `Upkeep`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub(super) enum Task {
    Repair {
        instance: String,
        rtype: String,
        id: Option<String>,
        ts: Option<i64>,
        pending: Option<String>,
        steps: Vec<Call>,
    },
    Close {
        instance: String,
        pending: String,
        result: String,
        rtype: String,
        id: String,
        ts: i64,
        jobs: Vec<u64>,
    },
    Refuse {
        instance: String,
        rtype: String,
    },
    Balance {
        instance: String,
        steps: Vec<Call>,
    },
    Wait {
        jobs: Vec<u64>,
    },
}

/// One RAPI write that submits a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Call {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) body: Value,
}

pub(super) fn call(method: &str, path: String, body: Value) -> Call {
    Call {
        method: method.into(),
        path,
        body,
    }
}

pub(super) fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
