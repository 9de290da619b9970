//! The master and three self-fencing nodes in network namespaces of their own on a bridge,
//! each node with the stand-in watchdog and a stand-in workload, for the tests that cut links
//! for real (`partitions.rs`) and step the master's clock (`clocks.rs`). The release hook is the
//! workload watcher: it records `LIVE-COPY` when the released node's workload still runs.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::netns::{self, Net};
use super::watchdog::{Fate, start_watched};
use super::*;

/// Starts the master's daemon in its namespace, under `wrapper`.
pub fn start_daemon(c: &mut Cluster, net: &Net, wrapper: &[&str]) {
    c.daemon = None;
    let cfg = c.daemon_config();
    let mut w: Vec<String> = net.exec(0);
    w.extend(wrapper.iter().map(|s| s.to_string()));
    c.daemon = Some(c.spawn_wrapped(
        "daemon",
        &w.iter().map(String::as_str).collect::<Vec<_>>(),
        &["--config", cfg.to_str().unwrap(), "daemon"],
    ));
}

/// When the release hook ran for `node`, by the real clock (hooks run without the daemon's
/// environment, so a faked clock of the daemon's does not reach them).
pub fn released_at(c: &Cluster, node: &str) -> Option<i64> {
    std::fs::read_to_string(c.path("released-at"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{node} "))?.trim().parse().ok())
}

/// Fields drop in order: the processes (and their groups) go before the namespaces.
pub struct Part {
    pub c: Cluster,
    pub fates: Vec<Receiver<Fate>>,
    pub pgids: Vec<Arc<OnceLock<u32>>>,
    pub net: Net,
}

impl Drop for Part {
    fn drop(&mut self) {
        for p in &self.pgids {
            if let Some(pg) = p.get() {
                // Most groups are gone already (reset by their watchdog, or killed below).
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pg}")])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}

/// Heartbeats every 200 ms lost after 1 s (master-lost-after 4 s); watchdog 3 s fed every 0.5 s,
/// isolation 2 s; grace 1 s, probe every 200 ms, margin 1 s.
pub async fn setup() -> Option<Part> {
    setup_with(&[]).await
}

/// `setup`, the daemon started under `wrapper` (inside its namespace).
pub async fn setup_with(wrapper: &[&str]) -> Option<Part> {
    if !netns::available() {
        return None;
    }
    let net = Net::new(3);
    let mut c = net.cluster(3);
    // A 5 s acceptance window, so a heartbeat can arrive 4.6 s late and still be taken.
    c.extra_collector_toml =
        "[collector.heartbeat]\ninterval = \"200ms\"\nlost-after = \"1s\"\nwindow = \"5s\"\n"
            .into();
    let mut fencing = "[fencing]\ngrace = \"1s\"\nliveness-interval = \"200ms\"\nliveness-timeout = \"1s\"\nstorm-percent = 50\nself-fence-margin = \"1s\"\ncheck-interval = \"0s\"\n".to_string();
    for n in &c.nodes {
        fencing.push_str(&format!("[fencing.nodes.{n}]\nself-fence = true\n"));
    }
    c.extra_daemon_toml = fencing;
    let root = c.dir.path().display().to_string();
    c.set_hook(
        "release",
        &format!(
            r#"wl=$(cat {root}/workload-$1.pid)
st=$(cut -d' ' -f3 /proc/$wl/stat 2>/dev/null)
if [ -n "$st" ] && [ "$st" != Z ]; then echo "LIVE-COPY $1" >> {root}/hooks.log; fi
echo "$MAINTD_ACTION $1 $2 $MAINTD_REASON" >> {root}/hooks.log
echo "$1 $(date +%s%N)" >> {root}/released-at"#
        ),
    );
    start_daemon(&mut c, &net, wrapper);
    c.wait_api().await;
    let mut fates = Vec::new();
    let mut pgids = Vec::new();
    for i in 0..3 {
        let node = c.nodes[i].clone();
        // The workload shares the collector's process group: a reset kills both.
        let script =
            format!("sleep 1000000 & echo $! > {root}/workload-{node}.pid; exec \"$0\" \"$@\"");
        let mut wrapper = net.exec(i + 1);
        wrapper.extend(["setsid", "--", "sh", "-c", &script].map(String::from));
        let w = start_watched(
            &mut c,
            i,
            Duration::from_secs(3),
            "feed-interval = \"500ms\"\nisolation-timeout = \"2s\"\n",
            &wrapper,
            0,
        );
        fates.push(w.fate);
        pgids.push(w.pgid);
    }
    c.wait_collectors_ready().await;
    for n in &c.nodes {
        wait_for("every node heard by both its watchers", || async {
            let w = c.node(n).await;
            (w["witnesses"]["heard-by"].as_array().map(Vec::len) == Some(2)).then_some(())
        })
        .await;
    }
    Some(Part {
        c,
        fates,
        pgids,
        net,
    })
}

pub async fn fate(rx: &Receiver<Fate>, within: Duration) -> Option<Fate> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match rx.try_recv() {
            Ok(f) => return Some(f),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if std::time::Instant::now() > deadline => return None,
            Err(TryRecvError::Empty) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Well past isolation + watchdog + safe time, no watchdog has fired.
pub async fn no_reset_within(p: &Part, d: Duration) {
    tokio::time::sleep(d).await;
    for (i, f) in p.fates.iter().enumerate() {
        assert_eq!(f.try_recv(), Err(TryRecvError::Empty), "node{}", i + 1);
    }
}
