//! Instance repairs as Ganeti's harep does them, the pure part: the `ganeti:watcher:autorepair:*`
//! tags (what each object allows, what is pending, what ended), and what an instance needs
//! given its nodes. Tag-compatible with harep, so either tool reads the other's trail.

use std::collections::BTreeMap;

use serde::Deserialize;

pub const PREFIX: &str = "ganeti:watcher:autorepair:";
const PENDING: &str = "ganeti:watcher:autorepair:pending:";
const RESULT: &str = "ganeti:watcher:autorepair:result:";
const SUSPEND: &str = "ganeti:watcher:autorepair:suspend";

/// The repair types, least invasive first; each tag allows its type and the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RepairType {
    FixStorage,
    Migrate,
    Failover,
    Reinstall,
}

impl RepairType {
    pub fn as_str(self) -> &'static str {
        match self {
            RepairType::FixStorage => "fix-storage",
            RepairType::Migrate => "migrate",
            RepairType::Failover => "failover",
            RepairType::Reinstall => "reinstall",
        }
    }

    pub fn parse(s: &str) -> Option<RepairType> {
        [
            RepairType::FixStorage,
            RepairType::Migrate,
            RepairType::Failover,
            RepairType::Reinstall,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
    }
}

/// What the tags allow for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    NotEnabled,
    Suspended,
    Enabled(RepairType),
}

/// The policy from the tags of the instance, its node group and the cluster (nearest first):
/// the nearest object with an autorepair or an unexpired suspend tag decides; within one
/// object a suspension wins, then the least invasive type.
pub fn policy(levels: &[&[String]], now_s: i64) -> Policy {
    for tags in levels {
        let suspended = tags.iter().any(|t| match t.strip_prefix(SUSPEND) {
            Some("") => true,
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|ts| ts.parse::<i64>().ok())
                .is_some_and(|until| until > now_s),
            None => false,
        });
        if suspended {
            return Policy::Suspended;
        }
        let least = tags
            .iter()
            .filter_map(|t| t.strip_prefix(PREFIX).and_then(RepairType::parse))
            .min();
        if let Some(t) = least {
            return Policy::Enabled(t);
        }
    }
    Policy::NotEnabled
}

/// A repair in an instance's tags: pending (`result` None) or ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    pub rtype: RepairType,
    pub id: String,
    pub ts: i64,
    pub result: Option<String>,
    pub jobs: Vec<u64>,
    pub tag: String,
}

/// Parses a pending (`…:pending:<type>:<id>:<ts>:<jobs>`) or result
/// (`…:result:<type>:<id>:<ts>:<result>:<jobs>`) tag; `None` for any other tag or a malformed one.
pub fn tracked(tag: &str) -> Option<Tracked> {
    let (rest, is_result) = match (tag.strip_prefix(PENDING), tag.strip_prefix(RESULT)) {
        (Some(r), _) => (r, false),
        (_, Some(r)) => (r, true),
        _ => return None,
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (rtype, id, ts, result, jobs) = match (is_result, parts.as_slice()) {
        (false, [t, id, ts, jobs]) => (t, id, ts, None, jobs),
        (true, [t, id, ts, r, jobs]) => (t, id, ts, Some(r.to_string()), jobs),
        _ => return None,
    };
    let jobs = jobs
        .split('+')
        .filter(|j| !j.is_empty())
        .map(|j| j.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    Some(Tracked {
        rtype: RepairType::parse(rtype)?,
        id: id.to_string(),
        ts: ts.parse().ok()?,
        result,
        jobs,
        tag: tag.to_string(),
    })
}

pub fn pending_tag(rtype: RepairType, id: &str, ts: i64) -> String {
    format!("{PENDING}{}:{id}:{ts}:", rtype.as_str())
}

pub fn result_tag(rtype: RepairType, id: &str, ts: i64, result: &str, jobs: &[u64]) -> String {
    let jobs: Vec<String> = jobs.iter().map(u64::to_string).collect();
    format!(
        "{RESULT}{}:{id}:{ts}:{result}:{}",
        rtype.as_str(),
        jobs.join("+")
    )
}

/// An instance as `/2/instances?bulk=1` lists it (the fields the repairs and balancing read).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Instance {
    pub name: String,
    pub pnode: String,
    #[serde(default)]
    pub snodes: Vec<String>,
    pub disk_template: String,
    /// `running`, `ADMIN_down`, `ERROR_down`, `ERROR_nodedown`, `ERROR_nodeoffline`, …
    pub status: String,
    /// `up`, `down` or `offline`: whether Ganeti is asked to keep it running.
    pub admin_state: String,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

impl Instance {
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.pnode).chain(&self.snodes)
    }
}

/// A node's flags as the repairs read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeFlags {
    pub offline: bool,
    pub drained: bool,
}

