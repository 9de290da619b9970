//! `maintd bench peers`: what the peer heartbeats and the second opinion cost. The
//! leader's assignment and peer sets at N nodes; a heartbeat's size and the bytes each node sends
//! and receives; each node's CPU, measured on real collectors' heartbeat tasks exchanging UDP on
//! loopback; and the leader's extra CPU to verify every node's view once per liveness probe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::HeartbeatConfig;
use crate::fencing::peering::{Peering, PeeringSettings};
use crate::node::NodeConfig;
use crate::report::heartbeat::{Heartbeat, PeerSet, PeerState, PeerView};
use crate::report::keyring::Keyring;
use crate::report::nodekey::{Credential, Held, NodeSecret};
use crate::report::{Key, now_ns};
use maintd_core::fencing::watchers::DEFAULT_WATCHERS;

use super::bench::{BenchError, cpu_seconds};

fn members(n: usize) -> Vec<NodeConfig> {
    (0..n)
        .map(|i| NodeConfig {
            name: format!("node{i}"),
            collector: format!("10.{}.{}.{}:1815", i / 65536, (i / 256) % 256, i % 256),
        })
        .collect()
}

fn settings() -> PeeringSettings {
    PeeringSettings {
        watchers: DEFAULT_WATCHERS,
        fresh_for: Duration::from_secs(3),
    }
}

/// The probe number every sample view answers.
const PROBE: u64 = 7;

/// The view a node with these peers serves, as the leader receives it.
fn view_bytes(key: &Key, node: &str, peers: &[String], at: i64) -> Vec<u8> {
    let v = PeerView {
        node: node.into(),
        epoch: 1,
        at,
        peers: peers
            .iter()
            .map(|p| PeerState {
                name: p.clone(),
                heard_at: Some(at - 300_000_000),
                alive: true,
                hears_me: true,
                quiet_ms: Some(300),
            })
            .collect(),
        rejected: Default::default(),
        watchdog: None,
        beat: 1,
        answers: PROBE,
    };
    serde_json::to_vec(&v.sign(key)).unwrap_or_default()
}

