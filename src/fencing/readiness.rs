//! Fence readiness: the `status` action of every node's power-management methods, at start-up
//! and then once per `check-interval` per node (spread over the interval, bounded concurrency),
//! so a wrong password or an unreachable BMC shows while the node is still healthy; and, for a
//! node with a self-fence level, whether its collector's last signed view reports an armed
//! watchdog. A level that fails makes the node's fencing *inactive*, shown
//! in `/1/nodes` and `/1/fences/readiness`, as a gauge, in the log and as an Event when it changes.
//!
//! Readiness informs; it does not gate. A flow for an inactive node still tries its devices (an
//! unreachable BMC may answer again), and a power-off still counts only once `status` says OFF.

use crate::cluster::Backend;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use tracing::{info, warn};

use super::agent::{AgentRunner, EXIT_OFF, EXIT_OK};
use super::config::FencePlan;
use crate::clock::Clock;
use crate::cluster::EventReason;
use crate::fencing::metrics::FenceMetrics;
use crate::sync::LockExt;
use crate::ticker::Ticker;
use maintd_core::verdict::Nanos;

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

impl CheckSettings {
    pub fn new(f: &crate::fencing::config::FencingConfig) -> CheckSettings {
        CheckSettings {
            interval: f.check_interval,
            timeout: f.check_timeout,
            concurrency: f.check_concurrency,
        }
    }
}

pub use crate::views::{DeviceCheck, FencingState, MethodCheck};

/// The last check of every node with a fence plan, shared with the API.
#[derive(Debug, Default)]
pub struct Board(Mutex<BTreeMap<String, DeviceCheck>>);

impl Board {
    pub fn all(&self) -> BTreeMap<String, DeviceCheck> {
        self.0.lock_unpoisoned().clone()
    }

