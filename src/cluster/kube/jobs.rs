//! Runs a `PodRun` as a `batch/v1` Job in maintd's namespace and waits for the Job controller's
//! verdict: a Job of the same name made for the same work is adopted, never duplicated; secret
//! files travel in a Secret the Job owns; a Job that gives no verdict in time is deleted, so it
//! cannot act later.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodTemplateSpec, Secret, SecretVolumeSource, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use tracing::{info, warn};

use super::{KubeCluster, api_code};
use crate::cluster::pods::{FILES_DIR, Placement, PodOutcome, PodRun};
use crate::cluster::{ClusterError, PodRunner};

/// Beyond the Job's own deadline, how long maintd waits for the Job controller to say so.
const VERDICT_MARGIN: Duration = Duration::from_secs(60);
/// The label every Job maintd makes carries, with the work's identity beside it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "maintd");
const FILES_VOLUME: &str = "maintd-files";

fn job_error(name: &str, problem: impl Into<String>) -> ClusterError {
    ClusterError::Job {
        name: name.into(),
        problem: problem.into(),
    }
}

/// The Job for `run`, from its template and what maintd adds: labels, environment,
/// placement, the secret files' volume, one attempt, the deadline and the TTL.
pub fn job_of(run: &PodRun) -> Result<Job, ClusterError> {
    let mut template: PodTemplateSpec = serde_json::from_value(run.template.clone())
        .map_err(|e| job_error(&run.name, format!("the pod template is not valid: {e}")))?;
    let mut labels = run.labels.clone();
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    let meta = template.metadata.get_or_insert_default();
    meta.labels.get_or_insert_default().extend(labels.clone());
    let spec = template
        .spec
        .as_mut()
        .ok_or_else(|| job_error(&run.name, "the pod template has no spec"))?;
    if spec.containers.is_empty() {
        return Err(job_error(&run.name, "the pod template has no container"));
    }
    // One attempt per Job: retrying is maintd's decision (another node, an escalation).
    spec.restart_policy = Some("Never".into());
    if spec.automount_service_account_token.is_none() {
        spec.automount_service_account_token = Some(false);
    }
    match &run.placement {
        Placement::On(node) => {
            // Bound directly: a node being repaired is often NotReady or cordoned, which the
            // scheduler would refuse; its kubelet, if alive, runs the pod.
            spec.node_name = Some(node.clone());
            spec.tolerations.get_or_insert_default().push(Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            });
        }
        Placement::AwayFrom(nodes) if !nodes.is_empty() => {
            // By the Node's name (a field), not its hostname label: the two may differ, and a
            // node without the label would match a NotIn on it.
            // A field requirement takes one value; requirements in a term are ANDed.
            let away = NodeSelectorTerm {
                match_fields: Some(
                    nodes
                        .iter()
                        .map(|n| NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "NotIn".into(),
                            values: Some(vec![n.clone()]),
                        })
                        .collect(),
                ),
                ..Default::default()
            };
            let affinity = spec.affinity.get_or_insert_with(Affinity::default);
            let na = affinity
                .node_affinity
                .get_or_insert_with(NodeAffinity::default);
            let required = na
                .required_during_scheduling_ignored_during_execution
                .get_or_insert_with(|| NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm::default()],
                });
            if required.node_selector_terms.is_empty() {
                required.node_selector_terms.push(away.clone());
            } else {
                // Terms are ORed: the exclusion goes into every one of them.
                for t in &mut required.node_selector_terms {
                    t.match_fields
                        .get_or_insert_default()
                        .extend(away.match_fields.clone().unwrap_or_default());
                }
            }
        }
        Placement::AwayFrom(_) => {}
    }
    if !run.files.is_empty() {
        spec.volumes.get_or_insert_default().push(Volume {
            name: FILES_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(run.name.clone()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    for c in &mut spec.containers {
        let env = c.env.get_or_insert_default();
        for (k, v) in &run.env {
            env.push(EnvVar {
                name: k.clone(),
                value: Some(v.clone()),
                ..Default::default()
            });
        }
        if !run.files.is_empty() {
            c.volume_mounts.get_or_insert_default().push(VolumeMount {
                name: FILES_VOLUME.into(),
                mount_path: FILES_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
    }
    Ok(Job {
        metadata: kube::api::ObjectMeta {
            name: Some(run.name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(JobSpec {
            template,
            backoff_limit: Some(0),
            active_deadline_seconds: Some(run.deadline.as_secs().max(1) as i64),
            ttl_seconds_after_finished: Some(run.ttl.as_secs().min(i32::MAX as u64) as i32),
            ..Default::default()
        }),
        status: None,
    })
}

/// The Job's verdict, once the Job controller has one: `Some((succeeded, why))`.
fn verdict(job: &Job) -> Option<(bool, String)> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match c.type_.as_str() {
            "Complete" => Some((true, "completed".to_string())),
            "Failed" => Some((
                false,
                format!(
                    "failed: {}{}",
                    c.reason.as_deref().unwrap_or("no reason"),
                    c.message
                        .as_deref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default()
                ),
            )),
            _ => None,
        })
}

/// Whether an existing Job was made for the same work: every label the run asks for matches.
fn same_work(existing: &Job, run: &PodRun) -> bool {
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    labels.get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
        && run.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Where the Job's last pod ran, and what its first container said on termination.
fn pod_result(pods: &[Pod]) -> (Option<String>, Option<String>) {
    let Some(pod) = pods
        .iter()
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
    else {
        return (None, None);
    };
    let host = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|st| st.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .filter(|m| !m.is_empty());
    (host, message)
}

impl KubeCluster {
    /// Creates (or adopts) the Job for `run` and waits for its verdict. With `owner` (a remedy's
    /// Node), the Job goes when its owner does.
    pub async fn run_pod_job(
        &self,
        run: PodRun,
        owner: Option<OwnerReference>,
    ) -> Result<PodOutcome, ClusterError> {
        let ns = self.fence_namespace();
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let mut job = job_of(&run)?;
        job.metadata.owner_references = owner.map(|o| vec![o]);
        info!(job = %run.name, namespace = %ns, placement = ?run.placement, "starting a Job");
        let (created, adopted) = match jobs.create(&PostParams::default(), &job).await {
            Ok(j) => (j, false),
            Err(e) if api_code(&e) == Some(409) => {
                let existing = jobs.get(&run.name).await?;
                if !same_work(&existing, &run) {
                    return Err(job_error(
                        &run.name,
                        "a Job of this name exists that maintd did not make for this work",
                    ));
                }
                info!(job = %run.name, namespace = %ns, "adopting the Job of the same work");
                (existing, true)
            }
            Err(e) => return Err(e.into()),
        };
        if !run.files.is_empty() && !adopted {
            self.put_files(&ns, &run, &created).await?;
        }
        let wait =
            kube::runtime::wait::await_condition(jobs.clone(), &run.name, |j: Option<&Job>| {
                j.is_some_and(|j| verdict(j).is_some())
            });
        let outcome = match tokio::time::timeout(run.deadline + VERDICT_MARGIN, wait).await {
            Ok(Ok(Some(done))) => {
                let (succeeded, why) = verdict(&done).unwrap_or((false, "vanished".into()));
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                let lp = ListParams::default().labels(&format!("job-name={}", run.name));
                let (host, message) = match pods.list(&lp).await {
                    Ok(l) => pod_result(&l.items),
                    Err(e) => {
                        warn!(job = %run.name, error = %e, "cannot read the Job's pods");
                        (None, None)
                    }
                };
                let on = host
                    .as_deref()
                    .map(|h| format!(" on {h}"))
                    .unwrap_or_default();
                PodOutcome {
                    succeeded,
                    detail: format!("Job {ns}/{}{on} {why}", run.name),
                    host,
                    message,
                    adopted,
                }
            }
            Ok(Ok(None)) => PodOutcome {
                succeeded: false,
                detail: format!("Job {ns}/{} was deleted before it ended", run.name),
                host: None,
                message: None,
                adopted,
            },
            Ok(Err(e)) => {
                self.stop_job(&jobs, &run.name).await;
                return Err(job_error(&run.name, format!("cannot watch it: {e}")));
            }
            Err(_) => {
                // A Job that outlives maintd's wait must not act later.
                self.stop_job(&jobs, &run.name).await;
                PodOutcome {
                    succeeded: false,
                    detail: format!(
                        "Job {ns}/{} gave no verdict within {:?}; deleted",
                        run.name,
                        run.deadline + VERDICT_MARGIN
                    ),
                    host: None,
                    message: None,
                    adopted,
                }
            }
        };
        if !run.files.is_empty() {
            // The Job owns the Secret too; deleting it now keeps secrets no longer than needed.
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
            if let Err(e) = secrets.delete(&run.name, &DeleteParams::default()).await
                && api_code(&e) != Some(404)
            {
                warn!(secret = %run.name, error = %e, "cannot delete a Job's Secret; the Job's TTL removes it");
            }
        }
        Ok(outcome)
    }

    /// The run's secret files, in a Secret the Job owns (garbage-collected with it). The pod
    /// waits for it to appear before it starts.
    async fn put_files(&self, ns: &str, run: &PodRun, job: &Job) -> Result<(), ClusterError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let owner = OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: run.name.clone(),
            uid: job.metadata.uid.clone().unwrap_or_default(),
            ..Default::default()
        };
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(run.name.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_string(),
                    MANAGED_BY.1.to_string(),
                )])),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            string_data: Some(run.files.clone()),
            ..Default::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.stop_job(&Api::namespaced(self.client.clone(), ns), &run.name)
                    .await;
                Err(job_error(
                    &run.name,
                    format!("cannot create its Secret: {e}"),
                ))
            }
        }
    }

    async fn stop_job(&self, jobs: &Api<Job>, name: &str) {
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        if let Err(e) = jobs.delete(name, &dp).await
            && api_code(&e) != Some(404)
        {
            warn!(job = %name, error = %e, "cannot delete a Job maintd gave up on");
        }
    }
}

