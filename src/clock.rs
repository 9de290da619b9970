//! The clocks of the daemon and the collector. Every span that decides anything (a grace, a
//! fence's wait, a release, a return, a view's freshness) is measured on a clock that never
//! steps: Linux's `CLOCK_BOOTTIME`, which counts suspend and which neither NTP's `makestep`,
//! `date -s` nor a resumed VM moves. The wall clock is for display, records and comparing with
//! other machines' clocks only.
//!
//! The daemon's decisions read `Clock::now`, the **steady timeline**: `CLOCK_BOOTTIME` plus an
//! offset taken from the wall clock once per boot (the daemon keeps it in its database, so every
//! process on the same boot continues one timeline). It looks like a Unix time (records and the
//! API stay readable), but a step of the wall clock never moves it, so two of its instants taken
//! on one boot always differ by the true span, across restarts too. A span that must survive a
//! reboot of the master is kept as a [`BootInstant`] (the boot id and `CLOCK_BOOTTIME`), which
//! no other boot takes for its own.
//!
//! `ManualClock` (set by a test) and `RuntimeClock` (tokio's paused time, the simulated-time
//! harness, with a wall clock a test can step) stand in for it in tests.

use std::sync::OnceLock;
#[cfg(test)]
use std::sync::atomic::{AtomicI64, Ordering};

use maintd_core::verdict::{BootInstant, Nanos};

pub trait Clock: Send + Sync + 'static {
    /// The steady timeline in nanoseconds: what every decision's `now` is.
    fn now(&self) -> Nanos;
    /// The wall clock, ns since the epoch: for display and for other machines' clocks only.
    fn wall(&self) -> Nanos;
    /// This boot and `CLOCK_BOOTTIME` now: spans kept across a restart.
    fn boot(&self) -> BootInstant;

    /// `now` and `boot` read at one moment, so a span carried from one to the other is exact.
    fn now_and_boot(&self) -> (Nanos, BootInstant) {
        (self.now(), self.boot())
    }
}

#[cfg(test)]
fn ns(d: std::time::Duration) -> Nanos {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `CLOCK_BOOTTIME` in nanoseconds: monotonic, counts suspend, never set. At least 1 s, so no
/// reading is ever 0 ("none").
pub fn boot_ns() -> Nanos {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec)
        .max(1_000_000_000)
}

/// The monotonic clock nodes measure their round trips and the watchdog's rules on: the boot
/// clock, so a suspend counts as the time it took.
pub fn mono_ns() -> Nanos {
    boot_ns()
}

/// The kernel's id of this boot, read once. Without it, an id of this process's own: whatever
/// this process keeps across a restart then counts as another boot's, which only makes the next
/// process wait longer.
pub fn boot_id() -> uuid::Uuid {
    static ID: OnceLock<uuid::Uuid> = OnceLock::new();
    *ID.get_or_init(|| {
        std::fs::read_to_string(crate::report::KERNEL_BOOT_ID)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(uuid::Uuid::new_v4)
    })
}

/// The steady timeline's offset from the boot clock.
static OFFSET: OnceLock<Nanos> = OnceLock::new();

/// The offset the wall clock gives now: the steady timeline of a boot's first process.
pub fn wall_offset_now() -> Nanos {
    crate::report::now_ns().saturating_sub(boot_ns())
}

/// The steady timeline: the boot clock plus this boot's offset (by default the wall clock's at
/// this process's first reading).
pub fn steady_ns() -> Nanos {
    steady_at(boot_ns())
}

/// The steady timeline at boot-clock reading `boot`.
fn steady_at(boot: Nanos) -> Nanos {
    boot.saturating_add(*OFFSET.get_or_init(wall_offset_now))
}

/// Continues this boot's steady timeline at `offset`, as an earlier process on the same boot
/// kept it. Must come before the first reading; false if the timeline was read already with
/// another offset (it then stays as it was).
pub fn continue_timeline(offset: Nanos) -> bool {
    OFFSET.set(offset).is_ok() || OFFSET.get() == Some(&offset)
}

/// How far the wall clock has stepped from the steady timeline since this process started
/// (positive: the wall clock is ahead). Exported as a metric; a few milliseconds is NTP's
/// slewing, seconds are a step.
pub fn wall_step_ns() -> Nanos {
    crate::report::now_ns().saturating_sub(steady_ns())
}

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        steady_ns()
    }

    fn wall(&self) -> Nanos {
        crate::report::now_ns()
    }

    fn boot(&self) -> BootInstant {
        BootInstant {
            boot: boot_id(),
            ns: boot_ns(),
        }
    }

    fn now_and_boot(&self) -> (Nanos, BootInstant) {
        let b = boot_ns();
        (
            steady_at(b),
            BootInstant {
                boot: boot_id(),
                ns: b,
            },
        )
    }
}

/// The boot id the test clocks report.
#[cfg(test)]
pub use maintd_core::testing::TEST_BOOT;

/// A clock that moves only when told to; its wall clock and its boot clock move with it.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

