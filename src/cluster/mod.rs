//! The cluster backend trait (tags, evacuate, offline, online, release) and the local inventory
//! backend: nodes from the config file, tags and offline flags in SQLite, actions as whitelisted
//! hooks. `kube` holds the Kubernetes implementation of the same trait.

pub mod kube;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::exec::hooks::HookCall;
use crate::exec::jobs::JobRunner;
use crate::exec::{self, ExecError};
use crate::repair::Policy;
use crate::repair::{Job, JobKind};
use crate::report::now_ns;
use crate::store::{Store, StoreError};
use crate::verdict::Outcome;
use serde::Deserialize;

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
}

/// What the node list says now (Kubernetes): the managed nodes and their conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    pub members: Vec<crate::node::NodeConfig>,
    pub conditions: BTreeMap<String, Vec<crate::repair::conditions::NodeCondition>>,
    /// Each node's kubelet Lease, by node name (Kubernetes; empty when unknown).
    pub kubelet_leases: BTreeMap<String, KubeletLease>,
}

/// A kubelet's Lease as the fencer reads it: only whether it was renewed, never its time
/// against the master's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletLease {
    /// `renewTime` exactly as stored: a change is a renewal.
    pub renew_marker: String,
    /// `leaseDurationSeconds`; the kubelet renews every quarter of it.
    pub duration_s: i32,
}

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

/// The shared objects of leader election: the Lease, and the ConfigMap holding the leader's
/// checkpoint of the decision state. Writes are conditional: `Ok(None)`/`Ok(false)` on conflict.
/// Why maintd records an Event on a node: the `reason` operators filter on
/// (`kubectl get events --field-selector reason=MaintdFence`), one stable name each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    /// A repair event was noted for the node.
    EventNoted,
    RepairReady,
    RepairFailed,
    /// A job of a repair ran on the node (the reason names its kind).
    Job(crate::repair::JobKind),
    /// A fence flow moved.
    Fence,
    FenceRelease,
    FenceRecovered,
    /// The master lost the node while its watchers still hear it, and when that ends.
    Partitioned,
    PartitionEnded,
    /// The node's fencing can or cannot act (readiness checks).
    FencingInactive,
    FencingActive,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        use crate::repair::JobKind;
        match self {
            EventReason::EventNoted => "MaintdEventNoted",
            EventReason::RepairReady => "MaintdRepairReady",
            EventReason::RepairFailed => "MaintdRepairFailed",
            EventReason::Job(JobKind::LiveRepair) => "Maintdliverepair",
            EventReason::Job(JobKind::Evacuate) => "Maintdevacuate",
            EventReason::Job(JobKind::EvacuateFailover) => "Maintdevacuatefailover",
            EventReason::Job(JobKind::Offline) => "Maintdoffline",
            EventReason::Job(JobKind::Online) => "Maintdonline",
            EventReason::Fence => "MaintdFence",
            EventReason::FenceRelease => "MaintdFenceRelease",
            EventReason::FenceRecovered => "MaintdFenceRecovered",
            EventReason::Partitioned => "MaintdPartitioned",
            EventReason::PartitionEnded => "MaintdPartitionEnded",
            EventReason::FencingInactive => "FencingInactive",
            EventReason::FencingActive => "FencingActive",
        }
    }
}

impl std::fmt::Display for EventReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
}

/// What the daemon needs from a cluster. Every job method must be idempotent: after a daemon
/// restart the same job is run again and must not repeat work that already happened.
#[async_trait::async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// Tags of every node.
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError>;
    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError>;
    /// Returns whether the tag was there.
    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError>;
    /// Runs an evacuate, evacuate-failover, offline or online job for `event`.
    async fn run_job(&self, job: &Job, event: &Value) -> Outcome;
    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError>;
    /// Releases a fenced node's workloads; called only after a verified power-off. Runs at most
    /// once per (flow, attempt), even across daemon restarts.
    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome;
    /// Clears a release once the node has recovered.
    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome;
    /// Marks a self-fencing node unschedulable (`on`), so that after its reset it takes no
    /// work, or clears that once it is back. Idempotent.
    async fn mark_unschedulable(&self, node: &str, flow: &Uuid, on: bool) -> Outcome;
    /// Records a human-readable event on the node (Kubernetes Events); a no-op by default.
    async fn record(&self, _node: &str, _reason: EventReason, _message: &str, _warning: bool) {}
    /// Current membership and node conditions, for backends that have them.
    async fn node_facts(&self) -> Result<Option<NodeFacts>, ClusterError> {
        Ok(None)
    }
    /// Capacity facts for admitting drains, for backends that know the workloads.
    async fn capacity(&self) -> Result<Option<crate::repair::capacity::Snapshot>, ClusterError> {
        Ok(None)
    }
}

