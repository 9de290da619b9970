//! The master's side of the peer heartbeats: which peer set each collector should hold
//! (watchers by rendezvous hashing, addresses resolved once per membership), the signed views
//! the liveness probe reads back (verified, and taken only as the answer to the probe just
//! sent, so never older than that probe), each node's testimony from its watchers for the
//! second opinion, and the evidence a self-fencing node's reset is proven from. Every time kept
//! here is the master's own clock at sending or receipt: no node's clock is compared with it.
//! The probe and the pushes themselves run in the executor, through the `CollectorLink`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{debug, warn};

use crate::fencing::peersets::{build, resolve};
use crate::fencing::readiness::WatchdogViews;
use crate::node::NodeConfig;
use crate::report::heartbeat::{PeerAddress, PeerSet, PeerView, SignedView};
use crate::report::keyring::Keyring;
use crate::sync::LockExt;
use crate::views::PeerWitnesses;
use maintd_core::fencing::opinion::{KubeletSays, PeerOpinion, Says, Testimony};
use maintd_core::fencing::selffence::{LostRun, ResetEvidence, WatcherEvidence};
use maintd_core::verdict::Nanos;

/// A view lists at most `MAX_PEERS` peers of ~120 bytes each, then escaped into a string.
pub const VIEW_BODY_CAP: usize = 32 * 1024;

/// How the master uses the peers; from `[fencing]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeeringSettings {
    /// Watchers per node.
    pub watchers: usize,
    /// A view counts as what the watcher says now for this long after it was fetched.
    pub fresh_for: Duration,
}

/// Why a collector's view was not taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ViewRejection {
    #[error("{0}")]
    View(#[from] crate::report::heartbeat::ViewError),
    #[error("not a signed view: {0}")]
    Shape(String),
    #[error("view answers probe {answers}, not the probe {sent} just sent (delayed or replayed)")]
    Replayed { answers: u64, sent: u64 },
    #[error("{0}")]
    Revoked(String),
}

impl ViewRejection {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ViewRejection::View(crate::report::heartbeat::ViewError::BadSignature) => "signature",
            ViewRejection::View(crate::report::heartbeat::ViewError::WrongNode { .. }) => "node",
            ViewRejection::View(crate::report::heartbeat::ViewError::Malformed(_))
            | ViewRejection::Shape(_) => "malformed",
            ViewRejection::Replayed { .. } => "replayed",
            ViewRejection::Revoked(_) => "revoked",
        }
    }
}

struct Held {
    view: PeerView,
    /// When the master received it (the view was taken before).
    fetched_at: Nanos,
    /// How far the node's wall clock was from the master's when it took the view: its
    /// timestamp less the middle of the probe's round trip, both wall clocks. Shown and
    /// alerted on, never used to judge anything.
    offset: Nanos,
}

/// The peer sets of one membership.
#[derive(Default)]
struct Sets {
    members: Vec<NodeConfig>,
    /// The keyring's version the sets carry the public keys of.
    keys_version: u64,
    /// node -> its watchers, best first.
    watchers: BTreeMap<String, Vec<String>>,
    sets: BTreeMap<String, PeerSet>,
}

pub struct Peering {
    /// Views are checked under their node's keys; peer sets carry every peer's public keys.
    keys: std::sync::Arc<Keyring>,
    pub settings: PeeringSettings,
    held: Mutex<BTreeMap<String, Held>>,
    sets: Mutex<Sets>,
    /// When a set was last pushed to a node, so a collector that refuses it is not asked every
    /// probe.
    pushed: Mutex<BTreeMap<String, (u64, Nanos)>>,
    /// Nodes the master has lost while a watcher hears them (kept by the fencer).
    pub(crate) partitioned: Mutex<maintd_core::fencing::partitions::Partitions>,
    /// watcher -> node -> what the watcher's views said of the node.
    evidence: Mutex<BTreeMap<String, BTreeMap<String, WatcherEvidence>>>,
    /// Since when this process leads (`None`: it does not), and the last probe number.
    leading_since: Mutex<Option<Nanos>>,
    probes: std::sync::atomic::AtomicU64,
}

