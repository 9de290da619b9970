//! The audit trail: every operator command accepted, who sent it, and how it ended, kept with
//! the state it changed so that a restart does not forget who did what.

use super::*;

/// One operator command, as `/1/audit`, a flow's timeline and an event show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Command {
    pub seq: i64,
    /// When it was accepted (the steady timeline, as every time the API shows).
    pub at: Nanos,
    /// The operator whose key signed it, or `cluster-key`.
    pub operator: String,
    pub method: String,
    /// Path and query, as signed.
    pub path: String,
    /// The HTTP status it was answered with; absent while it runs, or when the daemon
    /// stopped before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// Commands the trail keeps: the newest this many. Only authenticated operators add to it, but
/// a script looping on a command must not grow the database without end.
pub const AUDIT_KEEP: i64 = 100_000;

/// The trail is cut back every this many commands, not on each one.
const AUDIT_PRUNE_EVERY: i64 = 1024;

impl Store {
    /// Records a command before it runs; returns its number.
    pub fn audit_begin(&self, operator: &str, method: &str, path: &str, at: Nanos) -> Result<i64> {
        let c = self.conn();
        c.execute(
            "INSERT INTO audit (at_ns, operator, method, path) VALUES (?1, ?2, ?3, ?4)",
            params![at, operator, method, path],
        )?;
        let seq = c.last_insert_rowid();
        drop(c);
        if seq % AUDIT_PRUNE_EVERY == 0 {
            self.prune_audit(seq, AUDIT_KEEP)?;
        }
        Ok(seq)
    }

    /// Forgets the commands older than the newest `keep` of those up to `seq`.
    pub(crate) fn prune_audit(&self, seq: i64, keep: i64) -> Result<usize> {
        Ok(self
            .conn()
            .execute("DELETE FROM audit WHERE seq <= ?1", params![seq - keep])?)
    }

    /// Records how command `seq` was answered.
    pub fn audit_end(&self, seq: i64, status: u16) -> Result<()> {
        self.conn().execute(
            "UPDATE audit SET status=?2 WHERE seq=?1",
            params![seq, status],
        )?;
        Ok(())
    }

    /// The newest commands first, at most `limit`; only those whose path names `about` when
    /// given (an event's or a flow's id).
    pub fn audit(&self, about: Option<&str>, limit: usize) -> Result<Vec<Command>> {
        let c = self.conn();
        let stmt = c.prepare_cached(
            "SELECT seq, at_ns, operator, method, path, status FROM audit
             WHERE ?1 IS NULL OR instr(path, ?1) > 0 ORDER BY seq DESC LIMIT ?2",
        )?;
        collect(stmt, params![about, limit as i64], |r| {
            Ok(Command {
                seq: r.get(0)?,
                at: r.get(1)?,
                operator: r.get(2)?,
                method: r.get(3)?,
                path: r.get(4)?,
                status: r
                    .get::<_, Option<i64>>(5)?
                    .and_then(|s| u16::try_from(s).ok()),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trail_keeps_the_newest_commands_only() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("s.db")).unwrap();
        let mut last = 0;
        for i in 0..10 {
            last = s
                .audit_begin("alice", "POST", &format!("/1/x/{i}"), i)
                .unwrap();
        }
        assert_eq!(s.prune_audit(last, 4).unwrap(), 6);
        let kept: Vec<String> = s
            .audit(None, 100)
            .unwrap()
            .into_iter()
            .map(|c| c.path)
            .collect();
        assert_eq!(kept, ["/1/x/9", "/1/x/8", "/1/x/7", "/1/x/6"]);
    }
}
