//! Benchmarks: `maintd bench poll` measures one poll-and-verify cycle of the daemon (the real
//! `Poller`: concurrent HTTP, HMAC verification, SQLite record) against N simulated signed
//! collectors served by a child process on loopback.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};
use prometheus_client::registry::Registry;

use crate::collector::{Collector, diagnose};
use crate::config::CollectorConfig;
use crate::members::Members;
use crate::node::NodeConfig;
use crate::repair::poller::{PollSettings, Poller};
use crate::report::{Key, VerifyRules};
use crate::store::Store;
use maintd_core::repair::{Observation, Policy, decide};
use maintd_core::verdict::Verdict;

/// Why a benchmark could not produce valid figures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("MAINTD_KEY_FILE is not set")]
    NoKeyFile,
    #[error(transparent)]
    Key(#[from] crate::report::KeyError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Collector(#[from] crate::collector::CollectorError),
    #[error("bad verdict: {0}")]
    Verdict(#[from] maintd_core::verdict::VerdictError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("a bench task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("cannot start the simulated collectors: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("simulated collectors did not start: {0}")]
    Collectors(String),
    #[error("only {verified} of {of} reports verified; the figures are not valid")]
    Unverified { verified: usize, of: usize },
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("API bench: {0}")]
    Api(String),
    #[error("peer set refused: {0}")]
    PeerSet(#[from] crate::report::heartbeat::PeerSetError),
    #[error(transparent)]
    Etcd(#[from] super::bench_etcd::ShareError),
    #[error("cannot bind {proto} {at}: {source}")]
    Bind {
        proto: &'static str,
        at: String,
        #[source]
        source: std::io::Error,
    },
}

/// How many ports a simulated collector tries before it gives up.
const PORT_TRIES: usize = 64;

/// A TCP listener and a UDP socket on one port of `addr`, as a collector has (its API and its
/// heartbeat socket). A port the kernel finds free for TCP may be held for UDP by another
/// process (on a busy machine, often), so each of `candidates` (0: any free one) is tried in
/// turn; the error names the last port and protocol that failed.
async fn bind_pair(
    addr: std::net::Ipv4Addr,
    candidates: impl IntoIterator<Item = u16>,
) -> Result<(tokio::net::TcpListener, tokio::net::UdpSocket), BenchError> {
    let mut last = None;
    for want in candidates {
        let l = match tokio::net::TcpListener::bind((addr, want)).await {
            Ok(l) => l,
            Err(source) => {
                last = Some(("TCP", format!("{addr}:{want}"), source));
                continue;
            }
        };
        let port = l.local_addr()?.port();
        match tokio::net::UdpSocket::bind((addr, port)).await {
            Ok(u) => return Ok((l, u)),
            Err(source) => last = Some(("UDP", format!("{addr}:{port}"), source)),
        }
    }
    let (proto, at, source) = last.unwrap_or_else(|| {
        (
            "TCP",
            format!("{addr}"),
            std::io::Error::other("no port to try"),
        )
    });
    Err(BenchError::Bind { proto, at, source })
}

fn raise_fd_limit() {
    let _ = crate::http::listener::raise_fd_limit();
}

pub(super) fn cpu_seconds() -> f64 {
    super::bench_floor::cpu_seconds_of(UsageWho::RUSAGE_SELF)
}

fn peak_rss_mib() -> f64 {
    // ru_maxrss is in KiB on Linux.
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| u.max_rss() as f64 / 1024.0)
        .unwrap_or(0.0)
}

/// Serves `count` collectors (`sim<first>` on) on ephemeral loopback ports, prints the ports as
/// one JSON line, and serves until stdin closes. Every tenth node reports an evacuation.
pub async fn sim_collectors(
    count: usize,
    first: usize,
    addr: std::net::Ipv4Addr,
    verdict: Option<&str>,
) -> Result<(), BenchError> {
    raise_fd_limit();
    let every = verdict
        .map(|v| Verdict::parse_bytes(v.as_bytes()))
        .transpose()?;
    let key_file = std::env::var("MAINTD_KEY_FILE").map_err(|_| BenchError::NoKeyFile)?;
    let key = Key::load(std::path::Path::new(&key_file))?;
    let ok = diagnose(&CollectorConfig::default()).await;
    let mut ports = Vec::with_capacity(count);
    let state = tempfile::tempdir()?;
    for i in first..first + count {
        let cfg = CollectorConfig {
            state_dir: state.path().join(format!("sim{i}")),
            ..CollectorConfig::default()
        };
        let c = Collector::new(format!("sim{i}"), key.clone(), cfg)?;
        let mut d = ok.clone();
        if let Some(v) = &every {
            d.verdict = v.clone();
        } else if i % 10 == 0 {
            d.verdict = Verdict::parse_bytes(
                format!(r#"{{"status":"evacuate","details":{{"disk":"sd{i}"}}}}"#).as_bytes(),
            )?;
        }
        c.set_diagnosis(d);
        // The UDP poll on the same port, as a collector's heartbeat socket answers it.
        let (l, udp) = bind_pair(addr, std::iter::repeat_n(0, PORT_TRIES)).await?;
        ports.push(l.local_addr()?.port());
        let app = c.router();
        tokio::spawn(async move { axum::serve(l, app).await });
        let answers = crate::collector::poll::PollAnswers::new(c);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                if let Some(a) = answers.answer(&buf[..n], crate::report::now_ns()) {
                    let _ = udp.send_to(&a, from).await;
                }
            }
        });
    }
    out!("{}", serde_json::to_string(&ports)?);
    std::io::stdout().flush()?;
    // Serve until the parent closes our stdin.
    tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        while std::io::stdin()
            .lock()
            .read_line(&mut s)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await?;
    Ok(())
}

