//! The web status page in a real browser (headless Chromium over WebDriver) against a real
//! daemon: four nodes in network namespaces, one with a repair event whose details carry HTML
//! and script payloads, one fenced by the stand-in power switch, one cut from the master only
//! (partitioned), and one that reports a new event while the page is open. Needs root (for the
//! namespaces), `chromium` and `chromedriver`; skipped with a notice without them, required
//! under `scripts/test`. Screenshots go to `target/ui/`.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::browser::Browser;
use common::netns::{self, Net};
use common::*;
use serde_json::Value;

const XSS_SCRIPT: &str = "<script>document.title='XSS'</script>";
const XSS_IMG: &str = "<img src=x onerror=\"document.title='XSS'\">";
const XSS_ATTR: &str = "\"><svg onload=\"document.title='XSS'\">";

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ui")
}

/// What the page shows, read from its DOM.
const READ_PAGE: &str = r##"
const text = (sel) => [...document.querySelectorAll(sel)].map((e) => e.textContent);
return {
  path: location.pathname,
  title: document.title,
  scripts: document.scripts.length,
  injected: document.querySelectorAll("main img, main svg, main iframe, main script, main [onerror], main [onload]").length,
  conn: document.getElementById("conn").dataset.state,
  leader: document.getElementById("leader").textContent,
  fencing: document.getElementById("fencing").textContent,
  events: text("#events-rows tr"),
  eventNodes: [...document.querySelectorAll("#events-rows tr")].map((e) => e.dataset.node),
  flows: text("#fences-list article"),
  flowNodes: [...document.querySelectorAll("#fences-list article")].map((e) => e.dataset.node),
  nodes: Object.fromEntries([...document.querySelectorAll("#nodes-rows tr")].map((e) => [e.dataset.node, e.textContent])),
  commands: text("#commands-rows tr"),
};
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_events_fences_and_partitions_escapes_node_data_and_updates_live() {
    if !netns::available() {
        return;
    }
    let Some(browser) = Browser::start(1280, 2400).await else {
        return;
    };
    let net = Net::new(4);
    let mut c = Cluster::new(4);
    c.daemon_host = net.hosts[0].ip.clone();
    c.node_hosts = net.hosts[1..].iter().map(|h| h.ip.clone()).collect();
    c.ports = vec![1815; 4];
    c.api_port = 1816;
    c.extra_collector_toml =
        "[collector.heartbeat]\ninterval = \"200ms\"\nlost-after = \"1s\"\nwindow = \"5s\"\n"
            .into();
    // Every node has a power switch; a fenced node and a partitioned one together are half the
    // cluster, under the storm threshold.
    c.extra_daemon_toml = c
        .stub_fencing(
            "fence_ok",
            POWER_AGENT,
            "1s",
            &["node1", "node2", "node3", "node4"],
        )
        .replace("storm-percent = 50", "storm-percent = 75");
    let details = serde_json::json!({ "why": [XSS_SCRIPT, XSS_IMG, XSS_ATTR] });
    c.set_verdict(
        "node2",
        &serde_json::json!({ "status": "evacuate", "details": details }).to_string(),
    );
    let cfg = c.daemon_config();
    c.daemon = Some(c.spawn_wrapped(
        "daemon",
        &net.exec(0).iter().map(String::as_str).collect::<Vec<_>>(),
        &["--config", cfg.to_str().unwrap(), "daemon"],
    ));
    for i in 0..4 {
        let cfg = c.collector_config(i, "scripted", "cluster.key");
        let name = format!("collector-{}", c.nodes[i]);
        let wrapper = net.exec(i + 1);
        let w: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        c.collectors[i] =
            Some(c.spawn_wrapped(&name, &w, &["--config", cfg.to_str().unwrap(), "collector"]));
    }
    c.wait_api().await;
    c.wait_status("node2", "completed").await;
    for n in ["node1", "node3"] {
        wait_for("the node heard by its watchers", || async {
            let w = c.node(n).await;
            (w["witnesses"]["heard-by"].as_array().map(Vec::len) >= Some(1)).then_some(())
        })
        .await;
    }
    // node1 dies: fenced by its switch, its workloads released.
    c.kill_collector(0);
    c.wait_flow("node1 fenced and released", |f| {
        f["node"] == "node1" && f["fenced"] == true && f["released"] == true
    })
    .await;
    // node3 is cut from the master only: its watchers still hear it.
    net.cut(0, 3);
    wait_for("node3 partitioned", || async {
        let n = c.node("node3").await;
        (n["witnesses"]["partitioned"] == true && n["reachable"] == false).then_some(())
    })
    .await;

    // A browser asking for `/` is sent to the page; API clients still get the versions.
    browser.goto(&format!("{}/", c.url())).await;
    let page = browser
        .wait_until(
            "the page to show the three lists",
            &read_when(
                "p.eventNodes.includes('node2') && p.flowNodes.includes('node1') \
                 && (p.nodes.node3 || '').includes('unreachable') && p.conn === 'live' \
                 && !p.fencing.includes('…') && !p.leader.includes('…')",
            ),
        )
        .await;
    assert_eq!(page["path"], "/ui/", "{page:#}");
    assert_eq!(c.get("/").await.1, serde_json::json!([1]));
    let head = c
        .client
        .get(format!("{}/ui/", c.url()))
        .send()
        .await
        .unwrap();
    let policy = head.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("default-src 'none'"),
        "{policy}"
    );

    // Node data is text: the payloads show as written, and none became an element or ran.
    let event = event_text(&page, "node2");
    for payload in [XSS_SCRIPT, "<img src=x onerror=", "\"><svg onload="] {
        assert!(
            event.contains(payload),
            "{payload} not shown as text: {event}"
        );
    }
    assert!(
        event.contains("evacuate") && event.contains("completed"),
        "{event}"
    );
    assert!(event.contains("maintd:repairready:"), "{event}");
    assert_eq!(page["injected"], 0, "{page:#}");
    assert_eq!(page["scripts"], 1, "only the page's own script: {page:#}");
    assert_eq!(page["title"], "maintd");
    assert_eq!(page["conn"], "live", "{page:#}");

    // The fenced node: its flow with its steps, and the node unreachable.
    let flow = page["flows"][index_of(&page["flowNodes"], "node1")]
        .as_str()
        .unwrap()
        .to_string();
    for want in [
        "fenced",
        "released",
        "power-management",
        "fence_ok",
        "collector silent",
    ] {
        assert!(flow.contains(want), "{want} missing from the flow: {flow}");
    }
    let nodes = &page["nodes"];
    assert!(
        nodes["node1"].as_str().unwrap().contains("unreachable"),
        "{nodes:#}"
    );
    let node3 = nodes["node3"].as_str().unwrap();
    assert!(
        node3.contains("partitioned") && node3.contains("unreachable"),
        "{node3}"
    );
    let node4 = nodes["node4"].as_str().unwrap();
    assert!(
        node4.contains("reachable") && node4.contains("active"),
        "{node4}"
    );
    // Its clock, as the probe measures it against the master's: the same machine, well under
    // a second.
    assert!(node4.contains("clock ") && node4.contains(" ms"), "{node4}");
    assert!(
        page["fencing"].as_str().unwrap().contains("active"),
        "{page:#}"
    );
    assert!(!page["leader"].as_str().unwrap().contains('…'), "{page:#}");

    // A new event appears without a reload.
    browser
        .eval("window.__kept = 'no reload'; return null;")
        .await;
    c.set_verdict(
        "node4",
        r#"{"status":"live-repair","command":"fix","details":{"disk":"sdb"}}"#,
    );
    let live = browser
        .wait_until(
            "node4's event on the open page",
            &read_when("p.eventNodes.includes('node4')"),
        )
        .await;
    assert!(
        event_text(&live, "node4").contains("live-repair"),
        "{live:#}"
    );
    assert_eq!(browser.eval("return window.__kept;").await, "no reload");
    // An operator's pause: the page says who paused, and the command is in its trail.
    let out = c.cli(&["fencing", "pause", "--reason", "ui check"]);
    assert!(out.status.success(), "{out:?}");
    let paused = browser
        .wait_until(
            "the pause and its command on the open page",
            &read_when("p.fencing.includes('(by cluster-key)') && p.commands.length > 0"),
        )
        .await;
    let cmd = paused["commands"][0].as_str().unwrap();
    assert!(
        cmd.contains("cluster-key") && cmd.contains("POST /1/fencing/pause") && cmd.contains("200"),
        "{paused:#}"
    );
    assert!(c.cli(&["fencing", "resume"]).status.success());
    browser.screenshot(&shots().join("desktop.png")).await;

    // A phone: nothing wider than the screen, every list still there.
    browser.resize(390, 844).await;
    let fits = browser
        .eval("return [document.documentElement.scrollWidth, window.innerWidth];")
        .await;
    let (wide, screen) = (fits[0].as_u64().unwrap(), fits[1].as_u64().unwrap());
    assert!(screen <= 500, "the window did not shrink: {fits}");
    assert!(
        wide <= screen,
        "the page is {wide} px wide on a {screen} px screen"
    );
    browser.screenshot(&shots().join("phone.png")).await;
}

