//! maintd against a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler v1.36.2 on loopback; tests/it/common/k8s.rs): what the in-process fake cannot
//! decide. One control plane for the whole binary (it takes seconds to start); the scenarios run
//! one after another in one test and clean up what they create.

use crate::common;
mod maintenance;
mod remedies;
mod standby;
mod takeover;

use std::time::Duration;

use common::k8s::{self, ControlPlane};
use common::*;
use nix::sys::signal::{Signal, kill};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_real_control_plane() {
    if !k8s::available() {
        return;
    }
    // The audit log counts what maintd's ServiceAccount sends (the drain scenario reads it).
    let cp = ControlPlane::start_audited(Duration::from_secs(8), SA_USER).await;
    // Every deploy/ manifest is valid for the real apiserver (the namespace first).
    let deploy = common::sims::repo("deploy");
    cp.kubectl_ok(&[
        "apply",
        "-f",
        deploy.join("namespace.yaml").to_str().unwrap(),
    ]);
    let out = cp.kubectl_ok(&["apply", "-f", deploy.to_str().unwrap()]);
    assert!(
        out.contains("clusterrole.rbac.authorization.k8s.io/maintd"),
        "{out}"
    );
    scenarios!(cp;
        nodefences_pass_the_flow_store_suite_under_the_deploy_rbac,
        nodefences_are_the_record_a_new_daemon_resumes_from_and_operators_fence_with,
        configmaps_configure_fencing_at_run_time_with_secrets_only_from_secrets,
        standby::a_standby_reads_no_fence_secret_until_it_leads,
        remedies::remedy_jobs_fail_escalate_succeed_and_are_adopted_after_a_restart,
        remedies::remedies_that_ran_while_a_node_was_fenced_leave_no_label_once_it_returns,
        maintenance::maintenance_by_repair_nodemaintenance_or_another_holder_holds_every_fence,
        events_show_in_kubectl_describe_node_under_the_deploy_rbac,
        a_fence_release_never_deletes_the_replacement_pod,
        takeover::a_takeover_mid_call_keeps_the_earlier_daemons_power_off_in_the_record,
        a_condition_fence_does_not_recover_while_ready_is_unknown,
        a_renewing_kubelet_lease_vetoes_a_fence_until_it_goes_stale,
        a_self_fencing_node_is_cordoned_reset_and_only_then_released,
        a_stale_answer_never_returns_a_fenced_node_and_its_old_boot_is_an_alarm,
        drains_evict_each_pod_once_and_a_failed_drain_leaves_the_node_cordoned,
        kdump_holds_the_power_off_for_its_window_and_a_notification_releases_with_none,
    );
}

/// Runs each scenario in order, or only those whose names contain `MAINTD_K8S_SCENARIO` (for
/// a quick loop on one).
macro_rules! scenarios {
    ($cp:expr; $($f:path),* $(,)?) => {
        $(
            if wanted(stringify!($f)) {
                $f(&$cp).await;
            }
        )*
    };
}
use scenarios;

/// Whether the scenario `name` runs.
fn wanted(name: &str) -> bool {
    std::env::var("MAINTD_K8S_SCENARIO").map_or(true, |s| name.contains(&s))
}

const SA_USER: &str = "system:serviceaccount:maintd:maintd";

fn taints(cp: &ControlPlane, node: &str) -> String {
    cp.kubectl_ok(&["get", "node", node, "-o", "jsonpath={.spec.taints}"])
}

/// Four collectors for four managed Nodes named `<prefix>node<i>`, with the daemon taking its
/// nodes from the API.
async fn managed_cluster(cp: &ControlPlane, prefix: &str) -> (Cluster, Vec<String>) {
    let mut c = Cluster::new(4);
    let nodes: Vec<String> = c.nodes.iter().map(|n| format!("{prefix}{n}")).collect();
    cp.add_managed_nodes(&c, &nodes).await;
    // The collectors answer under the Kubernetes node names, healthy.
    c.nodes = nodes.clone();
    for n in &nodes {
        c.set_verdict(n, r#"{"status":"Ok"}"#);
    }
    c.inventory_nodes = false;
    (c, nodes)
}

/// A daemon as cluster-admin, without election, fencing `nodes` with a stub agent that always
/// powers off (2 s grace).
fn stub_fenced_admin_daemon(cp: &ControlPlane, c: &mut Cluster, nodes: &[String]) {
    stub_fenced_admin_daemon_with(cp, c, nodes, ("fence_ok", POWER_AGENT));
}

/// `stub_fenced_admin_daemon` with the stand-in agent `(name, body)`.
fn stub_fenced_admin_daemon_with(
    cp: &ControlPlane,
    c: &mut Cluster,
    nodes: &[String],
    (agent, body): (&str, &str),
) {
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n",
        c.stub_fencing(agent, body, "2s", &refs)
    );
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
}

/// The collectors, then the daemon on the Kubernetes backend, each answering.
async fn start_all(c: &mut Cluster) {
    c.start_collectors();
    c.wait_collectors_ready().await;
    c.start_kube_daemon();
    c.wait_api().await;
}

/// The daemon talks to the apiserver as maintd's ServiceAccount, under deploy/'s RBAC.
fn as_maintd(cp: &ControlPlane, c: &mut Cluster) {
    c.env.push((
        "KUBECONFIG".into(),
        cp.service_account_kubeconfig("maintd", "maintd")
            .display()
            .to_string(),
    ));
}

/// Waits until the three other nodes hear `victim`.
async fn heard_by_its_peers(c: &Cluster, victim: &str) {
    wait_for("the peers to hear the victim", || async {
        let w = c.node(victim).await["witnesses"].clone();
        (w["heard-by"].as_array().map(Vec::len) == Some(3)).then_some(())
    })
    .await;
}

/// The one fence flow of `node`, which must not have ended.
async fn one_open_flow(c: &Cluster, node: &str) -> serde_json::Value {
    let flows = c.get("/1/fences").await.1;
    let mine: Vec<_> = flows
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["node"] == node)
        .cloned()
        .collect();
    assert_eq!(mine.len(), 1, "{flows:#}");
    assert_ne!(mine[0]["status"], "final", "{:#}", mine[0]);
    mine[0].clone()
}

