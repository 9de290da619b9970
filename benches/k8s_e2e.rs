//! End to end on a real control plane: a node running a StatefulSet pod dies (its heartbeats
//! and its collector stop together) → maintd's flow → fence_ipmilan off + status against
//! ipmi_sim → out-of-service taint and force delete → the replacement pod scheduled on another
//! node → Running. Default fencing grace (5 s) and probe, default node-monitor-grace-period.
//! Prints each run, p50/p99 to scheduled and to Running, each stage's share, and how often a
//! replacement pod was deleted. Each flow is a NodeFence: the apiserver requests maintd sends
//! from death to recovery are counted from the audit log, and at the end the daemon restarts
//! beside 1,000 finished NodeFences to time its resume. Run: `cargo bench --bench k8s_e2e`
//! (MAINTD_BENCH_RUNS, default 10). With `MAINTD_BENCH_EXECUTOR=job` every agent call runs as a
//! Job on another node (the tests' kubelet stand-in runs its pod on this host); each call's
//! latency is printed either way, to compare the two. With `MAINTD_BENCH_DEATH=silent` the dead
//! node's collector is frozen (SIGSTOP: its connections are accepted by the kernel and never
//! answered, as a powered-off machine or a hung process gives no answer) instead of killed
//! (a refused connection).

#[path = "../tests/it/common/mod.rs"]
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
    // The daemon runs as the admin user here: the audit log records what it sends.
    let cp = ControlPlane::start_audited(Duration::from_secs(50), "admin").await;
    let mut c = Cluster::new(4);
    let nodes = c.nodes.clone();
    let bmcs: Vec<Ipmi> = nodes.iter().map(|n| Ipmi::start(c.dir.path(), n)).collect();
    cp.add_managed_nodes(&c, &nodes).await;
    let pw = c.secret("bmc.pw", &bmcs[0].password);
    let executor = std::env::var("MAINTD_BENCH_EXECUTOR").unwrap_or_else(|_| "local".into());
    let silent = std::env::var("MAINTD_BENCH_DEATH").is_ok_and(|d| d == "silent");
    println!(
        "death: {}",
        if silent {
            "the collector frozen (SIGSTOP): no answer"
        } else {
            "the collector killed: connections refused"
        }
    );
    let mut toml = format!(
        "[fencing]\ncooldown = \"1s\"\nstorm-percent = 50\nagent-image = \"localhost/fence-agents:bench\"\n[fencing.templates.ipmi]\nagent = \"fence_ipmilan\"\nexecutor = \"{executor}\"\nsecrets = {{ password = \"{}\" }}\n",
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
    println!(
        "death to replacement, real control plane v1.36.2, grace 5 s, {runs} runs, agents run {executor}"
    );
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "run", "detect s", "off+ver s", "release s", "sched s", "scheduled s", "Running s"
    );
    let (mut to_sched, mut to_run) = (Vec::new(), Vec::new());
    let mut shares = [0.0f64; 4];
    let mut replacement_deletions = 0;
    let mut seen_flows = std::collections::HashSet::new();
    let mut per_flow: Vec<(usize, usize)> = Vec::new();
    let mut call_ms: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
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
        if silent {
            let pid = c.collectors[i].as_ref().unwrap().child.id();
            let st = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .unwrap();
            assert!(st.success());
            // Its next start is a new boot.
            c.reboot(i);
        } else {
            c.kill_collector(i);
        }
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
        for call in f["calls"].as_array().into_iter().flatten() {
            let action = call["action"].as_str().unwrap_or("?").to_string();
            let ms = call["elapsed-ms"].as_f64().unwrap_or(0.0);
            call_ms.entry(action).or_default().push(ms);
        }
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
        // What the daemon sent from the death to the end of recovery: all of it, and the part
        // that was the flow's own record.
        let sent = cp.audited(died);
        let fences = sent
            .iter()
            .filter(|e| e["objectRef"]["resource"] == "nodefences")
            .count();
        per_flow.push((fences, sent.len()));
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
    for (action, ms) in &mut call_ms {
        ms.sort_by(f64::total_cmp);
        println!(
            "agent {action} calls ({executor}): n {}, p50 {:.0} ms, p99 {:.0} ms",
            ms.len(),
            percentile(ms, 0.5),
            percentile(ms, 0.99)
        );
    }
    let n = per_flow.len().max(1) as f64;
    println!(
        "apiserver requests per flow, death to recovery: {:.1} on NodeFences, {:.1} in all (runs: {:?})",
        per_flow.iter().map(|p| p.0).sum::<usize>() as f64 / n,
        per_flow.iter().map(|p| p.1).sum::<usize>() as f64 / n,
        per_flow
    );
    resume_beside_finished_fences(&cp, &mut c).await;
    c.kill_daemon();
}

/// The daemon stops; 1,000 finished NodeFences appear (as a week of fences would leave); the
/// daemon starts again. Times the start to its API and to its first listing of the flows, with
/// and without them.
async fn resume_beside_finished_fences(cp: &ControlPlane, c: &mut Cluster) {
    c.kill_daemon();
    c.start_kube_daemon();
    let (api0, listed0, n0) = timed_start(c).await;
    c.kill_daemon();
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        cp.client.clone(),
        &kube::api::ApiResource {
            group: "maintd.io".into(),
            version: "v1alpha1".into(),
            api_version: "maintd.io/v1alpha1".into(),
            kind: "NodeFence".into(),
            plural: "nodefences".into(),
        },
    );
    let t = Instant::now();
    let old = "2026-01-01T00:00:00Z";
    for i in 0..1000 {
        let name = format!("old-{i}");
        let obj = serde_json::json!({
            "apiVersion": "maintd.io/v1alpha1", "kind": "NodeFence",
            "metadata": {"name": name, "labels": {"maintd.io/flow": uuid::Uuid::new_v4().to_string()}},
            "spec": {"node": "gone"},
        });
        let made = api
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .unwrap();
        let mut with = made.clone();
        with.data["status"] = serde_json::json!({
            "step": "recovery", "status": "final", "retries": 0, "restarts": 0,
            "detected": old, "created": old, "updated": old, "nextAttempt": old,
        });
        api.replace_status(&name, &kube::api::PostParams::default(), &with)
            .await
            .unwrap();
    }
    println!(
        "1,000 finished NodeFences written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    c.start_kube_daemon();
    let (api1, listed1, n1) = timed_start(c).await;
    println!(
        "start to API: {api0:.2} s with {n0} flows, {api1:.2} s beside 1,000 finished NodeFences; to the first listing: {listed0:.2} s / {listed1:.2} s ({n1} flows listed)"
    );
}

/// Seconds from now to the daemon's API answering and to its first listing of the flows, and
/// how many it listed.
async fn timed_start(c: &Cluster) -> (f64, f64, usize) {
    let t0 = Instant::now();
    c.wait_api().await;
    let api = t0.elapsed().as_secs_f64();
    let n = wait_for("the flows listed", || async {
        let (code, v) = c.get("/1/fences").await;
        (code == 200).then(|| v.as_array().map(Vec::len).unwrap_or(0))
    })
    .await;
    (api, t0.elapsed().as_secs_f64(), n)
}
