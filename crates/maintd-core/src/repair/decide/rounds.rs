//! Rounds: once every job of the previous round has finished, per node the most invasive active
//! event gets its next job, drains are admitted against the capacity facts, and milder events
//! are superseded. Pure.

use super::*;

/// Starts the next round once every job of the previous one has finished: per node the most
/// invasive active event (ties: the oldest) gets its next job; milder events are superseded.
pub(super) fn plan_round(d: &mut Draft, observations: &Observations) {
    let events = std::mem::take(&mut d.events);
    let specs = plan_nodes(d, &events, observations);
    d.events = events;
    if let Some(mut specs) = specs {
        admit_evacuations(d, &mut specs);
        admit_remedies(d, &mut specs);
        if !specs.is_empty() {
            d.out.push(Action::StartRound {
                round: d.state.last_round + 1,
                jobs: specs,
            });
        }
    }
}

/// Per node, the job its winning event needs next; `None` while a round runs.
fn plan_nodes(
    d: &mut Draft,
    events: &[Event],
    observations: &Observations,
) -> Option<Vec<JobSpec>> {
    let mut nodes: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for e in events.iter().filter(|e| !d.cleared.contains(&e.id)) {
        nodes.entry(e.node.as_str()).or_default().push(e);
    }
    if let Some(round) = d.state.round_running {
        for evs in nodes.values() {
            for e in evs {
                if d.status(e) == RepairStatus::Noted {
                    d.note(e, Some(format!("waiting for round {round} to finish")));
                }
            }
        }
        return None;
    }
    if d.state.upkeep_running {
        let why = "waiting for the cluster's instance repairs and balancing moves to finish";
        for e in nodes.values().flatten() {
            if d.status(e) == RepairStatus::Noted {
                d.note(e, Some(why.into()));
            }
        }
        return None;
    }
    let mut specs = Vec::new();
    for (node, evs) in &nodes {
        let active: Vec<&Event> = evs
            .iter()
            .copied()
            .filter(|e| d.status(e).is_active())
            .collect();
        if let Some(why) = node_block(d, evs, observations, &active, &mut specs) {
            for e in &active {
                d.note(e, Some(why.clone()));
            }
            continue;
        }
        let Some(winner) = active.iter().copied().min_by(|a, b| {
            b.action
                .cmp(&a.action)
                .then(a.created.cmp(&b.created))
                .then(a.id.cmp(&b.id))
        }) else {
            continue;
        };
        for e in &active {
            if e.id == winner.id {
                continue;
            }
            if e.action < winner.action {
                d.status.insert(e.id, RepairStatus::Canceled);
                d.out.push(Action::Cancel {
                    event: e.id,
                    superseded_by: winner.id,
                });
            } else {
                d.note(e, Some(format!("waiting behind older event {}", winner.id)));
            }
        }
        if !d.state.policy.allows(winner.action) {
            d.note(
                winner,
                Some(format!(
                    "action {} is disabled by configuration",
                    winner.action
                )),
            );
            continue;
        }
        match d.next_step(winner) {
            Some(kind) => specs.push(JobSpec {
                event: winner.id,
                node: node.to_string(),
                kind,
                command: winner.command.clone(),
            }),
            // Nothing to run (a live repair without a command): ready for the operator now.
            None if d.jobs_of(&winner.id).is_empty() => {
                d.finalize(winner, RepairStatus::Completed, None)
            }
            None => {}
        }
    }
    Some(specs)
}

/// Keeps at most `max_remedies` remedy Jobs in the round, the oldest events first; the others
/// wait for a later round, and their events say why. (A round never takes a node twice, so a
/// node has at most one remedy at a time.)
fn admit_remedies(d: &mut Draft, specs: &mut Vec<JobSpec>) {
    let Some(cap) = d.state.max_remedies else {
        return;
    };
    let created: HashMap<Uuid, (Nanos, Uuid)> =
        d.events.iter().map(|e| (e.id, (e.created, e.id))).collect();
    let mut remedies: Vec<Uuid> = specs
        .iter()
        .filter(|s| s.kind == JobKind::Remedy)
        .map(|s| s.event)
        .collect();
    if remedies.len() <= cap {
        return;
    }
    remedies.sort_by_key(|id| created.get(id).copied());
    let waiting: HashSet<Uuid> = remedies[cap..].iter().copied().collect();
    specs.retain(|s| !waiting.contains(&s.event));
    let note = Some(format!("waiting: at most {cap} remedy Jobs run at once"));
    let notes: Vec<Action> = d
        .events
        .iter()
        .filter(|e| waiting.contains(&e.id) && e.note != note)
        .map(|e| Action::Note {
            event: e.id,
            note: note.clone(),
        })
        .collect();
    d.out.extend(notes);
}

