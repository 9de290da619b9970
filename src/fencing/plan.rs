//! The resolved fence plans: a node's stages, each stage's methods with every parameter the
//! agent gets, and where and under which policy they run. What the configuration (TOML or
//! ConfigMaps) turns into, and what the executor and the readiness checks act on.

use std::collections::BTreeMap;
use std::time::Duration;

use maintd_core::fencing::machine::{
    MethodRecord, PlanRecord, PlanSummary, StageLimits, StageRecord, Step,
};

// The policy and the executor are recorded with each flow's plan, so they are the machine's.
pub use maintd_core::fencing::machine::{ExecPolicy, Executor};

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
    /// What the fence state machine needs of the plan: each stage's retry limits, rounded as
    /// the record keeps them, so a flow resumed from its record decides exactly as the one
    /// that started it.
    pub fn summary(&self) -> PlanSummary {
        let limits = |step| {
            self.stage(step)
                .map(|s| StageLimits::recorded(s.retries, s.retry_interval.as_millis() as u64))
        };
        PlanSummary::of(limits, self.self_fence, self.kdump)
    }

    fn stages(&self) -> impl Iterator<Item = (Step, &Stage)> {
        [
            (Step::Isolation, self.isolation.as_ref()),
            (Step::PowerManagement, self.power_management.as_ref()),
            (Step::PowerOn, self.power_on.as_ref()),
            (Step::Recovery, self.recovery.as_ref()),
        ]
        .into_iter()
        .filter_map(|(step, s)| Some((step, s?)))
    }

    /// The plan as a flow records it: every secret parameter named, none valued.
    pub fn record(&self) -> PlanRecord {
        let method = |m: &Method| {
            let (secret, plain): (Vec<_>, Vec<_>) =
                m.params.iter().partition(|(_, v)| m.secrets.contains(v));
            MethodRecord {
                name: m.name.clone(),
                agent: m.agent.clone(),
                action: m.action.clone(),
                params: plain
                    .into_iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                secret_params: secret.into_iter().map(|(k, _)| k.clone()).collect(),
                required: m.required,
                executor: m.executor,
                power_on: m.power_on,
            }
        };
        PlanRecord {
            stages: self
                .stages()
                .map(|(step, s)| StageRecord {
                    step,
                    policy: s.policy,
                    timeout_ms: s.timeout.as_millis() as u64,
                    retries: s.retries,
                    retry_interval_ms: s.retry_interval.as_millis() as u64,
                    methods: s.methods.iter().map(method).collect(),
                })
                .collect(),
            self_fence: self.self_fence,
            kdump: self.kdump,
        }
    }

    /// The plan a flow recorded, its secret parameters valued from `current` (the node's plan
    /// in force now), from the closest method that has the parameter as a secret: the same
    /// method of the same stage, the same method in another stage, then (a method renamed
    /// since) a method of the same agent in the same stage, then in another. A wrong guess can
    /// only fail the call (the device refuses it), never act on another device: the method's
    /// own parameters, its address among them, stay the recorded ones.
    pub fn restore(
        record: &PlanRecord,
        current: Option<&FencePlan>,
    ) -> Result<FencePlan, Unrestorable> {
        fn secret_in<'a>(
            s: &'a Stage,
            like: &dyn Fn(&Method) -> bool,
            param: &str,
        ) -> Option<&'a String> {
            s.methods
                .iter()
                .filter(|c| like(c))
                .find_map(|c| c.params.get(param).filter(|v| c.secrets.contains(v)))
        }
        let value = |step: Step, m: &MethodRecord, param: &str| {
            let current = current?;
            let same = |c: &Method| c.name == m.name;
            let agent = |c: &Method| c.agent == m.agent;
            let here = current.stage(step);
            let anywhere = |like: &dyn Fn(&Method) -> bool| {
                current
                    .stages()
                    .find_map(|(_, s)| secret_in(s, like, param))
            };
            here.and_then(|s| secret_in(s, &same, param))
                .or_else(|| anywhere(&same))
                .or_else(|| here.and_then(|s| secret_in(s, &agent, param)))
                .or_else(|| anywhere(&agent))
                .cloned()
        };
        let mut plan = FencePlan {
            isolation: None,
            power_management: None,
            power_on: None,
            recovery: None,
            self_fence: record.self_fence,
            kdump: record.kdump,
        };
        for s in &record.stages {
            let mut methods = Vec::new();
            for m in &s.methods {
                let mut params = m.params.clone();
                let mut secrets = Vec::new();
                for p in &m.secret_params {
                    let v = value(s.step, m, p).ok_or_else(|| Unrestorable {
                        method: m.name.clone(),
                        param: p.clone(),
                    })?;
                    secrets.push(v.clone());
                    params.insert(p.clone(), v);
                }
                methods.push(Method {
                    name: m.name.clone(),
                    agent: m.agent.clone(),
                    action: m.action.clone(),
                    params,
                    secrets,
                    required: m.required,
                    executor: m.executor,
                    power_on: m.power_on,
                });
            }
            let stage = Some(Stage {
                policy: s.policy,
                timeout: Duration::from_millis(s.timeout_ms),
                retries: s.retries,
                retry_interval: Duration::from_millis(s.retry_interval_ms),
                methods,
            });
            match s.step {
                Step::Isolation => plan.isolation = stage,
                Step::PowerManagement => plan.power_management = stage,
                Step::PowerOn => plan.power_on = stage,
                Step::Recovery => plan.recovery = stage,
                // A plan has no stage of agents for self-fencing: such a record is not ours.
                Step::SelfFence => {}
            }
        }
        Ok(plan)
    }

    /// Every secret value of every method of the plan.
    pub fn secrets(&self) -> impl Iterator<Item = &String> {
        self.stages()
            .flat_map(|(_, s)| &s.methods)
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

/// The plan a flow this process did not start runs by: the one it recorded, its secrets from
/// the node's plan in force (`current`). A flow recorded before plans were, or whose secret is
/// gone from the configuration, goes on with `current`, and the latter says so.
pub fn resumed(
    f: &maintd_core::fencing::machine::Flow,
    current: Option<&FencePlan>,
) -> Option<FencePlan> {
    let Some(record) = &f.plan else {
        return current.cloned();
    };
    match FencePlan::restore(record, current) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(flow = %f.id, node = %f.node, error = %e, "the plan the flow started with cannot be restored: it goes on with the node's plan in force");
            current.cloned()
        }
    }
}

