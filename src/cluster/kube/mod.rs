//! The Kubernetes backend (kube-rs): nodes by label selector, maintd tags as node labels, drain
//! through the Eviction API (which honours PodDisruptionBudgets), taints for offline and for the
//! out-of-service release, and Events on the Node. One code path for a real API server and the
//! tests' fake: only the URL differs. Reads come from watch caches (`cache`); only writes and
//! the reads a write is conditional on go to the API. This module holds the client and the
//! `Cluster` trait's implementation; `config` its settings, `nodes` the writes to Nodes (tags,
//! cordon, taints), `drain` moving pods off a node, `election` the Lease and checkpoint, and
//! `snapshot` the pure translation to the capacity snapshot `repair::capacity` decides on.

pub mod cache;
mod caps;
mod config;
mod drain;
mod election;
mod events;
mod fenceconfig;
mod fences;
mod jobs;
mod leases;
pub mod medik8s;
pub mod nodefence;
mod nodes;
mod remedies;
mod snapshot;
mod tokens;

pub use config::{
    ConditionRuleConfig, KubeConfig, KubeConfigError, LeaderElectionConfig, StorageLeaseConfig,
};
pub use fenceconfig::ConfigMaps;
pub use fences::NodeFences;
#[cfg(any(test, feature = "testing"))]
pub use fences::conformance as nodefence_conformance;
pub use jobs::job_of;
pub use nodes::{OFFLINE_TAINT, OUT_OF_SERVICE, TaintEffect, label_to_tag, tag_to_label};
pub use remedies::{RemedyConfig, RemedyError, RemedyPlacement, remedy_run};
pub use snapshot::{quantity, snapshot};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;
use uuid::Uuid;

use super::{
    Backend, Capacity, Claims, ClusterError, EventReason, Events, FenceRelease, KubeletLease,
    NodeFacts, NodeWitness, Purpose, TagsAndJobs,
};

/// Where every kubelet keeps its heartbeat Lease, named after its node.
const KUBELET_LEASE_NAMESPACE: &str = "kube-node-lease";
use crate::node::NodeConfig;
use cache::Watched;
use maintd_core::repair::conditions::NodeCondition;
use maintd_core::repair::{Job, capacity};
use maintd_core::verdict::{FailureKind, Outcome};

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

pub struct KubeCluster {
    client: Client,
    cfg: KubeConfig,
    /// `label-selector`, applied to the node cache (which holds every node, for capacity).
    selector: kube::core::Selector,
    nodes: Watched<Node>,
    pods: Watched<Pod>,
    pdbs: Watched<PodDisruptionBudget>,
    /// The election's Lease and state ConfigMap, watched only with leader election on.
    lease: Option<Watched<Lease>>,
    state: Option<Watched<ConfigMap>>,
    /// The kubelets' Leases in `kube-node-lease`: a further witness of a node's life.
    kubelet_leases: Watched<Lease>,
    /// The storage Leases' namespaces, each watched (`storage-leases`).
    storage_leases: BTreeMap<String, Watched<Lease>>,
    /// Events, through kube's recorder and a budget.
    events: events::Events,
    /// NodeMaintenance objects and the per-node medik8s Leases.
    medik8s: medik8s::Medik8s,
    /// Nodes as this replica last wrote them, until the watch catches up (as client-go's
    /// mutation cache): a tag applied one tick must not read as removed by an operator the
    /// next, only because its watch event is still on the way.
    written: std::sync::Mutex<BTreeMap<String, Arc<Node>>>,
}

impl KubeCluster {
    /// From `api-url` if set, else the kubeconfig or the in-cluster service account.
    pub async fn connect(cfg: KubeConfig) -> Result<KubeCluster, ClusterError> {
        if let Some(url) = cfg.api_url.clone() {
            return KubeCluster::with_url(&url, cfg);
        }
        let config = kube::Config::infer()
            .await
            .map_err(|e| ClusterError::KubeConfig(e.to_string()))?;
        KubeCluster::from_config(config, cfg)
    }

