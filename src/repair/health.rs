//! Whether the daemon is healthy, as `/1/health` and the service manager's watchdog see it:
//! the engine still decides, the state database can be written, and what it found at start-up
//! that it could not match (a lost or emptied database beside earlier jobs and tags).

use crate::sync::LockExt;
use maintd_core::verdict::Nanos;

/// Whether the engine is still deciding: a daemon whose every tick fails (an unreadable
/// database, an unreachable backend) must not look healthy.
#[derive(Default)]
pub struct Health {
    last_ok_ns: std::sync::atomic::AtomicI64,
    last_error: std::sync::Mutex<Option<String>>,
    started_ns: std::sync::atomic::AtomicI64,
    /// Turns of the engine's loop (a poll and a decision, failed or not): what the service
    /// manager's watchdog is fed by, so a hung loop gets the daemon restarted.
    pub(super) turns: std::sync::atomic::AtomicU64,
    /// Since when writes to the state database fail, and the latest failure.
    write_error: std::sync::Mutex<Option<(Nanos, String)>>,
    /// When the database was last probed with a write (`/1/health`, at most once a second).
    probed_ns: std::sync::atomic::AtomicI64,
    /// What the daemon found at start-up and could not match, said on `/1/health` for good.
    found: std::sync::Mutex<Vec<String>>,
}

impl Health {
    pub fn new(now: i64) -> Health {
        let h = Health::default();
        h.started_ns
            .store(now, std::sync::atomic::Ordering::Relaxed);
        h
    }

    pub(super) fn ok(&self, now: i64) {
        self.last_ok_ns
            .store(now, std::sync::atomic::Ordering::Relaxed);
        *self.last_error.lock_unpoisoned() = None;
    }

    pub(super) fn failed(&self, why: String) {
        *self.last_error.lock_unpoisoned() = Some(why);
    }

    /// Turns of the engine's loop so far.
    pub fn turns(&self) -> u64 {
        self.turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A write to the state database succeeded (`Ok`) or failed, at `now`.
    pub fn wrote<E: std::fmt::Display>(&self, now: Nanos, r: &Result<(), E>) {
        let mut w = self.write_error.lock_unpoisoned();
        match r {
            Ok(()) => *w = None,
            Err(e) => {
                let since = w.as_ref().map_or(now, |(s, _)| *s);
                *w = Some((since, e.to_string()));
            }
        }
    }

    /// Whether the database is due for another write probe (at most once a second, so that
    /// `/1/health` asked often costs no more than that).
    pub fn probe_due(&self, now: Nanos) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.probed_ns.load(Relaxed);
        now.saturating_sub(last) >= 1_000_000_000
            && self
                .probed_ns
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }

    /// Says what the daemon found at start-up and could not match.
    pub fn set_found(&self, found: Vec<String>) {
        *self.found.lock_unpoisoned() = found;
    }

    pub fn found(&self) -> Vec<String> {
        self.found.lock_unpoisoned().clone()
    }

    /// `Ok(age of the last decision)` while one completed within `stale_ns` (or the daemon is
    /// younger than that) and the database can be written, else why not.
    pub fn check(&self, now: i64, stale_ns: i64) -> Result<Option<i64>, Unhealthy> {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some((since, why)) = self.write_error.lock_unpoisoned().clone() {
            return Err(Unhealthy::Unwritable {
                for_s: now.saturating_sub(since).max(0) as f64 / 1e9,
                why,
            });
        }
        let last = self.last_ok_ns.load(Relaxed);
        let since = if last == 0 {
            self.started_ns.load(Relaxed)
        } else {
            last
        };
        let age = now.saturating_sub(since);
        if age <= stale_ns {
            return Ok((last != 0).then_some(age));
        }
        let why = self
            .last_error
            .lock_unpoisoned()
            .clone()
            .unwrap_or_else(|| "the engine has not run".into());
        Err(Unhealthy::Stale {
            for_s: age as f64 / 1e9,
            why,
        })
    }
}

/// Why the daemon is not healthy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unhealthy {
    #[error("the state database cannot be written (for {for_s:.1} s): {why}")]
    Unwritable { for_s: f64, why: String },
    #[error("no decision for {for_s:.1} s: {why}")]
    Stale { for_s: f64, why: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn failed_writes_make_the_daemon_unhealthy_until_one_succeeds() {
        let h = Health::new(0);
        h.ok(S);
        assert_eq!(h.check(2 * S, 10 * S), Ok(Some(S)));
        h.wrote(3 * S, &Err("disk I/O error"));
        h.wrote(5 * S, &Err("disk I/O error"));
        let e = h.check(6 * S, 10 * S).unwrap_err().to_string();
        assert!(
            e.contains("cannot be written (for 3.0 s): disk I/O error"),
            "{e}"
        );
        h.wrote::<String>(7 * S, &Ok(()));
        assert!(h.check(7 * S, 10 * S).is_ok());
        // Probed at most once a second.
        assert!(h.probe_due(10 * S));
        assert!(!h.probe_due(10 * S + S / 2));
        assert!(h.probe_due(11 * S));
    }
}
