//! `decide(state, observations, now) -> actions`: event identity, acknowledgement by tag
//! removal, supersession and rounds. Pure: no I/O and no clock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use uuid::Uuid;

use super::capacity;
use super::model::*;
use crate::verdict::{Nanos, Status, Verdict};

/// Effective view of the events while actions for this tick are being chosen.
struct Draft<'a> {
    state: &'a State,
    events: Vec<Event>,
    cleared: HashSet<Uuid>,
    status: HashMap<Uuid, RepairStatus>,
    acked: HashSet<Uuid>,
    jobs: HashMap<Uuid, Vec<&'a Job>>,
    out: Vec<Action>,
}

impl<'a> Draft<'a> {
    fn status(&self, e: &Event) -> RepairStatus {
        *self.status.get(&e.id).unwrap_or(&e.status)
    }

    fn acked(&self, e: &Event) -> bool {
        e.acknowledged || self.acked.contains(&e.id)
    }

    fn clear(&mut self, id: Uuid, why: impl Into<String>) {
        if self.cleared.insert(id) {
            self.out.push(Action::Clear {
                event: id,
                why: why.into(),
            });
        }
    }

    fn jobs_of(&self, id: &Uuid) -> &[&'a Job] {
        self.jobs.get(id).map(Vec::as_slice).unwrap_or(&[])
    }

    fn next_step(&self, e: &Event) -> Option<JobKind> {
        let jobs = self.jobs_of(&e.id);
        e.plan().into_iter().find(|k| {
            !jobs
                .iter()
                .any(|j| j.kind == *k && j.status == JobStatus::Succeeded)
        })
    }

    fn finalize(&mut self, e: &Event, status: RepairStatus, note: Option<String>) {
        let tag = match status {
            RepairStatus::Completed => ready_tag(&e.id),
            _ => failed_tag(&e.id),
        };
        self.status.insert(e.id, status);
        self.out.push(Action::Finalize {
            event: e.id,
            node: e.node.clone(),
            status,
            tag,
            note,
        });
    }

    fn note(&mut self, e: &Event, note: Option<String>) {
        if e.note != note {
            self.out.push(Action::Note { event: e.id, note });
        }
    }
}

/// Decides what to do now. Pure: the same inputs always give the same actions.
pub fn decide(state: &State, observations: &Observations, now: Nanos) -> Vec<Action> {
    let mut jobs: HashMap<Uuid, Vec<&Job>> = HashMap::new();
    for j in &state.jobs {
        jobs.entry(j.event).or_default().push(j);
    }
    let mut d = Draft {
        state,
        events: state.events.clone(),
        cleared: HashSet::new(),
        status: HashMap::new(),
        acked: HashSet::new(),
        jobs,
        out: Vec::new(),
    };
    forget_departed(&mut d);
    settle_jobs(&mut d);
    follow_tags(&mut d);
    observe(&mut d, observations, now);
    plan_round(&mut d, observations);
    d.out
}

/// Events of nodes no longer managed: forgotten, with their jobs, before anything else is
/// decided for them.
fn forget_departed(d: &mut Draft) {
    let Some(members) = &d.state.members else {
        return;
    };
    let events = std::mem::take(&mut d.events);
    for e in &events {
        if !members.contains(&e.node) {
            d.cleared.insert(e.id);
            d.out.push(Action::Forget {
                event: e.id,
                node: e.node.clone(),
                why: format!("node {} left the inventory", e.node),
            });
        }
    }
    d.events = events;
}

/// Finalizes events whose jobs have all run, or one of which failed.
fn settle_jobs(d: &mut Draft) {
    // Taken out and put back rather than cloned: cloning every event is the cost on big clusters.
    let events = std::mem::take(&mut d.events);
    for e in &events {
        if d.cleared.contains(&e.id) {
            continue;
        }
        let jobs = d.jobs_of(&e.id);
        let failed = jobs.iter().find(|j| j.status == JobStatus::Failed).copied();
        let running = jobs.iter().any(|j| j.status == JobStatus::Running);
        if e.status.is_active() {
            if let Some(j) = failed {
                let why = format!(
                    "job {} ({}) failed: {}",
                    j.id,
                    j.kind.as_str(),
                    j.detail.as_deref().unwrap_or("no detail")
                );
                d.finalize(e, RepairStatus::Failed, Some(why));
            } else if !running && !jobs.is_empty() && d.next_step(e).is_none() {
                d.finalize(e, RepairStatus::Completed, None);
            }
        } else if e.status == RepairStatus::Completed && e.acknowledged {
            let online: Vec<_> = jobs.iter().filter(|j| j.kind == JobKind::Online).collect();
            if let Some(j) = online.iter().find(|j| j.status == JobStatus::Failed) {
                let why = format!(
                    "bringing the node back online failed (job {}): {}",
                    j.id,
                    j.detail.as_deref().unwrap_or("no detail")
                );
                d.finalize(e, RepairStatus::Failed, Some(why));
            } else if online.iter().any(|j| j.status == JobStatus::Succeeded) {
                d.clear(e.id, "acknowledged; node back online");
            }
        }
    }
    d.events = events;
}