/// Node `i` dies as a hung node does: its collector freezes (SIGSTOP) and its kubelet stops.
/// Returns the frozen collector (SIGCONT wakes it) and its flow once released.
async fn freeze_until_released(
    cp: &ControlPlane,
    c: &Cluster,
    i: usize,
) -> (nix::unistd::Pid, serde_json::Value) {
    let victim = c.nodes[i].clone();
    let pid = hang(cp, c, i);
    let f = c
        .wait_flow("the release", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    (pid, f)
}

/// Node `i` hangs: its collector freezes (SIGSTOP; the returned pid wakes it with SIGCONT) and
/// its kubelet stops.
fn hang(cp: &ControlPlane, c: &Cluster, i: usize) -> nix::unistd::Pid {
    let pid = nix::unistd::Pid::from_raw(c.collectors[i].as_ref().unwrap().child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    cp.heartbeats.alive(&c.nodes[i], false);
    pid
}

/// Node `i`, powered off by the stub agent, boots again: a new collector with a new boot id,
/// and its kubelet beats.
fn boot_again(cp: &ControlPlane, c: &mut Cluster, i: usize) {
    c.kill_collector(i);
    c.start_collector_with(i, "scripted", "cluster.key");
    cp.heartbeats.alive(&c.nodes[i], true);
}

/// The node's flow ends in recovery and its out-of-service taint goes.
async fn wait_recovered(cp: &ControlPlane, c: &Cluster, node: &str) {
    c.wait_flow("recovery", |f| f["node"] == node && f["status"] == "final")
        .await;
    cp.wait_for("the out-of-service taint to go", |cp| {
        !taints(cp, node).contains("out-of-service")
    })
    .await;
}

/// Ends a scenario: its daemon stops, its nodes stop heartbeating and are deleted, and so are
/// its NodeFences (their finalizers first: no daemon is left to remove them).
fn remove_nodes(cp: &ControlPlane, c: &mut Cluster, nodes: &[String]) {
    c.kill_daemon();
    for n in nodes {
        cp.heartbeats.alive(n, false);
        cp.kubectl(&["delete", "node", n, "--wait=false"]);
    }
    clear_nodefences(cp);
}

/// Deletes the Jobs maintd made for `role` (`remedy`, `fence-agent`) in its namespace.
fn delete_jobs(cp: &ControlPlane, role: &str) {
    let selector = format!("maintd.io/role={role}");
    cp.kubectl(&[
        "delete",
        "jobs",
        "-n",
        "maintd",
        "-l",
        &selector,
        "--wait=false",
    ]);
}

fn clear_nodefences(cp: &ControlPlane) {
    let names = cp.kubectl_ok(&["get", "nodefences", "-o", "name"]);
    for n in names.lines().filter(|l| !l.is_empty()) {
        cp.kubectl(&[
            "patch",
            n,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        cp.kubectl(&["delete", n, "--wait=false"]);
    }
}

/// A client authenticated as maintd's ServiceAccount, as deploy/ installs it.
#[cfg(feature = "testing")]
async fn maintd_client(cp: &ControlPlane) -> kube::Client {
    let path = cp.service_account_kubeconfig("maintd", "maintd");
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// The suite every flow store passes (inserts, optimistic saves, outcomes, cancels, listings,
/// pruning), run against NodeFence objects on the real apiserver with deploy/'s RBAC.
async fn nodefences_pass_the_flow_store_suite_under_the_deploy_rbac(cp: &ControlPlane) {
    #[cfg(feature = "testing")]
    {
        maintd::cluster::kube::nodefence_conformance(maintd_client(cp).await).await;
        clear_nodefences(cp);
    }
    // The suite is test code, built only with the `testing` feature (scripts/test enables it).
    #[cfg(not(feature = "testing"))]
    {
        let _ = cp;
        assert!(
            std::env::var_os("MAINTD_REQUIRE_K8S").is_none(),
            "MAINTD_REQUIRE_K8S is set, but the flow-store suite needs --features testing"
        );
        eprintln!(
            "notice: built without the `testing` feature: the flow-store suite against NodeFences is skipped"
        );
    }
}

/// `kubectl get nodefences` output for one node: (step, status), from the printer columns.
fn nodefence_row(cp: &ControlPlane, node: &str) -> Option<(String, String)> {
    let out = cp.kubectl_ok(&["get", "nodefences"]);
    out.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.get(1) == Some(&node)).then(|| (cols[2].to_string(), cols[3].to_string()))
    })
}

/// A dead node's fence is a NodeFence that `kubectl get nodefences` shows moving through its
/// steps. The daemon dies after the release and its database is wiped: the next one resumes the
/// flow from the object alone, with no second flow, and recovers the node once it is back. An
/// operator's NodeFence fences a live node (power-off by the agent, workloads released) and
/// recovers it on its next healthy report; one for a node without fence configuration is
/// refused, with the reason in its status, and pruned once its retention has passed. All
/// under deploy/'s RBAC.
async fn nodefences_are_the_record_a_new_daemon_resumes_from_and_operators_fence_with(
    cp: &ControlPlane,
) {
    let (mut c, nodes) = managed_cluster(cp, "nf").await;
    let refs: Vec<&str> = nodes[..3].iter().map(String::as_str).collect();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n",
        c.stub_fencing("fence_ok", POWER_AGENT, "2s", &refs)
    );
    as_maintd(cp, &mut c);
    start_all(&mut c).await;
    let victim = nodes[0].clone();
    heard_by_its_peers(&c, &victim).await;
    let (pid, f) = freeze_until_released(cp, &c, 0).await;
    let (step, status) = nodefence_row(cp, &victim).expect("kubectl get nodefences shows it");
    assert!(
        ["power-management", "power-on", "recovery"].contains(&step.as_str()) && status != "final",
        "{step} {status}"
    );
    let nf: serde_json::Value = serde_json::from_str(&cp.kubectl_ok(&[
        "get",
        "nf",
        "-l",
        &format!("maintd.io/flow={}", f["id"].as_str().unwrap()),
        "-o",
        "json",
    ]))
    .unwrap();
    let st = &nf["items"][0]["status"];
    assert_eq!(st["fenced"], true, "{nf:#}");
    assert!(
        st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "PoweredOff" && c["status"] == "True"),
        "{nf:#}"
    );
    assert_eq!(st["jobs"][0]["action"], "off", "{nf:#}");

    // The daemon dies and its database goes: the NodeFence alone carries the flow on.
    c.kill_daemon();
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(c.path("state").join(f));
    }
    c.start_kube_daemon();
    c.wait_api().await;
    let again = c
        .wait_flow("the resumed flow", |g| g["id"] == f["id"])
        .await;
    assert_eq!(again["released"], true, "{again:#}");
    // The stub's off killed the frozen collector; the power-on leaves the node to boot.
    let _ = pid;
    boot_again(cp, &mut c, 0);
    wait_recovered(cp, &c, &victim).await;
    let all = c.get("/1/fences").await.1;
    let mine = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["node"] == victim.as_str())
        .count();
    assert_eq!(mine, 1, "one flow, resumed, never a second: {all:#}");
    assert_eq!(nodefence_row(cp, &victim).unwrap().1, "final");

    // An operator fences a live node with kubectl.
    let live = nodes[1].clone();
    let manifest = c.path("manual.yaml");
    std::fs::write(
        &manifest,
        format!("apiVersion: maintd.io/v1alpha1\nkind: NodeFence\nmetadata:\n  name: by-hand\nspec:\n  node: {live}\n"),
    )
    .unwrap();
    cp.kubectl_ok(&["create", "-f", manifest.to_str().unwrap()]);
    let m = c
        .wait_flow("the operator's fence released", |g| {
            g["node"] == live.as_str() && g["released"] == true
        })
        .await;
    assert_eq!(m["witnesses"]["manual"], "NodeFence/by-hand", "{m:#}");
    assert!(m["fenced-at"].as_i64().is_some(), "{m:#}");
    // The stub's off took its collector down with the node; powered on, it boots again and
    // returns on its new boot's reports.
    boot_again(cp, &mut c, 1);
    wait_recovered(cp, &c, &live).await;
    let m = c
        .wait_flow("the operator's fence final", |g| g["id"] == m["id"])
        .await;
    assert!(
        m["returned-boot"].is_string() && m["boot-before"] != m["returned-boot"],
        "{m:#}"
    );
    let status = cp.kubectl_ok(&[
        "get",
        "nf",
        "by-hand",
        "-o",
        "jsonpath={.status.returnedBoot}",
    ]);
    assert_eq!(
        m["returned-boot"],
        status.as_str(),
        "the NodeFence shows the new boot"
    );
    let uid = cp.kubectl_ok(&["get", "nf", "by-hand", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(
        m["id"],
        uid.as_str(),
        "the request became the flow in place"
    );

    // One for a node without fence configuration is refused, said in its status.
    let other = nodes[3].clone();
    std::fs::write(
        &manifest,
        format!("apiVersion: maintd.io/v1alpha1\nkind: NodeFence\nmetadata:\n  name: refused\nspec:\n  node: {other}\n"),
    )
    .unwrap();
    cp.kubectl_ok(&["create", "-f", manifest.to_str().unwrap()]);
    cp.wait_for("the refusal in the NodeFence's status", |cp| {
        cp.kubectl_ok(&["get", "nf", "refused", "-o", "jsonpath={.status.message}"])
            .contains("has no fence configuration")
    })
    .await;
    let reason = cp.kubectl_ok(&[
        "get",
        "nf",
        "refused",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Accepted\")].reason}",
    ]);
    assert_eq!(reason, "Refused");
    assert!(!taints(cp, &other).contains("out-of-service"));
    // A refusal is kept for the retention, as a final flow is, then pruned: a daemon whose
    // retention has passed deletes it (its first decision prunes).
    c.kill_daemon();
    c.extra_daemon_toml =
        c.extra_daemon_toml
            .replacen("[fencing]\n", "[fencing]\nretention = \"1s\"\n", 1);
    c.start_kube_daemon();
    c.wait_api().await;
    cp.wait_for("the refused NodeFence pruned", |cp| {
        !cp.kubectl(&["get", "nf", "refused"]).status.success()
    })
    .await;
    remove_nodes(cp, &mut c, &nodes);
}

/// The collector dies but the kubelet keeps renewing its Lease: the node runs, so its silent
/// collector and its peers (which lose the collector's heartbeats) are outvoted and nothing is
/// fenced. The kubelet stops too, but a storage Lease the operator named is still renewed (by
/// a storage agent, here the test): still nothing. Once that stops and goes stale as well, the
/// node is fenced, with both Leases among the witnesses. All at the default timings: the 5 s
/// grace, the default node interval, a storage Lease renewed every 2.5 s.
async fn a_renewing_kubelet_lease_vetoes_a_fence_until_it_goes_stale(cp: &ControlPlane) {
    let (mut c, nodes) = managed_cluster(cp, "l").await;
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\n[[kubernetes.storage-leases]]\nnamespace = \"storage\"\nname = \"{{node}}-storage\"\nrenew-interval = \"2500ms\"\n[kubernetes.leader-election]\nenabled = false\n",
        c.stub_fencing("fence_ok", POWER_AGENT, "5s", &refs)
    );
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
    let victim = nodes[0].clone();
    // The storage agent's Lease: 10 s long, renewed every 2.5 s while `storage` holds.
    cp.kubectl(&["create", "namespace", "storage"]);
    let storage = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let renewer = {
        let (client, storage, name) = (
            cp.client.clone(),
            storage.clone(),
            format!("{victim}-storage"),
        );
        tokio::spawn(async move {
            let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
                kube::Api::namespaced(client, "storage");
            while storage.load(std::sync::atomic::Ordering::SeqCst) {
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": "storage"},
                    "spec": {"holderIdentity": "storage-agent", "leaseDurationSeconds": 10,
                        "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
                });
                let pp = kube::api::PatchParams::apply("maintd-test-storage").force();
                let _ = leases
                    .patch(&name, &pp, &kube::api::Patch::Apply(&lease))
                    .await;
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
        })
    };
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    heard_by_its_peers(&c, &victim).await;
    c.kill_collector(0);
    wait_for("the victim to show as partitioned", || async {
        (c.node(&victim).await["witnesses"]["partitioned"] == true).then_some(())
    })
    .await;
    // Three graces later, still nothing.
    c.some_polls(90).await;
    let flows = c.get("/1/fences").await.1;
    assert_eq!(flows, serde_json::json!([]), "{flows:#}");
    assert_eq!(c.node(&victim).await["witnesses"]["partitioned"], true);
    // The kubelet stops: its Lease goes stale, but the storage Lease is still renewed.
    cp.heartbeats.alive(&victim, false);
    c.some_polls(100).await;
    let flows = c.get("/1/fences").await.1;
    assert_eq!(
        flows,
        serde_json::json!([]),
        "the storage Lease vetoes: {flows:#}"
    );
    // The storage agent stops too.
    storage.store(false, std::sync::atomic::Ordering::SeqCst);
    renewer.await.unwrap();
    let f = c
        .wait_flow("the release", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    let witnesses: Vec<&str> = f["witnesses"]["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["watcher"].as_str().unwrap())
        .collect();
    assert!(witnesses.contains(&"lease:kubelet"), "{f:#}");
    let storage_witness = format!("lease:storage/{victim}-storage");
    assert!(witnesses.contains(&storage_witness.as_str()), "{f:#}");
    assert_eq!(witnesses.len(), 5, "three peers and two Leases: {f:#}");
    cp.kubectl(&["delete", "namespace", "storage", "--wait=false"]);
    remove_nodes(cp, &mut c, &nodes);
}

/// A self-fencing node (no BMC) dies: collector hung, kubelet stopped. It is cordoned and
/// tainted `maintd.io/offline` first, its watchdog (the stand-in) resets it, and only after that
/// and its safe time is it released (out-of-service). Back healthy, the mark and the release go.
async fn a_self_fencing_node_is_cordoned_reset_and_only_then_released(cp: &ControlPlane) {
    use common::watchdog::{Fate, next_fate, start_watched};
    let (mut c, nodes) = managed_cluster(cp, "s").await;
    let victim = nodes[0].clone();
    c.extra_collector_toml =
        "[collector.heartbeat]\ninterval = \"200ms\"\nlost-after = \"1s\"\n".into();
    c.extra_daemon_toml = format!(
        "[fencing]\ngrace = \"1s\"\nliveness-interval = \"200ms\"\nliveness-timeout = \"1s\"\nstorm-percent = 50\nself-fence-margin = \"1s\"\ncheck-interval = \"0s\"\n[fencing.nodes.{victim}]\nself-fence = true\n[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n"
    );
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
    c.start_kube_daemon();
    c.wait_api().await;
    for i in 1..4 {
        c.start_collector_with(i, "scripted", "cluster.key");
    }
    let fast = "feed-interval = \"500ms\"\nisolation-timeout = \"2s\"\n";
    let three = Duration::from_secs(3);
    let w = start_watched(&mut c, 0, three, fast, &[], 0);
    wait_for("the peers to hear the victim", || async {
        let n = c.node(&victim).await;
        (n["witnesses"]["heard-by"].as_array().map(Vec::len) == Some(3)).then_some(())
    })
    .await;
    let pgid = *w.pgid.get().unwrap();
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pgid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    cp.heartbeats.alive(&victim, false);
    let reset = next_fate(w.fate, Duration::from_secs(60)).await;
    let Ok(Fate::Reset(reset_at)) = reset else {
        panic!("the watchdog did not fire: {reset:?}")
    };
    let f = c
        .wait_flow("the release", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    common::watchdog::assert_released_after_reset(&f, reset_at);
    assert_eq!(f["marked"], true);
    let cordoned = |cp: &ControlPlane| {
        cp.kubectl_ok(&[
            "get",
            "node",
            &victim,
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
    };
    assert_eq!(cordoned(cp), "true");
    let t = taints(cp, &victim);
    assert!(
        t.contains("maintd.io/offline") && t.contains("NoSchedule"),
        "{t}"
    );
    assert!(t.contains("out-of-service"), "{t}");
    // Rebooted: a collector again, heartbeats again.
    c.reboot(0);
    let _back = start_watched(&mut c, 0, three, fast, &[], 1);
    cp.heartbeats.alive(&victim, true);
    wait_recovered(cp, &c, &victim).await;
    cp.wait_for("the mark to go", |cp| {
        !taints(cp, &victim).contains("maintd.io/offline") && cordoned(cp) != "true"
    })
    .await;
    remove_nodes(cp, &mut c, &nodes);
}

/// The kubelet dies but the collector keeps answering: the `Ready=Unknown` rule fences the node.
/// While its kubelet stays down, Ready stays Unknown and nothing recovers, un-taints or fences it
/// again (no power-cycle loop); once its heartbeats resume (Ready=True), it recovers.
async fn a_condition_fence_does_not_recover_while_ready_is_unknown(cp: &ControlPlane) {
    let (mut c, nodes) = managed_cluster(cp, "k").await;
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n[[kubernetes.conditions]]\ntype = \"Ready\"\nstatus = \"Unknown\"\nfor = \"1s\"\nactions = [\"fence\"]\n",
        // A short cooldown: a flow that ended would be followed by a new one within the wait.
        c.stub_fencing("fence_ok", POWER_AGENT, "2s", &refs)
            .replacen("[fencing]\n", "[fencing]\ncooldown = \"2s\"\n", 1)
    );
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    let victim = nodes[0].clone();
    cp.heartbeats.alive(&victim, false);
    let f = c
        .wait_flow("the condition fence's release", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    assert!(
        f["witnesses"]["condition"]
            .as_str()
            .unwrap()
            .starts_with("Ready=Unknown"),
        "{f:#}"
    );
    assert!(taints(cp, &victim).contains("out-of-service"));
    // Powered on, the node boots (a new boot id, healthy reports) but its kubelet stays down:
    // for several cooldowns the flow waits in recovery and keeps the taint; no second flow
    // starts, and nothing powers it off again.
    c.wait_flow("the power-on", |f| {
        f["node"] == victim.as_str() && f["powered-on-at"].is_i64()
    })
    .await;
    c.kill_collector(0);
    c.start_collector_with(0, "scripted", "cluster.key");
    c.wait_flow("the new boot seen", |f| {
        f["node"] == victim.as_str() && f["returned-boot"].is_string()
    })
    .await;
    // Time for the return to be decided, had it been allowed.
    c.some_polls(20).await;
    let f = one_open_flow(&c, &victim).await;
    assert!(
        f["returned-boot"].is_string(),
        "the new boot is seen: {f:#}"
    );
    assert!(f["returned-at"].is_null(), "{f:#}");
    assert!(taints(cp, &victim).contains("out-of-service"));
    let offs = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["action"] == "off")
        .count();
    assert_eq!(offs, 1, "powered off once: {f:#}");
    // The kubelet is back: Ready=True and its Lease renewed, recovery, the taint goes.
    cp.heartbeats.alive(&victim, true);
    wait_recovered(cp, &c, &victim).await;
    remove_nodes(cp, &mut c, &nodes);
}

/// Four nodes; the one running a StatefulSet pod dies (heartbeats and collector stop). maintd
/// powers it off, taints it out-of-service and force-deletes the pod: the StatefulSet's
/// replacement, tracked by UID through a watch, must never be deleted by anyone.
async fn a_fence_release_never_deletes_the_replacement_pod(cp: &ControlPlane) {
    use futures::StreamExt;
    use kube::api::WatchEvent;
    let mut c = Cluster::new(4);
    let nodes: Vec<String> = c.nodes.clone();
    cp.add_managed_nodes(&c, &nodes).await;
    stub_fenced_admin_daemon(cp, &mut c, &nodes);
    c.start_collectors();
    let pods = cp.statefulset("race");
    let first = k8s::running_pod(&pods, "db-0").await;
    let victim = first.spec.as_ref().unwrap().node_name.clone().unwrap();
    let old_uid = first.metadata.uid.clone().unwrap();
    let mut stream = k8s::watch_pods(&pods).await;
    c.start_kube_daemon();
    c.wait_api().await;
    wait_for("node reachability", || async {
        (c.node(&victim).await["reachable"] == true).then_some(())
    })
    .await;
    // The node dies.
    cp.heartbeats.alive(&victim, false);
    let i = nodes.iter().position(|n| *n == victim).unwrap();
    c.kill_collector(i);
    let flow = c
        .wait_flow("the release", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    assert!(
        flow["fenced-at"].as_i64() <= flow["released-at"].as_i64(),
        "{flow:#}"
    );
    // Follow the pods until the replacement has run on another node for a while.
    let mut replacement: Option<String> = None;
    let mut deleted = Vec::new();
    let mut since_running: Option<std::time::Instant> = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while since_running.is_none_or(|t| t.elapsed() < Duration::from_secs(8)) {
        assert!(
            std::time::Instant::now() < deadline,
            "no replacement ran; deleted: {deleted:?}"
        );
        let ev = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        let Ok(Some(Ok(ev))) = ev else { continue };
        let (pod, gone) = match ev {
            WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
            WatchEvent::Deleted(p) => (p, true),
            _ => continue,
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid != old_uid && replacement.is_none() {
            replacement = Some(uid.clone());
        }
        if gone || pod.metadata.deletion_timestamp.is_some() {
            deleted.push(uid.clone());
            if Some(&uid) == replacement.as_ref() {
                break;
            }
        }
        if Some(&uid) == replacement.as_ref() && k8s::pod_running(&pod) && since_running.is_none() {
            let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
            assert_ne!(node, victim, "the replacement must run elsewhere");
            since_running = Some(std::time::Instant::now());
        }
    }
    let replacement = replacement.unwrap();
    assert!(
        !deleted.contains(&replacement),
        "the replacement pod {replacement} was deleted; deletions: {deleted:?}\ncontroller-manager log tail:\n{}",
        std::fs::read_to_string(cp.dir.path().join("controller-manager.log"))
            .unwrap_or_default()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(deleted.contains(&old_uid), "{deleted:?}");
    c.kill_daemon();
    for n in &nodes {
        cp.heartbeats.alive(n, false);
    }
    cp.kubectl(&["delete", "namespace", "race", "--wait=false"]);
    for n in &nodes {
        cp.kubectl(&["delete", "node", n, "--wait=false"]);
    }
}

/// The daemon runs with the deploy/ ServiceAccount's token (not as admin): its Events about a
/// node land in `default`, carry the node's uid, and `kubectl describe node` lists them.
async fn events_show_in_kubectl_describe_node_under_the_deploy_rbac(cp: &ControlPlane) {
    let mut c = Cluster::new(1);
    cp.add_node(
        "node1",
        json!({"maintd.io/managed": "true"}),
        json!({"maintd.io/collector": format!("127.0.0.1:{}", c.ports[0])}),
    )
    .await;
    c.inventory_nodes = false;
    // Leader election as shipped: the Lease and the state ConfigMap in `maintd`, watched by
    // name, which the Role allows only through its resourceNames.
    c.extra_daemon_toml = "[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\noperator-tokens = true\n[kubernetes.leader-election]\nnamespace = \"maintd\"\n".into();
    as_maintd(cp, &mut c);
    c.set_verdict("node1", r#"{"status":"live-repair","command":"fix"}"#);
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    c.wait_status("node1", "completed").await;
    cp.wait_for("maintd's Events in kubectl describe node", |cp| {
        let d = cp.kubectl_ok(&["describe", "node", "node1"]);
        d.contains("MaintdEventNoted") && d.contains("MaintdRepairReady")
    })
    .await;
    let log = c.daemon_log();
    assert!(!log.contains("cannot record a Kubernetes Event"), "{log}");
    assert!(log.contains("became the leader"), "{log}");
    // Every watch (nodes, pods, PDBs, the Lease, the state ConfigMap) is allowed and running.
    assert!(!log.contains("watch broken"), "{log}");

    // Operators' bearer tokens, judged by the API server under the deploy RBAC: a
    // ServiceAccount bound to maintd-operator pauses; one without the verb gets 403; a token the
    // API server never issued gets 401. The audit trail names the ServiceAccount.
    for sa in ["alice", "mallory"] {
        cp.kubectl_ok(&["-n", "maintd", "create", "serviceaccount", sa]);
    }
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "maintd-alice",
        "--clusterrole=maintd-operator",
        "--serviceaccount=maintd:alice",
    ]);
    let token = |sa: &str| {
        cp.kubectl_ok(&["create", "token", sa, "-n", "maintd"])
            .trim()
            .to_string()
    };
    let send = |path: &'static str, token: String| {
        let req = c
            .client
            .post(format!("{}{path}", c.url()))
            .bearer_auth(token);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        send("/1/fencing/pause?reason=k8s", token("alice")).await,
        200
    );
    assert_eq!(send("/1/fencing/pause", token("mallory")).await, 403);
    assert_eq!(send("/1/fencing/pause", "not-a-token".into()).await, 401);
    let (_, audit) = c.get("/1/audit").await;
    assert_eq!(
        audit[0]["operator"], "system:serviceaccount:maintd:alice",
        "{audit}"
    );
    assert_eq!(send("/1/fencing/resume", token("alice")).await, 200);
    let log = c.daemon_log();
    assert!(
        log.lines()
            .any(|l| l.contains("forbidden") && l.contains("system:serviceaccount:maintd:mallory")),
        "{log}"
    );
    cp.kubectl_ok(&["delete", "clusterrolebinding", "maintd-alice"]);
    for sa in ["alice", "mallory"] {
        cp.kubectl_ok(&["-n", "maintd", "delete", "serviceaccount", sa]);
    }
    c.kill_daemon();
    cp.heartbeats.alive("node1", false);
    cp.kubectl_ok(&["delete", "node", "node1"]);
}

/// A node hangs (heartbeats stop, its collector freezes) and is fenced by a device that reports
/// OFF but switches nothing. Its collector then wakes up still holding the report it diagnosed
/// before the power-off, while its next diagnose hangs: it answers, but that answer predates the
/// power-off and proves nothing, so the flow neither returns the node nor raises anything. Its
/// next diagnose, run after the verified off under the same boot, is the alarm: the node never
/// went down. It stays out of service, and the Node gets a `MaintdFenceAlarm` Event.
async fn a_stale_answer_never_returns_a_fenced_node_and_its_old_boot_is_an_alarm(
    cp: &ControlPlane,
) {
    let (mut c, nodes) = managed_cluster(cp, "s").await;
    stub_fenced_admin_daemon(cp, &mut c, &nodes);
    // The diagnose hangs while a hold file exists; a long diagnose timeout keeps it hanging
    // (rather than failing) for the whole check.
    write_exec(
        &c.path("diagnose.d/scripted"),
        &format!(
            "while [ -e {root}/hold-$NODE ]; do sleep 0.1; done; cat {root}/verdict-$NODE.json",
            root = c.dir.path().display()
        ),
    );
    for (i, n) in nodes.iter().enumerate() {
        let cfg = c.collector_config(i, "scripted", "cluster.key");
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("diagnose-timeout = \"1s\"", "diagnose-timeout = \"60s\"");
        std::fs::write(&cfg, text).unwrap();
        c.collectors[i] = Some(c.spawn(
            &format!("collector-{n}"),
            &["--config", cfg.to_str().unwrap(), "collector"],
        ));
    }
    c.wait_collectors_ready().await;
    c.start_kube_daemon();
    c.wait_api().await;
    let victim = nodes[0].clone();
    wait_for("the victim reachable", || async {
        (c.node(&victim).await["reachable"] == true).then_some(())
    })
    .await;
    std::fs::write(c.path(&format!("agents/lie-{victim}")), "").unwrap();
    let (pid, f) = freeze_until_released(cp, &c, 0).await;
    assert_eq!(f["witnesses"]["collector"], true, "{f:#}");
    assert!(f["witnesses"]["condition"].is_null(), "{f:#}");
    assert!(taints(cp, &victim).contains("out-of-service"));
    // It wakes with its pre-power-off report while its next diagnose hangs.
    std::fs::write(c.path(&format!("hold-{victim}")), "").unwrap();
    kill(pid, Signal::SIGCONT).unwrap();
    cp.heartbeats.alive(&victim, true);
    let n = wait_for("the stale collector answering", || async {
        let n = c.node(&victim).await;
        (n["reachable"] == true).then_some(n)
    })
    .await;
    assert!(n["diagnose-error"].is_null(), "{n:#}");
    c.some_polls(20).await;
    let f = one_open_flow(&c, &victim).await;
    assert!(f["alarm"].is_null() && f["returned-at"].is_null(), "{f:#}");
    assert!(taints(cp, &victim).contains("out-of-service"));
    // A diagnose that ran after the power-off, under the boot from before it: the alarm.
    std::fs::remove_file(c.path(&format!("hold-{victim}"))).unwrap();
    let f = c
        .wait_flow("the alarm", |f| {
            f["node"] == victim.as_str() && f["alarm"].is_string()
        })
        .await;
    assert_eq!(f["status"], "error", "{f:#}");
    cp.wait_for("the alarm's Node Event", |cp| {
        cp.kubectl_ok(&["describe", "node", &victim])
            .contains("MaintdFenceAlarm")
    })
    .await;
    c.some_polls(10).await;
    assert!(
        taints(cp, &victim).contains("out-of-service"),
        "it stays out"
    );
    let metrics = c.metrics().await;
    assert!(
        metrics.contains(&format!("maintd_fence_alarms_total{{node=\"{victim}\"}} 1")),
        "{metrics}"
    );
    // The operator checks the device and acknowledges the alarm: the node answers and reports
    // healthy, so it returns to service, its taints and cordon cleared.
    let id = f["id"].as_str().unwrap();
    let out = c.cli(&["fences", "ack", id, "--reason", "BMC rewired"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("acknowledged by cluster-key (BMC rewired)") && said.contains("left: "),
        "{said}"
    );
    c.wait_flow("the acknowledged return", |f| {
        f["id"] == id && f["status"] == "final"
    })
    .await;
    let state = |cp: &ControlPlane| {
        format!(
            "taints {} unschedulable {:?}",
            taints(cp, &victim),
            cp.kubectl_ok(&[
                "get",
                "node",
                &victim,
                "-o",
                "jsonpath={.spec.unschedulable}"
            ])
        )
    };
    wait_for("the node back in service", || async {
        let now = state(cp);
        (!now.contains("out-of-service") && !now.contains("maintd.io") && !now.contains("true"))
            .then_some(())
    })
    .await;
    let (_, nf) = c.get(&format!("/1/fences/{id}")).await;
    assert_eq!(nf["acknowledged"], "cluster-key (BMC rewired)", "{nf:#}");
    // A flow no longer in error has nothing to acknowledge.
    let again = c.cli(&["fences", "ack", id]);
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .contains("acknowledged by cluster-key (BMC rewired)"),
        "{again:?}"
    );
    remove_nodes(cp, &mut c, &nodes);
}

/// Drains on the real apiserver, under the deploy/ RBAC. A pod whose shutdown takes 2 s is
/// evicted once, not again while it terminates (the audit log counts maintd's evictions), and the
/// job counts pods, not calls. A drain that misses its deadline fails, says the node stays
/// cordoned, and it does stay cordoned after its repairfailed label is removed (as after a
/// failed `kubectl drain`).
async fn drains_evict_each_pod_once_and_a_failed_drain_leaves_the_node_cordoned(cp: &ControlPlane) {
    let (mut c, nodes) = managed_cluster(cp, "d").await;
    c.extra_daemon_toml = "[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\ndrain-deadline = \"8s\"\n[kubernetes.leader-election]\nnamespace = \"maintd\"\n".into();
    as_maintd(cp, &mut c);
    cp.kubectl_ok(&["create", "namespace", "drain"]);
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cp.client.clone(), "drain");
    for (name, node, exit_after, grace) in [
        ("slow", &nodes[0], 2, 30),
        ("fast", &nodes[0], 0, 30),
        ("stuck", &nodes[1], 60, 60),
    ] {
        let p = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {k8s::EXIT_AFTER: exit_after.to_string()}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace,
                "containers": [{"name": "c", "image": "c:1",
                    "resources": {"requests": {"cpu": "100m"}}}]}}))
        .unwrap();
        pods.create(&Default::default(), &p).await.unwrap();
        k8s::running_pod(&pods, name).await;
    }
    start_all(&mut c).await;
    let since = maintd::report::now_ns();
    c.set_verdict(&nodes[0], r#"{"status":"evacuate"}"#);
    let e = c
        .wait_event(&nodes[0], "the drain to complete", |e| {
            e["repair-status"] == "completed"
        })
        .await;
    let drain = e["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["kind"] == "evacuate")
        .unwrap_or_else(|| panic!("{e:#}"));
    assert_eq!(
        drain["detail"],
        format!("{} drained (2 pods)", nodes[0]),
        "{e:#}"
    );
    let evictions = |name: &str| {
        cp.audited(since)
            .iter()
            .filter(|v| {
                v["user"]["username"] == SA_USER
                    && v["verb"] == "create"
                    && v["objectRef"]["subresource"] == "eviction"
                    && v["objectRef"]["name"] == name
            })
            .count()
    };
    assert_eq!(evictions("slow"), 1, "a terminating pod was evicted again");
    assert_eq!(evictions("fast"), 1);
    // The stuck pod outlasts the deadline: the drain fails and says the node stays cordoned.
    c.set_verdict(&nodes[1], r#"{"status":"evacuate"}"#);
    let e = c
        .wait_event(&nodes[1], "the drain to fail", |e| {
            e["repair-status"] == "failed"
        })
        .await;
    let detail = e["jobs"][0]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("drain/stuck") && detail.contains("stays cordoned"),
        "{e:#}"
    );
    assert_eq!(evictions("stuck"), 1, "{e:#}");
    let unschedulable =
        |n: &str| cp.kubectl_ok(&["get", "node", n, "-o", "jsonpath={.spec.unschedulable}"]);
    assert_eq!(unschedulable(&nodes[1]), "true");
    // The operator acknowledges the failure by removing its label: the event goes, the cordon
    // stays until they uncordon the node themselves.
    let label = maintd::cluster::kube::tag_to_label(e["tag"].as_str().unwrap()).unwrap();
    c.set_verdict(&nodes[1], r#"{"status":"Ok"}"#);
    cp.kubectl_ok(&["label", "node", &nodes[1], &format!("{label}-")]);
    let id = e["id"].clone();
    wait_for("the failed event to be forgotten", || async {
        (!c.status().await.iter().any(|e| e["id"] == id)).then_some(())
    })
    .await;
    assert_eq!(unschedulable(&nodes[1]), "true");
    cp.kubectl_ok(&["delete", "namespace", "drain", "--wait=false"]);
    remove_nodes(cp, &mut c, &nodes);
}

/// Fencing configured only by ConfigMaps, created after the daemon started: the node becomes
/// fenceable (its readiness check runs the real fence_ipmilan against ipmi_sim) and is fenced
/// with it, its password read from a Secret. Its template says `executor=job`: every call runs
/// as a Job on another node; the first power-off lands on a node that cannot reach the BMC and
/// fails, and the retry runs elsewhere. A ConfigMap with an inline password leaves its node
/// inactive, with the ConfigMap and the key named in the readiness, the log and an Event on the
/// ConfigMap, and the password nowhere. All under deploy/'s RBAC.
async fn configmaps_configure_fencing_at_run_time_with_secrets_only_from_secrets(
    cp: &ControlPlane,
) {
    if !common::sims::available() {
        return;
    }
    let (mut c, nodes) = managed_cluster(cp, "cm").await;
    let ipmi = common::sims::Ipmi::start(c.dir.path(), "cm0");
    c.extra_daemon_toml = "[fencing]\nagent-image = \"localhost/fence-agents:test\"\ngrace = \"2s\"\nliveness-interval = \"200ms\"\nliveness-timeout = \"1s\"\nstorm-percent = 50\ncheck-interval = \"1h\"\n[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\nnamespace = \"maintd\"\n".into();
    as_maintd(cp, &mut c);
    start_all(&mut c).await;
    let (victim, bad) = (nodes[0].clone(), nodes[1].clone());
    let file = c.path("fence-configmaps.yaml");
    let cm = |name: &str, key: &str, body: &str| {
        let body: String = body.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: maintd\ndata:\n  {key}: |\n{body}"
        )
    };
    let yaml = [
        "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: bmc\n  namespace: maintd\nstringData:\n  password: s3cret\n".to_string(),
        cm(
            "fence-method-template-ipmi",
            "template.properties",
            &format!("agent_name=fence_ipmilan\nexecutor=job\nip=127.0.0.1\nipport={}\nusername={}\nlanplus=1\ncipher=3\npower_wait=0\npassword_secret=bmc/password\n", ipmi.port, ipmi.user),
        ),
        cm(&format!("fence-method-ipmi-off-{victim}"), "method.properties", "template=ipmi\n"),
        cm(&format!("fence-config-{victim}"), "config.properties", &format!("node_name={victim}\npower_management=ipmi-off\n")),
        cm(
            "fence-method-template-leaky",
            "template.properties",
            "agent_name=fence_ipmilan\nip=127.0.0.1\npassword=hunter2-inline\n",
        ),
        cm(&format!("fence-method-leaky-{bad}"), "method.properties", "template=leaky\n"),
        cm(&format!("fence-config-{bad}"), "config.properties", &format!("node_name={bad}\npower_management=leaky\n")),
    ]
    .concat();
    std::fs::write(&file, yaml).unwrap();
    cp.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    // Within seconds, without a restart: the victim's BMC answers its check; the leaky one is
    // refused, saying where and why.
    let r = wait_for("readiness from the ConfigMaps", || async {
        let (_, r) = c.get("/1/fences/readiness").await;
        (r[&victim]["state"] == "active" && r[&bad]["state"] == "inactive").then_some(r)
    })
    .await;
    let why = r[&bad]["detail"].as_str().unwrap();
    assert!(
        why.contains("fence-method-template-leaky") && why.contains("password is given inline"),
        "{why}"
    );
    cp.wait_for("the Event on the refused ConfigMap", |cp| {
        cp.kubectl_ok(&[
            "get",
            "events",
            "-n",
            "maintd",
            "--field-selector",
            "involvedObject.name=fence-method-template-leaky",
            "-o",
            "json",
        ])
        .contains("MaintdFenceConfigRefused")
    })
    .await;
    // The readiness check ran as a Job, away from the victim.
    let checked = r[&victim]["methods"][0].clone();
    assert_eq!(checked["ok"], true, "{r:#}");
    // Only the node that cannot reach the BMC takes Jobs now: the first power-off fails there.
    let (cut_off, busy) = (nodes[3].clone(), [nodes[1].clone(), nodes[2].clone()]);
    cp.kubectl_ok(&[
        "label",
        "node",
        &cut_off,
        &format!("{}=true", common::jobpods::NO_BMC_NETWORK),
    ]);
    for n in &busy {
        cp.kubectl_ok(&["taint", "node", n, "maintd-test/busy=true:NoSchedule"]);
    }
    // The victim dies and is fenced by the real agent, in Jobs. Once the first call has failed
    // on the cut-off node, the other nodes take Jobs again, and the retry goes to one of them.
    let untaint = async {
        c.wait_flow("a call that failed on the cut-off node", |f| {
            f["node"] == victim.as_str()
                && f["calls"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|x| x["ok"] == false && x["host"] == cut_off.as_str())
                })
        })
        .await;
        for n in &busy {
            cp.kubectl_ok(&["taint", "node", n, "maintd-test/busy-"]);
        }
    };
    let ((pid, f), ()) = tokio::join!(freeze_until_released(cp, &c, 0), untaint);
    assert!(!ipmi.powered_on(), "the BMC powered the node off");
    // The power-on's call may be on record by now, pending: only answered calls count here.
    let hosts: Vec<(&str, bool, &str)> = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pending"] != true)
        .map(|c| {
            (
                c["action"].as_str().unwrap(),
                c["ok"].as_bool().unwrap(),
                c["host"].as_str().unwrap_or("the daemon"),
            )
        })
        .collect();
    assert_eq!(hosts[0], ("off", false, cut_off.as_str()), "{f:#}");
    for (_, ok, host) in &hosts[1..] {
        assert!(
            *ok && busy.iter().any(|b| b == host),
            "retried elsewhere: {hosts:?}"
        );
    }
    // The power-off's calls (the power-on after the release may have begun by now: it follows
    // the release within a fraction of a second).
    let jobs = cp.kubectl_ok(&[
        "get",
        "jobs",
        "-n",
        "maintd",
        "-l",
        &format!(
            "maintd.io/flow={},maintd.io/action in (off,status)",
            f["id"].as_str().unwrap()
        ),
        "-o",
        "name",
    ]);
    assert_eq!(
        jobs.lines().count(),
        hosts.len(),
        "one Job per call: {jobs}"
    );
    // Their Secrets are gone once each call ended (the power-on's too, once it has).
    cp.wait_for("the calls' Secrets gone", |cp| {
        cp.kubectl_ok(&[
            "get",
            "secrets",
            "-n",
            "maintd",
            "-l",
            "app.kubernetes.io/managed-by=maintd",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    })
    .await;
    let calls: Vec<(&str, &str)> = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["agent"].as_str().unwrap(), c["action"].as_str().unwrap()))
        .collect();
    assert!(
        calls.contains(&("fence_ipmilan", "off")) && calls.contains(&("fence_ipmilan", "status")),
        "{f:#}"
    );
    // Neither password anywhere an operator or an attacker reads.
    let events = cp.kubectl_ok(&["get", "events", "-A", "-o", "json"]);
    let fences = cp.kubectl_ok(&["get", "nodefences", "-o", "json"]);
    let jobs = cp.kubectl_ok(&["get", "jobs,pods", "-n", "maintd", "-o", "json"]);
    let (_, api) = c.get("/1/fences").await;
    for (what, text) in [
        ("the log", c.daemon_log()),
        ("the Events", events),
        ("the NodeFences", fences),
        ("the Jobs and pods", jobs),
        ("the API", api.to_string()),
    ] {
        assert!(
            !text.contains("hunter2-inline") && !text.contains("s3cret"),
            "a password in {what}"
        );
    }
    kill(pid, Signal::SIGCONT).unwrap();
    cp.kubectl(&["delete", "-f", file.to_str().unwrap(), "--wait=false"]);
    delete_jobs(cp, "fence-agent");
    remove_nodes(cp, &mut c, &nodes);
}

