//! Unit tests of the pure core: fixed `now`, hand-built state, assertions on the returned actions.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use uuid::Uuid;

use super::model::*;
use super::{capacity, decide};
use crate::verdict::{Nanos, Verdict};

const NOW: Nanos = 1_700_000_000_000_000_000;

fn verdict(v: Value) -> Verdict {
    Verdict::from_value(v).unwrap()
}

fn report(v: Value) -> Observation {
    Observation::Report(verdict(v))
}

fn evac(disk: &str) -> Value {
    json!({"status": "evacuate", "details": {"disk": disk}})
}

fn live(cmd: &str) -> Value {
    json!({"status": "live-repair", "command": cmd, "details": {"x": 1}})
}

fn failover() -> Value {
    json!({"status": "evacuate-failover", "details": "dimm"})
}

impl Event {
    /// Builder for tests: a noted event on `node` for `original`, created at `created`.
    fn test(node: &str, original: Value, created: Nanos) -> Event {
        let v = verdict(original);
        let id = Uuid::new_v5(&EVENT_NAMESPACE, format!("{node}{created}").as_bytes());
        Event {
            id,
            node: node.into(),
            canonical: v.canonical(),
            original: v.original,
            action: v.status,
            command: v.command,
            status: RepairStatus::Noted,
            tag: ready_tag(&id),
            tagged: false,
            acknowledged: false,
            superseded_by: None,
            note: None,
            created,
            updated: created,
        }
    }

    fn with(mut self, status: RepairStatus) -> Event {
        self.status = status;
        if status == RepairStatus::Failed {
            self.tag = failed_tag(&self.id);
        }
        self
    }

    fn tagged(mut self) -> Event {
        self.tagged = true;
        self
    }

    fn acked(mut self) -> Event {
        self.acknowledged = true;
        self
    }
}

fn job(e: &Event, id: i64, kind: JobKind, status: JobStatus) -> Job {
    Job {
        id,
        event: e.id,
        node: e.node.clone(),
        round: id,
        kind,
        command: e.command.clone(),
        status,
        reason: reason_trail(&e.id),
        detail: Some("hook said no".into()),
        created: NOW - 10,
        finished: None,
    }
}

fn obs(entries: &[(&str, Observation)]) -> Observations {
    entries
        .iter()
        .map(|(n, o)| (n.to_string(), o.clone()))
        .collect()
}

fn state(events: Vec<Event>, jobs: Vec<Job>) -> State {
    let running = jobs
        .iter()
        .find(|j| j.status == JobStatus::Running)
        .map(|j| j.round);
    State {
        events,
        jobs,
        round_running: running,
        last_round: 7,
        tags: BTreeMap::new(),
        policy: Policy::default(),
        capacity: None,
        members: None,
        max_remedies: None,
        upkeep_running: false,
        maintenance: BTreeMap::new(),
    }
}

fn with_tag(mut s: State, node: &str, tag: &str) -> State {
    s.tags.entry(node.into()).or_default().insert(tag.into());
    s
}

fn created(actions: &[Action]) -> Vec<&Event> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateEvent(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn round(actions: &[Action]) -> Option<(i64, Vec<JobSpec>)> {
    actions.iter().find_map(|a| match a {
        Action::StartRound { round, jobs } => Some((*round, jobs.clone())),
        _ => None,
    })
}

fn cleared(actions: &[Action]) -> Vec<Uuid> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Clear { event, .. } => Some(*event),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_report_creates_an_event_and_starts_a_round_at_once() {
    let s = state(vec![], vec![]);
    let a = decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW);
    let ev = created(&a);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].node, "n1");
    assert_eq!(ev[0].status, RepairStatus::Noted);
    assert_eq!(ev[0].tag, ready_tag(&ev[0].id));
    assert_eq!(ev[0].created, NOW);
    let (n, jobs) = round(&a).unwrap();
    assert_eq!(n, 8);
    assert_eq!(
        jobs,
        vec![JobSpec {
            event: ev[0].id,
            node: "n1".into(),
            kind: JobKind::Evacuate,
            command: None
        }]
    );
}

