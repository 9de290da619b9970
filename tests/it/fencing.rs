//! Fencing with real ClusterLabs agents against device simulators on 127.0.0.1: ipmi_sim +
//! fence_ipmilan, sushy-tools + fence_redfish, snmpsim + fence_apc_snmp / fence_ifmib; faults that
//! must never release workloads; storm protection; kill -9 between power-off and release.

use crate::common;

use common::sims::{self, Ipmi, Redfish, Snmp};
use common::*;
use serde_json::Value;

/// Common fencing settings: fast detection for tests (the benchmark uses the defaults). The
/// readiness checks are off, so every agent call a test sees is its flow's; one test turns them
/// on.
fn fencing_toml(c: &Cluster, storm_percent: u32, body: &str) -> String {
    format!(
        r#"
[fencing]
check-interval = "0s"
grace = "1s"
liveness-interval = "200ms"
liveness-timeout = "500ms"
cooldown = "2s"
max-in-flight = 5
storm-percent = {storm_percent}
max-restarts = 0
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{pw}" }}
[fencing.templates.switch]
agent = "fence_ifmib"
params = {{ ip = "127.0.0.1", community = "switch", snmp_version = "1" }}
[fencing.templates.pdu]
agent = "fence_apc_snmp"
params = {{ ip = "127.0.0.1", community = "apc", snmp_version = "1" }}
[fencing.templates.redfish]
agent = "fence_redfish"
secrets = {{ password = "{pw}" }}
{body}
"#,
        pw = c.secret("bmc.pw", "s3cret").display()
    )
}

fn ipmi_stage(stage: &str, ipmi: &Ipmi, extra: &str) -> String {
    format!(
        "[fencing.nodes.node1.{stage}]\nretries = 0\ntimeout = \"20s\"\nmethods = [{{ template = \"ipmi\", params = {{ {} {extra} }} }}]\n",
        ipmi.params()
    )
}

/// Waits for node1's flow to satisfy `pred`.
async fn wait_flow(c: &Cluster, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    c.wait_flow(what, |f| f["node"] == "node1" && pred(f)).await
}

fn history(f: &Value) -> Vec<String> {
    f["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{} {}",
                t["step"].as_str().unwrap(),
                t["status"].as_str().unwrap()
            )
        })
        .collect()
}

