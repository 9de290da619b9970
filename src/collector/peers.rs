//! Peer heartbeats, the node's side (issue 13 §1). The leader tells each collector its peers
//! (signed `PUT /1/peers`: the nodes that watch it and the nodes it watches). The collector then
//! sends every peer a signed heartbeat each `interval` over UDP, on its own port number but apart
//! from the HTTP listener, so a flood of HTTP connections does not silence it. It accepts
//! heartbeats only from its peers, refuses and counts forged, stale, replayed and misrouted ones,
//! and serves what it hears as a signed view (`GET /1/peers`). Memory is bounded by the peer set:
//! a stranger's datagram creates nothing.

use std::collections::{BTreeMap, BTreeSet};
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
use crate::report::{Key, now_ns};
use crate::sync::{LockExt, RwLockExt};
use crate::verdict::Nanos;

struct Heard {
    seq: u64,
    at: Nanos,
    hears_me: bool,
    master_ok: bool,
    marked_me: bool,
}

/// What the master's last signed probe said.
#[derive(Default)]
struct MasterSeen {
    /// When a probe last said the master hears this node (contact both ways).
    contact: Option<Nanos>,
    /// The nodes the master has marked for fencing, as of its last probe.
    marked: BTreeSet<String>,
}

pub struct Peers {
    me: String,
    key: Key,
    cfg: HeartbeatConfig,
    set: std::sync::RwLock<(PeerSet, Vec<(String, SocketAddr)>)>,
    heard: std::sync::Mutex<BTreeMap<String, Heard>>,
    rejected: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    /// Seeded from the clock, so a restarted collector continues above what its peers accepted.
    seq: AtomicU64,
    master: std::sync::Mutex<MasterSeen>,
    /// The armed watchdog, told to the master in the view and to every peer (its timeout).
    pub(super) watchdog: std::sync::RwLock<Option<crate::report::WatchdogReport>>,
    /// Where the installed set is kept, so a node that restarts while the master is away
    /// still knows its watchers (and is not reset for want of them).
    saved: Option<std::path::PathBuf>,
}

impl Peers {
    pub fn new(me: String, key: Key, cfg: HeartbeatConfig) -> Peers {
        Peers {
            me,
            key,
            cfg,
            set: Default::default(),
            heard: Default::default(),
            rejected: Default::default(),
            seq: AtomicU64::new(now_ns().max(0) as u64),
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

    /// A verified probe of the master: `hears` says the master hears this node.
    pub fn master_probe(&self, hears: bool, marked: BTreeSet<String>, now: Nanos) {
        let mut m = self.master.lock_unpoisoned();
        if hears {
            m.contact = Some(now);
        }
        if marked.contains(&self.me) && !m.marked.contains(&self.me) {
            warn!("the master marked this node for fencing");
        }
        m.marked = marked;
    }

    fn master_fresh(&self, now: Nanos) -> bool {
        self.master
            .lock_unpoisoned()
            .contact
            .is_some_and(|t| now.saturating_sub(t) <= self.cfg.lost_after.as_nanos() as Nanos)
    }

    /// What the watchdog's rules read: the master's contact and mark, and each watcher's.
    pub fn feed_view(
        &self,
        now: Nanos,
    ) -> (
        Option<Nanos>,
        bool,
        Vec<crate::fencing::selffence::WatcherContact>,
    ) {
        let (contact, marked) = {
            let m = self.master.lock_unpoisoned();
            (m.contact, m.marked.contains(&self.me))
        };
        let watchers = self.set.read_unpoisoned().0.watchers.clone();
        let heard = self.heard.lock_unpoisoned();
        let contacts = watchers
            .into_iter()
            .map(|name| {
                let h = heard.get(&name).filter(|h| self.alive(h, now));
                crate::fencing::selffence::WatcherContact {
                    heard: h.is_some(),
                    two_way: h.is_some_and(|h| h.hears_me),
                    master_ok: h.is_some_and(|h| h.master_ok),
                    marked_me: h.is_some_and(|h| h.marked_me),
                    name,
                }
            })
            .collect();
        (contact, marked, contacts)
    }

    /// Checks and installs a pushed set; forgets what was heard from nodes no longer in it.
    /// Returns the set as installed.
    pub fn install(&self, mut set: PeerSet) -> Result<PeerSet, PeerSetError> {
        set.check(&self.me)?;
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
        if let Some(path) = &self.saved {
            let bytes = serde_json::to_vec(&set).unwrap_or_default();
            if let Err(e) = crate::fsutil::write_atomic(path, &bytes) {
                warn!(file = %path.display(), error = %e, "cannot keep the peer set");
            }
        }
        *self.set.write_unpoisoned() = (set.clone(), resolved);
        Ok(set)
    }

    fn alive(&self, h: &Heard, now: Nanos) -> bool {
        now.saturating_sub(h.at) <= self.cfg.lost_after.as_nanos() as Nanos
    }

    /// What this node hears now, signed for the leader.
    pub fn view(&self, now: Nanos) -> SignedView {
        let (set, _) = self.set.read_unpoisoned().clone();
        let heard = self.heard.lock_unpoisoned();
        let peers = set
            .peers
            .keys()
            .map(|name| {
                let h = heard.get(name);
                crate::report::heartbeat::PeerState {
                    name: name.clone(),
                    heard_at: h.map(|h| h.at),
                    alive: h.is_some_and(|h| self.alive(h, now)),
                    hears_me: h.is_some_and(|h| self.alive(h, now) && h.hears_me),
                }
            })
            .collect();
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
        }
        .sign(&self.key)
    }

    fn reject(&self, label: &'static str) {
        *self.rejected.lock_unpoisoned().entry(label).or_default() += 1;
    }

    /// One datagram from the network.
    fn receive(&self, bytes: &[u8], now: Nanos) {
        let window_s = self.cfg.window.as_secs().max(1);
        let last = |from: &str| self.heard.lock_unpoisoned().get(from).map(|h| h.seq);
        let hb = match Heartbeat::verify(bytes, &self.key, &self.me, last, now, window_s) {
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
                hears_me: hb.hears_you,
                master_ok: hb.master_ok,
                marked_me: hb.marked_you,
            },
        );
    }

