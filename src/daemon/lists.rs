//! The three lists of the API (`/1/status`, `/1/nodes`, `/1/fences`) with their filters, pages
//! and watches, and the built repair events kept until the store counts a change: a dump of
//! ten thousand events is then a copy, not ten thousand rows read and serialized again.

use std::collections::HashMap;

use axum::extract::{Extension, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::api_state::{ApiState, S, db_error, flows_error, internal};
use super::listing::{self, Item, ListQuery, Page, Watches, one_of};
use super::status_cache::time_key;
use crate::http::ApiError;
use crate::http::listener::ConnActivity;
use crate::node::collector_address;
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
        s.lists(),
        "status",
        Watches::Events,
        conn.as_deref(),
        &headers,
        &q,
        || status_page(&s, &q),
    )
    .await
}

async fn status_page(s: &ApiState, q: &ListQuery) -> Result<Page, ApiError> {
    let built = s
        .status_cache
        .get(&s.store, q.node.as_deref())
        .map_err(|e| db_error(&s.store, e))?;
    let mut items: Vec<Item> = built
        .of(q.node.as_deref())
        .filter(|e| q.event_ok(&e.node, e.status, e.action, e.updated))
        .map(|e| Item {
            key: e.key.clone(),
            json: e.json.clone(),
        })
        .collect();
    // Fence flows are events too, until they are final.
    let flows = s
        .status_cache
        .flows(s.flows.as_ref(), &s.store)
        .await
        .map_err(|e| flows_error(s, e))?;
    items.extend(
        flows
            .iter()
            .filter(|f| q.event_ok(&f.node, f.status, f.action, f.updated))
            .map(|f| Item {
                key: f.key.clone(),
                json: f.json.clone(),
            }),
    );
    listing::page_apart(items, q).await
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
        s.lists(),
        "fences",
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
            let step = crate::clock::wall_step_ns();
            let shown = flows
                .iter()
                .filter(|f| {
                    q.node_ok(&f.node) && q.status_ok(f.status.as_str()) && q.since_ok(f.updated)
                })
                // Newest first, as before paging: the key runs backwards in time.
                .map(|f| (time_key(!f.created, &f.id), views::Fence::of(f, step)))
                .collect();
            listing::page_of(shown, &q).await
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
        s.lists(),
        "nodes",
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
        items.push((n.name.clone(), v));
    }
    listing::page_of(items, q).await
}
