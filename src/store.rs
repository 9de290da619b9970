//! Persistent state in SQLite: events, jobs, rounds, per-node poll state and the inventory
//! backend's tags and offline flags. WAL mode, numbered migrations, one transaction per change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;
use uuid::Uuid;

use crate::core::fence::{Call, FenceStatus, Flow, Outcome};
use crate::core::{
    Action, Event, Job, JobKind, JobSpec, JobStatus, Nanos, Policy, RepairStatus, State,
    reason_trail,
};
use crate::report::Status;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open state database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("state database holds a corrupt row: {0}")]
    Corrupt(String),
    #[error(
        "state database {path} fails its integrity check ({detail}); restore it from a backup or move it aside to start afresh"
    )]
    Integrity { path: String, detail: String },
    #[error("state database has schema version {found}, newer than this maintd ({known})")]
    TooNew { found: i64, known: i64 },
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: events, jobs, rounds, node poll state, inventory tags and offline flags.
    r#"
    CREATE TABLE events (
        id TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        canonical TEXT NOT NULL,
        action TEXT NOT NULL,
        command TEXT,
        status TEXT NOT NULL,
        tag TEXT NOT NULL,
        tagged INTEGER NOT NULL DEFAULT 0,
        acknowledged INTEGER NOT NULL DEFAULT 0,
        superseded_by TEXT,
        note TEXT,
        created_ns INTEGER NOT NULL,
        updated_ns INTEGER NOT NULL,
        cleared_ns INTEGER,
        cleared_why TEXT
    );
    -- Event identity: one live event per (node, canonical JSON).
    CREATE UNIQUE INDEX events_identity ON events(node, canonical) WHERE cleared_ns IS NULL;
    CREATE TABLE rounds (
        id INTEGER PRIMARY KEY,
        started_ns INTEGER NOT NULL
    );
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL REFERENCES events(id),
        node TEXT NOT NULL,
        round INTEGER NOT NULL REFERENCES rounds(id),
        kind TEXT NOT NULL,
        command TEXT,
        status TEXT NOT NULL,
        reason TEXT NOT NULL,
        detail TEXT,
        created_ns INTEGER NOT NULL,
        finished_ns INTEGER
    );
    CREATE INDEX jobs_event ON jobs(event_id);
    CREATE INDEX jobs_status ON jobs(status);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        reachable INTEGER NOT NULL DEFAULT 0,
        last_answer_ns INTEGER,
        unreachable_since_ns INTEGER,
        last_error TEXT,
        last_seq INTEGER,
        last_report TEXT,
        diagnosed_ns INTEGER,
        diagnose_error TEXT,
        rejected INTEGER NOT NULL DEFAULT 0,
        last_rejection TEXT
    );
    CREATE TABLE inventory_tags (
        node TEXT NOT NULL,
        tag TEXT NOT NULL,
        created_ns INTEGER NOT NULL,
        PRIMARY KEY (node, tag)
    );
    CREATE TABLE inventory_offline (
        node TEXT PRIMARY KEY,
        since_ns INTEGER NOT NULL
    );
    "#,
    // 2: fence flows. The flow is one JSON document; `version` guards against stale writes.
    r#"
    CREATE TABLE fences (
        id TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        status TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_ns INTEGER NOT NULL,
        updated_ns INTEGER NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX fences_status ON fences(status, updated_ns);
    "#,
];

/// Outcome of an operator's cancel of a fence flow.
#[derive(Debug, PartialEq)]
pub enum FenceCancel {
    Canceled(Box<Flow>),
    NotFound,
    Final,
    PoweredOff,
    AlreadyCanceled,
}

/// Which executor-written outcome of a flow to set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowOutcome {
    Step,
    Release,
    Reclaim,
}

fn flow_from_row(r: &Row) -> Result<Flow> {
    let data: String = r.get(0)?;
    let version: i64 = r.get(1)?;
    let mut f: Flow =
        serde_json::from_str(&data).map_err(|e| corrupt(format!("fence flow: {e}")))?;
    f.version = version as u64;
    Ok(f)
}

/// An event, its jobs, and why it was cleared (None while it is live).
pub type EventRecord = (Event, Vec<Job>, Option<String>);

pub struct Store {
    conn: Mutex<Connection>,
    path: String,
}

/// Outcome of an operator's cancel request.
#[derive(Debug, PartialEq)]
pub enum CancelOutcome {
    Canceled,
    NotFound,
    AlreadyFinal(RepairStatus),
}

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
    pub last_report: Option<serde_json::Value>,
    #[serde(rename = "diagnosed-at")]
    pub diagnosed_ns: Option<i64>,
    #[serde(rename = "diagnose-error")]
    pub diagnose_error: Option<String>,
    #[serde(rename = "rejected-reports")]
    pub rejected: u64,
    #[serde(rename = "last-rejection")]
    pub last_rejection: Option<String>,
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

