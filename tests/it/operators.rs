//! Operators with names and roles, against a real daemon: a key that every node holds cannot
//! command once operators are configured, a reader cannot operate, every command is audited
//! with its operator's name, an operator's key can be rolled over, and reads can be closed to
//! the anonymous.

use crate::common;

use common::*;
use maintd::report::operator::{OPERATOR_HEADER, OperatorKey};
use maintd::report::{DAEMON_TARGET, Key, SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};
use serde_json::Value;

/// Sends `method path` signed by operator `op` (or by the cluster key when `None`).
async fn send(
    c: &Cluster,
    method: reqwest::Method,
    path: &str,
    op: Option<&OperatorKey>,
) -> (u16, Value) {
    let ts = now_ns();
    let mut r = c
        .client
        .request(method.clone(), format!("{}{path}", c.url()))
        .header(TIMESTAMP_HEADER, ts.to_string());
    r = match op {
        Some(op) => r
            .header(
                SIGNATURE_HEADER,
                op.sign_request(method.as_str(), path, ts, b""),
            )
            .header(OPERATOR_HEADER, &op.name),
        None => {
            let key = Key::load(&c.path("cluster.key")).unwrap();
            r.header(
                SIGNATURE_HEADER,
                key.sign_request(DAEMON_TARGET, method.as_str(), path, ts, b""),
            )
        }
    };
    let resp = r.send().await.unwrap();
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

fn operators_toml(c: &Cluster, alice_files: &[&str]) -> String {
    let files: Vec<String> = alice_files
        .iter()
        .map(|f| format!("\"{}\"", c.path(f).display()))
        .collect();
    format!(
        "anonymous-read = false\n[daemon.operators.alice]\nrole = \"operate\"\nkey-files = [{}]\n[daemon.operators.bob]\nrole = \"read\"\nkey-files = [\"{}\"]\n",
        files.join(", "),
        c.path("bob.key").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_operator_with_the_operate_role_commands_and_every_command_names_its_operator() {
    let mut c = Cluster::new(2);
    let alice = c.operator_key("alice", "alice.key");
    let bob = c.operator_key("bob", "bob.key");
    c.extra_daemon_toml = operators_toml(&c, &["alice.key"]);
    c.start().await;
    let post = reqwest::Method::POST;

    // The cluster key, which every node holds, commands nothing: 403, logged as its.
    for path in [
        "/1/fencing/pause?reason=x",
        "/1/nodes/node2/drill",
        "/1/nodes/node2/reset-seq",
        "/1/events/8c7e1a64-3b4b-4c7b-9a43-1f0a2b3c4d5e/cancel",
    ] {
        let (code, err) = send(&c, post.clone(), path, None).await;
        assert_eq!(code, 403, "{path}: {err}");
        assert!(
            err["message"].as_str().unwrap().contains("cluster key"),
            "{err}"
        );
    }
    let log = c.daemon_log();
    assert!(
        log.lines().any(|l| l.contains("signed request refused")
            && l.contains("forbidden")
            && l.contains("cluster-key")),
        "{log}"
    );
    // A reader reads, and cannot pause.
    let (code, _) = send(&c, reqwest::Method::GET, "/1/status", Some(&bob)).await;
    assert_eq!(code, 200);
    let (code, err) = send(&c, post.clone(), "/1/fencing/pause?reason=x", Some(&bob)).await;
    assert_eq!(code, 403, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("read role"),
        "{err}"
    );
    // Anonymous reads are closed, but health and metrics stay open.
    let (code, _) = c.get("/1/status").await;
    assert_eq!(code, 401);
    assert_eq!(c.get("/1/health").await.0, 200);
    // An operator nobody configured, and a key claimed for another operator: 401.
    let mallory = c.operator_key("mallory", "mallory.key");
    let (code, _) = send(&c, post.clone(), "/1/fencing/pause", Some(&mallory)).await;
    assert_eq!(code, 401);
    let posing = OperatorKey {
        name: "alice".into(),
        key: bob.key.clone(),
    };
    let (code, _) = send(&c, post.clone(), "/1/fencing/pause", Some(&posing)).await;
    assert_eq!(code, 401);

    // Alice pauses, through the CLI with her key file: the pause and the audit trail name her.
    let out = c.cli_as("alice.key", &["fencing", "pause", "--reason", "rack work"]);
    assert!(out.status.success(), "{out:?}");
    let (code, summary) = send(&c, reqwest::Method::GET, "/1/fences/summary", Some(&alice)).await;
    assert_eq!(code, 200);
    assert_eq!(summary["paused"]["by"], "alice", "{summary}");
    // A repair event, canceled by alice: the event's view names her.
    c.set_verdict("node1", r#"{"status":"evacuate","details":"disk"}"#);
    let id = wait_for("node1's event", || async {
        let (_, v) = send(&c, reqwest::Method::GET, "/1/status", Some(&bob)).await;
        v.as_array()?
            .iter()
            .find(|e| e["node"] == "node1")
            .map(|e| e["id"].as_str().unwrap().to_string())
    })
    .await;
    let (code, err) = send(
        &c,
        post.clone(),
        &format!("/1/events/{id}/cancel"),
        Some(&alice),
    )
    .await;
    assert!(code == 200 || code == 409, "{code} {err}");
    let (_, one) = send(
        &c,
        reqwest::Method::GET,
        &format!("/1/status/{id}"),
        Some(&bob),
    )
    .await;
    let cmds = one["commands"].as_array().expect("commands").clone();
    assert_eq!(cmds.len(), 1, "{one}");
    assert_eq!(cmds[0]["operator"], "alice");
    assert_eq!(cmds[0]["status"], code);
    let (_, audit) = send(&c, reqwest::Method::GET, "/1/audit", Some(&bob)).await;
    let who: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["operator"].as_str().unwrap())
        .collect();
    assert_eq!(
        who,
        ["alice", "alice"],
        "refused commands are not in the trail: {audit}"
    );
    assert!(c.daemon_log().contains("operator command"));
    let m = c.metrics().await;
    for reason in ["forbidden", "unknown-operator", "forged"] {
        assert!(
            m.contains(&format!(
                "maintd_requests_refused_total{{reason=\"{reason}\"}}"
            )),
            "{reason}"
        );
    }
    c.kill_daemon();
}

/// `POST /1/fencing/resume` signed by `op`: its status.
async fn resume_as(c: &Cluster, op: &OperatorKey) -> u16 {
    send(c, reqwest::Method::POST, "/1/fencing/resume", Some(op))
        .await
        .0
}

/// Alice's key rolled over while the cluster runs, with SIGHUPs only (no restart): both keys
/// work during the rollover, then only the new one; the collectors are never refused nor found
/// silent meanwhile. A configuration that cannot be read changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_key_is_rolled_over_with_both_accepted_meanwhile() {
    let mut c = Cluster::new(2);
    let old = c.operator_key("alice", "alice.key");
    let _bob = c.operator_key("bob", "bob.key");
    c.extra_daemon_toml = operators_toml(&c, &["alice.key"]);
    c.start().await;
    assert_eq!(resume_as(&c, &old).await, 200);

    let new = c.operator_key("alice", "alice-next.key");
    assert_eq!(resume_as(&c, &new).await, 401);
    let pid = c.daemon.as_ref().unwrap().child.id();
    let said = "SIGHUP: operators and node keys read again";
    c.extra_daemon_toml = operators_toml(&c, &["alice.key", "alice-next.key"]);
    c.daemon_config();
    reload(&c.daemon, said).await;
    assert_eq!(resume_as(&c, &old).await, 200);
    assert_eq!(resume_as(&c, &new).await, 200);
    // A key file that is not there: refused whole, logged, the keys in use stay.
    c.extra_daemon_toml = operators_toml(&c, &["alice-next.key", "missing.key"]);
    c.daemon_config();
    reload(&c.daemon, "SIGHUP: cannot read the operators").await;
    assert_eq!(resume_as(&c, &old).await, 200);
    c.extra_daemon_toml = operators_toml(&c, &["alice-next.key"]);
    c.daemon_config();
    reload(&c.daemon, said).await;
    assert_eq!(resume_as(&c, &old).await, 401);
    assert_eq!(resume_as(&c, &new).await, 200);
    assert_eq!(
        c.daemon.as_ref().unwrap().child.id(),
        pid,
        "never restarted"
    );
    // The nodes were polled all along (a loaded machine may not have reached them yet).
    let nodes = wait_for("every node polled", || async {
        let (_, nodes) = send(&c, reqwest::Method::GET, "/1/nodes", Some(&new)).await;
        let all = nodes.as_array()?.iter().all(|n| n["reachable"] == true);
        all.then_some(nodes)
    })
    .await;
    for n in nodes.as_array().unwrap() {
        assert_eq!(n["rejected-reports"].as_u64().unwrap_or(0), 0, "{n}");
    }
    // A key file listed under another operator's name is refused at start, naming both.
    c.kill_daemon();
    c.extra_daemon_toml = operators_toml(&c, &["bob.key"]);
    let cfg = c.daemon_config();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maintd"))
        .args(["--config", cfg.to_str().unwrap(), "daemon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"bob\"'s, not \"alice\"'s"), "{err}");
}

/// Before any operator is configured (a daemon upgraded alone), the cluster key commands as
/// before, and is audited as `cluster-key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_operators_the_cluster_key_still_commands_and_is_audited_as_such() {
    let mut c = Cluster::new(1);
    c.start().await;
    let (code, _) = send(&c, reqwest::Method::POST, "/1/fencing/pause", None).await;
    assert_eq!(code, 200);
    let (_, audit) = c.get("/1/audit").await;
    assert_eq!(audit[0]["operator"], "cluster-key", "{audit}");
    let (_, summary) = c.get("/1/fences/summary").await;
    assert_eq!(summary["paused"]["by"], "cluster-key");
    c.kill_daemon();
}
