//! harep's instance repairs with side effects: each instance's step planned from its tags, its
//! node group's and the cluster's, and run as jobs under harep's `pending` tag, ending with its
//! `result` tag.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tracing::info;

use super::autorepair::{self, Instance, NodeFlags, RepairOp, RepairType, Step};
use super::backend::{Ganeti, REASON_SOURCE};
use super::tasks::{Call, Task, call, now_s};
use crate::cluster::{ClusterError, Upkeep};

impl Ganeti {
    pub(super) async fn plan_repairs(
        &self,
        instances: &[Instance],
        taken: &mut BTreeSet<String>,
        out: &mut Vec<Upkeep>,
    ) -> Result<(), ClusterError> {
        let nodes = self.rapi.nodes().await?;
        let flags: BTreeMap<String, NodeFlags> = nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    NodeFlags {
                        offline: n.offline,
                        drained: n.drained,
                    },
                )
            })
            .collect();
        let group_of: BTreeMap<&str, &str> = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.group.as_str()))
            .collect();
        let groups: Vec<Value> =
            serde_json::from_value(self.rapi.get("/2/groups?bulk=1").await?)
                .map_err(|e| ClusterError::Ganeti(format!("GET /2/groups?bulk=1: {e}")))?;
        let group_tags: BTreeMap<String, Vec<String>> = groups
            .iter()
            .filter_map(|g| {
                let tags = serde_json::from_value(g["tags"].clone()).unwrap_or_default();
                Some((g["name"].as_str()?.to_string(), tags))
            })
            .collect();
        let cluster_tags: Vec<String> = serde_json::from_value(self.rapi.get("/2/tags").await?)
            .map_err(|e| ClusterError::Ganeti(format!("GET /2/tags: {e}")))?;
        let now = now_s();
        let names: BTreeSet<&str> = instances.iter().map(|i| i.name.as_str()).collect();
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        said.retain(|i, _| names.contains(i.as_str()));
        drop(said);
        let mut down = self.down_since.lock().unwrap_or_else(|p| p.into_inner());
        down.retain(|i, _| {
            instances
                .iter()
                .any(|x| &x.name == i && x.status == "ERROR_down")
        });
        for inst in instances {
            let down_long = inst.status == "ERROR_down" && {
                let since = *down
                    .entry(inst.name.clone())
                    .or_insert_with(tokio::time::Instant::now);
                since.elapsed() >= self.upkeep.repair_down_after
            };
            let need = autorepair::need(inst, &flags, down_long);
            let group = group_of
                .get(inst.pnode.as_str())
                .and_then(|g| group_tags.get(*g));
            let empty = Vec::new();
            let levels = [
                &inst.tags[..],
                &group.unwrap_or(&empty)[..],
                &cluster_tags[..],
            ];
            let policy = autorepair::policy(&levels, now);
            let (what, task, nodes) = match autorepair::step(inst, &need, policy) {
                Step::Nothing => continue,
                Step::Blocked(why) => {
                    self.say_once(&inst.name, &why);
                    continue;
                }
                Step::Refuse(t) => (
                    format!(
                        "record that {} needs a {} repair its tags do not allow",
                        inst.name,
                        t.as_str()
                    ),
                    Task::Refuse {
                        instance: inst.name.clone(),
                        rtype: t.as_str().into(),
                    },
                    BTreeSet::new(),
                ),
                Step::Close { pending, result } => (
                    format!("close repair {} of {} ({result})", pending.id, inst.name),
                    Task::Close {
                        instance: inst.name.clone(),
                        pending: pending.tag,
                        result: result.into(),
                        rtype: pending.rtype.as_str().into(),
                        id: pending.id,
                        ts: pending.ts,
                        jobs: pending.jobs,
                    },
                    BTreeSet::new(),
                ),
                Step::Repair {
                    rtype,
                    op,
                    id,
                    ts,
                    pending,
                } => {
                    let nodes: BTreeSet<String> = inst.nodes().cloned().collect();
                    if !nodes.is_disjoint(taken) {
                        self.say_once(&inst.name, "waits for a round without its nodes");
                        continue;
                    }
                    let steps = self.repair_steps(inst, op);
                    (
                        format!("{} repair of {} ({op:?})", rtype.as_str(), inst.name),
                        Task::Repair {
                            instance: inst.name.clone(),
                            rtype: rtype.as_str().into(),
                            id,
                            ts,
                            pending,
                            steps,
                        },
                        nodes,
                    )
                }
            };
            taken.extend(nodes.iter().cloned());
            out.push(Upkeep {
                what,
                nodes,
                op: serde_json::to_value(task).expect("a task serializes"),
            });
        }
        Ok(())
    }

    fn repair_steps(&self, inst: &Instance, op: RepairOp) -> Vec<Call> {
        let i = &inst.name;
        let alloc = json!(self.iallocator);
        let drbd = inst.disk_template == "drbd";
        match op {
            RepairOp::Failover => {
                let body = if drbd {
                    json!({})
                } else {
                    json!({"iallocator": alloc})
                };
                vec![call("PUT", format!("/2/instances/{i}/failover"), body)]
            }
            RepairOp::Migrate => {
                let body = if drbd {
                    json!({"mode": "live"})
                } else {
                    json!({"mode": "live", "iallocator": alloc})
                };
                vec![call("PUT", format!("/2/instances/{i}/migrate"), body)]
            }
            RepairOp::ReplaceSecondary => vec![call(
                "POST",
                format!("/2/instances/{i}/replace-disks"),
                json!({"mode": "replace_new_secondary", "iallocator": alloc}),
            )],
            RepairOp::Reinstall => vec![
                call(
                    "POST",
                    format!("/2/instances/{i}/recreate-disks"),
                    json!({"iallocator": alloc}),
                ),
                call(
                    "POST",
                    format!("/2/instances/{i}/reinstall"),
                    json!({"os": inst.os, "start": true}),
                ),
            ],
        }
    }

    /// A repair under its pending tag (made now when it has none), then its result tag.
    pub(super) async fn repair(
        &self,
        instance: &str,
        rtype: &str,
        id: Option<String>,
        ts: Option<i64>,
        pending: Option<String>,
        steps: &[Call],
    ) -> Result<String, ClusterError> {
        let t = RepairType::parse(rtype)
            .ok_or_else(|| ClusterError::Ganeti(format!("unknown repair type {rtype:?}")))?;
        let id = id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let pending = match pending {
            Some(p) => p,
            None => {
                let p = autorepair::pending_tag(t, &id, ts.unwrap_or_else(now_s));
                self.instance_tag(instance, &p, true).await?;
                p
            }
        };
        let mut jobs = Vec::new();
        let mut failed = None;
        for (n, c) in steps.iter().enumerate() {
            // The repair's id is in the reason: after a restart its job is found, not repeated.
            let reason =
                format!("{REASON_SOURCE} autorepair:{rtype} {instance} repair:{id} step:{n}");
            match self.submit_call(c, &reason).await {
                Ok((job, children)) => {
                    jobs.push(job);
                    jobs.extend(children);
                }
                Err(e) => {
                    // The failed job's id goes into the result tag.
                    if let Ok(Some(j)) = self.rapi.find_job(&reason).await {
                        jobs.push(j);
                    }
                    failed = Some(e);
                    break;
                }
            }
        }
        let result = if failed.is_some() {
            "failure"
        } else {
            "success"
        };
        let tag = autorepair::result_tag(t, &id, now_s(), result, &jobs);
        self.instance_tag(instance, &tag, true).await?;
        self.instance_tag(instance, &pending, false).await?;
        match failed {
            Some(e) => Err(e),
            None => Ok(format!("{instance}: {tag}")),
        }
    }

    /// Logs why an instance's repair waits, once until the reason changes (the plan runs
    /// every round and every `upkeep-interval`).
    fn say_once(&self, instance: &str, why: &str) {
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        if said.get(instance).map(String::as_str) != Some(why) {
            info!(instance = %instance, why = %why, "instance repair waits");
            said.insert(instance.to_string(), why.to_string());
        }
    }

    /// Adds (`on`) or removes an instance tag, unless it already is so.
    pub(super) async fn instance_tag(
        &self,
        instance: &str,
        tag: &str,
        on: bool,
    ) -> Result<(), ClusterError> {
        let v = self
            .rapi
            .get(&format!("/2/instances/{instance}/tags"))
            .await?;
        let has = v
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t.as_str() == Some(tag));
        if has == on {
            return Ok(());
        }
        let path = format!(
            "/2/instances/{instance}/tags?tag={}",
            super::rapi::encode(tag)
        );
        let reason = format!("{REASON_SOURCE} {} {tag}", if on { "tag" } else { "untag" });
        self.job_ids(if on { "PUT" } else { "DELETE" }, &path, &reason, None)
            .await?;
        Ok(())
    }
}
