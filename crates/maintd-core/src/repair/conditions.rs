//! Pure evaluation of node-condition rules (Kubernetes): which repair verdicts the conditions of
//! each node produce now, with escalation along a rule's ladder, and which nodes a rule hands to
//! the fencer. Escalation is a function of how long the condition has held, so no state is kept.

use std::collections::BTreeMap;

use serde_json::json;

use super::model::CONDITION_SOURCE;
use crate::verdict::Nanos;
use crate::verdict::{Status, Verdict};

#[derive(Debug, Clone, PartialEq)]
pub enum RuleAction {
    Repair(Status),
    /// A whitelisted live repair on the node's collector (`live-repair:restart-kubelet`): a
    /// living node is repaired before anything more invasive.
    LiveRepair(String),
    /// A remedy run as a Kubernetes Job from its pod template (`remedy:<name>`).
    Remedy(String),
    Fence,
}

impl RuleAction {
    pub fn parse(s: &str) -> Option<RuleAction> {
        if let Some(cmd) = s.strip_prefix("live-repair:") {
            let ok = !cmd.is_empty()
                && cmd.len() <= 64
                && cmd
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            return ok.then(|| RuleAction::LiveRepair(cmd.to_string()));
        }
        if let Some(name) = s.strip_prefix(crate::verdict::REMEDY_PREFIX) {
            return crate::verdict::valid_remedy_name(name)
                .then(|| RuleAction::Remedy(name.to_string()));
        }
        Some(match s {
            "fence" => RuleAction::Fence,
            "evacuate" => RuleAction::Repair(Status::Evacuate),
            "evacuate-failover" => RuleAction::Repair(Status::EvacuateFailover),
            _ => return None,
        })
    }
}

/// A node condition's status, as Kubernetes states it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::IntoStaticStr, strum::Display,
)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `(condition type, status) held for `after` -> steps[0]`; each further `escalate_after`
/// during which the condition still holds moves one step up the ladder.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub condition: String,
    pub status: ConditionStatus,
    pub after: Nanos,
    pub steps: Vec<RuleAction>,
    pub escalate_after: Nanos,
}

/// Why a condition rule from the configuration is refused; each names the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("a condition rule needs a condition type")]
    NoCondition,
    #[error("{rule}: status must be True, False or Unknown, not {status:?}")]
    Status { rule: String, status: String },
    #[error("{rule}: needs at least one action")]
    NoAction { rule: String },
    #[error(
        "{rule}: unknown action {action:?} (expected live-repair:<command>, remedy:<name>, evacuate, evacuate-failover or fence)"
    )]
    UnknownAction { rule: String, action: String },
    #[error("{rule}: fence can only be the last step (nothing escalates past a power-off)")]
    FenceNotLast { rule: String },
    #[error("{rule}: several actions need a non-zero escalate-after")]
    NoEscalation { rule: String },
}

