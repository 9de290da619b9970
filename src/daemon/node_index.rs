//! The nodes `/1/nodes` lists, indexed by name and by state, built once per change of the poll
//! records or of the membership: a filtered or paged request picks what it returns instead of
//! reading and building every node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::http::ApiError;
use crate::node::NodeConfig;
use crate::store::{NodeRow, Store};
use crate::sync::LockExt;

/// The members in name order, each with its poll record, and the members of each state.
pub(super) struct NodeIndex {
    members: Arc<Vec<NodeConfig>>,
    rows: HashMap<String, NodeRow>,
    /// Positions in `members`, in name order: every member, the reachable ones, the others
    /// (a member the poll has no record of yet is unreachable).
    all: Vec<usize>,
    reachable: Vec<usize>,
    unreachable: Vec<usize>,
}

impl NodeIndex {
    fn new(members: Arc<Vec<NodeConfig>>, rows: Vec<NodeRow>) -> NodeIndex {
        let rows: HashMap<String, NodeRow> =
            rows.into_iter().map(|r| (r.name.clone(), r)).collect();
        let mut all: Vec<usize> = (0..members.len()).collect();
        all.sort_by(|&a, &b| members[a].name.cmp(&members[b].name));
        let (reachable, unreachable) = all
            .iter()
            .partition(|&&i| rows.get(&members[i].name).is_some_and(|r| r.reachable));
        NodeIndex {
            members,
            rows,
            all,
            reachable,
            unreachable,
        }
    }

    /// The members `status` (`reachable`, `unreachable` or every one) and `node` pick, in name
    /// order, from just after `after`, at most `take`: found by binary search, never by
    /// looking at the members left out.
    pub(super) fn pick(
        &self,
        node: Option<&str>,
        status: Option<&str>,
        after: Option<&str>,
        take: usize,
    ) -> Vec<(&NodeConfig, Option<&NodeRow>)> {
        let of_state = match status {
            Some("reachable") => &self.reachable,
            Some("unreachable") => &self.unreachable,
            _ => &self.all,
        };
        let name = |i: &usize| self.members[*i].name.as_str();
        let mut from = after.map_or(0, |a| of_state.partition_point(|i| name(i) <= a));
        let mut to = of_state.len();
        if let Some(n) = node {
            from = from.max(of_state.partition_point(|i| name(i) < n));
            to = to.min(of_state.partition_point(|i| name(i) <= n));
        }
        of_state[from..to.max(from)]
            .iter()
            .take(take)
            .map(|&i| {
                let m = &self.members[i];
                (m, self.rows.get(&m.name))
            })
            .collect()
    }
}

/// The index as last built, for the store's count of node changes and the membership it read;
/// one build at a time, so that readers arriving together after a change wait for one read of
/// every node's row instead of each making their own.
#[derive(Default)]
pub struct NodeIndexCache {
    kept: Mutex<Option<(u64, Arc<NodeIndex>)>>,
    building: tokio::sync::Mutex<()>,
}

