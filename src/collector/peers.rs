//! Peer heartbeats, the node's side. The leader tells each collector its peers
//! (signed `PUT /1/peers`: the nodes that watch it and the nodes it watches). The collector then
//! sends every peer a signed heartbeat each `interval` over UDP, on its own port number but apart
//! from the HTTP listener, so a flood of HTTP connections does not silence it. It accepts
//! heartbeats only from its peers, refuses and counts forged, stale, replayed and misrouted ones,
//! and serves what it hears as a signed view (`GET /1/peers`). Every heartbeat echoes the
//! recipient's latest beat, and every view answering a signed probe has a beat of its own for
//! the master to echo: the watchdog's rules count contact only from when this node sent the
//! echoed beat (its monotonic clock), so a delayed message never passes for present contact.
//! Memory is bounded by the peer set and two capped rings: a stranger's datagram creates
//! nothing, and an unsigned view request records nothing.

use super::probe::MasterProbe;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;
use tracing::{debug, warn};

use crate::config::HeartbeatConfig;
use crate::report::heartbeat::{
    Heartbeat, MAX_HEARTBEAT_BYTES, PeerSet, PeerSetError, PeerView, SignedView,
};
use crate::report::nodekey::Credential;
use crate::report::now_ns;
use crate::report::peerkeys::{PeerKeys, heartbeat_signed};
use crate::sync::{LockExt, RwLockExt};
use maintd_core::verdict::Nanos;

struct Heard {
    seq: u64,
    /// When it arrived: the wall clock (shown in the view) and the monotonic one (judged).
    at: Nanos,
    at_mono: Nanos,
    /// The latest beat of this node it echoed, and the latest it vouched for.
    echo: u64,
    vouch: u64,
    marked_me: bool,
}

/// A view served to a signed probe of the master: its beat, when it was taken (monotonic), and
/// each peer it said it hears with that peer's latest beat.
struct Served {
    beat: u64,
    at: Nanos,
    hears: BTreeMap<String, u64>,
}

/// What the master's signed probes said.
#[derive(Default)]
struct MasterSeen {
    /// When this node took the latest view the master echoed: contact both ways, as of then.
    contact: Option<Nanos>,
    /// What that view said this node hears (each peer's latest beat): the master has seen it,
    /// so this node vouches for those beats to their senders.
    acked: BTreeMap<String, u64>,
    /// The nodes the master has marked for fencing, as of its last probe.
    marked: BTreeSet<String>,
}

/// Beats kept to look echoes up: 64 peers at a 100 ms interval for 60 s stays well below this.
const MAX_SENT: usize = 1 << 16;

/// Views kept for the master to echo (it echoes the view of its previous probe).
const MAX_SERVED: usize = 16;

/// The set, its peers' addresses, and the keys their heartbeats are checked with.
type Installed = (
    PeerSet,
    Vec<(String, SocketAddr)>,
    BTreeMap<String, PeerKeys>,
);

pub struct Peers {
    me: String,
    cred: Credential,
    cfg: HeartbeatConfig,
    set: std::sync::RwLock<Installed>,
    heard: std::sync::Mutex<BTreeMap<String, Heard>>,
    rejected: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    /// Seeded from the clock, so a restarted collector continues above what its peers accepted.
    /// Heartbeats and views draw their beats from it.
    seq: AtomicU64,
    /// The beats this node sent, oldest first, with their monotonic send times.
    sent: std::sync::Mutex<VecDeque<(u64, Nanos)>>,
    served: std::sync::Mutex<VecDeque<Served>>,
    /// Since when (monotonic) each peer of the set has been tracked: a view never claims a
    /// silence it was not listening through.
    tracked: std::sync::Mutex<BTreeMap<String, Nanos>>,
    master: std::sync::Mutex<MasterSeen>,
    /// The armed watchdog, told to the master in the view and to every peer (its timeout).
    pub(super) watchdog: std::sync::RwLock<Option<crate::report::WatchdogReport>>,
    /// Where the installed set is kept, so a node that restarts while the master is away
    /// still knows its watchers (and is not reset for want of them).
    saved: Option<std::path::PathBuf>,
}