impl Rule {
    /// Checks a rule from the configuration; the error names what is wrong.
    pub fn new(
        condition: &str,
        status: &str,
        after: Nanos,
        steps: &[String],
        escalate_after: Option<Nanos>,
    ) -> Result<Rule, RuleError> {
        let rule = format!("rule {condition}={status}");
        if condition.is_empty() {
            return Err(RuleError::NoCondition);
        }
        let Ok(status) = status.parse::<ConditionStatus>() else {
            return Err(RuleError::Status {
                rule,
                status: status.into(),
            });
        };
        if steps.is_empty() {
            return Err(RuleError::NoAction { rule });
        }
        let parsed = steps
            .iter()
            .map(|s| {
                RuleAction::parse(s).ok_or_else(|| RuleError::UnknownAction {
                    rule: rule.clone(),
                    action: s.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parsed[..parsed.len() - 1].contains(&RuleAction::Fence) {
            return Err(RuleError::FenceNotLast { rule });
        }
        let escalate_after = match (parsed.len(), escalate_after) {
            (1, e) => e.unwrap_or(0),
            (_, Some(e)) if e > 0 => e,
            _ => return Err(RuleError::NoEscalation { rule }),
        };
        Ok(Rule {
            condition: condition.into(),
            status,
            after,
            steps: parsed,
            escalate_after,
        })
    }
}

/// A node condition as the API reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCondition {
    pub kind: String,
    pub status: ConditionStatus,
    /// `lastTransitionTime`: since when the condition has had this status.
    pub since: Nanos,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    pub verdicts: BTreeMap<String, Vec<Verdict>>,
    /// Nodes a fence rule applies to, with the time their condition began and the rule.
    pub fence: BTreeMap<String, FenceRule>,
}

/// A fence rule that holds for a node.
#[derive(Debug, Clone, PartialEq)]
pub struct FenceRule {
    pub since: Nanos,
    /// The rule as an operator wrote it: `Ready=Unknown for 5s`.
    pub rule: String,
}

/// The verdict a rule's repair step stands for. `since` is part of its identity: a condition
/// that clears and comes back is a new event.
fn condition_verdict(
    status: Status,
    command: Option<(&str, &str)>,
    rule: usize,
    c: &NodeCondition,
    step: usize,
) -> Verdict {
    let mut v = json!({
        "status": status.to_string(),
        "details": {
            "source": CONDITION_SOURCE,
            "rule": rule,
            "condition": c.kind,
            "condition-status": c.status.as_str(),
            "since": c.since,
            "step": step,
        },
    });
    if let Some((key, value)) = command {
        v[key] = json!(value);
    }
    Verdict::from_value(v).expect("a built verdict is valid")
}

pub fn evaluate(
    rules: &[Rule],
    nodes: &BTreeMap<String, Vec<NodeCondition>>,
    now: Nanos,
) -> Evaluation {
    let mut out = Evaluation::default();
    for (node, conditions) in nodes {
        for (i, rule) in rules.iter().enumerate() {
            let Some(c) = conditions
                .iter()
                .find(|c| c.kind == rule.condition && c.status == rule.status)
            else {
                continue;
            };
            let held = now.saturating_sub(c.since);
            if held < rule.after {
                continue;
            }
            let step = if rule.escalate_after > 0 {
                ((held - rule.after) / rule.escalate_after) as usize
            } else {
                0
            }
            .min(rule.steps.len() - 1);
            match &rule.steps[step] {
                RuleAction::Fence => {
                    let rule = format!(
                        "{}={} for {}",
                        rule.condition,
                        rule.status,
                        humantime::format_duration(std::time::Duration::from_nanos(
                            rule.after.max(0) as u64
                        ))
                    );
                    let e = out.fence.entry(node.clone()).or_insert(FenceRule {
                        since: c.since,
                        rule,
                    });
                    e.since = e.since.min(c.since);
                }
                RuleAction::Repair(status) => {
                    let v = condition_verdict(*status, None, i, c, step);
                    out.verdicts.entry(node.clone()).or_default().push(v);
                }
                RuleAction::LiveRepair(cmd) => {
                    let v =
                        condition_verdict(Status::LiveRepair, Some(("command", cmd)), i, c, step);
                    out.verdicts.entry(node.clone()).or_default().push(v);
                }
                RuleAction::Remedy(name) => {
                    let v =
                        condition_verdict(Status::LiveRepair, Some(("remedy", name)), i, c, step);
                    out.verdicts.entry(node.clone()).or_default().push(v);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const NOW: Nanos = 1_700_000_000 * S;

    fn cond(kind: &str, status: &str, since: Nanos) -> BTreeMap<String, Vec<NodeCondition>> {
        BTreeMap::from([(
            "n1".to_string(),
            vec![NodeCondition {
                kind: kind.into(),
                status: status.parse().unwrap(),
                since,
            }],
        )])
    }

    /// The shipped rule for a node whose kubelet stopped: a live repair that restarts it
    /// first, and a fence only if Ready is still Unknown after the escalation.
    #[test]
    fn a_living_node_is_repaired_before_a_rule_fences_it() {
        let r = Rule::new(
            "Ready",
            "Unknown",
            5 * S,
            &["live-repair:restart-kubelet".into(), "fence".into()],
            Some(60 * S),
        )
        .unwrap();
        let nodes = cond("Ready", "Unknown", NOW - 10 * S);
        let e = evaluate(std::slice::from_ref(&r), &nodes, NOW);
        assert!(e.fence.is_empty(), "no fence before the escalation");
        let v = &e.verdicts["n1"][0];
        assert_eq!(v.status, Status::LiveRepair);
        assert_eq!(v.command.as_deref(), Some("restart-kubelet"));
        let later = evaluate(std::slice::from_ref(&r), &nodes, NOW + 60 * S);
        assert!(later.fence.contains_key("n1"));
        assert!(later.verdicts.is_empty());
        let r = Rule::new(
            "Ready",
            "False",
            0,
            &["remedy:restart-node".into(), "remedy:reprovision".into()],
            Some(60 * S),
        )
        .unwrap();
        let ev = evaluate(&[r], &cond("Ready", "False", NOW - 90 * S), NOW);
        let v = &ev.verdicts["n1"][0];
        assert_eq!(v.command.as_deref(), Some("remedy:reprovision"), "{v:?}");
        assert_eq!(v.original["remedy"], "reprovision");
        for bad in ["remedy:", "remedy:Bad", "remedy:a/b"] {
            let e = Rule::new("Ready", "False", 0, &[bad.into()], None).unwrap_err();
            assert!(e.to_string().contains("remedy:<name>"), "{e}");
        }
        for bad in ["live-repair:", "live-repair:rm -rf /", "live-repair:../x"] {
            let e = Rule::new(
                "Ready",
                "Unknown",
                0,
                &[bad.into(), "fence".into()],
                Some(S),
            );
            assert!(matches!(e, Err(RuleError::UnknownAction { .. })), "{bad}");
        }
    }

    fn disk() -> Rule {
        Rule::new(
            "DiskPressure",
            "True",
            10 * S,
            &[
                "evacuate".into(),
                "evacuate-failover".into(),
                "fence".into(),
            ],
            Some(60 * S),
        )
        .unwrap()
    }

    fn action(e: &Evaluation) -> Option<Status> {
        e.verdicts.get("n1").map(|v| v[0].status)
    }

    #[test]
    fn a_rule_fires_after_its_duration_and_escalates_while_the_condition_holds() {
        let rules = [disk()];
        let at = |held: i64| evaluate(&rules, &cond("DiskPressure", "True", NOW - held), NOW);
        assert_eq!(at(9 * S), Evaluation::default());
        assert_eq!(action(&at(10 * S)), Some(Status::Evacuate));
        assert_eq!(action(&at(69 * S)), Some(Status::Evacuate));
        assert_eq!(action(&at(70 * S)), Some(Status::EvacuateFailover));
        let top = at(130 * S);
        assert!(top.verdicts.is_empty());
        assert_eq!(top.fence.get("n1").map(|f| f.since), Some(NOW - 130 * S));
        assert_eq!(top.fence["n1"].rule, "DiskPressure=True for 10s");
        // Far past the ladder's end it stays at the last step.
        assert_eq!(at(10_000 * S).fence.len(), 1);
        // Another status of the same condition does not match.
        assert_eq!(
            evaluate(&rules, &cond("DiskPressure", "False", NOW - 100 * S), NOW),
            Evaluation::default()
        );
    }

    #[test]
    fn verdicts_are_condition_events_and_a_recurrence_is_a_new_identity() {
        let rules = [disk()];
        let a = evaluate(&rules, &cond("DiskPressure", "True", NOW - 20 * S), NOW);
        let b = evaluate(&rules, &cond("DiskPressure", "True", NOW - 30 * S), NOW);
        let (va, vb) = (&a.verdicts["n1"][0], &b.verdicts["n1"][0]);
        assert_eq!(va.original["details"]["source"], CONDITION_SOURCE);
        assert_ne!(va.canonical(), vb.canonical());
        // The same condition seen again later keeps its identity.
        let again = evaluate(&rules, &cond("DiskPressure", "True", NOW - 20 * S), NOW + S);
        assert_eq!(again.verdicts["n1"][0].canonical(), va.canonical());
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        let err = |c: &str, s: &str, steps: &[&str], esc: Option<Nanos>| {
            let steps: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
            Rule::new(c, s, 0, &steps, esc).unwrap_err().to_string()
        };
        assert!(err("Ready", "Maybe", &["fence"], None).contains("True, False or Unknown"));
        assert!(err("Ready", "Unknown", &["reboot"], None).contains("unknown action \"reboot\""));
        assert!(err("Ready", "Unknown", &["fence", "evacuate"], Some(S)).contains("last step"));
        assert!(err("Ready", "Unknown", &["evacuate", "fence"], None).contains("escalate-after"));
        assert!(err("Ready", "Unknown", &[], None).contains("at least one"));
    }
}
