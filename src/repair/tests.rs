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

fn condition(status: &str, since: Nanos) -> Verdict {
    verdict(json!({"status": status, "details": {
        "source": CONDITION_SOURCE, "condition": "DiskPressure", "since": since, "step": 0}}))
}

fn with_conditions(mut o: Observations, node: &str, vs: Vec<Verdict>) -> Observations {
    o.conditions
        .get_or_insert_with(BTreeMap::new)
        .insert(node.into(), vs);
    o
}

#[test]
fn condition_verdicts_are_events_beside_the_report_and_the_most_invasive_wins() {
    let s = state(vec![], vec![]);
    let o = with_conditions(
        obs(&[("n1", report(evac("sda")))]),
        "n1",
        vec![condition("evacuate-failover", 5)],
    );
    let a = decide(&s, &o, NOW);
    let c = created(&a);
    assert_eq!(c.len(), 2);
    assert!(c.iter().any(|e| e.from_condition()));
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].kind, JobKind::EvacuateFailover);
}

#[test]
fn condition_events_are_judged_only_by_readable_conditions() {
    let from_cond = {
        let v = condition("evacuate", 5);
        let mut e = Event::test("n1", v.original.clone(), NOW - 100);
        e.canonical = v.canonical();
        e
    };
    let s = state(vec![from_cond.clone()], vec![]);
    // A healthy report says nothing about a condition event; unreadable conditions neither.
    let healthy = obs(&[("n1", report(json!({"status": "Ok"})))]);
    assert!(cleared(&decide(&s, &healthy, NOW)).is_empty());
    // Readable conditions without it: the condition cleared before any job ran.
    let gone = with_conditions(healthy.clone(), "n1", vec![]);
    assert_eq!(cleared(&decide(&s, &gone, NOW)), vec![from_cond.id]);
    // A report event is not cleared by the conditions, nor by an unknown report.
    let rep = Event::test("n2", evac("sda"), NOW - 100);
    let s = state(vec![rep.clone()], vec![]);
    let o = with_conditions(obs(&[("n2", Observation::Unknown)]), "n2", vec![]);
    assert!(cleared(&decide(&s, &o, NOW)).is_empty());
}

#[test]
fn escalation_supersedes_the_waiting_milder_condition_event() {
    let mild = {
        let v = condition("evacuate", 5);
        let mut e = Event::test("n1", v.original.clone(), NOW - 100);
        e.canonical = v.canonical();
        e
    };
    let s = state(vec![mild.clone()], vec![]);
    let o = with_conditions(
        Observations::new(),
        "n1",
        vec![verdict(json!({"status": "evacuate-failover", "details": {
            "source": CONDITION_SOURCE, "condition": "DiskPressure", "since": 5, "step": 1}}))],
    );
    let a = decide(&s, &o, NOW);
    // The milder step is no longer observed and never ran: it is forgotten; the next step runs.
    assert_eq!(cleared(&a), vec![mild.id]);
    let (_, jobs) = round(&a).unwrap();
    assert_eq!(jobs[0].kind, JobKind::EvacuateFailover);
}

fn cap_snapshot(nodes: &[&str], cpu: i64, pods: &[(&str, &str, i64)]) -> capacity::Snapshot {
    capacity::Snapshot {
        nodes: nodes
            .iter()
            .map(|n| capacity::NodeCap {
                name: n.to_string(),
                cpu_milli: cpu,
                mem_bytes: 1 << 40,
                labels: BTreeMap::new(),
                taints: vec![],
                schedulable: true,
            })
            .collect(),
        pods: pods
            .iter()
            .map(|(p, n, c)| capacity::PodReq {
                name: p.to_string(),
                node: n.to_string(),
                cpu_milli: *c,
                mem_bytes: 1 << 20,
                node_selector: BTreeMap::new(),
                tolerations: vec![],
                pdbs: vec![],
                movable: true,
            })
            .collect(),
        pdbs: vec![],
    }
}