/// How an instance's disks survive its primary: on its secondary (drbd), anywhere (shared or
/// no storage), or only where they are (plain, file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mirror {
    Internal,
    External,
    None,
}

fn mirror(template: &str) -> Mirror {
    match template {
        "drbd" => Mirror::Internal,
        "plain" | "file" => Mirror::None,
        _ => Mirror::External,
    }
}

/// The Ganeti operations of a repair, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairOp {
    /// Restart on another node (drbd: its secondary; otherwise where the iallocator says).
    Failover,
    /// Live-migrate away from a drained primary.
    Migrate,
    /// A new secondary for a drbd instance whose secondary is offline.
    ReplaceSecondary,
    /// Disks recreated elsewhere and the OS reinstalled: the data is lost.
    Reinstall,
}

/// What an instance needs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    Healthy,
    Repair(RepairType, RepairOp),
    /// Broken, but no repair is safe yet (why).
    Wait(String),
}

/// What `inst` needs given its nodes' flags. `down_long` says it has been `ERROR_down` longer
/// than Ganeti's watcher needs to restart it in place. An unreachable primary that is not
/// offline is never repaired: the instance may still run there, and a second copy elsewhere
/// is what repairs must never make; it waits until the node is fenced or marked offline.
pub fn need(inst: &Instance, nodes: &BTreeMap<String, NodeFlags>, down_long: bool) -> Need {
    if inst.admin_state != "up" {
        return Need::Healthy;
    }
    let flags = |n: &String| nodes.get(n).copied().unwrap_or_default();
    let primary = flags(&inst.pnode);
    let secondary_off = inst.snodes.iter().any(|n| flags(n).offline);
    let m = mirror(&inst.disk_template);
    if primary.offline {
        return match m {
            Mirror::None => Need::Repair(RepairType::Reinstall, RepairOp::Reinstall),
            Mirror::Internal if secondary_off => {
                Need::Repair(RepairType::Reinstall, RepairOp::Reinstall)
            }
            _ => Need::Repair(RepairType::Failover, RepairOp::Failover),
        };
    }
    if m == Mirror::Internal && secondary_off {
        return Need::Repair(RepairType::FixStorage, RepairOp::ReplaceSecondary);
    }
    if inst.status == "ERROR_nodedown" {
        return Need::Wait(format!(
            "{} is unreachable but not offline: repaired once it is fenced or marked offline",
            inst.pnode
        ));
    }
    if primary.drained && m != Mirror::None && inst.status == "running" {
        return Need::Repair(RepairType::Migrate, RepairOp::Migrate);
    }
    if inst.status == "ERROR_down" && m != Mirror::None {
        return if down_long {
            Need::Repair(RepairType::Failover, RepairOp::Failover)
        } else {
            Need::Wait("down; Ganeti's watcher restarts it in place first".into())
        };
    }
    Need::Healthy
}

/// What to do with one instance's repair trail this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Run (or resume) a repair: `pending` is its pending tag when it already has one.
    Repair {
        rtype: RepairType,
        op: RepairOp,
        id: Option<String>,
        ts: Option<i64>,
        pending: Option<String>,
    },
    /// End a pending repair without jobs: the instance is healthy (`success`) or the tags do
    /// not allow what it needs (`enoperm`).
    Close {
        pending: Tracked,
        result: &'static str,
    },
    /// Record once that the repair it needs is not allowed.
    Refuse(RepairType),
    /// Broken, stuck (a failed repair waits for the operator, two pending repairs are an
    /// error, or no repair is safe yet): said in the log.
    Blocked(String),
}

