//! Time from a node's death to its return to service, at the defaults: grace 5 s, liveness
//! probe 1 s, diagnose every 5 s, poll every 5 s, three healthy reports from the new boot.
//! The real `fence_ipmilan` against `ipmi_sim`, whose power drives a stand-in node (off kills
//! its collector, on starts it again with a new boot id). Prints each run with every stage, the
//! p50 and each stage's share; then the duration of fencing drills on the same node.
//! Run: `cargo bench --bench returns` (MAINTD_BENCH_RUNS, default 5; MAINTD_BENCH_DRILLS, 3).

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::Duration;

use common::sims::{self, Ipmi, PoweredNode};
use common::*;

const STAGES: [&str; 8] = [
    "detect",
    "power-off",
    "release",
    "power-on",
    "boot",
    "reports",
    "reclaim",
    "total",
];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") || !sims::available() {
        return;
    }
    let (runs, drills) = (env("MAINTD_BENCH_RUNS", 5), env("MAINTD_BENCH_DRILLS", 3));
    let mut c = Cluster::new(3);
    c.poll_interval = "5s".into();
    c.diagnose_interval = "5s".into();
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    let pw = c.secret("bmc.pw", &ipmi.password);
    c.extra_daemon_toml = format!(
        r#"
[fencing]
# Defaults for grace (5 s), liveness (1 s, 0.8 s), return-reports (3).
cooldown = "1s"
storm-percent = 50
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{pw}" }}
[fencing.nodes.node1.power-management]
methods = [{{ template = "ipmi", params = {{ {params} }} }}]
"#,
        pw = pw.display(),
        params = ipmi.params()
    );
    c.start_daemon();
    for i in 1..3 {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    let node = PoweredNode::start(&mut c, 0, &ipmi);
    c.wait_collectors_ready().await;
    c.wait_api().await;
    println!("death to return to service at the defaults, {runs} runs (seconds)");
    println!(
        "{:>4} {}",
        "run",
        STAGES.map(|s| format!("{s:>9}")).join(" ")
    );
    let mut all: Vec<[f64; 8]> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for run in 1..=runs {
        // Healthy and heard before it dies.
        tokio::time::sleep(Duration::from_secs(12)).await;
        node.hang(true);
        let died = maintd::report::now_ns();
        let f = c
            .wait_flow("the return to service", |f| {
                f["status"] == "final"
                    && f["returned-at"].is_i64()
                    && !seen.contains(f["id"].as_str().unwrap_or(""))
            })
            .await;
        seen.insert(f["id"].as_str().unwrap().to_string());
        let t = |k: &str| f[k].as_i64().unwrap();
        let new_boot = f["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["note"].as_str().unwrap().starts_with("new boot id"))
            .map(|h| h["at"].as_i64().unwrap())
            .unwrap();
        let s = |a: i64, b: i64| (b - a) as f64 / 1e9;
        let row = [
            s(died, t("created")),
            s(t("created"), t("fenced-at")),
            s(t("fenced-at"), t("released-at")),
            s(t("released-at"), t("powered-on-at")),
            s(t("powered-on-at"), new_boot),
            s(new_boot, t("returned-at")),
            s(t("returned-at"), t("updated")),
            s(died, t("updated")),
        ];
        println!("{run:>4} {}", row.map(|v| format!("{v:>9.2}")).join(" "));
        all.push(row);
    }
    let p50 = |i: usize| {
        let mut v: Vec<f64> = all.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.5)
    };
    println!(
        " p50 {}",
        (0..8)
            .map(|i| format!("{:>9.2}", p50(i)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let total: f64 = all.iter().map(|r| r[7]).sum();
    println!(
        "share {}",
        (0..7)
            .map(|i| format!(
                "{}={:.0}%",
                STAGES[i],
                100.0 * all.iter().map(|r| r[i]).sum::<f64>() / total
            ))
            .collect::<Vec<_>>()
            .join(" ")
    );

    println!("\nfencing drills on the same node, {drills} runs (seconds)");
    let url = c.url();
    for run in 1..=drills {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let out = c.cli(&["drill", "node1", "--url", &url]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let done = run;
        let d = wait_for("the drill", || async {
            let v = c.get("/1/drills").await.1;
            let list = v.as_array()?.clone();
            (list.iter().filter(|d| d["status"] == "passed").count() >= done)
                .then(|| list[0].clone())
        })
        .await;
        let stages: Vec<String> = d["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {:.2}",
                    s["stage"].as_str().unwrap(),
                    s["seconds"].as_f64().unwrap()
                )
            })
            .collect();
        println!("{run:>4} {}", stages.join(", "));
    }
    drop(node);
}
