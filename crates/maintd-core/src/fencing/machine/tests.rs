//! Unit tests of the fence state machine: fixed `now`, flows driven through outcomes as the
//! executor would record them.

use super::*;

const S: Nanos = 1_000_000_000;
const T0: Nanos = 1_700_000_000 * S;

fn limits(retries: u32) -> StageLimits {
    StageLimits {
        retries,
        retry_interval: S,
    }
}

fn plan(isolation: bool) -> PlanSummary {
    PlanSummary {
        isolation: isolation.then(|| limits(1)),
        power_management: Some(limits(2)),
        power_on: None,
        recovery: limits(1),
        self_fence: false,
        kdump: false,
    }
}

fn policy() -> FencePolicy {
    FencePolicy {
        grace: 5 * S,
        storm_percent: 30,
        max_in_flight: 1,
        min_interval: 0,
        cooldown: 60 * S,
        paused: false,
        max_restarts: 1,
        // The gates below are the master's own; the second opinion has its tests at the end.
        second_opinion: false,
        self_fence_margin: 5 * S,
        kdump_timeout: 30 * S,
        kdump_window: 20 * S,
        clean_reports: 3,
        return_deadline: 600 * S,
    }
}

fn up() -> Liveness {
    Liveness {
        reachable: true,
        answered: true,
        unreachable_since: None,
        healthy_at: None,
        probe_silent: false,
        condition_fence: false,
        boot: None,
        suspected_at: None,
    }
}

const B1: Uuid = Uuid::from_u128(0xb1);
const B2: Uuid = Uuid::from_u128(0xb2);

/// A report from boot `id`, diagnosed at `at`, with `clean` healthy reports since the boot.
fn booted(id: Uuid, at: Nanos, clean: u32) -> Option<BootSeen> {
    Some(BootSeen {
        id,
        booted_at: at - S,
        reported_at: at,
        clean,
    })
}

/// Silent since T0, its last report from boot B1.
fn down_on_b1() -> Liveness {
    Liveness {
        boot: booted(B1, T0 - S, 9),
        ..down(T0)
    }
}

fn down(since: Nanos) -> Liveness {
    Liveness {
        reachable: false,
        answered: false,
        unreachable_since: Some(since),
        healthy_at: None,
        probe_silent: true,
        condition_fence: false,
        boot: None,
        suspected_at: None,
    }
}

/// Ten nodes, all up; n1..n3 have fence plans (n1 with isolation).
fn state() -> FenceState {
    let mut liveness = BTreeMap::new();
    for i in 0..10 {
        liveness.insert(format!("n{i}"), up());
    }
    let mut plans = BTreeMap::new();
    plans.insert("n1".to_string(), plan(true));
    plans.insert("n2".to_string(), plan(false));
    plans.insert("n3".to_string(), plan(false));
    FenceState {
        flows: vec![],
        liveness,
        plans,
        tags: BTreeMap::new(),
        policy: policy(),
        rules: BTreeMap::new(),
        opinions: BTreeMap::new(),
        self_fence: BTreeMap::new(),
        requests: vec![],
        kdump: BTreeMap::new(),
        returns: BTreeMap::new(),
        maintenance: BTreeMap::new(),
        boot: crate::verdict::BootInstant {
            boot: crate::testing::TEST_BOOT,
            ns: T0,
        },
    }
}

fn started(a: &[FenceAction]) -> Vec<Flow> {
    a.iter()
        .filter_map(|x| match x {
            FenceAction::Record(Record::Start(f)) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// The flow as last recorded (a start records it at its first step's attempt).
fn saved(a: &[FenceAction]) -> Flow {
    a.iter()
        .rev()
        .find_map(|x| match x {
            FenceAction::Record(Record::Save(f)) | FenceAction::Record(Record::Start(f)) => {
                Some(f.clone())
            }
            _ => None,
        })
        .expect("a saved flow")
}

fn runs(a: &[FenceAction]) -> Vec<Step> {
    a.iter()
        .filter_map(|x| match x {
            FenceAction::Effect(Effect::RunStep { step, .. }) => Some(*step),
            _ => None,
        })
        .collect()
}

/// One tick with `s.flows = [f]`.
/// One decision on `f` at `now`; the master's boot clock reads `now` too.
fn tick(s: &mut FenceState, f: &Flow, now: Nanos) -> Vec<FenceAction> {
    s.flows = vec![f.clone()];
    s.boot.ns = now;
    decide_fencing(s, now)
}

fn with_result(f: &Flow, ok: bool) -> Flow {
    let mut f = f.clone();
    f.result = Some(Outcome::of(ok, if ok { "ok" } else { "agent exit 1" }));
    f
}

#[test]
fn a_silent_node_becomes_a_candidate_only_after_the_grace() {
    let mut s = state();
    s.liveness.insert("n1".into(), down(T0));
    assert!(decide_fencing(&s, T0 + 4 * S).is_empty());
    let a = decide_fencing(&s, T0 + 5 * S);
    let f = &started(&a)[0];
    assert_eq!(
        (f.node.as_str(), f.step, f.detected),
        ("n1", Step::Isolation, T0)
    );
    assert_eq!(runs(&a), vec![Step::Isolation]);
    assert_eq!(saved(&a).status, FenceStatus::Running);
    // Nodes without a fence plan are never candidates.
    let mut s = state();
    s.liveness.insert("n7".into(), down(T0));
    assert!(decide_fencing(&s, T0 + 60 * S).is_empty());
}

/// The grace is a floor: a detector that learnt a jittery link waits longer, and the flow says
/// so; one that suspects sooner than the grace changes nothing; a node-condition rule does not
/// wait for it.
#[test]
fn the_detector_stretches_the_grace_and_never_shortens_it() {
    let mut s = state();
    let stretched = Liveness {
        suspected_at: Some(T0 + 8 * S),
        ..down(T0)
    };
    s.liveness.insert("n1".into(), stretched);
    assert!(decide_fencing(&s, T0 + 5 * S).is_empty());
    assert!(decide_fencing(&s, T0 + 8 * S - 1).is_empty());
    let a = decide_fencing(&s, T0 + 8 * S);
    let f = &started(&a)[0];
    assert_eq!((f.node.as_str(), f.detected), ("n1", T0));
    assert!(
        f.history[0].note.contains("stretched to 8.0 s"),
        "{:?}",
        f.history[0].note
    );
    let early = Liveness {
        suspected_at: Some(T0 + S),
        ..down(T0)
    };
    s.liveness.insert("n1".into(), early);
    assert!(
        decide_fencing(&s, T0 + 4 * S).is_empty(),
        "never before the grace"
    );
    assert_eq!(started(&decide_fencing(&s, T0 + 5 * S)).len(), 1);
    let rule = Liveness {
        condition_fence: true,
        suspected_at: Some(T0 + 60 * S),
        ..down(T0)
    };
    s.liveness.insert("n1".into(), rule);
    assert_eq!(started(&decide_fencing(&s, T0 + 5 * S)).len(), 1);
}

#[test]
fn a_node_that_answers_again_within_the_grace_is_never_a_candidate() {
    let mut s = state();
    s.liveness.insert("n1".into(), down(T0));
    assert!(decide_fencing(&s, T0 + 3 * S).is_empty());
    // The probe saw it again: its silence is forgotten, and later ticks start nothing.
    s.liveness.insert("n1".into(), up());
    assert!(decide_fencing(&s, T0 + 6 * S).is_empty());
    assert!(decide_fencing(&s, T0 + 60 * S).is_empty());
}

#[test]
fn the_full_flow_isolates_powers_off_releases_and_recovers() {
    let mut s = state();
    s.liveness.insert(
        "n1".into(),
        Liveness {
            boot: booted(B1, T0 - 10 * S, 5),
            ..down(T0)
        },
    );
    let a = decide_fencing(&s, T0 + 5 * S);
    let mut f = saved(&a);
    assert_eq!(
        f.boot_before,
        Some(B1),
        "the boot before the fence is recorded"
    );
    // Isolation succeeds; the node is still silent: power management.
    f = saved(&tick(&mut s, &with_result(&f, true), T0 + 6 * S));
    assert!(f.isolated() && f.status == FenceStatus::Done);
    f = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!(
        (f.step, f.status),
        (Step::PowerManagement, FenceStatus::New)
    );
    let a = tick(&mut s, &f, T0 + 6 * S);
    assert_eq!(runs(&a), vec![Step::PowerManagement]);
    assert!(
        a.iter().any(|x| matches!(
            x,
            FenceAction::Effect(Effect::RunStep {
                work: StepWork::Agents { mark: true, .. },
                ..
            })
        )),
        "the node is marked unschedulable before the power-off: {a:?}"
    );
    f = saved(&a);
    // Verified off: fenced, then released exactly through a Release action.
    f = saved(&tick(&mut s, &with_result(&f, true), T0 + 7 * S));
    assert!(f.fenced() && f.fenced_at == Some(T0 + 7 * S) && f.marked);
    let a = tick(&mut s, &f, T0 + 7 * S);
    assert_eq!(
        a,
        vec![FenceAction::Effect(Effect::Release {
            flow: f.id,
            node: "n1".into(),
            attempt: 0
        })]
    );
    f.release_result = Some(Outcome::done("hook ok"));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert!(f.released());
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    // Left off (no power-on in this plan): recovery waits for a report from a new boot.
    s.liveness.insert("n1".into(), up());
    assert!(tick(&mut s, &f, T0 + 9 * S).is_empty());
    // The new boot is recorded once; two healthy reports are not yet the three needed.
    s.liveness.get_mut("n1").unwrap().boot = booted(B2, T0 + 20 * S, 2);
    f = saved(&tick(&mut s, &f, T0 + 20 * S));
    assert_eq!(f.returned_boot, Some(B2));
    assert!(tick(&mut s, &f, T0 + 20 * S).is_empty());
    s.liveness.get_mut("n1").unwrap().boot = booted(B2, T0 + 21 * S, 3);
    let a = tick(&mut s, &f, T0 + 21 * S);
    assert_eq!(runs(&a), vec![Step::Recovery]);
    f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 22 * S));
    let a = tick(&mut s, &f, T0 + 22 * S);
    assert!(
        a.contains(&FenceAction::Effect(Effect::Reclaim {
            flow: f.id,
            node: "n1".into(),
            unmark: true,
            since: f.detected,
        })),
        "{a:?}"
    );
    f = saved(&a);
    assert!(f.history.last().unwrap().note.contains(&B2.to_string()));
    f.reclaim_result = Some(Outcome::done("ok"));
    f = saved(&tick(&mut s, &f, T0 + 23 * S));
    assert_eq!(f.status, FenceStatus::Final);
    let steps: Vec<_> = f.history.iter().map(|t| (t.step, t.status)).collect();
    assert_eq!(steps.first(), Some(&(Step::Isolation, FenceStatus::New)));
    assert_eq!(steps.last(), Some(&(Step::Recovery, FenceStatus::Final)));
}

#[test]
fn a_node_back_during_isolation_goes_to_recovery_without_power_off() {
    let mut s = state();
    s.liveness.insert("n1".into(), down(T0));
    let f = saved(&decide_fencing(&s, T0 + 5 * S));
    s.liveness.insert("n1".into(), up());
    let f = saved(&tick(&mut s, &with_result(&f, true), T0 + 6 * S));
    let f = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    let a = tick(&mut s, &f, T0 + 6 * S);
    assert_eq!(runs(&a), vec![Step::Recovery], "un-isolation runs at once");
    let f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 7 * S));
    let f = saved(&tick(&mut s, &f, T0 + 7 * S));
    assert_eq!(f.status, FenceStatus::Final);
    assert!(!f.fenced() && !f.released());
    assert!(!f.history.iter().any(|t| t.step == Step::PowerManagement));
}

