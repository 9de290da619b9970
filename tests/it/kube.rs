//! The Kubernetes backend against the in-process fake API server: the production client code,
//! only the URL differs. Drain through the Eviction API with a PDB that blocks then allows, the
//! drain deadline, offline taints, tags as labels, the out-of-service release after a fence, and
//! Events.

use crate::common;

use std::time::Duration;

use common::fake_kube;
use maintd::cluster::kube::{KubeCluster, KubeConfig, OUT_OF_SERVICE};
use maintd::cluster::{FenceRelease, TagsAndJobs};
use maintd_core::repair::{Job, JobKind, JobStatus};
use serde_json::json;
use uuid::Uuid;

fn cfg(deadline_ms: u64) -> KubeConfig {
    KubeConfig {
        drain_deadline: Duration::from_millis(deadline_ms),
        eviction_backoff: Duration::from_millis(100),
        ..KubeConfig::default()
    }
}

fn job(node: &str, kind: JobKind) -> Job {
    let event = Uuid::new_v4();
    Job {
        id: 1,
        event,
        node: node.into(),
        round: 1,
        kind,
        command: None,
        status: JobStatus::Running,
        reason: format!("maintd:{event}"),
        detail: None,
        created: 0,
        finished: None,
    }
}

/// n1 with two app pods (one under a PDB), a DaemonSet pod and a mirror pod; n2 with one pod.
async fn world(deadline_ms: u64, pdb_allowed: i64) -> (KubeCluster, fake_kube::Shared) {
    let (url, w) = fake_kube::start().await;
    {
        let mut w = w.lock().unwrap();
        w.add_node("n1", "10.0.0.1");
        w.add_node("n2", "10.0.0.2");
        w.add_pod("db", "db-0", "n1", json!({"app": "db"}), "StatefulSet");
        w.add_pod("web", "web-1", "n1", json!({"app": "web"}), "ReplicaSet");
        w.add_pod("kube-system", "agent-x", "n1", json!({}), "DaemonSet");
        w.add_mirror_pod("kube-system", "etcd-n1", "n1");
        w.add_pod("web", "web-2", "n2", json!({"app": "web"}), "ReplicaSet");
        w.add_pdb("db", "db-pdb", json!({"app": "db"}), pdb_allowed);
    }
    (KubeCluster::with_url(&url, cfg(deadline_ms)).unwrap(), w)
}

#[tokio::test]
async fn a_drain_waits_out_a_blocking_pdb_and_spares_daemonset_and_mirror_pods() {
    let (k, w) = world(30_000, 0).await;
    let k = std::sync::Arc::new(k);
    let drain = tokio::spawn({
        let k = k.clone();
        async move { k.run_job(&job("n1", JobKind::Evacuate), "{}").await }
    });
    // The PDB refuses (429); the job keeps retrying with backoff instead of failing.
    common::wait_for("a second refused eviction", || async {
        (w.lock().unwrap().evictions_refused >= 2).then_some(())
    })
    .await;
    assert!(!drain.is_finished());
    {
        let w = w.lock().unwrap();
        assert_eq!(
            w.nodes["n1"]["spec"]["unschedulable"], true,
            "cordoned first"
        );
        assert!(w.pods_on("n1").contains(&"db-0".to_string()));
        assert!(
            !w.pods_on("n1").contains(&"web-1".to_string()),
            "unprotected pods go at once"
        );
    }
    w.lock().unwrap().set_pdb_allowed("db-pdb", 1);
    let o = drain.await.unwrap();
    assert!(o.ok(), "{o:?}");
    let w = w.lock().unwrap();
    let mut left = w.pods_on("n1");
    left.sort();
    assert_eq!(left, vec!["agent-x", "etcd-n1"]);
    assert_eq!(w.pods_on("n2"), vec!["web-2"], "other nodes untouched");
    // Every eviction named the pod's UID; each pod counts once however often it was tried.
    assert!(
        w.delete_requests.iter().all(|(_, uid)| uid.is_some()),
        "{:?}",
        w.delete_requests
    );
    assert!(o.detail().ends_with("(2 pods)"), "{o:?}");
    let ev = w.events.last().unwrap();
    assert_eq!(ev["involvedObject"]["kind"], "Node");
    assert_eq!(ev["involvedObject"]["name"], "n1");
    // The uid is what `kubectl describe node` matches Events by; the namespace is default.
    assert_eq!(ev["involvedObject"]["uid"], "uid-n1", "{ev}");
    assert_eq!(ev["metadata"]["namespace"], "default", "{ev}");
    assert!(
        ev["message"].as_str().unwrap().starts_with("maintd:"),
        "{ev}"
    );
}

