//! A fenced node's power-on and return to service, with the real `fence_ipmilan` against
//! `ipmi_sim`, whose power state drives a stand-in node (tests/support/powered-node): off
//! kills its collector, on starts it again with a new boot id. The return only on proof of the
//! new boot; a BMC that reports OFF but never switched the node raises the alarm; a node that
//! does not boot fails its flow at the deadline.

use crate::common;

use std::time::Duration;

use common::sims::{self, Ipmi, PoweredNode};
use common::*;
use serde_json::Value;

/// node1 behind an IPMI BMC, powered back on after the release; fast detection.
fn start(extra: &str) -> (Cluster, Ipmi) {
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    c.extra_daemon_toml = format!(
        r#"
[fencing]
check-interval = "0s"
grace = "1s"
liveness-interval = "200ms"
liveness-timeout = "500ms"
cooldown = "2s"
storm-percent = 50
max-restarts = 0
{extra}
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{pw}" }}
after-release = "on"
[fencing.nodes.node1.power-management]
retries = 1
timeout = "20s"
methods = [{{ template = "ipmi", params = {{ {params} }} }}]
"#,
        pw = c.secret("bmc.pw", "s3cret").display(),
        params = ipmi.params()
    );
    (c, ipmi)
}

/// Starts the daemon and the collectors, node1's as a stand-in node that follows its BMC.
async fn run(c: &mut Cluster, ipmi: &Ipmi) -> PoweredNode {
    c.start_daemon();
    for i in 1..c.nodes.len() {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    let node = PoweredNode::start(c, 0, ipmi);
    c.wait_collectors_ready().await;
    c.wait_api().await;
    c.some_polls(5).await;
    node
}

fn notes(f: &Value) -> Vec<String> {
    f["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{} {}: {}",
                t["step"].as_str().unwrap(),
                t["status"].as_str().unwrap(),
                t["note"].as_str().unwrap()
            )
        })
        .collect()
}

fn calls(f: &Value) -> Vec<String> {
    f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            format!(
                "{} {}",
                x["agent"].as_str().unwrap(),
                x["action"].as_str().unwrap()
            )
        })
        .collect()
}

/// Waits for a drill in `/1/drills` that satisfies `pred`.
async fn wait_drill(c: &Cluster, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, || async {
        let v = c.get("/1/drills").await.1;
        v.as_array()?.iter().find(|d| pred(d)).cloned()
    })
    .await
}

