//! The store's conformance suite: what every table group promises, through the public API.

use super::*;
use maintd_core::repair::{Observation, Observations, decide};
use maintd_core::verdict::Verdict;

fn obs(node: &str, json: &str) -> Observations {
    let mut o = Observations::new();
    o.reports.insert(
        node.into(),
        Observation::Report(Verdict::parse_bytes(json.as_bytes()).unwrap()),
    );
    o
}

/// Runs decide and applies its event-level actions and rounds, as the executor does.
fn tick(s: &Store, o: &Observations, now: Nanos) -> Vec<Action> {
    let state = s
        .load_state(Policy::default(), s.inventory_tags().unwrap())
        .unwrap();
    let actions = decide(&state, o, now);
    for a in &actions {
        match a {
            Action::StartRound { round, jobs } => {
                s.start_round(*round, jobs, now).unwrap();
            }
            Action::Finalize {
                event, node, tag, ..
            } => {
                s.apply(a, now).unwrap();
                s.inventory_add_tag(node, tag, now).unwrap();
                s.mark_tagged(event, now).unwrap();
            }
            other => s.apply(other, now).unwrap(),
        }
    }
    actions
}

#[test]
fn events_round_trip_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let o = obs(
        "n1",
        r#"{"status":"evacuate","details":{"b":2,"a":[1,2.5,"x"]}}"#,
    );
    {
        let s = Store::open(&path).unwrap();
        tick(&s, &o, 100);
        let evs = s.events_with_jobs(None).unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].0.status, RepairStatus::Pending);
        assert_eq!(evs[0].1[0].kind, JobKind::Evacuate);
        assert_eq!(evs[0].1[0].reason, format!("maintd:{}", evs[0].0.id));
    }
    let s = Store::open(&path).unwrap();
    let state = s.load_state(Policy::default(), BTreeMap::new()).unwrap();
    assert_eq!(state.events.len(), 1);
    assert_eq!(state.round_running, Some(1));
    assert_eq!(state.events[0].original["details"]["a"][1], 2.5);
    // Same observation again: no new event, no new round.
    assert!(tick(&s, &o, 200).is_empty());
    let journal: String = s
        .conn()
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
}

