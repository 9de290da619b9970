//! Remedies as Jobs on the real control plane: a condition rule's ladder runs a remedy from the
//! TOML that fails (the event fails, tagged `repairfailed`), then, one escalation later, one from
//! a ConfigMap that succeeds (tagged `repairready`) even though the daemon is killed while its
//! Job runs: the next daemon adopts that Job instead of starting a second one.

use super::*;

/// The condition the rule watches, set on a node's status as node-problem-detector would.
fn set_condition(cp: &ControlPlane, node: &str, status: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{"type": "MaintdTestBroken", "status": status,
        "reason": "Test", "message": "set by the test", "lastTransitionTime": now,
        "lastHeartbeatTime": now}]}});
    cp.kubectl_ok(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]);
}

/// The objects of `kind` in maintd's namespace that `selector` matches, as JSON.
fn items(cp: &ControlPlane, kind: &str, selector: &str) -> Vec<serde_json::Value> {
    let out = cp.kubectl_ok(&["get", kind, "-n", "maintd", "-l", selector, "-o", "json"]);
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The Jobs of one event, by their label.
fn jobs_of(cp: &ControlPlane, event: &str) -> Vec<serde_json::Value> {
    items(cp, "jobs", &format!("maintd.io/event={event}"))
}

fn pods_of(cp: &ControlPlane, job: &str) -> Vec<serde_json::Value> {
    items(cp, "pods", &format!("job-name={job}"))
}

const FIRST_AID: &str = r#"
spec:
  containers:
  - name: first-aid
    image: localhost/remedies:test
    env: [{name: RESULT, value: /dev/termination-log}]
    command: ["/bin/sh", "-c", "echo \"no luck on $MAINTD_NODE\" > \"$RESULT\"; exit 3"]
"#;

const FIX: &str = r#"spec:
  containers:
  - name: fix
    image: localhost/remedies:test
    env: [{name: RESULT, value: /dev/termination-log}]
    command: ["/bin/sh", "-c", "sleep 8; echo \"fixed $MAINTD_NODE for $MAINTD_EVENT\" > \"$RESULT\""]
"#;

pub async fn remedy_jobs_fail_escalate_succeed_and_are_adopted_after_a_restart(cp: &ControlPlane) {
    let (mut c, nodes) = managed_cluster(cp, "rm").await;
    c.extra_daemon_toml = format!(
        "[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\nmax-remedies = 2\n[kubernetes.leader-election]\nenabled = false\nnamespace = \"maintd\"\n[[kubernetes.conditions]]\ntype = \"MaintdTestBroken\"\nstatus = \"True\"\nfor = \"0s\"\nactions = [\"remedy:first-aid\", \"remedy:fix\"]\nescalate-after = \"25s\"\n[kubernetes.remedies.first-aid]\ndeadline = \"1m\"\nttl = \"10m\"\ntemplate = '''{FIRST_AID}'''\n"
    );
    as_maintd(cp, &mut c);
    let body: String = FIX.lines().map(|l| format!("    {l}\n")).collect();
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: remedy-fix\n  namespace: maintd\ndata:\n  placement: elsewhere\n  deadline: 2m\n  template: |\n{body}"
    );
    let file = c.path("remedy-fix.yaml");
    std::fs::write(&file, cm).unwrap();
    cp.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    start_all(&mut c).await;
    let sick = nodes[1].clone();
    set_condition(cp, &sick, "True");

    // The first remedy runs on the node itself and fails: the event fails with the Job's
    // account and the pod's own message, and the node is tagged repairfailed.
    let first = c.wait_status(&sick, "failed").await;
    let id1 = first["id"].as_str().unwrap().to_string();
    assert_eq!(first["original"]["remedy"], "first-aid", "{first:#}");
    let job = &first["jobs"][0];
    assert_eq!(job["kind"], "remedy", "{first:#}");
    let detail = job["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("maintd-remedy-{id1}"))
            && detail.contains("failed")
            && detail.contains(&format!("no luck on {sick}")),
        "{detail}"
    );
    let jobs = jobs_of(cp, &id1);
    assert_eq!(
        jobs.len(),
        1,
        "kubectl get jobs -l maintd.io/event=<id> finds it"
    );
    assert_eq!(jobs[0]["spec"]["backoffLimit"], 0);
    assert_eq!(jobs[0]["spec"]["activeDeadlineSeconds"], 60);
    assert_eq!(jobs[0]["spec"]["ttlSecondsAfterFinished"], 600);
    let owner = &jobs[0]["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (&json!("Node"), &json!(sick))
    );
    let pods = pods_of(cp, &format!("maintd-remedy-{id1}"));
    assert_eq!(
        pods[0]["spec"]["nodeName"],
        sick.as_str(),
        "pinned to the node"
    );
    let labels = cp.kubectl_ok(&["get", "node", &sick, "-o", "jsonpath={.metadata.labels}"]);
    assert!(labels.contains("repairfailed"), "{labels}");

    // One escalation later the ConfigMap's remedy runs, elsewhere. The daemon is killed while
    // its Job runs; the next daemon adopts the Job.
    let second = c
        .wait_event(&sick, "the escalated remedy's job", |e| {
            e["original"]["remedy"] == "fix" && e["jobs"].as_array().is_some_and(|j| !j.is_empty())
        })
        .await;
    let id2 = second["id"].as_str().unwrap().to_string();
    let name2 = format!("maintd-remedy-{id2}");
    cp.wait_for("the fix Job's pod", |cp| !pods_of(cp, &name2).is_empty())
        .await;
    c.kill_daemon();
    c.start_kube_daemon();
    c.wait_api().await;
    let done = c.wait_status(&sick, "completed").await;
    assert_eq!(done["id"], id2.as_str());
    let detail = done["jobs"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("completed")
            && detail.contains("adopted")
            && detail.contains(&format!("fixed {sick} for {id2}")),
        "{detail}"
    );
    assert_eq!(jobs_of(cp, &id2).len(), 1, "no second Job");
    let pods = pods_of(cp, &name2);
    assert_eq!(pods.len(), 1, "no second pod: {pods:#?}");
    assert_ne!(
        pods[0]["spec"]["nodeName"],
        sick.as_str(),
        "placement = elsewhere"
    );
    let labels = cp.kubectl_ok(&["get", "node", &sick, "-o", "jsonpath={.metadata.labels}"]);
    assert!(labels.contains("repairready"), "{labels}");
    // The remedies' Events are on the node.
    let events = cp.kubectl_ok(&["get", "events", "-n", "default", "-o", "json"]);
    assert!(events.contains("MaintdRemedy"), "no MaintdRemedy Event");

    set_condition(cp, &sick, "False");
    cp.kubectl(&["delete", "-f", file.to_str().unwrap(), "--wait=false"]);
    delete_jobs(cp, "remedy");
    remove_nodes(cp, &mut c, &nodes);
}

