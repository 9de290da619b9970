//! Starting flows: the gates every new flow passes (storm, pause, in-flight cap, interval,
//! cooldown), operators' requests through them, and silent nodes' candidates after the grace.

use super::{
    Effect, FenceAction, FencePolicy, FenceState, FenceStatus, Flow, PeerOpinion, PeerWitness,
    Record, Witnesses,
};
use crate::verdict::Nanos;

/// The limits on starting flows, counted as flows start within one decision.
pub(super) struct Gates {
    pub(super) in_flight: usize,
    pub(super) last_start: Option<Nanos>,
}

impl Gates {
    /// Why no flow may start now, if so.
    fn closed(&self, p: &FencePolicy, now: Nanos) -> Option<String> {
        if self.in_flight >= p.max_in_flight {
            return Some(format!(
                "{} fence flows in flight (max-in-flight {})",
                self.in_flight, p.max_in_flight
            ));
        }
        match self.last_start {
            Some(t) if now.saturating_sub(t) < p.min_interval => Some(format!(
                "the last fence started {:.1} s ago (min-interval {:.1} s)",
                now.saturating_sub(t) as f64 / 1e9,
                p.min_interval as f64 / 1e9
            )),
            _ => None,
        }
    }

    /// Records `f` as started, first step running at once rather than a tick later; except a
    /// kdump node's power-off, which waits for its kdump window (`kdump::window_open`).
    fn start(&mut self, mut f: Flow, s: &FenceState, now: Nanos, out: &mut Vec<FenceAction>) {
        let step = f.step;
        let kdump = s.plans.get(&f.node).is_some_and(|p| p.kdump);
        if !(kdump && step == super::Step::PowerManagement) {
            f.go(now, step, FenceStatus::Running, "attempt 1");
            out.push(FenceAction::Effect(Effect::run_step(&f)));
        }
        out.push(FenceAction::Record(Record::Start(f)));
        self.in_flight += 1;
        self.last_start = Some(now);
    }
}

/// What keeps `node` from a new flow now: a flow on it, or one ended within the cooldown.
fn node_busy(s: &FenceState, node: &str, now: Nanos) -> Option<String> {
    let mine = s.flows.iter().filter(|f| f.node == node);
    for f in mine {
        if f.status != FenceStatus::Final {
            return Some(format!(
                "fence flow {} already runs on {node}",
                crate::tags::reference(&f.id)
            ));
        }
        if f.updated + s.policy.cooldown > now {
            return Some(format!(
                "{node} was fenced {:.0} s ago (cooldown {:.0} s)",
                now.saturating_sub(f.updated) as f64 / 1e9,
                s.policy.cooldown as f64 / 1e9
            ));
        }
    }
    None
}

/// Operators' requests, oldest first, through the same gates as automatic flows (storm, pause,
/// in-flight cap, interval, cooldown); a request that can never run is refused for good.
pub(super) fn requested_flows(
    s: &FenceState,
    held: Option<String>,
    gates: &mut Gates,
    now: Nanos,
    out: &mut Vec<FenceAction>,
) {
    for r in &s.requests {
        let refuse = match s.plans.get(&r.node) {
            None => Some(format!("{} has no fence configuration", r.node)),
            Some(p) if p.power_management.is_none() => Some(format!(
                "{} only fences itself by watchdog, which an operator cannot trigger on a live node; it needs a power-management stage",
                r.node
            )),
            Some(_) => s
                .flows
                .iter()
                .find(|f| f.node == r.node && f.status != FenceStatus::Final)
                .map(|f| {
                    format!(
                        "fence flow {} already runs on {}",
                        crate::tags::reference(&f.id),
                        r.node
                    )
                }),
        };
        if let Some(why) = refuse {
            out.push(FenceAction::Record(Record::Hold {
                request: r.id,
                why,
                refused: true,
            }));
            continue;
        }
        let wait = held
            .clone()
            .or_else(|| super::in_maintenance(s, &r.node).map(|m| format!("in maintenance: {m}")))
            .or_else(|| node_busy(s, &r.node, now))
            .or_else(|| gates.closed(&s.policy, now));
        if let Some(why) = wait {
            if r.held.as_deref() != Some(why.as_str()) {
                out.push(FenceAction::Record(Record::Hold {
                    request: r.id,
                    why,
                    refused: false,
                }));
            }
            continue;
        }
        let plan = &s.plans[&r.node];
        let witnesses = Witnesses {
            manual: Some(r.by.clone()),
            ..Witnesses::default()
        };
        let mut f = Flow::new(
            &r.node,
            now,
            now,
            plan.first_step(),
            witnesses,
            format!("requested by an operator ({})", r.by),
        );
        f.id = r.id;
        f.boot_before = s.liveness.get(&r.node).and_then(|l| l.boot).map(|b| b.id);
        gates.start(f, s, now, out);
    }
}