#[test]
fn a_node_back_before_isolation_ends_the_flow() {
    let mut s = state();
    s.liveness.insert("n2".into(), down(T0));
    s.policy.paused = false;
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    f.status = FenceStatus::New;
    s.liveness.insert("n2".into(), up());
    // Its power-off attempt may have marked it: recovery clears the mark, nothing else.
    let f = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    let a = tick(&mut s, &f, T0 + 6 * S);
    assert!(
        a.iter().any(|x| matches!(
            x,
            FenceAction::Effect(Effect::RunStep {
                work: StepWork::Agents { unmark: true, .. },
                ..
            })
        )),
        "{a:?}"
    );
    let f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 7 * S));
    let f = saved(&tick(&mut s, &f, T0 + 7 * S));
    assert_eq!(f.status, FenceStatus::Final);
    // A flow whose isolation never ran ends at once.
    let mut s = state();
    s.liveness.insert("n1".into(), down(T0));
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    f.status = FenceStatus::New;
    f.history.retain(|t| t.status != FenceStatus::Running);
    s.liveness.insert("n1".into(), up());
    let f = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!(f.status, FenceStatus::Final);
}

#[test]
fn failed_attempts_retry_then_error_then_restart_then_tag_and_release_nothing() {
    let mut s = state();
    s.liveness.insert("n2".into(), down(T0));
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    assert_eq!(f.step, Step::PowerManagement);
    let mut now = T0 + 5 * S;
    let mut attempts = 1;
    let mut saw_restart = false;
    loop {
        f = saved(&tick(&mut s, &with_result(&f, false), now));
        if f.status == FenceStatus::Error {
            if f.restarts == s.policy.max_restarts {
                break;
            }
            f = saved(&tick(&mut s, &f, now));
            assert_eq!(f.status, FenceStatus::New);
            saw_restart = true;
        }
        // Not before the retry interval.
        assert!(runs(&tick(&mut s, &f, now)).is_empty() || f.next_attempt <= now);
        now += S;
        let a = tick(&mut s, &f, now);
        assert_eq!(runs(&a), vec![Step::PowerManagement]);
        f = saved(&a);
        attempts += 1;
    }
    assert!(saw_restart);
    assert_eq!(attempts, 6, "(1 + 2 retries) x (1 + 1 restart)");
    let a = tick(&mut s, &f, now);
    assert_eq!(
        a,
        vec![FenceAction::Effect(Effect::TagFailed {
            flow: f.id,
            node: "n2".into(),
            tag: fence_failed_tag(&f.id)
        })]
    );
    f.tagged = true;
    s.tags
        .entry("n2".into())
        .or_default()
        .insert(fence_failed_tag(&f.id));
    assert!(
        tick(&mut s, &f, now).is_empty(),
        "stays in error; releases nothing"
    );
    s.tags.clear();
    assert_eq!(saved(&tick(&mut s, &f, now)).status, FenceStatus::Final);
}

#[test]
fn a_storm_starts_nothing_and_holds_power_steps() {
    let mut s = state();
    for i in 1..=4 {
        s.liveness.insert(format!("n{i}"), down(T0));
    }
    let a = decide_fencing(&s, T0 + 60 * S);
    assert_eq!(
        a,
        vec![FenceAction::Record(Record::Storm {
            unreachable: 4,
            total: 10
        })]
    );
    // Exactly at the threshold (3 of 10 = 30 %) is not a storm.
    s.liveness.insert("n4".into(), up());
    assert_eq!(started(&decide_fencing(&s, T0 + 60 * S)).len(), 1);
}

#[test]
fn pause_in_flight_cap_min_interval_and_cooldown_gate_starts() {
    let mut s = state();
    s.liveness.insert("n2".into(), down(T0));
    s.liveness.insert("n3".into(), down(T0 + S));
    s.policy.paused = true;
    assert!(decide_fencing(&s, T0 + 60 * S).is_empty());
    s.policy.paused = false;
    // One in flight at a time: the oldest silent node first.
    let a = decide_fencing(&s, T0 + 60 * S);
    assert_eq!(started(&a).len(), 1);
    assert_eq!(started(&a)[0].node, "n2");
    let f = saved(&a);
    s.flows = vec![f.clone()];
    assert!(started(&decide_fencing(&s, T0 + 61 * S)).is_empty());
    // Once n2 is fenced it no longer counts; the min interval still applies.
    let mut fenced = f.clone();
    fenced.fenced_at = Some(T0);
    s.flows = vec![fenced];
    s.policy.min_interval = 10 * S;
    assert!(started(&decide_fencing(&s, T0 + 65 * S)).is_empty());
    assert_eq!(started(&decide_fencing(&s, T0 + 70 * S))[0].node, "n3");
    // Cooldown: a node whose flow ended recently is not fenced again.
    let mut done = f;
    done.status = FenceStatus::Final;
    done.updated = T0 + 100 * S;
    s.flows = vec![done];
    s.liveness.insert("n3".into(), up());
    s.liveness.insert("n2".into(), down(T0 + 101 * S));
    s.policy.min_interval = 0;
    assert!(started(&decide_fencing(&s, T0 + 120 * S)).is_empty());
    assert_eq!(started(&decide_fencing(&s, T0 + 161 * S)).len(), 1);
}

