//! Fence flows kept as NodeFence objects: the `FlowStore` of the Kubernetes backend, so that the
//! controller keeps no fence state of its own and any later leader resumes from the objects
//! alone. Reads come from a watch of the objects with this replica's own writes over it (as
//! client-go's mutation cache); every write of a flow is conditional on the resourceVersion it
//! was read at, and the flow's `version` is that resourceVersion.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;
use uuid::Uuid;

use super::cache::{Watched, trim_meta};
use super::nodefence::{
    FINALIZER, NodeFence, NodeFenceSpec, NodeFenceStatus, flow_id, flow_of, labels, name_for,
    set_condition, status_of, time,
};
use super::{KubeCluster, api_code};

mod operators;
use crate::store::{FenceCancel, FlowStore, Requests, StoreError};
use crate::sync::LockExt;
use maintd_core::fencing::machine::{FenceStatus, Flow};
use maintd_core::verdict::Nanos;
#[cfg(any(test, feature = "testing"))]
pub use operators::conformance;

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How long a write of this replica's stands over the watch before the watch must have caught
/// up (a write the watch never shows was overtaken by a delete).
const OVERLAY_FOR: Duration = Duration::from_secs(30);
/// Conflicts a read-modify-write retries before it gives up.
const CONFLICT_RETRIES: usize = 5;

fn remote(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Remote {
        what: what.to_string(),
        detail: e.to_string(),
    }
}

fn rv(nf: &NodeFence) -> u64 {
    nf.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub struct NodeFences {
    api: Api<NodeFence>,
    cache: Watched<NodeFence>,
    /// Objects as this replica last wrote them, by name, until the watch shows them.
    written: Mutex<BTreeMap<String, (Instant, Arc<NodeFence>)>>,
    /// Unreadable objects already logged, by name and resourceVersion (logged once each).
    warned: Mutex<BTreeMap<String, u64>>,
}

impl NodeFences {
    /// Watches every NodeFence on the current tokio runtime.
    pub fn new(client: kube::Client) -> NodeFences {
        let api: Api<NodeFence> = Api::all(client);
        let cache = Watched::spawn(
            "nodefences",
            api.clone(),
            watcher::Config::default().any_semantic(),
            trim_meta,
        );
        NodeFences {
            api,
            cache,
            written: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeMap::new()),
        }
    }

    /// Fails with a clear message when the CRD is not installed (or not readable).
    pub async fn check_installed(&self) -> Result<()> {
        match self
            .api
            .list(&kube::api::ListParams::default().limit(1))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if api_code(&e) == Some(404) => Err(remote(
                "the NodeFence CRD is not installed",
                "apply deploy/crd.yaml (or `maintd crd | kubectl apply -f -`), or set [kubernetes] nodefences = false",
            )),
            Err(e) => Err(remote("cannot list NodeFences", e)),
        }
    }

    /// Every object: the watch's, with this replica's newer writes over it.
    async fn objects(&self) -> Result<Vec<Arc<NodeFence>>> {
        let watched = self
            .cache
            .objects()
            .await
            .map_err(|e| remote("NodeFence watch", e))?;
        let mut by_name: BTreeMap<String, Arc<NodeFence>> = watched
            .into_iter()
            .filter_map(|o| Some((o.metadata.name.clone()?, o)))
            .collect();
        let mut written = self.written.lock_unpoisoned();
        written.retain(|name, (at, mine)| {
            let seen = by_name.get(name).map(|o| rv(o));
            if seen.is_some_and(|v| v >= rv(mine)) || at.elapsed() > OVERLAY_FOR {
                return false;
            }
            by_name.insert(name.clone(), mine.clone());
            true
        });
        Ok(by_name.into_values().collect())
    }

    fn remember(&self, nf: NodeFence) -> Arc<NodeFence> {
        let nf = Arc::new(nf);
        if let Some(name) = nf.metadata.name.clone() {
            self.written
                .lock_unpoisoned()
                .insert(name, (Instant::now(), nf.clone()));
        }
        nf
    }

    fn forget(&self, name: &str) {
        self.written.lock_unpoisoned().remove(name);
    }

    /// Each readable flow with its object; an unreadable object is logged once per version and
    /// left alone (it never stops the rest).
    async fn flows(&self) -> Result<Vec<(Flow, Arc<NodeFence>)>> {
        let mut out = Vec::new();
        for o in self.objects().await? {
            match flow_of(&o) {
                Ok(Some(f)) => out.push((f, o)),
                Ok(None) => {}
                Err(e) => self.warn_unreadable(&o, &e),
            }
        }
        Ok(out)
    }

    fn warn_unreadable(&self, o: &NodeFence, e: &super::nodefence::UnreadableFlow) {
        let name = o.metadata.name.clone().unwrap_or_default();
        let mut warned = self.warned.lock_unpoisoned();
        if warned.get(&name) != Some(&rv(o)) {
            tracing::warn!(nodefence = %name, error = %e, "NodeFence ignored: its status is not a flow maintd can read");
            warned.insert(name, rv(o));
        }
    }

    async fn find(&self, id: &Uuid) -> Result<Option<Arc<NodeFence>>> {
        Ok(self
            .objects()
            .await?
            .into_iter()
            .find(|o| flow_id(o) == Some(*id)))
    }

    /// Writes `status` over `base` unless the object changed since (409: `None`).
    async fn put_status(
        &self,
        base: &NodeFence,
        status: NodeFenceStatus,
    ) -> Result<Option<Arc<NodeFence>>> {
        let name = base.metadata.name.clone().unwrap_or_default();
        let mut nf = base.clone();
        nf.status = Some(status);
        match self
            .api
            .replace_status(&name, &PostParams::default(), &nf)
            .await
        {
            Ok(o) => Ok(Some(self.remember(o))),
            Err(e) if api_code(&e) == Some(409) => Ok(None),
            Err(e) => Err(remote(&format!("cannot write NodeFence {name}"), e)),
        }
    }

    /// Sets or removes this controller's finalizer (a patch conditional on the version read).
    async fn finalizer(&self, o: &NodeFence, on: bool) -> Result<()> {
        let name = o.metadata.name.clone().unwrap_or_default();
        let mut list: Vec<String> = o.metadata.finalizers.clone().unwrap_or_default();
        list.retain(|f| f != FINALIZER);
        if on {
            list.push(FINALIZER.to_string());
        }
        let patch = json!({"metadata": {
            "resourceVersion": o.metadata.resource_version,
            "finalizers": list,
        }});
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(n) => {
                self.remember(n);
                Ok(())
            }
            Err(e) if api_code(&e) == Some(404) => {
                self.forget(&name);
                Ok(())
            }
            Err(e) => Err(remote(&format!("cannot update NodeFence {name}"), e)),
        }
    }

    fn has_finalizer(o: &NodeFence) -> bool {
        o.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
    }
}

