//! A key per node: the master's node-key secret, each node's HMAC key derived from it (HKDF over
//! the node's name and a generation), the Ed25519 heartbeat key derived from a node's key, and
//! the key files a collector holds. A node's key signs only that node's reports, views and
//! heartbeats; the master derives every node's key and needs no list of them.

use std::path::Path;
use std::sync::{Arc, RwLock};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::key::{read_secret, write_fresh};
use super::{Key, KeyError};
use crate::sync::RwLockExt;

/// HKDF salts: a derived key is valid for its one purpose only.
const NODE_KEY_SALT: &[u8] = b"maintd-node-key-v1";
const HEARTBEAT_KEY_SALT: &[u8] = b"maintd-heartbeat-ed25519-v1";

/// What a node key file starts with: `node:<name>:<generation>:<64 hex digits>`.
const NODE_KEY_PREFIX: &str = "node:";

/// The highest generation a node key may have (kept in 32 bits on the wire and in files).
pub const MAX_GENERATION: u32 = u32::MAX;

/// The secret only the master holds; every node's key is derived from it.
pub struct NodeSecret(Hkdf<Sha256>);

impl std::fmt::Debug for NodeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeSecret(<redacted>)")
    }
}

impl NodeSecret {
    /// Loads the secret (hex, at least 32 bytes), refusing a file group or others can read.
    pub fn load(path: &Path) -> Result<NodeSecret, KeyError> {
        let text = Zeroizing::new(read_secret(path)?);
        let bytes = Zeroizing::new(hex::decode(text.trim()).unwrap_or_default());
        if bytes.len() < 32 {
            return Err(KeyError::SecretFormat {
                path: path.display().to_string(),
            });
        }
        Ok(NodeSecret::from_bytes(&bytes))
    }

    pub fn from_bytes(bytes: &[u8]) -> NodeSecret {
        NodeSecret(Hkdf::new(Some(NODE_KEY_SALT), bytes))
    }

    /// Writes a fresh 256-bit secret, mode 0600; refuses to overwrite a file.
    pub fn generate(path: &Path) -> Result<(), KeyError> {
        write_fresh(path, "")
    }

    /// Node `node`'s key of generation `generation`. The name is length-prefixed so no two
    /// (name, generation) pairs share the input.
    pub fn derive(&self, node: &str, generation: u32) -> NodeKey {
        let mut info = Vec::with_capacity(node.len() + 12);
        info.extend_from_slice(&(node.len() as u32).to_be_bytes());
        info.extend_from_slice(node.as_bytes());
        info.extend_from_slice(&generation.to_be_bytes());
        let mut out = Zeroizing::new([0u8; 32]);
        self.0
            .expand(&info, out.as_mut())
            .expect("32 bytes is a valid HKDF-SHA256 length");
        NodeKey::new(node.to_string(), generation, &out)
    }
}

/// One node's key of one generation: its HMAC key, and the Ed25519 key its heartbeats are
/// signed with (derived from it, so one file holds both).
#[derive(Clone)]
pub struct NodeKey {
    pub node: String,
    pub generation: u32,
    bytes: Zeroizing<[u8; 32]>,
    pub mac: Key,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey({}:{}, <redacted>)", self.node, self.generation)
    }
}

impl NodeKey {
    fn new(node: String, generation: u32, bytes: &[u8; 32]) -> NodeKey {
        NodeKey {
            node,
            generation,
            bytes: Zeroizing::new(*bytes),
            mac: Key::from_bytes(bytes.to_vec()),
        }
    }

    /// The heartbeat signing key: HKDF over this key, bound to the node's name.
    pub fn heartbeat_signer(&self) -> SigningKey {
        let hk = Hkdf::<Sha256>::new(Some(HEARTBEAT_KEY_SALT), self.bytes.as_ref());
        let mut seed = Zeroizing::new([0u8; 32]);
        hk.expand(self.node.as_bytes(), seed.as_mut())
            .expect("32 bytes is a valid HKDF-SHA256 length");
        SigningKey::from_bytes(&seed)
    }

    /// The public half peers verify this node's heartbeats with, as the master hands it out.
    pub fn heartbeat_public(&self) -> HeartbeatPublic {
        HeartbeatPublic(self.heartbeat_signer().verifying_key())
    }