#[test]
fn a_checkpoint_carries_the_decision_state_and_a_bad_one_changes_nothing() {
    let leader = Store::open_in_memory().unwrap();
    tick(
        &leader,
        &obs("n1", r#"{"status":"evacuate","details":{"x":[1,2.5]}}"#),
        100,
    );
    let text = leader.export_checkpoint(true).unwrap();
    let standby = Store::open_in_memory().unwrap();
    let before = standby.changes().now();
    standby.import_checkpoint(&text, true).unwrap();
    // Lists the API built before the import must not be served after it.
    let after = standby.changes().now();
    assert_ne!(before.events, after.events);
    assert_ne!(before.nodes, after.nodes);
    let (a, b) = (
        leader.events_with_jobs(None).unwrap(),
        standby.events_with_jobs(None).unwrap(),
    );
    assert_eq!(a, b);
    let state = standby
        .load_state(Policy::default(), BTreeMap::new())
        .unwrap();
    assert_eq!(state.round_running, Some(1), "the running job came along");
    // Importing again replaces rather than duplicates.
    standby.import_checkpoint(&text, true).unwrap();
    assert_eq!(standby.events_with_jobs(None).unwrap().len(), 1);

    let mut wrong_column: serde_json::Value = serde_json::from_str(&text).unwrap();
    wrong_column["jobs"]["columns"][0] = "id; DROP TABLE jobs".into();
    let mut short_row: serde_json::Value = serde_json::from_str(&text).unwrap();
    short_row["jobs"]["rows"][0].as_array_mut().unwrap().pop();
    let mut odd_value: serde_json::Value = serde_json::from_str(&text).unwrap();
    odd_value["events"]["rows"][0][0] = serde_json::json!([1]);
    for (bad, why) in [
        ("{".to_string(), "not JSON"),
        (wrong_column.to_string(), "jobs has no column"),
        (short_row.to_string(), "does not match its columns"),
        (odd_value.to_string(), "unexpected value"),
        (r#"{"schema": 99}"#.to_string(), "newer than this maintd"),
    ] {
        let err = standby
            .import_checkpoint(&bad, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{why}: {err}");
        assert_eq!(
            standby.events_with_jobs(None).unwrap(),
            b,
            "state kept after {why}"
        );
    }
}

#[test]
fn the_identity_index_refuses_a_duplicate_live_event() {
    let s = Store::open_in_memory().unwrap();
    let o = obs("n1", r#"{"status":"evacuate"}"#);
    let a = tick(&s, &o, 1);
    let Action::CreateEvent(mut e) = a[0].clone() else {
        panic!()
    };
    e.id = Uuid::new_v4();
    assert!(s.apply(&Action::CreateEvent(e), 2).is_err());
}

#[test]
fn cancel_outcomes() {
    let s = Store::open_in_memory().unwrap();
    let a = tick(&s, &obs("n1", r#"{"status":"evacuate"}"#), 1);
    let Action::CreateEvent(e) = &a[0] else {
        panic!()
    };
    assert_eq!(
        s.cancel(&Uuid::new_v4(), 2).unwrap(),
        CancelOutcome::NotFound
    );
    assert_eq!(s.cancel(&e.id, 2).unwrap(), CancelOutcome::Canceled);
    assert_eq!(
        s.cancel(&e.id, 3).unwrap(),
        CancelOutcome::AlreadyFinal(RepairStatus::Canceled)
    );
}

#[test]
fn an_operators_cancel_never_waits_for_the_engines_read_of_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("s.db")).unwrap();
    let a = tick(&s, &obs("n1", r#"{"status":"evacuate"}"#), 1);
    let Action::CreateEvent(e) = &a[0] else {
        panic!("no event: {a:?}")
    };
    {
        // The engine in the middle of its read, as `load_state` holds it.
        let engine = s.engine_reader();
        let read = engine.unchecked_transaction().unwrap();
        let live: i64 = read
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(live, 1);
        assert!(
            s.conn.try_lock().is_ok(),
            "a write must not wait for the engine's read"
        );
        assert_eq!(s.cancel(&e.id, 2).unwrap(), CancelOutcome::Canceled);
    }
    // The engine's next read sees the committed cancel.
    let state = s.load_state(Policy::default(), BTreeMap::new()).unwrap();
    let ev = state.events.iter().find(|x| x.id == e.id).unwrap();
    assert_eq!(ev.status, RepairStatus::Canceled);
}

#[test]
fn a_full_live_repair_flow_through_the_store() {
    let s = Store::open_in_memory().unwrap();
    let o = obs("n1", r#"{"status":"live-repair","command":"fix"}"#);
    tick(&s, &o, 1);
    let job = &s.running_jobs().unwrap()[0];
    s.finish_job(job.id, true, "exit 0", 2).unwrap();
    tick(&s, &o, 3);
    let (e, _) = &s.events_with_jobs(None).unwrap()[0];
    assert_eq!(e.status, RepairStatus::Completed);
    assert!(e.tagged);
    assert!(s.inventory_tags().unwrap()["n1"].contains(&e.tag));
    // Operator removes the tag; the problem is gone: forgotten.
    s.inventory_remove_tag("n1", &e.tag).unwrap();
    tick(&s, &obs("n1", r#"{"status":"Ok"}"#), 4);
    assert!(s.events_with_jobs(None).unwrap().is_empty());
    let (_, _, why) = s.event(&e.id).unwrap().unwrap();
    assert_eq!(why.as_deref(), Some("acknowledged and no longer observed"));
}

#[test]
fn poll_records_keep_the_first_unreachable_time_and_count_rejections() {
    let s = Store::open_in_memory().unwrap();
    let down = NodeUpdate {
        name: "n1".into(),
        error: Some("refused".into()),
        ..Default::default()
    };
    s.record_polls(std::slice::from_ref(&down), 10).unwrap();
    s.record_polls(&[down], 20).unwrap();
    let n = &s.nodes().unwrap()[0];
    assert!(!n.reachable);
    assert_eq!(n.unreachable_since_ns, Some(10));
    let rej = NodeUpdate {
        name: "n1".into(),
        answered: true,
        rejection: Some("bad signature".into()),
        ..Default::default()
    };
    s.record_polls(&[rej.clone(), rej], 30).unwrap();
    let n = &s.nodes().unwrap()[0];
    assert_eq!(n.rejected, 2);
    assert_eq!(n.unreachable_since_ns, None);
    s.record_polls(
        &[NodeUpdate {
            name: "n1".into(),
            answered: true,
            seq: Some(42),
            report: Some("{}".into()),
            ..Default::default()
        }],
        40,
    )
    .unwrap();
    assert_eq!(s.last_seqs().unwrap()["n1"], 42);
    assert_eq!(s.nodes().unwrap()[0].rejected, 2);
}

#[test]
fn a_node_is_healthy_only_after_a_verified_ok_report_without_a_diagnose_error() {
    let s = Store::open_in_memory().unwrap();
    let report = |json: &str, error: Option<&str>, at: i64| NodeUpdate {
        name: "n1".into(),
        answered: true,
        seq: Some(at as u64),
        report: Some(json.into()),
        diagnosed_ns: Some(at),
        diagnose_error: error.map(Into::into),
        ..Default::default()
    };
    assert_eq!(
        s.nodes().unwrap().first().and_then(|n| n.healthy_at()),
        None
    );
    s.record_polls(&[report(r#"{"status":"Ok"}"#, None, 5)], 6)
        .unwrap();
    assert_eq!(s.nodes().unwrap()[0].healthy_at(), Some(5));
    s.record_polls(&[report(r#"{"status":"evacuate"}"#, None, 7)], 8)
        .unwrap();
    assert_eq!(s.nodes().unwrap()[0].healthy_at(), None);
    s.record_polls(
        &[report(r#"{"status":"Ok"}"#, Some("diagnose timed out"), 9)],
        10,
    )
    .unwrap();
    assert_eq!(s.nodes().unwrap()[0].healthy_at(), None);
}

#[test]
fn the_steady_clock_offset_is_kept_per_boot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
    let s = Store::open(&path).unwrap();
    assert_eq!(s.steady_offset(a, 100).unwrap(), 100, "the first process");
    drop(s);
    // A restart on the same boot, the wall clock stepped meanwhile: the same timeline.
    let s = Store::open(&path).unwrap();
    assert_eq!(s.steady_offset(a, 130).unwrap(), 100);
    // Another boot: a new timeline from its wall clock, kept for its own restarts.
    assert_eq!(s.steady_offset(b, 500).unwrap(), 500);
    assert_eq!(s.steady_offset(b, 900).unwrap(), 500);
    s.set_control(super::controls::STEADY_CLOCK, Some("garbage"), 0)
        .unwrap();
    assert_eq!(s.steady_offset(b, 700).unwrap(), 700, "unreadable: anew");
}
