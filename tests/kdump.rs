//! kdump on a real network: a node's collector dies, its peers lose it, and the real
//! `fence_kdump_send` (Debian's fence-agents) in the node's network namespace tells the master
//! it runs its crash kernel. Its workloads are released at once, while its power-off, failing,
//! has proven nothing. The same message from another node's address, or from an address no
//! node has, is refused and counted.

mod common;

use common::netns::{self, Net};
use common::*;

const SEND: &str = "/usr/libexec/fence-agents/fence_kdump_send";

/// An agent whose power-off always fails: only kdump can release.
const FAILING_AGENT: &str = "cat >/dev/null; exit 1";

fn send_from(net: &Net, host: usize, to: &str, port: u16) {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &net.hosts[host].ns, SEND])
        .args(["-p", &port.to_string(), "-c", "3", "-i", "1", to]);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kdump_notification_releases_a_dead_nodes_workloads_before_any_power_off() {
    if !netns::available() || !std::path::Path::new(SEND).exists() {
        eprintln!("skipped: network namespaces or fence_kdump_send missing");
        return;
    }
    let net = Net::new(3);
    let mut c = Cluster::new(3);
    c.daemon_host = net.hosts[0].ip.clone();
    c.node_hosts = net.hosts[1..].iter().map(|h| h.ip.clone()).collect();
    c.ports = vec![1815; 3];
    c.api_port = 1816;
    let port = 17410;
    let nodes: Vec<&str> = vec!["node1", "node2", "node3"];
    let mut toml = c.stub_fencing("fence_failing", FAILING_AGENT, "1s", &nodes);
    toml = toml.replacen(
        "[fencing]\n",
        &format!(
            "[fencing]\nkdump-listen = \"{}:{port}\"\nkdump-timeout = \"1h\"\ncheck-interval = \"0s\"\n",
            net.hosts[0].ip
        ),
        1,
    );
    // Its power-off keeps failing for the whole test.
    toml = toml.replacen(
        "[fencing.nodes.node1.power-management]\n",
        "[fencing.nodes.node1.power-management]\nretries = 1000\n",
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
    // node1 dies; its peers lose it; the flow starts and its power-off fails.
    c.kill_collector(0);
    let f = c
        .wait_flow("node1's flow, its power-off failing", |f| {
            f["node"] == "node1" && f["calls"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    assert_eq!(f["released"], false, "{f:#}");
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
