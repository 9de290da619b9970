//! The contract every script of `repair.d/` is run under: its arguments and `MAINTD_*`
//! environment, built in one place for inventory jobs, fence hooks and live repairs, so the three
//! callers cannot drift apart from what docs/configuration.md promises.

use std::time::Duration;

use crate::exec::RunSpec;
use maintd_core::tags::reference as reason_trail;

/// What a hook run is about. `job` and `action` are absent for live repairs, which run on the
/// node itself and are not jobs of the backend.
pub struct HookCall<'a> {
    pub node: &'a str,
    /// The event (repairs) or fence flow (release, reclaim) the hook serves.
    pub event: &'a str,
    pub job: Option<&'a str>,
    pub action: Option<&'a str>,
}

/// Output a hook may leave for the daemon or the operator: enough for an error line, bounded so a
/// chatty script cannot grow a job record.
pub const HOOK_OUTPUT_CAP: usize = 4096;

impl HookCall<'_> {
    /// The configured extra environment followed by the `MAINTD_*` variables; the latter win
    /// because a later entry overrides an earlier one of the same name.
    pub fn env(&self, extra: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = extra.to_vec();
        env.push(("MAINTD_NODE".into(), self.node.to_string()));
        env.push(("MAINTD_EVENT".into(), self.event.to_string()));
        if let Some(job) = self.job {
            env.push(("MAINTD_JOB".into(), job.to_string()));
        }
        if let Some(action) = self.action {
            env.push(("MAINTD_ACTION".into(), action.to_string()));
        }
        env.push(("MAINTD_REASON".into(), reason_trail(&self.event)));
        env
    }

    /// A backend hook (inventory job, release, reclaim): `<hook> <node> <event-id>`.
    pub fn spec(
        &self,
        program: std::path::PathBuf,
        stdin: Vec<u8>,
        extra: &[(String, String)],
        timeout: Duration,
    ) -> RunSpec {
        RunSpec {
            program,
            args: vec![self.node.to_string(), self.event.to_string()],
            stdin,
            env: self.env(extra),
            timeout,
            output_cap: HOOK_OUTPUT_CAP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn a_job_hook_gets_every_variable_and_they_override_the_configured_ones() {
        let event = Uuid::from_u128(7).to_string();
        let job = Uuid::from_u128(9).to_string();
        let call = HookCall {
            node: "n1",
            event: &event,
            job: Some(&job),
            action: Some("offline"),
        };
        let extra = vec![
            ("MAINTD_HOOK_LOG".to_string(), "/tmp/h.log".to_string()),
            ("MAINTD_NODE".to_string(), "spoofed".to_string()),
        ];
        let spec = call.spec("/bin/true".into(), vec![], &extra, Duration::from_secs(1));
        assert_eq!(spec.args, vec!["n1".to_string(), event.clone()]);
        let last = |k: &str| {
            spec.env
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(last("MAINTD_NODE").as_deref(), Some("n1"));
        assert_eq!(last("MAINTD_JOB"), Some(job));
        assert_eq!(last("MAINTD_ACTION").as_deref(), Some("offline"));
        assert_eq!(last("MAINTD_REASON"), Some(format!("maintd:{event}")));
        assert_eq!(last("MAINTD_HOOK_LOG").as_deref(), Some("/tmp/h.log"));
    }

    #[test]
    fn a_live_repair_has_no_job_or_action() {
        let event = Uuid::from_u128(7).to_string();
        let env = HookCall {
            node: "n1",
            event: &event,
            job: None,
            action: None,
        }
        .env(&[]);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["MAINTD_NODE", "MAINTD_EVENT", "MAINTD_REASON"]);
    }
}
