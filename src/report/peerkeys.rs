//! What a collector accepts each peer's heartbeats under: the keys a pushed set names (tidied
//! as the set is installed), and the rule that checks a heartbeat against them.

use std::collections::BTreeMap;

use super::Key;
use super::heartbeat::{Heartbeat, PeerSet};
use super::nodekey::{CLUSTER_KEY_ENTRY, HeartbeatPublic};

/// What one peer's heartbeats are accepted under, as a pushed set says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerKeys {
    pub cluster: bool,
    pub publics: Vec<HeartbeatPublic>,
}

impl PeerSet {
    /// The keys of each peer, decoded (the set was checked on install).
    pub fn peer_keys(&self) -> BTreeMap<String, PeerKeys> {
        self.keys
            .iter()
            .map(|(name, entries)| {
                let mut k = PeerKeys::default();
                for e in entries {
                    if e == CLUSTER_KEY_ENTRY {
                        k.cluster = true;
                    } else if let Some(p) = HeartbeatPublic::decode(e) {
                        k.publics.push(p);
                    }
                }
                (name.clone(), k)
            })
            .collect()
    }

    /// Drops the keys of nodes that are not among the peers (as watchers are), and says so;
    /// says too which peers' keys are no valid Ed25519 point. Those verify nothing: the set is
    /// the master's, signed, so such a key is its mistake, never taken for another.
    pub fn tidy_keys(&mut self) {
        let before = self.keys.len();
        let peers = &self.peers;
        self.keys.retain(|n, _| peers.contains_key(n));
        if self.keys.len() < before {
            tracing::warn!(
                dropped = before - self.keys.len(),
                "heartbeat keys of nodes that are not among the peers are ignored"
            );
        }
        for (peer, entries) in &self.keys {
            let bad = entries
                .iter()
                .filter(|e| *e != CLUSTER_KEY_ENTRY && HeartbeatPublic::decode(e).is_none())
                .count();
            if bad > 0 {
                tracing::warn!(%peer, bad, "heartbeat public keys that are not valid Ed25519 keys verify nothing");
            }
        }
    }
}

/// Whether `hb` is signed as its sender may sign, given what this node holds and the keys a
/// pushed set gave: a set with keys names them for each peer (none for a revoked one); a set
/// without keys (the shared-key configuration) accepts the cluster key.
pub fn heartbeat_signed(
    hb: &Heartbeat,
    keys: &BTreeMap<String, PeerKeys>,
    cluster: Option<&Key>,
) -> bool {
    let by_cluster = || cluster.is_some_and(|k| hb.cluster_signed(k));
    if keys.is_empty() {
        return by_cluster();
    }
    match keys.get(&hb.from) {
        Some(k) => k.publics.iter().any(|p| hb.signed_by(p)) || (k.cluster && by_cluster()),
        None => false,
    }
}
