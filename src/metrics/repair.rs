//! The repair engine's metrics: events, jobs, and its decisions (made, skipped, actions failed).

use super::*;

metric_set! {
    /// The repair engine's metrics: events, jobs, and its decisions (made, skipped, actions failed).
    pub struct RepairMetrics {
        jobs_started: Counter = Counter::default()
            => ("maintd_jobs_started", "Jobs submitted"),
        jobs_finished: Family<JobLabel, Counter> = Family::default()
            => ("maintd_jobs_finished", "Jobs finished, by kind and outcome"),
        events_created: Counter = Counter::default()
            => ("maintd_events_created", "Repair events created"),
        /// Unix time of the last completed decision.
        last_decision: Gauge = Gauge::default()
            => ("maintd_engine_last_decision_timestamp_seconds", "Unix time of the engine's last completed decision"),
        /// Decisions skipped, by what failed (store, tags, capacity).
        tick_failures: Family<ReasonLabel, Counter> = Family::default()
            => ("maintd_engine_skipped_decisions", "Decisions skipped because an input could not be read, by input"),
        /// Actions the engine could not carry out, by `ActionError::metric_label`.
        action_failures: Family<ReasonLabel, Counter> = Family::default()
            => ("maintd_engine_action_failures", "Actions the engine could not carry out (retried from the store next tick), by reason"),
    }
}

impl RepairMetrics {
    pub fn action_failed(&self, reason: &'static str) {
        self.action_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn tick_failed(&self, reason: &'static str) {
        self.tick_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}