/// kdump on the real control plane, with the real `fence_kdump_send`: the other nodes' collectors
/// listen on 127.0.0.2, .4 and .5 (their annotated addresses), so the victim alone has 127.0.0.1,
/// where its crash kernel's datagrams come from on this host; it dies (collector and kubelet), and its power-off waits for the kdump window. First a
/// notification within the window: released (out-of-service taint) with no agent call at all.
/// Then, back and dead again with no notification: the power-off follows the window.
async fn kdump_holds_the_power_off_for_its_window_and_a_notification_releases_with_none(
    cp: &ControlPlane,
) {
    const SEND: &str = "/usr/libexec/fence-agents/fence_kdump_send";
    if !std::path::Path::new(SEND).exists() {
        eprintln!("skipped the kdump scenario: fence_kdump_send missing");
        return;
    }
    let mut c = Cluster::new(4);
    for (i, ip) in [(1, "127.0.0.2"), (2, "127.0.0.4"), (3, "127.0.0.5")] {
        c.node_hosts[i] = ip.into();
    }
    let nodes: Vec<String> = c.nodes.iter().map(|n| format!("k{n}")).collect();
    cp.add_managed_nodes(&c, &nodes).await;
    c.nodes = nodes.clone();
    for n in &nodes {
        c.set_verdict(n, r#"{"status":"Ok"}"#);
    }
    c.inventory_nodes = false;
    let victim = nodes[0].clone();
    let calls = c.path("agent-calls");
    let port = free_port();
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let agent = format!(
        "opts=$(cat); echo \"$opts\" | grep -q '^action=status' && exit 2; echo call >> {}; exit 0",
        calls.display()
    );
    let fencing = c.stub_fencing("fence_counted", &agent, "2s", &refs).replacen(
        "[fencing]\n",
        &format!("[fencing]\ncooldown = \"1s\"\nkdump-listen = \"0.0.0.0:{port}\"\nkdump-timeout = \"1h\"\nkdump-window = \"1h\"\ncheck-interval = \"0s\"\n"),
        1,
    );
    let toml = |fencing: &str| {
        format!(
            "{fencing}[fencing.nodes.{victim}]\nkdump = true\n[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n"
        )
    };
    c.extra_daemon_toml = toml(&fencing);
    c.env
        .push(("KUBECONFIG".into(), cp.kubeconfig.display().to_string()));
    c.start_collectors();
    c.start_kube_daemon();
    c.wait_api().await;
    heard_by_its_peers(&c, &victim).await;
    let agent_calls = || {
        std::fs::read_to_string(&calls)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    // Dies; waits for the window.
    c.kill_collector(0);
    cp.heartbeats.alive(&victim, false);
    c.wait_flow("the flow waiting for a kdump notification", |f| {
        f["node"] == victim.as_str() && has_note(f, "waits for a kdump notification")
    })
    .await;
    let out = std::process::Command::new(SEND)
        .args(["-p", &port.to_string(), "-c", "3", "-i", "1", "127.0.0.1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let f = c
        .wait_flow("the release after the notification", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    assert!(taints(cp, &victim).contains("out-of-service"), "{f:#}");
    assert_eq!(f["fenced"], false, "{f:#}");
    c.some_polls(10).await;
    assert_eq!(agent_calls(), 0, "no power-off at all: {f:#}");
    let first = f["id"].as_str().unwrap().to_string();
    // Back after its dump (a new boot), then dead again, silent: the power-off follows a
    // window of 4 s.
    c.kill_daemon();
    c.extra_daemon_toml = toml(&fencing.replace("kdump-window = \"1h\"", "kdump-window = \"4s\""));
    c.start_kube_daemon();
    c.wait_api().await;
    boot_again(cp, &mut c, 0);
    c.wait_flow("recovery", |f| {
        f["id"] == first.as_str() && f["status"] == "final"
    })
    .await;
    wait_for("the peers to hear the victim again", || async {
        let w = c.node(&victim).await["witnesses"].clone();
        (w["heard-by"].as_array().map(Vec::len) == Some(3)).then_some(())
    })
    .await;
    c.some_polls(15).await;
    c.kill_collector(0);
    cp.heartbeats.alive(&victim, false);
    let f = c
        .wait_flow("the power-off after the window", |f| {
            f["node"] == victim.as_str() && f["id"] != first.as_str() && f["released"] == true
        })
        .await;
    let detected = f["detected"].as_i64().unwrap();
    let first_call = f["calls"][0]["at"].as_i64().unwrap();
    assert!(
        first_call - detected >= 4_000_000_000,
        "the power-off {:.1} s after the silence: {f:#}",
        (first_call - detected) as f64 / 1e9
    );
    assert_eq!(f["fenced"], true, "{f:#}");
    assert!(agent_calls() > 0);
    remove_nodes(cp, &mut c, &nodes);
}
