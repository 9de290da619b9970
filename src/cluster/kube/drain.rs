//! Moving pods off a node: the drain (Eviction API, or deletes for a failover) and the fence
//! release's force deletes, each request naming the pod's UID.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use super::KubeCluster;
use super::api_code;
use crate::cluster::ClusterError;
use maintd_core::verdict::{FailureKind, Outcome};

pub(super) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

pub(super) fn evictable(pod: &Pod) -> bool {
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
pub(super) const RELEASE_SETTLE: Duration = Duration::from_secs(1);

/// Delete options that apply only to this very pod (its UID), with an optional grace period.
pub(super) fn uid_delete(p: &Pod, grace: Option<u32>) -> DeleteParams {
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
pub(super) fn uid_eviction(p: &Pod) -> k8s_openapi::api::policy::v1::Eviction {
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

pub(super) fn pod_name(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or("?")
    )
}

impl KubeCluster {
    /// The node's pods that a drain or release moves, from the pod cache (as last seen: the
    /// job's own requests go to the API and fail there while it is away).
    pub(super) async fn pods_on(&self, node: &str) -> Result<Vec<Arc<Pod>>, ClusterError> {
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
            return Outcome::failed_as(FailureKind::Backend, format!("cordon {node}: {e}"));
        }
        let deadline = tokio::time::Instant::now() + self.cfg.drain_deadline;
        let mut backoff = self.cfg.eviction_backoff;
        let mut evicted = std::collections::BTreeSet::new();
        loop {
            let pods = match self.pods_on(node).await {
                Ok(p) => p,
                Err(e) => {
                    return Outcome::failed_as(
                        FailureKind::Backend,
                        format!("list pods on {node}: {e}"),
                    );
                }
            };
            if pods.is_empty() {
                return Outcome::done(format!("{node} drained ({} pods)", evicted.len()));
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
                return Outcome::failed_as(
                    FailureKind::Backend,
                    format!(
                        "drain of {node} missed its {:?} deadline; blocking pods: {}; the node stays cordoned (as kubectl drain leaves it): `kubectl uncordon {node}` once it may take work again",
                        self.cfg.drain_deadline,
                        still.join(", ")
                    ),
                );
            }
            tokio::time::sleep(backoff.min(deadline - tokio::time::Instant::now())).await;
            if !blocked.is_empty() {
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }

    /// Force-deletes the node's pods (grace 0), so their controllers recreate them at once. Each
    /// delete names the pod's UID: a replacement that took the name is never deleted.
    pub(super) async fn force_delete_pods(&self, pods: &[Arc<Pod>]) -> Result<usize, ClusterError> {
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
    pub(super) async fn pods_after_taint(&self, node: &str) -> Result<Vec<Arc<Pod>>, ClusterError> {
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
}