fn parse_uuid(s: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("bad uuid {s:?}")))
}

const EVENT_COLS: &str = "id, node, canonical, action, command, status, tag, tagged, acknowledged, superseded_by, note, created_ns, updated_ns";

fn event_from_row(r: &Row) -> Result<Event> {
    let id: String = r.get(0)?;
    let canonical: String = r.get(2)?;
    let action: String = r.get(3)?;
    let status: String = r.get(5)?;
    let sup: Option<String> = r.get(9)?;
    Ok(Event {
        id: parse_uuid(&id)?,
        node: r.get(1)?,
        original: serde_json::from_str(&canonical)
            .map_err(|e| corrupt(format!("event {id}: {e}")))?,
        canonical,
        action: Status::parse(&action).ok_or_else(|| corrupt(format!("action {action:?}")))?,
        command: r.get(4)?,
        status: RepairStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("status {status:?}")))?,
        tag: r.get(6)?,
        tagged: r.get(7)?,
        acknowledged: r.get(8)?,
        superseded_by: sup.as_deref().map(parse_uuid).transpose()?,
        note: r.get(10)?,
        created: r.get(11)?,
        updated: r.get(12)?,
    })
}

const JOB_COLS: &str =
    "id, event_id, node, round, kind, command, status, reason, detail, created_ns, finished_ns";

fn job_from_row(r: &Row) -> Result<Job> {
    let ev: String = r.get(1)?;
    let kind: String = r.get(4)?;
    let status: String = r.get(6)?;
    Ok(Job {
        id: r.get(0)?,
        event: parse_uuid(&ev)?,
        node: r.get(2)?,
        round: r.get(3)?,
        kind: JobKind::parse(&kind).ok_or_else(|| corrupt(format!("job kind {kind:?}")))?,
        command: r.get(5)?,
        status: JobStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("job status {status:?}")))?,
        reason: r.get(7)?,
        detail: r.get(8)?,
        created: r.get(9)?,
        finished: r.get(10)?,
    })
}

fn collect<T>(
    mut stmt: rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
    f: fn(&Row) -> Result<T>,
) -> Result<Vec<T>> {
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(f(r)?);
    }
    Ok(out)
}

/// Live (non-cleared) events, oldest first, and all their jobs.
fn live_events_and_jobs(c: &Connection) -> Result<(Vec<Event>, Vec<Job>)> {
    let events = collect(
        c.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE cleared_ns IS NULL ORDER BY created_ns, id"
        ))?,
        [],
        event_from_row,
    )?;
    let jobs = collect(
        c.prepare_cached(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE event_id IN (SELECT id FROM events WHERE cleared_ns IS NULL) ORDER BY id"
        ))?,
        [],
        job_from_row,
    )?;
    Ok((events, jobs))
}