    /// Loads a node key file, refusing one written for another node.
    pub fn load(path: &Path, me: &str) -> Result<NodeKey, KeyError> {
        let text = Zeroizing::new(read_secret(path)?);
        let bad = || KeyError::NodeFormat {
            path: path.display().to_string(),
        };
        let rest = text.trim().strip_prefix(NODE_KEY_PREFIX).ok_or_else(bad)?;
        let mut parts = rest.splitn(3, ':');
        let (name, generation, hex) = match (parts.next(), parts.next(), parts.next()) {
            (Some(n), Some(g), Some(h)) => (n, g, h),
            _ => return Err(bad()),
        };
        let generation: u32 = generation
            .parse()
            .ok()
            .filter(|g| *g >= 1 && !generation.starts_with('0'))
            .ok_or_else(bad)?;
        let mut bytes = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(hex, bytes.as_mut()).map_err(|_| bad())?;
        if name != me {
            return Err(KeyError::OtherNode {
                path: path.display().to_string(),
                signed: name.to_string(),
                me: me.to_string(),
            });
        }
        Ok(NodeKey::new(name.to_string(), generation, &bytes))
    }

    /// Writes this key as a node key file, mode 0600; refuses to overwrite a file.
    pub fn write(&self, path: &Path) -> Result<(), KeyError> {
        super::key::write_exact(
            path,
            &format!(
                "{NODE_KEY_PREFIX}{}:{}:{}",
                self.node,
                self.generation,
                hex::encode(self.bytes.as_ref())
            ),
        )
    }
}

/// A node's heartbeat public key, written `ed25519:<64 hex digits>` in a pushed peer set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatPublic(pub VerifyingKey);

const ED25519_PREFIX: &str = "ed25519:";

/// How a peer set says that a peer's heartbeats may still be signed with the cluster key (the
/// first step of moving to a key per node).
pub const CLUSTER_KEY_ENTRY: &str = "cluster-key";

impl HeartbeatPublic {
    pub fn encode(&self) -> String {
        format!("{ED25519_PREFIX}{}", hex::encode(self.0.as_bytes()))
    }

    /// Whether `s` is written as [`HeartbeatPublic::encode`] writes: `ed25519:` and 64
    /// lower-case hex digits (whether they are a valid point is [`HeartbeatPublic::decode`]'s).
    pub fn well_formed(s: &str) -> bool {
        s.strip_prefix(ED25519_PREFIX).is_some_and(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    }

    /// The one encoding [`HeartbeatPublic::encode`] writes: lower-case hex of a valid point.
    pub fn decode(s: &str) -> Option<HeartbeatPublic> {
        if !HeartbeatPublic::well_formed(s) {
            return None;
        }
        let hex = &s[ED25519_PREFIX.len()..];
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex, &mut bytes).ok()?;
        VerifyingKey::from_bytes(&bytes).ok().map(HeartbeatPublic)
    }

    /// Strict verification (no small-order keys, a canonical `S`) of an Ed25519 signature in
    /// its one encoding, 128 lower-case hex digits.
    pub fn verify(&self, domain: &[u8], msg: &[u8], sig_hex: &str) -> bool {
        let Some(sig) = decode_signature(sig_hex) else {
            return false;
        };
        let mut signed = Vec::with_capacity(domain.len() + msg.len());
        signed.extend_from_slice(domain);
        signed.extend_from_slice(msg);
        self.0.verify_strict(&signed, &sig).is_ok()
    }
}

fn decode_signature(s: &str) -> Option<ed25519_dalek::Signature> {
    if s.len() != 128 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut bytes = [0u8; 64];
    hex::decode_to_slice(s, &mut bytes).ok()?;
    Some(ed25519_dalek::Signature::from_bytes(&bytes))
}

/// An Ed25519 signature over `domain` and `msg`, in its one encoding.
pub fn ed25519_sign(key: &SigningKey, domain: &[u8], msg: &[u8]) -> String {
    let mut signed = Vec::with_capacity(domain.len() + msg.len());
    signed.extend_from_slice(domain);
    signed.extend_from_slice(msg);
    hex::encode(key.sign(&signed).to_bytes())
}

/// One key a collector holds: the cluster key, or one of its own.
#[derive(Debug, Clone)]
pub enum Held {
    Cluster(Key),
    Node(NodeKey),
}

impl Held {
    pub fn mac(&self) -> &Key {
        match self {
            Held::Cluster(k) => k,
            Held::Node(k) => &k.mac,
        }
    }
}

