//! Leadership's metrics: whether this replica leads, and what it decided as a standby and dropped.

use super::*;

metric_set! {
    /// Leadership's metrics: whether this replica leads, and what it decided as a standby and dropped.
    pub struct LeaderMetrics {
        /// 1 while this replica is the leader.
        leader: Gauge = Gauge::default()
            => ("maintd_leader", "1 while this replica is the leader"),
        /// Actions a standby decided and did not carry out (repair and fence decisions).
        standby_dropped: Counter = Counter::default()
            => ("maintd_standby_dropped_actions", "Actions this replica decided as a standby and did not carry out"),
    }
}