/// Names of the inventory hooks in the daemon's `repair-dir`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HooksConfig {
    pub evacuate: String,
    pub evacuate_failover: String,
    pub offline: String,
    pub online: String,
    /// Fencing: release a powered-off node's workloads, and clear that after recovery.
    pub release: String,
    pub reclaim: String,
}

impl Default for HooksConfig {
    fn default() -> Self {
        HooksConfig {
            evacuate: "evacuate".into(),
            evacuate_failover: "evacuate-failover".into(),
            offline: "offline".into(),
            online: "online".into(),
            release: "release".into(),
            reclaim: "reclaim".into(),
        }
    }
}

/// What the inventory backend takes from the configuration, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    pub nodes: BTreeSet<String>,
    /// Where the hooks are (the daemon's `repair-dir`).
    pub repair_dir: PathBuf,
    pub hooks: HooksConfig,
    pub hook_timeout: Duration,
    pub hook_env: Vec<(String, String)>,
    /// Each hook job's directory goes under here.
    pub jobs_dir: PathBuf,
    /// The enabled actions, whose hooks must exist.
    pub actions: Policy,
    /// Whether fencing is configured, which needs the release and reclaim hooks.
    pub fencing: bool,
    /// Whether a node self-fences, which needs the offline and online hooks.
    pub self_fencing: bool,
}

/// The embedded default backend.
pub struct Inventory {
    store: Arc<Store>,
    nodes: BTreeSet<String>,
    repair_dir: PathBuf,
    hooks: HooksConfig,
    timeout: Duration,
    env: Vec<(String, String)>,
    runner: JobRunner,
}

impl Inventory {
    /// Builds the backend and checks that every hook an enabled action needs is whitelisted.
    pub fn new(s: InventorySettings, store: Arc<Store>) -> Result<Inventory, ClusterError> {
        let inv = Inventory {
            store,
            nodes: s.nodes,
            repair_dir: s.repair_dir,
            hooks: s.hooks,
            timeout: s.hook_timeout,
            env: s.hook_env,
            runner: JobRunner::new(s.jobs_dir).map_err(ClusterError::Jobs)?,
        };
        inv.check_hooks(&s.actions, s.fencing, s.self_fencing)?;
        Ok(inv)
    }

    fn check_hooks(
        &self,
        actions: &Policy,
        fencing: bool,
        self_fencing: bool,
    ) -> Result<(), ClusterError> {
        let mut needed = Vec::new();
        if fencing {
            needed.push(("fencing", &self.hooks.release));
            needed.push(("fencing", &self.hooks.reclaim));
        }
        if self_fencing {
            needed.push(("self-fencing", &self.hooks.offline));
            needed.push(("self-fencing", &self.hooks.online));
        }
        if actions.evacuate {
            needed.push(("evacuate", &self.hooks.evacuate));
        }
        if actions.evacuate_failover {
            needed.push(("evacuate-failover", &self.hooks.evacuate_failover));
        }
        if actions.evacuate || actions.evacuate_failover {
            needed.push(("offline", &self.hooks.offline));
            needed.push(("online", &self.hooks.online));
        }
        for (action, hook) in needed {
            exec::resolve(&self.repair_dir, hook).map_err(|source| ClusterError::Hook {
                hook: hook.clone(),
                action,
                source,
            })?;
        }
        Ok(())
    }

