//! The liveness probe's metrics: unanswered probes, silences, its patience and the clock offsets it measures.

use super::*;

metric_set! {
    /// The liveness probe's metrics: unanswered probes, silences, its patience and the clock offsets it measures.
    pub struct ProbeMetrics {
        /// Liveness probes that got no answer in time.
        probe_failures: Counter = Counter::default()
            => ("maintd_probe_failures", "Liveness probes that got no answer within their patience"),
        /// Collectors that came to count as silent (`liveness-misses` probes in a row unanswered).
        probe_silences: Counter = Counter::default()
            => ("maintd_probe_silences", "Collectors that came to count as silent (liveness-misses probes in a row unanswered)"),
        /// The liveness probe's current patience per node.
        probe_timeout_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
            => ("maintd_probe_timeout_seconds", "How long the liveness probe waits for each collector (adapted to its round trips)"),
        /// How far each node's wall clock is from the master's, from the probe's round trip.
        node_clock_offset_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
            => ("maintd_node_clock_offset_seconds", "How far each node's wall clock is from the master's (positive: ahead), from the liveness probe's round trip; shown, never used to judge a node"),
    }
}
