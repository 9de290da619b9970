//! The three lists of the API (`/1/status`, `/1/nodes`, `/1/fences`) with their filters, pages
//! and watches, and the built repair events kept until the store counts a change: a dump of
//! ten thousand events is then a copy, not ten thousand rows read and serialized again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Extension, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::api::{ApiState, S, db_error, flows_error, internal};
use super::listing::{self, Item, ListQuery, Page, Watches, one_of};
use crate::http::ApiError;
use crate::http::listener::ConnActivity;
use crate::node::collector_address;
use crate::store::Store;
use crate::sync::LockExt;
use crate::views;

const REPAIR_STATUSES: [&str; 5] = ["noted", "pending", "canceled", "failed", "completed"];
const ACTIONS: [&str; 5] = [
    "Ok",
    "live-repair",
    "evacuate",
    "evacuate-failover",
    "fence",
];
const FENCE_STATUSES: [&str; 5] = ["new", "running", "done", "error", "final"];
const NODE_STATES: [&str; 2] = ["reachable", "unreachable"];

/// A sort key that orders by time, then id, as text: times are shifted to be non-negative and
/// padded, so that the cursor (the last key shown) compares as the items do.
fn time_key(t: i64, id: &uuid::Uuid) -> String {
    format!("{:020}.{id}", (t as u64) ^ (1 << 63))
}

/// One repair event, built, with what the filters look at.
struct Built {
    key: String,
    node: String,
    status: &'static str,
    action: &'static str,
    updated: i64,
    json: Arc<[u8]>,
}

/// Built repair events, with where each node's are among them.
struct BuiltEvents {
    all: Vec<Built>,
    /// A node's positions in `all`, in order: one node's events out of ten thousand are
    /// picked, not found by comparing every event's node.
    by_node: HashMap<String, Vec<usize>>,
}

