//! The manifests in deploy/ parse as the Kubernetes objects they claim to be, the config they
//! ship is a valid maintd config, and the RBAC grants exactly the verbs the code sends.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use serde::Deserialize;
use serde_json::Value;

fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("deploy/{file}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("deploy/{file}: {e}")))
        .collect()
}

fn of_kind<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> Vec<T> {
    docs(file)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_json::from_value(d).unwrap_or_else(|e| panic!("{file} {kind}: {e}")))
        .collect()
}

fn rules(rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    let names = r.resource_names.clone().unwrap_or_default().join(",");
                    out.insert(format!("{g}/{res}:{v}[{names}]"));
                }
            }
        }
    }
    out
}

#[test]
fn the_shipped_config_is_valid_and_enables_kubernetes() {
    let cm: Vec<ConfigMap> = of_kind("configmap.yaml", "ConfigMap");
    let text = &cm[0].data.as_ref().unwrap()["maintd.toml"];
    let cfg = maintd::config::Config::parse(text).unwrap();
    assert_eq!(cfg.cluster.backend, maintd::config::Backend::Kubernetes);
    assert!(cfg.kubernetes.leader_election.enabled);
    assert_eq!(cfg.kubernetes.max_disruptions, 1);
    assert_eq!(cfg.kubernetes.conditions.len(), 3);
    for r in &cfg.kubernetes.conditions {
        r.rule().unwrap();
    }
}

#[test]
fn rbac_grants_only_the_verbs_maintd_uses() {
    let cluster: Vec<ClusterRole> = of_kind("rbac.yaml", "ClusterRole");
    let got = rules(cluster[0].rules.as_deref().unwrap());
    let want: BTreeSet<String> = [
        "/nodes:get[]",
        "/nodes:list[]",
        "/nodes:watch[]",
        "/nodes:patch[]",
        "/pods:list[]",
        "/pods:watch[]",
        "/pods:delete[]",
        "/pods/eviction:create[]",
        "policy/poddisruptionbudgets:list[]",
        "policy/poddisruptionbudgets:watch[]",
        "maintd.io/nodefences:get[]",
        "maintd.io/nodefences:list[]",
        "maintd.io/nodefences:watch[]",
        "maintd.io/nodefences:create[]",
        "maintd.io/nodefences:patch[]",
        "maintd.io/nodefences:delete[]",
        "maintd.io/nodefences/status:update[]",
        "nodemaintenance.medik8s.io/nodemaintenances:list[]",
        "nodemaintenance.medik8s.io/nodemaintenances:watch[]",
        "authentication.k8s.io/tokenreviews:create[]",
        "authorization.k8s.io/subjectaccessreviews:create[]",
    ]
    .map(String::from)
    .into();
    assert_eq!(got, want);
    let operator = rules(cluster[1].rules.as_deref().unwrap());
    assert_eq!(
        operator,
        [
            "maintd.io/nodefences:get[]",
            "maintd.io/nodefences:operate[]"
        ]
        .map(String::from)
        .into()
    );
    let ns: Vec<Role> = of_kind("rbac.yaml", "Role");
    let got = rules(ns[0].rules.as_deref().unwrap());
    let want: BTreeSet<String> = [
        "coordination.k8s.io/leases:create[]",
        "coordination.k8s.io/leases:get[maintd]",
        "coordination.k8s.io/leases:list[maintd]",
        "coordination.k8s.io/leases:watch[maintd]",
        "coordination.k8s.io/leases:update[maintd]",
        "/configmaps:create[]",
        "/configmaps:get[]",
        "/configmaps:list[]",
        "/configmaps:watch[]",
        "/configmaps:update[maintd-state]",
        "/secrets:get[]",
        "/secrets:create[]",
        "/secrets:delete[]",
        "batch/jobs:create[]",
        "batch/jobs:get[]",
        "batch/jobs:list[]",
        "batch/jobs:watch[]",
        "batch/jobs:delete[]",
        "events.k8s.io/events:create[]",
        "events.k8s.io/events:patch[]",
    ]
    .map(String::from)
    .into();
    assert_eq!(got, want);
    // Node Events go where the apiserver accepts them, and the Role there allows exactly that.
    let events = ns
        .iter()
        .find(|r| r.metadata.namespace.as_deref() == Some("default"))
        .expect("a Role in default for Node Events");
    assert_eq!(
        rules(events.rules.as_deref().unwrap()),
        [
            "events.k8s.io/events:create[]".to_string(),
            "events.k8s.io/events:patch[]".to_string()
        ]
        .into()
    );
    // The kubelets' Leases are read, never written.
    let leases = ns
        .iter()
        .find(|r| r.metadata.namespace.as_deref() == Some("kube-node-lease"))
        .expect("a Role in kube-node-lease for the kubelet Leases");
    assert_eq!(
        rules(leases.rules.as_deref().unwrap()),
        [
            "coordination.k8s.io/leases:list[]".to_string(),
            "coordination.k8s.io/leases:watch[]".to_string()
        ]
        .into()
    );
    // The medik8s per-node Leases: read, and maintd's own taken, renewed and given back.
    let node_leases = ns
        .iter()
        .find(|r| {
            r.metadata.namespace.as_deref() == Some(maintd::cluster::kube::medik8s::LEASE_NAMESPACE)
        })
        .expect("a Role in medik8s-leases for the per-node Leases");
    assert_eq!(
        rules(node_leases.rules.as_deref().unwrap()),
        ["get", "list", "watch", "create", "update", "delete"]
            .map(|v| format!("coordination.k8s.io/leases:{v}[]"))
            .into()
    );
    // The names the Role allows are the ones the shipped config uses.
    let cm: Vec<ConfigMap> = of_kind("configmap.yaml", "ConfigMap");
    let cfg = maintd::config::Config::parse(&cm[0].data.as_ref().unwrap()["maintd.toml"]).unwrap();
    assert_eq!(cfg.kubernetes.leader_election.lease_name, "maintd");
    assert_eq!(
        cfg.kubernetes.leader_election.state_configmap,
        "maintd-state"
    );
    assert_eq!(cfg.kubernetes.events_namespace, "default");
}

