//! Each node's health as the poller saw it: when it last diagnosed itself healthy, which boot
//! its reports come from, and when it last answered; read by the fencer from memory.

use std::sync::Mutex;

use tracing::warn;

use crate::sync::LockExt;
use maintd_core::verdict::Nanos;

/// When each node last diagnosed itself healthy, and which boot its reports come from, as the
/// poller saw it: the fencer reads it from memory (a node proven back ends its fence), and it
/// starts from the store so a restart keeps what was known.
#[derive(Default)]
pub struct NodeHealth(Mutex<std::collections::BTreeMap<String, Health>>);

/// What the poller knows of one node's health.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Health {
    pub healthy_at: Option<Nanos>,
    pub boot: Option<maintd_core::fencing::machine::BootSeen>,
    /// The poll's latest answer from the node (verified or not), and the diagnose time of its
    /// latest verified report. The API shows these from here: the store writes an unchanged row
    /// only every so often, so its copy may be that much older.
    pub answered_at: Option<Nanos>,
    pub diagnosed_at: Option<Nanos>,
}

impl NodeHealth {
    pub fn new(known: impl IntoIterator<Item = (String, Health)>) -> NodeHealth {
        NodeHealth(Mutex::new(known.into_iter().collect()))
    }

    /// What the store recorded before a restart (nothing, if it cannot be read: the next poll
    /// fills it in).
    pub fn from_store(store: &crate::store::Store) -> NodeHealth {
        let rows = store.nodes().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read node reports; node health starts empty");
            Vec::new()
        });
        NodeHealth::new(rows.into_iter().map(|r| {
            let h = Health {
                healthy_at: r.healthy_at(),
                boot: r.boot(),
                answered_at: r.last_answer_ns,
                diagnosed_at: r.diagnosed_ns,
            };
            (r.name, h)
        }))
    }

    /// A verified report from `node`, diagnosed (started) at `diagnosed_at` during `boot`:
    /// healthy or not.
    pub fn reported(
        &self,
        node: &str,
        healthy: bool,
        diagnosed_at: Nanos,
        boot: Option<crate::report::BootReport>,
    ) {
        let mut m = self.0.lock_unpoisoned();
        let h = match m.get_mut(node) {
            Some(h) => h,
            None => m.entry(node.to_string()).or_default(),
        };
        h.healthy_at = healthy.then_some(diagnosed_at);
        h.diagnosed_at = Some(diagnosed_at);
        h.boot = maintd_core::fencing::machine::observe_report(
            h.boot,
            boot.map(|b| (b.id, b.at)),
            diagnosed_at,
            healthy,
        );
    }

    /// Which nodes answered the poll cycle at `now` (verified or not), in one lock.
    pub fn heard(&self, updates: &[crate::store::NodeUpdate], now: Nanos) {
        let mut m = self.0.lock_unpoisoned();
        for u in updates.iter().filter(|u| u.answered) {
            let h = match m.get_mut(&u.name) {
                Some(h) => h,
                None => m.entry(u.name.clone()).or_default(),
            };
            h.answered_at = Some(now);
        }
    }

    /// What the poller knows of `node`, if it heard of it.
    pub fn get(&self, node: &str) -> Option<Health> {
        self.0.lock_unpoisoned().get(node).copied()
    }

    pub fn all(&self) -> std::collections::BTreeMap<String, Health> {
        self.0.lock_unpoisoned().clone()
    }
}
