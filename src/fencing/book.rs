//! The fence plans in force: those of the TOML file, fixed at start-up, and those of the
//! cluster's ConfigMaps, replaced whenever they change. The fencer, the readiness checks and
//! the agents' redaction read the current set; the fencer records each flow's plan with the flow
//! when it starts, so a change takes effect for the next flow, never mid-flow.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::fencing::config::FencePlan;
use crate::fencing::configmaps::{Parsed, Problem};
use crate::sync::RwLockExt;

pub type Plans = BTreeMap<String, FencePlan>;

#[derive(Default)]
struct Dynamic {
    plans: Plans,
    problems: BTreeMap<String, Problem>,
}

impl std::fmt::Debug for PlanBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Plans hold secrets: only their count.
        write!(f, "PlanBook({} plans)", self.current().len())
    }
}

/// The plans in force, and the ConfigMap problems that leave nodes unfenced.
pub struct PlanBook {
    fixed: Plans,
    /// Whether plans may come from ConfigMaps (then fencing runs even with no plan yet).
    dynamic_source: bool,
    dynamic: RwLock<Dynamic>,
    merged: RwLock<Arc<Plans>>,
    /// Bumped at every change, so readers rebuild what they derive only then.
    version: std::sync::atomic::AtomicU64,
    /// The leader wants the Secrets the ConfigMaps name; a standby reads none.
    secrets_wanted: AtomicBool,
    /// The ConfigMap plans in force carry the Secret values (not a standby's placeholders).
    secrets_read: AtomicBool,
}

impl PlanBook {
    /// The TOML plans only.
    pub fn fixed(plans: Plans) -> PlanBook {
        PlanBook::new(plans, false)
    }

    /// The TOML plans, with ConfigMap plans to come (`set_dynamic`).
    pub fn with_configmaps(plans: Plans) -> PlanBook {
        PlanBook::new(plans, true)
    }

    fn new(plans: Plans, dynamic_source: bool) -> PlanBook {
        PlanBook {
            merged: RwLock::new(Arc::new(plans.clone())),
            fixed: plans,
            dynamic_source,
            dynamic: RwLock::new(Dynamic::default()),
            version: Default::default(),
            secrets_wanted: AtomicBool::new(false),
            secrets_read: AtomicBool::new(false),
        }
    }

    /// Whether fencing has anything to do now or may have later.
    pub fn active(&self) -> bool {
        self.dynamic_source || !self.fixed.is_empty()
    }

    /// Every plan in force: the file's, and the ConfigMaps' for nodes the file does not name.
    pub fn current(&self) -> Arc<Plans> {
        self.merged.read_unpoisoned().clone()
    }

    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Replaces the ConfigMaps' plans; returns the nodes whose plan or problem changed. A node
    /// the file configures keeps the file's plan (its ConfigMap is a problem that says so).
    pub fn set_dynamic(&self, mut parsed: Parsed) -> Vec<String> {
        for node in self.fixed.keys() {
            if parsed.plans.remove(node).is_some() {
                parsed.problems.insert(
                    node.clone(),
                    Problem {
                        configmap: format!("{}{node}", crate::fencing::configmaps::NODE_PREFIX),
                        key: "-".into(),
                        problem: "ignored: the node is configured in maintd's own [fencing] section, which wins".into(),
                    },
                );
            }
        }
        let mut d = self.dynamic.write_unpoisoned();
        let mut changed: Vec<String> = parsed
            .plans
            .keys()
            .chain(d.plans.keys())
            .chain(parsed.problems.keys())
            .chain(d.problems.keys())
            .filter(|n| {
                parsed.plans.get(*n) != d.plans.get(*n)
                    || parsed.problems.get(*n) != d.problems.get(*n)
            })
            .cloned()
            .collect();
        changed.sort();
        changed.dedup();
        if changed.is_empty() {
            return changed;
        }
        let mut merged = parsed.plans.clone();
        merged.extend(self.fixed.clone());
        *d = Dynamic {
            plans: parsed.plans,
            problems: parsed.problems,
        };
        *self.merged.write_unpoisoned() = Arc::new(merged);
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        changed
    }

    /// `set_dynamic`, saying whether the plans carry the Secret values read now (`false`: a
    /// standby's placeholders, which check the maps' form only).
    pub fn set_dynamic_read(&self, parsed: Parsed, secrets_read: bool) -> Vec<String> {
        let changed = self.set_dynamic(parsed);
        self.secrets_read.store(secrets_read, Ordering::Release);
        changed
    }

    /// Whether this replica wants the Secrets read (it leads): a standby reads none.
    pub fn want_secrets(&self, on: bool) {
        self.secrets_wanted.store(on, Ordering::Release);
    }

    pub fn secrets_wanted(&self) -> bool {
        self.secrets_wanted.load(Ordering::Acquire)
    }

    /// Whether ConfigMap plans are in force without their Secret values yet (a standby's, or
    /// a new leader's before its first read): nothing may act on them until they are read.
    pub fn secrets_pending(&self) -> bool {
        !self.secrets_read.load(Ordering::Acquire)
            && !self.dynamic.read_unpoisoned().plans.is_empty()
    }

    /// Nodes left unfenced by a problem in their ConfigMaps.
    pub fn problems(&self) -> BTreeMap<String, Problem> {
        self.dynamic.read_unpoisoned().problems.clone()
    }

