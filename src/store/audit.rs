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

impl Store {
    /// Records a command before it runs; returns its number.
    pub fn audit_begin(&self, operator: &str, method: &str, path: &str, at: Nanos) -> Result<i64> {
        let c = self.conn();
        c.execute(
            "INSERT INTO audit (at_ns, operator, method, path) VALUES (?1, ?2, ?3, ?4)",
            params![at, operator, method, path],
        )?;
        Ok(c.last_insert_rowid())
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
