//! The cluster HMAC key: loading it from an owner-only file, generating one, and the
//! domain-separated MACs the report and request signatures are made of.

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A MAC's 32 bytes (HMAC-SHA256).
pub type Mac32 = [u8; 32];

/// The one encoding of a MAC on the wire: exactly 64 lower-case hex digits. Every other
/// spelling of the same bytes (upper case, padding, another length) is refused before anything
/// else is looked at, so one MAC has one encoding and nothing keyed on it can be passed by
/// spelling it differently.
pub fn decode_mac(s: &str) -> Option<Mac32> {
    if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// The cluster HMAC key, kept as the MAC's keyed state: every signature starts from a copy of
/// it, so the key's own two hash blocks are computed once, not per message.
#[derive(Clone)]
pub struct Key(HmacSha256);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "key file {path} is accessible by group or others (mode {mode:o}); run chmod 600 {path}"
    )]
    Permissions { path: String, mode: u32 },
    #[error("key file {path} must hold at least 32 hex digits (16 bytes)")]
    Format { path: String },
    #[error("cannot write key file {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no random bytes: {0}")]
    Random(String),
    #[error(
        "operator key file {path} must hold <name>:<hex key> (a lower-case name, at least 32 hex digits), as `maintd keygen --operator NAME` writes it"
    )]
    OperatorFormat { path: String },
    #[error(
        "node key-secret file {path} must hold at least 64 hex digits (32 bytes), as `maintd keygen --node-secret` writes it"
    )]
    SecretFormat { path: String },
    #[error(
        "node key file {path} must hold node:<name>:<generation>:<64 hex digits> (generation 1 or above), as `maintd keygen --node NAME` writes it"
    )]
    NodeFormat { path: String },
    #[error("node key file {path} is node {signed:?}'s key; this collector is node {me:?}")]
    OtherNode {
        path: String,
        signed: String,
        me: String,
    },
    #[error("no key file is configured")]
    NoKeys,
    #[error(
        "{0:?} is not an operator name: 1 to 64 of a-z, 0-9, '.', '_', '@', '-', starting with a letter or digit"
    )]
    OperatorName(String),
}

/// A secret file's text, refusing one that group or others can read or write.
pub(super) fn read_secret(path: &Path) -> Result<String, KeyError> {
    let p = path.display().to_string();
    crate::secret::read(path).map_err(|e| match e {
        crate::secret::SecretFileError::Read { source } => KeyError::Read { path: p, source },
        crate::secret::SecretFileError::Permissions { mode } => {
            KeyError::Permissions { path: p, mode }
        }
    })
}

/// Writes `prefix` and a fresh 256-bit key in hex, mode 0600; refuses to overwrite a file.
pub(super) fn write_fresh(path: &Path, prefix: &str) -> Result<(), KeyError> {
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(bytes.as_mut()).map_err(|e| KeyError::Random(e.to_string()))?;
    write_exact(
        path,
        &zeroize::Zeroizing::new(format!("{prefix}{}", hex::encode(bytes.as_ref()))),
    )
}

/// Writes `text` and a newline to a new file of mode 0600, synced; refuses to overwrite one.
pub(super) fn write_exact(path: &Path, text: &str) -> Result<(), KeyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let write_err = |source| KeyError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err)?;
    writeln!(f, "{text}").map_err(write_err)?;
    f.sync_all().map_err(write_err)
}

/// The keys a signature may be made with: one key, or a node's keys during a rollover. Each is
/// tried in turn; the first that verifies wins.
pub trait Verifiers {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool;
}

impl Verifiers for Key {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool {
        f(self)
    }
}

impl Verifiers for [Key] {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool {
        self.iter().any(f)
    }
}

impl Verifiers for Vec<Key> {
    fn any_key(&self, f: &mut dyn FnMut(&Key) -> bool) -> bool {
        self.iter().any(f)
    }
}

impl Key {
    fn keyed(bytes: &[u8]) -> Key {
        Key(HmacSha256::new_from_slice(bytes).expect("HMAC takes any key length"))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Key {
        Key::keyed(&bytes)
    }

    /// Loads a key file, refusing one that group or others can read or write.
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let text = read_secret(path)?;
        Key::parse_hex(text.trim()).ok_or_else(|| KeyError::Format {
            path: path.display().to_string(),
        })
    }

    /// A key written as hex, of at least 16 bytes.
    pub(super) fn parse_hex(text: &str) -> Option<Key> {
        let bytes = hex::decode(text).ok()?;
        (bytes.len() >= 16).then(|| Key::keyed(&bytes))
    }

    /// Writes a fresh 256-bit key with mode 0600; refuses to overwrite an existing file.
    pub fn generate(path: &Path) -> Result<(), KeyError> {
        write_fresh(path, "")
    }

    fn mac(&self, domain: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.0.clone();
        mac.update(domain);
        for p in parts {
            mac.update(p);
        }
        mac
    }

    pub(super) fn sign(&self, domain: &[u8], parts: &[&[u8]]) -> String {
        hex::encode(self.mac(domain, parts).finalize().into_bytes())
    }

    /// Constant-time comparison (hmac's `verify_slice`), of a MAC in its one encoding only.
    pub(super) fn verify(&self, domain: &[u8], parts: &[&[u8]], sig_hex: &str) -> bool {
        decode_mac(sig_hex).is_some_and(|sig| self.verify_mac(domain, parts, &sig))
    }

    pub(super) fn verify_mac(&self, domain: &[u8], parts: &[&[u8]], sig: &Mac32) -> bool {
        self.mac(domain, parts).verify_slice(sig).is_ok()
    }
}
