//! Leadership and the shared decision state on etcd, for daemons on bare metal that outgrow one
//! master. Three keys under `store.prefix`:
//!
//! - `leader`: the lease as the leader last renewed it (holder, duration, transitions). Standbys
//!   never compare clocks with it: each write gives it a new revision, and a standby takes over
//!   only once the revision has not moved for `lease-duration` by its own steady clock, the
//!   rule the Kubernetes Lease follows.
//! - `term`: rewritten only when the lease changes hands. Its revision at that write is the
//!   leader's **fencing token**: every later write of the leader compares it, so once another
//!   replica has taken the lease, nothing a deposed leader writes takes effect.
//! - `state`: the decision state (repair events, rounds, jobs, controls) the leader shares
//!   before every effect and after every change; a standby imports it, and a new leader
//!   resumes from it as a restart resumes from SQLite.
//! - `flows/<id>`: each fence flow (`flows`), written as it changes, every write fenced by
//!   the token.
//! - `jobs/<job>/claim` and `jobs/<job>/end`: which machine's job runner holds a job, and how
//!   its hook ended (`claims`), so a job's hook runs once whoever leads.

pub mod claims;
pub mod config;
pub mod flows;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};

use super::{ClusterError, Coordination, LeaseRecord};
use crate::sync::LockExt;
pub use config::{StoreBackend, StoreConfig, StoreConfigError};

/// Why etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Client(#[from] etcd_client::Error),
    /// No member answered: what each one said.
    #[error("no etcd member answered: {}", .0.iter().map(|(at, e)| format!("{at}: {e}")).collect::<Vec<_>>().join("; "))]
    NoMember(Vec<(String, etcd_client::Error)>),
    #[error("etcd key {key}: {problem}")]
    Record { key: String, problem: String },
}

impl From<EtcdError> for ClusterError {
    fn from(e: EtcdError) -> ClusterError {
        ClusterError::Etcd(e)
    }
}

/// The leader key's value: what a follower needs of the lease.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaderValue {
    holder: Option<String>,
    duration_s: i32,
    transitions: i32,
}

/// A condition of a transaction on the keys, as etcd compares them.
#[derive(Debug, Clone)]
pub enum Cond {
    /// The key does not exist (its create revision reads as 0).
    Absent(String),
    /// The key was last written at this revision.
    ModRev(String, i64),
}

/// What the coordination needs of etcd: linearizable reads, and transactions that write only
/// when every condition holds. The seam lets the protocol run over an in-memory store in
/// simulated time (the property tests), with etcd's semantics.
#[async_trait::async_trait]
pub trait Kv: Send + Sync + 'static {
    /// The key's last-write revision and value.
    async fn get(&self, key: &str) -> Result<Option<(i64, Vec<u8>)>, EtcdError>;
    /// Every key under `prefix` with its last-write revision and value, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, i64, Vec<u8>)>, EtcdError>;
    /// Applies `ops` if every condition in `when` holds, at one new revision; that revision
    /// (the store's current one when `ops` is empty), or `None` when a condition failed.
    async fn txn(&self, when: Vec<Cond>, ops: Vec<Op>) -> Result<Option<i64>, EtcdError>;
}

/// One write of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put(String, Vec<u8>),
    /// A put whose key lives only as long as the lease (by its id).
    PutLeased(String, Vec<u8>, i64),
    Delete(String),
}

/// etcd itself, through its v3 gRPC API: a connection to each member, one used at a time. A
/// request that gets no answer from a member (down, cut off, or out of quorum) is tried on
/// each other member in turn, and the member that answered serves the next requests: a lost
/// member costs one timeout, never a share of every request after it.
struct EtcdKv {
    /// Each member's endpoint and connection.
    members: Vec<(String, Client)>,
    current: AtomicUsize,
}

