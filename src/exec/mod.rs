//! Whitelisted command lookup and bounded subprocess execution: stdin input, scrubbed environment,
//! capped output, and a deadline that kills the command's whole process group. `hooks` builds a
//! hook's call (arguments and environment), `jobs` runs a job as a detached runner process that
//! survives a daemon restart; both the inventory backend and the collector use them.

pub mod claimed;
pub mod hooks;
pub mod jobs;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::sync::LockExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// Where whitelisted commands get their PATH: never from the caller's environment.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("command name {0:?} is not a bare name of [A-Za-z0-9._-]")]
    BadName(String),
    #[error("{path}: {source}")]
    Missing {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is a symlink; whitelisted commands must be regular files")]
    Symlink(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    #[error("{0} is not executable")]
    NotExecutable(String),
    #[error("{path} is writable by group or others (mode {mode:o})")]
    Writable { path: String, mode: u32 },
    #[error("{path} is owned by uid {uid}, not by root or by this process's user")]
    Owner { path: String, uid: u32 },
    #[error("cannot start {path}: {source}")]
    Spawn {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} did not finish within {timeout:?}; its process group was killed")]
    Timeout { path: String, timeout: Duration },
    #[error("waiting for {path} failed: {source}")]
    Wait {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Checks a whitelist entry name: non-empty, `[A-Za-z0-9._-]` only, and not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), ExecError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ExecError::BadName(name.to_string()))
    }
}

fn check_owner_and_mode(path: &Path, meta: &std::fs::Metadata) -> Result<(), ExecError> {
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(ExecError::Writable {
            path: path.display().to_string(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(ExecError::Owner {
            path: path.display().to_string(),
            uid: meta.uid(),
        });
    }
    Ok(())
}

/// Resolves `name` in the whitelist directory `dir`, applying every rule: bare name, no symlink,
/// regular executable file, neither file nor directory writable by group or others, and owned by
/// root (or by this process's own user when it does not run as root).
pub fn resolve(dir: &Path, name: &str) -> Result<PathBuf, ExecError> {
    validate_name(name)?;
    let dir_meta = std::fs::metadata(dir).map_err(|source| ExecError::Missing {
        path: dir.display().to_string(),
        source,
    })?;
    check_owner_and_mode(dir, &dir_meta)?;
    let path = dir.join(name);
    let meta = std::fs::symlink_metadata(&path).map_err(|source| ExecError::Missing {
        path: path.display().to_string(),
        source,
    })?;
    let shown = path.display().to_string();
    if meta.file_type().is_symlink() {
        return Err(ExecError::Symlink(shown));
    }
    if !meta.is_file() {
        return Err(ExecError::NotRegular(shown));
    }
    check_owner_and_mode(&path, &meta)?;
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(ExecError::NotExecutable(shown));
    }
    Ok(path)
}

/// One bounded run of a command.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub stdin: Vec<u8>,
    /// The complete environment (besides PATH); nothing is inherited.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// At most this many bytes of stdout and stderr are kept (the last ones).
    pub output_cap: usize,
}

#[derive(Debug, Clone)]
pub struct RunOutput {
    /// Exit code, or None when a signal ended the process.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    /// Total stdout bytes written, which may exceed what was kept.
    pub stdout_len: usize,
    pub stderr_tail: Vec<u8>,
}

impl RunOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A short human-readable tail of both streams, for job details.
    pub fn tail(&self, max: usize) -> String {
        let mut s = String::from_utf8_lossy(&self.stdout).into_owned();
        let err = String::from_utf8_lossy(&self.stderr_tail);
        if !err.trim().is_empty() {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(&err);
        }
        tail_chars(&s, max)
    }
}

pub fn tail_chars(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        s.chars().skip(n - max).collect()
    }
}

/// What a reader has collected so far: the last `cap` bytes and the total count. Shared, so the
/// output is kept even when the reader is stopped before end of file.
#[derive(Default)]
struct Tail {
    kept: Vec<u8>,
    total: usize,
}

type SharedTail = std::sync::Arc<std::sync::Mutex<Tail>>;

