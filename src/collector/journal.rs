//! The collector's journal of live repairs: one JSON file per job, written before the repair
//! runs and at each change of its state, so a restarted collector answers for every job it took.

use std::collections::BTreeMap;

use tracing::warn;

use super::{CollectorError, LiveRepairRecord, RepairState};

/// The collector's record of live repairs on disk: one JSON file per job under
/// `<state-dir>/repairs`, written before a repair runs and at each change of its state.
pub(super) struct Journal {
    dir: std::path::PathBuf,
}

impl Journal {
    pub(super) fn open(state_dir: &std::path::Path) -> Result<Journal, CollectorError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = state_dir.join("repairs");
        let err = |source| CollectorError::Journal {
            path: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(err)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(Journal { dir })
    }

    pub(super) fn path(&self, job: &str) -> std::path::PathBuf {
        self.dir.join(format!("{job}.json"))
    }

    pub(super) fn load(&self) -> Result<BTreeMap<String, LiveRepairRecord>, CollectorError> {
        let err = |source| CollectorError::Journal {
            path: self.dir.display().to_string(),
            source,
        };
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir).map_err(err)? {
            let path = entry.map_err(err)?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<LiveRepairRecord>(&b).ok());
            let Some(mut r) = parsed else {
                warn!(file = %path.display(), "unreadable repair journal entry left aside");
                let _ = std::fs::rename(&path, path.with_extension("bad"));
                continue;
            };
            if r.state != RepairState::Done {
                // It may have run in part: never run it again, and say why it did not finish.
                r.error = Some(format!(
                    "the collector restarted while this repair was {}; it was not run again",
                    match r.state {
                        RepairState::Queued => "queued",
                        _ => "running",
                    }
                ));
                r.state = RepairState::Done;
                self.save(&r).map_err(err)?;
            }
            out.insert(r.job.clone(), r);
        }
        Ok(out)
    }

    pub(super) fn save(&self, r: &LiveRepairRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        crate::fsutil::write_atomic(&self.path(&r.job), &bytes)
    }

    pub(super) fn remove(&self, job: &str) {
        let _ = std::fs::remove_file(self.path(job));
    }
}
