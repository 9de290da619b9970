//! The Kubernetes backend (kube-rs): nodes by label selector, maintd tags as node labels, drain
//! through the Eviction API (which honours PodDisruptionBudgets), taints for offline and for the
//! out-of-service release, and Events on the Node. One code path for a real API server and the
//! tests' fake: only the URL differs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Cluster, ClusterError};
use crate::core::{Job, JobKind, Outcome};

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

    fn from_config(mut config: kube::Config, cfg: KubeConfig) -> Result<KubeCluster, ClusterError> {
        // The client's own retry of 429s (up to 15 times, 5 s apart) would hide a blocking PDB
        // for minutes and overrun the drain deadline: the drain loop backs off itself.
        config.default_retry = false;
        let client =
            Client::try_from(config).map_err(|e| ClusterError::KubeConfig(e.to_string()))?;
        Ok(KubeCluster { client, cfg })
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

    async fn list_nodes(&self) -> Result<Vec<Node>, ClusterError> {
        let mut lp = ListParams::default();
        if !self.cfg.label_selector.is_empty() {
            lp = lp.labels(&self.cfg.label_selector);
        }
        Ok(self.nodes_api().list(&lp).await?.items)
    }

    /// Managed nodes and their collector addresses (InternalIP:1815 unless annotated).
    pub async fn nodes(&self) -> Result<Vec<(String, String)>, ClusterError> {
        Ok(self
            .list_nodes()
            .await?
            .into_iter()
            .filter_map(|n| {
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
                Some((name, annotated.or(ip)?))
            })
            .collect())
    }

    async fn merge_patch(&self, node: &str, patch: Value) -> Result<(), ClusterError> {
        self.nodes_api()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn cordon(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        self.merge_patch(node, json!({"spec": {"unschedulable": on}}))
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

    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        Ok(pods
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(evictable)
            .collect())
    }

    /// Cordons, then evicts (honouring PDBs, retrying 429s with backoff) or deletes every pod but
    /// DaemonSet and mirror pods, until none is left or the drain deadline passes.
    pub async fn drain(&self, node: &str, respect_pdbs: bool) -> Outcome {
        if let Err(e) = self.cordon(node, true).await {
            return Outcome::failed(format!("cordon {node}: {e}"));
        }
        let deadline = tokio::time::Instant::now() + self.cfg.drain_deadline;
        let mut backoff = self.cfg.eviction_backoff;
        let mut evicted = 0usize;
        loop {
            let pods = match self.pods_on(node).await {
                Ok(p) => p,
                Err(e) => return Outcome::failed(format!("list pods on {node}: {e}")),
            };
            if pods.is_empty() {
                return Outcome {
                    ok: true,
                    detail: format!("{node} drained ({evicted} pods)"),
                };
            }
            let mut blocked = Vec::new();
            for p in &pods {
                let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
                    continue;
                };
                let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let r = if respect_pdbs {
                    api.evict(name, &EvictParams::default()).await.map(|_| ())
                } else {
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                };
                match r {
                    Ok(()) => evicted += 1,
                    Err(e) if api_code(&e) == Some(404) => {}
                    // 429: a PodDisruptionBudget allows no disruption right now.
                    Err(e) if api_code(&e) == Some(429) => blocked.push(pod_name(p)),
                    Err(e) => blocked.push(format!("{} ({e})", pod_name(p))),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                let still = if blocked.is_empty() {
                    pods.iter().map(pod_name).collect()
                } else {
                    blocked
                };
                return Outcome::failed(format!(
                    "drain of {node} missed its {:?} deadline; blocking pods: {}",
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

    /// Force-deletes the node's pods (grace 0), so their controllers recreate them at once.
    async fn force_delete_pods(&self, node: &str) -> Result<usize, ClusterError> {
        let mut n = 0;
        for p in self.pods_on(node).await? {
            let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            match api
                .delete(name, &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => n += 1,
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
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
        for n in self.list_nodes().await? {
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
        self.merge_patch(node, json!({"metadata": {"labels": {key: "true"}}}))
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
        // null deletes the key in a JSON merge patch.
        self.merge_patch(node, json!({"metadata": {"labels": {key: null}}}))
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
            .list_nodes()
            .await?
            .into_iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == OFFLINE_TAINT))
            })
            .filter_map(|n| n.metadata.name)
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
            self.force_delete_pods(node).await
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

    async fn record(&self, node: &str, reason: &str, message: &str, warning: bool) {
        let now = chrono_now();
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
}