#[async_trait::async_trait]
impl PodRunner for KubeCluster {
    async fn run_pod(&self, run: PodRun) -> Result<PodOutcome, ClusterError> {
        self.run_pod_job(run, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(placement: Placement, files: bool) -> PodRun {
        PodRun {
            name: "maintd-remedy-x".into(),
            labels: BTreeMap::from([("maintd.io/event".to_string(), "e1".to_string())]),
            template: serde_json::json!({"metadata": {"labels": {"app": "fix"}},
                "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "i"}]}}),
            env: vec![("MAINTD_NODE".into(), "n1".into())],
            placement,
            files: if files {
                BTreeMap::from([("options".to_string(), "password=pw\n".to_string())])
            } else {
                BTreeMap::new()
            },
            deadline: Duration::from_secs(90),
            ttl: Duration::from_secs(600),
        }
    }

    #[test]
    fn a_run_becomes_one_attempt_with_its_labels_placement_deadline_and_ttl() {
        let j = job_of(&run(Placement::On("n1".into()), false)).unwrap();
        let spec = j.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(90));
        assert_eq!(spec.ttl_seconds_after_finished, Some(600));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.node_name.as_deref(), Some("n1"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels["app"], "fix");
        assert_eq!(labels["maintd.io/event"], "e1");
        assert_eq!(labels[MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(j.metadata.labels.as_ref().unwrap()["maintd.io/event"], "e1");
        let env = pod.containers[0].env.as_ref().unwrap();
        assert!(
            env.iter()
                .any(|e| e.name == "MAINTD_NODE" && e.value.as_deref() == Some("n1"))
        );
        assert!(pod.volumes.is_none());
        let j = job_of(&run(
            Placement::AwayFrom(vec!["n1".into(), "n2".into()]),
            true,
        ))
        .unwrap();
        let pod = j.spec.unwrap().template.spec.unwrap();
        assert!(pod.node_name.is_none());
        let terms = pod
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let away: Vec<(&str, &str, Vec<String>)> = terms[0]
            .match_fields
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m.key.as_str(),
                    m.operator.as_str(),
                    m.values.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            away,
            vec![
                ("metadata.name", "NotIn", vec!["n1".to_string()]),
                ("metadata.name", "NotIn", vec!["n2".to_string()])
            ]
        );
        // The files come from the Secret named after the Job; no value is in the Job.
        let v = &pod.volumes.unwrap()[0];
        assert_eq!(
            v.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("maintd-remedy-x")
        );
        assert_eq!(
            pod.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path,
            FILES_DIR
        );
        let text =
            serde_json::to_string(&job_of(&run(Placement::On("n".into()), true)).unwrap()).unwrap();
        assert!(!text.contains("password=pw"));
    }

    #[test]
    fn a_job_of_other_work_is_not_adopted_and_a_bad_template_is_named() {
        let r = run(Placement::On("n1".into()), false);
        let mine = job_of(&r).unwrap();
        assert!(same_work(&mine, &r));
        let mut other = mine.clone();
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("maintd.io/event".into(), "e2".into());
        assert!(!same_work(&other, &r));
        let mut bad = r.clone();
        bad.template = serde_json::json!({"spec": {"containers": []}});
        let e = job_of(&bad).unwrap_err().to_string();
        assert!(
            e.contains("maintd-remedy-x") && e.contains("no container"),
            "{e}"
        );
    }
}