pub async fn peers(nodes: usize, live: usize, secs: u64) -> Result<(), BenchError> {
    // Keys per node, as a cluster runs once it has moved off the cluster key: heartbeats are
    // signed and checked with Ed25519.
    let key = Key::from_bytes(vec![5; 32]);
    let keyring = Arc::new(Keyring::with(
        key.clone(),
        Some(NodeSecret::from_bytes(&[6; 32])),
        Default::default(),
    ));
    let cred = |n: &str| {
        let k = keyring.node_key(n, 1).expect("a secret is set");
        Credential::new(vec![Held::Node(k)])
    };
    let hb = HeartbeatConfig::default();
    out!(
        "peer heartbeats: {nodes} nodes, {DEFAULT_WATCHERS} watchers each, a heartbeat every {:?}",
        hb.interval
    );

    // 1. The leader's assignment, on start-up and on every membership change.
    let m = members(nodes);
    let leader = Peering::new(keyring.clone(), settings());
    let t = Instant::now();
    leader.refresh(&m).await;
    let assign_s = t.elapsed().as_secs_f64();
    let sets = leader.sets_for_bench();
    let sizes: Vec<usize> = sets.values().map(|s| s.peers.len()).collect();
    let avg = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
    let max = sizes.iter().copied().max().unwrap_or(0);
    out!(
        "assignment and peer sets: {assign_s:.2} s for {nodes} nodes; peers per node avg {avg:.1}, max {max}"
    );

    // 2. Bytes on the wire.
    // Beats are seeded from the clock: echo and vouch are numbers of that size.
    let seeded = now_ns() as u64;
    let mut beat = Heartbeat::new("node1234", "node4321", seeded, now_ns(), seeded);
    beat.vouch = seeded;
    let beat = beat.sign_as(&cred("node1234").now()).to_bytes().len();
    let per_s = avg / hb.interval.as_secs_f64();
    // IPv4 + UDP headers on top of the payload.
    let wire = (beat + 28) as f64;
    out!(
        "heartbeat: {beat} bytes ({wire:.0} on the wire); per node {per_s:.0} sent and {per_s:.0} received per second = {:.1} KiB/s each way",
        per_s * wire / 1024.0
    );

    // 3. Each node's CPU, on `live` real heartbeat tasks over loopback UDP.
    let _ = crate::http::listener::raise_fd_limit();
    let names: Vec<NodeConfig> = members(live);
    let mut sockets = Vec::new();
    for _ in 0..live {
        sockets.push(tokio::net::UdpSocket::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<NodeConfig> = names
        .iter()
        .zip(&sockets)
        .map(|(n, s)| NodeConfig {
            name: n.name.clone(),
            collector: s.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        })
        .collect();
    let planner = Peering::new(keyring.clone(), settings());
    planner.refresh(&addrs).await;
    let live_sets = planner.sets_for_bench();
    let mut all = Vec::new();
    let mut tasks = Vec::new();
    for (n, socket) in addrs.iter().zip(sockets) {
        let p = Arc::new(crate::collector::peers::Peers::new(
            n.name.clone(),
            cred(&n.name),
            hb,
        ));
        let set: PeerSet = live_sets.get(&n.name).cloned().unwrap_or_default();
        p.install(set)?;
        all.push(p.clone());
        tasks.push(tokio::spawn(p.run(socket, None)));
    }
    // Let every node hear its peers, then measure.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let cpu = cpu_seconds() - cpu0;
    let wall = t.elapsed().as_secs_f64();
    let now = now_ns();
    let heard = all
        .iter()
        .zip(&addrs)
        .map(|(p, n)| {
            let keys = keyring.verifiers(&n.name).unwrap_or_default();
            let v = p.view(now).verify(&keys, &n.name).ok();
            v.map(|v| v.peers.iter().filter(|x| x.alive && x.hears_me).count())
                .unwrap_or(0)
        })
        .sum::<usize>();
    let expected: usize = live_sets.values().map(|s| s.peers.len()).sum();
    let per_node_ms = cpu / wall / live as f64 * 1000.0;
    out!(
        "node CPU: {live} live nodes over {wall:.0} s used {cpu:.2} CPU-s: {per_node_ms:.3} ms of CPU per node per second ({:.3} % of a core); {heard} of {expected} peer links heard both ways at the end",
        per_node_ms / 10.0
    );

    // The nodes stop, so the leader's figure is its own (a node's heartbeats would share the
    // cores with it).
    for t in tasks {
        t.abort();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 4. The leader's extra CPU: every node's view verified once per liveness probe (1 s).
    let sample: Vec<(String, Vec<u8>)> = sets
        .iter()
        .map(|(n, s)| {
            let peers: Vec<String> = s.peers.keys().cloned().collect();
            let k = keyring.signer(n).expect("no node is revoked");
            (n.clone(), view_bytes(&k, n, &peers, now))
        })
        .collect();
    let bytes: usize = sample.iter().map(|(_, b)| b.len()).sum();
    let verifier = Peering::new(keyring.clone(), settings());
    verifier.refresh(&m).await;
    let t = Instant::now();
    let verified = sample
        .iter()
        .filter(|(n, b)| verifier.accept(n, b, PROBE, now..now, now).is_ok())
        .count();
    let best = t.elapsed().as_secs_f64();
    // Of which the node keys: each node's looked up (derived once, then cached).
    let t = Instant::now();
    let looked_up = sample
        .iter()
        .filter(|(n, _)| keyring.verifiers(n).is_ok())
        .count();
    let lookups = t.elapsed().as_secs_f64();
    out!(
        "leader: {looked_up} node key lookups in {:.1} ms",
        lookups * 1000.0
    );
    if verified != sample.len() {
        return Err(BenchError::Unverified {
            verified,
            of: sample.len(),
        });
    }
    let t = Instant::now();
    let silent = nodes / 100;
    for (n, _) in sample.iter().take(silent) {
        let _ = verifier.opinion(n, now, &[]);
    }
    let opinions = t.elapsed().as_secs_f64();
    out!(
        "leader: {nodes} views of {:.0} bytes avg ({:.1} MiB per probe) verified in {:.0} ms = {:.1} % of a core at one probe per second; the second opinion on {silent} silent nodes: {:.2} ms",
        bytes as f64 / nodes as f64,
        bytes as f64 / 1048576.0,
        best * 1000.0,
        best * 100.0,
        opinions * 1000.0
    );
    Ok(())
}
