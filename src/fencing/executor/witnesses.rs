//! The fencer's witnesses: the second opinion on every silent node from its
//! watchers' views and, on Kubernetes, its kubelet's Lease; and the report of nodes partitioned
//! from the master (log, metric, Event).

use std::collections::BTreeMap;
use std::time::Duration;

use tracing::{info, warn};

use super::{Fencer, ns};
use crate::cluster::EventReason;
use crate::metrics::NodeLabel;
use crate::sync::LockExt;
use maintd_core::fencing::machine::{Liveness, SelfFenceFacts};
use maintd_core::fencing::opinion::{KubeletSays, PeerOpinion};
use maintd_core::fencing::partitions::PartitionChange;
use maintd_core::fencing::selffence::SelfFenceTimes;
use maintd_core::verdict::Nanos;

/// When (by this fencer's clock) each witnessing Lease's current renewal arrived, by node and
/// witness name: read from the Lease watches at each decision.
#[derive(Default)]
pub(super) struct Renewals(std::sync::Mutex<BTreeMap<(String, String), Renewal>>);

/// A kubelet Lease as the fencer follows it.
#[derive(Debug, Clone)]
struct Renewal {
    /// When its current renewal arrived on a live watch (`None`: learned from a list, or not
    /// changed since this fencer first saw it, so when it happened is unknown).
    at: Option<Nanos>,
    /// The kubelet renews every quarter of the Lease's duration.
    every: Nanos,
}

use crate::cluster::LEASE_DELIVERY as DELIVERY;

/// The times a node reported with its armed watchdog, in ns.
fn reported_times(w: &crate::report::WatchdogReport) -> SelfFenceTimes {
    // A day bounds any honest setting, and keeps the proof's sums far from overflow.
    let ns = |ms: u64| (ms.min(86_400_000) * 1_000_000) as Nanos;
    SelfFenceTimes {
        lost_after: ns(w.lost_after_ms),
        heartbeat: ns(w.heartbeat_interval_ms),
        feed_every: ns(w.feed_interval_ms),
        isolation: ns(w.isolation_timeout_ms),
        watchdog_timeout: ns(w.timeout_ms),
        master_lost_after: ns(w.master_lost_after_ms),
    }
}

impl Fencer {
    /// For each self-fencing flow still waiting: the node's last reported watchdog, and what
    /// the master received from it and its watchers (its own clock only).
    pub(super) fn self_fence_facts(
        &self,
        flows: &[maintd_core::fencing::machine::Flow],
    ) -> BTreeMap<String, SelfFenceFacts> {
        flows
            .iter()
            .filter(|f| f.step == maintd_core::fencing::machine::Step::SelfFence && !f.fenced())
            .map(|f| {
                let facts = SelfFenceFacts {
                    times: self.peering.watchdog(&f.node).as_ref().map(reported_times),
                    evidence: self.peering.reset_evidence(&f.node),
                };
                (f.node.clone(), facts)
            })
            .collect()
    }

    /// Notes every witness Lease renewal the watches show, dated by when it arrived, on this
    /// fencer's clock: no clock is ever compared with a node's. Returns how much earlier than
    /// its arrival a renewal may have happened (the watch's delivery), `None` on a backend
    /// without Leases.
    fn observe_renewals(&self, now: Nanos) -> Option<Nanos> {
        let leases = self.shared.cluster.witness.as_ref()?.witness_leases();
        // The watch dates each renewal by its arrival; one first seen in a list has no date,
        // and proves nothing until the next one arrives.
        *self.witnesses.0.lock_unpoisoned() = leases
            .into_iter()
            .map(|(node, l)| {
                let every = ns(Duration::from_secs(l.duration_s.max(4) as u64 / 4));
                let at = l.arrived.map(|t| now.saturating_sub(ns(t.elapsed())));
                (node, Renewal { at, every })
            })
            .collect();
        Some(ns(DELIVERY))
    }