impl EtcdKv {
    /// A connection to each member of `cfg` (lazily: a member that is down is tried again at
    /// each request).
    async fn connect(cfg: &StoreConfig) -> Result<EtcdKv, EtcdError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|source| EtcdError::Read {
                path: p.display().to_string(),
                source,
            })
        };
        let mut opts = ConnectOptions::new()
            .with_timeout(cfg.timeout)
            .with_connect_timeout(cfg.timeout);
        if let Some(ca) = &cfg.ca_file {
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            opts = opts.with_tls(tls);
        }
        let mut members = Vec::new();
        for e in &cfg.endpoints {
            members.push((e.clone(), Client::connect([e], Some(opts.clone())).await?));
        }
        Ok(EtcdKv {
            members,
            current: AtomicUsize::new(0),
        })
    }

    /// Runs `op` on the current member, then on each other one until one answers; when none
    /// does, says what each one answered.
    async fn on_any<T, F, Fut>(&self, op: F) -> Result<T, EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut said = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let (at, client) = &self.members[i];
            match op(client.clone()).await {
                Ok(v) => {
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => said.push((at.clone(), e)),
            }
        }
        Err(match said.len() {
            1 => EtcdError::Client(said.remove(0).1),
            _ => EtcdError::NoMember(said),
        })
    }
}

#[async_trait::async_trait]
impl Kv for EtcdKv {
    async fn get(&self, key: &str) -> Result<Option<(i64, Vec<u8>)>, EtcdError> {
        let resp = self
            .on_any(|mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| (kv.mod_revision(), kv.value().to_vec())))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, i64, Vec<u8>)>, EtcdError> {
        let resp = self
            .on_any(
                |mut c| async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await },
            )
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.mod_revision(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    async fn txn(&self, when: Vec<Cond>, ops: Vec<Op>) -> Result<Option<i64>, EtcdError> {
        let when: Vec<Compare> = when
            .into_iter()
            .map(|c| match c {
                Cond::Absent(k) => Compare::create_revision(k, CompareOp::Equal, 0),
                Cond::ModRev(k, rev) => Compare::mod_revision(k, CompareOp::Equal, rev),
            })
            .collect();
        let then: Vec<TxnOp> = ops
            .into_iter()
            .map(|op| match op {
                Op::Put(k, v) => TxnOp::put(k, v, None),
                Op::PutLeased(k, v, lease) => {
                    TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)))
                }
                Op::Delete(k) => TxnOp::delete(k, None),
            })
            .collect();
        // Tried again on another member when unanswered: the transaction may have landed on
        // the first, and then its conditions fail on the second (its revision moved), which
        // the caller reads as a conflict and settles by reading afresh.
        let txn = Txn::new().when(when).and_then(then);
        let resp = self
            .on_any(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| h.revision()).unwrap_or_default()))
    }
}

/// Whether every write of `ops` is what the keys hold now: each key's revision if so (0 for
/// a key deleted). A write whose answer was lost and that was sent again to another member
/// conflicts with itself; this tells it from a write that did not land.
async fn as_sent(kv: &dyn Kv, ops: &[Op]) -> Result<Option<Vec<i64>>, EtcdError> {
    let mut revs = Vec::with_capacity(ops.len());
    for op in ops {
        let (key, want) = match op {
            Op::Put(k, v) | Op::PutLeased(k, v, _) => (k, Some(v.as_slice())),
            Op::Delete(k) => (k, None),
        };
        let have = kv.get(key).await?;
        if have.as_ref().map(|(_, v)| v.as_slice()) != want {
            return Ok(None);
        }
        revs.push(have.map_or(0, |(r, _)| r));
    }
    Ok(Some(revs))
}

/// Who leads and what it shares, on etcd.
pub struct Etcd {
    kv: Box<dyn Kv>,
    leader: String,
    term: String,
    state: String,
    /// The prefix of the fence flows' keys (`<prefix>/flows/`).
    flows: String,
    /// The `term` key's revision when this replica took the lease: the token every write it
    /// makes as the leader compares.
    token: Mutex<Option<i64>>,
    /// The last lease write got no answer: it may have landed unseen.
    lease_unsure: AtomicBool,
    endpoints: Vec<String>,
}

impl Etcd {
    /// Connects to etcd (lazily: a member that is down is tried again at each request).
    pub async fn connect(cfg: &StoreConfig) -> Result<Etcd, EtcdError> {
        let kv = EtcdKv::connect(cfg).await?;
        Ok(Etcd::over(Box::new(kv), &cfg.prefix, cfg.endpoints.clone()))
    }