    /// Starts the watches on the current tokio runtime; they stop when the cluster is dropped.
    fn from_config(mut config: kube::Config, cfg: KubeConfig) -> Result<KubeCluster, ClusterError> {
        // The client's own retry of 429s (up to 15 times, 5 s apart) would hide a blocking PDB
        // for minutes and overrun the drain deadline: the drain loop backs off itself.
        config.default_retry = false;
        let client =
            Client::try_from(config).map_err(|e| ClusterError::KubeConfig(e.to_string()))?;
        let selector = cache::parse_selector(&cfg.label_selector)?;
        // Lists from the apiserver's watch cache (resourceVersion 0), as informers do: the
        // first list after a break costs the apiserver no etcd read.
        let any = || watcher::Config::default().any_semantic();
        let nodes = Watched::spawn(
            "nodes",
            Api::all(client.clone()),
            any(),
            cache::trim_node(&cfg.collector_annotation),
        );
        let pods = Watched::spawn("pods", Api::all(client.clone()), any(), cache::trim_pod);
        let pdbs = Watched::spawn(
            "poddisruptionbudgets",
            Api::all(client.clone()),
            any(),
            cache::trim_meta,
        );
        let kubelet_leases = Watched::spawn_noting(
            "kubelet leases",
            Api::namespaced(client.clone(), KUBELET_LEASE_NAMESPACE),
            any(),
            cache::trim_meta,
            Some(leases::renew_marker),
        );
        let storage_leases = cfg
            .storage_leases
            .iter()
            .map(|l| l.namespace.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|ns| {
                let w = Watched::spawn_noting(
                    "storage leases",
                    Api::namespaced(client.clone(), &ns),
                    any(),
                    cache::trim_meta,
                    Some(leases::renew_marker),
                );
                (ns, w)
            })
            .collect();
        let le = &cfg.leader_election;
        let one = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (lease, state) = if le.enabled {
            let ns = le.namespace();
            (
                Some(Watched::spawn(
                    "lease",
                    Api::namespaced(client.clone(), &ns),
                    one(&le.lease_name),
                    cache::trim_meta,
                )),
                Some(Watched::spawn(
                    "state configmap",
                    Api::namespaced(client.clone(), &ns),
                    one(&le.state_configmap),
                    cache::trim_meta,
                )),
            )
        } else {
            (None, None)
        };
        Ok(KubeCluster {
            events: events::Events::new(client.clone(), &cfg.instance),
            medik8s: medik8s::Medik8s::start(client.clone()),
            client,
            cfg,
            selector,
            nodes,
            pods,
            pdbs,
            lease,
            state,
            kubelet_leases,
            storage_leases,
            written: Default::default(),
        })
    }

    /// For an explicit API URL (plain HTTP, e.g. `kubectl proxy` or a test's fake API server).
    pub fn with_url(url: &str, cfg: KubeConfig) -> Result<KubeCluster, ClusterError> {
        let uri = url
            .parse()
            .map_err(|e| ClusterError::KubeConfig(format!("bad API URL {url:?}: {e}")))?;
        KubeCluster::from_config(kube::Config::new(uri), cfg)
    }

    fn nodes_api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The managed nodes, from the node cache.
    async fn managed_nodes(&self) -> Result<Vec<Arc<Node>>, ClusterError> {
        Ok(self.managed(self.all_nodes().await?))
    }

    /// Every node by name, from the node cache with this replica's own writes over it.
    async fn all_nodes(&self) -> Result<Vec<Arc<Node>>, ClusterError> {
        Ok(self.with_writes(self.nodes.objects().await?))
    }

    fn managed(&self, nodes: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        nodes
            .into_iter()
            .filter(|n| cache::selects(&self.selector, n.metadata.labels.as_ref()))
            .collect()
    }

    /// Managed nodes and their collector addresses (InternalIP:1815 unless annotated).
    pub async fn nodes(&self) -> Result<Vec<(String, String)>, ClusterError> {
        Ok(self
            .managed_nodes()
            .await?
            .iter()
            .filter_map(|n| self.member(n))
            .map(|m| (m.name, m.collector))
            .collect())
    }

    fn member(&self, n: &Node) -> Option<NodeConfig> {
        let name = n.metadata.name.clone()?;
        let annotated = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&self.cfg.collector_annotation).cloned());
        let ip = n.status.as_ref().and_then(|s| {
            s.addresses
                .iter()
                .flatten()
                .find(|a| a.type_ == "InternalIP")
                .map(|a| format!("{}:{}", a.address, crate::node::COLLECTOR_PORT))
        });
        let collector = annotated.or(ip)?;
        // An annotation is operator input: a bad one leaves the node unmanaged, said loudly,
        // rather than polled at an empty address.
        if let Err(e) = crate::node::collector_address(&collector) {
            tracing::warn!(node = %name, error = %e, "node skipped: bad collector address");
            return None;
        }
        Some(NodeConfig { name, collector })
    }
}

fn outcome(what: String, r: Result<(), ClusterError>) -> Outcome {
    match r {
        Ok(()) => Outcome::done(what),
        Err(e) => Outcome::failed_as(FailureKind::Backend, format!("{what}: {e}")),
    }
}

