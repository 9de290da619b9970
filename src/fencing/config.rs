//! Fencing configuration: agent templates, per-node methods and stages, cluster policy, and
//! secrets loaded from files. Validated once at start-up into a `FencePlan` per node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use super::plan::{ExecPolicy, Executor, FencePlan, Method, Stage};
use maintd_core::fencing::machine::Step;

/// A fencing section that cannot work; the text names the node, stage, method or file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FencingConfigError(pub String);

/// A node's peer set holds its watchers and the nodes it watches (about as many again), within
/// a collector's 64 peers.
const MAX_WATCHERS: usize = 16;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FencingConfig {
    /// Where fence agents are looked up (whitelist directory).
    pub agents_dir: PathBuf,
    /// How long a collector must stay silent before its node becomes a fencing candidate.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// The fast liveness probe's interval and per-request timeout.
    #[serde(with = "humantime_serde")]
    pub liveness_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub liveness_timeout: Duration,
    /// The probe waits for each collector as long as its measured round trips need (smoothed
    /// round trip + 4 x its variation, as TCP does), from `liveness-timeout` up to this.
    #[serde(with = "humantime_serde")]
    pub liveness_timeout_max: Duration,
    /// Probes unanswered in a row before a collector counts as silent (from the first miss):
    /// one answer lost on a lossy link is not silence, and each miss doubles the next probe's
    /// patience.
    pub liveness_misses: u32,
    /// No fence starts while more than this share of nodes is unreachable (a storm).
    pub storm_percent: u32,
    /// Fences that have not reached a verified power-off, at most, at once.
    pub max_in_flight: usize,
    /// Minimum time between two fence starts.
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
    /// A node is not fenced again within this time after its last flow ended.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// Final flows are kept this long (for the API, `kubectl get nodefences` and the cooldown),
    /// then deleted.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Global pause: no fence starts and no isolation or power step runs.
    pub paused: bool,
    /// How often a flow in error restarts from the beginning.
    pub max_restarts: u32,
    /// Readiness: every node's power-management `status` is checked at start-up and then once
    /// per interval (zero disables), each call within `check-timeout`, at most
    /// `check-concurrency` nodes at once.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub check_timeout: Duration,
    pub check_concurrency: usize,
    /// A silent collector alone starts no fence: the node's watchers must have lost it too
    ///. Off only for a cluster whose collectors cannot reach each other.
    pub second_opinion: bool,
    /// How many peers watch each node (all of them in a cluster of at most `watchers + 1`).
    pub watchers: usize,
    /// Added to a self-fencing node's proven reset time for clock rates and scheduling.
    #[serde(with = "humantime_serde")]
    pub self_fence_margin: Duration,
    /// Where kdump notifications (`fence_kdump_send` in a node's crash kernel, UDP) are heard,
    /// when any node is configured for kdump.
    pub kdump_listen: std::net::SocketAddr,
    /// A fenced node returns to service after this many healthy reports in a row, each from
    /// a diagnose started after its new boot.
    pub return_reports: u32,
    /// A fenced node not back in service this long after its power-on (or proven reset) fails
    /// its flow: tagged fencefailed, with an Event and an alert.
    #[serde(with = "humantime_serde")]
    pub return_deadline: Duration,
    /// Scheduled drills: one node every this long (the one drilled longest ago first), only
    /// while no flow or drill runs, fencing is not paused and there is no storm. Zero: off.
    #[serde(with = "humantime_serde")]
    pub drill_every: Duration,
    /// After a kdump notification, power-management waits this long for the dump to finish.
    #[serde(with = "humantime_serde")]
    pub kdump_timeout: Duration,
    /// A node with `kdump = true` is not powered off until this long after it went silent: a
    /// crash kernel takes a while to boot and send its notification, and a power-off before
    /// then would cut its dump off. A notification within it releases the node without a
    /// power-off; silence for all of it lets the power-off proceed.
    #[serde(with = "humantime_serde")]
    pub kdump_window: Duration,
    /// The image agent calls run in when a template says `executor = "job"` (Kubernetes): it
    /// must hold `/bin/sh`, coreutils' `timeout` and the agents under `agents-dir`, as Debian's
    /// `fence-agents` package installs them.
    pub agent_image: String,
    pub templates: BTreeMap<String, TemplateConfig>,
    pub nodes: BTreeMap<String, NodeFenceConfig>,
}

