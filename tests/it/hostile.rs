//! Hostile clients without the cluster key, aimed at a healthy node's collector and at the
//! daemon: floods of big unsigned bodies, slow headers, idle connections, huge or half-sent
//! bodies, captured and replayed signed requests. None of it may fence or release a healthy
//! node, run a repair twice or elsewhere, or stop `/1/status` from answering. Every attack is
//! bounded in count and time and aimed at 127.0.0.1 only.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use maintd::report::{DAEMON_TARGET, Key, SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};
use serde_json::{Value, json};

/// Fencing for node1 with a stand-in agent: any flow that starts shows in /1/fences, and any
/// release in the hook log. The grace is short, so a node that looks silent for 3 s is fenced.
fn fenced_cluster() -> Cluster {
    let mut c = Cluster::new(3);
    let calls = c.path("agent-calls");
    c.extra_daemon_toml = c.stub_fencing(
        "fence_stub",
        &format!("cat >> {0}; echo called >> {0}; exit 0", calls.display()),
        "3s",
        &["node1"],
    );
    c.extra_collector_toml = r#"
[collector.limits]
header-timeout = "2s"
idle-timeout = "5s"
body-timeout = "1s"
"#
    .into();
    c
}

/// Raises this test process's own fd limit: the attacks open a few thousand sockets.
fn raise_own_fd_limit() {
    let _ = maintd::http::listener::raise_fd_limit();
}

/// What a healthy node must look like after an attack: unfenced, unreleased, reachable.
async fn assert_unharmed(c: &mut Cluster) {
    assert!(
        alive(&mut c.collectors[0]),
        "the attacked collector died; its log:\n{}",
        std::fs::read_to_string(c.path("collector-node1.log")).unwrap_or_default()
    );
    let fences = c.get("/1/fences").await.1;
    assert_eq!(
        fences,
        json!([]),
        "a healthy node was fenced; daemon log:\n{}",
        c.daemon_log()
    );
    assert!(
        !c.hook_log().iter().any(|l| l.starts_with("release")),
        "{:?}",
        c.hook_log()
    );
    // The readiness check asks for the status; nothing else may have run.
    let calls = std::fs::read_to_string(c.path("agent-calls")).unwrap_or_default();
    assert!(
        calls
            .lines()
            .filter(|l| l.starts_with("action="))
            .all(|l| l == "action=status"),
        "a fence agent ran: {calls}"
    );
    wait_for("node1 to be reachable", || async {
        (c.node("node1").await["reachable"] == true).then_some(())
    })
    .await;
}

