//! Fence readiness: the `status` action of every node's power-management methods, at start-up
//! and then once per `check-interval` per node (spread over the interval, bounded concurrency),
//! so a wrong password or an unreachable BMC shows while the node is still healthy. A device
//! that fails makes the node's fencing *inactive* (seed 002's INACTIVE), shown in `/1/nodes` and
//! `/1/fences/readiness`, as a gauge, in the log and as an Event when it changes.
//!
//! Readiness informs; it does not gate. A flow for an inactive node still tries its devices (an
//! unreachable BMC may answer again), and a power-off still counts only once `status` says OFF.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::agent::{AgentRunner, EXIT_OFF, EXIT_OK};
use super::config::FencePlan;
use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::metrics::Metrics;
use crate::sync::LockExt;
use crate::ticker::Ticker;
use crate::verdict::Nanos;

/// What the readiness checker needs of the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckSettings {
    /// Every node is checked once per interval; zero disables the checks.
    pub interval: Duration,
    /// Deadline of one `status` call.
    pub timeout: Duration,
    /// Nodes checked at once during the start-up pass.
    pub concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FencingState {
    /// Every power-management device answered its status check.
    Active,
    /// At least one did not: a power-off would fail now.
    Inactive,
}

/// One method's status check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MethodCheck {
    pub method: String,
    pub agent: String,
    /// The agent's exit code; none when it was killed at the deadline.
    pub code: Option<i32>,
    pub ok: bool,
}

/// A node's last readiness check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeviceCheck {
    pub state: FencingState,
    pub checked_at: Nanos,
    /// `ok`, or what failed (agent output, redacted).
    pub detail: String,
    pub methods: Vec<MethodCheck>,
}

/// The last check of every node with a fence plan, shared with the API.
#[derive(Debug, Default)]
pub struct Board(Mutex<BTreeMap<String, DeviceCheck>>);

impl Board {
    pub fn all(&self) -> BTreeMap<String, DeviceCheck> {
        self.0.lock_unpoisoned().clone()
    }

    pub fn get(&self, node: &str) -> Option<DeviceCheck> {
        self.0.lock_unpoisoned().get(node).cloned()
    }

    /// Records a check; returns the previous one.
    fn set(&self, node: &str, check: DeviceCheck) -> Option<DeviceCheck> {
        self.0.lock_unpoisoned().insert(node.to_string(), check)
    }
}

/// A status check passes when the device answers, on or off: only then could it power off.
pub fn status_ok(code: Option<i32>) -> bool {
    matches!(code, Some(EXIT_OK) | Some(EXIT_OFF))
}

/// Runs the power-management methods' `status` for one plan.
pub async fn check_plan(
    runner: &dyn AgentRunner,
    plan: &FencePlan,
    timeout: Duration,
    now: Nanos,
) -> DeviceCheck {
    let mut methods = Vec::new();
    let mut failures = Vec::new();
    for m in plan.power_management.iter().flat_map(|s| &s.methods) {
        let (code, output) = runner.call(m, "status", timeout).await;
        let ok = status_ok(code);
        if !ok {
            let ended = code.map_or("killed at the deadline".into(), |c| format!("exit {c}"));
            failures.push(format!(
                "{}: {} status failed ({ended}): {}",
                m.name,
                m.agent,
                output.trim()
            ));
        }
        methods.push(MethodCheck {
            method: m.name.clone(),
            agent: m.agent.clone(),
            code,
            ok,
        });
    }
    let (state, detail) = if failures.is_empty() {
        (FencingState::Active, "ok".to_string())
    } else {
        (FencingState::Inactive, failures.join("; "))
    };
    DeviceCheck {
        state,
        checked_at: now,
        detail,
        methods,
    }
}

pub struct Readiness<C: Cluster> {
    pub board: Arc<Board>,
    plans: BTreeMap<String, FencePlan>,
    runner: Arc<dyn AgentRunner>,
    cluster: Arc<C>,
    metrics: Metrics,
    leadership: Arc<crate::leader::Leadership>,
    settings: CheckSettings,
    pub clock: Arc<dyn Clock>,
}

impl<C: Cluster> Readiness<C> {
    pub fn new(
        settings: CheckSettings,
        plans: BTreeMap<String, FencePlan>,
        runner: Arc<dyn AgentRunner>,
        cluster: Arc<C>,
        metrics: Metrics,
        leadership: Arc<crate::leader::Leadership>,
    ) -> Readiness<C> {
        Readiness {
            board: Arc::new(Board::default()),
            plans,
            runner,
            cluster,
            metrics,
            leadership,
            settings,
            clock: Arc::new(crate::clock::SystemClock),
        }
    }

    /// Checks every node at once (bounded), then one node per `interval / nodes`, so each is
    /// checked once per interval and the devices are never asked all together again. Only the
    /// leader checks: a standby's checks would double the load on the devices.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        if self.settings.interval.is_zero() || self.plans.is_empty() {
            return;
        }
        tokio::pin!(shutdown);
        let nodes: Vec<String> = self.plans.keys().cloned().collect();
        let step = (self.settings.interval / nodes.len() as u32).max(Duration::from_millis(100));
        let first = futures::stream::iter(nodes.clone())
            .map(|n| {
                let me = self.clone();
                async move { me.check(&n).await }
            })
            .buffer_unordered(self.settings.concurrency.max(1))
            .collect::<Vec<()>>();
        tokio::select! {
            biased;
            _ = &mut shutdown => return,
            _ = first => {}
        }
        let mut ticker = Ticker::new(step, None);
        // The ticker's first tick is immediate, and the start-up pass has just checked everyone.
        if ticker.next(shutdown.as_mut()).await.is_none() {
            return;
        }
        for n in nodes.iter().cycle() {
            if ticker.next(shutdown.as_mut()).await.is_none() {
                return;
            }
            self.check(n).await;
        }
    }

    async fn check(&self, node: &str) {
        if !self.leadership.is_leader() {
            return;
        }
        let Some(plan) = self.plans.get(node) else {
            return;
        };
        let check = check_plan(
            self.runner.as_ref(),
            plan,
            self.settings.timeout,
            self.clock.now(),
        )
        .await;
        self.metrics
            .fencing_ready(node, check.state == FencingState::Active);
        let before = self.board.set(node, check.clone()).map(|c| c.state);
        match (before, check.state) {
            (Some(b), now) if b == now => {}
            (None, FencingState::Active) => {
                info!(node = %node, "fencing ready: power management answers its status check");
            }
            (_, FencingState::Inactive) => {
                warn!(node = %node, detail = %check.detail, "fencing inactive: a power-management device fails its status check");
                let msg = format!("fencing inactive: {}", check.detail);
                self.cluster
                    .record(node, "FencingInactive", &msg, true)
                    .await;
            }
            (Some(_), FencingState::Active) => {
                info!(node = %node, "fencing active again: power management answers its status check");
                self.cluster
                    .record(
                        node,
                        "FencingActive",
                        "power management answers its status check again",
                        false,
                    )
                    .await;
            }
        }
    }
}