    fn hook(&self, kind: JobKind) -> Option<&str> {
        Some(match kind {
            JobKind::Evacuate => &self.hooks.evacuate,
            JobKind::EvacuateFailover => &self.hooks.evacuate_failover,
            JobKind::Offline => &self.hooks.offline,
            JobKind::Online => &self.hooks.online,
            JobKind::LiveRepair => return None,
        })
    }

    fn known(&self, node: &str) -> Result<(), ClusterError> {
        if self.nodes.contains(node) {
            Ok(())
        } else {
            Err(ClusterError::UnknownNode(node.into()))
        }
    }
}

#[async_trait::async_trait]
impl Cluster for Inventory {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        Ok(self.store.inventory_tags()?)
    }

    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError> {
        self.known(node)?;
        Ok(self.store.inventory_add_tag(node, tag, now_ns())?)
    }

    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError> {
        self.known(node)?;
        Ok(self.store.inventory_remove_tag(node, tag)?)
    }

    async fn run_job(&self, job: &Job, event_json: &Value) -> Outcome {
        let Some(hook) = self.hook(job.kind) else {
            return Outcome::failed(format!("{} is not an inventory job", job.kind.as_str()));
        };
        let program = match exec::resolve(&self.repair_dir, hook) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(format!("hook refused: {e}")),
        };
        let (event, id) = (job.event.to_string(), job.id.to_string());
        let call = HookCall {
            node: &job.node,
            event: &event,
            job: Some(&id),
            action: Some(job.kind.as_str()),
        };
        let stdin = serde_json::to_vec(event_json).unwrap_or_default();
        let spec = call.spec(program, stdin, &self.env, self.timeout);
        let outcome = self.runner.run(&id, &spec).await;
        if outcome.ok {
            let flag = match job.kind {
                JobKind::Offline => Some(true),
                JobKind::Online => Some(false),
                _ => None,
            };
            if let Some(offline) = flag
                && let Err(e) = self
                    .store
                    .inventory_set_offline(&job.node, offline, now_ns())
            {
                return Outcome::failed(format!("hook succeeded but recording it failed: {e}"));
            }
        }
        outcome
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self.store.inventory_offline()?)
    }

    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome {
        let key = format!("fence-{flow}-release-{attempt}");
        let o = self
            .fence_hook(&self.hooks.release, "release", node, flow, &key)
            .await;
        self.set_offline_after(o, node, true)
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        let key = format!("fence-{flow}-reclaim");
        let o = self
            .fence_hook(&self.hooks.reclaim, "reclaim", node, flow, &key)
            .await;
        self.set_offline_after(o, node, false)
    }

    /// The `offline` hook marks the node, the `online` hook clears it.
    async fn mark_unschedulable(&self, node: &str, flow: &Uuid, on: bool) -> Outcome {
        let (hook, action) = if on {
            (&self.hooks.offline, "offline")
        } else {
            (&self.hooks.online, "online")
        };
        let key = format!("fence-{flow}-{action}");
        let o = self.fence_hook(hook, action, node, flow, &key).await;
        self.set_offline_after(o, node, on)
    }
}

impl Inventory {
    /// A fenced node is offline in the inventory until its recovery clears the release.
    fn set_offline_after(&self, o: Outcome, node: &str, offline: bool) -> Outcome {
        if !o.ok {
            return o;
        }
        match self.store.inventory_set_offline(node, offline, now_ns()) {
            Ok(()) => o,
            Err(e) => Outcome::failed(format!("hook succeeded but recording it failed: {e}")),
        }
    }

    async fn fence_hook(
        &self,
        hook: &str,
        action: &str,
        node: &str,
        flow: &Uuid,
        key: &str,
    ) -> Outcome {
        let program = match exec::resolve(&self.repair_dir, hook) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(format!("hook refused: {e}")),
        };
        let flow = flow.to_string();
        let call = HookCall {
            node,
            event: &flow,
            job: None,
            action: Some(action),
        };
        let spec = call.spec(program, Vec::new(), &self.env, self.timeout);
        self.runner.run(key, &spec).await
    }
}
