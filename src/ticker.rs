//! The loop every periodic task of the daemon shares: wake at each interval (a late tick delays
//! the next one instead of bursting to catch up) or when notified, and stop when shutdown comes,
//! which wins over a tick that is due at the same moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
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
    /// The leadership term: a change (this replica became the leader) is a wake-up.
    term: Option<watch::Receiver<u64>>,
}

impl Ticker {
    /// The first tick is immediate.
    pub fn new(interval: Duration) -> Ticker {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticker {
            tick,
            wake: None,
            term: None,
        }
    }

    /// Also wakes when `wake` is notified (new work, an operator's action).
    pub fn notified_by(mut self, wake: Arc<Notify>) -> Ticker {
        self.wake = Some(wake);
        self
    }

    /// Also wakes when the leadership term changes, so a new leader acts at once.
    pub fn following(mut self, term: watch::Receiver<u64>) -> Ticker {
        self.term = Some(term);
        self
    }

    /// The next wake-up, or `None` once `shutdown` has resolved.
    pub async fn next<F: Future<Output = ()>>(&mut self, shutdown: Pin<&mut F>) -> Option<Wake> {
        let notified = async {
            match &self.wake {
                Some(w) => w.notified().await,
                None => std::future::pending().await,
            }
        };
        let term = async {
            match &mut self.term {
                // A closed channel (the election ended) never wakes again.
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown => None,
            _ = self.tick.tick() => Some(Wake::Tick),
            _ = notified => Some(Wake::Notified),
            _ = term => Some(Wake::Notified),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_wake_ups_and_shutdown_first() {
        let wake = Arc::new(Notify::new());
        let mut t = Ticker::new(Duration::from_secs(10)).notified_by(wake.clone());
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

    #[tokio::test(start_paused = true)]
    async fn a_new_term_wakes_a_follower_at_once() {
        let (tx, rx) = watch::channel(0u64);
        let mut t = Ticker::new(Duration::from_secs(10)).following(rx);
        let shutdown = std::future::pending::<()>();
        tokio::pin!(shutdown);
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Tick));
        let start = tokio::time::Instant::now();
        tx.send_replace(1);
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Notified));
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "woken by the term, not the interval"
        );
        // The election ended (the sender is gone): only the interval wakes it from now on.
        drop(tx);
        assert_eq!(t.next(shutdown.as_mut()).await, Some(Wake::Tick));
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }
}
