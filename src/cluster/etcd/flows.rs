//! Fence flows on etcd: each flow one key (`<prefix>/flows/<id>`, its JSON), its revision the
//! version an optimistic save compares. Every write also compares the leader's fencing token,
//! so once another replica has taken the lease nothing a deposed leader writes about a flow
//! (a step, an agent call about to be made, a release) takes effect; and since each write is
//! shared as it lands, a successor reads every flow as the last leader left it, and a standby's
//! API shows the same flows.

use std::sync::Arc;

use uuid::Uuid;

use super::{Cond, Etcd, EtcdError, Op};
use crate::store::{FlowStore, StoreError};
use maintd_core::fencing::machine::{FenceStatus, Flow};
use maintd_core::verdict::Nanos;

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// How often a change of one flow is read and tried again when another write of the same
/// flow landed in between (the fencer and an operator's cancel); the fencer decides again
/// on its next tick after that.
const ATTEMPTS: usize = 5;

/// The flow store on etcd, beside the leadership it shares its client and token with.
pub struct EtcdFlows {
    etcd: Arc<Etcd>,
}

fn remote(e: EtcdError) -> StoreError {
    StoreError::Remote {
        what: "etcd".into(),
        detail: e.to_string(),
    }
}

fn deposed() -> StoreError {
    StoreError::Remote {
        what: "etcd".into(),
        detail: "another replica holds the lease: this one no longer writes fence flows".into(),
    }
}

impl EtcdFlows {
    pub fn new(etcd: Arc<Etcd>) -> EtcdFlows {
        EtcdFlows { etcd }
    }

    fn key(&self, id: &Uuid) -> String {
        format!("{}{id}", self.etcd.flows)
    }

    fn decode(&self, key: &str, rev: i64, value: &[u8]) -> Result<Flow> {
        let mut f: Flow = serde_json::from_slice(value).map_err(|e| {
            remote(EtcdError::Record {
                key: key.into(),
                problem: e.to_string(),
            })
        })?;
        f.version = rev as u64;
        Ok(f)
    }

    fn encode(f: &Flow) -> Result<Vec<u8>> {
        serde_json::to_vec(f).map_err(|e| StoreError::Corrupt(format!("fence flow: {e}")))
    }

    /// Applies `ops` if `when` holds and this replica still holds the lease. `Ok(false)`: a
    /// condition of the flow's own failed (it changed meanwhile). A replica that never took the
    /// lease, or lost it, writes nothing and is told so.
    async fn write(&self, when: Cond, ops: Vec<Op>) -> Result<bool> {
        let Some(mine) = self.etcd.still_mine() else {
            return Err(deposed());
        };
        if self
            .etcd
            .kv
            .txn(vec![mine, when], ops.clone())
            .await
            .map_err(remote)?
            .is_some()
        {
            return Ok(true);
        }
        if !self.etcd.confirm_token().await.map_err(remote)? {
            return Err(deposed());
        }
        // A write whose answer was lost and that was sent again to another member conflicts
        // with itself: it landed if what it wrote is there.
        Ok(super::as_sent(self.etcd.kv.as_ref(), &ops)
            .await
            .map_err(remote)?
            .is_some())
    }

    async fn read(&self, id: &Uuid) -> Result<Option<Flow>> {
        let key = self.key(id);
        match self.etcd.kv.get(&key).await.map_err(remote)? {
            Some((rev, v)) => Ok(Some(self.decode(&key, rev, &v)?)),
            None => Ok(None),
        }
    }

    /// Writes `flows` for daemons to start from (`maintd store migrate --to etcd`, every
    /// daemon stopped, so no token): only where no flow is yet, unless `replace`, which first
    /// deletes every flow there. Returns how many were written.
    pub async fn seed(&self, flows: &[Flow], replace: bool) -> Result<usize> {
        // etcd takes at most 128 operations per transaction by default.
        const CHUNK: usize = 100;
        let there = self.all().await?;
        if !there.is_empty() && !replace {
            return Err(StoreError::Remote {
                what: "etcd".into(),
                detail: format!(
                    "{} fence flows are already at {}",
                    there.len(),
                    self.location()
                ),
            });
        }
        for chunk in there.chunks(CHUNK) {
            let ops = chunk.iter().map(|f| Op::Delete(self.key(&f.id))).collect();
            self.etcd.kv.txn(vec![], ops).await.map_err(remote)?;
        }
        for chunk in flows.chunks(CHUNK) {
            let when = chunk
                .iter()
                .map(|f| Cond::Absent(self.key(&f.id)))
                .collect();
            let ops = chunk
                .iter()
                .map(|f| Ok(Op::Put(self.key(&f.id), Self::encode(f)?)))
                .collect::<Result<Vec<Op>>>()?;
            if self.etcd.kv.txn(when, ops).await.map_err(remote)?.is_none() {
                return Err(StoreError::Remote {
                    what: "etcd".into(),
                    detail: "fence flows were written there meanwhile: a daemon is running".into(),
                });
            }
        }
        Ok(flows.len())
    }

