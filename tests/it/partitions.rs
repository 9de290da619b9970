//! Real network partitions: the master and three nodes, each in a network
//! namespace of its own on a bridge, links cut for real. Every node self-fences with the
//! stand-in watchdog (tests/it/common/watchdog.rs), and runs a stand-in workload (a process in its
//! process group, which a reset kills with it). The workload watcher is the release hook itself:
//! at the moment of the release it checks whether the released node's workload still runs, and
//! records `LIVE-COPY` if it does; no test may ever see one. Needs root (skipped with a notice
//! without it; `scripts/test` requires it).

use crate::common;

use std::sync::mpsc::TryRecvError;
use std::time::Duration;

use common::parts::{Part, fate, no_reset_within, setup};
use common::watchdog::{Fate, assert_released_after_reset};
use common::*;

/// node2 is reset by its watchdog, marked, and released only after the reset, with its
/// workload dead; node1 and node3 run on.
async fn self_fenced_before_release(p: &Part, cut_at: i64) {
    let reset_at = match fate(&p.fates[1], Duration::from_secs(60)).await {
        Some(Fate::Reset(at)) => at,
        other => panic!("node2's watchdog did not fire: {other:?}"),
    };
    assert!(reset_at > cut_at);
    let f =
        p.c.wait_flow("node2 released", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    let released_at = f["released-at"].as_i64().unwrap_or_default();
    eprintln!(
        "node2: cut at 0, reset at {:.2} s, released at {:.2} s",
        (reset_at - cut_at) as f64 / 1e9,
        (released_at - cut_at) as f64 / 1e9
    );
    assert_released_after_reset(&f, reset_at);
    let log = p.c.hook_log();
    assert!(
        !log.iter().any(|l| l.starts_with("LIVE-COPY")),
        "two live copies: {log:?}"
    );
    let mark = log.iter().position(|l| l.starts_with("offline node2"));
    let release = log.iter().position(|l| l.starts_with("release node2"));
    assert!(
        matches!((mark, release), (Some(m), Some(r)) if m < r),
        "{log:?}"
    );
    for i in [0, 2] {
        assert_eq!(
            p.fates[i].try_recv(),
            Err(TryRecvError::Empty),
            "node{}",
            i + 1
        );
    }
}

/// `tests/support/udp-late.py` on a relay host that node2's watchers send node2's traffic
/// through: node2 gets their genuine heartbeats only late. Killed when dropped.
struct Late(std::process::Child);

impl Late {
    fn start(p: &mut Part, mode: &[&str]) -> Late {
        use std::io::BufRead;
        let relay = p.net.add_relay();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/udp-late.py");
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &p.net.hosts[relay].ns, "python3", script])
            .args(["--victim", &p.net.hosts[2].ip])
            .args(mode)
            .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("udp-late.py");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("udp-late.py says ready");
        assert_eq!(line.trim(), "ready");
        for watcher in [1, 3] {
            p.net.route_via(watcher, 2, relay);
        }
        Late(child)
    }

    fn signal(&self, sig: &str) {
        let st = std::process::Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
    }

    /// Drops every datagram from now on (none is held any more).
    fn suppress(&self) {
        self.signal("-USR2");
    }
}

