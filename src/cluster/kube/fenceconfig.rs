//! Fence configuration from the cluster's ConfigMaps: watches the fence ConfigMaps in maintd's
//! namespace, reads the Secret keys they refer to, and replaces the ConfigMaps' plans in the
//! plan book whenever either changes (a node becomes fenceable within seconds, without a
//! restart). The parsing is `fencing::configmaps`; this is only the reading.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use tracing::{info, warn};

use super::KubeCluster;
use super::cache::Watched;
use crate::cluster::EventReason;
use crate::fencing::book::PlanBook;
use crate::fencing::configmaps::{Maps, StageDefaults, is_fence_map, parse, secret_refs};

/// How often the maps are looked at (a change shows within this), and how often the Secrets
/// they name are read again even when no map changed.
const LOOK_EVERY: Duration = Duration::from_secs(1);
const SECRETS_EVERY: Duration = Duration::from_secs(60);

/// The watch and its reader; both stop when this is dropped.
pub struct FenceConfigs {
    task: tokio::task::AbortHandle,
}

impl Drop for FenceConfigs {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keeps a fence map's data, and of any other ConfigMap only its name: the namespace may hold
/// large maps (the state checkpoint) the cache has no use for.
fn trim(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
    if !cm.metadata.name.as_deref().is_some_and(is_fence_map) {
        cm.data = None;
        cm.binary_data = None;
    }
}

impl KubeCluster {
    /// The namespace fence ConfigMaps and their Secrets are read from.
    pub fn fence_namespace(&self) -> String {
        self.cfg.leader_election.namespace()
    }

    /// Starts reading the fence ConfigMaps into `book`.
    pub fn watch_fence_configs(
        &self,
        book: Arc<PlanBook>,
        defaults: StageDefaults,
    ) -> FenceConfigs {
        let ns = self.fence_namespace();
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let task = tokio::spawn(async move {
            let cache = Watched::spawn(
                "fence configmaps",
                cms,
                watcher::Config::default().any_semantic(),
                trim,
            );
            let mut seen: Option<Vec<(String, String)>> = None;
            let mut secrets_read = Instant::now();
            let mut broken = false;
            loop {
                let objs = match cache.objects().await {
                    Ok(o) => {
                        broken = false;
                        o
                    }
                    Err(e) => {
                        if !broken {
                            warn!(namespace = %ns, error = %e, "cannot read the fence ConfigMaps; the plans in force stay");
                        }
                        broken = true;
                        tokio::time::sleep(LOOK_EVERY).await;
                        continue;
                    }
                };
                let fence: Vec<&Arc<ConfigMap>> = objs
                    .iter()
                    .filter(|c| c.metadata.name.as_deref().is_some_and(is_fence_map))
                    .collect();
                let print: Vec<(String, String)> = fence
                    .iter()
                    .map(|c| {
                        (
                            c.metadata.name.clone().unwrap_or_default(),
                            c.metadata.resource_version.clone().unwrap_or_default(),
                        )
                    })
                    .collect();
                if seen.as_ref() == Some(&print) && secrets_read.elapsed() < SECRETS_EVERY {
                    tokio::time::sleep(LOOK_EVERY).await;
                    continue;
                }
                let maps: Maps = fence
                    .iter()
                    .map(|c| {
                        (
                            c.metadata.name.clone().unwrap_or_default(),
                            c.data.clone().unwrap_or_default(),
                        )
                    })
                    .collect();
                let mut values = BTreeMap::new();
                for (s, k) in secret_refs(&maps) {
                    match secrets.get_opt(&s).await {
                        Ok(Some(sec)) => {
                            if let Some(v) = sec.data.as_ref().and_then(|d| d.get(&k)) {
                                let text = String::from_utf8_lossy(&v.0);
                                values.insert((s, k), text.trim_end_matches(['\n', '\r']).to_string());
                            }
                        }
                        Ok(None) => {}
                        // The node that needs it is refused, naming the Secret.
                        Err(e) => warn!(secret = %s, error = %e, "cannot read a Secret a fence ConfigMap refers to"),
                    }
                }
                secrets_read = Instant::now();
                seen = Some(print);
                let changed = book.set_dynamic(parse(&maps, &values, defaults));
                if !changed.is_empty() {
                    info!(namespace = %ns, nodes = ?changed, "fence configuration from ConfigMaps changed; it applies to the next flow of each node");
                }
                tokio::time::sleep(LOOK_EVERY).await;
            }
        })
        .abort_handle();
        FenceConfigs { task }
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
