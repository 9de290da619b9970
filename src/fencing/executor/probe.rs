//! The fencer's liveness probe: every collector asked for its signed view once per interval,
//! each probe numbered and echoing the beat of the node's last view (only the leader echoes),
//! each waiting its node's patience (`fencing::rtt`); what came back goes to `fencing::peering`,
//! and each node's answers to `Seen`. The leader pushes a collector its peer set when it holds
//! another.

use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, warn};

use super::Fencer;
use crate::cluster::Cluster;
use crate::fencing::peering::VIEW_BODY_CAP;
use crate::metrics::{NodeLabel, ReasonLabel};
use crate::sync::LockExt;
use crate::verdict::Nanos;

/// What the probe saw of one collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// Since when probes have gone unanswered, and how many in a row.
    since: Option<Nanos>,
    misses: u32,
    /// The latest probe got an answer (never probed: no).
    answered: bool,
}

impl Seen {
    /// Returns whether this probe made the collector count as silent (`misses` in a row).
    pub(super) fn probed(&mut self, answered: bool, now: Nanos, misses: u32) -> bool {
        if answered {
            *self = Seen {
                answered: true,
                ..Seen::default()
            };
            false
        } else {
            self.answered = false;
            self.since.get_or_insert(now);
            self.misses = self.misses.saturating_add(1);
            self.misses == misses
        }
    }

    /// (answers, silent since, answered) as `merge_liveness` takes them: silent after `misses`
    /// unanswered probes in a row, one answer lost on a lossy link (and retransmitted too late)
    /// being no silence; counted from the first miss. Before the first probe a collector is
    /// taken to answer (nothing is fenced on start-up alone), but has not answered.
    pub(super) fn liveness(self, misses: u32) -> (bool, Option<Nanos>, bool) {
        (self.misses < misses, self.since, self.answered)
    }
}

impl<C: Cluster> Fencer<C> {
    /// Says so when a two-node cluster can never fence: one dead node is half of it, a storm
    /// at a threshold under 50 %.
    fn warn_two_nodes(&self, members: usize) {
        let mut last = self.warned_size.lock_unpoisoned();
        if *last == members {
            return;
        }
        *last = members;
        if members == 2 && self.policy.storm_percent < 50 {
            warn!(
                storm_percent = self.policy.storm_percent,
                "a two-node cluster never fences at storm-percent {}: one dead node is half of it, a storm; set fencing.storm-percent = 50 to make the master the tie-breaker",
                self.policy.storm_percent
            );
        }
    }

    /// One liveness probe of every collector: `GET /1/peers`, whose answer proves the collector
    /// answers and carries its signed view of its peers. A collector whose set is out of date
    /// gets it pushed (by the leader).
    pub(super) async fn probe(&self) {
        let now = self.clock.now();
        let targets = self.members.get();
        self.warn_two_nodes(targets.len());
        self.peering.refresh(&targets).await;
        let targets = &targets;
        let leader = self.leadership.is_leader();
        self.peering.set_leading(leader, now);
        self.rtt
            .lock_unpoisoned()
            .retain(|n, _| targets.iter().any(|t| &t.name == n));
        let marked = self.marked.lock_unpoisoned().join(",");
        let marked = &marked;
        let answers: Vec<(String, bool)> = futures::stream::iter(0..targets.len())
            .map(|i| async move {
                let node = &targets[i];
                // Signed; numbered, so the view can answer exactly this probe; echoing the beat of
                // the node's last view taken, so the node counts the master only by a round trip
                // on its own clock; naming the marked nodes.
                let probe = self.peering.next_probe();
                let echo = self.peering.echo(&node.name);
                let path = format!("/1/peers?echo={echo}&probe={probe}&marked={marked}");
                let (floor, max) = self.patience;
                let patience = self
                    .rtt
                    .lock_unpoisoned()
                    .get(&node.name)
                    .map_or(floor, |e| e.timeout(floor, max));
                self.metrics
                    .probe_timeout_seconds
                    .get_or_create(&NodeLabel {
                        node: node.name.clone(),
                    })
                    .set(patience.as_secs_f64());
                let sent_at = self.clock.now();
                let call = self
                    .link
                    .signed(node, reqwest::Method::GET, &path, None, VIEW_BODY_CAP);
                let answer = match tokio::time::timeout(patience, call).await {
                    Ok(Ok(a)) if a.status.is_success() => a,
                    _ => {
                        self.metrics.probe_failures.inc();
                        return (node.name.clone(), false);
                    }
                };
                // Read after the answer: the view was taken before this moment.
                let received_at = self.clock.now();
                let rtt = Duration::from_nanos(received_at.saturating_sub(sent_at).max(0) as u64);
                self.rtt
                    .lock_unpoisoned()
                    .entry(node.name.clone())
                    .or_default()
                    .observe(rtt);
                // A collector that answers is alive whatever its view says: a view that fails
                // to verify (a wrong key, say) must not make a running node look dead.
                match self
                    .peering
                    .accept(&node.name, &answer.body, probe, sent_at, received_at)
                {
                    Ok(epoch) if leader => self.push_if_due(node, epoch, now).await,
                    Ok(_) => {}
                    Err(e) => {
                        debug!(node = %node.name, error = %e, "peer view refused");
                        self.metrics
                            .views_rejected
                            .get_or_create(&ReasonLabel {
                                reason: e.metric_label().into(),
                            })
                            .inc();
                    }
                }
                (node.name.clone(), true)
            })
            .buffer_unordered(256)
            .collect()
            .await;
        let mut seen = self.seen.lock_unpoisoned();
        let mut rtt = self.rtt.lock_unpoisoned();
        for (node, ok) in answers {
            if !ok {
                rtt.entry(node.clone()).or_default().missed();
            }
            if seen.entry(node).or_default().probed(ok, now, self.misses) {
                self.metrics.probe_silences.inc();
            }
        }
    }

    /// Pushes a node the peer set it should hold, when it holds another.
    async fn push_if_due(&self, node: &crate::node::NodeConfig, held: u64, now: Nanos) {
        let retry = 5 * self.interval.as_nanos() as Nanos;
        let Some(set) = self.peering.due_push(&node.name, held, now, retry) else {
            return;
        };
        let body = serde_json::to_vec(&set).unwrap_or_default();
        let r = self
            .link
            .signed(node, reqwest::Method::PUT, "/1/peers", Some(body), 4096)
            .await;
        match r {
            Ok(a) if a.status.is_success() => {
                self.metrics.peer_sets_pushed.inc();
                debug!(node = %node.name, epoch = set.epoch, peers = set.peers.len(), "peer set pushed");
            }
            other => {
                self.metrics.peer_set_push_failures.inc();
                let why = match other {
                    Ok(a) => format!(
                        "{}: {}",
                        a.status,
                        String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
                    ),
                    Err(e) => e.to_string(),
                };
                warn!(node = %node.name, error = %why, "collector did not take its peer set");
            }
        }
    }
}
