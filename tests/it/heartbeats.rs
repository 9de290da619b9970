//! Peer heartbeats between real collector processes on loopback: the leader's
//! signed peer set, heartbeats both ways over UDP, a silent peer lost within `lost-after`, and
//! forged, replayed, misrouted and strangers' datagrams refused and counted without effect.

use crate::common;

use common::*;
use maintd::report::heartbeat::{Heartbeat, PeerView};
use maintd::report::{Key, now_ns};
use serde_json::{Value, json};

fn key(c: &Cluster) -> Key {
    Key::load(&c.path("cluster.key")).unwrap()
}

/// Pushes to node `i` a peer set of every other node.
async fn push_peers(c: &Cluster, i: usize, epoch: u64) -> (u16, Value) {
    let peers: serde_json::Map<String, Value> = c
        .nodes
        .iter()
        .zip(&c.ports)
        .filter(|(n, _)| **n != c.nodes[i])
        .map(|(n, p)| (n.clone(), json!({"ip": "127.0.0.1", "port": p})))
        .collect();
    let body = serde_json::to_vec(&json!({"epoch": epoch, "peers": peers})).unwrap();
    let r = maintd::http::send_signed(
        &c.client,
        &key(c),
        &c.nodes[i],
        reqwest::Method::PUT,
        &format!("http://127.0.0.1:{}", c.ports[i]),
        "/1/peers",
        Some(body),
    )
    .await
    .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn view(c: &Cluster, i: usize) -> PeerView {
    fetch_view(
        &c.client,
        &format!("127.0.0.1:{}", c.ports[i]),
        &key(c),
        &c.nodes[i],
    )
    .await
}

fn alive(v: &PeerView, peer: &str) -> bool {
    v.peers
        .iter()
        .any(|p| p.name == peer && p.alive && p.hears_me)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_hear_each_other_lose_a_silent_one_and_refuse_forged_and_replayed_beats() {
    let mut c = Cluster::new(3);
    c.start_collectors();
    c.wait_collectors_ready().await;
    // Before the leader pushes a set, a collector hears and sends nothing.
    assert!(view(&c, 0).await.peers.is_empty());
    for i in 0..3 {
        assert_eq!(push_peers(&c, i, 7).await.0, 200);
    }
    let v = wait_for("every node to hear the others both ways", || async {
        let v = view(&c, 0).await;
        (alive(&v, "node2") && alive(&v, "node3")).then_some(v)
    })
    .await;
    assert_eq!(v.epoch, 7);

    // A peer set must be signed, for this node, and sane.
    let unsigned = c
        .client
        .put(format!("http://127.0.0.1:{}/1/peers", c.ports[0]))
        .body(r#"{"epoch":1,"peers":{}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status().as_u16(), 401);

    // Hostile datagrams at node1's heartbeat port: none creates state or changes a verdict.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = format!("127.0.0.1:{}", c.ports[0]);
    let now = now_ns();
    let forged = Heartbeat::new("node3", "node1", u64::MAX - 1, now, 0)
        .sign(&Key::from_bytes(vec![1; 32]))
        .to_bytes();
    let old = Heartbeat::new("node2", "node1", 1, now, 0)
        .sign(&key(&c))
        .to_bytes();
    let misrouted = Heartbeat::new("node2", "node3", u64::MAX - 1, now, 0)
        .sign(&key(&c))
        .to_bytes();
    let stranger = Heartbeat::new("node9", "node1", 1, now, 0)
        .sign(&key(&c))
        .to_bytes();
    for d in [&forged, &old, &misrouted, &stranger] {
        sock.send_to(d, &to).await.unwrap();
    }
    sock.send_to(&vec![b'x'; 4096], &to).await.unwrap();
    let v = wait_for("the refusals to be counted", || async {
        let v = view(&c, 0).await;
        (v.rejected.values().sum::<u64>() >= 5).then_some(v)
    })
    .await;
    for reason in ["signature", "replay", "recipient", "stranger", "size"] {
        assert_eq!(
            v.rejected.get(reason),
            Some(&1),
            "{reason}: {:?}",
            v.rejected
        );
    }
    assert!(!v.peers.iter().any(|p| p.name == "node9"));
    assert!(alive(&v, "node2") && alive(&v, "node3"));

    // node3's collector stops: its peers lose it within lost-after (2 s), and it no longer
    // counts as hearing them.
    c.kill_collector(2);
    let lost = wait_for("node1 and node2 to lose node3", || async {
        let (a, b) = (view(&c, 0).await, view(&c, 1).await);
        let gone = |v: &PeerView| v.peers.iter().any(|p| p.name == "node3" && !p.alive);
        (gone(&a) && gone(&b)).then_some(a)
    })
    .await;
    let node3 = lost.peers.iter().find(|p| p.name == "node3").unwrap();
    assert!(!node3.hears_me && node3.heard_at.is_some());
    // node1 keeps hearing node2: a heartbeat newer than the view that lost node3.
    let heard = |v: &PeerView| {
        v.peers
            .iter()
            .find(|p| p.name == "node2")
            .and_then(|p| p.heard_at)
    };
    let then = heard(&lost);
    let v = wait_for("node1 to hear node2 again", || async {
        let v = view(&c, 0).await;
        (heard(&v) > then).then_some(v)
    })
    .await;
    assert!(alive(&v, "node2"), "the others still hear each other");
}

/// The daemon's side with real processes: the leader pushes every collector its
/// peer set, reads their views with its liveness probe, and fences a dead node only with its
/// watchers as witnesses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_pushes_peer_sets_and_a_dead_nodes_watchers_are_its_witnesses() {
    let mut c = Cluster::new(3);
    let calls = c.path("agent-calls");
    c.extra_daemon_toml = c.stub_fencing(
        "fence_stub",
        &format!(
            "echo called >> {}; grep -q '^action=status' && exit 2; exit 0",
            calls.display()
        ),
        "2s",
        &["node1"],
    );
    c.start().await;
    // Every node hears the two others, as the daemon sees it through their views.
    let w = wait_for("node1's watchers to hear it", || async {
        let w = c.node("node1").await["witnesses"].clone();
        (w["heard-by"].as_array().map(Vec::len) == Some(2)).then_some(w)
    })
    .await;
    assert_eq!(w["partitioned"], false);
    assert_eq!(w["unheard"], json!([]));
    let m = c.metrics().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("maintd_peer_sets_pushed_total 3")),
        "one push per collector:\n{m}"
    );
    c.kill_collector(0);
    let f = c
        .wait_flow("node1's flow", |f| {
            f["node"] == "node1" && f["released"] == true
        })
        .await;
    let mut witnesses: Vec<&str> = f["witnesses"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["watcher"].as_str().unwrap())
        .collect();
    witnesses.sort();
    assert_eq!(witnesses, ["node2", "node3"], "{f:#}");
    let note = f["history"][0]["note"].as_str().unwrap();
    assert!(note.contains("lost by its watchers"), "{note}");
    // Both shapes as the spec documents them.
    let mut spec = common::spec::Spec::load();
    for path in ["/1/nodes", "/1/fences"] {
        let (status, v) = c.get(path).await;
        let body = serde_json::to_vec(&v).unwrap();
        spec.check("GET", path, status, "application/json", &body);
    }
    assert!(std::fs::read_to_string(&calls).unwrap().contains("called"));
}