#[test]
fn ok_reports_and_unknown_observations_create_nothing() {
    let s = state(vec![], vec![]);
    let a = decide(
        &s,
        &obs(&[
            ("n1", report(json!({"status": "Ok"}))),
            ("n2", Observation::Unknown),
        ]),
        NOW,
    );
    assert!(a.is_empty(), "{a:?}");
}

#[test]
fn same_json_is_the_same_event_whatever_the_key_order() {
    let e = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let s = state(
        vec![e.clone()],
        vec![job(&e, 1, JobKind::Evacuate, JobStatus::Running)],
    );
    let reordered = verdict(json!({"details": {"disk": "sda"}, "status": "evacuate"}));
    let a = decide(&s, &obs(&[("n1", Observation::Report(reordered))]), NOW);
    assert!(created(&a).is_empty(), "{a:?}");
    assert!(round(&a).is_none());
}

#[test]
fn changed_json_is_a_new_event_and_a_noted_predecessor_is_forgotten() {
    let old = Event::test("n1", evac("sda"), NOW - 100);
    let s = state(vec![old.clone()], vec![]);
    let a = decide(&s, &obs(&[("n1", report(evac("sdb")))]), NOW);
    assert_eq!(created(&a).len(), 1);
    assert_ne!(created(&a)[0].id, old.id);
    assert_eq!(cleared(&a), vec![old.id]);
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs[0].event, created(&a)[0].id);
}

#[test]
fn ids_are_deterministic_and_distinct_per_creation_time() {
    let s = state(vec![], vec![]);
    let o = obs(&[("n1", report(evac("sda")))]);
    let a1 = decide(&s, &o, NOW);
    let a2 = decide(&s, &o, NOW);
    let a3 = decide(&s, &o, NOW + 1);
    assert_eq!(a1, a2);
    assert_ne!(created(&a1)[0].id, created(&a3)[0].id);
}

#[test]
fn no_new_round_while_a_job_runs() {
    let busy = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let s = state(
        vec![busy.clone()],
        vec![job(&busy, 1, JobKind::Evacuate, JobStatus::Running)],
    );
    let a = decide(&s, &obs(&[("n2", report(live("fix")))]), NOW);
    assert_eq!(created(&a).len(), 1);
    assert!(round(&a).is_none());
    assert!(a.iter().any(
        |x| matches!(x, Action::Note { note: Some(n), .. } if n.contains("waiting for round 1"))
    ));
}

/// A node in maintenance: its new event starts no job and says why; once the maintenance
/// ends, the round starts.
#[test]
fn a_node_in_maintenance_starts_no_job_until_it_ends() {
    let e = Event::test("n1", evac("sda"), NOW - 100);
    let mut s = state(vec![e], vec![]);
    s.maintenance.insert("n1".into(), "disk swap".into());
    let a = decide(&s, &Observations::new(), NOW);
    assert!(round(&a).is_none());
    assert!(
        a.iter().any(
            |x| matches!(x, Action::Note { note: Some(n), .. } if n.contains("in maintenance (disk swap)"))
        ),
        "{a:?}"
    );
    s.maintenance.clear();
    assert!(round(&decide(&s, &Observations::new(), NOW)).is_some());
}

#[test]
fn no_new_round_while_the_clusters_upkeep_runs_and_the_plan_keeps_its_nodes_apart() {
    let e = Event::test("n1", evac("sda"), NOW - 100);
    let mut s = state(vec![e.clone()], vec![]);
    s.upkeep_running = true;
    let a = decide(&s, &Observations::new(), NOW);
    assert!(round(&a).is_none());
    assert!(a.iter().any(
        |x| matches!(x, Action::Note { note: Some(n), .. } if n.contains("instance repairs and balancing"))
    ));
    // Once it ended the round starts, and the upkeep it is offered keeps off the round's
    // node and the failed event's node.
    s.upkeep_running = false;
    let failed = Event::test("n2", evac("sdb"), NOW - 300).with(RepairStatus::Failed);
    s.events.push(failed);
    let a = decide(&s, &Observations::new(), NOW);
    assert!(round(&a).is_some());
    let plan = crate::repair::upkeep::plan(&s, &a, false).unwrap();
    assert!(plan.round);
    assert_eq!(plan.busy.iter().collect::<Vec<_>>(), ["n1"]);
    assert_eq!(plan.failed.iter().collect::<Vec<_>>(), ["n2"]);
    assert!(
        crate::repair::upkeep::plan(&s, &a, true).is_none(),
        "one upkeep at a time"
    );
    let mut running = s.clone();
    running.round_running = Some(1);
    assert!(crate::repair::upkeep::plan(&running, &[], false).is_none());
}

