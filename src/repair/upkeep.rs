//! The cluster's own upkeep in rounds (Ganeti: instance repairs and balancing moves): asked of
//! the backend when a round of events starts (it joins that round) or while the engine is idle,
//! never on the nodes the events hold; the next round waits for it as for the round's jobs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tracing::{Instrument, info, info_span, warn};

use crate::cluster::{Upkeep, UpkeepRunner};
pub use maintd_core::repair::upkeep::{UpkeepPlan, plan};

/// How many upkeep tasks run now.
#[derive(Default)]
pub struct Upkeeps {
    running: Arc<AtomicUsize>,
}

impl Upkeeps {
    pub fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst) > 0
    }

    /// Runs each task to its end; the last one to end wakes the engine for the next round.
    /// Each ends counted in `maintd_jobs_finished` under the kind `upkeep`.
    pub fn spawn(
        &self,
        runner: &Arc<dyn UpkeepRunner>,
        tasks: Vec<Upkeep>,
        wake: &Arc<Notify>,
        metrics: &crate::repair::metrics::RepairMetrics,
    ) {
        self.running.fetch_add(tasks.len(), Ordering::SeqCst);
        for task in tasks {
            let (runner, running, wake) = (runner.clone(), self.running.clone(), wake.clone());
            let metrics = metrics.clone();
            let span = info_span!("upkeep", what = %task.what);
            tokio::spawn(
                async move {
                    info!(nodes = ?task.nodes, "upkeep started");
                    let o = runner.run_upkeep(&task).await;
                    if o.ok() {
                        info!(detail = %o.detail(), "upkeep done");
                    } else {
                        warn!(detail = %o.detail(), "upkeep failed");
                    }
                    let outcome = if o.ok() { "succeeded" } else { "failed" };
                    let label = crate::metrics::JobLabel {
                        kind: "upkeep",
                        outcome,
                    };
                    metrics.jobs_finished.get_or_create(&label).inc();
                    if running.fetch_sub(1, Ordering::SeqCst) == 1 {
                        wake.notify_one();
                    }
                }
                .instrument(span),
            );
        }
    }
}
