//! Bad input never triggers an action: rejected reports (wrong key, forged signature, replay,
//! a report answering no poll, oversized body, wrong node), whitelist escapes, diagnose
//! timeouts and bad output; and a node whose clock is far off is still heard.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::RawQuery;
use axum::routing::get;
use common::*;
use maintd::report::{Envelope, Key, now_ns};
use maintd_core::verdict::Verdict;

/// How a fake collector misbehaves.
#[derive(Clone, Copy)]
enum Fake {
    Forged,
    Replay,
    /// Signed now, answering no poll (a report held back, or one served to another reader).
    Unasked,
    Oversized,
    WrongNode,
    /// Honest, with a clock ten minutes behind and an Ok verdict: taken.
    Skewed,
}

fn evacuate() -> Verdict {
    Verdict::parse_bytes(br#"{"status":"evacuate","details":"forged"}"#).unwrap()
}

/// Serves a misbehaving collector for `node` on `port`.
async fn fake_collector(port: u16, node: &'static str, key: Key, mode: Fake) {
    let replayed: Arc<Mutex<Option<String>>> = Arc::default();
    let app = Router::new().route(
        "/1/report/diagnose",
        get(move |RawQuery(q): RawQuery| {
            let key = key.clone();
            let replayed = replayed.clone();
            async move {
                let now = now_ns();
                let v = evacuate();
                let nonce: u64 = q
                    .as_deref()
                    .and_then(|q| q.strip_prefix("nonce="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                match mode {
                    Fake::Forged => {
                        let mut env = Envelope::new(node, now as u64, now, now, &v, None)
                            .answering(nonce)
                            .sign(&key);
                        // Signed for an Ok verdict, then the data is swapped.
                        let ok = Verdict::builtin_ok();
                        let mut okenv = Envelope::new(node, now as u64, now, now, &ok, None)
                            .answering(nonce)
                            .sign(&key);
                        okenv.data = env.data.clone();
                        env = okenv;
                        serde_json::to_string(&env).unwrap()
                    }
                    Fake::Replay => {
                        let mut r = replayed.lock().unwrap();
                        if r.is_none() {
                            let ok = Verdict::builtin_ok();
                            *r = Some(
                                serde_json::to_string(
                                    &Envelope::new(node, 5, now, now, &ok, None)
                                        .answering(nonce)
                                        .sign(&key),
                                )
                                .unwrap(),
                            );
                        }
                        r.clone().unwrap()
                    }
                    Fake::Unasked => serde_json::to_string(
                        &Envelope::new(node, now as u64, now, now, &v, None).sign(&key),
                    )
                    .unwrap(),
                    Fake::Skewed => {
                        let old = now - 600_000_000_000;
                        let ok = Verdict::builtin_ok();
                        serde_json::to_string(
                            &Envelope::new(node, now as u64, old, old, &ok, None)
                                .answering(nonce)
                                .sign(&key),
                        )
                        .unwrap()
                    }
                    Fake::Oversized => {
                        let big = Verdict::from_value(
                            serde_json::json!({"status":"evacuate","details":"x".repeat(300_000)}),
                        )
                        .unwrap();
                        serde_json::to_string(
                            &Envelope::new(node, now as u64, now, now, &big, None)
                                .answering(nonce)
                                .sign(&key),
                        )
                        .unwrap()
                    }
                    Fake::WrongNode => serde_json::to_string(
                        &Envelope::new("node9", now as u64, now, now, &v, None)
                            .answering(nonce)
                            .sign(&key),
                    )
                    .unwrap(),
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_reports_create_no_event_and_are_counted_with_their_reason() {
    let mut c = Cluster::new(7);
    let key = Key::load(&c.path("cluster.key")).unwrap();
    let modes = [
        ("node1", Fake::Forged, "signature does not verify"),
        ("node2", Fake::Replay, "not the poll"),
        ("node3", Fake::Unasked, "answers poll 0, not the poll"),
        ("node4", Fake::Oversized, "cap"),
        ("node5", Fake::WrongNode, "signed for node \"node9\""),
    ];
    for (i, (node, mode, _)) in modes.iter().enumerate() {
        fake_collector(c.ports[i], node, key.clone(), *mode).await;
    }
    fake_collector(c.ports[6], "node7", key.clone(), Fake::Skewed).await;
    // node6 is a real collector with the wrong key.
    let other = c.path("other.key");
    assert!(
        std::process::Command::new(&*BIN)
            .args(["keygen", "--key-file"])
            .arg(&other)
            .status()
            .unwrap()
            .success()
    );
    c.set_verdict("node6", r#"{"status":"evacuate","details":"real"}"#);
    c.start_collector_with(5, "scripted", "other.key");
    c.start_daemon();
    c.wait_api().await;

    for (node, _, reason) in modes
        .iter()
        .chain([("node6", Fake::Forged, "signature does not verify")].iter())
    {
        let n = wait_for("rejections to be counted", || async {
            let n = c.node(node).await;
            (n["rejected-reports"].as_u64().unwrap_or(0) >= 2).then_some(n)
        })
        .await;
        assert!(
            n["last-rejection"].as_str().unwrap_or("").contains(reason),
            "{node}: {n}"
        );
    }
    // The replaying node's first report was accepted; every repeat is rejected.
    assert!(c.node("node2").await["last-seq"].as_u64() == Some(5));
    // A node whose clock is ten minutes behind answers the poll: it is heard, and nothing
    // refused.
    let n = wait_for("the skewed node's reports", || async {
        let n = c.node("node7").await;
        (n["last-seq"].as_u64().is_some()).then_some(n)
    })
    .await;
    assert_eq!(n["rejected-reports"], 0, "{n}");
    c.some_polls(5).await;
    assert!(
        c.status().await.is_empty(),
        "a rejected report created an event"
    );
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("maintd_reports_rejected_total{reason=\"unanswered\",node=\"node2\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whitelist_escapes_and_broken_diagnoses_are_reported_as_ok_with_the_reason() {
    let mut c = Cluster::new(6);
    let d = c.path("diagnose.d");
    std::os::unix::fs::symlink(d.join("scripted"), d.join("link")).unwrap();
    write_exec(&d.join("groupw"), "echo '{\"status\":\"evacuate\"}'");
    std::fs::set_permissions(d.join("groupw"), std::fs::Permissions::from_mode(0o775)).unwrap();
    write_exec(
        &d.join("slow"),
        "sleep 10; echo '{\"status\":\"evacuate\"}'",
    );
    write_exec(&d.join("garbage"), "echo 'evacuate now!'");
    write_exec(&d.join("unknown"), "echo '{\"status\":\"reboot\"}'");
    // A file outside the whitelist directory, reached by a relative name, must never run.
    write_exec(&c.path("outside"), "echo '{\"status\":\"evacuate\"}'");
    let cases = [
        ("link", "symlink"),
        ("groupw", "writable by group or others"),
        ("slow", "timed out"),
        ("garbage", "invalid output"),
        ("unknown", "unknown status"),
        ("absent", "No such file"),
    ];
    for (i, (name, _)) in cases.iter().enumerate() {
        c.start_collector_with(i, name, "cluster.key");
    }
    c.start_daemon();
    c.wait_api().await;
    for (i, (name, expect)) in cases.iter().enumerate() {
        let node = c.nodes[i].clone();
        let n = wait_for("a diagnose error", || async {
            let n = c.node(&node).await;
            n["diagnose-error"].as_str().map(|_| n.clone())
        })
        .await;
        let err = n["diagnose-error"].as_str().unwrap();
        assert!(err.contains(expect), "{name}: {err}");
        assert_eq!(n["last-report"]["status"], "Ok");
        assert_eq!(n["last-report"]["details"]["diagnose-error"], err);
    }
    c.some_polls(5).await;
    assert!(
        c.status().await.is_empty(),
        "a broken diagnose triggered an action"
    );

    // A name with a slash is refused when the collector starts.
    let cfg = c.collector_config(0, "../outside", "cluster.key");
    let out = std::process::Command::new(&*BIN)
        .args(["--config", cfg.to_str().unwrap(), "collector"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bare name"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_command_outside_the_whitelist_fails_the_event_and_runs_nothing() {
    let mut c = Cluster::new(1);
    write_exec(
        &c.path("evil"),
        &format!("touch {}", c.path("evil-ran").display()),
    );
    c.set_verdict("node1", r#"{"status":"live-repair","command":"../evil"}"#);
    c.start().await;
    let e = c.wait_status("node1", "failed").await;
    assert!(
        e["jobs"][0]["detail"].as_str().unwrap().contains("refused"),
        "{e}"
    );
    assert!(!c.path("evil-ran").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_config_and_key_files_are_refused_with_a_clear_message() {
    let c = Cluster::new(1);
    let bad = c.path("bad.toml");
    std::fs::write(&bad, "[daemon]\npoll-interval = \"fast\"\n").unwrap();
    let (code, err) = c.daemon_exit(&bad, &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("poll-interval"), "{err}");

    std::fs::set_permissions(
        c.path("cluster.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let (code, err) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("chmod 600"), "{err}");
}

/// Every configuration error is reported before the daemon opens anything: a `[fencing]` section
/// that names an unknown template leaves neither a lock nor a database behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_fencing_section_is_refused_before_anything_is_opened() {
    let mut c = Cluster::new(1);
    c.extra_daemon_toml =
        "[fencing.nodes.node1.power-management]\nmethods = [{ template = \"nope\" }]\n".into();
    let (code, err) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("unknown template \"nope\""), "{err}");
    assert!(!c.path("state/maintd.lock").exists(), "the lock was taken");
    assert!(
        !c.path("state/state.db").exists(),
        "the database was opened"
    );
}
