//! hbal, Ganeti's balancer, as the source of balancing moves: run on the master's query socket,
//! its first set of jobs read from its command listing, each command turned into a RAPI call
//! (only migrate, failover and replace-disks of one plainly named instance).

use std::time::Duration;

use serde_json::json;

use super::backend::Ganeti;
use super::tasks::{Call, call};
use crate::cluster::ClusterError;

impl Ganeti {
    /// Runs hbal on the master's query socket and returns its commands.
    pub(super) async fn hbal(&self) -> Result<String, ClusterError> {
        let s = &self.upkeep;
        let mut cmd = tokio::process::Command::new(&s.hbal);
        cmd.arg(format!("-L{}", s.luxi_socket.display())).arg("-C");
        if s.balance_mond {
            cmd.arg("--mond=yes");
        }
        cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
        let what = format!("{} -L{} -C", s.hbal.display(), s.luxi_socket.display());
        let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
            .await
            .map_err(|_| ClusterError::Ganeti(format!("{what}: no answer within 120 s")))?
            .map_err(|e| ClusterError::Ganeti(format!("{what}: {e}")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .last()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>();
            return Err(ClusterError::Ganeti(format!(
                "{what}: {}: {last}",
                out.status
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The jobs of hbal's first job set (its `-C` output), each as its command lines.
pub(super) fn first_jobset(text: &str) -> Vec<Vec<String>> {
    let mut jobs: Vec<Vec<String>> = Vec::new();
    let mut sets = 0;
    for line in text.lines().map(str::trim) {
        if line.starts_with("echo jobset ") {
            sets += 1;
            if sets > 1 {
                break;
            }
        } else if sets == 1 && line.starts_with("echo job ") {
            jobs.push(Vec::new());
        } else if sets == 1
            && line.starts_with("gnt-")
            && let Some(j) = jobs.last_mut()
        {
            j.extend(line.split(" && ").map(str::to_string));
        }
    }
    jobs.retain(|j| !j.is_empty());
    jobs
}

/// One hbal command as a RAPI call: `migrate`, `failover` and `replace-disks` of one instance.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Move {
    pub(super) instance: String,
    what: &'static str,
    /// The target node (`-n`).
    pub(super) node: Option<String>,
    /// `replace-disks -p`/`-s`: on the primary or the secondary.
    side: Option<&'static str>,
}

pub(super) fn parse_move(line: &str) -> Option<Move> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (["gnt-instance", what, rest @ ..], Some(instance)) = (words.as_slice(), words.last())
    else {
        return None;
    };
    // Names go into RAPI paths: plain host-like names only.
    let name = |n: &str| {
        !n.starts_with('-')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
    };
    if !name(instance) {
        return None;
    }
    let what = match *what {
        "migrate" => "migrate",
        "failover" => "failover",
        "replace-disks" => "replace-disks",
        _ => return None,
    };
    let mut node = None;
    let mut side = None;
    let mut args = rest[..rest.len().saturating_sub(1)].iter();
    while let Some(a) = args.next() {
        match *a {
            "-f" | "--force" => {}
            "-n" | "--new-secondary" | "--target-node" => {
                node = Some(args.next().filter(|n| name(n))?.to_string())
            }
            "-p" => side = Some("replace_on_primary"),
            "-s" => side = Some("replace_on_secondary"),
            _ => return None,
        }
    }
    Some(Move {
        instance: instance.to_string(),
        what,
        node,
        side,
    })
}

impl Move {
    pub(super) fn call(&self) -> Call {
        let i = &self.instance;
        match (self.what, &self.node) {
            ("migrate", Some(n)) => call(
                "PUT",
                format!("/2/instances/{i}/migrate"),
                json!({"mode": "live", "target_node": n}),
            ),
            ("migrate", None) => call(
                "PUT",
                format!("/2/instances/{i}/migrate"),
                json!({"mode": "live"}),
            ),
            ("failover", Some(n)) => call(
                "PUT",
                format!("/2/instances/{i}/failover"),
                json!({"target_node": n}),
            ),
            ("failover", None) => call("PUT", format!("/2/instances/{i}/failover"), json!({})),
            (_, Some(n)) => call(
                "POST",
                format!("/2/instances/{i}/replace-disks"),
                json!({"mode": "replace_new_secondary", "remote_node": n}),
            ),
            (_, None) => call(
                "POST",
                format!("/2/instances/{i}/replace-disks"),
                json!({"mode": self.side.unwrap_or("replace_auto")}),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HBAL: &str = "Trying to minimize the CV...
    1. insta node1       => node2         4.50531010 a=fa:node2
Cluster score improved from 9.01062020 to 0.00000000
Solution length=2

Commands to run to reach the above solution:
  
  echo jobset 1, 2 jobs
    echo job 1/1
    gnt-instance migrate -f -n node2 insta
    echo job 1/2
    gnt-instance replace-disks -n node3 instb && gnt-instance migrate -f instb
  
  echo jobset 2, 1 jobs
    echo job 2/1
    gnt-instance migrate -f -n node2 instc
";

    #[test]
    fn only_hbals_first_jobset_is_taken() {
        let jobs = first_jobset(HBAL);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0], ["gnt-instance migrate -f -n node2 insta"]);
        assert_eq!(jobs[1].len(), 2);
        let m = parse_move(&jobs[0][0]).unwrap();
        assert_eq!(
            (m.instance.as_str(), m.node.as_deref()),
            ("insta", Some("node2"))
        );
        assert_eq!(
            m.call().body,
            json!({"mode": "live", "target_node": "node2"})
        );
        let r = parse_move(&jobs[1][0]).unwrap();
        assert_eq!(r.call().path, "/2/instances/instb/replace-disks");
        assert!(first_jobset("No solution found\n").is_empty());
    }

    #[test]
    fn commands_maintd_does_not_know_are_refused() {
        for bad in [
            "gnt-instance remove -f insta",
            "gnt-node evacuate node1",
            "gnt-instance migrate --cleanup insta",
            "gnt-instance migrate -n",
            "gnt-instance migrate -f -n ../x insta",
            "gnt-instance failover -f inst/../../x",
            "rm -rf /",
        ] {
            assert_eq!(parse_move(bad), None, "{bad}");
        }
    }
}
