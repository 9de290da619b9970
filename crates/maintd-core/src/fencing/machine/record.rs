//! A flow's fence plan as the flow records it when it starts, without a secret value: what it
//! runs by to its end, across restarts and failovers, whatever the configuration became since.

use super::*;

/// How a stage's methods must succeed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ExecPolicy {
    /// Every method must succeed (a Pacemaker fencing level).
    #[default]
    All,
    /// The first method that succeeds wins.
    Any,
}

/// Where a method's agent calls run.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Executor {
    /// On the daemon's host (the default).
    #[default]
    Local,
    /// As a Kubernetes Job (`agent-image`) on a node other than the one being fenced, and on
    /// retry another than the failed attempt's: for clusters where only some nodes reach the
    /// BMC network.
    Job,
}

/// The plan a flow started with. Secret parameters are named, never valued: a daemon that
/// resumes the flow takes their values from the node's plan in force then (a password rotated
/// since is the one the device now wants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct PlanRecord {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageRecord>,
    #[serde(default)]
    pub self_fence: bool,
    #[serde(default)]
    pub kdump: bool,
}

/// One stage of a recorded plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct StageRecord {
    /// `isolation`, `power-management`, `power-on` or `recovery`.
    pub step: Step,
    pub policy: ExecPolicy,
    pub timeout_ms: u64,
    pub retries: u32,
    pub retry_interval_ms: u64,
    pub methods: Vec<MethodRecord>,
}

/// One method of a recorded stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct MethodRecord {
    pub name: String,
    pub agent: String,
    pub action: String,
    /// Every parameter but the secret ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// The parameters whose values are secret: named only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_params: Vec<String>,
    pub required: bool,
    pub executor: Executor,
    pub power_on: bool,
}

impl PlanRecord {
    pub fn stage(&self, step: Step) -> Option<&StageRecord> {
        self.stages.iter().find(|s| s.step == step)
    }

    /// What the state machine needs of the plan: each stage's retry limits.
    pub fn summary(&self) -> PlanSummary {
        PlanSummary::of(
            |step| {
                self.stage(step)
                    .map(|s| StageLimits::recorded(s.retries, s.retry_interval_ms))
            },
            self.self_fence,
            self.kdump,
        )
    }
}

impl StageLimits {
    /// A stage's limits as a record keeps them (the interval in whole milliseconds), so a plan
    /// in force and the record of it summarize alike.
    pub fn recorded(retries: u32, retry_interval_ms: u64) -> StageLimits {
        StageLimits {
            retries,
            retry_interval: (retry_interval_ms as Nanos).saturating_mul(1_000_000),
        }
    }
}

impl PlanSummary {
    /// The summary of a plan whose stage for each step has `limits` (none: no such stage).
    pub fn of(limits: impl Fn(Step) -> Option<StageLimits>, self_fence: bool, kdump: bool) -> Self {
        PlanSummary {
            isolation: limits(Step::Isolation),
            power_management: limits(Step::PowerManagement),
            power_on: limits(Step::PowerOn),
            recovery: limits(Step::Recovery).unwrap_or(StageLimits {
                retries: 0,
                retry_interval: 0,
            }),
            self_fence,
            kdump,
        }
    }
}
