//! The master's keys for its nodes: which generation of each node's key it signs with and which
//! it accepts (two during a rollover), generation 0 being the cluster key of the shared-key
//! configuration; revoked nodes; the heartbeat public keys it hands out with peer sets. Read
//! again on SIGHUP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Deserialize;

use super::Key;
use super::nodekey::{CLUSTER_KEY_ENTRY, NodeKey, NodeSecret};
use crate::sync::{LockExt, RwLockExt};

/// `[daemon.node-keys]`: a key per node, derived from a secret only the master holds.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeKeysConfig {
    /// The master's node-key secret. Without it every node signs with the cluster key (the
    /// shared-key configuration) and the rest of this table is unused.
    pub secret_file: Option<PathBuf>,
    /// The generation of every node's key the master signs with and accepts; 0 is the cluster
    /// key.
    pub generation: u32,
    /// Also accepted (never signed with) while nodes move to `generation`.
    pub previous: Option<u32>,
    /// Nodes whose keys are refused whatever they sign, counted as refusals.
    pub revoked: BTreeSet<String>,
    /// Per node: its own `generation` and `previous`, for rolling one node's key over.
    pub nodes: BTreeMap<String, NodeGenerations>,
}

impl Default for NodeKeysConfig {
    fn default() -> Self {
        NodeKeysConfig {
            secret_file: None,
            generation: 1,
            previous: None,
            revoked: BTreeSet::new(),
            nodes: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeGenerations {
    pub generation: u32,
    pub previous: Option<u32>,
}

impl NodeKeysConfig {
    /// Whether any node's accepted keys include the cluster key.
    pub fn accepts_cluster_key(&self) -> bool {
        self.secret_file.is_none()
            || [Some(self.generation), self.previous]
                .into_iter()
                .chain(
                    self.nodes
                        .values()
                        .flat_map(|g| [Some(g.generation), g.previous]),
                )
                .any(|g| g == Some(0))
    }
}

/// Why the master has no key for a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeKeyError {
    #[error("node {0:?}'s key is revoked (daemon.node-keys.revoked)")]
    Revoked(String),
}

struct Ring {
    cluster: Key,
    secret: Option<NodeSecret>,
    cfg: NodeKeysConfig,
    /// Derived keys, by node and generation: derivation is cheap, the Ed25519 public key is not.
    derived: std::sync::Mutex<HashMap<(String, u32), NodeKey>>,
}

/// Derived keys kept at most; beyond this the cache starts again (names come from the
/// membership, which is trusted, but it changes over a long run).
const DERIVED_CAP: usize = 1 << 16;

impl Ring {
    fn generations(&self, node: &str) -> Result<(u32, Option<u32>), NodeKeyError> {
        if self.secret.is_none() {
            return Ok((0, None));
        }
        if self.cfg.revoked.contains(node) {
            return Err(NodeKeyError::Revoked(node.to_string()));
        }
        Ok(match self.cfg.nodes.get(node) {
            Some(g) => (g.generation, g.previous),
            None => (self.cfg.generation, self.cfg.previous),
        })
    }

    /// The node key of `generation` (≥ 1; only called with a secret), kept for next time.
    fn derived(&self, node: &str, generation: u32) -> NodeKey {
        self.derived_keeping(node, generation, true)
    }

    /// The same; `keep` false for a name an unauthenticated request chose, which must not fill
    /// the cache (or empty it of the members' keys).
    fn derived_keeping(&self, node: &str, generation: u32, keep: bool) -> NodeKey {
        let secret = self
            .secret
            .as_ref()
            .expect("generations ≥ 1 only with a secret");
        let mut cache = self.derived.lock_unpoisoned();
        if let Some(k) = cache.get(&(node.to_string(), generation)) {
            return k.clone();
        }
        if !keep {
            drop(cache);
            return secret.derive(node, generation);
        }
        if cache.len() >= DERIVED_CAP {
            cache.clear();
        }
        let k = secret.derive(node, generation);
        cache.insert((node.to_string(), generation), k.clone());
        k
    }

    fn mac(&self, node: &str, generation: u32, keep: bool) -> Key {
        if generation == 0 {
            self.cluster.clone()
        } else {
            self.derived_keeping(node, generation, keep).mac
        }
    }
}

/// The master's keyring, shared by the poll, the probe, live repairs and the API.
pub struct Keyring {
    ring: RwLock<Arc<Ring>>,
    /// Moves on every reload, so peer sets are built again with the new public keys.
    version: AtomicU64,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keyring(<redacted>)")
    }
}

impl Keyring {
    /// Every node signs with the cluster key.
    pub fn cluster(key: Key) -> Keyring {
        Keyring::with(key, None, NodeKeysConfig::default())
    }

    /// [`Keyring::cluster`], shared.
    pub fn arc(key: Key) -> Arc<Keyring> {
        Arc::new(Keyring::cluster(key))
    }

