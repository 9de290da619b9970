//! The Kubernetes backend (kube-rs): nodes by label selector, maintd tags as node labels, drain
//! through the Eviction API (which honours PodDisruptionBudgets), taints for offline and for the
//! out-of-service release, and Events on the Node. One code path for a real API server and the
//! tests' fake: only the URL differs. Reads come from watch caches (`cache`); only writes and
//! the reads a write is conditional on go to the API.

pub mod cache;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Cluster, ClusterError, Coordination, LeaseRecord, NodeFacts};
use crate::config::NodeConfig;
use crate::core::conditions::{NodeCondition, Rule};
use crate::core::{Job, JobKind, Outcome, capacity};
use cache::Watched;

/// The taint that tells Kubernetes a node is shut down for good: the attach-detach controller
/// detaches its volumes and the pod GC deletes its pods (GA in 1.28).
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
pub const OFFLINE_TAINT: &str = "maintd.io/offline";
/// Labels are `<kind>.maintd.io/<id>`: `maintd:repairready:<id>` is `repairready.maintd.io/<id>`.
const LABEL_SUFFIX: &str = ".maintd.io";
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const CONFLICT_RETRIES: usize = 5;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct KubeConfig {
    /// API server URL, e.g. `http://127.0.0.1:8001` behind `kubectl proxy`. Unset: the
    /// kubeconfig, or the in-cluster service account.
    pub api_url: Option<String>,
    /// Which Nodes maintd manages (a label selector; empty = all).
    pub label_selector: String,
    /// Annotation that overrides a node's collector address (default: InternalIP:1815).
    pub collector_annotation: String,
    /// An evacuation that cannot evict every pod by then fails, naming the blocking pods.
    #[serde(with = "humantime_serde")]
    pub drain_deadline: Duration,
    /// First backoff after a 429 from the Eviction API (doubles up to 5 s).
    #[serde(with = "humantime_serde")]
    pub eviction_backoff: Duration,
    /// Namespace for the Events maintd records on Nodes.
    pub events_namespace: String,
    /// How often the node list is read: membership, conditions and the fencing source.
    #[serde(with = "humantime_serde")]
    pub node_interval: Duration,
    /// At most this many nodes drain in one round (capacity and PDBs may allow fewer).
    pub max_disruptions: usize,
    /// Node-condition rules, checked in order.
    pub conditions: Vec<ConditionRuleConfig>,
    pub leader_election: LeaderElectionConfig,
}

/// `(type, status) for <duration> -> actions`, escalating one step per `escalate-after`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConditionRuleConfig {
    #[serde(rename = "type")]
    pub condition: String,
    pub status: String,
    #[serde(rename = "for", with = "humantime_serde", default)]
    pub after: Duration,
    pub actions: Vec<String>,
    #[serde(with = "humantime_serde", default)]
    pub escalate_after: Option<Duration>,
}

impl ConditionRuleConfig {
    pub fn rule(&self) -> Result<Rule, String> {
        Rule::new(
            &self.condition,
            &self.status,
            self.after.as_nanos() as i64,
            &self.actions,
            self.escalate_after.map(|d| d.as_nanos() as i64),
        )
    }
}

/// A `coordination.k8s.io/v1` Lease elects the one replica that acts; the state it acts on is
/// checkpointed to a ConfigMap, so a successor resumes it. Defaults are client-go's.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LeaderElectionConfig {
    pub enabled: bool,
    /// Namespace of the Lease and the state ConfigMap (default: `$POD_NAMESPACE`, else
    /// `default`).
    pub namespace: Option<String>,
    pub lease_name: String,
    pub state_configmap: String,
    /// This replica's name in the Lease (default: `$POD_NAME`, else the host name).
    pub identity: Option<String>,
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops acting (exits) before its lease expires.
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: true,
            namespace: None,
            lease_name: "maintd".into(),
            state_configmap: "maintd-state".into(),
            identity: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaderElectionConfig {
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".into())
    }

    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
            .or_else(|| {
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
            })
            .unwrap_or_else(|| "maintd".into())
    }
}