/// A flow's recorded plan names a secret parameter that no method of the node's plan in force
/// has any more.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("method {method}'s {param} is no longer configured for the node")]
pub struct Unrestorable {
    pub method: String,
    pub param: String,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn method(name: &str, action: &str, password: &str) -> Method {
        Method {
            name: name.into(),
            agent: "fence_ipmilan".into(),
            action: action.into(),
            params: BTreeMap::from([
                ("ip".into(), "10.9.9.9".into()),
                ("username".into(), "admin".into()),
                ("password".into(), password.into()),
            ]),
            secrets: vec![password.into()],
            required: true,
            executor: Executor::Local,
            power_on: action == "off",
        }
    }

    fn plan(password: &str) -> FencePlan {
        let stage = |action| Stage {
            policy: ExecPolicy::Any,
            timeout: Duration::from_secs(20),
            retries: 2,
            retry_interval: Duration::from_millis(1500),
            methods: vec![method("ipmi#0", action, password)],
        };
        FencePlan {
            isolation: None,
            power_management: Some(stage("off")),
            power_on: Some(stage("on")),
            recovery: None,
            self_fence: false,
            kdump: true,
        }
    }

    #[test]
    fn a_record_names_the_secret_parameters_and_never_values_them() {
        let r = plan("hunter2-pw").record();
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("hunter2-pw"), "{json}");
        let m = &r.stage(Step::PowerManagement).unwrap().methods[0];
        assert_eq!(m.secret_params, vec!["password".to_string()]);
        assert_eq!(m.params.get("username").map(String::as_str), Some("admin"));
        assert_eq!(serde_json::from_str::<PlanRecord>(&json).unwrap(), r);
    }

    #[test]
    fn a_restored_plan_is_the_recorded_one_with_the_secrets_in_force_now() {
        let old = plan("old-pw");
        let r = old.record();
        assert_eq!(FencePlan::restore(&r, Some(&old)).unwrap(), old);
        assert_eq!(r.summary(), old.summary());
        // The password was rotated and the stages changed since: the stages stay as recorded,
        // the password is the one the device now wants.
        let mut now = plan("new-pw");
        now.power_on = None;
        now.power_management.as_mut().unwrap().retries = 0;
        let p = FencePlan::restore(&r, Some(&now)).unwrap();
        assert_eq!(p.power_management.as_ref().unwrap().retries, 2);
        assert!(p.power_on.is_some());
        let on = &p.power_on.as_ref().unwrap().methods[0];
        assert_eq!(
            on.params["password"], "new-pw",
            "from another stage's same method"
        );
        assert_eq!(on.secrets, vec!["new-pw".to_string()], "and redacted");
    }

    #[test]
    fn a_renamed_method_of_the_same_agent_lends_its_secret() {
        let r = plan("old-pw").record();
        let mut now = plan("new-pw");
        now.power_management.as_mut().unwrap().methods[0].name = "bmc#0".into();
        now.power_on = None;
        let p = FencePlan::restore(&r, Some(&now)).unwrap();
        let off = &p.power_management.as_ref().unwrap().methods[0];
        assert_eq!(off.name, "ipmi#0", "the recorded method");
        assert_eq!(
            off.params["password"], "new-pw",
            "the renamed one's password"
        );
    }

    #[test]
    fn a_secret_gone_from_the_configuration_cannot_be_restored() {
        let r = plan("pw").record();
        let mut now = plan("pw");
        now.power_management.as_mut().unwrap().methods[0].name = "redfish#0".into();
        now.power_management.as_mut().unwrap().methods[0].agent = "fence_redfish".into();
        now.power_on = None;
        assert_eq!(
            FencePlan::restore(&r, Some(&now)).unwrap_err().to_string(),
            "method ipmi#0's password is no longer configured for the node"
        );
        assert!(FencePlan::restore(&r, None).is_err());
    }
}
