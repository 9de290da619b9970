//! Peer heartbeats on the wire: one small signed UDP datagram from a node to each of its peers.
//! It names sender and recipient, carries a per-sender counter (the beat) and the send time, and
//! echoes the latest beat of the recipient the sender heard, so the recipient judges two-way
//! contact by a round trip on its own clock, never by when a message arrived. A heartbeat is
//! checked like a report: size first, then signature, recipient, freshness and a strictly
//! increasing counter, so a forged or replayed one neither keeps a dead node "alive" nor makes a
//! live one "dead".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::nodekey::{CLUSTER_KEY_ENTRY, HeartbeatPublic, HeldKeys, ed25519_sign};
use super::{Key, age_ns};

/// Domain separator: a heartbeat signature is valid for nothing else.
const HEARTBEAT_DOMAIN: &[u8] = b"maintd-heartbeat-v1\n";

/// Version 2 echoes beats; version 1 said "I hear you" by arrival, which a delay could fake.
pub const HEARTBEAT_VERSION: u32 = 2;

/// A datagram larger than this is dropped unread.
pub const MAX_HEARTBEAT_BYTES: usize = 2048;

/// Peers one node may have (the nodes that watch it and those it watches, together).
pub const MAX_PEERS: usize = 64;

/// The longest node name a peer set may hold.
pub const MAX_NAME: usize = 64;

fn valid_peer_name(name: &str) -> bool {
    name.len() <= MAX_NAME && crate::exec::validate_name(name).is_ok()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Format version.
    pub v: u32,
    pub from: String,
    pub to: String,
    /// Strictly increasing per sender (a restarted sender starts above its last value: the
    /// counter is seeded from the clock).
    pub seq: u64,
    /// Send time, ns since the epoch.
    pub ts: i64,
    /// The latest beat (`seq`) of the recipient the sender accepted; 0 for none. The recipient
    /// counts contact from when it sent that beat, so a late or replayed heartbeat echoes an old
    /// beat and proves nothing about now.
    #[serde(default)]
    pub echo: u64,
    /// A beat of the recipient the sender heard before taking a view of its peers that the
    /// master has since acknowledged (echoed in its signed probe); 0 for none. The master has
    /// then seen this sender say it hears the recipient: the recipient is partitioned from the
    /// master, never judged dead, for as long as this beat is recent.
    #[serde(default)]
    pub vouch: u64,
    /// The master told the sender that the recipient is marked for fencing: a node whose own
    /// traffic does not get out still learns it, and stops feeding its watchdog.
    #[serde(default)]
    pub marked_you: bool,
    /// The sender's watchdog timeout in ms; 0 when it has no armed watchdog.
    #[serde(default)]
    pub watchdog_ms: u64,
    /// HMAC-SHA256 over everything else under the cluster key, hex; sent only while the sender
    /// holds the cluster key (the shared-key configuration, and the move away from it).
    #[serde(default)]
    pub sig: String,
    /// Ed25519 over everything else under the sender's own heartbeat key, hex; its peers hold
    /// only the public half, which the master hands out with the peer set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ed: String,
}

/// Why a heartbeat is refused; each is counted under its label.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("heartbeat is {size} bytes, over the {MAX_HEARTBEAT_BYTES}-byte cap")]
    TooLarge { size: usize },
    #[error("not a heartbeat: {0}")]
    Malformed(String),
    #[error("heartbeat signature does not verify")]
    BadSignature,
    #[error("heartbeat for {to:?} reached {me:?}")]
    WrongRecipient { to: String, me: String },
    #[error("heartbeat from {from:?} is {age_s:.1} s away from now")]
    Stale { from: String, age_s: f64 },
    #[error("heartbeat {seq} from {from:?} is not above the last accepted {last} (replay?)")]
    Replay { from: String, seq: u64, last: u64 },
}

impl HeartbeatError {
    /// The `reason` label of the rejection counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            HeartbeatError::TooLarge { .. } => "size",
            HeartbeatError::Malformed(_) => "malformed",
            HeartbeatError::BadSignature => "signature",
            HeartbeatError::WrongRecipient { .. } => "recipient",
            HeartbeatError::Stale { .. } => "stale",
            HeartbeatError::Replay { .. } => "replay",
        }
    }
}

