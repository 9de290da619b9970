//! Self-fencing by watchdog between real processes: a collector arms a stand-in
//! watchdog (a FIFO read by a thread of this test that speaks the device's protocol and, when
//! not fed in time, kills the collector's whole process group: the simulated reset); the daemon
//! marks the silent node, proves its reset and only then releases. The production code path
//! is the one a real `/dev/watchdog` gets; only the device path differs.

use crate::common;

use std::sync::mpsc;
use std::time::Duration;

use common::watchdog::{Fate, Watched, assert_released_after_reset, next_fate, start_watched};
use common::*;

const TIMEOUT: Duration = Duration::from_secs(3);
const FAST: &str = "feed-interval = \"500ms\"\nisolation-timeout = \"2s\"\n";

/// Four nodes, fast heartbeats; node2 self-fences (no BMC) with a 3 s watchdog. From the start
/// of the quiet window to the reset: isolation 2 + feed 0.5 + watchdog 3 + margin 1 = 6.5 s.
struct Setup {
    c: Cluster,
    fate: mpsc::Receiver<Fate>,
    pgid: std::sync::Arc<std::sync::OnceLock<u32>>,
}

async fn setup() -> Setup {
    setup_with(Cluster::new(4), "").await
}

/// As `setup`, with `extra` added to the daemon's `[fencing]` section.
async fn setup_with(mut c: Cluster, extra: &str) -> Setup {
    c.extra_collector_toml =
        "[collector.heartbeat]\ninterval = \"200ms\"\nlost-after = \"1s\"\n".into();
    c.extra_daemon_toml = format!(
        "[fencing]\ngrace = \"1s\"\nliveness-interval = \"200ms\"\nliveness-timeout = \"1s\"\nstorm-percent = 50\nself-fence-margin = \"1s\"\ncheck-interval = \"0s\"\n[fencing.nodes.node2]\nself-fence = true\n{extra}"
    );
    // The daemon first: a self-fencing node that can reach nobody for its isolation timeout
    // takes itself for the isolated one.
    c.start_daemon();
    c.wait_api().await;
    for i in [0, 2, 3] {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    let Watched { fate, pgid } = start_watched(&mut c, 1, TIMEOUT, FAST, &[], 0);
    c.wait_collectors_ready().await;
    // Armed, seen by the master, every watcher hears it, and it holds the peer set the master
    // assigned it (a node stopped before it took up its set cannot be proven reset).
    wait_for("node2's armed watchdog in its view", || async {
        let n = c.node("node2").await;
        let w = &n["witnesses"];
        let armed = w["watchdog"]["timeout-ms"] == 3000 && w["set-current"] == true;
        (armed && w["heard-by"].as_array().map(Vec::len) == Some(3)).then_some(())
    })
    .await;
    Setup { c, fate, pgid }
}

fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[tokio::test]
async fn a_hung_self_fencing_node_is_reset_by_its_watchdog_before_its_workloads_are_released() {
    let s = setup().await;
    let c = &s.c;
    let hung = maintd::report::now_ns();
    signal(*s.pgid.get().unwrap(), "-STOP");
    let fate = next_fate(s.fate, Duration::from_secs(30))
        .await
        .expect("the stand-in watchdog fires");
    let Fate::Reset(reset_at) = fate else {
        panic!("{fate:?}")
    };
    assert!(
        reset_at - hung >= TIMEOUT.as_nanos() as i64 - 500_000_000,
        "reset {:.1} s after the hang",
        (reset_at - hung) as f64 / 1e9
    );
    let f = c
        .wait_flow("the release", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    assert_released_after_reset(&f, reset_at);
    assert_eq!(f["safe-time-ms"], 6500, "{f:#}");
    assert_eq!(f["safe-proven"], true, "{f:#}");
    let log = c.hook_log();
    let mark = log.iter().position(|l| l.starts_with("offline node2"));
    let release = log.iter().position(|l| l.starts_with("release node2"));
    assert!(
        matches!((mark, release), (Some(m), Some(r)) if m < r),
        "marked before released: {log:?}"
    );
    let notes: Vec<&str> = f["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["note"].as_str())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("reset proven: no rule could keep")),
        "{notes:?}"
    );
    assert!(
        notes[0].contains("lost by its watchers"),
        "the second opinion decided: {notes:?}"
    );
    // Rebooted: its collector is back, healthy, and recovery clears the mark and the release.
    let mut c = s.c;
    c.reboot(1);
    let _back = start_watched(&mut c, 1, TIMEOUT, FAST, &[], 1);
    c.wait_flow("recovery", |x| x["id"] == f["id"] && x["status"] == "final")
        .await;
    let log = c.hook_log();
    assert!(log.iter().any(|l| l.starts_with("online node2")), "{log:?}");
    assert!(
        log.iter().any(|l| l.starts_with("reclaim node2")),
        "{log:?}"
    );
}

/// A daemon restart (or a failover) once the reset is proven: the proof is in the flow (a starved
/// watchdog is never fed again), and the new daemon releases at the recorded moment, neither
/// earlier nor later.
#[tokio::test]
async fn a_daemon_restarted_after_the_proof_releases_at_the_recorded_moment() {
    let mut s = setup().await;
    signal(*s.pgid.get().unwrap(), "-STOP");
    let proven =
        s.c.wait_flow("the proven wait", |f| {
            f["node"] == "node2" && f["safe-proven"] == true
        })
        .await;
    assert_eq!(proven["released"], false);
    s.c.kill_daemon();
    s.c.start_daemon();
    s.c.wait_api().await;
    let Ok(Fate::Reset(reset_at)) = next_fate(s.fate, Duration::from_secs(30)).await else {
        panic!("the stand-in watchdog did not fire")
    };
    let f =
        s.c.wait_flow("the release after the restart", |f| {
            f["id"] == proven["id"] && f["released"] == true
        })
        .await;
    assert_released_after_reset(&f, reset_at);
    let until = proven["safe-until"].as_i64().unwrap();
    assert_eq!(f["safe-until"].as_i64(), Some(until), "{f:#}");
    let fenced_at = f["fenced-at"].as_i64().unwrap();
    // One decision tick (a second at most on a loaded machine) after the recorded moment.
    assert!(
        fenced_at >= until && fenced_at - until < 1_500_000_000,
        "counted reset {:.2} s after the recorded moment",
        (fenced_at - until) as f64 / 1e9
    );
}

/// A daemon restart (or a failover) before the reset is proven: the new daemon holds no view of
/// the silent node and cannot tell what an earlier leader echoed to it, so it proves the reset
/// again from its own start, with the node's settings kept in the flow; never earlier than the
/// recorded estimate.
#[tokio::test]
async fn a_daemon_restarted_during_the_safe_time_resumes_the_wait_and_releases_after_the_reset() {
    let mut s = setup().await;
    signal(*s.pgid.get().unwrap(), "-STOP");
    let waiting =
        s.c.wait_flow("the recorded wait", |f| {
            f["node"] == "node2" && !f["safe-until"].is_null()
        })
        .await;
    assert_eq!(waiting["released"], false);
    s.c.kill_daemon();
    s.c.start_daemon();
    s.c.wait_api().await;
    let fate = next_fate(s.fate, Duration::from_secs(30))
        .await
        .expect("the stand-in watchdog fires");
    let Fate::Reset(reset_at) = fate else {
        panic!("{fate:?}")
    };
    let f =
        s.c.wait_flow("the release after the restart", |f| {
            f["id"] == waiting["id"] && f["released"] == true
        })
        .await;
    assert_released_after_reset(&f, reset_at);
    assert!(
        f["safe-until"].as_i64() >= waiting["safe-until"].as_i64(),
        "never earlier than recorded: {f:#}"
    );
    let (_, flows) = s.c.get("/1/fences").await;
    assert_eq!(
        flows.as_array().unwrap().len(),
        1,
        "resumed, not restarted: {flows:#}"
    );
}

#[tokio::test]
async fn a_bmc_whose_power_off_fails_falls_back_to_the_watchdog() {
    if !common::sims::available() {
        return;
    }
    let c = Cluster::new(4);
    let ipmi = common::sims::Ipmi::start(c.dir.path(), "node2");
    // The BMC answers, but to another password: every power-off fails.
    let wrong = c.secret("wrong.pw", "nope");
    let extra = format!(
        "[fencing.templates.ipmi]\nagent = \"fence_ipmilan\"\nsecrets = {{ password = \"{}\" }}\n[fencing.nodes.node2.power-management]\nretries = 0\ntimeout = \"20s\"\nmethods = [{{ template = \"ipmi\", params = {{ {} }} }}]\n",
        wrong.display(),
        ipmi.params()
    );
    let s = setup_with(c, &extra).await;
    signal(*s.pgid.get().unwrap(), "-STOP");
    let f =
        s.c.wait_flow("the release", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    let reset = next_fate(s.fate, Duration::from_secs(5)).await;
    let Ok(Fate::Reset(reset_at)) = reset else {
        panic!("{reset:?}")
    };
    assert_released_after_reset(&f, reset_at);
    let steps: Vec<String> = f["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{} {}: {}", t["step"], t["status"], t["note"]))
        .collect();
    assert!(
        steps.iter().any(|t| t.contains("\"self-fence\" \"new\"")
            && t.contains("fence_ipmilan off failed")
            && t.contains("falling back to self-fencing")),
        "{steps:#?}"
    );
    let calls = f["calls"].as_array().unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c["agent"] == "fence_ipmilan" && c["ok"] == false)
    );
    assert!(ipmi.powered_on(), "the BMC never powered it off");
}