/// The step for one instance from its trail, its need and its policy.
pub fn step(inst: &Instance, need: &Need, policy: Policy) -> Step {
    let trail: Vec<Tracked> = inst.tags.iter().filter_map(|t| tracked(t)).collect();
    if let Some(f) = trail
        .iter()
        .find(|t| t.result.as_deref() == Some("failure"))
    {
        return match need {
            Need::Healthy => Step::Nothing,
            _ => Step::Blocked(format!(
                "its repair {} failed: remove {} once it is looked at",
                f.id, f.tag
            )),
        };
    }
    let pending: Vec<&Tracked> = trail.iter().filter(|t| t.result.is_none()).collect();
    if pending.len() > 1 {
        return Step::Blocked(format!("{} pending repairs", pending.len()));
    }
    let allowed = |t: RepairType, p: Option<&Tracked>| {
        p.is_some_and(|p| p.rtype >= t) || matches!(policy, Policy::Enabled(max) if t <= max)
    };
    match (pending.first().copied(), need) {
        (Some(p), Need::Healthy) => Step::Close {
            pending: p.clone(),
            result: "success",
        },
        (Some(_), _) if policy == Policy::Suspended => Step::Nothing,
        (Some(p), Need::Repair(t, op)) if allowed(*t, Some(p)) => Step::Repair {
            rtype: *t,
            op: *op,
            id: Some(p.id.clone()),
            ts: Some(p.ts),
            pending: Some(p.tag.clone()),
        },
        (Some(p), Need::Repair(..)) => Step::Close {
            pending: p.clone(),
            result: "enoperm",
        },
        (_, Need::Wait(why)) => Step::Blocked(why.clone()),
        (None, Need::Repair(t, op)) if allowed(*t, None) => Step::Repair {
            rtype: *t,
            op: *op,
            id: None,
            ts: None,
            pending: None,
        },
        (None, Need::Repair(t, _)) if matches!(policy, Policy::Enabled(_)) => {
            // Refused once: an enoperm result for this type already says so.
            let said = trail
                .iter()
                .any(|r| r.rtype == *t && r.result.as_deref() == Some("enoperm"));
            if said {
                Step::Nothing
            } else {
                Step::Refuse(*t)
            }
        }
        _ => Step::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(status: &str, template: &str, tags: &[&str]) -> Instance {
        Instance {
            name: "i1".into(),
            pnode: "node2".into(),
            snodes: if template == "drbd" {
                vec!["node3".into()]
            } else {
                vec![]
            },
            disk_template: template.into(),
            status: status.into(),
            admin_state: "up".into(),
            os: Some("noop".into()),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn nodes(off: &[&str], drained: &[&str]) -> BTreeMap<String, NodeFlags> {
        ["node1", "node2", "node3"]
            .iter()
            .map(|n| {
                let f = NodeFlags {
                    offline: off.contains(n),
                    drained: drained.contains(n),
                };
                (n.to_string(), f)
            })
            .collect()
    }

    #[test]
    fn tags_read_and_write_as_harep_does() {
        let p = pending_tag(RepairType::Failover, "abc", 1700000000);
        assert_eq!(
            p,
            "ganeti:watcher:autorepair:pending:failover:abc:1700000000:"
        );
        let t = tracked(&p).unwrap();
        assert_eq!(
            (t.rtype, t.ts, t.result, t.jobs),
            (RepairType::Failover, 1700000000, None, vec![])
        );
        let r = result_tag(RepairType::Reinstall, "abc", 17, "success", &[4, 5]);
        assert_eq!(
            r,
            "ganeti:watcher:autorepair:result:reinstall:abc:17:success:4+5"
        );
        let t = tracked(&r).unwrap();
        assert_eq!((t.result.as_deref(), t.jobs), (Some("success"), vec![4, 5]));
        for bad in [
            "ganeti:watcher:autorepair:pending:failover:abc:notatime:",
            "ganeti:watcher:autorepair:pending:explode:abc:1:",
            "ganeti:watcher:autorepair:result:failover:abc:1:2",
            "ganeti:watcher:autorepair:pending:failover:abc:1:x+2",
            "maintd:repairready:x",
        ] {
            assert_eq!(tracked(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_nearest_object_decides_and_the_least_invasive_tag_wins_within_it() {
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        let (inst, group, cluster) = (
            s(&["ganeti:watcher:autorepair:failover"]),
            s(&[]),
            s(&[
                "ganeti:watcher:autorepair:fix-storage",
                "ganeti:watcher:autorepair:reinstall",
            ]),
        );
        assert_eq!(
            policy(&[&inst, &group, &cluster], 0),
            Policy::Enabled(RepairType::Failover)
        );
        assert_eq!(
            policy(&[&[], &group, &cluster], 0),
            Policy::Enabled(RepairType::FixStorage)
        );
        assert_eq!(policy(&[&[], &[], &[]], 0), Policy::NotEnabled);
        let suspended = s(&["ganeti:watcher:autorepair:suspend"]);
        assert_eq!(policy(&[&[], &suspended, &cluster], 0), Policy::Suspended);
        // A suspension of the cluster is lifted for an instance by a tag of its own.
        assert_eq!(
            policy(&[&inst, &[], &suspended], 0),
            Policy::Enabled(RepairType::Failover)
        );
        let until = s(&["ganeti:watcher:autorepair:suspend:100"]);
        assert_eq!(policy(&[&until, &[], &cluster], 99), Policy::Suspended);
        assert_eq!(
            policy(&[&until, &[], &cluster], 100),
            Policy::Enabled(RepairType::FixStorage)
        );
    }

    #[test]
    fn what_an_instance_needs_follows_its_nodes_and_disks() {
        use RepairOp as O;
        use RepairType as T;
        let n = |off: &[&str], dr: &[&str]| nodes(off, dr);
        let cases = [
            (
                inst("ERROR_nodeoffline", "diskless", &[]),
                n(&["node2"], &[]),
                Need::Repair(T::Failover, O::Failover),
            ),
            (
                inst("ERROR_nodeoffline", "sharedfile", &[]),
                n(&["node2"], &[]),
                Need::Repair(T::Failover, O::Failover),
            ),
            (
                inst("ERROR_nodeoffline", "plain", &[]),
                n(&["node2"], &[]),
                Need::Repair(T::Reinstall, O::Reinstall),
            ),
            (
                inst("ERROR_nodeoffline", "drbd", &[]),
                n(&["node2"], &[]),
                Need::Repair(T::Failover, O::Failover),
            ),
            (
                inst("ERROR_nodeoffline", "drbd", &[]),
                n(&["node2", "node3"], &[]),
                Need::Repair(T::Reinstall, O::Reinstall),
            ),
            (
                inst("running", "drbd", &[]),
                n(&["node3"], &[]),
                Need::Repair(T::FixStorage, O::ReplaceSecondary),
            ),
            (
                inst("running", "sharedfile", &[]),
                n(&[], &["node2"]),
                Need::Repair(T::Migrate, O::Migrate),
            ),
            (
                inst("running", "plain", &[]),
                n(&[], &["node2"]),
                Need::Healthy,
            ),
            (inst("running", "diskless", &[]), n(&[], &[]), Need::Healthy),
        ];
        for (i, nodes, want) in cases {
            assert_eq!(
                need(&i, &nodes, false),
                want,
                "{} {}",
                i.status,
                i.disk_template
            );
        }
        // Unreachable but not offline: it may still run; no second copy.
        let i = inst("ERROR_nodedown", "diskless", &[]);
        assert!(
            matches!(need(&i, &n(&[], &[]), true), Need::Wait(w) if w.contains("node2 is unreachable"))
        );
        let i = inst("ERROR_down", "diskless", &[]);
        assert!(matches!(need(&i, &n(&[], &[]), false), Need::Wait(_)));
        assert_eq!(
            need(&i, &n(&[], &[]), true),
            Need::Repair(T::Failover, O::Failover)
        );
        let mut i = inst("ERROR_nodeoffline", "diskless", &[]);
        i.admin_state = "down".into();
        assert_eq!(need(&i, &n(&["node2"], &[]), false), Need::Healthy);
    }

    #[test]
    fn the_trail_decides_the_step() {
        use RepairType as T;
        let broken = Need::Repair(T::Failover, RepairOp::Failover);
        let on = Policy::Enabled(T::Failover);
        let i = inst("ERROR_nodeoffline", "diskless", &[]);
        assert!(matches!(
            step(&i, &broken, on),
            Step::Repair { id: None, .. }
        ));
        assert_eq!(step(&i, &broken, Policy::NotEnabled), Step::Nothing);
        assert_eq!(step(&i, &broken, Policy::Suspended), Step::Nothing);
        assert_eq!(
            step(&i, &broken, Policy::Enabled(T::Migrate)),
            Step::Refuse(T::Failover)
        );
        let refused = result_tag(T::Failover, "r", 1, "enoperm", &[]);
        let i2 = inst("ERROR_nodeoffline", "diskless", &[&refused]);
        assert_eq!(
            step(&i2, &broken, Policy::Enabled(T::Migrate)),
            Step::Nothing
        );
        // A pending repair resumes with its id and time; healthy closes it with success.
        let p = pending_tag(T::Failover, "abc", 7);
        let i = inst("ERROR_nodeoffline", "diskless", &[&p]);
        assert!(matches!(step(&i, &broken, Policy::NotEnabled),
            Step::Repair { id: Some(id), ts: Some(7), pending: Some(_), .. } if id == "abc"));
        assert!(matches!(
            step(&i, &Need::Healthy, on),
            Step::Close {
                result: "success",
                ..
            }
        ));
        let weak = pending_tag(T::Migrate, "abc", 7);
        let i = inst("ERROR_nodeoffline", "diskless", &[&weak]);
        assert!(matches!(
            step(&i, &broken, Policy::NotEnabled),
            Step::Close {
                result: "enoperm",
                ..
            }
        ));
        // A failure waits for the operator.
        let f = result_tag(T::Failover, "abc", 7, "failure", &[3]);
        let i = inst("ERROR_nodeoffline", "diskless", &[&f]);
        assert!(matches!(step(&i, &broken, on), Step::Blocked(w) if w.contains("failed")));
        let two = [
            pending_tag(T::Failover, "a", 1),
            pending_tag(T::Failover, "b", 2),
        ];
        let i = inst("ERROR_nodeoffline", "diskless", &[&two[0], &two[1]]);
        assert!(matches!(step(&i, &broken, on), Step::Blocked(_)));
    }
}
