//! One diagnose run: the whitelisted command under a deadline and an output cap, its output
//! checked as the daemon would check it. Every failure is an Ok verdict carrying the reason.

use crate::config::CollectorConfig;
use crate::exec::{self, ExecError, RunSpec};
use crate::report::{Envelope, Key, now_ns};
use maintd_core::verdict::Verdict;

/// The result of one diagnose run.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub verdict: Verdict,
    /// Why the diagnose failed, if it did; the verdict is then Ok and never triggers an action.
    pub error: Option<String>,
    /// When the run started, ns since the epoch.
    pub at: i64,
}

/// Runs the configured diagnose once. Any failure becomes an Ok verdict flagged with the reason.
pub async fn diagnose(cfg: &CollectorConfig) -> Diagnosis {
    // Stamped when it starts: a diagnose begun before a power-off proves nothing after it, even
    // if the collector (stopped, say) takes its result only later.
    let started = now_ns();
    let (verdict, error) = match diagnose_inner(cfg).await {
        Ok(v) => (v, None),
        Err(e) => {
            let reason = e.to_string();
            (Verdict::ok_with_error(&reason), Some(reason))
        }
    };
    Diagnosis {
        verdict,
        error,
        at: started,
    }
}

/// Why a diagnose run gave no verdict; the report then says Ok and carries this as its
/// `diagnose-error`.
#[derive(Debug, thiserror::Error)]
pub enum DiagnoseError {
    #[error("diagnose command refused: {0}")]
    Refused(#[source] ExecError),
    #[error("diagnose timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("diagnose failed: {0}")]
    Run(#[source] ExecError),
    #[error("diagnose printed {printed} bytes, over the {cap}-byte cap")]
    TooMuch { printed: usize, cap: usize },
    #[error("diagnose exited with {status}: {stderr}")]
    Exit { status: String, stderr: String },
    #[error("diagnose printed invalid output: {0}")]
    Output(#[from] maintd_core::verdict::VerdictError),
    /// The collector checks its own report as the daemon would, so the two never disagree.
    #[error("the daemon would refuse this diagnose output: {0}")]
    Unacceptable(#[source] crate::report::ReportError),
}

async fn diagnose_inner(cfg: &CollectorConfig) -> Result<Verdict, DiagnoseError> {
    if cfg.diagnose.is_empty() {
        return Ok(Verdict::builtin_ok());
    }
    let program =
        exec::resolve(&cfg.diagnose_dir, &cfg.diagnose).map_err(DiagnoseError::Refused)?;
    let out = exec::run(&RunSpec {
        program,
        args: vec![],
        stdin: vec![],
        env: cfg
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        timeout: cfg.diagnose_timeout,
        output_cap: cfg.diagnose_output_cap,
    })
    .await
    .map_err(|e| match e {
        ExecError::Timeout { timeout, .. } => DiagnoseError::Timeout(timeout),
        other => DiagnoseError::Run(other),
    })?;
    if out.stdout_len > cfg.diagnose_output_cap {
        return Err(DiagnoseError::TooMuch {
            printed: out.stdout_len,
            cap: cfg.diagnose_output_cap,
        });
    }
    if !out.success() {
        return Err(DiagnoseError::Exit {
            status: out
                .code
                .map_or("a signal".to_string(), |c| format!("code {c}")),
            stderr: exec::tail_chars(String::from_utf8_lossy(&out.stderr_tail).trim(), 512),
        });
    }
    let verdict = Verdict::parse_bytes(&out.stdout)?;
    daemon_would_accept(&verdict).map_err(DiagnoseError::Unacceptable)?;
    Ok(verdict)
}

/// Refuses, as a diagnose error, a verdict the daemon would refuse: the collector runs the
/// daemon's own verification on a report carrying it, so the two can never disagree on limits
/// (nesting depth, size, numbers) and a genuine report is never rejected as forged.
fn daemon_would_accept(verdict: &Verdict) -> Result<(), crate::report::ReportError> {
    let key = Key::from_bytes(vec![0; 32]);
    let now = now_ns();
    let mut env = Envelope::new("self-check", 1, now, now, verdict, None);
    env.answers = u64::MAX;
    let env = env.sign(&key);
    // An envelope of valid JSON values always serializes.
    let body = serde_json::to_vec(&env).unwrap_or_default();
    let rules = crate::report::VerifyRules {
        max_bytes: crate::config::DaemonConfig::default().max_report_bytes,
    };
    Envelope::verify(&body, &key, "self-check", None, u64::MAX, rules).map(|_| ())
}