#[test]
fn one_round_runs_every_node_in_parallel_and_never_a_node_twice() {
    let a1 = Event::test("n1", live("fix"), NOW - 300);
    let a2 = Event::test("n1", evac("sda"), NOW - 200);
    let b = Event::test("n2", failover(), NOW - 100);
    let s = state(vec![a1.clone(), a2.clone(), b.clone()], vec![]);
    let a = decide(&s, &Observations::new(), NOW);
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs.len(), 2);
    let nodes: BTreeSet<_> = jobs.iter().map(|j| j.node.as_str()).collect();
    assert_eq!(nodes.len(), 2);
    assert!(
        jobs.iter()
            .any(|j| j.event == a2.id && j.kind == JobKind::Evacuate)
    );
    assert!(
        jobs.iter()
            .any(|j| j.event == b.id && j.kind == JobKind::EvacuateFailover)
    );
    assert!(a.contains(&Action::Cancel {
        event: a1.id,
        superseded_by: a2.id
    }));
}

#[test]
fn a_more_invasive_report_supersedes_a_pending_milder_event_in_the_next_round() {
    let lr = Event::test("n1", live("fix"), NOW - 100).with(RepairStatus::Pending);
    let done = job(&lr, 1, JobKind::LiveRepair, JobStatus::Running);
    let s = state(vec![lr.clone()], vec![done.clone()]);
    // While the live repair runs, the evacuate report is noted but nothing is superseded yet.
    let a = decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW);
    let ev = created(&a)[0].clone();
    assert!(round(&a).is_none());
    assert!(!a.iter().any(|x| matches!(x, Action::Cancel { .. })));
    // The next round, after the live repair has finished, runs the evacuation instead.
    let mut finished = done;
    finished.status = JobStatus::Succeeded;
    let mut s2 = state(vec![lr.clone(), ev.clone()], vec![finished]);
    s2.events[0].status = RepairStatus::Pending;
    let a = decide(&s2, &obs(&[("n1", report(evac("sda")))]), NOW + 1);
    // the live repair's plan is exhausted, so it completes rather than being superseded
    assert!(a.iter().any(|x| matches!(x, Action::Finalize { event, status: RepairStatus::Completed, .. } if *event == lr.id)));
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs[0].event, ev.id);

    // An evacuation half-way (evacuated, not yet offlined) is superseded by a failover.
    let ev2 = Event::test("n1", evac("sdc"), NOW - 50).with(RepairStatus::Pending);
    let fo = Event::test("n1", failover(), NOW - 10);
    let s3 = state(
        vec![ev2.clone(), fo.clone()],
        vec![job(&ev2, 2, JobKind::Evacuate, JobStatus::Succeeded)],
    );
    let a = decide(&s3, &obs(&[("n1", report(failover()))]), NOW);
    assert!(a.contains(&Action::Cancel {
        event: ev2.id,
        superseded_by: fo.id
    }));
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(
        (jobs[0].event, jobs[0].kind),
        (fo.id, JobKind::EvacuateFailover)
    );
}

#[test]
fn ties_go_to_the_oldest_event() {
    let old = Event::test("n1", evac("sda"), NOW - 200);
    let new = Event::test("n1", evac("sdb"), NOW - 100);
    let s = state(vec![new.clone(), old.clone()], vec![]);
    let a = decide(&s, &Observations::new(), NOW);
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs[0].event, old.id);
    assert!(!a.iter().any(|x| matches!(x, Action::Cancel { .. })));
}

