//! Peering's metrics: the views collectors send, the peer sets pushed to them, and partitions.

use super::*;

metric_set! {
    /// Peering's metrics: the views collectors send, the peer sets pushed to them, and partitions.
    pub struct PeerMetrics {
        /// Peer views refused, by reason (signature, node, stale, replayed, malformed).
        views_rejected: Family<ReasonLabel, Counter> = Family::default()
            => ("maintd_peer_views_rejected", "Peer views from collectors refused, by reason"),
        /// Peer sets pushed to collectors, and pushes that failed.
        peer_sets_pushed: Counter = Counter::default()
            => ("maintd_peer_sets_pushed", "Peer sets pushed to collectors"),
        peer_set_push_failures: Counter = Counter::default()
            => ("maintd_peer_set_push_failures", "Peer set pushes that a collector did not accept"),
        /// 1 while the master has lost a node that a watcher still hears.
        partitioned: Family<NodeLabel, Gauge> = Family::default()
            => ("maintd_node_partitioned", "1 while the master cannot reach the node but one of its watchers still hears it"),
    }
}
