//! The inventory backend's own state: tags and offline flags per node.

use super::*;

impl Store {
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
        // Tags and offline flags show in `/1/nodes`: its readers see them at once.
        self.changes.nodes_changed();
        Ok(())
    }

    /// Returns whether the tag was there.
    pub fn inventory_remove_tag(&self, node: &str, tag: &str) -> Result<bool> {
        let n = self.conn().execute(
            "DELETE FROM inventory_tags WHERE node=?1 AND tag=?2",
            params![node, tag],
        )?;
        self.changes.nodes_changed();
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
        self.changes.nodes_changed();
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
}
