//! A fence flow's timeline (`/1/fences/{id}/timeline`, `maintd fences show`): every observation,
//! witness, decision and effect with its time, in order, so an incident review needs no log.

use serde::{Deserialize, Serialize};

use maintd_core::fencing::machine::{Flow, Step};
use maintd_core::verdict::Nanos;

/// What a timeline entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// What the master saw: the silence, a kdump notification, a new boot.
    Observation,
    /// What declared the node dead: a watcher's signed view, a Lease, a rule, an operator.
    Witness,
    /// A transition of the flow, with its note.
    Decision,
    /// An agent call, a release, a return to service.
    Effect,
    /// An operator's command about the flow, with who sent it and how it was answered.
    Command,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Entry {
    pub at: Nanos,
    pub kind: EntryKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    pub what: String,
}

fn entry(at: Nanos, kind: EntryKind, step: Option<Step>, what: String) -> Entry {
    Entry {
        at,
        kind,
        step,
        what,
    }
}

/// The flow's timeline, oldest first (entries at the same moment keep the order they were
/// recorded in).
pub fn of(f: &Flow) -> Vec<Entry> {
    use EntryKind::*;
    let w = &f.witnesses;
    let mut out = Vec::new();
    if w.collector {
        out.push(entry(
            f.detected,
            Observation,
            None,
            "the collector stopped answering the liveness probe".into(),
        ));
    }
    if let Some(rule) = &w.condition {
        out.push(entry(
            f.detected,
            Witness,
            None,
            format!("the fence rule {rule} holds"),
        ));
    }
    for p in &w.peers {
        let heard = p.last_heard.map_or("never heard".to_string(), |t| {
            format!("last heard {:.1} s before", (p.view_at - t) as f64 / 1e9)
        });
        out.push(entry(
            p.view_at,
            Witness,
            None,
            format!("{} has lost the node ({heard})", p.watcher),
        ));
    }
    if let Some(by) = &w.manual {
        out.push(entry(
            f.created,
            Witness,
            None,
            format!("requested by an operator ({by})"),
        ));
    }
    if !w.alive.is_empty() {
        out.push(entry(
            f.created,
            Observation,
            None,
            format!("still heard by {}", w.alive.join(", ")),
        ));
    }
    if let Some(t) = f.kdump_at {
        out.push(entry(
            t,
            Observation,
            None,
            "kdump notification: the node runs its crash kernel".into(),
        ));
    }
    for t in &f.history {
        out.push(entry(
            t.at,
            Decision,
            Some(t.step),
            format!("{} {}: {}", t.step.as_str(), t.status.as_str(), t.note),
        ));
    }
    for c in &f.calls {
        let code = maintd_core::fencing::machine::ended(c.code, &c.output);
        let host = c
            .host
            .as_deref()
            .map(|h| format!(" on {h}"))
            .unwrap_or_default();
        out.push(entry(
            c.at,
            Effect,
            Some(c.step),
            format!(
                "{} {} ({}): {code} in {} ms{host}",
                c.agent, c.action, c.method, c.elapsed_ms
            ),
        ));
    }
    let boot = |b: Option<uuid::Uuid>| b.map_or("unknown".to_string(), |u| u.to_string());
    if let Some(t) = f.fenced_at {
        out.push(entry(
            t,
            Effect,
            None,
            format!("power-off verified (boot before: {})", boot(f.boot_before)),
        ));
    }
    if let Some(t) = f.released_at {
        out.push(entry(t, Effect, None, "workloads released".into()));
    }
    if let Some(t) = f.powered_on_at {
        out.push(entry(
            t,
            Effect,
            Some(Step::PowerOn),
            "power-on verified".into(),
        ));
    }
    if let Some(t) = f.returned_at {
        out.push(entry(
            t,
            Effect,
            Some(Step::Recovery),
            format!("returned to service on boot {}", boot(f.returned_boot)),
        ));
    }
    out.sort_by_key(|e| e.at);
    out
}

/// The flow's timeline with the operator commands sent about it, each at its moment.
pub fn with_commands(f: &Flow, commands: &[crate::store::Command]) -> Vec<Entry> {
    let mut out = of(f);
    for c in commands {
        let answer = c
            .status
            .map(|s| format!("answered {s}"))
            .unwrap_or_else(|| "not answered".into());
        out.push(entry(
            c.at,
            EntryKind::Command,
            None,
            format!(
                "{} {} by operator {} ({answer})",
                c.method, c.path, c.operator
            ),
        ));
    }
    // Stable: entries at the same moment keep the order they were recorded in.
    out.sort_by_key(|e| e.at);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use maintd_core::fencing::machine::{Call, Witnesses};

    #[test]
    fn every_witness_decision_and_call_is_on_the_timeline_in_order() {
        let w = Witnesses {
            collector: true,
            peers: vec![maintd_core::fencing::opinion::PeerWitness {
                watcher: "n2".into(),
                view_at: 15,
                last_heard: Some(5),
            }],
            ..Witnesses::default()
        };
        let mut f = Flow::new("n1", 10, 20, Step::PowerManagement, w, "silent");
        f.calls.push(Call {
            at: 30,
            step: Step::PowerManagement,
            method: "ipmi#0".into(),
            agent: "fence_ipmilan".into(),
            action: "off".into(),
            code: Some(0),
            ok: true,
            elapsed_ms: 120,
            output: String::new(),
            host: None,
            pending: false,
        });
        f.fenced_at = Some(40);
        f.boot_before = Some(uuid::Uuid::from_u128(1));
        let t = of(&f);
        let whats: Vec<(Nanos, EntryKind)> = t.iter().map(|e| (e.at, e.kind)).collect();
        assert_eq!(
            whats,
            [
                (10, EntryKind::Observation),
                (15, EntryKind::Witness),
                (20, EntryKind::Decision),
                (30, EntryKind::Effect),
                (40, EntryKind::Effect)
            ]
        );
        assert!(t[1].what.contains("n2 has lost the node"), "{t:?}");
        assert!(t[3].what.contains("fence_ipmilan off") && t[3].what.contains("exit 0"));
        assert!(t[4].what.contains("00000000-0000-0000-0000-000000000001"));
    }
}
