//! Time from a self-fencing node's death (its collector killed with SIGKILL, so its watchdog is
//! left armed and unfed) to its workloads released, at the defaults: grace 5 s, liveness probe
//! 1 s, heartbeats every 0.5 s lost after 2 s, master-lost-after 4 s, watchdog 10 s fed every
//! 1 s, isolation 5 s, margin 5 s (the release waits for the reset to be proven: a quiet window
//! of isolation + feed after the last contact could have held, then watchdog + margin). The
//! watchdog is the test stand-in (a FIFO; its reset kills the
//! collector's process group). Prints every run, p50, p99 and each stage's share, and checks in
//! every run that the release came after the reset. Run: `cargo bench --bench selffence`
//! (MAINTD_BENCH_RUNS, default 20).

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::Duration;

use common::watchdog::{Fate, start_watched};
use common::*;

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("MAINTD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut c = Cluster::new(4);
    c.extra_daemon_toml =
        "[fencing]\ncooldown = \"1s\"\nstorm-percent = 50\ncheck-interval = \"0s\"\n[fencing.nodes.node1]\nself-fence = true\n"
            .into();
    c.start_daemon();
    c.wait_api().await;
    for i in 1..4 {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    println!(
        "time to release after a self-fencing node dies (defaults; proven reset), {runs} runs"
    );
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "run", "detect s", "mark s", "wait s", "release s", "total s", "reset s"
    );
    let mut totals = Vec::new();
    let mut stages = [0.0f64; 4];
    let mut seen = std::collections::HashSet::new();
    let ten = Duration::from_secs(10);
    let mut fate = start_watched(&mut c, 0, ten, "", &[], 0).fate;
    for run in 1..=runs {
        // Up, armed and heard by all its watchers before it dies.
        wait_for("node1 watched and armed", || async {
            let n = c.node("node1").await;
            let heard = n["witnesses"]["heard-by"].as_array().map(Vec::len);
            let fences = c.get("/1/fences").await.1;
            let open = fences
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f["status"] != "final");
            (heard == Some(3) && !open).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // SIGKILL: no magic close; the stand-in keeps counting, as the driver would.
        c.collectors[0] = None;
        let died = maintd::report::now_ns();
        let f = c
            .wait_flow("the release", |f| {
                f["released"] == true && !seen.contains(f["id"].as_str().unwrap_or(""))
            })
            .await;
        seen.insert(f["id"].as_str().unwrap().to_string());
        let reset =
            match tokio::task::spawn_blocking(move || fate.recv_timeout(Duration::from_secs(5)))
                .await
                .unwrap()
            {
                Ok(Fate::Reset(at)) => at,
                other => panic!("run {run}: the stand-in watchdog did not fire: {other:?}"),
            };
        let ns = |k: &str| f[k].as_i64().unwrap();
        let marked = f["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["step"] == "self-fence" && t["status"] == "done")
            .and_then(|t| t["at"].as_i64())
            .unwrap();
        let released = ns("released-at");
        assert!(released > reset, "run {run}: released before the reset");
        let s = |a: i64, b: i64| (b - a) as f64 / 1e9;
        let parts = [
            s(died, ns("created")),
            s(ns("created"), marked),
            s(marked, ns("fenced-at")),
            s(ns("fenced-at"), released),
        ];
        let total = s(died, released);
        println!(
            "{run:>4} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {total:>9.2} {:>9.2}",
            parts[0],
            parts[1],
            parts[2],
            parts[3],
            s(died, reset)
        );
        for (acc, p) in stages.iter_mut().zip(parts) {
            *acc += p;
        }
        totals.push(total);
        // Back up (rebooted): recovery clears the mark and the release.
        fate = start_watched(&mut c, 0, ten, "", &[], run).fate;
        c.wait_flow("recovery", |x| x["id"] == f["id"] && x["status"] == "final")
            .await;
    }
    totals.sort_by(f64::total_cmp);
    let sum: f64 = stages.iter().sum();
    println!(
        "p50 {:.2} s  p99 {:.2} s  (min {:.2}, max {:.2})",
        percentile(&totals, 0.5),
        percentile(&totals, 0.99),
        totals[0],
        totals[totals.len() - 1]
    );
    for (name, v) in ["detect", "mark", "wait", "release"].iter().zip(stages) {
        println!("  {name:<8} {:5.1} %", 100.0 * v / sum);
    }
}
