//! The one validated configuration: embedded defaults, overlaid by a TOML file, overlaid by flags.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::http::listener::ListenerLimits;
use crate::node::{NodeConfig, collector_address};

mod collector;
mod daemon_defaults;
pub use collector::{CollectorConfig, HeartbeatConfig, WatchdogConfig};

pub const DEFAULT_CONFIG: &str = "/etc/maintd/maintd.toml";
pub const DAEMON_PORT: u16 = 1816;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config: {0}")]
    Invalid(String),
    #[error("config: {0}")]
    Fencing(#[from] crate::fencing::config::FencingConfigError),
    #[error("config: {0}")]
    Kubernetes(#[from] crate::cluster::kube::KubeConfigError),
    #[error("config: {0}")]
    Limits(#[from] crate::http::listener::LimitsError),
    #[error("config: {0}")]
    Store(#[from] crate::cluster::etcd::StoreConfigError),
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    pub cluster: ClusterConfig,
    pub daemon: DaemonConfig,
    pub collector: CollectorConfig,
    pub actions: maintd_core::repair::Policy,
    pub inventory: InventoryConfig,
    pub nodes: Vec<NodeConfig>,
    pub fencing: crate::fencing::config::FencingConfig,
    pub kubernetes: crate::cluster::kube::KubeConfig,
    pub ganeti: crate::cluster::ganeti::GanetiConfig,
    pub store: crate::cluster::etcd::StoreConfig,
    /// This host's name, resolved once at load (`resolve_environment`).
    #[serde(skip)]
    pub host: String,
    /// The file this was read from, read again on SIGHUP; `None` for the embedded defaults.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClusterConfig {
    /// The HMAC key shared by the daemon, the collectors and the CLI (hex, mode 0600).
    pub key_file: PathBuf,
    /// Which cluster backend the daemon drives: "inventory" (the embedded default),
    /// "kubernetes" or "ganeti".
    pub backend: Backend,
}

/// The cluster backend the daemon drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Backend {
    /// The local inventory (the embedded default): tags and offline flags in the state
    /// database, jobs as hooks.
    Inventory,
    Kubernetes,
    /// A Ganeti cluster, over its remote API.
    Ganeti,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DaemonConfig {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    /// SQLite database; defaults to `<state-dir>/state.db`.
    pub db: Option<PathBuf>,
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub poll_timeout: Duration,
    pub poll_concurrency: usize,
    /// Connections to collectors open at most (the poll's, the liveness probe's and live
    /// repairs'): those kept open between requests, plus room for the poll's and the probe's
    /// requests in flight. Collectors beyond the kept set connect afresh each time.
    pub poll_connections: usize,
    /// Poll each collector over UDP first (one signed datagram each way), over HTTP when the
    /// report does not fit or no answer comes.
    pub poll_udp: bool,
    /// No longer used: a report is fresh because it answers the poll's nonce, never by its
    /// timestamp. Kept so that configuration files that set it still load.
    #[serde(with = "humantime_serde")]
    pub report_window: Duration,
    pub max_report_bytes: usize,
    /// How far a signed API request's timestamp may be from the daemon's clock.
    #[serde(with = "humantime_serde")]
    pub request_window: Duration,
    /// Whitelist directory of the inventory hooks.
    pub repair_dir: PathBuf,
    #[serde(with = "humantime_serde")]
    pub hook_timeout: Duration,
    /// Extra environment for the inventory hooks (nothing else is inherited but PATH).
    pub hook_env: BTreeMap<String, String>,
    /// How long the daemon waits for a live repair on a collector before failing the job.
    #[serde(with = "humantime_serde")]
    pub live_repair_timeout: Duration,
    /// `/1/health` fails when no decision completed for this long.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
    /// Connection caps and deadlines of the API listener.
    #[serde(deserialize_with = "daemon_limits")]
    pub limits: ListenerLimits,
    /// Who may sign operator commands, by name. While none is listed the cluster key may still
    /// (the first step of an upgrade); once one is, only operator keys may.
    pub operators: BTreeMap<String, OperatorConfig>,
    /// The API's reads answer unsigned requests. When false, they need an operator's signed
    /// request (either role); `/1/health`, `/metrics` and the status page's files stay open.
    pub anonymous_read: bool,
    /// The API's certificate chain (PEM); with `tls-key-file` the API speaks HTTPS only.
    /// Reloaded on SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// The API certificate's private key (PEM, owner-only).
    pub tls_key_file: Option<PathBuf>,
    /// Serve plain HTTP on an address other than loopback: without TLS such a listener is
    /// refused unless this says so.
    pub plain_http: bool,
    /// A second listener serving only `/metrics` and `/1/health`, on a thread of its own: a
    /// scraper or a health check is answered at once however many readers the API has.
    pub metrics_listen: Option<SocketAddr>,
    /// A key per node, derived from a secret only the master holds: `[daemon.node-keys]`.
    pub node_keys: crate::report::keyring::NodeKeysConfig,
}

pub use crate::report::operator::OperatorConfig;

/// The API listener's limits: a key left out keeps the daemon's default (its caps are higher
/// than a collector's, as every operator and tool connects to it).
fn daemon_limits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ListenerLimits, D::Error> {
    ListenerLimits::deserialize_over(d, DaemonConfig::default().limits)
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct InventoryConfig {
    pub hooks: crate::cluster::HooksConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            key_file: "/etc/maintd/cluster.key".into(),
            backend: Backend::Inventory,
        }
    }
}

impl Config {
    /// Loads `path`, or the default path if it exists, or the embedded defaults. A path given
    /// explicitly must exist.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        if !explicit && !path.exists() {
            return Ok(Config::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let cfg = Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })?;
        Ok(Config {
            source: Some(path),
            ..cfg
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<text>".into(),
            message: e.to_string(),
        })?;
        // On a Ganeti node the collector's default port is Ganeti's free one (its monitoring
        // daemon holds 1815), unless the file names a listen address.
        if cfg.cluster.backend == Backend::Ganeti {
            let raw: toml::Table = toml::from_str(text).unwrap_or_default();
            let named = raw.get("collector").and_then(|c| c.get("listen")).is_some();
            if !named {
                cfg.collector.listen.set_port(cfg.ganeti.collector_port);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// What only the backend in force decides (the command line may choose it): agents run as
    /// Jobs need Kubernetes.
    pub fn validate_backend(&self) -> Result<(), ConfigError> {
        use crate::cluster::etcd::{StoreBackend, StoreConfigError};
        if self.store.backend == StoreBackend::Etcd && self.cluster.backend != Backend::Inventory {
            return Err(StoreConfigError::NotInventory.into());
        }
        let kube = self.cluster.backend == Backend::Kubernetes;
        Ok(self
            .fencing
            .check_jobs(Some(kube), self.cluster.backend.as_str())?)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let mut seen = BTreeSet::new();
        for n in &self.nodes {
            if crate::exec::validate_name(&n.name).is_err() {
                return bad(format!("node name {:?} must be [A-Za-z0-9._-]", n.name));
            }
            if !seen.insert(n.name.as_str()) {
                return bad(format!("node {:?} is listed twice", n.name));
            }
            if let Err(e) = collector_address(&n.collector) {
                return bad(format!("node {:?}: {e}", n.name));
            }
        }
        let d = &self.daemon;
        for (name, v) in [
            ("daemon.poll-interval", d.poll_interval),
            ("daemon.poll-timeout", d.poll_timeout),
            ("daemon.report-window", d.report_window),
            ("daemon.hook-timeout", d.hook_timeout),
            ("daemon.live-repair-timeout", d.live_repair_timeout),
            (
                "collector.diagnose-interval",
                self.collector.diagnose_interval,
            ),
            (
                "collector.diagnose-timeout",
                self.collector.diagnose_timeout,
            ),
            ("collector.repair-timeout", self.collector.repair_timeout),
        ] {
            if v.is_zero() {
                return bad(format!("{name} must be greater than zero"));
            }
        }
        self.kubernetes.validate()?;
        self.store.validate()?;
        (self.kubernetes)
            .check_witness_timing(self.fencing.grace, self.fencing.liveness_interval)?;
        self.fencing.check_jobs(None, "")?;
        for (what, l) in [
            ("daemon.limits", &d.limits),
            ("collector.limits", &self.collector.limits),
        ] {
            l.validate(what)?;
        }
        match (&d.tls_cert_file, &d.tls_key_file) {
            (Some(_), None) | (None, Some(_)) => {
                return bad(
                    "daemon.tls-cert-file and daemon.tls-key-file go together: set both or neither"
                        .into(),
                );
            }
            (None, None) if !d.listen.ip().is_loopback() && !d.plain_http => {
                return bad(format!(
                    "daemon.listen {} is reachable from the network, and the API carries operators' commands: serve it over TLS (daemon.tls-cert-file and daemon.tls-key-file), or set daemon.plain-http = true to serve plain HTTP anyway",
                    d.listen
                ));
            }
            _ => {}
        }
        if d.metrics_listen == Some(d.listen) {
            return bad(format!(
                "daemon.metrics-listen {} is daemon.listen: give the metrics listener an address of its own, or leave it out (the API serves /metrics too)",
                d.listen
            ));
        }
        for (name, o) in &d.operators {
            if !crate::report::operator::valid_operator_name(name) {
                return bad(format!(
                    "daemon.operators.{name}: not an operator name (1 to 64 of a-z, 0-9, '.', '_', '@', '-')"
                ));
            }
            if o.key_files.is_empty() || o.key_files.len() > 2 {
                return bad(format!(
                    "daemon.operators.{name}: key-files must list one key file, or two while a key is rolled over"
                ));
            }
        }
        let nk = &d.node_keys;
        let node_name = |n: &String| {
            n.len() <= crate::report::heartbeat::MAX_NAME && crate::exec::validate_name(n).is_ok()
        };
        if let Some(n) = nk
            .revoked
            .iter()
            .chain(nk.nodes.keys())
            .find(|n| !node_name(n))
        {
            return bad(format!(
                "daemon.node-keys: {n:?} is not a node name (1-64 characters of [A-Za-z0-9._-])"
            ));
        }
        if self.collector.key_files.len() > 2 {
            return bad(
                "collector.key-files lists at most two key files: the one the collector signs with, and one more while a key is rolled over"
                    .into(),
            );
        }
        if d.stall_after < d.poll_interval * 2 {
            return bad(format!(
                "daemon.stall-after ({:?}) must be at least two poll intervals ({:?})",
                d.stall_after,
                d.poll_interval * 2
            ));
        }
        let hb = &self.collector.heartbeat;
        if hb.interval.is_zero() || hb.lost_after < hb.interval * 2 || hb.window.is_zero() {
            return bad(
                "collector.heartbeat: interval and window must be greater than zero, and lost-after at least two intervals"
                    .into(),
            );
        }
        // A relay takes a heartbeat to the watcher, a probe for the master to see it in the
        // watcher's view, the next probe to acknowledge that view, and a heartbeat back.
        let cycle = self
            .fencing
            .liveness_interval
            .max(self.fencing.liveness_timeout_max);
        let relay_needs = cycle * 2 + hb.interval * 2;
        if hb.master_lost_after < hb.lost_after || hb.master_lost_after < relay_needs {
            return bad(format!(
                "collector.heartbeat.master-lost-after ({:?}) must be at least lost-after ({:?}) and 2 x the probe cycle (fencing.liveness-interval or liveness-timeout-max) + 2 x interval ({:?}): contact through the master's probe takes that long to come back",
                hb.master_lost_after, hb.lost_after, relay_needs
            ));
        }
        let wd = &self.collector.watchdog;
        if wd.enabled
            && (wd.timeout < Duration::from_secs(1)
                || wd.feed_interval.is_zero()
                || wd.feed_interval * 2 > wd.timeout
                || wd.isolation_timeout < hb.lost_after)
        {
            return bad(
                "collector.watchdog: timeout at least 1 s, feed-interval above zero and at most half the timeout, isolation-timeout at least collector.heartbeat.lost-after"
                    .into(),
            );
        }
        if d.poll_concurrency == 0 || d.poll_connections <= d.poll_concurrency {
            return bad(format!(
                "daemon.poll-concurrency must be at least 1 and below daemon.poll-connections ({})",
                d.poll_connections
            ));
        }
        if !self.collector.diagnose.is_empty()
            && crate::exec::validate_name(&self.collector.diagnose).is_err()
        {
            return bad(format!(
                "collector.diagnose {:?} must be a bare name of [A-Za-z0-9._-] in diagnose-dir",
                self.collector.diagnose
            ));
        }
        Ok(())
    }

    /// The poller's settings.
    pub fn poll_settings(&self) -> crate::repair::poller::PollSettings {
        crate::repair::poller::PollSettings {
            rules: crate::report::VerifyRules {
                max_bytes: self.daemon.max_report_bytes,
            },
            concurrency: self.daemon.poll_concurrency,
            timeout: self.daemon.poll_timeout,
        }
    }

    /// How the fencer uses the peers: a view counts for three liveness intervals (at least the
    /// collectors' `lost-after`), so a watcher missing one probe is still heard.
    pub fn peering_settings(&self) -> crate::fencing::peering::PeeringSettings {
        crate::fencing::peering::PeeringSettings {
            watchers: self.fencing.watchers,
            fresh_for: (self.fencing.liveness_interval * 3)
                .max(self.collector.heartbeat.lost_after),
        }
    }

    /// The inventory backend's settings.
    pub fn inventory_settings(&self) -> crate::cluster::InventorySettings {
        crate::cluster::InventorySettings {
            nodes: self.nodes.iter().map(|n| n.name.clone()).collect(),
            repair_dir: self.daemon.repair_dir.clone(),
            hooks: self.inventory.hooks.clone(),
            hook_timeout: self.daemon.hook_timeout,
            hook_env: self.daemon.hook_env.clone().into_iter().collect(),
            jobs_dir: self.daemon.state_dir.join("jobs"),
            actions: self.actions,
            fencing: !self.fencing.nodes.is_empty(),
            self_fencing: self.fencing.nodes.values().any(|n| n.self_fence),
            claims: self.store.shared(),
        }
    }

    pub fn db_path(&self) -> PathBuf {
        self.daemon
            .db
            .clone()
            .unwrap_or_else(|| self.daemon.state_dir.join("state.db"))
    }

    /// Resolves, once, what the file leaves to the environment: this host's name, the
    /// collector's node name (the host name), the leader-election namespace and identity. Every
    /// part then reads the resolved value.
    pub fn resolve_environment(&mut self) {
        if self.host.is_empty() {
            self.host = nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default();
        }
        if self.collector.node.is_none() {
            let host = (!self.host.is_empty()).then(|| self.host.clone());
            self.collector.node = Some(host.unwrap_or_else(|| "localhost".into()));
        }
        self.kubernetes.leader_election.resolve(&self.host);
        // Events name the replica (its Pod), not the host it runs on.
        self.kubernetes.instance = self.kubernetes.leader_election.identity();
    }

    pub fn node_name(&self) -> String {
        self.collector
            .node
            .clone()
            .unwrap_or_else(|| "localhost".into())
    }

    /// The collector's key files: its own, or else the cluster key.
    pub fn collector_key_files(&self) -> Vec<PathBuf> {
        if self.collector.key_files.is_empty() {
            vec![self.cluster.key_file.clone()]
        } else {
            self.collector.key_files.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_resolved_once_and_explicit_values_stay() {
        let mut cfg = Config::default();
        cfg.resolve_environment();
        assert!(!cfg.host.is_empty(), "the host name is known");
        let le = &cfg.kubernetes.leader_election;
        let pod = std::env::var("POD_NAME").ok().filter(|s| !s.is_empty());
        assert_eq!(le.identity, Some(pod.unwrap_or_else(|| cfg.host.clone())));
        assert!(le.namespace.as_deref().is_some_and(|n| !n.is_empty()));
        assert_eq!(cfg.collector.node.as_deref(), Some(cfg.host.as_str()));
        assert_eq!(cfg.kubernetes.instance, le.identity());
        let mut explicit = Config::default();
        explicit.collector.node = Some("n7".into());
        explicit.kubernetes.leader_election.identity = Some("replica-a".into());
        explicit.kubernetes.leader_election.namespace = Some("ops".into());
        explicit.resolve_environment();
        assert_eq!(explicit.node_name(), "n7");
        assert_eq!(explicit.kubernetes.leader_election.identity(), "replica-a");
        assert_eq!(explicit.kubernetes.leader_election.namespace(), "ops");
    }

    /// A storage Lease renewed too seldom to veto within the grace is refused at start, with
    /// the numbers; one renewed often enough (the 2.5 s of a typical storage agent) is taken.
    #[test]
    fn a_witness_that_could_never_veto_in_time_is_refused() {
        let lease = |every: &str| {
            format!(
                "[[kubernetes.storage-leases]]\nnamespace = \"storage\"\nname = \"{{node}}-storage\"\nrenew-interval = \"{every}\"\n"
            )
        };
        assert!(Config::parse(&lease("2500ms")).is_ok());
        let e = Config::parse(&lease("4s")).unwrap_err().to_string();
        assert!(
            e.contains("storage/{node}-storage") && e.contains("could never veto"),
            "{e}"
        );
        let slower = format!("{}[fencing]\ngrace = \"10s\"\n", lease("4s"));
        assert!(Config::parse(&slower).is_ok(), "a longer grace takes it");
    }

    /// The `toml` block after the heading `heading` of the configuration reference.
    fn reference_block(heading: &str) -> &'static str {
        let doc = include_str!("../docs/configuration.md");
        let at = doc
            .find(heading)
            .expect("the heading is in docs/configuration.md");
        let rest = &doc[at..];
        let start = rest.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let len = rest[start..].find("```").expect("the block ends");
        &rest[start..start + len]
    }

    /// The configuration reference is what the parser reads, and every value it shows
    /// is the embedded default (unknown keys are errors, so a stale or misspelt key fails too).
    #[test]
    fn the_configuration_reference_is_the_parsers_defaults() {
        let text = reference_block("\n## Daemon, collector and inventory\n");
        let c = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let d = Config::default();
        assert_eq!(c.cluster, d.cluster);
        assert_eq!(c.daemon, d.daemon);
        assert_eq!(c.collector, d.collector);
        assert_eq!(c.actions, d.actions);
        assert_eq!(c.inventory, d.inventory);
        assert_eq!(c.nodes.len(), 1, "the example inventory");
    }

    /// The fields the parser knows in `section`, as serde names them when it refuses an unknown
    /// one ("unknown field `x`, expected one of `a`, `b`").
    fn known_fields(section: &str) -> Vec<String> {
        let text = format!("[{section}]\nnot-a-key = 1\n");
        let err = toml::from_str::<Config>(&text).expect_err("unknown keys are errors");
        let msg = err.to_string();
        let list = msg
            .split("expected one of ")
            .nth(1)
            .or_else(|| msg.split("expected ").nth(1))
            .unwrap_or_else(|| panic!("{section}: {msg}"));
        list.split(',')
            .filter_map(|f| f.split('`').nth(1))
            .map(String::from)
            .collect()
    }

    #[test]
    fn a_ganeti_nodes_collector_leaves_1815_to_ganetis_monitoring_daemon() {
        let c = Config::parse("[cluster]\nbackend = \"ganeti\"\n").unwrap();
        assert_eq!(c.collector.listen.port(), 1817);
        let c = Config::parse("[cluster]\nbackend = \"ganeti\"\n[ganeti]\ncollector-port = 1900\n")
            .unwrap();
        assert_eq!(c.collector.listen.port(), 1900);
        let named = "[cluster]\nbackend = \"ganeti\"\n[collector]\nlisten = \"0.0.0.0:1815\"\n";
        assert_eq!(Config::parse(named).unwrap().collector.listen.port(), 1815);
        assert_eq!(Config::parse("").unwrap().collector.listen.port(), 1815);
    }

    /// And the reference lists every key the parser knows, section by section.
    #[test]
    fn the_store_reference_is_the_parsers_defaults() {
        let text = reference_block("\n## Store\n");
        let c = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(c.store, crate::cluster::etcd::StoreConfig::default());
        // The optional keys shown commented out parse too.
        let all = text
            .replace("# ca-file", "ca-file")
            .replace("# cert-file", "cert-file");
        let all = all
            .replace("# key-file", "key-file")
            .replace("# identity", "identity");
        let c = Config::parse(&all).unwrap_or_else(|e| panic!("{e}\n{all}"));
        assert_eq!(c.store.identity("host"), "master1");
    }

    #[test]
    fn etcd_is_for_the_inventory_backend_only() {
        let mut c = Config::parse("[store]\nbackend = \"etcd\"\n").unwrap();
        c.validate_backend().unwrap();
        c.cluster.backend = Backend::Ganeti;
        let e = c.validate_backend().unwrap_err().to_string();
        assert!(
            e.contains("store.backend = \"etcd\" is for the inventory backend"),
            "{e}"
        );
        let e = Config::parse("[store]\nbackend = \"etcd\"\nendpoints = []\n").unwrap_err();
        assert!(e.to_string().contains("store.endpoints"), "{e}");
    }

    #[test]
    fn the_ganeti_reference_is_the_parsers_defaults() {
        let text = reference_block("\n## Ganeti\n");
        let c = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(c.ganeti, crate::cluster::ganeti::GanetiConfig::default());
    }

    #[test]
    fn the_configuration_reference_lists_every_key() {
        let reference = reference_block("\n## Daemon, collector and inventory\n");
        let fencing = reference_block("\n## Fencing\n");
        let kubernetes = reference_block("\n## Kubernetes\n");
        let ganeti = reference_block("\n## Ganeti\n");
        let store = reference_block("\n## Store\n");
        for (section, text) in [
            ("cluster", reference),
            ("daemon", reference),
            ("daemon.limits", reference),
            ("daemon.operators.alice", reference),
            ("daemon.node-keys", reference),
            ("daemon.node-keys.nodes.node1", reference),
            ("actions", reference),
            ("inventory.hooks", reference),
            ("collector", reference),
            ("collector.limits", reference),
            ("collector.heartbeat", reference),
            ("collector.watchdog", reference),
            ("fencing", fencing),
            ("kubernetes", kubernetes),
            ("kubernetes.leader-election", kubernetes),
            ("ganeti", ganeti),
            ("store", store),
        ] {
            let fields = known_fields(section);
            assert!(!fields.is_empty(), "{section}");
            for f in fields {
                let listed = text
                    .lines()
                    .map(|l| l.trim_start_matches("# ").trim_start())
                    .any(|l| {
                        l.starts_with(&format!("{f} ="))
                            || l.starts_with(&format!("[{f}"))
                            || l.starts_with(&format!("[{section}.{f}"))
                            || l.starts_with(&format!("[[{f}"))
                            || l.starts_with(&format!("[[{section}.{f}"))
                    });
                assert!(listed, "[{section}] {f} is not in docs/configuration.md");
            }
        }
    }

    /// The same for the fencing reference: every scalar it shows is the default, and its
    /// templates and nodes parse.
    #[test]
    fn the_fencing_reference_is_the_parsers_defaults() {
        let text = reference_block("\n## Fencing\n");
        let c: Config = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut f = c.fencing.clone();
        assert!(!f.templates.is_empty() && !f.nodes.is_empty());
        f.templates.clear();
        f.nodes.clear();
        assert_eq!(f, crate::fencing::config::FencingConfig::default());
    }

    #[test]
    fn embedded_defaults_are_valid() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.daemon.listen.port(), 1816);
        assert_eq!(c.collector.listen.port(), 1815);
        assert_eq!(c.db_path(), PathBuf::from("/var/lib/maintd/state.db"));
    }

    #[test]
    fn parses_a_full_file() {
        let c = Config::parse(
            r#"
            [cluster]
            key-file = "/k"
            [daemon]
            poll-interval = "1s"
            state-dir = "/tmp/s"
            [actions]
            evacuate-failover = false
            [[nodes]]
            name = "n1"
            collector = "127.0.0.1:9000"
            [[nodes]]
            name = "n2"
            collector = "n2.example"
            "#,
        )
        .unwrap();
        assert_eq!(c.daemon.poll_interval, Duration::from_secs(1));
        assert!(!c.actions.evacuate_failover && c.actions.evacuate);
        assert_eq!(
            collector_address(&c.nodes[1].collector).unwrap(),
            "n2.example:1815"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |t: &str| Config::parse(t).unwrap_err().to_string();
        assert!(err("[daemon]\npoll-interval = \"soon\"").contains("poll-interval"));
        assert!(err("[daemon]\nbogus = 1").contains("bogus"));
        assert!(
            err(
                "[[nodes]]\nname=\"a\"\ncollector=\"x:1\"\n[[nodes]]\nname=\"a\"\ncollector=\"y:1\""
            )
            .contains("twice")
        );
        assert!(err("[[nodes]]\nname=\"a/b\"\ncollector=\"x:1\"").contains("a/b"));
        assert!(err("[[nodes]]\nname=\"a\"\ncollector=\"x:99999\"").contains("bad port"));
        assert!(err("[collector]\ndiagnose = \"../x\"").contains("bare name"));
        assert!(err("[daemon]\npoll-interval = \"0s\"").contains("greater than zero"));
        let e = err("[cluster]\nbackend = \"nope\"");
        assert!(
            e.contains("`inventory`, `kubernetes`, `ganeti`") && e.contains("nope"),
            "{e}"
        );
        assert!(
            err("[kubernetes]\nevents-namespace = \"maintd\"")
                .contains("accepted only in \"default\"")
        );
    }

    /// A listener others can reach carries operators' commands: TLS, or plain HTTP by
    /// explicit choice; certificate and key go together.
    #[test]
    fn a_network_listener_needs_tls_or_an_explicit_plain_http() {
        let err = |t: &str| Config::parse(t).unwrap_err().to_string();
        assert_eq!(
            Config::default().daemon.listen.to_string(),
            "127.0.0.1:1816"
        );
        let open = "[daemon]\nlisten = \"0.0.0.0:1816\"\n";
        assert!(err(open).contains("plain-http = true"), "{}", err(open));
        assert!(Config::parse(&format!("{open}plain-http = true\n")).is_ok());
        let tls = "tls-cert-file = \"/c.pem\"\ntls-key-file = \"/k.pem\"\n";
        assert!(Config::parse(&format!("{open}{tls}")).is_ok());
        let half = format!("{open}tls-cert-file = \"/c.pem\"\n");
        assert!(err(&half).contains("go together"), "{}", err(&half));
        assert!(Config::parse("[daemon]\nlisten = \"[::1]:1816\"\n").is_ok());
        // The metrics listener has an address of its own, and needs no TLS: it serves no
        // command and nothing secret.
        let same = "[daemon]\nmetrics-listen = \"127.0.0.1:1816\"\n";
        assert!(err(same).contains("daemon.metrics-listen"), "{}", err(same));
        let lane = "[daemon]\nmetrics-listen = \"0.0.0.0:9816\"\n";
        assert_eq!(
            Config::parse(lane).unwrap().daemon.metrics_listen,
            Some("0.0.0.0:9816".parse().unwrap())
        );
    }

    /// Setting one key of a `[*.limits]` table changes that key only: every other key keeps
    /// the default of its own listener (the daemon's caps are not the collector's).
    #[test]
    fn a_partial_limits_table_keeps_every_other_key_at_its_listeners_default() {
        let daemon = Config::default().daemon.limits;
        let collector = Config::default().collector.limits;
        assert_ne!(daemon.max_connections, collector.max_connections);
        type Set = fn(&mut ListenerLimits);
        let keys: [(&str, &str, Set); 6] = [
            ("max-connections", "2000", |l| l.max_connections = 2000),
            ("max-connections-per-ip", "3", |l| {
                l.max_connections_per_ip = 3
            }),
            ("header-timeout", "\"7s\"", |l| {
                l.header_timeout = Duration::from_secs(7)
            }),
            ("idle-timeout", "\"8s\"", |l| {
                l.idle_timeout = Duration::from_secs(8)
            }),
            ("body-timeout", "\"9s\"", |l| {
                l.body_timeout = Duration::from_secs(9)
            }),
            ("request-timeout", "\"11s\"", |l| {
                l.request_timeout = Duration::from_secs(11)
            }),
        ];
        for (key, value, set) in keys {
            for (section, base) in [("daemon", daemon), ("collector", collector)] {
                let text = format!("[{section}.limits]\n{key} = {value}\n");
                let c = Config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                let got = if section == "daemon" {
                    c.daemon.limits
                } else {
                    c.collector.limits
                };
                let mut want = base;
                set(&mut want);
                assert_eq!(got, want, "{text}");
            }
        }
        let e = Config::parse("[daemon.limits]\nmax-conections = 5\n").unwrap_err();
        assert!(e.to_string().contains("max-conections"), "{e}");
    }

    /// Remedies and agents run as Jobs: a definition that cannot work is refused at load, with
    /// the remedy or template named.
    #[test]
    fn remedies_and_agent_jobs_are_checked_at_load() {
        let err = |t: &str| Config::parse(t).unwrap_err().to_string();
        let ok = "[kubernetes.remedies.reboot]\nplacement = \"elsewhere\"\ndeadline = \"2m\"\ntemplate = \"\"\"\nspec:\n  containers:\n  - name: r\n    image: img\n\"\"\"\n";
        let c = Config::parse(ok).unwrap();
        let r = &c.kubernetes.remedies["reboot"];
        assert_eq!(r.deadline, Duration::from_secs(120));
        assert_eq!(r.ttl, Duration::from_secs(3600));
        let e = err(&ok.replace("containers:\n  - name: r\n    image: img", "containers: []"));
        assert!(
            e.contains("remedy \"reboot\"") && e.contains("no container"),
            "{e}"
        );
        let e = err(&ok.replace("reboot", "\"Reboot!\""));
        assert!(e.contains("not a remedy name"), "{e}");
        let e = err(&format!("{ok}restartPolicy = 1"));
        assert!(e.contains("restartPolicy"), "{e}");
        let e = err("[kubernetes]\nmax-remedies = 0");
        assert!(e.contains("max-remedies"), "{e}");
        let job = "[fencing.templates.ipmi]\nagent = \"fence_ipmilan\"\nexecutor = \"job\"\n";
        let on_inventory =
            Config::parse(&format!("[fencing]\nagent-image = \"fa:1\"\n{job}")).unwrap();
        let e = on_inventory.validate_backend().unwrap_err().to_string();
        assert!(
            e.contains("fencing.templates.ipmi") && e.contains("inventory backend"),
            "{e}"
        );
        let e = err(&format!("[cluster]\nbackend = \"kubernetes\"\n{job}"));
        assert!(e.contains("agent-image"), "{e}");
        let c = Config::parse(&format!(
            "[cluster]\nbackend = \"kubernetes\"\n[fencing]\nagent-image = \"fa:1\"\n{job}"
        ))
        .unwrap();
        c.validate_backend().unwrap();
        assert_eq!(
            c.fencing.templates["ipmi"].executor,
            crate::fencing::config::Executor::Job
        );
    }
}
