//! The API's lists against a real daemon and real collectors: filters, pages behind a cursor,
//! ETags with 304, gzip, and a watch that answers when a new event appears.

use crate::common;

use std::io::Read;
use std::time::Duration;

use common::*;
use serde_json::Value;

const EVAC: &str = r#"{"status":"evacuate","details":{"disk":"sda"}}"#;
const LIVE: &str = r#"{"status":"live-repair","command":"fix","details":{"nic":"eth0"}}"#;

async fn get(c: &Cluster, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = c.client.get(format!("{}{path}", c.url()));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

fn names(v: &Value, field: &str) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| e[field].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_pages_etags_gzip_and_a_watch() {
    let mut c = Cluster::new(4);
    // Events stay in view: no evacuation runs.
    c.extra_daemon_toml = "[actions]\nevacuate = false\n".into();
    c.set_verdict("node1", EVAC);
    c.set_verdict("node2", LIVE);
    c.start().await;
    c.wait_event("node1", "the evacuate event", |e| e["action"] == "evacuate")
        .await;
    c.wait_status("node2", "completed").await;

    // Filters: each one is applied by the daemon, and a wrong one is named.
    let (s, v) = c.get("/1/status?node=node1").await;
    assert_eq!((s, names(&v, "node")), (200, vec!["node1".to_string()]));
    let (_, v) = c.get("/1/status?action=live-repair").await;
    assert_eq!(names(&v, "node"), vec!["node2".to_string()]);
    let (_, v) = c.get("/1/status?status=completed&node=node1").await;
    assert_eq!(v, serde_json::json!([]));
    let (_, v) = c.get("/1/status?since=9000000000000000000").await;
    assert_eq!(v, serde_json::json!([]));
    for (path, names_it) in [
        ("/1/status?status=bogus", "noted, pending"),
        ("/1/status?nosuch=1", "nosuch"),
        ("/1/nodes?action=evacuate", "`action`"),
        ("/1/status?limit=0", "limit 0"),
        ("/1/status?cursor=zz", "cursor"),
        ("/1/status?wait=999", "wait 999"),
    ] {
        let (s, v) = c.get(path).await;
        assert_eq!(s, 400, "{path}: {v}");
        assert!(
            v["message"].as_str().unwrap_or_default().contains(names_it),
            "{path}: {v}"
        );
    }
    let (_, v) = c.get("/1/nodes?node=node3").await;
    assert_eq!(names(&v, "name"), vec!["node3".to_string()]);
    let (_, all) = c.get("/1/nodes?status=reachable").await;
    assert_eq!(all.as_array().unwrap().len(), 4);

    // Pages: following the cursor gives the whole list once, in order.
    let mut cursor = None::<String>;
    let mut paged = Vec::new();
    loop {
        let path = match &cursor {
            Some(cur) => format!("/1/nodes?limit=3&cursor={cur}"),
            None => "/1/nodes?limit=3".into(),
        };
        let r = get(&c, &path, &[]).await;
        let next = r
            .headers()
            .get("x-next-cursor")
            .map(|h| h.to_str().unwrap().to_string());
        let page: Value = r.json().await.unwrap();
        paged.extend(names(&page, "name"));
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(paged, vec!["node1", "node2", "node3", "node4"]);

    // ETag: the same list is answered 304 to a client that holds it.
    let r = get(&c, "/1/status", &[]).await;
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    let r = get(&c, "/1/status", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status(), 304);
    assert!(r.bytes().await.unwrap().is_empty());

    // gzip when asked, and the same JSON inside.
    let r = get(&c, "/1/status", &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&r.bytes().await.unwrap()[..])
        .read_to_string(&mut text)
        .unwrap();
    let unzipped: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(unzipped, c.get("/1/status").await.1);

    // A watch: held while nothing changes, answered with the new event once it appears.
    let watch = {
        let url = format!("{}/1/status?action=evacuate&wait=60", c.url());
        let client = c.client.clone();
        let etag = get(&c, "/1/status?action=evacuate", &[]).await.headers()["etag"]
            .to_str()
            .unwrap()
            .to_string();
        tokio::spawn(async move {
            let r = client
                .get(url)
                .header("if-none-match", etag)
                .timeout(Duration::from_secs(90))
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    c.some_polls(3).await;
    assert!(!watch.is_finished(), "a watch with nothing new must wait");
    c.set_verdict("node3", EVAC);
    let (s, v) = watch.await.unwrap();
    assert_eq!(s, 200, "{v}");
    let mut nodes = names(&v, "node");
    nodes.sort();
    assert_eq!(nodes, vec!["node1", "node3"]);
}

/// A steady node's row is not rewritten each poll (its new sequence and diagnose time are no
/// change), yet `/1/nodes` shows them current: the latest answer comes from the poll's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_node_is_shown_current_though_its_row_is_not_rewritten() {
    let mut c = Cluster::new(1);
    c.start().await;
    let seq = |n: &Value| n["last-seq"].as_u64();
    let first = wait_for("a first report", || async {
        let n = c.node("node1").await;
        seq(&n).map(|_| n)
    })
    .await;
    let stored = || {
        let db = rusqlite::Connection::open_with_flags(
            c.path("state/state.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        db.query_row(
            "SELECT last_answer_ns, last_seq FROM nodes WHERE name = 'node1'",
            [],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .unwrap()
    };
    let row = stored();
    // Three more reports (the collector diagnoses and the daemon polls every 200 ms).
    let later = wait_for("three more reports", || async {
        let n = c.node("node1").await;
        (seq(&n)? >= seq(&first)? + 3).then_some(n)
    })
    .await;
    assert!(
        later["last-answer"].as_i64() > first["last-answer"].as_i64(),
        "{later}"
    );
    assert!(
        later["diagnosed-at"].as_i64() > first["diagnosed-at"].as_i64(),
        "{later}"
    );
    assert_eq!(stored(), row, "an unchanged report rewrote the row");
    assert!(later["last-seq"].as_i64().unwrap() > row.1);
}

/// A watch may be held for the documented maximum (60 s), longer than the request timeout (set
/// to 2 s here so the test does not take a minute): it answers 304 at the end of its span, not a
/// closed connection. A watch open when the daemon gets SIGTERM answers at once, the daemon
/// stops promptly, and after its restart a watch with the old ETag is answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_outlive_the_request_timeout_and_end_at_once_on_sigterm() {
    let mut c = Cluster::new(1);
    c.extra_daemon_toml = "[daemon.limits]\nrequest-timeout = \"2s\"\n".into();
    c.start().await;
    let etag = get(&c, "/1/status", &[]).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_string();
    let (base, client) = (c.url(), c.client.clone());
    let watch = |wait: u64| {
        let url = format!("{base}/1/status?wait={wait}");
        let client = client.clone();
        let etag = etag.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = client
                .get(url)
                .header("if-none-match", etag)
                .timeout(Duration::from_secs(90))
                .send()
                .await;
            (r.map(|r| r.status().as_u16()), started.elapsed())
        })
    };
    // Held for its 5 s, past the 2 s request timeout, and answered 304.
    let (status, took) = watch(5).await.unwrap();
    assert_eq!(status.expect("the watch was answered"), 304);
    assert!(took >= Duration::from_secs(5), "{took:?}");

    // A 60 s watch, then SIGTERM: the watch is answered, and the daemon exits, well before
    // the watch's span would have ended.
    let held = watch(60);
    c.some_polls(5).await;
    assert!(!held.is_finished(), "nothing changed: the watch waits");
    let stopped = std::time::Instant::now();
    let code = c.daemon.as_mut().unwrap().terminate().await;
    assert_eq!(code.code(), Some(0), "{}", c.daemon_log());
    let (status, _) = held.await.unwrap();
    assert_eq!(status.expect("the watch was answered on SIGTERM"), 304);
    assert!(
        stopped.elapsed() < Duration::from_secs(30),
        "the daemon took {:?} to stop with a watch open",
        stopped.elapsed()
    );

    c.start_daemon();
    c.wait_api().await;
    let (status, _) = watch(1).await.unwrap();
    assert!(
        matches!(status, Ok(200 | 304)),
        "after the restart: {status:?}"
    );
}

/// `daemon.metrics-listen` serves `/metrics` and `/1/health` on an address of their own (the
/// same text and verdict the API gives) and nothing else; the API keeps serving both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_serves_metrics_and_health_and_nothing_else() {
    let mut c = Cluster::new(1);
    let port = free_port();
    c.extra_daemon_toml = format!("metrics-listen = \"127.0.0.1:{port}\"\n");
    c.start().await;
    let lane = |path: &str| {
        c.client
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
    };
    let scrape = lane("/metrics").await.unwrap();
    assert_eq!(scrape.status(), 200);
    let text = scrape.text().await.unwrap();
    assert!(text.contains("maintd_http_connections "), "{text}");
    assert!(text.contains("maintd_poll_"), "{text}");
    let health = lane("/1/health").await.unwrap();
    assert_eq!(health.status(), 200);
    let verdict: Value = health.json().await.unwrap();
    let (_, api_verdict) = c.get("/1/health").await;
    assert_eq!(verdict["ok"], api_verdict["ok"], "{verdict} {api_verdict}");
    for path in ["/1/status", "/1/nodes", "/"] {
        let r = lane(path).await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"].is_string(), "{path}: {e}");
    }
    let r = get(&c, "/metrics", &[]).await;
    assert_eq!(r.status(), 200);
}
