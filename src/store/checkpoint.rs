//! The leader's checkpoint of the decision state (events, jobs, rounds, fence flows) as one
//! JSON document, and its import by a new leader: the `Checkpoint` seam leader election uses,
//! and its SQLite implementation.

use super::*;

#[cfg(test)]
pub(crate) mod conformance;

/// Where the decision state a successor resumes from is exported and imported. Leader election
/// calls only this, so another home for the state implements it and passes
/// `conformance::suite`.
pub trait Checkpoint: Send + Sync + 'static {
    /// The decision state as one document.
    fn export(&self) -> Result<String>;
    /// Replaces the decision state with `text`, or, if `text` is malformed, refuses it as a
    /// whole and keeps the state as it was.
    fn import(&self, text: &str) -> Result<()>;
}

impl Checkpoint for Store {
    fn export(&self) -> Result<String> {
        self.export_checkpoint(true)
    }
    fn import(&self, text: &str) -> Result<()> {
        self.import_checkpoint(text, true)
    }
}

/// The checkpoint without fence flows, for a backend that keeps them in objects of their own
/// (NodeFences): a successor reads them there, and the checkpoint stays small.
pub struct WithoutFlows(pub std::sync::Arc<Store>);

impl Checkpoint for WithoutFlows {
    fn export(&self) -> Result<String> {
        self.0.export_checkpoint(false)
    }
    fn import(&self, text: &str) -> Result<()> {
        self.0.import_checkpoint(text, false)
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
    // Operators' runtime controls: a pause outlives a failover. The replica's own (its steady
    // clock, its health probe) stay with it.
    (
        "controls",
        "SELECT * FROM controls WHERE name NOT IN ('steady-clock', 'health-write')",
    ),
    ("drills", "SELECT * FROM drills ORDER BY seq DESC LIMIT 100"),
    // The inventory backend's own cluster state (its tags and offline flags): with the state
    // on etcd, a new leader must see the tags an operator has not yet removed, or it would
    // read every waiting event as acknowledged. Empty on the other backends.
    ("inventory_tags", "SELECT * FROM inventory_tags"),
    ("inventory_offline", "SELECT * FROM inventory_offline"),
];

/// The checkpoint's tables, with or without the fence flows.
fn tables(
    with_flows: bool,
) -> impl DoubleEndedIterator<Item = &'static (&'static str, &'static str)> {
    CHECKPOINT
        .iter()
        .filter(move |(t, _)| with_flows || *t != "fences")
}

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
    /// The decision state (events, jobs, rounds, fence flows, operators' controls, drills, the
    /// inventory's tags and offline flags) as one JSON document, for the leader's checkpoint.
    /// Poll state stays per replica.
    pub fn export_checkpoint(&self, with_flows: bool) -> Result<String> {
        let c = self.conn();
        let mut doc = serde_json::Map::new();
        doc.insert("schema".into(), (MIGRATIONS.len() as i64).into());
        for (table, query) in tables(with_flows) {
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
    pub fn import_checkpoint(&self, text: &str, with_flows: bool) -> Result<()> {
        let bad = |m: String| StoreError::Corrupt(format!("checkpoint: {m}"));
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let schema = doc["schema"]
            .as_i64()
            .ok_or_else(|| bad("no schema".into()))?;
        if schema > MIGRATIONS.len() as i64 {
            return Err(bad(format!(
                "schema version {schema}, newer than this maintd ({}); upgrade this replica",
                MIGRATIONS.len()
            )));
        }
        let mut c = self.conn();
        let tx = c.transaction()?;
        // A table the checkpoint does not carry (a leader older than it) is kept as it is.
        let carried = |table: &str| !doc[table].is_null();
        for (table, _) in tables(with_flows).rev().filter(|(t, _)| carried(t)) {
            let mine = if *table == "controls" {
                " WHERE name NOT IN ('steady-clock', 'health-write')"
            } else {
                ""
            };
            tx.execute(&format!("DELETE FROM {table}{mine}"), [])?;
        }
        for (table, _) in tables(with_flows).filter(|(t, _)| carried(t)) {
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
            // A replica's own controls in an older leader's export are its, not this one's.
            let verb = if *table == "controls" {
                "INSERT OR IGNORE"
            } else {
                "INSERT"
            };
            let sql = format!(
                "{verb} INTO {table} ({}) VALUES ({})",
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
        // What the API built from the rows before is stale now.
        self.changes.events_changed();
        self.changes.nodes_changed();
        Ok(())
    }
}