/// The keys a collector holds, in the order configured: the first signs its reports and views;
/// every one is accepted on the master's requests and polls (two while a key is rolled over).
/// Heartbeats are signed with the first node key's Ed25519 key, and also with the cluster key
/// while the collector holds it (peers that have no public key for it yet still hear it).
#[derive(Debug)]
pub struct HeldKeys {
    held: Vec<Held>,
    heartbeat: Option<SigningKey>,
}

/// A collector's keys, read again on SIGHUP: clones share them, and each use takes the keys
/// in force at that moment.
#[derive(Debug, Clone)]
pub struct Credential(Arc<RwLock<Arc<HeldKeys>>>);

impl Credential {
    /// A collector holding the cluster key only (the shared-key configuration).
    pub fn cluster(key: Key) -> Credential {
        Credential::new(vec![Held::Cluster(key)])
    }

    pub fn new(held: Vec<Held>) -> Credential {
        Credential(Arc::new(RwLock::new(Arc::new(HeldKeys::new(held)))))
    }

    /// Loads `paths` for node `me`: each a node key file of this node, or the cluster key.
    pub fn load(paths: &[std::path::PathBuf], me: &str) -> Result<Credential, KeyError> {
        Ok(Credential::new(HeldKeys::read(paths, me)?))
    }

    /// Takes the keys in `paths` (SIGHUP); nothing changes if one cannot be read.
    pub fn reload(&self, paths: &[std::path::PathBuf], me: &str) -> Result<(), KeyError> {
        let fresh = Arc::new(HeldKeys::new(HeldKeys::read(paths, me)?));
        *self.0.write_unpoisoned() = fresh;
        Ok(())
    }

    /// The keys in force now.
    pub fn now(&self) -> Arc<HeldKeys> {
        self.0.read_unpoisoned().clone()
    }
}

impl HeldKeys {
    fn new(held: Vec<Held>) -> HeldKeys {
        assert!(!held.is_empty(), "a credential holds a key");
        let heartbeat = held.iter().find_map(|h| match h {
            Held::Node(k) => Some(k.heartbeat_signer()),
            Held::Cluster(_) => None,
        });
        HeldKeys { held, heartbeat }
    }

    fn read(paths: &[std::path::PathBuf], me: &str) -> Result<Vec<Held>, KeyError> {
        if paths.is_empty() {
            return Err(KeyError::NoKeys);
        }
        let mut held = Vec::with_capacity(paths.len());
        for p in paths {
            let text = Zeroizing::new(read_secret(p)?);
            held.push(if text.trim_start().starts_with(NODE_KEY_PREFIX) {
                Held::Node(NodeKey::load(p, me)?)
            } else {
                Held::Cluster(Key::load(p)?)
            });
        }
        Ok(held)
    }

    /// The key the collector signs with.
    pub fn signer(&self) -> &Key {
        self.held[0].mac()
    }

    pub fn held(&self) -> &[Held] {
        &self.held
    }

    /// The cluster key, while the collector still holds it.
    pub fn cluster_key(&self) -> Option<&Key> {
        self.held.iter().find_map(|h| match h {
            Held::Cluster(k) => Some(k),
            Held::Node(_) => None,
        })
    }

    pub fn heartbeat_signer(&self) -> Option<&SigningKey> {
        self.heartbeat.as_ref()
    }

    /// What the log says the collector signs with.
    pub fn describe(&self) -> String {
        match &self.held[0] {
            Held::Cluster(_) => super::operator::CLUSTER_KEY_ID.to_string(),
            Held::Node(k) => format!("node:{}:{}", k.node, k.generation),
        }
    }
}

impl From<Key> for Credential {
    fn from(key: Key) -> Credential {
        Credential::cluster(key)
    }
}

impl super::Verifiers for HeldKeys {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool {
        self.held.iter().any(|h| f(h.mac()))
    }
}