impl Heartbeat {
    pub fn new(from: &str, to: &str, seq: u64, ts: i64, echo: u64) -> Heartbeat {
        Heartbeat {
            v: HEARTBEAT_VERSION,
            from: from.into(),
            to: to.into(),
            seq,
            ts,
            echo,
            vouch: 0,
            marked_you: false,
            watchdog_ms: 0,
            sig: String::new(),
            ed: String::new(),
        }
    }

    /// Fields are length-prefixed, so no choice of names can shift bytes between fields.
    fn signing_bytes(&self) -> Vec<u8> {
        format!(
            "{}\n{}:{}\n{}:{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.v,
            self.from.len(),
            self.from,
            self.to.len(),
            self.to,
            self.seq,
            self.ts,
            self.echo,
            self.vouch,
            self.marked_you,
            self.watchdog_ms
        )
        .into_bytes()
    }

    /// Signed with the cluster key only (the shared-key configuration).
    pub fn sign(mut self, key: &Key) -> Heartbeat {
        self.sig = key.sign(HEARTBEAT_DOMAIN, &[&self.signing_bytes()]);
        self
    }

    /// Signed with what the collector holds: its own heartbeat key, and the cluster key while
    /// it still holds it.
    pub fn sign_as(mut self, cred: &HeldKeys) -> Heartbeat {
        let bytes = self.signing_bytes();
        if let Some(k) = cred.cluster_key() {
            self.sig = k.sign(HEARTBEAT_DOMAIN, &[&bytes]);
        }
        if let Some(k) = cred.heartbeat_signer() {
            self.ed = ed25519_sign(k, HEARTBEAT_DOMAIN, &bytes);
        }
        self
    }

    /// Whether the cluster key signed it.
    pub fn cluster_signed(&self, key: &Key) -> bool {
        key.verify(HEARTBEAT_DOMAIN, &[&self.signing_bytes()], &self.sig)
    }

    /// Whether the holder of `public` signed it.
    pub fn signed_by(&self, public: &HeartbeatPublic) -> bool {
        public.verify(HEARTBEAT_DOMAIN, &self.signing_bytes(), &self.ed)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        // A heartbeat of strings and integers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Checks a received datagram for `me`. `last_seq` is the sender's last accepted counter,
    /// which the caller looks up by the (then verified) sender.
    /// `signed` says whether the heartbeat's signature is one its sender may make.
    pub fn verify(
        bytes: &[u8],
        signed: impl FnOnce(&Heartbeat) -> bool,
        me: &str,
        last_seq: impl FnOnce(&str) -> Option<u64>,
        now_ns: i64,
        window_s: u64,
    ) -> Result<Heartbeat, HeartbeatError> {
        if bytes.len() > MAX_HEARTBEAT_BYTES {
            return Err(HeartbeatError::TooLarge { size: bytes.len() });
        }
        let hb: Heartbeat =
            serde_json::from_slice(bytes).map_err(|e| HeartbeatError::Malformed(e.to_string()))?;
        if hb.v != HEARTBEAT_VERSION {
            return Err(HeartbeatError::Malformed(format!(
                "unknown version {}",
                hb.v
            )));
        }
        if !signed(&hb) {
            return Err(HeartbeatError::BadSignature);
        }
        if hb.to != me {
            return Err(HeartbeatError::WrongRecipient {
                to: hb.to,
                me: me.into(),
            });
        }
        let age = age_ns(now_ns, hb.ts);
        if age > window_s.saturating_mul(1_000_000_000) {
            return Err(HeartbeatError::Stale {
                from: hb.from,
                age_s: age as f64 / 1e9,
            });
        }
        if let Some(last) = last_seq(&hb.from)
            && hb.seq <= last
        {
            return Err(HeartbeatError::Replay {
                from: hb.from,
                seq: hb.seq,
                last,
            });
        }
        Ok(hb)
    }
}

/// The largest integer every JSON reader (JavaScript included) reads exactly.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Where a peer's collector listens; heartbeats go to the same port over UDP. The leader sends
/// addresses, not names, so a pushed set never makes a collector wait on DNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAddress {
    pub ip: std::net::IpAddr,
    #[serde(deserialize_with = "integral")]
    pub port: u16,
}