    /// Every secret value of every plan in force, for redaction.
    pub fn secrets(&self) -> Vec<String> {
        self.current()
            .values()
            .flat_map(|p| p.secrets().cloned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// How often the ConfigMaps are looked at (a change shows within this), and how often the
/// Secrets they name are read again even when no map changed.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
const SECRETS_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

pub use crate::cluster::maps::MapSource;

/// Follows the fence ConfigMaps into `book` until `stop`: whenever a map changes the maps are
/// parsed again, so a node becomes fenceable within seconds of its ConfigMap, without a
/// restart. Only while this replica leads (`want_secrets`) are the Secrets they name read (at
/// once on becoming leader, on every change, and every minute); a standby parses with empty
/// placeholders, which checks the maps' form and reads no Secret.
pub async fn follow(
    book: Arc<PlanBook>,
    maps: Arc<dyn MapSource>,
    defaults: crate::fencing::configmaps::StageDefaults,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        _ = stop => {}
        _ = follow_maps(book, maps, defaults) => {}
    }
}

async fn follow_maps(
    book: Arc<PlanBook>,
    maps: Arc<dyn MapSource>,
    defaults: crate::fencing::configmaps::StageDefaults,
) {
    use crate::fencing::configmaps::{parse, secret_refs};
    let mut seen = None;
    let mut last = None;
    let mut secrets_read: Option<std::time::Instant> = None;
    let mut broken = false;
    loop {
        let want = book.secrets_wanted();
        if !want {
            secrets_read = None;
        }
        let mut changed = false;
        match maps.snapshot().await {
            Err(e) => {
                if !broken {
                    tracing::warn!(at = %maps.location(), error = %e, "cannot read the fence ConfigMaps; the plans in force stay");
                }
                broken = true;
            }
            Ok((data, versions)) => {
                broken = false;
                if seen.as_ref() != Some(&versions) {
                    seen = Some(versions);
                    last = Some(data);
                    changed = true;
                }
            }
        }
        // A new leader reads at once, even while the watch reconnects (from the maps last seen).
        let due = want && secrets_read.is_none_or(|t| t.elapsed() >= SECRETS_EVERY);
        if let Some(data) = last.as_ref().filter(|_| changed || due) {
            let mut values = BTreeMap::new();
            for (s, k) in secret_refs(data) {
                let v = if want {
                    maps.secret(&s, &k).await
                } else {
                    Some(String::new())
                };
                if let Some(v) = v {
                    values.insert((s, k), v);
                }
            }
            if want {
                secrets_read = Some(std::time::Instant::now());
            }
            let changed = book.set_dynamic_read(parse(data, &values, defaults), want);
            if !changed.is_empty() {
                tracing::info!(at = %maps.location(), nodes = ?changed, "fence configuration from ConfigMaps changed; it applies to the next flow of each node");
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::config::{ExecPolicy, Method, Stage};

    fn plan(ip: &str) -> FencePlan {
        FencePlan {
            isolation: None,
            power_management: Some(Stage {
                policy: ExecPolicy::All,
                timeout: std::time::Duration::from_secs(1),
                retries: 0,
                retry_interval: std::time::Duration::from_secs(1),
                methods: vec![Method {
                    name: "m#0".into(),
                    agent: "fence_x".into(),
                    action: "off".into(),
                    params: BTreeMap::from([("ip".into(), ip.into())]),
                    secrets: vec![format!("pw-{ip}")],
                    required: true,
                    power_on: false,
                    executor: Default::default(),
                }],
            }),
            power_on: None,
            recovery: None,
            self_fence: false,
            kdump: false,
        }
    }

    #[test]
    fn configmap_plans_come_and_go_and_the_file_wins() {
        let book = PlanBook::with_configmaps(BTreeMap::from([("a".into(), plan("1"))]));
        assert!(book.active());
        let v0 = book.version();
        let parsed = Parsed {
            plans: BTreeMap::from([("a".into(), plan("9")), ("b".into(), plan("2"))]),
            ..Parsed::default()
        };
        assert_eq!(book.set_dynamic(parsed.clone()), ["a", "b"]);
        assert!(book.version() > v0);
        let now = book.current();
        assert_eq!(now["a"], plan("1"), "the file wins");
        assert_eq!(now["b"], plan("2"));
        assert!(book.problems()["a"].problem.contains("wins"));
        assert!(book.secrets().contains(&"pw-2".to_string()));
        // The same again: nothing changed, no new version.
        let v1 = book.version();
        assert!(book.set_dynamic(parsed).is_empty());
        assert_eq!(book.version(), v1);
        // The ConfigMap goes: the node is no longer configured.
        assert_eq!(book.set_dynamic(Parsed::default()), ["a", "b"]);
        assert!(!book.current().contains_key("b"));
        assert!(book.current().contains_key("a"));
        assert!(!PlanBook::fixed(BTreeMap::new()).active());
    }

    #[test]
    fn a_standbys_placeholder_plans_are_pending_until_a_leaders_read() {
        let book = PlanBook::with_configmaps(BTreeMap::from([("a".into(), plan("1"))]));
        assert!(!book.secrets_pending(), "the file's plans need no read");
        let mut placeholder = plan("2");
        placeholder.power_management.as_mut().unwrap().methods[0].secrets = vec![String::new()];
        let parsed = |p: FencePlan| Parsed {
            plans: BTreeMap::from([("b".into(), p)]),
            ..Parsed::default()
        };
        book.set_dynamic_read(parsed(placeholder), false);
        assert!(book.secrets_pending());
        assert!(
            !book.secrets().iter().any(String::is_empty),
            "an empty placeholder redacts nothing"
        );
        assert!(!book.secrets_wanted());
        book.want_secrets(true);
        assert!(book.secrets_wanted());
        assert_eq!(book.set_dynamic_read(parsed(plan("2")), true), ["b"]);
        assert!(!book.secrets_pending());
    }
}