#[test]
fn the_evacuation_plan_is_evacuate_then_offline_then_ready() {
    let e = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let j1 = job(&e, 1, JobKind::Evacuate, JobStatus::Succeeded);
    let a = decide(
        &state(vec![e.clone()], vec![j1.clone()]),
        &Observations::new(),
        NOW,
    );
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs[0].kind, JobKind::Offline);
    let j2 = job(&e, 2, JobKind::Offline, JobStatus::Succeeded);
    let a = decide(
        &state(vec![e.clone()], vec![j1, j2]),
        &Observations::new(),
        NOW,
    );
    assert_eq!(
        a,
        vec![Action::Finalize {
            event: e.id,
            node: "n1".into(),
            status: RepairStatus::Completed,
            tag: ready_tag(&e.id),
            note: None
        }]
    );
}

#[test]
fn a_failed_job_fails_the_event_and_submits_nothing_more() {
    let e = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let a = decide(
        &state(
            vec![e.clone()],
            vec![job(&e, 1, JobKind::Evacuate, JobStatus::Failed)],
        ),
        &obs(&[("n1", report(evac("sda")))]),
        NOW,
    );
    assert!(round(&a).is_none());
    assert!(a.iter().any(|x| matches!(x, Action::Finalize { status: RepairStatus::Failed, tag, note: Some(n), .. } if *tag == failed_tag(&e.id) && n.contains("hook said no"))));
}

#[test]
fn a_live_repair_without_command_is_ready_at_once() {
    let a = decide(
        &state(vec![], vec![]),
        &obs(&[(
            "n1",
            report(json!({"status": "live-repair", "details": "fan"})),
        )]),
        NOW,
    );
    let id = created(&a)[0].id;
    assert!(a.iter().any(|x| matches!(x, Action::Finalize { event, status: RepairStatus::Completed, .. } if *event == id)));
    assert!(round(&a).is_none());
}

#[test]
fn a_final_event_whose_tag_never_landed_gets_it_again() {
    let e = Event::test("n1", live("fix"), NOW).with(RepairStatus::Completed);
    let a = decide(&state(vec![e.clone()], vec![]), &Observations::new(), NOW);
    assert_eq!(
        a,
        vec![Action::ApplyTag {
            event: e.id,
            node: "n1".into(),
            tag: e.tag.clone()
        }]
    );
}

#[test]
fn removing_repairready_acknowledges_and_the_event_is_forgotten_once_gone() {
    let e = Event::test("n1", live("fix"), NOW - 100)
        .with(RepairStatus::Completed)
        .tagged();
    // Tag present: nothing happens.
    let s = with_tag(state(vec![e.clone()], vec![]), "n1", &e.tag);
    assert!(decide(&s, &obs(&[("n1", report(live("fix")))]), NOW).is_empty());
    // Tag removed, still observed: acknowledged, kept.
    let s = state(vec![e.clone()], vec![]);
    let a = decide(&s, &obs(&[("n1", report(live("fix")))]), NOW);
    assert_eq!(a, vec![Action::Acknowledge { event: e.id }]);
    // Tag removed and no longer observed: acknowledged and forgotten in the same tick.
    let a = decide(&s, &obs(&[("n1", report(json!({"status": "Ok"})))]), NOW);
    assert_eq!(a[0], Action::Acknowledge { event: e.id });
    assert_eq!(cleared(&a), vec![e.id]);
    // Unreachable node: nothing is concluded.
    let a = decide(
        &state(vec![e.clone().acked()], vec![]),
        &obs(&[("n1", Observation::Unknown)]),
        NOW,
    );
    assert!(a.is_empty());
}

#[test]
fn removing_repairfailed_forgets_unconditionally_and_restarts_the_flow() {
    let e = Event::test("n1", evac("sda"), NOW - 100)
        .with(RepairStatus::Failed)
        .tagged();
    let s = state(
        vec![e.clone()],
        vec![job(&e, 1, JobKind::Evacuate, JobStatus::Failed)],
    );
    let a = decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW);
    assert_eq!(cleared(&a), vec![e.id]);
    let new = created(&a);
    assert_eq!(new.len(), 1, "problem still observed: a new event starts");
    assert_ne!(new[0].id, e.id);
    assert_eq!(round(&a).unwrap().1[0].event, new[0].id);
}

