//! The Ganeti backend's upkeep in rounds: harep's instance repairs and hbal's balancing moves,
//! planned away from the nodes the round's events hold, and run as jobs carrying maintd's
//! reason, the repairs with harep's own `pending` and `result` tags.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use super::autorepair::{self, Instance, RepairType};
use super::backend::Ganeti;
use super::hbal::{Move, first_jobset, parse_move};
use super::tasks::{Call, Task, now_s};
use crate::cluster::{ClusterError, Upkeep, UpkeepPlan};
use maintd_core::verdict::Outcome;

const BALANCE: &str = "gnt:daemon:maintd balance";

impl Ganeti {
    /// The round's repairs and balancing moves, none touching `plan.busy` nor each other.
    pub(super) async fn plan(&self, plan: &UpkeepPlan) -> Result<Vec<Upkeep>, ClusterError> {
        let s = &self.upkeep;
        if !s.repairs && !s.balance {
            return Ok(Vec::new());
        }
        {
            let mut last = self.last_plan.lock().unwrap_or_else(|p| p.into_inner());
            if !plan.round && last.is_some_and(|l| l.elapsed() < s.interval) {
                return Ok(Vec::new());
            }
            *last = Some(tokio::time::Instant::now());
        }
        let instances: Vec<Instance> =
            serde_json::from_value(self.rapi.get("/2/instances?bulk=1").await?)
                .map_err(|e| ClusterError::Ganeti(format!("GET /2/instances?bulk=1: {e}")))?;
        let mut taken = plan.busy.clone();
        let mut out = Vec::new();
        if s.repairs {
            self.plan_repairs(&instances, &mut taken, &mut out).await?;
        }
        if s.balance {
            taken.extend(plan.failed.iter().cloned());
            // hbal out of reach costs the moves, never the repairs planned beside them.
            if let Err(e) = self.plan_balance(&instances, &taken, &mut out).await {
                warn!(error = %e, "no balancing moves this round");
            }
        }
        Ok(out)
    }

    /// hbal's first set of moves, without those touching a taken node; or, after a restart,
    /// the balancing jobs still running (the round waits for them).
    async fn plan_balance(
        &self,
        instances: &[Instance],
        taken: &BTreeSet<String>,
        out: &mut Vec<Upkeep>,
    ) -> Result<(), ClusterError> {
        let running = self.rapi.unfinished(BALANCE).await?;
        if !running.is_empty() {
            out.push(Upkeep {
                what: format!("balancing jobs {running:?} from before, to their end"),
                nodes: BTreeSet::new(),
                op: serde_json::to_value(Task::Wait { jobs: running }).expect("a task serializes"),
            });
            return Ok(());
        }
        let text = self.hbal().await?;
        let by_name: BTreeMap<&str, &Instance> =
            instances.iter().map(|i| (i.name.as_str(), i)).collect();
        for job in first_jobset(&text) {
            let moves: Vec<Move> = match job.iter().map(|l| parse_move(l)).collect() {
                Some(m) => m,
                None => {
                    warn!(job = ?job, "hbal proposed a command maintd does not submit; skipped");
                    continue;
                }
            };
            let Some(inst) = moves.first().and_then(|m| by_name.get(m.instance.as_str())) else {
                continue;
            };
            // Only a healthy instance is moved: one on an unreachable node may still run
            // there, and is for the repairs and the fencing to handle.
            if !matches!(inst.status.as_str(), "running" | "ADMIN_down") {
                info!(instance = %inst.name, status = %inst.status, "no balancing move for an instance that is not healthy");
                continue;
            }
            let mut nodes: BTreeSet<String> = inst.nodes().cloned().collect();
            nodes.extend(moves.iter().filter_map(|m| m.node.clone()));
            if !nodes.is_disjoint(taken) {
                info!(instance = %inst.name, "balancing move left for a round without its nodes");
                continue;
            }
            let steps = moves.iter().map(Move::call).collect();
            out.push(Upkeep {
                what: format!("balance: {}", job.join(" && ")),
                nodes,
                op: serde_json::to_value(Task::Balance {
                    instance: inst.name.clone(),
                    steps,
                })
                .expect("a task serializes"),
            });
        }
        Ok(())
    }

    /// Runs one upkeep task; every job carries maintd's reason.
    pub(super) async fn run(&self, u: &Upkeep) -> Outcome {
        let task: Task = match serde_json::from_value(u.op.clone()) {
            Ok(t) => t,
            Err(e) => return Outcome::failed(format!("{}: not a Ganeti upkeep task: {e}", u.what)),
        };
        let r =
            match task {
                Task::Repair {
                    instance,
                    rtype,
                    id,
                    ts,
                    pending,
                    steps,
                } => {
                    self.repair(&instance, &rtype, id, ts, pending, &steps)
                        .await
                }
                Task::Close {
                    instance,
                    pending,
                    result,
                    rtype,
                    id,
                    ts: _,
                    jobs,
                } => {
                    async {
                        let t = RepairType::parse(&rtype).unwrap_or(RepairType::FixStorage);
                        let tag = autorepair::result_tag(t, &id, now_s(), &result, &jobs);
                        self.instance_tag(&instance, &tag, true).await?;
                        self.instance_tag(&instance, &pending, false).await?;
                        Ok(format!("{instance}: {tag}"))
                    }
                    .await
                }
                Task::Refuse { instance, rtype } => {
                    async {
                        let t = RepairType::parse(&rtype).unwrap_or(RepairType::Reinstall);
                        let id = uuid::Uuid::new_v4().to_string();
                        let tag = autorepair::result_tag(t, &id, now_s(), "enoperm", &[]);
                        self.instance_tag(&instance, &tag, true).await?;
                        Ok(format!("{instance}: {tag}"))
                    }
                    .await
                }
                Task::Balance { instance, steps } => {
                    async {
                        let mut done = Vec::new();
                        for (n, c) in steps.iter().enumerate() {
                            let reason = format!("{BALANCE} {instance} step:{n}");
                            done.push(self.submit_call(c, &reason).await?.0.to_string());
                        }
                        Ok(format!("{instance} moved by jobs {}", done.join(", ")))
                    }
                    .await
                }
                Task::Wait { jobs } => async {
                    for id in &jobs {
                        // A balancing job's own failure is Ganeti's to report; the round just waits.
                        if let Err(e) = self.rapi.wait(*id, self.job_timeout).await {
                            warn!(job = id, error = %e, "a balancing job from before ended badly");
                        }
                    }
                    Ok(format!("jobs {jobs:?} ended"))
                }
                .await,
            };
        match r {
            Ok(d) => Outcome::done(d),
            Err(e) => Outcome::failed(format!("{}: {e}", u.what)),
        }
    }

    pub(super) async fn submit_call(
        &self,
        c: &Call,
        reason: &str,
    ) -> Result<(u64, Vec<u64>), ClusterError> {
        let method = match c.method.as_str() {
            "PUT" => "PUT",
            "POST" => "POST",
            "DELETE" => "DELETE",
            other => {
                return Err(ClusterError::Ganeti(format!(
                    "method {other} is not submitted"
                )));
            }
        };
        Ok(self
            .job_ids(method, &c.path, reason, Some(c.body.clone()))
            .await?)
    }
}
