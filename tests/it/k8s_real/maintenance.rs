//! Maintenance on the real control plane, under deploy/'s RBAC: the hardware swap (a node
//! evacuated by its repair, then powered down by a technician), a node-maintenance operator's
//! NodeMaintenance, and another remediator's per-node Lease in `medik8s-leases` each keep a
//! silent node from being fenced: no flow, no agent call, no power-on. Once they end the node is
//! fenced in the normal way, holding its own Lease while it works on it and giving it back
//! once the node has returned.

use super::*;
use maintd::cluster::kube::medik8s::{self, NodeMaintenance};

/// A stand-in power agent that also logs every call (`<action> <node>`) to `agents/calls`.
fn logging_agent() -> String {
    format!(
        "in=$(cat)\nprintf '%s %s\\n' \"$(printf '%s\\n' \"$in\" | sed -n 's/^action=//p')\" \"$(printf '%s\\n' \"$in\" | sed -n 's/^port=//p')\" >> \"$(dirname \"$0\")/calls\"\nprintf '%s\\n' \"$in\" | {{\n{POWER_AGENT}\n}}"
    )
}

/// The power actions (`off`, `on`) the agent was asked for on `node`.
fn power_calls(c: &Cluster, node: &str) -> Vec<String> {
    std::fs::read_to_string(c.path("agents/calls"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&format!(" {node}")))
        .map(|l| l.split(' ').next().unwrap_or_default().to_string())
        .filter(|a| a == "off" || a == "on")
        .collect()
}

/// Nodes in maintenance as `/1/maintenance` lists them: (node, source, reason).
async fn in_maintenance(c: &Cluster) -> Vec<(String, String, String)> {
    let (_, all) = c.get("/1/maintenance").await;
    all.as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("node"), s("source"), s("reason"))
        })
        .collect()
}

