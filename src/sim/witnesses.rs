//! Scenarios of the second opinion on the simulated-time harness: the master's
//! probe against the peers' heartbeats, with links cut one at a time.

use std::time::Duration;

use super::*;
use maintd_core::fencing::opinion::PeerWitness;

const MIN: Duration = Duration::from_secs(60);

/// Fencing at the defaults (grace 5 s, liveness every 1 s, 8 watchers), readiness checks off.
fn fencing(storm_percent: u32) -> FencingConfig {
    FencingConfig {
        check_interval: Duration::ZERO,
        storm_percent,
        ..FencingConfig::default()
    }
}

/// `nodes` nodes fencing at the defaults with `storm_percent`, run for 10 s: every collector
/// polled, every peer set pushed.
async fn settled(nodes: usize, storm_percent: u32) -> Sim {
    let sim = Sim::start(SimOptions {
        nodes,
        fencing: Some(fencing(storm_percent)),
        ..SimOptions::default()
    });
    sim.run_for(Duration::from_secs(10)).await;
    sim
}

fn events_of(sim: &Sim, node: &str) -> Vec<String> {
    sim.cluster
        .events()
        .into_iter()
        .filter_map(|e| e.strip_prefix(&format!("{node} ")).map(String::from))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_node_cut_from_the_master_but_heard_by_its_peers_is_partitioned_and_never_fenced() {
    let sim = settled(5, 30).await;
    let peering = sim.peering.clone().unwrap();
    sim.collectors.cut_from_master("node2", true);
    sim.run_for(10 * MIN).await;
    assert!(sim.flows().is_empty(), "{:?}", sim.flows());
    assert!(sim.agents.calls().is_empty());
    let w = peering.witnesses("node2", sim.clock.now());
    assert!(w.partitioned, "{w:?}");
    assert_eq!(w.watchers.len(), 4, "every other node watches it");
    assert_eq!(w.heard_by.len(), 4, "{w:?}");
    assert_eq!(events_of(&sim, "node2"), vec!["MaintdPartitioned"]);
    // Now the node dies while still cut off: its peers lose it too, and it is fenced, with
    // them as witnesses.
    sim.collectors.silence("node2");
    let f = sim
        .until("the release", MIN, |s| {
            s.flows().into_iter().find(|f| f.released())
        })
        .await;
    let watchers: Vec<&str> = f
        .witnesses
        .peers
        .iter()
        .map(|w: &PeerWitness| w.watcher.as_str())
        .collect();
    assert_eq!(watchers.len(), 4, "{:?}", f.witnesses);
    assert!(
        f.history[0].note.contains("lost by its watchers"),
        "{}",
        f.history[0].note
    );
    assert!(!peering.witnesses("node2", sim.clock.now()).partitioned);
    let events = events_of(&sim, "node2");
    assert_eq!(&events[..2], ["MaintdPartitioned", "MaintdPartitionEnded"]);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_second_opinion_is_ready_when_the_grace_ends() {
    let sim = settled(5, 30).await;
    let died = sim.clock.now();
    sim.collectors.silence("node3");
    let f = sim
        .until("the flow", MIN, |s| s.flows().into_iter().next())
        .await;
    // The watchers lose the node 2 s after its last heartbeat and the master asks them every
    // second: by the end of the 5 s grace they have long agreed, so the flow starts within one
    // probe of it, as it would on the master's word alone.
    let grace = 5_000_000_000;
    let probe = 1_000_000_000;
    assert!(
        f.created - died <= grace + 2 * probe,
        "started {:.1} s after the death",
        (f.created - died) as f64 / 1e9
    );
    assert!(f.created - f.detected >= grace);
    assert_eq!(f.witnesses.peers.len(), 4);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn with_too_few_watchers_heard_nothing_is_fenced_until_enough_are_heard_again() {
    // No storm gate here: the rule under test is the second opinion's own.
    let sim = settled(5, 100).await;
    // The master loses three of node1's four watchers (they still hear each other), then node1
    // dies: one watcher heard of four is too few to judge.
    for n in ["node2", "node3", "node4"] {
        sim.collectors.cut_from_master(n, true);
    }
    sim.collectors.silence("node1");
    sim.run_for(5 * MIN).await;
    assert!(sim.flows().is_empty(), "{:?}", sim.flows());
    assert!(sim.collectors.powered("node1"));
    // Two of four heard again: half is enough, and both lost node1.
    sim.collectors.cut_from_master("node2", false);
    let f = sim
        .until("the flow", MIN, |s| s.flows().into_iter().next())
        .await;
    assert_eq!(f.node, "node1");
    let mut watchers: Vec<String> = f
        .witnesses
        .peers
        .iter()
        .map(|w| w.watcher.clone())
        .collect();
    watchers.sort();
    assert_eq!(watchers, ["node2", "node5"]);
    sim.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_with_the_wrong_key_is_never_fenced_for_it() {
    let sim = settled(4, 30).await;
    // Its peers refuse its heartbeats and the master its view: to every witness it looks
    // lost. But its collector answers, and an answer is proof of life.
    sim.collectors.use_wrong_key("node2");
    sim.run_for(10 * MIN).await;
    assert!(sim.flows().is_empty(), "{:?}", sim.flows());
    assert!(sim.agents.calls().is_empty());
    let w = sim
        .peering
        .clone()
        .unwrap()
        .witnesses("node2", sim.clock.now());
    assert_eq!(w.lost_by.len(), 3, "its peers cannot hear it: {w:?}");
    assert!(!w.partitioned);
    sim.stop().await;
}

/// No false alarms: a node that dies is never first called partitioned (its watchers' judgement
/// is in before the grace ends), and a cut from the master shorter than the grace, however often
/// it flickers, says nothing.
#[tokio::test(start_paused = true)]
async fn a_dead_node_or_a_flickering_cut_is_never_called_partitioned() {
    let sim = settled(5, 30).await;
    for _ in 0..5 {
        sim.collectors.cut_from_master("node3", true);
        sim.run_for(Duration::from_secs(3)).await;
        sim.collectors.cut_from_master("node3", false);
        sim.run_for(Duration::from_secs(4)).await;
    }
    assert!(
        events_of(&sim, "node3").is_empty(),
        "{:?}",
        events_of(&sim, "node3")
    );
    sim.collectors.silence("node2");
    sim.until("the release", MIN, |s| {
        s.flows().into_iter().find(|f| f.released())
    })
    .await;
    sim.run_for(Duration::from_secs(30)).await;
    let events = events_of(&sim, "node2");
    assert!(!events.is_empty(), "the fence says so");
    assert!(
        !events.iter().any(|e| e.starts_with("MaintdPartitioned")),
        "{events:?}"
    );
    sim.stop().await;
}

/// A node whose fence flow is under way (its power-off hangs at a dead BMC) and which is then
/// heard by its peers but not by the master is being fenced, not "partitioned, not fenced": no
/// MaintdPartitioned while its flow is open.
#[tokio::test(start_paused = true)]
async fn a_node_with_an_open_flow_is_never_called_partitioned() {
    let sim = settled(5, 30).await;
    let peering = sim.peering.clone().unwrap();
    sim.agents
        .hang
        .store(true, std::sync::atomic::Ordering::SeqCst);
    sim.collectors.silence("node2");
    sim.until("node2's flow", MIN, |s| {
        s.flows().into_iter().find(|f| f.node == "node2")
    })
    .await;
    sim.collectors.cut_from_master("node2", true);
    sim.collectors.answer_again("node2");
    sim.run_for(3 * MIN).await;
    let open = sim
        .flows()
        .into_iter()
        .filter(|f| {
            f.node == "node2" && f.status != maintd_core::fencing::machine::FenceStatus::Final
        })
        .count();
    assert_eq!(open, 1, "{:?}", sim.flows());
    let w = peering.witnesses("node2", sim.clock.now());
    assert!(w.heard_by.len() >= 3, "its peers hear it: {w:?}");
    let events = events_of(&sim, "node2");
    assert!(
        !events.iter().any(|e| e.starts_with("MaintdPartitioned")),
        "{events:?}"
    );
    sim.stop().await;
}
