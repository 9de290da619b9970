//! The resolved fence plans: a node's stages, each stage's methods with every parameter the
//! agent gets, and where and under which policy they run. What the configuration (TOML or
//! ConfigMaps) turns into, and what the executor and the readiness checks act on.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::fencing::machine::Step;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ExecPolicy {
    /// Every method must succeed (a Pacemaker fencing level).
    #[default]
    All,
    /// The first method that succeeds wins.
    Any,
}

/// One resolved method: the agent and every parameter it gets on stdin (secrets included).
#[derive(Clone, PartialEq)]
pub struct Method {
    pub name: String,
    pub agent: String,
    pub action: String,
    pub params: BTreeMap<String, String>,
    /// The values read from secret files, for redaction of agent output.
    pub secrets: Vec<String>,
    /// Its failure fails the stage (`must_success`); an optional method's failure is noted
    /// and the stage still needs one success.
    pub required: bool,
    /// Where its calls run.
    pub executor: Executor,
    /// A power-off method: power the node back on after its workloads were released
    /// (`after-release = "on"`, the default).
    pub power_on: bool,
}

/// Where a method's agent calls run.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
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

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Parameters may hold secrets: never print them.
        f.debug_struct("Method")
            .field("name", &self.name)
            .field("agent", &self.agent)
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub policy: ExecPolicy,
    pub timeout: Duration,
    pub retries: u32,
    pub retry_interval: Duration,
    pub methods: Vec<Method>,
}

/// A node's validated fence configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct FencePlan {
    pub isolation: Option<Stage>,
    pub power_management: Option<Stage>,
    /// Power back on after the release, each method verified by a status that reads ON.
    pub power_on: Option<Stage>,
    pub recovery: Option<Stage>,
    pub self_fence: bool,
    /// kdump notifications from the node count (see `NodeFenceConfig::kdump`).
    pub kdump: bool,
}

impl FencePlan {
    /// What the fence state machine needs of the plan: each stage's retry limits.
    pub fn summary(&self) -> crate::fencing::machine::PlanSummary {
        use crate::fencing::machine::StageLimits;
        let limits = |s: &Stage| StageLimits {
            retries: s.retries,
            retry_interval: s.retry_interval.as_nanos() as crate::verdict::Nanos,
        };
        crate::fencing::machine::PlanSummary {
            isolation: self.isolation.as_ref().map(limits),
            power_management: self.power_management.as_ref().map(limits),
            power_on: self.power_on.as_ref().map(limits),
            recovery: self.recovery.as_ref().map(limits).unwrap_or(StageLimits {
                retries: 0,
                retry_interval: 0,
            }),
            self_fence: self.self_fence,
            kdump: self.kdump,
        }
    }

    /// Every secret value of every method of the plan.
    pub fn secrets(&self) -> impl Iterator<Item = &String> {
        [
            self.isolation.as_ref(),
            self.power_management.as_ref(),
            self.power_on.as_ref(),
            self.recovery.as_ref(),
        ]
        .into_iter()
        .flatten()
        .flat_map(|s| &s.methods)
        .flat_map(|m| &m.secrets)
    }

    pub fn stage(&self, step: Step) -> Option<&Stage> {
        match step {
            Step::Isolation => self.isolation.as_ref(),
            Step::PowerManagement => self.power_management.as_ref(),
            Step::PowerOn => self.power_on.as_ref(),
            Step::Recovery => self.recovery.as_ref(),
            Step::SelfFence => None,
        }
    }
}

/// Splits a power-management stage into its power-off methods and its power-on stage: the
/// methods written with action `on` (as `eaton-off eaton-on`) when there are any, else an `on`
/// of each power-off method whose `after-release` is `on`. The power-on stage keeps the
/// stage's policy, timeout and retries; `None` leaves the node off for a person.
pub fn split_power_on(power: &mut Stage) -> Option<Stage> {
    let (off, on): (Vec<Method>, Vec<Method>) =
        power.methods.drain(..).partition(|m| m.action == "off");
    power.methods = off;
    let on = if on.is_empty() {
        power
            .methods
            .iter()
            .filter(|m| m.power_on)
            .map(|m| Method {
                action: "on".into(),
                ..m.clone()
            })
            .collect()
    } else {
        on
    };
    (!on.is_empty()).then(|| Stage {
        methods: on,
        ..power.clone()
    })
}
