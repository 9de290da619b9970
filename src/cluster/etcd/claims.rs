//! Job claims on etcd (`<prefix>/jobs/<key>/claim` and `/end`): the claim is a key bound to a
//! lease its runner keeps alive, so it vanishes on its own when the runner's machine dies or
//! is cut off; the end is recorded with the claim's removal in one transaction that compares
//! the claim, and kept a day (its own lease) for a leader that resumes the job later.

use std::time::Duration;

use super::{Cond, EtcdError, EtcdKv, Kv, Op, StoreConfig, as_sent};
pub use crate::exec::claimed::{Claim, ClaimStore};
use crate::exec::jobs::ClaimsFrom;

/// How long a recorded end is kept: far longer than any leader takes to resume a job.
const END_KEPT: Duration = Duration::from_secs(24 * 3600);

/// The claims of one daemon's jobs, on the etcd its leadership uses.
pub struct EtcdClaims {
    kv: EtcdKv,
    prefix: String,
    timeout: Duration,
}

fn said(e: EtcdError) -> String {
    e.to_string()
}

impl EtcdClaims {
    pub async fn connect(cfg: &StoreConfig) -> Result<EtcdClaims, EtcdError> {
        Ok(EtcdClaims {
            kv: EtcdKv::connect(cfg).await?,
            prefix: cfg.prefix.clone(),
            timeout: cfg.timeout,
        })
    }

    fn claim_key(&self, key: &str) -> String {
        format!("{}/jobs/{key}/claim", self.prefix)
    }

    fn end_key(&self, key: &str) -> String {
        format!("{}/jobs/{key}/end", self.prefix)
    }

    /// A lease of at least `ttl` (whole seconds, rounded up): its id and the time to live
    /// etcd granted, which may be longer (etcd has a floor).
    async fn grant(&self, ttl: Duration) -> Result<(i64, Duration), EtcdError> {
        let secs = ttl.as_secs() as i64 + i64::from(ttl.subsec_nanos() > 0);
        let resp = self
            .kv
            .on_any(|mut c| async move { c.lease_grant(secs.max(1), None).await })
            .await?;
        Ok((resp.id(), Duration::from_secs(resp.ttl().max(0) as u64)))
    }

    async fn revoke(&self, lease: i64) {
        if let Err(e) = self
            .kv
            .on_any(|mut c| async move { c.lease_revoke(lease).await })
            .await
        {
            tracing::debug!(lease, error = %e, "a claim's lease was not revoked; it lapses on its own");
        }
    }
}

#[async_trait::async_trait]
impl ClaimStore for EtcdClaims {
    async fn ended(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let got = self.kv.get(&self.end_key(key)).await.map_err(said)?;
        Ok(got.map(|(_, v)| end_of(&v).to_vec()))
    }

    async fn claim(&self, key: &str, holder: &str, ttl: Duration) -> Result<Option<Claim>, String> {
        let (lease, granted) = self.grant(ttl).await.map_err(said)?;
        let (claim, end) = (self.claim_key(key), self.end_key(key));
        let when = vec![Cond::Absent(claim.clone()), Cond::Absent(end)];
        let puts = vec![Op::PutLeased(claim, holder.as_bytes().to_vec(), lease)];
        let claimed = match self.kv.txn(when, puts.clone()).await.map_err(said)? {
            Some(rev) => Some(rev),
            // Sent again after its answer was lost, a claim that landed conflicts with
            // itself: it is this runner's if the key names it (its holder is unique).
            None => as_sent(&self.kv, &puts)
                .await
                .map_err(said)?
                .and_then(|revs| revs.first().copied()),
        };
        match claimed {
            Some(rev) => Ok(Some(Claim {
                lease,
                ttl: granted,
                rev,
                holder: holder.to_string(),
            })),
            None => {
                self.revoke(lease).await;
                Ok(None)
            }
        }
    }

    async fn renew(&self, claim: &Claim) -> Result<bool, String> {
        let lease = claim.lease;
        let timeout = self.timeout;
        self.kv
            .on_any(|mut c| async move {
                match tokio::time::timeout(timeout, c.lease_keep_alive(lease)).await {
                    Ok(Ok(_)) => Ok(true),
                    // etcd answered that the lease is gone.
                    Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(false),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer to a lease renewal within {timeout:?}"),
                    ))),
                }
            })
            .await
            .map_err(said)
    }

    async fn finish(&self, key: &str, claim: &Claim, end: &[u8]) -> Result<bool, String> {
        let (kept, _) = self.grant(END_KEPT).await.map_err(said)?;
        let (ck, ek) = (self.claim_key(key), self.end_key(key));
        // The end names the runner that recorded it: another runner's end, however alike
        // (the same hook, the same output), is never taken for this one's.
        let value = [claim.holder.as_bytes(), b"\n", end].concat();
        let when = vec![Cond::ModRev(ck.clone(), claim.rev)];
        let ops = vec![Op::PutLeased(ek, value, kept), Op::Delete(ck)];
        let done = match self.kv.txn(when, ops.clone()).await.map_err(said)? {
            Some(_) => true,
            // A finish that landed and was sent again: the end is there as sent, and the
            // claim gone.
            None => as_sent(&self.kv, &ops).await.map_err(said)?.is_some(),
        };
        if done {
            self.revoke(claim.lease).await;
        } else {
            self.revoke(kept).await;
        }
        Ok(done)
    }

    async fn holder(&self, key: &str) -> Result<Option<String>, String> {
        let got = self.kv.get(&self.claim_key(key)).await.map_err(said)?;
        Ok(got.map(|(_, v)| String::from_utf8_lossy(&v).into_owned()))
    }
}

/// The end a runner recorded, without the line naming the runner.
fn end_of(value: &[u8]) -> &[u8] {
    value
        .iter()
        .position(|&b| b == b'\n')
        .map_or(value, |i| &value[i + 1..])
}

/// Connects a job runner to etcd from the store's settings in its job's spec.
pub struct EtcdClaimsFrom;

#[async_trait::async_trait]
impl ClaimsFrom for EtcdClaimsFrom {
    async fn connect(
        &self,
        settings: &serde_json::Value,
    ) -> Result<(Box<dyn ClaimStore>, Duration), String> {
        let cfg: StoreConfig = serde_json::from_value(settings.clone())
            .map_err(|e| format!("the job's store settings: {e}"))?;
        let claims = EtcdClaims::connect(&cfg).await.map_err(said)?;
        Ok((Box::new(claims), cfg.lease_duration))
    }
}