impl NodeIndexCache {
    /// The index of `members` and the poll records as they are now: kept while neither
    /// changed, else read again on a thread of the blocking pool (the rows of every node).
    pub(super) async fn get(
        &self,
        store: &Arc<Store>,
        members: Arc<Vec<NodeConfig>>,
    ) -> Result<Arc<NodeIndex>, ApiError> {
        let current = |generation: u64| {
            self.kept
                .lock_unpoisoned()
                .as_ref()
                .filter(|(g, index)| *g == generation && Arc::ptr_eq(&index.members, &members))
                .map(|(_, index)| index.clone())
        };
        // Read before the rows: a change while reading leaves the old count, so the next
        // request reads again.
        if let Some(index) = current(store.changes().now().nodes) {
            return Ok(index);
        }
        let _one = self.building.lock().await;
        let generation = store.changes().now().nodes;
        if let Some(index) = current(generation) {
            return Ok(index);
        }
        let reader = store.clone();
        let index = tokio::task::spawn_blocking(move || {
            reader
                .nodes()
                .map(|rows| Arc::new(NodeIndex::new(members, rows)))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        // As every handler says a database error: the database named, then what failed.
        .map_err(|e| ApiError::internal(format!("{}: {e}", store.path())))?;
        *self.kept.lock_unpoisoned() = Some((generation, index.clone()));
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> NodeConfig {
        NodeConfig {
            name: name.into(),
            collector: format!("{name}:1815"),
        }
    }

    fn row(name: &str, reachable: bool) -> NodeRow {
        NodeRow {
            name: name.into(),
            reachable,
            last_answer_ns: None,
            unreachable_since_ns: None,
            last_error: None,
            last_seq: None,
            last_report: None,
            diagnosed_ns: None,
            diagnose_error: None,
            rejected: 0,
            last_rejection: None,
            boot_id: None,
            booted_ns: None,
        }
    }

    fn names(p: &[(&NodeConfig, Option<&NodeRow>)]) -> Vec<String> {
        p.iter().map(|(m, _)| m.name.clone()).collect()
    }

    #[test]
    fn a_pick_is_the_filtered_sorted_list_cut_at_the_cursor_and_limit() {
        let members: Vec<NodeConfig> = ["n3", "n1", "n5", "n2", "n4", "n0"]
            .iter()
            .map(|n| member(n))
            .collect();
        // n0 has no record yet: unreachable, as the page shows it.
        let rows = vec![
            row("n1", true),
            row("n2", false),
            row("n3", true),
            row("n4", true),
            row("n5", false),
        ];
        let ix = NodeIndex::new(Arc::new(members), rows);
        let all = names(&ix.pick(None, None, None, usize::MAX));
        assert_eq!(all, ["n0", "n1", "n2", "n3", "n4", "n5"]);
        // Every combination agrees with filtering the whole sorted list.
        let states = [None, Some("reachable"), Some("unreachable")];
        let nodes = [None, Some("n0"), Some("n3"), Some("n9"), Some("")];
        let afters = [
            None,
            Some(""),
            Some("n1"),
            Some("n25"),
            Some("n5"),
            Some("z"),
        ];
        for status in states {
            for node in nodes {
                for after in afters {
                    for take in [0, 1, 2, usize::MAX] {
                        let want: Vec<String> = ix
                            .pick(None, None, None, usize::MAX)
                            .into_iter()
                            .filter(|(_, r)| {
                                let reachable = r.is_some_and(|r| r.reachable);
                                match status {
                                    Some("reachable") => reachable,
                                    Some("unreachable") => !reachable,
                                    _ => true,
                                }
                            })
                            .filter(|(m, _)| node.is_none_or(|n| m.name == n))
                            .filter(|(m, _)| after.is_none_or(|a| m.name.as_str() > a))
                            .take(take)
                            .map(|(m, _)| m.name.clone())
                            .collect();
                        let got = names(&ix.pick(node, status, after, take));
                        assert_eq!(got, want, "{status:?} {node:?} {after:?} {take}");
                    }
                }
            }
        }
        let picked = ix.pick(Some("n2"), None, None, 5);
        assert_eq!(picked[0].1.map(|r| r.reachable), Some(false));
        assert!(ix.pick(Some("n0"), None, None, 5)[0].1.is_none());
    }

    /// The index is read once per counted change of the polls or of the membership: readers
    /// in between share it, and each change is seen by the next reader.
    #[tokio::test]
    async fn the_index_is_read_again_only_after_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
        let cache = NodeIndexCache::default();
        let members = Arc::new(vec![member("a"), member("b")]);
        let first = cache.get(&store, members.clone()).await.unwrap();
        assert!(first.pick(None, Some("reachable"), None, 9).is_empty());
        let again = cache.get(&store, members.clone()).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "no change: the same index");
        let answered = crate::store::NodeUpdate {
            name: "b".into(),
            answered: true,
            error: None,
            seq: None,
            report: None,
            diagnosed_ns: None,
            diagnose_error: None,
            rejection: None,
            boot: None,
        };
        store.record_polls(&[answered], 1).unwrap();
        let polled = cache.get(&store, members.clone()).await.unwrap();
        assert_eq!(names(&polled.pick(None, Some("reachable"), None, 9)), ["b"]);
        assert_eq!(
            names(&polled.pick(None, Some("unreachable"), None, 9)),
            ["a"]
        );
        let fewer = Arc::new(vec![member("b")]);
        let now = cache.get(&store, fewer).await.unwrap();
        assert_eq!(
            names(&now.pick(None, None, None, 9)),
            ["b"],
            "a new membership"
        );
    }
}