#[test]
fn cancel_before_power_off_undoes_isolation_and_after_it_is_ignored() {
    let mut s = state();
    s.liveness.insert("n1".into(), down(T0));
    let f = saved(&decide_fencing(&s, T0 + 5 * S));
    let mut f = saved(&tick(&mut s, &with_result(&f, true), T0 + 6 * S));
    f.canceled = true;
    let f2 = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!((f2.step, f2.status), (Step::Recovery, FenceStatus::New));
    // A fenced flow keeps going to its release even if a cancel arrived late.
    let mut g = f.clone();
    g.step = Step::PowerManagement;
    g.status = FenceStatus::Done;
    g.fenced_at = Some(T0 + 7 * S);
    let a = tick(&mut s, &g, T0 + 7 * S);
    assert!(matches!(a[0], FenceAction::Effect(Effect::Release { .. })));
}

/// An isolation attempt that failed may have isolated the node all the same (the switch took
/// the port down, then the agent timed out): a stand-down after it, by a cancel or by the node's
/// answer, undoes the isolation rather than ending with the port down.
#[test]
fn a_stand_down_after_a_failed_isolation_attempt_still_undoes_the_isolation() {
    for canceled in [true, false] {
        let mut s = state();
        s.liveness.insert("n1".into(), down(T0));
        let f = saved(&decide_fencing(&s, T0 + 5 * S));
        assert_eq!((f.step, f.status), (Step::Isolation, FenceStatus::Running));
        // Failed; one retry is left, so the step waits for its next attempt.
        let mut f = saved(&tick(&mut s, &with_result(&f, false), T0 + 6 * S));
        assert_eq!((f.step, f.status), (Step::Isolation, FenceStatus::New));
        assert!(!f.isolated());
        if canceled {
            f.cancel(T0 + 7 * S).unwrap();
        } else {
            s.liveness.insert("n1".into(), up());
        }
        let g = saved(&tick(&mut s, &f, T0 + 7 * S));
        assert_eq!(
            (g.step, g.status),
            (Step::Recovery, FenceStatus::New),
            "{g:?}"
        );
        assert_eq!(runs(&tick(&mut s, &g, T0 + 8 * S)), vec![Step::Recovery]);
    }
    // Canceled while the attempt ran, which then failed for good: recovery, not a tag.
    let mut s = state();
    s.policy.max_restarts = 0;
    s.liveness.insert("n1".into(), down(T0));
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    f.retries = 1;
    f.cancel(T0 + 6 * S).unwrap();
    let f = saved(&tick(&mut s, &with_result(&f, false), T0 + 7 * S));
    assert_eq!(f.status, FenceStatus::Error);
    let g = saved(&tick(&mut s, &f, T0 + 7 * S));
    assert_eq!(
        (g.step, g.status),
        (Step::Recovery, FenceStatus::New),
        "{g:?}"
    );
    // Before any attempt ran there is nothing to undo: the flow just ends.
    let mut s = state();
    s.policy.paused = false;
    s.liveness.insert("n1".into(), down(T0));
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    f.status = FenceStatus::New;
    f.history.retain(|t| t.status != FenceStatus::Running);
    f.cancel(T0 + 6 * S).unwrap();
    let g = saved(&tick(&mut s, &f, T0 + 6 * S));
    assert_eq!(g.status, FenceStatus::Final);
}

#[test]
fn a_failed_release_is_an_error_and_the_restart_releases_under_a_new_attempt_key() {
    let mut s = state();
    s.liveness.insert("n2".into(), down(T0));
    let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
    f = saved(&tick(&mut s, &with_result(&f, true), T0 + 6 * S));
    f.release_result = Some(Outcome::failed("hook exit 1"));
    f = saved(&tick(&mut s, &f, T0 + 7 * S));
    assert_eq!(f.status, FenceStatus::Error);
    assert!(!f.released());
    f = saved(&tick(&mut s, &f, T0 + 7 * S));
    assert_eq!((f.restarts, f.status), (1, FenceStatus::New));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    f = saved(&tick(&mut s, &with_result(&f, true), T0 + 9 * S));
    assert_eq!(
        tick(&mut s, &f, T0 + 9 * S),
        vec![FenceAction::Effect(Effect::Release {
            flow: f.id,
            node: "n2".into(),
            attempt: 1
        })]
    );
}

/// Drives n2's flow from a fresh start to "powered off, released, recovery due".
fn fenced_flow(s: &mut FenceState) -> Flow {
    let a = decide_fencing(s, T0 + 6 * S);
    let mut f = saved(&a);
    f = saved(&tick(s, &with_result(&f, true), T0 + 7 * S));
    assert!(f.fenced());
    f.release_result = Some(Outcome::done("ok"));
    f = saved(&tick(s, &f, T0 + 8 * S));
    f = saved(&tick(s, &f, T0 + 8 * S));
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    f
}

#[test]
fn a_condition_fence_recovers_only_once_the_condition_clears_and_says_which_rule_fired() {
    let mut s = state();
    // The collector still answers; the Ready=Unknown rule alone declares n2 dead.
    s.liveness.insert(
        "n2".into(),
        Liveness {
            reachable: false,
            answered: false,
            unreachable_since: Some(T0),
            healthy_at: Some(T0 + 5 * S),
            probe_silent: false,
            condition_fence: true,
            boot: None,
            suspected_at: None,
        },
    );
    s.rules.insert("n2".into(), "Ready=Unknown for 5s".into());
    let a = decide_fencing(&s, T0 + 6 * S);
    let f = &started(&a)[0];
    assert_eq!(
        f.witnesses,
        Witnesses {
            collector: false,
            condition: Some("Ready=Unknown for 5s".into()),
            peers: vec![],
            manual: None,
            // The record says the node looked alive: its collector still answered.
            alive: vec!["collector".into()],
        }
    );
    let note = &f.history[0].note;
    assert!(
        note.contains("rule Ready=Unknown for 5s") && !note.contains("collector silent"),
        "{note}"
    );
    let mut f = fenced_flow(&mut s);
    f.returned_boot = Some(B2);
    // Powered back on with the kubelet still down: a new boot, healthy reports, Ready
    // still Unknown.
    s.liveness.get_mut("n2").unwrap().boot = booted(B2, T0 + 30 * S, 3);
    assert!(
        runs(&tick(&mut s, &f, T0 + 31 * S)).is_empty(),
        "no recovery while the rule holds"
    );
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B2, T0 + 32 * S, 4),
            ..up()
        },
    );
    assert_eq!(runs(&tick(&mut s, &f, T0 + 32 * S)), vec![Step::Recovery]);
}

#[test]
fn a_fenced_node_returns_only_with_a_new_boot_and_enough_healthy_reports_from_it() {
    let mut s = state();
    s.liveness.insert("n2".into(), down_on_b1());
    let f = fenced_flow(&mut s);
    assert!(f.witnesses.collector && f.boot_before == Some(B1));
    // A stale answer: the probe reaches it, and its last report, diagnosed before the off,
    // is from the old boot: no proof, and no alarm either.
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B1, T0 + 6 * S, 9),
            ..up()
        },
    );
    assert!(tick(&mut s, &f, T0 + 9 * S).is_empty());
    // A new boot, healthy three times over, while the probe fails: not yet.
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B2, T0 + 20 * S, 3),
            probe_silent: true,
            reachable: false,
            answered: false,
            ..up()
        },
    );
    let f = saved(&tick(&mut s, &f, T0 + 21 * S));
    assert_eq!(f.returned_boot, Some(B2), "the new boot is a milestone");
    assert!(runs(&tick(&mut s, &f, T0 + 21 * S)).is_empty());
    // One unhealthy report in between starts the count again (the pure fold, below).
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B2, T0 + 22 * S, 3),
            ..up()
        },
    );
    assert_eq!(runs(&tick(&mut s, &f, T0 + 22 * S)), vec![Step::Recovery]);
}

#[test]
fn healthy_reports_count_once_per_diagnose_after_the_boot_and_an_unhealthy_one_resets() {
    let boot = Some((B2, T0));
    let mut b = observe_report(None, boot, T0 - S, true);
    assert_eq!(b.unwrap().clean, 0, "a diagnose from before the boot");
    b = observe_report(b, boot, T0 + S, true);
    b = observe_report(b, boot, T0 + S, true);
    assert_eq!(b.unwrap().clean, 1, "one diagnose served twice counts once");
    b = observe_report(b, boot, T0 + 2 * S, true);
    b = observe_report(b, boot, T0 + S, true);
    assert_eq!(b.unwrap().clean, 2, "a reordered older report adds nothing");
    b = observe_report(b, boot, T0 + 3 * S, false);
    assert_eq!(b.unwrap().clean, 0);
    b = observe_report(b, Some((B1, T0 + 4 * S)), T0 + 5 * S, true);
    assert_eq!(
        (b.unwrap().id, b.unwrap().clean),
        (B1, 1),
        "another boot starts anew"
    );
    assert_eq!(observe_report(b, None, T0 + 6 * S, true), None);
}

