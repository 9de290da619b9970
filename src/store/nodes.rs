//! Per-node poll state: reachability, the last verified report and sequence, rejections.

use super::*;

/// What one poll learned about a node.
#[derive(Debug, Clone, Default)]
pub struct NodeUpdate {
    pub name: String,
    pub answered: bool,
    pub error: Option<String>,
    pub seq: Option<u64>,
    pub report: Option<String>,
    pub diagnosed_ns: Option<i64>,
    pub diagnose_error: Option<String>,
    pub rejection: Option<String>,
    pub boot: Option<crate::report::BootReport>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeRow {
    pub name: String,
    pub reachable: bool,
    #[serde(rename = "last-answer")]
    pub last_answer_ns: Option<i64>,
    #[serde(rename = "unreachable-since")]
    pub unreachable_since_ns: Option<i64>,
    #[serde(rename = "last-error")]
    pub last_error: Option<String>,
    #[serde(rename = "last-seq")]
    pub last_seq: Option<u64>,
    #[serde(rename = "last-report")]
    pub last_report: Option<maintd_core::verdict::ExactJson>,
    #[serde(rename = "diagnosed-at")]
    pub diagnosed_ns: Option<i64>,
    #[serde(rename = "diagnose-error")]
    pub diagnose_error: Option<String>,
    #[serde(rename = "rejected-reports")]
    pub rejected: u64,
    #[serde(rename = "last-rejection")]
    pub last_rejection: Option<String>,
    /// The boot its last verified report came from.
    #[serde(rename = "boot-id")]
    pub boot_id: Option<uuid::Uuid>,
    #[serde(rename = "booted-at")]
    pub booted_ns: Option<i64>,
}

impl NodeRow {
    /// When the node last diagnosed itself healthy: its last verified report says `Ok` and its
    /// diagnose did not fail.
    pub fn healthy_at(&self) -> Option<Nanos> {
        if self.diagnose_error.is_some() {
            return None;
        }
        let verdict = maintd_core::verdict::Verdict::from_exact(self.last_report.clone()?).ok()?;
        (verdict.status == maintd_core::verdict::Status::Ok)
            .then_some(self.diagnosed_ns)
            .flatten()
    }