#[tokio::test]
async fn a_drain_deadline_fails_the_job_naming_the_blocking_pods() {
    let (k, w) = world(1_000, 0).await;
    let o = k.run_job(&job("n1", JobKind::Evacuate), "{}").await;
    assert!(!o.ok());
    assert!(
        o.detail().contains("deadline") && o.detail().contains("db/db-0"),
        "{o:?}"
    );
    assert_eq!(w.lock().unwrap().events.last().unwrap()["type"], "Warning");
}

#[tokio::test]
async fn failover_deletes_pods_without_waiting_for_pdbs() {
    let (k, w) = world(30_000, 0).await;
    let o = k.run_job(&job("n1", JobKind::EvacuateFailover), "{}").await;
    assert!(o.ok(), "{o:?}");
    assert_eq!(w.lock().unwrap().evictions_refused, 0);
    assert!(
        !w.lock()
            .unwrap()
            .pods_on("n1")
            .contains(&"db-0".to_string())
    );
}

#[tokio::test]
async fn offline_and_online_cordon_and_taint_and_survive_a_stale_resource_version() {
    let (k, w) = world(30_000, 0).await;
    w.lock().unwrap().nodes.get_mut("n1").unwrap()["spec"]["taints"] =
        json!([{"key": "other", "effect": "NoSchedule"}]);
    assert!(k.run_job(&job("n1", JobKind::Offline), "{}").await.ok());
    assert_eq!(
        k.offline_nodes()
            .await
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        vec!["n1"]
    );
    {
        let w = w.lock().unwrap();
        assert_eq!(
            w.taints("n1"),
            vec!["other=:NoSchedule", "maintd.io/offline=:NoSchedule"]
        );
        assert_eq!(w.nodes["n1"]["spec"]["unschedulable"], true);
    }
    assert!(k.run_job(&job("n1", JobKind::Online), "{}").await.ok());
    let w2 = w.lock().unwrap();
    assert_eq!(
        w2.taints("n1"),
        vec!["other=:NoSchedule"],
        "other taints are kept"
    );
    assert_eq!(w2.nodes["n1"]["spec"]["unschedulable"], false);
}

#[tokio::test]
async fn tags_are_node_labels_that_one_kubectl_label_command_removes() {
    let (k, w) = world(30_000, 0).await;
    let id = Uuid::new_v4();
    let tag = format!("maintd:repairready:{id}");
    k.add_tag("n1", &tag).await.unwrap();
    assert_eq!(
        w.lock().unwrap().nodes["n1"]["metadata"]["labels"][format!("repairready.maintd.io/{id}")],
        "true"
    );
    assert!(k.tags().await.unwrap()["n1"].contains(&tag));
    // `kubectl label node n1 repairready.maintd.io/<id>-` is this merge patch.
    assert!(k.remove_tag("n1", &tag).await.unwrap());
    assert!(!k.remove_tag("n1", &tag).await.unwrap());
    assert!(k.tags().await.unwrap()["n1"].is_empty());
}

#[tokio::test]
async fn release_taints_out_of_service_and_force_deletes_pods_and_reclaim_clears_it() {
    let (k, w) = world(30_000, 0).await;
    let flow = Uuid::new_v4();
    // Another controller changes the node between our read and our write (twice): the
    // versioned taint patch gets 409, re-reads and lands.
    w.lock().unwrap().races = 2;
    let o = k.release("n1", &flow, 0).await;
    assert!(o.ok(), "{o:?}");
    {
        let w = w.lock().unwrap();
        assert_eq!(
            w.taints("n1"),
            vec![format!("{OUT_OF_SERVICE}=nodeshutdown:NoExecute")]
        );
        assert_eq!(
            w.conflicts, 2,
            "stale resourceVersions were refused with 409"
        );
        let forced: Vec<_> = w
            .deleted
            .iter()
            .filter(|(_, g)| *g == Some(0))
            .map(|(p, _)| p.as_str())
            .collect();
        assert_eq!(
            forced,
            vec!["db/db-0", "web/web-1"],
            "grace 0, DaemonSet and mirror pods kept"
        );
        assert!(
            !w.delete_requests.is_empty()
                && w.delete_requests.iter().all(|(p, uid)| uid
                    .as_deref()
                    .is_some_and(|u| u.contains(p.replace('/', "-").as_str()))),
            "every delete names the pod's UID: {:?}",
            w.delete_requests
        );
        assert_eq!(w.events.last().unwrap()["reason"], "MaintdFenceRelease");
    }
    assert!(k.reclaim("n1", &flow).await.ok());
    assert!(w.lock().unwrap().taints("n1").is_empty());
}

