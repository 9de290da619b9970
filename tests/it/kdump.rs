//! kdump on a real network: a node's collector dies, its peers lose it, and the real
//! `fence_kdump_send` (Debian's fence-agents) in the node's network namespace tells the master
//! it runs its crash kernel. No power-off is sent before the kdump window has decided: a
//! notification within it releases the node's workloads with no agent call at all; silence for
//! all of it lets the power-off go. The same message from another node's address, or from an
//! address no node has, is refused and counted.

use crate::common;

use common::netns::{self, Net};
use common::*;

const SEND: &str = "/usr/libexec/fence-agents/fence_kdump_send";

/// An agent that counts its calls and always fails: only kdump can release.
fn counting_agent(c: &Cluster) -> String {
    format!(
        "cat >/dev/null; echo call >> {}/agent-calls; exit 1",
        c.dir.path().display()
    )
}

fn agent_calls(c: &Cluster) -> usize {
    std::fs::read_to_string(c.path("agent-calls"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn send_from(net: &Net, host: usize, to: &str, port: u16) {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &net.hosts[host].ns, SEND])
        .args(["-p", &port.to_string(), "-c", "3", "-i", "1", to]);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A master and three nodes in namespaces; node1 has kdump, a power-off that always fails, and
/// a kdump window of `window`.
async fn setup(window: &str) -> Option<(Net, Cluster, u16)> {
    if !netns::available() || !std::path::Path::new(SEND).exists() {
        eprintln!("skipped: network namespaces or fence_kdump_send missing");
        return None;
    }
    let net = Net::new(3);
    let mut c = net.cluster(3);
    let port = 17410;
    let nodes: Vec<&str> = vec!["node1", "node2", "node3"];
    let agent = counting_agent(&c);
    let mut toml = c.stub_fencing("fence_failing", &agent, "1s", &nodes);
    toml = toml.replacen(
        "[fencing]\n",
        &format!(
            "[fencing]\nkdump-listen = \"{}:{port}\"\nkdump-timeout = \"1h\"\nkdump-window = \"{window}\"\ncheck-interval = \"0s\"\n",
            net.hosts[0].ip
        ),
        1,
    );
    // Its power-off keeps failing for the whole test.
    toml = toml.replacen(
        "[fencing.nodes.node1.power-management]\n",
        "[fencing.nodes.node1.power-management]\nretries = 1000\nretry-interval = \"1s\"\n",
        1,
    );
    toml.push_str("[fencing.nodes.node1]\nkdump = true\n");
    c.extra_daemon_toml = toml;
    let cfg = c.daemon_config();
    c.daemon = Some(c.spawn_wrapped(
        "daemon",
        &net.exec(0).iter().map(String::as_str).collect::<Vec<_>>(),
        &["--config", cfg.to_str().unwrap(), "daemon"],
    ));
    c.wait_api().await;
    for i in 0..3 {
        let w = net.exec(i + 1);
        c.start_collector_wrapped(i, &w.iter().map(String::as_str).collect::<Vec<_>>());
    }
    c.wait_collectors_ready().await;
    wait_for("node1 heard by its watchers", || async {
        let w = c.node("node1").await;
        (w["witnesses"]["heard-by"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await;
    Some((net, c, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kdump_notification_within_the_window_releases_a_dead_node_with_no_power_off_at_all() {
    let Some((net, mut c, port)) = setup("1h").await else {
        return;
    };
    // Before anything happens: a notification from node2 (not configured for kdump) and one
    // from the master's own address (no node's) are refused.
    send_from(&net, 2, &net.hosts[0].ip, port);
    let m = wait_for("the refusals counted", || async {
        let m = c.metrics().await;
        m.contains(r#"maintd_kdump_notifications_total{result="not-configured"} 3"#)
            .then_some(m)
    })
    .await;
    assert!(!m.contains(r#"result="accepted""#), "{m}");
    // node1 dies; its peers lose it; the flow starts, and its power-off waits for the window.
    c.kill_collector(0);
    let f = c
        .wait_flow("node1's flow, waiting for a kdump notification", |f| {
            f["node"] == "node1" && has_note(f, "waits for a kdump notification")
        })
        .await;
    assert_eq!(f["released"], false, "{f:#}");
    c.some_polls(10).await;
    assert_eq!(agent_calls(&c), 0, "no power-off before the window decides");
    // Its crash kernel says so.
    send_from(&net, 1, &net.hosts[0].ip, port);
    let f = c
        .wait_flow("the release after the kdump notification", |f| {
            f["node"] == "node1" && f["released"] == true
        })
        .await;
    assert_eq!(f["fenced"], false, "released with no power-off: {f:#}");
    assert!(f["kdump-at"].as_i64().is_some(), "{f:#}");
    assert!(
        c.hook_log().iter().any(|l| l.starts_with("release node1")),
        "{:?}",
        c.hook_log()
    );
    c.some_polls(10).await;
    assert_eq!(agent_calls(&c), 0, "no power-off during the dump: {f:#}");
    assert_eq!(f["calls"].as_array().map(Vec::len), Some(0), "{f:#}");
    let m = c.metrics().await;
    assert!(
        m.contains(r#"maintd_kdump_notifications_total{result="accepted"}"#),
        "{m}"
    );
    assert!(c.daemon_log().contains("kdump message refused"));
    // Nothing for node2, whose refused messages proved nothing.
    let (_, flows) = c.get("/1/fences").await;
    assert!(
        flows
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["node"] == "node1"),
        "{flows:#}"
    );
    c.kill_daemon();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_for_the_whole_kdump_window_lets_the_power_off_go() {
    let Some((_net, mut c, _port)) = setup("4s").await else {
        return;
    };
    c.kill_collector(0);
    let f = c.wait_flow("node1's flow", |f| f["node"] == "node1").await;
    assert_eq!(agent_calls(&c), 0, "{f:#}");
    let f = c
        .wait_flow("the power-off after the window", |f| {
            // A call is recorded (pending) before the agent runs: wait for its answer, which
            // comes only once the agent has run.
            let answered = |a: &Vec<serde_json::Value>| a.iter().any(|x| x["pending"] != true);
            f["node"] == "node1" && f["calls"].as_array().is_some_and(answered)
        })
        .await;
    // The window runs from when the collector went silent.
    let detected = f["detected"].as_i64().unwrap();
    let first = f["calls"][0]["at"].as_i64().unwrap();
    assert!(
        first - detected >= 4_000_000_000,
        "the first call {:.1} s after the silence: {f:#}",
        (first - detected) as f64 / 1e9
    );
    assert!(agent_calls(&c) > 0);
    assert_eq!(f["released"], false, "a failing power-off releases nothing");
    c.kill_daemon();
}
