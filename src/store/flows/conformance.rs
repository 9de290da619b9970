//! What every `FlowStore` must do, as one suite any implementation runs against a fresh, empty
//! store of its own: insert and read back, optimistic saves that refuse a stale copy, outcomes
//! and tags that keep the rest of the flow, the operator's cancel and its refusals, and the
//! fencer's and the API's listings.

use uuid::Uuid;

use super::{FenceCancel, FlowStore};
use maintd_core::fencing::machine::FlowOutcome;
use maintd_core::fencing::machine::{
    Call, ExecPolicy, Executor, FenceStatus, Flow, MethodRecord, PlanRecord, StageRecord, Step,
    Witnesses,
};
use maintd_core::verdict::{Nanos, Outcome};

const S: Nanos = 1_000_000_000;

fn flow(node: &str, at: Nanos) -> Flow {
    let w = Witnesses {
        collector: true,
        condition: None,
        peers: Vec::new(),
        manual: None,
        alive: vec![],
    };
    let mut f = Flow::new(node, at - 5 * S, at, Step::PowerManagement, w, "silent");
    // The plan it started with, which every store keeps whole (a stale schema would prune it).
    f.plan = Some(PlanRecord {
        stages: vec![StageRecord {
            step: Step::PowerManagement,
            policy: ExecPolicy::Any,
            timeout_ms: 20_000,
            retries: 2,
            retry_interval_ms: 1_500,
            methods: vec![MethodRecord {
                name: "ipmi#0".into(),
                agent: "fence_ipmilan".into(),
                action: "off".into(),
                params: [("ip".to_string(), "10.9.9.9".to_string())].into(),
                secret_params: vec!["password".into()],
                required: true,
                executor: Executor::Job,
                power_on: true,
            }],
        }],
        self_fence: false,
        kdump: true,
    });
    f
}

fn call() -> Call {
    Call {
        at: 1_700_000_001 * S,
        step: Step::PowerManagement,
        method: "switch#0".into(),
        agent: "fence_sim".into(),
        action: "off".into(),
        code: Some(0),
        ok: true,
        elapsed_ms: 12,
        output: "Success: Powered OFF".into(),
        // Where a call run as a Job ran: kept by every store (a stale schema would prune it).
        host: Some("n3".into()),
        pending: false,
    }
}

/// `f` with the store's version cleared, to compare content.
fn content(f: Option<Flow>) -> Option<Flow> {
    f.map(|mut f| {
        f.version = 0;
        f
    })
}

