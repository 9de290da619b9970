//! The election loop: reading, taking, renewing and releasing the lease on the leader's steady
//! clock, stopping at the renew deadline, and what the loop last could not do (said by the API).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use super::Leadership;
use crate::cluster::{Coordination, LeaseRecord};
use crate::sync::LockExt;
use maintd_core::lease::{LeaseStep, lease_step};
use maintd_core::verdict::Nanos;

impl Leadership {
    /// The store refused or did not answer `what`: said in the log, `/1/health` and a metric.
    fn trouble(&self, what: &str, e: &dyn std::fmt::Display) {
        warn!(error = %e, "{what}");
        *self.problem.lock_unpoisoned() = Some(format!("{what}: {e}"));
        self.metrics.store_up.set(0);
    }

    /// The store answered.
    fn fine(&self) {
        if self.problem.lock_unpoisoned().take().is_some() {
            info!("the lease's store answers again");
        }
        self.metrics.store_up.set(1);
    }

    /// One write of the lease, timed and counted.
    async fn write_lease(
        &self,
        coord: &Arc<dyn Coordination>,
        l: &LeaseRecord,
    ) -> Result<Option<LeaseRecord>, crate::cluster::ClusterError> {
        let started = self.clock.now();
        let written = coord.write_lease(l).await;
        let result = match &written {
            Ok(Some(_)) => "ok",
            Ok(None) => "conflict",
            Err(_) => "error",
        };
        self.metrics.lease_write(result, self.since(started));
        written
    }
    /// The election loop. Returns when `shutdown` resolves (releasing a held lease after a final
    /// checkpoint) or when leadership is lost.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let Some((coord, cfg)) = self.election.clone() else {
            shutdown.await;
            return;
        };
        let me = self.identity.clone();
        let lease_duration = cfg.lease_duration;
        let mut seen: Option<(Option<String>, Option<String>)> = None;
        let mut seen_at = self.clock.now();
        let mut renewed_at = self.clock.now();
        // The Lease as this replica last wrote it, while it holds it: a renewal replaces that
        // version without reading first (as client-go does), so a leader's only request per
        // retry period is its renewal. A conflict means someone else wrote: read it afresh.
        let mut own: Option<LeaseRecord> = None;
        let mut fresh = false;
        let mut ticker = crate::ticker::Ticker::new(cfg.retry_period);
        tokio::pin!(shutdown);
        info!(identity = %me, lease = %cfg.place, "leader election started");
        while ticker.next(shutdown.as_mut()).await.is_some() {
            if self.lost.lock_unpoisoned().is_some() {
                return;
            }
            let lease = match own.clone() {
                Some(l) => Some(l),
                None => match coord.get_lease(fresh).await {
                    Ok(l) => {
                        fresh = false;
                        self.fine();
                        l
                    }
                    Err(e) => {
                        self.trouble("cannot read the lease", &e);
                        fresh = true;
                        self.check_deadline(renewed_at, cfg.renew_deadline);
                        continue;
                    }
                },
            };
            let marker = lease
                .as_ref()
                .map(|l| (l.holder.clone(), l.renew_marker.clone()));
            if marker != seen {
                seen = marker;
                seen_at = self.clock.now();
            }
            match lease_step(
                lease.as_ref().map(LeaseRecord::view),
                &me,
                self.since(seen_at),
                lease_duration,
            ) {
                LeaseStep::Renew => {
                    let mut l = lease.clone().unwrap_or_default();
                    l.duration_s = lease_duration.as_secs().max(1) as i32;
                    let sent = self.clock.now();
                    match self.write_lease(&coord, &l).await {
                        Ok(Some(written)) => {
                            own = Some(written);
                            renewed_at = sent;
                            // Our own lease from before a restart: lead again at once.
                            self.held(&coord, sent).await;
                        }
                        Ok(None) => {
                            warn!("lease renewal conflicted; reading it afresh");
                            own = None;
                            fresh = true;
                        }
                        // Whether it landed is unknown: the next attempt replaces the same
                        // version, and a conflict then reads it afresh.
                        Err(e) => self.trouble("cannot renew the lease", &e),
                    }
                    self.check_deadline(renewed_at, cfg.renew_deadline);
                }
                LeaseStep::Acquire { transitions } => {
                    if self.leads() {
                        self.lose("the lease lapsed while this replica led".into());
                        return;
                    }
                    let l = LeaseRecord {
                        holder: Some(me.clone()),
                        renew_marker: None,
                        duration_s: lease_duration.as_secs().max(1) as i32,
                        transitions,
                        version: lease.and_then(|l| l.version),
                        acquired: None,
                    };
                    let sent = self.clock.now();
                    match self.write_lease(&coord, &l).await {
                        Ok(Some(written)) => {
                            own = Some(written);
                            renewed_at = sent;
                            self.held(&coord, sent).await;
                        }
                        Ok(None) => {
                            info!("another replica took the lease first");
                            fresh = true;
                        }
                        Err(e) => {
                            self.trouble("cannot take the lease", &e);
                            fresh = true;
                        }
                    }
                }
                LeaseStep::Follow { holder } => {
                    if self.leads() {
                        self.lose(format!("{holder} holds the lease now"));
                        return;
                    }
                    own = None;
                    *self.holder.lock_unpoisoned() = Some(holder);
                    match self.import(&coord, false).await {
                        Ok(_) => self.fine(),
                        Err(e) => self.trouble("cannot follow the leader's state", &e),
                    }
                }
            }
        }
        if self.leads() {
            // Hand over at once rather than after the lease expires: last state, then the lease.
            if let Err(e) = self.checkpoint().await {
                warn!(error = %e, "final checkpoint failed");
            }
            self.leader.store(false, Ordering::SeqCst);
            if let Ok(Some(l)) = coord.get_lease(true).await
                && l.holder.as_deref() == Some(me.as_str())
            {
                let released = LeaseRecord {
                    holder: None,
                    duration_s: 1,
                    ..l
                };
                match self.write_lease(&coord, &released).await {
                    Ok(Some(_)) => info!("lease released"),
                    _ => warn!("cannot release the lease; it expires on its own"),
                }
            }
        }
    }

    /// The lease was written as this replica's, the write sent at `sent`: the renewal counts
    /// from then (a standby saw the write no earlier, so this replica's deadline ends before
    /// the lease can in its eyes, however late the answer came), and a replica not leading yet
    /// leads.
    async fn held(&self, coord: &Arc<dyn Coordination>, sent: Nanos) {
        self.fine();
        self.renewed_at(sent);
        if !self.leads() {
            self.become_leader(coord).await;
        }
    }

    fn check_deadline(&self, renewed_at: Nanos, deadline: Duration) {
        let age = if self.leads() {
            self.since(renewed_at)
        } else {
            Duration::ZERO
        };
        self.metrics.renewal_age.set(age.as_secs_f64());
        if self.leads() && self.since(renewed_at) > deadline {
            self.lose(format!("could not renew the lease for {deadline:?}"));
        }
    }

    async fn become_leader(&self, coord: &Arc<dyn Coordination>) {
        // The leader acts on the last shared state, never on what it computed as a standby:
        // until that loads it holds the lease without acting, and tries again at its renewal
        // (stepping down would only hand the same unreachable state to the next replica).
        if let Err(e) = self.import(coord, true).await {
            self.trouble(
                "took the lease but cannot load the shared state; not acting yet",
                &e,
            );
            return;
        }
        *self.holder.lock_unpoisoned() = Some(self.identity.clone());
        self.term.fetch_add(1, Ordering::SeqCst);
        self.leader.store(true, Ordering::SeqCst);
        info!(identity = %self.identity, term = self.term(), "became the leader");
        self.term_tx.send_replace(self.term());
    }
}
