//! The loop every periodic task of the daemon shares: wake at each interval (a late tick delays
//! the next one instead of bursting to catch up) or when notified, and stop when shutdown comes,
//! which wins over a tick that is due at the same moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Interval, MissedTickBehavior};

/// Why a periodic task woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The interval elapsed.
    Tick,
    /// Someone asked for a turn now (new work, a leadership change).
    Notified,
}

pub struct Ticker {
    tick: Interval,
    wake: Option<Arc<Notify>>,
}

impl Ticker {
    /// The first tick is immediate.
    pub fn new(interval: Duration, wake: Option<Arc<Notify>>) -> Ticker {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticker { tick, wake }
    }

    /// The next wake-up, or `None` once `shutdown` has resolved.
    pub async fn next<F: Future<Output = ()>>(&mut self, shutdown: Pin<&mut F>) -> Option<Wake> {
        let notified = async {
            match &self.wake {
                Some(w) => w.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown => None,
            _ = self.tick.tick() => Some(Wake::Tick),
            _ = notified => Some(Wake::Notified),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_wake_ups_and_shutdown_first() {
        let wake = Arc::new(Notify::new());
        let mut t = Ticker::new(Duration::from_secs(10), Some(wake.clone()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = rx.await;
        };
        tokio::pin!(shutdown);
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Tick));
        wake.notify_one();
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Notified));
        let start = tokio::time::Instant::now();
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Tick));
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        tx.send(()).unwrap();
        wake.notify_one();
        assert_eq!(t.next(shutdown.as_mut()).await, None);
    }
}
