//! Pure admission check for evacuation rounds: which nodes may be drained together, so that their
//! pods fit on the remaining schedulable nodes (first fit by CPU and memory requests, honouring
//! nodeSelector and taints/tolerations), no PodDisruptionBudget goes below its allowance, and the
//! concurrent-disruption cap holds. Every node that must wait gets a reason.

use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, PartialEq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Toleration {
    /// Empty with `exists` = tolerate everything.
    pub key: String,
    /// `Exists` (true) or `Equal` (false).
    pub exists: bool,
    pub value: String,
    /// Empty = every effect.
    pub effect: String,
}

impl Toleration {
    fn tolerates(&self, t: &Taint) -> bool {
        let effect = self.effect.is_empty() || self.effect == t.effect;
        let key = (self.key.is_empty() && self.exists) || self.key == t.key;
        let value = self.exists || self.value == t.value;
        effect && key && value
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeCap {
    pub name: String,
    pub cpu_milli: i64,
    pub mem_bytes: i64,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub schedulable: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodReq {
    /// `namespace/name`.
    pub name: String,
    pub node: String,
    pub cpu_milli: i64,
    pub mem_bytes: i64,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// Indices into `Snapshot::pdbs` of the budgets that select this pod.
    pub pdbs: Vec<usize>,
    /// False for DaemonSet and mirror pods, which a drain leaves in place.
    pub movable: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pdb {
    pub name: String,
    pub disruptions_allowed: i64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub nodes: Vec<NodeCap>,
    pub pods: Vec<PodReq>,
    pub pdbs: Vec<Pdb>,
}

/// A node that wants to drain; a failover deletes pods without waiting for their budgets.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub node: String,
    pub respects_pdbs: bool,
}

impl From<&str> for Candidate {
    fn from(node: &str) -> Candidate {
        Candidate {
            node: node.into(),
            respects_pdbs: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub admitted: Vec<String>,
    /// Nodes that must wait, with the reason to show in /1/status.
    pub waiting: Vec<(String, String)>,
}

fn fits_on(p: &PodReq, n: &NodeCap) -> bool {
    n.schedulable
        && p.node_selector
            .iter()
            .all(|(k, v)| n.labels.get(k) == Some(v))
        && n.taints
            .iter()
            .filter(|t| t.effect != "PreferNoSchedule")
            .all(|t| p.tolerations.iter().any(|tol| tol.tolerates(t)))
}

/// Admits candidates in order (most urgent first) while their pods still fit elsewhere, no PDB
/// is exceeded and at most `max_disruptions` nodes drain at once.
pub fn admit(s: &Snapshot, candidates: &[Candidate], max_disruptions: usize) -> Admission {
    let index: HashMap<&str, usize> = s
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut free: Vec<(i64, i64)> = s.nodes.iter().map(|n| (n.cpu_milli, n.mem_bytes)).collect();
    let mut pods_of: HashMap<&str, Vec<&PodReq>> = HashMap::new();
    for p in &s.pods {
        if let Some(&i) = index.get(p.node.as_str()) {
            free[i].0 -= p.cpu_milli;
            free[i].1 -= p.mem_bytes;
        }
        pods_of.entry(p.node.as_str()).or_default().push(p);
    }
    let mut draining = vec![false; s.nodes.len()];
    let mut pdb_used = vec![0i64; s.pdbs.len()];
    let mut out = Admission {
        admitted: Vec::new(),
        waiting: Vec::new(),
    };
    for cand in candidates {
        let c = &cand.node;
        let wait = |why: String, out: &mut Admission| out.waiting.push((c.clone(), why));
        if out.admitted.len() >= max_disruptions {
            wait(
                format!("at most {max_disruptions} concurrent disruptions"),
                &mut out,
            );
            continue;
        }
        let Some(&ci) = index.get(c.as_str()) else {
            wait("not a known node".into(), &mut out);
            continue;
        };
        let mut movable: Vec<&PodReq> = pods_of
            .get(c.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|p| p.movable)
            .collect();
        // PDBs first: cheap, and a refusal there needs no placement.
        let mut need = vec![0i64; s.pdbs.len()];
        for p in &movable {
            for &b in &p.pdbs {
                need[b] += 1;
            }
        }
        if !cand.respects_pdbs {
            need.iter_mut().for_each(|n| *n = 0);
        }
        if let Some(b) = (0..s.pdbs.len())
            .find(|&b| need[b] > 0 && pdb_used[b] + need[b] > s.pdbs[b].disruptions_allowed)
        {
            wait(
                format!(
                    "would exceed PodDisruptionBudget {} ({} allowed, {} needed)",
                    s.pdbs[b].name,
                    s.pdbs[b].disruptions_allowed - pdb_used[b],
                    need[b]
                ),
                &mut out,
            );
            continue;
        }
        // First fit, biggest pods first, on a scratch copy of the free capacity.
        movable.sort_by_key(|p| std::cmp::Reverse((p.cpu_milli, p.mem_bytes)));
        let mut trial = free.clone();
        let mut stuck = None;
        for p in &movable {
            let slot = (0..s.nodes.len()).find(|&i| {
                i != ci
                    && !draining[i]
                    && trial[i].0 >= p.cpu_milli
                    && trial[i].1 >= p.mem_bytes
                    && fits_on(p, &s.nodes[i])
            });
            match slot {
                Some(i) => {
                    trial[i].0 -= p.cpu_milli;
                    trial[i].1 -= p.mem_bytes;
                }
                None => {
                    stuck = Some(*p);
                    break;
                }
            }
        }
        if let Some(p) = stuck {
            wait(
                format!(
                    "pod {} ({}m CPU, {} MiB) fits on no other schedulable node",
                    p.name,
                    p.cpu_milli,
                    p.mem_bytes >> 20
                ),
                &mut out,
            );
            continue;
        }
        free = trial;
        draining[ci] = true;
        for (b, n) in need.iter().enumerate() {
            pdb_used[b] += n;
        }
        out.admitted.push(c.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i64 = 1 << 30;

    fn node(name: &str, cpu: i64) -> NodeCap {
        NodeCap {
            name: name.into(),
            cpu_milli: cpu,
            mem_bytes: 64 * GI,
            labels: BTreeMap::new(),
            taints: vec![],
            schedulable: true,
        }
    }

    fn pod(name: &str, node: &str, cpu: i64) -> PodReq {
        PodReq {
            name: name.into(),
            node: node.into(),
            cpu_milli: cpu,
            mem_bytes: GI,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            pdbs: vec![],
            movable: true,
        }
    }

    #[test]
    fn nodes_whose_pods_cannot_fit_elsewhere_wait_with_a_reason() {
        let s = Snapshot {
            nodes: vec![node("a", 4000), node("b", 4000), node("c", 4000)],
            pods: vec![
                pod("p1", "a", 3000),
                pod("p2", "b", 3000),
                pod("p3", "c", 1000),
            ],
            pdbs: vec![],
        };
        // a's 3000m fits only on c (3000m free); then b's 3000m fits nowhere.
        let r = admit(&s, &["a".into(), "b".into()], 5);
        assert_eq!(r.admitted, vec!["a"]);
        assert_eq!(r.waiting[0].0, "b");
        assert!(
            r.waiting[0].1.contains("p2") && r.waiting[0].1.contains("fits on no other"),
            "{r:?}"
        );
    }

    #[test]
    fn selectors_taints_and_tolerations_are_honoured() {
        let mut gpu = node("gpu", 8000);
        gpu.labels.insert("gpu".into(), "yes".into());
        gpu.taints.push(Taint {
            key: "gpu".into(),
            value: "yes".into(),
            effect: "NoSchedule".into(),
        });
        let mut s = Snapshot {
            nodes: vec![node("a", 8000), gpu, node("b", 1000)],
            pods: vec![pod("job", "a", 4000)],
            pdbs: vec![],
        };
        assert!(
            admit(&s, &["a".into()], 1).admitted.is_empty(),
            "untolerated taint, b too small"
        );
        s.pods[0].tolerations.push(Toleration {
            key: "gpu".into(),
            exists: true,
            value: String::new(),
            effect: String::new(),
        });
        assert_eq!(admit(&s, &["a".into()], 1).admitted, vec!["a"]);
        s.pods[0].node_selector.insert("zone".into(), "x".into());
        assert!(
            admit(&s, &["a".into()], 1).admitted.is_empty(),
            "no node has zone=x"
        );
        s.nodes[1].schedulable = false;
        s.pods[0].node_selector.clear();
        assert!(
            admit(&s, &["a".into()], 1).admitted.is_empty(),
            "cordoned nodes take nothing"
        );
    }

    #[test]
    fn pdbs_and_the_concurrency_cap_limit_a_round() {
        let mut s = Snapshot {
            nodes: (0..4).map(|i| node(&format!("n{i}"), 16000)).collect(),
            pods: (0..3)
                .map(|i| pod(&format!("db-{i}"), &format!("n{i}"), 100))
                .collect(),
            pdbs: vec![Pdb {
                name: "db".into(),
                disruptions_allowed: 1,
            }],
        };
        for p in &mut s.pods {
            p.pdbs.push(0);
        }
        let all: Vec<Candidate> = (0..3).map(|i| format!("n{i}").as_str().into()).collect();
        let r = admit(&s, &all, 5);
        assert_eq!(r.admitted, vec!["n0"]);
        assert!(
            r.waiting
                .iter()
                .all(|(_, w)| w.contains("PodDisruptionBudget db")),
            "{r:?}"
        );
        s.pdbs[0].disruptions_allowed = 3;
        assert_eq!(admit(&s, &all, 2).admitted, vec!["n0", "n1"]);
        assert!(admit(&s, &all, 2).waiting[0].1.contains("2 concurrent"));
        // DaemonSet pods neither move nor count.
        s.pods.iter_mut().for_each(|p| p.movable = false);
        s.pdbs[0].disruptions_allowed = 0;
        assert_eq!(admit(&s, &all, 5).admitted.len(), 3);
        // A failover deletes pods whatever their budget says.
        s.pods.iter_mut().for_each(|p| p.movable = true);
        let failover = Candidate {
            node: "n2".into(),
            respects_pdbs: false,
        };
        assert_eq!(admit(&s, &[failover], 1).admitted, vec!["n2"]);
    }

    #[test]
    fn drained_nodes_receive_no_pods_of_other_drained_nodes() {
        let s = Snapshot {
            nodes: vec![node("a", 2000), node("b", 2000)],
            pods: vec![pod("p", "a", 500), pod("q", "b", 500)],
            pdbs: vec![],
        };
        let r = admit(&s, &["a".into(), "b".into()], 5);
        assert_eq!(
            r.admitted,
            vec!["a"],
            "b cannot move its pod onto a, which is draining"
        );
    }
}
