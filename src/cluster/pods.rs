//! Work run as a pod on the cluster (a Kubernetes Job on that backend): what a remedy or a fence
//! agent call asks for, and how it ended. The backend owns how; these types say what.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ClusterError;

/// Where a run's secret files appear in its containers (a Secret volume, read-only).
pub const FILES_DIR: &str = "/run/maintd";

/// Where the pod may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On this node (a remedy that repairs the node it runs on).
    On(String),
    /// Anywhere but these nodes (the node being fenced, and nodes where an attempt failed).
    AwayFrom(Vec<String>),
}

/// One run: a pod template and what maintd adds to it.
#[derive(Clone)]
pub struct PodRun {
    /// The Job's name. It is derived from the work itself, so that running the same work again
    /// (a new leader resuming it) finds the first Job and waits for it instead of starting a
    /// second one.
    pub name: String,
    /// Labels on the Job and its pods (`maintd.io/role` and the work's identity).
    pub labels: BTreeMap<String, String>,
    /// A PodTemplateSpec, as JSON.
    pub template: serde_json::Value,
    /// Added to every container's environment.
    pub env: Vec<(String, String)>,
    pub placement: Placement,
    /// Files under `FILES_DIR`, from a Secret owned by the Job; their values appear nowhere
    /// else (not in the Job, not in a log).
    pub files: BTreeMap<String, String>,
    /// The Job's `activeDeadlineSeconds`; maintd waits a little longer for its verdict.
    pub deadline: Duration,
    /// The Job's `ttlSecondsAfterFinished`.
    pub ttl: Duration,
}

impl std::fmt::Debug for PodRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `files` may hold secrets: never printed.
        f.debug_struct("PodRun")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PodOutcome {
    /// The Job completed (its pod exited 0).
    pub succeeded: bool,
    /// What happened, for an event's note or a flow's call: the Job, where it ran, and why it
    /// failed.
    pub detail: String,
    /// The node its (last) pod ran on.
    pub host: Option<String>,
    /// The container's termination message, when it wrote one.
    pub message: Option<String>,
    /// An existing Job of the same work was found and waited for.
    pub adopted: bool,
}

/// Runs pods to their end. The Kubernetes backend's Jobs; others have none.
#[async_trait::async_trait]
pub trait PodRunner: Send + Sync + 'static {
    async fn run_pod(&self, run: PodRun) -> Result<PodOutcome, ClusterError>;
}