/// Reads a stream to its end into `tail`, keeping only the last `cap` bytes.
async fn read_tail<R: AsyncRead + Unpin>(mut r: R, cap: usize, tail: SharedTail) {
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut t = tail.lock_unpoisoned();
                t.total += n;
                t.kept.extend_from_slice(&buf[..n]);
                if t.kept.len() > cap.saturating_mul(2).max(8192) {
                    let cut = t.kept.len() - cap;
                    t.kept.drain(..cut);
                }
            }
        }
    }
}

/// Waits a moment for a reader to reach end of file, then stops it either way (closing our end
/// of the pipe, so a process that escaped the group cannot pin the descriptor) and returns what
/// it read.
async fn finish_tail(
    reader: tokio::task::JoinHandle<()>,
    tail: SharedTail,
    cap: usize,
    grace: Duration,
) -> (Vec<u8>, usize) {
    let abort = reader.abort_handle();
    if tokio::time::timeout(grace, reader).await.is_err() {
        abort.abort();
    }
    let mut t = tail.lock_unpoisoned();
    let mut kept = std::mem::take(&mut t.kept);
    if kept.len() > cap {
        let cut = kept.len() - cap;
        kept.drain(..cut);
    }
    (kept, t.total)
}

fn kill_group(pid: u32) {
    // ESRCH just means the group is already gone.
    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// Runs a command in its own process group and kills the whole group at the deadline (or when
/// the future is dropped), so a hung command and its children never outlive their budget.
pub async fn run(spec: &RunSpec) -> Result<RunOutput, ExecError> {
    let shown = spec.program.display().to_string();
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .env("PATH", SAFE_PATH)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| ExecError::Spawn {
        path: shown.clone(),
        source,
    })?;
    let pid = child.id().unwrap_or(0);
    let guard = GroupGuard(pid);

    let mut stdin = child.stdin.take().expect("piped");
    let input = spec.stdin.clone();
    let writer = tokio::spawn(async move {
        // A command that exits without reading its input is not an error.
        let _ = stdin.write_all(&input).await;
        let _ = stdin.shutdown().await;
    });
    let out_tail = SharedTail::default();
    let err_tail = SharedTail::default();
    let out = tokio::spawn(read_tail(
        child.stdout.take().expect("piped"),
        spec.output_cap,
        out_tail.clone(),
    ));
    let err = tokio::spawn(read_tail(
        child.stderr.take().expect("piped"),
        spec.output_cap,
        err_tail.clone(),
    ));

    let status = match tokio::time::timeout(spec.timeout, child.wait()).await {
        Ok(Ok(status)) => status,
        Ok(Err(source)) => {
            return Err(ExecError::Wait {
                path: shown,
                source,
            });
        }
        Err(_) => {
            kill_group(pid);
            let _ = child.wait().await;
            writer.abort();
            out.abort();
            err.abort();
            return Err(ExecError::Timeout {
                path: shown,
                timeout: spec.timeout,
            });
        }
    };
    // Stragglers left in the group would hold the pipes open; they die with their leader.
    kill_group(pid);
    drop(guard);
    writer.abort();
    // A descendant that left the group (setsid) may still hold the pipes: what the command
    // printed before it exited is kept, and the pipes are closed regardless.
    let grace = Duration::from_millis(500);
    let (stdout, stdout_len) = finish_tail(out, out_tail, spec.output_cap, grace).await;
    let (stderr_tail, _) = finish_tail(err, err_tail, spec.output_cap, grace).await;
    Ok(RunOutput {
        code: status.code(),
        stdout,
        stdout_len,
        stderr_tail,
    })
}

/// Kills the process group if the running future is dropped (e.g. on shutdown or cancellation).
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.0 != 0 {
            kill_group(self.0);
        }
    }
}

#[cfg(test)]
pub mod testing {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    /// Writes an executable script with mode 0755 into a whitelist directory.
    /// Copied into place by `cp`, never written by this process: a test thread that forks while
    /// this process holds the script open for writing hands that descriptor to its child until
    /// the child's exec, and executing the script meanwhile fails with ETXTBSY ("Text file
    /// busy"), as a loaded CI machine showed.
    pub fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        let src = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(src.path(), format!("#!/bin/sh\n{body}\n")).unwrap();
        let cp = std::process::Command::new("cp")
            .arg(src.path())
            .arg(&p)
            .status()
            .unwrap();
        assert!(cp.success(), "cp {} failed", p.display());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A temporary whitelist directory with mode 0755.
    pub fn whitelist_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn spec(p: PathBuf, timeout_ms: u64) -> RunSpec {
        RunSpec {
            program: p,
            args: vec![],
            stdin: b"hello".to_vec(),
            env: vec![],
            timeout: Duration::from_millis(timeout_ms),
            output_cap: 16,
        }
    }