#[test]
fn a_round_drains_only_what_capacity_and_the_disruption_cap_admit() {
    let e1 = Event::test("n1", evac("sda"), NOW - 300);
    let e2 = Event::test("n2", evac("sdb"), NOW - 200);
    let e3 = Event::test("n3", failover(), NOW - 100);
    let mut s = state(vec![e1.clone(), e2.clone(), e3.clone()], vec![]);
    s.capacity = Some(Capacity {
        snapshot: cap_snapshot(
            &["n1", "n2", "n3", "n4", "n5"],
            1000,
            &[("a", "n1", 600), ("b", "n2", 600), ("c", "n3", 600)],
        ),
        max_disruptions: 3,
    });
    let o = obs(&[
        ("n1", report(evac("sda"))),
        ("n2", report(evac("sdb"))),
        ("n3", report(failover())),
    ]);
    let a = decide(&s, &o, NOW);
    // The failover goes first and takes n4's room, the oldest evacuation takes n5's, and b
    // then fits nowhere (n1 drains; every other node has 400m left).
    let (_, jobs) = round(&a).unwrap();
    let nodes: Vec<&str> = jobs.iter().map(|j| j.node.as_str()).collect();
    assert_eq!(nodes, vec!["n1", "n3"], "{a:#?}");
    let waits: Vec<&String> = a
        .iter()
        .filter_map(|x| match x {
            Action::Note {
                event,
                note: Some(n),
            } if *event == e2.id => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 1);
    assert!(waits[0].starts_with("waiting to drain: pod b"), "{waits:?}");
    // With a cap of one, only the failover runs and the others say so.
    s.capacity.as_mut().unwrap().max_disruptions = 1;
    let a = decide(&s, &o, NOW);
    assert_eq!(round(&a).unwrap().1.len(), 1);
    assert_eq!(round(&a).unwrap().1[0].node, "n3");
    assert!(a.iter().any(
        |x| matches!(x, Action::Note { event, note: Some(n) } if *event == e1.id && n.contains("at most 1 concurrent"))
    ));
}

#[test]
fn events_of_a_node_that_left_the_inventory_are_forgotten_and_nothing_more_runs_there() {
    let gone = Event::test("n9", evac("sda"), NOW - 100).with(RepairStatus::Pending);
    let failed = Event::test("n9", live("fix"), NOW - 50)
        .with(RepairStatus::Failed)
        .tagged();
    let stays = Event::test("n1", evac("sdb"), NOW - 10);
    let mut s = state(
        vec![gone.clone(), failed.clone(), stays.clone()],
        vec![job(&gone, 1, JobKind::Offline, JobStatus::Failed)],
    );
    s.members = Some(["n1".to_string()].into_iter().collect());
    let a = decide(&s, &obs(&[("n1", report(evac("sdb")))]), NOW);
    let forgotten: Vec<Uuid> = a
        .iter()
        .filter_map(|x| match x {
            Action::Forget { event, why, .. } => {
                assert!(why.contains("n9") && why.contains("left the inventory"));
                Some(*event)
            }
            _ => None,
        })
        .collect();
    assert_eq!(forgotten, [gone.id, failed.id]);
    // Not finalized, tagged or planned on the departed node; the other node goes on.
    assert!(!a.iter().any(|x| matches!(x,
        Action::Finalize { node, .. } | Action::ApplyTag { node, .. } if node == "n9")));
    let (_, jobs) = round(&a).expect("n1 still gets its round");
    assert!(jobs.iter().all(|j| j.node == "n1"));
    // Unknown membership forgets nothing.
    s.members = None;
    let a = decide(&s, &obs(&[("n1", report(evac("sdb")))]), NOW);
    assert!(!a.iter().any(|x| matches!(x, Action::Forget { .. })));
}

#[test]
fn derived_enum_strings_match_their_serde_names_and_parse_back() {
    use crate::fencing::machine::{FenceStatus, Step};
    use crate::verdict::Status;
    fn same<T: serde::Serialize>(v: T, s: &str) {
        assert_eq!(serde_json::to_value(v).unwrap(), s);
    }
    for v in [
        RepairStatus::Noted,
        RepairStatus::Pending,
        RepairStatus::Canceled,
        RepairStatus::Failed,
        RepairStatus::Completed,
    ] {
        same(v, v.as_str());
        assert_eq!(RepairStatus::parse(v.as_str()), Some(v));
    }
    for v in [
        JobKind::LiveRepair,
        JobKind::Evacuate,
        JobKind::EvacuateFailover,
        JobKind::Offline,
        JobKind::Online,
    ] {
        same(v, v.as_str());
        assert_eq!(JobKind::parse(v.as_str()), Some(v));
    }
    for v in [JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed] {
        same(v, v.as_str());
        assert_eq!(JobStatus::parse(v.as_str()), Some(v));
    }
    for v in [Step::Isolation, Step::PowerManagement, Step::Recovery] {
        same(v, v.as_str());
    }
    for v in [
        FenceStatus::New,
        FenceStatus::Running,
        FenceStatus::Done,
        FenceStatus::Error,
        FenceStatus::Final,
    ] {
        same(v, v.as_str());
    }
    for v in [
        Status::Ok,
        Status::LiveRepair,
        Status::Evacuate,
        Status::EvacuateFailover,
    ] {
        same(v, v.as_str());
        assert_eq!(Status::parse(v.as_str()), Some(v));
    }
    assert_eq!(Status::parse("ok"), None);
    assert_eq!(JobKind::parse("Evacuate"), None);
}