fn position(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_powered_on_after_the_release_and_returns_only_on_its_new_boot() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi) = start("");
    let node = run(&mut c, &ipmi).await;
    let before = c.boot_id(0);
    assert!(!before.is_empty());
    node.hang(true);
    let f = c
        .wait_flow("the return to service", |f| {
            f["node"] == "node1" && f["status"] == "final"
        })
        .await;
    let n = notes(&f);
    assert_eq!(
        calls(&f),
        [
            "fence_ipmilan off",
            "fence_ipmilan status",
            "fence_ipmilan on",
            "fence_ipmilan status"
        ],
        "{n:#?}"
    );
    assert!(ipmi.powered_on(), "the BMC reads power on");
    // The boot before the fence, and the new one the node proved.
    let after = c.boot_id(0);
    assert_ne!(before, after);
    assert_eq!(f["boot-before"], before.as_str(), "{f:#}");
    assert_eq!(f["returned-boot"], after.as_str(), "{f:#}");
    assert!(f["powered-on-at"].as_i64() >= f["released-at"].as_i64());
    assert!(f["returned-at"].as_i64() > f["powered-on-at"].as_i64());
    assert!(n.iter().any(|x| x.starts_with("power-on done")), "{n:#?}");
    let newboot = n.iter().find(|x| x.contains("new boot id")).unwrap();
    assert!(
        newboot.contains(&after) && newboot.contains(&before),
        "{newboot}"
    );
    let proof = n
        .iter()
        .find(|x| x.contains("return to service proven"))
        .unwrap();
    // At least `return-reports` (3); the fencer may read the count a poll later, on a loaded
    // machine, so it can be higher (that it returns exactly at 3 is the property test's).
    let healthy: u32 = proof
        .split(" healthy reports")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {proof}"));
    assert!(healthy >= 3, "{proof}");
    // Unschedulable from before the off until the proven return; released exactly once.
    let log = c.hook_log();
    let (offline, release, reclaim, online) = (
        position(&log, "offline node1"),
        position(&log, "release node1"),
        position(&log, "reclaim node1"),
        position(&log, "online node1"),
    );
    assert!(
        offline < release && release < reclaim && reclaim < online,
        "{log:?}"
    );
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("release node1"))
            .count(),
        1
    );
    assert_eq!(c.node("node1").await["offline"], false);
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("maintd_fence_returns_total 1"),
        "{metrics}"
    );
    assert!(!serde_json::to_string(&f).unwrap().contains("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_reports_off_but_never_switched_the_node_raises_the_alarm() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi) = start("");
    let node = run(&mut c, &ipmi).await;
    let boot = c.boot_id(0);
    ipmi.set_lying();
    node.hang(true);
    c.wait_flow("the verified power-on", |f| {
        f["node"] == "node1" && f["powered-on-at"].is_i64()
    })
    .await;
    assert!(ipmi.powered_on(), "the node was never switched");
    // The node runs on: its collector answers again, from the boot it always had.
    node.hang(false);
    let f = c
        .wait_flow("the alarm", |f| f["node"] == "node1" && f["tagged"] == true)
        .await;
    assert_eq!(c.boot_id(0), boot);
    let alarm = f["alarm"].as_str().unwrap();
    assert!(alarm.contains(&boot) && alarm.contains("lied"), "{alarm}");
    assert_eq!(f["status"], "error");
    assert_eq!(f["reclaimed"], false);
    let log = c.hook_log();
    assert!(
        !log.iter().any(|l| l.starts_with("reclaim node1")),
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.starts_with("online node1")),
        "{log:?}"
    );
    assert_eq!(
        c.node("node1").await["offline"],
        true,
        "it stays out of service"
    );
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("maintd_fence_alarms_total{node=\"node1\"} 1"),
        "{metrics}"
    );
    assert!(c.daemon_log().contains("fence alarm"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_boot_after_its_power_on_fails_its_flow_at_the_deadline() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi) = start("return-deadline = \"3s\"");
    let node = run(&mut c, &ipmi).await;
    ipmi.set_no_boot();
    node.hang(true);
    let f = c
        .wait_flow("the deadline", |f| {
            f["node"] == "node1" && f["tagged"] == true
        })
        .await;
    assert!(ipmi.powered_on());
    let n = notes(&f);
    let last = n.iter().rfind(|x| x.starts_with("recovery error")).unwrap();
    assert!(
        last.contains("did not return to service within 3 s of its power-on"),
        "{n:#?}"
    );
    assert_eq!(c.node("node1").await["offline"], true);
    c.some_polls(3).await;
    assert!(!c.hook_log().iter().any(|l| l.starts_with("reclaim node1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_drains_fences_powers_on_and_returns_the_node_and_records_each_stage() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi) = start("");
    let _node = run(&mut c, &ipmi).await;
    let url = c.url();
    // A node without a fence plan, or a drill while one runs, is refused with the reason.
    let out = c.cli(&["drill", "node2", "--url", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no fence configuration"),
        "{err}"
    );
    let before = c.boot_id(0);
    let out = c.cli(&["drill", "node1", "--url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c.cli(&["drill", "node1", "--url", &url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("one drill at a time"), "{err}");
    let d = wait_drill(&c, "the drill to pass", |d| {
        d["status"] == "passed" || d["status"] == "failed"
    })
    .await;
    assert_eq!(d["status"], "passed", "{d:#}");
    let stages: Vec<&str> = d["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "evacuation",
            "power-off",
            "release",
            "power-on",
            "boot",
            "return",
            "total"
        ],
        "{d:#}"
    );
    assert!(
        d["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["seconds"].as_f64().unwrap() >= 0.0)
    );
    // Its flow: a real power cycle, back on a new boot.
    let f = c
        .wait_flow("the drill's flow", |f| f["id"] == d["flow"])
        .await;
    assert_eq!(f["status"], "final");
    assert_eq!(
        f["witnesses"]["manual"],
        format!("drill {}", d["id"].as_str().unwrap())
    );
    assert_ne!(c.boot_id(0), before);
    assert_eq!(f["returned-boot"], c.boot_id(0).as_str());
    let log = c.hook_log();
    let order: Vec<usize> = [
        "evacuate node1",
        "release node1",
        "reclaim node1",
        "online node1",
    ]
    .iter()
    .map(|p| position(&log, p))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{log:?}");
    assert_eq!(c.node("node1").await["offline"], false);
    let m = c.metrics().await;
    assert!(m.contains("maintd_drill_passed{node=\"node1\"} 1"), "{m}");
    assert!(
        m.contains("maintd_drill_last_timestamp_seconds{node=\"node1\"}"),
        "{m}"
    );
    let out = c.cli(&["drills", "--url", &url]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("passed") && listed.contains("power-on"),
        "{listed}"
    );

    // A drain that cannot move what the node runs: refused, and nothing is fenced.
    c.set_hook("evacuate", "echo 'pod db-0 has no controller' >&2; exit 1");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = c.cli(&["drill", "node1", "--url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = wait_drill(&c, "the drill to be refused", |d| d["status"] == "refused").await;
    let why = d["detail"].as_str().unwrap();
    assert!(
        why.contains("cannot move") && why.contains("no controller"),
        "{why}"
    );
    let flows = c.get("/1/fences").await.1;
    assert_eq!(
        flows.as_array().unwrap().len(),
        1,
        "only the first drill fenced: {flows:#}"
    );
    assert!(
        c.metrics()
            .await
            .contains("maintd_drill_passed{node=\"node1\"} 0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_drill_runs_by_itself_and_not_again_within_its_interval() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi) = start("drill-every = \"1h\"");
    let _node = run(&mut c, &ipmi).await;
    let d = wait_drill(&c, "the scheduled drill to pass", |d| {
        d["status"] == "passed" || d["status"] == "failed"
    })
    .await;
    assert_eq!(
        (d["node"].as_str(), d["status"].as_str()),
        (Some("node1"), Some("passed")),
        "{d:#}"
    );
    assert!(c.daemon_log().contains("scheduled fencing drill started"));
    // Within the hour, no second one.
    c.some_polls(20).await;
    assert_eq!(c.get("/1/drills").await.1.as_array().unwrap().len(), 1);
}