/// n2 fenced and released, then answering under its boot from before the verified off (a
/// diagnose that started after it): the decision the alarm comes from.
fn old_boot_after_the_off(s: &mut FenceState) -> Vec<FenceAction> {
    s.liveness.insert("n2".into(), down_on_b1());
    let f = fenced_flow(s);
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B1, T0 + 30 * S, 12),
            ..up()
        },
    );
    tick(s, &f, T0 + 31 * S)
}

#[test]
fn the_old_boot_after_a_verified_power_off_is_an_alarm_and_the_node_stays_out() {
    let mut s = state();
    let a = old_boot_after_the_off(&mut s);
    assert!(
        a.iter()
            .any(|x| matches!(x, FenceAction::Effect(Effect::Alarm { node, .. }) if node == "n2")),
        "{a:?}"
    );
    let f = saved(&a);
    assert_eq!(f.status, FenceStatus::Error);
    assert!(
        f.alarm.as_deref().unwrap().contains("lied"),
        "{:?}",
        f.alarm
    );
    // No restart (it would power off a node that ignores its device), no reclaim: tagged.
    let a = tick(&mut s, &f, T0 + 32 * S);
    assert!(
        matches!(a[..], [FenceAction::Effect(Effect::TagFailed { .. })]),
        "{a:?}"
    );
}

#[test]
fn an_acknowledged_alarm_returns_the_node_once_it_answers_and_reports_healthy() {
    let mut s = state();
    let mut f = saved(&old_boot_after_the_off(&mut s));
    assert!(f.released() && f.alarm.is_some());
    f.tagged = true;
    f.acknowledged = Some("alice (device rewired)".into());
    // Silent meanwhile: the flow waits, and says so once.
    s.liveness.insert("n2".into(), down_on_b1());
    let w = saved(&tick(&mut s, &f, T0 + 40 * S));
    let note = &w.history.last().unwrap().note;
    assert!(
        note.contains("waits for the node to answer and report healthy") && note.contains("alice"),
        "{note}"
    );
    assert!(tick(&mut s, &w, T0 + 41 * S).is_empty());
    // It answers, healthy: back to service, its release cleared and its mark with it.
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B1, T0 + 50 * S, 13),
            ..up()
        },
    );
    let r = saved(&tick(&mut s, &w, T0 + 51 * S));
    assert_eq!((r.step, r.status), (Step::Recovery, FenceStatus::Done));
    assert!(r.returned_at.is_some());
    let a = tick(&mut s, &r, T0 + 52 * S);
    assert!(
        matches!(&a[..], [FenceAction::Effect(Effect::Reclaim { unmark, .. })] if *unmark == r.marked),
        "{a:?}"
    );
}

#[test]
fn an_acknowledged_failure_that_released_nothing_ends_its_flow() {
    let mut s = state();
    s.liveness.insert("n2".into(), down_on_b1());
    let mut f = saved(&decide_fencing(&s, T0 + 6 * S));
    f.go(T0 + 7 * S, f.step, FenceStatus::Error, "power-off failed");
    f.tagged = true;
    f.restarts = 99;
    f.acknowledged = Some("bob (BMC replaced)".into());
    let end = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert_eq!(end.status, FenceStatus::Final);
    assert!(
        end.history
            .last()
            .unwrap()
            .note
            .contains("acknowledged by bob")
    );
}

/// n2 with a power-on stage after the release.
fn powering_on() -> FenceState {
    let mut s = state();
    s.plans.get_mut("n2").unwrap().power_on = Some(limits(1));
    s.liveness.insert("n2".into(), down_on_b1());
    s
}

#[test]
fn power_on_follows_the_release_then_recovery_runs_and_the_return_waits_for_proof() {
    let mut s = powering_on();
    let a = decide_fencing(&s, T0 + 6 * S);
    let mut f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 7 * S));
    f.release_result = Some(Outcome::done("ok"));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert!(f.released());
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    assert_eq!((f.step, f.status), (Step::PowerOn, FenceStatus::New));
    // The power-on runs while the node is still silent.
    let a = tick(&mut s, &f, T0 + 8 * S);
    assert_eq!(runs(&a), vec![Step::PowerOn]);
    f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 9 * S));
    assert_eq!(f.powered_on_at, Some(T0 + 9 * S));
    f = saved(&tick(&mut s, &f, T0 + 9 * S));
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    // Recovery's agents (un-isolation) run at once: the node may need them to answer.
    let a = tick(&mut s, &f, T0 + 9 * S);
    assert_eq!(runs(&a), vec![Step::Recovery]);
    f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 10 * S));
    // The return to service waits for the proof.
    assert!(tick(&mut s, &f, T0 + 11 * S).is_empty());
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B2, T0 + 40 * S, 3),
            ..up()
        },
    );
    f = saved(&tick(&mut s, &f, T0 + 41 * S));
    let a = tick(&mut s, &f, T0 + 41 * S);
    assert!(
        a.iter()
            .any(|x| matches!(x, FenceAction::Effect(Effect::Reclaim { .. }))),
        "{a:?}"
    );
}

#[test]
fn a_failed_power_on_is_retried_then_reported_and_never_undoes_the_release() {
    let mut s = powering_on();
    let a = decide_fencing(&s, T0 + 6 * S);
    let mut f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 7 * S));
    f.release_result = Some(Outcome::done("ok"));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    f = saved(&tick(&mut s, &f, T0 + 8 * S));
    f = saved(&tick(&mut s, &with_result(&f, false), T0 + 9 * S));
    assert_eq!(
        (f.step, f.status, f.retries),
        (Step::PowerOn, FenceStatus::New, 1)
    );
    f = saved(&tick(&mut s, &f, T0 + 10 * S));
    f = saved(&tick(&mut s, &with_result(&f, false), T0 + 11 * S));
    assert_eq!(f.status, FenceStatus::Error);
    assert!(f.history.last().unwrap().note.contains("stay released"));
    let a = tick(&mut s, &f, T0 + 12 * S);
    assert!(
        matches!(a[..], [FenceAction::Effect(Effect::TagFailed { .. })]),
        "{a:?}"
    );
    assert!(f.released() && !f.reclaimed);
}

#[test]
fn a_node_not_back_by_the_deadline_after_its_power_on_fails_its_flow() {
    let mut s = powering_on();
    let mut f = Flow::new("n2", T0, T0, Step::Recovery, Witnesses::default(), "x");
    f.fenced_at = Some(T0 + S);
    f.released_at = Some(T0 + S);
    f.powered_on_at = Some(T0 + 2 * S);
    f.boot_before = Some(B1);
    f.status = FenceStatus::Done;
    assert!(tick(&mut s, &f, T0 + 600 * S).is_empty());
    let f = saved(&tick(&mut s, &f, T0 + 603 * S));
    assert_eq!(f.status, FenceStatus::Error);
    let note = &f.history.last().unwrap().note;
    assert!(
        note.contains("within 600 s") && note.contains("no report from a new boot"),
        "{note}"
    );
    assert!(matches!(
        tick(&mut s, &f, T0 + 604 * S)[..],
        [FenceAction::Effect(Effect::TagFailed { .. })]
    ));
}

#[test]
fn every_witness_that_declared_the_node_dead_must_be_back_before_its_return() {
    let mut s = state();
    s.liveness.insert("n2".into(), down_on_b1());
    let mut f = fenced_flow(&mut s);
    f.witnesses
        .peers
        .push(crate::fencing::opinion::PeerWitness {
            watcher: crate::fencing::opinion::KUBELET_WITNESS.into(),
            view_at: T0,
            last_heard: None,
        });
    s.liveness.insert(
        "n2".into(),
        Liveness {
            boot: booted(B2, T0 + 40 * S, 3),
            ..up()
        },
    );
    f.returned_boot = Some(B2);
    let mut facts = ReturnFacts {
        ready: Some(false),
        renewed: BTreeMap::new(),
    };
    s.returns.insert("n2".into(), facts.clone());
    // What the return waits for is said once, and again only when it changes.
    let waits = |f: &Flow| f.history.last().unwrap().note.clone();
    let f = saved(&tick(&mut s, &f, T0 + 41 * S));
    assert_eq!(
        waits(&f),
        "the return to service waits for: the kubelet is not Ready"
    );
    assert!(tick(&mut s, &f, T0 + 41 * S).is_empty(), "said once");
    facts.ready = Some(true);
    // A renewal from before the node came back is no witness of its return.
    facts.renewed.insert("lease:kubelet".into(), T0 + 5 * S);
    s.returns.insert("n2".into(), facts.clone());
    let f = saved(&tick(&mut s, &f, T0 + 42 * S));
    assert!(
        waits(&f).contains("lease:kubelet not renewed"),
        "{}",
        waits(&f)
    );
    assert!(
        tick(&mut s, &f, T0 + 42 * S).is_empty(),
        "the Lease is stale"
    );
    facts.renewed.insert("lease:kubelet".into(), T0 + 40 * S);
    s.returns.insert("n2".into(), facts);
    assert_eq!(runs(&tick(&mut s, &f, T0 + 43 * S)), vec![Step::Recovery]);
}

