//! The readiness checks' rotation: which node's devices are checked next, one per
//! `interval / nodes`, following the plans in force as ConfigMaps change them.

use std::sync::Arc;
use std::time::Duration;

use super::SELF_FENCE_EVERY;

/// Which node's devices are checked next: one per `interval / nodes`, following the plans in
/// force as they change.
pub(super) struct Rotation {
    version: u64,
    plans: Arc<crate::fencing::book::Plans>,
    nodes: Vec<String>,
    pub(super) self_fencing: Vec<String>,
    step: Duration,
    next: tokio::time::Instant,
    at: usize,
}

impl Rotation {
    pub(super) fn new(book: &crate::fencing::book::PlanBook, interval: Duration) -> Rotation {
        let plans = book.current();
        let nodes: Vec<String> = plans.keys().cloned().collect();
        let step = (interval / nodes.len().max(1) as u32).max(Duration::from_millis(100));
        Rotation {
            version: book.version(),
            self_fencing: plans
                .iter()
                .filter(|(_, p)| p.self_fence)
                .map(|(n, _)| n.clone())
                .collect(),
            plans,
            nodes,
            step,
            next: tokio::time::Instant::now() + step,
            at: 0,
        }
    }

    /// The loop's period: the rotation's step, or the watchdog checks' if shorter, and never
    /// longer than that while plans may still come from ConfigMaps.
    pub(super) fn tick(&self) -> Duration {
        self.step.min(SELF_FENCE_EVERY)
    }

    /// The nodes whose plan is new or changed since the last look, if the book changed.
    pub(super) fn refresh(
        &mut self,
        book: &crate::fencing::book::PlanBook,
        interval: Duration,
    ) -> Option<Vec<String>> {
        if book.version() == self.version {
            return None;
        }
        let old = self.plans.clone();
        *self = Rotation::new(book, interval);
        Some(
            self.plans
                .iter()
                .filter(|(n, p)| old.get(*n) != Some(*p))
                .map(|(n, _)| n.clone())
                .collect(),
        )
    }

    /// The nodes due for their check now.
    pub(super) fn due(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while tokio::time::Instant::now() >= self.next && !self.nodes.is_empty() {
            self.next += self.step;
            out.push(self.nodes[self.at % self.nodes.len()].clone());
            self.at += 1;
        }
        out
    }
}
