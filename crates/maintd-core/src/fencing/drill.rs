//! Fencing drills: a healthy, drained node is fenced on purpose through its real flow (off,
//! verified, released, on, verified, back in service on a new boot), so an operator knows every
//! node's fence path works, and how long each stage takes, before a node dies. The record and
//! its stage times; pure.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::fencing::machine::Flow;
use crate::verdict::Nanos;

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
pub enum DrillStatus {
    /// The node is drained through the normal evacuation.
    Evacuating,
    /// Its fence flow runs (the request waits at the gates first).
    Fencing,
    /// Back in service: the evacuation is undone.
    Restoring,
    Passed,
    Failed,
    /// The evacuation could not move what the node runs: nothing was fenced.
    Refused,
}

impl DrillStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            DrillStatus::Passed | DrillStatus::Failed | DrillStatus::Refused
        )
    }
}

/// One measured stage of a drill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DrillStage {
    pub stage: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Drill {
    pub id: Uuid,
    pub node: String,
    pub status: DrillStatus,
    /// Numbers the drill's jobs (the store's row number).
    #[serde(default)]
    pub seq: i64,
    pub requested: Nanos,
    pub updated: Nanos,
    /// The fence flow it runs (its request's id, taken by the flow).
    pub flow: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuated_at: Option<Nanos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Nanos>,
    /// Why it waits, failed or was refused; what the evacuation said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Each stage's measured time, once passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<DrillStage>,
}

impl Drill {
    /// A drill `id` of `node` requested at `now`, whose fence flow will be `flow`.
    pub fn new(node: &str, now: Nanos, id: Uuid, flow: Uuid) -> Drill {
        Drill {
            id,
            node: node.into(),
            status: DrillStatus::Evacuating,
            seq: 0,
            requested: now,
            updated: now,
            flow,
            evacuated_at: None,
            finished: None,
            detail: None,
            stages: Vec::new(),
        }
    }

    /// Who asked for the flow, as its witnesses record it.
    pub fn requester(&self) -> String {
        format!("drill {}", self.id)
    }
}

/// The measured stages of a drill whose flow returned the node to service: evacuation, then
/// the flow's own (start to verified off, the release, the verified power-on, boot to its
/// first report, the healthy reports and witnesses, the return), and the total.
pub fn stages(d: &Drill, f: &Flow) -> Vec<DrillStage> {
    let secs = |a: Nanos, b: Nanos| b.saturating_sub(a).max(0) as f64 / 1e9;
    let new_boot = f
        .history
        .iter()
        .find(|t| t.note.starts_with("new boot id"))
        .map(|t| t.at);
    let mut out = Vec::new();
    let mut push = |stage: &str, a: Option<Nanos>, b: Option<Nanos>| {
        if let (Some(a), Some(b)) = (a, b) {
            out.push(DrillStage {
                stage: stage.into(),
                seconds: secs(a, b),
            });
        }
    };
    push("evacuation", Some(d.requested), d.evacuated_at);
    push("power-off", Some(f.created), f.fenced_at);
    push("release", f.fenced_at, f.released_at);
    push("power-on", f.released_at, f.powered_on_at);
    push("boot", f.powered_on_at, new_boot);
    push("return", new_boot, f.returned_at);
    push("total", Some(d.requested), f.returned_at);
    out
}