fn releases(c: &Cluster) -> usize {
    c.hook_log()
        .iter()
        .filter(|l| l.starts_with("release node1"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_power_off_with_ifmib_isolation_then_recovery_powers_on_and_unisolates() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    let snmp = Snmp::start(c.dir.path());
    let isolate = format!(
        "[fencing.nodes.node1.isolation]\nretries = 0\ntimeout = \"20s\"\nmethods = [{{ template = \"switch\", params = {{ ipport = \"{}\", plug = \"1\" }} }}]\n",
        snmp.port
    );
    let recover = format!(
        "[fencing.nodes.node1.recovery]\nretries = 1\ntimeout = \"20s\"\nmethods = [{{ template = \"ipmi\", params = {{ {} }} }}, {{ template = \"switch\", params = {{ ipport = \"{}\", plug = \"1\" }} }}]\n",
        ipmi.params(),
        snmp.port
    );
    let body = format!(
        "{isolate}{}{recover}",
        ipmi_stage("power-management", &ipmi, "")
    );
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    c.start().await;
    assert!(ipmi.powered_on() && snmp.port_up(1));
    c.kill_collector(0);
    let f = wait_flow(&c, "the release", |f| f["released"] == true).await;
    assert!(!ipmi.powered_on(), "the BMC must read power off");
    assert!(!snmp.port_up(1), "the switch port must be down");
    assert_eq!(releases(&c), 1);
    assert_eq!(
        c.node("node1").await["offline"],
        true,
        "a fenced node is offline"
    );
    let h = history(&f);
    assert_eq!(&h[..2], ["isolation new", "isolation running"]);
    assert!(h.contains(&"power-management done".to_string()), "{h:?}");
    // The power-on may have started by now: its call is on record, pending, before it is made.
    let calls: Vec<(String, String)> = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["pending"] != true)
        .map(|x| {
            (
                x["agent"].as_str().unwrap().into(),
                x["action"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("fence_ifmib", "off"),
            ("fence_ipmilan", "off"),
            ("fence_ipmilan", "status")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // No password in the API or the daemon's log.
    assert!(!serde_json::to_string(&f).unwrap().contains("s3cret"));
    assert!(!c.daemon_log().contains("s3cret"));
    // The fence flow is an event in /1/status meanwhile.
    let st = c.status().await;
    assert!(
        st.iter()
            .any(|e| e["id"] == f["id"] && e["action"] == "fence"),
        "{st:?}"
    );

    // The node is repaired and its collector answers again: recovery powers on and un-isolates.
    c.start_collector_with(0, "scripted", "cluster.key");
    // Read while recovery runs: the list the API keeps must not outlive the flow's changes.
    let _ = c.status().await;
    let f = wait_flow(&c, "recovery", |f| f["status"] == "final").await;
    assert!(ipmi.powered_on(), "recovery powers the node back on");
    assert!(snmp.port_up(1), "recovery brings the switch port back up");
    assert_eq!(f["reclaimed"], true);
    let st = c.status().await;
    assert!(
        !st.iter().any(|e| e["id"] == f["id"]),
        "a final flow is no event: {st:?}"
    );
    assert!(c.hook_log().iter().any(|l| l.starts_with("reclaim node1")));
    assert_eq!(c.node("node1").await["offline"], false);
    assert_eq!(releases(&c), 1);
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("maintd_fence_stage_seconds_count{stage=\"power-off\"} 1"),
        "{metrics}"
    );
    // The adaptive detector's wait for a node that kept answering: past its probe interval,
    // within the bound.
    let wait: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("maintd_probe_suspect_after_seconds{node=\"node2\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no detector wait for node2: {metrics}"));
    assert!((0.2..=30.0).contains(&wait), "{wait}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_and_apc_pdu_power_off_and_release() {
    if !sims::available() {
        return;
    }
    for agent in ["redfish", "pdu"] {
        let mut c = Cluster::new(3);
        let redfish = (agent == "redfish").then(|| Redfish::start(c.dir.path()));
        let snmp = (agent == "pdu").then(|| Snmp::start(c.dir.path()));
        let params = match (&redfish, &snmp) {
            (Some(r), _) => r.params(),
            (_, Some(s)) => format!(r#"ipport = "{}", plug = "2""#, s.port),
            _ => unreachable!(),
        };
        let body = format!(
            "[fencing.nodes.node1.power-management]\nretries = 0\ntimeout = \"20s\"\nmethods = [{{ template = \"{agent}\", params = {{ {params} }} }}]\n"
        );
        c.extra_daemon_toml = fencing_toml(&c, 50, &body);
        c.start().await;
        c.kill_collector(0);
        wait_flow(&c, "the release", |f| f["released"] == true).await;
        if let Some(r) = &redfish {
            assert_eq!(r.power_state().as_deref(), Some("Off"));
        }
        if let Some(s) = &snmp {
            assert!(!s.outlet_on(2), "the PDU outlet must be off");
            assert!(s.outlet_on(1), "other outlets untouched");
        }
        assert_eq!(releases(&c), 1);
    }
}

/// Runs one fault: the flow must end in error, tagged fencefailed, with nothing released.
async fn assert_fault_never_releases(c: &mut Cluster, expect: &str) -> Value {
    c.start().await;
    c.kill_collector(0);
    let f = wait_flow(c, "the flow to fail", |f| {
        f["status"] == "error" && f["tagged"] == true
    })
    .await;
    let note = f["history"].as_array().unwrap().last().unwrap()["note"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(note.contains(expect), "{note}");
    assert_eq!(f["released"], false);
    assert_eq!(f["fenced"], false);
    assert_eq!(releases(c), 0, "workloads must not be released");
    let tag = format!("maintd:fencefailed:{}", f["id"].as_str().unwrap());
    let (_, tags) = c.get("/1/tags?node=node1").await;
    assert!(
        tags["node1"].as_array().unwrap().iter().any(|t| t == &tag),
        "{tags}"
    );
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_and_releases_nothing() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    let wrong = c.secret("wrong.pw", "nope");
    let body = ipmi_stage("power-management", &ipmi, "").replace(
        "template = \"ipmi\", params",
        &format!(
            "template = \"ipmi\", secrets = {{ password = \"{}\" }}, params",
            wrong.display()
        ),
    );
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    assert_fault_never_releases(&mut c, "fence_ipmilan off failed").await;
    assert!(ipmi.powered_on());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_bmc_fails_within_power_timeout_and_releases_nothing() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let mut ipmi = Ipmi::start(c.dir.path(), "node1");
    ipmi.kill();
    let body = ipmi_stage("power-management", &ipmi, r#", power_timeout = "3""#);
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    let f = assert_fault_never_releases(&mut c, "failed").await;
    let call = &f["calls"][0];
    assert!(
        call["elapsed-ms"].as_u64().unwrap() < 20_000,
        "bounded by power_timeout: {call}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_accepts_off_but_stays_on_releases_nothing() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    ipmi.set_stuck();
    let body = ipmi_stage("power-management", &ipmi, r#", power_timeout = "3""#);
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    assert_fault_never_releases(&mut c, "fence_ipmilan").await;
    assert!(ipmi.powered_on());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redfish_server_is_killed_at_the_deadline_and_releases_nothing() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let r = Redfish::start(c.dir.path());
    r.hang();
    let body = format!(
        "[fencing.nodes.node1.power-management]\nretries = 0\ntimeout = \"3s\"\nmethods = [{{ template = \"redfish\", params = {{ {} }} }}]\n",
        r.params()
    );
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    let f = assert_fault_never_releases(&mut c, "killed").await;
    let call = &f["calls"][0];
    let ms = call["elapsed-ms"].as_u64().unwrap();
    assert!(
        (2_900..15_000).contains(&ms),
        "killed at the 3 s deadline: {call}"
    );
    assert!(
        call["output"]
            .as_str()
            .unwrap()
            .contains("process group was killed"),
        "{call}"
    );
    // No fence_redfish is left behind: nothing still holds a connection to this test's hung
    // server (scoped to its port: other tests, or another suite, may run agents of their own).
    let ss = std::process::Command::new("ss")
        .args(["-Htnp", "state", "established"])
        .arg(format!("( dport = :{} )", r.port))
        .output()
        .expect("ss (iproute2)");
    assert!(ss.status.success());
    let left = String::from_utf8_lossy(&ss.stdout);
    assert!(
        left.trim().is_empty(),
        "a fence_redfish survived its deadline: {left}"
    );
}

/// node1 with a switch isolation that the agent's own `delay` keeps running for `delay` seconds,
/// IPMI power management and switch recovery; its collector killed, and isolation running.
async fn start_with_slow_isolation(delay: u32) -> (Cluster, Ipmi, Snmp, Value) {
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    let snmp = Snmp::start(c.dir.path());
    let body = format!(
        "[fencing.nodes.node1.isolation]\nretries = 0\ntimeout = \"20s\"\nmethods = [{{ template = \"switch\", params = {{ ipport = \"{port}\", plug = \"1\", delay = \"{delay}\" }} }}]\n{}[fencing.nodes.node1.recovery]\nmethods = [{{ template = \"switch\", params = {{ ipport = \"{port}\", plug = \"1\" }} }}]\n",
        ipmi_stage("power-management", &ipmi, ""),
        port = snmp.port
    );
    c.extra_daemon_toml = fencing_toml(&c, 50, &body);
    c.start().await;
    c.kill_collector(0);
    let f = wait_flow(&c, "isolation to run", |f| {
        f["step"] == "isolation" && f["status"] == "running"
    })
    .await;
    (c, ipmi, snmp, f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_during_isolation_recovers_without_power_off() {
    if !sims::available() {
        return;
    }
    let (mut c, ipmi, snmp, _) = start_with_slow_isolation(4).await;
    c.start_collector_with(0, "scripted", "cluster.key");
    let f = wait_flow(&c, "the flow to end", |f| f["status"] == "final").await;
    let h = history(&f);
    assert!(
        !h.iter().any(|s| s.starts_with("power-management")),
        "{h:?}"
    );
    assert!(h.contains(&"recovery done".to_string()), "{h:?}");
    assert!(ipmi.powered_on(), "no power-off");
    assert!(snmp.port_up(1), "un-isolated");
    assert_eq!(releases(&c), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_power_off_stops_the_flow_and_after_it_is_refused() {
    if !sims::available() {
        return;
    }
    let (c, ipmi, snmp, f) = start_with_slow_isolation(3).await;
    let id = f["id"].as_str().unwrap().to_string();
    let out = c.cli(&["cancel", &id]);
    assert!(out.status.success(), "{out:?}");
    let f = wait_flow(&c, "the canceled flow to end", |f| f["status"] == "final").await;
    assert_eq!(f["canceled"], true);
    assert!(
        !history(&f)
            .iter()
            .any(|s| s.starts_with("power-management"))
    );
    assert!(ipmi.powered_on());
    assert!(snmp.port_up(1), "isolation undone");
    assert_eq!(releases(&c), 0);
    let out = c.cli(&["cancel", &id]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("409"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_power_off_and_release_releases_exactly_once() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let log = c.path("hooks.log").display().to_string();
    c.set_hook(
        "release",
        &format!("echo \"release-start $1\" >> {log}; sleep 2; echo \"release $1 $2\" >> {log}"),
    );
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    c.extra_daemon_toml = fencing_toml(&c, 50, &ipmi_stage("power-management", &ipmi, ""));
    c.start().await;
    c.kill_collector(0);
    wait_for("the release hook to start", || async {
        c.hook_log()
            .iter()
            .any(|l| l.starts_with("release-start"))
            .then_some(())
    })
    .await;
    assert!(!ipmi.powered_on());
    c.kill_daemon();
    c.start_daemon();
    c.wait_api().await;
    let f = wait_flow(&c, "the release", |f| f["released"] == true).await;
    c.some_polls(5).await;
    let log = c.hook_log();
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("release-start"))
            .count(),
        1,
        "{log:?}"
    );
    assert_eq!(releases(&c), 1, "{log:?}");
    // The power-off was not repeated either: one off and one status.
    let offs = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["action"] == "off")
        .count();
    assert_eq!(offs, 1, "{f}");
}

/// Readiness: a wrong BMC password makes node1's fencing inactive at the start-up check, while
/// node2's device answers; nothing has failed yet and nothing is fenced. (Going back to active
/// is a decision of the checker, covered on the simulated-time harness.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_fencing_inactive_before_any_failure() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(3);
    let ipmi1 = Ipmi::start(c.dir.path(), "node1");
    let ipmi2 = Ipmi::start(c.dir.path(), "node2");
    let wrong = c.secret("node1.pw", "nope");
    let node1 = ipmi_stage("power-management", &ipmi1, "").replace(
        "template = \"ipmi\", params",
        &format!(
            "template = \"ipmi\", secrets = {{ password = \"{}\" }}, params",
            wrong.display()
        ),
    );
    let node2 = ipmi_stage("power-management", &ipmi2, "").replace("node1", "node2");
    c.extra_daemon_toml = fencing_toml(&c, 50, &format!("{node1}{node2}")).replace(
        "check-interval = \"0s\"",
        "check-interval = \"4s\"\ncheck-timeout = \"10s\"",
    );
    c.start().await;
    let fencing = |n: &Value| n["fencing"]["state"].as_str().map(String::from);
    let nodes = wait_for("both nodes to be checked", || async {
        let (_, v) = c.get("/1/nodes").await;
        let all = v.as_array().cloned().unwrap_or_default();
        let checked = all.iter().filter(|n| fencing(n).is_some()).count();
        (checked == 2).then_some(all)
    })
    .await;
    let by_name = |name: &str| nodes.iter().find(|n| n["name"] == name).unwrap().clone();
    let (n1, n2) = (by_name("node1"), by_name("node2"));
    assert_eq!(fencing(&n1).as_deref(), Some("inactive"), "{n1}");
    assert!(
        n1["fencing"]["detail"]
            .as_str()
            .unwrap()
            .contains("fence_ipmilan status failed"),
        "{n1}"
    );
    assert_eq!(fencing(&n2).as_deref(), Some("active"), "{n2}");
    assert!(n1["fencing"]["methods"][0]["ok"] == false);
    assert!(by_name("node3")["fencing"].is_null());
    let (_, all) = c.get("/1/fences/readiness").await;
    assert_eq!(all["node1"]["state"], "inactive", "{all}");
    assert_eq!(all["node2"]["state"], "active", "{all}");
    let m = c.metrics().await;
    assert!(m.contains(r#"maintd_fencing_ready{node="node1"} 0"#), "{m}");
    assert!(m.contains(r#"maintd_fencing_ready{node="node2"} 1"#), "{m}");
    assert!(c.daemon_log().contains("fencing inactive"));
    // Nothing failed and nothing was fenced: the check only asked for the status.
    let (_, flows) = c.get("/1/fences").await;
    assert_eq!(flows.as_array().map(Vec::len), Some(0));
    assert!(ipmi1.powered_on() && ipmi2.powered_on());
    // Later checks, one node per interval / nodes, keep the verdict and log no change.
    let before = all["node1"]["checked-at"].as_i64();
    let again = wait_for("node1 checked again", || async {
        let (_, again) = c.get("/1/fences/readiness").await;
        (again["node1"]["checked-at"].as_i64() > before).then_some(again)
    })
    .await;
    assert_eq!(again["node1"]["state"], "inactive");
    assert_eq!(c.daemon_log().matches("fencing inactive").count(), 1);
}
