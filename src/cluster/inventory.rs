//! The inventory backend, the embedded default: tags and offline flags in the state database,
//! jobs, releases, reclaims and marks as hooks in the daemon's `repair-dir`, each run as a
//! detached job that survives a daemon restart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use uuid::Uuid;

use super::{ClusterError, FenceRelease, TagsAndJobs};
use crate::clock::steady_ns;
use crate::exec;
use crate::exec::hooks::HookCall;
use crate::exec::jobs::JobRunner;
use crate::store::Store;
use maintd_core::repair::Policy;
use maintd_core::repair::{Job, JobKind};
use maintd_core::verdict::Outcome;

/// Names of the inventory hooks in the daemon's `repair-dir`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HooksConfig {
    pub evacuate: String,
    pub evacuate_failover: String,
    pub offline: String,
    pub online: String,
    /// Fencing: release a powered-off node's workloads, and clear that after recovery.
    pub release: String,
    pub reclaim: String,
}

impl Default for HooksConfig {
    fn default() -> Self {
        HooksConfig {
            evacuate: "evacuate".into(),
            evacuate_failover: "evacuate-failover".into(),
            offline: "offline".into(),
            online: "online".into(),
            release: "release".into(),
            reclaim: "reclaim".into(),
        }
    }
}

/// What the inventory backend takes from the configuration, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    pub nodes: BTreeSet<String>,
    /// Where the hooks are (the daemon's `repair-dir`).
    pub repair_dir: PathBuf,
    pub hooks: HooksConfig,
    pub hook_timeout: Duration,
    pub hook_env: Vec<(String, String)>,
    /// Each hook job's directory goes under here.
    pub jobs_dir: PathBuf,
    /// The enabled actions, whose hooks must exist.
    pub actions: Policy,
    /// Whether fencing is configured, which needs the release and reclaim hooks.
    pub fencing: bool,
    /// Whether a node self-fences, which needs the offline and online hooks.
    pub self_fencing: bool,
    /// The store several daemons share (etcd), where each job is claimed before its hook runs.
    pub claims: Option<crate::cluster::etcd::StoreConfig>,
}

/// The embedded default backend.
pub struct Inventory {
    store: Arc<Store>,
    nodes: BTreeSet<String>,
    repair_dir: PathBuf,
    hooks: HooksConfig,
    timeout: Duration,
    env: Vec<(String, String)>,
    runner: JobRunner,
}

impl Inventory {
    /// Builds the backend and checks that every hook an enabled action needs is whitelisted.
    pub fn new(s: InventorySettings, store: Arc<Store>) -> Result<Inventory, ClusterError> {
        let inv = Inventory {
            store,
            nodes: s.nodes,
            repair_dir: s.repair_dir,
            hooks: s.hooks,
            timeout: s.hook_timeout,
            env: s.hook_env,
            runner: {
                let r = JobRunner::new(s.jobs_dir).map_err(ClusterError::Jobs)?;
                match s.claims {
                    Some(cfg) => r.claiming_on(
                        serde_json::to_value(&cfg).expect("the store's settings serialize"),
                    ),
                    None => r,
                }
            },
        };
        inv.check_hooks(&s.actions, s.fencing, s.self_fencing)?;
        Ok(inv)
    }

    fn check_hooks(
        &self,
        actions: &Policy,
        fencing: bool,
        self_fencing: bool,
    ) -> Result<(), ClusterError> {
        let mut needed = Vec::new();
        if fencing {
            needed.push(("fencing", &self.hooks.release));
            needed.push(("fencing", &self.hooks.reclaim));
        }
        if self_fencing {
            needed.push(("self-fencing", &self.hooks.offline));
            needed.push(("self-fencing", &self.hooks.online));
        }
        if actions.evacuate {
            needed.push(("evacuate", &self.hooks.evacuate));
        }
        if actions.evacuate_failover {
            needed.push(("evacuate-failover", &self.hooks.evacuate_failover));
        }
        if actions.evacuate || actions.evacuate_failover {
            needed.push(("offline", &self.hooks.offline));
            needed.push(("online", &self.hooks.online));
        }
        for (action, hook) in needed {
            exec::resolve(&self.repair_dir, hook).map_err(|source| ClusterError::Hook {
                hook: hook.clone(),
                action,
                source,
            })?;
        }
        Ok(())
    }

    fn hook(&self, kind: JobKind) -> Option<&str> {
        Some(match kind {
            JobKind::Evacuate => &self.hooks.evacuate,
            JobKind::EvacuateFailover => &self.hooks.evacuate_failover,
            JobKind::Offline => &self.hooks.offline,
            JobKind::Online => &self.hooks.online,
            JobKind::LiveRepair | JobKind::Remedy => return None,
        })
    }

