//! `maintd bench plan`: one whole `decide()` with the round planner's admission check
//! (capacity, PDBs, the cap) over a synthetic cluster of nodes and pods.

use super::bench::BenchError;

/// `maintd bench plan`: admission of evacuation candidates over a synthetic cluster.
pub fn plan(nodes: usize, pods_per_node: usize, candidates: &[usize]) -> Result<(), BenchError> {
    use maintd_core::repair::capacity::{NodeCap, Pdb, PodReq, Snapshot, Taint, Toleration};
    use std::collections::BTreeMap;
    const GI: i64 = 1 << 30;
    let mut s = Snapshot::default();
    for i in 0..nodes {
        let mut labels = BTreeMap::new();
        labels.insert("zone".to_string(), format!("z{}", i % 3));
        let taints = if i % 10 == 0 {
            vec![Taint {
                key: "dedicated".into(),
                value: "db".into(),
                effect: "NoSchedule".into(),
            }]
        } else {
            vec![]
        };
        s.nodes.push(NodeCap {
            name: format!("node{i}"),
            cpu_milli: 32_000,
            mem_bytes: 128 * GI,
            labels,
            taints,
            schedulable: true,
        });
    }
    // One PDB per 300 pods, allowing 2 disruptions.
    let total = nodes * pods_per_node;
    s.pdbs = (0..total.div_ceil(300))
        .map(|i| Pdb {
            name: format!("app{i}"),
            disruptions_allowed: 2,
        })
        .collect();
    for i in 0..total {
        let node = i / pods_per_node;
        let mut node_selector = BTreeMap::new();
        if i % 7 == 0 {
            node_selector.insert("zone".to_string(), format!("z{}", node % 3));
        }
        let tolerations = if i % 11 == 0 {
            vec![Toleration {
                key: "dedicated".into(),
                exists: false,
                value: "db".into(),
                effect: "NoSchedule".into(),
            }]
        } else {
            vec![]
        };
        s.pods.push(PodReq {
            name: format!("ns/p{i}"),
            node: format!("node{node}"),
            cpu_milli: 250 + (i % 4) as i64 * 250,
            mem_bytes: GI + (i % 3) as i64 * GI,
            node_selector,
            tolerations,
            pdbs: vec![(i * 7919) % s.pdbs.len()],
            movable: i % 30 != 0,
        });
    }
    out!(
        "evacuation admission over {nodes} nodes and {total} pods ({} PDBs)",
        s.pdbs.len()
    );
    out!(
        "{:>10}  {:>10}  {:>9}  {:>8}",
        "candidates",
        "ms (best)",
        "admitted",
        "waiting"
    );
    for &n in candidates {
        // A whole decision, as the engine makes it: every node reports, `n` of them want a
        // drain, and the round planner admits what fits.
        let mut obs = maintd_core::repair::Observations::new();
        let mut events = Vec::new();
        let evac = maintd_core::verdict::Verdict::from_value(
            serde_json::json!({"status": "evacuate", "details": {"bench": true}}),
        )?;
        for i in 0..nodes {
            let name = format!("node{i}");
            obs.reports.insert(
                name,
                maintd_core::repair::Observation::Report(
                    maintd_core::verdict::Verdict::builtin_ok(),
                ),
            );
        }
        for i in 0..n.min(nodes) {
            let name = format!("node{}", (i * 37) % nodes);
            obs.reports.insert(
                name.clone(),
                maintd_core::repair::Observation::Report(evac.clone()),
            );
            let id = uuid::Uuid::from_u128(i as u128 + 1);
            events.push(maintd_core::repair::Event {
                id,
                node: name,
                original: evac.original.clone(),
                canonical: evac.canonical(),
                action: evac.status,
                command: None,
                status: maintd_core::repair::RepairStatus::Noted,
                tag: maintd_core::repair::ready_tag(&id),
                tagged: false,
                acknowledged: false,
                superseded_by: None,
                note: None,
                created: i as i64,
                updated: i as i64,
            });
        }
        let state = maintd_core::repair::State {
            events,
            capacity: Some(maintd_core::repair::Capacity {
                snapshot: s.clone(),
                max_disruptions: n,
            }),
            ..Default::default()
        };
        let mut best = f64::MAX;
        let mut last = None;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let a = maintd_core::repair::decide(&state, &obs, 1_000_000);
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
            last = Some(a);
        }
        let actions = last.expect("five runs");
        let admitted = actions
            .iter()
            .find_map(|a| match a {
                maintd_core::repair::Action::StartRound { jobs, .. } => Some(jobs.len()),
                _ => None,
            })
            .unwrap_or(0);
        let waiting = actions
            .iter()
            .filter(|a| {
                matches!(a, maintd_core::repair::Action::Note { note: Some(w), .. } if w.starts_with("waiting to drain"))
            })
            .count();
        out!("{n:>10}  {best:>10.1}  {admitted:>9}  {waiting:>8}");
    }
    Ok(())
}
