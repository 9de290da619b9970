//! The clock seam of the daemon's shells: the engine, the fencer and the poller read the time
//! through a `Clock`, once per decision, so that a decision sees one `now` and a test can set it
//! (`ManualClock`) or let it run on tokio's paused time (`RuntimeClock`, the simulated-time
//! harness). Pure decisions never read a clock; they are handed `now`.

#[cfg(test)]
use std::sync::atomic::{AtomicI64, Ordering};

use crate::verdict::Nanos;

pub trait Clock: Send + Sync + 'static {
    /// Unix time in nanoseconds.
    fn now(&self) -> Nanos;
}

/// This process's monotonic clock in nanoseconds (from its first reading): what a node measures
/// its round trips with, immune to the wall clock being set.
pub fn mono_ns() -> Nanos {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    // A monotonic reading that starts at 1 s, so no real send time is ever 0 ("none").
    i64::try_from(start.elapsed().as_nanos())
        .unwrap_or(i64::MAX)
        .saturating_add(1_000_000_000)
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        crate::report::now_ns()
    }
}

/// A clock that moves only when told to.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

#[cfg(test)]
impl ManualClock {
    pub fn new(at: Nanos) -> ManualClock {
        ManualClock(AtomicI64::new(at))
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}

/// The async runtime's clock, anchored at a Unix time. Under tokio's paused time it moves only
/// as the runtime's timers do, so the simulated-time harness runs minutes in milliseconds.
#[cfg(test)]
#[derive(Debug)]
pub struct RuntimeClock {
    base: Nanos,
    start: tokio::time::Instant,
}

#[cfg(test)]
impl RuntimeClock {
    pub fn starting_at(base: Nanos) -> RuntimeClock {
        RuntimeClock {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

#[cfg(test)]
impl Clock for RuntimeClock {
    fn now(&self) -> Nanos {
        let since = i64::try_from(self.start.elapsed().as_nanos()).unwrap_or(i64::MAX);
        self.base.saturating_add(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_runtime_clock_moves_with_paused_time() {
        let c = RuntimeClock::starting_at(5_000_000_000);
        assert_eq!(c.now(), 5_000_000_000);
        tokio::time::sleep(std::time::Duration::from_secs(90)).await;
        assert_eq!(c.now(), 95_000_000_000);
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now(), 1_000);
        c.advance(std::time::Duration::from_micros(2));
        assert_eq!(c.now(), 3_000);
        c.advance(std::time::Duration::MAX);
        assert_eq!(c.now(), i64::MAX);
        assert!(SystemClock.now() > 1_700_000_000_000_000_000);
    }
}
