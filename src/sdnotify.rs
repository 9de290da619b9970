//! systemd's service notification protocol, spoken by hand (a datagram to `$NOTIFY_SOCKET`):
//! `READY=1` once the process serves, `WATCHDOG=1` while its main loop turns, `STOPPING=1` on
//! shutdown. Without `$NOTIFY_SOCKET` (not run by systemd, or not `Type=notify`) it is silent.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where systemd listens, and how often it wants to hear that the service is alive.
pub struct Notifier {
    socket: UnixDatagram,
    to: SocketAddr,
    watchdog: Option<Duration>,
}

/// Why the notification socket named by the environment cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={0:?} is neither an absolute path nor an abstract name (@…)")]
    Address(String),
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds")]
    Watchdog(String),
    #[error("the notification socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Notifier {
    /// The notifier systemd asked for through the environment, if any. The watchdog counts only
    /// when it is meant for this process (`WATCHDOG_PID`, when set, is ours).
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let path = path.to_string_lossy().into_owned();
        let watchdog = match std::env::var("WATCHDOG_USEC") {
            Ok(v) => {
                let ours = std::env::var("WATCHDOG_PID")
                    .map_or(true, |p| p.trim() == std::process::id().to_string());
                let usec: u64 = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|u| *u > 0)
                    .ok_or_else(|| NotifyError::Watchdog(v.clone()))?;
                ours.then(|| Duration::from_micros(usec))
            }
            Err(_) => None,
        };
        Notifier::new(&path, watchdog).map(Some)
    }

    pub fn new(path: &str, watchdog: Option<Duration>) -> Result<Notifier, NotifyError> {
        let io = |source| NotifyError::Io {
            path: path.to_string(),
            source,
        };
        let to = if let Some(name) = path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?
        } else if path.starts_with('/') {
            SocketAddr::from_pathname(path).map_err(io)?
        } else {
            return Err(NotifyError::Address(path.to_string()));
        };
        let socket = UnixDatagram::unbound().map_err(io)?;
        Ok(Notifier {
            socket,
            to,
            watchdog,
        })
    }

    /// How often to ping: half the watchdog's timeout, as systemd recommends. None without a
    /// watchdog.
    pub fn ping_every(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    fn send(&self, msg: &str) {
        // A lost notification is systemd's to notice (it restarts a silent service); the
        // service itself carries on.
        if let Err(e) = self.socket.send_to_addr(msg.as_bytes(), &self.to) {
            tracing::warn!(error = %e, "cannot notify systemd");
        }
    }

    /// The service is up; `status` is what `systemctl status` shows.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// The main loop turned since the last ping.
    pub fn alive(&self) {
        self.send("WATCHDOG=1");
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }
}

/// The notifier the environment names, told that the service is ready (`status` is what
/// `systemctl status` shows). An environment that names an unusable socket is logged, not
/// fatal: systemd notices a service that never reports ready.
pub fn announce_ready(status: &str) -> Option<std::sync::Arc<Notifier>> {
    match Notifier::from_env() {
        Ok(Some(n)) => {
            n.ready(status);
            Some(std::sync::Arc::new(n))
        }
        Ok(None) => None,
        Err(e) => {
            tracing::error!(error = %e, "cannot tell systemd that the service is ready");
            None
        }
    }
}

/// Feeds the watchdog (when systemd asked for one) every half timeout, but only when
/// `turns` moved since the last feed: a main loop that hangs stops the feeding, and systemd
/// restarts the service. `cycle` is the longest a turn is expected to take.
pub fn feed_watchdog(
    n: std::sync::Arc<Notifier>,
    turns: impl Fn() -> u64 + Send + 'static,
    cycle: Duration,
) {
    let Some(every) = n.ping_every() else {
        return;
    };
    if every < cycle {
        tracing::warn!(
            watchdog_half = ?every,
            cycle = ?cycle,
            "the service manager's watchdog is shorter than twice a turn of the main loop: a slow turn gets the service restarted; raise WatchdogSec",
        );
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut last = turns();
        loop {
            tick.tick().await;
            let now = turns();
            if now != last {
                n.alive();
                last = now;
            } else {
                tracing::warn!(
                    ?every,
                    "the main loop has not turned; the watchdog is not fed"
                );
            }
        }
    });
}

/// A status is one line of the protocol: a newline would start another assignment.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen() -> (tempfile::TempDir, String, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (dir, path.to_str().unwrap().to_string(), sock)
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn ready_watchdog_and_stopping_arrive_as_systemd_reads_them() {
        let (_dir, path, sock) = listen();
        let n = Notifier::new(&path, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(n.ping_every(), Some(Duration::from_secs(15)));
        n.ready("polling 3 nodes\nSTOPPING=1");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=polling 3 nodes STOPPING=1");
        n.alive();
        assert_eq!(recv(&sock), "WATCHDOG=1");
        n.stopping();
        assert_eq!(recv(&sock), "STOPPING=1");
    }

    #[test]
    fn an_abstract_socket_is_reached_by_its_name() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("maintd-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Notifier::new(&format!("@{name}"), None).unwrap().alive();
        assert_eq!(recv(&sock), "WATCHDOG=1");
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_is_fed_only_while_the_loop_turns() {
        let (_dir, path, sock) = listen();
        sock.set_nonblocking(true).unwrap();
        let n = std::sync::Arc::new(Notifier::new(&path, Some(Duration::from_secs(2))).unwrap());
        let turns = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t = turns.clone();
        feed_watchdog(
            n,
            move || t.load(std::sync::atomic::Ordering::Relaxed),
            Duration::ZERO,
        );
        let fed = |sock: &UnixDatagram| {
            let mut buf = [0u8; 64];
            let mut n = 0;
            while let Ok(len) = sock.recv(&mut buf) {
                assert_eq!(&buf[..len], b"WATCHDOG=1");
                n += 1;
            }
            n
        };
        // The feeder takes its first count before the loop turns.
        tokio::task::yield_now().await;
        for _ in 0..3 {
            turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1001)).await;
        }
        assert_eq!(fed(&sock), 3, "one feed per half timeout while it turns");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            fed(&sock),
            0,
            "a loop that stopped turning is not vouched for"
        );
        turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1001)).await;
        assert_eq!(fed(&sock), 1, "and is again once it turns");
    }

    #[test]
    fn a_relative_address_is_refused_by_name() {
        let e = Notifier::new("notify.sock", None).err().unwrap();
        assert!(e.to_string().contains("notify.sock"), "{e}");
    }
}
