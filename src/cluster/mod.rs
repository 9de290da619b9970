//! The cluster backend trait (tags, evacuate, offline, online, release), the `Coordination`
//! trait of leader election, and `EventReason`. `inventory` holds the local inventory backend
//! (nodes from the config file, tags and offline flags in SQLite, actions as whitelisted hooks);
//! `kube` the Kubernetes implementation of the same traits.

mod caps;
pub mod etcd;
pub mod ganeti;
mod inventory;
pub mod kube;
pub mod maps;
pub mod pods;

pub use caps::{
    Backend, Capacity, Claims, Events, FenceRelease, NodeSource, NodeWitness, TagsAndJobs,
    Unattached, UpkeepRunner,
};
pub use inventory::{HooksConfig, Inventory, InventorySettings};
pub use pods::{PodOutcome, PodRun, PodRunner};

use std::collections::{BTreeMap, BTreeSet};

use crate::exec::ExecError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    #[error("hook {hook:?} for {action} is not usable: {source}")]
    Hook {
        hook: String,
        action: &'static str,
        #[source]
        source: ExecError,
    },
    #[error("cannot set up the job directory: {0}")]
    Jobs(#[source] std::io::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] ::kube::Error),
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    #[error("kubernetes.label-selector: {0}")]
    Selector(#[from] kube::cache::SelectorError),
    /// maintd's tags are node labels on Kubernetes; this one has no label form.
    #[error("tag {0:?} cannot be a node label")]
    TagNotLabel(String),
    #[error("the {what} cache has no list yet: {detail}")]
    NotSynced { what: &'static str, detail: String },
    #[error("the {what} watch is broken: {detail}")]
    WatchBroken { what: &'static str, detail: String },
    #[error("Ganeti: {0}")]
    Ganeti(String),
    #[error("Job {name}: {problem}")]
    Job { name: String, problem: String },
    #[error(transparent)]
    Etcd(etcd::EtcdError),
}

/// What the node list says now (Kubernetes): the managed nodes and their conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    pub members: Vec<crate::node::NodeConfig>,
    pub conditions: BTreeMap<String, Vec<maintd_core::repair::conditions::NodeCondition>>,
}

/// A Lease that witnesses a node's life (its kubelet's, or a storage agent's) as the fencer
/// reads it: only whether and when (by this process's clock) it was renewed, never its time
/// against the master's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletLease {
    /// `renewTime` exactly as stored: a change is a renewal.
    pub renew_marker: String,
    /// `leaseDurationSeconds`; the holder renews every quarter of it.
    pub duration_s: i32,
    /// When this renewal was delivered by a live watch: the renewal happened before, and at
    /// most the watch's delivery delay before. `None` when it was learned from a list.
    pub arrived: Option<std::time::Instant>,
}

/// How much earlier than its arrival on a watch a Lease renewal may have happened: the watch's
/// delivery. A renewal delivered later than this counts as later than it was, which can only
/// delay a fence (a veto for one renew interval), never start one.
pub const LEASE_DELIVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Witness Leases by (node, witness name): `lease:kubelet` or `lease:<namespace>/<name>`.
pub type WitnessLeases = BTreeMap<(String, String), KubeletLease>;

/// A Lease as leader election reads and writes it. `version` is the resourceVersion it was read
/// at (`None`: not created yet), so a write over someone else's change fails instead of winning.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    /// `renewTime` exactly as stored: followers compare it, never their clocks against it.
    pub renew_marker: Option<String>,
    pub duration_s: i32,
    pub transitions: i32,
    pub version: Option<String>,
    /// `acquireTime` as stored: kept on renewal, set anew (None) only when the lease is taken.
    pub acquired: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
}

impl LeaseRecord {
    /// What the lease step reads of it.
    pub fn view(&self) -> maintd_core::lease::LeaseView<'_> {
        maintd_core::lease::LeaseView {
            holder: self.holder.as_deref(),
            transitions: self.transitions,
        }
    }
}

