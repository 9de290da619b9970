//! Fence-agent execution: whitelisted `fence_*` agents, parameters on stdin (never argv), a
//! scrubbed environment, a hard deadline that kills the agent's process group, and power-off
//! verified by a `status` that must answer OFF.

use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::exec::{self, ExecError, RunSpec};
use maintd_core::fencing::machine::{Call, PENDING, Step};
use maintd_core::verdict::Nanos;
use maintd_core::verdict::{FailureKind, Outcome};

#[cfg(test)]
use super::call::NoJournal;
use super::call::stdin_params;
pub use super::call::{Answer, CallJournal, CallSite};
use super::config::{ExecPolicy, Method, Stage};

/// Agent exit codes (every ClusterLabs agent): 0 success or ON, 1 failure, 2 OFF.
pub const EXIT_OK: i32 = 0;
pub const EXIT_OFF: i32 = 2;
/// Agent actions that only read the device: made without a record first.
const READS: [&str; 4] = ["status", "monitor", "list", "metadata"];

/// How agents are run: the seam the executor's tests replace.
#[async_trait::async_trait]
pub trait AgentRunner: Send + Sync + 'static {
    /// Runs `agent` with `action`; returns the exit code (None when killed) and the output tail.
    async fn call(
        &self,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> (Option<i32>, String);

    /// The same, knowing what the call is for: a runner that places calls on other nodes
    /// (Jobs) needs it; the others run it here.
    async fn call_at(
        &self,
        _site: &CallSite,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> Answer {
        Answer::here(self.call(method, action, deadline).await)
    }
}

/// Runs the real agents: from the whitelist directory on this host, or, for a method whose
/// template says `executor = "job"`, as a Kubernetes Job on another node.
pub struct Agents {
    pub dir: PathBuf,
    /// Applied to every agent's output before anything else sees it.
    pub redact: super::redact::Redactor,
    /// Runs agent Jobs (the Kubernetes backend), with the image that holds the agents.
    pub jobs: Option<super::agentjob::AgentJobs>,
}

/// Agent output read, and what is kept of it after redaction.
const OUTPUT_READ: usize = 16 * 1024;
const OUTPUT_KEPT: usize = 400;

#[async_trait::async_trait]
impl AgentRunner for Agents {
    async fn call(
        &self,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> (Option<i32>, String) {
        let program = match exec::resolve(&self.dir, &method.agent) {
            Ok(p) => p,
            Err(e) => return (None, format!("agent refused: {e}")),
        };
        // No PCMK_* or anything else from our environment: with PCMK_service set, agents
        // disable their own timeouts.
        let spec = RunSpec {
            program,
            args: vec![],
            stdin: stdin_params(method, action),
            env: vec![("LANG".into(), "C.UTF-8".into())],
            timeout: deadline,
            output_cap: OUTPUT_READ,
        };
        match exec::run(&spec).await {
            Ok(out) => (
                out.code,
                // The method's own secrets too: a ConfigMap's come and go after start-up.
                self.redact
                    .with(&method.secrets)
                    .summarize(&out.tail(OUTPUT_READ), OUTPUT_KEPT),
            ),
            Err(ExecError::Timeout { timeout, .. }) => (
                None,
                format!("{KILLED} {timeout:?}; the agent's process group was killed"),
            ),
            Err(e) => (None, e.to_string()),
        }
    }

    async fn call_at(
        &self,
        site: &CallSite,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> Answer {
        if method.executor == super::config::Executor::Local {
            return Answer::here(self.call(method, action, deadline).await);
        }
        let Some(jobs) = &self.jobs else {
            return Answer {
                code: None,
                output: "executor = job needs the Kubernetes backend and [fencing] agent-image"
                    .into(),
                host: None,
            };
        };
        let mut a = jobs.call(&self.dir, site, method, action, deadline).await;
        a.output = self
            .redact
            .with(&method.secrets)
            .summarize(&a.output, OUTPUT_KEPT);
        a
    }
}

/// Runs one stage's methods under its policy and returns the outcome with every call made.
#[cfg(test)]
pub async fn run_stage(
    runner: &dyn AgentRunner,
    clock: &dyn Clock,
    site: &mut CallSite,
    step: Step,
    stage: Option<&Stage>,
) -> (Outcome, Vec<Call>) {
    let env = CallEnv {
        runner,
        clock,
        journal: &NoJournal,
    };
    run_stage_recorded(env, site, step, stage).await
}

/// What a stage's calls run with: the agents, the clock that times them, and where a
/// state-changing call is written before it is made.
#[derive(Clone, Copy)]
pub struct CallEnv<'a> {
    pub runner: &'a dyn AgentRunner,
    pub clock: &'a dyn Clock,
    pub journal: &'a dyn CallJournal,
}

/// `run_stage`, writing each state-changing call to the journal before it is made.
pub async fn run_stage_recorded(
    env: CallEnv<'_>,
    site: &mut CallSite,
    step: Step,
    stage: Option<&Stage>,
) -> (Outcome, Vec<Call>) {
    let Some(stage) = stage else {
        return (
            Outcome::done(format!("no {} methods configured", step.as_str())),
            vec![],
        );
    };
    let mut calls = Vec::new();
    let mut failures = Vec::new();
    let mut kind = None;
    let mut successes = Vec::new();
    let mut optional_failures = Vec::new();
    for m in &stage.methods {
        let ok = run_method(env, site, step, m, stage.timeout, &mut calls).await;
        match ok {
            Ok(()) => {
                successes.push(m.name.clone());
                if stage.policy == ExecPolicy::Any {
                    break;
                }
            }
            Err(why) if !m.required => {
                // An optional method (must_success=no): noted, and the stage goes on.
                optional_failures.push(format!("{} (optional): {why}", m.name));
            }
            Err(why) => {
                // A device that still reports power outranks any other failure.
                if kind != Some(FailureKind::StillOn) {
                    kind = Some(why.kind());
                }
                failures.push(format!("{}: {why}", m.name));
                if stage.policy == ExecPolicy::All {
                    break;
                }
            }
        }
    }
    // Optional methods never decide a stage alone: one method must have succeeded.
    let ok = match stage.policy {
        ExecPolicy::All => failures.is_empty() && !successes.is_empty(),
        ExecPolicy::Any => !successes.is_empty(),
    };
    if failures.is_empty() && !ok {
        failures = std::mem::take(&mut optional_failures);
    }
    let detail = if ok {
        let mut d = format!("{} ok ({})", step.as_str(), successes.join(", "));
        if !optional_failures.is_empty() {
            d.push_str(&format!("; {}", optional_failures.join("; ")));
        }
        d
    } else {
        failures.join("; ")
    };
    let outcome = match kind {
        Some(k) if !ok => Outcome::failed_as(k, detail),
        _ => Outcome::of(ok, detail),
    };
    (outcome, calls)
}

/// One agent call in a stage, as the place's runner makes it.
struct StageCall<'a> {
    env: CallEnv<'a>,
    site: &'a mut CallSite,
    step: Step,
}

async fn call(
    c: StageCall<'_>,
    m: &Method,
    action: &str,
    deadline: Duration,
    calls: &mut Vec<Call>,
) -> Option<i32> {
    let StageCall {
        env: CallEnv {
            runner,
            clock,
            journal,
        },
        site,
        step,
    } = c;
    let at: Nanos = clock.now();
    let started = Call {
        at,
        step,
        method: m.name.clone(),
        agent: m.agent.clone(),
        action: action.into(),
        code: None,
        ok: false,
        elapsed_ms: 0,
        output: PENDING.into(),
        host: None,
        pending: true,
    };
    // A read (status, monitor, list) changes nothing: only an action is recorded first.
    if !READS.contains(&action)
        && let Err(e) = journal.begin(&started).await
    {
        calls.push(Call {
            output: format!("not run: the call could not be recorded first: {e}"),
            pending: false,
            ..started
        });
        return None;
    }
    let t = std::time::Instant::now();
    let Answer { code, output, host } = runner.call_at(site, m, action, deadline).await;
    let ok = match action {
        "status" => matches!(code, Some(EXIT_OK) | Some(EXIT_OFF)),
        _ => code == Some(EXIT_OK),
    };
    site.seq += 1;
    if !ok && host.is_some() {
        site.failed_on = host.clone();
    }
    calls.push(Call {
        at,
        step,
        method: m.name.clone(),
        agent: m.agent.clone(),
        action: action.into(),
        code,
        ok,
        elapsed_ms: t.elapsed().as_millis() as u64,
        output,
        host,
        pending: false,
    });
    code
}

use maintd_core::fencing::machine::{KILLED, ended};

/// Why a method did not do its part.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MethodError {
    #[error("{agent} {action} failed ({}): {output}", ended(*code, output))]
    Action {
        agent: String,
        action: String,
        code: Option<i32>,
        output: String,
    },
    /// The device took the off but still reports power: the one failure a release must never
    /// follow.
    #[error("{agent} accepted off but status still reports ON")]
    StillOn { agent: String },
    #[error("{agent} accepted on but status still reports OFF")]
    StillOff { agent: String },
    #[error("{agent} status could not confirm power-{action} ({})", ended(*code, output))]
    Unconfirmed {
        agent: String,
        code: Option<i32>,
        action: String,
        output: String,
    },
}

