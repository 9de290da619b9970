//! A fenced node's power-on and return to service in simulated time: off, verified, released,
//! on, verified, then back in service only on a new boot and three healthy reports from it; a
//! device that lies about the off raises the alarm and the node stays out.

use std::time::Duration;

use super::*;
use maintd_core::fencing::machine::{FenceStatus, Step};

const MIN: Duration = Duration::from_secs(60);

fn options() -> SimOptions {
    SimOptions {
        nodes: 4,
        fencing: Some(FencingConfig {
            grace: Duration::from_secs(10),
            liveness_interval: Duration::from_secs(1),
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        power_on: true,
        ..SimOptions::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_node_is_powered_on_after_the_release_and_returns_only_on_its_new_boot() {
    let sim = Sim::start(options());
    sim.run_for(MIN).await;
    // A hung kernel: powered, but silent. Powering it off and on reboots it.
    sim.collectors.silence("node3");
    let f = sim
        .until("the return to service", 3 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node3" && f.status == FenceStatus::Final)
        })
        .await;
    assert_eq!(
        sim.agents.calls(),
        ["off node3", "status node3", "on node3", "status node3"],
        "off, verified off, then on, verified on"
    );
    assert!(sim.collectors.powered("node3"));
    let (off, released, on) = (
        f.fenced_at.unwrap(),
        f.released_at.unwrap(),
        f.powered_on_at.unwrap(),
    );
    assert!(off <= released && released <= on, "{off} {released} {on}");
    assert!(f.boot_before.is_some() && f.returned_boot.is_some());
    assert_ne!(f.boot_before, f.returned_boot);
    assert!(f.reclaimed && f.marked);
    let notes: Vec<&str> = f.history.iter().map(|t| t.note.as_str()).collect();
    assert!(
        notes.iter().any(|n| n.starts_with("new boot id")),
        "{notes:?}"
    );
    let proven = notes
        .iter()
        .find(|n| n.starts_with("return to service proven"))
        .unwrap();
    assert!(proven.contains("3 healthy reports"), "{proven}");
    // The node was unschedulable from before the off until its return.
    let jobs: Vec<String> = sim
        .cluster
        .jobs()
        .into_iter()
        .filter(|j| j.ends_with("node3"))
        .collect();
    assert_eq!(jobs, ["mark node3", "unmark node3"]);
    assert_eq!(sim.cluster.releases(), 1);
    assert_eq!(sim.cluster.reclaims.lock_unpoisoned().len(), 1);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_device_that_reports_off_but_never_switched_the_node_raises_the_alarm() {
    let sim = Sim::start(options());
    sim.run_for(MIN).await;
    sim.agents
        .lies
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The collector hangs for a while; the device "powers it off" and on, switching nothing.
    sim.collectors.silence("node3");
    sim.until("the power-on", 3 * MIN, |s| {
        s.flows().into_iter().find(|f| f.powered_on_at.is_some())
    })
    .await;
    // The node (never reset) answers again, with the boot it had all along.
    sim.collectors.answer_again("node3");
    let f = sim
        .until("the alarm", MIN, |s| {
            s.flows().into_iter().find(|f| f.alarm.is_some())
        })
        .await;
    assert_eq!((f.step, f.status), (Step::Recovery, FenceStatus::Error));
    sim.run_for(MIN).await;
    let f = sim.store.flow(&f.id).unwrap().unwrap();
    assert!(f.tagged && !f.reclaimed, "it stays out of service: {f:?}");
    assert!(sim.cluster.reclaims.lock_unpoisoned().is_empty());
    assert!(
        sim.cluster.offline_nodes().await.unwrap().contains("node3"),
        "still released"
    );
    sim.stop().await;
}
