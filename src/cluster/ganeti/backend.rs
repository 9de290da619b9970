//! The Ganeti backend: nodes, roles and tags from the RAPI; every action a Ganeti job carrying
//! maintd's reason (`gnt:daemon:maintd` and the event), adopted after a restart instead of
//! submitted twice, and followed to its end with its child jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::rapi::{Rapi, RapiError, RapiNode, RapiSettings};
use super::tasks::UpkeepSettings;
use crate::cluster::{
    Backend, ClusterError, FenceRelease, NodeSource, TagsAndJobs, Upkeep, UpkeepPlan, UpkeepRunner,
};
use crate::node::NodeConfig;
use maintd_core::repair::{Job, JobKind};
use maintd_core::verdict::Outcome;

/// The `[ganeti]` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct GanetiConfig {
    pub rapi_url: String,
    /// The RAPI's certificate, pinned: its first PEM certificate is the only one trusted.
    pub rapi_certificate: PathBuf,
    pub rapi_user: String,
    pub rapi_password_file: PathBuf,
    #[serde(with = "humantime_serde")]
    pub rapi_timeout: Duration,
    pub rapi_retries: u32,
    /// How Ganeti picks where instances go.
    pub iallocator: String,
    /// How long one action's jobs (child jobs included) may take.
    #[serde(with = "humantime_serde")]
    pub job_timeout: Duration,
    /// The collectors' port on Ganeti nodes: Ganeti's monitoring daemon holds 1815.
    pub collector_port: u16,
    /// This host's Ganeti node name (default: `GANETI_HOSTNAME` when set, else the host name).
    pub node_name: Option<String>,
    /// Where Ganeti keeps this node's `ssconf_*` files: `ssconf_master_node` says who is master
    /// now, even when the RAPI moved away with a failover.
    pub ssconf_dir: PathBuf,
    /// How often the node list is read again (nodes added or removed without a restart).
    #[serde(with = "humantime_serde")]
    pub members_interval: Duration,
    /// Instance repairs as harep does them, by its tags.
    pub repairs: bool,
    /// How long an instance stays `ERROR_down` before a repair moves it: Ganeti's watcher
    /// restarts it in place first.
    #[serde(with = "humantime_serde")]
    pub repair_down_after: Duration,
    /// Balancing moves from hbal in each round.
    pub balance: bool,
    /// hbal weighs the nodes' load from Ganeti's monitoring daemons (`--mond=yes`).
    pub balance_mond: bool,
    pub hbal: PathBuf,
    /// Ganeti's query socket on the master, which hbal reads.
    pub luxi_socket: PathBuf,
    /// How often an idle daemon looks for repairs and moves (a round of events always looks).
    #[serde(with = "humantime_serde")]
    pub upkeep_interval: Duration,
}

impl Default for GanetiConfig {
    fn default() -> Self {
        GanetiConfig {
            rapi_url: "https://localhost:5080".into(),
            rapi_certificate: "/var/lib/ganeti/rapi.pem".into(),
            rapi_user: "maintd".into(),
            rapi_password_file: "/etc/maintd/ganeti-rapi-password".into(),
            rapi_timeout: Duration::from_secs(30),
            rapi_retries: 3,
            iallocator: "hail".into(),
            job_timeout: Duration::from_secs(30 * 60),
            collector_port: 1817,
            node_name: None,
            ssconf_dir: "/var/lib/ganeti".into(),
            members_interval: Duration::from_secs(30),
            repairs: false,
            repair_down_after: Duration::from_secs(10 * 60),
            balance: false,
            balance_mond: false,
            hbal: "hbal".into(),
            luxi_socket: "/var/run/ganeti/socket/ganeti-query".into(),
            upkeep_interval: Duration::from_secs(60),
        }
    }
}

impl GanetiConfig {
    pub fn rapi(&self) -> RapiSettings {
        RapiSettings {
            url: self.rapi_url.clone(),
            certificate: self.rapi_certificate.clone(),
            user: self.rapi_user.clone(),
            password_file: self.rapi_password_file.clone(),
            timeout: self.rapi_timeout,
            retries: self.rapi_retries,
        }
    }