/// Where this process's probe numbers start: random, so no two daemon processes (a restart, a
/// new leader) ever number a probe alike, and a view recorded in answer to an earlier
/// process's probe never answers this one's. Below 2^52, so every JSON reader reads them.
fn probe_seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No randomness: the clock still differs from one process to the next.
        b = crate::report::now_ns().to_be_bytes();
    }
    u64::from_be_bytes(b) >> 12
}

impl Peering {
    pub fn new(keys: std::sync::Arc<Keyring>, settings: PeeringSettings) -> Peering {
        Peering {
            keys,
            settings,
            held: Mutex::default(),
            sets: Mutex::default(),
            pushed: Mutex::default(),
            partitioned: Mutex::default(),
            evidence: Mutex::default(),
            leading_since: Mutex::default(),
            probes: std::sync::atomic::AtomicU64::new(probe_seed()),
        }
    }

    /// A fresh probe number (never 0, which means none).
    pub fn next_probe(&self) -> u64 {
        self.probes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1)
            .max(1)
    }

    /// Tells whether this process leads, at `now`.
    pub fn set_leading(&self, leader: bool, now: Nanos) {
        let mut since = self.leading_since.lock_unpoisoned();
        match (leader, *since) {
            (true, None) => *since = Some(now),
            (false, _) => *since = None,
            (true, Some(_)) => {}
        }
    }

    /// The beat of `node`'s last view taken, for the leader's next probe to echo (0: none). Only
    /// the leader echoes: its proof of a reset accounts for no one else's echoes.
    pub fn echo(&self, node: &str) -> u64 {
        if self.leading_since.lock_unpoisoned().is_none() {
            return 0;
        }
        self.held
            .lock_unpoisoned()
            .get(node)
            .map_or(0, |h| h.view.beat)
    }

    /// Recomputes the assignment and every node's set when membership changed.
    pub async fn refresh(&self, members: &[NodeConfig]) {
        let keys_version = self.keys.version();
        {
            let sets = self.sets.lock_unpoisoned();
            if sets.members == members && sets.keys_version == keys_version {
                return;
            }
        }
        let mut addrs: BTreeMap<String, PeerAddress> = BTreeMap::new();
        for n in members {
            if let Some(sa) = resolve(&n.collector).await {
                addrs.insert(
                    n.name.clone(),
                    PeerAddress {
                        ip: sa.ip(),
                        port: sa.port(),
                    },
                );
            }
        }
        let names: BTreeSet<String> = members.iter().map(|n| n.name.clone()).collect();
        let k = self.settings.watchers;
        // Some 0.1 s of CPU at 5,000 nodes: off the runtime's threads, so the probe's other
        // work and the API go on meanwhile.
        let keys = self.keys.clone();
        let built = tokio::task::spawn_blocking(move || build(names, &addrs, k, &keys)).await;
        let Ok((names, watchers, sets)) = built else {
            warn!("peer sets not computed; the previous ones stay");
            return;
        };
        self.held.lock_unpoisoned().retain(|n, _| names.contains(n));
        self.evidence
            .lock_unpoisoned()
            .retain(|n, _| names.contains(n));
        *self.sets.lock_unpoisoned() = Sets {
            members: members.to_vec(),
            keys_version,
            watchers,
            sets,
        };
    }

    /// The set `node` should hold, when it differs from the epoch it reported and it was not
    /// pushed in the last `retry`.
    pub fn due_push(
        &self,
        node: &str,
        held_epoch: u64,
        now: Nanos,
        retry: Nanos,
    ) -> Option<PeerSet> {
        let set = self.sets.lock_unpoisoned().sets.get(node).cloned()?;
        if set.epoch == held_epoch {
            return None;
        }
        let mut pushed = self.pushed.lock_unpoisoned();
        if let Some((e, at)) = pushed.get(node)
            && *e == set.epoch
            && now.saturating_sub(*at) < retry
        {
            return None;
        }
        pushed.insert(node.to_string(), (set.epoch, now));
        Some(set)
    }

    /// Verifies a collector's answer to the probe numbered `probe`, sent and answered over `trip`
    /// (`sent_at..received_at` (the steady timeline), and keeps it; returns the epoch of the
    /// set the collector holds. The view is fresh because it answers this very probe: its own
    /// timestamp is never compared with this clock (a master whose wall clock is off by a
    /// minute still judges every node), only kept as the node's clock offset from `wall_mid`,
    /// the middle of the round trip on the master's wall clock.
    pub fn accept(
        &self,
        node: &str,
        body: &[u8],
        probe: u64,
        trip: std::ops::Range<Nanos>,
        wall_mid: Nanos,
    ) -> Result<u64, ViewRejection> {
        let (sent_at, received_at) = (trip.start, trip.end);
        let signed: SignedView =
            serde_json::from_slice(body).map_err(|e| ViewRejection::Shape(e.to_string()))?;
        let keys = self
            .keys
            .verifiers(node)
            .map_err(|e| ViewRejection::Revoked(e.to_string()))?;
        let view = signed.verify(&keys, node)?;
        if view.answers != probe {
            return Err(ViewRejection::Replayed {
                answers: view.answers,
                sent: probe,
            });
        }
        self.witness(node, &view, sent_at, received_at);
        let epoch = view.epoch;
        debug!(node, epoch, peers = view.peers.len(), "peer view taken");
        let offset = view.at.saturating_sub(wall_mid);
        self.held.lock_unpoisoned().insert(
            node.to_string(),
            Held {
                view,
                fetched_at: received_at,
                offset,
            },
        );
        Ok(epoch)
    }

    /// How far `node`'s wall clock is from the master's (positive: ahead), from its last view.
    pub fn clock_offset(&self, node: &str) -> Option<Nanos> {
        self.held.lock_unpoisoned().get(node).map(|h| h.offset)
    }

    /// What `watcher`'s view says of each of its peers, as evidence for a reset proof: a peer
    /// it hears, as of the receipt; one it lost, as the span it has heard nothing from it; one
    /// it no longer lists, nothing.
    fn witness(&self, watcher: &str, view: &PeerView, sent_at: Nanos, received_at: Nanos) {
        let mut all = self.evidence.lock_unpoisoned();
        let mine = all.entry(watcher.to_string()).or_default();
        mine.retain(|n, _| view.peers.iter().any(|p| &p.name == n));
        for p in &view.peers {
            let e = mine.entry(p.name.clone()).or_default();
            if p.alive {
                e.hears_at = Some(received_at);
                e.lost = None;
            } else if let Some(quiet_ms) = p.quiet_ms {
                let quiet = (quiet_ms.min(86_400_000) * 1_000_000) as Nanos;
                e.lost = Some(LostRun::extend(e.lost, sent_at, received_at, quiet));
            } else {
                // A collector that does not say how long it has heard nothing covers nothing.
                e.lost = None;
            }
        }
    }

    /// Everything the master holds to prove `node` reset: when it last received the node's own
    /// view, since when it leads, and each of the node's watchers' evidence. `None` when the
    /// node's last view shows it holds another peer set than the one its watchers are taken
    /// from (then its watchers are not known).
    pub fn reset_evidence(&self, node: &str) -> Option<ResetEvidence> {
        let leading_since = (*self.leading_since.lock_unpoisoned())?;
        let (watchers, epoch) = {
            let sets = self.sets.lock_unpoisoned();
            let set = sets.sets.get(node);
            (
                set.map(|s| s.watchers.iter().cloned().collect::<Vec<_>>())
                    .unwrap_or_default(),
                set.map(|s| s.epoch),
            )
        };
        let (master_heard, held_epoch) = self
            .held
            .lock_unpoisoned()
            .get(node)
            .map(|h| (Some(h.fetched_at), Some(h.view.epoch)))
            .unwrap_or_default();
        if held_epoch.is_some() && held_epoch != epoch {
            return None;
        }
        let all = self.evidence.lock_unpoisoned();
        let watchers = watchers
            .iter()
            .map(|w| {
                all.get(w)
                    .and_then(|m| m.get(node))
                    .copied()
                    .unwrap_or_default()
            })
            .collect();
        Some(ResetEvidence {
            master_heard,
            leading_since,
            watchers,
        })
    }

    fn watchers_of(&self, node: &str) -> Vec<String> {
        self.sets
            .lock_unpoisoned()
            .watchers
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    /// What each of `node`'s watchers says about it, from the views fetched within
    /// `fresh_for`.
    pub fn testimony(&self, node: &str, now: Nanos) -> Vec<Testimony> {
        let watchers = self.watchers_of(node);
        let held = self.held.lock_unpoisoned();
        let fresh = self.settings.fresh_for.as_nanos() as Nanos;
        watchers
            .into_iter()
            .map(|w| {
                // Both on this process's steady timeline, so a step of the wall clock makes no
                // old view young again. A view taken after `now` (the probe runs beside the
                // decisions) is as fresh as can be: its age counts as 0.
                let says = held
                    .get(&w)
                    .filter(|h| now.saturating_sub(h.fetched_at).max(0) <= fresh)
                    .and_then(|h| {
                        let p = h.view.peers.iter().find(|p| p.name == node)?;
                        Some(if p.alive {
                            Says::Hears { view_at: h.view.at }
                        } else {
                            Says::Lost {
                                view_at: h.view.at,
                                last_heard: p.heard_at,
                            }
                        })
                    })
                    .unwrap_or(Says::Unheard);
                Testimony { watcher: w, says }
            })
            .collect()
    }

    /// The second opinion on `node`, with its kubelet's Lease when there is one.
    pub fn opinion(&self, node: &str, now: Nanos, leases: &[(String, KubeletSays)]) -> PeerOpinion {
        maintd_core::fencing::opinion::second_opinion(&self.testimony(node, now), leases)
    }

    /// A node's last reported watchdog, from its own last view: `None` if it never had one or
    /// its last word was "disarmed".
    pub fn watchdog(&self, node: &str) -> Option<crate::report::WatchdogReport> {
        self.reported_watchdog(node).flatten()
    }

    /// Every node's peer set, for `maintd bench peers`.
    #[cfg(feature = "bench")]
    pub fn sets_for_bench(&self) -> BTreeMap<String, PeerSet> {
        self.sets.lock_unpoisoned().sets.clone()
    }

    /// What `node`'s watchers say, as `/1/nodes` shows it.
    pub fn witnesses(&self, node: &str, now: Nanos) -> PeerWitnesses {
        let mut w = PeerWitnesses::default();
        for t in self.testimony(node, now) {
            w.watchers.push(t.watcher.clone());
            match t.says {
                Says::Hears { .. } => w.heard_by.push(t.watcher),
                Says::Lost { .. } => w.lost_by.push(t.watcher),
                Says::Unheard => w.unheard.push(t.watcher),
            }
        }
        w.partitioned = self.partitioned.lock_unpoisoned().called().contains(node);
        w.watchdog = self.reported_watchdog(node).flatten();
        let assigned = self.sets.lock_unpoisoned().sets.get(node).map(|s| s.epoch);
        w.set_current = self
            .held
            .lock_unpoisoned()
            .get(node)
            .is_some_and(|h| Some(h.view.epoch) == assigned);
        w
    }
}

