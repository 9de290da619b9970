//! The conventions the medik8s operators share, so that maintd and they never work on one node
//! at once: a `NodeMaintenance` object (read only when its CRD is installed) puts its node in
//! maintenance, and the per-node Lease in `medik8s-leases` says who is working on a node. maintd
//! takes that Lease before it fences or remedies a node, and leaves a node alone while another
//! holder has it. Neither operator needs to be installed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, CustomResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::cache::{self, Watched};
use super::{api_code, chrono_now};
use crate::cluster::Purpose;
use crate::sync::LockExt;
use maintd_core::repair::{Job, JobKind};
use maintd_core::verdict::{FailureKind, Outcome};

/// Where the medik8s operators keep their per-node Leases.
pub const LEASE_NAMESPACE: &str = "medik8s-leases";
/// The holder maintd writes into a node's Lease (one for every replica: a new leader takes
/// over its predecessor's Leases as its own).
pub const HOLDER: &str = "maintd";
/// How long a Lease maintd holds stays valid without a renewal.
const LEASE_DURATION: Duration = Duration::from_secs(60);
/// A held Lease is renewed once this much of it has passed.
const RENEW_AFTER: Duration = Duration::from_secs(20);
/// How often the daemon looks for the NodeMaintenance CRD until it finds it.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(60);
const MAINTENANCE_GROUP: &str = "nodemaintenance.medik8s.io";

/// The node-maintenance operator's request to put a node in maintenance: only the fields
/// maintd reads (the rest of the object is ignored).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1beta1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances"
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The Lease's name for `node`, as the medik8s operators name it.
pub fn lease_name(node: &str) -> String {
    format!("node-{}", node.to_lowercase())
}

/// Why maintd may not take a node's Lease now.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("someone else is working on it: Lease {LEASE_NAMESPACE}/{lease} is held by {holder:?}")]
    Held { lease: String, holder: String },
    #[error("cannot take Lease {LEASE_NAMESPACE}/{lease}: {source}")]
    Api {
        lease: String,
        #[source]
        source: kube::Error,
    },
}

/// What maintd holds: per node, why (fencing, a repair job) and when it last wrote the Lease.
#[derive(Debug)]
struct Claim {
    purposes: BTreeSet<Purpose>,
    renewed: Instant,
}

pub(super) struct Medik8s {
    client: Client,
    leases: Watched<Lease>,
    /// Started once the NodeMaintenance CRD is found.
    maintenances: Arc<Mutex<Option<Watched<NodeMaintenance>>>>,
    discovery: tokio::task::AbortHandle,
    claims: tokio::sync::Mutex<BTreeMap<String, Claim>>,
}

impl Drop for Medik8s {
    fn drop(&mut self) {
        self.discovery.abort();
    }
}

impl Medik8s {
    /// Starts the Lease watch and the search for the NodeMaintenance CRD.
    pub(super) fn start(client: Client) -> Medik8s {
        let leases = Watched::spawn_noting(
            "medik8s leases",
            Api::namespaced(client.clone(), LEASE_NAMESPACE),
            watcher::Config::default().any_semantic(),
            cache::trim_meta,
            Some(super::leases::renew_marker),
        );
        let maintenances = Arc::new(Mutex::new(None));
        let found = maintenances.clone();
        let c = client.clone();
        let discovery = tokio::spawn(async move {
            let gv = format!("{MAINTENANCE_GROUP}/v1beta1");
            loop {
                match c.list_api_group_resources(&gv).await {
                    Ok(l) if l.resources.iter().any(|r| r.name == "nodemaintenances") => {
                        tracing::info!(
                            "the NodeMaintenance CRD is installed: its objects put nodes in maintenance"
                        );
                        let w = Watched::spawn(
                            "nodemaintenances",
                            Api::<NodeMaintenance>::all(c.clone()),
                            watcher::Config::default().any_semantic(),
                            cache::trim_meta,
                        );
                        *found.lock_unpoisoned() = Some(w);
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if api_code(&e) == Some(404) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot tell whether the NodeMaintenance CRD is installed")
                    }
                }
                tokio::time::sleep(DISCOVERY_INTERVAL).await;
            }
        })
        .abort_handle();
        Medik8s {
            client,
            leases,
            maintenances,
            discovery,
            claims: Default::default(),
        }
    }

