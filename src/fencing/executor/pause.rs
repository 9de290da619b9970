//! The operators' runtime pause of fencing: read from the store at each decision (so it holds
//! across a restart, and across a failover through the checkpoint), shown as a metric, and said
//! once in the log and as an Event each time it starts, changes its reason or ends.

use tracing::{info, warn};

use super::Fencer;
use crate::cluster::EventReason;
use crate::store::Pause;
use crate::sync::LockExt;

impl Fencer {
    /// The pause in force: the configuration's `paused`, or an operator's. A pause record that
    /// cannot be read holds fencing (a resume clears it).
    pub(super) async fn pause(&self) -> Option<Pause> {
        let runtime = self.shared.store.fencing_pause().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the fencing pause; fencing is held until it can be");
            Some(Pause {
                reason: format!("the pause state cannot be read: {e}"),
                since: 0,
                by: None,
            })
        });
        let pause = runtime.or_else(|| {
            self.settings.policy.paused.then(|| Pause {
                reason: "fencing.paused = true in the configuration".into(),
                since: 0,
                by: None,
            })
        });
        self.metrics
            .fence
            .fencing_paused
            .set(i64::from(pause.is_some()));
        let changed = {
            let mut last = self.last_pause.lock_unpoisoned();
            let changed = *last != pause;
            last.clone_from(&pause);
            changed
        };
        if changed && self.shared.leadership.is_leader() {
            let (reason, msg) = match &pause {
                Some(p) => {
                    warn!(reason = %p.reason, "fencing is paused: no fence starts, and no isolation or power-off runs");
                    (
                        EventReason::FencingPaused,
                        format!("fencing paused: {}", p.reason),
                    )
                }
                None => {
                    info!("fencing resumed");
                    (EventReason::FencingResumed, "fencing resumed".to_string())
                }
            };
            self.shared
                .cluster
                .record_config(&self.settings.pause_events_on, reason, &msg)
                .await;
        }
        pause
    }
}
