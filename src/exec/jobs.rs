//! Detached job execution for hook commands: each job gets a directory under the state dir and a
//! `maintd run-job` process of its own, so a job outlives a crashed daemon and is never started
//! twice. A restarted daemon finds the result file, or waits for the runner that is still alive.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::claimed::{ClaimStore, Claimed, run_claimed};
use crate::exec::{self, RunSpec};

const SPEC: &str = "spec.json";
const INPUT: &str = "input";
const STARTED: &str = "started";
const RESULT: &str = "result.json";
const RUNNER_LOG: &str = "runner.log";
const POLL: Duration = Duration::from_millis(100);
/// How long a spawned runner may take to claim its job before it counts as lost.
const CLAIM_GRACE: Duration = Duration::from_secs(10);
const OUTPUT_CAP: usize = 4096;

#[derive(Debug, Serialize, Deserialize)]
struct FileSpec {
    /// The job this directory is for: its result names it, and a result naming another job is
    /// never taken.
    #[serde(default)]
    job: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout_ms: u64,
    /// Where the job is claimed before its hook runs, when several daemons share one store:
    /// a runner on another machine then adopts the end, or waits, instead of running it again.
    /// The store's settings, read by whoever connects (`ClaimsFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claims: Option<serde_json::Value>,
}

use maintd_core::verdict::Outcome;

#[derive(Debug, Clone)]
pub struct JobRunner {
    root: PathBuf,
    exe: PathBuf,
    claims: Option<serde_json::Value>,
}

use crate::fsutil::write_atomic;

/// Whether the runner that claimed `dir` is still alive: its pid runs a command line naming `dir`.
fn runner_alive(pid: u32, dir: &Path) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmd) => {
            let needle = dir.as_os_str().as_encoded_bytes();
            cmd.windows(needle.len()).any(|w| w == needle)
        }
        Err(_) => false,
    }
}

impl JobRunner {
    pub fn new(root: PathBuf) -> std::io::Result<JobRunner> {
        std::fs::create_dir_all(&root)?;
        Ok(JobRunner {
            root,
            exe: std::env::current_exe()?,
            claims: None,
        })
    }

    /// Claims each job on the store `settings` name (etcd) before its hook runs, and records
    /// its end there, so a job runs once however many daemons resume it.
    pub fn claiming_on(mut self, settings: serde_json::Value) -> JobRunner {
        self.claims = Some(settings);
        self
    }

    /// Runs the job named `key` once: starts it if it never started, otherwise waits for the
    /// run that did. `key` must be unique per job and made of `[A-Za-z0-9._-]`.
    pub async fn run(&self, key: &str, spec: &RunSpec) -> Outcome {
        self.run_or_adopt(key, spec, None).await
    }

