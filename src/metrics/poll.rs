//! The poller's metrics: poll cycles, report verification, unanswered polls.

use super::*;

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
