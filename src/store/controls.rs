//! Operators' runtime controls (the fencing pause), kept in the database so that they outlive
//! a restart, and in the leader's checkpoint so that they outlive a failover.

use super::*;

/// The name the fencing pause is kept under.
pub const FENCING_PAUSE: &str = "fencing-pause";

/// The name the steady clock's offset is kept under, with the boot it belongs to.
pub const STEADY_CLOCK: &str = "steady-clock";

/// An operator's pause of fencing: why, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Pause {
    pub reason: String,
    pub since: Nanos,
    /// The operator who paused (or last gave the reason); absent for the configuration's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl Store {
    /// Sets (`Some`) or clears (`None`) a control; returns what it held before.
    pub fn set_control(
        &self,
        name: &str,
        value: Option<&str>,
        now: Nanos,
    ) -> Result<Option<String>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let before: Option<String> = tx
            .query_row("SELECT value FROM controls WHERE name=?1", [name], |r| {
                r.get(0)
            })
            .optional()?;
        match value {
            Some(v) => tx.execute(
                "INSERT INTO controls (name, value, updated_ns) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET value=?2, updated_ns=?3",
                params![name, v, now],
            )?,
            None => tx.execute("DELETE FROM controls WHERE name=?1", [name])?,
        };
        tx.commit()?;
        // Operators' controls (maintenance, the fencing pause) show in the lists.
        self.changes.nodes_changed();
        Ok(before)
    }

    /// This boot's steady-clock offset: the one an earlier process on `boot` kept, else
    /// `proposed`, kept now for the next.
    pub fn steady_offset(&self, boot: Uuid, proposed: Nanos) -> Result<Nanos> {
        let kept = self.control(STEADY_CLOCK)?.and_then(|v| {
            let (b, o) = v.split_once(' ')?;
            (b.parse::<Uuid>().ok()? == boot).then(|| o.parse::<Nanos>().ok())?
        });
        if let Some(o) = kept {
            return Ok(o);
        }
        self.set_control(STEADY_CLOCK, Some(&format!("{boot} {proposed}")), proposed)?;
        Ok(proposed)
    }

    pub fn control(&self, name: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT value FROM controls WHERE name=?1")?
            .query_row([name], |r| r.get(0))
            .optional()?)
    }

    /// The fencing pause in force, if any. A record that cannot be read counts as a pause (with
    /// a reason that says so): fencing stays held rather than resumed by accident.
    pub fn fencing_pause(&self) -> Result<Option<Pause>> {
        Ok(self.control(FENCING_PAUSE)?.map(|v| {
            serde_json::from_str(&v).unwrap_or(Pause {
                reason: format!("unreadable pause record {v:?}; resume to clear it"),
                since: 0,
                by: None,
            })
        }))
    }

    /// Pauses fencing (or changes the reason), as operator `by`; returns whether it was paused
    /// already.
    pub fn pause_fencing(&self, reason: &str, by: &str, now: Nanos) -> Result<bool> {
        let since = self.fencing_pause()?.map_or(now, |p| p.since);
        let v = serde_json::to_string(&Pause {
            reason: reason.to_string(),
            since,
            by: Some(by.to_string()),
        })
        .expect("a pause serializes");
        Ok(self.set_control(FENCING_PAUSE, Some(&v), now)?.is_some())
    }

    /// Resumes fencing; returns whether it was paused.
    pub fn resume_fencing(&self, now: Nanos) -> Result<bool> {
        Ok(self.set_control(FENCING_PAUSE, None, now)?.is_some())
    }
}
