//! Which capabilities the Kubernetes backend offers (`KubeCluster::backend`), and those beyond
//! jobs, releases and Events: node facts from the node watch and the kubelet Leases, claims
//! shared with other controllers (NodeMaintenance, the medik8s Lease), and capacity for drains.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::*;

impl KubeCluster {
    /// Every capability this backend has: all of them but a node source (its nodes come from
    /// the node watch) and upkeep.
    pub fn backend(self: Arc<Self>) -> Backend {
        let tokens = self
            .cfg
            .operator_tokens
            .then(|| Arc::new(tokens::KubeTokens::new(self.client.clone())) as _);
        Backend {
            events: Some(self.clone()),
            witness: Some(self.clone()),
            claims: Some(self.clone()),
            capacity: Some(self.clone()),
            pods: Some(self.clone()),
            tokens,
            ..Backend::basic(self)
        }
    }
}

#[async_trait::async_trait]
impl NodeWitness for KubeCluster {
    async fn node_facts(&self) -> Result<NodeFacts, ClusterError> {
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
                // A status other than True, False or Unknown matches no rule.
                .filter_map(|c| {
                    Some(NodeCondition {
                        kind: c.type_.clone(),
                        status: c.status.parse().ok()?,
                        since: c
                            .last_transition_time
                            .as_ref()
                            .map(|t| t.0.as_nanosecond() as i64)
                            .unwrap_or(0),
                    })
                })
                .collect();
            facts.conditions.insert(m.name.clone(), conditions);
            facts.members.push(m);
        }
        Ok(facts)
    }

    fn witness_leases(&self) -> crate::cluster::WitnessLeases {
        self.leases_now()
    }
}

#[async_trait::async_trait]
impl Claims for KubeCluster {
    fn held_elsewhere(&self) -> BTreeMap<String, String> {
        self.medik8s.held_elsewhere()
    }

    async fn hold_nodes(
        &self,
        purpose: Purpose,
        nodes: &BTreeSet<String>,
    ) -> BTreeMap<String, String> {
        self.hold_medik8s(purpose, nodes).await
    }
}

#[async_trait::async_trait]
impl Capacity for KubeCluster {
    async fn capacity(&self) -> Result<capacity::Snapshot, ClusterError> {
        // Every node counts as room for the pods, managed or not.
        let nodes = self.all_nodes().await?;
        let pods = self.pods.objects().await?;
        let pdbs = self.pdbs.objects().await?;
        Ok(snapshot(&nodes, &pods, &pdbs))
    }
}
