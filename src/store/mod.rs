//! Persistent state in SQLite: the connection, its migrations and integrity check. WAL mode,
//! numbered migrations, one transaction per change. One file per table group: `events` (events,
//! jobs, rounds), `nodes` (poll state), `inventory` (the inventory backend's tags and offline
//! flags), `flows` (fence flows) and `checkpoint` (the leader's export and import); `tests` is
//! the conformance suite for all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;
use uuid::Uuid;

use crate::sync::LockExt;
use maintd_core::fencing::machine::{Call, FenceRequest, Flow};
use maintd_core::repair::{
    Action, Event, Job, JobKind, JobSpec, JobStatus, Policy, RepairStatus, State, reason_trail,
};
use maintd_core::verdict::Nanos;
use maintd_core::verdict::Outcome;
use maintd_core::verdict::Status;

mod audit;
pub mod changes;
pub mod checkpoint;
mod controls;
mod drills;
mod events;
mod flows;
mod inventory;
mod maintenance;
mod nodes;
#[cfg(test)]
mod tests;

pub use audit::Command;
pub use checkpoint::Checkpoint;
pub use controls::Pause;
pub use events::CancelOutcome;
pub(crate) use flows::apply_cancel;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub(crate) use flows::conformance as flow_conformance;
pub use flows::{FenceCancel, FlowStore, Requests};
pub use maintenance::Maintenance;
pub use nodes::{NodeRow, NodeUpdate};

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
    /// The database cannot be written where it lies (a read-only file system, permissions):
    /// not damage, and no reason to restore anything.
    #[error(
        "state database {path} cannot be written ({detail}); it was not checked for damage: make its directory writable (a read-write mount, ownership) and start again"
    )]
    ReadOnly { path: String, detail: String },
    #[error("state database has schema version {found}, newer than this maintd ({known})")]
    TooNew { found: i64, known: i64 },
    /// A store kept in cluster objects (NodeFences) failed or refused a request.
    #[error("{what}: {detail}")]
    Remote { what: String, detail: String },
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
    // 3: each node's boot (its return to service is proven by a new one), and operators'
    // runtime controls (the fencing pause) that outlive a restart.
    r#"
    ALTER TABLE nodes ADD COLUMN boot_id TEXT;
    ALTER TABLE nodes ADD COLUMN boot_ns INTEGER;
    CREATE TABLE controls (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ns INTEGER NOT NULL
    );
    -- Fencing drills: one JSON document each; `seq` numbers their jobs.
    CREATE TABLE drills (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        node TEXT NOT NULL,
        status TEXT NOT NULL,
        updated_ns INTEGER NOT NULL,
        data TEXT NOT NULL
    );
    "#,
    // 4: the live events in their order without a sort, and one node's events without a scan
    // (the API's lists with many events).
    r#"
    CREATE INDEX events_live ON events(created_ns, id) WHERE cleared_ns IS NULL;
    CREATE INDEX events_node ON events(node, created_ns);
    "#,
    // 5: the audit trail of operator commands.
    r#"
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ns INTEGER NOT NULL,
        operator TEXT NOT NULL,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        status INTEGER
    );
    "#,
];

pub struct Store {
    conn: Mutex<Connection>,
    /// A second connection for the API's large reads, so that they neither wait for the
    /// engine's reads and the poll's writes nor hold them up (WAL lets them run side by side).
    /// None in memory, where a second connection would open another database.
    reader: Option<Mutex<Connection>>,
    /// A third connection for the engine's read of the live state each cycle, so that an
    /// operator's write (a cancel) never waits for that read, nor the read for the API's.
    engine: Option<Mutex<Connection>>,
    path: String,
    changes: changes::Changes,
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

fn parse_uuid(s: &str) -> Result<Uuid> {
    Uuid::parse_str(s).map_err(|_| corrupt(format!("bad uuid {s:?}")))
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

/// Why the database at `path` cannot be written, if it cannot: WAL mode needs its directory
/// (for the `-wal` and `-shm` files) and the file itself.
fn unwritable(path: &Path) -> Option<String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".maintd-write-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => return Some(format!("its directory {}: {e}", dir.display())),
    }
    match std::fs::OpenOptions::new().write(true).open(path) {
        // Not there yet: created in the writable directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(format!("the file: {e}")),
        Ok(_) => None,
    }
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
        // A database it cannot write is refused at once, before SQLite falls back to reading
        // it: a daemon that cannot record a fence step or a job must not run as if it could.
        if let Some(why) = unwritable(path) {
            return Err(StoreError::ReadOnly {
                path: shown,
                detail: why,
            });
        }
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
                if let Some(why) = unwritable(path) {
                    return Err(StoreError::ReadOnly {
                        path: shown,
                        detail: format!("{why}; SQLite: {e}"),
                    });
                }
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
        let read_only = || {
            let c = Connection::open_with_flags(
                path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?;
            c.busy_timeout(std::time::Duration::from_secs(5))?;
            Ok(Mutex::new(c))
        };
        store.reader = Some(read_only().map_err(open_err)?);
        store.engine = Some(read_only().map_err(open_err)?);
        store.path = shown;
        Ok(store)
    }

    pub fn open_in_memory() -> Result<Store> {
        Store::init(Connection::open_in_memory()?)
    }

    /// Counts the writes the API shows, for its caches and watchers.
    pub fn changes(&self) -> &changes::Changes {
        &self.changes
    }

    /// Where the database lives, for messages about it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Writes (and syncs) one small row: whether the database can be written now, for
    /// `/1/health` (a quiet daemon may write nothing else for a long time).
    pub fn probe_write(&self, now: Nanos) -> Result<()> {
        self.conn().execute(
            "INSERT INTO controls (name, value, updated_ns) VALUES ('health-write', '', ?1)
             ON CONFLICT(name) DO UPDATE SET updated_ns=?1",
            [now],
        )?;
        Ok(())
    }

    /// Whether the database holds no event, job, flow or drill at all: new, or emptied.
    pub fn is_empty(&self) -> Result<bool> {
        let c = self.conn();
        let n: i64 = c.query_row(
            "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM jobs)
                  + (SELECT count(*) FROM fences) + (SELECT count(*) FROM drills)",
            [],
            |r| r.get(0),
        )?;
        Ok(n == 0)
    }

    fn init(mut conn: Connection) -> Result<Store> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // Every commit is on disk before it returns (WAL synced at each commit): a commit that
        // records a fence step, a job or an event survives a power loss, not only a crash of
        // the process (NORMAL syncs at checkpoints only, and a power loss can take the last
        // commits back while their effects have happened).
        conn.pragma_update(None, "synchronous", "FULL")?;
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
            reader: None,
            engine: None,
            path: ":memory:".into(),
            changes: changes::Changes::default(),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-applied change: SQLite rolls back.
        self.conn.lock_unpoisoned()
    }

    /// The connection for reads that only show state (the API's lists): it sees every
    /// committed write.
    fn reader(&self) -> MutexGuard<'_, Connection> {
        self.reader.as_ref().unwrap_or(&self.conn).lock_unpoisoned()
    }

    /// The connection for the engine's read of the live state: it sees every committed write,
    /// and holds no lock that a write waits for.
    fn engine_reader(&self) -> MutexGuard<'_, Connection> {
        self.engine.as_ref().unwrap_or(&self.conn).lock_unpoisoned()
    }
}