    /// Nodes others are working on, with why: a NodeMaintenance names them, or another holder
    /// has their Lease. From the watches as last seen: a watch that reconnects keeps what it
    /// knew rather than let a fence through meanwhile.
    pub(super) fn held_elsewhere(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(w) = self.maintenances.lock_unpoisoned().as_ref() {
            for m in w.known() {
                let name = m.metadata.name.clone().unwrap_or_default();
                let reason = m.spec.reason.as_deref().unwrap_or("no reason given");
                out.insert(
                    m.spec.node_name.clone(),
                    format!("in maintenance by NodeMaintenance {name} ({reason})"),
                );
            }
        }
        let wall = crate::report::now_ns();
        for l in self.leases.known() {
            let Some(node) = l
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix("node-"))
            else {
                continue;
            };
            let arrived = super::leases::renew_marker(&l)
                .and_then(|m| self.leases.arrived(l.metadata.name.as_deref()?, &m))
                .map(|at| at.elapsed());
            if let Some(holder) = foreign_holder(&l, wall, arrived) {
                out.entry(node.to_string()).or_insert_with(|| {
                    ClaimError::Held {
                        lease: lease_name(node),
                        holder,
                    }
                    .to_string()
                });
            }
        }
        out
    }

    /// Holds the Leases of `purpose` for exactly `nodes`: takes those not held, renews every
    /// held Lease that is due (of any purpose), and gives back those no purpose needs any
    /// more. Returns the nodes whose Lease could not be taken or kept, with why.
    pub(super) async fn hold(
        &self,
        purpose: Purpose,
        nodes: &BTreeSet<String>,
        uid: impl Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, String> {
        let mut claims = self.claims.lock().await;
        let mut refused = BTreeMap::new();
        let mut gone = Vec::new();
        for (node, c) in claims.iter_mut() {
            if !nodes.contains(node) && c.purposes.remove(&purpose) && c.purposes.is_empty() {
                gone.push(node.clone());
            }
        }
        for node in gone {
            claims.remove(&node);
            self.give_back(&node).await;
        }
        for node in nodes {
            let due = claims
                .get(node)
                .is_none_or(|c| c.renewed.elapsed() >= RENEW_AFTER);
            if due && let Err(e) = self.take(node, uid(node)).await {
                refused.insert(node.clone(), e.to_string());
                // Not held for this purpose; a claim no purpose needs is dropped, not renewed.
                if let Some(c) = claims.get_mut(node) {
                    c.purposes.remove(&purpose);
                    if c.purposes.is_empty() {
                        claims.remove(node);
                    }
                }
                continue;
            }
            let c = claims.entry(node.clone()).or_insert_with(|| Claim {
                purposes: BTreeSet::new(),
                renewed: Instant::now(),
            });
            if due {
                c.renewed = Instant::now();
            }
            c.purposes.insert(purpose);
        }
        // Leases of other purposes that are due (a long repair job's) are renewed here too.
        let due: Vec<String> = claims
            .iter()
            .filter(|(n, c)| !nodes.contains(*n) && c.renewed.elapsed() >= RENEW_AFTER)
            .map(|(n, _)| n.clone())
            .collect();
        for node in due {
            match self.take(&node, uid(&node)).await {
                Ok(()) => {
                    if let Some(c) = claims.get_mut(&node) {
                        c.renewed = Instant::now();
                    }
                }
                Err(e) => tracing::warn!(node = %node, error = %e, "cannot renew the node's Lease"),
            }
        }
        refused
    }

    /// Takes `node`'s Lease for one purpose (a repair job) until [`Medik8s::release`].
    pub(super) async fn claim(
        &self,
        purpose: Purpose,
        node: &str,
        uid: Option<String>,
    ) -> Result<(), ClaimError> {
        let mut claims = self.claims.lock().await;
        self.take(node, uid).await?;
        let c = claims.entry(node.to_string()).or_insert_with(|| Claim {
            purposes: BTreeSet::new(),
            renewed: Instant::now(),
        });
        c.renewed = Instant::now();
        c.purposes.insert(purpose);
        Ok(())
    }

    /// Gives back `node`'s Lease for `purpose`, and the Lease itself once nothing holds it.
    pub(super) async fn release(&self, purpose: Purpose, node: &str) {
        let mut claims = self.claims.lock().await;
        let Some(c) = claims.get_mut(node) else {
            return;
        };
        c.purposes.remove(&purpose);
        if c.purposes.is_empty() {
            claims.remove(node);
            self.give_back(node).await;
        }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), LEASE_NAMESPACE)
    }

    /// Creates, renews or takes over `node`'s Lease, from the API itself (the watch may not
    /// have seen another holder's write yet). Every write is conditional on what was read.
    async fn take(&self, node: &str, uid: Option<String>) -> Result<(), ClaimError> {
        let lease = lease_name(node);
        let api_err = |source| ClaimError::Api {
            lease: lease.clone(),
            source,
        };
        let now = MicroTime(chrono_now());
        let current = self.api().get_opt(&lease).await.map_err(api_err)?;
        let Some(mut l) = current else {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(lease.clone()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    owner_references: owner(node, uid),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(HOLDER.into()),
                    lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api().create(&PostParams::default(), &fresh).await {
                Ok(_) => Ok(()),
                // No namespace: nobody else can hold a Lease there either.
                Err(e) if api_code(&e) == Some(404) => {
                    tracing::debug!(error = %e, "no {LEASE_NAMESPACE} namespace: no node Lease taken");
                    Ok(())
                }
                Err(e) => Err(api_err(e)),
            };
        };
        let wall = crate::report::now_ns();
        let arrived = super::leases::renew_marker(&l)
            .and_then(|m| self.leases.arrived(&lease, &m))
            .map(|at| at.elapsed());
        if let Some(holder) = foreign_holder(&l, wall, arrived) {
            return Err(ClaimError::Held { lease, holder });
        }
        let spec = l.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(HOLDER) {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(HOLDER.into());
            if uid.is_some() {
                l.metadata.owner_references = owner(node, uid);
            }
        }
        let spec = l.spec.get_or_insert_with(Default::default);
        spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        spec.renew_time = Some(now);
        // The read's resourceVersion makes the replace fail if another holder wrote meanwhile.
        self.api()
            .replace(&lease, &PostParams::default(), &l)
            .await
            .map(|_| ())
            .map_err(api_err)
    }

    /// Deletes `node`'s Lease if maintd still holds it, conditional on the version read.
    async fn give_back(&self, node: &str) {
        let lease = lease_name(node);
        let l = match self.api().get_opt(&lease).await {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "cannot give back the node's Lease; it expires by itself");
                return;
            }
        };
        if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(HOLDER) {
            return;
        }
        let dp = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: l.metadata.uid.clone(),
                resource_version: l.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        if let Err(e) = self.api().delete(&lease, &dp).await {
            tracing::warn!(node = %node, error = %e, "cannot give back the node's Lease; it expires by itself");
        } else {
            tracing::info!(node = %node, "node Lease given back");
        }
    }
}