/// Collectors one simulator process serves: each holds a listener and an accepted connection per
/// collector, so a fleet of 20,000 stays within a process's descriptor limit when split.
const PER_SIMULATOR: usize = 4000;

/// This process's open descriptors, resident memory (MiB) and write calls and bytes so far.
fn process_figures() -> (usize, f64, u64, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        fds,
        rss_kib / 1024.0,
        field("syscw:"),
        field("write_bytes:"),
    )
}

/// Starts simulators for `n` collectors and returns them with every collector's address, in
/// order. Each simulator serves on a loopback address of its own (127.0.0.2, .3, …): the
/// ephemeral ports of one address would not hold 20,000 listeners beside the poll's own
/// connections. With `idle`, they run under the idle scheduling class (`chrt --idle`): they stand
/// for other machines, and take only the CPU the daemon and its clients leave.
pub(super) async fn simulators(
    exe: &std::path::Path,
    key_file: &std::path::Path,
    n: usize,
    verdict: Option<&str>,
    idle: bool,
) -> Result<(Vec<tokio::process::Child>, Vec<String>), BenchError> {
    let mut children = Vec::new();
    let mut ports = Vec::with_capacity(n);
    for (k, first) in (0..n).step_by(PER_SIMULATOR).enumerate() {
        let count = PER_SIMULATOR.min(n - first);
        let addr = format!("127.0.0.{}", k + 2);
        let mut cmd = if idle {
            let mut c = tokio::process::Command::new("chrt");
            c.args(["--idle", "0"]).arg(exe);
            c
        } else {
            tokio::process::Command::new(exe)
        };
        let mut child = cmd
            .args(["bench", "sim-collectors", "--count", &count.to_string()])
            .args(["--first", &first.to_string(), "--addr", &addr])
            .args(verdict.iter().flat_map(|v| ["--verdict", v]))
            .env("MAINTD_KEY_FILE", key_file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(BenchError::Spawn)?;
        let mut out = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
        let some: Vec<u16> = serde_json::from_str(&line)
            .map_err(|e| BenchError::Collectors(format!("{e}: {line:?}")))?;
        ports.extend(some.into_iter().map(|p| format!("{addr}:{p}")));
        children.push(child);
    }
    Ok((children, ports))
}

pub async fn poll(
    sizes: &[usize],
    cycles: usize,
    connections: usize,
    udp: bool,
    etcd: Option<&str>,
) -> Result<(), BenchError> {
    raise_fd_limit();
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("cluster.key");
    Key::generate(&key_file)?;
    let key = Key::load(&key_file)?;
    let exe = std::env::current_exe()?;
    out!(
        "poll-and-verify cycle: {} cores, {} warm cycles per size (first cycle, which opens the connections, shown apart)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        cycles
    );
    let concurrency = 512.min(connections / 2).max(1);
    out!(
        "{:>6}  {:>8}  {:>7}  {:>7}  {:>9}  {:>12}  {:>8}  {:>9}  {:>8}  {:>6}  {:>9}  {:>9}  {:>12}",
        "nodes",
        "cold ms",
        "p50 ms",
        "max ms",
        "cpu ms/cyc",
        "poll µs/node",
        "floor µs",
        "decide ms",
        "RSS MiB",
        "fds",
        "writes/cyc",
        "KiB/cyc",
        "verified"
    );
    for &n in sizes {
        let (mut children, ports) = simulators(&exe, &key_file, n, None, false).await?;
        let members = Arc::new(Members::new(
            ports
                .iter()
                .enumerate()
                .map(|(i, p)| NodeConfig {
                    name: format!("sim{i}"),
                    collector: p.clone(),
                })
                .collect(),
        ));
        let store = Arc::new(Store::open(&dir.path().join(format!("bench-{n}.db")))?);
        let settings = PollSettings {
            rules: VerifyRules {
                max_bytes: 256 * 1024,
            },
            concurrency,
            timeout: Duration::from_secs(10),
        };
        let keys = Arc::new(crate::report::keyring::Keyring::cluster(key.clone()));
        let link = crate::link::Links::http(
            &keys,
            settings.timeout,
            settings.timeout,
            connections,
            concurrency,
        )
        .poll;
        let shared = crate::parts::Shared::standalone(store.clone(), members);
        let udp = match udp {
            true => Some(Arc::new(crate::link::UdpPoll::bind(
                keys.clone(),
                crate::link::udp_patience(Duration::from_secs(2)),
                Default::default(),
            )?)),
            false => None,
        };
        let metrics = crate::repair::metrics::PollMetrics::register(&mut Registry::default());
        let poller = Poller::new(settings, link, keys, &shared, metrics)?.with_udp(udp.clone());

        let sharing = match etcd {
            Some(url) => Some(super::bench_etcd::Sharing::start(url, store.clone(), n).await?),
            None => None,
        };
        let t = Instant::now();
        poller.poll_all().await;
        let cold = t.elapsed();
        let first = NodeConfig {
            name: "sim0".into(),
            collector: ports[0].clone(),
        };
        let floor = super::bench_floor::floor_us(&key, udp.as_deref(), &first).await;
        let mut walls = Vec::new();
        let cpu0 = cpu_seconds();
        let (_, _, calls0, bytes0) = process_figures();
        let mut verified = 0;
        let mut decide_ms = 0.0;
        let mut shares = Vec::new();
        // A new leader first writes the state it found missing; the cycles after count.
        if let Some(s) = &sharing {
            s.after_cycle().await?;
        }
        let written = sharing.as_ref().map_or(0, |s| s.writes());
        let mut poll_cpu = 0.0;
        for _ in 0..cycles.max(1) {
            let t = Instant::now();
            let c = cpu_seconds();
            let obs = poller.poll_all().await;
            poll_cpu += cpu_seconds() - c;
            walls.push(t.elapsed());
            verified = obs
                .reports
                .values()
                .filter(|o| matches!(o, Observation::Report(_)))
                .count();
            let state = store.load_state(Policy::default(), Default::default())?;
            let t = Instant::now();
            let actions = decide(&state, &obs, crate::report::now_ns());
            decide_ms = t.elapsed().as_secs_f64() * 1e3;
            std::hint::black_box(actions);
            if let Some(s) = &sharing {
                shares.push(s.after_cycle().await?);
            }
        }
        let runs = cycles.max(1) as f64;
        let cpu = (cpu_seconds() - cpu0) / runs;
        let (fds, rss, calls, bytes) = process_figures();
        walls.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        out!(
            "{:>6}  {:>8.1}  {:>7.1}  {:>7.1}  {:>9.1}  {:>12.1}  {:>8.1}  {:>9.2}  {:>8.1}  {:>6}  {:>9.0}  {:>9.1}  {:>6}/{:<5}",
            n,
            ms(cold),
            ms(walls[walls.len() / 2]),
            ms(*walls.last().expect("at least one cycle")),
            cpu * 1e3,
            poll_cpu / runs * 1e6 / n as f64,
            floor.unwrap_or(f64::NAN),
            decide_ms,
            rss,
            fds,
            (calls - calls0) as f64 / runs,
            (bytes - bytes0) as f64 / runs / 1024.0,
            verified,
            n,
        );
        if let Some(s) = &sharing {
            shares.sort();
            out!(
                "{:>6}  etcd: {} state writes in {} cycles; the share check after a cycle p50 {:.2} ms, max {:.2} ms",
                n,
                s.writes() - written,
                shares.len(),
                ms(shares[shares.len() / 2]),
                ms(*shares.last().expect("at least one cycle"))
            );
        }
        if verified != n {
            return Err(BenchError::Unverified { verified, of: n });
        }
        for mut child in children.drain(..) {
            drop(child.stdin.take());
            let _ = child.wait().await;
        }
    }
    out!("peak RSS {:.1} MiB", peak_rss_mib());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_another_process_holds_for_udp_is_passed_over_and_named_when_none_is_left() {
        let lo = std::net::Ipv4Addr::LOCALHOST;
        let held = std::net::UdpSocket::bind((lo, 0)).unwrap();
        let p = held.local_addr().unwrap().port();
        // Free for TCP, held for UDP: the next candidate is taken.
        let (l, u) = bind_pair(lo, [p, 0]).await.unwrap();
        let got = l.local_addr().unwrap().port();
        assert_ne!(got, p);
        assert_eq!(u.local_addr().unwrap().port(), got);
        let e = bind_pair(lo, [p]).await.unwrap_err().to_string();
        assert!(e.contains(&format!("127.0.0.1:{p}")), "{e}");
    }
}
