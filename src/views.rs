//! The JSON the daemon's API serves and the CLI reads, as types both sides share: a field renamed
//! on one side is renamed on the other, and no reader indexes a `Value` by a misspelt name.
//! `api-spec/openapi.yaml` describes the same shapes; `tests/it/api_spec.rs` checks them against it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::NodeRow;
use maintd_core::fencing::machine::{FenceStatus, Flow, Step, fence_failed_tag};
use maintd_core::repair::{JobKind, JobStatus, RepairStatus};
use maintd_core::verdict::{ExactJson, Nanos, Status};

/// What an event of `/1/status` is about: a repair verdict, or a fence flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventAction {
    Repair(Status),
    Fence(FenceWord),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FenceWord {
    #[serde(rename = "fence")]
    Fence,
}

impl EventAction {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventAction::Repair(s) => s.as_str(),
            EventAction::Fence(_) => "fence",
        }
    }
}

/// A repair event (or a fence flow until it is final) as `/1/status` shows it, and as hooks get
/// it on stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Event {
    pub id: Uuid,
    pub node: String,
    /// The diagnose JSON the event stands for; null for a fence flow.
    pub original: ExactJson,
    pub action: EventAction,
    pub repair_status: RepairStatus,
    pub jobs: Vec<Job>,
    pub tag: String,
    pub tagged: bool,
    pub acknowledged: bool,
    pub superseded_by: Option<Uuid>,
    pub note: Option<String>,
    pub created: Nanos,
    pub updated: Nanos,
    /// Where a fence flow stands; absent for repair events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceProgress>,
    /// The operator commands sent about it, newest first, with who sent them (one event's
    /// view only: lists leave it out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<crate::store::Command>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Job {
    pub id: i64,
    pub kind: JobKind,
    pub round: i64,
    pub status: JobStatus,
    pub reason: String,
    pub detail: Option<String>,
    pub created: Nanos,
    pub finished: Option<Nanos>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FenceProgress {
    pub step: Step,
    pub status: FenceStatus,
    pub fenced: bool,
    pub released: bool,
    pub retries: u32,
    pub restarts: u32,
}

impl Event {
    pub fn of_repair(e: &maintd_core::repair::Event, jobs: &[maintd_core::repair::Job]) -> Event {
        Event {
            id: e.id,
            node: e.node.clone(),
            original: ExactJson::assume_canonical(e.canonical.clone()),
            action: EventAction::Repair(e.action),
            repair_status: e.status,
            jobs: jobs
                .iter()
                .map(|j| Job {
                    id: j.id,
                    kind: j.kind,
                    round: j.round,
                    status: j.status,
                    reason: j.reason.clone(),
                    detail: j.detail.clone(),
                    created: j.created,
                    finished: j.finished,
                })
                .collect(),
            tag: e.tag.clone(),
            tagged: e.tagged,
            acknowledged: e.acknowledged,
            superseded_by: e.superseded_by,
            note: e.note.clone(),
            created: e.created,
            updated: e.updated,
            fence: None,
            commands: vec![],
        }
    }

    /// A fence flow as an event: canceled, failed (tagged), completed, noted (just detected) or
    /// pending.
    pub fn of_flow(f: &Flow) -> Event {
        let repair_status = match f.status {
            _ if f.canceled && !f.fenced() => RepairStatus::Canceled,
            FenceStatus::Error if f.tagged => RepairStatus::Failed,
            FenceStatus::Final => RepairStatus::Completed,
            FenceStatus::New if f.history.len() <= 1 => RepairStatus::Noted,
            _ => RepairStatus::Pending,
        };
        Event {
            id: f.id,
            node: f.node.clone(),
            original: ExactJson::null(),
            action: EventAction::Fence(FenceWord::Fence),
            repair_status,
            jobs: vec![],
            tag: fence_failed_tag(&f.id),
            tagged: f.tagged,
            acknowledged: false,
            superseded_by: None,
            note: f
                .history
                .last()
                .map(|t| format!("{} {}: {}", t.step.as_str(), t.status.as_str(), t.note)),
            created: f.created,
            updated: f.updated,
            fence: Some(FenceProgress {
                step: f.step,
                status: f.status,
                fenced: f.fenced(),
                released: f.released(),
                retries: f.retries,
                restarts: f.restarts,
            }),
            commands: vec![],
        }
    }
}