    /// Whether `peer` was heard within `lost-after`, told to it in the next heartbeat.
    fn hears(&self, peer: &str, now: Nanos) -> bool {
        self.heard
            .lock_unpoisoned()
            .get(peer)
            .is_some_and(|h| self.alive(h, now))
    }

    /// Sends heartbeats every interval and receives them, until the task is dropped.
    pub async fn run(self: Arc<Self>, socket: UdpSocket) {
        let socket = Arc::new(socket);
        let rx = {
            let me = self.clone();
            let socket = socket.clone();
            async move {
                // One byte more than the cap, so an oversized datagram is seen as such.
                let mut buf = vec![0u8; MAX_HEARTBEAT_BYTES + 1];
                loop {
                    match socket.recv_from(&mut buf).await {
                        Ok((n, _)) => me.receive(&buf[..n], now_ns()),
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
                let targets = self.set.read_unpoisoned().1.clone();
                let master_ok = self.master_fresh(now);
                let marked = self.master.lock_unpoisoned().marked.clone();
                let watchdog_ms = self.watchdog.read_unpoisoned().map_or(0, |w| w.timeout_ms);
                for (name, addr) in targets {
                    let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut hb = Heartbeat::new(&self.me, &name, seq, now, self.hears(&name, now));
                    hb.master_ok = master_ok;
                    hb.marked_you = marked.contains(&name);
                    hb.watchdog_ms = watchdog_ms;
                    let hb = hb.sign(&self.key).to_bytes();
                    if let Err(e) = socket.send_to(&hb, addr).await {
                        debug!(peer = %name, error = %e, "heartbeat not sent");
                    }
                }
            }
        };
        tokio::join!(rx, tx);
    }
}

/// Binds the heartbeat socket on the collector's own address (UDP).
pub async fn bind(listen: SocketAddr) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(listen).await.inspect_err(|e| {
        warn!(listen = %listen, error = %e, "cannot bind the heartbeat socket");
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::heartbeat::{MAX_SAFE_INTEGER, PeerAddress};

    #[test]
    fn a_peer_set_naming_this_node_or_a_bad_name_or_port_0_is_refused() {
        let p = Peers::new(
            "n1".into(),
            Key::from_bytes(vec![1; 32]),
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
        let v = p.view(now_ns()).verify(&p.key, "n1").unwrap();
        assert_eq!(v.epoch, 1);
        assert_eq!(v.peers.len(), 1);
        assert!(!v.peers[0].alive);
    }
}