    /// The name Ganeti knows this host by.
    pub fn this_node(&self, host: &str) -> String {
        self.node_name
            .clone()
            .or_else(|| std::env::var("GANETI_HOSTNAME").ok())
            .unwrap_or_else(|| host.to_string())
    }
}

impl From<RapiError> for ClusterError {
    fn from(e: RapiError) -> Self {
        ClusterError::Ganeti(e.to_string())
    }
}

/// The marker every job of maintd's carries in its reason trail.
pub const REASON_SOURCE: &str = "gnt:daemon:maintd";

pub struct Ganeti {
    pub(super) rapi: Rapi,
    ssconf_master: PathBuf,
    pub(super) iallocator: String,
    pub(super) job_timeout: Duration,
    collector_port: u16,
    members_interval: Duration,
    pub(super) upkeep: UpkeepSettings,
    /// When the upkeep last looked (it looks every `upkeep-interval` when idle).
    pub(super) last_plan: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Since when each `ERROR_down` instance has been seen so.
    pub(super) down_since: std::sync::Mutex<BTreeMap<String, tokio::time::Instant>>,
    /// Why each instance's repair last waited, as logged.
    pub(super) said: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Ganeti {
    pub fn connect(cfg: &GanetiConfig) -> Result<Ganeti, ClusterError> {
        Ok(Ganeti {
            rapi: Rapi::new(&cfg.rapi())?,
            ssconf_master: cfg.ssconf_dir.join("ssconf_master_node"),
            iallocator: cfg.iallocator.clone(),
            job_timeout: cfg.job_timeout,
            collector_port: cfg.collector_port,
            members_interval: cfg.members_interval,
            upkeep: UpkeepSettings {
                repairs: cfg.repairs,
                repair_down_after: cfg.repair_down_after,
                balance: cfg.balance,
                balance_mond: cfg.balance_mond,
                hbal: cfg.hbal.clone(),
                luxi_socket: cfg.luxi_socket.clone(),
                interval: cfg.upkeep_interval,
            },
            last_plan: Default::default(),
            down_since: Default::default(),
            said: Default::default(),
        })
    }

    /// Who is master as Ganeti told this node (its ssconf), or the RAPI when that file cannot
    /// be read. After a failover the old master's RAPI is gone, but its ssconf is updated.
    pub async fn current_master(&self) -> Result<String, ClusterError> {
        match self.ssconf_master() {
            Some(m) => Ok(m),
            None => self.master().await,
        }
    }

    /// The master this node's `ssconf_master_node` names, if it can be read.
    pub fn ssconf_master(&self) -> Option<String> {
        std::fs::read_to_string(&self.ssconf_master)
            .ok()
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
    }

    pub fn rapi(&self) -> &Rapi {
        &self.rapi
    }

    /// The master by Ganeti's own vote.
    pub async fn master(&self) -> Result<String, ClusterError> {
        Ok(self.rapi.master().await?)
    }

    /// Every node with its collector at its primary address.
    pub async fn members(&self) -> Result<Vec<NodeConfig>, ClusterError> {
        let path = "/2/nodes?bulk=1";
        let nodes: Vec<Value> = serde_json::from_value(self.rapi_get(path).await?)
            .map_err(|e| ClusterError::Ganeti(format!("GET {path}: {e}")))?;
        Ok(nodes
            .iter()
            .filter_map(|n| {
                let name = n["name"].as_str()?;
                let ip = n["pip"].as_str()?;
                Some(NodeConfig {
                    name: name.into(),
                    collector: format!("{ip}:{}", self.collector_port),
                })
            })
            .collect())
    }

    async fn rapi_get(&self, path: &str) -> Result<Value, ClusterError> {
        Ok(self.rapi.get(path).await?)
    }

    async fn node(&self, name: &str) -> Result<RapiNode, ClusterError> {
        self.rapi
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| ClusterError::UnknownNode(name.into()))
    }

    /// Runs one job to its end: the one already queued with `reason` (submitted before a
    /// restart), else a new one.
    async fn job(
        &self,
        method: &'static str,
        path: &str,
        reason: &str,
        body: Option<Value>,
    ) -> Result<String, RapiError> {
        let (id, children) = self.job_ids(method, path, reason, body).await?;
        Ok(if children.is_empty() {
            format!("job {id}")
        } else {
            let c: Vec<String> = children.iter().map(u64::to_string).collect();
            format!("job {id} (child jobs {})", c.join(", "))
        })
    }

