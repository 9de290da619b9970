//! Command-line interface: argument parsing, and the operator commands (status, cancel, tags,
//! keygen, diagnose --once) that talk to the daemon's API or run locally.

#[macro_use]
mod out;
#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "bench")]
mod bench_api;
#[cfg(feature = "bench")]
mod bench_api_load;
#[cfg(feature = "bench")]
mod bench_etcd;
#[cfg(feature = "bench")]
mod bench_floor;
#[cfg(feature = "bench")]
mod bench_peers;
#[cfg(feature = "bench")]
mod bench_plan;
#[cfg(feature = "bench")]
mod bench_store;
#[cfg(feature = "bench")]
mod benches;
mod client;
mod fences;
mod keys;
mod manual;
mod nodes;
mod show;
mod store;
use client::*;
pub use fences::{FencesCmd, FencingCmd};
pub use nodes::{MaintenanceCmd, TagsCmd};
use show::status_table;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError};
use crate::http::{error_message, send_signed};
use crate::report::{Envelope, Key, KeyError, now_ns};
use crate::views;
use maintd_core::verdict::ExactJson;

#[derive(Debug, Parser)]
#[command(
    name = "maintd",
    version,
    about = "Cluster maintenance and node-repair daemon"
)]
pub struct Cli {
    /// Config file (TOML). Without it, /etc/maintd/maintd.toml if present, else embedded defaults.
    #[arg(long, short, env = "MAINTD_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Cluster key file; overrides `cluster.key-file`.
    #[arg(long, env = "MAINTD_KEY_FILE", global = true)]
    pub key_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "MAINTD_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the master daemon (polls collectors, plans rounds, serves the API on 1816).
    Daemon(DaemonArgs),
    /// Run the node collector (diagnose loop, signed reports on 1815, live repairs).
    Collector(CollectorArgs),
    /// Show the repair events.
    Status {
        /// Print the raw JSON of /1/status.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filter: Filter,
        /// Only events of this action (Ok, live-repair, evacuate, evacuate-failover, fence).
        #[arg(long)]
        action: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Show every node's reachability, last report and diagnose errors.
    Nodes {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Cancel an event that is not final yet.
    Cancel {
        id: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Forget the last report sequence accepted from a node, so its collector's next report is
    /// accepted again (after a collector's clock was far ahead, or its sequence was reset).
    ResetSeq {
        node: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// List or remove node tags (removing a maintd tag acknowledges the repair).
    Tags {
        #[command(subcommand)]
        cmd: TagsCmd,
    },
    /// Put a node in maintenance (never fenced, powered on or off), end it, or list them.
    Maintenance {
        #[command(subcommand)]
        cmd: MaintenanceCmd,
    },
    /// Fence flows: list them, or show one with its timeline.
    Fences {
        #[command(subcommand)]
        cmd: FencesCmd,
    },
    /// Drill a node's fencing: drain it, fence it through its real flow (off, verified, on,
    /// back in service on a new boot) and record each stage's time.
    Drill {
        node: String,
        /// Wait for the drill to end and print its stages.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The recent fencing drills and their measured stages.
    Drills {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Pause or resume fencing at runtime, or show whether it is paused.
    Fencing {
        #[command(subcommand)]
        cmd: FencingCmd,
    },
    /// Write a fresh cluster key (mode 0600) to the key file, or with `--operator` an
    /// operator's key.
    Keygen {
        /// Write a key for this operator (`<name>:<hex>`), to give them and to list under
        /// `[daemon.operators.<name>]`.
        #[arg(long, conflicts_with_all = ["node", "node_secret"])]
        operator: Option<String>,
        /// Write this node's key (`node:<name>:<generation>:<hex>`), derived from the master's
        /// `daemon.node-keys.secret-file`, to install as the collector's `key-files`.
        #[arg(long, conflicts_with = "node_secret")]
        node: Option<String>,
        /// The generation of the node key (default: the one the master's configuration gives
        /// that node, `daemon.node-keys.generation` or its per-node override).
        #[arg(long, requires = "node")]
        generation: Option<u32>,
        /// Write a fresh node-key secret to `daemon.node-keys.secret-file` (master only).
        #[arg(long)]
        node_secret: bool,
        /// Where the key goes (default `./<name>.key`, or the configured secret file); never
        /// overwritten.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the NodeFence CustomResourceDefinition (YAML), e.g. `maintd crd | kubectl apply -f -`.
    Crd,
    /// The shared decision state on etcd: `migrate --to etcd` moves a single master's state
    /// there (every daemon stopped), `migrate --to sqlite` back.
    Store {
        #[command(subcommand)]
        cmd: store::StoreCmd,
    },
    /// Run the local diagnose and print the signed report envelope.
    Diagnose {
        /// Run once and print (the only mode).
        #[arg(long, required = true)]
        once: bool,
    },
    /// Print the shell completion script (bash, zsh, fish, elvish or powershell), e.g.
    /// `maintd completions bash > /usr/share/bash-completion/completions/maintd`.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (maintd.1 and one per subcommand) into a directory.
    Manpages { dir: PathBuf },
    /// Benchmarks (built with `--features bench`; the shipped binary has none).
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        cmd: benches::BenchCmd,
    },
    /// Internal: run one detached daemon job from its directory.
    #[command(hide = true)]
    RunJob { dir: PathBuf },
}

#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Base URL of the daemon's API.
    #[arg(long, env = "MAINTD_URL", default_value = "http://127.0.0.1:1816")]
    pub url: String,
    /// Operator key file (`<name>:<hex>`, as `maintd keygen --operator NAME` writes it): signs
    /// commands, and reads too. Default: ~/.config/maintd/operator.key when it exists; without
    /// one, the cluster key signs commands and reads go unsigned.
    #[arg(long, env = "MAINTD_OPERATOR_KEY")]
    pub operator_key: Option<PathBuf>,
    /// The CA (PEM) that signed the daemon's certificate, for an `https://` URL: the only one
    /// trusted.
    #[arg(long, env = "MAINTD_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Listen address of the API (default 0.0.0.0:1816).
    #[arg(long, env = "MAINTD_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// State directory (lock, database, job directories).
    #[arg(long, env = "MAINTD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Cluster backend: inventory, kubernetes or ganeti (overrides `cluster.backend`).
    #[arg(long, env = "MAINTD_CLUSTER")]
    pub cluster: Option<crate::config::Backend>,
}

#[derive(Debug, Args)]
pub struct CollectorArgs {
    /// This node's name (default: host name).
    #[arg(long, env = "MAINTD_NODE")]
    pub node: Option<String>,
    /// Listen address (default 0.0.0.0:1815).
    #[arg(long, env = "MAINTD_COLLECTOR_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// Diagnose command: a bare name in the diagnose directory ("" = built-in Ok).
    #[arg(long, env = "MAINTD_DIAGNOSE")]
    pub diagnose: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("cannot reach the daemon at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("daemon answered {0}")]
    Api(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("unexpected answer from the daemon: {0}")]
    Decode(String),
    #[error(transparent)]
    Daemon(#[from] crate::daemon::DaemonError),
    #[error(transparent)]
    Collector(#[from] crate::collector::CollectorError),
    #[error(transparent)]
    #[cfg(feature = "bench")]
    Bench(#[from] bench::BenchError),
    #[error(transparent)]
    NodeKey(#[from] keys::NodeKeyCliError),
    #[error("{0}")]
    Usage(String),
    #[error("cannot write the man pages into {dir}: {source}")]
    Manpages {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("job {dir}: {source}")]
    RunJob {
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Daemon(d) => d.exit_code(),
            _ => 1,
        }
    }
}

impl Cli {
    /// The validated config with this command line's overrides applied.
    pub fn load_config(&self) -> Result<Config, CliError> {
        let mut cfg = Config::load(self.config.as_deref())?;
        if let Some(k) = &self.key_file {
            cfg.cluster.key_file = k.clone();
        }
        match &self.command {
            Command::Daemon(a) => {
                if let Some(l) = a.listen {
                    cfg.daemon.listen = l;
                }
                if let Some(s) = &a.state_dir {
                    cfg.daemon.state_dir = s.clone();
                }
                if let Some(c) = &a.cluster {
                    cfg.cluster.backend = *c;
                }
            }
            Command::Collector(a) => {
                if let Some(n) = &a.node {
                    cfg.collector.node = Some(n.clone());
                }
                if let Some(l) = a.listen {
                    cfg.collector.listen = l;
                }
                if let Some(d) = &a.diagnose {
                    cfg.collector.diagnose = d.clone();
                }
            }
            _ => {}
        }
        cfg.resolve_environment();
        cfg.validate()?;
        if matches!(self.command, Command::Daemon(_)) {
            cfg.validate_backend()?;
        }
        Ok(cfg)
    }
}

/// Raises the open-files limit to its hard limit (systemd's soft default of 1024 is too low for
/// a listener's caps) and says what it is.
fn log_fd_limit(what: &str) {
    match crate::http::listener::raise_fd_limit() {
        Ok(n) => tracing::info!(component = what, nofile = n, "open-files limit"),
        Err(e) => tracing::warn!(component = what, error = %e, "cannot raise the open-files limit"),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Runs a parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> Result<i32, CliError> {
    // A configuration named on the command line must be there and valid, whatever the command
    // (a read that needs none would otherwise go on as if it had not been named).
    if cli.config.is_some() {
        cli.load_config()?;
    }
    match &cli.command {
        Command::Daemon(_) => {
            let cfg = cli.load_config()?;
            log_fd_limit("daemon");
            crate::daemon::run(cfg, shutdown_signal()).await?;
        }
        Command::Collector(_) => {
            let cfg = cli.load_config()?;
            log_fd_limit("collector");
            crate::collector::run(cfg, shutdown_signal()).await?;
        }
        Command::Status {
            json,
            filter,
            action,
            api,
        } => {
            let path = filter.query("/1/status", &[("action", action.as_deref())]);
            let v = api_get(api, &path).await?;
            if *json {
                print_json(&v);
            } else {
                out_raw!("{}", status_table(&view::<Vec<views::Event>>(v)?));
            }
        }
        Command::Nodes { json, filter, api } => {
            let v = api_get(api, &filter.query("/1/nodes", &[])).await?;
            if *json {
                print_json(&v);
            } else {
                for n in view::<Vec<views::Node>>(v)? {
                    out!("{}", show::node_line(&n));
                }
            }
        }
        Command::ResetSeq { node, api } => {
            let cfg = cli.load_config()?;
            let v: views::SeqReset = view(
                api_signed(
                    &cfg,
                    api,
                    reqwest::Method::POST,
                    &format!("/1/nodes/{}/reset-seq", segment(node)),
                )
                .await?,
            )?;
            out!(
                "node {node}: sequence state reset (was {})",
                v.previous_seq.map_or("none".to_string(), |s| s.to_string())
            );
        }
        Command::Cancel { id, api } => {
            let cfg = cli.load_config()?;
            let e: views::Event = view(
                api_signed(
                    &cfg,
                    api,
                    reqwest::Method::POST,
                    &format!("/1/events/{}/cancel", segment(id)),
                )
                .await?,
            )?;
            out!("event {} is now {}", e.id, e.repair_status.as_str());
        }
        Command::Tags { cmd } => nodes::tags(&cli, cmd).await?,
        Command::Maintenance { cmd } => nodes::maintenance(&cli, cmd).await?,
        Command::Fences { cmd } => fences::fences(&cli, cmd).await?,
        Command::Fencing { cmd } => fences::fencing(&cli, cmd).await?,
        Command::Drill { node, wait, api } => return fences::drill(&cli, node, *wait, api).await,
        Command::Drills { json, api } => fences::drills(*json, api).await?,
        Command::Completions { shell } => {
            let mut script = Vec::new();
            manual::completions(*shell, &mut script);
            // A reader that stops early (`| head`) is its choice, not a failure.
            let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), &script);
        }
        Command::Manpages { dir } => {
            let pages = manual::man_pages(dir).map_err(|source| CliError::Manpages {
                dir: dir.display().to_string(),
                source,
            })?;
            for p in pages {
                out!("{}", p.display());
            }
        }
        Command::Crd => {
            out_raw!("{}", crate::cluster::kube::nodefence::crd_yaml());
        }
        Command::Store { cmd } => {
            let cfg = cli.load_config()?;
            out!("{}", store::run(&cfg, cmd).await?);
        }
        Command::Keygen {
            operator,
            node,
            generation,
            node_secret,
            out,
        } => {
            let what = keys::Keygen {
                operator: operator.as_deref(),
                node: node.as_deref(),
                generation: *generation,
                node_secret: *node_secret,
                out: out.clone(),
            };
            keys::keygen(&cli, what)?;
        }
        Command::Diagnose { .. } => {
            let cfg = cli.load_config()?;
            let node = cfg.node_name();
            let cred = crate::report::nodekey::Credential::load(&cfg.collector_key_files(), &node)?;
            let d = crate::collector::diagnose(&cfg.collector).await;
            let env = Envelope::new(&node, 1, now_ns(), d.at, &d.verdict, d.error.clone())
                .sign(cred.now().signer());
            let body = serde_json::to_vec(&env).expect("an envelope serializes");
            print_json(&ExactJson::parse(&body).expect("a serialized envelope is JSON"));
            if let Some(e) = d.error {
                eprintln!("maintd: diagnose error: {e}");
                return Ok(2);
            }
        }
        #[cfg(feature = "bench")]
        Command::Bench { cmd } => benches::run(cmd).await?,
        Command::RunJob { dir } => {
            crate::exec::jobs::run_job_main(dir, &crate::cluster::etcd::claims::EtcdClaimsFrom)
                .await
                .map_err(|source| CliError::RunJob {
                    dir: dir.display().to_string(),
                    source,
                })?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use uuid::Uuid;

    #[test]
    fn the_status_table_is_aligned_and_shows_notes() {
        let event = |id: u128, node: &str, action: &str, status: &str, jobs, note| {
            serde_json::from_value::<views::Event>(json!({
                "id": Uuid::from_u128(id), "node": node, "original": {}, "action": action,
                "repair-status": status, "jobs": jobs, "tag": "maintd:repairready:a",
                "tagged": false, "acknowledged": false, "superseded-by": null, "note": note,
                "created": 1, "updated": 1,
            }))
            .unwrap()
        };
        let job = json!([{"id":1,"kind":"evacuate","round":1,"status":"running","reason":"r",
            "detail":null,"created":1,"finished":null}]);
        let t = status_table(&[
            event(10, "n1", "evacuate", "pending", job, Value::Null),
            event(
                11,
                "node-2",
                "live-repair",
                "noted",
                json!([]),
                json!("waiting for round 3 to finish"),
            ),
            event(12, "node-3", "fence", "pending", json!([]), Value::Null),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("ID  ") && lines[0].contains("  NODE  "),
            "{t}"
        );
        assert!(lines[1].contains("1:evacuate:running"));
        assert!(lines[2].contains("(waiting for round 3 to finish)"));
        assert_eq!(lines[1].find("n1"), lines[2].find("node-2"));
        assert!(lines[3].contains("fence"), "{t}");
        assert_eq!(status_table(&[]), "no repair events\n");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(segment("maintd:repairready:x"), "maintd:repairready:x");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