impl KubeConfig {
    /// Checks what serde cannot: rules, and timings that only work in one order.
    pub fn validate(&self) -> Result<(), String> {
        for r in &self.conditions {
            r.rule()?;
        }
        cache::parse_selector(&self.label_selector)
            .map_err(|e| format!("kubernetes.label-selector: {e}"))?;
        if self.node_interval.is_zero() {
            return Err("kubernetes.node-interval must be greater than zero".into());
        }
        if self.max_disruptions == 0 {
            return Err("kubernetes.max-disruptions must be at least 1".into());
        }
        if !matches!(self.events_namespace.as_str(), "default" | "kube-system") {
            return Err(format!(
                "kubernetes.events-namespace {:?}: Events about Nodes (cluster-scoped objects) are accepted only in \"default\" (or \"kube-system\"); the apiserver refuses any other namespace with 422",
                self.events_namespace
            ));
        }
        let l = &self.leader_election;
        if l.enabled && !(l.retry_period < l.renew_deadline && l.renew_deadline < l.lease_duration)
        {
            return Err(
                "kubernetes.leader-election needs retry-period < renew-deadline < lease-duration"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            api_url: None,
            label_selector: String::new(),
            collector_annotation: "maintd.io/collector".into(),
            drain_deadline: Duration::from_secs(600),
            eviction_backoff: Duration::from_millis(500),
            events_namespace: "default".into(),
            node_interval: Duration::from_secs(2),
            max_disruptions: 1,
            conditions: vec![],
            leader_election: LeaderElectionConfig::default(),
        }
    }
}

/// Maps a maintd tag to a node label key, and back.
pub fn tag_to_label(tag: &str) -> Option<String> {
    let rest = tag.strip_prefix("maintd:")?;
    let (kind, id) = rest.split_once(':')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    (ok(kind) && ok(id)).then(|| format!("{kind}{LABEL_SUFFIX}/{id}"))
}

pub fn label_to_tag(key: &str) -> Option<String> {
    let (prefix, id) = key.split_once('/')?;
    let kind = prefix.strip_suffix(LABEL_SUFFIX)?;
    Some(format!("maintd:{kind}:{id}"))
}

fn evictable(pod: &Pod) -> bool {
    let daemonset = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !daemonset && !mirror && !finished
}

/// How long a release waits for the taint-eviction controller to mark the pods terminating.
const RELEASE_SETTLE: Duration = Duration::from_secs(1);

/// Delete options that apply only to this very pod (its UID), with an optional grace period.
fn uid_delete(p: &Pod, grace: Option<u32>) -> DeleteParams {
    let mut dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Some(g) = grace {
        dp = dp.grace_period(g);
    }
    dp
}

/// An Eviction of this very pod (its UID). Built from k8s-openapi's type rather than kube's
/// `evict`, whose body spells the field `delete_options`: the apiserver expects
/// `deleteOptions` and silently drops the unknown key, preconditions with it.
fn uid_eviction(p: &Pod) -> k8s_openapi::api::policy::v1::Eviction {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
    k8s_openapi::api::policy::v1::Eviction {
        metadata: ObjectMeta {
            name: p.metadata.name.clone(),
            namespace: p.metadata.namespace.clone(),
            ..Default::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: p.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        }),
    }
}

