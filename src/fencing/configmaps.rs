//! Fence configuration in ConfigMaps, as cluster operators write it: per node
//! `fence-config-<node>` (`config.properties`: `node_name`, `isolation`, `power_management`,
//! `recovery`, `kdump`; or stages: `fence_stage1`… and `recover_stage`), methods
//! `fence-method-<method>-<node>` (or `fence-method-<method>` for every node) with a `template=`
//! and overrides, templates `fence-method-template-<name>` (`agent_name` or `method_name`,
//! `must_success`, `executor` local or job, defaults), and stages `fence-stage-<name>` (`priority`, `execution_policy`
//! all or only one, `fence_method1`…); methods and templates may also be keys of the node's own
//! map (the single-map form). Pure: the ConfigMaps and the Secret values they refer to
//! in, one plan or one problem per node out. Secrets are never taken inline: a password,
//! community or key must be a `<param>_secret=<secret>/<key>` reference.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::fencing::config::{ExecPolicy, FencePlan, Stage};

mod method;
use method::Source;

pub const NODE_PREFIX: &str = "fence-config-";
pub const METHOD_PREFIX: &str = "fence-method-";
pub const TEMPLATE_PREFIX: &str = "fence-method-template-";
pub const STAGE_PREFIX: &str = "fence-stage-";
/// A parameter whose value comes from a Secret: `password_secret=ipmi/password`.
const SECRET_SUFFIX: &str = "_secret";

/// ConfigMaps by name: each one's data.
pub type Maps = BTreeMap<String, BTreeMap<String, String>>;

/// What is wrong with a node's fence configuration, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub configmap: String,
    pub key: String,
    pub problem: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConfigMap {} key {}: {}",
            self.configmap, self.key, self.problem
        )
    }
}

/// Every node configured by ConfigMaps: a plan, or the problem that leaves it unfenced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    pub plans: BTreeMap<String, FencePlan>,
    pub problems: BTreeMap<String, Problem>,
}

/// Whether a ConfigMap's name is part of the fence configuration.
pub fn is_fence_map(name: &str) -> bool {
    name.starts_with(NODE_PREFIX)
        || name.starts_with(METHOD_PREFIX)
        || name.starts_with(STAGE_PREFIX)
}

/// `key=value` lines (`#` and `!` comments, blank lines skipped), as Java properties.
fn properties(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=').or_else(|| l.split_once(':'))?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// A map's settings: its `<file>` properties if it has them, else its data keys; and the key
/// problems are reported under.
fn settings(data: &BTreeMap<String, String>, file: &str) -> (BTreeMap<String, String>, String) {
    match data.get(file) {
        Some(text) => (properties(text), file.to_string()),
        None => (data.clone(), "data".to_string()),
    }
}

/// Every `(secret, key)` the maps refer to, for the caller to read before `parse`.
pub fn secret_refs(maps: &Maps) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut sources = Vec::new();
    for (name, data) in maps {
        if name.starts_with(NODE_PREFIX) {
            // The single-map form: methods and templates as keys of the node's own map.
            sources.extend(
                data.iter()
                    .filter(|(k, _)| k.starts_with(METHOD_PREFIX))
                    .map(|(_, v)| properties(v)),
            );
        } else if name.starts_with(METHOD_PREFIX) {
            let file = if name.starts_with(TEMPLATE_PREFIX) {
                "template.properties"
            } else {
                "method.properties"
            };
            sources.push(settings(data, file).0);
        }
    }
    for props in sources {
        for (k, v) in props {
            if k.ends_with(SECRET_SUFFIX)
                && let Some((s, key)) = v.split_once('/')
            {
                out.insert((s.trim().to_string(), key.trim().to_string()));
            }
        }
    }
    out
}

/// What a stage is built with when the ConfigMaps do not say.
#[derive(Debug, Clone, Copy)]
pub struct StageDefaults {
    pub timeout: Duration,
    pub retries: u32,
    pub retry_interval: Duration,
}

