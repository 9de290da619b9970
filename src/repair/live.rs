//! Live-repair jobs: a signed, idempotent request to the node's collector, then polling for the
//! result. A restarted daemon sends the same request again and gets the existing run back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use crate::http::error_message;
use crate::link::{Answer, CollectorLink, LinkError};
use crate::members::Members;
use crate::node::NodeConfig;
use crate::report::live::{LiveRepairRecord, RepairRequest, RepairState};
use maintd_core::repair::{Event, Job};
use maintd_core::verdict::Outcome;

const POLL: Duration = Duration::from_millis(250);
/// Extra time beyond the collector's own repair timeout before the daemon gives up.
const MARGIN: Duration = Duration::from_secs(30);

pub struct LiveRepairs {
    link: Arc<dyn CollectorLink>,
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
    /// Live repairs through `link`; the daemon waits `repair_timeout` and a margin.
    pub fn new(
        link: Arc<dyn CollectorLink>,
        repair_timeout: Duration,
        members: Arc<Members>,
    ) -> LiveRepairs {
        LiveRepairs {
            link,
            members,
            timeout: repair_timeout + MARGIN,
        }
    }

    async fn call(
        &self,
        node: &NodeConfig,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Progress {
        let Answer {
            status,
            body: bytes,
        } = match self.link.signed(node, method, path, body, 1 << 20).await {
            Ok(a) => a,
            Err(e @ LinkError::Down(_)) => {
                return Progress::Retry(format!("collector unreachable: {e}"));
            }
            Err(e) => return Progress::Retry(e.to_string()),
        };
        if status == http::StatusCode::NOT_FOUND {
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
        let Some(node) = self.members.find(&job.node) else {
            return Outcome::failed(format!("node {} has no collector address", job.node));
        };
        let node = &node;
        let Some(command) = job.command.clone() else {
            return Outcome::failed("live-repair job without a command");
        };
        let key = job.key();
        let req = RepairRequest {
            job: key.clone(),
            event: job.event.to_string(),
            command,
            input: maintd_core::verdict::ExactJson::assume_canonical(event.canonical.clone()),
        };
        let body = serde_json::to_vec(&req).expect("request serializes");
        let deadline = Instant::now() + self.timeout;
        let mut accepted = false;
        let mut last_err = String::new();
        while Instant::now() < deadline {
            let step = if accepted {
                self.call(node, http::Method::GET, &format!("/1/repair/{key}"), None)
                    .await
            } else {
                self.call(node, http::Method::POST, "/1/repair", Some(body.clone()))
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
                    return Outcome::of(
                        ok,
                        format!("{} on {}: {what}: {}", s.command, job.node, s.output.trim()),
                    );
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
