//! The pure translation from Kubernetes objects (Nodes, Pods, PodDisruptionBudgets) to the
//! core's capacity snapshot: quantities, requests, selectors, taints and tolerations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::drain::{evictable, pod_name};
use maintd_core::repair::capacity;

/// CPU in millicores or memory in bytes from a Kubernetes quantity ("500m", "2", "1Gi", "1e9").
pub fn quantity(q: &str, milli: bool) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    let v = n * scale * if milli { 1000.0 } else { 1.0 };
    Some(v.ceil() as i64)
}

pub(super) fn requests(pod: &Pod) -> (i64, i64) {
    let Some(spec) = &pod.spec else {
        return (0, 0);
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |k: &str, milli: bool| {
            r.and_then(|r| r.get(k))
                .and_then(|q| quantity(&q.0, milli))
                .unwrap_or(0)
        };
        (get("cpu", true), get("memory", false))
    };
    let (mut cpu, mut mem) = spec
        .containers
        .iter()
        .map(of)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // Init containers run one at a time before the others: the pod needs the largest of them.
    for c in spec.init_containers.iter().flatten() {
        let (c2, m2) = of(c);
        cpu = cpu.max(c2);
        mem = mem.max(m2);
    }
    (cpu, mem)
}

pub(super) fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let vals = e.values.clone().unwrap_or_default();
        let got = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => got.is_some_and(|v| vals.contains(v)),
            "NotIn" => got.is_none_or(|v| !vals.contains(v)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The capacity picture for `capacity::admit`, from one list of nodes, pods and PDBs.
pub fn snapshot<N, P, B>(nodes: &[N], pods: &[P], pdbs: &[B]) -> capacity::Snapshot
where
    N: std::borrow::Borrow<Node>,
    P: std::borrow::Borrow<Pod>,
    B: std::borrow::Borrow<PodDisruptionBudget>,
{
    let mut s = capacity::Snapshot::default();
    for n in nodes.iter().map(|n| n.borrow()) {
        let Some(name) = n.metadata.name.clone() else {
            continue;
        };
        let status = n.status.as_ref();
        let alloc = |k: &str, milli: bool| {
            status
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(k))
                .and_then(|q| quantity(&q.0, milli))
                .unwrap_or(0)
        };
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let spec = n.spec.as_ref();
        s.nodes.push(capacity::NodeCap {
            name,
            cpu_milli: alloc("cpu", true),
            mem_bytes: alloc("memory", false),
            labels: n.metadata.labels.clone().unwrap_or_default(),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| capacity::Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone(),
                })
                .collect(),
            schedulable: ready && !spec.and_then(|s| s.unschedulable).unwrap_or(false),
        });
    }
    for b in pdbs.iter().map(|b| b.borrow()) {
        s.pdbs.push(capacity::Pdb {
            name: format!(
                "{}/{}",
                b.metadata.namespace.as_deref().unwrap_or("default"),
                b.metadata.name.as_deref().unwrap_or("?")
            ),
            disruptions_allowed: b
                .status
                .as_ref()
                .map(|s| s.disruptions_allowed as i64)
                .unwrap_or(0),
        });
    }
    for p in pods.iter().map(|p| p.borrow()) {
        let Some(spec) = &p.spec else { continue };
        let Some(node) = spec.node_name.clone() else {
            continue;
        };
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let (cpu, mem) = requests(p);
        s.pods.push(capacity::PodReq {
            name: pod_name(p),
            node,
            cpu_milli: cpu,
            mem_bytes: mem,
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec
                .tolerations
                .iter()
                .flatten()
                .map(|t| capacity::Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    exists: t.operator.as_deref() == Some("Exists"),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone().unwrap_or_default(),
                })
                .collect(),
            pdbs: pdbs
                .iter()
                .map(|b| b.borrow())
                .enumerate()
                .filter(|(_, b)| {
                    b.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && b.spec
                            .as_ref()
                            .and_then(|s| s.selector.as_ref())
                            .is_some_and(|sel| selects(sel, &labels))
                })
                .map(|(i, _)| i)
                .collect(),
            movable: evictable(p),
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_parse_as_the_api_writes_them() {
        assert_eq!(quantity("500m", true), Some(500));
        assert_eq!(quantity("2", true), Some(2000));
        assert_eq!(quantity("0.25", true), Some(250));
        assert_eq!(quantity("1Gi", false), Some(1 << 30));
        assert_eq!(quantity("128974848", false), Some(128_974_848));
        assert_eq!(quantity("129e6", false), Some(129_000_000));
        assert_eq!(quantity("123Mi", false), Some(123 << 20));
        assert_eq!(quantity("1k", false), Some(1000));
        assert_eq!(quantity("1Qi", false), None);
        assert_eq!(quantity("", false), None);
    }

    #[test]
    fn pdb_selectors_match_labels_and_expressions() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "db"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(&sel, &l(&[("app", "db"), ("tier", "a")])));
        assert!(!selects(&sel, &l(&[("app", "db"), ("tier", "c")])));
        assert!(!selects(
            &sel,
            &l(&[("app", "db"), ("tier", "a"), ("canary", "1")])
        ));
        assert!(!selects(&sel, &l(&[("tier", "a")])));
        // An empty selector selects every pod of the namespace (policy/v1).
        assert!(selects(&LabelSelector::default(), &l(&[])));
    }
}
