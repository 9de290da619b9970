//! The node's watchdog: arms the device, feeds it while the pure rules of
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

use crate::clock::mono_ns;
use crate::config::{HeartbeatConfig, WatchdogConfig};
use crate::report::WatchdogReport;
use crate::sync::RwLockExt;
use maintd_core::fencing::selffence::{Feed, FeedInputs, FeedSettings, Reason, decide_feed};
use maintd_core::verdict::Nanos;

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
        "watchdog device {path} has a {device_s} s timeout but collector.watchdog.timeout is {config_s} s; they must agree (the master's proof of a reset counts on the configured one)"
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
        master_lost_after_ms: ms(hb.master_lost_after),
    }
}

/// What this boot's earlier collector processes left: when a rule last kept the node fed
/// (seconds since boot, written at most every quarter of the isolation timeout, so never later
/// than the truth), and whether it starved. The master's proof of a reset counts on a node that
/// stopped feeding never feeding again, and on its isolation timeout running from its last
/// contact: a collector that crashes and is restarted on the same boot must not start either
/// afresh. A reboot has a new boot id, and starts afresh.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FeedRecord {
    pub boot_id: String,
    pub vouched_at: Option<f64>,
    pub starved: bool,
}

/// How a (re)started feeder begins, from this boot's record: never feeding, or waiting for
/// contact from a moment on its own monotonic clock (`now` is that clock, `uptime` seconds since
/// boot at the same moment).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resume {
    Never,
    WaitingFrom(Nanos),
}

pub fn resume(earlier: Option<&FeedRecord>, boot: &str, now: Nanos, uptime: Option<f64>) -> Resume {
    let Some(r) = earlier.filter(|r| r.boot_id == boot && !boot.is_empty()) else {
        return Resume::WaitingFrom(now);
    };
    if r.starved {
        return Resume::Never;
    }
    match (r.vouched_at, uptime) {
        (Some(v), Some(u)) => {
            let ago = ((u - v).max(0.0) * 1e9) as Nanos;
            Resume::WaitingFrom(now.saturating_sub(ago))
        }
        // Recorded without a time, or no uptime to place it: no grace at all.
        _ => Resume::WaitingFrom(Nanos::MIN / 2),
    }
}

/// Seconds since boot (suspend included), as the kernel counts them for every process alike.
fn since_boot() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn read_record(path: &Path) -> Option<FeedRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn keep(path: &Path, r: &FeedRecord) {
    let bytes = serde_json::to_vec(r).unwrap_or_default();
    if let Err(e) = crate::fsutil::write_atomic(path, &bytes) {
        warn!(file = %path.display(), error = %e, "cannot record the watchdog's state");
    }
}

/// Feeds the device while the rules hold, until `stop` says to disarm. Returns once disarmed, or
/// never after the rules said stop (the watchdog then resets the node). `record` keeps the
/// feeding state across restarts of the collector on the same boot, `boot` (the boot id its
/// reports carry, from `boot-id-file`): one notion of a boot for the reports and the watchdog.
pub async fn run(
    mut device: Device,
    cfg: WatchdogConfig,
    hb: HeartbeatConfig,
    peers: Arc<Peers>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    record: std::path::PathBuf,
    boot: String,
) {
    let settings = FeedSettings {
        lost_after: hb.lost_after.as_nanos() as Nanos,
        master_lost_after: hb.master_lost_after.as_nanos() as Nanos,
        isolation: cfg.isolation_timeout.as_nanos() as Nanos,
    };
    // Every time here is the monotonic clock: setting the wall clock never feeds the watchdog.
    let now = mono_ns();
    let armed_at = match resume(read_record(&record).as_ref(), &boot, now, since_boot()) {
        Resume::WaitingFrom(t) => t,
        Resume::Never => {
            error!(
                device = %device.path.display(),
                "this node stopped feeding its watchdog earlier in this boot: it is never fed again, and resets within its timeout"
            );
            let _keep = device;
            std::future::pending::<()>().await;
            return;
        }
    };
    // Placed on the kernel's since-boot clock, for a later process of this boot.
    let uptime_of = |t: Nanos| since_boot().map(|u| u - (mono_ns() - t) as f64 / 1e9);
    let mut kept = FeedRecord {
        boot_id: boot,
        vouched_at: uptime_of(armed_at.max(now - 3_600_000_000_000)),
        starved: false,
    };
    keep(&record, &kept);
    let every = (cfg.isolation_timeout / 4).as_nanos() as Nanos;
    let mut written = now;
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
                let _ = std::fs::remove_file(&record);
                return;
            }
        }
        let now = mono_ns();
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
                    // Now and then, never ahead of the truth: a restart waits from then.
                    if now - written >= every {
                        kept.vouched_at = uptime_of(now);
                        keep(&record, &kept);
                        written = now;
                    }
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
                kept.starved = true;
                keep(&record, &kept);
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn rec(boot: &str, vouched_at: Option<f64>, starved: bool) -> FeedRecord {
        FeedRecord {
            boot_id: boot.into(),
            vouched_at,
            starved,
        }
    }

    #[test]
    fn a_restart_on_the_same_boot_never_feeds_a_starved_node_nor_restarts_its_grace() {
        let now = 1000 * S;
        // A fresh boot, or no record: the whole grace from now.
        assert_eq!(
            resume(None, "b1", now, Some(50.0)),
            Resume::WaitingFrom(now)
        );
        let other = rec("b0", Some(10.0), true);
        assert_eq!(
            resume(Some(&other), "b1", now, Some(50.0)),
            Resume::WaitingFrom(now)
        );
        // The same boot: a starved node stays starved.
        let starved = rec("b1", Some(40.0), true);
        assert_eq!(resume(Some(&starved), "b1", now, Some(50.0)), Resume::Never);
        // Last vouched 3 s ago: the wait goes on from then, not from the restart.
        let vouched = rec("b1", Some(47.0), false);
        assert_eq!(
            resume(Some(&vouched), "b1", now, Some(50.0)),
            Resume::WaitingFrom(now - 3 * S)
        );
        // A record that cannot be placed in time gives no grace.
        let placeless = rec("b1", None, false);
        assert!(matches!(
            resume(Some(&placeless), "b1", now, Some(50.0)),
            Resume::WaitingFrom(t) if t < 0
        ));
        // Without a boot id nothing is trusted across processes.
        assert_eq!(
            resume(Some(&starved), "", now, Some(50.0)),
            Resume::WaitingFrom(now)
        );
    }
}
