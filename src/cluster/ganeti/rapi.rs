//! A client of Ganeti's remote API, version 2: reads (cluster info, nodes, jobs) and job
//! submission, each job followed to its end with the queue's own long poll, child jobs (those a
//! node migrate or evacuate submits) included. The certificate is pinned, the password comes
//! from an owner-only file and never reaches a log or an error.

use std::path::PathBuf;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;
use serde_json::Value;

/// Where the RAPI is and how to reach it.
#[derive(Debug, Clone, PartialEq)]
pub struct RapiSettings {
    /// `https://<master>:5080`.
    pub url: String,
    /// The RAPI's certificate (PEM), copied from the master's `/var/lib/ganeti/rapi.pem`.
    pub certificate: PathBuf,
    pub user: String,
    /// An owner-only file holding the user's password.
    pub password_file: PathBuf,
    /// Each request's deadline; a job wait asks for at most this long at a time.
    pub timeout: Duration,
    /// Extra tries of a request that never reached the RAPI (connection refused or reset).
    pub retries: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum RapiError {
    #[error("RAPI certificate {path}: {detail}")]
    Certificate { path: PathBuf, detail: String },
    #[error("RAPI password file {path}: {source}")]
    Password {
        path: PathBuf,
        #[source]
        source: crate::secret::SecretFileError,
    },
    #[error("RAPI client: {0}")]
    Setup(String),
    #[error("{method} {path}: {detail}")]
    Transport {
        method: &'static str,
        path: String,
        detail: String,
    },
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
    #[error("{method} {path}: unexpected answer: {detail}")]
    Answer {
        method: &'static str,
        path: String,
        detail: String,
    },
    #[error("Ganeti job {id} ended {status}: {message}")]
    JobFailed {
        id: u64,
        status: String,
        message: String,
    },
    #[error("Ganeti job {id} is not done after {waited:?}")]
    JobTimeout { id: u64, waited: Duration },
    #[error(
        "Ganeti job {id} could not be followed within its {waited:?}: the RAPI did not answer ({last})"
    )]
    JobUnreachable {
        id: u64,
        waited: Duration,
        last: String,
    },
}

/// A node as `/2/nodes?bulk=1` lists it (the fields maintd reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RapiNode {
    pub name: String,
    pub offline: bool,
    pub drained: bool,
    pub master_candidate: bool,
    /// `M` master, `C` candidate, `R` regular, `D` drained, `O` offline.
    pub role: String,
    #[serde(default)]
    pub pinst_list: Vec<String>,
    #[serde(default)]
    pub sinst_list: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// The node group's name.
    #[serde(default)]
    pub group: String,
}

/// A finished job: its id and every child job it submitted, all successful.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDone {
    pub id: u64,
    pub children: Vec<u64>,
    pub result: Value,
}

const FINAL: [&str; 3] = ["success", "error", "canceled"];

mod follow;

pub struct Rapi {
    /// reqwest over the pinned TLS configuration, one connection per request (the RAPI is
    /// asked rarely, and a kept connection would only go stale between two questions).
    client: reqwest::Client,
    base: String,
    /// `Basic <user:password>`, the only place the password is kept.
    auth: reqwest::header::HeaderValue,
    user: String,
    retries: u32,
    /// Connect and handshake; a whole request gets at least the RAPI's own job wait more.
    timeout: Duration,
}

impl std::fmt::Debug for Rapi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Rapi")
            .field("base", &self.base)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The largest answer read (the job list of a busy cluster stays far below).
const MAX_ANSWER: usize = 64 << 20;

/// Why one try failed: before the request left (worth another try) or after.
enum Try {
    NotSent(String),
    Failed(String),
}

