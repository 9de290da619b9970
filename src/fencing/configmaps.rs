//! Fence configuration in ConfigMaps, as cluster operators write it: per node
//! `fence-config-<node>` (`config.properties`: `node_name`, `isolation`, `power_management`,
//! `recovery`, `kdump`; or stages: `fence_stage1`… and `recover_stage`), methods
//! `fence-method-<method>-<node>` (or `fence-method-<method>` for every node) with a `template=`
//! and overrides, templates `fence-method-template-<name>` (`agent_name` or `method_name`,
//! `must_success`, `executor` local or job, defaults), and stages `fence-stage-<name>` (`priority`, `execution_policy`
//! all or only one, `fence_method1`…). Pure: the ConfigMaps and the Secret values they refer to
//! in, one plan or one problem per node out. Secrets are never taken inline: a password,
//! community or key must be a `<param>_secret=<secret>/<key>` reference.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::fencing::config::{ExecPolicy, FencePlan, Method, Stage};
use crate::fencing::redact::secret_by_name;

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
    for (name, data) in maps {
        if !name.starts_with(METHOD_PREFIX) {
            continue;
        }
        let file = if name.starts_with(TEMPLATE_PREFIX) {
            "template.properties"
        } else {
            "method.properties"
        };
        for (k, v) in settings(data, file).0 {
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
                        .stage(node, &names, ExecPolicy::All, k == "recovery")
                        .map(Some)
                        .map_err(|p| p.unwrap_or_else(|m| problem(cm, key, format!("{k}: {m}")))),
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
                stages.push(self.named_stage(node, s, false)?);
            }
            let power = stages.pop();
            let recovery = props
                .get("recover_stage")
                .map(|s| self.named_stage(node, s, true))
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
    fn named_stage(&self, node: &str, name: &str, recovery: bool) -> Result<Stage, Problem> {
        let cm = format!("{STAGE_PREFIX}{name}");
        let data = self.maps.get(&cm).ok_or_else(|| {
            problem(
                &format!("{NODE_PREFIX}{node}"),
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
        self.stage(node, &names, policy, recovery)
            .map_err(|p| p.unwrap_or_else(|m| problem(&cm, &key, m)))
    }

    /// A stage of the named methods. `Err(Err(m))`: a problem of the list itself, for the caller
    /// to place; `Err(Ok(p))`: a problem inside a method's or template's map.
    fn stage(
        &self,
        node: &str,
        names: &[&str],
        policy: ExecPolicy,
        recovery: bool,
    ) -> Result<Stage, Result<Problem, String>> {
        if names.is_empty() {
            return Err(Err("no methods".into()));
        }
        let mut methods = Vec::new();
        for (i, m) in names.iter().enumerate() {
            let specific = format!("{METHOD_PREFIX}{m}-{node}");
            let shared = format!("{METHOD_PREFIX}{m}");
            let cm = if self.maps.contains_key(&specific) {
                specific
            } else if self.maps.contains_key(&shared) {
                shared
            } else {
                return Err(Err(format!(
                    "method {m:?} has no ConfigMap {specific} (or {shared})"
                )));
            };
            methods.push(self.method(&cm, i, recovery).map_err(Ok)?);
        }
        Ok(Stage {
            policy,
            timeout: self.defaults.timeout,
            retries: self.defaults.retries,
            retry_interval: self.defaults.retry_interval,
            methods,
        })
    }

    /// One method: its template's agent and defaults, its own overrides, secrets resolved.
    fn method(&self, cm: &str, i: usize, recovery: bool) -> Result<Method, Problem> {
        let (props, key) = settings(&self.maps[cm], "method.properties");
        let template = props
            .get("template")
            .ok_or_else(|| problem(cm, &key, "no template="))?;
        let tname = if template.starts_with(TEMPLATE_PREFIX) {
            template.clone()
        } else {
            format!("{TEMPLATE_PREFIX}{template}")
        };
        let tdata = self.maps.get(&tname).ok_or_else(|| {
            problem(
                cm,
                &key,
                format!("template {template:?} has no ConfigMap {tname}"),
            )
        })?;
        let (tprops, tkey) = settings(tdata, "template.properties");
        let agent = tprops
            .get("agent_name")
            .or_else(|| tprops.get("method_name"))
            .cloned()
            .ok_or_else(|| problem(&tname, &tkey, "no agent_name (the fence_* agent to run)"))?;
        let valid = agent.starts_with("fence_")
            && agent.len() > 6
            && agent
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(problem(
                &tname,
                &tkey,
                format!("agent {agent:?} must be a fence_* name"),
            ));
        }
        let required = !matches!(
            tprops
                .get("must_success")
                .or_else(|| tprops.get("must_sucess"))
                .map(|s| s.to_ascii_lowercase())
                .as_deref(),
            Some("no" | "false")
        );
        let power_on = match tprops.get("after_release").map(|s| s.trim()) {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return Err(problem(
                    &tname,
                    &tkey,
                    format!("after_release {other:?} must be on or off"),
                ));
            }
        };
        let executor = match tprops.get("executor").map(|s| s.trim()) {
            None | Some("local") => super::config::Executor::Local,
            Some("job") => super::config::Executor::Job,
            Some(other) => {
                return Err(problem(
                    &tname,
                    &tkey,
                    format!("executor {other:?} must be local or job"),
                ));
            }
        };
        let mut params = BTreeMap::new();
        let mut secrets = Vec::new();
        let reserved = [
            "executor",
            "after_release",
            "name",
            "agent_name",
            "method_name",
            "must_success",
            "must_sucess",
            "template",
            "action",
        ];
        for (src, src_key, p) in [(&tname, &tkey, &tprops), (&cm.to_string(), &key, &props)] {
            for (k, v) in p.iter().filter(|(k, _)| !reserved.contains(&k.as_str())) {
                let (name, value) = match k.strip_suffix(SECRET_SUFFIX) {
                    Some(base) => {
                        let (s, sk) = v.split_once('/').ok_or_else(|| {
                            problem(
                                src,
                                src_key,
                                format!("{k} must be <secret>/<key>, not {v:?}"),
                            )
                        })?;
                        let value = self
                            .secrets
                            .get(&(s.trim().to_string(), sk.trim().to_string()))
                            .cloned()
                            .ok_or_else(|| {
                                problem(src, src_key, format!("{k}: Secret {s} has no key {sk} (or maintd may not read it)"))
                            })?;
                        secrets.push(value.clone());
                        (base.to_string(), value)
                    }
                    None if secret_by_name(k) => {
                        return Err(problem(
                            src,
                            src_key,
                            format!(
                                "{k} is given inline, where anyone who reads ConfigMaps sees it: put it in a Secret and write {k}{SECRET_SUFFIX}=<secret>/<key>"
                            ),
                        ));
                    }
                    None => (k.clone(), v.clone()),
                };
                // fence-agents read stdin options with underscores (`snmp-priv-prot` is
                // `snmp_priv_prot` there).
                let name = name.replace('-', "_");
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    return Err(problem(
                        src,
                        src_key,
                        format!("parameter name {k:?} must be [A-Za-z0-9_-]"),
                    ));
                }
                if value.contains('\n') {
                    return Err(problem(src, src_key, format!("{k}: a value is one line")));
                }
                params.insert(name, value);
            }
        }
        let action = props
            .get("action")
            .cloned()
            .unwrap_or_else(|| if recovery { "on" } else { "off" }.to_string());
        if !matches!(action.as_str(), "on" | "off") {
            return Err(problem(
                cm,
                &key,
                format!("action {action:?} must be on or off"),
            ));
        }
        Ok(Method {
            name: format!("{}#{i}", cm.trim_start_matches(METHOD_PREFIX)),
            agent,
            action,
            params,
            secrets,
            required,
            executor,
            power_on: power_on && !recovery,
        })
    }
}

#[cfg(test)]
mod tests;