#[async_trait::async_trait]
impl TagsAndJobs for KubeCluster {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        let mut out = BTreeMap::new();
        for n in self.managed_nodes().await? {
            let Some(name) = n.metadata.name.clone() else {
                continue;
            };
            let tags: BTreeSet<String> = n
                .metadata
                .labels
                .iter()
                .flatten()
                .filter_map(|(k, _)| label_to_tag(k))
                .collect();
            out.insert(name, tags);
        }
        Ok(out)
    }

    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError> {
        let key = tag_to_label(tag).ok_or_else(|| ClusterError::TagNotLabel(tag.to_string()))?;
        self.strategic_patch(node, json!({"metadata": {"labels": {key: "true"}}}))
            .await
    }

    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError> {
        let Some(key) = tag_to_label(tag) else {
            return Ok(false);
        };
        let n = self.nodes_api().get(node).await?;
        if !n
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(&key))
        {
            return Ok(false);
        }
        // null deletes the key.
        self.strategic_patch(node, json!({"metadata": {"labels": {key: null}}}))
            .await?;
        Ok(true)
    }

    async fn run_job(&self, job: &Job, event: &str) -> Outcome {
        let o = self.run_claimed(job, event).await;
        self.record(
            &job.node,
            EventReason::Job(job.kind),
            &format!("{} ({}): {}", job.reason, job.kind.as_str(), o.detail()),
            !o.ok(),
        )
        .await;
        o
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self
            .managed_nodes()
            .await?
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == OFFLINE_TAINT))
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect())
    }
}

#[async_trait::async_trait]
impl FenceRelease for KubeCluster {
    async fn release(&self, node: &str, flow: &Uuid, _attempt: u32) -> Outcome {
        // Only called after a verified power-off: the taint alone leaves StatefulSet pods to the
        // pod GC (19 s on a real 1.36 controller-manager), so the pods are force-deleted too.
        let r = async {
            self.set_taint(
                node,
                OUT_OF_SERVICE,
                Some("nodeshutdown"),
                TaintEffect::NoExecute,
                true,
            )
            .await?;
            let pods = self.pods_after_taint(node).await?;
            self.force_delete_pods(&pods).await
        }
        .await;
        let o = match r {
            Ok(n) => Outcome::done(format!(
                "{OUT_OF_SERVICE} taint set; {n} pods force-deleted"
            )),
            Err(e) => Outcome::failed_as(FailureKind::Backend, format!("release of {node}: {e}")),
        };
        self.record(
            node,
            EventReason::FenceRelease,
            &format!("{}: {}", maintd_core::tags::reference(flow), o.detail()),
            !o.ok(),
        )
        .await;
        o
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        let r = self
            .set_taint(node, OUT_OF_SERVICE, None, TaintEffect::NoExecute, false)
            .await;
        let o = outcome(format!("{OUT_OF_SERVICE} taint removed from {node}"), r);
        self.record(
            node,
            EventReason::FenceRecovered,
            &format!("{}: {}", maintd_core::tags::reference(flow), o.detail()),
            !o.ok(),
        )
        .await;
        o
    }

    /// Cordon plus maintd's NoSchedule taint, as for an offline job.
    async fn mark_unschedulable(&self, node: &str, _flow: &Uuid, on: bool) -> Outcome {
        let what = if on {
            format!("{node} cordoned and tainted {OFFLINE_TAINT} (self-fencing)")
        } else {
            format!("{node} uncordoned, {OFFLINE_TAINT} removed")
        };
        outcome(what, self.offline(node, on).await)
    }
}

#[async_trait::async_trait]
impl Events for KubeCluster {
    async fn record(&self, node: &str, reason: EventReason, message: &str, warning: bool) {
        // `kubectl describe node` lists only Events whose object reference carries the Node's
        // uid.
        let uid = match self.nodes.get(node).await {
            // The uid never changes: no need for this replica's own writes.
            Ok(Some(n)) => n.metadata.uid.clone(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(node, %reason, error = %e, "cannot read the Node for its Event");
                None
            }
        };
        // Nodes have no namespace: their Events go to `events-namespace` (default).
        let ns = &self.cfg.events_namespace;
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid,
            namespace: (ns != "default").then(|| ns.clone()),
            ..Default::default()
        };
        self.events.publish(&object, reason, message, warning).await;
    }

    async fn record_config(&self, configmap: &str, reason: EventReason, message: &str) {
        self.record_on_configmap(configmap, reason, message).await;
    }
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
