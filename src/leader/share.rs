//! What leadership shares and counts: why a checkpoint of the decision state could not be
//! written or read, its size limit, and the leadership's metrics.

use crate::metrics::metric_set;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

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
