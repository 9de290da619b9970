//! What the daemon reads again on SIGHUP (the API's certificate, the operators' keys, the node
//! keys' configuration), and whether it needs the cluster key at all.

use std::sync::Arc;

use tracing::info;

use super::DaemonError;
use crate::config::Config;
use crate::report::keyring::Keyring;
use crate::report::{Key, KeyError};

/// The cluster key, when the daemon still needs it: some node may sign with it (no node-key
/// secret, or generation 0 accepted), or no operator is configured (it then signs operator
/// commands). Otherwise it is not read at all, and a key no one holds stands in for it.
pub(super) fn cluster_key(cfg: &Config) -> Result<Key, DaemonError> {
    if cfg.daemon.node_keys.accepts_cluster_key() || cfg.daemon.operators.is_empty() {
        return Ok(Key::load(&cfg.cluster.key_file)?);
    }
    let mut bytes = vec![0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| DaemonError::Key(KeyError::Random(e.to_string())))?;
    Ok(Key::from_bytes(bytes))
}

/// What a SIGHUP reads again: the API's certificate and key (a renewed certificate without a
/// restart), and from the configuration file `[daemon.node-keys]` and `[daemon.operators]`
/// (a node's or an operator's key rolled over, a node revoked). What cannot be read is logged
/// and what is in use stays; a SIGHUP never stops the daemon (or a fence step with it).
pub(super) struct Reloadable {
    pub source: Option<std::path::PathBuf>,
    /// The cluster key's file as the daemon was started with it (`--key-file` included).
    pub key_file: std::path::PathBuf,
    pub keyring: Arc<Keyring>,
    pub operators: Arc<crate::http::Operators>,
    pub tls: Option<crate::http::tls::ServerTls>,
}

impl Reloadable {
    /// What a SIGHUP reads again for the daemon `cfg` started, into the keys `creds` it holds.
    pub fn of(cfg: &crate::config::Config, creds: &super::Credentials) -> Reloadable {
        Reloadable {
            source: cfg.source.clone(),
            key_file: cfg.cluster.key_file.clone(),
            keyring: creds.keyring.clone(),
            operators: creds.operators.clone(),
            tls: creds.tls.clone(),
        }
    }

    fn reload(&self) {
        match self.tls.as_ref().map(|t| t.reload()) {
            None => {}
            Some(Ok(())) => info!("SIGHUP: the API's TLS certificate and key were read again"),
            Some(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: cannot read the new TLS certificate or key; the one in use stays")
            }
        }
        let Some(source) = &self.source else {
            info!("SIGHUP: no configuration file to read again (embedded defaults)");
            return;
        };
        let keys = Config::load(Some(source))
            .map_err(|e| e.to_string())
            .and_then(|mut cfg| {
                cfg.cluster.key_file = self.key_file.clone();
                let key = cluster_key(&cfg).map_err(|e| e.to_string())?;
                // Operators first: were the node keys to fail after, the cluster key's rights
                // would still follow the operators in use.
                self.operators
                    .reload(&cfg.daemon.operators)
                    .map_err(|e| e.to_string())?;
                self.keyring
                    .reload(key, &cfg.daemon.node_keys)
                    .map_err(|e| e.to_string())?;
                Ok((cfg.daemon.operators.len(), cfg.daemon.node_keys))
            });
        match keys {
            Ok((operators, nk)) => info!(
                file = %source.display(),
                operators,
                node_keys = nk.secret_file.is_some(),
                generation = nk.generation,
                previous = ?nk.previous,
                revoked = nk.revoked.len(),
                "SIGHUP: operators and node keys read again (other settings need a restart)"
            ),
            Err(e) => tracing::error!(
                file = %source.display(),
                error = %e,
                "SIGHUP: cannot read the operators and node keys again; the ones in use stay"
            ),
        }
    }
}

pub(super) fn on_sighup(keys: Reloadable) -> Result<(), DaemonError> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(DaemonError::Serve)?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            keys.reload();
        }
    });
    Ok(())
}