#[cfg(test)]
impl ManualClock {
    pub fn new(at: Nanos) -> ManualClock {
        ManualClock(AtomicI64::new(at))
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = ns(by);
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

    fn wall(&self) -> Nanos {
        self.now()
    }

    fn boot(&self) -> BootInstant {
        BootInstant {
            boot: TEST_BOOT,
            ns: self.now(),
        }
    }
}

/// The async runtime's clock, anchored at a Unix time. Under tokio's paused time it moves only
/// as the runtime's timers do, so the simulated-time harness runs minutes in milliseconds. Its
/// wall clock can be stepped either way (`step_wall`), as NTP's `makestep` or `date -s` would;
/// a new daemon process anchors its steady timeline at the wall clock again
/// (`new_process`), as `steady_ns` does; and the master can be rebooted (`reboot`): another
/// boot id, the boot clock from 1 s.
#[cfg(test)]
#[derive(Debug)]
pub struct RuntimeClock {
    origin: Nanos,
    base: AtomicI64,
    start: tokio::time::Instant,
    wall_offset: AtomicI64,
    boot: std::sync::Mutex<(uuid::Uuid, tokio::time::Instant)>,
    /// The boot the steady timeline was anchored on.
    anchored: std::sync::Mutex<uuid::Uuid>,
}

#[cfg(test)]
impl RuntimeClock {
    pub fn starting_at(base: Nanos) -> RuntimeClock {
        let start = tokio::time::Instant::now();
        RuntimeClock {
            origin: base,
            base: AtomicI64::new(base),
            start,
            wall_offset: AtomicI64::new(0),
            boot: std::sync::Mutex::new((TEST_BOOT, start)),
            anchored: std::sync::Mutex::new(TEST_BOOT),
        }
    }

    /// Steps the wall clock by `by` nanoseconds (negative: back).
    pub fn step_wall(&self, by: Nanos) {
        self.wall_offset.fetch_add(by, Ordering::SeqCst);
    }

    /// A new process: on the same boot it continues the steady timeline (the daemon keeps the
    /// offset); after a reboot it anchors a new one at the wall clock, whatever that stepped by.
    pub fn new_process(&self) {
        use crate::sync::LockExt;
        let boot = self.boot.lock_unpoisoned().0;
        let mut anchored = self.anchored.lock_unpoisoned();
        if *anchored != boot {
            *anchored = boot;
            let off = self.wall_offset.swap(0, Ordering::SeqCst);
            self.base.fetch_add(off, Ordering::SeqCst);
        }
    }

    /// The master boots again: a new boot id, its boot clock from 1 s.
    pub fn reboot(&self) {
        use crate::sync::LockExt;
        *self.boot.lock_unpoisoned() = (uuid::Uuid::new_v4(), tokio::time::Instant::now());
    }

    /// The simulation's true time, which no step or new process moves: the nodes' own
    /// clocks, and what a scenario judges the daemon by.
    pub fn true_now(&self) -> Nanos {
        self.origin.saturating_add(ns(self.start.elapsed()))
    }
}

#[cfg(test)]
impl Clock for RuntimeClock {
    fn now(&self) -> Nanos {
        self.base
            .load(Ordering::SeqCst)
            .saturating_add(ns(self.start.elapsed()))
    }

    fn wall(&self) -> Nanos {
        self.now()
            .saturating_add(self.wall_offset.load(Ordering::SeqCst))
    }

    fn boot(&self) -> BootInstant {
        use crate::sync::LockExt;
        let (boot, since) = *self.boot.lock_unpoisoned();
        BootInstant {
            boot,
            ns: ns(since.elapsed()).saturating_add(1_000_000_000),
        }
    }
}

/// A runtime on tokio's paused clock, for tests in simulated time: time moves only when every
/// task waits, straight to the next timer.
#[cfg(test)]
pub fn simulated_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_runtime_clock_moves_with_paused_time_and_its_wall_clock_steps_alone() {
        let c = RuntimeClock::starting_at(5_000_000_000);
        assert_eq!(c.now(), 5_000_000_000);
        tokio::time::sleep(std::time::Duration::from_secs(90)).await;
        assert_eq!(c.now(), 95_000_000_000);
        assert_eq!(c.boot().ns, 91_000_000_000);
        c.step_wall(30_000_000_000);
        assert_eq!(c.now(), 95_000_000_000, "a step moves the wall clock only");
        assert_eq!(c.wall(), 125_000_000_000);
        c.new_process();
        assert_eq!(c.now(), 95_000_000_000, "the same boot: the same timeline");
        let before = c.boot();
        c.reboot();
        assert_ne!(c.boot().boot, before.boot);
        assert_eq!(c.boot().ns, 1_000_000_000);
        c.new_process();
        assert_eq!(
            c.now(),
            125_000_000_000,
            "another boot anchors at the wall clock"
        );
        assert_eq!(c.wall(), 125_000_000_000);
        assert_eq!(c.true_now(), 95_000_000_000);
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now(), 1_000);
        c.advance(std::time::Duration::from_micros(2));
        assert_eq!(c.now(), 3_000);
        c.advance(std::time::Duration::MAX);
        assert_eq!(c.now(), i64::MAX);
    }

    #[test]
    fn the_steady_timeline_starts_at_the_wall_clock_and_moves_with_the_boot_clock() {
        let (s, w) = (SystemClock.now(), SystemClock.wall());
        assert!(s > 1_700_000_000_000_000_000);
        // The same process, no step on a test machine worth a minute.
        assert!((s - w).abs() < 60_000_000_000, "{}", s - w);
        let (b0, s0) = (boot_ns(), steady_ns());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (b1, s1) = (boot_ns(), steady_ns());
        assert!(b1 - b0 >= 20_000_000 && s1 - s0 >= 20_000_000);
        assert!(
            ((s1 - s0) - (b1 - b0)).abs() < 5_000_000,
            "moves as the boot clock"
        );
        assert_eq!(SystemClock.boot().boot, boot_id());
        assert_eq!(boot_id(), boot_id(), "read once");
    }
}