impl Drop for Late {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A gray failure: node2's watchers' heartbeats reach it 4.6 s late (inside their 5 s window),
/// then node2's outbound traffic dies. Their "I hear you"s echo beats node2 sent 4.6 s before,
/// which count for nothing: node2 starves on time, and the release follows its reset.
#[tokio::test]
async fn heartbeats_delayed_by_almost_their_window_never_keep_a_cut_off_node_fed_past_its_release()
{
    let Some(mut p) = setup().await else { return };
    let _late = Late::start(&mut p, &["--delay", "4.6"]);
    // The master's echoes alone keep node2 fed meanwhile: no false reset.
    no_reset_within(&p, Duration::from_secs(8)).await;
    let cut_at = maintd::report::now_ns();
    p.net.drop_outbound(2);
    self_fenced_before_release(&p, cut_at).await;
}

/// An on-path attacker holds each of the watchers' genuine, signed heartbeats to node2 until
/// just before its own timestamp leaves the 5 s window; node2's outbound traffic dies; from 0.9 s
/// after the cut the attacker drops every new heartbeat (the ones that would say node2 is no
/// longer heard), so the last ones node2 gets, 4.7 s late, still say the watchers heard it. They
/// echo beats node2 sent before the cut: node2 still starves on time.
#[tokio::test]
async fn genuine_heartbeats_withheld_and_redelivered_never_keep_a_cut_off_node_fed_past_its_release()
 {
    let Some(mut p) = setup().await else { return };
    let late = Late::start(&mut p, &["--expire", "4.7"]);
    no_reset_within(&p, Duration::from_secs(8)).await;
    let cut_at = maintd::report::now_ns();
    p.net.drop_outbound(2);
    tokio::time::sleep(Duration::from_millis(900)).await;
    late.suppress();
    self_fenced_before_release(&p, cut_at).await;
}

#[tokio::test]
async fn a_node_cut_off_from_the_master_and_its_peers_self_fences_before_its_release() {
    let Some(p) = setup().await else { return };
    let cut_at = maintd::report::now_ns();
    p.net.link(2, false);
    self_fenced_before_release(&p, cut_at).await;
}

#[tokio::test]
async fn a_node_whose_outbound_traffic_alone_is_dropped_self_fences_before_its_release() {
    let Some(p) = setup().await else { return };
    let cut_at = maintd::report::now_ns();
    // It still hears every heartbeat, but nobody hears it: it is the isolated one.
    p.net.drop_outbound(2);
    self_fenced_before_release(&p, cut_at).await;
}

#[tokio::test]
async fn a_node_cut_from_the_master_only_is_partitioned_and_neither_fenced_nor_self_fenced() {
    let Some(p) = setup().await else { return };
    p.net.cut(0, 2);
    wait_for("node2 reported partitioned", || async {
        (p.c.node("node2").await["witnesses"]["partitioned"] == true).then_some(())
    })
    .await;
    no_reset_within(&p, Duration::from_secs(15)).await;
    let (_, flows) = p.c.get("/1/fences").await;
    assert_eq!(flows.as_array().map(Vec::len), Some(0), "{flows:#}");
    assert!(p.c.hook_log().is_empty(), "{:?}", p.c.hook_log());
    assert!(
        p.c.metrics()
            .await
            .contains("maintd_node_partitioned{node=\"node2\"} 1")
    );
}

#[tokio::test]
async fn the_master_cut_off_from_every_node_fences_nothing_and_no_node_self_fences() {
    let Some(p) = setup().await else { return };
    for i in 1..=3 {
        p.net.cut(0, i);
    }
    wait_for("the storm reported", || async {
        p.c.metrics()
            .await
            .contains("maintd_fencing_storm 1")
            .then_some(())
    })
    .await;
    // The nodes hear each other, not the master: too few watchers for the master to judge,
    // so none of them stops feeding (no reboot storm).
    no_reset_within(&p, Duration::from_secs(15)).await;
    let (_, flows) = p.c.get("/1/fences").await;
    assert_eq!(flows.as_array().map(Vec::len), Some(0), "{flows:#}");
    assert!(p.c.hook_log().is_empty(), "{:?}", p.c.hook_log());
}

#[tokio::test]
async fn a_hung_collector_on_a_self_fencing_node_is_reset_before_its_release() {
    let Some(p) = setup().await else { return };
    let hung_at = maintd::report::now_ns();
    // The collector alone stops; its workload runs on until the reset kills the group.
    let pid = p.c.collectors[1].as_ref().unwrap().child.id();
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    self_fenced_before_release(&p, hung_at).await;
}

#[tokio::test]
async fn forged_and_replayed_heartbeats_keep_no_dead_node_alive() {
    use maintd::report::Key;
    use maintd::report::heartbeat::Heartbeat;
    let Some(p) = setup().await else { return };
    let key = Key::load(&p.c.path("cluster.key")).unwrap();
    let wrong = Key::from_bytes(vec![7; 32]);
    let cut_at = maintd::report::now_ns();
    p.net.link(2, false);
    // From the bridge, someone speaks for node2 to its watchers: with a wrong key, and with the
    // right key but an old counter (a replay) or an old time (stale).
    let targets: Vec<(String, String)> = [0, 2]
        .iter()
        .map(|&i| (p.c.nodes[i].clone(), p.c.node_hosts[i].clone()))
        .collect();
    let signing = key.clone();
    let attack = tokio::spawn(async move {
        let key = signing;
        let sock = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        loop {
            let now = maintd::report::now_ns();
            for (name, host) in &targets {
                for (k, seq, ts) in [
                    (&wrong, u64::MAX / 2, now),
                    (&key, 1, now),
                    (&key, u64::MAX / 2, now - 3_600_000_000_000),
                ] {
                    let hb = Heartbeat::new("node2", name, seq, ts, seq)
                        .sign(k)
                        .to_bytes();
                    let _ = sock.send_to(&hb, format!("{host}:1815")).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    self_fenced_before_release(&p, cut_at).await;
    attack.abort();
    let view = fetch_view(
        &p.c.client,
        &format!("{}:1815", p.c.node_hosts[0]),
        &key,
        "node1",
    )
    .await;
    for reason in ["signature", "replay", "stale"] {
        assert!(
            view.rejected.get(reason).copied().unwrap_or(0) > 0,
            "{reason}: {:?}",
            view.rejected
        );
    }
    let node2 = view.peers.iter().find(|x| x.name == "node2").unwrap();
    assert!(!node2.alive, "{node2:?}");
}
