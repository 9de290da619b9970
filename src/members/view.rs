//! What the cluster says of the managed nodes now: membership and the condition rules' verdicts,
//! re-read from the backend's node cache (a watch on Kubernetes) every interval.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::Members;
use crate::cluster::{NodeFacts, NodeWitness};
use crate::node::NodeConfig;
use crate::sync::LockExt;
use maintd_core::repair::conditions::{Evaluation, Rule, evaluate};
use maintd_core::verdict::Nanos;

/// What the cluster says of the managed nodes now: membership and the condition rules'
/// verdicts, re-read from the backend's node cache (a watch on Kubernetes) every interval.
pub struct NodeView {
    rules: Vec<Rule>,
    /// How often the node cache is read.
    interval: Duration,
    /// Facts older than this are not used: the conditions count as unknown.
    max_age: Duration,
    facts: Mutex<Option<(Instant, Arc<NodeFacts>)>>,
}

impl NodeView {
    pub fn new(rules: Vec<Rule>, interval: Duration) -> NodeView {
        NodeView {
            rules,
            interval,
            max_age: interval * 3 + Duration::from_secs(5),
            facts: Mutex::new(None),
        }
    }

    /// What the condition rules say at `now`, or `None` without a recent node list.
    pub fn evaluate(&self, now: Nanos) -> Option<Evaluation> {
        let facts = self.facts.lock_unpoisoned().clone();
        let (at, facts) = facts?;
        (at.elapsed() <= self.max_age).then(|| evaluate(&self.rules, &facts.conditions, now))
    }

    /// Whether each node's kubelet reports Ready, from a recent node list (`None` without one:
    /// then no node counts as Ready).
    pub fn ready(&self) -> Option<std::collections::BTreeMap<String, bool>> {
        let facts = self.facts.lock_unpoisoned().clone();
        let (at, facts) = facts?;
        if at.elapsed() > self.max_age {
            return None;
        }
        Some(
            facts
                .members
                .iter()
                .map(|m| {
                    let ready = facts.conditions.get(&m.name).is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.kind == "Ready"
                                && c.status
                                    == maintd_core::repair::conditions::ConditionStatus::True
                        })
                    });
                    (m.name.clone(), ready)
                })
                .collect(),
        )
    }

    /// Records a fresh node list; returns the new membership if it changed.
    fn update(&self, facts: NodeFacts) -> Option<Vec<NodeConfig>> {
        let mut cur = self.facts.lock_unpoisoned();
        let changed = cur
            .as_ref()
            .is_none_or(|(_, old)| old.members != facts.members);
        let members = changed.then(|| facts.members.clone());
        *cur = Some((Instant::now(), Arc::new(facts)));
        members
    }

    /// Reads the nodes every `interval` until `shutdown`, updating `members` on each change. The
    /// read costs no API request; it fails while the node watch is broken, and the conditions
    /// then age into unknown.
    pub async fn run(
        self: Arc<Self>,
        witness: Arc<dyn NodeWitness>,
        members: Arc<Members>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = crate::ticker::Ticker::new(self.interval);
        tokio::pin!(shutdown);
        while ticker.next(shutdown.as_mut()).await.is_some() {
            match witness.node_facts().await {
                Ok(facts) => {
                    if let Some(m) = self.update(facts) {
                        info!(nodes = m.len(), "managed nodes changed");
                        members.set(m);
                    }
                }
                Err(e) => warn!(error = %e, "cannot list nodes; conditions count as unknown"),
            }
        }
    }
}
