//! The fencer's liveness probe: every collector asked for its signed view once per interval,
//! each probe numbered and echoing the beat of the node's last view (only the leader echoes),
//! each waiting its node's patience (`fencing::rtt`); what came back goes to `fencing::peering`,
//! and each node's answers to `Seen`. The leader pushes a collector its peer set when it holds
//! another.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, warn};

use super::Fencer;
use crate::fencing::peering::VIEW_BODY_CAP;
use crate::metrics::{NodeLabel, ReasonLabel};
use crate::node::NodeConfig;
use crate::sync::LockExt;
use maintd_core::fencing::detector::{Detector, DetectorSettings};
use maintd_core::fencing::rtt::RttEstimate;
use maintd_core::verdict::Nanos;

/// What the probe saw of one collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    /// Since when probes have gone unanswered, and how many in a row.
    since: Option<Nanos>,
    misses: u32,
    /// The latest probe got an answer (never probed: no).
    answered: bool,
}

impl Seen {
    /// Returns whether this probe made the collector count as silent (`misses` in a row).
    fn probed(&mut self, answered: bool, now: Nanos, misses: u32) -> bool {
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
    fn liveness(self, misses: u32) -> (bool, Option<Nanos>, bool) {
        (self.misses < misses, self.since, self.answered)
    }
}

/// What the probe learnt of one collector: its answers, its round-trip estimate, and the
/// spacing of its answers (the adaptive failure detector).
#[derive(Debug, Clone, Default)]
struct Probed {
    seen: Seen,
    rtt: RttEstimate,
    detector: Detector,
    /// The detector has suspected the node during its current silence (counted once).
    suspected: bool,
}

/// What every probe of one cycle shares.
#[derive(Default)]
struct Cycle {
    targets: Arc<Vec<NodeConfig>>,
    leader: bool,
    /// The nodes marked for self-fencing, as the probe's query names them.
    marked: String,
}

/// The probe's memory: a cache of the collectors' answers, rebuilt by the next probes after a
/// restart (until then every collector counts as answering, so nothing is fenced on start-up).
#[derive(Default)]
pub(super) struct Probes {
    nodes: Mutex<BTreeMap<String, Probed>>,
    /// Nodes marked for self-fencing (from the flow store at each tick), told to every
    /// collector in the signed probe.
    marked: Mutex<Vec<String>>,
    /// The membership size last checked for a two-node cluster that can never fence.
    warned_size: Mutex<usize>,
}

impl Probes {
    /// (answers, silent since, answered) as `merge_liveness` takes them.
    pub(super) fn liveness(&self, node: &str, misses: u32) -> (bool, Option<Nanos>, bool) {
        let nodes = self.nodes.lock_unpoisoned();
        nodes
            .get(node)
            .map(|p| p.seen)
            .unwrap_or_default()
            .liveness(misses)
    }

    /// When the adaptive failure detector suspects `node` if it stays silent.
    pub(super) fn suspected_at(&self, node: &str) -> Option<Nanos> {
        let nodes = self.nodes.lock_unpoisoned();
        nodes
            .get(node)?
            .detector
            .suspected_at(&DetectorSettings::default())
    }

    pub(super) fn set_marked(&self, nodes: Vec<String>) {
        *self.marked.lock_unpoisoned() = nodes;
    }

    fn patience(&self, node: &str, (floor, max): (Duration, Duration)) -> Duration {
        let nodes = self.nodes.lock_unpoisoned();
        nodes.get(node).map_or(floor, |p| p.rtt.timeout(floor, max))
    }
}

impl Fencer {
    /// Says so when a two-node cluster can never fence: one dead node is half of it, a storm
    /// at a threshold under 50 %.
    fn warn_two_nodes(&self, members: usize) {
        let mut last = self.probes.warned_size.lock_unpoisoned();
        if *last == members {
            return;
        }
        *last = members;
        let storm_percent = self.settings.policy.storm_percent;
        if members == 2 && storm_percent < 50 {
            warn!(
                storm_percent,
                "a two-node cluster never fences at storm-percent {storm_percent}: one dead node is half of it, a storm; set fencing.storm-percent = 50 to make the master the tie-breaker",
            );
        }
    }

