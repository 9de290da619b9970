//! Time from a hard node failure (its collector killed) to its workloads released, with the
//! default grace (5 s) and liveness probe (1 s): fence_ifmib isolation against snmpsim, then
//! fence_ipmilan off + status against ipmi_sim, then the release hook. Prints every run, p50, p99
//! and each stage's share. Run: `cargo bench --bench fence` (MAINTD_BENCH_RUNS, default 20);
//! `MAINTD_BENCH_STORE=etcd` runs the same with the decision state and the flows on a real etcd
//! (one member on loopback), for the cost of etcd per fence step.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::Duration;

use common::sims::{self, Ipmi, Snmp};
use common::*;

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") || !sims::available() {
        return;
    }
    let runs: usize = std::env::var("MAINTD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut c = Cluster::new(3);
    let ipmi = Ipmi::start(c.dir.path(), "node1");
    let snmp = Snmp::start(c.dir.path());
    let pw = c.secret("bmc.pw", &ipmi.password);
    let switch = format!(
        r#"{{ template = "switch", params = {{ ipport = "{}", plug = "1" }} }}"#,
        snmp.port
    );
    let bmc = format!(
        r#"{{ template = "ipmi", params = {{ {} }} }}"#,
        ipmi.params()
    );
    c.extra_daemon_toml = format!(
        r#"
[fencing]
# Defaults for grace (5 s), liveness interval (1 s) and timeout (0.8 s).
cooldown = "1s"
storm-percent = 50
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{pw}" }}
[fencing.templates.switch]
agent = "fence_ifmib"
params = {{ ip = "127.0.0.1", community = "switch", snmp_version = "1" }}
[fencing.nodes.node1.isolation]
methods = [{switch}]
[fencing.nodes.node1.power-management]
methods = [{bmc}]
[fencing.nodes.node1.recovery]
methods = [{bmc}, {switch}]
"#,
        pw = pw.display()
    );
    let on_etcd = std::env::var("MAINTD_BENCH_STORE").as_deref() == Ok("etcd");
    let _etcd = if on_etcd {
        let etcd = common::etcd::Etcd::start()
            .await
            .expect("MAINTD_BENCH_STORE=etcd needs etcd (Debian's etcd-server)");
        c.extra_daemon_toml.push_str(&etcd.store_toml("bench", 15));
        Some(etcd)
    } else {
        None
    };
    c.start().await;
    println!(
        "time to release after a hard node failure (grace 5 s, liveness probe 1 s), {runs} runs, state on {}",
        if on_etcd { "etcd" } else { "SQLite" }
    );
    println!(
        "{:>4} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "run", "detect s", "isolate s", "off+ver s", "release s", "total s"
    );
    let mut totals = Vec::new();
    let mut stages = [0.0f64; 4];
    let mut seen = std::collections::HashSet::new();
    for run in 1..=runs {
        // Let the liveness probe see the node up before it fails.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        c.kill_collector(0);
        let killed = maintd::report::now_ns();
        let f = c
            .wait_flow("the release", |f| {
                f["released"] == true && !seen.contains(f["id"].as_str().unwrap_or(""))
            })
            .await;
        seen.insert(f["id"].as_str().unwrap().to_string());
        assert!(!ipmi.powered_on(), "the BMC must be off");
        let t = |k: &str| f[k].as_i64().unwrap();
        let s = |a: i64, b: i64| (b - a) as f64 / 1e9;
        let parts = [
            s(killed, t("created")),
            s(t("created"), t("isolated-at")),
            s(t("isolated-at"), t("fenced-at")),
            s(t("fenced-at"), t("released-at")),
        ];
        let total = s(killed, t("released-at"));
        println!(
            "{run:>4} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            parts[0], parts[1], parts[2], parts[3], total
        );
        for (acc, p) in stages.iter_mut().zip(parts) {
            *acc += p;
        }
        totals.push(total);
        // Repair: the node comes back, recovery powers it on, the flow ends.
        c.start_collector_with(0, "scripted", "cluster.key");
        let id = f["id"].as_str().unwrap().to_string();
        c.wait_flow("recovery", |g| {
            g["id"] == id.as_str() && g["status"] == "final"
        })
        .await;
        assert!(ipmi.powered_on());
    }
    // What went wrong meanwhile, if anything (a write retried, a tick skipped).
    for l in c
        .daemon_log()
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        println!("daemon: {l}");
    }
    totals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let sum: f64 = stages.iter().sum();
    println!(
        "p50 {:.2} s, p99 {:.2} s, max {:.2} s; shares: detection {:.0} %, isolation {:.0} %, power-off+verify {:.0} %, release {:.0} %",
        percentile(&totals, 0.5),
        percentile(&totals, 0.99),
        totals.last().unwrap(),
        100.0 * stages[0] / sum,
        100.0 * stages[1] / sum,
        100.0 * stages[2] / sum,
        100.0 * stages[3] / sum
    );
}