    fn known(&self, node: &str) -> Result<(), ClusterError> {
        if self.nodes.contains(node) {
            Ok(())
        } else {
            Err(ClusterError::UnknownNode(node.into()))
        }
    }
}

#[async_trait::async_trait]
impl TagsAndJobs for Inventory {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        Ok(self.store.inventory_tags()?)
    }

    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError> {
        self.known(node)?;
        Ok(self.store.inventory_add_tag(node, tag, steady_ns())?)
    }

    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError> {
        self.known(node)?;
        Ok(self.store.inventory_remove_tag(node, tag)?)
    }

    async fn run_job(&self, job: &Job, event_json: &str) -> Outcome {
        if job.kind == JobKind::Remedy {
            return Outcome::failed(
                "remedies run as Kubernetes Jobs: the inventory backend has none to run",
            );
        }
        let Some(hook) = self.hook(job.kind) else {
            return Outcome::failed(format!("{} is not an inventory job", job.kind.as_str()));
        };
        let program = match exec::resolve(&self.repair_dir, hook) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(format!("hook refused: {e}")),
        };
        let (event, id) = (job.event.to_string(), job.id.to_string());
        let call = HookCall {
            node: &job.node,
            event: &event,
            job: Some(&id),
            action: Some(job.kind.as_str()),
        };
        let stdin = event_json.as_bytes().to_vec();
        let spec = call.spec(program, stdin, &self.env, self.timeout);
        // A job of an earlier version ran in `job-<number>`: its own directory, if its spec
        // names this event and this job (else it belongs to a job of a lost database).
        let legacy = crate::exec::jobs::Legacy {
            key: id.clone(),
            env: vec![
                ("MAINTD_EVENT".into(), event.clone()),
                ("MAINTD_JOB".into(), id.clone()),
            ],
        };
        let outcome = self
            .runner
            .run_or_adopt(&job.key(), &spec, Some(&legacy))
            .await;
        if outcome.ok() {
            let flag = match job.kind {
                JobKind::Offline => Some(true),
                JobKind::Online => Some(false),
                _ => None,
            };
            if let Some(offline) = flag
                && let Err(e) = self
                    .store
                    .inventory_set_offline(&job.node, offline, steady_ns())
            {
                return Outcome::failed(format!("hook succeeded but recording it failed: {e}"));
            }
        }
        outcome
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self.store.inventory_offline()?)
    }
}

#[async_trait::async_trait]
impl FenceRelease for Inventory {
    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome {
        let key = format!("fence-{flow}-release-{attempt}");
        let o = self
            .fence_hook(&self.hooks.release, "release", node, flow, &key)
            .await;
        self.set_offline_after(o, node, true)
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        let key = format!("fence-{flow}-reclaim");
        let o = self
            .fence_hook(&self.hooks.reclaim, "reclaim", node, flow, &key)
            .await;
        self.set_offline_after(o, node, false)
    }

    /// The `offline` hook marks the node, the `online` hook clears it.
    async fn mark_unschedulable(&self, node: &str, flow: &Uuid, on: bool) -> Outcome {
        let (hook, action) = if on {
            (&self.hooks.offline, "offline")
        } else {
            (&self.hooks.online, "online")
        };
        let key = format!("fence-{flow}-{action}");
        let o = self.fence_hook(hook, action, node, flow, &key).await;
        self.set_offline_after(o, node, on)
    }
}

impl Inventory {
    /// A fenced node is offline in the inventory until its recovery clears the release.
    fn set_offline_after(&self, o: Outcome, node: &str, offline: bool) -> Outcome {
        if !o.ok() {
            return o;
        }
        match self.store.inventory_set_offline(node, offline, steady_ns()) {
            Ok(()) => o,
            Err(e) => Outcome::failed(format!("hook succeeded but recording it failed: {e}")),
        }
    }

    async fn fence_hook(
        &self,
        hook: &str,
        action: &str,
        node: &str,
        flow: &Uuid,
        key: &str,
    ) -> Outcome {
        let program = match exec::resolve(&self.repair_dir, hook) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(format!("hook refused: {e}")),
        };
        let flow = flow.to_string();
        let call = HookCall {
            node,
            event: &flow,
            job: None,
            action: Some(action),
        };
        let spec = call.spec(program, Vec::new(), &self.env, self.timeout);
        self.runner.run(key, &spec).await
    }
}