    /// The liveness probe, as a loop of its own beside the fencer's decisions: once per
    /// interval every collector is asked for its view (`GET /1/peers`), each as soon as a slot
    /// is free and its previous probe has ended, and each answer (or its patience running out)
    /// is recorded as it comes. No decision waits for a probe: the fencer reads the last
    /// outcomes, and is woken when a collector falls silent or answers again, so a fence step
    /// never waits for the patience of the node it fences.
    pub(super) async fn probe_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(self.settings.interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        type Probe =
            std::pin::Pin<Box<dyn std::future::Future<Output = (String, bool, Nanos)> + Send>>;
        let mut running: futures::stream::FuturesUnordered<Probe> = Default::default();
        // Nodes waiting for a slot or asked and not yet answered (or given up on): none is
        // asked twice at once.
        let mut busy: HashSet<String> = HashSet::new();
        let mut queue: VecDeque<NodeConfig> = VecDeque::new();
        let mut cycle = Arc::new(Cycle::default());
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some((node, ok, sent_at)) = running.next(), if !running.is_empty() => {
                    busy.remove(&node);
                    if self.record(&node, ok, sent_at) {
                        self.wake.notify_one();
                    }
                }
                _ = interval.tick() => {
                    cycle = Arc::new(self.begin_cycle().await);
                    queue.retain(|n| {
                        let member = cycle.targets.iter().any(|t| t.name == n.name);
                        if !member {
                            busy.remove(&n.name);
                        }
                        member
                    });
                    for t in cycle.targets.iter() {
                        if busy.insert(t.name.clone()) {
                            queue.push_back(t.clone());
                        }
                    }
                }
            }
            while running.len() < crate::link::PROBES_IN_FLIGHT
                && let Some(node) = queue.pop_front()
            {
                let me = self.clone();
                let c = cycle.clone();
                running.push(Box::pin(async move { me.probe_one(node, &c).await }));
            }
        }
    }

    /// What every probe of one cycle shares: the membership (its peer sets refreshed), whether
    /// this replica leads, and the nodes marked for self-fencing.
    async fn begin_cycle(&self) -> Cycle {
        let now = self.shared.clock.now();
        let targets = self.shared.members.get();
        self.warn_two_nodes(targets.len());
        self.peering.refresh(&targets).await;
        let leader = self.shared.leadership.is_leader();
        self.peering.set_leading(leader, now);
        self.probes
            .nodes
            .lock_unpoisoned()
            .retain(|n, _| targets.iter().any(|t| &t.name == n));
        let marked = self.probes.marked.lock_unpoisoned().join(",");
        Cycle {
            targets,
            leader,
            marked,
        }
    }

    /// One probe of one collector; returns whether it answered, and when the probe was sent.
    async fn probe_one(&self, node: NodeConfig, c: &Cycle) -> (String, bool, Nanos) {
        let clock = &self.shared.clock;
        let metrics = &self.metrics;
        // Signed; numbered, so the view can answer exactly this probe; echoing the beat of the
        // node's last view taken, so the node counts the master only by a round trip on its
        // own clock; naming the marked nodes.
        let probe = self.peering.next_probe();
        let echo = self.peering.echo(&node.name);
        let path = format!("/1/peers?echo={echo}&probe={probe}&marked={}", c.marked);
        let patience = self.probes.patience(&node.name, self.settings.patience);
        metrics
            .probe
            .probe_timeout_seconds
            .get_or_create(&NodeLabel {
                node: node.name.clone(),
            })
            .set(patience.as_secs_f64());
        let (sent_at, wall_sent) = (clock.now(), clock.wall());
        let call = self
            .link
            .signed(&node, http::Method::GET, &path, None, VIEW_BODY_CAP);
        let answer = match tokio::time::timeout(patience, call).await {
            Ok(Ok(a)) if a.status.is_success() => a,
            _ => {
                metrics.probe.probe_failures.inc();
                return (node.name, false, sent_at);
            }
        };
        // Read after the answer: the view was taken before this moment.
        let (received_at, wall_received) = (clock.now(), clock.wall());
        let rtt = Duration::from_nanos(received_at.saturating_sub(sent_at).max(0) as u64);
        let suspect_after = {
            let mut nodes = self.probes.nodes.lock_unpoisoned();
            let p = nodes.entry(node.name.clone()).or_default();
            p.rtt.observe(rtt);
            // On the steady clock, at its arrival: a late answer counts late.
            p.detector.heard(received_at);
            p.detector.suspect_after(&DetectorSettings::default())
        };
        if let Some(after) = suspect_after {
            metrics
                .probe
                .probe_suspect_after_seconds
                .get_or_create(&NodeLabel {
                    node: node.name.clone(),
                })
                .set(after.as_secs_f64());
        }
        // A collector that answers is alive whatever its view says: a view that fails to
        // verify (a wrong key, say) must not make a running node look dead.
        let wall_mid = wall_sent + (wall_received - wall_sent) / 2;
        match self.peering.accept(
            &node.name,
            &answer.body,
            probe,
            sent_at..received_at,
            wall_mid,
        ) {
            Ok(epoch) => {
                if let Some(o) = self.peering.clock_offset(&node.name) {
                    metrics
                        .probe
                        .node_clock_offset_seconds
                        .get_or_create(&NodeLabel {
                            node: node.name.clone(),
                        })
                        .set(o as f64 / 1e9);
                }
                if c.leader {
                    self.push_if_due(&node, epoch, received_at).await;
                }
            }
            Err(e) => {
                debug!(node = %node.name, error = %e, "peer view refused");
                metrics
                    .peers
                    .views_rejected
                    .get_or_create(&ReasonLabel {
                        reason: e.metric_label(),
                    })
                    .inc();
            }
        }
        (node.name, true, sent_at)
    }

    /// Records one probe's outcome; returns whether the collector's liveness changed (it came
    /// to count as silent, or answered after being silent), which the fencer acts on at once.
    fn record(&self, node: &str, ok: bool, sent_at: Nanos) -> bool {
        let now = self.shared.clock.now();
        let mut nodes = self.probes.nodes.lock_unpoisoned();
        let p = nodes.entry(node.to_string()).or_default();
        if ok {
            p.suspected = false;
        } else {
            p.rtt.missed();
            // Counted once per silence: how often the detector would have suspected a node,
            // to weigh against the fences that followed (or did not).
            let due = p.detector.suspected_at(&DetectorSettings::default());
            if !p.suspected && due.is_some_and(|at| at <= now) {
                p.suspected = true;
                self.metrics.probe.probe_suspicions.inc();
            }
        }
        let was_silent = p.seen.misses >= self.settings.misses;
        let silent = p.seen.probed(ok, sent_at, self.settings.misses);
        if silent {
            self.metrics.probe.probe_silences.inc();
            p.detector.outage();
        }
        silent || (ok && was_silent)
    }

    /// Pushes a node the peer set it should hold, when it holds another.
    async fn push_if_due(&self, node: &crate::node::NodeConfig, held: u64, now: Nanos) {
        let retry = 5 * self.settings.interval.as_nanos() as Nanos;
        let Some(set) = self.peering.due_push(&node.name, held, now, retry) else {
            return;
        };
        let body = serde_json::to_vec(&set).unwrap_or_default();
        let r = self
            .link
            .signed(node, http::Method::PUT, "/1/peers", Some(body), 4096)
            .await;
        match r {
            Ok(a) if a.status.is_success() => {
                self.metrics.peers.peer_sets_pushed.inc();
                debug!(node = %node.name, epoch = set.epoch, peers = set.peers.len(), "peer set pushed");
            }
            other => {
                self.metrics.peers.peer_set_push_failures.inc();
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
