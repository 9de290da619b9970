//! The NodeFence custom resource (`maintd.io/v1alpha1`, cluster-scoped): one object per fence
//! flow, so that `kubectl get nodefences` shows every fence and an operator can create one to
//! fence a node or delete or annotate one to cancel it. Its schema is derived from these types;
//! this module also maps a flow to the object's status and back.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use maintd_core::fencing::machine::{Call, FenceStatus, Flow, Step, Transition, Witnesses};
use maintd_core::fencing::selffence::SelfFenceTimes;
use maintd_core::verdict::{Nanos, Outcome};

/// The API group of maintd's own resources: never `*.k8s.io`, which needs API review.
pub const GROUP: &str = "maintd.io";
/// Label naming the flow an object records (absent on an operator's request not yet started).
pub const FLOW_LABEL: &str = "maintd.io/flow";
/// Finalizer on every flow's object until the flow is final: a delete before then is an
/// operator's cancel, which maintd must see and answer, not a record lost.
pub const FINALIZER: &str = "maintd.io/fence";
/// Annotation an operator sets (any value) to cancel a flow before the power-off.
pub const CANCEL_ANNOTATION: &str = "maintd.io/cancel";

/// A fence of one node, as maintd runs it or as an operator asks for it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "maintd.io",
    version = "v1alpha1",
    kind = "NodeFence",
    plural = "nodefences",
    shortname = "nf",
    category = "maintd",
    status = "NodeFenceStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceSpec {
    /// The Node to fence.
    pub node: String,
}

/// The flow's record: written by maintd before every effect, read back by any later leader.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFenceStatus {
    /// The flow's id (an operator's request takes the object's uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// The step the flow is at: `isolation`, `power-management`, `self-fence`, `power-on` or
    /// `recovery`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// The step's status: `new` (waiting for its attempt), `running`, `done`, `error` (failed
    /// for good) or `final` (the flow has ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<FenceStatus>,
    /// Failed attempts of the current step.
    #[serde(default)]
    pub retries: u32,
    /// Restarts of the whole flow after a step failed for good.
    #[serde(default)]
    pub restarts: u32,
    /// Why a request waits or was refused, else the flow's latest note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The fence agent calls: method, action, result, times.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<Call>,
    /// What declared the node dead (or the operator who asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witnesses: Option<Witnesses>,
    /// Proof of the power-off (the verified `status` read OFF) or of a self-fencing reset.
    #[serde(default)]
    pub fenced: bool,
    /// When the power-off was proven (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_at: Option<String>,
    /// A self-fencing node has reset by this moment (an estimate until `safeProven`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_until: Option<String>,
    /// The self-fencing node's reset is proven, not estimated.
    #[serde(default)]
    pub safe_proven: bool,
    /// The proven moment on the boot clock of the master that proved it (another boot proves
    /// the reset again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_boot: Option<maintd_core::verdict::BootInstant>,
    /// How long after it went silent a self-fencing node has surely reset, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_time_ms: Option<u64>,
    /// The watchdog timings the self-fencing node reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_fence_times: Option<SelfFenceTimes>,
    /// A kdump notification said the node runs its crash kernel (its workloads were released
    /// then; power-management waited for the dump).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kdump_at: Option<String>,
    /// The return to service: the boot id before the fence, the power-on, the new boot id
    /// proven, when the node returned, and the alarm of a node that kept its old boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_before: Option<String>,
    /// When the released node's power-on was verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub powered_on_at: Option<String>,
    /// The new boot id the node came back with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_boot: Option<String>,
    /// When the node's return to service was proven.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_at: Option<String>,
    /// Why the flow raised an alarm (the node runs the boot it had before its verified
    /// power-off: the BMC's answer was not true); an operator must acknowledge it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
    /// Who acknowledged the failure or alarm, and why (`maintd fences ack`): the released node
    /// returns to service once it answers and reports healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<String>,
    /// The plan the flow started with and runs by to its end, secret parameters named only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<maintd_core::fencing::machine::PlanRecord>,
    /// The isolation step took the node off its network or storage.
    #[serde(default)]
    pub isolated: bool,
    /// When the isolation was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated_at: Option<String>,
    /// The node's workloads were released to run elsewhere (after the proven power-off).
    #[serde(default)]
    pub released: bool,
    /// When the workloads were released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    /// The release was cleared: the node is back in service.
    #[serde(default)]
    pub reclaimed: bool,
    /// An operator canceled the flow before its power-off.
    #[serde(default)]
    pub canceled: bool,
    /// The node was marked unschedulable by the flow (cleared by its recovery).
    #[serde(default)]
    pub marked: bool,
    /// The node carries the flow's fencefailed tag.
    #[serde(default)]
    pub tagged: bool,
    /// Outcomes the executor recorded and the next decision reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    /// The release's outcome, written by the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_result: Option<Outcome>,
    /// The return to service's outcome, written by the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_result: Option<Outcome>,
    /// When the node was found silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected: Option<String>,
    /// When the flow started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// When the flow last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// When the step's next attempt is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<String>,
    /// Every transition: when, the step and status, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Transition>,
    /// `Accepted`, `PoweredOff`, `Released`, `Returned`, `Canceled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<FenceCondition>,
}