/// Reads the page and returns what it read once `cond` (over `p`) holds, else null.
fn read_when(cond: &str) -> String {
    format!("const read = () => {{{READ_PAGE}}}; const p = read(); return ({cond}) ? p : null;")
}

fn index_of(list: &Value, node: &str) -> usize {
    list.as_array()
        .and_then(|l| l.iter().position(|n| n == node))
        .unwrap_or_else(|| panic!("{node} not in {list}"))
}

fn event_text(page: &Value, node: &str) -> String {
    page["events"][index_of(&page["eventNodes"], node)]
        .as_str()
        .unwrap()
        .to_string()
}

/// The page on an operator's worst day: a node put into maintenance says so in its row, and
/// when the daemon restarts under an open page (its watches held), the daemon stops at once and
/// the page is live again a few seconds after the new daemon answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_maintenance_and_reconnects_after_a_daemon_restart() {
    let Some(browser) = Browser::start(1280, 1200).await else {
        return;
    };
    let mut c = Cluster::new(2);
    c.start().await;
    c.wait_collectors_ready().await;
    browser.goto(&format!("{}/", c.url())).await;
    browser
        .wait_until(
            "the live page",
            &read_when("p.conn === 'live' && p.nodes.node1"),
        )
        .await;
    let out = c.cli(&[
        "maintenance",
        "start",
        "node1",
        "--reason",
        "disk swap in bay 3",
    ]);
    assert!(out.status.success(), "{out:?}");
    let p = browser
        .wait_until(
            "node1's maintenance on the open page",
            &read_when("(p.nodes.node1 || '').includes('disk swap in bay 3')"),
        )
        .await;
    assert!(
        p["nodes"]["node1"]
            .as_str()
            .unwrap()
            .contains("maintenance"),
        "{p:#}"
    );
    assert!(
        !p["nodes"]["node2"]
            .as_str()
            .unwrap()
            .contains("maintenance"),
        "{p:#}"
    );
    // Let the page's watches be held, then restart the daemon under them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopping = Instant::now();
    let code = c.daemon.as_mut().unwrap().terminate().await;
    assert_eq!(code.code(), Some(0));
    let stop_took = stopping.elapsed();
    browser
        .wait_until(
            "the page to see the daemon gone",
            &read_when("p.conn === 'error'"),
        )
        .await;
    c.start_daemon();
    c.wait_api().await;
    let answering = Instant::now();
    browser
        .wait_until("the page live again", &read_when("p.conn === 'live'"))
        .await;
    let back_took = answering.elapsed();
    // Far below the 30 s request timeout that used to hold both (the page retries every 2 s).
    assert!(
        stop_took < Duration::from_secs(20),
        "SIGTERM took {stop_took:?}"
    );
    assert!(
        back_took < Duration::from_secs(20),
        "reconnecting took {back_took:?}"
    );
    eprintln!("daemon stopped in {stop_took:?}; page live {back_took:?} after the restart");
}
