//! The fencing part of the API: one flow, its timeline, and the runtime pause (signed).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use uuid::Uuid;

use super::api_state::{ApiState, require_leader};
use crate::clock::steady_ns;
use crate::http::ApiError;
use crate::views;

type S = State<Arc<ApiState>>;

fn flow_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::bad_request(format!("{id:?} is not a flow id")))
}

pub(super) async fn flow(
    s: &ApiState,
    id: &str,
) -> Result<maintd_core::fencing::machine::Flow, ApiError> {
    let id = flow_id(id)?;
    s.flows
        .get(&id)
        .await
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.flows.location())))?
        .ok_or_else(|| ApiError::not_found(format!("no fence flow {id}")))
}

pub(super) async fn one(
    State(s): S,
    Path(id): Path<String>,
) -> Result<Json<views::Fence>, ApiError> {
    Ok(Json(views::Fence::of(
        &flow(&s, &id).await?,
        crate::clock::wall_step_ns(),
    )))
}

pub(super) async fn timeline(
    State(s): S,
    Path(id): Path<String>,
) -> Result<Json<Vec<views::timeline::Entry>>, ApiError> {
    let f = flow(&s, &id).await?;
    let commands = s
        .store
        .audit(Some(&f.id.to_string()), 1000)
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))?;
    Ok(Json(views::timeline::with_commands(&f, &commands)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseQuery {
    reason: Option<String>,
}

/// The pause as the API shows it: an operator's, else the configuration's.
pub(super) fn current(s: &ApiState) -> Result<Option<crate::store::Pause>, ApiError> {
    let runtime = s
        .store
        .fencing_pause()
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))?;
    Ok(runtime.or_else(|| {
        s.settings.config_paused.then(|| crate::store::Pause {
            reason: "fencing.paused = true in the configuration".into(),
            since: 0,
            by: None,
        })
    }))
}

/// Records the change where a successor reads it, and says what holds now.
async fn changed(s: &ApiState) -> Result<Json<views::FencingPause>, ApiError> {
    if let Err(e) = s.leadership.checkpoint().await {
        tracing::warn!(error = %e, "the pause is recorded here but not yet in the shared checkpoint; retried on the next change");
    }
    let pause = current(s)?;
    Ok(Json(views::FencingPause {
        paused: pause.is_some(),
        pause,
    }))
}

/// An operator's reason as sent: at most 512 characters, no control characters (judged before
/// trimming: a tab trimmed away was still sent); `default` when it is empty.
pub(super) fn operator_reason(sent: Option<String>, default: &str) -> Result<String, ApiError> {
    let raw = sent.unwrap_or_default();
    if raw.chars().count() > 512 || raw.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "reason must be at most 512 characters, without control characters",
        ));
    }
    Ok(Some(raw.trim().to_string())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| default.into()))
}

/// `POST /1/fencing/pause?reason=…`: no new flow starts and no isolation or power step runs
/// until resumed; running steps finish. Kept across restarts and failovers.
pub(super) async fn pause(
    State(s): S,
    axum::Extension(op): axum::Extension<crate::report::operator::Operator>,
    Query(q): Query<PauseQuery>,
) -> Result<Json<views::FencingPause>, ApiError> {
    require_leader(&s)?;
    let reason = operator_reason(q.reason, "paused by an operator")?;
    let was = s
        .store
        .pause_fencing(&reason, &op.name, steady_ns())
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))?;
    tracing::info!(reason = %reason, already = was, operator = %op.name, "fencing paused by an operator");
    changed(&s).await
}

/// `POST /1/fencing/resume`.
pub(super) async fn resume(State(s): S) -> Result<Json<views::FencingPause>, ApiError> {
    require_leader(&s)?;
    let was = s
        .store
        .resume_fencing(steady_ns())
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))?;
    tracing::info!(was_paused = was, "fencing resumed by an operator");
    changed(&s).await
}

/// `POST /1/nodes/{node}/drill`: drain the node, fence it through its real flow, return it by
/// its new boot, and record each stage's time. Refused, with the reason, while fencing is paused
/// or cannot act on it, while any flow or drill runs, or for a node it cannot bring back.
pub(super) async fn drill(
    State(s): S,
    Path(node): Path<String>,
) -> Result<
    (
        axum::http::StatusCode,
        Json<maintd_core::fencing::drill::Drill>,
    ),
    ApiError,
> {
    require_leader(&s)?;
    let db = |e: crate::store::StoreError| ApiError::internal(format!("{}: {e}", s.store.path()));
    if s.members.find(&node).is_none() {
        return Err(ApiError::not_found(format!("no managed node {node:?}")));
    }
    let Some(fencer) = &s.fencer else {
        return Err(ApiError::conflict(
            "fencing is not configured: there is nothing to drill",
        ));
    };
    if let Some(why) = fencer.drill_refusal(&node) {
        return Err(ApiError::conflict(format!("cannot drill {node}: {why}")));
    }
    if let Some(p) = current(&s)? {
        return Err(ApiError::conflict(format!(
            "fencing is paused ({}): no drill runs",
            p.reason
        )));
    }
    if let Some(d) = s
        .store
        .drills(16)
        .map_err(db)?
        .into_iter()
        .find(|d| !d.status.is_final())
    {
        return Err(ApiError::conflict(format!(
            "drill {} on {} runs; one drill at a time",
            d.id, d.node
        )));
    }
    let flows = s
        .flows
        .active(i64::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.flows.location())))?;
    if let Some(f) = flows
        .iter()
        .find(|f| f.status != maintd_core::fencing::machine::FenceStatus::Final)
    {
        return Err(ApiError::conflict(format!(
            "fence flow {} runs on {}: no drill while a node is fenced",
            f.id, f.node
        )));
    }
    let d = s
        .store
        .insert_drill(&maintd_core::fencing::drill::Drill::new(
            &node,
            steady_ns(),
            Uuid::new_v4(),
            Uuid::new_v4(),
        ))
        .map_err(db)?;
    tracing::info!(drill = %d.id, node = %node, "fencing drill requested");
    if let Err(e) = s.leadership.checkpoint().await {
        tracing::warn!(error = %e, "the drill is recorded here but not yet in the shared checkpoint");
    }
    Ok((axum::http::StatusCode::ACCEPTED, Json(d)))
}

/// `GET /1/drills`: the 100 newest drills, each with its status and measured stages.
pub(super) async fn drills(
    State(s): S,
) -> Result<Json<Vec<maintd_core::fencing::drill::Drill>>, ApiError> {
    s.store
        .drills(100)
        .map(Json)
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))
}
