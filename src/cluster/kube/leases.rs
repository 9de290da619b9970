//! The storage Leases an operator names as witnesses of a node's life, read from their
//! namespaces' watches into the node facts beside the kubelets' Leases.

use super::{KubeCluster, KubeletLease, NodeFacts};

impl KubeCluster {
    /// Each member's storage Leases, from watches that are current (an optional witness, like
    /// the kubelet's: a broken watch only removes it).
    pub(super) fn storage_lease_facts(&self, facts: &mut NodeFacts) {
        for l in &self.cfg.storage_leases {
            let Some(leases) = self
                .storage_leases
                .get(&l.namespace)
                .and_then(|w| w.if_current())
            else {
                continue;
            };
            for m in &facts.members {
                let name = l.name.replace("{node}", &m.name);
                let Some(spec) = leases
                    .iter()
                    .find(|x| x.metadata.name.as_deref() == Some(name.as_str()))
                    .and_then(|x| x.spec.as_ref())
                else {
                    continue;
                };
                if let Some(t) = &spec.renew_time {
                    let witness = crate::fencing::opinion::lease_witness(&l.namespace, &name);
                    let lease = KubeletLease {
                        renew_marker: format!("{:?}", t.0),
                        duration_s: spec.lease_duration_seconds.unwrap_or(40),
                    };
                    facts
                        .storage_leases
                        .entry(m.name.clone())
                        .or_default()
                        .push((witness, lease));
                }
            }
        }
    }
}