fn pod_name(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or("?")
    )
}

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
        let selector =
            cache::parse_selector(&cfg.label_selector).map_err(ClusterError::KubeConfig)?;
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
            client,
            cfg,
            selector,
            nodes,
            pods,
            pdbs,
            lease,
            state,
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

    fn with_writes(&self, nodes: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .into_iter()
            .map(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                match written.get(name) {
                    Some(mine) if newer(mine, &n) => mine.clone(),
                    Some(_) => {
                        // The watch has caught up (or moved past it).
                        written.remove(name);
                        n
                    }
                    None => n,
                }
            })
            .collect()
    }

    fn wrote(&self, mut n: Node) {
        cache::trim_node(&self.cfg.collector_annotation)(&mut n);
        if let Some(name) = n.metadata.name.clone() {
            self.written
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, Arc::new(n));
        }
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
                .map(|a| format!("{}:{}", a.address, crate::config::COLLECTOR_PORT))
        });
        let collector = annotated.or(ip)?;
        // An annotation is operator input: a bad one leaves the node unmanaged, said loudly,
        // rather than polled at an empty address.
        if let Err(e) = crate::config::collector_address(&collector) {
            tracing::warn!(node = %name, error = %e, "node skipped: bad collector address");
            return None;
        }
        Some(NodeConfig { name, collector })
    }

    /// The Lease and the state ConfigMap live in the leader-election namespace.
    fn election_api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.cfg.leader_election.namespace())
    }

    async fn merge_patch(&self, node: &str, patch: Value) -> Result<(), ClusterError> {
        let n = self
            .nodes_api()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.wrote(n);
        Ok(())
    }

    /// A strategic-merge patch, as kubectl sends for cordon and labels: maps merge, and a
    /// null deletes a key, without reading the node first.
    async fn strategic_patch(&self, node: &str, patch: Value) -> Result<(), ClusterError> {
        let n = self
            .nodes_api()
            .patch(node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        self.wrote(n);
        Ok(())
    }

    async fn cordon(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        self.strategic_patch(node, json!({"spec": {"unschedulable": on}}))
            .await
    }

    /// Adds or removes a taint. A merge patch replaces the whole list, so it carries the
    /// resourceVersion it was computed from, and a 409 (someone changed the node) is retried.
    async fn set_taint(
        &self,
        node: &str,
        key: &str,
        value: Option<&str>,
        effect: &str,
        present: bool,
    ) -> Result<(), ClusterError> {
        for attempt in 0.. {
            let n = self.nodes_api().get(node).await?;
            let mut taints: Vec<Value> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .filter(|t| !(t.key == key && t.effect == effect))
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect();
            if present {
                let mut t = json!({"key": key, "effect": effect});
                if let Some(v) = value {
                    t["value"] = json!(v);
                }
                taints.push(t);
            }
            let patch = json!({
                "metadata": {"resourceVersion": n.metadata.resource_version},
                "spec": {"taints": taints},
            });
            match self.merge_patch(node, patch).await {
                Err(ClusterError::Kube(e))
                    if api_code(&e) == Some(409) && attempt < CONFLICT_RETRIES =>
                {
                    continue;
                }
                other => return other,
            }
        }
        unreachable!("the loop returns")
    }

    /// The node's pods that a drain or release moves, from the pod cache (as last seen: the
    /// job's own requests go to the API and fail there while it is away).
    async fn pods_on(&self, node: &str) -> Result<Vec<Arc<Pod>>, ClusterError> {
        Ok(self
            .pods
            .last_known()
            .await?
            .into_iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .is_some_and(|s| s.node_name.as_deref() == Some(node))
                    && evictable(p)
            })
            .collect())
    }

    /// Cordons, then evicts (honouring PDBs, retrying 429s with backoff) or deletes every pod but
    /// DaemonSet and mirror pods, until none is left or the drain deadline passes. A pod already
    /// terminating is waited for, not evicted again; every request names the pod's UID, so a
    /// replacement that took the same name is never touched.
    pub async fn drain(&self, node: &str, respect_pdbs: bool) -> Outcome {
        if let Err(e) = self.cordon(node, true).await {
            return Outcome::failed(format!("cordon {node}: {e}"));
        }
        let deadline = tokio::time::Instant::now() + self.cfg.drain_deadline;
        let mut backoff = self.cfg.eviction_backoff;
        let mut evicted = std::collections::BTreeSet::new();
        loop {
            let pods = match self.pods_on(node).await {
                Ok(p) => p,
                Err(e) => return Outcome::failed(format!("list pods on {node}: {e}")),
            };
            if pods.is_empty() {
                return Outcome {
                    ok: true,
                    detail: format!("{node} drained ({} pods)", evicted.len()),
                };
            }
            let mut blocked = Vec::new();
            for p in pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
                    continue;
                };
                let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let r = if respect_pdbs {
                    api.create_subresource::<_, serde_json::Value>(
                        "eviction",
                        name,
                        &PostParams::default(),
                        &uid_eviction(p),
                    )
                    .await
                    .map(|_| ())
                } else {
                    api.delete(name, &uid_delete(p, None)).await.map(|_| ())
                };
                match r {
                    Ok(()) => {
                        evicted.insert(pod_name(p));
                    }
                    // Gone, or replaced by a new pod of that name: nothing of ours is left.
                    Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                    // 429: a PodDisruptionBudget allows no disruption right now.
                    Err(e) if api_code(&e) == Some(429) => blocked.push(pod_name(p)),
                    Err(e) => blocked.push(format!("{} ({e})", pod_name(p))),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                let still = if blocked.is_empty() {
                    pods.iter().map(|p| pod_name(p)).collect()
                } else {
                    blocked
                };
                return Outcome::failed(format!(
                    "drain of {node} missed its {:?} deadline; blocking pods: {}; the node stays cordoned (as kubectl drain leaves it): `kubectl uncordon {node}` once it may take work again",
                    self.cfg.drain_deadline,
                    still.join(", ")
                ));
            }
            tokio::time::sleep(backoff.min(deadline - tokio::time::Instant::now())).await;
            if !blocked.is_empty() {
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }

    /// Force-deletes the node's pods (grace 0), so their controllers recreate them at once. Each
    /// delete names the pod's UID: a replacement that took the name is never deleted.
    async fn force_delete_pods(&self, pods: &[Arc<Pod>]) -> Result<usize, ClusterError> {
        let mut n = 0;
        for p in pods {
            let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match api.delete(name, &uid_delete(p, Some(0))).await {
                Ok(_) => n += 1,
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    }

    /// After the out-of-service taint, the taint-eviction controller deletes the node's pods
    /// itself (gracefully, which a dead kubelet never completes). Waiting until it has marked
    /// them, briefly, lets its delete land first: our force delete then finishes the same pod,
    /// and the controller never retries a delete by name that could hit the replacement.
    async fn pods_after_taint(&self, node: &str) -> Result<Vec<Arc<Pod>>, ClusterError> {
        let until = tokio::time::Instant::now() + RELEASE_SETTLE;
        loop {
            let pods = self.pods_on(node).await?;
            let settled = pods.iter().all(|p| p.metadata.deletion_timestamp.is_some());
            if settled || tokio::time::Instant::now() >= until {
                return Ok(pods);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn offline(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        self.cordon(node, on).await?;
        self.set_taint(node, OFFLINE_TAINT, None, "NoSchedule", on)
            .await
    }
}

fn outcome(what: String, r: Result<(), ClusterError>) -> Outcome {
    match r {
        Ok(()) => Outcome {
            ok: true,
            detail: what,
        },
        Err(e) => Outcome::failed(format!("{what}: {e}")),
    }
}

#[async_trait::async_trait]
impl Cluster for KubeCluster {
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
        let key = tag_to_label(tag)
            .ok_or_else(|| ClusterError::KubeConfig(format!("tag {tag:?} cannot be a label")))?;
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

    async fn run_job(&self, job: &Job, _event: &Value) -> Outcome {
        let node = &job.node;
        let o = match job.kind {
            JobKind::Evacuate => self.drain(node, true).await,
            JobKind::EvacuateFailover => self.drain(node, false).await,
            JobKind::Offline => outcome(
                format!("{node} cordoned and tainted {OFFLINE_TAINT}"),
                self.offline(node, true).await,
            ),
            JobKind::Online => outcome(
                format!("{node} uncordoned"),
                self.offline(node, false).await,
            ),
            JobKind::LiveRepair => Outcome::failed("live repairs run on the collector"),
        };
        let reason = format!("Maintd{}", job.kind.as_str().replace('-', ""));
        self.record(
            node,
            &reason,
            &format!("{} ({}): {}", job.reason, job.kind.as_str(), o.detail),
            !o.ok,
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

    async fn release(&self, node: &str, flow: &Uuid, _attempt: u32) -> Outcome {
        // Only called after a verified power-off: the taint alone leaves StatefulSet pods to the
        // pod GC (19 s on a real 1.36 controller-manager), so the pods are force-deleted too.
        let r = async {
            self.set_taint(
                node,
                OUT_OF_SERVICE,
                Some("nodeshutdown"),
                "NoExecute",
                true,
            )
            .await?;
            let pods = self.pods_after_taint(node).await?;
            self.force_delete_pods(&pods).await
        }
        .await;
        let o = match r {
            Ok(n) => Outcome {
                ok: true,
                detail: format!("{OUT_OF_SERVICE} taint set; {n} pods force-deleted"),
            },
            Err(e) => Outcome::failed(format!("release of {node}: {e}")),
        };
        self.record(
            node,
            "MaintdFenceRelease",
            &format!("maintd:{flow}: {}", o.detail),
            !o.ok,
        )
        .await;
        o
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        let r = self
            .set_taint(node, OUT_OF_SERVICE, None, "NoExecute", false)
            .await;
        let o = outcome(format!("{OUT_OF_SERVICE} taint removed from {node}"), r);
        self.record(
            node,
            "MaintdFenceRecovered",
            &format!("maintd:{flow}: {}", o.detail),
            !o.ok,
        )
        .await;
        o
    }

    async fn node_facts(&self) -> Result<Option<NodeFacts>, ClusterError> {
        // Conditions can start a fence: never from a cache whose watch is broken.
        let nodes = self.managed_nodes().await?;
        let mut facts = NodeFacts::default();
        for n in &nodes {
            let Some(m) = self.member(n) else { continue };
            let conditions = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .map(|c| NodeCondition {
                    kind: c.type_.clone(),
                    status: c.status.clone(),
                    since: c
                        .last_transition_time
                        .as_ref()
                        .map(|t| t.0.as_nanosecond() as i64)
                        .unwrap_or(0),
                })
                .collect();
            facts.conditions.insert(m.name.clone(), conditions);
            facts.members.push(m);
        }
        Ok(Some(facts))
    }

    async fn capacity(&self) -> Result<Option<capacity::Snapshot>, ClusterError> {
        // Every node counts as room for the pods, managed or not.
        let nodes = self.all_nodes().await?;
        let pods = self.pods.objects().await?;
        let pdbs = self.pdbs.objects().await?;
        Ok(Some(snapshot(&nodes, &pods, &pdbs)))
    }

    async fn record(&self, node: &str, reason: &str, message: &str, warning: bool) {
        let now = chrono_now();
        // `kubectl describe node` lists only Events whose involvedObject carries the Node's uid.
        let uid = match self.nodes.get(node).await {
            // The uid never changes: no need for this replica's own writes.
            Ok(Some(n)) => n.metadata.uid.clone(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(node, reason, error = %e, "cannot read the Node for its Event");
                None
            }
        };
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{node}.maintd.")),
                namespace: Some(self.cfg.events_namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                uid,
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.chars().take(1024).collect()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            reporting_component: Some("maintd".into()),
            reporting_instance: Some(
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_default(),
            ),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            action: Some(reason.into()),
            count: Some(1),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.cfg.events_namespace);
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::warn!(node, reason, error = %e, "cannot record a Kubernetes Event");
        }
    }
}

#[async_trait::async_trait]
impl Coordination for KubeCluster {
    async fn get_lease(&self, fresh: bool) -> Result<Option<LeaseRecord>, ClusterError> {
        let l = match (&self.lease, fresh) {
            (Some(w), false) => w.only().await?.map(|l| (*l).clone()),
            _ => {
                self.election_api::<Lease>()
                    .get_opt(&self.cfg.leader_election.lease_name)
                    .await?
            }
        };
        Ok(l.map(lease_record))
    }

    async fn write_lease(&self, lease: &LeaseRecord) -> Result<Option<LeaseRecord>, ClusterError> {
        let now = MicroTime(chrono_now());
        let name = &self.cfg.leader_election.lease_name;
        let l = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: lease.version.clone(),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: lease.holder.clone(),
                lease_duration_seconds: Some(lease.duration_s),
                lease_transitions: Some(lease.transitions),
                renew_time: Some(now.clone()),
                // Set when the lease changes hands, kept on every renewal (as client-go does).
                acquire_time: Some(lease.acquired.clone().unwrap_or(now)),
                ..Default::default()
            }),
        };
        let r = match &lease.version {
            None => {
                self.election_api::<Lease>()
                    .create(&PostParams::default(), &l)
                    .await
            }
            Some(_) => {
                self.election_api::<Lease>()
                    .replace(name, &PostParams::default(), &l)
                    .await
            }
        };
        match r {
            Ok(l) => Ok(Some(lease_record(l))),
            // 409: someone else wrote it first (a replace over a newer version, or a create).
            Err(e) if api_code(&e) == Some(409) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn get_state(&self, fresh: bool) -> Result<Option<(String, String)>, ClusterError> {
        let name = &self.cfg.leader_election.state_configmap;
        let cm = match (&self.state, fresh) {
            (Some(w), false) => w.only().await?.map(|c| (*c).clone()),
            _ => self.election_api::<ConfigMap>().get_opt(name).await?,
        };
        let Some(cm) = cm else {
            return Ok(None);
        };
        let data = cm
            .data
            .and_then(|mut d| d.remove(STATE_KEY))
            .unwrap_or_default();
        Ok(Some((
            cm.metadata.resource_version.unwrap_or_default(),
            data,
        )))
    }

    async fn put_state(
        &self,
        version: Option<&str>,
        data: &str,
    ) -> Result<Option<String>, ClusterError> {
        let name = &self.cfg.leader_election.state_configmap;
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: version.map(str::to_string),
                // Who wrote it, for operators reading the object.
                annotations: Some(BTreeMap::from([(
                    "maintd.io/leader".to_string(),
                    self.cfg.leader_election.identity(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(STATE_KEY.to_string(), data.to_string())])),
            ..Default::default()
        };
        let r = match version {
            None => {
                self.election_api::<ConfigMap>()
                    .create(&PostParams::default(), &cm)
                    .await
            }
            Some(_) => {
                self.election_api::<ConfigMap>()
                    .replace(name, &PostParams::default(), &cm)
                    .await
            }
        };
        match r {
            Ok(cm) => Ok(Some(cm.metadata.resource_version.unwrap_or_default())),
            Err(e) if api_code(&e) == Some(409) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

const STATE_KEY: &str = "state.json";

/// Whether `a` is a later version of the same object than `b`. resourceVersions are opaque to
/// clients but are etcd revisions in practice; client-go's mutation cache compares them the same
/// way, and anything unparsable trusts the watch.
fn newer(a: &Node, b: &Node) -> bool {
    let rv = |n: &Node| {
        n.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(x), Some(y)) if x > y)
}

fn lease_record(l: Lease) -> LeaseRecord {
    let spec = l.spec.unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        renew_marker: spec.renew_time.map(|t| t.0.to_string()),
        duration_s: spec.lease_duration_seconds.unwrap_or(0),
        transitions: spec.lease_transitions.unwrap_or(0),
        version: l.metadata.resource_version,
        acquired: spec.acquire_time,
    }
}

/// CPU in millicores or memory in bytes from a Kubernetes quantity ("500m", "2", "1Gi", "1e9").
pub fn quantity(q: &str, milli: bool) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    let v = n * scale * if milli { 1000.0 } else { 1.0 };
    Some(v.ceil() as i64)
}

fn requests(pod: &Pod) -> (i64, i64) {
    let Some(spec) = &pod.spec else {
        return (0, 0);
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |k: &str, milli: bool| {
            r.and_then(|r| r.get(k))
                .and_then(|q| quantity(&q.0, milli))
                .unwrap_or(0)
        };
        (get("cpu", true), get("memory", false))
    };
    let (mut cpu, mut mem) = spec
        .containers
        .iter()
        .map(of)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // Init containers run one at a time before the others: the pod needs the largest of them.
    for c in spec.init_containers.iter().flatten() {
        let (c2, m2) = of(c);
        cpu = cpu.max(c2);
        mem = mem.max(m2);
    }
    (cpu, mem)
}

fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let vals = e.values.clone().unwrap_or_default();
        let got = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => got.is_some_and(|v| vals.contains(v)),
            "NotIn" => got.is_none_or(|v| !vals.contains(v)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The capacity picture for `capacity::admit`, from one list of nodes, pods and PDBs.
pub fn snapshot<N, P, B>(nodes: &[N], pods: &[P], pdbs: &[B]) -> capacity::Snapshot
where
    N: std::borrow::Borrow<Node>,
    P: std::borrow::Borrow<Pod>,
    B: std::borrow::Borrow<PodDisruptionBudget>,
{
    let mut s = capacity::Snapshot::default();
    for n in nodes.iter().map(|n| n.borrow()) {
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let status = n.status.as_ref();
        let alloc = |k: &str, milli: bool| {
            status
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(k))
                .and_then(|q| quantity(&q.0, milli))
                .unwrap_or(0)
        };
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let spec = n.spec.as_ref();
        s.nodes.push(capacity::NodeCap {
            name,
            cpu_milli: alloc("cpu", true),
            mem_bytes: alloc("memory", false),
            labels: n.metadata.labels.clone().unwrap_or_default(),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| capacity::Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone(),
                })
                .collect(),
            schedulable: ready && !spec.and_then(|s| s.unschedulable).unwrap_or(false),
        });
    }
    for b in pdbs.iter().map(|b| b.borrow()) {
        s.pdbs.push(capacity::Pdb {
            name: format!(
                "{}/{}",
                b.metadata.namespace.as_deref().unwrap_or("default"),
                b.metadata.name.as_deref().unwrap_or("?")
            ),
            disruptions_allowed: b
                .status
                .as_ref()
                .map(|s| s.disruptions_allowed as i64)
                .unwrap_or(0),
        });
    }
    for p in pods.iter().map(|p| p.borrow()) {
        let Some(spec) = &p.spec else { continue };
        let Some(node) = spec.node_name.clone() else {
            continue;
        };
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let (cpu, mem) = requests(p);
        s.pods.push(capacity::PodReq {
            name: pod_name(p),
            node,
            cpu_milli: cpu,
            mem_bytes: mem,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec
                .tolerations
                .iter()
                .flatten()
                .map(|t| capacity::Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    exists: t.operator.as_deref() == Some("Exists"),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone().unwrap_or_default(),
                })
                .collect(),
            pdbs: pdbs
                .iter()
                .map(|b| b.borrow())
                .enumerate()
                .filter(|(_, b)| {
                    b.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && b.spec
                            .as_ref()
                            .and_then(|s| s.selector.as_ref())
                            .is_some_and(|sel| selects(sel, &labels))
                })
                .map(|(i, _)| i)
                .collect(),
            movable: evictable(p),
        });
    }
    s
}

fn chrono_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_map_to_labels_and_back() {
        let id = "228581bc-40fb-5fec-bf81-fd1b634f2b2e";
        let tag = format!("maintd:repairready:{id}");
        let label = tag_to_label(&tag).unwrap();
        assert_eq!(label, format!("repairready.maintd.io/{id}"));
        assert_eq!(label_to_tag(&label).unwrap(), tag);
        assert_eq!(label_to_tag("kubernetes.io/hostname"), None);
        assert_eq!(tag_to_label("other:x"), None);
        assert_eq!(tag_to_label("maintd:repairready:a b"), None);
    }

    #[test]
    fn quantities_parse_as_the_api_writes_them() {
        assert_eq!(quantity("500m", true), Some(500));
        assert_eq!(quantity("2", true), Some(2000));
        assert_eq!(quantity("0.25", true), Some(250));
        assert_eq!(quantity("1Gi", false), Some(1 << 30));
        assert_eq!(quantity("128974848", false), Some(128_974_848));
        assert_eq!(quantity("129e6", false), Some(129_000_000));
        assert_eq!(quantity("123Mi", false), Some(123 << 20));
        assert_eq!(quantity("1k", false), Some(1000));
        assert_eq!(quantity("1Qi", false), None);
        assert_eq!(quantity("", false), None);
    }

    #[test]
    fn pdb_selectors_match_labels_and_expressions() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "db"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(&sel, &l(&[("app", "db"), ("tier", "a")])));
        assert!(!selects(&sel, &l(&[("app", "db"), ("tier", "c")])));
        assert!(!selects(
            &sel,
            &l(&[("app", "db"), ("tier", "a"), ("canary", "1")])
        ));
        assert!(!selects(&sel, &l(&[("tier", "a")])));
        // An empty selector selects every pod of the namespace (policy/v1).
        assert!(selects(&LabelSelector::default(), &l(&[])));
    }
}