/// JSON has one number type: `1815.0` is the integer 1815 (as JSON Schema counts it), while a
/// fraction or a value out of range is refused.
fn integral<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = serde_json::Number::deserialize(d)?;
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => Some(u),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    whole
        .and_then(|u| T::try_from(u).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("{n} is not an integer in range")))
}

/// The peer set the leader pushes, by node name; `epoch` lets it see which set a collector
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PeerSet {
    #[serde(deserialize_with = "integral")]
    pub epoch: u64,
    pub peers: BTreeMap<String, PeerAddress>,
    /// The peers that watch this node (its self-fencing counts their contact). A name that is
    /// not among `peers` is dropped on install: the node could never hear it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub watchers: std::collections::BTreeSet<String>,
    /// What each peer's heartbeats may be signed with: its Ed25519 public keys
    /// (`ed25519:<hex>`, two while its key is rolled over) and `cluster-key` while it may still
    /// sign with the cluster key. Empty in the shared-key configuration, where every heartbeat
    /// is checked under the cluster key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, Vec<String>>,
}

/// Keys one peer may have in a set: two generations and the cluster key.
pub const MAX_PEER_KEYS: usize = 3;

/// Why a pushed peer set is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PeerSetError {
    #[error("at most {MAX_PEERS} peers")]
    TooMany,
    #[error("peer {0:?} is this node")]
    Myself(String),
    #[error("peer name {0:?} must be 1-64 characters of [A-Za-z0-9._-]")]
    Name(String),
    #[error("peer {0}: port 0")]
    Port(String),
    #[error("epoch {0} is above JSON's safe integers (2^53 - 1)")]
    Epoch(u64),
    #[error(
        "keys of {0:?}: at most {MAX_PEER_KEYS}, each `cluster-key` or `ed25519:` and 64 lower-case hex digits"
    )]
    Keys(String),
}

impl PeerSet {
    /// Checks a set pushed to node `me`: at most `MAX_PEERS`, never `me`, names a collector
    /// accepts, no port 0, an epoch every JSON reader reads exactly.
    pub fn check(&self, me: &str) -> Result<(), PeerSetError> {
        if self.peers.len() > MAX_PEERS || self.watchers.len() > MAX_PEERS {
            return Err(PeerSetError::TooMany);
        }
        if self.epoch > MAX_SAFE_INTEGER {
            return Err(PeerSetError::Epoch(self.epoch));
        }
        for (name, addr) in &self.peers {
            if name == me {
                return Err(PeerSetError::Myself(name.clone()));
            }
            if !valid_peer_name(name) {
                return Err(PeerSetError::Name(name.clone()));
            }
            if addr.port == 0 {
                return Err(PeerSetError::Port(name.clone()));
            }
        }
        if let Some(w) = self.watchers.iter().find(|w| !valid_peer_name(w)) {
            return Err(PeerSetError::Name(w.clone()));
        }
        if self.keys.len() > MAX_PEERS {
            return Err(PeerSetError::TooMany);
        }
        for (name, entries) in &self.keys {
            // A name that is not a peer is dropped on install, as a watcher's is.
            let valid = |e: &String| e == CLUSTER_KEY_ENTRY || HeartbeatPublic::well_formed(e);
            if entries.len() > MAX_PEER_KEYS || !entries.iter().all(valid) {
                return Err(PeerSetError::Keys(name.clone()));
            }
        }
        Ok(())
    }
}

/// Domain separator of a collector's signed peer view.
const VIEW_DOMAIN: &[u8] = b"maintd-peer-view-v1\n";