#[test]
fn a_failed_event_blocks_its_node_until_acknowledged() {
    let f = Event::test("n1", evac("sda"), NOW - 100)
        .with(RepairStatus::Failed)
        .tagged();
    let s = with_tag(state(vec![f.clone()], vec![]), "n1", &f.tag);
    let a = decide(&s, &obs(&[("n1", report(failover()))]), NOW);
    assert_eq!(created(&a).len(), 1);
    assert!(round(&a).is_none());
    assert!(a.iter().any(|x| matches!(x, Action::Note { note: Some(n), .. } if n.contains("remove tag maintd:repairfailed:"))));
}

#[test]
fn an_acknowledged_evacuation_brings_the_node_online_once_no_longer_observed() {
    let e = Event::test("n1", evac("sda"), NOW - 100)
        .with(RepairStatus::Completed)
        .tagged();
    let jobs = vec![
        job(&e, 1, JobKind::Evacuate, JobStatus::Succeeded),
        job(&e, 2, JobKind::Offline, JobStatus::Succeeded),
    ];
    // Unacknowledged: node waits, with a note naming the tag.
    let s = with_tag(state(vec![e.clone()], jobs.clone()), "n1", &e.tag);
    let a = decide(&s, &obs(&[("n1", report(json!({"status": "Ok"})))]), NOW);
    assert!(round(&a).is_none());
    // Acknowledged but still observed: waits.
    let s = state(vec![e.clone().acked()], jobs.clone());
    assert!(round(&decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW)).is_none());
    // Acknowledged and gone: an online job.
    let a = decide(&s, &obs(&[("n1", report(json!({"status": "Ok"})))]), NOW);
    let (_, r) = round(&a).unwrap();
    assert_eq!((r[0].event, r[0].kind), (e.id, JobKind::Online));
    // Online done: forgotten.
    let mut j = jobs.clone();
    j.push(job(&e, 3, JobKind::Online, JobStatus::Succeeded));
    let a = decide(
        &state(vec![e.clone().acked()], j),
        &Observations::new(),
        NOW,
    );
    assert_eq!(cleared(&a), vec![e.id]);
    // Online failed: the event fails with a repairfailed tag.
    let mut j = jobs;
    j.push(job(&e, 3, JobKind::Online, JobStatus::Failed));
    let a = decide(
        &state(vec![e.clone().acked()], j),
        &Observations::new(),
        NOW,
    );
    assert!(a.iter().any(|x| matches!(x, Action::Finalize { status: RepairStatus::Failed, tag, .. } if *tag == failed_tag(&e.id))));
}

#[test]
fn canceled_events_take_no_action_and_are_forgotten_once_gone() {
    let c = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Canceled);
    let s = state(vec![c.clone()], vec![]);
    assert!(decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW).is_empty());
    let a = decide(&s, &obs(&[("n1", report(json!({"status": "Ok"})))]), NOW);
    assert_eq!(cleared(&a), vec![c.id]);
}

#[test]
fn a_canceled_event_whose_job_fails_is_not_tagged() {
    let c = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Canceled);
    let s = state(
        vec![c.clone()],
        vec![job(&c, 1, JobKind::Evacuate, JobStatus::Failed)],
    );
    assert!(decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW).is_empty());
}

#[test]
fn disabled_actions_are_noted_and_wait() {
    let mut s = state(vec![], vec![]);
    s.policy.evacuate = false;
    let a = decide(&s, &obs(&[("n1", report(evac("sda")))]), NOW);
    assert_eq!(created(&a).len(), 1);
    assert!(round(&a).is_none());
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Note { note: Some(n), .. } if n.contains("disabled")))
    );
}

#[test]
fn pending_events_are_not_dropped_when_the_report_changes() {
    let e = Event::test("n1", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let s = state(
        vec![e.clone()],
        vec![job(&e, 1, JobKind::Evacuate, JobStatus::Succeeded)],
    );
    let a = decide(&s, &obs(&[("n1", report(json!({"status": "Ok"})))]), NOW);
    assert!(cleared(&a).is_empty());
    assert_eq!(round(&a).unwrap().1[0].kind, JobKind::Offline);
}

mod conditions_and_capacity;
