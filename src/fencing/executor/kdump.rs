//! kdump notifications: the UDP messages `fence_kdump_send` sends from a node's crash kernel
//! (ClusterLabs' fence_kdump protocol: a 32-bit magic and version 1). The listener starts once
//! a plan enables kdump; a message counts only from the address of a node configured for it,
//! and only the fence state machine decides what it proves (a flow for a silent node whose
//! watchers lost it too, heard after it went silent). The protocol has no authentication, as
//! in Pacemaker: the network the crash kernels send on must be trusted not to forge a node's
//! address; every refusal is counted and logged.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::Fencer;
use crate::metrics::KdumpLabel;
use crate::sync::LockExt;
use maintd_core::verdict::Nanos;

const MAGIC: u32 = 0x1B30_2A40;
const VERSION: u32 = 1;

/// Whether `data` is a fence_kdump notification (both fields little-endian, as the sender
/// writes them on every platform maintd runs on).
pub(super) fn is_notification(data: &[u8]) -> Result<(), &'static str> {
    let Ok(bytes) = <[u8; 8]>::try_from(data) else {
        return Err("length");
    };
    let magic = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    let version = u32::from_le_bytes(bytes[4..].try_into().expect("4 bytes"));
    match (magic, version) {
        (MAGIC, VERSION) => Ok(()),
        (MAGIC, _) => Err("version"),
        _ => Err("magic"),
    }
}

#[derive(Default)]
pub(super) struct Kdump {
    /// The latest notification from each kdump node, by this fencer's clock.
    heard: Mutex<BTreeMap<String, Nanos>>,
    listener: Mutex<Option<tokio::task::AbortHandle>>,
    /// The last failed bind, so it is retried (and logged) once a minute, not every tick.
    bind_failed: Mutex<Option<Instant>>,
    /// Refusals logged per source, once a minute at most.
    logged: Mutex<BTreeMap<IpAddr, Instant>>,
}

impl Kdump {
    pub(super) fn heard(&self) -> BTreeMap<String, Nanos> {
        self.heard.lock_unpoisoned().clone()
    }

    pub(super) fn stop(&self) {
        if let Some(t) = self.listener.lock_unpoisoned().take() {
            t.abort();
        }
    }
}

impl Fencer {
    /// Starts the listener once any plan in force enables kdump.
    pub(super) async fn listen_for_kdump(self: &Arc<Self>) {
        let k = &self.kdump;
        if k.listener.lock_unpoisoned().is_some() {
            return;
        }
        if !self.settings.book.current().values().any(|p| p.kdump) {
            return;
        }
        if k.bind_failed
            .lock_unpoisoned()
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            return;
        }
        let addr = self.settings.kdump_listen;
        let socket = match tokio::net::UdpSocket::bind(addr).await {
            Ok(s) => s,
            Err(e) => {
                error!(listen = %addr, error = %e, "cannot listen for kdump notifications; retried in a minute");
                *k.bind_failed.lock_unpoisoned() = Some(Instant::now());
                return;
            }
        };
        info!(listen = %addr, "listening for kdump notifications");
        let me = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            // A notification is 8 bytes: anything longer is cut here and refused.
            let mut buf = [0u8; 64];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                let Some(me) = me.upgrade() else { return };
                me.kdump_message(from, &buf[..n]);
            }
        });
        *k.listener.lock_unpoisoned() = Some(task.abort_handle());
    }

    /// One datagram: recorded for its node if it is a notification from a kdump node's
    /// address, else refused, counted and logged.
    fn kdump_message(&self, from: SocketAddr, data: &[u8]) {
        let plans = self.settings.book.current();
        // A node's address is its collector's (its InternalIP on Kubernetes); a collector named
        // by host name is never looked up per datagram, so its node's messages are refused.
        let node = self.shared.members.get().iter().find_map(|m| {
            let addr = crate::node::collector_address(&m.collector).ok()?;
            let ip = addr.parse::<SocketAddr>().ok()?.ip();
            (ip == from.ip()).then(|| m.name.clone())
        });
        let refused = match (is_notification(data), &node) {
            (Err(why), _) => Some(why),
            (Ok(()), None) => Some("unknown-source"),
            (Ok(()), Some(n)) if !plans.get(n).is_some_and(|p| p.kdump) => Some("not-configured"),
            (Ok(()), Some(_)) => None,
        };
        let metrics = &self.metrics.fence.kdump_notifications;
        match (refused, node) {
            (None, Some(node)) => {
                metrics
                    .get_or_create(&KdumpLabel { result: "accepted" })
                    .inc();
                let now = self.shared.clock.now();
                let first = self
                    .kdump
                    .heard
                    .lock_unpoisoned()
                    .insert(node.clone(), now)
                    .is_none_or(|t| now.saturating_sub(t) > 60_000_000_000);
                if first {
                    info!(node = %node, from = %from, "kdump notification: the node runs its crash kernel");
                    self.wake.notify_one();
                }
            }
            (why, _) => {
                let why = why.unwrap_or("unknown-source");
                metrics.get_or_create(&KdumpLabel { result: why }).inc();
                let mut logged = self.kdump.logged.lock_unpoisoned();
                logged.retain(|_, t| t.elapsed() < Duration::from_secs(60));
                if logged.len() < 1024 && !logged.contains_key(&from.ip()) {
                    logged.insert(from.ip(), Instant::now());
                    warn!(from = %from, reason = why, "kdump message refused");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_eight_byte_notification_counts() {
        // What fence_kdump_send writes, as captured from it.
        assert_eq!(
            is_notification(&hex::decode("402a301b01000000").unwrap()),
            Ok(())
        );
        assert_eq!(
            is_notification(&hex::decode("402a301b02000000").unwrap()),
            Err("version")
        );
        assert_eq!(
            is_notification(&hex::decode("1b302a4001000000").unwrap()),
            Err("magic")
        );
        assert_eq!(is_notification(b"402a301b"), Err("magic"));
        assert_eq!(is_notification(&[0u8; 9]), Err("length"));
        assert_eq!(is_notification(&[]), Err("length"));
    }
}