#[async_trait::async_trait]
impl FlowStore for NodeFences {
    async fn insert(&self, f: &Flow) -> Result<()> {
        // An operator's request becomes the flow in place; anything else gets its own object.
        let request = self
            .objects()
            .await?
            .into_iter()
            .find(|o| flow_id(o) == Some(f.id) && flow_of(o).ok().flatten().is_none());
        let base = match request {
            Some(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                let mut meta_labels = o.metadata.labels.clone().unwrap_or_default();
                meta_labels.extend(labels(f));
                let mut finalizers = o.metadata.finalizers.clone().unwrap_or_default();
                finalizers.retain(|x| x != FINALIZER);
                finalizers.push(FINALIZER.to_string());
                let patch = json!({"metadata": {
                    "resourceVersion": o.metadata.resource_version,
                    "labels": meta_labels,
                    "finalizers": finalizers,
                }});
                self.api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| remote(&format!("cannot adopt NodeFence {name}"), e))?
            }
            None => {
                let nf = NodeFence {
                    metadata: ObjectMeta {
                        name: Some(name_for(f)),
                        labels: Some(labels(f)),
                        finalizers: Some(vec![FINALIZER.to_string()]),
                        ..Default::default()
                    },
                    spec: NodeFenceSpec {
                        node: f.node.clone(),
                    },
                    status: None,
                };
                self.api
                    .create(&PostParams::default(), &nf)
                    .await
                    .map_err(|e| remote(&format!("cannot create NodeFence {}", name_for(f)), e))?
            }
        };
        let status = status_of(f, base.status.as_ref());
        match self.put_status(&base, status).await? {
            Some(_) => Ok(()),
            None => Err(remote(
                "NodeFence",
                format!("flow {} changed while it was recorded", f.id),
            )),
        }
    }

    async fn save(&self, f: &Flow) -> Result<bool> {
        let Some(o) = self.find(&f.id).await? else {
            return Ok(false);
        };
        if rv(&o) != f.version {
            return Ok(false);
        }
        let Some(saved) = self.put_status(&o, status_of(f, o.status.as_ref())).await? else {
            return Ok(false);
        };
        // A final flow's record may go: an operator's delete completes, and the pruning of
        // old records needs no finalizer step.
        if f.status == FenceStatus::Final && Self::has_finalizer(&saved) {
            self.finalizer(&saved, false).await?;
        }
        Ok(true)
    }

    async fn update(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>> {
        let Some(mut o) = self.find(id).await? else {
            return Ok(None);
        };
        for _ in 0..CONFLICT_RETRIES {
            let Some(mut f) = flow_of(&o).map_err(|e| remote("NodeFence", e))? else {
                return Ok(None);
            };
            if !change(&mut f) {
                return Ok(Some(f));
            }
            if let Some(put) = self
                .put_status(&o, status_of(&f, o.status.as_ref()))
                .await?
            {
                f.version = rv(&put);
                return Ok(Some(f));
            }
            let name = o.metadata.name.clone().unwrap_or_default();
            o = Arc::new(
                self.api
                    .get(&name)
                    .await
                    .map_err(|e| remote(&format!("cannot read NodeFence {name}"), e))?,
            );
        }
        Err(remote(
            &format!("NodeFence of flow {id}"),
            "changed by others on every attempt",
        ))
    }

    async fn cancel(&self, id: &Uuid, now: Nanos) -> Result<FenceCancel> {
        let mut verdict = FenceCancel::NotFound;
        self.update(id, &mut |f| {
            verdict = crate::store::apply_cancel(f, now);
            matches!(verdict, FenceCancel::Canceled(_))
        })
        .await?;
        if let FenceCancel::PoweredOff = verdict
            && let Some(o) = self.find(id).await?
        {
            // Said where the operator looks, once, so the request is not retried every tick.
            let mut s = o.status.clone().unwrap_or_default();
            set_condition(
                &mut s.conditions,
                "Canceled",
                false,
                "PoweredOff",
                verdict.describe(),
                &time(now),
            );
            self.put_status(&o, s).await?;
        }
        if let FenceCancel::Canceled(f) = &mut verdict
            && let Some(o) = self.find(id).await?
        {
            f.version = rv(&o);
        }
        Ok(verdict)
    }

    async fn active(&self, since: Nanos) -> Result<Vec<Flow>> {
        let mut v: Vec<Flow> = self
            .flows()
            .await?
            .into_iter()
            .map(|(f, _)| f)
            .filter(|f| f.status != FenceStatus::Final || f.updated >= since)
            .collect();
        v.sort_by_key(|f| (f.created, f.id));
        Ok(v)
    }

    async fn recent(&self, limit: usize) -> Result<Vec<Flow>> {
        let mut v: Vec<Flow> = self.flows().await?.into_iter().map(|(f, _)| f).collect();
        v.sort_by_key(|f| std::cmp::Reverse((f.created, f.id)));
        v.truncate(limit);
        Ok(v)
    }

    async fn get(&self, id: &Uuid) -> Result<Option<Flow>> {
        let Some(o) = self.find(id).await? else {
            return Ok(None);
        };
        flow_of(&o).map_err(|e| remote("NodeFence", e))
    }

    async fn prune(&self, ended_before: Nanos) -> Result<usize> {
        let mut n = 0;
        for o in self.objects().await? {
            let ended = match crate::cluster::kube::nodefence::flow_of(&o) {
                Ok(Some(f)) => (f.status == FenceStatus::Final).then_some(f.updated),
                // An operator's request refused for good ends then, like a final flow.
                Ok(None) => crate::cluster::kube::nodefence::refused_at(o.status.as_ref()),
                Err(_) => None,
            };
            if ended.is_some_and(|t| t < ended_before) && self.delete_record(&o).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    async fn requests(&self) -> Result<Requests> {
        self.operator_requests().await
    }

    async fn hold(&self, request: &Uuid, why: &str, refused: bool) -> Result<()> {
        self.hold_request(request, why, refused).await
    }

    fn shared(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        "NodeFence objects (maintd.io/v1alpha1)".to_string()
    }
}

impl NodeFences {
    /// Deletes the record `o`, and only that object (a new one of the same name is not it);
    /// whether it was deleted here.
    async fn delete_record(&self, o: &NodeFence) -> Result<bool> {
        let name = o.metadata.name.clone().unwrap_or_default();
        if Self::has_finalizer(o) {
            self.finalizer(o, false).await?;
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: o.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let deleted = match self.api.delete(&name, &dp).await {
            Ok(_) => true,
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => false,
            Err(e) => return Err(remote(&format!("cannot delete NodeFence {name}"), e)),
        };
        self.forget(&name);
        Ok(deleted)
    }
}

impl KubeCluster {
    /// The flow store over this cluster's NodeFence objects.
    pub fn node_fences(&self) -> NodeFences {
        NodeFences::new(self.client.clone())
    }
}
