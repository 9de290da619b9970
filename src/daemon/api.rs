//! The HTTP API on port 1816: status, nodes, tags and metrics for everyone; cancel and tag
//! removal only for requests signed with the cluster key.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use uuid::Uuid;

use crate::cluster::ClusterError;
use crate::http::{ApiError, SignedAuth, require_signed};
use crate::report::DAEMON_TARGET;
use crate::store::{CancelOutcome, FenceCancel};
use crate::views;

pub use super::api_state::ApiState;
use super::api_state::{S, db_error, flows_error, internal, require_leader};

/// What the metrics listener serves (`daemon.metrics-listen`): `/metrics` and `/1/health`, the
/// same handlers as the API's, nothing else.
pub fn metrics_router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/1/health", get(health))
        .fallback(crate::http::not_found_fallback)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
        .with_state(state)
        .layer(middleware::map_response(crate::http::json_errors))
}

pub fn router(state: Arc<ApiState>) -> Router {
    // Every signed route of the daemon takes no body.
    let auth = SignedAuth {
        keys: Arc::new(state.key.clone()),
        nodes: Some(state.keyring.clone()),
        target: DAEMON_TARGET.into(),
        window_s: state.settings.request_window.as_secs(),
        max_body: 0,
        body_timeout: state.settings.body_timeout,
        replay: state.replay.clone(),
        refused: state.refused.clone(),
        operators: Some(state.operators.clone()),
        reads: false,
        tokens: state.tokens.clone(),
    };
    let readers = SignedAuth {
        reads: true,
        ..auth.clone()
    };
    let signed = Router::new()
        .route("/1/events/{id}/cancel", post(cancel))
        .route("/1/nodes/{node}/tags/{tag}", delete(remove_tag))
        .route("/1/nodes/{node}/reset-seq", post(reset_seq))
        .route("/1/fencing/pause", post(super::fencing_api::pause))
        .route("/1/fences/{id}/ack", post(super::fence_ack::ack))
        .route("/1/fencing/resume", post(super::fencing_api::resume))
        .route("/1/nodes/{node}/drill", post(super::fencing_api::drill))
        .route(
            "/1/nodes/{node}/maintenance",
            post(super::maintenance::start).delete(super::maintenance::stop),
        )
        // Inside the signature check: only a signed, accepted command is recorded, with its
        // signer.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            super::audit::audited,
        ))
        .route_layer(middleware::from_fn_with_state(auth, require_signed));
    let mut reads = Router::new()
        .route("/1/status", get(super::lists::status))
        .route("/1/status/{id}", get(one_status))
        .route("/1/nodes", get(super::lists::nodes))
        .route("/1/tags", get(tags))
        .route("/1/fences", get(super::lists::fences))
        .route("/1/fences/readiness", get(readiness))
        .route("/1/fences/summary", get(fencing_summary))
        .route("/1/fences/{id}", get(super::fencing_api::one))
        .route("/1/drills", get(super::fencing_api::drills))
        .route("/1/audit", get(super::audit::list))
        .route("/1/maintenance", get(super::maintenance::list))
        .route("/1/fences/{id}/timeline", get(super::fencing_api::timeline))
        .route("/1/leader", get(leader));
    if !state.settings.anonymous_read {
        reads = reads.route_layer(middleware::from_fn_with_state(readers, require_signed));
    }
    Router::new()
        .route("/", get(super::ui::root))
        .route("/1/health", get(health))
        .route("/metrics", get(metrics))
        .merge(reads)
        .merge(signed)
        .merge(super::ui::routes())
        .fallback(crate::http::not_found_fallback)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
        .with_state(state)
        .layer(middleware::map_response(crate::http::json_errors))
        // gzip for a client that asks (a dump of thousands of events shrinks tenfold).
        .layer(tower_http::compression::CompressionLayer::new().gzip(true))
}

async fn leader(State(s): S) -> Json<views::Leader> {
    let l = &s.leadership;
    Json(views::Leader {
        identity: l.identity().to_string(),
        leader: l.is_leader(),
        holder: l.holder(),
        elected: l.elected_mode(),
        term: l.term(),
        backend: l.backend().into(),
        place: l.place(),
        token: l.token(),
        last_renewal_age_seconds: l.renewed_ago().map(|d| d.as_secs_f64()),
        problem: l.problem(),
    })
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id)
        .map_err(|_| ApiError::bad_request(format!("{id:?} is not an event id (a uuid)")))
}

async fn fencing_summary(State(s): S) -> Result<Json<views::FencingSummary>, ApiError> {
    let checks = s.readiness.as_ref().map(|b| b.all()).unwrap_or_default();
    let mut summary = views::FencingSummary::of(&checks);
    summary.paused = super::fencing_api::current(&s)?;
    Ok(Json(summary))
}

async fn readiness(State(s): S) -> Json<views::Readiness> {
    Json(s.readiness.as_ref().map(|b| b.all()).unwrap_or_default())
}

