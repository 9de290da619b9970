//! Remedies: pod templates (`[kubernetes.remedies.<name>]`, or a ConfigMap `remedy-<name>` in
//! maintd's namespace) that a repair event runs as a Job, named after the event so that a new
//! leader adopts the Job rather than starting a second one. The Job's verdict is the event's.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use serde::Deserialize;

use super::KubeCluster;
use crate::cluster::pods::{Placement, PodRun};
use maintd_core::repair::{Job, JobKind};
use maintd_core::verdict::{FailureKind, Outcome};

/// The ConfigMap that defines remedy `<name>` when the TOML does not.
pub const CONFIGMAP_PREFIX: &str = "remedy-";
/// Labels that find a remedy's Job: `kubectl get jobs -l maintd.io/event=<id>`.
pub const EVENT_LABEL: &str = "maintd.io/event";
pub const REMEDY_LABEL: &str = "maintd.io/remedy";
pub const NODE_LABEL: &str = "maintd.io/node";
pub const ROLE_LABEL: &str = "maintd.io/role";
/// The event's JSON goes into the environment only up to this size.
const EVENT_JSON_MAX: usize = 8 * 1024;

/// Where a remedy's pod runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemedyPlacement {
    /// On the node being remedied (bound to it, tolerating its taints).
    #[default]
    Node,
    /// On any other node (e.g. a remedy that calls a cloud API about the node).
    Elsewhere,
}

/// One remedy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RemedyConfig {
    /// A pod template (`metadata` and `spec`, as in a Deployment's `template`), in YAML.
    pub template: String,
    #[serde(default)]
    pub placement: RemedyPlacement,
    /// The Job's active deadline: past it the Job fails (and the event with it).
    #[serde(default = "default_deadline", with = "humantime_serde")]
    pub deadline: Duration,
    /// How long a finished Job is kept (its `ttlSecondsAfterFinished`).
    #[serde(default = "default_ttl", with = "humantime_serde")]
    pub ttl: Duration,
}

fn default_deadline() -> Duration {
    Duration::from_secs(600)
}

fn default_ttl() -> Duration {
    Duration::from_secs(3600)
}

/// Why a remedy's definition is refused; each names the place and the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RemedyError {
    #[error(
        "remedy {name:?}: not defined (no [kubernetes.remedies.{name}] and no ConfigMap {CONFIGMAP_PREFIX}{name})"
    )]
    Unknown { name: String },
    #[error("remedy {name:?} ({place}): {problem}")]
    Invalid {
        name: String,
        place: String,
        problem: RemedyProblem,
    },
}

/// What is wrong with a remedy's definition, or with the Job it makes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RemedyProblem {
    /// A key of its ConfigMap, or the ConfigMap itself.
    #[error("{0}")]
    Definition(String),
    #[error("template is not a pod template: {0}")]
    NotATemplate(String),
    #[error("template has no spec")]
    NoSpec,
    #[error("template has no container")]
    NoContainer,
    #[error("template's restartPolicy is {0}; a remedy runs once (Never)")]
    Restarts(String),
    #[error("deadline must be greater than zero")]
    NoDeadline,
    #[error("the template cannot be written as JSON: {0}")]
    Json(String),
}

impl KubeCluster {
    /// One job of a repair event on its node (its medik8s Lease already held).
    pub(super) async fn run_node_job(&self, job: &Job, event: &str) -> Outcome {
        let node = &job.node;
        match job.kind {
            JobKind::Remedy => self.run_remedy(job, event).await,
            JobKind::Evacuate => self.drain(node, true).await,
            JobKind::EvacuateFailover => self.drain(node, false).await,
            JobKind::Offline => super::outcome(
                format!("{node} cordoned and tainted {}", super::OFFLINE_TAINT),
                self.offline(node, true).await,
            ),
            JobKind::Online => super::outcome(
                format!("{node} uncordoned"),
                self.offline(node, false).await,
            ),
            JobKind::LiveRepair => {
                Outcome::failed_as(FailureKind::Backend, "live repairs run on the collector")
            }
        }
    }
}