/// Why maintd records an Event on a node: the `reason` operators filter on
/// (`kubectl get events --field-selector reason=MaintdFence`), one stable name each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    /// A repair event was noted for the node.
    EventNoted,
    RepairReady,
    RepairFailed,
    /// A job of a repair ran on the node (the reason names its kind).
    Job(maintd_core::repair::JobKind),
    /// A fence flow moved.
    Fence,
    FenceRelease,
    FenceRecovered,
    /// A node answered with its boot id from before a verified power-off.
    FenceAlarm,
    /// An operator paused fencing at runtime, or resumed it (recorded on maintd's state
    /// ConfigMap).
    FencingPaused,
    FencingResumed,
    /// The master lost the node while its watchers still hear it, and when that ends.
    Partitioned,
    PartitionEnded,
    /// The node's fencing can or cannot act (readiness checks).
    FencingInactive,
    FencingActive,
    /// A node's fence configuration in ConfigMaps is refused (recorded on the ConfigMap).
    FenceConfigRefused,
    /// A remedy's ConfigMap is refused (recorded on the ConfigMap).
    RemedyConfigRefused,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        use maintd_core::repair::JobKind;
        match self {
            EventReason::EventNoted => "MaintdEventNoted",
            EventReason::RepairReady => "MaintdRepairReady",
            EventReason::RepairFailed => "MaintdRepairFailed",
            EventReason::Job(JobKind::LiveRepair) => "Maintdliverepair",
            EventReason::Job(JobKind::Remedy) => "MaintdRemedy",
            EventReason::Job(JobKind::Evacuate) => "Maintdevacuate",
            EventReason::Job(JobKind::EvacuateFailover) => "Maintdevacuatefailover",
            EventReason::Job(JobKind::Offline) => "Maintdoffline",
            EventReason::Job(JobKind::Online) => "Maintdonline",
            EventReason::Fence => "MaintdFence",
            EventReason::FenceRelease => "MaintdFenceRelease",
            EventReason::FenceRecovered => "MaintdFenceRecovered",
            EventReason::FenceAlarm => "MaintdFenceAlarm",
            EventReason::FencingPaused => "MaintdFencingPaused",
            EventReason::FencingResumed => "MaintdFencingResumed",
            EventReason::Partitioned => "MaintdPartitioned",
            EventReason::PartitionEnded => "MaintdPartitionEnded",
            EventReason::FencingInactive => "FencingInactive",
            EventReason::FencingActive => "FencingActive",
            EventReason::FenceConfigRefused => "MaintdFenceConfigRefused",
            EventReason::RemedyConfigRefused => "MaintdRemedyConfigRefused",
        }
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The shared objects of leader election: the Lease, and the ConfigMap holding the leader's
/// checkpoint of the decision state. Writes are conditional: `Ok(None)`/`Ok(false)` on conflict.
#[async_trait::async_trait]
pub trait Coordination: Send + Sync + 'static {
    /// The Lease: from a watch cache unless `fresh` asks the API itself (after a conflict, when
    /// the cache may lag behind the write that won).
    async fn get_lease(&self, fresh: bool) -> Result<Option<LeaseRecord>, ClusterError>;
    /// Creates the Lease (`version` None) or replaces the version read; sets `renewTime` now.
    /// Returns the Lease as written (its new version), or `None` on conflict.
    async fn write_lease(&self, lease: &LeaseRecord) -> Result<Option<LeaseRecord>, ClusterError>;
    /// The checkpoint and its resourceVersion, from a watch cache unless `fresh`.
    async fn get_state(&self, fresh: bool) -> Result<Option<(String, String)>, ClusterError>;
    /// Writes the checkpoint over `version` (None: create); returns the new resourceVersion.
    async fn put_state(
        &self,
        version: Option<&str>,
        data: &str,
    ) -> Result<Option<String>, ClusterError>;
    /// Whether this replica still holds the lease, asked of the store of record now (not of a
    /// cache): the check before an effect when there is no new state to share.
    async fn confirm(&self) -> Result<bool, ClusterError>;
    /// The fencing token this leader's writes compare, where the store has one.
    fn token(&self) -> Option<i64>;
}

/// Why maintd claims a node (the claim is given back once no purpose needs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Purpose {
    Fence,
    Repair,
}

pub use maintd_core::repair::upkeep::UpkeepPlan;

/// One upkeep task of a round: what it does (for logs and the API), the nodes it touches, and
/// the backend's own description of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Upkeep {
    pub what: String,
    pub nodes: BTreeSet<String>,
    pub op: serde_json::Value,
}
