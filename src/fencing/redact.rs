//! What may be kept of a fence agent's output: every secret the daemon knows and every
//! password-like `key=value` replaced before the text is stored, logged or served, Python
//! warning noise dropped, and the lines that explain a failure kept when the text is cut.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

pub const REDACTED: &str = "[redacted]";

/// `password=x`, `passwd: x`, `snmp_priv_passwd = x`, `--password x`, `-P x`, `community=x`…
static KEY_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)((?:[a-z0-9_-]*(?:passw(?:or)?d|passphrase|secret|token|community|priv_?key|_key)[a-z0-9_-]*)\s*[=:]\s*)([^\s,;]+)",
    )
    .expect("the pattern compiles")
});
/// A parameter name whose value is secret (`password`, `community`, `snmp_priv_passwd`…).
static SECRET_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)passw(?:or)?d|passphrase|secret|token|community|priv_?key|_key$")
        .expect("the pattern compiles")
});

/// Whether a parameter's value is secret by its name: such a value is redacted wherever it
/// appears (agent output, the log, the API), however it was given.
pub fn secret_by_name(k: &str) -> bool {
    SECRET_NAME.is_match(k)
}

static FLAG_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"((?:^|\s)(?:-P|--password|--passwd|--community)\s+)(\S+)")
        .expect("the pattern compiles")
});
/// `/usr/lib/python3/dist-packages/x.py:12: DeprecationWarning: …` and the source line after it.
static PY_WARNING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\S+\.py:\d+: [A-Za-z]*Warning:").expect("the pattern compiles"));
static EXPLAINS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)error|fail|unable|unreachable|refused|denied|timed? ?out|invalid|incorrect|not |no ",
    )
    .expect("the pattern compiles")
});

/// Replaces known secret values and password-like parameters in agent output.
#[derive(Default, Clone)]
pub struct Redactor {
    /// Longest first, so a secret that contains another is replaced whole.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let set: BTreeSet<String> = secrets
            .into_iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let mut secrets: Vec<String> = set.into_iter().collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    /// This redactor with `extra` secrets as well.
    pub fn with(&self, extra: &[String]) -> Redactor {
        Redactor::new(self.secrets.iter().chain(extra).cloned())
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        let out = KEY_VALUE.replace_all(&out, format!("${{1}}{REDACTED}"));
        FLAG_VALUE
            .replace_all(&out, format!("${{1}}{REDACTED}"))
            .into_owned()
    }

    /// The part of an agent's output worth keeping, redacted, within `max` characters: warning
    /// noise dropped, and when it must be cut, the lines that explain a failure kept first.
    pub fn summarize(&self, output: &str, max: usize) -> String {
        let redacted = self.redact(output);
        let mut lines: Vec<&str> = Vec::new();
        let mut skip_source_line = false;
        for line in redacted.lines() {
            if skip_source_line {
                skip_source_line = false;
                if line.starts_with(char::is_whitespace) {
                    continue;
                }
            }
            if PY_WARNING.is_match(line) {
                skip_source_line = true;
                continue;
            }
            if !line.trim().is_empty() {
                lines.push(line.trim_end());
            }
        }
        let all = lines.join("\n");
        if all.chars().count() <= max {
            return all;
        }
        // Too long: the explaining lines, then the last line, each cut to fit.
        let mut keep: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| EXPLAINS.is_match(l))
            .collect();
        if let Some(last) = lines.last()
            && keep.last() != Some(last)
        {
            keep.push(last);
        }
        let joined = keep.join("\n");
        crate::exec::tail_chars(&joined, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_password_parameters_are_replaced() {
        let r = Redactor::new(["s3cr3t-pw".to_string(), "pw".to_string()]);
        let out = r.redact(
            "Sent: s3cr3t-pw\npassword=hunter2 ipaddr=10.0.0.1\npasswd: x1\nipmitool -H h -P abc -U admin\nsnmp_priv_passwd = zz, login=admin",
        );
        assert!(!out.contains("s3cr3t") && !out.contains("hunter2"), "{out}");
        assert!(
            !out.contains("x1") && !out.contains("abc") && !out.contains("zz"),
            "{out}"
        );
        assert!(
            out.contains("ipaddr=10.0.0.1") && out.contains("login=admin"),
            "{out}"
        );
        assert!(out.contains("Sent: [redacted]"), "{out}");
    }

    #[test]
    fn warnings_are_dropped_and_the_cause_survives_a_cut() {
        let noise = "/usr/lib/python3/dist-packages/pexpect/spawnbase.py:12: DeprecationWarning: x is deprecated\n  import imp\n";
        let body = "line of chatter\n".repeat(40);
        let text = format!(
            "{noise}{body}Failed: Unable to obtain correct plug status or plug is not available\n"
        );
        let r = Redactor::default();
        let s = r.summarize(&text, 200);
        assert!(
            !s.contains("DeprecationWarning") && !s.contains("import imp"),
            "{s}"
        );
        assert!(s.contains("Unable to obtain correct plug status"), "{s}");
        assert!(s.chars().count() <= 200);
        assert_eq!(r.summarize("ok\n\n", 100), "ok");
    }
}