async fn one_status(State(s): S, Path(id): Path<String>) -> Result<Json<views::Event>, ApiError> {
    let id = parse_id(&id)?;
    let commands = || {
        s.store
            .audit(Some(&id.to_string()), 100)
            .map_err(|e| db_error(&s.store, e))
    };
    if let Some(f) = s.flows.get(&id).await.map_err(|e| flows_error(&s, e))? {
        let mut v = views::Event::of_flow(&f);
        v.commands = commands()?;
        return Ok(Json(v));
    }
    match s.store.event(&id).map_err(|e| db_error(&s.store, e))? {
        Some((e, jobs, None)) => {
            let mut v = views::Event::of_repair(&e, &jobs);
            v.commands = commands()?;
            Ok(Json(v))
        }
        Some((_, _, Some(why))) => Err(ApiError::not_found(format!(
            "event {id} was cleared: {why}"
        ))),
        None => Err(ApiError::not_found(format!("no event {id}"))),
    }
}

async fn cancel(State(s): S, Path(id): Path<String>) -> Result<Json<views::Event>, ApiError> {
    let id = parse_id(&id)?;
    require_leader(&s)?;
    match s
        .store
        .cancel(&id, crate::clock::steady_ns())
        .map_err(|e| db_error(&s.store, e))?
    {
        CancelOutcome::NotFound => match s
            .flows
            .cancel(&id, crate::clock::steady_ns())
            .await
            .map_err(|e| flows_error(&s, e))?
        {
            FenceCancel::NotFound => Err(ApiError::not_found(format!("no live event {id}"))),
            FenceCancel::Final => Err(ApiError::conflict(format!(
                "fence flow {id} is already final"
            ))),
            FenceCancel::AlreadyCanceled => Err(ApiError::conflict(format!(
                "fence flow {id} is already canceled"
            ))),
            FenceCancel::PoweredOff => Err(ApiError::conflict(format!(
                "fence flow {id} has already powered the node off; it can no longer be canceled"
            ))),
            refused @ FenceCancel::PowerOffRunning => Err(ApiError::conflict(format!(
                "fence flow {id} cannot be canceled: {}",
                refused.describe()
            ))),
            FenceCancel::Canceled(f) => {
                tracing::info!(flow = %id, "fence flow canceled by operator");
                s.wake.notify_one();
                Ok(Json(views::Event::of_flow(&f)))
            }
        },
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
                .map_err(|e| db_error(&s.store, e))?
                .ok_or_else(|| ApiError::internal("event vanished"))?;
            Ok(Json(views::Event::of_repair(&e, &jobs)))
        }
    }
}

#[derive(Deserialize)]
struct TagQuery {
    node: Option<String>,
}

async fn tags(State(s): S, Query(q): Query<TagQuery>) -> Result<Json<views::Tags>, ApiError> {
    let mut all = s.cluster.jobs.tags().await.map_err(internal)?;
    for n in s.members.get().iter() {
        all.entry(n.name.clone()).or_default();
    }
    if let Some(node) = q.node {
        let t = all
            .remove(&node)
            .ok_or_else(|| ApiError::not_found(format!("unknown node {node:?}")))?;
        return Ok(Json(views::Tags::from([(node, t)])));
    }
    Ok(Json(all))
}

async fn remove_tag(
    State(s): S,
    Path((node, tag)): Path<(String, String)>,
) -> Result<Json<views::TagRemoved>, ApiError> {
    require_leader(&s)?;
    match s.cluster.jobs.remove_tag(&node, &tag).await {
        Ok(true) => {
            tracing::info!(node = %node, tag = %tag, "tag removed by operator");
            s.wake.notify_one();
            Ok(Json(views::TagRemoved { node, removed: tag }))
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

/// 200 while the engine decides and the database can be written, 503 naming the cause when
/// not: for a liveness probe and for alerting. What the daemon found at start-up and could not
/// match (earlier jobs or tags beside a lost database) is listed either way.
async fn health(State(s): S) -> Result<Json<views::Health>, ApiError> {
    let stale_ns = i64::try_from(s.settings.stall_after.as_nanos()).unwrap_or(i64::MAX);
    let now = crate::clock::steady_ns();
    if s.health.probe_due(now) {
        let wrote = s.store.probe_write(now);
        if let Err(e) = &wrote {
            tracing::error!(error = %e, db = %s.store.path(), "the state database cannot be written");
        }
        s.health.wrote(now, &wrote);
    }
    let found = s.health.found();
    match s.health.check(now, stale_ns) {
        Ok(age) => Ok(Json(views::Health {
            status: "ok".into(),
            last_decision_age_seconds: age.map(|a| a as f64 / 1e9),
            db: s.store.path().to_string(),
            found,
            lease_problem: s.leadership.problem(),
        })),
        Err(why) if found.is_empty() => Err(ApiError::unavailable(why.to_string())),
        Err(why) => Err(ApiError::unavailable(format!(
            "{why}; found at start-up: {}",
            found.join("; ")
        ))),
    }
}

async fn reset_seq(
    State(s): S,
    Path(node): Path<String>,
) -> Result<Json<views::SeqReset>, ApiError> {
    require_leader(&s)?;
    if !s.members.get().iter().any(|n| n.name == node) {
        return Err(ApiError::not_found(format!("unknown node {node:?}")));
    }
    let prev = s
        .seqs
        .reset(&s.store, &node)
        .map_err(|e| db_error(&s.store, e))?;
    tracing::warn!(node = %node, previous_seq = ?prev, "report sequence state reset by operator");
    Ok(Json(views::SeqReset {
        node,
        previous_seq: prev,
    }))
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), else the classic text format,
/// which `promtool check metrics` and older tools read.
async fn metrics(
    State(s): S,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &s.registry).map_err(internal)?;
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    Ok(if wants_openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::metrics::openmetrics_to_text(&text),
        )
    })
}
