//! End to end on a real control plane: a node running a StatefulSet pod dies (its heartbeats
//! and its collector stop together) → maintd's flow → fence_ipmilan off + status against
//! ipmi_sim → out-of-service taint and force delete → the replacement pod scheduled on another
//! node → Running. Default fencing grace (5 s) and probe, default node-monitor-grace-period.
//! Prints each run, p50/p99 to scheduled and to Running, each stage's share, and how often a
//! replacement pod was deleted. Run: `cargo bench --bench k8s_e2e` (MAINTD_BENCH_RUNS, default 10).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::k8s::{self, ControlPlane};
use common::sims::{self, Ipmi};
use common::*;
use futures::StreamExt;
use kube::api::WatchEvent;

fn now_ns() -> i64 {
    maintd::report::now_ns()
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") || !sims::available() || !common::k8s::available() {
        return;
    }
    let runs: usize = std::env::var("MAINTD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    // The controller-manager's default node-monitor-grace-period (50 s).
    let cp = ControlPlane::start(Duration::from_secs(50)).await;
    let mut c = Cluster::new(4);
    let nodes = c.nodes.clone();
    let bmcs: Vec<Ipmi> = nodes.iter().map(|n| Ipmi::start(c.dir.path(), n)).collect();
    cp.add_managed_nodes(&c, &nodes).await;
    let pw = c.secret("bmc.pw", &bmcs[0].password);
    let mut toml = format!(
        "[fencing]\ncooldown = \"1s\"\nstorm-percent = 50\n[fencing.templates.ipmi]\nagent = \"fence_ipmilan\"\nsecrets = {{ password = \"{}\" }}\n",
        pw.display()
    );
    for (n, b) in nodes.iter().zip(&bmcs) {
        toml.push_str(&format!(
            "[fencing.nodes.{n}.power-management]\nmethods = [{{ template = \"ipmi\", params = {{ {} }} }}]\n[fencing.nodes.{n}.recovery]\nmethods = [{{ template = \"ipmi\", params = {{ {} }} }}]\n",
            b.params(),
            b.params()
        ));
    }
    toml.push_str("[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"1s\"\n[kubernetes.leader-election]\nenabled = false\n");
    c.extra_daemon_toml = toml;
    c.inventory_nodes = false;
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    let pods = cp.statefulset("bench");
    println!("death to replacement, real control plane v1.36.2, grace 5 s, {runs} runs");
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "run", "detect s", "off+ver s", "release s", "sched s", "scheduled s", "Running s"
    );
    let (mut to_sched, mut to_run) = (Vec::new(), Vec::new());
    let mut shares = [0.0f64; 4];
    let mut replacement_deletions = 0;
    let mut seen_flows = std::collections::HashSet::new();
    for run in 1..=runs {
        let p = k8s::running_pod(&pods, "db-0").await;
        let victim = p.spec.as_ref().unwrap().node_name.clone().unwrap();
        let old_uid = p.metadata.uid.clone().unwrap();
        let i = nodes.iter().position(|n| *n == victim).unwrap();
        wait_for("the victim reachable", || async {
            (c.node(&victim).await["reachable"] == true).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut stream = k8s::watch_pods(&pods).await;
        // Death: heartbeats and collector stop together.
        cp.heartbeats.alive(&victim, false);
        c.kill_collector(i);
        let died = now_ns();
        let (mut sched, mut up, mut replacement) = (None, None, None::<String>);
        let deadline = Instant::now() + Duration::from_secs(120);
        while up.is_none() {
            assert!(Instant::now() < deadline, "run {run}: no replacement ran");
            let Ok(Some(Ok(ev))) =
                tokio::time::timeout(Duration::from_millis(200), stream.next()).await
            else {
                continue;
            };
            let (pod, gone) = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    let terminating = p.metadata.deletion_timestamp.is_some();
                    (p, terminating)
                }
                WatchEvent::Deleted(p) => (p, true),
                _ => continue,
            };
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if uid == old_uid {
                continue;
            }
            if replacement.as_ref().is_some_and(|r| *r != uid) || gone {
                // A replacement was deleted and another took its place.
                replacement_deletions += 1;
                replacement = None;
                sched = None;
                continue;
            }
            replacement.get_or_insert(uid);
            if sched.is_none()
                && pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some()
            {
                sched = Some(now_ns());
            }
            if k8s::pod_running(&pod) {
                up = Some(now_ns());
            }
        }
        let f = c
            .wait_flow("the release", |f| {
                f["node"] == victim.as_str()
                    && f["released"] == true
                    && !seen_flows.contains(f["id"].as_str().unwrap_or(""))
            })
            .await;
        seen_flows.insert(f["id"].as_str().unwrap().to_string());
        let t = |k: &str| f[k].as_i64().unwrap();
        let s = |a: i64, b: i64| (b - a) as f64 / 1e9;
        let (sched, up) = (sched.unwrap(), up.unwrap());
        let parts = [
            s(died, t("created")),
            s(t("created"), t("fenced-at")),
            s(t("fenced-at"), t("released-at")),
            s(t("released-at"), sched),
        ];
        println!(
            "{run:>4} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>11.2} {:>9.2}",
            parts[0],
            parts[1],
            parts[2],
            parts[3],
            s(died, sched),
            s(died, up)
        );
        for (acc, p) in shares.iter_mut().zip(parts) {
            *acc += p;
        }
        to_sched.push(s(died, sched));
        to_run.push(s(died, up));
        // The node is repaired: heartbeats and collector back, recovery powers it on.
        cp.heartbeats.alive(&victim, true);
        c.start_collector_with(i, "scripted", "cluster.key");
        let id = f["id"].as_str().unwrap().to_string();
        c.wait_flow("recovery", |g| {
            g["id"] == id.as_str() && g["status"] == "final"
        })
        .await;
        assert!(bmcs[i].powered_on());
    }
    to_sched.sort_by(f64::total_cmp);
    to_run.sort_by(f64::total_cmp);
    let sum: f64 = shares.iter().sum();
    println!(
        "to scheduled: p50 {:.2} s, p99 {:.2} s; to Running: p50 {:.2} s, p99 {:.2} s",
        percentile(&to_sched, 0.5),
        percentile(&to_sched, 0.99),
        percentile(&to_run, 0.5),
        percentile(&to_run, 0.99)
    );
    println!(
        "shares: detection {:.0} %, power-off+verify {:.0} %, release {:.0} %, scheduling {:.0} %",
        100.0 * shares[0] / sum,
        100.0 * shares[1] / sum,
        100.0 * shares[2] / sum,
        100.0 * shares[3] / sum
    );
    println!("replacement pods deleted: {replacement_deletions}");
    c.kill_daemon();
}