#[test]
fn two_daemon_replicas_and_a_collector_per_node_with_host_script_dirs() {
    let d: Vec<Deployment> = of_kind("daemon.yaml", "Deployment");
    let spec = d[0].spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("maintd"));
    let env: Vec<&str> = pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"));
    let args = pod.containers[0].args.clone().unwrap();
    assert!(args.windows(2).any(|w| w == ["--cluster", "kubernetes"]));
    // It may run on the control plane: its taint tolerated, its nodes preferred.
    const CP: &str = "node-role.kubernetes.io/control-plane";
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some(CP) && t.effect.as_deref() == Some("NoSchedule")),
        "no control-plane toleration"
    );
    let prefers = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .flat_map(|p| p.preference.match_expressions.iter().flatten())
        .any(|e| e.key == CP && e.operator == "Exists");
    assert!(prefers, "control-plane nodes are not preferred");
    // The operators' keys go to the daemon only: a node's root cannot command fencing.
    let secrets = |pod: &k8s_openapi::api::core::v1::PodSpec| -> BTreeSet<String> {
        pod.volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect()
    };
    assert!(secrets(pod).contains("maintd-operators"));
    // So does the secret every node's key is derived from.
    assert!(secrets(pod).contains("maintd-node-keys"));
    let s: Vec<k8s_openapi::api::core::v1::Secret> = of_kind("node-keys.yaml", "Secret");
    assert_eq!(s[0].metadata.name.as_deref(), Some("maintd-node-keys"));
    // The API is reached through the Service: HTTPS, with its certificate from maintd-tls.
    assert!(secrets(pod).contains("maintd-tls"));
    let probe = pod.containers[0].liveness_probe.as_ref().unwrap();
    assert_eq!(
        probe.http_get.as_ref().unwrap().scheme.as_deref(),
        Some("HTTPS")
    );
    let cm: Vec<ConfigMap> = of_kind("configmap.yaml", "ConfigMap");
    let cfg = maintd::config::Config::parse(&cm[0].data.as_ref().unwrap()["maintd.toml"]).unwrap();
    assert_eq!(
        cfg.daemon.tls_cert_file.as_deref(),
        Some(std::path::Path::new("/etc/maintd/tls/tls.crt"))
    );
    let s: Vec<k8s_openapi::api::core::v1::Secret> = of_kind("tls.yaml", "Secret");
    assert_eq!(s[0].type_.as_deref(), Some("kubernetes.io/tls"));
    let s: Vec<k8s_openapi::api::core::v1::Secret> = of_kind("operators.yaml", "Secret");
    assert_eq!(s[0].metadata.name.as_deref(), Some("maintd-operators"));

    let ds: Vec<DaemonSet> = of_kind("collector.yaml", "DaemonSet");
    let pod = ds[0].spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.automount_service_account_token, Some(false));
    let host: BTreeSet<String> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
        .collect();
    assert!(host.contains("/etc/maintd/diagnose.d") && host.contains("/etc/maintd/repair.d"));
    // Each node's own key comes from its host, never from a Secret all nodes mount.
    assert!(host.contains("/etc/maintd/node"));
    let c = &pod.containers[0];
    assert!(c.env.iter().flatten().any(|e| e.name == "MAINTD_NODE"));
    assert_eq!(c.ports.as_ref().unwrap()[0].host_port, Some(1815));
    assert!(!secrets(pod).contains("maintd-operators"));
    assert!(!secrets(pod).contains("maintd-node-keys"));
}

/// Reports are verified by re-serializing the parsed JSON, which is exact only with serde_json's
/// correctly rounded float parser. A dev-dependency (jsonschema) turns it on for every test
/// build, so no test of the binary could see it missing from a release build: the manifest
/// itself must ask for it.
#[test]
fn the_release_build_parses_floats_exactly() {
    let manifest: toml::Table = toml::from_str(
        &std::fs::read_to_string(env!("CARGO_MANIFEST_DIR").to_string() + "/Cargo.toml").unwrap(),
    )
    .unwrap();
    let features = manifest["dependencies"]["serde_json"]["features"]
        .as_array()
        .expect("serde_json must be declared with features");
    assert!(
        features
            .iter()
            .any(|f| f.as_str() == Some("float_roundtrip")),
        "serde_json needs the float_roundtrip feature: {features:?}"
    );
}

/// The CRD in deploy/ is what `maintd crd` prints from the Rust types, so it cannot drift.
#[test]
fn the_shipped_crd_is_the_one_derived_from_the_types() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maintd"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd.yaml")).unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        shipped,
        "deploy/crd.yaml is stale: run `maintd crd > deploy/crd.yaml`"
    );
    let crd: Value = serde_yaml_ng::from_str(&shipped).unwrap();
    assert_eq!(crd["spec"]["group"], "maintd.io");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["subresources"]["status"], serde_json::json!({}));
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns[..4], ["Node", "Step", "Status", "Age"]);
}
