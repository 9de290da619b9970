//! Fencing drills as they are kept: one JSON document per drill, numbered by its row.

use super::*;
use maintd_core::fencing::drill::Drill;

impl Store {
    /// Records a new drill; returns it with its number.
    pub fn insert_drill(&self, d: &Drill) -> Result<Drill> {
        let c = self.conn();
        c.execute(
            "INSERT INTO drills (id, node, status, updated_ns, data) VALUES (?1, ?2, ?3, ?4, '{}')",
            params![d.id.to_string(), d.node, d.status.as_str(), d.updated],
        )?;
        let mut d = d.clone();
        d.seq = c.last_insert_rowid();
        c.execute(
            "UPDATE drills SET data=?2 WHERE id=?1",
            params![
                d.id.to_string(),
                serde_json::to_string(&d).expect("a drill serializes")
            ],
        )?;
        Ok(d)
    }

    pub fn save_drill(&self, d: &Drill) -> Result<()> {
        self.conn().execute(
            "UPDATE drills SET status=?2, updated_ns=?3, data=?4 WHERE id=?1",
            params![
                d.id.to_string(),
                d.status.as_str(),
                d.updated,
                serde_json::to_string(d).expect("a drill serializes")
            ],
        )?;
        Ok(())
    }

    /// The newest drills first, at most `limit`.
    pub fn drills(&self, limit: usize) -> Result<Vec<Drill>> {
        let c = self.conn();
        let stmt = c.prepare_cached("SELECT data FROM drills ORDER BY seq DESC LIMIT ?1")?;
        collect(stmt, [limit as i64], |r| {
            let text: String = r.get(0)?;
            serde_json::from_str(&text).map_err(|e| corrupt(format!("drill: {e}")))
        })
    }
}