    /// `job`, returning the job's id and its child jobs' ids.
    pub(super) async fn job_ids(
        &self,
        method: &'static str,
        path: &str,
        reason: &str,
        body: Option<Value>,
    ) -> Result<(u64, Vec<u64>), RapiError> {
        let id = match self.rapi.find_job(reason).await? {
            Some(id) => id,
            None => {
                self.rapi
                    .submit(method, path, reason, body.as_ref())
                    .await?
            }
        };
        let done = self.rapi.wait(id, self.job_timeout).await?;
        Ok((id, done.children))
    }

    fn reason(what: &str) -> String {
        format!("{REASON_SOURCE} {what}")
    }

    /// Moves the node's instances away: primaries by live migration (`live`) or failover,
    /// secondaries by a secondary evacuation, each with the iallocator.
    async fn evacuate(&self, job: &Job, live: bool) -> Result<String, ClusterError> {
        let node = self.node(&job.node).await?;
        if node.role == "M" {
            // Ganeti offlines no master: evacuating it would empty it and then fail, leaving
            // an emptied master tagged as failed. Refused before anything moves.
            return Err(ClusterError::Ganeti(format!(
                "{} is the Ganeti master, which Ganeti will not offline: nothing was moved; fail the master over (gnt-cluster master-failover on a master candidate), and the new master's maintd acts on this verdict",
                job.node
            )));
        }
        let n = &job.node;
        let base = format!("maintd:{} job:{}", job.event, job.id);
        let mut done = Vec::new();
        if !node.pinst_list.is_empty() {
            if live {
                let body = json!({"mode": "live", "iallocator": self.iallocator});
                let r = Self::reason(&format!("{base} migrate"));
                done.push(
                    self.job("POST", &format!("/2/nodes/{n}/migrate"), &r, Some(body))
                        .await?,
                );
            } else {
                for inst in &node.pinst_list {
                    let body = json!({"iallocator": self.iallocator});
                    let r = Self::reason(&format!("{base} failover {inst}"));
                    let path = format!("/2/instances/{inst}/failover");
                    done.push(self.job("PUT", &path, &r, Some(body)).await?);
                }
            }
        }
        if !node.sinst_list.is_empty() {
            let body = json!({"mode": "secondary-only", "iallocator": self.iallocator});
            let r = Self::reason(&format!("{base} evacuate-secondaries"));
            done.push(
                self.job("POST", &format!("/2/nodes/{n}/evacuate"), &r, Some(body))
                    .await?,
            );
        }
        let left = self.node(n).await?;
        if !left.pinst_list.is_empty() || !left.sinst_list.is_empty() {
            return Err(ClusterError::Ganeti(format!(
                "{n} still holds instances after {}: primary {:?}, secondary {:?}",
                done.join(", "),
                left.pinst_list,
                left.sinst_list
            )));
        }
        Ok(if done.is_empty() {
            format!("{n} holds no instance")
        } else {
            format!("{n} evacuated: {}", done.join(", "))
        })
    }

    /// Sets a node offline (`true`) or back to a regular role (`false`), unless it is so.
    async fn set_offline(
        &self,
        n: &str,
        offline: bool,
        what: &str,
    ) -> Result<String, ClusterError> {
        let node = self.node(n).await?;
        if node.offline == offline && !node.drained {
            return Ok(format!(
                "{n} already {}",
                if offline { "offline" } else { "online" }
            ));
        }
        let r = Self::reason(what);
        Ok(if offline {
            let body = json!({"offline": true});
            self.job("POST", &format!("/2/nodes/{n}/modify"), &r, Some(body))
                .await?
        } else {
            let body = json!("regular");
            self.job("PUT", &format!("/2/nodes/{n}/role?force=1"), &r, Some(body))
                .await?
        })
    }
}

fn outcome(r: Result<String, ClusterError>) -> Outcome {
    match r {
        Ok(d) => Outcome::done(d),
        Err(e) => Outcome::failed(e.to_string()),
    }
}

