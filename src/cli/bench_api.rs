//! `maintd bench api`: the API with many repair events, measured against a real daemon process
//! on loopback: full dumps at several client counts, one node's events at a fixed request
//! rate, how soon a watcher sees a change, and the bytes of each answer.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::header::ETAG;

use super::bench::BenchError;
use super::bench_api_load::{
    Figures, WATCHES, closed_loop_with, gather, get_body_with, pct, watch_delays,
};
use crate::report::Key;
use crate::store::Store;
use maintd_core::repair::model::{Action, Event, RepairStatus};
use maintd_core::verdict::Status;

/// Of every five events (one per node), one waits, one is canceled and three are completed and
/// acknowledged.
const STATUS_CYCLE: usize = 5;

/// What every node's event says, and what its collector keeps reporting: a report that
/// matches the node's event changes nothing, and keeps a finished event from being cleared.
const WAITING_VERDICT: &str = r#"{"status":"evacuate","details":{"disk":"sd0"}}"#;

pub async fn api(
    events: usize,
    clients: &[usize],
    secs: u64,
    rate: u32,
    collectors_share: bool,
) -> Result<(), BenchError> {
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("cluster.key");
    Key::generate(&key_file)?;
    let key = Key::load(&key_file)?;
    // One event per node: a node's collector reports one verdict, and an event its node no
    // longer reports is cleared once finished.
    let nodes = events.max(1);
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state)?;
    let waiting = fill(&state.join("state.db"), events)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let lane = format!("http://127.0.0.1:{metrics_port}");
    // Live collectors that report what each node's waiting event says, so the daemon polls
    // and verifies a whole fleet while the events stay as written.
    let exe = std::env::current_exe()?;
    let (_collectors, addrs) = super::bench::simulators(
        &exe,
        &key_file,
        nodes,
        Some(WAITING_VERDICT),
        !collectors_share,
    )
    .await?;
    let ports = (port, metrics_port);
    let daemon = start_daemon(dir.path(), &key_file, &state, ports, &addrs).await?;
    let client = crate::http::client_builder().build()?;
    if let Err(e) = settle(&client, &base).await {
        let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(BenchError::Api(format!(
            "{e}; the daemon's log ends:\n{}",
            tail.join("\n")
        )));
    }

    let status = client.get(format!("{base}/1/status")).send().await?;
    let plain = status.bytes().await?.len();
    let gzip = client
        .get(format!("{base}/1/status"))
        .header("accept-encoding", "gzip")
        .send()
        .await?
        .bytes()
        .await?
        .len();
    let one = client
        .get(format!("{base}/1/status?node=sim7"))
        .send()
        .await?
        .bytes()
        .await?
        .len();
    out!(
        "API with {events} repair events on {nodes} nodes, {} cores; the daemon polls their live collectors meanwhile",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    out!(
        "the simulated collectors run {}",
        if collectors_share {
            "at normal priority, sharing the cores with the daemon and the client"
        } else {
            "in the idle scheduling class, as the other machines they stand for"
        }
    );
    out!("bytes: /1/status {plain} (gzip {gzip}), /1/status?node= {one}");
    out!(
        "{:<28} {:>7} {:>9} {:>9} {:>9} {:>8}",
        "request",
        "clients",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors"
    );
    let secs = Duration::from_secs(secs);
    for path in ["/1/status", "/1/nodes"] {
        for &n in clients {
            let r = closed_loop(&client, &format!("{base}{path}"), n, secs).await;
            r.print(path, &n.to_string());
        }
    }
    // Each figure on its own: the lists the last readers asked for are still being built when
    // they stop waiting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (r, mut lags) = fixed_rate(&client, &base, nodes, rate, secs).await;
    r.print("/1/status?node=<random>", &format!("{rate}/s"));
    lags.sort_by(f64::total_cmp);
    out!(
        "  (the client sent them p50 {:.2} ms, p99 {:.2} ms after their due time: its timer's \
         millisecond and its own wait for a core, not counted above)",
        pct(&lags, 0.5),
        pct(&lags, 0.99)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut answered, mut seen) = watch_delays(&client, &base, &key, &waiting).await?;
    answered.sort_by(f64::total_cmp);
    seen.sort_by(f64::total_cmp);
    out!(
        "watch: a cancel seen by a waiting watcher after p50 {:.1} ms, max {:.1} ms ({} changes; \
         the cancel itself answered after p50 {:.1} ms, max {:.1} ms)",
        pct(&seen, 0.5),
        seen.last().copied().unwrap_or(f64::NAN),
        seen.len(),
        pct(&answered, 0.5),
        answered.last().copied().unwrap_or(f64::NAN),
    );
    super::bench_api_load::cheap_answers(&client, &base, nodes, secs).await?;
    let rest = waiting.get(WATCHES..).unwrap_or_default();
    super::bench_api_load::under_load(&client, (&base, &lane), &key, rest, secs).await?;
    drop(daemon);
    Ok(())
}