impl Default for FencingConfig {
    fn default() -> Self {
        FencingConfig {
            agents_dir: "/usr/sbin".into(),
            grace: Duration::from_secs(5),
            liveness_interval: Duration::from_secs(1),
            liveness_timeout: Duration::from_millis(800),
            liveness_timeout_max: Duration::from_millis(1500),
            liveness_misses: 2,
            storm_percent: 30,
            max_in_flight: 1,
            min_interval: Duration::ZERO,
            cooldown: Duration::from_secs(600),
            retention: Duration::from_secs(7 * 24 * 3600),
            paused: false,
            max_restarts: 1,
            check_interval: Duration::from_secs(600),
            check_timeout: Duration::from_secs(10),
            check_concurrency: 4,
            second_opinion: true,
            watchers: maintd_core::fencing::watchers::DEFAULT_WATCHERS,
            self_fence_margin: Duration::from_secs(5),
            kdump_listen: std::net::SocketAddr::from(([0, 0, 0, 0], 7410)),
            kdump_timeout: Duration::from_secs(600),
            kdump_window: Duration::from_secs(60),
            return_reports: 3,
            return_deadline: Duration::from_secs(900),
            drill_every: Duration::ZERO,
            agent_image: String::new(),
            templates: BTreeMap::new(),
            nodes: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TemplateConfig {
    /// A `fence_*` agent name in `agents-dir`.
    pub agent: String,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Parameters whose values are read from files (mode 0600 or stricter), e.g. passwords.
    #[serde(default)]
    pub secrets: BTreeMap<String, PathBuf>,
    /// `local` (default) or `job`: see `agent-image`.
    #[serde(default)]
    pub executor: Executor,
    /// In a power-management stage: `on` (the default) powers the node back on once its
    /// workloads were released; `off` leaves it off for a person.
    #[serde(default)]
    pub after_release: Option<AfterRelease>,
}

/// What a power-management method does once the workloads were released.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AfterRelease {
    /// Power on, verified by a status that reads ON; the node returns to service only on
    /// proof of its new boot.
    #[default]
    On,
    /// Leave it off: a person powers it on.
    Off,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeFenceConfig {
    pub isolation: Option<StageConfig>,
    pub power_management: Option<StageConfig>,
    pub recovery: Option<StageConfig>,
    /// The node's collector arms a watchdog: the last level, after power-management when it
    /// has one, and the only one when it has none.
    pub self_fence: bool,
    /// The node's crash kernel sends kdump notifications (fence_kdump_send): one heard after
    /// it went silent releases its workloads at once.
    pub kdump: bool,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StageConfig {
    #[serde(default)]
    pub policy: ExecPolicy,
    /// Hard deadline of one agent call; the agent's process group is killed at it.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Retries after a failed attempt, before the flow goes to error.
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default = "default_retry_interval", with = "humantime_serde")]
    pub retry_interval: Duration,
    /// Power-management only: overrides the templates' `after-release`.
    #[serde(default)]
    pub after_release: Option<AfterRelease>,
    pub methods: Vec<MethodConfig>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_retries() -> u32 {
    2
}
fn default_retry_interval() -> Duration {
    Duration::from_secs(1)
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MethodConfig {
    pub template: String,
    /// Defaults: off for isolation and power-management, on for recovery.
    pub action: Option<String>,
    /// Per-node values; they win over the template's.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub secrets: BTreeMap<String, PathBuf>,
}

fn read_secret(path: &std::path::Path) -> Result<String, FencingConfigError> {
    let shown = path.display();
    let text = crate::secret::read(path).map_err(|e| match e {
        crate::secret::SecretFileError::Permissions { mode } => FencingConfigError(format!(
            "secret file {shown} is accessible by group or others (mode {mode:o}); run chmod 600 {shown}"
        )),
        e => FencingConfigError(format!("secret file {shown}: {e}")),
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

/// Parameters that hold secrets: these come from `secrets` files, never inline.
fn is_secret(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    k.contains("passw") || k.contains("secret") || k.ends_with("_key")
}

/// Parameter names and values go one per line as `key=value` on the agent's stdin.
fn check_param(where_: &str, k: &str, v: &str) -> Result<(), FencingConfigError> {
    let key_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !key_ok {
        return Err(FencingConfigError(format!(
            "{where_}: parameter name {k:?} must be [A-Za-z0-9_]"
        )));
    }
    if v.contains(['\n', '\r']) {
        return Err(FencingConfigError(format!(
            "{where_}: parameter {k} contains a line break"
        )));
    }
    if k == "action" {
        return Err(FencingConfigError(format!(
            "{where_}: set the action with `action = ...` on the method, not as a parameter"
        )));
    }
    Ok(())
}

fn check_inline(where_: &str, k: &str) -> Result<(), FencingConfigError> {
    if is_secret(k) {
        return Err(FencingConfigError(format!(
            "{where_}: {k} must not be inline; put it in a file (mode 0600) and use secrets = {{ {k} = \"/path\" }}"
        )));
    }
    Ok(())
}

impl FencingConfig {
    /// Templates whose agents run as Jobs need an image, and (when `kube` is known) the
    /// Kubernetes backend; `backend` names the one in force.
    pub fn check_jobs(&self, kube: Option<bool>, backend: &str) -> Result<(), FencingConfigError> {
        for (name, t) in &self.templates {
            if t.executor != Executor::Job {
                continue;
            }
            let why = if self.agent_image.is_empty() {
                "needs fencing.agent-image (an image with the fence agents)".to_string()
            } else if kube == Some(false) {
                format!("runs agents as Kubernetes Jobs; the {backend} backend has none")
            } else {
                continue;
            };
            return Err(FencingConfigError(format!(
                "fencing.templates.{name}: executor = \"job\" {why}"
            )));
        }
        Ok(())
    }

    /// Validates everything and loads the secrets: one plan per fenced node, each a known node.
    pub fn plans(
        &self,
        known_nodes: &[String],
    ) -> Result<BTreeMap<String, FencePlan>, FencingConfigError> {
        self.check_members(known_nodes)?;
        self.load_plans()
    }

    /// Every fenced node is one of `known_nodes` (the membership, once it is known).
    pub fn check_members(&self, known_nodes: &[String]) -> Result<(), FencingConfigError> {
        match self.nodes.keys().find(|n| !known_nodes.contains(n)) {
            Some(node) => Err(FencingConfigError(format!(
                "fencing.nodes.{node}: no such node in [[nodes]]"
            ))),
            None => Ok(()),
        }
    }

    /// Validates everything but the membership and loads the secrets: one plan per fenced node.
    pub fn load_plans(&self) -> Result<BTreeMap<String, FencePlan>, FencingConfigError> {
        let bad = |m: String| Err(FencingConfigError(m));
        if self.storm_percent > 100 {
            return bad("fencing.storm-percent must be 0-100".into());
        }
        if self.max_in_flight == 0 {
            return bad("fencing.max-in-flight must be at least 1".into());
        }
        if self.liveness_interval.is_zero() || self.liveness_timeout.is_zero() {
            return bad(
                "fencing.liveness-interval and liveness-timeout must be greater than zero".into(),
            );
        }
        if !(1..=10).contains(&self.liveness_misses) {
            return bad("fencing.liveness-misses must be 1-10".into());
        }
        if self.liveness_timeout_max < self.liveness_timeout {
            return bad(format!(
                "fencing.liveness-timeout-max ({:?}) must be at least liveness-timeout ({:?})",
                self.liveness_timeout_max, self.liveness_timeout
            ));
        }
        if self.check_timeout.is_zero() || self.check_concurrency == 0 {
            return bad(
                "fencing.check-timeout must be greater than zero and check-concurrency at least 1"
                    .into(),
            );
        }
        if !(1..=100).contains(&self.return_reports) || self.return_deadline.is_zero() {
            return bad(
                "fencing.return-reports must be 1-100 and return-deadline greater than zero".into(),
            );
        }
        if !(1..=MAX_WATCHERS).contains(&self.watchers) {
            return bad(format!("fencing.watchers must be 1-{MAX_WATCHERS}"));
        }
        for (name, t) in &self.templates {
            let ok = t.agent.starts_with("fence_")
                && t.agent.len() > 6
                && t.agent
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return bad(format!(
                    "fencing.templates.{name}: agent {:?} must be a fence_* name",
                    t.agent
                ));
            }
            for (k, v) in &t.params {
                check_inline(&format!("fencing.templates.{name}"), k)?;
                check_param(&format!("fencing.templates.{name}"), k, v)?;
            }
        }
        let mut plans = BTreeMap::new();
        for (node, nc) in &self.nodes {
            let stage = |step: Step, sc: &StageConfig| -> Result<Stage, FencingConfigError> {
                let where_ = format!("fencing.nodes.{node}.{}", step.as_str());
                if sc.methods.is_empty() {
                    return Err(FencingConfigError(format!("{where_}: no methods")));
                }
                if sc.after_release.is_some() && step != Step::PowerManagement {
                    return Err(FencingConfigError(format!(
                        "{where_}: after-release belongs in power-management (what the power-off method does once the workloads were released)"
                    )));
                }
                if sc.timeout.is_zero() {
                    return Err(FencingConfigError(format!(
                        "{where_}: timeout must be greater than zero"
                    )));
                }
                let mut methods = Vec::new();
                for (i, m) in sc.methods.iter().enumerate() {
                    let t = self.templates.get(&m.template).ok_or_else(|| {
                        FencingConfigError(format!("{where_}: unknown template {:?}", m.template))
                    })?;
                    let action = m.action.clone().unwrap_or_else(|| {
                        if step == Step::Recovery { "on" } else { "off" }.to_string()
                    });
                    if step == Step::PowerManagement && action != "off" {
                        return Err(FencingConfigError(format!(
                            "{where_}: action must be \"off\" (a reboot never proves a node is off)"
                        )));
                    }
                    if !matches!(action.as_str(), "on" | "off") {
                        return Err(FencingConfigError(format!(
                            "{where_}: action {action:?} must be on or off"
                        )));
                    }
                    let mut params = t.params.clone();
                    for (k, v) in &m.params {
                        check_inline(&where_, k)?;
                        check_param(&where_, k, v)?;
                        params.insert(k.clone(), v.clone());
                    }
                    let mut secrets = Vec::new();
                    for (k, p) in t.secrets.iter().chain(&m.secrets) {
                        check_param(&where_, k, "")?;
                        let v = read_secret(p)?;
                        secrets.push(v.clone());
                        params.insert(k.clone(), v);
                    }
                    // An inline value secret by its name (an SNMP community, say) is redacted
                    // like one read from a file.
                    secrets.extend(
                        params
                            .iter()
                            .filter(|(k, _)| crate::fencing::redact::secret_by_name(k))
                            .map(|(_, v)| v.clone()),
                    );
                    let after = sc.after_release.or(t.after_release).unwrap_or_default();
                    methods.push(Method {
                        name: format!("{}#{i}", m.template),
                        agent: t.agent.clone(),
                        action,
                        params,
                        secrets,
                        required: true,
                        executor: t.executor,
                        power_on: step == Step::PowerManagement && after == AfterRelease::On,
                    });
                }
                Ok(Stage {
                    policy: sc.policy,
                    timeout: sc.timeout,
                    retries: sc.retries,
                    retry_interval: sc.retry_interval,
                    methods,
                })
            };
            if nc.power_management.is_none() && !nc.self_fence {
                return bad(format!(
                    "fencing.nodes.{node}: a power-management stage or self-fence = true is required (one of them is the proof of power-off)"
                ));
            }
            let mut power_management = nc
                .power_management
                .as_ref()
                .map(|s| stage(Step::PowerManagement, s))
                .transpose()?;
            let power_on = power_management
                .as_mut()
                .and_then(crate::fencing::plan::split_power_on);
            plans.insert(
                node.clone(),
                FencePlan {
                    isolation: nc
                        .isolation
                        .as_ref()
                        .map(|s| stage(Step::Isolation, s))
                        .transpose()?,
                    power_management,
                    power_on,
                    recovery: nc
                        .recovery
                        .as_ref()
                        .map(|s| stage(Step::Recovery, s))
                        .transpose()?,
                    self_fence: nc.self_fence,
                    kdump: nc.kdump,
                },
            );
        }
        Ok(plans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::os::unix::fs::PermissionsExt;

    fn secret(dir: &std::path::Path, mode: u32) -> PathBuf {
        let p = dir.join(format!("pw{mode:o}"));
        std::fs::write(&p, "s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn cfg(extra: &str) -> Config {
        Config::parse(&format!(
            r#"
[[nodes]]
name = "n1"
collector = "127.0.0.1:1"
[fencing.templates.ipmi]
agent = "fence_ipmilan"
params = {{ username = "admin", lanplus = "1", cipher = "3", ip = "10.0.0.1" }}
{extra}
"#
        ))
        .unwrap()
    }

    #[test]
    fn node_values_win_and_secrets_come_from_files() {
        let d = tempfile::tempdir().unwrap();
        let pw = secret(d.path(), 0o600);
        let c = cfg(&format!(
            r#"
[fencing.nodes.n1.power-management]
retries = 5
methods = [{{ template = "ipmi", params = {{ ip = "10.9.9.9", ipport = "623" }}, secrets = {{ password = "{}" }} }}]
[fencing.nodes.n1.recovery]
methods = [{{ template = "ipmi" }}]
"#,
            pw.display()
        ));
        let plans = c.fencing.plans(&["n1".into()]).unwrap();
        let pm = plans["n1"].power_management.as_ref().unwrap();
        assert_eq!(pm.retries, 5);
        let m = &pm.methods[0];
        assert_eq!(m.action, "off");
        assert_eq!(m.params["ip"], "10.9.9.9");
        assert_eq!(m.params["username"], "admin");
        assert_eq!(m.params["password"], "s3cret");
        assert_eq!(
            plans["n1"].recovery.as_ref().unwrap().methods[0].action,
            "on"
        );
        assert!(
            !format!("{m:?}").contains("s3cret"),
            "secrets never show in Debug output"
        );
    }

    /// An SNMP community given inline (as the configuration reference's switch example does) is redacted like a
    /// password from a file: from agent output, and so from the log and the API.
    #[test]
    fn inline_values_secret_by_name_are_redacted() {
        let c = cfg(r#"
[fencing.templates.switch]
agent = "fence_ifmib"
params = { ip = "10.0.0.2", community = "private-c0mm", snmp_version = "2c" }
[fencing.nodes.n1.power-management]
methods = [{ template = "switch", params = { plug = "12" } }]
"#);
        let plans = c.fencing.plans(&["n1".into()]).unwrap();
        assert!(plans["n1"].secrets().any(|s| s == "private-c0mm"));
        let r = crate::fencing::redact::Redactor::new(plans["n1"].secrets().cloned());
        let out = r.redact("snmpget -v2c -c private-c0mm 10.0.0.2 (community private-c0mm)");
        assert!(!out.contains("private-c0mm"), "{out}");
        assert!(
            !r.redact("10.0.0.2 plug 12").contains("redacted"),
            "only secrets go"
        );
    }

    #[test]
    fn validation_errors_name_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let open = secret(d.path(), 0o644);
        let err = |extra: &str| {
            cfg(extra)
                .fencing
                .plans(&["n1".into()])
                .unwrap_err()
                .to_string()
        };
        assert!(err(&format!(
            "[fencing.nodes.n1.power-management]\nmethods = [{{ template = \"ipmi\", secrets = {{ password = \"{}\" }} }}]",
            open.display()
        ))
        .contains("chmod 600"));
        assert!(err("[fencing.nodes.n1.power-management]\nmethods = [{ template = \"ipmi\", action = \"reboot\" }]").contains("never proves"));
        assert!(
            err("[fencing.nodes.n1.power-management]\nmethods = [{ template = \"nope\" }]")
                .contains("unknown template")
        );
        assert!(
            err("[fencing.nodes.n1.isolation]\nmethods = [{ template = \"ipmi\" }]")
                .contains("power-management stage or self-fence = true is required")
        );
        assert!(
            err("[fencing.nodes.n9.power-management]\nmethods = [{ template = \"ipmi\" }]")
                .contains("no such node")
        );
        assert!(err("[fencing.nodes.n1.power-management]\nmethods = [{ template = \"ipmi\", params = { action = \"on\" } }]").contains("`action = ...`"));
        assert!(err("[fencing.nodes.n1.power-management]\nmethods = [{ template = \"ipmi\", params = { ip = \"a\\nb\" } }]").contains("line break"));
        assert!(err("[fencing.nodes.n1.power-management]\nmethods = [{ template = \"ipmi\", params = { password = \"x\" } }]").contains("must not be inline"));
        let c = Config::parse("[fencing.templates.x]\nagent = \"rm\"\n").unwrap();
        assert!(
            c.fencing
                .plans(&[])
                .unwrap_err()
                .to_string()
                .contains("fence_*")
        );
    }
}
