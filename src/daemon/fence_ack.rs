//! An operator's acknowledgement of a fence flow in error (`maintd fences ack`, signed and
//! audited): after an alarm or a missed return deadline they checked the device and the node,
//! and the node may return to service. A released node returns once it answers and reports
//! healthy; the answer says what is left.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::api_state::{ApiState, require_leader};
use crate::http::ApiError;
use maintd_core::fencing::machine::{FenceStatus, Transition, fence_failed_tag};

type S = State<Arc<ApiState>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AckQuery {
    reason: Option<String>,
}

/// What `POST /1/fences/{id}/ack` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Acknowledged {
    pub flow: Uuid,
    pub node: String,
    /// The operator and their reason.
    pub by: String,
    /// What the node's return to service still waits for (`nothing` when it ends now).
    pub left: String,
}

/// How often a save that lost to the fencer's own write is tried again.
const SAVE_TRIES: usize = 5;

/// `POST /1/fences/{id}/ack?reason=…`: records the acknowledgement on the flow (and removes
/// its `fencefailed` tag, the other way to acknowledge it). Only a flow in error can be
/// acknowledged; a second acknowledgement answers as the first did.
pub(super) async fn ack(
    State(s): S,
    axum::Extension(op): axum::Extension<crate::report::operator::Operator>,
    Path(id): Path<String>,
    Query(q): Query<AckQuery>,
) -> Result<Json<Acknowledged>, ApiError> {
    require_leader(&s)?;
    let reason = super::fencing_api::operator_reason(q.reason, "acknowledged")?;
    let by = format!("{} ({reason})", op.name);
    for _ in 0..SAVE_TRIES {
        let mut f = super::fencing_api::flow(&s, &id).await?;
        if let Some(was) = &f.acknowledged {
            return Ok(Json(answer(&s, &f, was.clone())?));
        }
        if f.status != FenceStatus::Error {
            return Err(ApiError::conflict(format!(
                "fence flow {} is {} {}, not in error: there is nothing to acknowledge",
                f.id,
                f.step.as_str(),
                f.status.as_str()
            )));
        }
        let now = crate::clock::steady_ns();
        f.acknowledged = Some(by.clone());
        f.updated = now;
        f.history.push(Transition {
            at: now,
            step: f.step,
            status: f.status,
            note: format!("acknowledged by {by}"),
        });
        let saved = s
            .flows
            .save(&f)
            .await
            .map_err(|e| ApiError::internal(format!("{}: {e}", s.flows.location())))?;
        if !saved {
            continue;
        }
        tracing::info!(flow = %f.id, node = %f.node, operator = %op.name, "fence flow acknowledged");
        if f.tagged
            && let Err(e) = s
                .cluster
                .jobs
                .remove_tag(&f.node, &fence_failed_tag(&f.id))
                .await
        {
            tracing::warn!(flow = %f.id, error = %e, "cannot remove the fencefailed tag; the acknowledgement stands");
        }
        s.wake.notify_one();
        return Ok(Json(answer(&s, &f, by)?));
    }
    Err(ApiError::conflict(format!(
        "fence flow {id} kept changing; acknowledge it again"
    )))
}

fn answer(
    s: &ApiState,
    f: &maintd_core::fencing::machine::Flow,
    by: String,
) -> Result<Acknowledged, ApiError> {
    let answers = s
        .store
        .nodes()
        .map_err(|e| ApiError::internal(format!("{}: {e}", s.store.path())))?
        .into_iter()
        .any(|r| r.name == f.node && r.reachable);
    let left = if !f.released() || f.reclaimed {
        "nothing: nothing of the node's was released, and the flow ends".to_string()
    } else if f.returned_at.is_some() {
        "nothing: the node is back in service".to_string()
    } else if answers {
        "nothing: the node answers; it returns to service at the next decision once its reports are healthy".to_string()
    } else {
        format!(
            "the node does not answer now; it stays out of service until it answers and reports healthy ({} stays released and marked)",
            f.node
        )
    };
    Ok(Acknowledged {
        flow: f.id,
        node: f.node.clone(),
        by,
        left,
    })
}
