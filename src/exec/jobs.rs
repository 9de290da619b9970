//! Detached job execution for hook commands: each job gets a directory under the state dir and a
//! `maintd run-job` process of its own, so a job outlives a crashed daemon and is never started
//! twice. A restarted daemon finds the result file, or waits for the runner that is still alive.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::{self, RunSpec};

const SPEC: &str = "spec.json";
const INPUT: &str = "input";
const STARTED: &str = "started";
const RESULT: &str = "result.json";
const POLL: Duration = Duration::from_millis(100);
/// How long a spawned runner may take to claim its job before it counts as lost.
const CLAIM_GRACE: Duration = Duration::from_secs(10);
const OUTPUT_CAP: usize = 4096;

#[derive(Debug, Serialize, Deserialize)]
struct FileSpec {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout_ms: u64,
}

use crate::verdict::Outcome;

#[derive(Debug, Clone)]
pub struct JobRunner {
    root: PathBuf,
    exe: PathBuf,
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
        })
    }

    /// Runs the job named `key` once: starts it if it never started, otherwise waits for the
    /// run that did. `key` must be unique per job and made of `[A-Za-z0-9._-]`.
    pub async fn run(&self, key: &str, spec: &RunSpec) -> Outcome {
        let dir = self.root.join(format!("job-{key}"));
        if !dir.exists()
            && let Err(e) = self.prepare(&dir, spec)
        {
            return Outcome::failed(format!(
                "cannot prepare job directory {}: {e}",
                dir.display()
            ));
        }
        let mut spawned_at = None;
        loop {
            if let Some(o) = read_result(&dir) {
                return o;
            }
            match std::fs::read_to_string(dir.join(STARTED)) {
                Ok(pid) => {
                    let alive = pid.trim().parse().is_ok_and(|p| runner_alive(p, &dir));
                    if !alive {
                        // The result may have landed between the two reads.
                        return read_result(&dir).unwrap_or_else(|| {
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

    fn prepare(&self, dir: &Path, spec: &RunSpec) -> std::io::Result<()> {
        let tmp = dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let fs = FileSpec {
            program: spec.program.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            timeout_ms: spec.timeout.as_millis() as u64,
        };
        write_atomic(&tmp.join(SPEC), &serde_json::to_vec(&fs)?)?;
        write_atomic(&tmp.join(INPUT), &spec.stdin)?;
        // The rename publishes a complete job: a directory without a spec never exists.
        std::fs::rename(&tmp, dir)
    }

    fn spawn(&self, dir: &Path) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(&self.exe)
            .arg("run-job")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
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

fn read_result(dir: &Path) -> Option<Outcome> {
    let bytes = std::fs::read(dir.join(RESULT)).ok()?;
    Some(
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| Outcome::failed(format!("unreadable job result: {e}"))),
    )
}

/// Entry point of `maintd run-job <dir>`: claims the job (exactly once), runs it, and writes the
/// result atomically.
pub async fn run_job_main(dir: &Path) -> std::io::Result<()> {
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
    let outcome = match exec::run(&RunSpec {
        program: spec.program.clone(),
        args: spec.args,
        stdin: input,
        env: spec.env,
        timeout: Duration::from_millis(spec.timeout_ms),
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
                format!("{} {code}: {}", spec.program.display(), tail.trim()),
            )
        }
        Err(e) => Outcome::failed(e.to_string()),
    };
    write_atomic(&dir.join(RESULT), &serde_json::to_vec(&outcome)?)
}