/// What one node hears of its peers, as it serves it to the leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PeerView {
    pub node: String,
    /// The peer set it holds (the leader pushes it again when this differs).
    pub epoch: u64,
    /// When the view was taken, ns since the epoch.
    pub at: i64,
    pub peers: Vec<PeerState>,
    /// Refused heartbeats, by reason.
    pub rejected: std::collections::BTreeMap<String, u64>,
    /// The node's armed watchdog and self-fencing times; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<super::WatchdogReport>,
    /// This view's beat, for the master to echo in its next probe (the node's round trip with
    /// the master); 0 when the view answers no signed probe.
    #[serde(default)]
    pub beat: u64,
    /// The `probe` number of the signed probe this view answers; 0 for none. The master takes
    /// only a view that answers the probe it just sent, so a view is never older than its
    /// probe, however an attacker delays or replays it.
    #[serde(default)]
    pub answers: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PeerState {
    pub name: String,
    pub heard_at: Option<i64>,
    /// Heard within `lost-after`.
    pub alive: bool,
    /// Alive, and its last heartbeat echoed a beat this node sent within `lost-after`: contact
    /// both ways.
    pub hears_me: bool,
    /// For how long, by this node's monotonic clock, nothing has been received from the peer
    /// (since its last heartbeat, or since this node began to track it): what the master proves
    /// a silent node's reset from, with no clock compared across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_ms: Option<u64>,
}

/// A view as served: the view's JSON text and its signature, so the bytes signed are the bytes
/// verified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedView {
    pub view: String,
    pub sig: String,
}

/// Why a served view is not trusted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ViewError {
    #[error("peer view signature does not verify")]
    BadSignature,
    #[error("peer view is not valid: {0}")]
    Malformed(String),
    #[error("peer view is of {signed:?}, expected {expected:?}")]
    WrongNode { signed: String, expected: String },
}

impl PeerView {
    pub fn sign(&self, key: &Key) -> SignedView {
        // A view of strings and integers always serializes.
        let view = serde_json::to_string(self).unwrap_or_default();
        let sig = key.sign(VIEW_DOMAIN, &[view.as_bytes()]);
        SignedView { view, sig }
    }
}

