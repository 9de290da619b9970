//! Decisions on node-condition verdicts, drain admission by capacity, departed nodes, and the
//! derived enum strings.

use super::*;

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

/// A remedy verdict plans one remedy Job; a round takes at most `max-remedies` of them, the
/// oldest events first, and the others say why they wait. Other jobs are not held back.
#[test]
fn a_round_runs_at_most_max_remedies_remedy_jobs() {
    let remedy = |name: &str| json!({"status": "live-repair", "remedy": name});
    let e1 = Event::test("n1", remedy("fix"), NOW - 300);
    let e2 = Event::test("n2", remedy("fix"), NOW - 200);
    let e3 = Event::test("n3", remedy("fix"), NOW - 100);
    let e4 = Event::test("n4", live("net-reset"), NOW - 50);
    assert_eq!(e1.plan(), vec![JobKind::Remedy]);
    assert_eq!(e1.remedy(), Some("fix"));
    assert_eq!(e4.plan(), vec![JobKind::LiveRepair]);
    let mut s = state(vec![e1.clone(), e2.clone(), e3.clone(), e4.clone()], vec![]);
    s.max_remedies = Some(2);
    let o = obs(&[
        ("n1", report(remedy("fix"))),
        ("n2", report(remedy("fix"))),
        ("n3", report(remedy("fix"))),
        ("n4", report(live("net-reset"))),
    ]);
    let a = decide(&s, &o, NOW);
    let (_, jobs) = round(&a).unwrap();
    let got: Vec<(&str, JobKind)> = jobs.iter().map(|j| (j.node.as_str(), j.kind)).collect();
    assert_eq!(
        got,
        vec![
            ("n1", JobKind::Remedy),
            ("n2", JobKind::Remedy),
            ("n4", JobKind::LiveRepair)
        ],
        "{a:#?}"
    );
    assert_eq!(jobs[0].command.as_deref(), Some("remedy:fix"));
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Note { event, note: Some(n) }
        if *event == e3.id && n.contains("at most 2 remedy Jobs")))
    );
    // Without a cap (a backend with no remedies), all of them.
    s.max_remedies = None;
    assert_eq!(round(&decide(&s, &o, NOW)).unwrap().1.len(), 4);
}

/// A failed rung of a condition rule's ladder is tagged and stays failed, but the next rung of
/// the same episode runs (the escalation); a failure of anything else still holds the node.
#[test]
fn a_failed_rung_does_not_block_the_next_rung_of_its_ladder() {
    let rung = |remedy: &str, step: u64, since: Nanos| {
        json!({"status": "live-repair", "remedy": remedy, "details": {
            "source": CONDITION_SOURCE, "rule": 0, "condition": "Broken", "since": since, "step": step}})
    };
    let failed = Event::test("n1", rung("first-aid", 0, NOW - 100), NOW - 90)
        .with(RepairStatus::Failed)
        .tagged();
    let next = Event::test("n1", rung("fix", 1, NOW - 100), NOW - 10);
    let jobs = vec![job(&failed, 1, JobKind::Remedy, JobStatus::Failed)];
    let s = with_tag(
        state(vec![failed.clone(), next.clone()], jobs.clone()),
        "n1",
        &failed_tag(&failed.id),
    );
    let o = with_conditions(obs(&[]), "n1", vec![verdict(rung("fix", 1, NOW - 100))]);
    let a = decide(&s, &o, NOW);
    let (_, specs) = round(&a).expect("the escalation runs");
    assert_eq!((specs[0].event, specs[0].kind), (next.id, JobKind::Remedy));
    // Another episode (the condition cleared and came back) is no escalation: it waits.
    let other = Event::test("n1", rung("fix", 1, NOW - 50), NOW - 10);
    let s = with_tag(
        state(vec![failed.clone(), other], jobs),
        "n1",
        &failed_tag(&failed.id),
    );
    let o = with_conditions(obs(&[]), "n1", vec![verdict(rung("fix", 1, NOW - 50))]);
    assert!(round(&decide(&s, &o, NOW)).is_none());
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
        JobKind::Remedy,
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
