//! The fence configuration's raw material on Kubernetes: the ConfigMaps of maintd's namespace
//! (watched), the Secrets they refer to (read on demand), and Events on a refused ConfigMap.
//! What they mean is `fencing::configmaps`; following them into the plan book is
//! `fencing::book::follow`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use tracing::warn;

use super::KubeCluster;
use super::cache::Watched;
use crate::cluster::{ClusterError, EventReason};

/// The ConfigMaps of one namespace whose names `keep` selects (the others are kept without
/// their data: the namespace may hold large maps the cache has no use for), and the Secrets of
/// that namespace, read on demand. The watch stops when this is dropped.
pub struct ConfigMaps {
    cache: Watched<ConfigMap>,
    secrets: Api<Secret>,
    keep: fn(&str) -> bool,
    pub namespace: String,
}

#[async_trait::async_trait]
impl crate::cluster::maps::MapSource for ConfigMaps {
    /// The kept maps, failing while the watch is broken (the plans in force then stay).
    async fn snapshot(&self) -> Result<crate::cluster::maps::MapSnapshot, ClusterError> {
        let objs = self.cache.objects().await?;
        let kept = objs
            .iter()
            .filter(|c| c.metadata.name.as_deref().is_some_and(self.keep));
        let mut maps = BTreeMap::new();
        let mut versions = Vec::new();
        for c in kept {
            let name = c.metadata.name.clone().unwrap_or_default();
            versions.push((
                name.clone(),
                c.metadata.resource_version.clone().unwrap_or_default(),
            ));
            maps.insert(name, c.data.clone().unwrap_or_default());
        }
        Ok((maps, versions))
    }

    /// One key of one Secret, as text (a trailing newline dropped); `None` when either is
    /// missing or cannot be read (said in the log, without the value).
    async fn secret(&self, name: &str, key: &str) -> Option<String> {
        match self.secrets.get_opt(name).await {
            Ok(sec) => sec
                .and_then(|s| s.data)
                .and_then(|d| d.get(key).cloned())
                .map(|v| {
                    String::from_utf8_lossy(&v.0)
                        .trim_end_matches(['\n', '\r'])
                        .to_string()
                }),
            Err(e) => {
                warn!(secret = name, error = %e, "cannot read a Secret a fence ConfigMap refers to");
                None
            }
        }
    }

    fn location(&self) -> String {
        format!("namespace {}", self.namespace)
    }
}

impl KubeCluster {
    /// The namespace fence ConfigMaps and their Secrets are read from.
    pub fn fence_namespace(&self) -> String {
        self.cfg.leader_election.namespace()
    }

    /// Watches the fence namespace's ConfigMaps that `keep` selects.
    pub fn watch_configmaps(&self, keep: fn(&str) -> bool) -> ConfigMaps {
        let namespace = self.fence_namespace();
        let trim = move |cm: &mut ConfigMap| {
            cm.metadata.managed_fields = None;
            if !cm.metadata.name.as_deref().is_some_and(keep) {
                cm.data = None;
                cm.binary_data = None;
            }
        };
        ConfigMaps {
            cache: Watched::spawn(
                "fence configmaps",
                Api::namespaced(self.client.clone(), &namespace),
                watcher::Config::default().any_semantic(),
                trim,
            ),
            secrets: Api::namespaced(self.client.clone(), &namespace),
            keep,
            namespace,
        }
    }

    /// A Warning Event on a ConfigMap in the fence namespace.
    pub(super) async fn record_on_configmap(&self, name: &str, reason: EventReason, message: &str) {
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some(name.into()),
            namespace: Some(self.fence_namespace()),
            ..Default::default()
        };
        self.events.publish(&object, reason, message, true).await;
    }
}