mod second_opinion {
    use super::*;
    use crate::fencing::opinion::{PeerOpinion, PeerWitness};

    fn with_opinion(o: Option<PeerOpinion>) -> FenceState {
        let mut s = state();
        s.policy.second_opinion = true;
        s.liveness.insert("n2".into(), down(T0));
        if let Some(o) = o {
            s.opinions.insert("n2".into(), o);
        }
        s
    }

    #[test]
    fn a_silent_collector_alone_starts_nothing() {
        for o in [
            None,
            Some(PeerOpinion::Partitioned {
                hearers: vec!["n5".into()],
            }),
            Some(PeerOpinion::TooFew {
                heard: 1,
                watchers: 8,
            }),
            Some(PeerOpinion::NotAsked),
        ] {
            let s = with_opinion(o.clone());
            assert!(
                started(&decide_fencing(&s, T0 + 60 * S)).is_empty(),
                "{o:?}"
            );
        }
    }

    #[test]
    fn watchers_that_lost_it_too_start_the_flow_and_are_its_witnesses() {
        let agreed = vec![
            PeerWitness {
                watcher: "n4".into(),
                view_at: T0 + 4 * S,
                last_heard: Some(T0 - S),
            },
            PeerWitness {
                watcher: "n7".into(),
                view_at: T0 + 5 * S,
                last_heard: None,
            },
        ];
        let s = with_opinion(Some(PeerOpinion::Lost {
            agreed: agreed.clone(),
        }));
        // Not before the grace, whatever the peers say.
        assert!(started(&decide_fencing(&s, T0 + 4 * S)).is_empty());
        let a = decide_fencing(&s, T0 + 6 * S);
        let f = &started(&a)[0];
        assert_eq!(f.node, "n2");
        assert_eq!(f.witnesses.peers, agreed);
        assert!(f.witnesses.collector);
        let note = &f.history[0].note;
        assert!(
            note.contains(
                "lost by its watchers n4 (last heard 5.0 s before its view), n7 (never heard)"
            ),
            "{note}"
        );
    }

    #[test]
    fn a_node_condition_rule_needs_no_second_opinion() {
        let mut s = with_opinion(Some(PeerOpinion::Partitioned {
            hearers: vec!["n5".into()],
        }));
        s.liveness.insert(
            "n2".into(),
            Liveness {
                reachable: false,
                answered: false,
                unreachable_since: Some(T0),
                healthy_at: None,
                probe_silent: false,
                condition_fence: true,
                boot: None,
                suspected_at: None,
            },
        );
        s.rules.insert("n2".into(), "Ready=Unknown for 5s".into());
        assert_eq!(started(&decide_fencing(&s, T0 + 6 * S)).len(), 1);
    }
}

mod self_fencing {
    use super::*;
    use crate::fencing::selffence::{
        LostRun, ResetEvidence, ResetProof, SelfFenceTimes, WatcherEvidence, reset_proof,
    };
    use proptest::prelude::*;

    /// n2 without a BMC, self-fencing, silent since T0.
    fn state(times: Option<SelfFenceTimes>, evidence: Option<ResetEvidence>) -> FenceState {
        let mut s = super::state();
        s.plans.insert(
            "n2".into(),
            PlanSummary {
                isolation: None,
                power_management: None,
                power_on: None,
                recovery: limits(0),
                self_fence: true,
                kdump: false,
            },
        );
        s.liveness.insert("n2".into(), down(T0));
        s.self_fence
            .insert("n2".into(), SelfFenceFacts { times, evidence });
        s
    }

    fn times(watchdog_s: Nanos) -> SelfFenceTimes {
        SelfFenceTimes {
            lost_after: 2 * S,
            heartbeat: S / 2,
            feed_every: S,
            isolation: 5 * S,
            watchdog_timeout: watchdog_s * S,
            master_lost_after: 4 * S,
        }
    }

    /// The master last heard n2 at T0 + 1 s; both its watchers have said "lost" from T0 until
    /// `until`.
    fn evidence(until: Nanos) -> ResetEvidence {
        let lost = WatcherEvidence {
            hears_at: None,
            lost: Some(LostRun { from: T0, until }),
        };
        ResetEvidence {
            master_heard: Some(T0 + S),
            leading_since: 0,
            watchers: vec![lost, lost],
        }
    }

    fn set_evidence(s: &mut FenceState, e: Option<ResetEvidence>) {
        s.self_fence.get_mut("n2").expect("facts").evidence = e;
    }

    /// Start, mark (the step's attempt succeeds) and return the marked flow.
    fn marked(s: &mut FenceState, now: Nanos) -> Flow {
        let a = decide_fencing(s, now);
        let f = started(&a).pop().expect("a flow");
        assert_eq!(f.step, Step::SelfFence);
        assert_eq!(runs(&a), [Step::SelfFence]);
        let running = saved(&a);
        saved(&tick(s, &with_result(&running, true), now))
    }

    #[test]
    fn without_a_bmc_the_flow_marks_the_node_and_releases_only_once_its_reset_is_proven() {
        let t = times(10);
        let mut s = state(Some(t), Some(evidence(T0 + 6 * S)));
        let f = marked(&mut s, T0 + 6 * S);
        assert!(f.marked && !f.fenced());
        // Quiet from T0 + 5 s (the master's echo of a view taken before T0 + 1 s counts 4 s).
        let reset_by = T0 + 5 * S + t.after_quiet(s.policy.self_fence_margin);
        let f = saved(&tick(&mut s, &f, T0 + 7 * S));
        assert_eq!(f.safe_until, Some(reset_by), "an estimate");
        assert!(!f.safe_proven);
        assert_eq!(f.safe_time_ms, Some(21_000));
        // The watchers' "lost" views do not cover the quiet window yet: never fenced, however
        // long it waits.
        assert!(tick(&mut s, &f, reset_by + 60 * S).is_empty());
        set_evidence(&mut s, Some(evidence(T0 + 11 * S)));
        let f = saved(&tick(&mut s, &f, T0 + 11 * S));
        assert!(f.safe_proven && !f.fenced());
        assert_eq!(f.safe_until, Some(reset_by));
        assert!(tick(&mut s, &f, reset_by - 1).is_empty());
        let f = saved(&tick(&mut s, &f, reset_by));
        assert!(f.fenced());
        let a = tick(&mut s, &f, reset_by);
        assert!(a.iter().any(
            |x| matches!(x, FenceAction::Effect(Effect::Release { node, .. }) if node == "n2")
        ));
    }

    #[test]
    fn only_a_real_answer_stands_a_self_fence_down_not_a_probe_that_merely_has_not_yet_failed_twice()
     {
        let t = times(10);
        let mut s = state(Some(t), Some(evidence(T0 + 7 * S)));
        let f = marked(&mut s, T0 + 6 * S);
        // A restarted daemon: one probe missed, not yet silent, but no answer either.
        s.liveness.insert(
            "n2".into(),
            Liveness {
                reachable: true,
                answered: false,
                ..down(T0)
            },
        );
        let a = tick(&mut s, &f, T0 + 7 * S);
        assert!(
            a.iter().all(
                |x| !matches!(x, FenceAction::Record(Record::Save(n)) if n.step == Step::Recovery)
            ),
            "{a:?}"
        );
        s.liveness.insert("n2".into(), up());
        let n = saved(&tick(&mut s, &f, T0 + 8 * S));
        assert_eq!(n.step, Step::Recovery, "a real answer stands it down");
    }