/// A remedy that ran while its node was fenced (its condition rule fired during the return
/// wait) failed against a node that was down: once the node returns, its `repairfailed` label
/// goes with the fence's reclaim, and the flow's record says so.
pub async fn remedies_that_ran_while_a_node_was_fenced_leave_no_label_once_it_returns(
    cp: &ControlPlane,
) {
    let (mut c, nodes) = managed_cluster(cp, "rw").await;
    stub_fenced_admin_daemon(cp, &mut c, &nodes);
    c.extra_daemon_toml += &format!(
        "[[kubernetes.conditions]]\ntype = \"MaintdTestBroken\"\nstatus = \"True\"\nfor = \"0s\"\nactions = [\"remedy:first-aid\"]\n[kubernetes.remedies.first-aid]\nplacement = \"elsewhere\"\ndeadline = \"1m\"\ntemplate = '''{FIRST_AID}'''\n"
    );
    start_all(&mut c).await;
    let victim = nodes[0].clone();
    heard_by_its_peers(&c, &victim).await;
    let (_pid, f) = freeze_until_released(cp, &c, 0).await;
    set_condition(cp, &victim, "True");
    let failed = c.wait_status(&victim, "failed").await;
    let labels = || cp.kubectl_ok(&["get", "node", &victim, "-o", "jsonpath={.metadata.labels}"]);
    assert!(labels().contains("repairfailed"), "{failed:#}");
    set_condition(cp, &victim, "False");
    boot_again(cp, &mut c, 0);
    wait_recovered(cp, &c, &victim).await;
    cp.wait_for("the remedy's label to go", |_| {
        !labels().contains("repairfailed")
    })
    .await;
    let id = f["id"].as_str().unwrap();
    let (_, done) = c.get(&format!("/1/fences/{id}")).await;
    assert!(
        done.to_string()
            .contains("removed the tags of remedies that ran while it was fenced"),
        "{done:#}"
    );
    delete_jobs(cp, "remedy");
    remove_nodes(cp, &mut c, &nodes);
}
