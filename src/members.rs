//! The managed nodes, and their discovery and conditions on Kubernetes: reads the node cache
//! (kept by a watch) every `node-interval`, keeps the one membership the poller, the fencer and
//! live repairs read, and evaluates the condition rules for the engine (repair events) and the
//! fencer (fence sources).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::cluster::{Cluster, NodeFacts};
use crate::node::NodeConfig;
use crate::sync::{LockExt, RwLockExt};
use maintd_core::repair::conditions::{Evaluation, Rule, evaluate};
use maintd_core::verdict::Nanos;

/// The managed nodes, replaced as a whole when discovery sees a change.
pub struct Members(RwLock<Arc<Vec<NodeConfig>>>);

impl Members {
    pub fn new(nodes: Vec<NodeConfig>) -> Members {
        Members(RwLock::new(Arc::new(nodes)))
    }

    pub fn get(&self) -> Arc<Vec<NodeConfig>> {
        self.0.read_unpoisoned().clone()
    }

    pub fn set(&self, nodes: Vec<NodeConfig>) {
        *self.0.write_unpoisoned() = Arc::new(nodes);
    }

    pub fn find(&self, node: &str) -> Option<NodeConfig> {
        self.get().iter().find(|n| n.name == node).cloned()
    }
}

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

    pub fn all(&self) -> std::collections::BTreeMap<String, Health> {
        self.0.lock_unpoisoned().clone()
    }
}

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
    pub async fn run<C: Cluster>(
        self: Arc<Self>,
        cluster: Arc<C>,
        members: Arc<Members>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticker = crate::ticker::Ticker::new(self.interval);
        tokio::pin!(shutdown);
        while ticker.next(shutdown.as_mut()).await.is_some() {
            match cluster.node_facts().await {
                Ok(Some(facts)) => {
                    if let Some(m) = self.update(facts) {
                        info!(nodes = m.len(), "managed nodes changed");
                        members.set(m);
                    }
                }
                Ok(None) => break,
                Err(e) => warn!(error = %e, "cannot list nodes; conditions count as unknown"),
            }
        }
    }
}

/// Reads the membership of a backend without a watch (Ganeti) every `interval` until
/// `shutdown`, replacing `members` when it changed: nodes added or removed need no restart.
pub async fn refresh<C: Cluster>(
    cluster: Arc<C>,
    members: Arc<Members>,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut ticker = crate::ticker::Ticker::new(interval);
    tokio::pin!(shutdown);
    while ticker.next(shutdown.as_mut()).await.is_some() {
        match cluster.members().await {
            Ok(Some(now)) if *members.get() != now => {
                info!(nodes = now.len(), "managed nodes changed");
                members.set(now);
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => warn!(error = %e, "cannot list nodes; the last list stays"),
        }
    }
}