    #[test]
    fn a_new_leader_resumes_a_proven_wait_at_its_recorded_moment() {
        let t = times(10);
        let mut s = state(Some(t), Some(evidence(T0 + 11 * S)));
        let f = marked(&mut s, T0 + 6 * S);
        let f = saved(&tick(&mut s, &f, T0 + 11 * S));
        assert!(f.safe_proven);
        let until = f.safe_until.expect("the wait is recorded");
        // A restart or a failover: the new leader holds no view of the silent node, nor any
        // evidence (it has led for a moment only).
        s.self_fence.clear();
        assert!(tick(&mut s, &f, T0 + 12 * S).is_empty(), "nothing changes");
        assert!(tick(&mut s, &f, until - 1).is_empty(), "not earlier");
        let done = saved(&tick(&mut s, &f, until));
        assert!(done.fenced() && done.status != FenceStatus::Error);
        assert_eq!(done.fenced_at, Some(until), "not later");
    }

    #[test]
    fn a_proven_wait_is_kept_on_the_boot_clock_and_another_boot_proves_it_again() {
        let t = times(10);
        let mut s = state(Some(t), Some(evidence(T0 + 11 * S)));
        let f = marked(&mut s, T0 + 6 * S);
        let f = saved(&tick(&mut s, &f, T0 + 11 * S));
        let until = f.safe_until.expect("the proven moment");
        let at = f.safe_boot.expect("kept on the boot clock");
        assert_eq!((at.boot, at.ns), (crate::testing::TEST_BOOT, until));
        // The same boot, read by a process whose steady timeline is 30 s off the last one's
        // (its offset lost): the boot clock decides, and the moment shown follows it.
        s.self_fence.clear();
        let mut shifted = f.clone();
        shifted.safe_until = Some(until + 30 * S);
        s.flows = vec![shifted.clone()];
        s.boot.ns = until - 2 * S;
        let a = decide_fencing(&s, T0 + 100 * S);
        let moved = saved(&a);
        assert_eq!(moved.safe_until, Some(T0 + 102 * S), "{a:?}");
        assert!(!moved.fenced());
        s.flows = vec![moved];
        s.boot.ns = until;
        assert!(saved(&decide_fencing(&s, T0 + 102 * S)).fenced());
        // Another boot: its clock says nothing about this one's; the reset is proven again,
        // never counted on the recorded moment.
        s.boot = crate::verdict::BootInstant {
            boot: uuid::Uuid::from_u128(2),
            ns: until + 3600 * S,
        };
        s.flows = vec![f.clone()];
        let again = saved(&decide_fencing(&s, until + 60 * S));
        assert!(!again.safe_proven && !again.fenced() && again.safe_boot.is_none());
        assert!(
            again
                .history
                .iter()
                .any(|h| h.note.contains("proven by another boot")),
            "{:?}",
            again.history
        );
        // A flow recorded before the boot clock was kept (no `safe-boot`) proves again too.
        let mut legacy = f.clone();
        legacy.safe_boot = None;
        assert!(!saved(&tick(&mut s, &legacy, until + 60 * S)).safe_proven);
    }

    #[test]
    fn an_unproven_wait_is_proven_again_by_a_new_leader_from_its_own_start() {
        let t = times(10);
        let mut s = state(Some(t), Some(evidence(T0 + 7 * S)));
        let f = marked(&mut s, T0 + 6 * S);
        let f = saved(&tick(&mut s, &f, T0 + 7 * S));
        assert!(!f.safe_proven);
        // The new leader never saw the node's report (it keeps the times from the flow) and
        // leads from T0 + 20 s: echoes an earlier leader sent are older than that.
        s.self_fence.insert(
            "n2".into(),
            SelfFenceFacts {
                times: None,
                evidence: None,
            },
        );
        assert!(
            tick(&mut s, &f, T0 + 20 * S).is_empty(),
            "no evidence, no proof"
        );
        let mut e = evidence(T0 + 40 * S);
        e.master_heard = None;
        e.leading_since = T0 + 20 * S;
        set_evidence(&mut s, Some(e.clone()));
        let f = saved(&tick(&mut s, &f, T0 + 40 * S));
        assert!(f.safe_proven);
        let ResetProof::Proven { reset_by, .. } =
            reset_proof(&e, &t, s.policy.self_fence_margin, T0 + 40 * S)
        else {
            panic!("proven")
        };
        assert_eq!(f.safe_until, Some(reset_by));
        assert_eq!(
            reset_by,
            T0 + 24 * S + t.after_quiet(s.policy.self_fence_margin)
        );
        // Without times in the flow and without a report, still nothing is ever released.
        let mut bare = f.clone();
        bare.self_fence_times = None;
        bare.safe_proven = false;
        bare.safe_until = None;
        s.self_fence.clear();
        let refused = saved(&tick(&mut s, &bare, T0 + 90 * S));
        assert_eq!(refused.status, FenceStatus::Error);
        assert!(!refused.fenced());
    }

    proptest! {
        /// Whatever the evidence and the ticks, a self-fencing node is counted reset only with a
        /// reported watchdog and only once the evidence proves it reset by then.
        #[test]
        fn never_fenced_early_or_without_a_reported_watchdog(
            watchdog_s in 1i64..60,
            armed in any::<bool>(),
            heard_after in 0i64..30,
            lost_until in 0i64..80,
            hears in prop::option::of(0i64..30),
            ticks in proptest::collection::vec(0i64..120, 1..12),
        ) {
            let t = times(watchdog_s);
            let mut e = evidence(T0 + lost_until * S);
            e.master_heard = Some(T0 + heard_after * S);
            e.watchers[0].hears_at = hears.map(|h| T0 + h * S);
            let mut s = state(armed.then_some(t), Some(e.clone()));
            let mut f = marked(&mut s, T0 + 6 * S);
            let mut ticks = ticks;
            ticks.sort();
            for dt in ticks {
                let now = T0 + 6 * S + dt * S;
                if f.status == FenceStatus::Final { break; }
                let a = tick(&mut s, &f, now);
                if let Some(FenceAction::Record(Record::Save(n))) = a.iter().rev().find(|x| matches!(x, FenceAction::Record(Record::Save(_)))) {
                    f = n.clone();
                }
                if f.fenced() {
                    prop_assert!(armed);
                    let proof = reset_proof(&e, &t, s.policy.self_fence_margin, now);
                    prop_assert!(
                        matches!(proof, ResetProof::Proven { reset_by, .. } if reset_by <= now),
                        "{proof:?} at {now}"
                    );
                }
            }
        }
    }
}

mod requests {
    use super::*;

    fn request(node: &str, n: u128) -> FenceRequest {
        FenceRequest {
            id: Uuid::from_u128(n),
            node: node.into(),
            by: format!("NodeFence/{node}-manual"),
            held: None,
        }
    }

    fn holds(a: &[FenceAction]) -> Vec<(Uuid, String, bool)> {
        a.iter()
            .filter_map(|x| match x {
                FenceAction::Record(Record::Hold {
                    request,
                    why,
                    refused,
                }) => Some((*request, why.clone(), *refused)),
                _ => None,
            })
            .collect()
    }

