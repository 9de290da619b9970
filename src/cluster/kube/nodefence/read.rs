//! A NodeFence read back into the flow it records, or the field that makes it unreadable.

use uuid::Uuid;

use super::{NodeFence, flow_id};
use maintd_core::fencing::machine::{Flow, established};
use maintd_core::verdict::Nanos;

/// Why a NodeFence's status is not a flow maintd can read, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnreadableFlow {
    #[error("status.{field} {value:?} is not an RFC 3339 time: {detail}")]
    Time {
        field: &'static str,
        value: String,
        detail: String,
    },
    #[error("status.{field} {value:?} is not a boot id: {detail}")]
    Boot {
        field: &'static str,
        value: String,
        detail: String,
    },
    #[error("status.{0} is missing")]
    Missing(&'static str),
    #[error("no flow id (label maintd.io/flow or uid)")]
    NoId,
    #[error("its resourceVersion is not a number")]
    Version,
}

pub(super) fn parse_time(
    field: &'static str,
    s: &Option<String>,
) -> Result<Option<Nanos>, UnreadableFlow> {
    s.as_deref()
        .map(|s| {
            s.parse::<k8s_openapi::jiff::Timestamp>()
                .map(|t| t.as_nanosecond() as Nanos)
                .map_err(|e| UnreadableFlow::Time {
                    field,
                    value: s.to_string(),
                    detail: e.to_string(),
                })
        })
        .transpose()
}

/// The flow an object records, at `version` (its resourceVersion); `Ok(None)` for an
/// operator's request not yet started; an error names the field that makes it unreadable.
pub fn flow_of(nf: &NodeFence) -> Result<Option<Flow>, UnreadableFlow> {
    let Some(s) = &nf.status else { return Ok(None) };
    let (Some(step), Some(status)) = (s.step, s.status) else {
        return Ok(None);
    };
    let id = flow_id(nf).ok_or(UnreadableFlow::NoId)?;
    let need = |field: &'static str, v: Option<Nanos>| v.ok_or(UnreadableFlow::Missing(field));
    let version = nf
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or(UnreadableFlow::Version)?;
    Ok(Some(Flow {
        id,
        node: nf.spec.node.clone(),
        step,
        status,
        retries: s.retries,
        restarts: s.restarts,
        result: s.result.clone(),
        release_result: s.release_result.clone(),
        reclaim_result: s.reclaim_result.clone(),
        next_attempt: need("nextAttempt", parse_time("nextAttempt", &s.next_attempt)?)?,
        reclaimed: s.reclaimed,
        canceled: s.canceled,
        tagged: s.tagged,
        detected: need("detected", parse_time("detected", &s.detected)?)?,
        created: need("created", parse_time("created", &s.created)?)?,
        updated: need("updated", parse_time("updated", &s.updated)?)?,
        isolated_at: established(s.isolated, parse_time("isolatedAt", &s.isolated_at)?),
        fenced_at: established(s.fenced, parse_time("fencedAt", &s.fenced_at)?),
        released_at: established(s.released, parse_time("releasedAt", &s.released_at)?),
        history: s.history.clone(),
        calls: s.jobs.clone(),
        marked: s.marked,
        safe_time_ms: s.safe_time_ms,
        safe_until: parse_time("safeUntil", &s.safe_until)?,
        safe_proven: s.safe_proven,
        safe_boot: s.safe_boot,
        self_fence_times: s.self_fence_times,
        kdump_at: parse_time("kdumpAt", &s.kdump_at)?,
        witnesses: s.witnesses.clone().unwrap_or_default(),
        boot_before: parse_boot("bootBefore", &s.boot_before)?,
        powered_on_at: parse_time("poweredOnAt", &s.powered_on_at)?,
        returned_boot: parse_boot("returnedBoot", &s.returned_boot)?,
        returned_at: parse_time("returnedAt", &s.returned_at)?,
        alarm: s.alarm.clone(),
        acknowledged: s.acknowledged.clone(),
        plan: s.plan.clone(),
        version,
    }))
}

fn parse_boot(field: &'static str, v: &Option<String>) -> Result<Option<Uuid>, UnreadableFlow> {
    v.as_deref()
        .map(|s| {
            Uuid::parse_str(s).map_err(|e| UnreadableFlow::Boot {
                field,
                value: s.to_string(),
                detail: e.to_string(),
            })
        })
        .transpose()
}