    /// The coordination over `kv`, its keys under `prefix`.
    pub fn over(kv: Box<dyn Kv>, prefix: &str, endpoints: Vec<String>) -> Etcd {
        let key = |k: &str| format!("{prefix}/{k}");
        Etcd {
            kv,
            leader: key("leader"),
            term: key("term"),
            state: key("state"),
            flows: key("flows/"),
            token: Mutex::new(None),
            lease_unsure: AtomicBool::new(false),
            endpoints,
        }
    }

    /// Where the state is, for logs and `/1/leader`.
    pub fn location(&self) -> String {
        format!("etcd {} {}", self.endpoints.join(","), self.state)
    }

    /// The compare every write of the leader carries: the lease has not changed hands since
    /// this replica took it.
    fn still_mine(&self) -> Option<Cond> {
        let token = *self.token.lock_unpoisoned();
        token.map(|t| Cond::ModRev(self.term.clone(), t))
    }

    fn revision(version: Option<&str>, key: &str) -> Result<Cond, EtcdError> {
        Ok(match version {
            None => Cond::Absent(key.into()),
            Some(v) => {
                let rev: i64 = v.parse().map_err(|_| EtcdError::Record {
                    key: key.into(),
                    problem: format!("version {v:?} is not a revision"),
                })?;
                Cond::ModRev(key.into(), rev)
            }
        })
    }

    async fn get(&self, key: &str) -> Result<Option<(i64, Vec<u8>)>, EtcdError> {
        self.kv.get(key).await
    }

    /// The leader key as last written, and its revision.
    async fn read_leader(&self) -> Result<Option<(i64, LeaderValue)>, EtcdError> {
        let Some((rev, value)) = self.get(&self.leader).await? else {
            return Ok(None);
        };
        let v = serde_json::from_slice(&value).map_err(|e| EtcdError::Record {
            key: self.leader.clone(),
            problem: e.to_string(),
        })?;
        Ok(Some((rev, v)))
    }

    /// The shared decision state and its revision, as `maintd store migrate` reads it.
    pub async fn read_state(&self) -> Result<Option<(i64, String)>, EtcdError> {
        let Some((rev, value)) = self.get(&self.state).await? else {
            return Ok(None);
        };
        let text = String::from_utf8(value).map_err(|_| EtcdError::Record {
            key: self.state.clone(),
            problem: "not UTF-8".into(),
        })?;
        Ok(Some((rev, text)))
    }

    /// Writes the decision state a single master kept, for daemons to start from
    /// (`maintd store migrate --to etcd`): only where there is none yet, unless `over` is the
    /// revision of the state to replace. Returns the new revision, or `None` when the state
    /// was there (or had changed since `over`).
    pub async fn seed_state(
        &self,
        data: &str,
        over: Option<i64>,
    ) -> Result<Option<i64>, EtcdError> {
        let when = match over {
            None => Cond::Absent(self.state.clone()),
            Some(rev) => Cond::ModRev(self.state.clone(), rev),
        };
        let puts = vec![Op::Put(self.state.clone(), data.as_bytes().to_vec())];
        self.kv.txn(vec![when], puts).await
    }

    /// Who holds the lease as last written, if anyone, and the leader key's revision.
    pub async fn holder(&self) -> Result<Option<(String, i64)>, EtcdError> {
        Ok(self
            .read_leader()
            .await?
            .and_then(|(rev, v)| v.holder.map(|h| (h, rev))))
    }

    /// Whether a lease write that met a conflict had landed itself: its revision if so. A
    /// renewal landed if the token still holds (no one else took the lease, so the leader key
    /// moved by this replica's hand) and the key says what was sent; a taking landed if the
    /// leader and term keys hold what was sent, both written at one revision.
    async fn lease_landed(&self, taking: bool, puts: &[Op]) -> Result<Option<i64>, EtcdError> {
        if !taking && !self.confirm_token().await? {
            return Ok(None);
        }
        let Some(revs) = as_sent(self.kv.as_ref(), puts).await? else {
            return Ok(None);
        };
        Ok(revs
            .first()
            .copied()
            .filter(|r| revs.iter().all(|x| x == r)))
    }

