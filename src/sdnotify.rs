//! systemd's service notifications, through the `sd-notify` crate: `READY=1` once the process
//! serves, `WATCHDOG=1` while its main loop turns, `STOPPING=1` on shutdown. Without
//! `$NOTIFY_SOCKET` (not run by systemd, or not `Type=notify`) it is silent.

use std::time::Duration;

use sd_notify::NotifyState;

/// How a notification leaves: to `$NOTIFY_SOCKET` in production, to a recorder in tests.
type Sender = Box<dyn Fn(&[NotifyState]) -> std::io::Result<()> + std::marker::Send + Sync>;

/// That systemd listens, and how often it wants to hear that the service is alive.
pub struct Notifier {
    send: Sender,
    watchdog: Option<Duration>,
}

/// Why the notification settings the environment names cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error(
        "NOTIFY_SOCKET={0:?} is not an absolute path (an abstract socket name, @…, is not supported)"
    )]
    Address(String),
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds")]
    Watchdog(String),
}

impl Notifier {
    /// The notifier systemd asked for through the environment, if any. The watchdog counts only
    /// when it is meant for this process (`WATCHDOG_PID`, when set, is ours).
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let path = path.to_string_lossy().into_owned();
        if !path.starts_with('/') {
            return Err(NotifyError::Address(path));
        }
        // Read here rather than by the crate, which takes neither surrounding blanks nor
        // tells a malformed value from an absent one: a watchdog asked for and not understood
        // is said, not run without.
        let watchdog = match std::env::var("WATCHDOG_USEC") {
            Ok(v) => {
                let usec = v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|u| *u > 0)
                    .ok_or_else(|| NotifyError::Watchdog(v.clone()))?;
                for_us().then(|| Duration::from_micros(usec))
            }
            Err(_) => None,
        };
        Ok(Some(Notifier::with(Box::new(sd_notify::notify), watchdog)))
    }

    fn with(send: Sender, watchdog: Option<Duration>) -> Notifier {
        Notifier { send, watchdog }
    }

    /// How often to ping: half the watchdog's timeout, as systemd recommends. None without a
    /// watchdog.
    pub fn ping_every(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    fn send(&self, states: &[NotifyState]) {
        // A lost notification is systemd's to notice (it restarts a silent service); the
        // service itself carries on.
        if let Err(e) = (self.send)(states) {
            tracing::warn!(error = %e, "cannot notify systemd");
        }
    }

    /// The service is up; `status` is what `systemctl status` shows.
    pub fn ready(&self, status: &str) {
        let status = one_line(status);
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// The main loop turned since the last ping.
    pub fn alive(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }
}

/// `WATCHDOG_PID` is unset or names this process.
fn for_us() -> bool {
    std::env::var("WATCHDOG_PID").map_or(true, |p| p.trim() == std::process::id().to_string())
}

/// The notifier the environment names, if any. An environment that names an unusable socket
/// is logged, not fatal: systemd notices a service that never reports ready.
pub fn from_env() -> Option<std::sync::Arc<Notifier>> {
    match Notifier::from_env() {
        Ok(n) => n.map(std::sync::Arc::new),
        Err(e) => {
            tracing::error!(error = %e, "cannot tell systemd that the service is ready");
            None
        }
    }
}

/// The notifier the environment names, told that the service is ready (`status` is what
/// `systemctl status` shows).
pub fn announce_ready(status: &str) -> Option<std::sync::Arc<Notifier>> {
    let n = from_env()?;
    n.ready(status);
    Some(n)
}

/// Feeds the watchdog (when systemd asked for one) every half timeout until `stop`, but only
/// when `turns` moved since the last feed: a main loop that hangs stops the feeding, and
/// systemd restarts the service. `cycle` is the longest a turn is expected to take.
pub async fn feed_watchdog(
    n: std::sync::Arc<Notifier>,
    turns: impl Fn() -> u64 + Send + 'static,
    cycle: Duration,
    stop: impl std::future::Future<Output = ()>,
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
    let feed = async move {
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
    };
    tokio::select! {
        _ = stop => {}
        _ = feed => {}
    }
}

/// A status is one line of the protocol: a newline would start another assignment.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A notifier whose notifications are kept as systemd would read them, one string each.
    fn recorded(watchdog: Option<Duration>) -> (Notifier, Arc<Mutex<Vec<String>>>) {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        let send: Sender = Box::new(move |states| {
            let msg: Vec<String> = states.iter().map(|s| s.to_string()).collect();
            h.lock().unwrap().push(msg.join("\n"));
            Ok(())
        });
        (Notifier::with(send, watchdog), heard)
    }

    #[test]
    fn ready_watchdog_and_stopping_say_what_systemd_reads() {
        let (n, heard) = recorded(Some(Duration::from_secs(30)));
        assert_eq!(n.ping_every(), Some(Duration::from_secs(15)));
        // A status is one line: a newline would start another assignment.
        n.ready("polling 3 nodes\nSTOPPING=1");
        n.alive();
        n.stopping();
        assert_eq!(
            *heard.lock().unwrap(),
            [
                "READY=1\nSTATUS=polling 3 nodes STOPPING=1",
                "WATCHDOG=1",
                "STOPPING=1"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_is_fed_only_while_the_loop_turns() {
        let (n, heard) = recorded(Some(Duration::from_secs(2)));
        let turns = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t = turns.clone();
        tokio::spawn(feed_watchdog(
            Arc::new(n),
            move || t.load(std::sync::atomic::Ordering::Relaxed),
            Duration::ZERO,
            std::future::pending(),
        ));
        let fed = || {
            let mut h = heard.lock().unwrap();
            assert!(h.iter().all(|m| m == "WATCHDOG=1"), "{h:?}");
            std::mem::take(&mut *h).len()
        };
        // The feeder takes its first count before the loop turns.
        tokio::task::yield_now().await;
        for _ in 0..3 {
            turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(1001)).await;
        }
        assert_eq!(fed(), 3, "one feed per half timeout while it turns");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(fed(), 0, "a loop that stopped turning is not vouched for");
        turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(1001)).await;
        assert_eq!(fed(), 1, "and is again once it turns");
    }
}