#[tokio::test]
async fn a_cleanly_stopped_collector_disarms_its_watchdog_and_is_never_released() {
    let mut s = setup().await;
    let pid = s.c.collectors[1].as_ref().unwrap().child.id();
    signal(pid, "-TERM");
    let fate = next_fate(s.fate, Duration::from_secs(30))
        .await
        .expect("the stand-in sees the close");
    assert_eq!(fate, Fate::Disarmed);
    // Its last word was "disarmed": the master never counts on a reset that will not come.
    let f =
        s.c.wait_flow("the flow's refusal", |f| {
            f["node"] == "node2"
                && f["history"].as_array().is_some_and(|h| {
                    h.iter().any(|t| {
                        t["note"]
                            .as_str()
                            .is_some_and(|n| n.contains("no signed report of an armed watchdog"))
                    })
                })
        })
        .await;
    assert_eq!(f["released"], false);
    s.c.some_polls(50).await;
    let (_, flows) = s.c.get("/1/fences").await;
    assert!(
        flows
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["released"] == false),
        "{flows:#}"
    );
    assert!(!s.c.hook_log().iter().any(|l| l.starts_with("release")));
    s.c.collectors[1] = None;
}

/// A collector killed and started again on the same boot (systemd's restart) reads what its
/// predecessor recorded: a node that had starved its watchdog is never fed again, even in a
/// healthy cluster; one that was being vouched for goes on feeding.
#[tokio::test]
async fn a_collector_restarted_on_the_same_boot_never_feeds_a_node_that_had_starved() {
    let mut s = setup().await;
    let record = s.c.dir.path().join("collector-state-node2/watchdog.json");
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the feeder keeps a record"))
            .unwrap();
    // The boot its reports carry (the test's stand-in for the kernel's boot id).
    let boot = s.c.boot_id(1);
    assert_eq!(kept["boot-id"], boot.trim(), "{kept}");
    assert_eq!(kept["starved"], false);
    // Killed (no magic close); its successor finds a record saying the node had starved.
    s.c.collectors[1] = None;
    let starved = serde_json::json!({"boot-id": boot.trim(), "vouched-at": 1.0, "starved": true});
    std::fs::write(&record, starved.to_string()).unwrap();
    let again = start_watched(&mut s.c, 1, TIMEOUT, FAST, &[], 1);
    let Ok(Fate::Reset(_)) = next_fate(again.fate, Duration::from_secs(15)).await else {
        panic!("a node that had starved was fed again by a restarted collector")
    };
    let logs = s.c.collector_log_tails(50);
    assert!(
        logs.contains("stopped feeding its watchdog earlier in this boot"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_missing_watchdog_device_stops_the_collector_with_a_clear_error() {
    let c = Cluster::new(1);
    let cfg = c.collector_config(0, "scripted", "cluster.key");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("[collector.watchdog]\nenabled = true\ndevice = \"/nonexistent/watchdog\"\n");
    std::fs::write(&cfg, text).unwrap();
    let out = std::process::Command::new(&*BIN)
        .args(["--config", cfg.to_str().unwrap(), "collector"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("watchdog device /nonexistent/watchdog") && err.contains("softdog"),
        "{err}"
    );
}

#[tokio::test]
async fn a_self_fencing_node_whose_collector_arms_no_watchdog_shows_fencing_inactive() {
    let mut c = Cluster::new(2);
    c.extra_daemon_toml =
        "[fencing]\ncheck-interval = \"10m\"\n[fencing.nodes.node2]\nself-fence = true\n".into();
    c.start_daemon();
    c.wait_api().await;
    for i in 0..2 {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    c.wait_collectors_ready().await;
    let fencing = wait_for("node2's readiness", || async {
        let n = c.node("node2").await;
        (!n["fencing"].is_null()).then(|| n["fencing"].clone())
    })
    .await;
    assert_eq!(fencing["state"], "inactive", "{fencing:#}");
    assert!(
        fencing["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no armed watchdog")),
        "{fencing:#}"
    );
    assert_eq!(fencing["methods"][0]["method"], "self-fence");
    assert!(
        c.node("node1").await["fencing"].is_null(),
        "no plan, no check"
    );
    let (_, all) = c.get("/1/fences/readiness").await;
    assert_eq!(all["node2"]["state"], "inactive");
    wait_for("the log line", || async {
        c.daemon_log().contains("fencing inactive").then_some(())
    })
    .await;
}
