//! TLS for the operator's port: the certificate chain and key read from PEM files (the key
//! owner-only), swapped in place on a reload without dropping a connection, and the client
//! side's trust in one CA file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::sync::LockExt;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS certificate file {path}: {detail}")]
    Cert { path: String, detail: String },
    #[error("TLS key file {path}: {detail}")]
    Key { path: String, detail: String },
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// The certificate the listener presents: read again by [`ServerTls::reload`], which swaps it
/// in for the next handshake; a connection already open keeps its session.
#[derive(Debug)]
struct Current {
    cert: PathBuf,
    key: PathBuf,
    now: Mutex<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now.lock_unpoisoned().clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let cert_err = |detail: String| TlsError::Cert {
        path: cert.display().to_string(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("holds no PEM certificate".into()));
    }
    let key_err = |detail: String| TlsError::Key {
        path: key.display().to_string(),
        detail,
    };
    // Owner-only, as every secret file: a key others can read is refused before it is read.
    let text = crate::secret::read(key).map_err(|e| key_err(e.to_string()))?;
    let der = PrivateKeyDer::from_pem_slice(text.as_bytes())
        .map_err(|e| key_err(format!("no PEM private key: {e}")))?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| key_err(e.to_string()))?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|e| {
        key_err(format!(
            "does not match the certificate in {}: {e}",
            cert.display()
        ))
    })?;
    Ok(pair)
}

/// The listener's TLS: what accepts connections, and what reloads the certificate.
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<Current>,
    pub acceptor: tokio_rustls::TlsAcceptor,
}

impl ServerTls {
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let current = Arc::new(Current {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            now: Mutex::new(Arc::new(load_pair(cert, key)?)),
        });
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
        })
    }

    /// Reads the files again and presents them from the next handshake on; on an error the
    /// certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let pair = load_pair(&self.current.cert, &self.current.key)?;
        *self.current.now.lock_unpoisoned() = Arc::new(pair);
        Ok(())
    }
}

/// A client's TLS that trusts only the CAs in `ca_file` (PEM), with the ring provider.
pub fn client_trusting(ca_file: &Path) -> Result<rustls::ClientConfig, TlsError> {
    let err = |detail: String| TlsError::Cert {
        path: ca_file.display().to_string(),
        detail,
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_file).map_err(|e| err(e.to_string()))? {
        roots
            .add(c.map_err(|e| err(e.to_string()))?)
            .map_err(|e| err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(err("holds no PEM certificate".into()));
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What a client that speaks plain HTTP to the TLS port is answered, before the connection
/// closes: a clear error instead of a handshake it cannot read.
pub const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 85\r\n\r\n{\"error\":\"tls-required\",\"message\":\"this port speaks HTTPS only: use an https:// URL\"}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_http_answer_is_one_whole_response() {
        let text = std::str::from_utf8(PLAIN_HTTP_ANSWER).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{}",
            body.len()
        );
        let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
        assert_eq!(v["error"], "tls-required");
    }
}
