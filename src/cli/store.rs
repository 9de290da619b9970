//! `maintd store migrate`: moves a single master's decision state into etcd, for daemons that
//! share it there, and back. Run with every daemon of the cluster stopped: the local state
//! directory's master lock is taken, a lease still being renewed in etcd refuses it, and a
//! state already there is replaced only with `--force`.

use std::sync::Arc;

use clap::{Subcommand, ValueEnum};

use super::CliError;
use crate::cluster::etcd::flows::EtcdFlows;
use crate::cluster::etcd::{Etcd, StoreBackend};
use crate::config::Config;
use crate::store::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// From this host's state database into etcd (`[store]` names where).
    Etcd,
    /// From etcd into this host's state database, for a single master again.
    Sqlite,
}

#[derive(Debug, Subcommand)]
pub enum StoreCmd {
    /// Copy the decision state (events, rounds, jobs, fence flows, controls, drills, the
    /// inventory's tags and offline flags) between this host's database and etcd.
    Migrate {
        #[arg(long)]
        to: Target,
        /// Replace a state already there (etcd's, or this database's), once no daemon holds
        /// the lease.
        #[arg(long)]
        force: bool,
    },
}

/// What a migration carried: rows per table, and the fence flows (kept apart on etcd).
fn summary(doc: &str, flows: usize) -> String {
    let v: serde_json::Value = serde_json::from_str(doc).unwrap_or_default();
    let count = |t: &str| v[t]["rows"].as_array().map_or(0, Vec::len);
    format!(
        "{} events, {} jobs, {} rounds, {flows} fence flows, {} tags",
        count("events"),
        count("jobs"),
        count("rounds"),
        count("inventory_tags")
    )
}

pub async fn run(cfg: &Config, cmd: &StoreCmd) -> Result<String, CliError> {
    let StoreCmd::Migrate { to, force } = cmd;
    let usage = |m: String| CliError::Usage(m);
    if cfg.store.backend != StoreBackend::Etcd {
        return Err(usage(
            "store migrate moves state to and from etcd: set [store] backend = \"etcd\" and its endpoints in the configuration".into(),
        ));
    }
    cfg.store
        .validate()
        .map_err(crate::config::ConfigError::from)?;
    // No daemon may be writing this database meanwhile.
    let _lock = crate::daemon::lock::acquire(&cfg.daemon.state_dir, &cfg.host)
        .map_err(crate::daemon::DaemonError::from)?;
    let store = Arc::new(Store::open(&cfg.db_path()).map_err(crate::daemon::DaemonError::from)?);
    let etcd = Arc::new(
        Etcd::connect(&cfg.store)
            .await
            .map_err(|e| usage(e.to_string()))?,
    );
    let flows = EtcdFlows::new(etcd.clone());
    let store_error = |e: crate::store::StoreError| usage(e.to_string());
    // A daemon that still renews the lease would act on a state this replaces, or go on
    // beside a single master started from it: the key must stay still for a whole lease.
    if let Some((holder, rev)) = etcd.holder().await.map_err(|e| usage(e.to_string()))? {
        tokio::time::sleep(cfg.store.lease_duration).await;
        if let Some((_, now)) = etcd.holder().await.map_err(|e| usage(e.to_string()))?
            && now != rev
        {
            return Err(usage(format!(
                "{holder} is renewing the lease in etcd: stop every daemon of the cluster first"
            )));
        }
    }
    let there = etcd.read_state().await.map_err(|e| usage(e.to_string()))?;
    match to {
        Target::Etcd => {
            let data = store
                .export_checkpoint(false)
                .map_err(crate::daemon::DaemonError::from)?;
            let kept = store.all_flows(usize::MAX).map_err(store_error)?;
            let over = match (&there, force) {
                (None, _) => None,
                (Some((rev, _)), true) => Some(*rev),
                (Some(_), false) => {
                    return Err(usage(format!(
                        "etcd already holds a decision state at {}: daemons may be using it; --force replaces it",
                        etcd.location()
                    )));
                }
            };
            // The flows first, the state last: a state there says the migration ended.
            let n = flows.seed(&kept, *force).await.map_err(store_error)?;
            match etcd
                .seed_state(&data, over)
                .await
                .map_err(|e| usage(e.to_string()))?
            {
                Some(rev) => Ok(format!(
                    "migrated to {} (revision {rev}): {}",
                    etcd.location(),
                    summary(&data, n)
                )),
                None => Err(usage(
                    "the state in etcd changed meanwhile: a daemon is running; nothing was written"
                        .into(),
                )),
            }
        }
        Target::Sqlite => {
            let Some((rev, data)) = there else {
                return Err(usage(format!("no decision state at {}", etcd.location())));
            };
            if !force && !store.is_empty().map_err(crate::daemon::DaemonError::from)? {
                return Err(usage(format!(
                    "{} already holds events, jobs, flows or drills: --force replaces them",
                    store.path()
                )));
            }
            let there = flows.all().await.map_err(store_error)?;
            store
                .import_checkpoint(&data, false)
                .map_err(crate::daemon::DaemonError::from)?;
            store.put_flows(&there, true).map_err(store_error)?;
            Ok(format!(
                "migrated from {} (revision {rev}) to {}: {}",
                etcd.location(),
                store.path(),
                summary(&data, there.len())
            ))
        }
    }
}
