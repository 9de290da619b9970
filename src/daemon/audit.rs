//! The audit trail's edges: the layer that records each accepted operator command with its
//! signer, and `GET /1/audit`.

use axum::Json;
use axum::extract::{Query, State};
use axum::middleware;
use serde::Deserialize;

use super::api_state::{S, db_error};
use crate::http::ApiError;

/// Records an accepted operator command in the audit trail before it runs, and its answer
/// after; logs both with the operator's name. A command that cannot be recorded is not run.
pub(super) async fn audited(
    State(s): S,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Result<axum::response::Response, ApiError> {
    let who = req
        .extensions()
        .get::<crate::report::operator::Operator>()
        .map(|o| o.name.clone())
        .unwrap_or_else(|| crate::report::operator::CLUSTER_KEY_ID.into());
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let seq = s
        .store
        .audit_begin(&who, &method, &path, crate::clock::steady_ns())
        .map_err(|e| db_error(&s.store, e))?;
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    tracing::info!(operator = %who, %method, %path, status, "operator command");
    if let Err(e) = s.store.audit_end(seq, status) {
        tracing::error!(error = %e, seq, "the command ran but its answer is not in the audit trail");
    }
    Ok(resp)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditQuery {
    limit: Option<usize>,
}

/// `GET /1/audit?limit=N`: the newest operator commands first (100 by default, at most 1000).
pub(super) async fn list(
    State(s): S,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Vec<crate::store::Command>>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be 1 to 1000"));
    }
    s.store
        .audit(None, limit)
        .map(Json)
        .map_err(|e| db_error(&s.store, e))
}
