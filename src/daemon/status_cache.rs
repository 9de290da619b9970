//! The repair events and fence flows `/1/status` shows, built once per change of the store and
//! kept until the next: a crowd of readers costs one build, not one each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::{FlowStore, Store, StoreError};
use crate::sync::LockExt;
use crate::views;

/// A sort key that orders by time, then id, as text: times are shifted to be non-negative and
/// padded, so that the cursor (the last key shown) compares as the items do.
pub(super) fn time_key(t: i64, id: &uuid::Uuid) -> String {
    format!("{:020}.{id}", (t as u64) ^ (1 << 63))
}

/// One repair event, built, with what the filters look at.
pub(super) struct Built {
    pub(super) key: String,
    pub(super) node: String,
    pub(super) status: &'static str,
    pub(super) action: &'static str,
    pub(super) updated: i64,
    pub(super) json: Arc<[u8]>,
}

/// Built repair events, with where each node's and each status's are among them.
pub(super) struct BuiltEvents {
    all: Vec<Built>,
    /// A node's positions in `all`, in order: one node's events out of ten thousand are
    /// picked, not found by comparing every event's node.
    by_node: HashMap<String, Vec<usize>>,
    /// Likewise a repair status's (the few failed events among thousands completed).
    by_status: HashMap<&'static str, Vec<usize>>,
}

impl BuiltEvents {
    fn new(all: Vec<Built>) -> BuiltEvents {
        let mut by_node: HashMap<String, Vec<usize>> = HashMap::new();
        let mut by_status: HashMap<&'static str, Vec<usize>> = HashMap::new();
        for (i, b) in all.iter().enumerate() {
            by_node.entry(b.node.clone()).or_default().push(i);
            by_status.entry(b.status).or_default().push(i);
        }
        BuiltEvents {
            all,
            by_node,
            by_status,
        }
    }

    /// Every event, or only `node`'s, or only those in `status`, in order: the smaller of the
    /// two indexes is walked (the caller still checks every filter).
    pub(super) fn of<'a>(
        &'a self,
        node: Option<&str>,
        status: Option<&str>,
    ) -> impl Iterator<Item = &'a Built> + 'a {
        let of_node = node.map(|n| self.by_node.get(n).map_or(&[][..], Vec::as_slice));
        let of_status = status.map(|s| self.by_status.get(s).map_or(&[][..], Vec::as_slice));
        let picked = match (of_node, of_status) {
            (Some(a), Some(b)) => Some(if a.len() <= b.len() { a } else { b }),
            (a, b) => a.or(b),
        };
        let (all, some) = match picked {
            None => (Some(self.all.iter()), None),
            Some(ix) => (None, Some(ix.iter().map(|&i| &self.all[i]))),
        };
        all.into_iter().flatten().chain(some.into_iter().flatten())
    }
}

/// The repair events as last built, and the store's count of event changes they reflect; and
/// likewise the fence flows shown beside them, where this daemon is their only writer.
#[derive(Default)]
pub struct StatusCache {
    events: Mutex<Option<(u64, Arc<BuiltEvents>)>>,
    flows: Mutex<Option<(u64, Arc<[Built]>)>>,
}

impl StatusCache {
    /// The events, all of them or only `node`'s. One node's are read afresh when the cache
    /// is stale rather than rebuilding it: a watcher of one node sees a change at the cost of
    /// that node's events, not of all of them.
    pub(super) fn get(
        &self,
        store: &Store,
        node: Option<&str>,
    ) -> Result<Arc<BuiltEvents>, StoreError> {
        // Read before the rows: a change while building leaves the old count, so the next
        // request builds again.
        let generation = store.changes().now().events;
        if let Some((g, built)) = self.events.lock_unpoisoned().as_ref()
            && *g == generation
        {
            return Ok(built.clone());
        }
        if node.is_some() {
            return Ok(Arc::new(Self::build(store, node)?));
        }
        let built = Arc::new(Self::build(store, None)?);
        *self.events.lock_unpoisoned() = Some((generation, built.clone()));
        Ok(built)
    }

    /// The fence flows to show, built. Every write of this daemon's flows is counted as an event
    /// change, so they are kept until the count moves; flows other replicas write (cluster
    /// objects) are read afresh each time.
    pub(super) async fn flows(
        &self,
        flows: &dyn FlowStore,
        store: &Store,
    ) -> Result<Arc<[Built]>, StoreError> {
        let shared = flows.shared();
        let generation = store.changes().now().events;
        if !shared
            && let Some((g, built)) = self.flows.lock_unpoisoned().as_ref()
            && *g == generation
        {
            return Ok(built.clone());
        }
        let flows = flows.shown(i64::MAX).await?;
        let built: Arc<[Built]> = flows
            .iter()
            .map(|f| {
                let v = views::Event::of_flow(f);
                Built {
                    key: time_key(v.created, &v.id),
                    status: v.repair_status.as_str(),
                    action: v.action.as_str(),
                    updated: v.updated,
                    json: serde_json::to_vec(&v).expect("a view serializes").into(),
                    node: v.node,
                }
            })
            .collect();
        if !shared {
            *self.flows.lock_unpoisoned() = Some((generation, built.clone()));
        }
        Ok(built)
    }

    fn build(store: &Store, node: Option<&str>) -> Result<BuiltEvents, StoreError> {
        let events = store.events_with_jobs(node)?;
        let built: Vec<Built> = events
            .iter()
            .map(|(e, j)| {
                let v = views::Event::of_repair(e, j);
                Built {
                    key: time_key(v.created, &v.id),
                    node: v.node.clone(),
                    status: v.repair_status.as_str(),
                    action: v.action.as_str(),
                    updated: v.updated,
                    json: serde_json::to_vec(&v).expect("a view serializes").into(),
                }
            })
            .collect();
        Ok(BuiltEvents::new(built))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever index is walked, the events picked are those of the whole list that pass the
    /// node and status filters, in the list's order.
    #[test]
    fn the_indexes_pick_what_filtering_every_event_would() {
        let statuses = ["pending", "failed", "completed"];
        let all: Vec<Built> = (0..60)
            .map(|i| Built {
                key: format!("{i:03}"),
                node: format!("n{}", i % 7),
                status: statuses[(i * i) % 3],
                action: "evacuate",
                updated: i as i64,
                json: Arc::from(&b"{}"[..]),
            })
            .collect();
        let b = BuiltEvents::new(all);
        for node in [None, Some("n0"), Some("n3"), Some("n9")] {
            for status in [None, Some("pending"), Some("failed"), Some("noted")] {
                let want: Vec<&str> = b
                    .all
                    .iter()
                    .filter(|e| node.is_none_or(|n| e.node == n))
                    .filter(|e| status.is_none_or(|s| e.status == s))
                    .map(|e| e.key.as_str())
                    .collect();
                let got: Vec<&str> = b
                    .of(node, status)
                    .filter(|e| node.is_none_or(|n| e.node == n))
                    .filter(|e| status.is_none_or(|s| e.status == s))
                    .map(|e| e.key.as_str())
                    .collect();
                assert_eq!(got, want, "{node:?} {status:?}");
            }
        }
        // The smaller index is walked: one node's events in one status.
        assert!(b.of(Some("n3"), Some("failed")).count() <= b.by_node["n3"].len());
    }
}
