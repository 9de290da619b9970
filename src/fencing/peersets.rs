//! The peer sets the master hands out: who watches whom, each node's set of peers with their
//! addresses and heartbeat public keys, and the epoch that names a set's content.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::warn;

use crate::report::heartbeat::{MAX_PEERS, MAX_SAFE_INTEGER, PeerAddress, PeerSet};
use crate::report::keyring::Keyring;
use maintd_core::fencing::watchers::{assignment, watched};

/// A set's epoch: a hash of its content, so every leader derives the same number and a
/// collector holding it needs no push. Never 0 (a collector's empty set).
pub(super) fn epoch_of(
    peers: &BTreeMap<String, PeerAddress>,
    watchers: &BTreeSet<String>,
    keys: &BTreeMap<String, Vec<String>>,
) -> u64 {
    let mut h = Sha256::new();
    for (name, a) in peers {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(a.ip.to_string().as_bytes());
        h.update(a.port.to_be_bytes());
        h.update([u8::from(watchers.contains(name))]);
        // Keys are written only with a key per node: a shared-key set's epoch is unchanged.
        for k in keys.get(name).into_iter().flatten() {
            h.update(k.as_bytes());
            h.update([0]);
        }
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(b) & MAX_SAFE_INTEGER).max(1)
}

/// A collector's address as an IP and port; a host name is looked up once per membership.
pub(super) async fn resolve(collector: &str) -> Option<SocketAddr> {
    let addr = crate::node::collector_address(collector).ok()?;
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Some(sa);
    }
    let lookup = tokio::net::lookup_host(addr.clone());
    match tokio::time::timeout(Duration::from_secs(2), lookup).await {
        Ok(Ok(mut it)) => it.next(),
        _ => {
            warn!(collector = %addr, "cannot resolve a collector's address; it gets no peers");
            None
        }
    }
}

pub(super) type Built = (
    BTreeSet<String>,
    BTreeMap<String, Vec<String>>,
    BTreeMap<String, PeerSet>,
);

/// The assignment and every node's peer set: its watchers first (if a set must be cut to
/// `MAX_PEERS`, what the node is judged by is kept), then the nodes it watches.
pub(super) fn build(
    names: BTreeSet<String>,
    addrs: &BTreeMap<String, PeerAddress>,
    k: usize,
    keys: &Keyring,
) -> Built {
    // `None` in the shared-key configuration: sets then carry no keys.
    let all_keys: BTreeMap<String, Vec<String>> = names
        .iter()
        .filter_map(|n| Some((n.clone(), keys.heartbeat_keys(n)?)))
        .collect();
    let watchers = assignment(&names, k);
    let watching = watched(&watchers);
    let mut sets = BTreeMap::new();
    for n in &names {
        let mut peers = BTreeMap::new();
        let mine = watchers.get(n).map(Vec::as_slice).unwrap_or_default();
        for p in mine.iter().chain(watching.get(n).into_iter().flatten()) {
            if peers.len() >= MAX_PEERS {
                warn!(node = %n, "peer set cut to {MAX_PEERS}");
                break;
            }
            if let Some(a) = addrs.get(p) {
                peers.insert(p.clone(), *a);
            }
        }
        let mine: BTreeSet<String> = mine
            .iter()
            .filter(|w| peers.contains_key(*w))
            .cloned()
            .collect();
        let keys: BTreeMap<String, Vec<String>> = peers
            .keys()
            .filter_map(|p| Some((p.clone(), all_keys.get(p)?.clone())))
            .collect();
        let epoch = epoch_of(&peers, &mine, &keys);
        sets.insert(
            n.clone(),
            PeerSet {
                epoch,
                peers,
                watchers: mine,
                keys,
            },
        );
    }
    (names, watchers, sets)
}