impl Store {
    /// Opens (or creates) the database, refusing one that fails SQLite's integrity check: a
    /// daemon that cannot read its events must not run as if it had none.
    pub fn open(path: &Path) -> Result<Store> {
        let shown = path.display().to_string();
        let open_err = |source| StoreError::Open {
            path: shown.clone(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        let check: std::result::Result<Vec<String>, rusqlite::Error> = conn
            .prepare("PRAGMA integrity_check")
            .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect());
        match check {
            Ok(lines) if lines.len() == 1 && lines[0] == "ok" => {}
            Ok(lines) => {
                return Err(StoreError::Integrity {
                    path: shown,
                    detail: lines.into_iter().take(5).collect::<Vec<_>>().join("; "),
                });
            }
            Err(e) => {
                return Err(StoreError::Integrity {
                    path: shown,
                    detail: e.to_string(),
                });
            }
        }
        let mut store = Store::init(conn).map_err(|e| match e {
            StoreError::Sql(source) => open_err(source),
            other => other,
        })?;
        store.path = shown;
        Ok(store)
    }

    pub fn open_in_memory() -> Result<Store> {
        Store::init(Connection::open_in_memory()?)
    }

    /// Where the database lives, for messages about it.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn init(mut conn: Connection) -> Result<Store> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew {
                found: version,
                known,
            });
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction()?;
            tx.execute_batch(m)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(Store {
            conn: Mutex::new(conn),
            path: ":memory:".into(),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-applied change: SQLite rolls back.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The decision input: live events, their jobs, and the round bookkeeping.
    pub fn load_state(
        &self,
        policy: Policy,
        tags: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<State> {
        let c = self.conn();
        let (events, jobs) = live_events_and_jobs(&c)?;
        let round_running: Option<i64> = c
            .query_row(
                "SELECT MIN(round) FROM jobs WHERE status = 'running'",
                [],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        let last_round: i64 =
            c.query_row("SELECT COALESCE(MAX(id), 0) FROM rounds", [], |r| r.get(0))?;
        Ok(State {
            events,
            jobs,
            round_running,
            last_round,
            tags,
            policy,
            capacity: None,
            members: None,
        })
    }

    /// Applies one event-level action in its own transaction. Tags and rounds go elsewhere:
    /// `finalize`/`mark_tagged` and `start_round`.
    pub fn apply(&self, action: &Action, now: Nanos) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        match action {
            Action::CreateEvent(e) => {
                tx.execute(
                    &format!("INSERT INTO events ({EVENT_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)"),
                    params![
                        e.id.to_string(),
                        e.node,
                        e.canonical,
                        e.action.as_str(),
                        e.command,
                        e.status.as_str(),
                        e.tag,
                        e.tagged,
                        e.acknowledged,
                        e.superseded_by.map(|u| u.to_string()),
                        e.note,
                        e.created,
                        e.updated
                    ],
                )?;
            }
            Action::Cancel {
                event,
                superseded_by,
            } => {
                tx.execute(
                    "UPDATE events SET status='canceled', superseded_by=?2, note=?3, updated_ns=?4 WHERE id=?1",
                    params![
                        event.to_string(),
                        superseded_by.to_string(),
                        format!("superseded by more invasive event {superseded_by}"),
                        now
                    ],
                )?;
            }
            Action::Acknowledge { event } => {
                tx.execute(
                    "UPDATE events SET acknowledged=1, note='acknowledged (tag removed)', updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now],
                )?;
            }
            Action::Clear { event, why } => {
                tx.execute(
                    "UPDATE events SET cleared_ns=?2, cleared_why=?3, updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now, why],
                )?;
            }
            Action::Forget { event, why, .. } => {
                tx.execute(
                    "UPDATE events SET cleared_ns=?2, cleared_why=?3, updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now, why],
                )?;
                tx.execute(
                    "UPDATE jobs SET status='failed', detail=?3, finished_ns=?2 WHERE event_id=?1 AND status='running'",
                    params![event.to_string(), now, why],
                )?;
            }
            Action::Finalize {
                event,
                status,
                tag,
                note,
                ..
            } => {
                tx.execute(
                    "UPDATE events SET status=?2, tag=?3, tagged=0, acknowledged=0, note=?4, updated_ns=?5 WHERE id=?1",
                    params![event.to_string(), status.as_str(), tag, note, now],
                )?;
            }
            Action::Note { event, note } => {
                tx.execute(
                    "UPDATE events SET note=?2 WHERE id=?1",
                    params![event.to_string(), note],
                )?;
            }
            Action::ApplyTag { .. } | Action::StartRound { .. } => {}
        }
        tx.commit()?;
        Ok(())
    }

    pub fn mark_tagged(&self, event: &Uuid, now: Nanos) -> Result<()> {
        self.conn().execute(
            "UPDATE events SET tagged=1, updated_ns=?2 WHERE id=?1",
            params![event.to_string(), now],
        )?;
        Ok(())
    }

    /// Records a round and all its jobs at once, marking their events pending.
    pub fn start_round(&self, round: i64, specs: &[JobSpec], now: Nanos) -> Result<Vec<Job>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        tx.execute(
            "INSERT INTO rounds (id, started_ns) VALUES (?1, ?2)",
            params![round, now],
        )?;
        let mut jobs = Vec::new();
        for s in specs {
            let reason = reason_trail(&s.event);
            tx.execute(
                "INSERT INTO jobs (event_id, node, round, kind, command, status, reason, created_ns) VALUES (?1,?2,?3,?4,?5,'running',?6,?7)",
                params![s.event.to_string(), s.node, round, s.kind.as_str(), s.command, reason, now],
            )?;
            let id = tx.last_insert_rowid();
            if s.kind != JobKind::Online {
                tx.execute(
                    "UPDATE events SET status='pending', note=NULL, updated_ns=?2 WHERE id=?1 AND status IN ('noted','pending')",
                    params![s.event.to_string(), now],
                )?;
            }
            jobs.push(Job {
                id,
                event: s.event,
                node: s.node.clone(),
                round,
                kind: s.kind,
                command: s.command.clone(),
                status: JobStatus::Running,
                reason,
                detail: None,
                created: now,
                finished: None,
            });
        }
        tx.commit()?;
        Ok(jobs)
    }

    pub fn finish_job(&self, id: i64, ok: bool, detail: &str, now: Nanos) -> Result<()> {
        let status = if ok {
            JobStatus::Succeeded
        } else {
            JobStatus::Failed
        };
        self.conn().execute(
            "UPDATE jobs SET status=?2, detail=?3, finished_ns=?4 WHERE id=?1 AND status='running'",
            params![id, status.as_str(), detail, now],
        )?;
        Ok(())
    }

    pub fn running_jobs(&self) -> Result<Vec<Job>> {
        let c = self.conn();
        collect(
            c.prepare_cached(&format!(
                "SELECT {JOB_COLS} FROM jobs WHERE status='running' ORDER BY id"
            ))?,
            [],
            job_from_row,
        )
    }

    /// Live (non-cleared) events with their jobs, oldest first.
    pub fn events_with_jobs(&self) -> Result<Vec<(Event, Vec<Job>)>> {
        let c = self.conn();
        let (events, jobs) = live_events_and_jobs(&c)?;
        let mut by_event: HashMap<Uuid, Vec<Job>> = HashMap::new();
        for j in jobs {
            by_event.entry(j.event).or_default().push(j);
        }
        Ok(events
            .into_iter()
            .map(|e| {
                let j = by_event.remove(&e.id).unwrap_or_default();
                (e, j)
            })
            .collect())
    }

    /// One event (cleared ones included: an id stays resolvable) with its jobs.
    pub fn event(&self, id: &Uuid) -> Result<Option<EventRecord>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached(&format!(
            "SELECT {EVENT_COLS}, cleared_why FROM events WHERE id=?1"
        ))?;
        let mut rows = stmt.query([id.to_string()])?;
        let Some(r) = rows.next()? else {
            return Ok(None);
        };
        let e = event_from_row(r)?;
        let cleared: Option<String> = r.get(13)?;
        let jobs = collect(
            c.prepare_cached(&format!(
                "SELECT {JOB_COLS} FROM jobs WHERE event_id=?1 ORDER BY id"
            ))?,
            [id.to_string()],
            job_from_row,
        )?;
        Ok(Some((e, jobs, cleared)))
    }

    /// An operator's cancel: only a live event that is not final yet.
    pub fn cancel(&self, id: &Uuid, now: Nanos) -> Result<CancelOutcome> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let status: Option<String> = tx
            .query_row(
                "SELECT status FROM events WHERE id=?1 AND cleared_ns IS NULL",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        let Some(status) = status else {
            return Ok(CancelOutcome::NotFound);
        };
        let status =
            RepairStatus::parse(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?;
        if !status.is_active() {
            return Ok(CancelOutcome::AlreadyFinal(status));
        }
        tx.execute(
            "UPDATE events SET status='canceled', note='canceled by operator', updated_ns=?2 WHERE id=?1",
            params![id.to_string(), now],
        )?;
        tx.commit()?;
        Ok(CancelOutcome::Canceled)
    }

    /// Records one poll cycle for every node in a single transaction.
    pub fn record_polls(&self, updates: &[NodeUpdate], now: Nanos) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        {
            let mut ok = tx.prepare_cached(
                "INSERT INTO nodes (name, reachable, last_answer_ns, unreachable_since_ns, last_error, last_seq, last_report, diagnosed_ns, diagnose_error, last_rejection)
                 VALUES (?1, 1, ?2, NULL, NULL, ?3, ?4, ?5, ?6, NULL)
                 ON CONFLICT(name) DO UPDATE SET reachable=1, last_answer_ns=?2, unreachable_since_ns=NULL, last_error=NULL,
                   last_seq=?3, last_report=?4, diagnosed_ns=?5, diagnose_error=?6",
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
                        u.diagnose_error
                    ])?;
                } else {
                    down.execute(params![u.name, now, u.error])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<NodeRow>> {
        let c = self.conn();
        let stmt = c.prepare_cached(
            "SELECT name, reachable, last_answer_ns, unreachable_since_ns, last_error, last_seq, last_report, diagnosed_ns, diagnose_error, rejected, last_rejection FROM nodes ORDER BY name",
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
                last_report: report.and_then(|s| serde_json::from_str(&s).ok()),
                diagnosed_ns: r.get(7)?,
                diagnose_error: r.get(8)?,
                rejected: rejected as u64,
                last_rejection: r.get(10)?,
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

    /// Live (not cleared) events per repair status, for the metrics.
    pub fn event_status_counts(&self) -> Result<BTreeMap<String, i64>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached(
            "SELECT status, count(*) FROM events WHERE cleared_ns IS NULL GROUP BY status",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// When the oldest job still running started, if any.
    pub fn oldest_running_job_ns(&self) -> Result<Option<Nanos>> {
        let c = self.conn();
        Ok(c.query_row(
            "SELECT min(created_ns) FROM jobs WHERE status='running'",
            [],
            |r| r.get(0),
        )?)
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
        Ok(prev.and_then(|s| u64::try_from(s).ok()))
    }

    pub fn inventory_tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>> {
        let c = self.conn();
        let mut stmt =
            c.prepare_cached("SELECT node, tag FROM inventory_tags ORDER BY node, tag")?;
        let mut rows = stmt.query([])?;
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        while let Some(r) = rows.next()? {
            out.entry(r.get(0)?).or_default().insert(r.get(1)?);
        }
        Ok(out)
    }

    pub fn inventory_add_tag(&self, node: &str, tag: &str, now: Nanos) -> Result<()> {
        self.conn().execute(
            "INSERT OR IGNORE INTO inventory_tags (node, tag, created_ns) VALUES (?1, ?2, ?3)",
            params![node, tag, now],
        )?;
        Ok(())
    }

    /// Returns whether the tag was there.
    pub fn inventory_remove_tag(&self, node: &str, tag: &str) -> Result<bool> {
        let n = self.conn().execute(
            "DELETE FROM inventory_tags WHERE node=?1 AND tag=?2",
            params![node, tag],
        )?;
        Ok(n > 0)
    }

    pub fn inventory_set_offline(&self, node: &str, offline: bool, now: Nanos) -> Result<()> {
        let c = self.conn();
        if offline {
            c.execute(
                "INSERT OR IGNORE INTO inventory_offline (node, since_ns) VALUES (?1, ?2)",
                params![node, now],
            )?;
        } else {
            c.execute("DELETE FROM inventory_offline WHERE node=?1", [node])?;
        }
        Ok(())
    }

    pub fn inventory_offline(&self) -> Result<BTreeSet<String>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached("SELECT node FROM inventory_offline")?;
        let mut rows = stmt.query([])?;
        let mut out = BTreeSet::new();
        while let Some(r) = rows.next()? {
            out.insert(r.get(0)?);
        }
        Ok(out)
    }

    pub fn insert_flow(&self, f: &Flow) -> Result<()> {
        let data = serde_json::to_string(f).map_err(|e| corrupt(e.to_string()))?;
        self.conn().execute(
            "INSERT INTO fences (id, node, status, version, created_ns, updated_ns, data) VALUES (?1,?2,?3,0,?4,?5,?6)",
            params![f.id.to_string(), f.node, f.status.as_str(), f.created, f.updated, data],
        )?;
        Ok(())
    }

    /// Saves a flow unless someone changed it since it was loaded; returns whether it was saved.
    pub fn save_flow(&self, f: &Flow) -> Result<bool> {
        let data = serde_json::to_string(f).map_err(|e| corrupt(e.to_string()))?;
        let n = self.conn().execute(
            "UPDATE fences SET status=?2, updated_ns=?3, data=?4, version=version+1 WHERE id=?1 AND version=?5",
            params![f.id.to_string(), f.status.as_str(), f.updated, data, f.version as i64],
        )?;
        Ok(n == 1)
    }

    /// Read-modify-write of one flow in a transaction.
    fn update_flow(
        &self,
        id: &Uuid,
        change: impl FnOnce(&mut Flow) -> bool,
    ) -> Result<Option<Flow>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let f = {
            let mut stmt = tx.prepare_cached("SELECT data, version FROM fences WHERE id=?1")?;
            let mut rows = stmt.query([id.to_string()])?;
            match rows.next()? {
                Some(r) => Some(flow_from_row(r)?),
                None => None,
            }
        };
        let Some(mut f) = f else {
            return Ok(None);
        };
        if !change(&mut f) {
            return Ok(Some(f));
        }
        let data = serde_json::to_string(&f).map_err(|e| corrupt(e.to_string()))?;
        tx.execute(
            "UPDATE fences SET status=?2, updated_ns=?3, data=?4, version=version+1 WHERE id=?1",
            params![id.to_string(), f.status.as_str(), f.updated, data],
        )?;
        tx.commit()?;
        Ok(Some(f))
    }

    /// Records what the executor saw: a step attempt (with its agent calls), a release or a reclaim.
    pub fn set_flow_outcome(
        &self,
        id: &Uuid,
        which: FlowOutcome,
        outcome: Outcome,
        calls: Vec<Call>,
    ) -> Result<()> {
        self.update_flow(id, |f| {
            match which {
                FlowOutcome::Step => f.result = Some(outcome),
                FlowOutcome::Release => f.release_result = Some(outcome),
                FlowOutcome::Reclaim => f.reclaim_result = Some(outcome),
            }
            f.calls.extend(calls);
            true
        })?;
        Ok(())
    }

    pub fn mark_flow_tagged(&self, id: &Uuid) -> Result<()> {
        self.update_flow(id, |f| {
            f.tagged = true;
            true
        })?;
        Ok(())
    }

    /// An operator's cancel: only before the node was powered off.
    pub fn cancel_flow(&self, id: &Uuid, now: Nanos) -> Result<FenceCancel> {
        let mut verdict = FenceCancel::NotFound;
        let f = self.update_flow(id, |f| {
            if f.status == FenceStatus::Final {
                verdict = FenceCancel::Final;
                false
            } else if f.fenced {
                verdict = FenceCancel::PoweredOff;
                false
            } else if f.canceled {
                // A repeated cancel changes nothing and says so, as an event's does.
                verdict = FenceCancel::AlreadyCanceled;
                false
            } else {
                f.canceled = true;
                f.updated = now;
                f.history.push(crate::core::fence::Transition {
                    at: now,
                    step: f.step,
                    status: f.status,
                    note: "canceled by operator".into(),
                });
                verdict = FenceCancel::Canceled(Box::new(f.clone()));
                true
            }
        })?;
        Ok(if f.is_none() {
            FenceCancel::NotFound
        } else {
            verdict
        })
    }

    /// Flows the fencer decides on: every one not final, and final ones ended after `since`.
    pub fn fence_flows(&self, since: Nanos) -> Result<Vec<Flow>> {
        let c = self.conn();
        collect(
            c.prepare_cached(
                "SELECT data, version FROM fences WHERE status != 'final' OR updated_ns >= ?1 ORDER BY created_ns",
            )?,
            [since],
            flow_from_row,
        )
    }

    /// Every flow, newest first, for the API.
    pub fn all_flows(&self, limit: usize) -> Result<Vec<Flow>> {
        let c = self.conn();
        collect(
            c.prepare_cached("SELECT data, version FROM fences ORDER BY created_ns DESC LIMIT ?1")?,
            [limit as i64],
            flow_from_row,
        )
    }

    pub fn flow(&self, id: &Uuid) -> Result<Option<Flow>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached("SELECT data, version FROM fences WHERE id=?1")?;
        let mut rows = stmt.query([id.to_string()])?;
        match rows.next()? {
            Some(r) => Ok(Some(flow_from_row(r)?)),
            None => Ok(None),
        }
    }
}

/// The events a checkpoint keeps: every live one, those with a running job, and the 100 most
/// recently cleared (for the status history).
macro_rules! kept_events {
    () => {
        "SELECT id FROM events WHERE cleared_ns IS NULL
           OR id IN (SELECT event_id FROM jobs WHERE status = 'running')
           OR id IN (SELECT id FROM events WHERE cleared_ns IS NOT NULL
                     ORDER BY cleared_ns DESC LIMIT 100)"
    };
}

/// Tables a checkpoint carries, in insertion order (rounds and events before the jobs that
/// reference them), with the rows each keeps.
const CHECKPOINT: &[(&str, &str)] = &[
    (
        "events",
        concat!("SELECT * FROM events WHERE id IN (", kept_events!(), ")"),
    ),
    (
        "rounds",
        concat!(
            "SELECT * FROM rounds WHERE id = (SELECT MAX(id) FROM rounds)
               OR id IN (SELECT round FROM jobs WHERE event_id IN (",
            kept_events!(),
            "))"
        ),
    ),
    (
        "jobs",
        concat!(
            "SELECT * FROM jobs WHERE event_id IN (",
            kept_events!(),
            ")"
        ),
    ),
    (
        "fences",
        "SELECT * FROM fences WHERE status != 'final'
           OR id IN (SELECT id FROM fences ORDER BY updated_ns DESC LIMIT 100)",
    ),
];

fn sql_to_json(v: rusqlite::types::ValueRef<'_>) -> serde_json::Value {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => hex::encode(b).into(),
    }
}

impl Store {
    /// The decision state (events, jobs, rounds, fence flows) as one JSON document, for the
    /// leader's checkpoint. Poll state stays per replica.
    pub fn export_checkpoint(&self) -> Result<String> {
        let c = self.conn();
        let mut doc = serde_json::Map::new();
        doc.insert("schema".into(), (MIGRATIONS.len() as i64).into());
        for (table, query) in CHECKPOINT {
            let mut stmt = c.prepare_cached(query)?;
            let cols: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let row: Vec<serde_json::Value> = (0..cols.len())
                    .map(|i| r.get_ref(i).map(sql_to_json))
                    .collect::<Result<_, _>>()?;
                out.push(serde_json::Value::Array(row));
            }
            doc.insert(
                table.to_string(),
                serde_json::json!({"columns": cols, "rows": out}),
            );
        }
        Ok(serde_json::Value::Object(doc).to_string())
    }

    /// Replaces the decision state with a checkpoint, in one transaction: a malformed one is
    /// refused as a whole and the state stays as it was.
    pub fn import_checkpoint(&self, text: &str) -> Result<()> {
        let bad = |m: String| StoreError::Corrupt(format!("checkpoint: {m}"));
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let schema = doc["schema"]
            .as_i64()
            .ok_or_else(|| bad("no schema".into()))?;
        if schema > MIGRATIONS.len() as i64 {
            return Err(StoreError::TooNew {
                found: schema,
                known: MIGRATIONS.len() as i64,
            });
        }
        let mut c = self.conn();
        let tx = c.transaction()?;
        for table in ["jobs", "rounds", "events", "fences"] {
            tx.execute(&format!("DELETE FROM {table}"), [])?;
        }
        for (table, _) in CHECKPOINT {
            let t = &doc[*table];
            let known: BTreeSet<String> = tx
                .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()?;
            let cols: Vec<String> = serde_json::from_value(t["columns"].clone())
                .map_err(|e| bad(format!("{table}.columns: {e}")))?;
            if let Some(c) = cols.iter().find(|c| !known.contains(*c)) {
                return Err(bad(format!("{table} has no column {c:?}")));
            }
            let rows = t["rows"]
                .as_array()
                .ok_or_else(|| bad(format!("{table}.rows is not a list")))?;
            let sql = format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                cols.join(", "),
                vec!["?"; cols.len()].join(", ")
            );
            let mut stmt = tx.prepare(&sql)?;
            for row in rows {
                let vals = row
                    .as_array()
                    .filter(|v| v.len() == cols.len())
                    .ok_or_else(|| bad(format!("{table}: a row does not match its columns")))?;
                let params: Vec<rusqlite::types::Value> = vals
                    .iter()
                    .map(|v| match v {
                        serde_json::Value::Null => Ok(rusqlite::types::Value::Null),
                        serde_json::Value::String(s) => Ok(rusqlite::types::Value::Text(s.clone())),
                        serde_json::Value::Number(n) => Ok(match n.as_i64() {
                            Some(i) => rusqlite::types::Value::Integer(i),
                            None => rusqlite::types::Value::Real(n.as_f64().unwrap_or(0.0)),
                        }),
                        other => Err(bad(format!("{table}: unexpected value {other}"))),
                    })
                    .collect::<Result<_>>()?;
                stmt.execute(rusqlite::params_from_iter(params))?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Observation, Observations, decide};
    use crate::report::Verdict;

    fn obs(node: &str, json: &str) -> Observations {
        let mut o = Observations::new();
        o.reports.insert(
            node.into(),
            Observation::Report(Verdict::parse_bytes(json.as_bytes()).unwrap()),
        );
        o
    }

    /// Runs decide and applies its event-level actions and rounds, as the executor does.
    fn tick(s: &Store, o: &Observations, now: Nanos) -> Vec<Action> {
        let state = s
            .load_state(Policy::default(), s.inventory_tags().unwrap())
            .unwrap();
        let actions = decide(&state, o, now);
        for a in &actions {
            match a {
                Action::StartRound { round, jobs } => {
                    s.start_round(*round, jobs, now).unwrap();
                }
                Action::Finalize {
                    event, node, tag, ..
                } => {
                    s.apply(a, now).unwrap();
                    s.inventory_add_tag(node, tag, now).unwrap();
                    s.mark_tagged(event, now).unwrap();
                }
                other => s.apply(other, now).unwrap(),
            }
        }
        actions
    }

    #[test]
    fn events_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let o = obs(
            "n1",
            r#"{"status":"evacuate","details":{"b":2,"a":[1,2.5,"x"]}}"#,
        );
        {
            let s = Store::open(&path).unwrap();
            tick(&s, &o, 100);
            let evs = s.events_with_jobs().unwrap();
            assert_eq!(evs.len(), 1);
            assert_eq!(evs[0].0.status, RepairStatus::Pending);
            assert_eq!(evs[0].1[0].kind, JobKind::Evacuate);
            assert_eq!(evs[0].1[0].reason, format!("maintd:{}", evs[0].0.id));
        }
        let s = Store::open(&path).unwrap();
        let state = s.load_state(Policy::default(), BTreeMap::new()).unwrap();
        assert_eq!(state.events.len(), 1);
        assert_eq!(state.round_running, Some(1));
        assert_eq!(state.events[0].original["details"]["a"][1], 2.5);
        // Same observation again: no new event, no new round.
        assert!(tick(&s, &o, 200).is_empty());
        let journal: String = s
            .conn()
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal");
    }

    #[test]
    fn a_checkpoint_carries_the_decision_state_and_a_bad_one_changes_nothing() {
        let leader = Store::open_in_memory().unwrap();
        tick(
            &leader,
            &obs("n1", r#"{"status":"evacuate","details":{"x":[1,2.5]}}"#),
            100,
        );
        let text = leader.export_checkpoint().unwrap();
        let standby = Store::open_in_memory().unwrap();
        standby.import_checkpoint(&text).unwrap();
        let (a, b) = (
            leader.events_with_jobs().unwrap(),
            standby.events_with_jobs().unwrap(),
        );
        assert_eq!(a, b);
        let state = standby
            .load_state(Policy::default(), BTreeMap::new())
            .unwrap();
        assert_eq!(state.round_running, Some(1), "the running job came along");
        // Importing again replaces rather than duplicates.
        standby.import_checkpoint(&text).unwrap();
        assert_eq!(standby.events_with_jobs().unwrap().len(), 1);

        let mut wrong_column: serde_json::Value = serde_json::from_str(&text).unwrap();
        wrong_column["jobs"]["columns"][0] = "id; DROP TABLE jobs".into();
        let mut short_row: serde_json::Value = serde_json::from_str(&text).unwrap();
        short_row["jobs"]["rows"][0].as_array_mut().unwrap().pop();
        let mut odd_value: serde_json::Value = serde_json::from_str(&text).unwrap();
        odd_value["events"]["rows"][0][0] = serde_json::json!([1]);
        for (bad, why) in [
            ("{".to_string(), "not JSON"),
            (wrong_column.to_string(), "jobs has no column"),
            (short_row.to_string(), "does not match its columns"),
            (odd_value.to_string(), "unexpected value"),
            (r#"{"schema": 99}"#.to_string(), "newer than this maintd"),
        ] {
            let err = standby.import_checkpoint(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
            assert_eq!(
                standby.events_with_jobs().unwrap(),
                b,
                "state kept after {why}"
            );
        }
    }

    #[test]
    fn the_identity_index_refuses_a_duplicate_live_event() {
        let s = Store::open_in_memory().unwrap();
        let o = obs("n1", r#"{"status":"evacuate"}"#);
        let a = tick(&s, &o, 1);
        let Action::CreateEvent(mut e) = a[0].clone() else {
            panic!()
        };
        e.id = Uuid::new_v4();
        assert!(s.apply(&Action::CreateEvent(e), 2).is_err());
    }

    #[test]
    fn cancel_outcomes() {
        let s = Store::open_in_memory().unwrap();
        let a = tick(&s, &obs("n1", r#"{"status":"evacuate"}"#), 1);
        let Action::CreateEvent(e) = &a[0] else {
            panic!()
        };
        assert_eq!(
            s.cancel(&Uuid::new_v4(), 2).unwrap(),
            CancelOutcome::NotFound
        );
        assert_eq!(s.cancel(&e.id, 2).unwrap(), CancelOutcome::Canceled);
        assert_eq!(
            s.cancel(&e.id, 3).unwrap(),
            CancelOutcome::AlreadyFinal(RepairStatus::Canceled)
        );
    }

    #[test]
    fn a_full_live_repair_flow_through_the_store() {
        let s = Store::open_in_memory().unwrap();
        let o = obs("n1", r#"{"status":"live-repair","command":"fix"}"#);
        tick(&s, &o, 1);
        let job = &s.running_jobs().unwrap()[0];
        s.finish_job(job.id, true, "exit 0", 2).unwrap();
        tick(&s, &o, 3);
        let (e, _) = &s.events_with_jobs().unwrap()[0];
        assert_eq!(e.status, RepairStatus::Completed);
        assert!(e.tagged);
        assert!(s.inventory_tags().unwrap()["n1"].contains(&e.tag));
        // Operator removes the tag; the problem is gone: forgotten.
        s.inventory_remove_tag("n1", &e.tag).unwrap();
        tick(&s, &obs("n1", r#"{"status":"Ok"}"#), 4);
        assert!(s.events_with_jobs().unwrap().is_empty());
        let (_, _, why) = s.event(&e.id).unwrap().unwrap();
        assert_eq!(why.as_deref(), Some("acknowledged and no longer observed"));
    }

    #[test]
    fn poll_records_keep_the_first_unreachable_time_and_count_rejections() {
        let s = Store::open_in_memory().unwrap();
        let down = NodeUpdate {
            name: "n1".into(),
            error: Some("refused".into()),
            ..Default::default()
        };
        s.record_polls(std::slice::from_ref(&down), 10).unwrap();
        s.record_polls(&[down], 20).unwrap();
        let n = &s.nodes().unwrap()[0];
        assert!(!n.reachable);
        assert_eq!(n.unreachable_since_ns, Some(10));
        let rej = NodeUpdate {
            name: "n1".into(),
            answered: true,
            rejection: Some("bad signature".into()),
            ..Default::default()
        };
        s.record_polls(&[rej.clone(), rej], 30).unwrap();
        let n = &s.nodes().unwrap()[0];
        assert_eq!(n.rejected, 2);
        assert_eq!(n.unreachable_since_ns, None);
        s.record_polls(
            &[NodeUpdate {
                name: "n1".into(),
                answered: true,
                seq: Some(42),
                report: Some("{}".into()),
                ..Default::default()
            }],
            40,
        )
        .unwrap();
        assert_eq!(s.last_seqs().unwrap()["n1"], 42);
        assert_eq!(s.nodes().unwrap()[0].rejected, 2);
    }
}
