//! What every `Checkpoint` must do: a successor that imports the leader's export exports the
//! same; importing again changes nothing; a malformed document is refused with a message that
//! names the problem, and the state it was refused into stays as it was.

use super::Checkpoint;

/// `leader` holds some decision state; `standby` starts empty.
pub(crate) fn suite(leader: &dyn Checkpoint, standby: &dyn Checkpoint) {
    let text = leader.export().expect("export");
    let empty = standby.export().expect("export of an empty state");
    assert_ne!(
        text, empty,
        "the leader must hold some state for the suite to mean anything"
    );
    standby.import(&text).expect("import");
    assert_eq!(
        standby.export().unwrap(),
        text,
        "the successor holds what the leader had"
    );
    standby.import(&text).expect("a second import");
    assert_eq!(
        standby.export().unwrap(),
        text,
        "importing again changes nothing"
    );
    for bad in ["{", "[]", r#"{"schema": 99}"#, "null"] {
        let err = standby.import(bad).expect_err(bad).to_string();
        assert!(err.contains("checkpoint"), "{bad}: {err}");
        assert_eq!(standby.export().unwrap(), text, "state kept after {bad:?}");
    }
    standby.import(&empty).expect("an empty state imports");
    assert_eq!(
        standby.export().unwrap(),
        empty,
        "an import replaces, never merges"
    );
}

#[test]
fn the_sqlite_store_passes_the_suite() {
    use maintd_core::fencing::machine::{Flow, Step, Witnesses};
    let leader = crate::store::Store::open_in_memory().unwrap();
    let w = Witnesses {
        collector: true,
        condition: None,
        peers: Vec::new(),
        manual: None,
        alive: vec![],
    };
    let f = Flow::new(
        "node1",
        1,
        5_000_000_000,
        Step::PowerManagement,
        w,
        "silent",
    );
    leader.insert_flow(&f).unwrap();
    let standby = crate::store::Store::open_in_memory().unwrap();
    suite(&leader, &standby);
}

/// Without flows (they live in NodeFences), the checkpoint passes the same suite, carries no
/// flow, and an import leaves the successor's own flow table alone.
#[test]
fn the_flowless_checkpoint_passes_the_suite_and_leaves_flows_alone() {
    use crate::store::checkpoint::WithoutFlows;
    use maintd_core::fencing::machine::{Flow, Step, Witnesses};
    use std::sync::Arc;
    let f = Flow::new(
        "node1",
        1,
        5_000_000_000,
        Step::PowerManagement,
        Witnesses::default(),
        "silent",
    );
    let leader = Arc::new(crate::store::Store::open_in_memory().unwrap());
    leader.insert_flow(&f).unwrap();
    // Some decision state besides the flow: a round.
    leader
        .conn()
        .execute("INSERT INTO rounds (id, started_ns) VALUES (1, 5)", [])
        .unwrap();
    let standby = Arc::new(crate::store::Store::open_in_memory().unwrap());
    let other = Flow::new(
        "node2",
        1,
        6_000_000_000,
        Step::PowerManagement,
        Witnesses::default(),
        "x",
    );
    standby.insert_flow(&other).unwrap();
    let text = WithoutFlows(leader.clone()).export().unwrap();
    assert!(!text.contains("fences"), "{text}");
    suite(&WithoutFlows(leader), &WithoutFlows(standby.clone()));
    assert!(
        standby.flow(&other.id).unwrap().is_some(),
        "the successor's flows stay"
    );
}
