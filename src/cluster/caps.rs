//! What the daemon needs from a cluster, one small trait per capability, and `Backend`, the
//! set a backend offers: every backend tags nodes, runs jobs and releases fenced nodes; the
//! rest (Events, node facts, claims, capacity, upkeep, pods, token reviews) only some have, so
//! they are options rather than methods that do nothing. Every job method must be idempotent:
//! after a daemon restart the same job is run again and must not repeat work that already
//! happened.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use uuid::Uuid;

use super::{
    ClusterError, EventReason, NodeFacts, PodRunner, Purpose, Upkeep, UpkeepPlan, WitnessLeases,
};
use crate::http::tokens::TokenReviewer;
use maintd_core::repair::Job;
use maintd_core::verdict::Outcome;

/// Tags on nodes and the jobs of repairs.
#[async_trait::async_trait]
pub trait TagsAndJobs: Send + Sync + 'static {
    /// Tags of every node.
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError>;
    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError>;
    /// Returns whether the tag was there.
    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError>;
    /// Runs an evacuate, evacuate-failover, offline or online job for an event, given as its
    /// JSON text (as `/1/status` shows it, the diagnose's numbers exact).
    async fn run_job(&self, job: &Job, event_json: &str) -> Outcome;
    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError>;
}

/// What a fence flow asks of the cluster once the node is proven off, and when it is back.
#[async_trait::async_trait]
pub trait FenceRelease: Send + Sync + 'static {
    /// Releases a fenced node's workloads; called only after a verified power-off. Runs at most
    /// once per (flow, attempt), even across daemon restarts.
    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome;
    /// Clears a release once the node has recovered.
    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome;
    /// Marks a self-fencing node unschedulable (`on`), so that after its reset it takes no
    /// work, or clears that once it is back. Idempotent.
    async fn mark_unschedulable(&self, node: &str, flow: &Uuid, on: bool) -> Outcome;
}

/// Human-readable records where operators look (Kubernetes Events).
#[async_trait::async_trait]
pub trait Events: Send + Sync + 'static {
    /// Records an event on the node.
    async fn record(&self, node: &str, reason: EventReason, message: &str, warning: bool);
    /// Records a Warning on a configuration object (a fence ConfigMap).
    async fn record_config(&self, configmap: &str, reason: EventReason, message: &str);
}

/// What the cluster itself knows of its nodes' lives (Kubernetes: conditions and Leases).
#[async_trait::async_trait]
pub trait NodeWitness: Send + Sync + 'static {
    /// Current membership and node conditions.
    async fn node_facts(&self) -> Result<NodeFacts, ClusterError>;
    /// The Leases that witness nodes' lives, read now from the watches. Cheap: the fencer asks
    /// at every decision.
    fn witness_leases(&self) -> WitnessLeases;
}

/// The managed nodes as the backend lists them, for backends whose membership can change while
/// the daemon runs without a watch of their own (Ganeti).
#[async_trait::async_trait]
pub trait NodeSource: Send + Sync + 'static {
    async fn members(&self) -> Result<Vec<crate::node::NodeConfig>, ClusterError>;
    /// How often the list is worth asking for.
    fn interval(&self) -> std::time::Duration;
}

/// Per-node claims shared with other controllers (Kubernetes: NodeMaintenance objects and the
/// medik8s Lease).
#[async_trait::async_trait]
pub trait Claims: Send + Sync + 'static {
    /// Nodes someone else is working on, with why: held as if in maintenance. Cheap: read from
    /// watches at every decision.
    fn held_elsewhere(&self) -> BTreeMap<String, String>;
    /// Holds the claims of `purpose` for exactly `nodes`, renewing those due and giving back
    /// the rest; returns the nodes it could not claim, with why. Nothing is done on such a node
    /// this time.
    async fn hold_nodes(
        &self,
        purpose: Purpose,
        nodes: &BTreeSet<String>,
    ) -> BTreeMap<String, String>;
}

/// Capacity facts for admitting drains, for backends that know the workloads.
#[async_trait::async_trait]
pub trait Capacity: Send + Sync + 'static {
    async fn capacity(&self) -> Result<maintd_core::repair::capacity::Snapshot, ClusterError>;
}

