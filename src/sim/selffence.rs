//! Scenarios of self-fencing, the master's side, on the simulated-time harness: mark, prove the
//! reset from what the master received of the node and its watchers, release; never without a
//! signed report of an armed watchdog; the fallback from a failed power-off.

use std::time::Duration;

use super::*;
use maintd_core::fencing::machine::{FenceStatus, Step};

const S: Nanos = 1_000_000_000;
const MIN: Duration = Duration::from_secs(60);
/// At the defaults, the least a release can follow a death by: the watchers' views hear the node
/// until its death at least, and a beat they vouched for counts master-lost-after 4 s; then the quiet
/// window (isolation 5 + feed 1), the watchdog 10 and the margin 5.
const SAFE: Nanos = 25_000_000_000;

fn options(self_fence: &[&str], no_power: &[&str]) -> SimOptions {
    SimOptions {
        nodes: 5,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        self_fence: self_fence.iter().map(|s| s.to_string()).collect(),
        no_power: no_power.iter().map(|s| s.to_string()).collect(),
        ..SimOptions::default()
    }
}

fn jobs_of(sim: &Sim, node: &str) -> Vec<String> {
    sim.cluster
        .jobs()
        .into_iter()
        .filter(|j| j.ends_with(&format!(" {node}")))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_dead_self_fencing_node_is_marked_and_released_only_after_its_safe_time() {
    let sim = Sim::start(options(&["node2"], &["node2"]));
    sim.collectors.arm_watchdog("node2");
    sim.run_for(Duration::from_secs(10)).await;
    let died = sim.clock.now();
    sim.collectors.silence("node2");
    let f = sim
        .until("the release", 2 * MIN, |s| {
            s.flows().into_iter().find(|f| f.released())
        })
        .await;
    assert_eq!(jobs_of(&sim, "node2"), ["mark node2"]);
    assert!(
        sim.agents.calls().is_empty(),
        "no agent for a node without a BMC"
    );
    assert_eq!(f.safe_time_ms, Some(21_000));
    assert!(f.safe_proven);
    let released = f.released_at.unwrap();
    // Proven from the last time anyone heard it, which is at or after the death.
    assert!(
        released >= died + SAFE,
        "{:.1} s",
        (released - died) as f64 / 1e9
    );
    assert!(
        released <= died + SAFE + 5 * S,
        "released {:.1} s after the death",
        (released - died) as f64 / 1e9
    );
    assert!(
        f.history.iter().any(|t| t.note.contains("reset proven")),
        "{:?}",
        f.history
    );
    // It comes back (reset, rebooted): the mark and the release are cleared.
    sim.collectors.reboot("node2");
    let f = sim
        .until("recovery", 2 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.status == FenceStatus::Final)
        })
        .await;
    assert!(f.reclaimed);
    assert_eq!(jobs_of(&sim, "node2"), ["mark node2", "unmark node2"]);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_that_never_reported_an_armed_watchdog_is_never_released() {
    let sim = Sim::start(options(&["node2"], &["node2"]));
    sim.run_for(Duration::from_secs(10)).await;
    sim.collectors.silence("node2");
    sim.run_for(10 * MIN).await;
    let flows = sim.flows();
    assert!(!flows.is_empty());
    assert!(
        flows.iter().all(|f| !f.released() && !f.fenced()),
        "{flows:?}"
    );
    let f = &flows[0];
    assert!(
        f.history
            .iter()
            .any(|t| t.note.contains("no signed report of an armed watchdog")),
        "{:?}",
        f.history
    );
    assert_eq!(sim.cluster.releases(), 0);
    assert!(f.tagged, "the operator is told: fencefailed tag");
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_power_off_falls_back_to_self_fencing_and_without_it_releases_nothing() {
    let sim = Sim::start(options(&["node2"], &[]));
    sim.collectors.arm_watchdog("node2");
    sim.collectors.arm_watchdog("node3");
    sim.run_for(Duration::from_secs(10)).await;
    sim.agents.fail_next("off", 1000);
    let died = sim.clock.now();
    sim.collectors.silence("node2");
    let f = sim
        .until("the release", 3 * MIN, |s| {
            s.flows().into_iter().find(|f| f.released())
        })
        .await;
    assert!(
        f.history
            .iter()
            .any(|t| t.step == Step::SelfFence && t.note.contains("falling back to self-fencing"))
    );
    assert!(f.released_at.unwrap() >= died + SAFE);
    assert!(
        sim.collectors.powered("node2"),
        "no agent ever powered it off"
    );
    // node3 has no self-fence level: its failed power-off ends in error, nothing released.
    sim.collectors.reboot("node2");
    sim.until("node2 recovered", 2 * MIN, |s| {
        s.flows()
            .into_iter()
            .find(|f| f.status == FenceStatus::Final)
    })
    .await;
    sim.collectors.silence("node3");
    sim.run_for(10 * MIN).await;
    let flows: Vec<Flow> = sim
        .flows()
        .into_iter()
        .filter(|f| f.node == "node3")
        .collect();
    assert!(!flows.is_empty());
    assert!(flows.iter().all(|f| !f.released()), "{flows:?}");
    assert_eq!(sim.cluster.releases(), 1);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_self_fencing_node_that_answers_before_its_safe_time_is_unmarked_and_nothing_released() {
    let sim = Sim::start(options(&["node2"], &["node2"]));
    sim.collectors.arm_watchdog("node2");
    sim.run_for(Duration::from_secs(10)).await;
    sim.collectors.silence("node2");
    sim.until("the mark", MIN, |s| {
        s.cluster
            .jobs()
            .contains(&"mark node2".to_string())
            .then_some(())
    })
    .await;
    sim.collectors.answer_again("node2");
    let f = sim
        .until("the stand-down", MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.status == FenceStatus::Final)
        })
        .await;
    assert!(!f.released() && !f.fenced());
    assert_eq!(jobs_of(&sim, "node2"), ["mark node2", "unmark node2"]);
    sim.run_for(Duration::from_secs(3)).await;
    assert!(
        !sim.collectors.marked("node2"),
        "the master no longer marks it"
    );
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_self_fencing_node_without_an_armed_watchdog_shows_fencing_inactive_until_it_arms_one() {
    use crate::fencing::readiness::{FencingState, SELF_FENCE_METHOD};
    let mut o = options(&["node2", "node3"], &["node3"]);
    if let Some(f) = o.fencing.as_mut() {
        f.check_interval = Duration::from_secs(600);
    }
    let sim = Sim::start(o);
    // node2 (BMC and watchdog) is armed; node3 (watchdog only) is not.
    sim.collectors.arm_watchdog("node2");
    let board = sim.readiness.clone().expect("fencing is on");
    let all = sim
        .until("every node judged", MIN, |_| {
            let all = board.all();
            (all.len() == 5).then_some(all)
        })
        .await;
    assert!(
        sim.elapsed_s() < 10.0,
        "judged within seconds of its first view"
    );
    let node3 = &all["node3"];
    assert_eq!(node3.state, FencingState::Inactive);
    assert!(node3.detail.contains("no armed watchdog"), "{node3:?}");
    assert_eq!(node3.methods.len(), 1);
    assert_eq!(node3.methods[0].method, SELF_FENCE_METHOD);
    let node2 = &all["node2"];
    assert_eq!(node2.state, FencingState::Active, "{node2:?}");
    assert!(
        node2
            .methods
            .iter()
            .any(|m| m.method == SELF_FENCE_METHOD && m.ok)
            && node2.methods.iter().any(|m| m.agent == "fence_sim" && m.ok),
        "both levels checked: {node2:?}"
    );
    for n in ["node1", "node4", "node5"] {
        assert_eq!(all[n].state, FencingState::Active, "{n}");
        assert!(all[n].methods.iter().all(|m| m.method != SELF_FENCE_METHOD));
    }
    assert_eq!(sim.cluster.events(), ["node3 FencingInactive"]);
    // The operator enables the watchdog on node3: active again within seconds, said once.
    sim.collectors.arm_watchdog("node3");
    let back = sim
        .until("node3 active", MIN, |_| {
            board
                .get("node3")
                .filter(|c| c.state == FencingState::Active)
        })
        .await;
    assert_eq!(back.detail, "ok");
    sim.run_for(20 * MIN).await;
    assert_eq!(
        sim.cluster.events(),
        ["node3 FencingInactive", "node3 FencingActive"],
        "repeated looks at an unchanged watchdog say nothing"
    );
    assert!(sim.flows().is_empty());
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_canceled_self_fence_ends_while_its_node_stays_dead() {
    let sim = Sim::start(options(&["node2"], &["node2"]));
    sim.collectors.arm_watchdog("node2");
    sim.run_for(Duration::from_secs(10)).await;
    sim.collectors.silence("node2");
    let f = sim
        .until("the mark", MIN, |s| {
            s.flows().into_iter().find(|f| f.marked)
        })
        .await;
    crate::store::FlowStore::cancel(sim.store.as_ref(), &f.id, sim.clock.now())
        .await
        .expect("cancel");
    let f = sim
        .until("the end of the canceled flow", 2 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.status == FenceStatus::Final)
        })
        .await;
    assert!(
        f.canceled && !f.released() && !f.fenced(),
        "{:?}",
        f.history
    );
    assert_eq!(jobs_of(&sim, "node2"), ["mark node2", "unmark node2"]);
    sim.stop().await;
}
