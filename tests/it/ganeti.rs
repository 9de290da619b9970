//! The Ganeti RAPI client against a real two-node Ganeti 3.0 cluster (Ganeti's virtual-cluster
//! mode in namespaces, `scripts/ganeti-cluster`): Ganeti's vote on the master, the node list,
//! real node tags set and removed by jobs carrying maintd's reason, jobs found again by that
//! reason, Ganeti's own error for a failed job, a node migrate followed through its child job,
//! and the pinned certificate and the password refusing what they should. Needs root and
//! Debian's ganeti (skipped with a notice without them; `scripts/test` requires them).

use crate::common;

use std::time::Duration;

use common::ganeti::Ganeti;
use maintd::cluster::ganeti::{Rapi, RapiError};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rapi_client_drives_a_real_ganeti_cluster() {
    let Some(g) = Ganeti::shared() else { return };
    let rapi = Rapi::new(&g.settings()).unwrap();

    // Who is master is Ganeti's to say.
    assert_eq!(rapi.master().await.unwrap(), "node1");
    let nodes = rapi.nodes().await.unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node1", "node2"]);
    assert_eq!(nodes[0].role, "M");
    assert!(nodes.iter().all(|n| !n.offline && !n.drained));

    // A real node tag, set by a job that carries maintd's reason, seen by Ganeti's own CLI.
    let tag = "maintd:repairready:8c7e1a64-3b4b-4c7b-9a43-1f0a2b3c4d5e";
    let reason = "gnt:daemon:maintd maintd:8c7e1a64 job:1";
    let id = rapi
        .submit(
            "PUT",
            &format!("/2/nodes/node2/tags?tag={tag}"),
            reason,
            None,
        )
        .await
        .unwrap();
    rapi.wait(id, LIMIT).await.unwrap();
    assert!(g.gnt(&["gnt-node", "list-tags", "node2"]).contains(tag));
    assert!(
        rapi.nodes().await.unwrap()[1]
            .tags
            .contains(&tag.to_string())
    );
    // After a restart the job is found by its reason, not submitted again.
    assert_eq!(rapi.find_job(reason).await.unwrap(), Some(id));
    assert_eq!(
        rapi.find_job("gnt:daemon:maintd other").await.unwrap(),
        None
    );
    // Removing it with Ganeti's CLI is what maintd sees.
    g.gnt(&["gnt-node", "remove-tags", "node2", tag]);
    assert!(rapi.nodes().await.unwrap()[1].tags.is_empty());

    // A job Ganeti refuses ends in Ganeti's own words.
    let id = rapi
        .submit(
            "PUT",
            "/2/instances/no-such-instance/migrate",
            reason,
            Some(&json!({})),
        )
        .await
        .unwrap();
    match rapi.wait(id, LIMIT).await {
        Err(RapiError::JobFailed { message, .. }) => {
            assert!(
                message.starts_with("OpPrereqError") && message.contains("no-such-instance"),
                "{message}"
            );
        }
        other => panic!("a failed job, not {other:?}"),
    }

    // A node migrate submits one child job per instance; the wait follows them to the end.
    g.running_instance("inst1", "node2");
    let id = rapi
        .submit(
            "POST",
            "/2/nodes/node2/migrate",
            reason,
            Some(&json!({"mode": "live", "iallocator": "hail"})),
        )
        .await
        .unwrap();
    let done = rapi.wait(id, LIMIT).await.unwrap();
    assert_eq!(done.children.len(), 1, "{done:?}");
    let list = g.instances();
    assert!(list.contains("inst1 node1 running"), "{list}");

    // The wrong password is refused; so is a server with another certificate.
    let mut s = g.settings();
    let wrong = g.path("wrong-password");
    std::fs::write(&wrong, "nope\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    s.password_file = wrong;
    match Rapi::new(&s).unwrap().master().await {
        Err(RapiError::Status { status: 401, .. }) => {}
        other => panic!("401, not {other:?}"),
    }
    let other = g.path("other.crt");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=ganeti.example.com", "-keyout"])
        .arg(g.path("other.key"))
        .arg("-out")
        .arg(&other)
        .output()
        .unwrap();
    assert!(made.status.success());
    let mut s = g.settings();
    s.certificate = other.clone();
    match Rapi::new(&s).unwrap().master().await {
        // The error names the file pinned, where the operator copies the new certificate.
        Err(RapiError::Transport { detail, .. }) => assert!(
            detail.contains(&format!("not the one pinned in {}", other.display())),
            "{detail}"
        ),
        other => panic!("a refused certificate, not {other:?}"),
    }
    // An exposed password file is never read.
    let mut s = g.settings();
    let exposed = g.path("exposed-password");
    std::fs::write(&exposed, "x\n").unwrap();
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    s.password_file = exposed;
    let e = Rapi::new(&s).unwrap_err().to_string();
    assert!(e.contains("mode 644"), "{e}");
}

/// The daemon on the Ganeti master with collectors on both nodes (port 1817: Ganeti's monitoring
/// daemon holds 1815): an evacuate verdict migrates the node's instance away with `hail`, offlines
/// the node and tags it with a real Ganeti tag, each job carrying maintd's reason; removing the
/// tag with `gnt-node remove-tags` acknowledges, and the node comes back online. A daemon on a
/// node that is not the master exits with 11.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ganeti_backend_evacuates_offlines_tags_and_brings_back_a_node() {
    let Some(g) = Ganeti::up() else { return };
    g.running_instance("inst1", "node2");

    let mut c = g.maintd("");
    // Ganeti's vote decides: on node2 the daemon refuses to act, with Ganeti's exit code.
    let own = c.extra_daemon_toml.clone();
    c.extra_daemon_toml = g.daemon_toml(&format!("https://127.0.0.1:{}", g.port), "node2", "");
    let cfg = c.daemon_config();
    let (code, err) = c.daemon_exit(&cfg, &["--cluster", "ganeti"]);
    assert_eq!(code, Some(11), "{err}");
    assert!(err.contains("not the Ganeti master (node1)"), "{err}");
    // The documented setup, one configuration everywhere with the RAPI at this host: node2 has
    // no RAPI to ask (refused), and its ssconf says who is master, so it still exits 11.
    let nothing = common::free_port();
    c.extra_daemon_toml = g.daemon_toml(&format!("https://127.0.0.1:{nothing}"), "node2", "");
    let cfg = c.daemon_config();
    let (code, err) = c.daemon_exit(&cfg, &["--cluster", "ganeti"]);
    assert_eq!(code, Some(11), "{err}");
    assert!(err.contains("not the Ganeti master (node1)"), "{err}");

    c.extra_daemon_toml = own;
    let port = c.api_port;
    let _fwd = g.start(&mut c, port, None).await;
    common::wait_for("both nodes polled", || async {
        let (_, nodes) = c.get("/1/nodes").await;
        (nodes
            .as_array()
            .map(|n| n.iter().filter(|n| n["reachable"] == true).count())
            == Some(2))
        .then_some(())
    })
    .await;

    c.set_verdict("node2", r#"{"status":"evacuate","details":{"disk":"sdb"}}"#);
    let e = c.wait_status("node2", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    let tag = format!("maintd:repairready:{id}");
    // `completed` is said only once the tag exists: read at once, before anything else.
    assert!(
        g.gnt(&["gnt-node", "list-tags", "node2"]).contains(&tag),
        "completed before its tag existed"
    );
    let list = g.instances();
    assert!(list.contains("inst1 node1 running"), "{list}");
    let nodes = g.offline();
    assert!(nodes.contains("node2 Y"), "{nodes}");
    // Every job carries maintd's reason with the event.
    let rapi = Rapi::new(&g.settings()).unwrap();
    let evacuate = e["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["kind"] == "evacuate")
        .unwrap();
    let reason = format!(
        "gnt:daemon:maintd maintd:{id} job:{} migrate",
        evacuate["id"]
    );
    assert!(rapi.find_job(&reason).await.unwrap().is_some(), "{reason}");
    assert!(
        evacuate["detail"].as_str().unwrap().contains("child jobs"),
        "{evacuate}"
    );

    // The operator acknowledges with Ganeti's own CLI; the node comes back.
    c.set_verdict("node2", r#"{"status":"Ok"}"#);
    g.gnt(&["gnt-node", "remove-tags", "node2", &tag]);
    // The event is cleared once its online job succeeded (a moment after, so it is never
    // caught in between: its answer says why it went).
    let why = common::wait_for("the event cleared with node2 back online", || async {
        let (status, v) = c.get(&format!("/1/status/{id}")).await;
        (status == 404).then(|| v["message"].as_str().unwrap_or_default().to_string())
    })
    .await;
    assert!(why.contains("acknowledged; node back online"), "{why}");
    let nodes = g.offline();
    assert!(nodes.contains("node2 N"), "{nodes}");

    // evacuate-failover: the instance, back on node2, is failed over (a job per instance).
    g.gnt(&["gnt-instance", "migrate", "-f", "-n", "node2", "inst1"]);
    c.set_verdict("node2", r#"{"status":"evacuate-failover"}"#);
    let e = c
        .wait_event("node2", "the failover evacuation", |e| {
            e["action"] == "evacuate-failover" && e["repair-status"] == "completed"
        })
        .await;
    assert!(g.instances().contains("inst1 node1 running"));
    assert!(g.offline().contains("node2 Y"));
    let fid = e["id"].as_str().unwrap().to_string();
    let job = e["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["kind"] == "evacuate-failover")
        .unwrap()["id"]
        .clone();
    let reason = format!("gnt:daemon:maintd maintd:{fid} job:{job} failover inst1");
    assert_eq!(g.jobs_with_reason(&reason, "OP_INSTANCE_FAILOVER").await, 1);
    acknowledge(&g, &c, &fid).await;

    // Ganeti moves its master: the daemon on the old one stops acting and exits with 11.
    // Ganeti's vote needs both node daemons to answer; right after node2 came back online one
    // may not yet (Ganeti says "Unhealthy nodes"), so the failover is asked again meanwhile.
    let failover = ["node2/cmd", "gnt-cluster", "master-failover"];
    common::wait_for("Ganeti's master failover", || {
        let done = match g.try_run(&failover) {
            Ok(_) => Some(()),
            Err(e) if e.contains("Unhealthy nodes") => None,
            Err(e) => panic!("{failover:?}: {e}"),
        };
        async move {
            if done.is_none() {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            done
        }
    })
    .await;
    let daemon = &mut c.daemon.as_mut().unwrap().child;
    let code = common::wait_for("the old master's daemon to stop", || {
        let code = daemon.try_wait().unwrap().map(|s| s.code());
        async move { code }
    })
    .await;
    assert_eq!(code, Some(11), "{}", c.daemon_log());
}

/// A job Ganeti refuses fails the event in Ganeti's own words and tags the node
/// `maintd:repairfailed` in Ganeti; and a daemon killed while its job waits in Ganeti's queue
/// adopts that job when it starts again, rather than submitting a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_fails_the_event_and_a_restarted_daemon_adopts_its_job() {
    let Some(g) = Ganeti::shared() else { return };
    // A `file` instance cannot migrate: the evacuation's child job fails.
    g.instance_of("file", "f1", "node2");
    let mut c = g.maintd("members-interval = \"1s\"\n");
    let port = c.api_port;
    c.set_verdict("node2", r#"{"status":"evacuate","details":{"disk":"sdb"}}"#);
    let fwd = g.start(&mut c, port, None).await;
    let e = c.wait_status("node2", "failed").await;
    let id = e["id"].as_str().unwrap().to_string();
    let detail = e["jobs"][0]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("OpPrereqError: Instance's disk layout 'file' does not allow migrations"),
        "{e}"
    );
    let failed = format!("maintd:repairfailed:{id}");
    assert!(g.gnt(&["gnt-node", "list-tags", "node2"]).contains(&failed));
    assert!(g.instances().contains("f1 node2 running"));

    // The operator removes the instance and the tag: the flow starts again, and its migrate
    // waits in Ganeti's queue behind a job holding node2.
    g.gnt(&["gnt-instance", "remove", "-f", "f1"]);
    g.running_instance("d1", "node2");
    g.gnt(&[
        "gnt-debug",
        "delay",
        "--submit",
        "--no-master",
        "-n",
        "node2",
        "15",
    ]);
    g.gnt(&["gnt-node", "remove-tags", "node2", &failed]);
    let again = c
        .wait_event("node2", "a new event", |e| e["id"] != id.as_str())
        .await;
    let reason = migrate_queued(&g, &again).await;
    c.kill_daemon();
    assert!(
        g.instances().contains("d1 node2 running"),
        "the job was still waiting"
    );
    // Held to the end: dropping the forwarder stops it, and a request that needs a new
    // connection is then refused.
    let _fwd = g.start(&mut c, port, Some(fwd)).await;
    let done = c.wait_status("node2", "completed").await;
    assert_eq!(done["id"], again["id"]);
    assert!(g.instances().contains("d1 node1 running"));
    assert_eq!(
        g.jobs_with_reason(&reason, "OP_NODE_MIGRATE").await,
        1,
        "adopted, not submitted twice"
    );
    assert!(c.daemon_log().contains("resuming job"));

    // The membership follows Ganeti's node list without a restart: node2 removed, added back.
    let polled = |present: bool| {
        let c = &c;
        move || async move {
            let (_, nodes) = c.get("/1/nodes").await;
            let has = nodes.as_array()?.iter().any(|n| n["name"] == "node2");
            (has == present).then_some(())
        }
    };
    g.gnt(&["gnt-node", "remove", "node2"]);
    common::wait_for("node2 gone from the managed nodes", polled(false)).await;
    // Removing it took the cluster's key from node2's root (one root for both nodes here).
    g.run(&[
        "sh",
        "-c",
        "cat /root/.ssh/id_rsa.pub >> /root/.ssh/authorized_keys",
    ]);
    g.gnt(&["gnt-node", "add", "--no-ssh-key-check", "node2"]);
    common::wait_for("node2 managed again", polled(true)).await;
}

/// harep's and hbal's work in maintd's rounds. An evacuation of node2 runs first; no balancing
/// move touches node2 while its event holds it. Once node2 is back, hbal's moves spread
/// node1's instances onto it. Then node2 dies and is marked offline: the instances tagged
/// `ganeti:watcher:autorepair:failover` (sharedfile and diskless) are failed over with harep's
/// pending and result tags; an untagged one is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_repairs_and_balancing_run_in_rounds_apart_from_evacuations() {
    let Some(g) = Ganeti::shared() else { return };
    for i in 1..=4 {
        let name = format!("s{i}");
        g.instance_of("sharedfile", &name, "node1");
        g.gnt(&[
            "gnt-instance",
            "add-tags",
            &name,
            "ganeti:watcher:autorepair:failover",
        ]);
    }
    g.running_instance("d1", "node2");
    // With the monitoring daemons' load asked for: they have none here (their default
    // collectors fail without DRBD and LVM), and hbal balances without it.
    let mut c =
        g.maintd("repairs = true\nbalance = true\nbalance-mond = true\nupkeep-interval = \"1s\"\n");
    let port = c.api_port;
    c.set_verdict("node2", r#"{"status":"evacuate","details":{"disk":"sdb"}}"#);
    let _fwd = g.start(&mut c, port, None).await;
    let e = c.wait_status("node2", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    assert!(g.instances().contains("d1 node1 running"));
    // Held by its event (offline, awaiting repair): no move onto it.
    c.some_polls(5).await;
    assert!(!g.instances().contains("node2"), "{}", g.instances());

    c.set_verdict("node2", r#"{"status":"Ok"}"#);
    g.gnt(&[
        "gnt-node",
        "remove-tags",
        "node2",
        &format!("maintd:repairready:{id}"),
    ]);
    let list = common::wait_for("hbal's moves onto node2", || async {
        let l = g.instances();
        (l.lines().filter(|l| l.contains(" node2 running")).count() >= 2).then_some(l)
    })
    .await;
    // Every balancing job ran after the evacuation's last job ended.
    let rapi = maintd::cluster::ganeti::Rapi::new(&g.settings()).unwrap();
    let jobs = rapi.get("/2/jobs?bulk=1").await.unwrap();
    let reasons = |j: &serde_json::Value| -> Vec<String> {
        j["ops"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|op| op["reason"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r[1].as_str().map(str::to_string))
            .collect()
    };
    let ts = |j: &serde_json::Value, f: &str| {
        j[f][0].as_f64().unwrap_or(0.0) + j[f][1].as_f64().unwrap_or(0.0) / 1e6
    };
    let (mut evac_end, mut balance_start) = (0.0f64, f64::MAX);
    for j in jobs.as_array().unwrap() {
        let r = reasons(j);
        if r.iter().any(|r| r.contains(&format!("maintd:{id}"))) {
            evac_end = evac_end.max(ts(j, "end_ts"));
        }
        if r.iter().any(|r| r.starts_with("gnt:daemon:maintd balance")) {
            balance_start = balance_start.min(ts(j, "start_ts"));
        }
    }
    assert!(balance_start < f64::MAX, "no balancing job: {list}");
    assert!(
        evac_end > 0.0 && balance_start > evac_end,
        "{evac_end} {balance_start}"
    );

    // node2 dies; the operator marks it offline (as harep needs): the tagged instances there
    // are failed over, each under harep's pending tag, ending with a result tag.
    g.running_instance("u1", "node2");
    g.running_instance("d2", "node2");
    g.gnt(&[
        "gnt-instance",
        "add-tags",
        "d2",
        "ganeti:watcher:autorepair:failover",
    ]);
    let mut moved: Vec<String> = g
        .instances()
        .lines()
        .filter(|l| l.contains(" node2 ") && l.starts_with('s'))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert!(!moved.is_empty());
    moved.push("d2".into());
    let pid = std::fs::read_to_string(g.path("vc/node2/var/run/ganeti/ganeti-noded.pid")).unwrap();
    g.run(&["kill", "-KILL", pid.trim()]);
    g.gnt(&["gnt-node", "modify", "-O", "yes", "--force", "node2"]);
    for name in &moved {
        let tags = common::wait_for("the repair's result tag", || async {
            let t = g.gnt(&["gnt-instance", "list-tags", name]);
            t.contains("ganeti:watcher:autorepair:result:failover:")
                .then_some(t)
        })
        .await;
        assert!(tags.contains(":success:"), "{name}: {tags}");
        assert!(
            g.instances().contains(&format!("{name} node1 running")),
            "{}",
            g.instances()
        );
    }
    let list = g.instances();
    assert!(
        list.contains("u1 node2 ERROR_nodeoffline"),
        "untagged: left alone: {list}"
    );
    assert!(
        g.gnt(&["gnt-instance", "list-tags", "u1"])
            .trim()
            .is_empty()
    );
}

/// A dead node on Ganeti: node2's node daemon and its collector die. maintd's staged flow
/// powers node2 off through its BMC (ipmi_sim, driven by the real fence_ipmilan), and only once
/// the BMC reads off does the release set node2 offline and fail its instance over to node1
/// (the failover job starts after the agent's last status call ended). Back on, the recovery
/// returns node2 to the regular role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_fenced_and_its_instances_fail_over_only_after_the_verified_off() {
    let Some((g, mut c, ipmi, _fwd)) = inst1_on_node2_fenced_by_ipmi().await else {
        return;
    };
    common::wait_for("both nodes polled", || async {
        let (_, nodes) = c.get("/1/nodes").await;
        let up = nodes.as_array()?.iter().filter(|n| n["reachable"] == true);
        (up.count() == 2).then_some(())
    })
    .await;

    let died = std::time::Instant::now();
    let pid = std::fs::read_to_string(g.path("vc/node2/var/run/ganeti/ganeti-noded.pid")).unwrap();
    g.run(&["kill", "-KILL", pid.trim()]);
    c.kill_collector(1);
    let f = c
        .wait_flow("node2 released", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    let elsewhere = common::wait_for("inst1 running on node1", || async {
        g.instances()
            .contains("inst1 node1 running")
            .then(|| died.elapsed())
    })
    .await;
    eprintln!("node death to its instance running elsewhere: {elsewhere:?}");
    // The BMC took the off (it may be on again by now: a released node is powered back on
    // for its return, `after-release = "on"`).
    let calls: Vec<(String, String, bool)> = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let s = |k: &str| x[k].as_str().unwrap_or_default().to_string();
            (s("agent"), s("action"), x["ok"] == true)
        })
        .collect();
    let ok = |a: &str| calls.contains(&("fence_ipmilan".into(), a.into(), true));
    assert!(ok("off") && ok("status"), "{calls:?}");
    assert!(g.offline().contains("node2 Y"));
    // The release's failover started only after the verified off.
    let verified_off = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        // The power-off step's own status calls (a power-on's come later).
        .filter(|x| x["step"] == "power-management" && x["action"] == "status" && x["ok"] == true)
        .map(|x| x["at"].as_i64().unwrap() + x["elapsed-ms"].as_i64().unwrap() * 1_000_000)
        .max()
        .expect("a status call read the power off");
    let rapi = maintd::cluster::ganeti::Rapi::new(&g.settings()).unwrap();
    let jobs = rapi.get("/2/jobs?bulk=1").await.unwrap();
    let failover = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["ops"][0]["OP_ID"] == "OP_INSTANCE_FAILOVER")
        .expect("the release's failover job");
    let started = failover["start_ts"][0].as_i64().unwrap() * 1_000_000_000
        + failover["start_ts"][1].as_i64().unwrap() * 1_000;
    assert!(started > verified_off, "{started} {verified_off}");
    assert!(
        failover["ops"][0]["ignore_consistency"] == true,
        "{failover}"
    );
    // Every job of maintd's names it once in its reason, the release's offline job included.
    let source = maintd::cluster::ganeti::REASON_SOURCE;
    let mut mine = 0;
    for j in jobs.as_array().unwrap() {
        for entry in j["ops"][0]["reason"].as_array().into_iter().flatten() {
            let text = entry[1].as_str().unwrap_or_default();
            if text.contains(source) {
                mine += 1;
                assert_eq!(text.matches(source).count(), 1, "{text}");
            }
        }
    }
    assert!(
        mine >= 2,
        "the offline and failover jobs carry maintd's reason: {jobs}"
    );
    // The release runs at most once per flow and attempt, even when asked again (a restart
    // between its jobs): a second call changes nothing.
    {
        use maintd::cluster::FenceRelease;
        let st = g.settings();
        let cfg = maintd::cluster::ganeti::GanetiConfig {
            rapi_url: st.url,
            rapi_certificate: st.certificate,
            rapi_password_file: st.password_file,
            ..Default::default()
        };
        let b = maintd::cluster::ganeti::Ganeti::connect(&cfg).unwrap();
        let flow = uuid::Uuid::parse_str(f["id"].as_str().unwrap()).unwrap();
        let again = b.release("node2", &flow, 1).await;
        assert!(again.ok(), "{again:?}");
        assert!(g.instances().contains("inst1 node1 running"));
        let failovers = jobs_of(&g, "OP_INSTANCE_FAILOVER").await;
        assert_eq!(failovers, 1, "no second failover");
    }

    // node2 comes back (its node daemon and collector): the recovery powers it on and the
    // reclaim returns it to the regular role.
    g.run(&[
        "node2/cmd",
        "/usr/lib/ganeti/daemon-util",
        "start",
        "ganeti-noded",
    ]);
    g.start_collectors(&mut c);
    common::wait_for("node2 online again", || async {
        g.offline().contains("node2 N").then_some(())
    })
    .await;
    assert!(ipmi.powered_on());
    // Each step's agent calls ran once: one off (with its status), one power-on (with its
    // status). A decision made from flows read before an earlier run ended must not run a step
    // again (the Ganeti backend's slower reads made that window wide).
    let f = c
        .wait_flow("node2's flow final", |f| {
            f["node"] == "node2" && f["status"] == "final"
        })
        .await;
    let count = |step: &str, action: &str| {
        f["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["step"] == step && x["action"] == action)
            .count()
    };
    assert_eq!(count("power-management", "off"), 1, "{f:#}");
    assert_eq!(count("power-on", "on"), 1, "{f:#}");
    assert_eq!(count("power-on", "status"), 1, "{f:#}");
}

/// A benchmark, run by hand (`cargo test --test it ganeti:: -- --ignored --nocapture`): both
/// evacuations of a node with `MAINTD_BENCH_INSTANCES` instances (3 by default; BENCHMARKS.md
/// has the figures for 20), `evacuate` (one node migrate, its child jobs followed) and
/// `evacuate-failover` (one failover job per instance), each ending with every instance
/// running on node1 and node2 offline and tagged. Prints how long each took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints figures for BENCHMARKS.md"]
async fn evacuate_and_evacuate_failover_move_every_instance() {
    let Some(g) = Ganeti::up() else { return };
    let n: usize = std::env::var("MAINTD_BENCH_INSTANCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // Room for them all on one node of this 2-CPU machine (hail counts virtual CPUs).
    g.gnt(&["gnt-cluster", "modify", "--ipolicy-vcpu-ratio=64"]);
    for i in 0..n {
        g.running_instance(&format!("e{i}"), "node2");
    }
    let mut c = g.maintd("");
    let port = c.api_port;
    let _fwd = g.start(&mut c, port, None).await;
    for (verdict, job) in [
        ("evacuate", "evacuate"),
        ("evacuate-failover", "evacuate-failover"),
    ] {
        let t = std::time::Instant::now();
        c.set_verdict("node2", &format!(r#"{{"status":"{verdict}"}}"#));
        // Longer than the tests' usual wait: many instances move one after another.
        let e = loop {
            let done = c.status().await.into_iter().find(|e| {
                e["node"] == "node2" && e["action"] == verdict && e["repair-status"] != "pending"
            });
            if let Some(e) = done.filter(|e| e["repair-status"] != "noted") {
                break e;
            }
            assert!(
                t.elapsed() < Duration::from_secs(1800),
                "{verdict} not done"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(e["repair-status"], "completed", "{e}");
        let took = t.elapsed();
        eprintln!("{verdict} of {n} instances: verdict to event completed in {took:?}");
        let list = g.instances();
        assert_eq!(
            list.lines()
                .filter(|l| l.ends_with("node1 running"))
                .count(),
            n,
            "{list}"
        );
        assert!(g.offline().contains("node2 Y"));
        let detail = e["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["kind"] == job)
            .map(|j| j["detail"].to_string())
            .unwrap();
        let id = e["id"].as_str().unwrap();
        if verdict == "evacuate-failover" {
            assert_eq!(
                detail.matches("job ").count(),
                n,
                "one failover each: {detail}"
            );
            break;
        }
        // Acknowledged, back online; the instances return to node2 for the next evacuation.
        acknowledge(&g, &c, id).await;
        g.gnt(&["gnt-node", "migrate", "-f", "node1"]);
    }
}

/// The cluster with `inst1` running on node2, and maintd started on it with node2 fenced by
/// its BMC: an IPMI simulator in the cluster's network namespace (where the daemon runs its
/// agents), powering off by fence_ipmilan and on again in the recovery. `None` (the test
/// skips) without the simulators or the cluster. The forwarder must be kept.
async fn inst1_on_node2_fenced_by_ipmi() -> Option<(
    common::ganeti::Shared,
    common::Cluster,
    common::sims::Ipmi,
    (u16, common::Proc),
)> {
    if !common::sims::available() {
        return None;
    }
    let g = Ganeti::shared()?;
    g.running_instance("inst1", "node2");
    let inside = g.inside();
    let wrap: Vec<&str> = inside.iter().map(String::as_str).collect();
    let mut c = g.maintd("");
    let ipmi = common::sims::Ipmi::start_in(c.dir.path(), "node2", &wrap);
    c.extra_daemon_toml += &common::sims::ipmi_fencing(&c, &ipmi, "node2", true);
    let port = c.api_port;
    let fwd = g.start(&mut c, port, None).await;
    Some((g, c, ipmi, fwd))
}

/// The hardware swap on real Ganeti: node2's repair evacuates and offlines it and waits for
/// its acknowledgement; a technician then powers it down (off at its BMC, its node daemon and
/// collector gone). maintd starts no fence flow, calls no agent and powers nothing on: node2
/// stays off and offline, its instance where the evacuation put it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_being_repaired_by_hand_is_never_fenced_or_powered_on() {
    let Some((g, mut c, ipmi, _fwd)) = inst1_on_node2_fenced_by_ipmi().await else {
        return;
    };
    c.set_verdict("node2", r#"{"status":"evacuate","details":"disk"}"#);
    c.wait_event("node2", "the evacuation to complete", |e| {
        e["repair-status"] == "completed"
    })
    .await;
    assert!(g.instances().contains("inst1 node1 running"));
    assert!(g.offline().contains("node2 Y"));
    let (_, held) = c.get("/1/maintenance").await;
    assert_eq!(held[0]["node"], "node2", "{held}");
    assert_eq!(held[0]["source"], "repair", "{held}");

    // The technician powers node2 down at its BMC.
    std::fs::write(ipmi.state_file(), "0\n").unwrap();
    let pid = std::fs::read_to_string(g.path("vc/node2/var/run/ganeti/ganeti-noded.pid")).unwrap();
    g.run(&["kill", "-KILL", pid.trim()]);
    c.kill_collector(1);
    // Far past the 1 s grace: no flow (so no agent call), no power-on, still offline.
    for _ in 0..40 {
        let (_, flows) = c.get("/1/fences").await;
        assert_eq!(flows, serde_json::json!([]), "a fence flow started");
        assert!(!ipmi.powered_on(), "node2 was powered on");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(c.node("node2").await["reachable"], false);
    assert!(g.offline().contains("node2 Y"));
    assert!(g.instances().contains("inst1 node1 running"));
    // Back from the swap: its node daemon restarted and the repair acknowledged, it returns.
    g.run(&[
        "node2/cmd",
        "/usr/lib/ganeti/daemon-util",
        "start",
        "ganeti-noded",
    ]);
    std::fs::write(ipmi.state_file(), "1\n").unwrap();
    g.start_collectors(&mut c);
    let id = c.status().await[0]["id"].as_str().unwrap().to_string();
    acknowledge(&g, &c, &id).await;
    assert!(g.offline().contains("node2 N"));
    let (_, flows) = c.get("/1/fences").await;
    assert_eq!(flows, serde_json::json!([]), "{flows}");
}

/// How many jobs in Ganeti's queue run opcode `op` first.
/// Waits until the migrate job of `event`'s evacuation is in Ganeti's queue (found by maintd's
/// reason); returns that reason.
async fn migrate_queued(g: &Ganeti, event: &serde_json::Value) -> String {
    common::wait_for("the migrate job in Ganeti's queue", || async move {
        let job = event["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["kind"] == "evacuate")?
            .clone();
        let r = format!(
            "gnt:daemon:maintd maintd:{} job:{} migrate",
            event["id"].as_str()?,
            job["id"]
        );
        (g.jobs_with_reason(&r, "OP_NODE_MIGRATE").await == 1).then_some(r)
    })
    .await
}

async fn jobs_of(g: &Ganeti, op: &str) -> usize {
    let rapi = Rapi::new(&g.settings()).unwrap();
    let jobs = rapi.get("/2/jobs?bulk=1").await.unwrap();
    jobs.as_array()
        .unwrap()
        .iter()
        .filter(|j| j["ops"][0]["OP_ID"] == op)
        .count()
}

/// The operator's hand-back of node2 after event `id`: healthy again, its `repairready` tag
/// removed with Ganeti's CLI; returns once Ganeti has it online.
async fn acknowledge(g: &Ganeti, c: &common::Cluster, id: &str) {
    c.set_verdict("node2", r#"{"status":"Ok"}"#);
    let tag = format!("maintd:repairready:{id}");
    g.gnt(&["gnt-node", "remove-tags", "node2", &tag]);
    common::wait_for("node2 back online", || async {
        g.offline().contains("node2 N").then_some(())
    })
    .await;
}

/// Ganeti's rough days, on the real cluster. An evacuation whose first child job fails (a
/// `file` instance cannot migrate) while its sibling still migrates (slowed by a Ganeti hook):
/// the event fails only once the sibling has ended, so no instance moves after the event is
/// final. Then `ganeti-rapi` is stopped for 5 s with Ganeti's own tools while maintd follows a
/// job: maintd asks again until the job's deadline, and the event completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sibling_and_a_rapi_outage_mid_job_are_followed_to_the_end() {
    let Some(g) = Ganeti::shared() else { return };
    // Ganeti submits a node migrate's child jobs in the order of its configuration's instances,
    // which is by UUID: the failing one (a1) must come first for the test to tell anything.
    // Both are made again by turns until they sort so (one alone may be drawn past any other).
    let rapi = Rapi::new(&g.settings()).unwrap();
    let uuid = |all: &serde_json::Value, name: &str| -> String {
        all.as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap()["uuid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    g.instance_of("file", "a1", "node2");
    g.running_instance("b1", "node2");
    for attempt in 0.. {
        let all = rapi.get("/2/instances?bulk=1").await.unwrap();
        if uuid(&all, "a1") < uuid(&all, "b1") {
            break;
        }
        assert!(attempt < 12, "b1's UUID never sorted after a1's");
        if attempt % 2 == 0 {
            g.gnt(&["gnt-instance", "remove", "-f", "b1"]);
            g.running_instance("b1", "node2");
        } else {
            g.gnt(&["gnt-instance", "remove", "-f", "a1"]);
            g.instance_of("file", "a1", "node2");
        }
    }
    for node in ["node1", "node2"] {
        let dir = g.path(&format!(
            "vc/{node}/etc/ganeti/hooks/instance-migrate-pre.d"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        common::write_exec(&dir.join("slow"), "#!/bin/sh\nsleep 6\n");
    }
    let mut c = g.maintd("");
    let port = c.api_port;
    c.set_verdict("node2", r#"{"status":"evacuate","details":{"disk":"sdb"}}"#);
    let fwd = g.start(&mut c, port, None).await;
    let e = c.wait_status("node2", "failed").await;
    assert!(
        g.instances().contains("b1 node1 running"),
        "{}",
        g.instances()
    );
    assert!(g.instances().contains("a1 node2 running"));
    let detail = e["jobs"][0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("does not allow migrations"), "{e}");
    // The failing child came first, and maintd's job ended only after every child had: by
    // Ganeti's own clock, b1's migration ended before maintd's job was finished (a wait that
    // stopped at the first failure finishes the job while b1 still migrates).
    let finished = e["jobs"][0]["finished"].as_i64().unwrap();
    let jobs = rapi.get("/2/jobs?bulk=1").await.unwrap();
    let children: Vec<&serde_json::Value> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["ops"][0]["OP_ID"] == "OP_INSTANCE_MIGRATE")
        .collect();
    let names: Vec<&str> = children
        .iter()
        .map(|j| j["ops"][0]["instance_name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, vec!["a1", "b1"], "{jobs}");
    for j in children {
        let end = &j["end_ts"];
        let end_ns = end[0].as_i64().expect("the child ended") * 1_000_000_000
            + end[1].as_i64().unwrap() * 1_000;
        assert!(
            end_ns <= finished,
            "child job {} ended {} ns after maintd's job was finished",
            j["id"],
            end_ns - finished
        );
    }
    for node in ["node1", "node2"] {
        let hook = format!("vc/{node}/etc/ganeti/hooks/instance-migrate-pre.d/slow");
        std::fs::remove_file(g.path(&hook)).unwrap();
    }

    // The operator removes the file instance and acknowledges; the new event's migrate waits
    // in Ganeti's queue behind a job holding node2, and the RAPI goes away meanwhile.
    g.gnt(&["gnt-instance", "remove", "-f", "a1"]);
    g.gnt(&["gnt-instance", "migrate", "-f", "b1"]);
    g.gnt(&[
        "gnt-debug",
        "delay",
        "--submit",
        "--no-master",
        "-n",
        "node2",
        "12",
    ]);
    let id = e["id"].as_str().unwrap().to_string();
    g.gnt(&[
        "gnt-node",
        "remove-tags",
        "node2",
        &format!("maintd:repairfailed:{id}"),
    ]);
    let again = c
        .wait_event("node2", "a new event", |e| e["id"] != id.as_str())
        .await;
    migrate_queued(&g, &again).await;
    let daemon_util = "/usr/lib/ganeti/daemon-util";
    g.run(&["node1/cmd", daemon_util, "stop", "ganeti-rapi"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    g.run(&["node1/cmd", daemon_util, "start", "ganeti-rapi"]);
    let done = c.wait_status("node2", "completed").await;
    assert_eq!(done["id"], again["id"]);
    assert!(g.offline().contains("node2 Y"), "{}", g.offline());
    assert!(g.instances().contains("b1 node1 running"));
    assert!(
        c.daemon_log()
            .contains("the RAPI did not answer while following a job"),
        "the outage was seen and ridden out"
    );

    // An evacuate verdict on the master is refused before anything moves.
    c.set_verdict("node1", r#"{"status":"evacuate","details":{"disk":"sda"}}"#);
    let refused = c.wait_status("node1", "failed").await;
    let detail = refused["jobs"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("node1 is the Ganeti master") && detail.contains("nothing was moved"),
        "{refused}"
    );
    assert!(
        g.instances().contains("b1 node1 running"),
        "{}",
        g.instances()
    );
    assert!(g.offline().contains("node1 N"), "{}", g.offline());
    drop(fwd);
}
