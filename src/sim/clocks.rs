//! Scenarios of the master's clocks on the simulated-time harness: its wall clock stepped
//! forward and back by any amount at any moment, a restart on the same boot after such a step,
//! a reboot of the master. The release never comes before the node's reset, and no step holds
//! a dead node's fence. Times are judged on the simulation's true clock, which nothing steps.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use maintd_core::fencing::machine::Step;

const S: Nanos = 1_000_000_000;
const MIN: Duration = Duration::from_secs(60);
/// At the defaults, the least a self-fencing node's release can follow its death by (see
/// `selffence.rs`): master-lost-after 4, isolation 5, feed 1, watchdog 10, margin 5.
const SAFE: Nanos = 25 * S;

fn options(power: bool) -> SimOptions {
    SimOptions {
        nodes: 5,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        self_fence: vec!["node2".into()],
        no_power: if power { vec![] } else { vec!["node2".into()] },
        ..SimOptions::default()
    }
}

/// node2's released flow, and when it was released on the true clock.
async fn released(sim: &Sim, within: Duration) -> (Flow, Nanos) {
    let f = sim
        .until("the release", within, |s| {
            s.flows().into_iter().find(|f| f.released())
        })
        .await;
    // The steady timeline and the true clock differ only by what restarts re-anchored.
    let shift = sim.clock.now() - sim.clock.true_now();
    let at = f.released_at.expect("released at") - shift;
    (f, at)
}

/// node2 (self-fencing, its watchdog armed) dies 10 s in; returns the sim and when it died.
async fn dying(o: SimOptions) -> (Sim, Nanos) {
    let sim = Sim::start(o);
    sim.collectors.arm_watchdog("node2");
    sim.run_for(Duration::from_secs(10)).await;
    let died = sim.clock.true_now();
    sim.collectors.silence("node2");
    (sim, died)
}

/// node2 dies 10 s in; the master's wall clock steps by each `(after, by)` (seconds after the
/// death). Returns how long after the death, on the true clock, node2 was released.
async fn release_with_steps(power: bool, steps: &[(u64, i64)]) -> Nanos {
    let (sim, died) = dying(options(power)).await;
    let mut steps = steps.to_vec();
    steps.sort_unstable();
    for (after, by) in steps {
        let at = died + after as Nanos * S;
        let wait = at - sim.clock.true_now();
        if wait > 0 {
            sim.run_for(Duration::from_nanos(wait as u64)).await;
        }
        sim.clock.step_wall(by * S);
    }
    let (f, at) = released(&sim, 2 * MIN).await;
    if !power {
        assert!(f.safe_proven, "{:?}", f.history);
    }
    sim.stop().await;
    at - died
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// However the master's wall clock steps, and whenever: a self-fencing node is released
    /// only after its watchdog has reset it (the proof's whole wait, on the true clock), and a
    /// node with a BMC only after its verified off; neither later than without a step.
    #[test]
    fn no_step_of_the_masters_wall_clock_moves_a_release(
        power in any::<bool>(),
        steps in prop::collection::vec((0u64..40, -300i64..300), 1..4),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let after = rt.block_on(release_with_steps(power, &steps));
        let calm = rt.block_on(release_with_steps(power, &[]));
        if !power {
            prop_assert!(after >= SAFE, "released {:.1} s after the death", after as f64 / 1e9);
        }
        // The same decisions at the same true moments, step or no step (a tick apart at most).
        prop_assert!(
            (after - calm).abs() <= 2 * S,
            "released {:.1} s after the death with the steps, {:.1} s without",
            after as f64 / 1e9,
            calm as f64 / 1e9
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_on_the_same_boot_after_a_step_resumes_a_proven_wait_at_its_true_moment() {
    let (mut sim, died) = dying(options(false)).await;
    let f = sim
        .until("the proof", MIN, |s| {
            s.flows().into_iter().find(|f| f.safe_proven)
        })
        .await;
    let proven_at = f.safe_until.expect("the proven moment");
    assert!(f.safe_boot.is_some(), "kept on the boot clock");
    assert!(!f.released());
    // The wall clock jumps 30 s ahead, and the daemon restarts: its steady timeline now reads
    // 30 s later than the last one's, which would release 30 s early on the recorded moment.
    sim.clock.step_wall(30 * S);
    sim.restart().await;
    let (f, at) = released(&sim, MIN).await;
    assert!(at - died >= SAFE, "{:.1} s", (at - died) as f64 / 1e9);
    assert!(
        (at - proven_at).abs() <= 2 * S,
        "released {:.1} s from the proven moment",
        (at - proven_at) as f64 / 1e9
    );
    assert!(f.safe_proven);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_proven_on_another_boot_of_the_master_is_proven_again() {
    let (mut sim, _) = dying(options(false)).await;
    let f = sim
        .until("the proof", MIN, |s| {
            s.flows().into_iter().find(|f| f.safe_proven)
        })
        .await;
    let proven_at = f.safe_until.expect("the proven moment");
    // The master reboots and its wall clock comes back 10 minutes ahead.
    sim.clock.reboot();
    sim.clock.step_wall(600 * S);
    sim.restart().await;
    let back = sim.clock.true_now();
    let (f, at) = released(&sim, 2 * MIN).await;
    assert!(
        f.history
            .iter()
            .any(|t| t.note.contains("proven by another boot of the master")),
        "{:?}",
        f.history
    );
    assert!(f.safe_proven);
    // Proven again from the new start: the quiet window begins master-lost-after after it.
    assert!(at >= proven_at, "never earlier than the first proof");
    assert!(
        at >= back + SAFE,
        "released {:.1} s after the reboot",
        (at - back) as f64 / 1e9
    );
    assert!(at <= back + SAFE + 5 * S);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_restart_before_the_proof_proves_from_its_own_start_and_says_the_new_estimate() {
    let (mut sim, died) = dying(options(false)).await;
    let f = sim
        .until("the wait", MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.step == Step::SelfFence && f.safe_until.is_some())
        })
        .await;
    assert!(!f.safe_proven);
    sim.run_for(Duration::from_secs(2)).await;
    assert!(!sim.flows()[0].safe_proven, "restarted before the proof");
    // Restarted with the wall clock stepped back a minute.
    sim.clock.step_wall(-60 * S);
    sim.restart().await;
    let back = sim.clock.true_now();
    let (f, at) = released(&sim, 2 * MIN).await;
    assert!(at - died >= SAFE);
    // The bound docs/fencing.md gives: master-lost-after + the quiet window + watchdog +
    // margin after the new process leads, and a probe interval or two of slack.
    assert!(
        at <= back + SAFE + 3 * S,
        "released {:.1} s after the restart",
        (at - back) as f64 / 1e9
    );
    assert!(
        f.history.iter().any(|t| t
            .note
            .contains("proving the reset again from this process's start")),
        "{:?}",
        f.history
    );
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_node_is_fenced_on_time_while_the_masters_wall_clock_is_a_minute_ahead() {
    for by in [60, -60] {
        let sim = Sim::start(options(true));
        sim.collectors.arm_watchdog("node2");
        sim.run_for(Duration::from_secs(10)).await;
        sim.clock.step_wall(by * S);
        sim.run_for(Duration::from_secs(5)).await;
        let died = sim.clock.true_now();
        sim.collectors.silence("node2");
        let (f, at) = released(&sim, MIN).await;
        assert!(f.fenced(), "{:?}", f.history);
        assert!(
            at - died <= 15 * S,
            "step {by} s: released {:.1} s after the death",
            (at - died) as f64 / 1e9
        );
        sim.stop().await;
    }
}
