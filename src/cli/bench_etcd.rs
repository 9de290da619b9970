//! `maintd bench poll --etcd URL`: the poll with the decision state shared on etcd the way an
//! elected leader shares it. After each cycle the engine's tick asks the leadership to share
//! the state; it compares the export with what it last wrote and writes only a change. Counts
//! etcd writes per cycle and times that check.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the leader sharing the bench's state on etcd could not start or share.
#[derive(Debug, thiserror::Error)]
#[error("etcd: {0}")]
pub struct ShareError(String);
use crate::cluster::etcd::{Etcd, StoreBackend, StoreConfig};
use crate::leader::{Election, Leadership};
use crate::metrics::ResultLabel;
use crate::store::Store;
use crate::store::checkpoint::WithoutFlows;

/// A leader on etcd sharing one bench store's state; stops its election when dropped.
pub struct Sharing {
    leadership: Arc<Leadership>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Sharing {
    /// Takes the lease under a prefix of its own on the etcd at `endpoint`.
    pub async fn start(endpoint: &str, store: Arc<Store>, n: usize) -> Result<Sharing, ShareError> {
        let lease = Duration::from_secs(15);
        let cfg = StoreConfig {
            backend: StoreBackend::Etcd,
            endpoints: vec![endpoint.to_string()],
            prefix: format!("/maintd-bench-{}-{n}", std::process::id()),
            ..Default::default()
        };
        let etcd = Etcd::connect(&cfg)
            .await
            .map_err(|e| ShareError(e.to_string()))?;
        let election = Election {
            identity: "bench".into(),
            place: etcd.location(),
            backend: "etcd",
            lease_duration: lease,
            renew_deadline: lease * 2 / 3,
            retry_period: Duration::from_secs(2),
        };
        let leadership = Arc::new(Leadership::elected(
            Arc::new(etcd),
            election,
            Arc::new(WithoutFlows(store)),
        ));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(leadership.clone().run(async {
            let _ = rx.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !leadership.is_leader() {
            if Instant::now() > deadline {
                return Err(ShareError(format!(
                    "no lease taken at {endpoint} in 10 s: {}",
                    leadership.problem().unwrap_or_default()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Sharing {
            leadership,
            stop: Some(tx),
        })
    }

    /// What the engine's tick does after a cycle; returns how long it took.
    pub async fn after_cycle(&self) -> Result<Duration, ShareError> {
        let t = Instant::now();
        self.leadership
            .checkpoint()
            .await
            .map_err(|e| ShareError(e.to_string()))?;
        Ok(t.elapsed())
    }

    /// Writes of the state to etcd so far.
    pub fn writes(&self) -> u64 {
        self.leadership
            .metrics()
            .state_shares
            .get_or_create(&ResultLabel { result: "written" })
            .get()
    }
}

impl Drop for Sharing {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
