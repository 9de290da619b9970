//! Leader election's shared objects on Kubernetes: the Lease and the state checkpoint ConfigMap,
//! read from their watches and written conditionally on their resourceVersion.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::KubeCluster;
use super::{api_code, chrono_now};
use crate::cluster::{ClusterError, Coordination, LeaseRecord};

impl KubeCluster {
    /// The Lease and the state ConfigMap live in the leader-election namespace.
    pub(super) fn election_api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.cfg.leader_election.namespace())
    }

    /// Creates `obj` (no version read: it did not exist) or replaces the version its metadata
    /// carries. `None` on 409: someone else wrote first (a replace over a newer version, or a
    /// create of an object that appeared meanwhile).
    pub(super) async fn create_or_replace<K>(
        &self,
        name: &str,
        exists: bool,
        obj: &K,
    ) -> Result<Option<K>, ClusterError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api = self.election_api::<K>();
        let r = if exists {
            api.replace(name, &PostParams::default(), obj).await
        } else {
            api.create(&PostParams::default(), obj).await
        };
        match r {
            Ok(o) => Ok(Some(o)),
            Err(e) if api_code(&e) == Some(409) => Ok(None),
            Err(e) => Err(e.into()),
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
        Ok(self
            .create_or_replace(name, lease.version.is_some(), &l)
            .await?
            .map(lease_record))
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
        Ok(self
            .create_or_replace(name, version.is_some(), &cm)
            .await?
            .map(|cm| cm.metadata.resource_version.unwrap_or_default()))
    }

    async fn confirm(&self) -> Result<bool, ClusterError> {
        // From the API server itself, not the watch cache, which may lag behind a successor's
        // write.
        let me = self.cfg.leader_election.identity();
        let lease = self
            .election_api::<Lease>()
            .get_opt(&self.cfg.leader_election.lease_name)
            .await?;
        Ok(lease.map(lease_record).and_then(|l| l.holder) == Some(me))
    }

    fn token(&self) -> Option<i64> {
        // A Lease has no revision that a write of another object could compare.
        None
    }
}

pub(super) const STATE_KEY: &str = "state.json";

pub(super) fn lease_record(l: Lease) -> LeaseRecord {
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