/// Writes the events straight into a new state database, before the daemon opens it. Returns
/// the waiting (noted) events, which a cancel can change.
fn fill(db: &Path, events: usize) -> Result<Vec<(String, uuid::Uuid)>, BenchError> {
    let store = Store::open(db)?;
    let now = crate::report::now_ns();
    let mut waiting = Vec::new();
    for k in 0..events {
        let node = format!("sim{k}");
        let status = match k % STATUS_CYCLE {
            0 => RepairStatus::Noted,
            1 => RepairStatus::Canceled,
            _ => RepairStatus::Completed,
        };
        let original: serde_json::Value = serde_json::from_str(WAITING_VERDICT)?;
        let e = Event {
            id: uuid::Uuid::new_v4(),
            node: node.clone(),
            canonical: original.to_string(),
            original,
            action: Status::Evacuate,
            command: None,
            status,
            tag: format!("maintd:repairready:{k}"),
            tagged: true,
            acknowledged: status == RepairStatus::Completed,
            superseded_by: None,
            note: Some("written by the benchmark".into()),
            created: now - (events - k) as i64 * 1_000_000,
            updated: now,
        };
        if status == RepairStatus::Noted {
            waiting.push((node, e.id));
        }
        store.apply(&Action::CreateEvent(e), now)?;
    }
    Ok(waiting)
}

/// The daemon, killed when dropped, polling the given collectors.
async fn start_daemon(
    dir: &Path,
    key_file: &Path,
    state: &Path,
    (port, metrics_port): (u16, u16),
    collectors: &[String],
) -> Result<tokio::process::Child, BenchError> {
    let mut toml = format!(
        "[cluster]\nkey-file = \"{}\"\n[daemon]\nlisten = \"127.0.0.1:{port}\"\nmetrics-listen = \"127.0.0.1:{metrics_port}\"\nstate-dir = \"{}\"\nrepair-dir = \"{}\"\npoll-interval = \"2s\"\n[actions]\nevacuate = false\nevacuate-failover = false\n",
        key_file.display(),
        state.display(),
        dir.join("repair.d").display(),
    );
    std::fs::create_dir_all(dir.join("repair.d"))?;
    for (i, addr) in collectors.iter().enumerate() {
        toml.push_str(&format!(
            "[[nodes]]\nname = \"sim{i}\"\ncollector = \"{addr}\"\n"
        ));
    }
    let cfg = dir.join("daemon.toml");
    std::fs::write(&cfg, toml)?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    tokio::process::Command::new(std::env::current_exe()?)
        .arg("daemon")
        .env("MAINTD_CONFIG", &cfg)
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(BenchError::Spawn)
}

/// Waits until the daemon answers and its events stop changing (the first decisions).
async fn settle(client: &reqwest::Client, base: &str) -> Result<(), BenchError> {
    let url = format!("{base}/1/status");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Ok(r) = client.get(&url).send().await else {
            continue;
        };
        let tag = r.headers().get(ETAG).cloned();
        if r.status().is_success() && tag.is_some() && tag == last {
            return Ok(());
        }
        last = tag;
    }
    Err(BenchError::Api(
        "the daemon did not answer with a steady /1/status within 120 s".into(),
    ))
}

/// `n` clients, each sending its next request when the last is answered, for `secs`.
async fn closed_loop(client: &reqwest::Client, url: &str, n: usize, secs: Duration) -> Figures {
    closed_loop_with(client, url, &reqwest::header::HeaderMap::new(), n, secs).await
}

/// One request every 1/`rate` s for a random node's events, whether or not the earlier ones
/// were answered (open loop: a slow answer never delays the next request). Each latency counts
/// from when its request was sent; how late the client sent it after its due time is returned
/// apart, since the client's timer works in whole milliseconds and its thread shares the cores.
async fn fixed_rate(
    client: &reqwest::Client,
    base: &str,
    nodes: usize,
    rate: u32,
    secs: Duration,
) -> (Figures, Vec<f64>) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    let mut lags = Vec::new();
    let mut k = 0usize;
    while start.elapsed() < secs {
        let due = tick.tick().await;
        let sent = Instant::now();
        lags.push(sent.saturating_duration_since(due.into_std()).as_secs_f64() * 1e3);
        // A stride walk visits nodes in a scattered order without a random generator.
        k = (k + 7919) % nodes;
        let (client, url) = (client.clone(), format!("{base}/1/status?node=sim{k}"));
        tasks.push(tokio::spawn(async move {
            match get_body(&client, &url).await {
                Ok(()) => (vec![sent.elapsed().as_secs_f64() * 1e3], 0),
                Err(()) => (Vec::new(), 1),
            }
        }));
    }
    (gather(tasks, start).await, lags)
}

async fn get_body(client: &reqwest::Client, url: &str) -> Result<(), ()> {
    get_body_with(client, url, &reqwest::header::HeaderMap::new()).await
}
