//! maintd against a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler v1.36.2 on loopback; tests/common/k8s.rs): what the in-process fake cannot
//! decide. One control plane for the whole binary (it takes seconds to start); the scenarios run
//! one after another in one test and clean up what they create.

mod common;

use std::time::Duration;

use common::k8s::{self, ControlPlane};
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_real_control_plane() {
    if !k8s::available() {
        return;
    }
    let cp = ControlPlane::start(Duration::from_secs(8)).await;
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
    events_show_in_kubectl_describe_node_under_the_deploy_rbac(&cp).await;
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
    c.extra_daemon_toml = "[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\n".into();
    c.env.push((
        "KUBECONFIG".into(),
        cp.service_account_kubeconfig("maintd", "maintd")
            .display()
            .to_string(),
    ));
    c.set_verdict("node1", r#"{"status":"live-repair","command":"fix"}"#);
    c.start_collectors();
    let cfg = c.daemon_config();
    c.daemon = Some(c.spawn(
        "daemon",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "daemon",
            "--cluster",
            "kubernetes",
        ],
    ));
    c.wait_api().await;
    c.wait_status("node1", "completed").await;
    cp.wait_for("maintd's Events in kubectl describe node", |cp| {
        let d = cp.kubectl_ok(&["describe", "node", "node1"]);
        d.contains("MaintdEventNoted") && d.contains("MaintdRepairReady")
    })
    .await;
    let log = c.daemon_log();
    assert!(!log.contains("cannot record a Kubernetes Event"), "{log}");
    c.kill_daemon();
    cp.heartbeats.alive("node1", false);
    cp.kubectl_ok(&["delete", "node", "node1"]);
}
