//! The daemon's embedded defaults (`[daemon]`), what a configuration file overlays.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::{DAEMON_PORT, DaemonConfig};
use crate::http::listener::ListenerLimits;

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            // Loopback: a listener others can reach needs TLS (or plain-http = true).
            listen: SocketAddr::from(([127, 0, 0, 1], DAEMON_PORT)),
            state_dir: "/var/lib/maintd".into(),
            db: None,
            poll_interval: Duration::from_secs(5),
            poll_timeout: Duration::from_secs(2),
            poll_concurrency: 512,
            poll_connections: 4096,
            poll_udp: true,
            report_window: Duration::from_secs(30),
            max_report_bytes: 256 * 1024,
            request_window: Duration::from_secs(60),
            repair_dir: "/etc/maintd/repair.d".into(),
            hook_timeout: Duration::from_secs(600),
            hook_env: BTreeMap::new(),
            live_repair_timeout: Duration::from_secs(600),
            stall_after: Duration::from_secs(60),
            operators: BTreeMap::new(),
            anonymous_read: true,
            tls_cert_file: None,
            tls_key_file: None,
            plain_http: false,
            metrics_listen: None,
            node_keys: Default::default(),
            limits: ListenerLimits {
                max_connections: 1024,
                max_connections_per_ip: 256,
                ..ListenerLimits::default()
            },
        }
    }
}