    #[test]
    fn whitelist_rules() {
        let d = whitelist_dir();
        script(d.path(), "good", "true");
        assert!(resolve(d.path(), "good").is_ok());
        for bad in ["", ".", "..", "../x", "a/b", "a b", "x;y", "\u{e9}"] {
            assert!(
                matches!(resolve(d.path(), bad), Err(ExecError::BadName(_))),
                "{bad:?}"
            );
        }
        std::os::unix::fs::symlink(d.path().join("good"), d.path().join("link")).unwrap();
        assert!(matches!(
            resolve(d.path(), "link"),
            Err(ExecError::Symlink(_))
        ));
        let gw = script(d.path(), "gw", "true");
        std::fs::set_permissions(&gw, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(matches!(
            resolve(d.path(), "gw"),
            Err(ExecError::Writable { .. })
        ));
        let noexec = script(d.path(), "noexec", "true");
        std::fs::set_permissions(&noexec, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            resolve(d.path(), "noexec"),
            Err(ExecError::NotExecutable(_))
        ));
        std::fs::create_dir(d.path().join("sub")).unwrap();
        assert!(matches!(
            resolve(d.path(), "sub"),
            Err(ExecError::NotRegular(_))
        ));
        assert!(matches!(
            resolve(d.path(), "absent"),
            Err(ExecError::Missing { .. })
        ));
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            resolve(d.path(), "good"),
            Err(ExecError::Writable { .. })
        ));
    }

    #[tokio::test]
    async fn runs_with_stdin_and_caps_output() {
        let d = whitelist_dir();
        let p = script(
            d.path(),
            "cat",
            "cat; echo; seq 1 100; echo err >&2; exit 3",
        );
        let out = run(&spec(p, 10_000)).await.unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout.len(), 16);
        assert!(out.stdout_len > 200);
        assert!(String::from_utf8_lossy(&out.stdout).ends_with("99\n100\n"));
        assert_eq!(out.stderr_tail, b"err\n");
    }

    #[tokio::test]
    async fn environment_is_scrubbed() {
        let d = whitelist_dir();
        let p = script(d.path(), "env", "env");
        let mut s = spec(p, 10_000);
        s.output_cap = 4096;
        s.env = vec![("ONLY".into(), "this".into())];
        let out = run(&s).await.unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("ONLY=this"));
        assert!(!text.contains("HOME="), "{text}");
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let d = whitelist_dir();
        let marker = d.path().join("survived");
        let p = script(
            d.path(),
            "hang",
            &format!("(sleep 2; touch {}) & sleep 30", marker.display()),
        );
        let err = run(&spec(p, 300)).await.unwrap_err();
        assert!(matches!(err, ExecError::Timeout { .. }), "{err}");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            !marker.exists(),
            "a child of the timed-out command survived"
        );
    }

    #[tokio::test]
    async fn an_escaped_grandchild_neither_hides_the_output_nor_pins_the_pipe() {
        let d = whitelist_dir();
        let pidfile = d.path().join("gpid");
        let p = script(
            d.path(),
            "escape",
            &format!(
                "echo '{{\"status\":\"Ok\"}}'\nsetsid sh -c 'echo $$ > {}; exec sleep 30' &\nsleep 0.2",
                pidfile.display()
            ),
        );
        let mut s = spec(p, 10_000);
        s.output_cap = 4096;
        let out = run(&s).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            r#"{"status":"Ok"}"#
        );
        let gpid = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .to_string();
        let pipe = std::fs::read_link(format!("/proc/{gpid}/fd/1")).unwrap();
        assert!(pipe.to_string_lossy().starts_with("pipe:"), "{pipe:?}");
        let ours: Vec<_> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect();
        let _ = nix::sys::signal::kill(Pid::from_raw(gpid.parse().unwrap()), Signal::SIGKILL);
        assert!(
            !ours.contains(&pipe),
            "the daemon still holds the escaped process's stdout pipe"
        );
    }
}
