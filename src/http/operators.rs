//! The daemon's operators as the API checks them: each name's role and the keys that speak
//! for it, loaded from the files `[daemon.operators]` lists (again on SIGHUP); and the refusal
//! of a request signed with a node's key, which speaks for no operator.

use crate::report::Key;
use crate::report::operator::{OperatorKey, Role};
use crate::sync::RwLockExt;

/// The daemon's operators: each name's role and the keys that speak for it.
#[derive(Default)]
pub struct Operators {
    /// Replaced whole on a reload (SIGHUP).
    keys: std::sync::RwLock<std::collections::HashMap<String, (Role, Vec<Key>)>>,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorsError {
    #[error("daemon.operators.{name}: {source}")]
    Key {
        name: String,
        #[source]
        source: crate::report::KeyError,
    },
    #[error("daemon.operators.{name}: key file {path} is {found:?}'s, not {name:?}'s")]
    Name {
        name: String,
        path: String,
        found: String,
    },
}

impl Operators {
    /// Loads every operator's key files; each must name the operator it is listed under.
    pub fn load(
        cfg: &std::collections::BTreeMap<String, crate::report::operator::OperatorConfig>,
    ) -> Result<Operators, OperatorsError> {
        let mut keys = std::collections::HashMap::new();
        for (name, o) in cfg {
            let mut loaded = Vec::new();
            for path in &o.key_files {
                let k = OperatorKey::load(path).map_err(|source| OperatorsError::Key {
                    name: name.clone(),
                    source,
                })?;
                if &k.name != name {
                    return Err(OperatorsError::Name {
                        name: name.clone(),
                        path: path.display().to_string(),
                        found: k.name,
                    });
                }
                loaded.push(k.key);
            }
            keys.insert(name.clone(), (o.role, loaded));
        }
        Ok(Operators {
            keys: std::sync::RwLock::new(keys),
        })
    }

    /// Takes a new configuration (SIGHUP): every key file is read first, and nothing changes
    /// if one cannot be.
    pub fn reload(
        &self,
        cfg: &std::collections::BTreeMap<String, crate::report::operator::OperatorConfig>,
    ) -> Result<(), OperatorsError> {
        let fresh = Operators::load(cfg)?;
        let keys = fresh.keys.into_inner().unwrap_or_else(|p| p.into_inner());
        *self.keys.write_unpoisoned() = keys;
        Ok(())
    }

    /// One operator's role and keys.
    pub(super) fn get(&self, name: &str) -> Option<(Role, Vec<Key>)> {
        self.keys.read_unpoisoned().get(name).cloned()
    }

    /// Until an operator is configured, the cluster key signs operator commands as before.
    pub fn cluster_key_operates(&self) -> bool {
        self.keys.read_unpoisoned().is_empty()
    }
}

/// What a request's signature covers, and the signature: the path, the time it was signed at,
/// the body and the MAC.
pub(super) struct SignedParts<'a> {
    pub path: &'a str,
    pub ts: i64,
    pub body: &'a [u8],
    pub sig: &'a crate::report::Mac32,
}

impl super::SignedAuth {
    /// The refusal of a request that says a node's key signed it: `forbidden`, under the node's
    /// key id, when the signature is that node's; `forged` otherwise.
    pub(super) fn node_signed(
        &self,
        parts: &axum::http::request::Parts,
        ring: &crate::report::keyring::Keyring,
        node: &str,
        signed: SignedParts<'_>,
    ) -> super::ApiError {
        let SignedParts {
            path,
            ts,
            body,
            sig,
        } = signed;
        let method = parts.method.as_str();
        let id = format!("node:{node}");
        let genuine = ring.claimed_verifiers(node).is_ok_and(|keys| {
            keys.iter()
                .any(|k| k.verify_request_mac(&self.target, method, path, ts, body, sig))
        });
        if !genuine {
            let e = super::ApiError::unauthorized(format!(
                "request signature does not verify under node {node:?}'s key"
            ));
            return self.refuse_signer("forged", parts, Some(&id), e);
        }
        let e = super::ApiError::forbidden(format!(
            "signed with node {node:?}'s key, which speaks only for that node's reports, views and heartbeats: sign operator commands with an operator key (maintd keygen --operator NAME)"
        ));
        self.refuse_signer("forbidden", parts, Some(&id), e)
    }
}