/// A fence flow as `/1/fences` shows it: everything, with its step history and agent calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fence {
    #[serde(flatten)]
    pub flow: Flow,
    /// The tag a failed flow puts on the node.
    pub tag: String,
}

impl Fence {
    /// The flow as shown, with its waits still to come (the retry, the self-fencing node's
    /// reset) moved by `wall_step` (the wall clock less the steady clock now) once that is a
    /// second or more: a wait is kept and decided on the steady clock, and shown as the wall
    /// clock will read it (NTP's slewing moves them apart by less, which is not worth showing).
    pub fn of(f: &Flow, wall_step: Nanos) -> Fence {
        let mut flow = f.clone();
        let wall_step = if wall_step.abs() >= 1_000_000_000 {
            wall_step
        } else {
            0
        };
        let to_wall = |t: Nanos| t.saturating_add(wall_step);
        if !flow.fenced() {
            flow.safe_until = flow.safe_until.map(to_wall);
        }
        if flow.status != maintd_core::fencing::machine::FenceStatus::Final {
            flow.next_attempt = to_wall(flow.next_attempt);
        }
        Fence {
            flow,
            tag: fence_failed_tag(&f.id),
        }
    }
}

/// A managed node as `/1/nodes` shows it: its poll state and what the backend says of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Node {
    pub name: String,
    pub reachable: bool,
    pub collector: String,
    pub offline: bool,
    pub tags: BTreeSet<String>,
    #[serde(rename = "last-answer")]
    pub last_answer: Option<Nanos>,
    pub unreachable_since: Option<Nanos>,
    pub last_error: Option<String>,
    pub last_seq: Option<u64>,
    pub last_report: Option<ExactJson>,
    #[serde(rename = "diagnosed-at")]
    pub diagnosed_at: Option<Nanos>,
    pub diagnose_error: Option<String>,
    pub rejected_reports: u64,
    pub last_rejection: Option<String>,
    /// The boot of its last verified report (a fenced node returns only with a new one).
    pub boot_id: Option<uuid::Uuid>,
    pub booted_at: Option<Nanos>,
    /// The last fence readiness check; null for a node without a fence plan, or not checked
    /// yet.
    pub fencing: Option<DeviceCheck>,
    /// What the node's watchers say of it; null without fencing.
    #[serde(default)]
    pub witnesses: Option<PeerWitnesses>,
    /// How far its wall clock is from the master's (positive: ahead), measured by the liveness
    /// probe's round trip; shown, never used to judge it. Null without fencing.
    #[serde(default)]
    pub clock_offset_ms: Option<i64>,
    /// Why it is in maintenance (an operator's, or its repair waiting for acknowledgement):
    /// never fenced or powered meanwhile. Absent when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
}

/// A node's watchers as the master last heard them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PeerWitnesses {
    /// Its watchers, best first.
    pub watchers: Vec<String>,
    /// Watchers that hear its heartbeats.
    pub heard_by: Vec<String>,
    /// Watchers that have lost it.
    pub lost_by: Vec<String>,
    /// Watchers the master holds no fresh view from.
    pub unheard: Vec<String>,
    /// The master cannot reach the node, but a watcher still hears it: nothing is fenced.
    pub partitioned: bool,
    /// The armed watchdog its last view reported (signed); `None` without one. A self-fencing
    /// node without it is never counted as reset.
    pub watchdog: Option<crate::report::WatchdogReport>,
    /// Its last view shows it holds the peer set the master assigned it, so `watchers` are the
    /// peers it listens to. Until then (a new node, or a new assignment not yet taken up) a
    /// self-fencing node that falls silent cannot be proven reset: which peers could have kept
    /// it alive is not known.
    #[serde(default)]
    pub set_current: bool,
}