    /// The boot of its last verified report, with no healthy report counted yet: a restart
    /// of the daemon starts the count of a returning node again.
    pub fn boot(&self) -> Option<maintd_core::fencing::machine::BootSeen> {
        Some(maintd_core::fencing::machine::BootSeen {
            id: self.boot_id?,
            booted_at: self.booted_ns?,
            reported_at: self.diagnosed_ns.unwrap_or(i64::MIN),
            clean: 0,
        })
    }
}

impl Store {
    /// Records one poll cycle for every node in a single transaction.
    pub fn record_polls(&self, updates: &[NodeUpdate], now: Nanos) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        {
            let mut ok = tx.prepare_cached(
                "INSERT INTO nodes (name, reachable, last_answer_ns, unreachable_since_ns, last_error, last_seq, last_report, diagnosed_ns, diagnose_error, last_rejection, boot_id, boot_ns)
                 VALUES (?1, 1, ?2, NULL, NULL, ?3, ?4, ?5, ?6, NULL, ?7, ?8)
                 ON CONFLICT(name) DO UPDATE SET reachable=1, last_answer_ns=?2, unreachable_since_ns=NULL, last_error=NULL,
                   last_seq=?3, last_report=?4, diagnosed_ns=?5, diagnose_error=?6, boot_id=?7, boot_ns=?8",
            )?;
            let mut rejected = tx.prepare_cached(
                "INSERT INTO nodes (name, reachable, last_answer_ns, rejected, last_rejection) VALUES (?1, 1, ?2, 1, ?3)
                 ON CONFLICT(name) DO UPDATE SET reachable=1, last_answer_ns=?2, unreachable_since_ns=NULL,
                   rejected=rejected+1, last_rejection=?3",
            )?;
            let mut no_report = tx.prepare_cached(
                "INSERT INTO nodes (name, reachable, last_answer_ns, last_error) VALUES (?1, 1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET reachable=1, last_answer_ns=?2, unreachable_since_ns=NULL, last_error=?3",
            )?;
            let mut down = tx.prepare_cached(
                "INSERT INTO nodes (name, reachable, unreachable_since_ns, last_error) VALUES (?1, 0, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET reachable=0, last_error=?3,
                   unreachable_since_ns=COALESCE(unreachable_since_ns, ?2)",
            )?;
            for u in updates {
                if let Some(r) = &u.rejection {
                    rejected.execute(params![u.name, now, r])?;
                } else if u.answered && u.report.is_none() {
                    no_report.execute(params![u.name, now, u.error])?;
                } else if u.answered {
                    ok.execute(params![
                        u.name,
                        now,
                        u.seq.and_then(|s| i64::try_from(s).ok()),
                        u.report,
                        u.diagnosed_ns,
                        u.diagnose_error,
                        u.boot.map(|b| b.id.to_string()),
                        u.boot.map(|b| b.at)
                    ])?;
                } else {
                    down.execute(params![u.name, now, u.error])?;
                }
            }
        }
        tx.commit()?;
        self.changes.nodes_changed();
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<NodeRow>> {
        let c = self.reader();
        let stmt = c.prepare_cached(
            "SELECT name, reachable, last_answer_ns, unreachable_since_ns, last_error, last_seq, last_report, diagnosed_ns, diagnose_error, rejected, last_rejection, boot_id, boot_ns FROM nodes ORDER BY name",
        )?;
        collect(stmt, [], |r| {
            let report: Option<String> = r.get(6)?;
            let seq: Option<i64> = r.get(5)?;
            let rejected: i64 = r.get(9)?;
            Ok(NodeRow {
                name: r.get(0)?,
                reachable: r.get(1)?,
                last_answer_ns: r.get(2)?,
                unreachable_since_ns: r.get(3)?,
                last_error: r.get(4)?,
                last_seq: seq.and_then(|s| u64::try_from(s).ok()),
                // Written by the poller as the exact canonical form of a verified report.
                last_report: report.map(maintd_core::verdict::ExactJson::assume_canonical),
                diagnosed_ns: r.get(7)?,
                diagnose_error: r.get(8)?,
                rejected: rejected as u64,
                last_rejection: r.get(10)?,
                boot_id: r
                    .get::<_, Option<String>>(11)?
                    .and_then(|s| uuid::Uuid::parse_str(&s).ok()),
                booted_ns: r.get(12)?,
            })
        })
    }

    /// The highest accepted sequence per node, so a replay stays rejected across restarts.
    pub fn last_seqs(&self) -> Result<HashMap<String, u64>> {
        let c = self.conn();
        let mut stmt =
            c.prepare_cached("SELECT name, last_seq FROM nodes WHERE last_seq IS NOT NULL")?;
        let mut rows = stmt.query([])?;
        let mut out = HashMap::new();
        while let Some(r) = rows.next()? {
            let s: i64 = r.get(1)?;
            // A negative value can only come from an older version that stored a sequence
            // above i64::MAX; it would reject every report, so it counts as none.
            if let Ok(s) = u64::try_from(s) {
                out.insert(r.get(0)?, s);
            }
        }
        Ok(out)
    }

    /// Forgets the last accepted sequence of `node`; returns it, or `None` when there was none.
    pub fn reset_seq(&self, node: &str) -> Result<Option<u64>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let prev: Option<i64> = tx
            .query_row("SELECT last_seq FROM nodes WHERE name=?1", [node], |r| {
                r.get(0)
            })
            .optional()?
            .flatten();
        tx.execute("UPDATE nodes SET last_seq=NULL WHERE name=?1", [node])?;
        tx.commit()?;
        // `/1/nodes` shows the sequence: its kept pages and index follow the count.
        self.changes.nodes_changed();
        Ok(prev.and_then(|s| u64::try_from(s).ok()))
    }
}