impl Rapi {
    pub fn new(s: &RapiSettings) -> Result<Rapi, RapiError> {
        use base64::Engine;
        let cert_err = |detail: String| RapiError::Certificate {
            path: s.certificate.clone(),
            detail,
        };
        let pem = std::fs::read(&s.certificate).map_err(|e| cert_err(e.to_string()))?;
        let cert = CertificateDer::pem_slice_iter(&pem)
            .next()
            .ok_or_else(|| cert_err("no PEM certificate in it".into()))?
            .map_err(|e| cert_err(e.to_string()))?;
        let tls = super::pin::pinned(cert, &s.certificate).map_err(|e| cert_err(e.to_string()))?;
        let password = crate::secret::read(&s.password_file)
            .map_err(|source| RapiError::Password {
                path: s.password_file.clone(),
                source,
            })?
            .trim_end_matches(['\n', '\r'])
            .to_string();
        let url = reqwest::Url::parse(&s.url)
            .map_err(|e| RapiError::Setup(format!("rapi-url {:?}: {e}", s.url)))?;
        if url.scheme() != "https" {
            return Err(RapiError::Setup(format!(
                "rapi-url {:?}: the RAPI speaks https only",
                s.url
            )));
        }
        if url.host_str().is_none() {
            return Err(RapiError::Setup(format!("rapi-url {:?}: no host", s.url)));
        }
        let token =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{password}", s.user));
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Basic {token}"))
            .map_err(|_| RapiError::Setup("the RAPI user or password is not header text".into()))?;
        auth.set_sensitive(true);
        // The certificate is pinned (its name is not checked); reqwest speaks HTTP over it.
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(s.timeout)
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RapiError::Setup(format!("the RAPI client: {e}")))?;
        let mut base = url.to_string();
        if url.port().is_none() {
            // Ganeti's RAPI port, when the URL names none (https's own would be 443).
            base = format!(
                "https://{}:5080{}",
                url.host_str().unwrap_or_default(),
                url.path()
            );
        }
        Ok(Rapi {
            client,
            base: base.trim_end_matches('/').to_string(),
            auth,
            user: s.user.clone(),
            retries: s.retries,
            timeout: s.timeout,
        })
    }

    /// One request: its status and its answer, at most `MAX_ANSWER` bytes.
    async fn once(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), Try> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| Try::NotSent(e.to_string()))?;
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header(reqwest::header::AUTHORIZATION, self.auth.clone())
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            // Ganeti refuses a write without this type (415).
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let exchange = async {
            let resp = req.send().await.map_err(|e| {
                let detail = transport_error(&e);
                if e.is_connect() {
                    Try::NotSent(detail)
                } else {
                    Try::Failed(detail)
                }
            })?;
            let status = resp.status().as_u16();
            let body = crate::http::read_capped(resp, MAX_ANSWER)
                .await
                .map_err(|e| Try::Failed(format!("reading the answer: {e}")))?;
            Ok((status, body))
        };
        // A job wait is held up to ten seconds by the RAPI itself.
        let deadline = self.timeout.max(Duration::from_secs(15));
        tokio::time::timeout(deadline, exchange)
            .await
            .unwrap_or_else(|_| Err(Try::Failed(format!("no answer within {deadline:?}"))))
    }

    async fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, RapiError> {
        let mut tries = 0;
        let (status, text) = loop {
            match self.once(method, path, body).await {
                Ok(r) => break r,
                // Only a request that never left is sent again: a write that timed out may
                // have been queued, and the caller finds it by its reason.
                Err(Try::NotSent(_)) if tries < self.retries => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200 << tries.min(4))).await;
                }
                Err(Try::NotSent(detail) | Try::Failed(detail)) => {
                    return Err(RapiError::Transport {
                        method,
                        path: path.into(),
                        detail,
                    });
                }
            }
        };
        let text = String::from_utf8_lossy(&text);
        if !(200..300).contains(&status) {
            return Err(RapiError::Status {
                method,
                path: path.into(),
                status,
                message: error_message(&text),
            });
        }
        serde_json::from_str(&text).map_err(|e| RapiError::Answer {
            method,
            path: path.into(),
            detail: e.to_string(),
        })
    }

    fn answer<T: for<'de> Deserialize<'de>>(
        method: &'static str,
        path: &str,
        v: Value,
    ) -> Result<T, RapiError> {
        serde_json::from_value(v).map_err(|e| RapiError::Answer {
            method,
            path: path.into(),
            detail: e.to_string(),
        })
    }

    /// A read of any resource.
    pub async fn get(&self, path: &str) -> Result<Value, RapiError> {
        self.call("GET", path, None).await
    }

    /// The node Ganeti's own vote made master.
    pub async fn master(&self) -> Result<String, RapiError> {
        let v = self.call("GET", "/2/info", None).await?;
        v["master"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| RapiError::Answer {
                method: "GET",
                path: "/2/info".into(),
                detail: "no master".into(),
            })
    }

    pub async fn nodes(&self) -> Result<Vec<RapiNode>, RapiError> {
        let path = "/2/nodes?bulk=1";
        Self::answer("GET", path, self.call("GET", path, None).await?)
    }

    /// Submits a job (`path` with its query, `reason` added) and returns its id.
    pub async fn submit(
        &self,
        method: &'static str,
        path: &str,
        reason: &str,
        body: Option<&Value>,
    ) -> Result<u64, RapiError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let full = format!("{path}{sep}reason={}", encode(reason));
        let v = self.call(method, &full, body).await?;
        // The id is a number, or a number as text, depending on the resource.
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| RapiError::Answer {
                method,
                path: path.into(),
                detail: format!("{v} is not a job id"),
            })
    }

    /// The id of the job in the queue whose reason trail holds `reason`, the oldest: a job
    /// submitted before a restart is adopted instead of submitted twice. (The child jobs a node
    /// migrate submits inherit its reason trail; they come after it.)
    pub async fn find_job(&self, reason: &str) -> Result<Option<u64>, RapiError> {
        let jobs = self.jobs().await?;
        let mine = jobs.iter().filter(|j| carries(j, |r| r == reason));
        Ok(mine.filter_map(|j| j["id"].as_u64()).min())
    }

    /// The ids of the jobs in the queue not yet ended whose reason trail has an entry that
    /// starts with `prefix` (maintd's balancing moves after a restart).
    pub async fn unfinished(&self, prefix: &str) -> Result<Vec<u64>, RapiError> {
        let jobs = self.jobs().await?;
        let open = jobs
            .iter()
            .filter(|j| !FINAL.contains(&j["status"].as_str().unwrap_or("")));
        let mine = open.filter(|j| carries(j, |r| r.starts_with(prefix)));
        Ok(mine.filter_map(|j| j["id"].as_u64()).collect())
    }

    async fn jobs(&self) -> Result<Vec<Value>, RapiError> {
        let path = "/2/jobs?bulk=1";
        Self::answer("GET", path, self.call("GET", path, None).await?)
    }
}

