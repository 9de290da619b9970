//! The repair room's metrics, declared and registered here, beside the poller and the engine
//! that produce them; the assembly hands each part its own set.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{JobLabel, ReasonLabel, RejectLabel, metric_set};

metric_set! {
    /// The poller's metrics: poll cycles, report verification, unanswered polls.
    pub struct PollMetrics {
        poll_cycle_seconds: Histogram = Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0])
            => ("maintd_poll_cycle_seconds", "Time to poll and verify every collector once"),
        reports_accepted: Counter = Counter::default()
            => ("maintd_reports_accepted", "Reports that passed verification"),
        reports_rejected: Family<RejectLabel, Counter> = Family::default()
            => ("maintd_reports_rejected", "Reports rejected, by reason and node"),
        nodes_unreachable: Gauge = Gauge::default()
            => ("maintd_nodes_unreachable", "Nodes whose collector did not answer the last poll"),
        /// Polls a collector did not answer (refused, timed out, broken off).
        polls_failed: Counter = Counter::default()
            => ("maintd_polls_failed", "Report polls a collector did not answer (refused, timed out or broken off)"),
    }
}

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
