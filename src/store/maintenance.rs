//! Nodes in maintenance, as operators set them: kept beside the fencing pause (in the
//! database and the leader's checkpoint), so a restart or a failover never forgets that a
//! person has their hands in a node.

use super::*;

/// Where one node's maintenance is kept: `maintenance:<node>` among the controls.
const PREFIX: &str = "maintenance:";

/// An operator's maintenance of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Maintenance {
    pub node: String,
    pub reason: String,
    /// When it began (the steady timeline).
    pub since: Nanos,
    /// Who set it.
    pub by: String,
    /// When it ends by itself (the steady timeline); absent: when an operator ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Nanos>,
}

impl Store {
    /// Puts `m.node` in maintenance (or changes its reason and end, keeping its start);
    /// returns whether it was in maintenance already.
    pub fn start_maintenance(&self, mut m: Maintenance, now: Nanos) -> Result<bool> {
        let before = self
            .maintenance(now)?
            .into_iter()
            .find(|k| k.node == m.node);
        if let Some(b) = &before {
            m.since = b.since;
        }
        let v = serde_json::to_string(&m).expect("a maintenance serializes");
        self.set_control(&format!("{PREFIX}{}", m.node), Some(&v), now)?;
        Ok(before.is_some())
    }

    /// Ends `node`'s maintenance; returns whether it was in maintenance.
    pub fn stop_maintenance(&self, node: &str, now: Nanos) -> Result<bool> {
        let was = self.maintenance(now)?.iter().any(|m| m.node == node);
        self.set_control(&format!("{PREFIX}{node}"), None, now)?;
        Ok(was)
    }

    /// Every node in maintenance at `now`, by name. One whose end has passed is not listed (and
    /// is forgotten at its next change). A record that cannot be read still counts, with a
    /// reason that says so: a node is kept from fencing rather than released by accident.
    pub fn maintenance(&self, now: Nanos) -> Result<Vec<Maintenance>> {
        let c = self.conn();
        let stmt = c.prepare_cached(
            "SELECT name, value FROM controls WHERE name >= ?1 AND name < ?2 ORDER BY name",
        )?;
        let rows: Vec<(String, String)> = collect(stmt, params![PREFIX, "maintenance;"], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        Ok(rows
            .into_iter()
            .map(|(name, v)| {
                let node = name.trim_start_matches(PREFIX).to_string();
                serde_json::from_str::<Maintenance>(&v)
                    .ok()
                    .filter(|m| m.node == node)
                    .unwrap_or(Maintenance {
                        reason: format!("unreadable maintenance record {v:?}; stop it to clear it"),
                        node,
                        since: 0,
                        by: String::new(),
                        until: None,
                    })
            })
            .filter(|m| m.until.is_none_or(|u| u > now))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(node: &str, until: Option<Nanos>) -> Maintenance {
        Maintenance {
            node: node.into(),
            reason: "disk swap".into(),
            since: 10,
            by: "alice".into(),
            until,
        }
    }

    #[test]
    fn maintenance_is_kept_until_stopped_or_its_end() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("s.db")).unwrap();
        assert!(!s.start_maintenance(m("n1", None), 10).unwrap());
        assert!(!s.start_maintenance(m("n2", Some(100)), 10).unwrap());
        let mut again = m("n1", None);
        again.since = 50;
        again.reason = "longer".into();
        assert!(s.start_maintenance(again, 50).unwrap());
        let now: Vec<Maintenance> = s.maintenance(60).unwrap();
        assert_eq!(now.len(), 2);
        assert_eq!((now[0].since, now[0].reason.as_str()), (10, "longer"));
        // Past its end, n2 is no longer in maintenance.
        assert_eq!(s.maintenance(100).unwrap().len(), 1);
        assert!(s.stop_maintenance("n1", 110).unwrap());
        assert!(!s.stop_maintenance("n1", 110).unwrap());
        assert!(s.maintenance(110).unwrap().is_empty());
        // A record that cannot be read still keeps its node in maintenance.
        s.set_control("maintenance:n3", Some("{"), 120).unwrap();
        let kept = s.maintenance(120).unwrap();
        assert_eq!(kept[0].node, "n3");
        assert!(kept[0].reason.contains("unreadable"), "{kept:?}");
    }
}