/// A failed request in words: a certificate other than the pinned one is told by the pin's own
/// message (which names the file), not by rustls's debug form of it; anything else by its
/// causes, each said once.
fn transport_error(e: &reqwest::Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        // An I/O error's `source` skips the error it carries (the connector nests two): those
        // are looked into too.
        let mut inner = c;
        loop {
            if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))) =
                inner.downcast_ref::<rustls::Error>()
            {
                return o.0.to_string();
            }
            match inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(carried) => inner = carried,
                None => break,
            }
        }
        cause = c.source();
    }
    crate::http::error_chain(e)
}

/// Whether any opcode of a job (as `/2/jobs?bulk=1` lists it) has a reason entry that `ok`.
fn carries(job: &Value, ok: impl Fn(&str) -> bool) -> bool {
    let ops = job["ops"].as_array().into_iter().flatten();
    ops.flat_map(|op| op["reason"].as_array().into_iter().flatten())
        .any(|entry| entry[1].as_str().is_some_and(&ok))
}

/// Ganeti's own words for a failed job: the first failed opcode's error class and message
/// (`OpPrereqError: Instance 'x' not known (unknown_entity)`).
pub fn job_error(job: &Value) -> String {
    let results = job["opresult"].as_array().cloned().unwrap_or_default();
    let statuses = job["opstatus"].as_array().cloned().unwrap_or_default();
    let failed = statuses
        .iter()
        .position(|s| s.as_str() == Some("error"))
        .and_then(|i| results.get(i));
    match failed.or(results.last()) {
        Some(Value::Array(e)) if e.len() == 2 => {
            let class = e[0].as_str().unwrap_or("error");
            match &e[1] {
                Value::Array(a) if !a.is_empty() => {
                    let msg = a[0].as_str().map(String::from).unwrap_or(a[0].to_string());
                    match a.get(1).and_then(Value::as_str) {
                        Some(code) => format!("{class}: {msg} ({code})"),
                        None => format!("{class}: {msg}"),
                    }
                }
                other => format!("{class}: {}", other.as_str().unwrap_or(&other.to_string())),
            }
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => format!("no result (status {})", job["status"]),
    }
}

/// The RAPI's error body (`{"code":…,"message":…,"explain":…}`), or its text.
fn error_message(text: &str) -> String {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let msg = v["message"].as_str().map(String::from);
    let explain = v["explain"].as_str().filter(|e| !e.is_empty());
    match (msg, explain) {
        (Some(m), Some(e)) => format!("{m}: {e}"),
        (Some(m), None) => m,
        _ => text.chars().take(300).collect(),
    }
}

/// Percent-encodes a query value.
pub fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_job_is_told_in_ganetis_words() {
        let job = json!({"status": "error", "opstatus": ["error"],
            "opresult": [["OpPrereqError", ["Instance 'x' not known", "unknown_entity"]]]});
        assert_eq!(
            job_error(&job),
            "OpPrereqError: Instance 'x' not known (unknown_entity)"
        );
        let job = json!({"status": "error", "opstatus": ["success", "error"],
            "opresult": [null, ["OpExecError", ["Could not migrate"]]]});
        assert_eq!(job_error(&job), "OpExecError: Could not migrate");
        let job = json!({"status": "canceled", "opstatus": ["canceled"], "opresult": [null]});
        assert_eq!(job_error(&job), "null");
    }

    #[test]
    fn jobs_are_found_by_their_reason() {
        let job = json!({"id": 7, "ops": [{"reason": [
            ["gnt:user", "gnt:daemon:maintd maintd:e1 job:3", 1],
            ["gnt:library:rlib2:NodeMigrate", "", 2]]}]});
        assert!(carries(&job, |r| r == "gnt:daemon:maintd maintd:e1 job:3"));
        assert!(!carries(&job, |r| r == "gnt:daemon:maintd maintd:e1 job:4"));
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            encode("gnt:daemon:maintd maintd:1&x=y"),
            "gnt:daemon:maintd%20maintd:1%26x%3Dy"
        );
        assert_eq!(
            error_message(r#"{"code": 400, "message": "Bad Request", "explain": "no"}"#),
            "Bad Request: no"
        );
    }
}