    /// An operator's fence of a live node runs the whole flow: the node's answers never stand
    /// it down, only a cancel does, and it returns only on a healthy report after the off.
    #[test]
    fn a_request_fences_a_live_node_and_only_a_cancel_or_proof_of_health_ends_it() {
        let mut s = state();
        s.requests = vec![request("n2", 9)];
        s.liveness.get_mut("n2").unwrap().boot = booted(B1, T0 - S, 4);
        let a = decide_fencing(&s, T0);
        let f = &started(&a)[0];
        assert_eq!(f.boot_before, Some(B1));
        assert_eq!(f.id, Uuid::from_u128(9), "the flow takes the request's id");
        assert_eq!(f.node, "n2");
        assert_eq!(f.status, FenceStatus::Running);
        assert_eq!(f.witnesses.manual.as_deref(), Some("NodeFence/n2-manual"));
        assert!(f.history[0].note.contains("requested by an operator"));
        assert_eq!(runs(&a), [Step::PowerManagement]);
        s.requests.clear();

        // The node answers throughout: the power-off still goes on.
        let mut f = saved(&tick(&mut s, &with_result(f, false), T0 + S));
        assert_eq!(f.status, FenceStatus::New, "a retry, not a stand-down");
        f = saved(&tick(&mut s, &f, T0 + 3 * S));
        assert_eq!(f.status, FenceStatus::Running);
        let off = saved(&tick(&mut s, &with_result(&f, true), T0 + 4 * S));
        assert!(off.fenced());
        // Released, then recovery waits for a healthy report diagnosed after the power-off.
        let mut r = off.clone();
        r.released_at = Some(T0 + 5 * S);
        r = saved(&tick(&mut s, &r, T0 + 5 * S));
        assert_eq!((r.step, r.status), (Step::Recovery, FenceStatus::New));
        let mut l = up();
        l.boot = booted(B1, T0 + 2 * S, 5);
        s.liveness.insert("n2".into(), l);
        assert!(
            runs(&tick(&mut s, &r, T0 + 6 * S)).is_empty(),
            "a report from before the off proves nothing"
        );
        l.boot = booted(B2, T0 + 6 * S, 3);
        s.liveness.insert("n2".into(), l);
        r = saved(&tick(&mut s, &r, T0 + 7 * S));
        assert_eq!(runs(&tick(&mut s, &r, T0 + 7 * S)), [Step::Recovery]);

        // A cancel before the power-off does stand it down.
        let mut s = state();
        s.requests = vec![request("n2", 10)];
        let mut f = started(&decide_fencing(&s, T0))[0].clone();
        s.requests.clear();
        f = saved(&tick(&mut s, &with_result(&f, false), T0 + S));
        f.cancel(T0 + 2 * S).unwrap();
        let end = saved(&tick(&mut s, &f, T0 + 3 * S));
        assert_eq!(
            (end.step, end.status, end.marked),
            (Step::Recovery, FenceStatus::New, true),
            "its power-off attempt marked the node: recovery clears the mark"
        );
        // While the power-off runs, a cancel is refused: it goes to its verified end.
        let mut running = started(&decide_fencing(
            &{
                let mut s = state();
                s.requests = vec![request("n2", 11)];
                s
            },
            T0,
        ))[0]
            .clone();
        assert_eq!(running.cancel(T0 + S), Err(CancelRefused::PowerOffRunning));
    }

    /// Requests pass the gates automatic flows pass; the reason is written once per change, and
    /// a request that can never run is refused for good.
    #[test]
    fn requests_wait_at_every_gate_and_are_refused_when_they_can_never_run() {
        let mut s = state();
        s.requests = vec![request("n7", 1)];
        assert_eq!(
            holds(&decide_fencing(&s, T0)),
            [(
                Uuid::from_u128(1),
                "n7 has no fence configuration".to_string(),
                true
            )]
        );
        s.plans.insert(
            "n7".into(),
            PlanSummary {
                power_management: None,
                self_fence: true,
                kdump: false,
                ..plan(false)
            },
        );
        let h = holds(&decide_fencing(&s, T0));
        assert!(h[0].2 && h[0].1.contains("watchdog"), "{h:?}");

        s.requests = vec![request("n1", 2)];
        s.policy.paused = true;
        let h = holds(&decide_fencing(&s, T0));
        assert_eq!(
            h,
            [(Uuid::from_u128(2), "fencing is paused".to_string(), false)]
        );
        assert!(started(&decide_fencing(&s, T0)).is_empty());
        // The same reason, already recorded, is not written again.
        s.requests[0].held = Some("fencing is paused".into());
        assert!(holds(&decide_fencing(&s, T0)).is_empty());
        s.policy.paused = false;

        for i in 4..8 {
            s.liveness.insert(format!("n{i}"), down(T0));
        }
        let h = holds(&decide_fencing(&s, T0 + S));
        assert!(
            h[0].1.starts_with("fencing storm: 4 of 10") && !h[0].2,
            "{h:?}"
        );
        for i in 4..8 {
            s.liveness.insert(format!("n{i}"), up());
        }

        // One flow in flight already (the cap is 1): the request waits, then starts.
        let mut other = state();
        other.liveness.insert("n3".into(), down(T0));
        let running = started(&decide_fencing(&other, T0 + 5 * S))[0].clone();
        s.flows = vec![running.clone()];
        let h = holds(&decide_fencing(&s, T0 + 6 * S));
        assert!(h[0].1.contains("max-in-flight 1") && !h[0].2, "{h:?}");
        // A flow already on the node refuses the request: the node is being fenced.
        s.requests = vec![request("n3", 3)];
        let h = holds(&decide_fencing(&s, T0 + 6 * S));
        assert!(h[0].1.contains("already runs on n3") && h[0].2, "{h:?}");
        s.flows.clear();
        s.requests = vec![request("n1", 2)];
        assert_eq!(
            started(&decide_fencing(&s, T0 + 6 * S))[0].id,
            Uuid::from_u128(2)
        );
    }
}

mod kdump {
    use super::*;

    fn releases(a: &[FenceAction]) -> usize {
        a.iter()
            .filter(|x| matches!(x, FenceAction::Effect(Effect::Release { .. })))
            .count()
    }

    /// A kdump notification heard after the node went silent releases its workloads at once;
    /// the power-off waits for the dump, then runs as ever (n2 has no isolation).
    #[test]
    fn a_notification_releases_at_once_and_holds_the_power_off_for_the_dump() {
        let mut s = state();
        s.liveness.insert("n2".into(), down(T0));
        let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
        assert_eq!(f.step, Step::PowerManagement);
        // The running attempt fails; a retry is due in a second.
        f = saved(&tick(&mut s, &with_result(&f, false), T0 + 6 * S));
        assert_eq!(f.status, FenceStatus::New);
        // A notification from before the node went silent proves nothing.
        s.kdump.insert("n2".into(), T0 - S);
        assert!(
            tick(&mut s, &f, T0 + 6 * S).iter().all(
                |a| !matches!(a, FenceAction::Record(Record::Save(n)) if n.kdump_at.is_some())
            )
        );
        s.kdump.insert("n2".into(), T0 + 6 * S);
        f = saved(&tick(&mut s, &f, T0 + 6 * S));
        assert_eq!(f.kdump_at, Some(T0 + 6 * S));
        assert!(f.history.last().unwrap().note.contains("crash kernel"));
        // Released now, before any power-off; the retry of the power-off waits for the dump.
        let a = tick(&mut s, &f, T0 + 7 * S);
        assert_eq!(releases(&a), 1);
        assert!(runs(&a).is_empty(), "power-off held during the dump: {a:?}");
        f.release_result = Some(Outcome::done("released"));
        f = saved(&tick(&mut s, &f, T0 + 8 * S));
        assert!(f.released() && !f.fenced());
        assert!(
            runs(&tick(&mut s, &f, T0 + 35 * S)).is_empty(),
            "30 s dump timeout"
        );
        let a = tick(&mut s, &f, T0 + 37 * S);
        assert_eq!(runs(&a), [Step::PowerManagement]);
        f = saved(&a);
        // Verified off: nothing to release again; recovery.
        f = saved(&tick(&mut s, &with_result(&f, true), T0 + 38 * S));
        assert!(f.fenced());
        let a = tick(&mut s, &f, T0 + 38 * S);
        assert_eq!(releases(&a), 0);
        assert_eq!(saved(&a).step, Step::Recovery);
    }

    /// n2 with `kdump = true`: its power-off waits for the kdump window after it went silent.
    fn kdump_node() -> FenceState {
        let mut s = state();
        s.plans.get_mut("n2").unwrap().kdump = true;
        s.liveness.insert("n2".into(), down(T0));
        s
    }

    #[test]
    fn no_power_off_before_the_kdump_window_has_decided_and_a_notification_in_it_sends_none() {
        let mut s = kdump_node();
        let a = decide_fencing(&s, T0 + 5 * S);
        assert!(runs(&a).is_empty(), "not at the start: {a:?}");
        let mut f = started(&a).pop().expect("a flow");
        assert_eq!(
            (f.step, f.status),
            (Step::PowerManagement, FenceStatus::New)
        );
        // Said once, and held for the whole window (20 s after it went silent, at T0).
        f = saved(&tick(&mut s, &f, T0 + 6 * S));
        assert!(
            f.history
                .last()
                .unwrap()
                .note
                .contains("kdump notification")
        );
        for t in [7, 12, 19] {
            assert!(tick(&mut s, &f, T0 + t * S).is_empty(), "at {t} s");
        }
        // A notification within it: released at once, and still no power-off, for the dump.
        s.kdump.insert("n2".into(), T0 + 15 * S);
        f = saved(&tick(&mut s, &f, T0 + 19 * S));
        assert_eq!(f.kdump_at, Some(T0 + 15 * S));
        let a = tick(&mut s, &f, T0 + 19 * S);
        assert_eq!(releases(&a), 1);
        f.release_result = Some(Outcome::done("released"));
        f = saved(&tick(&mut s, &f, T0 + 20 * S));
        assert!(f.released() && !f.fenced());
        for t in [21, 30, 44] {
            assert!(runs(&tick(&mut s, &f, T0 + t * S)).is_empty(), "at {t} s");
        }
    }