impl Default for StageDefaults {
    fn default() -> Self {
        StageDefaults {
            timeout: Duration::from_secs(30),
            retries: 2,
            retry_interval: Duration::from_secs(1),
        }
    }
}

struct Ctx<'a> {
    maps: &'a Maps,
    secrets: &'a BTreeMap<(String, String), String>,
    defaults: StageDefaults,
}

fn problem(configmap: &str, key: &str, what: impl Into<String>) -> Problem {
    Problem {
        configmap: configmap.to_string(),
        key: key.to_string(),
        problem: what.into(),
    }
}

/// Parses every `fence-config-<node>` with the methods, templates and stages it names.
/// `secrets` holds the values of the Secret keys `secret_refs` listed (a missing one is a
/// problem of the node that needs it).
pub fn parse(
    maps: &Maps,
    secrets: &BTreeMap<(String, String), String>,
    defaults: StageDefaults,
) -> Parsed {
    let ctx = Ctx {
        maps,
        secrets,
        defaults,
    };
    let mut out = Parsed::default();
    for (name, data) in maps {
        let Some(suffix) = name.strip_prefix(NODE_PREFIX) else {
            continue;
        };
        let (props, key) = settings(data, "config.properties");
        let node = props
            .get("node_name")
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| suffix.to_string());
        match ctx.node(name, &key, &node, &props) {
            Ok(mut plan) => {
                plan.kdump = matches!(
                    props.get("kdump").map(String::as_str),
                    Some("yes" | "true" | "on")
                );
                out.plans.insert(node, plan);
            }
            Err(p) => {
                out.problems.insert(node, p);
            }
        }
    }
    out
}

