//! One fence method of the ConfigMap configuration: its template's agent and defaults, its own
//! overrides, and its secrets resolved from the Secret values read beforehand.

use std::collections::BTreeMap;

use super::{Ctx, METHOD_PREFIX, Problem, SECRET_SUFFIX, TEMPLATE_PREFIX, problem};
use crate::fencing::config::Method;
use crate::fencing::redact::secret_by_name;

/// Where a method's or a template's settings are: a key of the node's own ConfigMap, or a
/// ConfigMap of its own (its `<file>` properties, or its data keys).
pub(super) struct Source {
    pub(super) configmap: String,
    pub(super) key: String,
    pub(super) props: BTreeMap<String, String>,
    /// The method's or template's name (`fence-method-…`).
    pub(super) name: String,
}

impl Ctx<'_> {
    /// One method: its template's agent and defaults, its own overrides, secrets resolved.
    pub(super) fn method(
        &self,
        home: &str,
        src: Source,
        i: usize,
        recovery: bool,
    ) -> Result<Method, Problem> {
        let Source {
            configmap,
            key,
            props,
            name,
        } = src;
        let cm = configmap.as_str();
        let template = props
            .get("template")
            .ok_or_else(|| problem(cm, &key, "no template="))?;
        let tname = if template.starts_with(TEMPLATE_PREFIX) {
            template.clone()
        } else {
            format!("{TEMPLATE_PREFIX}{template}")
        };
        let t = self
            .source(home, &[&tname], "template.properties")
            .ok_or_else(|| {
                problem(
                    cm,
                    &key,
                    format!("template {template:?} has no key {tname} in {home}, and no ConfigMap {tname}"),
                )
            })?;
        let (tprops, tkey, tname) = (t.props, t.key, t.configmap);
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
            None | Some("local") => crate::fencing::config::Executor::Local,
            Some("job") => crate::fencing::config::Executor::Job,
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
            name: format!("{}#{i}", name.trim_start_matches(METHOD_PREFIX)),
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