impl Node {
    /// `row` is `None` for a node not polled yet.
    pub fn new(
        name: &str,
        collector: String,
        row: Option<&NodeRow>,
        offline: bool,
        tags: BTreeSet<String>,
        fencing: Option<DeviceCheck>,
    ) -> Node {
        let Some(r) = row else {
            return Node {
                name: name.into(),
                reachable: false,
                collector,
                offline,
                tags,
                last_answer: None,
                unreachable_since: None,
                last_error: Some("not polled yet".into()),
                last_seq: None,
                last_report: None,
                diagnosed_at: None,
                diagnose_error: None,
                rejected_reports: 0,
                last_rejection: None,
                boot_id: None,
                booted_at: None,
                fencing,
                witnesses: None,
                clock_offset_ms: None,
                maintenance: None,
            };
        };
        Node {
            name: name.into(),
            reachable: r.reachable,
            collector,
            offline,
            tags,
            last_answer: r.last_answer_ns,
            unreachable_since: r.unreachable_since_ns,
            last_error: r.last_error.clone(),
            last_seq: r.last_seq,
            last_report: r.last_report.clone(),
            diagnosed_at: r.diagnosed_ns,
            diagnose_error: r.diagnose_error.clone(),
            rejected_reports: r.rejected,
            last_rejection: r.last_rejection.clone(),
            boot_id: r.boot_id,
            booted_at: r.booted_ns,
            fencing,
            witnesses: None,
            clock_offset_ms: None,
            maintenance: None,
        }
    }
}

impl Node {
    /// What the poll heard since the store last wrote the node's row: a later answer, the
    /// sequence floor it holds now, and the diagnose time of the latest verified report.
    pub fn heard(&mut self, health: Option<&crate::members::Health>, seq: Option<u64>) {
        if let Some(h) = health {
            self.last_answer = self.last_answer.max(h.answered_at);
            self.diagnosed_at = self.diagnosed_at.max(h.diagnosed_at);
        }
        if seq.is_some() {
            self.last_seq = seq;
        }
    }
}

/// `/1/fences/readiness`: the last readiness check of every node with a fence plan.
pub type Readiness = BTreeMap<String, DeviceCheck>;

/// `/1/leader`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Leader {
    pub identity: String,
    pub leader: bool,
    pub holder: Option<String>,
    pub elected: bool,
    pub term: u64,
    /// What elects the leader: `single`, `kubernetes` or `etcd`.
    pub backend: String,
    /// Where the lease is.
    pub place: Option<String>,
    /// etcd's fencing token, once this replica has taken the lease.
    pub token: Option<i64>,
    #[serde(rename = "last-renewal-age-seconds")]
    pub last_renewal_age_seconds: Option<f64>,
    /// Why this replica's last request to the lease's store failed, while it fails.
    pub problem: Option<String>,
}

/// `/1/health` while the engine decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Health {
    pub status: String,
    pub last_decision_age_seconds: Option<f64>,
    pub db: String,
    /// What the daemon found at start-up and could not match to its database (job results,
    /// tags of events it does not know): adopted by nothing, and said here until a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<String>,
    /// Why this replica cannot reach the lease's store (etcd out of quorum, say): while it
    /// says so, no replica may be leading, and nothing is fenced, released or started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_problem: Option<String>,
}

/// The answer to `POST /1/nodes/{node}/reset-seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SeqReset {
    pub node: String,
    pub previous_seq: Option<u64>,
}

/// `/1/tags`: every managed node's tags (maintd's and others').
pub type Tags = BTreeMap<String, BTreeSet<String>>;

/// The answer to `DELETE /1/nodes/{node}/tags/{tag}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TagRemoved {
    pub node: String,
    pub removed: String,
}

/// What a fence readiness check found, as the API serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FencingState {
    /// Every power-management device answered its status check.
    Active,
    /// At least one configured level would fail now: a device does not answer, or the node
    /// meant to fence itself reports no armed watchdog.
    Inactive,
}

/// One method's status check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MethodCheck {
    pub method: String,
    pub agent: String,
    /// The agent's exit code; none when it was killed at the deadline.
    pub code: Option<i32>,
    pub ok: bool,
}

/// Whether fencing can act on every configured node (`/1/fences/summary`), and whether it
/// is paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FencingSummary {
    pub state: FencingState,
    pub nodes: usize,
    pub inactive: Vec<String>,
    /// The pause in force: an operator's (`maintd fencing pause`), or the configuration's.
    #[serde(default)]
    pub paused: Option<crate::store::Pause>,
}

