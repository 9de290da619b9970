//! What maintd asks of the apiserver: a real control plane with 1,000 simulated Nodes (all
//! managed), the daemon under the deploy/ ServiceAccount with leader election on, and the
//! apiserver's audit log of that account's requests. Counts requests per minute by verb and
//! resource at idle (after the initial sync), while an evacuation waits for a
//! PodDisruptionBudget, and for the drain itself; prints the daemon's RSS after each phase.
//! Run: `cargo bench --bench k8s_requests` (MAINTD_BENCH_NODES, default 1000;
//! MAINTD_BENCH_IDLE_S, default 120; MAINTD_BENCH_WAIT_S, default 60).

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::k8s::{self, ControlPlane};
use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const USER: &str = "system:serviceaccount:maintd:maintd";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// maintd's requests received in [from, to), by "verb resource[/subresource]".
fn requests(cp: &ControlPlane, from: i64, to: i64) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for v in cp.audited(from) {
        let at = v["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(i64::MAX, |t| t.as_nanosecond() as i64);
        if v["user"]["username"] != USER || at >= to {
            continue;
        }
        let r = &v["objectRef"];
        let mut res = r["resource"].as_str().unwrap_or("?").to_string();
        if let Some(sub) = r["subresource"].as_str() {
            res = format!("{res}/{sub}");
        }
        *out.entry(format!("{} {res}", v["verb"].as_str().unwrap_or("?")))
            .or_default() += 1;
    }
    out
}

