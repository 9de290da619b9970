//! The Leases that witness a node's life, read from their watches at each fencing decision:
//! every kubelet's (in `kube-node-lease`) and the storage Leases an operator names, each with
//! the moment its current renewal arrived on a live watch.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;

use super::{KubeCluster, KubeletLease};
use crate::cluster::WitnessLeases;

/// A Lease's renewal marker: its `renewTime` exactly as stored (a change is a renewal).
pub(super) fn renew_marker(l: &Lease) -> Option<String> {
    let t = l.spec.as_ref()?.renew_time.as_ref()?;
    Some(format!("{:?}", t.0))
}

/// The fencer's view of one Lease object, with when its renewal arrived.
fn witness(
    l: &Lease,
    arrived: impl Fn(&str, &str) -> Option<tokio::time::Instant>,
) -> Option<KubeletLease> {
    let name = l.metadata.name.as_deref()?;
    let marker = renew_marker(l)?;
    Some(KubeletLease {
        arrived: arrived(name, &marker).map(tokio::time::Instant::into_std),
        duration_s: l.spec.as_ref()?.lease_duration_seconds.unwrap_or(40),
        renew_marker: marker,
    })
}

impl KubeCluster {
    /// Every witness Lease now, from watches that are current (an optional witness: a broken
    /// watch, or no permission to watch, only removes it). A kubelet's Lease is named after
    /// its node; a storage Lease's node is its name with the pattern's `{node}` read back.
    pub(super) fn leases_now(&self) -> WitnessLeases {
        let mut out = BTreeMap::new();
        if let Some(leases) = self.kubelet_leases.if_current() {
            for l in leases {
                let Some(w) = witness(&l, |n, m| self.kubelet_leases.arrived(n, m)) else {
                    continue;
                };
                let node = l.metadata.name.clone().unwrap_or_default();
                out.insert(
                    (
                        node,
                        maintd_core::fencing::opinion::KUBELET_WITNESS.to_string(),
                    ),
                    w,
                );
            }
        }
        for cfg in &self.cfg.storage_leases {
            let Some(cache) = self.storage_leases.get(&cfg.namespace) else {
                continue;
            };
            let Some(leases) = cache.if_current() else {
                continue;
            };
            let (prefix, suffix) = cfg.name.split_once("{node}").unwrap_or((&cfg.name, ""));
            for l in leases {
                let Some(name) = l.metadata.name.as_deref() else {
                    continue;
                };
                let Some(node) = name
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.strip_suffix(suffix))
                    .filter(|n| !n.is_empty())
                else {
                    continue;
                };
                let Some(w) = witness(&l, |n, m| cache.arrived(n, m)) else {
                    continue;
                };
                let id = maintd_core::fencing::opinion::lease_witness(&cfg.namespace, name);
                out.insert((node.to_string(), id), w);
            }
        }
        out
    }
}
