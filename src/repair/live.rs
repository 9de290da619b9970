//! Live-repair jobs: a signed, idempotent request to the node's collector, then polling for the
//! result. A restarted daemon sends the same request again and gets the existing run back.

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use crate::collector::{LiveRepairRecord, RepairRequest, RepairState};
use crate::http::{error_message, read_capped, send_signed};
use crate::repair::{Event, Job};
use crate::report::Key;
use crate::verdict::Outcome;

const POLL: Duration = Duration::from_millis(250);
/// Extra time beyond the collector's own repair timeout before the daemon gives up.
const MARGIN: Duration = Duration::from_secs(30);

pub struct LiveRepairs {
    client: reqwest::Client,
    key: Key,
    members: std::sync::Arc<crate::members::Members>,
    timeout: Duration,
}

enum Progress {
    Status(LiveRepairRecord),
    Missing,
    Refused(String),
    Retry(String),
}

impl LiveRepairs {
    pub fn new(
        key: Key,
        repair_timeout: Duration,
        members: std::sync::Arc<crate::members::Members>,
    ) -> LiveRepairs {
        LiveRepairs {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a plain HTTP client always builds"),
            key,
            members,
            timeout: repair_timeout + MARGIN,
        }
    }

    async fn call(
        &self,
        node: &str,
        base: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Progress {
        let resp = match send_signed(&self.client, &self.key, node, method, base, path, body).await
        {
            Ok(r) => r,
            Err(e) => return Progress::Retry(format!("collector unreachable: {e}")),
        };
        let status = resp.status();
        let bytes = match read_capped(resp, 1 << 20).await {
            Ok(b) => b,
            Err(e) => return Progress::Retry(e.to_string()),
        };
        if status == reqwest::StatusCode::NOT_FOUND {
            return Progress::Missing;
        }
        if status.is_client_error() {
            // The collector refused the request itself (bad command name, bad signature):
            // retrying cannot help.
            return Progress::Refused(error_message(status, &bytes));
        }
        if !status.is_success() {
            return Progress::Retry(error_message(status, &bytes));
        }
        match serde_json::from_slice(&bytes) {
            Ok(s) => Progress::Status(s),
            Err(e) => Progress::Retry(format!("collector sent an unreadable repair status: {e}")),
        }
    }

    pub async fn run(&self, job: &Job, event: &Event) -> Outcome {
        let Some(base) = self.members.find(&job.node).map(|n| n.collector_url("")) else {
            return Outcome::failed(format!("node {} has no collector address", job.node));
        };
        let base = &base;
        let Some(command) = job.command.clone() else {
            return Outcome::failed("live-repair job without a command");
        };
        let key = format!("{}-{}", job.event, job.id);
        let req = RepairRequest {
            job: key.clone(),
            event: job.event.to_string(),
            command,
            input: event.original.clone(),
        };
        let body = serde_json::to_vec(&req).expect("request serializes");
        let deadline = Instant::now() + self.timeout;
        let mut accepted = false;
        let mut last_err = String::new();
        while Instant::now() < deadline {
            let step = if accepted {
                self.call(
                    &job.node,
                    base,
                    reqwest::Method::GET,
                    &format!("/1/repair/{key}"),
                    None,
                )
                .await
            } else {
                self.call(
                    &job.node,
                    base,
                    reqwest::Method::POST,
                    "/1/repair",
                    Some(body.clone()),
                )
                .await
            };
            match step {
                Progress::Status(s) if s.state == RepairState::Done => {
                    let ok = s.exit_code == Some(0) && s.error.is_none();
                    let what = match (&s.error, s.exit_code) {
                        (Some(e), _) => e.clone(),
                        (None, Some(c)) => format!("exit {c}"),
                        (None, None) => "no exit code".into(),
                    };
                    return Outcome {
                        ok,
                        detail: format!(
                            "{} on {}: {what}: {}",
                            s.command,
                            job.node,
                            s.output.trim()
                        ),
                    };
                }
                Progress::Status(_) => accepted = true,
                Progress::Missing if accepted => {
                    return Outcome::failed(format!(
                        "collector on {} lost repair {key} (restarted?)",
                        job.node
                    ));
                }
                Progress::Missing => last_err = "collector has no repair endpoint".into(),
                Progress::Refused(e) => {
                    return Outcome::failed(format!(
                        "collector on {} refused the repair: {e}",
                        job.node
                    ));
                }
                Progress::Retry(e) => {
                    debug!(error = %e, "live repair: will retry");
                    last_err = e;
                }
            }
            tokio::time::sleep(POLL).await;
        }
        Outcome::failed(format!(
            "live repair on {} did not finish within {:?}: {last_err}",
            job.node, self.timeout
        ))
    }
}
