//! The daemon's operators as the API checks them: each name's role and the keys that speak
//! for it, loaded from the files `[daemon.operators]` lists.

use crate::report::Key;
use crate::report::operator::{OperatorKey, Role};

/// The daemon's operators: each name's role and the keys that speak for it.
#[derive(Default)]
pub struct Operators {
    keys: std::collections::HashMap<String, (Role, Vec<Key>)>,
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
        Ok(Operators { keys })
    }

    /// One operator's role and keys.
    pub(super) fn get(&self, name: &str) -> Option<&(Role, Vec<Key>)> {
        self.keys.get(name)
    }

    /// Until an operator is configured, the cluster key signs operator commands as before.
    pub fn cluster_key_operates(&self) -> bool {
        self.keys.is_empty()
    }
}
