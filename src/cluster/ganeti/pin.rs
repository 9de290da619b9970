//! TLS for the Ganeti RAPI: the cluster's own certificate, pinned. Ganeti serves a self-signed
//! certificate whose name is in its CN only (no subjectAltName), which no path validation
//! accepts; the one certificate the operator copied from the master is the only one trusted,
//! compared byte for byte, and the handshake's signature is still checked with its key.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    /// The file it was read from, named when the RAPI shows another certificate.
    path: std::path::PathBuf,
    key: PublicKey,
    provider: Arc<CryptoProvider>,
}

/// The certificate's subject public key. Ganeti's certificates are X.509 version 1, which
/// certificate-path libraries refuse to parse; the key is read from the DER here, once.
#[derive(Debug, Clone, PartialEq)]
struct PublicKey {
    /// The content of the SubjectPublicKeyInfo's AlgorithmIdentifier (as signature
    /// algorithms name the keys they take).
    algorithm: Vec<u8>,
    /// The subjectPublicKey bits.
    bits: Vec<u8>,
}

/// One DER element: (tag, content, rest).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;

impl PublicKey {
    /// Certificate → tbsCertificate → ([0] version) serial, signature, issuer, validity,
    /// subject → subjectPublicKeyInfo.
    fn of(cert: &[u8]) -> Option<PublicKey> {
        let (SEQUENCE, cert, _) = element(cert)? else {
            return None;
        };
        let (SEQUENCE, tbs, _) = element(cert)? else {
            return None;
        };
        let (tag, _, mut rest) = element(tbs)?;
        if tag == 0xa0 {
            rest = element(rest)?.2;
        }
        // signature, issuer, validity, subject
        for _ in 0..4 {
            rest = element(rest)?.2;
        }
        let (SEQUENCE, spki, _) = element(rest)? else {
            return None;
        };
        let (SEQUENCE, algorithm, rest) = element(spki)? else {
            return None;
        };
        let (0x03, bits, _) = element(rest)? else {
            return None;
        };
        // A key's bit string has no unused bits.
        let (0, bits) = bits.split_first()? else {
            return None;
        };
        Some(PublicKey {
            algorithm: algorithm.to_vec(),
            bits: bits.to_vec(),
        })
    }
}

/// The RAPI showed a certificate other than the pinned one.
#[derive(Debug)]
struct Mismatch(std::path::PathBuf);

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the RAPI's certificate is not the one pinned in {} (after `gnt-cluster renew-crypto`, copy the new certificate there and restart)",
            self.0.display()
        )
    }
}

impl std::error::Error for Mismatch {}

impl Pinned {
    fn mismatch(&self) -> rustls::Error {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
            Arc::new(Mismatch(self.path.clone())),
        )))
    }

    fn verify(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only the pinned certificate got this far; its key checks the signature.
        if cert.as_ref() != self.cert.as_ref() {
            return Err(self.mismatch());
        }
        let algs = &self.provider.signature_verification_algorithms;
        let candidates = algs
            .mapping
            .iter()
            .find(|(scheme, _)| *scheme == dss.scheme)
            .map(|(_, a)| *a)
            .unwrap_or_default();
        let ok = candidates
            .iter()
            .filter(|a| a.public_key_alg_id().as_ref() == self.key.algorithm.as_slice())
            .any(|a| {
                a.verify_signature(&self.key.bits, message, dss.signature())
                    .is_ok()
            });
        if ok {
            Ok(HandshakeSignatureValid::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadSignature,
            ))
        }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(self.mismatch())
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The schemes offered are the provider's; rustls checks the server chose one of them.
        self.verify(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Why a certificate cannot be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("the certificate's public key cannot be read")]
    Key,
    #[error(transparent)]
    Tls(#[from] rustls::Error),
}

/// A TLS client configuration that trusts `cert` (DER, read from `path`) and nothing else.
pub fn pinned(
    cert: CertificateDer<'static>,
    path: &std::path::Path,
) -> Result<rustls::ClientConfig, PinError> {
    let key = PublicKey::of(&cert).ok_or(PinError::Key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            cert,
            path: path.to_path_buf(),
            key,
            provider,
        }))
        .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_that_ends_early_or_lies_about_lengths_is_refused() {
        assert_eq!(element(&[0x30, 0x03, 1, 2]), None);
        assert_eq!(element(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(element(&[0x30]), None);
        assert_eq!(
            element(&[0x30, 0x02, 7, 8, 9]),
            Some((0x30, &[7u8, 8][..], &[9u8][..]))
        );
        assert_eq!(
            element(&[0x04, 0x81, 0x01, 5]),
            Some((0x04, &[5u8][..], &[][..]))
        );
        assert_eq!(PublicKey::of(b"not a certificate"), None);
        assert_eq!(PublicKey::of(&[]), None);
    }
}