impl BuiltEvents {
    fn new(all: Vec<Built>) -> BuiltEvents {
        let mut by_node: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, b) in all.iter().enumerate() {
            by_node.entry(b.node.clone()).or_default().push(i);
        }
        BuiltEvents { all, by_node }
    }

    /// Every event, or only `node`'s, in order.
    fn of<'a>(&'a self, node: Option<&str>) -> impl Iterator<Item = &'a Built> + 'a {
        let picked = node.map(|n| self.by_node.get(n).map_or(&[][..], Vec::as_slice));
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
    fn get(&self, store: &Store, node: Option<&str>) -> Result<Arc<BuiltEvents>, ApiError> {
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
    async fn flows(&self, s: &ApiState) -> Result<Arc<[Built]>, ApiError> {
        let shared = s.flows.shared();
        let generation = s.store.changes().now().events;
        if !shared
            && let Some((g, built)) = self.flows.lock_unpoisoned().as_ref()
            && *g == generation
        {
            return Ok(built.clone());
        }
        let flows = s
            .flows
            .shown(i64::MAX)
            .await
            .map_err(|e| flows_error(s, e))?;
        let built: Arc<[Built]> = flows
            .iter()
            .map(|f| {
                let v = views::Event::of_flow(f);
                Ok(Built {
                    key: time_key(v.created, &v.id),
                    status: v.repair_status.as_str(),
                    action: v.action.as_str(),
                    updated: v.updated,
                    json: serde_json::to_vec(&v).map_err(internal)?.into(),
                    node: v.node,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        if !shared {
            *self.flows.lock_unpoisoned() = Some((generation, built.clone()));
        }
        Ok(built)
    }

    fn build(store: &Store, node: Option<&str>) -> Result<BuiltEvents, ApiError> {
        let events = store
            .events_with_jobs(node)
            .map_err(|e| db_error(store, e))?;
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

pub(super) async fn status(
    State(s): S,
    conn: Option<Extension<ConnActivity>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    q.check(&[])?;
    one_of("status", q.status.as_deref(), &REPAIR_STATUSES)?;
    one_of("action", q.action.as_deref(), &ACTIONS)?;
    listing::answer(
        &s.builders,
        s.store.changes(),
        Watches::Events,
        conn.as_deref(),
        &headers,
        &q,
        || status_page(&s, &q),
    )
    .await
}

async fn status_page(s: &ApiState, q: &ListQuery) -> Result<Page, ApiError> {
    let built = s.status_cache.get(&s.store, q.node.as_deref())?;
    let mut items: Vec<Item> = built
        .of(q.node.as_deref())
        .filter(|e| q.event_ok(&e.node, e.status, e.action, e.updated))
        .map(|e| Item {
            key: e.key.clone(),
            json: e.json.clone(),
        })
        .collect();
    // Fence flows are events too, until they are final.
    let flows = s.status_cache.flows(s).await?;
    items.extend(
        flows
            .iter()
            .filter(|f| q.event_ok(&f.node, f.status, f.action, f.updated))
            .map(|f| Item {
                key: f.key.clone(),
                json: f.json.clone(),
            }),
    );
    listing::page(items, q)
}

pub(super) async fn fences(
    State(s): S,
    conn: Option<Extension<ConnActivity>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    q.check(&["action"])?;
    one_of("status", q.status.as_deref(), &FENCE_STATUSES)?;
    listing::answer(
        &s.builders,
        s.store.changes(),
        Watches::Events,
        conn.as_deref(),
        &headers,
        &q,
        || async {
            let flows = s
                .flows
                .recent(usize::MAX)
                .await
                .map_err(|e| flows_error(&s, e))?;
            let mut items = Vec::new();
            for f in flows.iter().filter(|f| {
                q.node_ok(&f.node) && q.status_ok(f.status.as_str()) && q.since_ok(f.updated)
            }) {
                // Newest first, as before paging: the key runs backwards in time.
                items.push(Item {
                    key: time_key(!f.created, &f.id),
                    json: serde_json::to_vec(&views::Fence::of(f, crate::clock::wall_step_ns()))
                        .map_err(internal)?
                        .into(),
                });
            }
            listing::page(items, &q)
        },
    )
    .await
}

pub(super) async fn nodes(
    State(s): S,
    conn: Option<Extension<ConnActivity>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    q.check(&["action", "since"])?;
    one_of("status", q.status.as_deref(), &NODE_STATES)?;
    listing::answer(
        &s.builders,
        s.store.changes(),
        Watches::Nodes,
        conn.as_deref(),
        &headers,
        &q,
        || nodes_page(&s, &q),
    )
    .await
}

async fn nodes_page(s: &ApiState, q: &ListQuery) -> Result<Page, ApiError> {
    let rows = s.store.nodes().map_err(|e| db_error(&s.store, e))?;
    let rows: HashMap<&str, &crate::store::NodeRow> =
        rows.iter().map(|r| (r.name.as_str(), r)).collect();
    let offline = s.cluster.jobs.offline_nodes().await.map_err(internal)?;
    let mut tags = s.cluster.jobs.tags().await.map_err(internal)?;
    let heard = s.heard.all();
    let now = crate::clock::steady_ns();
    let maintenance = super::maintenance::operators(s)?;
    let mut items = Vec::new();
    for n in s.members.get().iter().filter(|n| q.node_ok(&n.name)) {
        let row = rows.get(n.name.as_str()).copied();
        let reachable = row.is_some_and(|r| r.reachable);
        if !q.status_ok(if reachable {
            "reachable"
        } else {
            "unreachable"
        }) {
            continue;
        }
        let node_tags = tags.remove(&n.name).unwrap_or_default();
        let in_maintenance = maintenance
            .get(&n.name)
            .cloned()
            .or_else(|| maintd_core::fencing::machine::awaiting_ack(&node_tags));
        let mut v = views::Node::new(
            &n.name,
            collector_address(&n.collector).unwrap_or_default(),
            row,
            offline.contains(&n.name),
            node_tags,
            s.readiness.as_ref().and_then(|b| b.get(&n.name)),
        );
        v.maintenance = in_maintenance;
        v.witnesses = s.peering.as_ref().map(|p| p.witnesses(&n.name, now));
        v.clock_offset_ms = s
            .peering
            .as_ref()
            .and_then(|p| p.clock_offset(&n.name))
            .map(|o| o / 1_000_000);
        if row.is_some() {
            v.heard(heard.get(&n.name), s.seqs.get(&n.name));
        }
        items.push(Item {
            key: n.name.clone(),
            json: serde_json::to_vec(&v).map_err(internal)?.into(),
        });
    }
    listing::page(items, q)
}