    /// Asks etcd whether this replica still holds the lease it took: a transaction that
    /// compares its fencing token, so the answer is as of a revision after every earlier write.
    pub async fn confirm_token(&self) -> Result<bool, EtcdError> {
        let Some(mine) = self.still_mine() else {
            return Ok(false);
        };
        Ok(self.kv.txn(vec![mine], vec![]).await?.is_some())
    }
}

#[async_trait::async_trait]
impl Coordination for Etcd {
    async fn get_lease(&self, _fresh: bool) -> Result<Option<LeaseRecord>, ClusterError> {
        // Reads are linearizable: no cache to be behind.
        let Some((rev, v)) = self.read_leader().await? else {
            return Ok(None);
        };
        Ok(Some(LeaseRecord {
            holder: v.holder,
            // Each write moves the revision: followers watch it move, never a clock.
            renew_marker: Some(rev.to_string()),
            duration_s: v.duration_s,
            transitions: v.transitions,
            version: Some(rev.to_string()),
            acquired: None,
        }))
    }

    async fn write_lease(&self, lease: &LeaseRecord) -> Result<Option<LeaseRecord>, ClusterError> {
        let value = serde_json::to_vec(&LeaderValue {
            holder: lease.holder.clone(),
            duration_s: lease.duration_s,
            transitions: lease.transitions,
        })
        .expect("the leader value serializes");
        let mut when = vec![Self::revision(lease.version.as_deref(), &self.leader)?];
        let mut puts = vec![Op::Put(self.leader.clone(), value)];
        // A renewal (or the release) by the holder carries its token; taking the lease writes
        // a new term, whose revision becomes the new token.
        let taking = match self.still_mine() {
            Some(mine) => {
                when.push(mine);
                false
            }
            None => {
                let holder = lease.holder.clone().unwrap_or_default();
                puts.push(Op::Put(self.term.clone(), holder.into_bytes()));
                true
            }
        };
        // Only a write sent after a clean answer may be read back: had an earlier one failed
        // unanswered, it may have landed then, and this one would be credited with its moment.
        let sure = !self.lease_unsure.swap(true, Ordering::Relaxed);
        let answer = self.kv.txn(when, puts.clone()).await?;
        self.lease_unsure.store(false, Ordering::Relaxed);
        let rev = match answer {
            Some(rev) => rev,
            None if sure => match self.lease_landed(taking, &puts).await? {
                Some(rev) => rev,
                None => return Ok(None),
            },
            None => return Ok(None),
        };
        if taking {
            *self.token.lock_unpoisoned() = Some(rev);
        }
        Ok(Some(LeaseRecord {
            renew_marker: Some(rev.to_string()),
            version: Some(rev.to_string()),
            ..lease.clone()
        }))
    }

    async fn get_state(&self, _fresh: bool) -> Result<Option<(String, String)>, ClusterError> {
        let state = self.read_state().await?;
        Ok(state.map(|(rev, text)| (rev.to_string(), text)))
    }

    async fn put_state(
        &self,
        version: Option<&str>,
        data: &str,
    ) -> Result<Option<String>, ClusterError> {
        // Without a token this replica never took the lease: nothing it writes may count.
        let Some(mine) = self.still_mine() else {
            return Ok(None);
        };
        let when = vec![mine, Self::revision(version, &self.state)?];
        let puts = vec![Op::Put(self.state.clone(), data.as_bytes().to_vec())];
        if let Some(rev) = self.kv.txn(when, puts.clone()).await? {
            return Ok(Some(rev.to_string()));
        }
        // A write whose answer was lost and that was sent again conflicts with itself: it is
        // ours if the token still holds and the state is what was sent.
        if self.confirm_token().await?
            && let Some(revs) = as_sent(self.kv.as_ref(), &puts).await?
        {
            return Ok(revs.first().map(|r| r.to_string()));
        }
        Ok(None)
    }

    async fn confirm(&self) -> Result<bool, ClusterError> {
        Ok(self.confirm_token().await?)
    }

    fn token(&self) -> Option<i64> {
        *self.token.lock_unpoisoned()
    }
}