impl super::KubeCluster {
    /// A node's UID from the cache (for the owner reference of its medik8s Lease).
    async fn node_uid(&self, node: &str) -> Option<String> {
        self.nodes.get(node).await.ok()??.metadata.uid.clone()
    }

    pub(super) async fn hold_medik8s(
        &self,
        purpose: Purpose,
        nodes: &BTreeSet<String>,
    ) -> BTreeMap<String, String> {
        let mut uids = BTreeMap::new();
        for n in nodes {
            uids.insert(n.clone(), self.node_uid(n).await);
        }
        self.medik8s
            .hold(purpose, nodes, |n| uids.get(n).cloned().flatten())
            .await
    }

    /// Runs a repair event's job on its node holding the node's Lease throughout: a job on
    /// a node another holder is working on does not run, and says who holds it.
    pub(super) async fn run_claimed(&self, job: &Job, event: &str) -> Outcome {
        let node = &job.node;
        // A live repair runs on the collector, not here: `run_node_job` says so.
        if job.kind == JobKind::LiveRepair {
            return self.run_node_job(job, event).await;
        }
        let uid = self.node_uid(node).await;
        if let Err(e) = self.medik8s.claim(Purpose::Repair, node, uid).await {
            return Outcome::failed_as(
                FailureKind::Backend,
                format!("{node}: {e}; the {} job did not run", job.kind.as_str()),
            );
        }
        let o = self.run_node_job(job, event).await;
        self.medik8s.release(Purpose::Repair, node).await;
        o
    }
}

fn owner(node: &str, uid: Option<String>) -> Option<Vec<OwnerReference>> {
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: uid?,
        ..Default::default()
    }])
}

/// The holder of `l` when it is someone other than maintd and the Lease may still be valid:
/// by the wall clock (its renewal plus its duration not yet past; a renewal stamped in the
/// future counts as valid, whichever clock is wrong), or by this process's steady clock (a
/// renewal seen arriving within its duration), so a wall clock stepped forward does not end
/// another holder's Lease early.
pub fn foreign_holder(l: &Lease, wall_ns: i64, arrived_ago: Option<Duration>) -> Option<String> {
    let spec = l.spec.as_ref()?;
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    if holder == HOLDER {
        return None;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    let by_steady = arrived_ago.is_some_and(|a| a <= duration);
    let by_wall = spec.renew_time.as_ref().is_some_and(|t| {
        let renewed = t.0.as_nanosecond() as i64;
        renewed.saturating_add(duration.as_nanos() as i64) >= wall_ns
    });
    (by_steady || by_wall).then(|| holder.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_s: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(renewed_s).unwrap(),
                )),
                ..Default::default()
            }),
        }
    }

    const S: i64 = 1_000_000_000;

    #[test]
    fn another_holders_lease_counts_while_either_clock_says_it_is_valid() {
        let l = lease("node-maintenance", 1000, 3600);
        assert_eq!(
            foreign_holder(&l, 2000 * S, None).as_deref(),
            Some("node-maintenance")
        );
        // Expired by the wall clock, and never seen renewed: free.
        assert_eq!(foreign_holder(&l, 5000 * S, None), None);
        // The wall clock stepped forward, but its renewal arrived a minute ago: still held.
        assert!(foreign_holder(&l, 9000 * S, Some(Duration::from_secs(60))).is_some());
        // A renewal stamped in the future (a clock behind) counts as held.
        assert!(foreign_holder(&l, 10 * S, None).is_some());
    }

    #[test]
    fn maintds_own_lease_and_an_empty_holder_are_not_held_elsewhere() {
        assert_eq!(
            foreign_holder(&lease(HOLDER, 1000, 60), 1000 * S, None),
            None
        );
        assert_eq!(foreign_holder(&lease("", 1000, 60), 1000 * S, None), None);
    }

    #[test]
    fn node_leases_are_named_as_the_medik8s_operators_name_them() {
        assert_eq!(lease_name("Worker-1"), "node-worker-1");
    }
}
