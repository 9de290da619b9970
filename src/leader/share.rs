//! What leadership shares and counts: why a checkpoint of the decision state could not be
//! written or read, its size limit, and the leadership's metrics.

use crate::metrics::{ResultLabel, metric_set};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Why the shared checkpoint of the decision state could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("not the leader")]
    NotLeader,
    #[error("another replica wrote the state checkpoint")]
    Conflict,
    #[error("cannot export the decision state: {0}")]
    Export(#[source] crate::store::StoreError),
    #[error("cannot write the state checkpoint: {0}")]
    Write(#[source] crate::cluster::ClusterError),
    #[error("cannot read the state checkpoint: {0}")]
    Read(#[source] crate::cluster::ClusterError),
    #[error("cannot import the state checkpoint: {0}")]
    Import(#[source] crate::store::StoreError),
    #[error(
        "the state checkpoint would be {bytes} bytes, over its limit of {limit} (a Kubernetes object holds at most 1 MiB); fewer live events, or fence flows kept as NodeFences, keep it smaller"
    )]
    TooLarge { bytes: usize, limit: usize },
}

/// The largest checkpoint written: well below the 1 MiB an object (and etcd's request) holds,
/// so the limit is met with a clear error and never by a rejected write.
pub const CHECKPOINT_LIMIT: usize = 768 * 1024;

/// A checkpoint over the limit is never sent: the error says why, before the apiserver would.
pub(super) fn within_limit(data: &str) -> Result<(), CheckpointError> {
    if data.len() > CHECKPOINT_LIMIT {
        return Err(CheckpointError::TooLarge {
            bytes: data.len(),
            limit: CHECKPOINT_LIMIT,
        });
    }
    Ok(())
}

impl CheckpointError {
    /// A stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CheckpointError::NotLeader => "not-leader",
            CheckpointError::Conflict => "conflict",
            CheckpointError::Export(_) => "export",
            CheckpointError::Write(_) => "write",
            CheckpointError::Read(_) => "read",
            CheckpointError::Import(_) => "import",
            CheckpointError::TooLarge { .. } => "too-large",
        }
    }
}

metric_set! {
    /// Leadership's metrics: whether this replica leads, how its lease and the shared state are
    /// written (to etcd or the Kubernetes API), and what it decided as a standby and dropped.
    pub struct LeaderMetrics {
        /// 1 while this replica is the leader.
        leader: Gauge = Gauge::default()
            => ("maintd_leader", "1 while this replica is the leader"),
        /// Actions a standby decided and did not carry out (repair and fence decisions).
        standby_dropped: Counter = Counter::default()
            => ("maintd_standby_dropped_actions", "Actions this replica decided as a standby and did not carry out"),
        /// Lease writes (renewals, takeovers, the release), by result.
        lease_writes: Family<ResultLabel, Counter> = Family::default()
            => ("maintd_lease_writes", "Writes of the leader lease (etcd or a Kubernetes Lease), by result: ok, conflict (another replica wrote first), error"),
        lease_write_seconds: Histogram = Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
            => ("maintd_lease_write_seconds", "Latency of each write of the leader lease"),
        /// Shares of the decision state before an effect or after a change, by result.
        state_shares: Family<ResultLabel, Counter> = Family::default()
            => ("maintd_state_shares", "Shares of the decision state by the leader, by result: written, confirmed (nothing new; the lease confirmed before an effect), conflict (a newer leader exists: this one stops), error"),
        state_share_seconds: Histogram = Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
            => ("maintd_state_share_seconds", "Latency of each write (or confirmation) of the shared decision state"),
        /// 0 while the election loop's requests to the store fail (the reason: `/1/health`).
        store_up: Gauge = Gauge::default()
            => ("maintd_lease_store_up", "1 while this replica's last request to the lease's store (etcd or the Kubernetes API) succeeded, 0 while it fails (why: /1/health and /1/leader)"),
        /// How long ago this replica last renewed its lease, while it leads (its steady clock).
        renewal_age: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default()
            => ("maintd_lease_renewal_age_seconds", "How long ago the leader last renewed its lease, on its steady clock (0 on a standby); at renew-deadline it stops acting"),
    }
}

impl LeaderMetrics {
    pub(super) fn lease_write(&self, result: &'static str, took: std::time::Duration) {
        self.lease_writes
            .get_or_create(&ResultLabel { result })
            .inc();
        self.lease_write_seconds.observe(took.as_secs_f64());
    }

    pub(super) fn state_share(&self, result: &'static str, took: std::time::Duration) {
        self.state_shares
            .get_or_create(&ResultLabel { result })
            .inc();
        self.state_share_seconds.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_over_its_limit_is_refused_with_a_clear_error() {
        assert!(within_limit(&"x".repeat(CHECKPOINT_LIMIT)).is_ok());
        let e = within_limit(&"x".repeat(CHECKPOINT_LIMIT + 1)).unwrap_err();
        assert_eq!(e.metric_label(), "too-large");
        let msg = e.to_string();
        assert!(
            msg.contains("786433 bytes") && msg.contains("1 MiB"),
            "{msg}"
        );
    }
}
