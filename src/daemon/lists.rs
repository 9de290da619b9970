//! The three lists of the API (`/1/status`, `/1/nodes`, `/1/fences`) with their filters, pages
//! and watches, and the built repair events kept until the store counts a change: a dump of
//! ten thousand events is then a copy, not ten thousand rows read and serialized again.

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
        .of(q.node.as_deref(), q.status.as_deref())
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

/// The nodes the query picks, from the index: a filter or a page that shows few nodes reads
/// and builds only those (one past the limit, so the page knows whether another follows).
async fn nodes_page(s: &ApiState, q: &ListQuery) -> Result<Page, ApiError> {
    let index = s.node_index.get(&s.store, s.members.get()).await?;
    let after = q.after()?;
    let take = q.limit.map_or(usize::MAX, |l| l.saturating_add(1));
    let picked = index.pick(
        q.node.as_deref(),
        q.status.as_deref(),
        after.as_deref(),
        take,
    );
    if picked.is_empty() {
        return listing::page(Vec::new(), q);
    }
    let offline = s.cluster.jobs.offline_nodes().await.map_err(internal)?;
    let mut tags = s.cluster.jobs.tags().await.map_err(internal)?;
    let now = crate::clock::steady_ns();
    let maintenance = super::maintenance::operators(s)?;
    let mut items = Vec::with_capacity(picked.len());
    for (n, row) in picked {
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
            v.heard(s.heard.get(&n.name).as_ref(), s.seqs.get(&n.name));
        }
        items.push((n.name.clone(), v));
    }
    listing::page_of(items, q).await
}
