//! Resources and API latency under the hostile-client attacks: collector and daemon RSS and
//! open fds, and `/1/status` latency p50/p99, before, during and after each attack, with the
//! attacked collector under `prlimit --nofile=1024:1024 --as=768MiB`. Also says whether the
//! healthy node was fenced (it must never be). Run: `cargo bench --bench attack`.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// (RSS MiB, open fds) of a process.
fn usage(pid: u32) -> (f64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

#[derive(Default)]
struct Window {
    lat_ms: Vec<f64>,
    failed: usize,
    max_col: (f64, usize),
    max_dae: (f64, usize),
}

impl Window {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.lat_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    }
}

/// Samples resources and `/1/status` every 50 ms until `stop`, on a thread and runtime of its
/// own, so the attackers' tasks in this process do not delay the measurement.
async fn sample(c: &Cluster, col: u32, dae: u32, stop: Arc<AtomicBool>) -> Window {
    let url = format!("{}/1/status", c.url());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let w = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(sample_on(url, col, dae, stop));
        let _ = tx.send(w);
    });
    rx.await.unwrap()
}

async fn sample_on(url: String, col: u32, dae: u32, stop: Arc<AtomicBool>) -> Window {
    let client = maintd::http::client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut w = Window::default();
    while !stop.load(Ordering::SeqCst) {
        let (cr, cf) = usage(col);
        let (dr, df) = usage(dae);
        w.max_col = (w.max_col.0.max(cr), w.max_col.1.max(cf));
        w.max_dae = (w.max_dae.0.max(dr), w.max_dae.1.max(df));
        let t = Instant::now();
        let ok = match client.get(&url).send().await {
            Ok(r) if r.status() == 200 => r.bytes().await.is_ok(),
            _ => false,
        };
        if ok {
            w.lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
        } else {
            w.failed += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w
}

async fn phase<F: std::future::Future<Output = ()>>(
    c: &Cluster,
    col: u32,
    dae: u32,
    name: &str,
    attack: F,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let sampler = sample(c, col, dae, s);
    let run = async {
        attack.await;
        stop.store(true, Ordering::SeqCst);
    };
    let (w, ()) = tokio::join!(sampler, run);
    println!(
        "| {name:<28} | {:>6.1} | {:>5} | {:>6.1} | {:>5} | {:>6.1} | {:>6.1} | {:>3} |",
        w.max_col.0,
        w.max_col.1,
        w.max_dae.0,
        w.max_dae.1,
        w.pct(0.5),
        w.pct(0.99),
        w.failed
    );
}

async fn quiet(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let _ = maintd::http::listener::raise_fd_limit();
    let mut c = Cluster::new(3);
    // Default grace (5 s) and probe: the figures are for a daemon as shipped.
    c.extra_daemon_toml = c.stub_fencing("fence_stub", "cat > /dev/null; exit 0", "5s", &["node1"]);
    c.start_collectors();
    c.start_collector_wrapped(
        0,
        &["prlimit", "--nofile=1024:1024", "--as=805306368", "--"],
    );
    c.start_daemon();
    c.wait_api().await;
    wait_for("node1 reachable", || async {
        (c.node("node1").await["reachable"] == true).then_some(())
    })
    .await;
    let col = c.collectors[0].as_ref().unwrap().child.id();
    let dae = c.daemon.as_ref().unwrap().child.id();
    let (port, api) = (c.ports[0], c.api_port);
    println!(
        "| phase                        | col MiB | col fds | dae MiB | dae fds | status p50 ms | p99 ms | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    phase(&c, col, dae, "baseline (5 s)", quiet(5)).await;
    phase(&c, col, dae, "unsigned 960 KiB POSTs, 5 s", async {
        // Waves of 300 concurrent requests for 5 s.
        let end = Instant::now() + Duration::from_secs(5);
        let mut sent = 0;
        while Instant::now() < end {
            sent += common::attack::big_unsigned_posts(port, api, 300)
                .await
                .len();
        }
        eprintln!("unsigned POSTs sent: {sent}");
    })
    .await;
    phase(&c, col, dae, "after (5 s)", quiet(5)).await;
    phase(&c, col, dae, "1,100 slow-header conns", async {
        let mut slow = common::attack::slow_headers(port, 1100).await;
        for _ in 0..5 {
            common::attack::trickle(&mut slow).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    phase(&c, col, dae, "10,000 idle conns", async {
        let idle = common::attack::idle(port, 10_000).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(idle);
    })
    .await;
    phase(&c, col, dae, "1,000 idle conns to the daemon", async {
        let idle = common::attack::idle(api, 1000).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(idle);
    })
    .await;
    phase(&c, col, dae, "10 GB / half-sent bodies x50", async {
        let mut t = tokio::task::JoinSet::new();
        for i in 0..50 {
            let (head, body) = if i % 2 == 0 {
                (
                    common::attack::signed_looking_head("/1/repair", 10_000_000_000),
                    0,
                )
            } else {
                (common::attack::signed_looking_head("/1/repair", 100), 10)
            };
            t.spawn(common::attack::raw_request(port, head, body));
        }
        while t.join_next().await.is_some() {}
    })
    .await;
    phase(&c, col, dae, "after all (10 s)", quiet(10)).await;
    let fences = c.get("/1/fences").await.1;
    println!(
        "\nhealthy node fenced: {} (flows: {})",
        fences.as_array().is_some_and(|a| !a.is_empty()),
        fences.as_array().map_or(0, |a| a.len())
    );
}
