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

mod rounds;
use rounds::plan_round;