/// Acknowledgement: a removed repairfailed tag forgets the event; a removed repairready tag marks
/// it acknowledged. A final event whose tag never reached the backend gets it again.
fn follow_tags(d: &mut Draft) {
    let events = std::mem::take(&mut d.events);
    for e in &events {
        if d.cleared.contains(&e.id) || !e.status.is_final() || d.status(e) != e.status {
            continue;
        }
        if !e.tagged {
            d.out.push(Action::ApplyTag {
                event: e.id,
                node: e.node.clone(),
                tag: e.tag.clone(),
            });
            continue;
        }
        let present = d
            .state
            .tags
            .get(&e.node)
            .is_some_and(|t| t.contains(&e.tag));
        if present {
            continue;
        }
        match e.status {
            RepairStatus::Failed => d.clear(e.id, "repairfailed tag removed"),
            RepairStatus::Completed if !e.acknowledged => {
                d.acked.insert(e.id);
                d.out.push(Action::Acknowledge { event: e.id });
            }
            _ => {}
        }
    }
    d.events = events;
}

/// Creates events for new reports and condition verdicts, and forgets the ones that are no
/// longer observed. A source that is unknown this tick concludes nothing about its events.
fn observe(d: &mut Draft, observations: &Observations, now: Nanos) {
    // Index once: scanning every event for every node would be quadratic on large clusters.
    let events = std::mem::take(&mut d.events);
    let mut by_node: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        by_node.entry(e.node.as_str()).or_default().push(i);
    }
    let mut nodes: BTreeSet<&str> = observations.reports.keys().map(String::as_str).collect();
    if let Some(c) = &observations.conditions {
        nodes.extend(c.keys().map(String::as_str));
        nodes.extend(
            events
                .iter()
                .filter(|e| e.from_condition())
                .map(|e| e.node.as_str()),
        );
    }
    let mut created = Vec::new();
    for node in nodes {
        let report = observations.report(node);
        let conditions = observations.conditions_of(node);
        let mine: Vec<&Event> = by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|&i| &events[i])
            .filter(|e| !d.cleared.contains(&e.id))
            .collect();
        let busy = report.is_some_and(|v| v.status != Status::Ok)
            || conditions.is_some_and(|c| !c.is_empty());
        if mine.is_empty() && !busy {
            // The common case: a healthy node with no events needs no canonical form.
            continue;
        }
        let current: Vec<(String, &Verdict, bool)> = report
            .map(|v| (v.canonical(), v, false))
            .into_iter()
            .chain(
                conditions
                    .unwrap_or(&[])
                    .iter()
                    .map(|v| (v.canonical(), v, true)),
            )
            .collect();
        for e in &mine {
            let source_known = if e.from_condition() {
                conditions.is_some()
            } else {
                report.is_some()
            };
            if !source_known || current.iter().any(|(c, _, _)| *c == e.canonical) {
                continue;
            }
            match d.status(e) {
                RepairStatus::Canceled => d.clear(e.id, "canceled and no longer observed"),
                RepairStatus::Noted => d.clear(e.id, "no longer observed before any job ran"),
                RepairStatus::Completed if d.acked(e) && !e.takes_node_offline() => {
                    d.clear(e.id, "acknowledged and no longer observed")
                }
                // Evacuated nodes are cleared by the round planner once they are back online.
                _ => {}
            }
        }
        for (canonical, v, _) in current {
            let known = mine
                .iter()
                .any(|e| e.canonical == canonical && !d.cleared.contains(&e.id));
            if v.status == Status::Ok || known {
                continue;
            }
            let id = Uuid::new_v5(
                &EVENT_NAMESPACE,
                format!("{node}\n{canonical}\n{now}").as_bytes(),
            );
            let e = Event {
                id,
                node: node.to_string(),
                original: v.original.clone(),
                canonical,
                action: v.status,
                command: v.command.clone(),
                status: RepairStatus::Noted,
                tag: ready_tag(&id),
                tagged: false,
                acknowledged: false,
                superseded_by: None,
                note: None,
                created: now,
                updated: now,
            };
            d.out.push(Action::CreateEvent(e.clone()));
            created.push(e);
        }
    }
    d.events = events;
    d.events.extend(created);
}

fn observed(obs: &Observations, e: &Event) -> bool {
    let current = if e.from_condition() {
        obs.conditions_of(&e.node)
            .map(|c| c.iter().any(|v| v.canonical() == e.canonical))
    } else {
        obs.report(&e.node).map(|v| v.canonical() == e.canonical)
    };
    // Without a verified report (or readable conditions) we cannot know it is gone.
    current.unwrap_or(true)
}

/// Starts the next round once every job of the previous one has finished: per node the most
/// invasive active event (ties: the oldest) gets its next job; milder events are superseded.
fn plan_round(d: &mut Draft, observations: &Observations) {
    let events = std::mem::take(&mut d.events);
    let specs = plan_nodes(d, &events, observations);
    d.events = events;
    if let Some(mut specs) = specs {
        admit_evacuations(d, &mut specs);
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
fn node_block(
    d: &mut Draft,
    evs: &[&Event],
    observations: &Observations,
    active: &[&Event],
    specs: &mut Vec<JobSpec>,
) -> Option<String> {
    for e in evs {
        let st = d.status(e);
        if st == RepairStatus::Failed {
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