impl WatchdogViews for Peering {
    fn reported_watchdog(&self, node: &str) -> Option<Option<crate::report::WatchdogReport>> {
        self.held
            .lock_unpoisoned()
            .get(node)
            .map(|h| h.view.watchdog)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Key;
    use crate::report::heartbeat::PeerState;

    const NOW: Nanos = 1_800_000_000_000_000_000;
    const S: Nanos = 1_000_000_000;

    fn key() -> Key {
        Key::from_bytes(vec![3; 32])
    }

    fn peering() -> Peering {
        Peering::new(
            std::sync::Arc::new(Keyring::cluster(key())),
            PeeringSettings {
                watchers: 2,
                fresh_for: Duration::from_secs(3),
            },
        )
    }

    fn members(n: usize) -> Vec<NodeConfig> {
        (1..=n)
            .map(|i| NodeConfig {
                name: format!("n{i}"),
                collector: format!("10.0.0.{i}:1815"),
            })
            .collect()
    }

    fn view(node: &str, at: Nanos, alive: &[(&str, bool)], k: &Key) -> Vec<u8> {
        view_of_set(node, 1, at, alive, k)
    }

    fn view_of_set(node: &str, epoch: u64, at: Nanos, alive: &[(&str, bool)], k: &Key) -> Vec<u8> {
        let v = PeerView {
            node: node.into(),
            epoch,
            at,
            peers: alive
                .iter()
                .map(|(p, a)| PeerState {
                    name: p.to_string(),
                    heard_at: Some(at - 3 * S),
                    alive: *a,
                    hears_me: *a,
                    quiet_ms: Some(3000),
                })
                .collect(),
            rejected: BTreeMap::new(),
            watchdog: None,
            beat: 5,
            answers: 1,
        };
        serde_json::to_vec(&v.sign(k)).unwrap()
    }

    #[tokio::test]
    async fn the_evidence_of_a_reset_is_kept_on_the_masters_clock_and_only_the_leader_echoes() {
        let p = peering();
        p.refresh(&members(3)).await;
        let watchers: Vec<String> = p.sets.lock_unpoisoned().sets["n1"]
            .watchers
            .iter()
            .cloned()
            .collect();
        let w = watchers[0].as_str();
        // n1's own view (of the set it was pushed), then a watcher that hears it, then one that
        // lost it 3 s before.
        let epoch = p.sets.lock_unpoisoned().sets["n1"].epoch;
        assert!(!p.witnesses("n1", NOW).set_current, "no view of n1 yet");
        let own = view_of_set("n1", epoch, NOW, &[], &key());
        p.accept("n1", &own, 1, NOW..NOW + S / 10, NOW).unwrap();
        assert!(p.witnesses("n1", NOW).set_current);
        assert_eq!(p.echo("n1"), 0, "not leading: no echo");
        assert!(p.reset_evidence("n1").is_none(), "not leading: no proof");
        p.set_leading(true, NOW);
        assert_eq!(p.echo("n1"), 5, "the beat of n1's last view");
        p.accept(
            w,
            &view(w, NOW, &[("n1", true)], &key()),
            1,
            NOW..NOW + S,
            NOW,
        )
        .unwrap();
        let e = p.reset_evidence("n1").unwrap();
        assert_eq!(
            e.master_heard,
            Some(NOW + S / 10),
            "its receipt, not its own clock"
        );
        assert_eq!(e.leading_since, NOW);
        assert_eq!(e.watchers.len(), watchers.len());
        assert_eq!(e.watchers[0].hears_at, Some(NOW + S));
        // Lost, quiet for 3 s, asked at +5 s and answered at +5.5 s: covers (+2.5 s, +5 s].
        let at = NOW + 5 * S;
        p.accept(
            w,
            &view(w, at, &[("n1", false)], &key()),
            1,
            at..at + S / 2,
            at,
        )
        .unwrap();
        let e = p.reset_evidence("n1").unwrap();
        assert_eq!(e.watchers[0].hears_at, Some(NOW + S), "kept");
        assert_eq!(
            e.watchers[0].lost,
            Some(LostRun {
                from: NOW + 5 * S + S / 2 - 3 * S,
                until: NOW + 5 * S
            })
        );
        // A node that reports another peer set than its watchers are taken from: not known.
        let stale = view_of_set("n1", epoch + 1, at, &[], &key());
        p.accept("n1", &stale, 1, at..at + S, at).unwrap();
        assert!(p.reset_evidence("n1").is_none());
        assert!(!p.witnesses("n1", at).set_current, "shown as such");
        p.set_leading(false, at);
        assert_eq!(p.echo("n1"), 0);
    }

    #[test]
    fn no_two_processes_number_their_probes_alike() {
        let (a, b) = (peering(), peering());
        let (x, y) = (a.next_probe(), b.next_probe());
        assert!(x != 0 && y != 0 && x != y, "{x} {y}");
        assert_eq!(a.next_probe(), x + 1);
        assert!(x < 1 << 53, "JSON-safe");
    }

    #[test]
    fn forged_misaddressed_stale_and_replayed_views_are_refused() {
        let p = peering();
        let label = |r: Result<u64, ViewRejection>| r.unwrap_err().metric_label();
        let other = Key::from_bytes(vec![4; 32]);
        assert_eq!(
            label(p.accept("n1", &view("n1", NOW, &[], &other), 1, NOW..NOW, NOW)),
            "signature"
        );
        assert_eq!(
            label(p.accept("n1", &view("n2", NOW, &[], &key()), 1, NOW..NOW, NOW)),
            "node"
        );
        assert_eq!(
            label(p.accept("n1", b"{\"view\":1}", 1, NOW..NOW, NOW)),
            "malformed"
        );
        // A view an hour away from the master's wall clock, answering the probe just sent: taken,
        // and its clock's offset kept (the middle of the round trip is the master's reading).
        let far = view("n1", NOW - 3600 * S, &[], &key());
        assert_eq!(p.accept("n1", &far, 1, NOW..NOW + S, NOW + S / 2), Ok(1));
        assert_eq!(p.clock_offset("n1"), Some(-3600 * S - S / 2));
        // The same view again, as the answer to the next probe: delayed or replayed, however
        // near its timestamp is to the master's clock.
        let v = view("n1", NOW, &[], &key());
        assert_eq!(
            label(p.accept("n1", &v, 2, NOW + S..NOW + S, NOW + S)),
            "replayed"
        );
    }

    #[tokio::test]
    async fn testimony_comes_from_fresh_views_of_the_nodes_watchers() {
        let p = peering();
        p.refresh(&members(4)).await;
        let watchers = p.sets.lock_unpoisoned().watchers["n1"].clone();
        assert_eq!(watchers.len(), 2);
        let (a, b) = (watchers[0].as_str(), watchers[1].as_str());
        // Not asked yet: nobody is heard.
        assert!(
            p.testimony("n1", NOW)
                .iter()
                .all(|t| t.says == Says::Unheard)
        );
        p.accept(a, &view(a, NOW, &[("n1", false)], &key()), 1, NOW..NOW, NOW)
            .unwrap();
        p.accept(b, &view(b, NOW, &[("n1", true)], &key()), 1, NOW..NOW, NOW)
            .unwrap();
        let t = p.testimony("n1", NOW + S);
        assert!(matches!(
            t[0].says,
            Says::Lost {
                last_heard: Some(_),
                ..
            }
        ));
        assert!(matches!(t[1].says, Says::Hears { .. }));
        assert!(matches!(
            p.opinion("n1", NOW + S, &[]),
            PeerOpinion::Partitioned { .. }
        ));
        // Views older than `fresh-for` say nothing.
        assert!(
            p.testimony("n1", NOW + 4 * S)
                .iter()
                .all(|t| t.says == Says::Unheard)
        );
        // A view taken after the decision's `now` (the probe runs beside the decisions) is
        // fresh, not too young to count.
        let later = NOW + 10 * S;
        p.accept(
            a,
            &view(a, later, &[("n1", false)], &key()),
            1,
            later..later,
            later,
        )
        .unwrap();
        assert!(matches!(
            p.testimony("n1", later - S / 2)[0].says,
            Says::Lost { .. }
        ));
    }

    #[tokio::test]
    async fn each_set_holds_the_nodes_watchers_and_the_nodes_it_watches_and_is_pushed_when_it_differs()
     {
        let p = peering();
        p.refresh(&members(6)).await;
        let (sets, watchers) = {
            let s = p.sets.lock_unpoisoned();
            (s.sets.clone(), s.watchers.clone())
        };
        for (n, set) in &sets {
            assert!(!set.peers.contains_key(n));
            for w in &watchers[n] {
                assert!(set.peers.contains_key(w), "{n} is watched by {w}");
                assert!(sets[w].peers.contains_key(n), "{w} watches {n}");
            }
            assert_eq!(set.peers[&watchers[n][0]].port, 1815);
        }
        // Same membership, same epochs: a new leader pushes nothing.
        let again = peering();
        again.refresh(&members(6)).await;
        let epochs = |p: &Peering| -> Vec<u64> {
            p.sets
                .lock_unpoisoned()
                .sets
                .values()
                .map(|s| s.epoch)
                .collect()
        };
        assert_eq!(epochs(&p), epochs(&again));
        let n1 = sets["n1"].epoch;
        assert!(p.due_push("n1", n1, NOW, 5 * S).is_none(), "it holds it");
        assert_eq!(p.due_push("n1", 0, NOW, 5 * S).map(|s| s.epoch), Some(n1));
        assert!(
            p.due_push("n1", 0, NOW + S, 5 * S).is_none(),
            "not again at once"
        );
        assert!(p.due_push("n1", 0, NOW + 6 * S, 5 * S).is_some());
    }
}
