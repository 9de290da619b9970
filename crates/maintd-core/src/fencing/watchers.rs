//! Who watches whom: every node is watched by `k` peers chosen by rendezvous
//! hashing, so the choice is deterministic (every party computes the same sets from the same
//! membership), spreads evenly, and moves few assignments when membership changes: a node that
//! joins takes over only the watch slots it now wins, and a node that leaves hands each of its
//! slots to one successor. Each node sends O(k) heartbeats and watches O(k) nodes on average,
//! whatever the size of the cluster. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

/// The default number of watchers per node.
pub const DEFAULT_WATCHERS: usize = 8;

/// A name's stable 64-bit digest (SHA-256, so every version of maintd computes the same).
fn digest(name: &str) -> u64 {
    let d = Sha256::digest(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// MurmurHash3's 64-bit finalizer: every input bit flips each output bit with even odds.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// How strongly a watcher is drawn to watch a node, from their digests; the `k` highest win.
/// Hashing each name once and mixing the pair keeps a 5,000-node assignment (25 million pairs)
/// to a fraction of a second, where hashing every pair took seconds.
fn score(node: u64, watcher: u64) -> u64 {
    mix(node ^ mix(watcher ^ 0x9e37_79b9_7f4a_7c15))
}

/// The `k` best of `candidates` (digest, name) for the node with digest `node`, best first;
/// ties, which need two names with equal digests, go to the smaller name.
fn top_k<'a>(node: u64, me: &str, candidates: &[(u64, &'a str)], k: usize) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = candidates
        .iter()
        .filter(|(_, m)| *m != me)
        .map(|(d, m)| (score(node, *d), *m))
        .collect();
    let order = |a: &(u64, &str), b: &(u64, &str)| b.0.cmp(&a.0).then(a.1.cmp(b.1));
    if scored.len() > k {
        scored.select_nth_unstable_by(k, order);
        scored.truncate(k);
    }
    scored.sort_unstable_by(order);
    scored.into_iter().map(|(_, m)| m).collect()
}

/// The peers that watch `node`: the `k` members (not `node` itself) with the highest score,
/// best first. In a cluster of at most `k + 1` nodes every node watches every other.
#[cfg(test)]
fn watchers_of<'a>(node: &str, members: &'a BTreeSet<String>, k: usize) -> Vec<&'a str> {
    let candidates: Vec<(u64, &str)> = members.iter().map(|m| (digest(m), m.as_str())).collect();
    top_k(digest(node), node, &candidates, k)
}

/// The whole assignment: node -> its watchers.
pub fn assignment(members: &BTreeSet<String>, k: usize) -> BTreeMap<String, Vec<String>> {
    let candidates: Vec<(u64, &str)> = members.iter().map(|m| (digest(m), m.as_str())).collect();
    candidates
        .iter()
        .map(|(d, n)| {
            let w = top_k(*d, n, &candidates, k)
                .into_iter()
                .map(String::from)
                .collect();
            (n.to_string(), w)
        })
        .collect()
}

/// Who watches what under an assignment: watcher -> the nodes it watches (one pass, where
/// asking per node would scan the whole assignment each time).
pub fn watched(assignment: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, ws) in assignment {
        for w in ws {
            out.entry(w.clone()).or_default().push(node.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn members(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("node{i}")).collect()
    }

    fn pairs(a: &BTreeMap<String, Vec<String>>) -> BTreeSet<(String, String)> {
        a.iter()
            .flat_map(|(n, ws)| ws.iter().map(move |w| (n.clone(), w.clone())))
            .collect()
    }

    #[test]
    fn a_small_cluster_watches_everyone_and_nobody_watches_itself() {
        let m = members(5);
        let a = assignment(&m, DEFAULT_WATCHERS);
        for (n, ws) in &a {
            assert_eq!(ws.len(), 4, "{n}: {ws:?}");
            assert!(!ws.contains(n));
        }
        assert!(assignment(&members(1), 8)["node0"].is_empty());
    }

    #[test]
    fn the_load_spreads_evenly_in_a_large_cluster() {
        let m = members(800);
        let a = assignment(&m, 8);
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for ws in a.values() {
            assert_eq!(ws.len(), 8);
            for w in ws {
                *load.entry(w.as_str()).or_default() += 1;
            }
        }
        // Each node watches 8 on average; none is overloaded.
        let max = load.values().max().copied().unwrap_or(0);
        assert!(max <= 24, "a node watches {max} others");
    }

    #[test]
    fn every_party_computes_the_same_sets() {
        let m = members(50);
        let a = assignment(&m, 8);
        let mine = watched(&a).remove("node7").unwrap_or_default();
        for n in &mine {
            assert!(watchers_of(n, &m, 8).contains(&"node7"));
        }
    }

    proptest! {
        // Each case hashes every pair three times: few cases of moderate size keep it quick.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn membership_changes_move_few_assignments(n in 12usize..120, k in 1usize..10, pick in any::<prop::sample::Index>()) {
            let m = members(n);
            let before = pairs(&assignment(&m, k));
            // A node joins: it takes only slots it wins; no other pair changes.
            let mut joined = m.clone();
            joined.insert("newcomer".into());
            let after = pairs(&assignment(&joined, k));
            let lost: Vec<_> = before.difference(&after).collect();
            let gained: Vec<_> = after.difference(&before).collect();
            prop_assert!(lost.len() <= gained.len());
            prop_assert!(gained.iter().all(|(node, w)| node == "newcomer" || w == "newcomer"));
            // A node leaves: only its own pairs go, and each node it watched gets one successor.
            let gone = m.iter().nth(pick.index(n)).unwrap().clone();
            let mut left = m.clone();
            left.remove(&gone);
            let after = pairs(&assignment(&left, k));
            for (node, w) in before.difference(&after) {
                prop_assert!(node == &gone || w == &gone);
            }
            for (node, w) in after.difference(&before) {
                prop_assert!(node != &gone && w != &gone);
                prop_assert!(before.contains(&(node.clone(), gone.clone())));
            }
        }
    }
}
