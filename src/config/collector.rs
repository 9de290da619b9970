//! The collector's settings: `[collector]`, its heartbeats and its watchdog.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::http::listener::ListenerLimits;
use crate::node::COLLECTOR_PORT;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CollectorConfig {
    /// This node's name as the daemon knows it; defaults to the host name.
    pub node: Option<String>,
    /// This node's key files: node keys (`maintd keygen --node`) or the cluster key. The first
    /// signs; every one is accepted on the master's requests (two while a key is rolled over).
    /// Empty: the cluster key (`cluster.key-file`).
    pub key_files: Vec<PathBuf>,
    pub listen: SocketAddr,
    /// Bare name of the diagnose command in `diagnose-dir`; empty = built-in (always Ok).
    pub diagnose: String,
    pub diagnose_dir: PathBuf,
    #[serde(with = "humantime_serde")]
    pub diagnose_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub diagnose_timeout: Duration,
    pub diagnose_output_cap: usize,
    pub repair_dir: PathBuf,
    #[serde(with = "humantime_serde")]
    pub repair_timeout: Duration,
    /// Environment given to diagnose and repair commands (nothing else is inherited but PATH).
    pub env: BTreeMap<String, String>,
    #[serde(with = "humantime_serde")]
    pub request_window: Duration,
    /// Where the collector keeps the journal of live repairs, so a repair request is run once
    /// even across restarts.
    pub state_dir: PathBuf,
    /// The kernel's boot id; another file (a container's, a test's) dates the boot by its mtime.
    pub boot_id_file: PathBuf,
    /// Connection caps and deadlines of the collector's listener.
    #[serde(deserialize_with = "collector_limits")]
    pub limits: ListenerLimits,
    /// Peer heartbeats over UDP on the `listen` port.
    pub heartbeat: HeartbeatConfig,
    /// Answer the daemon's signed report polls over UDP on the same port.
    pub poll_udp: bool,
    /// Self-fencing by watchdog; `[collector.watchdog]`.
    pub watchdog: WatchdogConfig,
}

/// The node's watchdog: fed only while the node is healthy by consensus.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct WatchdogConfig {
    pub enabled: bool,
    /// The Linux watchdog device (a FIFO read by a stand-in in tests).
    pub device: PathBuf,
    /// The device's timeout: set it in the driver (e.g. softdog's `soft_margin`); the collector
    /// checks it against sysfs where the device has an entry there.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub feed_interval: Duration,
    /// In contact with neither the master nor enough of its watchers for this long, the node
    /// takes itself for the isolated one and stops feeding.
    #[serde(with = "humantime_serde")]
    pub isolation_timeout: Duration,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            enabled: false,
            device: "/dev/watchdog".into(),
            timeout: Duration::from_secs(10),
            feed_interval: Duration::from_secs(1),
            isolation_timeout: Duration::from_secs(5),
        }
    }
}

/// How the heartbeats run; `[collector.heartbeat]`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HeartbeatConfig {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A peer not heard for this long is lost.
    #[serde(with = "humantime_serde")]
    pub lost_after: Duration,
    /// How far a heartbeat's timestamp may be from this node's clock.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Contact through the master's liveness probe counts for this long after the node sent
    /// the beat it rests on: the master's echo of the node's view (which comes with the next
    /// probe), or a beat of the node that a watcher the master reaches heard and the master saw
    /// in that watcher's view. A relay takes two probe cycles and a heartbeat or two, so this
    /// must be at least 2 x the probe cycle (fencing.liveness-interval or
    /// liveness-timeout-max, whichever is longer) + 2 x interval.
    #[serde(with = "humantime_serde")]
    pub master_lost_after: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval: Duration::from_millis(500),
            lost_after: Duration::from_secs(2),
            window: Duration::from_secs(10),
            master_lost_after: Duration::from_secs(4),
        }
    }
}

impl Default for CollectorConfig {
    fn default() -> Self {
        CollectorConfig {
            node: None,
            key_files: Vec::new(),
            listen: SocketAddr::from(([0, 0, 0, 0], COLLECTOR_PORT)),
            diagnose: String::new(),
            diagnose_dir: "/etc/maintd/diagnose.d".into(),
            diagnose_interval: Duration::from_secs(5),
            diagnose_timeout: Duration::from_secs(30),
            diagnose_output_cap: 64 * 1024,
            repair_dir: "/etc/maintd/repair.d".into(),
            repair_timeout: Duration::from_secs(600),
            env: BTreeMap::new(),
            request_window: Duration::from_secs(60),
            state_dir: "/var/lib/maintd-collector".into(),
            boot_id_file: crate::report::KERNEL_BOOT_ID.into(),
            limits: ListenerLimits::default(),
            heartbeat: Default::default(),
            poll_udp: true,
            watchdog: Default::default(),
        }
    }
}

/// The collector listener's limits: a key left out keeps the collector's default.
fn collector_limits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ListenerLimits, D::Error> {
    ListenerLimits::deserialize_over(d, ListenerLimits::default())
}