    /// The second opinion on every node whose collector is silent. On Kubernetes its Leases
    /// speak too: a renewal that surely happened after the collector went silent (it arrived
    /// later than that by more than a watch's delivery) and within one renew interval of now
    /// proves the node runs.
    pub(super) fn opinions(
        &self,
        liveness: &BTreeMap<String, Liveness>,
        now: Nanos,
    ) -> BTreeMap<String, PeerOpinion> {
        let lag = self.observe_renewals(now);
        let renewals = self.witnesses.0.lock_unpoisoned().clone();
        liveness
            .iter()
            .filter(|(_, l)| l.probe_silent)
            .map(|(n, l)| {
                let leases: Vec<(String, KubeletSays)> = lag
                    .map(|lag| {
                        renewals
                            .range((n.clone(), String::new())..)
                            .take_while(|((node, _), _)| node == n)
                            .map(|((_, witness), r)| {
                                let since = l.unreachable_since.unwrap_or(now);
                                let alive = r
                                    .at
                                    .is_some_and(|t| t > since + lag && now - t <= r.every + lag);
                                let says = if alive {
                                    KubeletSays::RenewedSinceLoss
                                } else {
                                    KubeletSays::NotSinceLoss {
                                        checked_at: now,
                                        last_renewal: r.at,
                                    }
                                };
                                (witness.clone(), says)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (n.clone(), self.peering.opinion(n, now, &leases))
            })
            .collect()
    }

    /// What the return to service of each node with an open, fenced flow waits for besides
    /// its reports: its kubelet's Ready (Kubernetes: unknown counts as not Ready), and when its
    /// Leases were renewed, dated back by how late a renewal can be seen here (so a renewal
    /// counts as after the power-on only when it surely was).
    pub(super) fn return_facts(
        &self,
        flows: &[maintd_core::fencing::machine::Flow],
    ) -> BTreeMap<String, maintd_core::fencing::machine::ReturnFacts> {
        let Some(watch) = self.shared.watch.as_ref() else {
            return BTreeMap::new();
        };
        let ready = watch.ready().unwrap_or_default();
        let lag = ns(DELIVERY);
        let renewals = self.witnesses.0.lock_unpoisoned();
        flows
            .iter()
            .filter(|f| f.fenced() || f.kdump_at.is_some())
            .map(|f| {
                let renewed = renewals
                    .range((f.node.clone(), String::new())..)
                    .take_while(|((node, _), _)| *node == f.node)
                    .filter_map(|((_, w), r)| Some((w.clone(), r.at?.saturating_sub(lag))))
                    .collect();
                let facts = maintd_core::fencing::machine::ReturnFacts {
                    ready: Some(ready.get(&f.node).copied().unwrap_or(false)),
                    renewed,
                };
                (f.node.clone(), facts)
            })
            .collect()
    }

    /// Says so, once, when the master loses a node that its watchers still hear, and when that
    /// ends: in the log, as a metric and as an Event on the node. When is the core's
    /// `Partitions` rule (with hysteresis both ways).
    pub(super) async fn report_partitions(
        &self,
        opinions: &BTreeMap<String, PeerOpinion>,
        liveness: &BTreeMap<String, Liveness>,
        fencing: &std::collections::BTreeSet<String>,
        now: Nanos,
    ) {
        let since = |n: &str| liveness.get(n).and_then(|l| l.unreachable_since);
        let PartitionChange { began, ended } = self.peering.partitioned.lock_unpoisoned().step(
            opinions,
            since,
            fencing,
            self.settings.policy.grace,
            now,
        );
        let began = began.into_iter().map(|(n, h)| (n, h.join(", ")));
        for (node, hearers) in began {
            warn!(node = %node, hearers = %hearers, "node partitioned from the master: its watchers still hear it, so nothing is fenced");
            self.metrics
                .peers
                .partitioned
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(1);
            let msg = format!(
                "maintd cannot reach the collector, but its watchers {hearers} still hear the node: partitioned from the master, not fenced"
            );
            // Only the leader writes Events: a standby's would duplicate them.
            if self.shared.leadership.is_leader() {
                self.shared
                    .cluster
                    .record(&node, EventReason::Partitioned, &msg, true)
                    .await;
            }
        }
        for node in ended {
            info!(node = %node, "node no longer partitioned from the master");
            self.metrics
                .peers
                .partitioned
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(0);
            let msg = "maintd reaches the collector again, or its watchers lost it too";
            if self.shared.leadership.is_leader() {
                self.shared
                    .cluster
                    .record(&node, EventReason::PartitionEnded, msg, false)
                    .await;
            }
        }
    }
}