/// A standard condition (type, status, reason, message, lastTransitionTime).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceCondition {
    /// `Accepted`, `PoweredOff`, `Released`, `Returned` or `Canceled`.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// A one-word reason in CamelCase.
    pub reason: String,
    /// What happened, in words.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
}

/// The CRD as YAML, for `maintd crd` and `deploy/crd.yaml`.
mod read;
use read::parse_time;
pub use read::{UnreadableFlow, flow_of};

pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let yaml = serde_yaml_ng::to_string(&NodeFence::crd()).expect("the CRD serializes");
    format!("# Generated by `maintd crd` from maintd's own types; a test keeps it in step.\n{yaml}")
}

/// A time as the status shows it: RFC 3339 in UTC, to the nanosecond (lossless).
pub fn time(t: Nanos) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(t as i128)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

/// The flow id an object records: its label, else (an operator's request) its uid.
pub fn flow_id(nf: &NodeFence) -> Option<Uuid> {
    let labelled = nf
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(FLOW_LABEL))
        .and_then(|v| v.parse().ok());
    labelled.or_else(|| nf.metadata.uid.as_deref().and_then(|u| u.parse().ok()))
}

/// The object's name for a new flow: the node and the id's first eight hex digits, within the
/// 253 characters of a name.
pub fn name_for(f: &Flow) -> String {
    let id = f.id.simple().to_string();
    let node: String = f.node.chars().take(240).collect();
    format!("{node}-{}", &id[..8])
}

/// The status recording `f`; conditions carry over their transition times from `old`.
pub fn status_of(f: &Flow, old: Option<&NodeFenceStatus>) -> NodeFenceStatus {
    let now = time(f.updated);
    let mut conditions = old.map(|o| o.conditions.clone()).unwrap_or_default();
    let (off_reason, off_msg) = if f.fenced() {
        if f.step == Step::SelfFence || f.safe_proven {
            ("ResetProven", "the node's watchdog reset is proven")
        } else {
            ("Verified", "power-off verified by the agents' status")
        }
    } else {
        ("NotYet", "the node has not been powered off")
    };
    set_condition(
        &mut conditions,
        "Accepted",
        true,
        "Started",
        "the flow runs",
        &now,
    );
    set_condition(
        &mut conditions,
        "PoweredOff",
        f.fenced(),
        off_reason,
        off_msg,
        &now,
    );
    let (rel_reason, rel_msg) = if f.released() {
        (
            "Released",
            "workloads released after the verified power-off",
        )
    } else {
        (
            "NotReleased",
            "workloads are released only after a verified power-off",
        )
    };
    set_condition(
        &mut conditions,
        "Released",
        f.released(),
        rel_reason,
        rel_msg,
        &now,
    );
    if f.powered_on_at.is_some() || f.returned_at.is_some() || f.alarm.is_some() {
        let (ok, reason, msg) = match (&f.alarm, f.returned_at) {
            (Some(_), Some(_)) => (
                true,
                "Acknowledged",
                "the alarm was acknowledged and the node reports healthy; back in service",
            ),
            (Some(a), None) => (false, "Alarm", a.as_str()),
            (None, Some(_)) => (true, "BootProven", "a new boot proven; back in service"),
            (None, None) => (
                false,
                "Waiting",
                "powered on; waiting for proof of a new boot",
            ),
        };
        set_condition(&mut conditions, "Returned", ok, reason, msg, &now);
    }
    if f.canceled {
        set_condition(
            &mut conditions,
            "Canceled",
            true,
            "Canceled",
            "canceled by an operator",
            &now,
        );
    }
    NodeFenceStatus {
        flow: Some(f.id.to_string()),
        step: Some(f.step),
        status: Some(f.status),
        retries: f.retries,
        restarts: f.restarts,
        message: f
            .history
            .last()
            .map(|t| t.note.chars().take(1024).collect()),
        jobs: f.calls.clone(),
        witnesses: Some(f.witnesses.clone()),
        fenced: f.fenced(),
        fenced_at: f.fenced_at.map(time),
        safe_until: f.safe_until.map(time),
        safe_proven: f.safe_proven,
        safe_boot: f.safe_boot,
        safe_time_ms: f.safe_time_ms,
        self_fence_times: f.self_fence_times,
        kdump_at: f.kdump_at.map(time),
        boot_before: f.boot_before.map(|u| u.to_string()),
        powered_on_at: f.powered_on_at.map(time),
        returned_boot: f.returned_boot.map(|u| u.to_string()),
        returned_at: f.returned_at.map(time),
        alarm: f.alarm.clone(),
        acknowledged: f.acknowledged.clone(),
        plan: f.plan.clone(),
        isolated: f.isolated(),
        isolated_at: f.isolated_at.map(time),
        released: f.released(),
        released_at: f.released_at.map(time),
        reclaimed: f.reclaimed,
        canceled: f.canceled,
        marked: f.marked,
        tagged: f.tagged,
        result: f.result.clone(),
        release_result: f.release_result.clone(),
        reclaim_result: f.reclaim_result.clone(),
        detected: Some(time(f.detected)),
        created: Some(time(f.created)),
        updated: Some(now.clone()),
        next_attempt: Some(time(f.next_attempt)),
        history: f.history.clone(),
        conditions,
    }
}