impl Peers {
    pub fn new(me: String, cred: Credential, cfg: HeartbeatConfig) -> Peers {
        Peers {
            me,
            cred,
            cfg,
            set: Default::default(),
            heard: Default::default(),
            rejected: Default::default(),
            seq: AtomicU64::new(now_ns().max(0) as u64),
            sent: Default::default(),
            served: Default::default(),
            tracked: Default::default(),
            master: Default::default(),
            watchdog: Default::default(),
            saved: None,
        }
    }

    /// Keeps installed sets in `path` and installs the one found there now, if any.
    pub fn persist_in(mut self, path: std::path::PathBuf) -> Peers {
        let kept = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<PeerSet>(&b).ok());
        self.saved = Some(path);
        if let Some(set) = kept
            && let Err(e) = self.install(set)
        {
            warn!(error = %e, "the kept peer set is refused; waiting for the leader's");
        }
        self
    }

    fn lost_after(&self) -> Nanos {
        self.cfg.lost_after.as_nanos() as Nanos
    }

    /// A new beat, remembered with its send time.
    fn beat(&self, mono: Nanos) -> u64 {
        let keep = self
            .cfg
            .master_lost_after
            .max(self.cfg.lost_after)
            .as_nanos() as Nanos;
        let mut sent = self.sent.lock_unpoisoned();
        // Drawn under the ring's lock: the heartbeat loop and a probe draw beats concurrently,
        // and the ring must stay in beat order for `sent_at`'s binary search.
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        while sent
            .front()
            .is_some_and(|(_, at)| mono.saturating_sub(*at) > keep)
            || sent.len() >= MAX_SENT
        {
            sent.pop_front();
        }
        sent.push_back((seq, mono));
        seq
    }

    /// When this node sent beat `seq`, if it is one of its own recent ones.
    fn sent_at(&self, seq: u64) -> Option<Nanos> {
        if seq == 0 {
            return None;
        }
        let sent = self.sent.lock_unpoisoned();
        sent.binary_search_by_key(&seq, |(s, _)| *s)
            .ok()
            .map(|i| sent[i].1)
    }

    /// A verified probe of the master. Returns the view, signed, answering it.
    pub fn master_probe(&self, p: MasterProbe, now: Nanos, mono: Nanos) -> SignedView {
        let MasterProbe {
            echo,
            probe,
            marked,
            mark_window,
        } = p;
        let acked = {
            let served = self.served.lock_unpoisoned();
            served
                .iter()
                .find(|v| v.beat == echo && echo != 0)
                .map(|v| (v.at, v.hears.clone()))
        };
        {
            let mut m = self.master.lock_unpoisoned();
            // The marks of a probe that echoes no recent view of this node are not taken: a
            // copy played back (its signature forgotten) or one delayed past the window marks
            // nothing, whatever its timestamp says. A mark only ever stops the feeding, so the
            // next probe, echoing a recent view, brings it.
            let recent = acked
                .as_ref()
                .is_some_and(|(at, _)| mono.saturating_sub(*at) <= mark_window);
            if let Some((at, hears)) = acked
                && m.contact.is_none_or(|c| at > c)
            {
                m.contact = Some(at);
                m.acked = hears;
            }
            if recent {
                if marked.contains(&self.me) && !m.marked.contains(&self.me) {
                    warn!("the master marked this node for fencing");
                }
                m.marked = marked;
            }
        }
        let beat = self.beat(mono);
        let hears: BTreeMap<String, u64> = self
            .heard
            .lock_unpoisoned()
            .iter()
            .filter(|(_, h)| self.alive(h, mono))
            .map(|(n, h)| (n.clone(), h.seq))
            .collect();
        {
            let mut served = self.served.lock_unpoisoned();
            if served.len() >= MAX_SERVED {
                served.pop_front();
            }
            served.push_back(Served {
                beat,
                at: mono,
                hears,
            });
        }
        self.view_with(now, mono, beat, probe)
    }

    /// Whether the master echoed a view taken within `master-lost-after` (a probe cycle and
    /// more: the echo of a view comes with the next probe).
    fn master_fresh(&self, mono: Nanos) -> bool {
        let within = self.cfg.master_lost_after.as_nanos() as Nanos;
        self.master
            .lock_unpoisoned()
            .contact
            .is_some_and(|t| mono.saturating_sub(t) <= within)
    }

    /// What the watchdog's rules read, at `mono` on this node's monotonic clock: the master's
    /// contact and mark, and each watcher's echo, vouch and mark, as send times of this node's
    /// own beats.
    pub fn feed_view(
        &self,
        mono: Nanos,
    ) -> (
        Option<Nanos>,
        bool,
        Vec<maintd_core::fencing::selffence::WatcherContact>,
    ) {
        let (contact, marked) = {
            let m = self.master.lock_unpoisoned();
            (m.contact, m.marked.contains(&self.me))
        };
        let watchers = self.set.read_unpoisoned().0.watchers.clone();
        // What each said, taken under one lock; its beats are looked up under another after.
        struct Said {
            name: String,
            alive: bool,
            echo: u64,
            vouch: u64,
            marked: bool,
        }
        let said: Vec<Said> = {
            let heard = self.heard.lock_unpoisoned();
            watchers
                .into_iter()
                .map(|name| {
                    let h = heard.get(&name);
                    let alive = h.is_some_and(|h| self.alive(h, mono));
                    Said {
                        alive,
                        echo: h.map_or(0, |h| h.echo),
                        vouch: h.map_or(0, |h| h.vouch),
                        marked: alive && h.is_some_and(|h| h.marked_me),
                        name,
                    }
                })
                .collect()
        };
        let contacts = said
            .into_iter()
            .map(|w| maintd_core::fencing::selffence::WatcherContact {
                heard: w.alive,
                echoed: self.sent_at(w.echo),
                vouched: self.sent_at(w.vouch),
                marked_me: w.marked,
                name: w.name,
            })
            .collect();
        (contact, marked, contacts)
    }

    /// Checks and installs a pushed set; forgets what was heard from nodes no longer in it.
    /// Returns the set as installed.
    pub fn install(&self, mut set: PeerSet) -> Result<PeerSet, PeerSetError> {
        set.check(&self.me)?;
        set.tidy_keys();
        let before = set.watchers.len();
        set.watchers.retain(|w| set.peers.contains_key(w));
        if set.watchers.len() < before {
            warn!(
                dropped = before - set.watchers.len(),
                "watchers that are not among the peers are ignored"
            );
        }
        let resolved = set
            .peers
            .iter()
            .map(|(name, a)| (name.clone(), SocketAddr::new(a.ip, a.port)))
            .collect();
        self.heard
            .lock_unpoisoned()
            .retain(|name, _| set.peers.contains_key(name));
        {
            let mono = crate::clock::mono_ns();
            let mut tracked = self.tracked.lock_unpoisoned();
            tracked.retain(|name, _| set.peers.contains_key(name));
            for name in set.peers.keys() {
                tracked.entry(name.clone()).or_insert(mono);
            }
        }
        if let Some(path) = &self.saved {
            let bytes = serde_json::to_vec(&set).unwrap_or_default();
            if let Err(e) = crate::fsutil::write_atomic(path, &bytes) {
                warn!(file = %path.display(), error = %e, "cannot keep the peer set");
            }
        }
        let keys = set.peer_keys();
        *self.set.write_unpoisoned() = (set.clone(), resolved, keys);
        Ok(set)
    }

    fn alive(&self, h: &Heard, mono: Nanos) -> bool {
        mono.saturating_sub(h.at_mono) <= self.lost_after()
    }

    /// What this node hears now, signed, for anyone who asks (no beat: nothing to echo).
    pub fn view(&self, now: Nanos) -> SignedView {
        self.view_with(now, crate::clock::mono_ns(), 0, 0)
    }

    fn view_with(&self, now: Nanos, mono: Nanos, beat: u64, answers: u64) -> SignedView {
        let set = self.set.read_unpoisoned().0.clone();
        let peers = {
            let heard = self.heard.lock_unpoisoned();
            let tracked = self.tracked.lock_unpoisoned();
            set.peers
                .keys()
                .map(|name| {
                    let h = heard.get(name);
                    let since = h
                        .map(|h| h.at_mono)
                        .into_iter()
                        .chain(tracked.get(name).copied())
                        .max()
                        .unwrap_or(mono);
                    let alive = h.is_some_and(|h| self.alive(h, mono));
                    // Two-way: it echoed a beat this node sent within lost-after.
                    let echoed = h.and_then(|h| self.sent_at(h.echo));
                    crate::report::heartbeat::PeerState {
                        name: name.clone(),
                        heard_at: h.map(|h| h.at),
                        alive,
                        hears_me: alive
                            && echoed.is_some_and(|t| mono.saturating_sub(t) <= self.lost_after()),
                        quiet_ms: Some((mono.saturating_sub(since) / 1_000_000) as u64),
                    }
                })
                .collect()
        };
        let rejected = self
            .rejected
            .lock_unpoisoned()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        PeerView {
            node: self.me.clone(),
            epoch: set.epoch,
            at: now,
            peers,
            rejected,
            watchdog: *self.watchdog.read_unpoisoned(),
            beat,
            answers,
        }
        .sign(self.cred.now().signer())
    }

    fn reject(&self, label: &'static str) {
        *self.rejected.lock_unpoisoned().entry(label).or_default() += 1;
    }

    /// One datagram from the network, at `now` (wall) and `mono`.
    fn receive(&self, bytes: &[u8], now: Nanos, mono: Nanos) {
        let window_s = self.cfg.window.as_secs().max(1);
        let last = |from: &str| self.heard.lock_unpoisoned().get(from).map(|h| h.seq);
        let signed = |hb: &Heartbeat| {
            let set = self.set.read_unpoisoned();
            heartbeat_signed(hb, &set.2, self.cred.now().cluster_key())
        };
        let hb = match Heartbeat::verify(bytes, signed, &self.me, last, now, window_s) {
            Ok(hb) => hb,
            Err(e) => {
                debug!(error = %e, "heartbeat refused");
                return self.reject(e.metric_label());
            }
        };
        let known = self.set.read_unpoisoned().0.peers.contains_key(&hb.from);
        if !known {
            return self.reject("stranger");
        }
        self.heard.lock_unpoisoned().insert(
            hb.from,
            Heard {
                seq: hb.seq,
                at: now,
                at_mono: mono,
                echo: hb.echo,
                vouch: hb.vouch,
                marked_me: hb.marked_you,
            },
        );
    }

    /// Sends heartbeats every interval and receives them, until the task is dropped.
    /// Poll requests on the same socket go to `polls` (none are answered without it).
    pub async fn run(
        self: Arc<Self>,
        socket: UdpSocket,
        polls: Option<Arc<super::poll::PollAnswers>>,
    ) {
        let socket = Arc::new(socket);
        let rx = {
            let me = self.clone();
            let socket = socket.clone();
            async move {
                // One byte more than the cap, so an oversized datagram is seen as such.
                let mut buf = vec![0u8; MAX_HEARTBEAT_BYTES + 1];
                loop {
                    match socket.recv_from(&mut buf).await {
                        Ok((n, from)) if crate::report::poll::is_request(&buf[..n]) => {
                            let answer = polls
                                .as_ref()
                                .and_then(|p| p.answer(&buf[..n], crate::clock::mono_ns()));
                            if let Some(a) = answer
                                && let Err(e) = socket.send_to(&a, from).await
                            {
                                debug!(error = %e, "poll answer not sent");
                            }
                        }
                        Ok((n, _)) => me.receive(&buf[..n], now_ns(), crate::clock::mono_ns()),
                        Err(e) => {
                            debug!(error = %e, "heartbeat socket");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        };
        let tx = async move {
            let mut tick = tokio::time::interval(self.cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = now_ns();
                let mono = crate::clock::mono_ns();
                let targets = self.set.read_unpoisoned().1.clone();
                // What the master saw this node hear, vouched for while the master is in touch.
                let (acked, marked) = {
                    let m = self.master.lock_unpoisoned();
                    (m.acked.clone(), m.marked.clone())
                };
                let acked = if self.master_fresh(mono) {
                    acked
                } else {
                    BTreeMap::new()
                };
                let watchdog_ms = self.watchdog.read_unpoisoned().map_or(0, |w| w.timeout_ms);
                let held = self.cred.now();
                for (name, addr) in targets {
                    let seq = self.beat(mono);
                    let echo = self.heard.lock_unpoisoned().get(&name).map_or(0, |h| h.seq);
                    let mut hb = Heartbeat::new(&self.me, &name, seq, now, echo);
                    hb.vouch = acked.get(&name).copied().unwrap_or(0);
                    hb.marked_you = marked.contains(&name);
                    hb.watchdog_ms = watchdog_ms;
                    let hb = hb.sign_as(&held).to_bytes();
                    if let Err(e) = socket.send_to(&hb, addr).await {
                        debug!(peer = %name, error = %e, "heartbeat not sent");
                    }
                }
            }
        };
        tokio::join!(rx, tx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::heartbeat::{MAX_SAFE_INTEGER, PeerAddress};

    #[test]
    fn a_peer_set_naming_this_node_or_a_bad_name_or_port_0_is_refused() {
        let key = crate::report::Key::from_bytes(vec![1; 32]);
        let p = Peers::new(
            "n1".into(),
            Credential::cluster(key.clone()),
            HeartbeatConfig::default(),
        );
        let addr = PeerAddress {
            ip: "10.0.0.2".parse().unwrap(),
            port: 1815,
        };
        let set = |name: &str, port: u16| PeerSet {
            epoch: 1,
            peers: BTreeMap::from([(name.to_string(), PeerAddress { port, ..addr })]),
            watchers: Default::default(),
            keys: Default::default(),
        };
        assert_eq!(
            p.install(set("n1", 1815)),
            Err(PeerSetError::Myself("n1".into()))
        );
        assert!(matches!(
            p.install(set("../x", 1815)),
            Err(PeerSetError::Name(_))
        ));
        assert_eq!(
            p.install(set("n2", 0)),
            Err(PeerSetError::Port("n2".into()))
        );
        let mut huge = set("n2", 1815);
        huge.epoch = MAX_SAFE_INTEGER + 1;
        assert_eq!(
            p.install(huge),
            Err(PeerSetError::Epoch(MAX_SAFE_INTEGER + 1))
        );
        assert!(p.install(set("n2", 1815)).is_ok());
        let v = p.view(now_ns()).verify(&key, "n1").unwrap();
        assert_eq!(v.epoch, 1);
        assert_eq!(v.peers.len(), 1);
        assert!(!v.peers[0].alive);
        let mut bad_keys = set("n2", 1815);
        bad_keys.keys.insert("n2".into(), vec!["ed25519:00".into()]);
        assert!(matches!(p.install(bad_keys), Err(PeerSetError::Keys(_))));
        // Keys of a node that is not a peer are dropped, as watchers are.
        let mut stranger = set("n2", 1815);
        stranger
            .keys
            .insert("n9".into(), vec!["cluster-key".into()]);
        assert!(p.install(stranger).unwrap().keys.is_empty());
        // A key that is no valid point is taken, and verifies nothing.
        let mut bad_point = set("n2", 1815);
        let not_a_point = (0u8..=255)
            .map(|b| format!("ed25519:{}", hex::encode([b; 32])))
            .find(|k| crate::report::nodekey::HeartbeatPublic::decode(k).is_none())
            .expect("some 32 equal bytes are no point");
        bad_point.keys.insert("n2".into(), vec![not_a_point]);
        let installed = p.install(bad_point).unwrap();
        assert!(installed.peer_keys()["n2"].publics.is_empty());
    }

    /// The largest set the leader can push (64 peers with the longest names, IPv6 addresses,
    /// three heartbeat keys each during a rollover, all of them watchers) fits the route's cap.
    #[test]
    fn the_largest_peer_set_fits_the_cap() {
        use crate::report::nodekey::NodeSecret;
        let secret = NodeSecret::from_bytes(&[4; 32]);
        let mut set = PeerSet {
            epoch: MAX_SAFE_INTEGER,
            ..Default::default()
        };
        for i in 0..crate::report::heartbeat::MAX_PEERS {
            let name = format!("{i:0>64}");
            let ip = "fd00:1234:5678:9abc:def0:1234:5678:9abc".parse().unwrap();
            set.peers
                .insert(name.clone(), PeerAddress { ip, port: 65535 });
            set.watchers.insert(name.clone());
            let keys = [1, 2].map(|g| secret.derive(&name, g).heartbeat_public().encode());
            set.keys
                .insert(name, [keys.to_vec(), vec!["cluster-key".into()]].concat());
        }
        let p = Peers::new(
            "me".into(),
            Credential::cluster(crate::report::Key::from_bytes(vec![1; 32])),
            HeartbeatConfig::default(),
        );
        let bytes = serde_json::to_vec(&set).unwrap();
        assert!(
            bytes.len() < super::super::probe::PEER_SET_CAP,
            "{}",
            bytes.len()
        );
        assert!(p.install(set).is_ok());
    }

    /// With keys per node, a peer accepts a heartbeat only under the sender's own public key
    /// (or the cluster key where the set still allows it): node A's key cannot speak for B, and
    /// the cluster key stops counting once the set drops it.
    #[test]
    fn a_heartbeat_counts_only_under_its_senders_own_key() {
        use crate::report::nodekey::{Held, NodeSecret};
        let secret = NodeSecret::from_bytes(&[4; 32]);
        let cluster = crate::report::Key::from_bytes(vec![1; 32]);
        let cred = |n: &str, with_cluster: bool| {
            let mut held = vec![Held::Node(secret.derive(n, 1))];
            if with_cluster {
                held.push(Held::Cluster(cluster.clone()));
            }
            Credential::new(held)
        };
        let me = Peers::new("b".into(), cred("b", true), HeartbeatConfig::default());
        let addr = PeerAddress {
            ip: "127.0.0.1".parse().unwrap(),
            port: 1815,
        };
        let public = |n: &str| secret.derive(n, 1).heartbeat_public().encode();
        let install = |a_keys: Vec<String>| {
            me.install(PeerSet {
                epoch: 1,
                peers: BTreeMap::from([("a".into(), addr), ("c".into(), addr)]),
                watchers: Default::default(),
                keys: BTreeMap::from([("a".into(), a_keys), ("c".into(), vec![public("c")])]),
            })
            .unwrap();
        };
        install(vec![public("a")]);
        let mut seq = 1;
        let mut send = |from: &str, signer: &Credential| {
            seq += 1;
            let hb = Heartbeat::new(from, "b", seq, now_ns(), 0).sign_as(&signer.now());
            me.receive(&hb.to_bytes(), now_ns(), crate::clock::mono_ns());
        };
        let heard = |n: &str| me.heard.lock_unpoisoned().contains_key(n);
        // C's key, and a cluster-key-only signature, claiming to be A: refused.
        send("a", &cred("c", false));
        send("a", &Credential::cluster(cluster.clone()));
        assert!(!heard("a"));
        assert_eq!(me.rejected.lock_unpoisoned()["signature"], 2);
        send("a", &cred("a", false));
        assert!(heard("a"));
        // While the set still lists the cluster key for C, a cluster-signed beat counts.
        send("c", &Credential::cluster(cluster.clone()));
        assert!(!heard("c"));
        install(vec![public("a"), "cluster-key".into()]);
        send("a", &Credential::cluster(cluster.clone()));
        assert_eq!(me.rejected.lock_unpoisoned()["signature"], 3);
        // A revoked peer's beats count under no key.
        install(vec![]);
        me.heard.lock_unpoisoned().clear();
        send("a", &cred("a", true));
        assert!(!heard("a"));
    }
}
