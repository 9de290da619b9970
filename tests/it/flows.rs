//! End-to-end repair flows: a real daemon and real collectors on loopback, scripted diagnoses.

use crate::common;

use common::*;
use serde_json::Value;

const EVAC: &str = r#"{"status":"evacuate","details":{"disk":"sda"}}"#;

fn jobs(e: &Value) -> Vec<(String, String)> {
    e["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["kind"].as_str().unwrap().to_string(),
                j["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn tags_of(c: &Cluster, node: &str) -> String {
    let out = c.cli(&["tags", "list", node]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_repair_runs_on_the_collector_with_the_json_on_stdin() {
    let mut c = Cluster::new(3);
    c.set_verdict(
        "node2",
        r#"{"details":{"nic":"eth0","b":[1,2],"id":123456789012345678901234567890,"r":1.50},"command":"fix","status":"live-repair"}"#,
    );
    c.start().await;
    let e = c.wait_status("node2", "completed").await;
    assert_eq!(jobs(&e), vec![("live-repair".into(), "succeeded".into())]);
    assert_eq!(
        e["jobs"][0]["reason"],
        format!("maintd:{}", e["id"].as_str().unwrap())
    );
    assert!(e["jobs"][0]["detail"].as_str().unwrap().contains("fixed"));
    // The repair gets the diagnose's JSON in canonical form, its numbers as printed.
    assert_eq!(
        std::fs::read_to_string(c.path("repair-input-node2.json")).unwrap(),
        r#"{"command":"fix","details":{"b":[1,2],"id":123456789012345678901234567890,"nic":"eth0","r":1.50},"status":"live-repair"}"#
    );
    let tag = format!("maintd:repairready:{}", e["id"].as_str().unwrap());
    assert_eq!(e["tag"], tag);
    assert!(tags_of(&c, "node2").contains(&tag));
    // The healthy nodes have no events, and no hook ran for a live repair.
    assert_eq!(c.status().await.len(), 1);
    assert!(c.hook_log().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evacuate_runs_hooks_offlines_tags_and_acknowledgement_brings_the_node_back() {
    let mut c = Cluster::new(3);
    c.set_verdict("node1", EVAC);
    c.start().await;
    let e = c.wait_status("node1", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    assert_eq!(
        jobs(&e),
        vec![
            ("evacuate".into(), "succeeded".into()),
            ("offline".into(), "succeeded".into())
        ]
    );
    assert_eq!(
        c.hook_log(),
        vec![
            format!("evacuate node1 {id} maintd:{id}"),
            format!("offline node1 {id} maintd:{id}")
        ]
    );
    assert_eq!(c.node("node1").await["offline"], true);
    let tag = format!("maintd:repairready:{id}");
    assert!(tags_of(&c, "node1").contains(&tag));

    // Acknowledged while still observed: kept, node stays offline.
    let out = c.cli(&["tags", "remove", "node1", &tag]);
    assert!(out.status.success(), "{out:?}");
    c.wait_event("node1", "acknowledged", |e| e["acknowledged"] == true)
        .await;
    c.some_polls(5).await;
    assert_eq!(c.node("node1").await["offline"], true);
    assert_eq!(c.hook_log().len(), 2);

    // The hardware is fixed: the event is forgotten once the online hook brought the node back.
    c.set_verdict("node1", r#"{"status":"Ok"}"#);
    wait_for("the event to be forgotten", || async {
        c.status().await.is_empty().then_some(())
    })
    .await;
    assert_eq!(c.node("node1").await["offline"], false);
    assert_eq!(c.hook_log()[2], format!("online node1 {id} maintd:{id}"));
    let (code, body) = c.get(&format!("/1/status/{id}")).await;
    assert_eq!(code, 404);
    assert!(body["message"].as_str().unwrap().contains("cleared"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hook_fails_the_event_and_removing_repairfailed_restarts_the_flow() {
    let mut c = Cluster::new(2);
    c.set_hook(
        "evacuate",
        &format!(
            "echo \"evacuate $1\" >> {}; echo no capacity >&2; exit 1",
            c.path("hooks.log").display()
        ),
    );
    c.set_verdict("node2", EVAC);
    c.start().await;
    let e = c.wait_status("node2", "failed").await;
    let id = e["id"].as_str().unwrap().to_string();
    assert_eq!(jobs(&e), vec![("evacuate".into(), "failed".into())]);
    assert!(e["note"].as_str().unwrap().contains("no capacity"), "{e}");
    let tag = format!("maintd:repairfailed:{id}");
    assert_eq!(e["tag"], tag);
    c.some_polls(5).await;
    // No further job for a failed event: no offline, no second evacuate.
    assert_eq!(c.hook_log(), vec!["evacuate node2"]);
    assert_eq!(c.node("node2").await["offline"], false);
    assert!(tags_of(&c, "node2").contains(&tag));

    // Acknowledging the failure with the problem still there starts a new event.
    c.set_hook("evacuate", "exit 0");
    let out = c.cli(&["tags", "remove", "node2", &tag]);
    assert!(out.status.success(), "{out:?}");
    let e2 = c.wait_status("node2", "completed").await;
    assert_ne!(e2["id"], e["id"]);
    assert_eq!(c.status().await.len(), 1, "the failed event was forgotten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_further_jobs_and_answers_404_409_and_401() {
    let mut c = Cluster::new(2);
    let started = c.path("evacuate-started");
    c.set_hook(
        "evacuate",
        &format!(
            "touch {}; sleep 2; echo \"evacuate $1\" >> {}",
            started.display(),
            c.path("hooks.log").display()
        ),
    );
    c.set_verdict("node1", EVAC);
    c.set_verdict("node2", r#"{"status":"live-repair","details":"fan"}"#);
    c.start().await;
    let e = c.wait_status("node1", "pending").await;
    let id = e["id"].as_str().unwrap();
    wait_for("the evacuate hook to start", || async {
        started.exists().then_some(())
    })
    .await;
    let out = c.cli(&["cancel", id]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("canceled"));
    c.some_polls(10).await;
    let e = c.wait_status("node1", "canceled").await;
    assert_eq!(jobs(&e), vec![("evacuate".into(), "succeeded".into())]);
    assert_eq!(
        c.hook_log(),
        vec!["evacuate node1"],
        "no offline after cancel"
    );
    assert!(!tags_of(&c, "node1").contains("maintd:"));

    // 409 for a final event, 404 for an unknown one, 401 unsigned, 400 for a bad id.
    let done = c.wait_status("node2", "completed").await;
    let out = c.cli(&["cancel", done["id"].as_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("409"),
        "{out:?}"
    );
    let out = c.cli(&["cancel", "8c7e1a64-3b4b-4c7b-9a43-1f0a2b3c4d5e"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{out:?}"
    );
    let r = c
        .client
        .post(format!("{}/1/events/{id}/cancel", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unauthorized");

    // Canceled and no longer observed: forgotten.
    c.set_verdict("node1", r#"{"status":"Ok"}"#);
    wait_for("the canceled event to be forgotten", || async {
        (!c.status().await.iter().any(|e| e["node"] == "node1")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_round_then_restart_resumes_without_duplicating_a_job() {
    let mut c = Cluster::new(2);
    let log = c.path("hooks.log").display().to_string();
    c.set_hook(
        "evacuate",
        &format!("echo \"start $1\" >> {log}; sleep 3; echo \"end $1\" >> {log}"),
    );
    c.set_verdict("node1", EVAC);
    c.set_verdict("node2", EVAC);
    // Both reports are there before the daemon's first poll, so both land in one round even
    // on a loaded machine.
    c.start_collectors();
    c.wait_collectors_ready().await;
    c.start_daemon();
    c.wait_api().await;
    wait_for("both evacuations to start", || async {
        (c.hook_log()
            .iter()
            .filter(|l| l.starts_with("start"))
            .count()
            == 2)
            .then_some(())
    })
    .await;
    c.kill_daemon();
    c.start_daemon();
    c.wait_api().await;
    for n in ["node1", "node2"] {
        let e = c.wait_status(n, "completed").await;
        assert_eq!(
            jobs(&e),
            vec![
                ("evacuate".into(), "succeeded".into()),
                ("offline".into(), "succeeded".into())
            ]
        );
    }
    let log = c.hook_log();
    for n in ["node1", "node2"] {
        assert_eq!(
            log.iter().filter(|l| **l == format!("start {n}")).count(),
            1,
            "{log:?}"
        );
        assert_eq!(
            log.iter().filter(|l| **l == format!("end {n}")).count(),
            1,
            "{log:?}"
        );
        assert_eq!(
            log.iter()
                .filter(|l| l.starts_with(&format!("offline {n}")))
                .count(),
            1,
            "{log:?}"
        );
    }
    // Both evacuations ran in the same round.
    let evs = c.status().await;
    assert_eq!(evs[0]["jobs"][0]["round"], evs[1]["jobs"][0]["round"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_exits_11_naming_the_holder() {
    let mut c = Cluster::new(1);
    c.start().await;
    let (code, err) = c.daemon_exit(&c.daemon_config(), &["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(11), "{err}");
    let pid = c.daemon.as_ref().unwrap().child.id();
    assert!(err.contains(&format!("pid {pid}")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_hook_for_an_enabled_action_fails_start_up() {
    let c = Cluster::new(1);
    std::fs::remove_file(c.path("repair.d/offline")).unwrap();
    let (code, err) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("hook \"offline\"") && err.contains("No such file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_daemon_and_collector_cleanly_and_state_survives() {
    let mut c = Cluster::new(1);
    c.set_verdict("node1", r#"{"status":"live-repair","details":"fan"}"#);
    c.start().await;
    let e = c.wait_status("node1", "completed").await;
    for p in [
        c.daemon.as_mut().unwrap(),
        c.collectors[0].as_mut().unwrap(),
    ] {
        let status = p.terminate().await;
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            std::fs::read_to_string(&p.log).unwrap()
        );
    }
    // The event survives the restart unchanged, and no new one appears.
    c.start().await;
    c.some_polls(5).await;
    let evs = c.status().await;
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0]["id"], e["id"]);
    assert_eq!(evs[0]["repair-status"], "completed");
}
