//! Maintenance in the machine: a node in maintenance (an operator's, or a repair waiting for
//! its acknowledgement) is never fenced, powered on or off, and is out of the storm count;
//! leaving it resumes normal handling.

use super::*;

/// The hardware swap: n2 was evacuated by a repair event (its `repairready` tag stands) and a
/// technician powered it down. It stays silent for a minute: no flow starts, and an operator's
/// request waits.
#[test]
fn a_node_waiting_for_its_repairs_acknowledgement_is_never_fenced() {
    let mut s = state();
    s.liveness.insert("n2".into(), down(T0));
    let ready = crate::tags::tag(crate::tags::TagKind::RepairReady, &Uuid::from_u128(7));
    s.tags.insert("n2".into(), BTreeSet::from([ready.clone()]));
    assert!(decide_fencing(&s, T0 + 60 * S).is_empty());
    let why = in_maintenance(&s, "n2").unwrap();
    assert!(why.starts_with("waits for the acknowledgement"), "{why}");
    assert!(why.contains(&ready), "{why}");
    s.requests.push(FenceRequest {
        id: Uuid::from_u128(9),
        node: "n2".into(),
        by: "alice".into(),
        held: None,
    });
    let a = decide_fencing(&s, T0 + 61 * S);
    assert!(
        matches!(&a[..], [FenceAction::Record(Record::Hold { refused: false, why, .. })] if why.contains("in maintenance")),
        "{a:?}"
    );
    // Acknowledged (the tag removed) and still silent: fenced in the normal way.
    s.tags.clear();
    s.requests.clear();
    let a = decide_fencing(&s, T0 + 62 * S);
    assert_eq!(started(&a)[0].node, "n2");
}

/// A flow already under way when the node enters maintenance runs no step (no power-on after
/// the release), until the maintenance ends.
#[test]
fn maintenance_holds_every_step_of_a_running_flow() {
    let mut s = powering_on();
    let a = decide_fencing(&s, T0 + 6 * S);
    let mut f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 7 * S));
    f.release_result = Some(Outcome::done("ok"));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert_eq!((f.step, f.status), (Step::PowerOn, FenceStatus::New));
    s.maintenance
        .insert("n2".into(), "in maintenance by alice (disk swap)".into());
    for t in [9, 30, 300] {
        assert!(runs(&tick(&mut s, &f, T0 + t * S)).is_empty());
    }
    s.maintenance.clear();
    assert_eq!(runs(&tick(&mut s, &f, T0 + 301 * S)), vec![Step::PowerOn]);
}

/// Nodes in maintenance and nodes already fenced are out of the storm count: with 4 of 10
/// nodes in maintenance and one fenced, the next dead node is fenced at a 50 % threshold.
#[test]
fn maintenance_and_fenced_nodes_do_not_count_toward_a_storm() {
    let mut s = state();
    for n in ["n4", "n5", "n6", "n7"] {
        s.liveness.insert(n.into(), down(T0));
        s.maintenance.insert(n.into(), "racked out".into());
    }
    s.liveness.insert("n3".into(), down(T0 - 100 * S));
    let mut fenced = Flow::new(
        "n3",
        T0 - 100 * S,
        T0 - 90 * S,
        Step::PowerManagement,
        Witnesses::default(),
        "x",
    );
    fenced.fenced_at = Some(T0 - 90 * S);
    fenced.status = FenceStatus::Done;
    s.flows = vec![fenced];
    s.liveness.insert("n1".into(), down(T0));
    let a = decide_fencing(&s, T0 + 6 * S);
    assert!(
        !a.iter()
            .any(|x| matches!(x, FenceAction::Record(Record::Storm { .. }))),
        "{a:?}"
    );
    assert!(started(&a).iter().any(|f| f.node == "n1"), "{a:?}");
    // Without the maintenance, six of ten are silent: a storm, and nothing starts.
    s.maintenance.clear();
    let a = decide_fencing(&s, T0 + 6 * S);
    assert!(
        a.iter()
            .any(|x| matches!(x, FenceAction::Record(Record::Storm { .. }))),
        "{a:?}"
    );
    assert!(started(&a).is_empty());
}
