//! Maintenance in the API (signed, audited): put a node in maintenance, end it, and list every
//! node in maintenance, the operators' and those whose repair waits for its acknowledgement.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};

use super::api_state::{ApiState, require_leader};
use crate::clock::steady_ns;
use crate::http::ApiError;
use crate::store::Maintenance;
use maintd_core::verdict::Nanos;

type S = State<Arc<ApiState>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StartQuery {
    reason: Option<String>,
    /// When it ends by itself: ns since the epoch on the wall clock.
    until: Option<Nanos>,
}

/// One node in maintenance, as `GET /1/maintenance` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct InMaintenance {
    pub node: String,
    /// `operator`: set with `maintenance start`; `repair`: a repair event evacuated the node and
    /// waits for its acknowledgement (its `repairready` tag); `elsewhere`: someone else is
    /// working on it (on Kubernetes, a NodeMaintenance object or another holder of the node's
    /// medik8s Lease).
    pub source: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Nanos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Nanos>,
}

fn db(s: &ApiState, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{}: {e}", s.store.path()))
}

fn member(s: &ApiState, node: &str) -> Result<(), ApiError> {
    if s.members.get().iter().any(|n| n.name == node) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no managed node {node:?}")))
    }
}

/// Records the change where a successor reads it.
async fn checkpoint(s: &ApiState) {
    if let Err(e) = s.leadership.checkpoint().await {
        tracing::warn!(error = %e, "the maintenance is recorded here but not yet in the shared checkpoint; retried on the next change");
    }
}

/// `POST /1/nodes/{node}/maintenance?reason=…&until=…`: the node is never fenced, powered on or
/// off, and is out of the storm count until the maintenance ends (`DELETE`, or `until`).
pub(super) async fn start(
    State(s): S,
    axum::Extension(op): axum::Extension<crate::report::operator::Operator>,
    Path(node): Path<String>,
    Query(q): Query<StartQuery>,
) -> Result<Json<InMaintenance>, ApiError> {
    require_leader(&s)?;
    member(&s, &node)?;
    let reason = super::fencing_api::operator_reason(q.reason, "maintenance")?;
    let now = steady_ns();
    // The end is given on the wall clock and kept on the steady timeline, so a clock step
    // neither ends a maintenance early nor prolongs it.
    let until = match q.until {
        None => None,
        Some(wall) => {
            let left = wall.saturating_sub(crate::report::now_ns());
            if left <= 0 {
                return Err(ApiError::bad_request("until is in the past"));
            }
            Some(now.saturating_add(left))
        }
    };
    let m = Maintenance {
        node: node.clone(),
        reason,
        since: now,
        by: op.name.clone(),
        until,
    };
    let again = s.store.start_maintenance(m, now).map_err(|e| db(&s, e))?;
    tracing::info!(node = %node, operator = %op.name, again, "node in maintenance");
    checkpoint(&s).await;
    let kept = s.store.maintenance(now).map_err(|e| db(&s, e))?;
    let m = kept
        .into_iter()
        .find(|m| m.node == node)
        .ok_or_else(|| ApiError::internal("the maintenance was not kept"))?;
    Ok(Json(operator_view(m)))
}

/// `DELETE /1/nodes/{node}/maintenance`: normal handling resumes (a node that is still silent
/// is then fenced in the normal way, after the grace).
pub(super) async fn stop(
    State(s): S,
    Path(node): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_leader(&s)?;
    member(&s, &node)?;
    let was = s
        .store
        .stop_maintenance(&node, steady_ns())
        .map_err(|e| db(&s, e))?;
    tracing::info!(node = %node, was, "node out of maintenance");
    checkpoint(&s).await;
    Ok(Json(
        serde_json::json!({ "node": node, "was-in-maintenance": was }),
    ))
}

fn operator_view(m: Maintenance) -> InMaintenance {
    InMaintenance {
        node: m.node,
        source: "operator".into(),
        reason: m.reason,
        by: Some(m.by),
        since: Some(m.since),
        until: m.until,
    }
}

/// Each node an operator put in maintenance, with why, as `/1/nodes` shows it.
pub(super) fn operators(
    s: &ApiState,
) -> Result<std::collections::BTreeMap<String, String>, ApiError> {
    let operators = s.store.maintenance(steady_ns()).map_err(|e| db(s, e))?;
    // An operator's own maintenance is the one shown when both hold a node.
    Ok(s.cluster
        .held_elsewhere()
        .into_iter()
        .chain(
            operators
                .into_iter()
                .map(|m| (m.node, format!("in maintenance by {} ({})", m.by, m.reason))),
        )
        .collect())
}

/// `GET /1/maintenance`: every node in maintenance, by name.
pub(super) async fn list(State(s): S) -> Result<Json<Vec<InMaintenance>>, ApiError> {
    let mut out: Vec<InMaintenance> = s
        .store
        .maintenance(steady_ns())
        .map_err(|e| db(&s, e))?
        .into_iter()
        .map(operator_view)
        .collect();
    let tags = s
        .cluster
        .jobs
        .tags()
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot read tags: {e}")))?;
    for (node, reason) in s.cluster.held_elsewhere() {
        if !out.iter().any(|m| m.node == node) {
            out.push(InMaintenance {
                reason,
                node,
                source: "elsewhere".into(),
                by: None,
                since: None,
                until: None,
            });
        }
    }
    for (node, tags) in tags {
        let Some(reason) = maintd_core::fencing::machine::awaiting_ack(&tags) else {
            continue;
        };
        if out.iter().any(|m| m.node == node) {
            continue;
        }
        out.push(InMaintenance {
            reason,
            node,
            source: "repair".into(),
            by: None,
            since: None,
            until: None,
        });
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(Json(out))
}