/// With capacity facts, keeps only the drains that `capacity::admit` lets through together; the
/// others wait, and their events say why. Failovers go first and ignore PodDisruptionBudgets.
fn admit_evacuations(d: &mut Draft, specs: &mut Vec<JobSpec>) {
    let Some(cap) = &d.state.capacity else {
        return;
    };
    let by_id: HashMap<Uuid, &Event> = d.events.iter().map(|e| (e.id, e)).collect();
    let mut drains: Vec<(&Event, bool)> = specs
        .iter()
        .filter(|s| matches!(s.kind, JobKind::Evacuate | JobKind::EvacuateFailover))
        .filter_map(|s| {
            by_id
                .get(&s.event)
                .map(|e| (*e, s.kind == JobKind::Evacuate))
        })
        .collect();
    if drains.is_empty() {
        return;
    }
    drains.sort_by(|(a, _), (b, _)| {
        b.action
            .cmp(&a.action)
            .then(a.created.cmp(&b.created))
            .then(a.id.cmp(&b.id))
    });
    let candidates: Vec<capacity::Candidate> = drains
        .iter()
        .map(|(e, pdbs)| capacity::Candidate {
            node: e.node.clone(),
            respects_pdbs: *pdbs,
        })
        .collect();
    let verdict = capacity::admit(&cap.snapshot, &candidates, cap.max_disruptions);
    // One drain per node at most (rounds never take a node twice).
    let by_node: HashMap<&str, &Event> =
        drains.iter().map(|(e, _)| (e.node.as_str(), *e)).collect();
    let mut waiting = HashSet::new();
    let mut notes = Vec::new();
    for (node, why) in &verdict.waiting {
        if let Some(e) = by_node.get(node.as_str()) {
            waiting.insert(e.id);
            let note = Some(format!("waiting to drain: {why}"));
            if e.note != note {
                notes.push(Action::Note { event: e.id, note });
            }
        }
    }
    d.out.extend(notes);
    specs.retain(|s| !waiting.contains(&s.event));
}

/// Why a node takes no new job this round, if it must wait. May schedule the online job of an
/// acknowledged evacuation instead.
/// Whether a failed condition event has a later rung of its rule's ladder (same rule, same
/// condition episode) waiting: that rung is the escalation, and the failure does not block it.
fn escalated(d: &Draft, failed: &Event, evs: &[&Event]) -> bool {
    let rung = |e: &Event| {
        let det = e.original.get("details")?;
        Some((
            det.get("rule")?.clone(),
            det.get("since")?.clone(),
            det.get("step")?.as_u64()?,
        ))
    };
    let Some((rule, since, step)) = failed.from_condition().then(|| rung(failed)).flatten() else {
        return false;
    };
    evs.iter().any(|o| {
        o.from_condition()
            && d.status(o).is_active()
            && rung(o).is_some_and(|(r, s, n)| r == rule && s == since && n > step)
    })
}

fn node_block(
    d: &mut Draft,
    evs: &[&Event],
    observations: &Observations,
    active: &[&Event],
    specs: &mut Vec<JobSpec>,
) -> Option<String> {
    let node = evs.first().map(|e| e.node.as_str()).unwrap_or_default();
    if let Some(why) = d.state.maintenance.get(node) {
        return Some(format!(
            "node is in maintenance ({why}); its events wait until it ends"
        ));
    }
    for e in evs {
        let st = d.status(e);
        if st == RepairStatus::Failed && !escalated(d, e, evs) {
            return Some(format!(
                "node has failed event {}; remove tag {} to acknowledge",
                e.id,
                failed_tag(&e.id)
            ));
        }
        if st != RepairStatus::Completed || !e.takes_node_offline() {
            continue;
        }
        if !d.acked(e) {
            return Some(format!(
                "node was evacuated for event {}; remove tag {} to acknowledge",
                e.id, e.tag
            ));
        }
        if observed(observations, e) {
            return Some(format!(
                "acknowledged event {} is still observed; waiting for the report to change",
                e.id
            ));
        }
        if active.iter().any(|a| a.takes_node_offline()) {
            // Another evacuation is due: the node stays offline for it.
            d.clear(
                e.id,
                "acknowledged; node stays offline for a newer evacuation",
            );
            continue;
        }
        let online_running = d
            .jobs_of(&e.id)
            .iter()
            .any(|j| j.kind == JobKind::Online && j.status == JobStatus::Running);
        if !online_running {
            specs.push(JobSpec {
                event: e.id,
                node: e.node.clone(),
                kind: JobKind::Online,
                command: None,
            });
        }
        return Some(format!("bringing the node back online for event {}", e.id));
    }
    None
}