impl RemedyConfig {
    /// A ConfigMap's form: keys `template`, `placement`, `deadline`, `ttl`.
    pub fn from_configmap(
        name: &str,
        data: &BTreeMap<String, String>,
    ) -> Result<RemedyConfig, RemedyError> {
        let invalid = |problem: String| RemedyError::Invalid {
            name: name.into(),
            place: format!("ConfigMap {CONFIGMAP_PREFIX}{name}"),
            problem: RemedyProblem::Definition(problem),
        };
        if let Some(k) = data
            .keys()
            .find(|k| !matches!(k.as_str(), "template" | "placement" | "deadline" | "ttl"))
        {
            return Err(invalid(format!(
                "unknown key {k:?} (expected template, placement, deadline, ttl)"
            )));
        }
        let duration = |key: &str, default: Duration| -> Result<Duration, RemedyError> {
            match data.get(key) {
                None => Ok(default),
                Some(v) => humantime::parse_duration(v.trim())
                    .map_err(|e| invalid(format!("key {key}: {e}"))),
            }
        };
        let placement = match data.get("placement").map(|s| s.trim()) {
            None | Some("node") => RemedyPlacement::Node,
            Some("elsewhere") => RemedyPlacement::Elsewhere,
            Some(other) => {
                return Err(invalid(format!(
                    "key placement: {other:?} is neither node nor elsewhere"
                )));
            }
        };
        let r = RemedyConfig {
            template: data
                .get("template")
                .cloned()
                .ok_or_else(|| invalid("key template is missing".into()))?,
            placement,
            deadline: duration("deadline", default_deadline())?,
            ttl: duration("ttl", default_ttl())?,
        };
        r.check(name, &format!("ConfigMap {CONFIGMAP_PREFIX}{name}"))?;
        Ok(r)
    }

    /// The pod template, checked: it parses, has a container, and restarts never (one attempt
    /// per Job; escalation is the condition rule's).
    pub fn pod_template(&self) -> Result<PodTemplateSpec, RemedyProblem> {
        let t: PodTemplateSpec = serde_yaml_ng::from_str(&self.template)
            .map_err(|e| RemedyProblem::NotATemplate(e.to_string()))?;
        let spec = t.spec.as_ref().ok_or(RemedyProblem::NoSpec)?;
        if spec.containers.is_empty() {
            return Err(RemedyProblem::NoContainer);
        }
        if let Some(p) = spec.restart_policy.as_deref()
            && p != "Never"
        {
            return Err(RemedyProblem::Restarts(p.to_string()));
        }
        if self.deadline.is_zero() {
            return Err(RemedyProblem::NoDeadline);
        }
        Ok(t)
    }

    /// Checks the definition; the error names the remedy and where it is defined.
    pub fn check(&self, name: &str, place: &str) -> Result<(), RemedyError> {
        self.pod_template()
            .map(|_| ())
            .map_err(|problem| RemedyError::Invalid {
                name: name.into(),
                place: place.into(),
                problem,
            })
    }
}

/// A remedy Job's name: the event's id, so one event has one Job, whoever leads.
pub fn job_name(event: &uuid::Uuid) -> String {
    format!("maintd-remedy-{event}")
}

/// A label value, when `v` can be one (at most 63 characters of the allowed set).
fn label_value(v: &str) -> Option<String> {
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then(|| v.to_string())
}

/// The run for one remedy job.
pub fn remedy_run(
    job: &Job,
    remedy: &str,
    cfg: &RemedyConfig,
    event: &str,
) -> Result<PodRun, RemedyProblem> {
    let template = cfg.pod_template()?;
    let mut labels = BTreeMap::from([
        (EVENT_LABEL.to_string(), job.event.to_string()),
        (REMEDY_LABEL.to_string(), remedy.to_string()),
        (ROLE_LABEL.to_string(), "remedy".to_string()),
    ]);
    if let Some(n) = label_value(&job.node) {
        labels.insert(NODE_LABEL.into(), n);
    }
    let mut env = vec![
        ("MAINTD_NODE".to_string(), job.node.clone()),
        ("MAINTD_EVENT".to_string(), job.event.to_string()),
        ("MAINTD_REMEDY".to_string(), remedy.to_string()),
        ("MAINTD_REASON".to_string(), job.reason.clone()),
    ];
    let json = event.to_owned();
    if json.len() <= EVENT_JSON_MAX {
        env.push(("MAINTD_EVENT_JSON".into(), json));
    }
    Ok(PodRun {
        name: job_name(&job.event),
        labels,
        template: serde_json::to_value(template).map_err(|e| RemedyProblem::Json(e.to_string()))?,
        env,
        placement: match cfg.placement {
            RemedyPlacement::Node => Placement::On(job.node.clone()),
            RemedyPlacement::Elsewhere => Placement::AwayFrom(vec![job.node.clone()]),
        },
        files: BTreeMap::new(),
        deadline: cfg.deadline,
        ttl: cfg.ttl,
    })
}

