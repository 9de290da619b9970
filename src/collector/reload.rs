//! What a collector reads again on SIGHUP: its key files, so a node's key is rolled over
//! without a restart (the node never goes silent, the watchdog stays armed). Everything else
//! needs a restart.

use std::path::PathBuf;

use tracing::{error, info};

use crate::config::Config;
use crate::report::nodekey::Credential;

/// Where the key files are named, as the collector was started.
pub(super) struct KeySource {
    /// The configuration file; `None` for the embedded defaults (nothing to read again).
    pub config: Option<PathBuf>,
    /// The cluster key's file as started (`--key-file` included), used when the file names
    /// no key files of the node's own.
    pub cluster_key_file: PathBuf,
    pub node: String,
}

impl KeySource {
    fn reload(&self, cred: &Credential) {
        let Some(path) = &self.config else {
            info!("SIGHUP: no configuration file to read again (embedded defaults)");
            return;
        };
        let read = Config::load(Some(path)).map_err(|e| e.to_string());
        let done = read.and_then(|mut cfg| {
            cfg.cluster.key_file = self.cluster_key_file.clone();
            let files = cfg.collector_key_files();
            cred.reload(&files, &self.node).map_err(|e| e.to_string())
        });
        match done {
            Ok(()) => info!(
                file = %path.display(),
                signs_with = %cred.now().describe(),
                "SIGHUP: key files read again (other settings need a restart)"
            ),
            Err(e) => error!(
                file = %path.display(),
                error = %e,
                "SIGHUP: cannot read the key files again; the ones in use stay"
            ),
        }
    }
}

/// Reads the key files again on each SIGHUP, until the runtime stops.
pub(super) fn on_sighup(source: KeySource, cred: Credential) -> std::io::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            source.reload(&cred);
        }
    });
    Ok(())
}
