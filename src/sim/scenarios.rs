//! Scenarios that test decisions and timing, run on the simulated-time harness. Each spans
//! simulated minutes; none opens a socket or sleeps.

use std::time::Duration;

use super::*;
use crate::fencing::readiness::FencingState;
use maintd_core::fencing::machine::{FenceStatus, Step, fence_failed_tag};
use maintd_core::repair::{JobStatus, RepairStatus, ready_tag};
use maintd_core::verdict::Status;

const EVAC: &str = r#"{"status":"evacuate","details":{"a":1,"b":2}}"#;
const MIN: Duration = Duration::from_secs(60);

fn secs(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

/// Fencing with fast detection; readiness checks off, so the agents' calls are the flows' own.
fn fencing(grace_s: u64) -> FencingConfig {
    FencingConfig {
        grace: Duration::from_secs(grace_s),
        liveness_interval: Duration::from_secs(1),
        check_interval: Duration::ZERO,
        ..FencingConfig::default()
    }
}

fn job_list(jobs: &[Job]) -> Vec<(JobKind, JobStatus)> {
    jobs.iter().map(|j| (j.kind, j.status)).collect()
}

#[tokio::test(start_paused = true)]
async fn the_same_json_is_one_event_and_a_changed_json_is_a_new_one() {
    let sim = Sim::start(SimOptions::default());
    sim.cluster.fail(JobKind::Evacuate);
    sim.collectors.set_verdict("node1", EVAC);
    let first = sim
        .until("the evacuation to fail", MIN, |s| {
            s.events_of("node1")
                .into_iter()
                .find(|(e, _)| e.status == RepairStatus::Failed)
        })
        .await
        .0;
    // The same JSON with another key order and spacing: the same event.
    sim.collectors.set_verdict(
        "node1",
        r#"{ "details": {"b":2, "a":1}, "status": "evacuate" }"#,
    );
    sim.run_for(MIN).await;
    let evs = sim.events_of("node1");
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].0.id, first.id);
    // Another JSON: a second event, waiting behind the failed one on this node.
    sim.collectors
        .set_verdict("node1", r#"{"status":"evacuate","details":{"a":1,"b":3}}"#);
    let second = sim
        .until("a second event", MIN, |s| {
            s.events_of("node1")
                .into_iter()
                .find(|(e, _)| e.id != first.id)
        })
        .await
        .0;
    assert_eq!(second.original["details"]["b"], 3);
    assert_eq!(second.status, RepairStatus::Noted);
    let note = second.note.clone().unwrap_or_default();
    assert!(note.contains("failed event"), "{note}");
    // It stays waiting: a failed event blocks the node until its tag is removed.
    sim.run_for(5 * MIN).await;
    assert_eq!(sim.cluster.jobs(), vec!["evacuate node1"]);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_more_invasive_report_supersedes_the_event_in_the_next_round() {
    let sim = Sim::start(SimOptions::default());
    sim.cluster
        .job_takes(JobKind::Evacuate, Duration::from_secs(20));
    sim.collectors.set_verdict("node1", EVAC);
    let first = sim
        .until("the evacuation to start", MIN, |s| {
            let started = s.cluster.jobs().contains(&"evacuate node1".to_string());
            s.events_of("node1").into_iter().next().filter(|_| started)
        })
        .await
        .0;
    sim.collectors.set_verdict(
        "node1",
        r#"{"status":"evacuate-failover","details":"dimm"}"#,
    );
    let (second, jobs) = sim
        .until("the failover to complete", 5 * MIN, |s| {
            s.events_of("node1").into_iter().find(|(e, _)| {
                e.action == Status::EvacuateFailover
                    && e.status == RepairStatus::Completed
                    && e.tagged
            })
        })
        .await;
    assert_eq!(
        job_list(&jobs),
        vec![
            (JobKind::EvacuateFailover, JobStatus::Succeeded),
            (JobKind::Offline, JobStatus::Succeeded)
        ]
    );
    // The running evacuation ran to its end; the old event was never offlined.
    assert_eq!(
        sim.cluster.jobs(),
        vec!["evacuate node1", "evacuate-failover node1", "offline node1"]
    );
    let old = sim.store.event(&first.id).expect("store");
    assert!(
        old.as_ref()
            .is_none_or(|(e, _, _)| e.status == RepairStatus::Canceled),
        "{old:?}"
    );
    assert!(
        sim.cluster
            .tags_of("node1")
            .contains(&ready_tag(&second.id))
    );
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_live_repair_runs_once_and_removing_the_ready_tag_acknowledges_it() {
    let sim = Sim::start(SimOptions::default());
    sim.collectors
        .set_verdict("node2", r#"{"status":"live-repair","command":"fix"}"#);
    let (e, jobs) = sim
        .until("the repair to complete", MIN, |s| {
            s.events_of("node2")
                .into_iter()
                .find(|(e, _)| e.status == RepairStatus::Completed && e.tagged)
        })
        .await;
    assert_eq!(
        job_list(&jobs),
        vec![(JobKind::LiveRepair, JobStatus::Succeeded)]
    );
    assert_eq!(sim.collectors.repairs("node2"), vec!["fix"]);
    // Still reported: nothing runs again while the tag stands.
    sim.run_for(5 * MIN).await;
    assert_eq!(sim.collectors.repairs("node2"), vec!["fix"]);
    assert!(
        sim.cluster.jobs().is_empty(),
        "no backend job for a live repair"
    );
    // The operator removes the tag: acknowledged.
    sim.collectors.set_verdict("node2", OK);
    let tag = ready_tag(&e.id);
    sim.cluster.remove_tag("node2", &tag).await.unwrap();
    sim.until("the acknowledgement", MIN, |s| {
        s.events_of("node2")
            .into_iter()
            .all(|(x, _)| x.id != e.id || x.acknowledged)
            .then_some(())
    })
    .await;
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_storm_starts_no_fence_at_all() {
    let sim = Sim::start(SimOptions {
        nodes: 5,
        fencing: Some(fencing(5)),
        ..SimOptions::default()
    });
    // 2 of 5 (40 %) silent: over the 30 % threshold, for ten simulated minutes.
    sim.collectors.silence("node1");
    sim.collectors.silence("node2");
    sim.run_for(10 * MIN).await;
    assert!(sim.flows().is_empty(), "no fence may start during a storm");
    assert!(sim.agents.calls().is_empty());
    assert!(sim.collectors.powered("node1") && sim.collectors.powered("node2"));
    // One comes back: 1 of 5 is under the threshold, and the other is fenced.
    sim.collectors.answer_again("node2");
    let f = sim
        .until("node1 to be powered off", MIN, |s| {
            s.flows().into_iter().find(|f| f.fenced())
        })
        .await;
    assert_eq!(f.node, "node1");
    sim.stop().await;
}

/// Two nodes: one dead node is half the cluster. At the default storm threshold that is a storm
/// and nothing is ever fenced; at 50 % the master is the tie-breaker: it and the other node (the
/// dead node's only watcher) agree the node is gone, and it is fenced.
#[tokio::test(start_paused = true)]
async fn a_two_node_cluster_fences_only_with_the_master_as_tie_breaker() {
    for (storm_percent, fenced) in [(30, false), (50, true)] {
        let sim = Sim::start(SimOptions {
            nodes: 2,
            fencing: Some(FencingConfig {
                storm_percent,
                ..fencing(5)
            }),
            ..SimOptions::default()
        });
        sim.run_for(MIN).await;
        sim.collectors.silence("node2");
        sim.run_for(2 * MIN).await;
        let released = sim.flows().iter().any(|f| f.released());
        assert_eq!(released, fenced, "storm-percent {storm_percent}");
        assert_eq!(sim.collectors.powered("node2"), !fenced);
        let storm = sim.metrics.fencing.fence.fencing_storm_seconds.get();
        if fenced {
            assert_eq!(storm, 0.0);
        } else {
            assert!(storm > 100.0, "the storm held fencing for {storm:.0} s");
        }
        sim.stop().await;
    }
    // The survivor stays: cut from the master only, node2 is heard by node1 and not fenced.
    let sim = Sim::start(SimOptions {
        nodes: 2,
        fencing: Some(FencingConfig {
            storm_percent: 50,
            ..fencing(5)
        }),
        ..SimOptions::default()
    });
    sim.run_for(MIN).await;
    sim.collectors.cut_from_master("node2", true);
    sim.run_for(2 * MIN).await;
    assert!(sim.flows().is_empty(), "{:?}", sim.flows());
    assert!(sim.collectors.powered("node2"));
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_node_is_fenced_after_the_grace_released_once_and_recovered_once_healthy() {
    let sim = Sim::start(SimOptions {
        nodes: 4,
        fencing: Some(fencing(30)),
        ..SimOptions::default()
    });
    sim.run_for(MIN).await;
    // A hung kernel: powered, but the collector is silent.
    sim.collectors.silence("node3");
    let f = sim
        .until("the release", 2 * MIN, |s| {
            s.flows().into_iter().find(|f| f.released())
        })
        .await;
    let waited = f.created - f.detected;
    assert!(
        waited >= 30_000_000_000,
        "the flow started {:.1} s after the silence, before the 30 s grace",
        secs(waited)
    );
    assert!(!sim.collectors.powered("node3"));
    assert_eq!(sim.agents.calls(), vec!["off node3", "status node3"]);
    assert_eq!(sim.cluster.releases(), 1);
    // Powered off, the node waits for its witnesses: ten minutes change nothing.
    sim.run_for(10 * MIN).await;
    let f = sim.store.flow(&f.id).unwrap().unwrap();
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::New));
    assert_eq!(sim.cluster.releases(), 1, "released exactly once");
    // An operator repairs and powers it on; its first healthy report recovers it.
    sim.agents_power_on("node3");
    let f = sim
        .until("the recovery", MIN, |s| {
            s.flows()
                .into_iter()
                .find(|x| x.id == f.id && x.status == FenceStatus::Final)
        })
        .await;
    assert!(f.reclaimed, "{f:?}");
    assert_eq!(sim.cluster.reclaims.lock_unpoisoned().len(), 1);
    assert!(
        !sim.cluster.offline_nodes().await.unwrap().contains("node3"),
        "reclaimed"
    );
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_power_offs_retry_restart_tag_the_node_and_a_cooldown_follows_the_acknowledgement() {
    let sim = Sim::start(SimOptions {
        nodes: 4,
        fencing: Some(fencing(10)),
        power_retries: 1,
        ..SimOptions::default()
    });
    sim.agents.fail_next("off", 100);
    sim.collectors.silence("node1");
    let tagged = sim
        .until("the fencefailed tag", 5 * MIN, |s| {
            s.flows().into_iter().find(|f| {
                f.tagged
                    && s.cluster
                        .tags_of("node1")
                        .contains(&fence_failed_tag(&f.id))
            })
        })
        .await;
    // One restart of two attempts each (a retry 5 s apart): four calls, no status, no release.
    assert_eq!(sim.agents.calls(), vec!["off node1"; 4]);
    assert_eq!(tagged.restarts, 1);
    assert_eq!(sim.cluster.releases(), 0);
    assert!(sim.collectors.powered("node1"));
    let attempts: Vec<Nanos> = tagged
        .calls
        .iter()
        .filter(|c| c.action == "off")
        .map(|c| c.at)
        .collect();
    assert!(
        attempts[1] - attempts[0] >= 5_000_000_000,
        "a retry waits its interval: {attempts:?}"
    );
    // The operator acknowledges; the agents work again, but the cooldown (600 s) holds.
    sim.agents.fail_next("off", 0);
    let tag = fence_failed_tag(&tagged.id);
    sim.cluster.remove_tag("node1", &tag).await.unwrap();
    let done = sim
        .until("the flow to end", MIN, |s| {
            s.store
                .flow(&tagged.id)
                .unwrap()
                .filter(|f| f.status == FenceStatus::Final)
        })
        .await;
    sim.run_for(8 * MIN).await;
    assert_eq!(sim.flows().len(), 1, "no new flow within the cooldown");
    let next = sim
        .until("a new flow after the cooldown", 5 * MIN, |s| {
            s.flows().into_iter().find(|f| f.id != tagged.id)
        })
        .await;
    assert!(
        next.created - done.updated >= 600_000_000_000,
        "the new flow started {:.0} s after the last ended",
        secs(next.created - done.updated)
    );
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn fences_start_one_at_a_time_and_min_interval_apart() {
    let sim = Sim::start(SimOptions {
        nodes: 10,
        fencing: Some(FencingConfig {
            min_interval: Duration::from_secs(120),
            storm_percent: 50,
            ..fencing(5)
        }),
        ..SimOptions::default()
    });
    sim.collectors.silence("node1");
    sim.collectors.silence("node2");
    sim.collectors.silence("node3");
    let flows = sim
        .until("three releases", 10 * MIN, |s| {
            let f = s.flows();
            (f.iter().filter(|f| f.released()).count() == 3).then_some(f)
        })
        .await;
    let mut starts: Vec<Nanos> = flows.iter().map(|f| f.created).collect();
    starts.sort();
    for w in starts.windows(2) {
        assert!(
            w[1] - w[0] >= 120_000_000_000,
            "starts {:.0} s apart",
            secs(w[1] - w[0])
        );
    }
    // Never two power-offs in flight: each off came after the previous one was verified.
    let offs: Vec<String> = sim
        .agents
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("off"))
        .collect();
    assert_eq!(offs.len(), 3);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn readiness_checks_every_device_at_start_then_one_node_per_step_and_reports_changes() {
    let sim = Sim::start(SimOptions {
        nodes: 4,
        fencing: Some(FencingConfig {
            check_interval: Duration::from_secs(600),
            ..fencing(30)
        }),
        ..SimOptions::default()
    });
    // node2's BMC refuses the first two status calls (a wrong password, fixed later).
    sim.agents.fail_next("status node2", 2);
    let board = sim.readiness.clone().expect("fencing is on");
    let all = sim
        .until("the start-up pass", MIN, |_| {
            let all = board.all();
            (all.len() == 4).then_some(all)
        })
        .await;
    assert_eq!(all["node2"].state, FencingState::Inactive);
    assert!(
        all["node2"].detail.contains("bad credentials"),
        "{:?}",
        all["node2"]
    );
    for n in ["node1", "node3", "node4"] {
        assert_eq!(all[n].state, FencingState::Active, "{n}");
    }
    assert!(sim.elapsed_s() < 1.0, "the start-up pass runs at once");
    assert_eq!(sim.cluster.events(), vec!["node2 FencingInactive"]);
    // Then one node every 600 s / 4: node2's second check (t = 300 s) still fails, its third
    // (t = 900 s) passes.
    let back = sim
        .until("node2 to be active again", 20 * MIN, |_| {
            board
                .get("node2")
                .filter(|c| c.state == FencingState::Active)
        })
        .await;
    let at = secs(back.checked_at - T0);
    assert!(
        (890.0..=910.0).contains(&at),
        "node2 came back at {at:.0} s"
    );
    let node2_checks = sim
        .agents
        .calls()
        .iter()
        .filter(|c| *c == "status node2")
        .count();
    assert_eq!(node2_checks, 3, "one check per node per interval");
    assert_eq!(
        sim.cluster.events(),
        vec!["node2 FencingInactive", "node2 FencingActive"]
    );
    // Checks ask for the status only: nothing was switched.
    assert!(sim.agents.calls().iter().all(|c| c.starts_with("status")));
    assert!(sim.flows().is_empty());
    sim.stop().await;
}

impl Sim {
    /// An operator powers a node on after its repair: the collector answers again.
    fn agents_power_on(&self, node: &str) {
        self.collectors.set_power(node, true);
        self.collectors.answer_again(node);
    }
}