/// Runs every case against `store`, which must start empty.
pub async fn suite(store: &dyn FlowStore) {
    let t0 = 1_700_000_000 * S;
    let a = flow("node1", t0);
    let b = flow("node2", t0 + S);
    let c = flow("node3", t0 + 2 * S);

    // Inserted flows read back whole, and a second insert of one id with other content is
    // refused and changes nothing. (The same flow inserted again may be taken for an insert
    // sent again after its answer was lost.)
    store.insert(&a).await.expect("insert");
    store.insert(&b).await.expect("insert");
    store.insert(&c).await.expect("insert");
    assert_eq!(content(store.get(&a.id).await.unwrap()).as_ref(), Some(&a));
    let other = Flow {
        retries: a.retries + 1,
        ..a.clone()
    };
    assert!(
        store.insert(&other).await.is_err(),
        "an id is inserted once"
    );
    assert_eq!(content(store.get(&a.id).await.unwrap()).as_ref(), Some(&a));
    assert_eq!(store.get(&Uuid::from_u128(1)).await.unwrap(), None);

    // A save of the copy read succeeds and bumps the version; a save of a stale copy is
    // refused and changes nothing.
    let mut a1 = store.get(&a.id).await.unwrap().unwrap();
    a1.status = FenceStatus::Running;
    a1.updated = t0 + 3 * S;
    assert!(store.save(&a1).await.unwrap(), "the current copy saves");
    let stale = a1.clone();
    let a2 = store.get(&a.id).await.unwrap().unwrap();
    assert_eq!(a2.status, FenceStatus::Running);
    assert!(a2.version > a1.version, "a save moves the version");
    let mut stale = stale;
    stale.status = FenceStatus::Error;
    assert!(
        !store.save(&stale).await.unwrap(),
        "a stale copy is refused"
    );
    let kept = store.get(&a.id).await.unwrap().unwrap();
    assert_eq!(kept.status, FenceStatus::Running);

    // Outcomes land in their own field, keep the rest, and append the agent calls; each also
    // moves the version, so a copy read before one can no longer be saved.
    let before = store.get(&a.id).await.unwrap().unwrap();
    // A call is recorded before it is made; its answer replaces that record, while an earlier
    // daemon's call that never got its answer stays.
    let pending = |at| Call {
        at,
        code: None,
        ok: false,
        output: maintd_core::fencing::machine::PENDING.into(),
        host: None,
        pending: true,
        ..call()
    };
    store
        .note_call(&a.id, pending(call().at - S))
        .await
        .unwrap();
    store.note_call(&a.id, pending(call().at)).await.unwrap();
    let noted = store.get(&a.id).await.unwrap().unwrap();
    assert_eq!(
        noted.calls,
        vec![pending(call().at - S), pending(call().at)]
    );
    assert!(
        !store.save(&before).await.unwrap(),
        "a noted call makes older copies stale"
    );
    let before = noted;
    store
        .set_outcome(&a.id, FlowOutcome::Step, Outcome::done("off"), vec![call()])
        .await
        .unwrap();
    store
        .set_outcome(&a.id, FlowOutcome::Release, Outcome::failed("busy"), vec![])
        .await
        .unwrap();
    let after = store.get(&a.id).await.unwrap().unwrap();
    assert_eq!(after.result, Some(Outcome::done("off")));
    assert_eq!(after.release_result, Some(Outcome::failed("busy")));
    assert_eq!(after.reclaim_result, None);
    assert_eq!(after.calls, vec![pending(call().at - S), call()]);
    assert_eq!(after.status, FenceStatus::Running);
    // A change applied again (a write sent again after its answer was lost, then read and
    // applied afresh) records nothing twice: no second pending call, no answer over again,
    // and no pending record over the answer it already has.
    store.note_call(&a.id, pending(call().at)).await.unwrap();
    store
        .note_call(&a.id, pending(call().at - S))
        .await
        .unwrap();
    store
        .set_outcome(&a.id, FlowOutcome::Step, Outcome::done("off"), vec![call()])
        .await
        .unwrap();
    let again = store.get(&a.id).await.unwrap().unwrap();
    assert_eq!(again.calls, vec![pending(call().at - S), call()]);
    assert!(
        !store.save(&before).await.unwrap(),
        "an outcome makes older copies stale"
    );
    store.mark_tagged(&a.id).await.unwrap();
    assert!(store.get(&a.id).await.unwrap().unwrap().tagged);

    // The operator's cancel: once, never after the power-off, never of a final flow, and an
    // unknown id says so.
    match store.cancel(&b.id, t0 + 4 * S).await.unwrap() {
        FenceCancel::Canceled(f) => {
            assert!(f.canceled);
            assert_eq!(f.history.last().unwrap().note, "canceled by operator");
        }
        other => panic!("cancel: {other:?}"),
    }
    assert_eq!(
        store.cancel(&b.id, t0 + 5 * S).await.unwrap(),
        FenceCancel::AlreadyCanceled
    );
    let mut fenced = store.get(&c.id).await.unwrap().unwrap();
    fenced.fenced_at = Some(t0 + 4 * S);
    assert!(store.save(&fenced).await.unwrap());
    assert_eq!(
        store.cancel(&c.id, t0 + 5 * S).await.unwrap(),
        FenceCancel::PoweredOff
    );
    assert_eq!(
        store.cancel(&Uuid::from_u128(2), t0).await.unwrap(),
        FenceCancel::NotFound
    );

    // The fencer's listing: every flow not final, and final ones ended since the given time,
    // oldest first; the API's: newest first, capped.
    let mut done = store.get(&b.id).await.unwrap().unwrap();
    done.status = FenceStatus::Final;
    done.updated = t0 + 10 * S;
    assert!(store.save(&done).await.unwrap());
    let ids = |v: Vec<Flow>| v.into_iter().map(|f| f.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.active(t0 + 10 * S).await.unwrap()),
        [a.id, b.id, c.id]
    );
    assert_eq!(ids(store.active(t0 + 11 * S).await.unwrap()), [a.id, c.id]);
    // What the API shows is what the fencer reads, whichever path it takes.
    assert_eq!(
        ids(store.shown(t0 + 10 * S).await.unwrap()),
        [a.id, b.id, c.id]
    );
    assert_eq!(ids(store.shown(t0 + 11 * S).await.unwrap()), [a.id, c.id]);
    assert_eq!(ids(store.recent(2).await.unwrap()), [c.id, b.id]);

    // Pruning deletes final flows ended before the given time, and only those.
    assert_eq!(store.prune(t0 + 10 * S).await.unwrap(), 0);
    assert_eq!(store.prune(t0 + 11 * S).await.unwrap(), 1);
    // A store read through a watch may show a delete a moment later.
    for _ in 0..100 {
        if store.get(&b.id).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(store.get(&b.id).await.unwrap(), None);
    assert_eq!(ids(store.recent(10).await.unwrap()), [c.id, a.id]);
    assert!(!store.location().is_empty());
}

#[cfg(test)]
#[tokio::test]
async fn the_sqlite_store_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::Store::open(&dir.path().join("state.db")).unwrap();
    suite(&store).await;
}
