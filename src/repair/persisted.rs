//! Which poll results the store needs: a node's row is written when what it says changes, and
//! otherwise only every so often to move its last answer and its sequence floor forward.
//!
//! A steady fleet then costs no disk writes per cycle: a new sequence and a new diagnose time
//! come with every report, so they do not count as a change. The floor may lag the last accepted
//! sequence by up to the refresh interval; the poller closes that gap across a restart by
//! refusing reports signed before it resumed (see `Poller::poll_one`). The API reads the latest
//! answer and diagnose time from memory (`members::NodeHealth`), and a lagging diagnose time in
//! the store only makes a restarted daemon think a node's last healthy report older than it is.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use crate::store::NodeUpdate;
use maintd_core::verdict::Nanos;

/// How long an unchanged row may go unwritten.
pub const REFRESH_NS: Nanos = 600_000_000_000;

struct Entry {
    digest: u64,
    written_ns: Nanos,
}

/// What was last written per node, as a digest (a few dozen bytes per node).
pub struct Persisted {
    /// Keyed per process, so a collector cannot craft two reports that collide.
    hasher: RandomState,
    rows: HashMap<String, Entry>,
}

impl Default for Persisted {
    fn default() -> Self {
        Persisted {
            hasher: RandomState::new(),
            rows: HashMap::new(),
        }
    }
}

impl Persisted {
    /// Keeps the updates the store must see at `now`, and notes them as written. Rejections
    /// always count (the row counts them); so does a node whose floor was just reset.
    pub fn select(&mut self, updates: Vec<NodeUpdate>, now: Nanos) -> Vec<NodeUpdate> {
        updates.into_iter().filter(|u| self.due(u, now)).collect()
    }

    /// Forgets `node`, so its next result is written whatever it says.
    pub fn forget(&mut self, node: &str) {
        self.rows.remove(node);
    }

    fn due(&mut self, u: &NodeUpdate, now: Nanos) -> bool {
        if u.rejection.is_some() {
            self.rows.remove(&u.name);
            return true;
        }
        let digest = self.digest(u);
        if let Some(e) = self.rows.get_mut(&u.name) {
            if e.digest == digest {
                let age = now.saturating_sub(e.written_ns);
                // Spread the refreshes of a fleet first written in one cycle over half the
                // interval (the spread is only worked out once a row is that old).
                let spread = || (self.hasher.hash_one(&u.name) % (REFRESH_NS as u64 / 2)) as Nanos;
                if age < REFRESH_NS / 2 || age < REFRESH_NS - spread() {
                    return false;
                }
            }
            e.digest = digest;
            e.written_ns = now;
            return true;
        }
        self.rows.insert(
            u.name.clone(),
            Entry {
                digest,
                written_ns: now,
            },
        );
        true
    }

    /// Everything a row holds but the answer time, the sequence and the diagnose time.
    fn digest(&self, u: &NodeUpdate) -> u64 {
        let mut h = self.hasher.build_hasher();
        u.answered.hash(&mut h);
        u.error.hash(&mut h);
        u.report.hash(&mut h);
        u.diagnose_error.hash(&mut h);
        u.boot.map(|b| (b.id.as_u128(), b.at)).hash(&mut h);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(name: &str, report: &str, seq: u64) -> NodeUpdate {
        NodeUpdate {
            name: name.into(),
            answered: true,
            seq: Some(seq),
            report: Some(report.into()),
            ..Default::default()
        }
    }

    fn names(v: &[NodeUpdate]) -> Vec<&str> {
        v.iter().map(|u| u.name.as_str()).collect()
    }

    #[test]
    fn an_unchanged_row_waits_for_its_refresh_and_a_change_is_written_at_once() {
        let mut p = Persisted::default();
        let s = 1_000_000_000;
        assert_eq!(
            names(&p.select(vec![ok("a", "x", 1), ok("b", "x", 1)], 0)),
            ["a", "b"]
        );
        // Only the sequence and the diagnose time moved: nothing to write.
        let mut again = vec![ok("a", "x", 2), ok("b", "x", 2)];
        again[0].diagnosed_ns = Some(s);
        assert!(p.select(again, s).is_empty());
        // b's report changed.
        assert_eq!(
            names(&p.select(vec![ok("a", "x", 3), ok("b", "y", 3)], 2 * s)),
            ["b"]
        );
        // A node that stops answering is a change.
        let down = NodeUpdate {
            name: "a".into(),
            error: Some("refused".into()),
            ..Default::default()
        };
        assert_eq!(names(&p.select(vec![down.clone()], 3 * s)), ["a"]);
        assert!(p.select(vec![down], 4 * s).is_empty());
        // Every row is written again within the refresh interval.
        assert_eq!(
            names(&p.select(vec![ok("a", "x", 4), ok("b", "y", 4)], 5 * s)),
            ["a"]
        );
        assert_eq!(
            names(&p.select(vec![ok("b", "y", 5)], 2 * s + REFRESH_NS)),
            ["b"]
        );
    }

    #[test]
    fn rejections_and_forgotten_nodes_are_always_written() {
        let mut p = Persisted::default();
        p.select(vec![ok("a", "x", 1)], 0);
        let rejected = NodeUpdate {
            name: "a".into(),
            answered: true,
            rejection: Some("signature".into()),
            ..Default::default()
        };
        assert_eq!(p.select(vec![rejected.clone()], 1).len(), 1);
        assert_eq!(p.select(vec![rejected], 2).len(), 1);
        // After a rejection the next good report is written, even if it says the same.
        assert_eq!(p.select(vec![ok("a", "x", 2)], 3).len(), 1);
        assert!(p.select(vec![ok("a", "x", 3)], 4).is_empty());
        p.forget("a");
        assert_eq!(p.select(vec![ok("a", "x", 4)], 5).len(), 1);
    }
}