    pub fn with(cluster: Key, secret: Option<NodeSecret>, cfg: NodeKeysConfig) -> Keyring {
        Keyring {
            ring: RwLock::new(Arc::new(Ring {
                cluster,
                secret,
                cfg,
                derived: Default::default(),
            })),
            version: AtomicU64::new(0),
        }
    }

    /// Reads the secret `cfg` names. `cluster` is the cluster key, when there is one.
    pub fn load(cluster: Key, cfg: &NodeKeysConfig) -> Result<Keyring, super::KeyError> {
        let secret = match &cfg.secret_file {
            Some(p) => Some(NodeSecret::load(p)?),
            None => None,
        };
        Ok(Keyring::with(cluster, secret, cfg.clone()))
    }

    /// Takes a new configuration (SIGHUP): the next message signed or checked uses it.
    pub fn reload(&self, cluster: Key, cfg: &NodeKeysConfig) -> Result<(), super::KeyError> {
        let fresh = Keyring::load(cluster, cfg)?;
        let ring = fresh.ring.into_inner().unwrap_or_else(|p| p.into_inner());
        *self.ring.write_unpoisoned() = ring;
        self.version.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    fn ring(&self) -> Arc<Ring> {
        self.ring.read_unpoisoned().clone()
    }

    /// Whether nodes have keys of their own.
    pub fn per_node(&self) -> bool {
        self.ring().secret.is_some()
    }

    /// The key the master signs its requests and polls to `node` with.
    pub fn signer(&self, node: &str) -> Result<Key, NodeKeyError> {
        let ring = self.ring();
        let (generation, _) = ring.generations(node)?;
        Ok(ring.mac(node, generation, true))
    }

    /// The keys `node`'s reports, views and requests may be signed with.
    pub fn verifiers(&self, node: &str) -> Result<Vec<Key>, NodeKeyError> {
        self.verifiers_keeping(node, true)
    }

    /// [`Keyring::verifiers`] of a node an unauthenticated request names: nothing is kept.
    pub fn claimed_verifiers(&self, node: &str) -> Result<Vec<Key>, NodeKeyError> {
        self.verifiers_keeping(node, false)
    }

    fn verifiers_keeping(&self, node: &str, keep: bool) -> Result<Vec<Key>, NodeKeyError> {
        let ring = self.ring();
        let (generation, previous) = ring.generations(node)?;
        let mut keys = vec![ring.mac(node, generation, keep)];
        if let Some(p) = previous.filter(|p| *p != generation) {
            keys.push(ring.mac(node, p, keep));
        }
        Ok(keys)
    }

    /// What `node`'s peers accept its heartbeats under, as the peer set carries it: the
    /// Ed25519 public key of each accepted generation, `cluster-key` for generation 0. Empty
    /// for a revoked node (its peers refuse it); `None` in the shared-key configuration, where
    /// peers check the cluster key as they always did.
    pub fn heartbeat_keys(&self, node: &str) -> Option<Vec<String>> {
        let ring = self.ring();
        ring.secret.as_ref()?;
        let Ok((generation, previous)) = ring.generations(node) else {
            return Some(Vec::new());
        };
        let mut out = BTreeSet::new();
        for g in [Some(generation), previous].into_iter().flatten() {
            out.insert(if g == 0 {
                CLUSTER_KEY_ENTRY.to_string()
            } else {
                ring.derived(node, g).heartbeat_public().encode()
            });
        }
        Some(out.into_iter().collect())
    }

    /// A node's key of one generation, as `maintd keygen --node` writes it.
    pub fn node_key(&self, node: &str, generation: u32) -> Option<NodeKey> {
        let ring = self.ring();
        (ring.secret.is_some() && generation >= 1).then(|| ring.derived(node, generation))
    }

    /// The generation `node` signs with now, as configured.
    pub fn generation(&self, node: &str) -> Result<u32, NodeKeyError> {
        self.ring().generations(node).map(|(g, _)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cfg: NodeKeysConfig) -> Keyring {
        Keyring::with(
            Key::from_bytes(vec![1; 32]),
            Some(NodeSecret::from_bytes(&[2; 32])),
            cfg,
        )
    }

    fn signs(k: &Key) -> String {
        k.sign_request("n", "GET", "/", 1, b"")
    }

    fn accepts(r: &Keyring, node: &str, sig: &str) -> bool {
        r.verifiers(node)
            .unwrap_or_default()
            .iter()
            .any(|k| k.verify_request("n", "GET", "/", 1, b"", sig))
    }

    #[test]
    fn without_a_secret_every_node_is_the_cluster_key() {
        let cluster = Key::from_bytes(vec![1; 32]);
        let r = Keyring::cluster(cluster.clone());
        assert!(!r.per_node());
        assert!(accepts(&r, "a", &signs(&cluster)));
        assert!(accepts(&r, "b", &signs(&cluster)));
        assert_eq!(r.heartbeat_keys("a"), None);
    }

    #[test]
    fn a_node_key_speaks_for_its_node_only() {
        let r = ring(NodeKeysConfig::default());
        let a = r.node_key("a", 1).unwrap();
        assert!(accepts(&r, "a", &signs(&a.mac)));
        assert!(!accepts(&r, "b", &signs(&a.mac)));
        assert!(
            !accepts(&r, "a", &signs(&Key::from_bytes(vec![1; 32]))),
            "the cluster key is no longer accepted"
        );
        assert!(
            !accepts(&r, "a", &signs(&r.node_key("a", 2).unwrap().mac)),
            "a later generation before it is configured"
        );
        assert_eq!(
            r.heartbeat_keys("a").unwrap(),
            vec![a.heartbeat_public().encode()]
        );
    }

    #[test]
    fn a_rollover_accepts_both_generations_and_signs_with_the_new_one() {
        let mut cfg = NodeKeysConfig::default();
        cfg.nodes.insert(
            "a".into(),
            NodeGenerations {
                generation: 2,
                previous: Some(1),
            },
        );
        cfg.previous = Some(0);
        let r = ring(cfg);
        let (old, new) = (r.node_key("a", 1).unwrap(), r.node_key("a", 2).unwrap());
        assert!(accepts(&r, "a", &signs(&old.mac)) && accepts(&r, "a", &signs(&new.mac)));
        assert_eq!(signs(&r.signer("a").unwrap()), signs(&new.mac));
        assert_eq!(r.heartbeat_keys("a").unwrap().len(), 2);
        // Other nodes: generation 1, and the cluster key while they move to it.
        let cluster = Key::from_bytes(vec![1; 32]);
        assert!(accepts(&r, "b", &signs(&cluster)));
        assert!(!accepts(&r, "a", &signs(&cluster)));
        assert!(
            r.heartbeat_keys("b")
                .unwrap()
                .contains(&CLUSTER_KEY_ENTRY.to_string())
        );
    }

    proptest::proptest! {
        /// Whatever generations are configured, node A's key of any generation never verifies
        /// as node B's, and a node's accepted keys are exactly its configured generations.
        #[test]
        fn no_nodes_key_ever_speaks_for_another(
            a in "[a-z0-9.-]{1,12}",
            b in "[a-z0-9.-]{1,12}",
            generation in 1u32..6,
            previous in proptest::option::of(0u32..6),
            signed_with in 1u32..6,
        ) {
            proptest::prop_assume!(a != b);
            let mut cfg = NodeKeysConfig::default();
            for n in [&a, &b] {
                cfg.nodes.insert(n.clone(), NodeGenerations { generation, previous });
            }
            let r = ring(cfg);
            let sig = signs(&r.node_key(&a, signed_with).unwrap().mac);
            proptest::prop_assert!(!accepts(&r, &b, &sig));
            let own = signed_with == generation || previous == Some(signed_with);
            proptest::prop_assert_eq!(accepts(&r, &a, &sig), own);
        }
    }

    /// A name an unauthenticated request chose is checked but never kept: no client can fill
    /// the cache, or push the members' keys out of it.
    #[test]
    fn a_claimed_name_is_derived_but_not_kept() {
        let r = ring(NodeKeysConfig::default());
        let a = r.node_key("a", 1).unwrap();
        let kept = || r.ring().derived.lock_unpoisoned().len();
        let before = kept();
        for i in 0..100 {
            assert_eq!(r.claimed_verifiers(&format!("x{i}")).unwrap().len(), 1);
        }
        assert_eq!(kept(), before);
        assert!(r.claimed_verifiers("a").unwrap()[0].verify_request(
            "n",
            "GET",
            "/",
            1,
            b"",
            &signs(&a.mac)
        ));
    }

    #[test]
    fn a_revoked_node_has_no_key_and_a_reload_takes_effect_at_once() {
        let r = ring(NodeKeysConfig::default());
        let a = r.node_key("a", 1).unwrap();
        let v = r.version();
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        super::super::key::write_exact(&secret, &hex::encode([2u8; 32])).unwrap();
        let mut cfg = NodeKeysConfig {
            secret_file: Some(secret),
            ..Default::default()
        };
        cfg.revoked.insert("a".into());
        r.reload(Key::from_bytes(vec![1; 32]), &cfg).unwrap();
        assert!(r.version() > v);
        assert_eq!(
            r.signer("a").unwrap_err(),
            NodeKeyError::Revoked("a".into())
        );
        assert!(!accepts(&r, "a", &signs(&a.mac)));
        assert_eq!(r.heartbeat_keys("a"), Some(vec![]));
        assert!(accepts(&r, "b", &signs(&r.node_key("b", 1).unwrap().mac)));
    }
}
