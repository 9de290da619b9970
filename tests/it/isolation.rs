//! Observation never disturbs detection: a real daemon polls thousands of signed collectors
//! (served by `maintd bench sim-collectors`) while fifty clients read its API as fast as they
//! can. Counted, not timed: not one poll may fail and not one healthy node may be marked
//! unreachable. MAINTD_ISOLATION_NODES sets the fleet (5,000 by default).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::AsyncBufReadExt;

/// How long the test waits for anything: the API is slow under fifty readers on a loaded
/// machine, on purpose (the point is that the poll is not).
const PATIENCE: Duration = Duration::from_secs(600);

/// The daemon's metrics, read patiently: a read the API closed at its request deadline while
/// the readers kept it busy is asked again.
async fn metrics(c: &Cluster) -> String {
    let url = format!("{}/metrics", c.url());
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match c.client.get(&url).timeout(PATIENCE).send().await {
            Ok(r) if r.status().is_success() => {
                if let Ok(text) = r.text().await {
                    return text;
                }
            }
            other => assert!(
                std::time::Instant::now() < deadline,
                "no metrics within {PATIENCE:?}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits, patiently, until the metrics satisfy `done`.
async fn until(c: &Cluster, what: &str, done: impl Fn(&str) -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while !done(&metrics(c).await) {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_readers_cause_no_failed_poll_and_no_unreachable_node() {
    // The simulated collectors are `maintd bench sim-collectors`, built only with the `bench`
    // feature (scripts/test enables it and sets MAINTD_REQUIRE_BENCH).
    if !cfg!(feature = "bench") {
        assert!(
            std::env::var_os("MAINTD_REQUIRE_BENCH").is_none(),
            "MAINTD_REQUIRE_BENCH is set, but the binary was built without --features bench"
        );
        eprintln!("notice: built without the `bench` feature: the isolation test is skipped");
        return;
    }
    let n: usize = std::env::var("MAINTD_ISOLATION_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let mut c = Cluster::new(0);
    let mut sims = tokio::process::Command::new(&*BIN)
        .args(["bench", "sim-collectors", "--count", &n.to_string()])
        .env("MAINTD_KEY_FILE", c.path("cluster.key"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(sims.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    let ports: Vec<u16> = serde_json::from_str(&line).unwrap();
    assert_eq!(ports.len(), n);
    // Generous deadlines: what is counted is whether readers make polls fail, not how fast a
    // debug build on a loaded machine answers.
    c.poll_interval = "2s".into();
    c.poll_timeout = "8s".into();
    let mut extra = "[actions]\nevacuate = false\n".to_string();
    for (i, p) in ports.iter().enumerate() {
        extra.push_str(&format!(
            "[[nodes]]\nname = \"sim{i}\"\ncollector = \"127.0.0.1:{p}\"\n"
        ));
    }
    c.extra_daemon_toml = extra;
    c.start_daemon();
    c.wait_api().await;
    // Every node answered once: the connections are open and the store knows them.
    until(&c, "every collector's first report", |m| {
        metric(m, "maintd_reports_accepted_total") >= n as f64
    })
    .await;
    let before = metrics(&c).await;
    let cycles0 = metric(&before, "maintd_poll_cycle_seconds_count");
    let failed0 = metric(&before, "maintd_polls_failed_total");

    let stop = Arc::new(tokio::sync::Notify::new());
    let answers = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..50 {
        let (client, url, stop, answers) = (
            maintd::http::client_builder().build().unwrap(),
            c.url(),
            stop.clone(),
            answers.clone(),
        );
        let path = if r % 2 == 0 { "/1/status" } else { "/1/nodes" };
        readers.push(tokio::spawn(async move {
            loop {
                let read = async {
                    if let Ok(resp) = client.get(format!("{url}{path}")).send().await
                        && resp.bytes().await.is_ok()
                    {
                        answers.fetch_add(1, Ordering::Relaxed);
                    }
                };
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = read => {}
                }
            }
        }));
    }
    // Five whole poll cycles under the readers.
    until(&c, "five poll cycles under fifty readers", |m| {
        metric(m, "maintd_poll_cycle_seconds_count") >= cycles0 + 6.0
    })
    .await;
    stop.notify_waiters();
    for r in readers {
        r.abort();
    }
    let after = metrics(&c).await;
    assert!(
        answers.load(Ordering::Relaxed) >= 50,
        "the readers were answered"
    );
    assert_eq!(
        metric(&after, "maintd_polls_failed_total") - failed0,
        0.0,
        "polls failed while clients read the API"
    );
    let (_, unreachable) = c.get("/1/nodes?status=unreachable").await;
    assert_eq!(unreachable, serde_json::json!([]));
    assert_eq!(metric(&after, "maintd_nodes_unreachable"), 0.0);
    drop(sims.stdin.take());
    let _ = sims.wait().await;
}