    /// Every flow there, in key order.
    pub async fn all(&self) -> Result<Vec<Flow>> {
        let rows = self.etcd.kv.list(&self.etcd.flows).await.map_err(remote)?;
        rows.iter()
            .map(|(k, rev, v)| self.decode(k, *rev, v))
            .collect()
    }
}

#[async_trait::async_trait]
impl FlowStore for EtcdFlows {
    async fn insert(&self, f: &Flow) -> Result<()> {
        let key = self.key(&f.id);
        let put = Op::Put(key.clone(), Self::encode(f)?);
        if self.write(Cond::Absent(key), vec![put]).await? {
            Ok(())
        } else {
            Err(StoreError::Remote {
                what: "etcd".into(),
                detail: format!("fence flow {} exists already", f.id),
            })
        }
    }

    async fn save(&self, f: &Flow) -> Result<bool> {
        let key = self.key(&f.id);
        let put = Op::Put(key.clone(), Self::encode(f)?);
        self.write(Cond::ModRev(key, f.version as i64), vec![put])
            .await
    }

    async fn update(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>> {
        for _ in 0..ATTEMPTS {
            let Some(mut f) = self.read(id).await? else {
                return Ok(None);
            };
            if !change(&mut f) {
                return Ok(Some(f));
            }
            let key = self.key(id);
            let when = Cond::ModRev(key.clone(), f.version as i64);
            if self
                .write(when, vec![Op::Put(key, Self::encode(&f)?)])
                .await?
            {
                return Ok(Some(f));
            }
        }
        Err(StoreError::Remote {
            what: "etcd".into(),
            detail: format!("fence flow {id} kept changing under {ATTEMPTS} attempts to write it"),
        })
    }

    async fn active(&self, since: Nanos) -> Result<Vec<Flow>> {
        let mut fs: Vec<Flow> = self
            .all()
            .await?
            .into_iter()
            .filter(|f| f.status != FenceStatus::Final || f.updated >= since)
            .collect();
        fs.sort_by_key(|f| f.created);
        Ok(fs)
    }

    async fn recent(&self, limit: usize) -> Result<Vec<Flow>> {
        let mut fs = self.all().await?;
        fs.sort_by_key(|f| std::cmp::Reverse(f.created));
        fs.truncate(limit);
        Ok(fs)
    }

    async fn get(&self, id: &Uuid) -> Result<Option<Flow>> {
        self.read(id).await
    }

    async fn prune(&self, ended_before: Nanos) -> Result<usize> {
        let mut n = 0;
        for f in self.all().await? {
            if f.status != FenceStatus::Final || f.updated >= ended_before {
                continue;
            }
            let key = self.key(&f.id);
            let when = Cond::ModRev(key.clone(), f.version as i64);
            if self.write(when, vec![Op::Delete(key)]).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    fn shared(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        format!("etcd {} {}", self.etcd.endpoints.join(","), self.etcd.flows)
    }
}

/// Runs the suite every flow store passes against a real etcd at `endpoint`, under `prefix`
/// (empty there), as the holder of a lease taken first (for the real-etcd tests).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub async fn conformance(endpoint: &str, prefix: &str) {
    use crate::cluster::{Coordination, LeaseRecord};
    let cfg = super::StoreConfig {
        backend: super::StoreBackend::Etcd,
        endpoints: vec![endpoint.to_string()],
        prefix: prefix.to_string(),
        ..Default::default()
    };
    let etcd = Arc::new(Etcd::connect(&cfg).await.expect("etcd"));
    let lease = LeaseRecord {
        holder: Some("conformance".into()),
        duration_s: 15,
        ..Default::default()
    };
    assert!(etcd.write_lease(&lease).await.unwrap().is_some());
    crate::store::flow_conformance::suite(&EtcdFlows::new(etcd)).await;
}