/// `maintd fencing pause` / `resume`: the pause now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FencingPause {
    pub paused: bool,
    #[serde(default)]
    pub pause: Option<crate::store::Pause>,
}

pub mod timeline;

impl FencingSummary {
    /// Inactive while any node's readiness is.
    pub fn of(checks: &BTreeMap<String, DeviceCheck>) -> FencingSummary {
        let inactive: Vec<String> = checks
            .iter()
            .filter(|(_, c)| c.state == FencingState::Inactive)
            .map(|(n, _)| n.clone())
            .collect();
        FencingSummary {
            state: if inactive.is_empty() {
                FencingState::Active
            } else {
                FencingState::Inactive
            },
            nodes: checks.len(),
            inactive,
            paused: None,
        }
    }
}

/// A node's last readiness check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeviceCheck {
    pub state: FencingState,
    pub checked_at: Nanos,
    /// `ok`, or what failed (agent output, redacted).
    pub detail: String,
    pub methods: Vec<MethodCheck>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_fencing_summary_is_inactive_while_any_node_is() {
        let check = |state| DeviceCheck {
            state,
            checked_at: 1,
            detail: String::new(),
            methods: vec![],
        };
        let mut all = BTreeMap::from([("a".to_string(), check(FencingState::Active))]);
        assert_eq!(FencingSummary::of(&all).state, FencingState::Active);
        all.insert("b".into(), check(FencingState::Inactive));
        let s = FencingSummary::of(&all);
        assert_eq!(
            (s.state, s.nodes, s.inactive),
            (FencingState::Inactive, 2, vec!["b".to_string()])
        );
    }

    #[test]
    fn an_event_action_reads_back_as_a_verdict_status_or_fence() {
        for (a, text) in [
            (
                EventAction::Repair(Status::EvacuateFailover),
                "evacuate-failover",
            ),
            (EventAction::Fence(FenceWord::Fence), "fence"),
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), json!(text));
            assert_eq!(
                serde_json::from_value::<EventAction>(json!(text)).unwrap(),
                a
            );
            assert_eq!(a.as_str(), text);
        }
        assert!(serde_json::from_value::<EventAction>(json!("reboot")).is_err());
    }

    #[test]
    fn a_repair_event_has_no_fence_field_and_round_trips() {
        let e = Event {
            id: Uuid::from_u128(1),
            node: "n1".into(),
            original: ExactJson::from_value(&json!({"status": "evacuate"})),
            action: EventAction::Repair(Status::Evacuate),
            repair_status: RepairStatus::Pending,
            jobs: vec![],
            tag: "maintd:repairready:x".into(),
            tagged: false,
            acknowledged: false,
            superseded_by: None,
            note: None,
            created: 1,
            updated: 2,
            fence: None,
            commands: vec![],
        };
        let v = serde_json::to_value(&e).unwrap();
        assert!(v.get("fence").is_none(), "{v}");
        assert_eq!(v["repair-status"], "pending");
        assert_eq!(serde_json::from_value::<Event>(v).unwrap(), e);
    }

    #[test]
    fn waits_still_to_come_are_shown_as_the_wall_clock_will_read_them_after_a_step() {
        use maintd_core::fencing::machine::{Flow, Step, Witnesses};
        const S: Nanos = 1_000_000_000;
        let mut f = Flow::new(
            "n1",
            10 * S,
            11 * S,
            Step::SelfFence,
            Witnesses::default(),
            "x",
        );
        f.safe_until = Some(40 * S);
        f.next_attempt = 12 * S;
        // NTP's slewing: shown as kept.
        let v = Fence::of(&f, S / 2);
        assert_eq!(
            (v.flow.safe_until, v.flow.next_attempt),
            (Some(40 * S), 12 * S)
        );
        // A 30 s step: the waits move with it, the records stay.
        let v = Fence::of(&f, 30 * S);
        assert_eq!(
            (v.flow.safe_until, v.flow.next_attempt),
            (Some(70 * S), 42 * S)
        );
        assert_eq!((v.flow.created, v.flow.detected), (11 * S, 10 * S));
        // Once the node is counted reset, its moment is a record.
        f.fenced_at = Some(40 * S);
        assert_eq!(Fence::of(&f, -30 * S).flow.safe_until, Some(40 * S));
    }
}