impl SignedView {
    pub fn verify(
        &self,
        keys: &(impl super::Verifiers + ?Sized),
        node: &str,
    ) -> Result<PeerView, ViewError> {
        if !keys.any_key(&mut |k| k.verify(VIEW_DOMAIN, &[self.view.as_bytes()], &self.sig)) {
            return Err(ViewError::BadSignature);
        }
        let v: PeerView =
            serde_json::from_str(&self.view).map_err(|e| ViewError::Malformed(e.to_string()))?;
        if v.node != node {
            return Err(ViewError::WrongNode {
                signed: v.node,
                expected: node.into(),
            });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_800_000_000_000_000_000;

    fn key() -> Key {
        Key::from_bytes(vec![9; 32])
    }

    fn beat(seq: u64, ts: i64) -> Vec<u8> {
        Heartbeat::new("n1", "n2", seq, ts, 41)
            .sign(&key())
            .to_bytes()
    }

    fn check(bytes: &[u8], last: Option<u64>) -> Result<Heartbeat, HeartbeatError> {
        Heartbeat::verify(
            bytes,
            |hb| hb.cluster_signed(&key()),
            "n2",
            |_| last,
            NOW,
            5,
        )
    }

    #[test]
    fn integral_numbers_are_integers_and_fractions_are_not() {
        let set = |epoch: &str, port: &str| {
            serde_json::from_str::<PeerSet>(&format!(
                r#"{{"epoch":{epoch},"peers":{{"n2":{{"ip":"10.0.0.2","port":{port}}}}}}}"#
            ))
        };
        let s = set("471.0", "1815.0").unwrap();
        assert_eq!((s.epoch, s.peers["n2"].port), (471, 1815));
        assert!(set("1.5", "1815").is_err());
        assert!(set("1", "70000").is_err());
        assert!(set("-1", "1815").is_err());
    }

    #[test]
    fn a_signed_heartbeat_verifies_once_per_counter() {
        let hb = check(&beat(7, NOW), Some(6)).unwrap();
        assert_eq!((hb.from.as_str(), hb.seq), ("n1", 7));
        assert_eq!((hb.echo, hb.vouch), (41, 0));
        let replay = check(&beat(7, NOW), Some(7)).unwrap_err();
        assert_eq!(replay.metric_label(), "replay");
        assert!(check(&beat(5, NOW), Some(7)).is_err());
    }

    #[test]
    fn forged_misrouted_stale_and_oversized_heartbeats_are_refused_with_their_reason() {
        let forged = Heartbeat::new("n1", "n2", 1, NOW, 0)
            .sign(&Key::from_bytes(vec![1; 32]))
            .to_bytes();
        assert_eq!(
            check(&forged, None).unwrap_err().metric_label(),
            "signature"
        );
        let mut tampered = Heartbeat::new("n1", "n2", 1, NOW, 0).sign(&key());
        tampered.vouch = 1;
        assert_eq!(
            check(&tampered.to_bytes(), None)
                .unwrap_err()
                .metric_label(),
            "signature"
        );
        let elsewhere = Heartbeat::new("n1", "n4", 1, NOW, 0)
            .sign(&key())
            .to_bytes();
        assert_eq!(
            check(&elsewhere, None).unwrap_err().metric_label(),
            "recipient"
        );
        assert_eq!(
            check(&beat(1, NOW - 6_000_000_000), None)
                .unwrap_err()
                .metric_label(),
            "stale"
        );
        assert_eq!(
            check(&vec![b' '; MAX_HEARTBEAT_BYTES + 1], None)
                .unwrap_err()
                .metric_label(),
            "size"
        );
        assert_eq!(check(b"{}", None).unwrap_err().metric_label(), "malformed");
    }

    #[test]
    fn a_peer_view_verifies_for_its_node_only() {
        let v = PeerView {
            node: "n1".into(),
            epoch: 3,
            at: NOW,
            peers: vec![PeerState {
                name: "n2".into(),
                heard_at: Some(NOW),
                alive: true,
                hears_me: true,
                quiet_ms: Some(150),
            }],
            rejected: Default::default(),
            watchdog: None,
            beat: 12,
            answers: 3,
        };
        let s = v.sign(&key());
        assert_eq!(s.verify(&key(), "n1").unwrap(), v);
        assert!(matches!(
            s.verify(&key(), "n2"),
            Err(ViewError::WrongNode { .. })
        ));
        let mut forged = s.clone();
        forged.view = forged.view.replace("true", "false");
        assert_eq!(forged.verify(&key(), "n1"), Err(ViewError::BadSignature));
    }

    #[test]
    fn what_a_heartbeat_echoes_vouches_and_says_of_the_watchdog_is_signed() {
        let mut hb = Heartbeat::new("n1", "n2", 7, NOW, 41);
        hb.vouch = 40;
        hb.watchdog_ms = 10_000;
        let bytes = hb.sign(&key()).to_bytes();
        let ok = check(&bytes, None).unwrap();
        assert!(ok.vouch == 40 && !ok.marked_you && ok.watchdog_ms == 10_000);
        for (from, to) in [
            ("\"echo\":41", "\"echo\":42"),
            ("\"vouch\":40", "\"vouch\":42"),
            ("\"marked_you\":false", "\"marked_you\":true"),
            ("\"watchdog_ms\":10000", "\"watchdog_ms\":0"),
        ] {
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(text.contains(from), "{text}");
            let forged = text.replace(from, to);
            assert_eq!(
                check(forged.as_bytes(), None),
                Err(HeartbeatError::BadSignature),
                "{to}"
            );
        }
    }

    #[test]
    fn a_name_cannot_borrow_bytes_from_the_next_field() {
        let a = Heartbeat::new("n1", "n2x", 1, NOW, 0);
        let b = Heartbeat::new("n1n", "2x", 1, NOW, 0);
        assert_ne!(a.signing_bytes(), b.signing_bytes());
    }

    proptest! {
        #[test]
        fn arbitrary_datagrams_never_panic_and_never_verify(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            prop_assert!(check(&bytes, None).is_err());
        }

        #[test]
        fn any_single_byte_change_is_caught(seq in 1u64..1_000_000, pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut bytes = beat(seq, NOW);
            let i = pos.index(bytes.len());
            bytes[i] ^= 1 << bit;
            // Either it no longer parses or verifies, or the flip changed nothing that is
            // signed (the case of a hex digit of the signature).
            if let Ok(hb) = check(&bytes, None) {
                let orig = check(&beat(seq, NOW), None).unwrap();
                prop_assert_eq!(
                    (hb.from, hb.to, hb.seq, hb.ts, hb.echo, hb.vouch),
                    (orig.from, orig.to, orig.seq, orig.ts, orig.echo, orig.vouch)
                );
            }
        }
    }
}
