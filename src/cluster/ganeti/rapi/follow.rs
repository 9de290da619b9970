//! Following a Ganeti job to its end: the queue's own long poll, every child job a node
//! migrate or evacuate submits (siblings followed to their end even after one failed), and
//! RAPI outages ridden out until the job's deadline.

use std::time::Duration;

use serde_json::{Value, json};

use super::{FINAL, JobDone, Rapi, RapiError, job_error};

impl Rapi {
    /// Waits for job `id` and every child job it submits, for at most `limit` in all. A child
    /// that fails does not end the wait: every sibling is followed to its end (they move
    /// instances whatever maintd thinks), and then the first failure is the answer.
    pub async fn wait(&self, id: u64, limit: Duration) -> Result<JobDone, RapiError> {
        let deadline = tokio::time::Instant::now() + limit;
        let result = self.wait_one(id, deadline, limit).await?;
        let mut children = Vec::new();
        let mut failed = None;
        for r in result.as_array().into_iter().flatten() {
            for child in r["jobs"].as_array().into_iter().flatten() {
                match (child[0].as_bool(), child[1].as_u64()) {
                    (Some(true), Some(c)) => {
                        children.push(c);
                        match self.wait_one(c, deadline, limit).await {
                            Ok(_) => {}
                            Err(e @ RapiError::JobFailed { .. }) => {
                                tracing::warn!(job = id, child = c, error = %e, "a child job failed; following its siblings to their end");
                                failed.get_or_insert(e);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    _ => {
                        failed.get_or_insert(RapiError::JobFailed {
                            id,
                            status: "with a child job refused".into(),
                            message: child[1].to_string(),
                        });
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(JobDone {
            id,
            children,
            result,
        })
    }

    /// A read made while following job `id`: a RAPI that does not answer (restarting, a
    /// master's daemons moving) is asked again with a growing pause until the job's deadline.
    /// Reads are safe to repeat; each miss is logged.
    async fn follow(
        &self,
        id: u64,
        path: &str,
        body: Option<&Value>,
        deadline: tokio::time::Instant,
        limit: Duration,
    ) -> Result<Value, RapiError> {
        let mut misses = 0u32;
        loop {
            let e = match self.call("GET", path, body).await {
                Ok(v) => {
                    if misses > 0 {
                        tracing::info!(
                            job = id,
                            misses,
                            "the RAPI answers again; following the job"
                        );
                    }
                    return Ok(v);
                }
                Err(
                    e @ (RapiError::Transport { .. } | RapiError::Status { status: 500.., .. }),
                ) => e,
                Err(e) => return Err(e),
            };
            misses += 1;
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(RapiError::JobUnreachable {
                    id,
                    waited: limit,
                    last: e.to_string(),
                });
            }
            let pause = Duration::from_millis(250 << misses.min(5))
                .min(Duration::from_secs(5))
                .min(deadline - now);
            tracing::warn!(job = id, misses, error = %e, retry_in_ms = pause.as_millis() as u64, "the RAPI did not answer while following a job; asking again until the job's deadline");
            tokio::time::sleep(pause).await;
        }
    }

    /// One job to its end; its `opresult` when it succeeded.
    async fn wait_one(
        &self,
        id: u64,
        deadline: tokio::time::Instant,
        limit: Duration,
    ) -> Result<Value, RapiError> {
        let mut seen: Option<Value> = None;
        loop {
            let path = format!("/2/jobs/{id}/wait");
            let body = json!({"fields": ["status"], "previous_job_info": seen});
            let v = self.follow(id, &path, Some(&body), deadline, limit).await?;
            // null: nothing changed within the RAPI's own wait.
            if let Some(info) = v.get("job_info").filter(|i| i.is_array()) {
                seen = Some(info.clone());
                if FINAL.contains(&info[0].as_str().unwrap_or("")) {
                    break;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RapiError::JobTimeout { id, waited: limit });
            }
        }
        let path = format!("/2/jobs/{id}");
        let job = self.follow(id, &path, None, deadline, limit).await?;
        let status = job["status"].as_str().unwrap_or("unknown").to_string();
        if status == "success" {
            return Ok(job["opresult"].clone());
        }
        Err(RapiError::JobFailed {
            id,
            status,
            message: job_error(&job),
        })
    }
}