    /// Forgets nodes no longer configured.
    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock_unpoisoned().retain(|n, _| keep(n));
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

/// Where the readiness checks read a node's reported watchdog (the fencer's peer views).
pub trait WatchdogViews: Send + Sync {
    /// `None` while no view from the node is held (nothing to judge yet); `Some(None)` when its
    /// last view reports no armed watchdog.
    fn reported_watchdog(&self, node: &str) -> Option<Option<crate::report::WatchdogReport>>;
}

/// The method name under which the self-fence level shows among a check's methods.
pub const SELF_FENCE_METHOD: &str = "self-fence";

/// The self-fence level's check is a look at the node's last signed view, cheap enough to repeat
/// every few seconds rather than once per interval: the operator learns at once that a node meant
/// to fence itself has no armed watchdog (and when it is armed again).
const SELF_FENCE_EVERY: Duration = Duration::from_secs(2);

/// One level's part of a node's check.
#[derive(Debug, Clone, PartialEq)]
struct Part {
    at: Nanos,
    methods: Vec<MethodCheck>,
    /// What failed, one line per method.
    failures: Vec<String>,
}

/// Runs the power-management methods' `status` for one plan; `None` without power management.
async fn check_power(
    runner: &dyn AgentRunner,
    node: &str,
    plan: &FencePlan,
    timeout: Duration,
    now: Nanos,
) -> Option<Part> {
    let stage = plan.power_management.as_ref()?;
    let mut methods = Vec::new();
    let mut failures = Vec::new();
    for m in &stage.methods {
        let site = super::agent::CallSite {
            node: node.into(),
            ..Default::default()
        };
        let super::agent::Answer { code, output, .. } =
            runner.call_at(&site, m, "status", timeout).await;
        let ok = status_ok(code);
        if !ok {
            let ended = maintd_core::fencing::machine::ended(code, &output);
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
    Some(Part {
        at: now,
        methods,
        failures,
    })
}

/// The self-fence level from the node's last view: `None` without the level or before the
/// master holds any view from the node (nothing to judge: a node still starting is no alarm).
fn check_self_fence(
    plan: &FencePlan,
    reported: Option<Option<crate::report::WatchdogReport>>,
    now: Nanos,
) -> Option<Part> {
    if !plan.self_fence {
        return None;
    }
    let armed = reported?.is_some();
    Some(Part {
        at: now,
        methods: vec![MethodCheck {
            method: SELF_FENCE_METHOD.into(),
            agent: "watchdog".into(),
            code: None,
            ok: armed,
        }],
        failures: if armed {
            vec![]
        } else {
            vec![format!(
                "{SELF_FENCE_METHOD}: the node's collector reports no armed watchdog \
                 ([collector.watchdog] enabled = true there), so it would never be counted \
                 as reset"
            )]
        },
    })
}

/// A node's check from its levels' parts; `None` while no level has been judged.
fn compose(power: Option<&Part>, self_fence: Option<&Part>) -> Option<DeviceCheck> {
    let parts: Vec<&Part> = power.into_iter().chain(self_fence).collect();
    let checked_at = parts.iter().map(|p| p.at).max()?;
    let failures: Vec<&str> = parts
        .iter()
        .flat_map(|p| p.failures.iter().map(String::as_str))
        .collect();
    let (state, detail) = if failures.is_empty() {
        (FencingState::Active, "ok".to_string())
    } else {
        (FencingState::Inactive, failures.join("; "))
    };
    Some(DeviceCheck {
        state,
        checked_at,
        detail,
        methods: parts.iter().flat_map(|p| p.methods.clone()).collect(),
    })
}

/// The methods that failed, to tell a change of cause from a repeat of the same failure.
fn failing(check: &DeviceCheck) -> Vec<&str> {
    check
        .methods
        .iter()
        .filter(|m| !m.ok)
        .map(|m| m.method.as_str())
        .collect()
}

#[derive(Debug, Default)]
struct Parts {
    power: Option<Part>,
    self_fence: Option<Part>,
}

mod rotation;
use rotation::Rotation;

pub struct Readiness {
    board: Arc<Board>,
    book: Arc<crate::fencing::book::PlanBook>,
    runner: Arc<dyn AgentRunner>,
    cluster: Backend,
    metrics: FenceMetrics,
    leadership: Arc<crate::leader::Leadership>,
    settings: CheckSettings,
    clock: Arc<dyn Clock>,
    /// The fencer's peer views, where each node's watchdog report is; without them a self-fence
    /// level is never judged.
    views: Option<Arc<dyn WatchdogViews>>,
    parts: Mutex<BTreeMap<String, Parts>>,
}

impl Readiness {
    pub fn new(
        settings: CheckSettings,
        book: Arc<crate::fencing::book::PlanBook>,
        runner: Arc<dyn AgentRunner>,
        views: Option<Arc<dyn WatchdogViews>>,
        shared: &crate::parts::Shared,
        metrics: FenceMetrics,
    ) -> Readiness {
        Readiness {
            board: Arc::new(Board::default()),
            book,
            runner,
            cluster: shared.cluster.clone(),
            metrics,
            leadership: shared.leadership.clone(),
            settings,
            clock: shared.clock.clone(),
            views,
            parts: Mutex::default(),
        }
    }

    /// The checks' latest results, which the API serves.
    pub fn board(&self) -> Arc<Board> {
        self.board.clone()
    }

    /// Every node's devices at once (bounded by `check-concurrency`).
    async fn full_pass(self: &Arc<Self>) {
        self.report_problems().await;
        futures::stream::iter(self.book.current().keys().cloned().collect::<Vec<_>>())
            .map(|n| {
                let me = self.clone();
                async move { me.check(&n).await }
            })
            .buffer_unordered(self.settings.concurrency.max(1))
            .collect::<Vec<()>>()
            .await;
    }

    /// Checks every node at once (bounded), then one node per `interval / nodes`, so each is
    /// checked once per interval and the devices are never asked all together again; self-fence
    /// levels every `SELF_FENCE_EVERY`. The start-up pass runs on every replica, so readiness is
    /// known while the election runs; after it only the leader checks (a standby's checks would
    /// double the load on the devices, and only the leader holds the nodes' views), and a
    /// replica that becomes leader checks every node again at once.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        if self.settings.interval.is_zero() || !self.book.active() {
            return;
        }
        tokio::pin!(shutdown);
        tokio::select! {
            biased;
            _ = &mut shutdown => return,
            _ = self.full_pass() => {}
        }
        let mut rotation = Rotation::new(&self.book, self.settings.interval);
        let mut ticker = Ticker::new(rotation.tick()).following(self.leadership.subscribe());
        // The ticker's first tick is immediate, and the start-up pass has just checked everyone.
        if ticker.next(shutdown.as_mut()).await.is_none() {
            return;
        }
        while let Some(wake) = ticker.next(shutdown.as_mut()).await {
            if wake == crate::ticker::Wake::Notified {
                // A new term: this replica may have just become the leader.
                if self.leadership.is_leader() {
                    self.full_pass().await;
                }
                continue;
            }
            // The ConfigMaps changed: refused configurations are reported on every replica
            // (their board and metric are local; only the leader writes the Event), so a
            // restarted replica shows them as soon as it has read the maps, not once it leads.
            let fresh = rotation.refresh(&self.book, self.settings.interval);
            if fresh.is_some() {
                self.report_problems().await;
            }
            if !self.leadership.is_leader() {
                continue;
            }
            // New and changed nodes are checked at once.
            for n in fresh.into_iter().flatten() {
                self.check(&n).await;
            }
            for n in rotation.self_fencing.clone() {
                self.check_watchdog(&n).await;
            }
            for n in rotation.due() {
                self.check(&n).await;
            }
        }
    }

    /// Nodes whose ConfigMaps have a problem are inactive with it as the reason, said in the log
    /// and, by the leader, as an Event on the ConfigMap.
    async fn report_problems(&self) {
        let problems = self.book.problems();
        let plans = self.book.current();
        self.board
            .retain(|n| plans.contains_key(n) || problems.contains_key(n));
        for (node, p) in problems {
            let detail = p.to_string();
            let check = DeviceCheck {
                state: FencingState::Inactive,
                checked_at: self.clock.now(),
                detail: detail.clone(),
                methods: vec![],
            };
            self.metrics.fencing_ready(&node, false);
            let before = self.board.set(&node, check);
            if before.is_some_and(|b| b.detail == detail) {
                continue;
            }
            warn!(node = %node, configmap = %p.configmap, key = %p.key, problem = %p.problem, "fencing inactive: its fence configuration is refused");
            if self.leadership.is_leader() {
                self.cluster
                    .record_config(&p.configmap, EventReason::FenceConfigRefused, &detail)
                    .await;
            }
        }
    }

    /// Checks every level of one node: its devices' status and its reported watchdog.
    async fn check(&self, node: &str) {
        // A plan without its Secret values (a new leader's, before its first read) would log
        // in with an empty password: the check waits for the read, which changes the plans
        // and so checks them again.
        if self.book.secrets_pending() {
            return;
        }
        let plans = self.book.current();
        let Some(plan) = plans.get(node) else {
            return;
        };
        let power = check_power(
            self.runner.as_ref(),
            node,
            plan,
            self.settings.timeout,
            self.clock.now(),
        )
        .await;
        let self_fence = self.self_fence_part(node, plan);
        self.update(node, |p| {
            p.power = power;
            if self_fence.is_some() {
                p.self_fence = self_fence;
            }
        })
        .await;
    }

    async fn check_watchdog(&self, node: &str) {
        if !self.leadership.is_leader() {
            return;
        }
        let plans = self.book.current();
        let Some(plan) = plans.get(node) else {
            return;
        };
        // No view (yet, or since this leader took over): the last judgement stands.
        if let Some(part) = self.self_fence_part(node, plan) {
            self.update(node, |p| p.self_fence = Some(part)).await;
        }
    }

    fn self_fence_part(&self, node: &str, plan: &FencePlan) -> Option<Part> {
        let reported = self.views.as_ref()?.reported_watchdog(node);
        check_self_fence(plan, reported, self.clock.now())
    }

    /// Applies a change to a node's parts, publishes the composed check and reports a change of
    /// state (or of what fails) once.
    async fn update(&self, node: &str, change: impl FnOnce(&mut Parts)) {
        let composed = {
            let mut parts = self.parts.lock_unpoisoned();
            let p = parts.entry(node.to_string()).or_default();
            let before = (p.power.clone(), p.self_fence.clone());
            change(p);
            // A repeat look at an unchanged watchdog only moves the time: keep the board quiet.
            if p.power.is_none() && p.self_fence.is_none() {
                return;
            }
            let same_self_fence = match (&before.1, &p.self_fence) {
                (Some(a), Some(b)) => a.methods == b.methods,
                (a, b) => a.is_none() && b.is_none(),
            };
            if before.0 == p.power && same_self_fence && self.board.get(node).is_some() {
                return;
            }
            compose(p.power.as_ref(), p.self_fence.as_ref())
        };
        let Some(check) = composed else {
            return;
        };
        self.metrics
            .fencing_ready(node, check.state == FencingState::Active);
        let before = self.board.set(node, check.clone());
        let was = before.as_ref().map(|c| (c.state, failing(c)));
        match (was, check.state) {
            (Some((b, ref f)), now) if b == now && *f == failing(&check) => {}
            (None, FencingState::Active) => {
                info!(node = %node, "fencing ready: every configured level answers its check");
            }
            (_, FencingState::Inactive) => {
                warn!(node = %node, detail = %check.detail, "fencing inactive: a configured fencing level fails its check");
                let msg = format!("fencing inactive: {}", check.detail);
                if self.leadership.is_leader() {
                    self.cluster
                        .record(node, EventReason::FencingInactive, &msg, true)
                        .await;
                }
            }
            (Some(_), FencingState::Active) => {
                info!(node = %node, "fencing active again: every configured level answers its check");
                if !self.leadership.is_leader() {
                    return;
                }
                self.cluster
                    .record(
                        node,
                        EventReason::FencingActive,
                        "every configured fencing level answers its check again",
                        false,
                    )
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(self_fence: bool) -> FencePlan {
        FencePlan {
            isolation: None,
            power_management: None,
            power_on: None,
            recovery: None,
            self_fence,
            kdump: false,
        }
    }

    fn armed() -> Option<crate::report::WatchdogReport> {
        Some(crate::collector::watchdog::report(
            &Default::default(),
            &Default::default(),
        ))
    }

    #[test]
    fn a_self_fence_level_is_judged_only_from_a_view() {
        assert_eq!(check_self_fence(&plan(false), Some(None), 1), None);
        assert_eq!(check_self_fence(&plan(true), None, 1), None, "no view yet");
        let bare = check_self_fence(&plan(true), Some(None), 1).unwrap();
        assert!(!bare.methods[0].ok && bare.failures[0].contains("no armed watchdog"));
        let ok = check_self_fence(&plan(true), Some(armed()), 1).unwrap();
        assert!(ok.methods[0].ok && ok.failures.is_empty());
    }

    #[test]
    fn any_failing_level_makes_the_node_inactive_and_the_detail_names_it() {
        assert_eq!(compose(None, None), None);
        let power = Part {
            at: 5,
            methods: vec![MethodCheck {
                method: "ipmi".into(),
                agent: "fence_ipmilan".into(),
                code: Some(0),
                ok: true,
            }],
            failures: vec![],
        };
        let bare = check_self_fence(&plan(true), Some(None), 9).unwrap();
        let c = compose(Some(&power), Some(&bare)).unwrap();
        assert_eq!(c.state, FencingState::Inactive);
        assert_eq!(c.checked_at, 9);
        assert!(c.detail.starts_with("self-fence:"), "{}", c.detail);
        assert_eq!(failing(&c), ["self-fence"]);
        let ok = check_self_fence(&plan(true), Some(armed()), 7).unwrap();
        let c = compose(Some(&power), Some(&ok)).unwrap();
        assert_eq!((c.state, c.detail.as_str()), (FencingState::Active, "ok"));
        assert_eq!(c.methods.len(), 2);
    }
}