fn report(phase: &str, counts: &BTreeMap<String, usize>, secs: f64) {
    let total: usize = counts.values().sum();
    let lease: usize = counts
        .iter()
        .filter(|(k, _)| k.ends_with(" leases"))
        .map(|(_, n)| n)
        .sum();
    println!(
        "{phase}: {:.1} requests/min in all, {:.1}/min besides the Lease ({secs:.0} s)",
        total as f64 * 60.0 / secs,
        (total - lease) as f64 * 60.0 / secs
    );
    for (k, n) in counts {
        println!("  {k:<40} {n:>6}  ({:.2}/min)", *n as f64 * 60.0 / secs);
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn now_ns() -> i64 {
    maintd::report::now_ns()
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") || !k8s::available() {
        return;
    }
    let n = env_or("MAINTD_BENCH_NODES", 1000) as usize;
    let idle = Duration::from_secs(env_or("MAINTD_BENCH_IDLE_S", 120));
    let wait = Duration::from_secs(env_or("MAINTD_BENCH_WAIT_S", 60));
    // Only the drain target gets heartbeats: a long node-monitor grace keeps the node lifecycle
    // controller from marking the other 999 NotReady during the run.
    let cp = ControlPlane::start_audited(Duration::from_secs(3600), USER).await;
    let deploy = common::sims::repo("deploy");
    cp.kubectl_ok(&[
        "apply",
        "-f",
        deploy.join("namespace.yaml").to_str().unwrap(),
    ]);
    cp.kubectl_ok(&["apply", "-f", deploy.join("rbac.yaml").to_str().unwrap()]);

    let started = Instant::now();
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("sim-{i:04}")).collect();
    futures::stream::iter(names.iter().skip(1))
        .for_each_concurrent(16, |name| {
            let nodes = nodes.clone();
            async move {
                // Collectors at a closed port: the bench is about the apiserver, not the polls.
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"maintd.io/managed": "true"},
                        "annotations": {"maintd.io/collector": "127.0.0.1:9"}},
                }))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let status = json!({"status": {
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "simulated"}]}});
                nodes
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
                    .await
                    .unwrap();
            }
        })
        .await;
    let target = &names[0];
    cp.add_node(
        target,
        json!({"maintd.io/managed": "true"}),
        json!({"maintd.io/collector": "127.0.0.1:9"}),
    )
    .await;
    println!(
        "{n} nodes created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Four bare pods on the target, and a PDB over them that allows no disruption (for bare
    // pods the disruption controller computes only an integer minAvailable).
    cp.kubectl_ok(&["create", "namespace", "web"]);
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "web");
    for i in 0..4 {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("web-{i}"), "labels": {"app": "web"}},
            "spec": {"nodeName": target, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "web", "image": "web:1",
                    "resources": {"requests": {"cpu": "100m"}}}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "web"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "web"}}}});
    let file = cp.dir.path().join("pdb.json");
    std::fs::write(&file, pdb.to_string()).unwrap();
    cp.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    for i in 0..4 {
        k8s::running_pod(&pods, &format!("web-{i}")).await;
    }

    let mut c = Cluster::new(0);
    c.inventory_nodes = false;
    c.extra_daemon_toml = "[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\n[kubernetes.leader-election]\nnamespace = \"maintd\"\n[[kubernetes.conditions]]\ntype = \"MaintdBench\"\nstatus = \"True\"\nfor = \"0s\"\nactions = [\"evacuate\"]\n".into();
    c.env.push((
        "KUBECONFIG".into(),
        cp.service_account_kubeconfig("maintd", "maintd")
            .display()
            .to_string(),
    ));
    // A poll every 5 s: a thousand refused connections every 200 ms would only add noise.
    let cfg = c.daemon_config();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("poll-interval = \"200ms\"", "poll-interval = \"5s\"");
    let run = |c: &Cluster| {
        std::fs::write(c.path("bench.toml"), &text).unwrap();
        c.spawn(
            "daemon",
            &[
                "--config",
                c.path("bench.toml").to_str().unwrap(),
                "daemon",
                "--cluster",
                "kubernetes",
            ],
        )
    };
    c.daemon = Some(run(&c));
    c.wait_api().await;
    wait_for("leadership", || async {
        (c.get("/1/leader").await.1["leader"] == true).then_some(())
    })
    .await;
    let pid = c.daemon.as_ref().unwrap().child.id();
    // The initial lists are done once every node is known; measure idle after a settling pause.
    wait_for("every node polled", || async {
        let (_, v) = c.get("/1/nodes").await;
        (v.as_array().map(Vec::len) == Some(n)).then_some(())
    })
    .await;
    let synced = now_ns();
    println!(
        "daemon up and synced; start-up requests:\n{:#?}",
        requests(&cp, 0, synced)
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let from = now_ns();
    tokio::time::sleep(idle).await;
    let to = now_ns();
    report(
        &format!("idle leader, {n} nodes"),
        &requests(&cp, from, to),
        idle.as_secs_f64(),
    );
    println!("daemon RSS after idle: {} MiB", rss_kib(pid) / 1024);

    // The target reports a condition that asks for an evacuation; the PDB blocks it.
    let cond = json!({"status": {"conditions": [{"type": "MaintdBench", "status": "True",
        "reason": "Bench", "message": "evacuate me"}]}});
    nodes
        .patch_status(target, &PatchParams::default(), &Patch::Strategic(&cond))
        .await
        .unwrap();
    wait_for("the evacuation to wait for the PDB", || async {
        c.status()
            .await
            .iter()
            .any(|e| {
                e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("PodDisruptionBudget"))
            })
            .then_some(())
    })
    .await;
    let from = now_ns();
    tokio::time::sleep(wait).await;
    let to = now_ns();
    report(
        "evacuation waiting for a PDB",
        &requests(&cp, from, to),
        wait.as_secs_f64(),
    );

    // The budget opens: the drain runs to the end.
    let from = now_ns();
    cp.kubectl_ok(&[
        "patch",
        "pdb",
        "web",
        "-n",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":0}}"#,
    ]);
    let done = Instant::now();
    loop {
        let st = c.status().await;
        if st
            .iter()
            .any(|e| e["node"] == target.as_str() && e["repair-status"] == "completed")
        {
            break;
        }
        assert!(
            done.elapsed() < WAIT,
            "the drain did not finish: {st:#?}\n{}",
            c.daemon_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = done.elapsed().as_secs_f64();
    report(
        "drain of 4 pods, budget open",
        &requests(&cp, from, now_ns()),
        secs.max(1.0),
    );
    println!("daemon RSS after the drain: {} MiB", rss_kib(pid) / 1024);
}