#[async_trait::async_trait]
impl TagsAndJobs for Ganeti {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        Ok(self
            .rapi
            .nodes()
            .await?
            .into_iter()
            .map(|n| (n.name, n.tags.into_iter().collect()))
            .collect())
    }

    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError> {
        if self.node(node).await?.tags.iter().any(|t| t == tag) {
            return Ok(());
        }
        let path = format!("/2/nodes/{node}/tags?tag={}", super::rapi::encode(tag));
        self.job("PUT", &path, &Self::reason(&format!("tag {tag}")), None)
            .await?;
        Ok(())
    }

    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError> {
        if !self.node(node).await?.tags.iter().any(|t| t == tag) {
            return Ok(false);
        }
        let path = format!("/2/nodes/{node}/tags?tag={}", super::rapi::encode(tag));
        self.job(
            "DELETE",
            &path,
            &Self::reason(&format!("untag {tag}")),
            None,
        )
        .await?;
        Ok(true)
    }

    async fn run_job(&self, job: &Job, _event_json: &str) -> Outcome {
        let what = format!("maintd:{} job:{} {}", job.event, job.id, job.kind.as_str());
        match job.kind {
            JobKind::Evacuate => outcome(self.evacuate(job, true).await),
            JobKind::EvacuateFailover => outcome(self.evacuate(job, false).await),
            JobKind::Offline => outcome(self.set_offline(&job.node, true, &what).await),
            JobKind::Online => outcome(self.set_offline(&job.node, false, &what).await),
            JobKind::LiveRepair | JobKind::Remedy => Outcome::failed(format!(
                "{} is not a Ganeti job (live repairs run on the collector)",
                job.kind.as_str()
            )),
        }
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self
            .rapi
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.offline)
            .map(|n| n.name)
            .collect())
    }
}

#[async_trait::async_trait]
impl FenceRelease for Ganeti {
    /// The node is proven off: marked offline, then each of its instances failed over to a
    /// healthy node ignoring the dead node's disks.
    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome {
        let r = async {
            let base = format!("fence:{flow} release:{attempt}");
            let mut done = vec![
                self.set_offline(node, true, &format!("{base} offline"))
                    .await?,
            ];
            for inst in self.node(node).await?.pinst_list {
                let body = json!({"iallocator": self.iallocator, "ignore_consistency": true});
                let r = Self::reason(&format!("{base} failover {inst}"));
                let path = format!("/2/instances/{inst}/failover");
                done.push(format!(
                    "{inst}: {}",
                    self.job("PUT", &path, &r, Some(body)).await?
                ));
            }
            Ok(done.join("; "))
        };
        outcome(r.await)
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        outcome(
            self.set_offline(node, false, &format!("fence:{flow} reclaim"))
                .await,
        )
    }

    /// A self-fencing node is drained (no new instances) until it is back.
    async fn mark_unschedulable(&self, node: &str, flow: &Uuid, on: bool) -> Outcome {
        let r = async {
            let n = self.node(node).await?;
            if n.drained == on {
                return Ok(format!("{node} drained: {on}"));
            }
            let r = Self::reason(&format!("fence:{flow} drained:{on}"));
            let body = json!({"drained": on});
            Ok(self
                .job("POST", &format!("/2/nodes/{node}/modify"), &r, Some(body))
                .await?)
        };
        outcome(r.await)
    }
}

#[async_trait::async_trait]
impl NodeSource for Ganeti {
    async fn members(&self) -> Result<Vec<NodeConfig>, ClusterError> {
        Ganeti::members(self).await
    }

    fn interval(&self) -> Duration {
        self.members_interval
    }
}

impl Ganeti {
    /// Every capability this backend has: its nodes listed from the cluster, and upkeep when
    /// repairs or balancing are on.
    pub fn backend(self: Arc<Self>) -> Backend {
        let upkeep = (self.upkeep.repairs || self.upkeep.balance)
            .then(|| self.clone() as Arc<dyn UpkeepRunner>);
        Backend {
            nodes: Some(self.clone()),
            upkeep,
            ..Backend::basic(self)
        }
    }
}

#[async_trait::async_trait]
impl UpkeepRunner for Ganeti {
    async fn plan_upkeep(&self, plan: &UpkeepPlan) -> Result<Vec<Upkeep>, ClusterError> {
        self.plan(plan).await
    }

    async fn run_upkeep(&self, u: &Upkeep) -> Outcome {
        self.run(u).await
    }
}