/// The cluster's own upkeep besides the events' jobs (Ganeti: instance repairs and balancing).
#[async_trait::async_trait]
pub trait UpkeepRunner: Send + Sync + 'static {
    /// The upkeep for a round, none touching a node in `busy` (being evacuated or repaired) and
    /// no balancing move touching a node in `failed` (a failed event). `round` says a round of
    /// events starts with it; otherwise the backend may decline to look (its own interval).
    async fn plan_upkeep(&self, plan: &UpkeepPlan) -> Result<Vec<Upkeep>, ClusterError>;
    /// Runs one planned task to its end. Idempotent across restarts, like jobs.
    async fn run_upkeep(&self, u: &Upkeep) -> Outcome;
}

/// The capabilities one backend offers, each shared by whoever uses it.
#[derive(Clone)]
pub struct Backend {
    pub jobs: Arc<dyn TagsAndJobs>,
    pub fences: Arc<dyn FenceRelease>,
    pub events: Option<Arc<dyn Events>>,
    pub witness: Option<Arc<dyn NodeWitness>>,
    pub nodes: Option<Arc<dyn NodeSource>>,
    pub claims: Option<Arc<dyn Claims>>,
    pub capacity: Option<Arc<dyn Capacity>>,
    pub upkeep: Option<Arc<dyn UpkeepRunner>>,
    /// What runs pods to their end (remedy Jobs, fence agents as Jobs).
    pub pods: Option<Arc<dyn PodRunner>>,
    /// Who checks operators' bearer tokens.
    pub tokens: Option<Arc<dyn TokenReviewer>>,
}

impl Backend {
    /// A backend with the two capabilities every one has, from one value that has both.
    pub fn basic<T: TagsAndJobs + FenceRelease>(b: Arc<T>) -> Backend {
        Backend {
            jobs: b.clone(),
            fences: b,
            events: None,
            witness: None,
            nodes: None,
            claims: None,
            capacity: None,
            upkeep: None,
            pods: None,
            tokens: None,
        }
    }

    /// Records an event on the node where the backend keeps them; nothing elsewhere.
    pub async fn record(&self, node: &str, reason: EventReason, message: &str, warning: bool) {
        if let Some(e) = &self.events {
            e.record(node, reason, message, warning).await;
        }
    }

    /// Records a Warning on a configuration object where the backend keeps Events.
    pub async fn record_config(&self, configmap: &str, reason: EventReason, message: &str) {
        if let Some(e) = &self.events {
            e.record_config(configmap, reason, message).await;
        }
    }

    /// Nodes others are working on (none without claims).
    pub fn held_elsewhere(&self) -> BTreeMap<String, String> {
        self.claims
            .as_ref()
            .map(|c| c.held_elsewhere())
            .unwrap_or_default()
    }
}

/// No backend: for a part run on its own (the benchmarks), which never asks one.
pub struct Unattached;

#[async_trait::async_trait]
impl TagsAndJobs for Unattached {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        Ok(BTreeMap::new())
    }
    async fn add_tag(&self, _node: &str, _tag: &str) -> Result<(), ClusterError> {
        Ok(())
    }
    async fn remove_tag(&self, _node: &str, _tag: &str) -> Result<bool, ClusterError> {
        Ok(false)
    }
    async fn run_job(&self, job: &Job, _event_json: &str) -> Outcome {
        Outcome::failed(format!("{}: no backend", job.kind.as_str()))
    }
    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(BTreeSet::new())
    }
}

#[async_trait::async_trait]
impl FenceRelease for Unattached {
    async fn release(&self, _node: &str, _flow: &Uuid, _attempt: u32) -> Outcome {
        Outcome::failed("no backend")
    }
    async fn reclaim(&self, _node: &str, _flow: &Uuid) -> Outcome {
        Outcome::failed("no backend")
    }
    async fn mark_unschedulable(&self, _node: &str, _flow: &Uuid, _on: bool) -> Outcome {
        Outcome::failed("no backend")
    }
}