    #[test]
    fn silence_for_the_whole_kdump_window_lets_the_power_off_proceed() {
        let mut s = kdump_node();
        let mut f = started(&decide_fencing(&s, T0 + 5 * S))
            .pop()
            .expect("a flow");
        f = saved(&tick(&mut s, &f, T0 + 6 * S));
        assert!(runs(&tick(&mut s, &f, T0 + 20 * S - 1)).is_empty());
        let a = tick(&mut s, &f, T0 + 20 * S);
        assert_eq!(runs(&a), [Step::PowerManagement]);
        // A notification while that power-off runs: the node is released, and the attempt is
        // not started again while the dump runs, whatever its outcome.
        f = saved(&a);
        s.kdump.insert("n2".into(), T0 + 21 * S);
        f = saved(&tick(&mut s, &f, T0 + 21 * S));
        assert!(f.kdump_at.is_some());
        f = saved(&tick(&mut s, &with_result(&f, false), T0 + 22 * S));
        for t in [23, 40, 50] {
            assert!(runs(&tick(&mut s, &f, T0 + t * S)).is_empty(), "at {t} s");
        }
    }

    /// n2 silent since T0, its first power-off failed, then a kdump notification: released.
    fn released_after_a_kdump() -> (FenceState, Flow) {
        let mut s = state();
        s.liveness.insert("n2".into(), down(T0));
        let mut f = saved(&decide_fencing(&s, T0 + 5 * S));
        f = saved(&tick(&mut s, &with_result(&f, false), T0 + 6 * S));
        s.kdump.insert("n2".into(), T0 + 6 * S);
        f = saved(&tick(&mut s, &f, T0 + 6 * S));
        f.release_result = Some(Outcome::done("released"));
        f = saved(&tick(&mut s, &f, T0 + 7 * S));
        assert!(f.released());
        (s, f)
    }

    /// Released after a kdump notification, then canceled while the node stays in its crash
    /// kernel: the release is undone and the flow ends, without waiting for a return.
    #[test]
    fn a_canceled_flow_released_after_a_kdump_ends_without_the_nodes_return() {
        let (mut s, mut f) = released_after_a_kdump();
        f.cancel(T0 + 8 * S).unwrap();
        f = saved(&tick(&mut s, &f, T0 + 9 * S));
        assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
        let a = tick(&mut s, &f, T0 + 10 * S);
        assert_eq!(runs(&a), [Step::Recovery], "not held for a return: {a:?}");
        f = saved(&tick(&mut s, &with_result(&saved(&a), true), T0 + 11 * S));
        let a = tick(&mut s, &f, T0 + 12 * S);
        assert!(
            a.iter()
                .any(|x| matches!(x, FenceAction::Effect(Effect::Reclaim { .. }))),
            "{a:?}"
        );
        f = saved(&a);
        f.reclaim_result = Some(Outcome::done("reclaimed"));
        f = saved(&tick(&mut s, &f, T0 + 13 * S));
        assert_eq!(f.status, FenceStatus::Final, "{:#?}", f.history);
        assert!(f.canceled);
    }

    /// The node reboots after its dump and answers before the power-off: its released workloads
    /// are reclaimed through recovery (never left released), once a report diagnosed after the
    /// notification is healthy.
    #[test]
    fn a_node_back_after_its_dump_goes_through_recovery() {
        let (mut s, mut f) = released_after_a_kdump();
        let mut l = up();
        l.boot = booted(B1, T0 + 5 * S, 3);
        s.liveness.insert("n2".into(), l);
        f = saved(&tick(&mut s, &f, T0 + 10 * S));
        assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
        assert!(
            runs(&tick(&mut s, &f, T0 + 11 * S)).is_empty(),
            "a report from before the dump"
        );
        // The crash kernel rebooted the node: a new boot, healthy.
        l.boot = booted(B2, T0 + 11 * S, 3);
        s.liveness.insert("n2".into(), l);
        f = saved(&tick(&mut s, &f, T0 + 12 * S));
        assert_eq!(f.returned_boot, Some(B2));
        assert_eq!(runs(&tick(&mut s, &f, T0 + 12 * S)), [Step::Recovery]);
    }
}

/// The return to service under a network that delays (up to any window), duplicates, reorders
/// or withholds reports: reports from the boot before the fence never return the node, and the
/// healthy count never exceeds the distinct healthy diagnoses of the new boot.
mod return_proof {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_order_or_repeat_of_reports_returns_a_node_without_a_new_boot(
            // (from the new boot?, diagnose time in s after T0, healthy?)
            reports in proptest::collection::vec((any::<bool>(), 0i64..60, any::<bool>()), 0..24),
        ) {
            let mut s = state();
            s.liveness.insert(
                "n2".into(),
                Liveness { boot: booted(B1, T0 - S, 9), ..down(T0) },
            );
            let f = fenced_flow(&mut s);
            let new_booted_at = T0 + 20 * S;
            let mut seen: Option<BootSeen> = booted(B1, T0 - S, 9);
            for (new, at, healthy) in &reports {
                let boot = if *new { (B2, new_booted_at) } else { (B1, T0 - S) };
                seen = observe_report(seen, Some(boot), T0 + at * S, *healthy);
                let b = seen.unwrap();
                // Counted only once per diagnose, only after its boot.
                let distinct: std::collections::BTreeSet<i64> = reports
                    .iter()
                    .filter(|(n, t, h)| *n && *h && T0 + t * S > new_booted_at)
                    .map(|(_, t, _)| *t)
                    .collect();
                if b.id == B2 {
                    prop_assert!(b.clean as usize <= distinct.len());
                }
                s.liveness.insert("n2".into(), Liveness { boot: seen, ..up() });
                // Past the new boot's milestone, so the proof itself decides.
                let mut g = f.clone();
                g.returned_boot = (b.id == B2).then_some(B2);
                let a = tick(&mut s, &g, T0 + 70 * S);
                let returns = !runs(&a).is_empty()
                    || a.iter().any(|x| matches!(x, FenceAction::Effect(Effect::Reclaim { .. })));
                if b.id == B1 {
                    // The old boot never returns the node; once diagnosed after the off it
                    // is the alarm.
                    prop_assert!(!returns, "{a:?}");
                    let alarm = a.iter().any(|x| matches!(x, FenceAction::Effect(Effect::Alarm { .. })));
                    prop_assert_eq!(alarm, b.reported_at > f.fenced_at.unwrap());
                } else {
                    prop_assert_eq!(returns, b.clean >= s.policy.clean_reports, "{:?}", a);
                }
            }
        }
    }
}

/// An operator's cancel ends the flow, final and canceled, whether or not the node ever comes
/// back: nothing waits for the return of a node that was never powered off.
#[test]
fn a_canceled_flow_ends_while_its_node_stays_dead() {
    for isolation in [true, false] {
        let mut s = state();
        let node = if isolation { "n1" } else { "n2" };
        s.liveness.insert(node.into(), down(T0));
        let a = decide_fencing(&s, T0 + 5 * S);
        let mut f = saved(&a);
        if isolation {
            // Isolated, then canceled before the power-off.
            f = saved(&tick(&mut s, &with_result(&f, true), T0 + 6 * S));
        }
        let mut f2 = f.clone();
        if f2.status == FenceStatus::Running {
            // The running attempt goes to its end first (a power-off here fails).
            f2 = saved(&tick(&mut s, &with_result(&f2, false), T0 + 6 * S));
        }
        f2.cancel(T0 + 7 * S).unwrap();
        let mut f = f2;
        let mut t = 7;
        while f.status != FenceStatus::Final && t < 600 {
            let a = tick(&mut s, &f, T0 + t * S);
            for x in &a {
                match x {
                    FenceAction::Effect(Effect::RunStep { .. }) => f = with_result(&f, true),
                    FenceAction::Effect(Effect::Reclaim { .. }) => {
                        f.reclaim_result = Some(Outcome::done("ok"))
                    }
                    _ => {}
                }
            }
            if let Some(n) = a.iter().rev().find_map(|x| match x {
                FenceAction::Record(Record::Save(n)) => Some(n.clone()),
                _ => None,
            }) {
                let (r, rr) = (f.result.clone(), f.reclaim_result.clone());
                f = n;
                f.result = f.result.clone().or(r);
                f.reclaim_result = f.reclaim_result.clone().or(rr);
            }
            t += 1;
        }
        assert_eq!(f.status, FenceStatus::Final, "{node}: {:#?}", f.history);
        assert!(f.canceled && !f.fenced() && !f.released());
    }
}

mod maintenance;
