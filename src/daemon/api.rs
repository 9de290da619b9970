//! The HTTP API on port 1816: status, nodes, tags and metrics for everyone; cancel and tag
//! removal only for requests signed with the cluster key.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::cluster::{Cluster, ClusterError, event_json};
use crate::config::{Config, collector_address};
use crate::http::{ApiError, SignedAuth, require_signed};
use crate::report::{Key, now_ns};
use crate::store::{CancelOutcome, Store};

pub struct ApiState<C: Cluster> {
    pub store: Arc<Store>,
    pub cluster: Arc<C>,
    pub key: Key,
    pub cfg: Arc<Config>,
    pub wake: Arc<Notify>,
    pub registry: Arc<Registry>,
}

type S<C> = State<Arc<ApiState<C>>>;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

pub fn router<C: Cluster>(state: Arc<ApiState<C>>) -> Router {
    let auth = SignedAuth {
        key: state.key.clone(),
        window_s: state.cfg.daemon.request_window.as_secs(),
    };
    let signed = Router::new()
        .route("/1/events/{id}/cancel", post(cancel::<C>))
        .route("/1/nodes/{node}/tags/{tag}", delete(remove_tag::<C>))
        .route_layer(middleware::from_fn_with_state(auth, require_signed));
    Router::new()
        .route("/", get(|| async { Json(json!([1])) }))
        .route("/1/status", get(status::<C>))
        .route("/1/status/{id}", get(one_status::<C>))
        .route("/1/nodes", get(nodes::<C>))
        .route("/1/tags", get(tags::<C>))
        .route("/metrics", get(metrics::<C>))
        .merge(signed)
        .fallback(crate::http::not_found_fallback)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
        .with_state(state)
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id)
        .map_err(|_| ApiError::bad_request(format!("{id:?} is not an event id (a uuid)")))
}

async fn status<C: Cluster>(State(s): S<C>) -> Result<Json<Vec<Value>>, ApiError> {
    let events = s.store.events_with_jobs().map_err(internal)?;
    Ok(Json(events.iter().map(|(e, j)| event_json(e, j)).collect()))
}

async fn one_status<C: Cluster>(
    State(s): S<C>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    match s.store.event(&id).map_err(internal)? {
        Some((e, jobs, None)) => Ok(Json(event_json(&e, &jobs))),
        Some((_, _, Some(why))) => Err(ApiError::not_found(format!(
            "event {id} was cleared: {why}"
        ))),
        None => Err(ApiError::not_found(format!("no event {id}"))),
    }
}

async fn nodes<C: Cluster>(State(s): S<C>) -> Result<Json<Vec<Value>>, ApiError> {
    let rows = s.store.nodes().map_err(internal)?;
    let offline = s.cluster.offline_nodes().await.map_err(internal)?;
    let tags = s.cluster.tags().await.map_err(internal)?;
    let out = s
        .cfg
        .nodes
        .iter()
        .map(|n| {
            let row = rows.iter().find(|r| r.name == n.name);
            let mut v = match row {
                Some(r) => serde_json::to_value(r).unwrap_or(Value::Null),
                None => json!({"name": n.name, "reachable": false, "rejected-reports": 0}),
            };
            v["collector"] = json!(collector_address(&n.collector).unwrap_or_default());
            v["offline"] = json!(offline.contains(&n.name));
            v["tags"] = json!(tags.get(&n.name).cloned().unwrap_or_default());
            if row.is_none() {
                v["last-error"] = json!("not polled yet");
            }
            v
        })
        .collect();
    Ok(Json(out))
}

async fn cancel<C: Cluster>(
    State(s): S<C>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    match s.store.cancel(&id, now_ns()).map_err(internal)? {
        CancelOutcome::NotFound => Err(ApiError::not_found(format!("no live event {id}"))),
        CancelOutcome::AlreadyFinal(st) => Err(ApiError::conflict(format!(
            "event {id} is already {}; it cannot be canceled",
            st.as_str()
        ))),
        CancelOutcome::Canceled => {
            tracing::info!(event = %id, "event canceled by operator");
            s.wake.notify_one();
            let (e, jobs, _) = s
                .store
                .event(&id)
                .map_err(internal)?
                .ok_or_else(|| ApiError::internal("event vanished"))?;
            Ok(Json(event_json(&e, &jobs)))
        }
    }
}

#[derive(Deserialize)]
struct TagQuery {
    node: Option<String>,
}

async fn tags<C: Cluster>(
    State(s): S<C>,
    Query(q): Query<TagQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut all = s.cluster.tags().await.map_err(internal)?;
    for n in &s.cfg.nodes {
        all.entry(n.name.clone()).or_default();
    }
    if let Some(node) = q.node {
        let t = all
            .remove(&node)
            .ok_or_else(|| ApiError::not_found(format!("unknown node {node:?}")))?;
        return Ok(Json(json!({ node: t })));
    }
    Ok(Json(json!(all)))
}

async fn remove_tag<C: Cluster>(
    State(s): S<C>,
    Path((node, tag)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    match s.cluster.remove_tag(&node, &tag).await {
        Ok(true) => {
            tracing::info!(node = %node, tag = %tag, "tag removed by operator");
            s.wake.notify_one();
            Ok(Json(json!({"node": node, "removed": tag})))
        }
        Ok(false) => Err(ApiError::not_found(format!(
            "node {node} has no tag {tag:?}"
        ))),
        Err(ClusterError::UnknownNode(n)) => {
            Err(ApiError::not_found(format!("unknown node {n:?}")))
        }
        Err(e) => Err(internal(e)),
    }
}

async fn metrics<C: Cluster>(State(s): S<C>) -> Result<impl IntoResponse, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &s.registry).map_err(internal)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}