pub(super) fn start_flows(
    s: &FenceState,
    gates: &mut Gates,
    now: Nanos,
    out: &mut Vec<FenceAction>,
) {
    let p = &s.policy;
    let mut candidates: Vec<(&String, Nanos)> = s
        .liveness
        .iter()
        .filter(|(n, l)| !l.reachable && s.plans.contains_key(*n))
        // The grace is the floor; a silent collector's detector may stretch it (a node-condition
        // rule decides on its own, whatever the probe says).
        .filter(|(_, l)| l.condition_fence || l.suspected_at.is_none_or(|at| now >= at))
        .filter_map(|(n, l)| l.unreachable_since.map(|t| (n, t)))
        .filter(|(_, since)| now.saturating_sub(*since) >= p.grace)
        .collect();
    candidates.sort_by_key(|(n, since)| (*since, (*n).clone()));
    for (node, since) in candidates {
        // A flow started for a request in this decision counts too.
        let started = out
            .iter()
            .any(|a| matches!(a, FenceAction::Record(Record::Start(f)) if &f.node == node));
        if started || node_busy(s, node, now).is_some() || super::in_maintenance(s, node).is_some()
        {
            continue;
        }
        if gates.closed(p, now).is_some() {
            break;
        }
        let l = s.liveness.get(node).copied().unwrap_or_default();
        let rule = s.rules.get(node).filter(|_| l.condition_fence).cloned();
        // An operator's node-condition rule decides on its own; a silent collector needs its
        // watchers' agreement.
        let opinion = s.opinions.get(node).cloned().unwrap_or_default();
        let agreed = match (&rule, &opinion) {
            (Some(_), _) => Vec::new(),
            (None, PeerOpinion::Lost { agreed }) => agreed.clone(),
            (None, _) if p.second_opinion => continue,
            (None, _) => Vec::new(),
        };
        let plan = &s.plans[node];
        let step = plan.first_step();
        let why = match &rule {
            Some(r) => format!(
                "node condition rule {r} holds for {:.1} s (grace {:.1} s){}",
                now.saturating_sub(since) as f64 / 1e9,
                p.grace as f64 / 1e9,
                if l.probe_silent {
                    "; the collector is silent too"
                } else {
                    "; the collector still answers"
                }
            ),
            None => format!(
                "collector silent for {:.1} s (grace {:.1} s{}){}",
                now.saturating_sub(since) as f64 / 1e9,
                p.grace as f64 / 1e9,
                stretched(since, l.suspected_at, p.grace),
                agreement(&agreed)
            ),
        };
        // Under a rule, who still heard the node goes on record.
        let mut alive = Vec::new();
        if rule.is_some() {
            if !l.probe_silent {
                alive.push("collector".to_string());
            }
            if let PeerOpinion::Partitioned { hearers } = &opinion {
                alive.extend(hearers.iter().cloned());
            }
        }
        let witnesses = Witnesses {
            collector: l.probe_silent,
            condition: rule,
            peers: agreed,
            manual: None,
            alive,
        };
        let mut f = Flow::new(node, since, now, step, witnesses, why);
        f.boot_before = s.liveness.get(node).and_then(|l| l.boot).map(|b| b.id);
        gates.start(f, s, now, out);
    }
}

/// `; lost by its watchers n2 (last heard 4.1 s before), n3 (never heard)`, for the flow's note.
fn agreement(agreed: &[PeerWitness]) -> String {
    if agreed.is_empty() {
        return String::new();
    }
    let each: Vec<String> = agreed
        .iter()
        .map(|w| match w.last_heard {
            Some(h) => format!(
                "{} (last heard {:.1} s before its view)",
                w.watcher,
                w.view_at.saturating_sub(h) as f64 / 1e9
            ),
            None => format!("{} (never heard)", w.watcher),
        })
        .collect();
    format!("; lost by its watchers {}", each.join(", "))
}

/// What the flow's note says of the detector when it waited past the grace: how long.
fn stretched(since: Nanos, suspected_at: Option<Nanos>, grace: Nanos) -> String {
    match suspected_at {
        Some(at) if at.saturating_sub(since) > grace => format!(
            ", stretched to {:.1} s by the link's jitter and loss",
            at.saturating_sub(since) as f64 / 1e9
        ),
        _ => String::new(),
    }
}