impl MethodError {
    pub fn kind(&self) -> FailureKind {
        match self {
            MethodError::Action { .. } => FailureKind::Agent,
            MethodError::StillOn { .. } => FailureKind::StillOn,
            MethodError::StillOff { .. } => FailureKind::Agent,
            MethodError::Unconfirmed { .. } => FailureKind::Unconfirmed,
        }
    }
}

/// One method: the action, and for a power-off the `status` that proves it.
async fn run_method(
    env: CallEnv<'_>,
    site: &mut CallSite,
    step: Step,
    m: &Method,
    deadline: Duration,
    calls: &mut Vec<Call>,
) -> Result<(), MethodError> {
    let here = StageCall {
        env,
        site: &mut *site,
        step,
    };
    let code = call(here, m, &m.action, deadline, calls).await;
    if code != Some(EXIT_OK) {
        return Err(MethodError::Action {
            agent: m.agent.clone(),
            action: m.action.clone(),
            code,
            output: calls.last().map(|c| c.output.clone()).unwrap_or_default(),
        });
    }
    if !matches!(step, Step::PowerManagement | Step::PowerOn) {
        return Ok(());
    }
    // The action's own success is not proof: only a status answering OFF (or ON) is.
    let here = StageCall { env, site, step };
    let on = step == Step::PowerOn;
    match (call(here, m, "status", deadline, calls).await, on) {
        (Some(EXIT_OFF), false) | (Some(EXIT_OK), true) => Ok(()),
        (Some(EXIT_OK), false) => Err(MethodError::StillOn {
            agent: m.agent.clone(),
        }),
        (Some(EXIT_OFF), true) => Err(MethodError::StillOff {
            agent: m.agent.clone(),
        }),
        (code, _) => Err(MethodError::Unconfirmed {
            agent: m.agent.clone(),
            code,
            action: m.action.clone(),
            output: calls.last().map(|c| c.output.clone()).unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// A fake runner: answers from a script of (action -> code), recording calls.
    struct Fake {
        answers: Mutex<Vec<(String, Option<i32>)>>,
        seen: Mutex<Vec<(String, String)>>,
    }

    #[async_trait::async_trait]
    impl AgentRunner for Fake {
        async fn call(&self, m: &Method, action: &str, _: Duration) -> (Option<i32>, String) {
            self.seen
                .lock()
                .unwrap()
                .push((m.name.clone(), action.into()));
            let mut a = self.answers.lock().unwrap();
            let i = a
                .iter()
                .position(|(act, _)| act == action)
                .expect("scripted answer");
            // No exit code: killed at its deadline, as the real runner says it.
            match a.remove(i).1 {
                None => (
                    None,
                    format!("{KILLED} 1s; the agent's process group was killed"),
                ),
                code => (code, String::new()),
            }
        }
    }

    #[test]
    fn a_call_without_an_exit_code_says_whether_it_was_killed_or_never_ran() {
        assert_eq!(ended(Some(1), ""), "exit 1");
        let killed = format!("{KILLED} 20s; the agent's process group was killed");
        assert_eq!(ended(None, &killed), "killed at the deadline");
        assert_eq!(
            ended(
                None,
                "cannot start /usr/sbin/fence_gone: No such file or directory"
            ),
            "not run"
        );
        assert_eq!(ended(None, "agent refused: no agent fence_gone"), "not run");
    }

    fn fake(answers: &[(&str, Option<i32>)]) -> Fake {
        Fake {
            answers: Mutex::new(answers.iter().map(|(a, c)| (a.to_string(), *c)).collect()),
            seen: Mutex::new(vec![]),
        }
    }

    fn stage(policy: ExecPolicy, n: usize, action: &str) -> Stage {
        Stage {
            policy,
            timeout: Duration::from_secs(1),
            retries: 0,
            retry_interval: Duration::ZERO,
            methods: (0..n)
                .map(|i| Method {
                    name: format!("m{i}"),
                    agent: "fence_x".into(),
                    action: action.into(),
                    params: BTreeMap::new(),
                    secrets: vec![],
                    required: true,
                    power_on: false,
                    executor: Default::default(),
                })
                .collect(),
        }
    }

    #[tokio::test]
    async fn power_off_needs_a_status_that_answers_off() {
        let s = stage(ExecPolicy::All, 1, "off");
        let (o, calls) = run_stage(
            &fake(&[("off", Some(0)), ("status", Some(2))]),
            &SystemClock,
            &mut CallSite::default(),
            Step::PowerManagement,
            Some(&s),
        )
        .await;
        assert!(o.ok(), "{o:?}");
        assert_eq!(calls.len(), 2);
        let (o, _) = run_stage(
            &fake(&[("off", Some(0)), ("status", Some(0))]),
            &SystemClock,
            &mut CallSite::default(),
            Step::PowerManagement,
            Some(&s),
        )
        .await;
        assert!(!o.ok() && o.detail().contains("still reports ON"), "{o:?}");
        assert_eq!(o.failure(), Some(FailureKind::StillOn));
        let (o, _) = run_stage(
            &fake(&[("off", None)]),
            &SystemClock,
            &mut CallSite::default(),
            Step::PowerManagement,
            Some(&s),
        )
        .await;
        assert!(!o.ok() && o.detail().contains("killed"), "{o:?}");
        assert_eq!(o.failure(), Some(FailureKind::Agent));
    }

    #[tokio::test]
    async fn all_stops_at_the_first_failure_and_any_at_the_first_success() {
        let s = stage(ExecPolicy::All, 2, "off");
        let f = fake(&[("off", Some(1)), ("off", Some(0))]);
        let (o, _) = run_stage(
            &f,
            &SystemClock,
            &mut CallSite::default(),
            Step::Isolation,
            Some(&s),
        )
        .await;
        assert!(!o.ok());
        assert_eq!(f.seen.lock().unwrap().len(), 1);
        let s = stage(ExecPolicy::Any, 3, "on");
        let f = fake(&[("on", Some(1)), ("on", Some(0)), ("on", Some(0))]);
        let (o, _) = run_stage(
            &f,
            &SystemClock,
            &mut CallSite::default(),
            Step::Recovery,
            Some(&s),
        )
        .await;
        assert!(o.ok());
        assert_eq!(f.seen.lock().unwrap().len(), 2);
        let (o, calls) = run_stage(
            &f,
            &SystemClock,
            &mut CallSite::default(),
            Step::Recovery,
            None,
        )
        .await;
        assert!(o.ok() && calls.is_empty());
    }

    #[test]
    fn parameters_go_on_stdin_one_per_line() {
        let m = Method {
            name: "m".into(),
            agent: "fence_ipmilan".into(),
            action: "off".into(),
            params: [
                ("ip".to_string(), "10.0.0.1".to_string()),
                ("password".into(), "pw".into()),
            ]
            .into_iter()
            .collect(),
            secrets: vec!["pw".into()],
            required: true,
            power_on: false,
            executor: Default::default(),
        };
        assert_eq!(
            String::from_utf8(stdin_params(&m, "status")).unwrap(),
            "action=status\nip=10.0.0.1\npassword=pw\n"
        );
    }
}