/// Polls `/1/status` every 100 ms until `stop`, and returns how many answers came back (every
/// request must be answered; the latency figures are the benchmark's business).
fn watch_status(c: &Cluster) -> tokio::task::JoinHandle<(usize, usize)> {
    let url = format!("{}/1/status", c.url());
    let client = c.client.clone();
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0, 0);
        let end = Instant::now() + Duration::from_secs(6);
        while Instant::now() < end {
            match client.get(&url).send().await {
                Ok(r) if r.status() == 200 => ok += 1,
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (ok, failed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_without_the_key_neither_fence_nor_release_a_healthy_node() {
    raise_own_fd_limit();
    let mut c = fenced_cluster();
    c.start_collectors();
    // The attacked collector runs as under systemd's default fd limit, with its address space
    // capped as a container's memory limit would (an unbounded buffer would kill it).
    c.start_collector_wrapped(
        0,
        &["prlimit", "--nofile=1024:1024", "--as=805306368", "--"],
    );
    c.start_daemon();
    c.wait_api().await;
    wait_for("node1 to be reachable", || async {
        (c.node("node1").await["reachable"] == true).then_some(())
    })
    .await;
    let port = c.ports[0];
    let api = c.api_port;

    // 1. Big unsigned POSTs to the signed routes of the collector and the daemon.
    let status = watch_status(&c);
    let answered = attack::big_unsigned_posts(port, api, 300).await;
    assert!(
        answered.iter().flatten().all(|&s| s == 401),
        "unsigned requests must be refused: {answered:?}"
    );
    assert!(answered.iter().flatten().count() > 0);
    let (ok, failed) = status.await.unwrap();
    assert!(
        ok > 0 && failed == 0,
        "/1/status must keep answering: {ok} ok, {failed} failed"
    );

    // 2. 1,100 slow-header connections, trickling a byte each second, and 2,000 idle ones.
    let status = watch_status(&c);
    let mut slow = attack::slow_headers(port, 1100).await;
    let idle = attack::idle(port, 2000).await;
    for _ in 0..5 {
        attack::trickle(&mut slow).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (ok, failed) = status.await.unwrap();
    assert!(ok > 0 && failed == 0, "{ok} ok, {failed} failed");
    drop(slow);
    drop(idle);

    // 3. A 10 GB Content-Length and a half-sent body on a signed route.
    let huge = attack::signed_looking_head("/1/repair", 10_000_000_000);
    assert_eq!(attack::raw_request(port, huge, 0).await, Some(413));
    let half = attack::signed_looking_head("/1/repair", 100);
    assert_eq!(attack::raw_request(port, half, 10).await, Some(408));

    // The node was never silent for the grace: nothing fenced or released; the collector lives.
    c.some_polls(20).await;
    assert_unharmed(&mut c).await;
    let m = c.metrics().await;
    assert!(m.contains("maintd_http_connections"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_of_a_signed_request_is_judged_before_its_body() {
    let mut c = Cluster::new(1);
    c.start().await;
    for (port, path) in [
        (c.ports[0], "/1/repair"),
        (c.api_port, "/1/events/x/cancel"),
    ] {
        // No signature headers: 401 at once, the 10 GB body never read.
        let t = Instant::now();
        let unsigned =
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n");
        assert_eq!(
            attack::raw_request(port, unsigned, 0).await,
            Some(401),
            "{path}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        // Extreme timestamps are refused, not a panic (a debug build overflowed here).
        for ts in [i64::MIN.to_string(), i64::MAX.to_string()] {
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {ts}\r\n{SIGNATURE_HEADER}: {}\r\nContent-Length: 0\r\n\r\n",
                "0".repeat(64)
            );
            assert_eq!(
                attack::raw_request(port, head, 0).await,
                Some(401),
                "{path} {ts}"
            );
        }
    }
    // The daemon's signed routes take no body at all.
    let head = format!(
        "POST /1/events/x/cancel HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {}\r\n{SIGNATURE_HEADER}: {}\r\nContent-Length: 10\r\n\r\n",
        now_ns(),
        "0".repeat(64)
    );
    assert_eq!(attack::raw_request(c.api_port, head, 10).await, Some(413));
    assert!(alive(&mut c.collectors[0]) && alive(&mut c.daemon));
    let (code, _) = c.get("/1/status").await;
    assert_eq!(code, 200);
}

async fn send_raw_signed(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    ts: i64,
    sig: &str,
    body: &[u8],
) -> (u16, Value) {
    let r = client
        .request(method, format!("{base}{path}"))
        .header(TIMESTAMP_HEADER, ts.to_string())
        .header(SIGNATURE_HEADER, sig)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// A signed repair request to a collector, once it answers at all.
async fn post_repair(
    client: &reqwest::Client,
    node: &str,
    ts: i64,
    sig: &str,
    body: &[u8],
) -> Option<(u16, Value)> {
    let r = client
        .post(format!("{node}/1/repair"))
        .header(TIMESTAMP_HEADER, ts.to_string())
        .header(SIGNATURE_HEADER, sig)
        .body(body.to_vec())
        .send()
        .await
        .ok()?;
    Some((r.status().as_u16(), r.json::<Value>().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_repair_runs_once_and_only_on_the_node_it_was_signed_for() {
    let mut c = Cluster::new(2);
    let runs = c.path("runs");
    c.set_hook(
        "fix",
        &format!(
            "cat > /dev/null; echo \"$MAINTD_NODE\" >> {}",
            runs.display()
        ),
    );
    c.start().await;
    let key = Key::load(&c.path("cluster.key")).unwrap();
    let body = serde_json::to_vec(&json!({
        "job": "replay-1", "event": "e", "command": "fix", "input": {"status": "Ok"}
    }))
    .unwrap();
    let ts = now_ns();
    // Signed for node1, as the daemon would: captured on the way.
    let sig = key.sign_request("node1", "POST", "/1/repair", ts, &body);
    let node1 = format!("http://127.0.0.1:{}", c.ports[0]);
    let node2 = format!("http://127.0.0.1:{}", c.ports[1]);
    let post = reqwest::Method::POST;
    let (code, err) = send_raw_signed(
        &c.client,
        &node2,
        post.clone(),
        "/1/repair",
        ts,
        &sig,
        &body,
    )
    .await;
    assert_eq!(code, 401, "replayed at another node: {err}");
    assert!(err["message"].as_str().unwrap().contains("node2"), "{err}");
    let (code, _) = send_raw_signed(
        &c.client,
        &node1,
        post.clone(),
        "/1/repair",
        ts,
        &sig,
        &body,
    )
    .await;
    assert_eq!(code, 202);
    let (code, err) = send_raw_signed(
        &c.client,
        &node1,
        post.clone(),
        "/1/repair",
        ts,
        &sig,
        &body,
    )
    .await;
    assert_eq!(code, 401, "the same signed request twice: {err}");
    assert!(err["message"].as_str().unwrap().contains("replay"), "{err}");
    wait_for("the repair to run", || async {
        std::fs::read_to_string(&runs)
            .is_ok_and(|s| s.lines().count() == 1)
            .then_some(())
    })
    .await;
    // A restarted collector remembers the job: the same job, freshly signed, runs nothing.
    c.collectors[0] = None;
    c.start_collector_with(0, "scripted", "cluster.key");
    let resent = wait_for("the restarted collector", || {
        let (c, key, body, node1) = (&c, &key, &body, &node1);
        async move {
            let ts = now_ns();
            let sig = key.sign_request("node1", "POST", "/1/repair", ts, body);
            post_repair(&c.client, node1, ts, &sig, body).await
        }
    })
    .await;
    assert_eq!(resent.0, 200, "{resent:?}");
    assert_eq!(resent.1["state"], "done");
    c.some_polls(3).await;
    assert_eq!(
        std::fs::read_to_string(&runs)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        ["node1"]
    );
    // A signed cancel to the daemon, replayed: refused the second time.
    let path = "/1/events/8c7e1a64-3b4b-4c7b-9a43-1f0a2b3c4d5e/cancel";
    let ts = now_ns();
    let sig = key.sign_request(DAEMON_TARGET, "POST", path, ts, b"");
    let (code, _) = send_raw_signed(&c.client, &c.url(), post.clone(), path, ts, &sig, b"").await;
    assert_eq!(code, 404);
    let (code, err) = send_raw_signed(&c.client, &c.url(), post.clone(), path, ts, &sig, b"").await;
    assert_eq!(code, 401, "{err}");
    // A captured reset-seq, accepted once, and replayed after a daemon restart within its
    // window: still refused.
    let path = "/1/nodes/node2/reset-seq";
    let ts = now_ns();
    let sig = key.sign_request(DAEMON_TARGET, "POST", path, ts, b"");
    let (code, _) = send_raw_signed(&c.client, &c.url(), post.clone(), path, ts, &sig, b"").await;
    assert_eq!(code, 200);
    c.kill_daemon();
    c.start_daemon();
    c.wait_api().await;
    let (code, err) = send_raw_signed(&c.client, &c.url(), post.clone(), path, ts, &sig, b"").await;
    assert_eq!(code, 401, "replayed after a restart: {err}");
    assert!(err["message"].as_str().unwrap().contains("replay"), "{err}");
    // Spelled another way, the same signature is refused before it is looked at: upper case,
    // mixed case, padded with zeros, cut short. So is the timestamp spelled another way.
    let upper = sig.to_uppercase();
    let mixed: String = sig
        .chars()
        .enumerate()
        .map(|(i, ch)| {
            if i % 2 == 0 {
                ch.to_ascii_uppercase()
            } else {
                ch
            }
        })
        .collect();
    for respelled in [upper, mixed, format!("00{sig}"), sig[..62].to_string()] {
        let (code, err) =
            send_raw_signed(&c.client, &c.url(), post.clone(), path, ts, &respelled, b"").await;
        assert_eq!(code, 401, "{respelled}: {err}");
        assert!(
            err["message"].as_str().unwrap().contains("lower-case"),
            "{err}"
        );
    }
    let fresh = now_ns();
    let sig_fresh = key.sign_request(DAEMON_TARGET, "POST", path, fresh, b"");
    for ts_spelled in [format!("+{fresh}"), format!("0{fresh}")] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {ts_spelled}\r\n{SIGNATURE_HEADER}: {sig_fresh}\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(
            attack::raw_request(c.api_port, head, 0).await,
            Some(401),
            "{ts_spelled}"
        );
    }
    // The signature sent twice (the right one and a wrong one, in either order): refused.
    for (a, b) in [
        (sig_fresh.clone(), "0".repeat(64)),
        ("0".repeat(64), sig_fresh.clone()),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {fresh}\r\n{SIGNATURE_HEADER}: {a}\r\n{SIGNATURE_HEADER}: {b}\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(attack::raw_request(c.api_port, head, 0).await, Some(401));
    }
    let log = c.daemon_log();
    assert!(
        log.lines()
            .any(|l| l.contains("signed request refused") && l.contains("malformed")),
        "every re-spelling is logged with its reason: {log}"
    );
    // So is a repair replayed at a restarted collector.
    let ts = now_ns();
    let body2 = serde_json::to_vec(&json!({
        "job": "replay-2", "event": "e", "command": "fix", "input": {"status": "Ok"}
    }))
    .unwrap();
    let sig = key.sign_request("node1", "POST", "/1/repair", ts, &body2);
    let (code, _) = send_raw_signed(
        &c.client,
        &node1,
        post.clone(),
        "/1/repair",
        ts,
        &sig,
        &body2,
    )
    .await;
    assert_eq!(code, 202);
    c.stop_collector_keeping_boot(0);
    c.start_collector_with(0, "scripted", "cluster.key");
    let (code, err) = wait_for("the restarted collector's answer", || {
        let (c, node1, sig, body2) = (&c, &node1, &sig, &body2);
        async move { post_repair(&c.client, node1, ts, sig, body2).await }
    })
    .await;
    assert_eq!(code, 401, "replayed after a collector restart: {err}");
    // Every refusal is logged with its reason and counted, on the daemon and the collector.
    let forged = "0".repeat(64);
    let (code, _) = send_raw_signed(
        &c.client,
        &c.url(),
        post.clone(),
        path,
        now_ns(),
        &forged,
        b"",
    )
    .await;
    assert_eq!(code, 401);
    let stale = now_ns() - 3_600_000_000_000;
    let sig = key.sign_request(DAEMON_TARGET, "POST", path, stale, b"");
    let (code, _) = send_raw_signed(&c.client, &c.url(), post, path, stale, &sig, b"").await;
    assert_eq!(code, 401);
    let m = c.metrics().await;
    for reason in ["replayed", "forged", "stale", "malformed"] {
        assert!(
            m.contains(&format!(
                "maintd_requests_refused_total{{reason=\"{reason}\"}}"
            )),
            "{reason}: {m}"
        );
    }
    let log = c.daemon_log();
    assert!(
        log.contains("signed request refused") && log.contains("\"forged\""),
        "{log}"
    );
    let cm = c
        .client
        .get(format!("{node1}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        cm.contains("maintd_collector_requests_refused_total{reason=\"replayed\"} 1"),
        "{cm}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_cancel_is_idempotent_and_agent_output_is_redacted() {
    // Five nodes: two silent at once stay under the 50 % storm threshold.
    let mut c = Cluster::new(5);
    let pw = c.secret("bmc.pw", "Hunter2-secret");
    // Isolation is slow (time to cancel); power-management echoes its parameters, as an agent
    // with verbose=1 does, behind a Python warning, and then fails.
    let agents = c.stub_agents(&[
        ("fence_slow", "cat > /dev/null; sleep 3; exit 0"),
        (
            "fence_echo",
            "echo '/usr/lib/python3/dist-packages/pexpect/x.py:1: DeprecationWarning: old' >&2\necho '  import imp' >&2\nwhile read l; do echo \"Sent: $l\"; done\necho 'Failed: Unable to obtain correct plug status or plug is not available' >&2\nexit 1",
        ),
    ]);
    c.operator_key("carol", "carol.key");
    c.extra_daemon_toml = format!(
        r#"
[daemon.operators.carol]
role = "operate"
key-files = ["{}"]
[fencing]
agents-dir = "{}"
grace = "1s"
liveness-interval = "200ms"
liveness-timeout = "500ms"
storm-percent = 50
max-restarts = 0
[fencing.templates.slow]
agent = "fence_slow"
[fencing.templates.echo]
agent = "fence_echo"
secrets = {{ password = "{}" }}
[fencing.nodes.node1.isolation]
retries = 0
methods = [{{ template = "slow" }}]
[fencing.nodes.node1.power-management]
retries = 0
methods = [{{ template = "echo" }}]
[fencing.nodes.node2.power-management]
retries = 0
methods = [{{ template = "echo" }}]
"#,
        c.path("carol.key").display(),
        agents.display(),
        pw.display()
    );
    c.start().await;
    // node1: cancel during the slow isolation, twice.
    c.kill_collector(0);
    let f = c
        .wait_flow("node1's flow", |f| {
            f["node"] == "node1" && f["step"] == "isolation" && f["status"] == "running"
        })
        .await;
    let id = f["id"].as_str().unwrap().to_string();
    let first = c.cli_as("carol.key", &["cancel", &id]);
    assert!(first.status.success(), "{first:?}");
    let second = c.cli_as("carol.key", &["cancel", &id]);
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("409") && err.contains("already canceled"),
        "{err}"
    );
    let fences = c.get("/1/fences").await.1;
    let f = fences
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id.as_str())
        .unwrap();
    let cancels = f["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["note"] == "canceled by operator")
        .count();
    assert_eq!(cancels, 1, "{f:#}");
    // The timeline names who canceled, and how each attempt was answered.
    let (_, timeline) = c.get(&format!("/1/fences/{id}/timeline")).await;
    let commands: Vec<&str> = timeline
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "command")
        .map(|e| e["what"].as_str().unwrap())
        .collect();
    assert_eq!(commands.len(), 2, "{timeline:#}");
    assert!(
        commands[0].contains("by operator carol (answered 200)")
            && commands[1].contains("by operator carol (answered 409)"),
        "{commands:?}"
    );

    // node2: the failing agent's echo of its parameters never leaves the daemon.
    c.kill_collector(1);
    let f = c
        .wait_flow("node2's failed power-off", |f| {
            f["node"] == "node2" && f["status"] == "error"
        })
        .await;
    let shown = serde_json::to_string(&f).unwrap();
    assert!(
        shown.contains("Unable to obtain correct plug status"),
        "{shown}"
    );
    assert!(!shown.contains("DeprecationWarning"), "{shown}");
    let status = serde_json::to_string(&c.status().await).unwrap();
    let one = c
        .get(&format!("/1/status/{}", f["id"].as_str().unwrap()))
        .await
        .1;
    for (what, text) in [
        ("/1/fences", shown),
        ("/1/status", status),
        ("/1/status/<id>", one.to_string()),
        ("the daemon log", c.daemon_log()),
        (
            "the database",
            String::from_utf8_lossy(&std::fs::read(c.path("state/state.db")).unwrap()).into_owned(),
        ),
    ] {
        assert!(
            !text.contains("Hunter2-secret"),
            "the password reached {what}"
        );
    }
    assert_eq!(c.get("/1/fences").await.1.as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_that_do_not_round_trip_naively_still_verify_and_depth_is_refused_at_the_source() {
    let mut c = Cluster::new(3);
    c.extra_daemon_toml = "[actions]\nevacuate = false\n".into();
    c.set_verdict(
        "node1",
        r#"{"status":"evacuate","details":{"fs-used-ratio":0.92665207135085950,"big":123456789012345678901234567890,"neg":-1.7976931348623157e308,"tiny":5e-324}}"#,
    );
    let deep = format!(
        r#"{{"status":"evacuate","details":{}1{}}}"#,
        "[".repeat(126),
        "]".repeat(126)
    );
    c.set_verdict("node2", &deep);
    c.start().await;
    c.wait_event("node1", "the evacuate event", |e| e["action"] == "evacuate")
        .await;
    // Byte-exact wherever the details go: the API, the stored report, the CLI and the hooks.
    let exact = [
        r#""fs-used-ratio":0.92665207135085950"#,
        r#""big":123456789012345678901234567890"#,
        r#""neg":-1.7976931348623157e308"#,
        r#""tiny":5e-324"#,
    ];
    let status = c.get_text("/1/status").await.1;
    let nodes = c.get_text("/1/nodes").await.1;
    let out = c.cli(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let cli = String::from_utf8(out.stdout).unwrap().replace(": ", ":");
    for text in exact {
        assert!(status.contains(text), "/1/status lost {text}: {status}");
        assert!(nodes.contains(text), "/1/nodes lost {text}: {nodes}");
        assert!(
            cli.contains(text),
            "maintd status --json lost {text}: {cli}"
        );
    }
    let n1 = c.node("node1").await;
    assert_eq!(n1["rejected-reports"], 0, "{n1:#}");
    let n2 = wait_for("node2's diagnose error", || async {
        let n = c.node("node2").await;
        n["diagnose-error"].is_string().then_some(n)
    })
    .await;
    assert!(
        n2["diagnose-error"]
            .as_str()
            .unwrap()
            .contains("daemon would refuse"),
        "{n2:#}"
    );
    assert_eq!(
        n2["rejected-reports"], 0,
        "the collector refuses it, not the daemon"
    );
    assert!(c.status().await.iter().all(|e| e["node"] != "node2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_rejections_are_the_documented_json_error() {
    let mut c = Cluster::new(1);
    c.start().await;
    for path in ["/1/tags?node=a&node=b", "/1/status/%ff%fe"] {
        let r = c
            .client
            .get(format!("{}{path}", c.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{path}"
        );
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "bad-request", "{path}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

/// Request hygiene on both ports: a head over the cap is 431, and a path or query that is not
/// UTF-8 (also once percent-decoded) is 400, before any handler sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_invalid_utf8_are_refused_on_both_ports() {
    let mut c = Cluster::new(1);
    c.start().await;
    for port in [c.ports[0], c.api_port] {
        let big = format!(
            "GET /1/status HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n",
            "a".repeat(100 * 1024)
        );
        assert_eq!(attack::raw_request(port, big, 0).await, Some(431), "{port}");
        for target in [
            "/1/status?x=%ff%fe",
            "/1/events?node=%C3%28",
            "/1/%ff/status",
            "/1/events/%ff/history",
        ] {
            let head = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
            assert_eq!(
                attack::raw_request(port, head, 0).await,
                Some(400),
                "{port} {target}"
            );
        }
        let head = "GET /1/events?node=node%31 HTTP/1.1\r\nHost: x\r\n\r\n".to_string();
        let ok = attack::raw_request(port, head, 0).await;
        assert!(matches!(ok, Some(200) | Some(404)), "{port}: {ok:?}");
    }
    // A signed pause whose query is not UTF-8 is refused, whatever its signature: nothing is
    // stored with U+FFFD in place of what was sent.
    let path = "/1/fencing/pause?reason=%ff";
    let ts = now_ns();
    let key = Key::load(&c.path("cluster.key")).unwrap();
    let sig = key.sign_request(DAEMON_TARGET, "POST", path, ts, b"");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {ts}\r\n{SIGNATURE_HEADER}: {sig}\r\nContent-Length: 0\r\n\r\n"
    );
    assert_eq!(attack::raw_request(c.api_port, head, 0).await, Some(400));
    let (_, status) = c.get("/1/status").await;
    assert!(!status.to_string().contains('\u{fffd}'), "{status}");
    assert!(alive(&mut c.collectors[0]) && alive(&mut c.daemon));
}