/// Sets condition `kind`, keeping its transition time unless its status changes.
pub fn set_condition(
    conditions: &mut Vec<FenceCondition>,
    kind: &str,
    on: bool,
    reason: &str,
    message: &str,
    now: &str,
) {
    let status = if on { "True" } else { "False" };
    let at = conditions
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    conditions.retain(|c| c.type_ != kind);
    conditions.push(FenceCondition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: at,
    });
}

/// The condition `kind` if it holds with `reason`.
pub fn has_condition(s: Option<&NodeFenceStatus>, kind: &str, reason: &str) -> bool {
    s.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == kind && c.reason == reason)
    })
}

/// When an operator's request was refused for good (its `Accepted` condition says `Refused`).
pub fn refused_at(s: Option<&NodeFenceStatus>) -> Option<Nanos> {
    let c = s?
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted" && c.reason == "Refused")?;
    parse_time("conditions", &Some(c.last_transition_time.clone()))
        .ok()
        .flatten()
}

/// Labels of a flow's object.
pub fn labels(f: &Flow) -> BTreeMap<String, String> {
    BTreeMap::from([(FLOW_LABEL.to_string(), f.id.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use maintd_core::fencing::machine::Witnesses;

    /// A refused request ends at its refusal (then pruned like a final flow); a waiting one
    /// has not ended.
    #[test]
    fn a_refused_request_ends_when_it_was_refused() {
        let mut s = NodeFenceStatus::default();
        set_condition(
            &mut s.conditions,
            "Accepted",
            false,
            "Waiting",
            "storm",
            &time(5),
        );
        assert_eq!(refused_at(Some(&s)), None);
        let at = 1_795_000_000_123_456_789;
        s.conditions.retain(|c| c.type_ != "Accepted");
        set_condition(
            &mut s.conditions,
            "Accepted",
            false,
            "Refused",
            "no plan",
            &time(at),
        );
        assert_eq!(refused_at(Some(&s)), Some(at));
        assert_eq!(refused_at(None), None);
    }

    /// `kubectl explain nodefence.status` describes every field an operator reads.
    #[test]
    fn every_status_field_has_a_description() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(NodeFence::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let status = &schema["properties"]["status"]["properties"];
        let condition = &status["conditions"]["items"]["properties"];
        let mut missing = Vec::new();
        for (prefix, props) in [("status", status), ("status.conditions", condition)] {
            for (name, p) in props.as_object().expect("properties") {
                if p["description"].as_str().is_none_or(str::is_empty) {
                    missing.push(format!("{prefix}.{name}"));
                }
            }
        }
        assert!(missing.is_empty(), "no description: {missing:?}");
    }

    #[test]
    fn a_flow_survives_the_round_trip_through_the_status() {
        let w = Witnesses {
            collector: true,
            ..Witnesses::default()
        };
        let t0 = 1_780_000_000_123_456_789;
        let mut f = Flow::new("web-3", t0 - 5, t0, Step::PowerManagement, w, "silent");
        f.fenced_at = Some(t0 + 7);
        f.result = Some(Outcome::done("off"));
        let nf = NodeFence {
            metadata: kube::api::ObjectMeta {
                name: Some(name_for(&f)),
                labels: Some(labels(&f)),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: NodeFenceSpec {
                node: "web-3".into(),
            },
            status: Some(status_of(&f, None)),
        };
        let back = flow_of(&nf).unwrap().unwrap();
        assert_eq!(back.version, 42);
        f.version = 42;
        assert_eq!(back, f);
        let s = nf.status.as_ref().unwrap();
        assert!(has_condition(Some(s), "PoweredOff", "Verified"));
        assert_eq!(
            s.fenced_at.as_deref(),
            Some("2026-05-28T20:26:40.123456796Z")
        );
    }

    #[test]
    fn a_request_without_status_is_no_flow_and_a_bad_time_is_named() {
        let mut nf = NodeFence::new("manual", NodeFenceSpec { node: "n1".into() });
        assert_eq!(flow_of(&nf).unwrap(), None);
        nf.status = Some(NodeFenceStatus {
            step: Some(Step::Isolation),
            status: Some(FenceStatus::New),
            next_attempt: Some(time(1)),
            detected: Some("yesterday".into()),
            ..Default::default()
        });
        nf.metadata.uid = Some(Uuid::from_u128(7).to_string());
        nf.metadata.resource_version = Some("3".into());
        let e = flow_of(&nf).unwrap_err().to_string();
        assert!(
            e.contains("status.detected") && e.contains("yesterday"),
            "{e}"
        );
    }
}
