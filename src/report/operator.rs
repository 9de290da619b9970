//! Operators' credentials: a key file that names its holder, the roles the daemon gives them,
//! and the signature of an operator's request, bound to the operator's name.

use std::path::Path;

use super::{DAEMON_TARGET, Key, KeyError};

/// The header that names the operator whose key signed a request.
pub const OPERATOR_HEADER: &str = "x-maintd-operator";

/// The header that names the node whose key signed a request. No node may send the daemon a
/// command; the daemon uses it to name whose key was misused.
pub const NODE_HEADER: &str = "x-maintd-node";

/// The name under which a request signed with the cluster key is logged and audited: every
/// node holds that key, so it speaks for no one person.
pub const CLUSTER_KEY_ID: &str = "cluster-key";

/// What an operator may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Read the API's state (needed only when `anonymous-read = false`).
    Read,
    /// Also cancel, acknowledge, reset sequences, pause and resume fencing, start drills.
    Operate,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
        }
    }
}

/// One operator as `[daemon.operators.<name>]` configures them: what they may do, and the key
/// files that speak for them (two while a key is rolled over).
#[derive(Debug, Clone, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct OperatorConfig {
    pub role: Role,
    pub key_files: Vec<std::path::PathBuf>,
}

/// Who signed an accepted request, as handlers, logs and the audit trail see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub role: Role,
}

/// An operator's key file: `<name>:<64 hex digits>`, owner-only, as `maintd keygen --operator`
/// writes it. The same file is given to the CLI and named in the daemon's configuration.
#[derive(Debug, Clone)]
pub struct OperatorKey {
    pub name: String,
    pub key: Key,
}

/// An operator's name: what the audit trail and the logs show; no separator can be smuggled in.
pub fn valid_operator_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n != CLUSTER_KEY_ID
        && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && n.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'@' | b'-')
        })
}

/// What an operator's signature is made for: the daemon, as this operator. Binding the name
/// keeps a signature from being claimed for another operator, and from being a node request's.
pub fn operator_target(name: &str) -> String {
    format!("{DAEMON_TARGET};operator={name}")
}

impl OperatorKey {
    pub fn load(path: &Path) -> Result<OperatorKey, KeyError> {
        let p = path.display().to_string();
        let text = super::key::read_secret(path)?;
        let bad = || KeyError::OperatorFormat { path: p.clone() };
        let (name, hex) = text.trim().split_once(':').ok_or_else(bad)?;
        if !valid_operator_name(name) {
            return Err(bad());
        }
        let key = Key::parse_hex(hex).ok_or_else(bad)?;
        Ok(OperatorKey {
            name: name.to_string(),
            key,
        })
    }

    /// Writes a fresh operator key for `name` (mode 0600); refuses to overwrite a file.
    pub fn generate(path: &Path, name: &str) -> Result<(), KeyError> {
        if !valid_operator_name(name) {
            return Err(KeyError::OperatorName(name.to_string()));
        }
        super::key::write_fresh(path, &format!("{name}:"))
    }

    pub fn sign_request(&self, method: &str, path: &str, ts: i64, body: &[u8]) -> String {
        self.key
            .sign_request(&operator_target(&self.name), method, path, ts, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_key_names_its_holder_and_signs_only_as_them() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("alice.key");
        OperatorKey::generate(&p, "alice").unwrap();
        assert!(
            OperatorKey::generate(&p, "alice").is_err(),
            "never overwritten"
        );
        let k = OperatorKey::load(&p).unwrap();
        assert_eq!(k.name, "alice");
        let sig = k.sign_request("POST", "/1/fencing/pause", 5, b"");
        assert!(k.key.verify_request(
            &operator_target("alice"),
            "POST",
            "/1/fencing/pause",
            5,
            b"",
            &sig
        ));
        assert!(!k.key.verify_request(
            &operator_target("bob"),
            "POST",
            "/1/fencing/pause",
            5,
            b"",
            &sig
        ));
        assert!(
            !k.key
                .verify_request(DAEMON_TARGET, "POST", "/1/fencing/pause", 5, b"", &sig)
        );
        for bad in [
            "",
            "Alice",
            "a b",
            "a:b",
            "-a",
            CLUSTER_KEY_ID,
            &"a".repeat(65),
        ] {
            assert!(!valid_operator_name(bad), "{bad:?}");
        }
        assert!(OperatorKey::generate(&d.path().join("x"), "a:b").is_err());
        // A cluster key file is not an operator key file: the error says which file.
        let cluster = d.path().join("cluster.key");
        Key::generate(&cluster).unwrap();
        let e = OperatorKey::load(&cluster).unwrap_err().to_string();
        assert!(e.contains("cluster.key") && e.contains("<name>:"), "{e}");
    }
}
