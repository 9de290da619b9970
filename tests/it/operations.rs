//! What an operator relies on when things go wrong: a node removed from the inventory mid-repair,
//! a corrupt or missing database, a stalled engine, a collector whose sequence ran ahead, the
//! metrics and alert rules as promtool reads them, and error messages that say each cause once.

use crate::common;

use std::process::Command;

use common::*;
use maintd::report::{Envelope, Key, now_ns};
use maintd_core::verdict::Verdict;

fn promtool() -> Option<&'static str> {
    let ok = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("MAINTD_REQUIRE_SIMS").as_deref() != Ok("1"),
            "promtool missing: apt-get install prometheus (scripts/test does)"
        );
        eprintln!("skipped: promtool missing (apt-get install prometheus)");
        return None;
    }
    Some("promtool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_from_the_inventory_mid_repair_is_dropped_with_a_reason() {
    let mut c = Cluster::new(2);
    let log = c.path("hooks.log");
    c.set_hook(
        "evacuate",
        &format!(
            "echo \"$MAINTD_ACTION $1 $2 $MAINTD_REASON\" >> {}; [ \"$1\" = node2 ] && sleep 20; true",
            log.display()
        ),
    );
    c.set_verdict("node2", r#"{"status":"evacuate","details":"disk"}"#);
    c.start().await;
    let e = c.wait_status("node2", "pending").await;
    let id = e["id"].as_str().unwrap().to_string();
    wait_for("the evacuate hook to start", || async {
        c.hook_log()
            .iter()
            .any(|l| l.starts_with("evacuate node2"))
            .then_some(())
    })
    .await;
    // The operator takes node2 out of the inventory and restarts the daemon.
    c.kill_daemon();
    let cfg = c.daemon_config();
    let text = std::fs::read_to_string(&cfg).unwrap();
    let cut = text.find("[[nodes]]\nname = \"node2\"").unwrap();
    let end = text[cut + 9..]
        .find("[[nodes]]")
        .map_or(text.len(), |i| cut + 9 + i);
    std::fs::write(&cfg, format!("{}{}", &text[..cut], &text[end..])).unwrap();
    c.daemon = Some(c.spawn("daemon", &["--config", cfg.to_str().unwrap(), "daemon"]));
    c.wait_api().await;
    let (code, v) = wait_for("the event to be dropped", || async {
        let r = c.get(&format!("/1/status/{id}")).await;
        (r.0 == 404).then_some(r)
    })
    .await;
    assert_eq!(code, 404);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("node node2 left the inventory"),
        "{v}"
    );
    c.some_polls(5).await;
    assert!(
        !c.hook_log().iter().any(|l| l.starts_with("offline node2")),
        "{:?}",
        c.hook_log()
    );
    assert!(c.status().await.iter().all(|e| e["node"] != "node2"));
    let log = c.daemon_log();
    assert!(log.contains("left the inventory"), "{log}");
    assert!(!log.contains("unknown node"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_stops_the_start_and_a_missing_one_is_reported() {
    let mut c = Cluster::new(1);
    // Missing database beside job directories: said in the log.
    std::fs::create_dir_all(c.path("state/jobs/job-x-1")).unwrap();
    c.set_verdict("node1", r#"{"status":"evacuate","details":"d"}"#);
    c.start().await;
    c.wait_status("node1", "completed").await;
    assert!(
        c.daemon_log().contains("directories of earlier hook jobs"),
        "{}",
        c.daemon_log()
    );
    c.kill_daemon();
    // Everything into the main file first (a killed daemon leaves it in the WAL), then one
    // page of garbage in the middle of it.
    let db = c.path("state/state.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "wal_checkpoint", "TRUNCATE")
        .unwrap();
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() >= 3 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096..8192] {
        *b = 0xa5;
    }
    std::fs::write(&db, bytes).unwrap();
    let (code, err) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("integrity check") && err.contains(db.to_str().unwrap()),
        "{err}"
    );
}

/// A healthy database on a read-only file system is reported as such: it cannot be written,
/// nothing says it is damaged, and nothing suggests restoring it (needs root for the mount).
#[test]
fn a_healthy_database_on_a_read_only_file_system_is_not_called_damaged() {
    let c = Cluster::new(1);
    let ro = c.path("ro");
    let Some(fs) = Tmpfs::mount(&ro, "16m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let db = ro.join("state.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    fs.writable(false);
    let mut c = c;
    c.extra_daemon_toml = format!("db = \"{}\"", db.display());
    let (code, e) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1), "{e}");
    assert!(
        e.contains("cannot be written") && e.contains("Read-only file system"),
        "{e}"
    );
    assert!(!e.contains("integrity") && !e.contains("restore"), "{e}");
}

/// A collector whose sequence ran far ahead (its clock was wrong), then restarted lower: its
/// reports are replays until the operator resets the node's sequence state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_out_of_range_are_refused_and_an_operator_can_reset_a_node() {
    use axum::routing::get;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let mut c = Cluster::new(1);
    let key = Key::load(&c.path("cluster.key")).unwrap();
    let seq = Arc::new(AtomicU64::new(u64::MAX));
    let s = seq.clone();
    let app = axum::Router::new().route(
        "/1/report/diagnose",
        get(move |axum::extract::RawQuery(q): axum::extract::RawQuery| {
            let (key, s) = (key.clone(), s.clone());
            async move {
                let now = now_ns();
                let v = Verdict::builtin_ok();
                let n = s.load(Ordering::SeqCst);
                let nonce = q
                    .as_deref()
                    .and_then(|q| q.strip_prefix("nonce="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                // Every answer moves on by one, as a real collector's does.
                s.store(n.saturating_add(1).max(n), Ordering::SeqCst);
                let env = Envelope::new("node1", n, now, now, &v, None).answering(nonce);
                serde_json::to_string(&env.sign(&key)).unwrap()
            }
        }),
    );
    let l = tokio::net::TcpListener::bind(("127.0.0.1", c.ports[0]))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    c.start_daemon();
    c.wait_api().await;
    let n = wait_for("a rejection", || async {
        let n = c.node("node1").await;
        (n["rejected-reports"].as_u64() > Some(0)).then_some(n)
    })
    .await;
    assert!(
        n["last-rejection"].as_str().unwrap().contains("outside"),
        "{n:#}"
    );
    assert!(n["last-seq"].is_null(), "{n:#}");
    // Far ahead but in range: accepted; then the collector "restarts" far lower.
    seq.store(4_000_000_000_000_000_000, Ordering::SeqCst);
    wait_for("the high sequence", || async {
        (c.node("node1").await["last-seq"].as_u64() > Some(4_000_000_000_000_000_000)).then_some(())
    })
    .await;
    seq.store(1_000, Ordering::SeqCst);
    wait_for("replays", || async {
        c.node("node1").await["last-rejection"]
            .as_str()
            .is_some_and(|r| r.contains("not above"))
            .then_some(())
    })
    .await;
    // Unsigned, the reset is refused; signed through the CLI, it takes.
    let r = c
        .client
        .post(format!("{}/1/nodes/node1/reset-seq", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let out = c.cli(&["reset-seq", "node1"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("was 4000000000000000"),
        "{out:?}"
    );
    wait_for("reports accepted again", || async {
        let s = c.node("node1").await["last-seq"].as_u64();
        s.is_some_and(|s| s < 1_000_000).then_some(())
    })
    .await;
    let out = c.cli(&["reset-seq", "ghost"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{out:?}"
    );
}

/// A status agent answers OFF, an off succeeds: a fence that completes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_after_a_repair_and_a_fence_and_the_alert_rules_test_green() {
    let Some(promtool) = promtool() else {
        return;
    };
    let rules = common::sims::repo("deploy/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yaml"],
        vec!["test", "rules", "alerts-test.yaml"],
    ] {
        let out = Command::new(promtool)
            .args(&args)
            .current_dir(&rules)
            .output()
            .unwrap();
        assert!(out.status.success(), "promtool {args:?}: {out:?}");
    }
    let mut c = Cluster::new(5);
    c.extra_daemon_toml = c.stub_fencing("fence_ok", POWER_AGENT, "1s", &["node3"]);
    c.set_verdict("node1", r#"{"status":"live-repair","command":"fix"}"#);
    c.set_verdict("node2", r#"{"status":"evacuate","details":"d"}"#);
    c.start().await;
    c.wait_status("node1", "completed").await;
    c.wait_status("node2", "completed").await;
    c.kill_collector(2);
    c.wait_flow("node3's release", |f| {
        f["node"] == "node3" && f["released"] == true
    })
    .await;
    let text = c.metrics().await;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {out:?}\n{text}"
    );
    for series in [
        "maintd_events{repair_status=\"completed\"} 2",
        "maintd_fence_stage_seconds_count{stage=\"power-off\"} 1",
        "maintd_fence_flows{step=\"power-management\",status=\"error\"} 0",
        "maintd_oldest_running_job_age_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    // The collector that died is said once in the log, not on every poll.
    let lines = c
        .daemon_log()
        .lines()
        .filter(|l| l.contains("collector stopped answering") && l.contains("node3"))
        .count();
    assert_eq!(lines, 1, "{}", c.daemon_log());
}

#[test]
fn a_connection_error_names_each_cause_once() {
    let out = Command::new(&*BIN)
        .args(["status", "--url", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(err.matches("error sending request").count(), 1, "{err}");
}

/// `maintd fencing pause` holds every fence (a silent node is not fenced), shows in the
/// summary, the metric and `maintd fencing status`, survives a daemon restart, and `resume`
/// lets the held fence go ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_pause_holds_fencing_across_a_restart_until_resumed() {
    let mut c = Cluster::new(3);
    c.extra_daemon_toml = c.stub_fencing("fence_ok", POWER_AGENT, "1s", &["node3"]);
    c.start().await;
    let url = c.url();
    let out = c.cli(&[
        "fencing",
        "pause",
        "--reason",
        "firmware upgrade",
        "--url",
        &url,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("fencing paused: firmware upgrade"));
    c.kill_collector(2);
    c.some_polls(20).await;
    assert_eq!(c.get("/1/fences").await.1, serde_json::json!([]), "paused");
    let m = c.metrics().await;
    assert!(m.contains("maintd_fencing_paused 1"), "{m}");
    c.kill_daemon();
    c.start_daemon();
    c.wait_api().await;
    c.some_polls(15).await;
    assert_eq!(
        c.get("/1/fences").await.1,
        serde_json::json!([]),
        "still paused"
    );
    let out = c.cli(&["fencing", "status", "--url", &url]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("PAUSED") && said.contains("firmware upgrade"),
        "{said}"
    );
    assert!(c.daemon_log().contains("fencing is paused"));
    let out = c.cli(&["fencing", "resume", "--url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = c
        .wait_flow("the held fence", |f| {
            f["node"] == "node3" && f["released"] == true
        })
        .await;
    // The operator's view: the list, and one flow with its timeline.
    let id = f["id"].as_str().unwrap();
    let out = c.cli(&["fences", "list", "--url", &url]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(id));
    let out = c.cli(&["fences", "show", id, "--url", &url]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("timeline")
            && shown.contains("the collector stopped answering")
            && shown.contains("fence_ok off")
            && shown.contains("power-off verified"),
        "{shown}"
    );
    assert!(c.metrics().await.contains("maintd_fencing_paused 0"));
}

/// A cancel that arrives while the power-off runs is answered 409 with the reason, and the
/// power-off goes to its verified end: never a 200 followed by the power-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_the_power_off_runs_is_refused_and_the_off_completes() {
    let mut c = Cluster::new(3);
    let slow = format!(
        "in=$(cat); printf '%s\\n' \"$in\" | grep -q '^action=off' && sleep 3\nprintf '%s\\n' \"$in\" | sh {}",
        c.path("agents/fence_ok").display()
    );
    c.extra_daemon_toml = c.stub_fencing("fence_ok", POWER_AGENT, "1s", &["node3"]);
    c.stub_agents(&[("fence_slow", &slow)]);
    c.extra_daemon_toml = c
        .extra_daemon_toml
        .replace("agent = \"fence_ok\"", "agent = \"fence_slow\"");
    c.start().await;
    c.kill_collector(2);
    let f = c
        .wait_flow("the power-off running", |f| {
            f["node"] == "node3" && f["step"] == "power-management" && f["status"] == "running"
        })
        .await;
    let id = f["id"].as_str().unwrap();
    let out = c.cli(&["cancel", id, "--url", &c.url()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("409"), "{err}");
    assert!(err.contains("power-off is running"), "{err}");
    let f = c
        .wait_flow("the verified off", |f| {
            f["node"] == "node3" && f["released"] == true
        })
        .await;
    assert_eq!(f["canceled"], false);
    assert!(f["fenced-at"].is_i64());
}

/// The value of `series` in a Prometheus text exposition (0 when absent).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Reports come over UDP from collectors that answer it, and over HTTP from those that do not
/// (`collector.poll-udp = false` here), which are then asked over HTTP only: either way every
/// node's reports arrive, and the counts say which way they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_come_over_udp_and_over_http_from_a_collector_without_it() {
    for udp in [true, false] {
        let mut c = Cluster::new(2);
        if !udp {
            c.extra_collector_toml = "poll-udp = false\n".into();
        }
        c.start().await;
        let count = |m: &str, outcome: &str| {
            sample(
                m,
                &format!("maintd_poll_udp_total{{outcome=\"{outcome}\"}}"),
            )
        };
        if udp {
            // Two cycles' reports from both nodes, over UDP.
            wait_for("four reports over UDP", || async {
                let m = c.metrics().await;
                (count(&m, "answered") >= 4.0).then_some(())
            })
            .await;
        } else {
            let m = wait_for("six reports", || async {
                let m = c.metrics().await;
                (sample(&m, "maintd_reports_accepted_total") >= 6.0).then_some(m)
            })
            .await;
            assert_eq!(count(&m, "answered"), 0.0, "{m}");
            assert!(count(&m, "no-answer") >= 2.0, "{m}");
            assert!(
                count(&m, "http-only") >= 2.0,
                "the poll stops waiting for UDP: {m}"
            );
        }
    }
}
