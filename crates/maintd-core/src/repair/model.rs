//! The repair-event model the decisions work on: events, jobs, rounds, observations, the policy
//! and the actions `decide` returns, with the tags that mark a finished repair. Pure data.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::verdict::{Nanos, Status, Verdict};

/// Namespace of event ids: an id is a v5 uuid of (node, canonical JSON, creation time), so the
/// core stays deterministic without a random source.
pub(super) const EVENT_NAMESPACE: Uuid = Uuid::from_u128(0x6d61_696e_7464_4576_656e_7473_0000_0001);

pub fn ready_tag(id: &Uuid) -> String {
    crate::tags::tag(crate::tags::TagKind::RepairReady, id)
}

pub fn failed_tag(id: &Uuid) -> String {
    crate::tags::tag(crate::tags::TagKind::RepairFailed, id)
}

/// The reason trail every job carries to the backend.
pub fn reason_trail(id: &impl std::fmt::Display) -> String {
    crate::tags::reference(id)
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum RepairStatus {
    Noted,
    Pending,
    Canceled,
    Failed,
    Completed,
}

impl RepairStatus {
    pub fn is_final(self) -> bool {
        matches!(self, RepairStatus::Failed | RepairStatus::Completed)
    }

    pub fn is_active(self) -> bool {
        matches!(self, RepairStatus::Noted | RepairStatus::Pending)
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<RepairStatus> {
        s.parse().ok()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: Uuid,
    pub node: String,
    pub original: Value,
    /// Canonical JSON of `original`: with `node`, the event's identity.
    pub canonical: String,
    pub action: Status,
    pub command: Option<String>,
    pub status: RepairStatus,
    /// The tag that was added, or will be added on success.
    pub tag: String,
    /// Whether `tag` has been applied to the node by the backend.
    pub tagged: bool,
    /// Whether an operator removed the repairready tag.
    pub acknowledged: bool,
    pub superseded_by: Option<Uuid>,
    /// Why the event waits, or what ended it.
    pub note: Option<String>,
    pub created: Nanos,
    pub updated: Nanos,
}

impl Event {
    /// Whether the event came from a node-condition rule rather than a collector report.
    pub fn from_condition(&self) -> bool {
        self.original
            .pointer("/details/source")
            .and_then(Value::as_str)
            == Some(CONDITION_SOURCE)
    }

    /// The remedy Job this event asks for, if any (`remedy:<name>` as its command).
    pub fn remedy(&self) -> Option<&str> {
        self.command.as_deref().and_then(crate::verdict::remedy_of)
    }

    /// Evacuations leave the node offline until the event is acknowledged and cleared.
    pub fn takes_node_offline(&self) -> bool {
        matches!(self.action, Status::Evacuate | Status::EvacuateFailover)
    }

    /// The jobs this event needs, in order.
    pub fn plan(&self) -> Vec<JobKind> {
        match self.action {
            Status::Ok => vec![],
            Status::LiveRepair if self.remedy().is_some() => vec![JobKind::Remedy],
            Status::LiveRepair if self.command.is_some() => vec![JobKind::LiveRepair],
            Status::LiveRepair => vec![],
            Status::Evacuate => vec![JobKind::Evacuate, JobKind::Offline],
            Status::EvacuateFailover => vec![JobKind::EvacuateFailover, JobKind::Offline],
        }
    }
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum JobKind {
    LiveRepair,
    /// A remedy's pod template, run as a Kubernetes Job.
    Remedy,
    Evacuate,
    EvacuateFailover,
    Offline,
    Online,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<JobKind> {
        s.parse().ok()
    }
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum JobStatus {
    Running,
    Succeeded,
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        s.parse().ok()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: i64,
    pub event: Uuid,
    pub node: String,
    pub round: i64,
    pub kind: JobKind,
    pub command: Option<String>,
    pub status: JobStatus,
    pub reason: String,
    pub detail: Option<String>,
    pub created: Nanos,
    pub finished: Option<Nanos>,
}

impl Job {
    /// What names this job outside the database (its hook's directory, the collector's journal
    /// entry): its event, its number and the moment it was created. Numbers start again in a
    /// lost or emptied database, and a rolled-back one hands out numbers again; with the event
    /// and the moment, no new job is ever taken for an earlier one.
    pub fn key(&self) -> String {
        format!("{}-{}-{}", self.event, self.id, self.created)
    }
}

/// Which actions may be executed; a disabled one is noted and waits. The `[actions]` section of
/// the config file.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Policy {
    pub live_repair: bool,
    pub evacuate: bool,
    pub evacuate_failover: bool,
}

impl Policy {
    pub fn allows(&self, s: Status) -> bool {
        match s {
            Status::Ok => true,
            Status::LiveRepair => self.live_repair,
            Status::Evacuate => self.evacuate,
            Status::EvacuateFailover => self.evacuate_failover,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            live_repair: true,
            evacuate: true,
            evacuate_failover: true,
        }
    }
}

/// Everything the decision needs, rebuilt from the store and the backend on every tick.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// Non-cleared events.
    pub events: Vec<Event>,
    /// Jobs of the non-cleared events.
    pub jobs: Vec<Job>,
    /// Whether any job (of any event, cleared or not) still runs: a round is in progress.
    pub round_running: Option<i64>,
    pub last_round: i64,
    /// Tags per node, as the backend reports them.
    pub tags: BTreeMap<String, BTreeSet<String>>,
    pub policy: Policy,
    /// When present, evacuations in one round must pass `capacity::admit`.
    pub capacity: Option<Capacity>,
    /// The managed nodes, when known: events of any other node are forgotten.
    pub members: Option<BTreeSet<String>>,
    /// At most this many remedy Jobs in one round (cluster-wide); the others wait.
    pub max_remedies: Option<usize>,
    /// The cluster's own upkeep (instance repairs, balancing moves) still runs: the next round
    /// waits for it.
    pub upkeep_running: bool,
    /// Nodes an operator put in maintenance, with why: their events start no job meanwhile.
    pub maintenance: BTreeMap<String, String>,
}

/// What the last poll says about a node.
#[derive(Debug, Clone)]
pub enum Observation {
    /// A report that passed verification.
    Report(Verdict),
    /// Unreachable, rejected, or not polled yet: nothing is concluded from it.
    Unknown,
}

/// Source marker in the details of verdicts derived from node conditions (Kubernetes).
pub const CONDITION_SOURCE: &str = "node-condition";

/// What this tick knows: the collectors' reports and, on Kubernetes, verdicts derived from node
/// conditions. The two are separate sources of events for the same rounds.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub reports: BTreeMap<String, Observation>,
    /// `None` when the conditions could not be read this tick: nothing is concluded from them.
    pub conditions: Option<BTreeMap<String, Vec<Verdict>>>,
}

impl Observations {
    pub fn new() -> Observations {
        Observations::default()
    }

    pub fn report(&self, node: &str) -> Option<&Verdict> {
        match self.reports.get(node) {
            Some(Observation::Report(v)) => Some(v),
            _ => None,
        }
    }

    pub(super) fn conditions_of(&self, node: &str) -> Option<&[Verdict]> {
        self.conditions
            .as_ref()
            .map(|c| c.get(node).map(Vec::as_slice).unwrap_or(&[]))
    }
}

impl FromIterator<(String, Observation)> for Observations {
    fn from_iter<I: IntoIterator<Item = (String, Observation)>>(iter: I) -> Observations {
        Observations {
            reports: iter.into_iter().collect(),
            conditions: None,
        }
    }
}

/// Capacity facts for admitting evacuations (Kubernetes); without them only the rounds limit.
#[derive(Debug, Clone, Default)]
pub struct Capacity {
    pub snapshot: super::capacity::Snapshot,
    pub max_disruptions: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub event: Uuid,
    pub node: String,
    pub kind: JobKind,
    pub command: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    CreateEvent(Event),
    /// Ends an active event without a tag (operator cancel is an API call; here: supersession).
    Cancel {
        event: Uuid,
        superseded_by: Uuid,
    },
    Acknowledge {
        event: Uuid,
    },
    Clear {
        event: Uuid,
        why: String,
    },
    /// The node left the inventory (or the cluster): its event is cleared and its running jobs
    /// end as failed, with `why`; nothing more runs or is tagged on that node.
    Forget {
        event: Uuid,
        node: String,
        why: String,
    },
    /// Sets a final status and the tag to apply.
    Finalize {
        event: Uuid,
        node: String,
        status: RepairStatus,
        tag: String,
        note: Option<String>,
    },
    /// Re-applies a final event's tag that was recorded but never reached the backend.
    ApplyTag {
        event: Uuid,
        node: String,
        tag: String,
    },
    Note {
        event: Uuid,
        note: Option<String>,
    },
    /// All jobs of a round, submitted at once; no node appears twice.
    StartRound {
        round: i64,
        jobs: Vec<JobSpec>,
    },
}
