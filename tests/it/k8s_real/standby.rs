//! A standby reads no fence Secret, under deploy/'s RBAC (the audit log counts what maintd's
//! ServiceAccount sends): while another replica holds the election Lease, the daemon follows the
//! fence ConfigMaps but reads none of the Secrets they name, and a refused ConfigMap shows in
//! its readiness, summary and metric at once (as after a restart, before it leads). Once it
//! leads it reads the Secrets first, and only then checks the node's fencing with them.

use super::*;

/// Secret reads by maintd's ServiceAccount since `since`.
fn secret_reads(cp: &ControlPlane, since: i64) -> usize {
    cp.audited(since)
        .iter()
        .filter(|v| {
            v["user"]["username"] == SA_USER
                && v["objectRef"]["resource"] == "secrets"
                && v["objectRef"]["name"] == "bmc-standby"
                && v["verb"] == "get"
        })
        .count()
}

pub async fn a_standby_reads_no_fence_secret_until_it_leads(cp: &ControlPlane) {
    let (mut c, nodes) = managed_cluster(cp, "sb").await;
    let node = nodes[0].clone();
    c.extra_daemon_toml = format!(
        "{}[kubernetes]\nlabel-selector = \"maintd.io/managed=true\"\nnode-interval = \"500ms\"\n[kubernetes.leader-election]\nnamespace = \"maintd\"\nlease-name = \"maintd\"\n",
        c.stub_fencing("fence_ok", POWER_AGENT, "2s", &[])
            .replace("[fencing]\n", "[fencing]\ncheck-interval = \"1h\"\n")
    );
    as_maintd(cp, &mut c);
    let file = c.path("standby.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bmc-standby\n  namespace: maintd\nstringData:\n  password: s3cret\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fence-config-{node}\n  namespace: maintd\ndata:\n  config.properties: |\n    power_management=stub-off\n  fence-method-stub-off: |\n    template=fence-method-template-stub-standby\n    port={node}\n  fence-method-template-stub-standby: |\n    agent_name=fence_ok\n    password_secret=bmc-standby/password\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fence-config-{leaky}\n  namespace: maintd\ndata:\n  config.properties: |\n    power_management=leaky\n  fence-method-leaky: |\n    template=fence-method-template-stub-standby\n    password=inline\n",
            leaky = nodes[1]
        ),
    )
    .unwrap();
    cp.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    // Another replica leads, renewing its Lease every second for the whole standby part.
    let lease = c.path("lease.json");
    let renew = |cp: &ControlPlane| {
        let now = serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ))
        .unwrap();
        std::fs::write(
            &lease,
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "maintd", "namespace": "maintd"},
                "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 15,
                    "acquireTime": now, "renewTime": now}})
            .to_string(),
        )
        .unwrap();
        cp.kubectl_ok(&["apply", "--force", "-f", lease.to_str().unwrap()]);
    };
    cp.kubectl(&["delete", "lease", "-n", "maintd", "maintd", "--wait=true"]);
    renew(cp);
    let standby = async {
        let since = maintd::report::now_ns();
        c.start_collectors();
        c.wait_collectors_ready().await;
        c.start_kube_daemon();
        c.wait_api().await;
        // The standby has read the maps (its readiness reports the refused one) but no Secret.
        wait_for("the standby to report the refused ConfigMap", || async {
            let (_, r) = c.get("/1/fences/readiness").await;
            (r[&nodes[1]]["state"] == "inactive").then_some(())
        })
        .await;
        // A restarted replica that does not lead yet shows the refusal everywhere at once: its
        // readiness, the summary and the metric.
        let (_, summary) = c.get("/1/fences/summary").await;
        assert!(
            summary["inactive"]
                .as_array()
                .is_some_and(|a| a.iter().any(|n| n == nodes[1].as_str())),
            "{summary:#}"
        );
        let metrics = c.metrics().await;
        assert!(
            metrics.contains(&format!("maintd_fencing_ready{{node=\"{}\"}} 0", nodes[1])),
            "{metrics}"
        );
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (_, leader) = c.get("/1/leader").await;
        assert_ne!(leader["leader"], true, "{leader:#}");
        assert_eq!(
            secret_reads(cp, since),
            0,
            "a standby read the fence Secret"
        );
        since
    };
    let other = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            renew(cp);
        }
    };
    let since = tokio::select! {
        s = standby => s,
        () = other => unreachable!(),
    };
    // The other replica is gone: this one leads, reads the Secret, and only then checks the
    // node's fencing (the stub agent answers its status).
    cp.kubectl_ok(&["delete", "lease", "-n", "maintd", "maintd"]);
    wait_for("the node's fencing checked by the new leader", || async {
        let (_, r) = c.get("/1/fences/readiness").await;
        (r[&node]["state"] == "active").then_some(())
    })
    .await;
    assert!(secret_reads(cp, since) >= 1, "the leader read the Secret");
    cp.kubectl(&["delete", "-f", file.to_str().unwrap(), "--wait=false"]);
    remove_nodes(cp, &mut c, &nodes);
}