impl super::Verifiers for Credential {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool {
        self.now().any_key(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Verifiers;

    fn secret() -> NodeSecret {
        NodeSecret::from_bytes(&[5; 32])
    }

    #[test]
    fn each_node_and_generation_has_its_own_key() {
        let s = secret();
        let a1 = s.derive("a", 1);
        let sig = a1.mac.sign_request("x", "GET", "/", 1, b"");
        assert!(a1.mac.verify_request("x", "GET", "/", 1, b"", &sig));
        for other in [
            s.derive("b", 1),
            s.derive("a", 2),
            NodeSecret::from_bytes(&[6; 32]).derive("a", 1),
        ] {
            assert!(
                !other.mac.verify_request("x", "GET", "/", 1, b"", &sig),
                "{other:?}"
            );
            assert_ne!(other.heartbeat_public(), a1.heartbeat_public());
        }
        // Derivation is deterministic: the master needs no list of node keys.
        assert_eq!(s.derive("a", 1).heartbeat_public(), a1.heartbeat_public());
    }

    #[test]
    fn a_node_key_file_round_trips_and_speaks_only_for_its_node() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.key");
        let k = secret().derive("a", 3);
        k.write(&p).unwrap();
        assert!(k.write(&p).is_err(), "never overwritten");
        let back = NodeKey::load(&p, "a").unwrap();
        assert_eq!((back.node.as_str(), back.generation), ("a", 3));
        assert_eq!(back.heartbeat_public(), k.heartbeat_public());
        let e = NodeKey::load(&p, "b").unwrap_err().to_string();
        assert!(e.contains("node \"a\"") && e.contains("\"b\""), "{e}");
        let c = Credential::load(std::slice::from_ref(&p), "a")
            .unwrap()
            .now();
        assert_eq!(c.describe(), "node:a:3");
        assert!(c.cluster_key().is_none() && c.heartbeat_signer().is_some());
        for bad in [
            "node:a:0:".to_string() + &"00".repeat(32),
            "node:a:01:".to_string() + &"00".repeat(32),
            "node:a:1:".to_string() + &"00".repeat(31),
            "node:a:1".to_string(),
            "node:a:x:".to_string() + &"00".repeat(32),
        ] {
            let q = d.path().join("bad");
            let _ = std::fs::remove_file(&q);
            super::super::key::write_exact(&q, &bad).unwrap();
            let e = NodeKey::load(&q, "a").unwrap_err().to_string();
            assert!(e.contains("node:<name>:<generation>:"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_credential_signs_with_its_first_key_and_accepts_every_one() {
        let s = secret();
        let (old, new) = (s.derive("a", 1), s.derive("a", 2));
        let cluster = Key::from_bytes(vec![1; 32]);
        let c = Credential::new(vec![
            Held::Cluster(cluster.clone()),
            Held::Node(old.clone()),
            Held::Node(new.clone()),
        ]);
        let sig = c.now().signer().sign_request("x", "GET", "/", 1, b"");
        assert!(cluster.verify_request("x", "GET", "/", 1, b"", &sig));
        for k in [&cluster, &old.mac, &new.mac] {
            let sig = k.sign_request("x", "GET", "/", 1, b"");
            assert!(c.any_key(&mut |k| k.verify_request("x", "GET", "/", 1, b"", &sig)));
        }
        let stranger = s.derive("b", 1).mac.sign_request("x", "GET", "/", 1, b"");
        assert!(!c.any_key(&mut |k| k.verify_request("x", "GET", "/", 1, b"", &stranger)));
        // The first node key signs heartbeats.
        assert_eq!(
            HeartbeatPublic(c.now().heartbeat_signer().unwrap().verifying_key()),
            old.heartbeat_public()
        );
        // A reload takes effect for every clone at once; a bad file changes nothing.
        let d = tempfile::tempdir().unwrap();
        let (p, bad) = (d.path().join("new.key"), d.path().join("bad.key"));
        new.write(&p).unwrap();
        let clone = c.clone();
        assert!(c.reload(&[bad], "a").is_err());
        assert_eq!(clone.now().describe(), "cluster-key");
        c.reload(&[p], "a").unwrap();
        assert_eq!(clone.now().describe(), "node:a:2");
        assert!(!clone.any_key(&mut |k| k.verify_request("x", "GET", "/", 1, b"", &sig)));
    }

    #[test]
    fn a_heartbeat_signature_and_public_key_have_one_encoding() {
        let k = secret().derive("a", 1);
        let public = k.heartbeat_public();
        let text = public.encode();
        assert_eq!(HeartbeatPublic::decode(&text), Some(public));
        assert_eq!(HeartbeatPublic::decode(&text.to_uppercase()), None);
        assert_eq!(HeartbeatPublic::decode(&text.replace("ed25519:", "")), None);
        let sig = ed25519_sign(&k.heartbeat_signer(), b"d", b"m");
        assert!(public.verify(b"d", b"m", &sig));
        assert!(!public.verify(b"e", b"m", &sig));
        assert!(!public.verify(b"d", b"m", &sig.to_uppercase()));
        assert!(!public.verify(b"d", b"m", &format!("{sig} ")));
        let other = secret().derive("b", 1).heartbeat_public();
        assert!(!other.verify(b"d", b"m", &sig));
    }
}