impl Ctx<'_> {
    /// The first of `names` found: as a key of the node's ConfigMap `home` (the single-map
    /// form), else as a ConfigMap of its own.
    fn source(&self, home: &str, names: &[&str], file: &str) -> Option<Source> {
        for n in names {
            if let Some(text) = self.maps.get(home).and_then(|d| d.get(*n)) {
                return Some(Source {
                    configmap: home.to_string(),
                    key: n.to_string(),
                    props: properties(text),
                    name: n.to_string(),
                });
            }
        }
        for n in names {
            if let Some(data) = self.maps.get(*n) {
                let (props, key) = settings(data, file);
                return Some(Source {
                    configmap: n.to_string(),
                    key,
                    props,
                    name: n.to_string(),
                });
            }
        }
        None
    }

    /// The node a `fence-config-<node>` map configures (`node_name`, else its name's suffix).
    fn node_of(&self, home: &str) -> String {
        let suffix = home.strip_prefix(NODE_PREFIX).unwrap_or(home);
        self.maps
            .get(home)
            .map(|d| settings(d, "config.properties").0)
            .and_then(|p| p.get("node_name").filter(|n| !n.is_empty()).cloned())
            .unwrap_or_else(|| suffix.to_string())
    }

    fn node(
        &self,
        cm: &str,
        key: &str,
        node: &str,
        props: &BTreeMap<String, String>,
    ) -> Result<FencePlan, Problem> {
        let staged: Vec<(u32, &String)> = {
            let mut v: Vec<(u32, &String)> = props
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("fence_stage")?.parse().ok()?, v)))
                .collect();
            v.sort();
            v
        };
        let (isolation, mut power, recovery) = if staged.is_empty() {
            let list = |k: &str| -> Result<Option<Stage>, Problem> {
                match props
                    .get(k)
                    .map(|v| v.split_whitespace().collect::<Vec<_>>())
                {
                    None => Ok(None),
                    Some(names) if names.is_empty() => Ok(None),
                    Some(names) => self
                        .stage(cm, node, &names, ExecPolicy::All, k == "recovery")
                        .map(Some)
                        .map_err(|p| p.placed(|m| problem(cm, key, format!("{k}: {m}")))),
                }
            };
            (
                list("isolation")?,
                list("power_management")?,
                list("recovery")?,
            )
        } else {
            if staged.len() > 2 {
                return Err(problem(
                    cm,
                    key,
                    "at most two fence stages: the first isolates, the last powers off",
                ));
            }
            let mut stages = Vec::new();
            for (_, s) in &staged {
                stages.push(self.named_stage(cm, s, false)?);
            }
            let power = stages.pop();
            let recovery = props
                .get("recover_stage")
                .map(|s| self.named_stage(cm, s, true))
                .transpose()?;
            (stages.pop(), power, recovery)
        };
        // A power-management method that powers on (`eaton-off eaton-on`) runs after the
        // release, as the power-on: a power-off counts only as verified off, never as a reboot.
        let power_on = power
            .as_mut()
            .and_then(crate::fencing::plan::split_power_on);
        let power = power.filter(|p| !p.methods.is_empty());
        if power.is_none() {
            return Err(problem(
                cm,
                key,
                "no power_management method that powers off: the verified power-off is the only proof a node is off",
            ));
        }
        Ok(FencePlan {
            isolation,
            power_management: power,
            power_on,
            recovery,
            self_fence: false,
            kdump: false,
        })
    }

    /// `fence-stage-<name>`: its policy and its methods, in `fence_method<N>` order.
    fn named_stage(&self, home: &str, name: &str, recovery: bool) -> Result<Stage, Problem> {
        let cm = format!("{STAGE_PREFIX}{name}");
        let node = self.node_of(home);
        let data = self.maps.get(&cm).ok_or_else(|| {
            problem(
                home,
                "fence_stage",
                format!("stage {name:?} has no ConfigMap {cm}"),
            )
        })?;
        let (props, key) = settings(data, "stage.properties");
        let policy = match props
            .get("execution_policy")
            .map(|s| s.trim().to_ascii_lowercase())
        {
            None => ExecPolicy::All,
            Some(p) if p == "all" => ExecPolicy::All,
            Some(p) if p == "only one" || p == "only_one" || p == "any" => ExecPolicy::Any,
            Some(p) => {
                return Err(problem(
                    &cm,
                    &key,
                    format!("execution_policy {p:?} is neither all nor only one"),
                ));
            }
        };
        let mut methods: Vec<(u32, &String)> = props
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("fence_method")?.parse().ok()?, v)))
            .collect();
        methods.sort();
        let names: Vec<&str> = methods.iter().map(|(_, v)| v.as_str()).collect();
        self.stage(home, &node, &names, policy, recovery)
            .map_err(|p| p.placed(|m| problem(&cm, &key, m)))
    }

    /// A stage of the named methods.
    fn stage(
        &self,
        home: &str,
        node: &str,
        names: &[&str],
        policy: ExecPolicy,
        recovery: bool,
    ) -> Result<Stage, StageProblem> {
        if names.is_empty() {
            return Err(StageProblem::List("no methods".into()));
        }
        let mut methods = Vec::new();
        for (i, m) in names.iter().enumerate() {
            let specific = format!("{METHOD_PREFIX}{m}-{node}");
            let shared = format!("{METHOD_PREFIX}{m}");
            let src = self
                .source(home, &[&specific, &shared], "method.properties")
                .ok_or_else(|| {
                    StageProblem::List(format!(
                        "method {m:?} has no key {shared} in {home}, and no ConfigMap {specific} (or {shared})"
                    ))
                })?;
            methods.push(
                self.method(home, src, i, recovery)
                    .map_err(StageProblem::Placed)?,
            );
        }
        Ok(Stage {
            policy,
            timeout: self.defaults.timeout,
            retries: self.defaults.retries,
            retry_interval: self.defaults.retry_interval,
            methods,
        })
    }
}

/// Why a stage cannot be built: a problem of its list of method names, for the caller to place
/// (it knows the key the list is in), or one already placed inside a method's or template's map.
enum StageProblem {
    List(String),
    Placed(Problem),
}

impl StageProblem {
    fn placed(self, place: impl FnOnce(String) -> Problem) -> Problem {
        match self {
            StageProblem::List(m) => place(m),
            StageProblem::Placed(p) => p,
        }
    }
}

#[cfg(test)]
mod tests;
