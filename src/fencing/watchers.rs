//! Who watches whom (issue 13): every node is watched by `k` peers chosen by rendezvous
//! hashing, so the choice is deterministic (every party computes the same sets from the same
//! membership), spreads evenly, and moves few assignments when membership changes: a node that
//! joins takes over only the watch slots it now wins, and a node that leaves hands each of its
//! slots to one successor. Each node sends O(k) heartbeats and watches O(k) nodes on average,
//! whatever the size of the cluster. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

/// The default number of watchers per node.
pub const DEFAULT_WATCHERS: usize = 8;

/// How strongly `watcher` is drawn to watch `node`; the `k` highest win.
fn score(node: &str, watcher: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(node.len().to_le_bytes());
    h.update(node.as_bytes());
    h.update(watcher.as_bytes());
    h.finalize().into()
}

/// The peers that watch `node`: the `k` members (not `node` itself) with the highest score,
/// best first. In a cluster of at most `k + 1` nodes every node watches every other.
pub fn watchers_of<'a>(node: &str, members: &'a BTreeSet<String>, k: usize) -> Vec<&'a str> {
    let mut scored: Vec<([u8; 32], &str)> = members
        .iter()
        .filter(|m| m.as_str() != node)
        .map(|m| (score(node, m), m.as_str()))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().take(k).map(|(_, m)| m).collect()
}

/// The whole assignment: node -> its watchers.
pub fn assignment(members: &BTreeSet<String>, k: usize) -> BTreeMap<String, Vec<String>> {
    members
        .iter()
        .map(|n| {
            let w = watchers_of(n, members, k)
                .into_iter()
                .map(String::from)
                .collect();
            (n.clone(), w)
        })
        .collect()
}

/// The nodes `me` watches under an assignment.
pub fn watched_by(assignment: &BTreeMap<String, Vec<String>>, me: &str) -> Vec<String> {
    assignment
        .iter()
        .filter(|(_, w)| w.iter().any(|x| x == me))
        .map(|(n, _)| n.clone())
        .collect()
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
        let mine = watched_by(&a, "node7");
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
