//! Fence-agent calls run as Kubernetes Jobs: the agent's options (secrets included) in a Secret
//! the Job owns, read on stdin inside the pod; the pod placed away from the node being fenced
//! and from the node of the last failed call; the exit code and output read back from the
//! container's termination message. The same verification applies as for a local call: only a
//! `status` that answers OFF proves a power-off.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::call::{Answer, CallSite};
use super::config::Method;
use crate::cluster::pods::{FILES_DIR, Placement, PodRun, PodRunner};

/// Beyond the agent's own deadline, the time a Job gets to be scheduled and start its pod.
const START_ALLOWANCE: Duration = Duration::from_secs(30);
/// Finished agent Jobs are kept this long for an operator to read.
const TTL: Duration = Duration::from_secs(3600);
/// The termination message is at most 4 KiB; the output's tail keeps well within it.
const OUTPUT_TAIL: usize = 3000;
/// The last line of the termination message: the agent's exit code.
const EXIT_MARK: &str = "maintd-exit=";

/// Runs the agent ($1) on the options file, killed at the deadline as a local call is, and
/// writes its output's tail and exit code as the termination message. Lines that hold a secret
/// value are dropped first: the message is stored in the pod's status, which more people read
/// than the daemon's log. The pod itself exits 0 once the agent ran: the Job's failure means
/// only that the agent never ran.
const SCRIPT: &str = r#"out=$(timeout -s KILL "$MAINTD_AGENT_TIMEOUT" "$1" < "$MAINTD_AGENT_OPTIONS" 2>&1); rc=$?
out=$(printf '%s\n' "$out" | grep -vF -f "$MAINTD_AGENT_REDACT")
printf '%s\n%s%s\n' "$(printf '%s' "$out" | tail -c 3000)" "maintd-exit=" "$rc" > "$MAINTD_RESULT""#;

/// The Jobs' runner and the image that holds the agents.
#[derive(Clone)]
pub struct AgentJobs {
    pub pods: Arc<dyn PodRunner>,
    pub image: String,
}

/// The Job's name: the same call of the same flow gets the same name (a new leader that
/// repeats an interrupted step adopts its Job instead of calling the device twice); a
/// readiness check is new each time.
fn job_name(site: &CallSite, method: &Method, action: &str) -> String {
    let mut h = Sha256::new();
    match site.flow {
        Some(f) => h.update(format!("{f}/{}", site.seq)),
        None => h.update(format!(
            "check/{}/{}",
            site.node,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        )),
    }
    h.update(format!("/{}/{action}", method.name));
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("maintd-agent-{hex}")
}

/// The exit code and the output, from the termination message.
fn parse_message(message: &str) -> (Option<i32>, String) {
    let trimmed = message.trim_end();
    match trimmed.rsplit_once('\n') {
        Some((out, last)) if last.starts_with(EXIT_MARK) => {
            (last[EXIT_MARK.len()..].trim().parse().ok(), out.to_string())
        }
        None if trimmed.starts_with(EXIT_MARK) => (
            trimmed[EXIT_MARK.len()..].trim().parse().ok(),
            String::new(),
        ),
        _ => (None, trimmed.to_string()),
    }
}

/// The run for one call.
pub fn agent_run(
    image: &str,
    dir: &Path,
    site: &CallSite,
    method: &Method,
    action: &str,
    deadline: Duration,
) -> PodRun {
    let mut labels = BTreeMap::from([
        ("maintd.io/role".to_string(), "fence-agent".to_string()),
        ("maintd.io/action".to_string(), action.to_string()),
    ]);
    if let Some(f) = site.flow {
        labels.insert(
            crate::cluster::kube::nodefence::FLOW_LABEL.into(),
            f.to_string(),
        );
    }
    let template = serde_json::json!({
        "spec": {
            "containers": [{
                "name": "agent",
                "image": image,
                "command": ["/bin/sh", "-c", SCRIPT, "maintd-agent",
                            dir.join(&method.agent).to_string_lossy()],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }],
        },
    });
    let mut avoid = vec![site.node.clone()];
    avoid.extend(site.failed_on.clone());
    PodRun {
        name: job_name(site, method, action),
        labels,
        template,
        env: vec![
            ("LANG".into(), "C.UTF-8".into()),
            (
                "MAINTD_AGENT_OPTIONS".into(),
                format!("{FILES_DIR}/options"),
            ),
            ("MAINTD_AGENT_REDACT".into(), format!("{FILES_DIR}/redact")),
            (
                "MAINTD_AGENT_TIMEOUT".into(),
                deadline.as_secs().max(1).to_string(),
            ),
            ("MAINTD_RESULT".into(), "/dev/termination-log".into()),
        ],
        placement: Placement::AwayFrom(avoid),
        files: BTreeMap::from([
            (
                "options".to_string(),
                String::from_utf8_lossy(&super::call::stdin_params(method, action)).into_owned(),
            ),
            (
                "redact".to_string(),
                method
                    .secrets
                    .iter()
                    .filter(|v| !v.is_empty() && !v.contains('\n'))
                    .map(|v| format!("{v}\n"))
                    .collect(),
            ),
        ]),
        deadline: deadline + START_ALLOWANCE,
        ttl: TTL,
    }
}

