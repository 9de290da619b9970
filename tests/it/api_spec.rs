//! Real responses of a running daemon and collector, checked against api-spec/openapi.yaml: the
//! status code must be documented for the operation, and the body must match its schema. Every
//! operation in the spec must be exercised.

use crate::common;

use common::spec::Spec;
use common::*;
use maintd::http::send_signed;
use maintd::report::Key;
use serde_json::{Value, json};

struct Api {
    spec: Spec,
    client: reqwest::Client,
    key: Key,
    /// Signed requests to the collector at this base URL are for node1; all others go to the
    /// daemon.
    collector: String,
}

impl Api {
    /// Sends a request (signed or not) and checks the response against the spec.
    async fn call(
        &mut self,
        signed: bool,
        base: &str,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        let resp = if signed {
            let target = if base == self.collector {
                "node1"
            } else {
                maintd::report::DAEMON_TARGET
            };
            send_signed(&self.client, &self.key, target, m, base, path, body)
                .await
                .unwrap()
        } else {
            let mut r = self.client.request(m, format!("{base}{path}"));
            if let Some(b) = body {
                r = r.header("content-type", "application/json").body(b);
            }
            r.send().await.unwrap()
        };
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let bytes = resp.bytes().await.unwrap();
        self.spec.check(method, template, status, &ct, &bytes);
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_responses_match_the_openapi_spec() {
    let mut c = Cluster::new(3);
    c.extra_daemon_toml = "[actions]\nevacuate-failover = false\n".into();
    c.set_verdict("node1", r#"{"status":"evacuate","details":{"disk":"sda"}}"#);
    c.set_verdict(
        "node2",
        r#"{"status":"live-repair","command":"fix","details":null}"#,
    );
    c.set_verdict("node3", r#"{"status":"evacuate-failover","details":"ue"}"#);
    c.start().await;
    let done = c.wait_status("node1", "completed").await;
    let ready = c.wait_status("node2", "completed").await;
    let noted = c
        .wait_event("node3", "a waiting note", |e| {
            e["note"].as_str().is_some_and(|n| n.contains("disabled"))
        })
        .await;
    let mut api = Api {
        spec: Spec::load(),
        client: c.client.clone(),
        key: Key::load(&c.path("cluster.key")).unwrap(),
        collector: format!("http://127.0.0.1:{}", c.ports[0]),
    };
    let base = c.url();
    let unknown = "8c7e1a64-3b4b-4c7b-9a43-1f0a2b3c4d5e";
    let id = |e: &Value| e["id"].as_str().unwrap().to_string();

    api.call(false, &base, "GET", "/", "/", None).await;
    api.call(false, &base, "GET", "/ui/", "/ui/", None).await;
    let (_, all) = api
        .call(false, &base, "GET", "/1/status", "/1/status", None)
        .await;
    assert_eq!(all.as_array().unwrap().len(), 3);
    api.call(
        false,
        &base,
        "GET",
        "/1/status/{id}",
        &format!("/1/status/{}", id(&done)),
        None,
    )
    .await;
    assert_eq!(
        api.call(
            false,
            &base,
            "GET",
            "/1/status/{id}",
            &format!("/1/status/{unknown}"),
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        api.call(
            false,
            &base,
            "GET",
            "/1/status/{id}",
            "/1/status/nope",
            None
        )
        .await
        .0,
        400
    );
    let (_, nodes) = api
        .call(false, &base, "GET", "/1/nodes", "/1/nodes", None)
        .await;
    assert_eq!(nodes[0]["offline"], true);

    let cancel = "/1/events/{id}/cancel";
    assert_eq!(
        api.call(
            false,
            &base,
            "POST",
            cancel,
            &format!("/1/events/{}/cancel", id(&noted)),
            None
        )
        .await
        .0,
        401
    );
    let (st, ev) = api
        .call(
            true,
            &base,
            "POST",
            cancel,
            &format!("/1/events/{}/cancel", id(&noted)),
            None,
        )
        .await;
    assert_eq!((st, ev["repair-status"].as_str()), (200, Some("canceled")));
    assert_eq!(
        api.call(
            true,
            &base,
            "POST",
            cancel,
            &format!("/1/events/{}/cancel", id(&done)),
            None
        )
        .await
        .0,
        409
    );
    assert_eq!(
        api.call(
            true,
            &base,
            "POST",
            cancel,
            &format!("/1/events/{unknown}/cancel"),
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        api.call(true, &base, "POST", cancel, "/1/events/x/cancel", None)
            .await
            .0,
        400
    );

    let (_, tags) = api
        .call(false, &base, "GET", "/1/tags", "/1/tags", None)
        .await;
    let ready_tag = format!("maintd:repairready:{}", id(&ready));
    assert_eq!(tags["node2"], json!([ready_tag]));
    assert_eq!(tags["node3"], json!([]));
    api.call(false, &base, "GET", "/1/tags", "/1/tags?node=node2", None)
        .await;
    assert_eq!(
        api.call(false, &base, "GET", "/1/tags", "/1/tags?node=ghost", None)
            .await
            .0,
        404
    );
    let del = "/1/nodes/{node}/tags/{tag}";
    let tag_path = format!("/1/nodes/node2/tags/{ready_tag}");
    assert_eq!(
        api.call(false, &base, "DELETE", del, &tag_path, None)
            .await
            .0,
        401
    );
    assert_eq!(
        api.call(true, &base, "DELETE", del, &tag_path, None)
            .await
            .0,
        200
    );
    assert_eq!(
        api.call(true, &base, "DELETE", del, &tag_path, None)
            .await
            .0,
        404
    );
    assert_eq!(
        api.call(true, &base, "DELETE", del, "/1/nodes/ghost/tags/x", None)
            .await
            .0,
        404
    );
    api.call(false, &base, "GET", "/metrics", "/metrics", None)
        .await;
    let (code, h) = api
        .call(false, &base, "GET", "/1/health", "/1/health", None)
        .await;
    assert_eq!((code, &h["status"]), (200, &json!("ok")), "{h}");
    let reset = "/1/nodes/{node}/reset-seq";
    let (code, r) = api
        .call(true, &base, "POST", reset, "/1/nodes/node1/reset-seq", None)
        .await;
    assert_eq!(code, 200, "{r}");
    assert!(r["previous-seq"].is_u64(), "{r}");
    assert_eq!(
        api.call(
            false,
            &base,
            "POST",
            reset,
            "/1/nodes/node1/reset-seq",
            None
        )
        .await
        .0,
        401
    );
    assert_eq!(
        api.call(true, &base, "POST", reset, "/1/nodes/ghost/reset-seq", None)
            .await
            .0,
        404
    );
    assert_eq!(
        api.call(
            false,
            &base,
            "GET",
            "/1/tags",
            "/1/tags?node=a&node=b",
            None
        )
        .await
        .0,
        400
    );
    let (_, l) = api
        .call(false, &base, "GET", "/1/leader", "/1/leader", None)
        .await;
    assert_eq!(l["leader"], true, "the only replica leads: {l}");
    assert_eq!(l["elected"], false);
    let (_, f) = api
        .call(false, &base, "GET", "/1/fences", "/1/fences", None)
        .await;
    assert_eq!(
        f,
        json!([]),
        "no fencing configured here; tests/it/fencing.rs checks real flows"
    );
    let r = "/1/fences/readiness";
    let (_, ready) = api.call(false, &base, "GET", r, r, None).await;
    assert_eq!(ready, json!({}), "no fence plans, no readiness checks");
    let r = "/1/fences/summary";
    let (_, summary) = api.call(false, &base, "GET", r, r, None).await;
    assert_eq!(
        summary,
        json!({"state": "active", "nodes": 0, "inactive": [], "paused": null}),
        "nothing configured, nothing inactive"
    );
    // The runtime pause: signed, kept, shown in the summary, and undone by a resume.
    let p = "/1/fencing/pause";
    assert_eq!(api.call(false, &base, "POST", p, p, None).await.0, 401);
    let (st, paused) = api
        .call(
            true,
            &base,
            "POST",
            p,
            "/1/fencing/pause?reason=rack%2012%20work",
            None,
        )
        .await;
    assert_eq!(
        (st, paused["paused"].as_bool()),
        (200, Some(true)),
        "{paused}"
    );
    assert_eq!(paused["pause"]["reason"], "rack 12 work");
    let (st, _) = api
        .call(
            true,
            &base,
            "POST",
            p,
            "/1/fencing/pause?reason=%07bell",
            None,
        )
        .await;
    assert_eq!(st, 400, "a control character in the reason");
    let (_, summary) = api.call(false, &base, "GET", r, r, None).await;
    assert_eq!(summary["paused"]["reason"], "rack 12 work");
    let rp = "/1/fencing/resume";
    let (st, resumed) = api.call(true, &base, "POST", rp, rp, None).await;
    assert_eq!((st, resumed["paused"].as_bool()), (200, Some(false)));
    for (t, path) in [
        ("/1/fences/{id}", format!("/1/fences/{unknown}")),
        (
            "/1/fences/{id}/timeline",
            format!("/1/fences/{unknown}/timeline"),
        ),
    ] {
        assert_eq!(api.call(false, &base, "GET", t, &path, None).await.0, 404);
    }
    let (_, drills) = api
        .call(false, &base, "GET", "/1/drills", "/1/drills", None)
        .await;
    assert_eq!(drills, json!([]));
    // The audit trail: the pauses and the resume above, newest first, signed by the cluster key
    // (no operator is configured here); the refused unsigned pause is not in it.
    let (st, audit) = api
        .call(false, &base, "GET", "/1/audit", "/1/audit?limit=3", None)
        .await;
    assert_eq!(st, 200);
    let seen: Vec<(&str, &str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["operator"].as_str().unwrap(),
                c["path"].as_str().unwrap(),
                c["status"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("cluster-key", "/1/fencing/resume", 200),
            ("cluster-key", "/1/fencing/pause?reason=%07bell", 400),
            (
                "cluster-key",
                "/1/fencing/pause?reason=rack%2012%20work",
                200
            ),
        ]
    );
    // Maintenance: start (twice: the reason changes, the start stays), list, stop; an unknown
    // node is 404, an end in the past 400.
    let mp = "/1/nodes/{node}/maintenance";
    for path in [
        "/1/nodes/node1/maintenance?reason=disk%20swap",
        "/1/nodes/node1/maintenance?reason=longer",
    ] {
        let (st, m) = api.call(true, &base, "POST", mp, path, None).await;
        assert_eq!(st, 200, "{m}");
        assert_eq!(
            (m["node"].as_str(), m["source"].as_str()),
            (Some("node1"), Some("operator"))
        );
    }
    let (_, all) = api
        .call(
            false,
            &base,
            "GET",
            "/1/maintenance",
            "/1/maintenance",
            None,
        )
        .await;
    assert_eq!(all[0]["reason"], "longer", "{all}");
    let past = format!(
        "/1/nodes/node1/maintenance?until={}",
        maintd::report::now_ns() - 1
    );
    assert_eq!(api.call(true, &base, "POST", mp, &past, None).await.0, 400);
    let nope = "/1/nodes/nope/maintenance";
    assert_eq!(api.call(true, &base, "POST", mp, nope, None).await.0, 404);
    let (st, stopped) = api
        .call(
            true,
            &base,
            "DELETE",
            mp,
            "/1/nodes/node1/maintenance",
            None,
        )
        .await;
    assert_eq!((st, &stopped["was-in-maintenance"]), (200, &json!(true)));
    // Acknowledging: an unknown flow is 404, a malformed id 400.
    let ap = "/1/fences/{id}/ack";
    let unknown_ack = format!("/1/fences/{}/ack?reason=checked", uuid::Uuid::from_u128(7));
    assert_eq!(
        api.call(true, &base, "POST", ap, &unknown_ack, None)
            .await
            .0,
        404
    );
    assert_eq!(
        api.call(true, &base, "POST", ap, "/1/fences/nope/ack", None)
            .await
            .0,
        400
    );
    let dp = "/1/nodes/{node}/drill";
    assert_eq!(
        api.call(true, &base, "POST", dp, "/1/nodes/node1/drill", None)
            .await
            .0,
        409,
        "no fencing configured here"
    );
    assert_eq!(
        api.call(true, &base, "POST", dp, "/1/nodes/nope/drill", None)
            .await
            .0,
        404
    );
    assert_eq!(
        api.call(false, &base, "GET", "/1/fences/{id}", "/1/fences/x", None)
            .await
            .0,
        400
    );

    // The collector's endpoints.
    let col = format!("http://127.0.0.1:{}", c.ports[0]);
    api.call(
        false,
        &col,
        "GET",
        "/1/report/diagnose",
        "/1/report/diagnose",
        None,
    )
    .await;
    let req = json!({"job": "spec-1", "event": "e", "command": "fix", "input": {"status": "Ok"}});
    assert_eq!(
        api.call(
            false,
            &col,
            "POST",
            "/1/repair",
            "/1/repair",
            Some(req.clone())
        )
        .await
        .0,
        401
    );
    assert_eq!(
        api.call(
            true,
            &col,
            "POST",
            "/1/repair",
            "/1/repair",
            Some(req.clone())
        )
        .await
        .0,
        202
    );
    assert_eq!(
        api.call(true, &col, "POST", "/1/repair", "/1/repair", Some(req))
            .await
            .0,
        200
    );
    let bad = json!({"job": "spec-2", "event": "e", "command": "../x", "input": null});
    assert_eq!(
        api.call(true, &col, "POST", "/1/repair", "/1/repair", Some(bad))
            .await
            .0,
        400
    );
    assert_eq!(
        api.call(
            true,
            &col,
            "POST",
            "/1/repair",
            "/1/repair",
            Some(json!({"job": 1}))
        )
        .await
        .0,
        400
    );
    let set = json!({"epoch": 1, "peers": {"node2": {"ip": "127.0.0.1", "port": 9}}});
    assert_eq!(
        api.call(true, &col, "PUT", "/1/peers", "/1/peers", Some(set.clone()))
            .await
            .0,
        200
    );
    assert_eq!(
        api.call(false, &col, "PUT", "/1/peers", "/1/peers", Some(set))
            .await
            .0,
        401
    );
    let bad = json!({"epoch": 2, "peers": {"node1": {"ip": "127.0.0.1", "port": 9}}});
    assert_eq!(
        api.call(true, &col, "PUT", "/1/peers", "/1/peers", Some(bad))
            .await
            .0,
        400
    );
    let (_, v) = api
        .call(false, &col, "GET", "/1/peers", "/1/peers", None)
        .await;
    assert!(v["view"].as_str().unwrap().contains("\"epoch\":1"), "{v}");
    let r = "/1/repair/{job}";
    assert_eq!(
        api.call(true, &col, "GET", r, "/1/repair/spec-1", None)
            .await
            .0,
        200
    );
    assert_eq!(
        api.call(true, &col, "GET", r, "/1/repair/none", None)
            .await
            .0,
        404
    );
    assert_eq!(
        api.call(false, &col, "GET", r, "/1/repair/spec-1", None)
            .await
            .0,
        401
    );

    let missing: Vec<_> = api
        .spec
        .operations()
        .difference(&api.spec.seen)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "operations never exercised: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_get_json_errors() {
    let mut c = Cluster::new(1);
    c.start().await;
    let r = c
        .client
        .get(format!("{}/2/status", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "not-found");
    let r = c
        .client
        .delete(format!("{}/1/status", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "method-not-allowed");
}

/// Schemathesis (every operation, every check, signed requests) against a live daemon and
/// collector; scripts/test installs it into target/schemathesis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_failure_against_the_daemon_and_the_collector() {
    let pytest = std::env::var("MAINTD_PYTEST")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| common::sims::repo("target/schemathesis/bin/pytest"));
    if !pytest.exists() {
        assert!(
            std::env::var("MAINTD_REQUIRE_SIMS").as_deref() != Ok("1"),
            "schemathesis missing: run scripts/test (it installs target/schemathesis)"
        );
        eprintln!("skipped: schemathesis missing (scripts/test installs it)");
        return;
    }
    let mut c = Cluster::new(2);
    c.set_verdict("node2", r#"{"status":"evacuate","details":{"disk":"sda"}}"#);
    c.start().await;
    c.wait_status("node2", "completed").await;
    let out = tokio::process::Command::new(&pytest)
        .args(["-q", "-p", "no:cacheprovider"])
        .arg(common::sims::repo("tests/schemathesis/test_api.py"))
        .env("MAINTD_SPEC", common::sims::repo("api-spec/openapi.yaml"))
        .env("MAINTD_DAEMON_URL", c.url())
        .env(
            "MAINTD_COLLECTOR_URL",
            format!("http://127.0.0.1:{}", c.ports[0]),
        )
        .env("MAINTD_COLLECTOR_NODE", "node1")
        .env("MAINTD_KEY_FILE", c.path("cluster.key"))
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis failed:\n{text}");
    assert!(text.contains(" passed"), "{text}");
    // The daemon and the collector are still healthy after it.
    assert_eq!(c.get("/1/health").await.0, 200);
}