    /// `run`, adopting the directory an earlier version gave the same job (`legacy`), when its
    /// spec shows it is this job's.
    pub async fn run_or_adopt(
        &self,
        key: &str,
        spec: &RunSpec,
        legacy: Option<&Legacy>,
    ) -> Outcome {
        let mut dir = self.root.join(format!("job-{key}"));
        let mut expect = key.to_string();
        if !dir.exists()
            && let Some(l) = legacy
        {
            let old = self.root.join(format!("job-{}", l.key));
            if l.matches(&old) {
                tracing::info!(job = key, dir = %old.display(), "adopting the directory an earlier version gave this job");
                dir = old;
                expect = String::new();
            }
        }
        if !dir.exists()
            && let Err(e) = self.prepare(&dir, key, spec)
        {
            return Outcome::failed(format!(
                "cannot prepare job directory {}: {e}",
                dir.display()
            ));
        }
        let mut spawned_at = None;
        loop {
            if let Some(o) = read_result(&dir, &expect) {
                return o;
            }
            match std::fs::read_to_string(dir.join(STARTED)) {
                Ok(pid) => {
                    let alive = pid.trim().parse().is_ok_and(|p| runner_alive(p, &dir));
                    if !alive {
                        // The result may have landed between the two reads.
                        return read_result(&dir, &expect).unwrap_or_else(|| {
                            Outcome::failed("job runner ended without a result (killed?)")
                        });
                    }
                }
                Err(_) => match spawned_at {
                    None => {
                        if let Err(e) = self.spawn(&dir) {
                            return Outcome::failed(format!("cannot start job runner: {e}"));
                        }
                        spawned_at = Some(tokio::time::Instant::now());
                    }
                    Some(t) if t.elapsed() > CLAIM_GRACE => {
                        return Outcome::failed("job runner never claimed the job");
                    }
                    Some(_) => {}
                },
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn prepare(&self, dir: &Path, key: &str, spec: &RunSpec) -> std::io::Result<()> {
        let tmp = dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let fs = FileSpec {
            job: key.to_string(),
            program: spec.program.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            timeout_ms: spec.timeout.as_millis() as u64,
            claims: self.claims.clone(),
        };
        write_atomic(&tmp.join(SPEC), &serde_json::to_vec(&fs)?)?;
        write_atomic(&tmp.join(INPUT), &spec.stdin)?;
        // The rename publishes a complete job: a directory without a spec never exists.
        std::fs::rename(&tmp, dir)
    }

    fn spawn(&self, dir: &Path) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        // The runner's own log (what it met claiming the job, or recording its end) stays
        // beside the job, for the operator who asks why a hook did or did not run.
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(dir.join(RUNNER_LOG))?;
        let mut child = std::process::Command::new(&self.exe)
            .arg("run-job")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            // Its own process group: a signal to the daemon's group does not reach the job.
            .process_group(0)
            .spawn()?;
        // Reap it when it exits, so it never lingers as a zombie while the daemon lives.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        Ok(())
    }
}

/// A job's result as its runner writes it: the outcome, and the job it is for.
#[derive(Debug, Serialize, Deserialize)]
struct JobResult {
    #[serde(default)]
    job: String,
    #[serde(flatten)]
    outcome: Outcome,
}

/// The result in `dir`, if there is one; one that names another job than `expect` (when both
/// are known) is refused, logged, and reported as the job's failure: it is never adopted.
fn read_result(dir: &Path, expect: &str) -> Option<Outcome> {
    let bytes = std::fs::read(dir.join(RESULT)).ok()?;
    let r: JobResult = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => return Some(Outcome::failed(format!("unreadable job result: {e}"))),
    };
    if !expect.is_empty() && !r.job.is_empty() && r.job != expect {
        tracing::error!(dir = %dir.display(), names = %r.job, job = expect, "a job result names another job; it is not adopted");
        return Some(Outcome::failed(format!(
            "the result in {} names job {}, not this one ({expect}): not adopted",
            dir.display(),
            r.job
        )));
    }
    Some(r.outcome)
}

/// The directory an earlier version gave a job (`job-<key>`), and what its spec's environment
/// must hold for it to be this job's.
pub struct Legacy {
    pub key: String,
    pub env: Vec<(String, String)>,
}

impl Legacy {
    fn matches(&self, dir: &Path) -> bool {
        let Ok(bytes) = std::fs::read(dir.join(SPEC)) else {
            return false;
        };
        let Ok(spec) = serde_json::from_slice::<FileSpec>(&bytes) else {
            return false;
        };
        // The last value of a name is the one the hook saw.
        self.env.iter().all(|(k, v)| {
            spec.env
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .is_some_and(|(_, x)| x == v)
        })
    }
}

/// Connects to the store a job is claimed on, from the settings its spec carries: the claims
/// and the time to live of each claim.
#[async_trait::async_trait]
pub trait ClaimsFrom: Send + Sync {
    async fn connect(
        &self,
        settings: &serde_json::Value,
    ) -> Result<(Box<dyn ClaimStore>, Duration), String>;
}

/// Entry point of `maintd run-job <dir>`: claims the job (exactly once on this machine, and on
/// the shared store through `claims` when its spec names one), runs it, and writes the result
/// atomically.
pub async fn run_job_main(dir: &Path, claims: &dyn ClaimsFrom) -> std::io::Result<()> {
    // Claim with a complete pid file: written aside, then hard-linked into place, which fails if
    // another runner already claimed the job. Readers never see a half-written claim.
    let mine = dir.join(format!("{STARTED}.{}", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&mine)?;
        writeln!(f, "{}", std::process::id())?;
        f.sync_all()?;
    }
    let claimed = std::fs::hard_link(&mine, dir.join(STARTED));
    let _ = std::fs::remove_file(&mine);
    match claimed {
        Ok(()) => {}
        // Another runner owns this job.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    let spec: FileSpec =
        serde_json::from_slice(&std::fs::read(dir.join(SPEC))?).map_err(std::io::Error::other)?;
    let input = std::fs::read(dir.join(INPUT))?;
    let timeout = Duration::from_millis(spec.timeout_ms);
    let program = spec.program.clone();
    let hook = async {
        match exec::run(&RunSpec {
            program: program.clone(),
            args: spec.args,
            stdin: input,
            env: spec.env,
            timeout,
            output_cap: OUTPUT_CAP,
        })
        .await
        {
            Ok(out) => {
                let tail = out.tail(1024);
                let code = out
                    .code
                    .map_or("killed by a signal".into(), |c| format!("exit {c}"));
                Outcome::of(
                    out.success(),
                    format!("{} {code}: {}", program.display(), tail.trim()),
                )
            }
            Err(e) => Outcome::failed(e.to_string()),
        }
    };
    let outcome = match &spec.claims {
        None => hook.await,
        Some(settings) => claimed_run(claims, settings, &spec.job, timeout, hook).await,
    };
    let result = JobResult {
        job: spec.job,
        outcome,
    };
    write_atomic(&dir.join(RESULT), &serde_json::to_vec(&result)?)
}

/// Runs `hook` for `job` once across the daemons sharing the store `settings` name: adopts
/// the end a runner elsewhere recorded, waits while one holds the job, else claims it and runs
/// it here.
async fn claimed_run(
    claims: &dyn ClaimsFrom,
    settings: &serde_json::Value,
    job: &str,
    timeout: Duration,
    hook: impl std::future::Future<Output = Outcome>,
) -> Outcome {
    let (store, ttl) = match claims.connect(settings).await {
        Ok(s) => s,
        Err(e) => {
            return Outcome::failed(format!(
                "cannot reach the store to claim the job: {e}; the hook did not run"
            ));
        }
    };
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let holder = format!(
        "{host} pid {} run {}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    // Long enough to see a run elsewhere end (its hook's timeout) or its claim lapse.
    let patience = timeout + 2 * ttl + CLAIM_GRACE;
    let encode = |o: &Outcome| -> Vec<u8> {
        serde_json::to_vec(&JobResult {
            job: job.to_string(),
            outcome: o.clone(),
        })
        .expect("a job result serializes")
    };
    match run_claimed(store.as_ref(), job, &holder, ttl, patience, hook, encode).await {
        Claimed::Adopted(end) => match serde_json::from_slice::<JobResult>(&end) {
            Ok(r) if r.job == job => {
                tracing::info!(job, "adopted the end another machine's runner recorded");
                r.outcome
            }
            Ok(r) => Outcome::failed(format!(
                "the end recorded for this job names job {}: not adopted",
                r.job
            )),
            Err(e) => Outcome::failed(format!("the end recorded for this job is unreadable: {e}")),
        },
        Claimed::Ran { outcome, .. } => outcome,
        Claimed::Lost(o) => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_dir(root: &Path, key: &str, env: &[(&str, &str)], result: Option<&str>) -> PathBuf {
        let dir = root.join(format!("job-{key}"));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = FileSpec {
            job: key.into(),
            program: "/bin/true".into(),
            args: vec![],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            timeout_ms: 1000,
            claims: None,
        };
        std::fs::write(dir.join(SPEC), serde_json::to_vec(&spec).unwrap()).unwrap();
        if let Some(r) = result {
            std::fs::write(dir.join(RESULT), r).unwrap();
        }
        dir
    }

    #[test]
    fn a_result_that_names_another_job_is_never_adopted() {
        let root = tempfile::tempdir().unwrap();
        let ok = r#"{"job":"e1-1-5","ok":true,"detail":"done"}"#;
        let dir = job_dir(root.path(), "e1-1-5", &[], Some(ok));
        assert!(read_result(&dir, "e1-1-5").unwrap().ok());
        let o = read_result(&dir, "e2-1-9").unwrap();
        assert!(!o.ok() && o.detail().contains("names job e1-1-5"), "{o:?}");
        // A result of an earlier version names no job: its directory's name is the binding.
        let dir = job_dir(root.path(), "7", &[], Some(r#"{"ok":true,"detail":"old"}"#));
        assert_eq!(read_result(&dir, "").unwrap().detail(), "old");
        assert!(read_result(&root.path().join("job-none"), "x").is_none());
    }

    #[test]
    fn an_earlier_versions_directory_is_adopted_only_by_the_job_its_spec_names() {
        let root = tempfile::tempdir().unwrap();
        let dir = job_dir(
            root.path(),
            "1",
            &[
                ("MAINTD_EVENT", "spoof"),
                ("MAINTD_EVENT", "e1"),
                ("MAINTD_JOB", "1"),
            ],
            None,
        );
        let legacy = |event: &str| Legacy {
            key: "1".into(),
            env: vec![
                ("MAINTD_EVENT".into(), event.into()),
                ("MAINTD_JOB".into(), "1".into()),
            ],
        };
        assert!(legacy("e1").matches(&dir));
        // Job 1 of another event (a database lost and begun again) is not that job.
        assert!(!legacy("e2").matches(&dir));
        assert!(!legacy("spoof").matches(&dir), "the last value counts");
        assert!(!legacy("e1").matches(&root.path().join("job-2")));
    }
}