/// For `secs`, none of `nodes` gets a fence flow or a power call.
async fn untouched(c: &Cluster, nodes: &[&str], secs: u64) {
    for _ in 0..secs * 4 {
        let flows = c.get("/1/fences").await.1;
        for n in nodes {
            assert!(
                !flows.as_array().unwrap().iter().any(|f| f["node"] == *n),
                "{n} got a fence flow: {flows:#}"
            );
            assert!(power_calls(c, n).is_empty(), "{n} was powered off or on");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The holder of `node`'s medik8s Lease and its owner's kind, if the Lease exists.
fn node_lease(cp: &ControlPlane, node: &str) -> Option<(String, String)> {
    let out = cp.kubectl(&[
        "get",
        "lease",
        "-n",
        medik8s::LEASE_NAMESPACE,
        &medik8s::lease_name(node),
        "-o",
        "jsonpath={.spec.holderIdentity} {.metadata.ownerReferences[0].kind}",
    ]);
    out.status.success().then(|| {
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        let (h, k) = s.split_once(' ').unwrap_or((&s, ""));
        (h.to_string(), k.to_string())
    })
}

fn apply_json(cp: &ControlPlane, c: &Cluster, name: &str, v: &serde_json::Value) {
    let path = c.path(name);
    std::fs::write(&path, v.to_string()).unwrap();
    cp.kubectl_ok(&["apply", "-f", path.to_str().unwrap()]);
}

pub async fn maintenance_by_repair_nodemaintenance_or_another_holder_holds_every_fence(
    cp: &ControlPlane,
) {
    use kube::CustomResourceExt;
    let (mut c, nodes) = managed_cluster(cp, "mt").await;
    // The node-maintenance operator's CRD (as maintd reads it), installed before the daemon.
    apply_json(
        cp,
        &c,
        "nm-crd.json",
        &serde_json::to_value(NodeMaintenance::crd()).unwrap(),
    );
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=established",
        "crd/nodemaintenances.nodemaintenance.medik8s.io",
    ]);
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nenabled = false\nnamespace = \"maintd\"\n",
        c.stub_fencing("fence_ok", &logging_agent(), "2s", &refs)
    );
    as_maintd(cp, &mut c);
    start_all(&mut c).await;
    for n in &nodes[..3] {
        heard_by_its_peers(&c, n).await;
    }

    // The hardware swap: node 0 is drained, cordoned and tagged by its repair, which waits for
    // its acknowledgement; the technician powers it down (collector and kubelet gone).
    c.set_verdict(&nodes[0], r#"{"status":"evacuate","details":"disk"}"#);
    c.wait_event(&nodes[0], "the evacuation to complete", |e| {
        e["repair-status"] == "completed"
    })
    .await;
    // A NodeMaintenance for node 1 (a firmware update), and node 1 goes silent too.
    apply_json(
        cp,
        &c,
        "nm.json",
        &json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": "nm-firmware"},
            "spec": {"nodeName": nodes[1], "reason": "firmware update"}}),
    );
    wait_for("both held", || async {
        (in_maintenance(&c).await.len() == 2).then_some(())
    })
    .await;
    let held = in_maintenance(&c).await;
    assert_eq!(held[0].1, "repair", "{held:?}");
    assert_eq!(held[1].1, "elsewhere", "{held:?}");
    assert!(
        held[1]
            .2
            .contains("NodeMaintenance nm-firmware (firmware update)"),
        "{held:?}"
    );
    let shown = c.node(&nodes[1]).await["maintenance"].clone();
    assert!(shown.to_string().contains("nm-firmware"), "{shown}");
    for (i, n) in nodes[..2].iter().enumerate() {
        c.kill_collector(i);
        cp.heartbeats.alive(n, false);
    }
    // Far past the 2 s grace: no flow, no agent call. Half the nodes are silent, yet neither
    // counts toward the storm threshold (50 %).
    untouched(&c, &refs[..2], 8).await;

    // The NodeMaintenance ends: node 1, still silent, is fenced in the normal way, holding its
    // medik8s Lease meanwhile.
    cp.kubectl_ok(&["delete", "nodemaintenance", "nm-firmware"]);
    let f = c
        .wait_flow("node 1's fence once its maintenance ended", |f| {
            f["node"] == nodes[1].as_str() && f["released"] == true
        })
        .await;
    assert_eq!(
        power_calls(&c, &nodes[1]).first().map(String::as_str),
        Some("off"),
        "{f:#}"
    );
    assert_eq!(
        node_lease(cp, &nodes[1]),
        Some((medik8s::HOLDER.to_string(), "Node".to_string()))
    );
    // Node 1 returns: its flow ends and its Lease is given back.
    boot_again(cp, &mut c, 1);
    wait_recovered(cp, &c, &nodes[1]).await;
    cp.wait_for("node 1's Lease given back", |cp| {
        node_lease(cp, &nodes[1]).is_none()
    })
    .await;

    // Another remediator holds node 2's Lease, and node 2 goes silent: untouched.
    let now = serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .unwrap();
    apply_json(
        cp,
        &c,
        "lease.json",
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": medik8s::lease_name(&nodes[2]), "namespace": medik8s::LEASE_NAMESPACE},
            "spec": {"holderIdentity": "node-healthcheck", "leaseDurationSeconds": 3600,
                "acquireTime": now, "renewTime": now}}),
    );
    wait_for("node 2 held", || async {
        let held = in_maintenance(&c).await;
        held.iter()
            .any(|(n, _, why)| *n == nodes[2] && why.contains("held by \"node-healthcheck\""))
            .then_some(())
    })
    .await;
    c.kill_collector(2);
    cp.heartbeats.alive(&nodes[2], false);
    untouched(&c, &refs[2..3], 6).await;
    // The other holder lets go: node 2 is fenced, and the Lease is maintd's.
    cp.kubectl_ok(&[
        "delete",
        "lease",
        "-n",
        medik8s::LEASE_NAMESPACE,
        &medik8s::lease_name(&nodes[2]),
    ]);
    c.wait_flow("node 2's fence once the other holder let go", |f| {
        f["node"] == nodes[2].as_str() && f["released"] == true
    })
    .await;
    assert_eq!(
        node_lease(cp, &nodes[2]).map(|(h, _)| h).as_deref(),
        Some(medik8s::HOLDER)
    );
    // Node 0's repair still waits for its acknowledgement: never touched, no Lease taken.
    untouched(&c, &refs[..1], 1).await;
    assert_eq!(node_lease(cp, &nodes[0]), None);
    remove_nodes(cp, &mut c, &nodes);
    cp.kubectl(&[
        "delete",
        "leases",
        "-n",
        medik8s::LEASE_NAMESPACE,
        "--all",
        "--wait=false",
    ]);
    cp.kubectl(&[
        "delete",
        "crd",
        "nodemaintenances.nodemaintenance.medik8s.io",
    ]);
}