impl KubeCluster {
    /// The remedy's definition: the TOML's, else its ConfigMap's (read when the job starts, so
    /// a changed ConfigMap applies to the next remedy).
    async fn remedy_config(&self, name: &str) -> Result<RemedyConfig, RemedyError> {
        if let Some(r) = self.cfg.remedies.get(name) {
            return Ok(r.clone());
        }
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.fence_namespace());
        let cm_name = format!("{CONFIGMAP_PREFIX}{name}");
        match maps.get_opt(&cm_name).await {
            Ok(Some(cm)) => RemedyConfig::from_configmap(name, &cm.data.unwrap_or_default()),
            Ok(None) => Err(RemedyError::Unknown { name: name.into() }),
            Err(e) => Err(RemedyError::Invalid {
                name: name.into(),
                place: format!("ConfigMap {cm_name}"),
                problem: RemedyProblem::Definition(format!("cannot be read: {e}")),
            }),
        }
    }

    /// Runs a remedy job: its Job's verdict is the job's outcome.
    pub(super) async fn run_remedy(&self, job: &Job, event: &str) -> Outcome {
        let Some(remedy) = job
            .command
            .as_deref()
            .and_then(maintd_core::verdict::remedy_of)
        else {
            return Outcome::failed("a remedy job without a remedy name");
        };
        let cfg = match self.remedy_config(remedy).await {
            Ok(c) => c,
            Err(e) => {
                if let RemedyError::Invalid { .. } = e {
                    self.record_on_configmap(
                        &format!("{CONFIGMAP_PREFIX}{remedy}"),
                        crate::cluster::EventReason::RemedyConfigRefused,
                        &e.to_string(),
                    )
                    .await;
                }
                return Outcome::failed(e.to_string());
            }
        };
        let run = match remedy_run(job, remedy, &cfg, event) {
            Ok(r) => r,
            Err(problem) => return Outcome::failed(format!("remedy {remedy:?}: {problem}")),
        };
        // Owned by its Node: a node removed from the cluster takes its remedy Jobs along.
        let nodes: Api<Node> = Api::all(self.client.clone());
        let owner = match nodes.get_opt(&job.node).await {
            Ok(Some(n)) => n.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: job.node.clone(),
                uid,
                ..Default::default()
            }),
            _ => None,
        };
        match self.run_pod_job(run, owner).await {
            Ok(o) => {
                let mut detail = format!("remedy {remedy}: {}", o.detail);
                if o.adopted {
                    detail.push_str(" (adopted after a restart)");
                }
                if let Some(m) = &o.message {
                    detail.push_str(&format!(": {}", m.trim()));
                }
                Outcome::of(o.succeeded, detail)
            }
            Err(e) => Outcome::failed(format!("remedy {remedy}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str =
        "spec:\n  containers:\n  - name: fix\n    image: img\n    command: [\"/bin/true\"]\n";

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_configmap_defines_a_remedy_and_each_problem_names_the_key() {
        let r = RemedyConfig::from_configmap(
            "fix",
            &map(&[
                ("template", TEMPLATE),
                ("placement", "elsewhere"),
                ("deadline", "90s"),
            ]),
        )
        .unwrap();
        assert_eq!(r.placement, RemedyPlacement::Elsewhere);
        assert_eq!(r.deadline, Duration::from_secs(90));
        assert_eq!(r.ttl, Duration::from_secs(3600));
        let e = |m: &[(&str, &str)]| {
            RemedyConfig::from_configmap("fix", &map(m))
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[]).contains("ConfigMap remedy-fix") && e(&[]).contains("template is missing"));
        assert!(e(&[("template", TEMPLATE), ("deadline", "soon")]).contains("key deadline"));
        assert!(e(&[("template", TEMPLATE), ("placement", "there")]).contains("key placement"));
        assert!(e(&[("template", TEMPLATE), ("image", "x")]).contains("unknown key \"image\""));
        assert!(e(&[("template", "spec: [")]).contains("not a pod template"));
        let always = format!("{TEMPLATE}  restartPolicy: Always\n");
        assert!(e(&[("template", &always)]).contains("restartPolicy is Always"));
    }

    #[test]
    fn a_remedy_job_is_named_after_its_event_and_carries_the_node_and_event() {
        let cfg = RemedyConfig::from_configmap("fix", &map(&[("template", TEMPLATE)])).unwrap();
        let event = uuid::Uuid::from_u128(42);
        let job = Job {
            id: 3,
            event,
            node: "node-1".into(),
            round: 1,
            kind: maintd_core::repair::JobKind::Remedy,
            command: Some("remedy:fix".into()),
            status: maintd_core::repair::JobStatus::Running,
            reason: "maintd:event:x".into(),
            detail: None,
            created: 0,
            finished: None,
        };
        let run = remedy_run(&job, "fix", &cfg, r#"{"status":"live-repair"}"#).unwrap();
        assert_eq!(run.name, job_name(&event));
        assert!(run.name.len() <= 63);
        assert_eq!(run.labels[EVENT_LABEL], event.to_string());
        assert_eq!(run.labels[NODE_LABEL], "node-1");
        assert_eq!(run.placement, Placement::On("node-1".into()));
        let env: BTreeMap<_, _> = run.env.iter().cloned().collect();
        assert_eq!(env["MAINTD_NODE"], "node-1");
        assert_eq!(env["MAINTD_EVENT"], event.to_string());
        assert!(env["MAINTD_EVENT_JSON"].contains("live-repair"));
        // A node name that cannot be a label value is still in the environment.
        let mut long = job.clone();
        long.node = "n".repeat(100);
        let run = remedy_run(&long, "fix", &cfg, "{}").unwrap();
        assert!(!run.labels.contains_key(NODE_LABEL));
    }
}
