//! What a daemon finds at start-up beside a database that holds nothing (lost, emptied, or
//! new): directories of earlier hook jobs and maintd's tags on nodes. None of it is adopted (a
//! job's key binds it to its event and its moment, so no new job takes an earlier one's
//! result); it is said in the log and on `/1/health`, so the operator knows what state was lost.

use tracing::warn;

use crate::config::Config;
use crate::parts::Shared;

/// What there is of earlier state that the database does not know, when it holds nothing.
pub(super) async fn leftovers(cfg: &Config, shared: &Shared) -> Vec<String> {
    let store = &shared.store;
    match store.is_empty() {
        Ok(true) => {}
        Ok(false) => return Vec::new(),
        Err(e) => {
            return vec![format!(
                "cannot tell whether the state database is empty: {e}"
            )];
        }
    }
    let mut found = Vec::new();
    let jobs = cfg.daemon.state_dir.join("jobs");
    let dirs = std::fs::read_dir(&jobs)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("job-"))
                .count()
        })
        .unwrap_or(0);
    if dirs > 0 {
        found.push(format!(
            "{dirs} directories of earlier hook jobs in {}, beside a state database with no events or jobs: their results are not adopted",
            jobs.display()
        ));
    }
    // A replica that is elected takes the state from the leader's checkpoint: its tags are the
    // leader's to match.
    if !shared.leadership.elected_mode() {
        match shared.cluster.jobs.tags().await {
            Ok(tags) => {
                let mine: Vec<String> = tags
                    .iter()
                    .flat_map(|(node, t)| {
                        t.iter()
                            .filter(|t| maintd_core::tags::split(t).is_some())
                            .map(move |t| format!("{t} on {node}"))
                    })
                    .collect();
                if !mine.is_empty() {
                    found.push(format!(
                        "{} maintd tags of events or fences this database does not know ({}{}): they are left as they are; remove them by hand once the node is checked",
                        mine.len(),
                        mine.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
                        if mine.len() > 5 { ", ..." } else { "" }
                    ));
                }
            }
            Err(e) => warn!(error = %e, "cannot read tags to look for earlier events"),
        }
    }
    for f in &found {
        warn!(db = %store.path(), "state database holds nothing, but found {f}");
    }
    found
}