impl AgentJobs {
    /// One call as a Job; the answer's output is not redacted yet (the caller does).
    pub async fn call(
        &self,
        dir: &Path,
        site: &CallSite,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> Answer {
        if self.image.is_empty() {
            return Answer {
                code: None,
                output: "executor = job needs [fencing] agent-image".into(),
                host: None,
            };
        }
        let run = agent_run(&self.image, dir, site, method, action, deadline);
        match self.pods.run_pod(run).await {
            Ok(o) => {
                let (code, output) = match (&o.message, o.succeeded) {
                    (Some(m), true) => parse_message(m),
                    // The agent never ran (no node could take it, the image is missing, the
                    // deadline passed): no exit code, and the Job's account as the output.
                    _ => (None, o.detail.clone()),
                };
                let output = if output.len() > OUTPUT_TAIL {
                    output[output.len() - OUTPUT_TAIL..].to_string()
                } else {
                    output
                };
                Answer {
                    code,
                    output,
                    host: o.host,
                }
            }
            Err(e) => Answer {
                code: None,
                output: e.to_string(),
                host: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method() -> Method {
        Method {
            name: "ipmi#0".into(),
            agent: "fence_ipmilan".into(),
            action: "off".into(),
            params: BTreeMap::from([
                ("ip".to_string(), "10.0.0.9".to_string()),
                ("password".to_string(), "hunter2".to_string()),
            ]),
            secrets: vec!["hunter2".into()],
            required: true,
            power_on: false,
            executor: super::super::config::Executor::Job,
        }
    }

    #[test]
    fn the_exit_code_and_output_come_from_the_termination_message() {
        assert_eq!(
            parse_message("Status: OFF\nmaintd-exit=2\n"),
            (Some(2), "Status: OFF".into())
        );
        assert_eq!(parse_message("maintd-exit=0"), (Some(0), String::new()));
        assert_eq!(
            parse_message("a\nb\nmaintd-exit=1\n"),
            (Some(1), "a\nb".into())
        );
        // No mark: the agent's code is unknown, never guessed.
        assert_eq!(parse_message("killed\n"), (None, "killed".into()));
        assert_eq!(parse_message("x\nmaintd-exit=zz"), (None, "x".into()));
    }

    /// The pod's script, run by a real shell: the agent gets its options on stdin, a line with
    /// a secret never reaches the termination message, and the exit code does.
    #[test]
    fn the_pod_script_reports_the_exit_code_and_drops_secret_lines() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("fence_fake");
        std::fs::write(
            &agent,
            "#!/bin/sh\nread -r first\necho \"got $first\"\ncat >/dev/null\necho 'debug: -P hunter2'\necho 'Status: OFF'\nexit 2\n",
        )
        .unwrap();
        std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let run = agent_run(
            "img",
            dir.path(),
            &CallSite::default(),
            &Method {
                agent: "fence_fake".into(),
                ..method()
            },
            "status",
            Duration::from_secs(5),
        );
        for (k, v) in &run.files {
            std::fs::write(dir.path().join(k), v).unwrap();
        }
        let result = dir.path().join("termination-log");
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", SCRIPT, "maintd-agent"])
            .arg(&agent)
            .env("MAINTD_AGENT_OPTIONS", dir.path().join("options"))
            .env("MAINTD_AGENT_REDACT", dir.path().join("redact"))
            .env("MAINTD_AGENT_TIMEOUT", "5")
            .env("MAINTD_RESULT", &result)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let message = std::fs::read_to_string(&result).unwrap();
        assert!(!message.contains("hunter2"), "{message}");
        assert_eq!(
            parse_message(&message),
            (Some(2), "got action=status\nStatus: OFF".into())
        );
    }

    #[test]
    fn a_flows_call_has_one_name_and_runs_away_from_the_node_and_the_failed_host() {
        let flow = uuid::Uuid::from_u128(7);
        let mut site = CallSite {
            node: "n2".into(),
            flow: Some(flow),
            seq: 3,
            failed_on: Some("n1".into()),
        };
        let run = |site: &CallSite| {
            agent_run(
                "img",
                Path::new("/usr/sbin"),
                site,
                &method(),
                "off",
                Duration::from_secs(20),
            )
        };
        let a = run(&site);
        let b = run(&site);
        assert_eq!(a.name, b.name, "the same call adopts its Job");
        assert!(a.name.len() <= 63 && a.name.starts_with("maintd-agent-"));
        site.seq = 4;
        let c = run(&site);
        assert_ne!(a.name, c.name, "the next call is another Job");
        assert_eq!(
            a.placement,
            Placement::AwayFrom(vec!["n2".into(), "n1".into()])
        );
        // The password travels only in the Secret's file, never in the Job.
        assert!(a.files["options"].contains("password=hunter2\n"));
        assert!(a.files["options"].starts_with("action=off\n"));
        assert_eq!(a.files["redact"], "hunter2\n");
        let job = serde_json::to_string(&a.template).unwrap();
        let env = format!("{:?}", a.env);
        assert!(!job.contains("hunter2") && !env.contains("hunter2"));
        assert!(job.contains("/usr/sbin/fence_ipmilan"));
        assert_eq!(a.labels["maintd.io/flow"], flow.to_string());
        assert_eq!(a.deadline, Duration::from_secs(50));
    }
}