#[tokio::test]
async fn nodes_come_from_the_selector_with_internal_ip_or_an_annotation() {
    let (url, w) = fake_kube::start().await;
    {
        let mut w = w.lock().unwrap();
        w.add_node("a", "10.0.0.1");
        w.add_node("b", "10.0.0.2");
        w.add_node("c", "10.0.0.3");
        w.add_node("d", "10.0.0.4");
        for n in ["a", "b", "d"] {
            w.nodes.get_mut(n).unwrap()["metadata"]["labels"]["maintd.io/managed"] = json!("yes");
        }
        w.nodes.get_mut("b").unwrap()["metadata"]["annotations"] =
            json!({"maintd.io/collector": "127.0.0.1:9999"});
        // A malformed annotation leaves the node out rather than polled at a bad address.
        w.nodes.get_mut("d").unwrap()["metadata"]["annotations"] =
            json!({"maintd.io/collector": "http://10.0.0.4/x"});
    }
    let k = KubeCluster::with_url(
        &url,
        KubeConfig {
            label_selector: "maintd.io/managed=yes".into(),
            ..KubeConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        k.nodes().await.unwrap(),
        vec![
            ("a".to_string(), "10.0.0.1:1815".to_string()),
            ("b".to_string(), "127.0.0.1:9999".to_string())
        ]
    );
}

/// A maintd cluster of `n` nodes on the fake API: each node has one `web` pod and its collector
/// on loopback (annotated), and the daemon config points at the fake. `toml` goes after
/// `[kubernetes]`.
async fn kube_cluster(n: usize, toml: &str) -> (common::Cluster, String, fake_kube::Shared) {
    let (url, w) = fake_kube::start().await;
    let mut c = common::Cluster::new(n);
    {
        let mut w = w.lock().unwrap();
        for (i, n) in c.nodes.iter().enumerate() {
            w.add_node(n, "10.9.9.9");
            w.nodes.get_mut(n).unwrap()["metadata"]["annotations"] =
                json!({"maintd.io/collector": format!("127.0.0.1:{}", c.ports[i])});
            w.add_pod(
                "web",
                &format!("web-{n}"),
                n,
                json!({"app": "web"}),
                "ReplicaSet",
            );
        }
    }
    c.inventory_nodes = false;
    c.extra_daemon_toml = format!(
        "[kubernetes]\napi-url = \"{url}\"\nnodefences = false\nfence-configmaps = false\ndrain-deadline = \"20s\"\nnode-interval = \"300ms\"\n{toml}"
    );
    (c, url, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_drives_a_kubernetes_evacuation_and_a_label_removal_acknowledges_it() {
    let (mut c, _url, w) = kube_cluster(2, "").await;
    c.set_verdict("node1", r#"{"status":"evacuate","details":{"disk":"sda"}}"#);
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;

    let e = c.wait_status("node1", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    let label = format!("repairready.maintd.io/{id}");
    {
        let w = w.lock().unwrap();
        assert!(
            w.pods_on("node1").is_empty(),
            "drained through the Eviction API"
        );
        assert_eq!(w.pods_on("node2"), vec!["web-node2"]);
        assert_eq!(w.nodes["node1"]["spec"]["unschedulable"], true);
        assert_eq!(w.taints("node1"), vec!["maintd.io/offline=:NoSchedule"]);
        assert_eq!(w.nodes["node1"]["metadata"]["labels"][&label], "true");
        let reasons: Vec<&str> = w
            .events
            .iter()
            .filter_map(|e| e["reason"].as_str())
            .collect();
        for r in [
            "MaintdEventNoted",
            "Maintdevacuate",
            "Maintdoffline",
            "MaintdRepairReady",
        ] {
            assert!(reasons.contains(&r), "{reasons:?}");
        }
    }
    assert_eq!(c.node("node1").await["offline"], true);

    // `kubectl label node node1 repairready.maintd.io/<id>-`, then the node is healthy again.
    w.lock().unwrap().nodes.get_mut("node1").unwrap()["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove(&label);
    c.set_verdict("node1", r#"{"status":"Ok"}"#);
    common::wait_for("the event to be forgotten", || async {
        c.status().await.is_empty().then_some(())
    })
    .await;
    let w = w.lock().unwrap();
    assert_eq!(
        w.nodes["node1"]["spec"]["unschedulable"], false,
        "uncordoned"
    );
    assert!(w.taints("node1").is_empty(), "offline taint removed");
}

fn note_of(e: &serde_json::Value) -> String {
    e["note"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_whose_pods_do_not_fit_elsewhere_waits_and_says_why() {
    let (mut c, _url, w) = kube_cluster(3, "").await;
    {
        let mut w = w.lock().unwrap();
        for n in ["node1", "node2", "node3"] {
            w.set_allocatable(n, "1", "4Gi");
            w.set_requests("web", &format!("web-{n}"), "300m", "256Mi");
        }
        // 800m fits on no other node (700m free on each).
        w.set_allocatable("node1", "2", "4Gi");
        w.add_pod("web", "big", "node1", json!({"app": "big"}), "ReplicaSet");
        w.set_requests("web", "big", "800m", "1Gi");
    }
    c.set_verdict("node1", r#"{"status":"evacuate","details":{"disk":"sda"}}"#);
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    let e = c
        .wait_event("node1", "a capacity wait", |e| {
            note_of(e).contains("fits on no other schedulable node")
        })
        .await;
    assert_eq!(e["repair-status"], "noted", "{e}");
    assert!(
        note_of(&e).starts_with("waiting to drain: pod web/big (800m CPU"),
        "{e}"
    );
    {
        let w = w.lock().unwrap();
        assert!(
            w.nodes["node1"]["spec"]["unschedulable"].is_null(),
            "not cordoned while waiting"
        );
        assert_eq!(w.pods_on("node1").len(), 2);
    }
    // Room appears (a node grows): the drain goes ahead.
    w.lock().unwrap().set_allocatable("node3", "4", "16Gi");
    c.wait_status("node1", "completed").await;
    assert!(w.lock().unwrap().pods_on("node1").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_rules_raise_events_and_escalate_while_the_condition_holds() {
    let rule = "[[kubernetes.conditions]]\ntype = \"DiskPressure\"\nstatus = \"True\"\nfor = \"1s\"\nactions = [\"evacuate\", \"evacuate-failover\"]\nescalate-after = \"4s\"\n";
    let (mut c, _url, w) = kube_cluster(2, rule).await;
    {
        let mut w = w.lock().unwrap();
        w.add_pod("web", "db-0", "node1", json!({"app": "db"}), "StatefulSet");
        w.add_pdb("web", "db", json!({"app": "db"}), 0);
    }
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    w.lock()
        .unwrap()
        .set_condition("node1", "DiskPressure", "True", 0);
    // Step 0: an evacuation, which the PDB holds back before anything is cordoned.
    let first = c
        .wait_event("node1", "the evacuate step", |e| {
            e["action"] == "evacuate" && note_of(e).contains("PodDisruptionBudget web/db")
        })
        .await;
    assert_eq!(
        first["original"]["details"]["source"], "node-condition",
        "{first}"
    );
    assert_eq!(first["original"]["details"]["condition"], "DiskPressure");
    assert_eq!(first["repair-status"], "noted");
    // Still DiskPressure after escalate-after: the failover step runs, whatever the PDB says.
    let second = c.wait_status("node1", "completed").await;
    assert_eq!(second["action"], "evacuate-failover", "{second}");
    assert_eq!(second["original"]["details"]["step"], 1);
    let st = c.status().await;
    assert!(
        !st.iter().any(|e| e["id"] == first["id"]),
        "the unstarted step is gone: {st:?}"
    );
    let w = w.lock().unwrap();
    assert!(w.pods_on("node1").is_empty());
    assert!(w.deleted.iter().any(|(p, _)| p == "web/db-0"));
    assert_eq!(
        w.evictions_refused, 0,
        "admission kept the evacuation from trying"
    );
    assert_eq!(w.taints("node1"), vec!["maintd.io/offline=:NoSchedule"]);
    let label = format!("repairready.maintd.io/{}", second["id"].as_str().unwrap());
    assert_eq!(w.nodes["node1"]["metadata"]["labels"][&label], "true");
}

async fn leader_of(client: &reqwest::Client, port: u16) -> Option<serde_json::Value> {
    let r = client
        .get(format!("http://127.0.0.1:{port}/1/leader"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_mid_round_and_resumes_without_duplicating_the_job() {
    let election = "[kubernetes.leader-election]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\nretry-period = \"300ms\"\n";
    let (mut c, _url, w) = kube_cluster(2, election).await;
    let runs = c.path("runs.log");
    common::write_exec(
        &c.path("repair.d/slowfix"),
        &format!("echo run >> {}; sleep 4; echo fixed", runs.display()),
    );
    c.start_collectors();
    // Two replicas: A (the harness's daemon) and B, with their own state dirs and API ports.
    let cfg_a = c.daemon_config();
    let text = std::fs::read_to_string(&cfg_a).unwrap();
    let port_b = common::free_port();
    let root = c.dir.path().display().to_string();
    std::fs::create_dir_all(c.path("state-b")).unwrap();
    let mk = |id: &str, port: u16, state: &str| {
        text.replace(
            &format!("listen = \"127.0.0.1:{}\"", c.api_port),
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replace(
            &format!("state-dir = \"{root}/state\""),
            &format!("state-dir = \"{root}/{state}\""),
        )
        .replace(
            "[kubernetes.leader-election]\n",
            &format!("[kubernetes.leader-election]\nidentity = \"{id}\"\n"),
        )
    };
    std::fs::write(&cfg_a, mk("a", c.api_port, "state")).unwrap();
    let cfg_b = c.path("daemon-b.toml");
    std::fs::write(&cfg_b, mk("b", port_b, "state-b")).unwrap();
    let args = |cfg: &std::path::Path| {
        vec![
            "--config".to_string(),
            cfg.display().to_string(),
            "daemon".into(),
            "--cluster".into(),
            "kubernetes".into(),
        ]
    };
    let a_args = args(&cfg_a);
    c.daemon = Some(c.spawn(
        "daemon",
        &a_args.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    c.wait_api().await;
    common::wait_for("A to lead", || async {
        leader_of(&c.client, c.api_port)
            .await
            .filter(|l| l["leader"] == true)
    })
    .await;
    let b_args = args(&cfg_b);
    let _b = c.spawn(
        "daemon-b",
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let lb = common::wait_for("B to follow A", || async {
        leader_of(&c.client, port_b)
            .await
            .filter(|l| l["holder"] == "a")
    })
    .await;
    assert_eq!(lb["leader"], false);

    // While A is frozen (within its lease), B sees a report needing a repair, decides to act
    // on it, and drops the action: it is not the leader.
    let dropped = || async {
        let m = c
            .client
            .get(format!("http://127.0.0.1:{port_b}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        m.lines()
            .find(|l| l.starts_with("maintd_standby_dropped_actions_total"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
    };
    let pid_a = nix::unistd::Pid::from_raw(c.daemon.as_ref().unwrap().child.id() as i32);
    nix::sys::signal::kill(pid_a, nix::sys::signal::Signal::SIGSTOP).unwrap();
    c.set_verdict(
        "node1",
        r#"{"status":"live-repair","command":"slowfix","details":{"fan":2}}"#,
    );
    common::wait_for("the standby to drop an action", || async {
        dropped().await.filter(|d| *d >= 1.0)
    })
    .await;
    nix::sys::signal::kill(pid_a, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .is_empty(),
        "the standby started nothing"
    );

    // A, still the leader, starts the slow live repair.
    let e = c
        .wait_event("node1", "the repair to run", |e| {
            e["repair-status"] == "pending"
        })
        .await;
    common::wait_for("the repair to start on the collector", || async {
        std::fs::read_to_string(&runs)
            .ok()
            .filter(|s| !s.is_empty())
    })
    .await;
    // A standby refuses operator changes and names the leader.
    let out = c.cli(&[
        "cancel",
        e["id"].as_str().unwrap(),
        "--url",
        &format!("http://127.0.0.1:{port_b}"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("standby") && err.contains("(a)"), "{err}");
    // The same refusal, as the API spec documents it.
    let key = maintd::report::Key::load(&c.path("cluster.key")).unwrap();
    let r = maintd::http::send_signed(
        &c.client,
        &key,
        maintd::report::DAEMON_TARGET,
        reqwest::Method::DELETE,
        &format!("http://127.0.0.1:{port_b}"),
        "/1/nodes/node1/tags/maintd:repairready:x",
        None,
    )
    .await
    .unwrap();
    let (code, ct) = (
        r.status().as_u16(),
        r.headers()["content-type"].to_str().unwrap().to_string(),
    );
    assert_eq!(code, 503);
    common::spec::Spec::load().check(
        "DELETE",
        "/1/nodes/{node}/tags/{tag}",
        code,
        &ct,
        &r.bytes().await.unwrap(),
    );

    // An operator pauses fencing on the leader: the pause outlives it.
    let url_a = c.url();
    let out = c.cli(&[
        "fencing",
        "pause",
        "--reason",
        "rack 7 maintenance",
        "--url",
        &url_a,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The leader dies mid-round.
    let killed = std::time::Instant::now();
    c.kill_daemon();
    common::wait_for("B to take over", || async {
        leader_of(&c.client, port_b)
            .await
            .filter(|l| l["leader"] == true)
    })
    .await;
    eprintln!("takeover after {:?} (lease duration 4s)", killed.elapsed());
    // B finishes the same job: same id, one run on the collector, one label.
    let done = common::wait_for("B to complete the event", || async {
        let r = c
            .client
            .get(format!("http://127.0.0.1:{port_b}/1/status"))
            .send()
            .await
            .ok()?;
        let st: Vec<serde_json::Value> = r.json().await.ok()?;
        st.into_iter().find(|x| {
            x["node"] == "node1" && x["repair-status"] == "completed" && x["tagged"] == true
        })
    })
    .await;
    assert_eq!(done["id"], e["id"]);
    let url_b = format!("http://127.0.0.1:{port_b}");
    let out = c.cli(&["fencing", "status", "--url", &url_b]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("PAUSED") && said.contains("rack 7 maintenance"),
        "the pause survives the failover: {said}"
    );
    let jobs = done["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{done}");
    assert_eq!(jobs[0]["id"], e["jobs"][0]["id"]);
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "the repair ran once"
    );
    // acquireTime is set when B took the lease and kept across its renewals.
    let spec = |w: &fake_kube::Shared| {
        w.lock()
            .unwrap()
            .object("leases", "default", "maintd")
            .unwrap()["spec"]
            .clone()
    };
    let before = spec(&w);
    common::wait_for("a renewal", || async {
        (spec(&w)["renewTime"] != before["renewTime"]).then_some(())
    })
    .await;
    assert_eq!(spec(&w)["acquireTime"], before["acquireTime"]);
    assert_ne!(spec(&w)["acquireTime"], spec(&w)["renewTime"]);
    let w = w.lock().unwrap();
    let label = format!("repairready.maintd.io/{}", done["id"].as_str().unwrap());
    assert_eq!(w.nodes["node1"]["metadata"]["labels"][&label], "true");
    let lease = w.object("leases", "default", "maintd").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    assert!(lease["spec"]["leaseTransitions"].as_i64().unwrap() >= 1);
    // The checkpoint's writer follows the lease: A while it led, then only B, never interleaved.
    let mut holder = String::new();
    let mut seen = Vec::new();
    for (r, _, who) in &w.writes {
        if r == "leases" && !who.is_empty() {
            holder = who.clone();
        }
        if r == "configmaps" {
            assert_eq!(
                who, &holder,
                "checkpoint written by a replica not holding the lease"
            );
            if seen.last() != Some(who) {
                seen.push(who.clone());
            }
        }
    }
    assert_eq!(seen, vec!["a", "b"], "{:?}", w.writes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_unknown_rule_fences_and_out_of_service_comes_only_after_the_verified_off() {
    if !common::sims::available() {
        return;
    }
    let rule = "[[kubernetes.conditions]]\ntype = \"Ready\"\nstatus = \"Unknown\"\nfor = \"1s\"\nactions = [\"fence\"]\n";
    let (mut c, _url, w) = kube_cluster(3, rule).await;
    let ipmi = common::sims::Ipmi::start(c.dir.path(), "node1");
    let pw = c.secret("bmc.pw", "s3cret");
    let methods = format!(
        "methods = [{{ template = \"ipmi\", params = {{ {} }} }}]",
        ipmi.params()
    );
    c.extra_daemon_toml.push_str(&format!(
        r#"
[fencing]
grace = "1s"
liveness-interval = "200ms"
liveness-timeout = "500ms"
cooldown = "60s"
storm-percent = 50
max-restarts = 0
[fencing.templates.ipmi]
agent = "fence_ipmilan"
secrets = {{ password = "{}" }}
[fencing.nodes.node1.power-management]
retries = 0
timeout = "20s"
{methods}
[fencing.nodes.node1.recovery]
retries = 1
timeout = "20s"
{methods}
"#,
        pw.display()
    ));
    c.start_collectors();
    // node1 lives as its BMC says: the off takes its collector down, the on boots it anew.
    c.stop_collector_keeping_boot(0);
    let _node1 = common::sims::PoweredNode::start(&mut c, 0, &ipmi);
    c.start_kube_daemon();
    c.wait_api().await;
    assert!(ipmi.powered_on());
    // The kubelet stops posting status: Ready goes Unknown. The collector still answers, so the
    // node-condition rule alone starts the fence.
    w.lock()
        .unwrap()
        .set_condition("node1", "Ready", "Unknown", 0);
    let f = c
        .wait_flow("the release", |f| {
            f["node"] == "node1" && f["released"] == true
        })
        .await;
    assert!(!ipmi.powered_on(), "the BMC reads off");
    // The flow names the rule that fired, not a silent collector (it kept answering).
    let first = f["history"][0]["note"].as_str().unwrap();
    assert!(
        first.contains("rule Ready=Unknown for") && first.contains("collector still answers"),
        "{first}"
    );
    assert_eq!(f["witnesses"]["collector"], false, "{f:#}");
    let fenced_at = f["fenced-at"].as_i64().unwrap();
    {
        let w = w.lock().unwrap();
        let oos = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute";
        let first = w
            .taint_log
            .iter()
            .find(|(_, n, t)| n == "node1" && t.iter().any(|x| x == oos))
            .expect("the out-of-service taint was applied");
        assert!(
            first.0 > fenced_at,
            "out-of-service applied {} ns before the verified power-off",
            fenced_at - first.0
        );
        assert!(w.pods_on("node1").is_empty());
        assert!(
            w.deleted
                .iter()
                .any(|(p, g)| p == "web/web-node1" && *g == Some(0)),
            "{:?}",
            w.deleted
        );
        assert!(
            !w.taint_log
                .iter()
                .any(|(_, n, t)| n != "node1" && !t.is_empty()),
            "no other node was touched"
        );
    }
    // Powered back on after the release, it boots; repaired, the kubelet reports Ready again:
    // it returns to service on its new boot, and the taint goes.
    w.lock().unwrap().set_condition("node1", "Ready", "True", 0);
    let f = c
        .wait_flow("recovery", |f| {
            f["node"] == "node1" && f["status"] == "final"
        })
        .await;
    assert_eq!(f["reclaimed"], true, "{f}");
    assert!(ipmi.powered_on(), "the node was powered back on");
    assert!(
        f["returned-boot"].is_string() && f["boot-before"] != f["returned-boot"],
        "{f}"
    );
    let w = w.lock().unwrap();
    assert!(w.taints("node1").is_empty(), "{:?}", w.taint_log);
    let reasons: Vec<&str> = w
        .events
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for r in ["MaintdFence", "MaintdFenceRelease", "MaintdFenceRecovered"] {
        assert!(reasons.contains(&r), "{reasons:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_later_is_polled_and_repaired_without_a_restart() {
    let (mut c, _url, w) = kube_cluster(2, "").await;
    let node2 = w.lock().unwrap().nodes.remove("node2").unwrap();
    c.set_verdict(
        "node2",
        r#"{"status":"live-repair","command":"fix","details":{"fan":1}}"#,
    );
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    common::wait_for("node1 to be polled", || async {
        (c.node("node1").await["reachable"] == true).then_some(())
    })
    .await;
    assert!(c.status().await.is_empty(), "node2 is not managed yet");
    // The node joins the cluster: discovered, polled, and its live repair runs on its collector.
    w.lock().unwrap().nodes.insert("node2".into(), node2);
    let e = c.wait_status("node2", "completed").await;
    assert_eq!(e["jobs"][0]["status"], "succeeded", "{e}");
    assert!(c.path("repair-input-node2.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_engine_fails_its_health_check_naming_the_cause() {
    let (mut c, _url, w) = kube_cluster(1, "[kubernetes.leader-election]\nenabled = false\n").await;
    c.extra_daemon_toml = c
        .extra_daemon_toml
        .replace("[kubernetes]", "stall-after = \"1s\"\n[kubernetes]");
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    common::wait_for("a healthy engine", || async {
        let (code, v) = c.get("/1/health").await;
        (code == 200 && v["status"] == "ok").then_some(())
    })
    .await;
    // The apiserver goes away: no decision can be made, and the health check says why.
    w.lock().unwrap().down = true;
    let v = common::wait_for("the health check to fail", || async {
        let (code, v) = c.get("/1/health").await;
        (code == 503).then_some(v)
    })
    .await;
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.contains("no decision for") && msg.contains("cannot read tags"),
        "{msg}"
    );
    assert!(
        c.metrics()
            .await
            .contains("maintd_engine_skipped_decisions_total{reason=\"tags\"}")
    );
    // Back: healthy again.
    w.lock().unwrap().down = false;
    common::wait_for("the engine to recover", || async {
        (c.get("/1/health").await.0 == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_drain_never_evicts_a_terminating_pod_again_and_counts_each_pod_once() {
    let (k, w) = world(30_000, 1).await;
    w.lock().unwrap().graceful = true;
    let k = std::sync::Arc::new(k);
    let drain = tokio::spawn({
        let k = k.clone();
        async move { k.run_job(&job("n1", JobKind::Evacuate), "{}").await }
    });
    // Both pods are terminating; the drain waits for them for several of its rounds.
    common::wait_for("both pods terminating", || async {
        let w = w.lock().unwrap();
        let terminating = w
            .pods
            .values()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
            .count();
        (terminating == 2).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!drain.is_finished());
    w.lock().unwrap().finish_terminating();
    let o = drain.await.unwrap();
    assert!(o.ok(), "{o:?}");
    assert!(o.detail().contains("(2 pods)"), "{o:?}");
    let w = w.lock().unwrap();
    for pod in ["db/db-0", "web/web-1"] {
        let n = w.delete_requests.iter().filter(|(p, _)| p == pod).count();
        assert_eq!(n, 1, "{pod} evicted {n} times: {:?}", w.delete_requests);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_its_lease_starts_nothing_and_exits_12() {
    let election = "[kubernetes.leader-election]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\nretry-period = \"300ms\"\n";
    let (mut c, _url, w) = kube_cluster(1, election).await;
    start_leader(&mut c).await;
    // The apiserver goes away; meanwhile the node asks for a live repair.
    w.lock().unwrap().down = true;
    c.set_verdict("node1", r#"{"status":"live-repair","command":"fix"}"#);
    let d = c.daemon.as_mut().unwrap();
    let deadline = std::time::Instant::now() + common::WAIT;
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the leader did not exit"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(12), "{}", c.daemon_log());
    assert!(
        !c.path("repair-input-node1.json").exists(),
        "a leader without a fresh Lease started a repair"
    );
    assert!(
        c.daemon_log().contains("could not renew the lease"),
        "{}",
        c.daemon_log()
    );
}

/// Reads come from watches: once synced, an idle leader's only requests are its Lease renewals
/// (one PUT per retry period), and a standby, which follows the Lease and the checkpoint through
/// its watches, sends nothing at all. The real apiserver's figures are in BENCHMARKS.md (k8s_requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leader_sends_only_its_lease_renewals_and_a_standby_nothing() {
    let election = "[kubernetes.leader-election]\nlease-duration = \"4s\"\nrenew-deadline = \"3s\"\nretry-period = \"300ms\"\nidentity = \"a\"\n";
    let (mut c, _url, w) = kube_cluster(2, election).await;
    start_leader(&mut c).await;
    // The standby: a second daemon on the same fake, its own API port and state.
    let mut b = common::Cluster::new(0);
    b.inventory_nodes = false;
    b.extra_daemon_toml = c
        .extra_daemon_toml
        .replace("identity = \"a\"", "identity = \"b\"");
    b.start_kube_daemon();
    b.wait_api().await;
    common::wait_for("the standby to follow", || async {
        (b.get("/1/leader").await.1["holder"] == "a").then_some(())
    })
    .await;
    for n in c.nodes.clone() {
        common::wait_for("the nodes polled", || async {
            (c.node(&n).await["reachable"] == true).then_some(())
        })
        .await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = w.lock().unwrap().requests.len();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let seen: Vec<(String, String)> = w.lock().unwrap().requests[before..].to_vec();
    let renewals = seen
        .iter()
        .filter(|(v, p)| v == "PUT" && p.ends_with("/leases/maintd"))
        .count();
    let other: Vec<_> = seen
        .iter()
        .filter(|(v, p)| !(v == "PUT" && p.ends_with("/leases/maintd")))
        .collect();
    assert!(
        other.is_empty(),
        "requests besides the Lease renewals: {other:?}"
    );
    // About one per 300 ms retry period from the leader alone (a standby never writes).
    assert!((5..=15).contains(&renewals), "{renewals} renewals in 3 s");
}

/// Starts the collectors and a daemon, and waits until it leads.
async fn start_leader(c: &mut common::Cluster) {
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    common::wait_for("leadership", || async {
        (c.get("/1/leader").await.1["leader"] == true).then_some(())
    })
    .await;
}
