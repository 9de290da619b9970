//! The node's watchdog (issue 13 §4, seed 003): arms the device, feeds it while the pure rules of
//! `fencing::selffence` say the node is healthy by consensus, stops for good when they say
//! otherwise, and disarms it with the magic close only on a clean stop that the master can see.
//!
//! The device speaks the Linux watchdog API at its simplest: opening arms it, any write feeds
//! it, and writing `V` before closing disarms it ("magic close"); closing without `V` leaves it
//! running, so a crashed collector still resets the node. Feeding happens on the collector's own
//! runtime: a hung collector stops feeding by itself.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::config::{HeartbeatConfig, WatchdogConfig};
use crate::fencing::selffence::{Feed, FeedInputs, FeedSettings, Reason, decide_feed};
use crate::report::{WatchdogReport, now_ns};
use crate::sync::RwLockExt;
use crate::verdict::Nanos;

use super::peers::Peers;

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error(
        "watchdog device {path}: {source} (load a watchdog driver, e.g. `modprobe softdog soft_margin=<timeout>`, or set collector.watchdog.device)"
    )]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "watchdog device {path} has a {device_s} s timeout but collector.watchdog.timeout is {config_s} s; they must agree (the master's safe time is computed from the configured one)"
    )]
    Timeout {
        path: String,
        device_s: u64,
        config_s: u64,
    },
}

/// The armed device.
pub struct Device {
    file: std::fs::File,
    path: PathBuf,
}

/// The timeout the kernel reports for the device, where sysfs has it (`/dev/watchdogN` and
/// `/dev/watchdog`, which is the first one).
fn sysfs_timeout(device: &Path) -> Option<u64> {
    let canonical = std::fs::canonicalize(device).ok()?;
    let name = canonical.file_name()?.to_str()?;
    let name = if name == "watchdog" {
        "watchdog0"
    } else {
        name
    };
    if !name.starts_with("watchdog") || !canonical.starts_with("/dev") {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/watchdog/{name}/timeout"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Device {
    /// Opens (arms) the device, after checking that its timeout is the configured one.
    pub fn arm(cfg: &WatchdogConfig) -> Result<Device, WatchdogError> {
        let path = cfg.device.display().to_string();
        if let Some(device_s) = sysfs_timeout(&cfg.device)
            && device_s != cfg.timeout.as_secs()
        {
            return Err(WatchdogError::Timeout {
                path,
                device_s,
                config_s: cfg.timeout.as_secs(),
            });
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&cfg.device)
            .map_err(|source| WatchdogError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(Device {
            file,
            path: cfg.device.clone(),
        })
    }

    fn feed(&mut self) -> std::io::Result<()> {
        self.file.write_all(b"1")?;
        self.file.flush()
    }

    /// The magic close: the driver stops the timer.
    fn disarm(mut self) {
        match self.file.write_all(b"V").and_then(|_| self.file.flush()) {
            Ok(()) => info!(device = %self.path.display(), "watchdog disarmed (magic close)"),
            Err(e) => {
                warn!(device = %self.path.display(), error = %e, "watchdog magic close failed; the node may reset")
            }
        }
    }
}

/// What the collector reports of its watchdog.
pub fn report(cfg: &WatchdogConfig, hb: &HeartbeatConfig) -> WatchdogReport {
    let ms = |d: Duration| d.as_millis() as u64;
    WatchdogReport {
        timeout_ms: ms(cfg.timeout),
        feed_interval_ms: ms(cfg.feed_interval),
        isolation_timeout_ms: ms(cfg.isolation_timeout),
        heartbeat_interval_ms: ms(hb.interval),
        lost_after_ms: ms(hb.lost_after),
    }
}

/// Feeds the device while the rules hold, until `stop` says to disarm. Returns once disarmed, or
/// never after the rules said stop (the watchdog then resets the node).
pub async fn run(
    mut device: Device,
    cfg: WatchdogConfig,
    hb: HeartbeatConfig,
    peers: Arc<Peers>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let settings = FeedSettings {
        master_fresh: hb.lost_after.as_nanos() as Nanos,
        isolation: cfg.isolation_timeout.as_nanos() as Nanos,
    };
    let armed_at = now_ns();
    *peers.watchdog.write_unpoisoned() = Some(report(&cfg, &hb));
    info!(device = %device.path.display(), timeout_s = cfg.timeout.as_secs(), "watchdog armed");
    let mut last_vouched: Option<Nanos> = None;
    let mut last_reason: Option<Reason> = None;
    let mut tick = tokio::time::interval(cfg.feed_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {
                // Said first, so the master never counts this node as self-fencing after it.
                *peers.watchdog.write_unpoisoned() = None;
                device.disarm();
                return;
            }
        }
        let now = now_ns();
        let (master_contact, master_marked, watchers) = peers.feed_view(now);
        let inputs = FeedInputs {
            now,
            master_contact,
            master_marked,
            watchers,
            last_vouched,
            armed_at,
        };
        match decide_feed(&inputs, &settings) {
            Feed::Feed { reason, vouched } => {
                if vouched {
                    last_vouched = Some(now);
                }
                if last_reason != Some(reason) {
                    info!(reason = reason.as_str(), "watchdog fed");
                    last_reason = Some(reason);
                }
                if let Err(e) = device.feed() {
                    warn!(device = %device.path.display(), error = %e, "cannot feed the watchdog");
                }
            }
            Feed::Starve(reason) => {
                error!(
                    reason = reason.as_str(),
                    timeout_s = cfg.timeout.as_secs(),
                    "watchdog no longer fed: this node resets within its timeout"
                );
                // Never fed again, and never disarmed: the master counts on the reset. The
                // device stays open (closing without `V` would not stop it either).
                let _keep = device;
                std::future::pending::<()>().await;
                return;
            }
        }
    }
}
