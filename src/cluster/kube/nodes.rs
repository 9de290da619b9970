//! Writes to Nodes: maintd tags as labels, cordon, taints (offline and out-of-service), and
//! reading this replica's own writes back before the watch delivers them.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::KubeCluster;
use super::{api_code, cache};
use crate::cluster::ClusterError;
use crate::sync::LockExt;

/// The taint that tells Kubernetes a node is shut down for good: the attach-detach controller
/// detaches its volumes and the pod GC deletes its pods (GA in 1.28).
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

pub const OFFLINE_TAINT: &str = "maintd.io/offline";

/// Labels are `<kind>.maintd.io/<id>`: `maintd:repairready:<id>` is `repairready.maintd.io/<id>`.
pub(super) const LABEL_SUFFIX: &str = ".maintd.io";

pub(super) const CONFLICT_RETRIES: usize = 5;

/// Maps a maintd tag to a node label key, and back.
pub fn tag_to_label(tag: &str) -> Option<String> {
    let (kind, id) = maintd_core::tags::split(tag)?;
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
    Some(maintd_core::tags::join(kind, id))
}

/// The taint effects maintd sets: `NoSchedule` on a node it takes out of service (nothing new
/// lands there), `NoExecute` for the out-of-service taint after a proven power-off (workloads
/// leave at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum TaintEffect {
    NoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl KubeCluster {
    pub(super) fn with_writes(&self, nodes: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut written = self.written.lock_unpoisoned();
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

    pub(super) fn wrote(&self, mut n: Node) {
        cache::trim_node(&self.cfg.collector_annotation)(&mut n);
        if let Some(name) = n.metadata.name.clone() {
            self.written.lock_unpoisoned().insert(name, Arc::new(n));
        }
    }

    pub(super) async fn merge_patch(&self, node: &str, patch: Value) -> Result<(), ClusterError> {
        let n = self
            .nodes_api()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.wrote(n);
        Ok(())
    }

    /// A strategic-merge patch, as kubectl sends for cordon and labels: maps merge, and a
    /// null deletes a key, without reading the node first.
    pub(super) async fn strategic_patch(
        &self,
        node: &str,
        patch: Value,
    ) -> Result<(), ClusterError> {
        let n = self
            .nodes_api()
            .patch(node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        self.wrote(n);
        Ok(())
    }

    pub(super) async fn cordon(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        self.strategic_patch(node, json!({"spec": {"unschedulable": on}}))
            .await
    }

    /// Adds or removes a taint. A merge patch replaces the whole list, so it carries the
    /// resourceVersion it was computed from, and a 409 (someone changed the node) is retried.
    pub(super) async fn set_taint(
        &self,
        node: &str,
        key: &str,
        value: Option<&str>,
        effect: TaintEffect,
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
                .filter(|t| !(t.key == key && t.effect == effect.as_str()))
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
                .collect();
            if present {
                let mut t = json!({"key": key, "effect": effect.as_str()});
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

    pub(super) async fn offline(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        self.cordon(node, on).await?;
        self.set_taint(node, OFFLINE_TAINT, None, TaintEffect::NoSchedule, on)
            .await
    }
}

/// Whether `a` is a later version of the same object than `b`. resourceVersions are opaque to
/// clients but are etcd revisions in practice; client-go's mutation cache compares them the same
/// way, and anything unparsable trusts the watch.
pub(super) fn newer(a: &Node, b: &Node) -> bool {
    let rv = |n: &Node| {
        n.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(x), Some(y)) if x > y)
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
