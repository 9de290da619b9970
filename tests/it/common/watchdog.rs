//! A stand-in for the Linux watchdog device: a FIFO read by a thread that speaks
//! the device's protocol and, when not fed in time, kills the node's process group (the
//! simulated reset) and records the moment.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// What the stand-in watchdog saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    /// Not fed in time: it killed the process group at this Unix time (ns).
    Reset(i64),
    /// Closed with the magic `V`.
    Disarmed,
}

/// Makes the FIFO and starts the stand-in: it opens the FIFO for reading (so the collector's
/// open for writing proceeds), then resets the group `pgid` when no byte came for `timeout`.
/// A `V` just before end-of-file disarms it; end-of-file without one keeps it running, as the
/// Linux driver does.
pub fn stand_in(
    path: &Path,
    timeout: Duration,
    pgid: std::sync::Arc<std::sync::OnceLock<u32>>,
) -> mpsc::Receiver<Fate> {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
    let (bytes_tx, bytes_rx) = mpsc::channel::<Option<u8>>();
    let path: PathBuf = path.into();
    std::thread::spawn(move || {
        let mut f = std::fs::File::open(&path).unwrap();
        let mut b = [0u8; 1];
        loop {
            match f.read(&mut b) {
                Ok(1) => {
                    if bytes_tx.send(Some(b[0])).is_err() {
                        return;
                    }
                }
                _ => {
                    let _ = bytes_tx.send(None);
                    return;
                }
            }
        }
    });
    let (fate_tx, fate_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut last = 0u8;
        let mut open = true;
        loop {
            let got = if open {
                bytes_rx.recv_timeout(timeout)
            } else {
                std::thread::sleep(timeout);
                Err(mpsc::RecvTimeoutError::Timeout)
            };
            match got {
                Ok(Some(b)) => last = b,
                Ok(None) if last == b'V' => {
                    let _ = fate_tx.send(Fate::Disarmed);
                    return;
                }
                Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let at = maintd::report::now_ns();
                    if let Some(pg) = pgid.get() {
                        let _ = std::process::Command::new("kill")
                            .args(["-KILL", "--", &format!("-{pg}")])
                            .stderr(std::process::Stdio::null())
                            .status();
                    }
                    let _ = fate_tx.send(Fate::Reset(at));
                    return;
                }
            }
        }
    });
    fate_rx
}

/// A collector started with its watchdog on a stand-in.
pub struct Watched {
    pub fate: mpsc::Receiver<Fate>,
    /// The collector's process group (its pid: it leads a session of its own).
    pub pgid: std::sync::Arc<std::sync::OnceLock<u32>>,
}

/// Starts collector `i` of `c` with `[collector.watchdog]` enabled on a fresh stand-in FIFO
/// (`settings`: more keys of that table), in a session of its own, under `wrapper` (e.g.
/// `ip netns exec <ns>`, and a shell that starts a workload first); `run` tells FIFOs of
/// successive starts apart.
pub fn start_watched(
    c: &mut super::Cluster,
    i: usize,
    timeout: Duration,
    settings: &str,
    wrapper: &[String],
    run: usize,
) -> Watched {
    c.collectors[i] = None;
    let node = c.nodes[i].clone();
    let device = c.path(&format!("watchdog-{node}-{run}"));
    let pgid = std::sync::Arc::new(std::sync::OnceLock::new());
    let fate = stand_in(&device, timeout, pgid.clone());
    let cfg = c.collector_config(i, "scripted", "cluster.key");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[collector.watchdog]\nenabled = true\ndevice = \"{}\"\ntimeout = \"{}s\"\n{settings}",
        device.display(),
        timeout.as_secs()
    ));
    std::fs::write(&cfg, text).unwrap();
    let mut full: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    // setsid: the stand-in's reset kills the whole group.
    if !full.contains(&"setsid") {
        full.splice(0..0, ["setsid", "--"]);
    }
    let p = c.spawn_wrapped(
        &format!("collector-{node}"),
        &full,
        &["--config", cfg.to_str().unwrap(), "collector"],
    );
    pgid.set(p.child.id()).unwrap();
    c.collectors[i] = Some(p);
    Watched { fate, pgid }
}

/// What the stand-in sees next, waiting at most `within` off the async runtime.
pub async fn next_fate(
    fate: mpsc::Receiver<Fate>,
    within: Duration,
) -> Result<Fate, mpsc::RecvTimeoutError> {
    tokio::task::spawn_blocking(move || fate.recv_timeout(within))
        .await
        .unwrap()
}

/// Never two live copies: the flow `f` released the node's workloads only after the stand-in
/// reset it at `reset_at`.
pub fn assert_released_after_reset(f: &serde_json::Value, reset_at: i64) {
    let released_at = f["released-at"].as_i64().expect("a released flow");
    assert!(
        released_at > reset_at,
        "released {:.1} s before the reset: {f:#}",
        (reset_at - released_at) as f64 / 1e9
    );
}
