//! When a node counts as partitioned from the master (its watchers still hear it, the master
//! does not) and when that ends, with hysteresis both ways, so a witness that flickers (a
//! kubelet Lease renewed a little late) says nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::fencing::opinion::PeerOpinion;
use crate::verdict::Nanos;

/// The nodes called partitioned, and since when each that no longer looks it has been clear.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Partitions {
    called: BTreeSet<String>,
    clear: BTreeMap<String, Nanos>,
}

/// What one step changed: the nodes now called partitioned (with who still hears them) and the
/// nodes no longer.
#[derive(Debug, Default, PartialEq)]
pub struct PartitionChange {
    pub began: Vec<(String, Vec<String>)>,
    pub ended: Vec<String>,
}

impl Partitions {
    /// The nodes called partitioned now.
    pub fn called(&self) -> &BTreeSet<String> {
        &self.called
    }

    /// One step at `now`. A node is called partitioned once its watchers still hear it and it
    /// has been unreachable to the master (`unreachable_since`) for `hold`: the watchers'
    /// judgement is in by then (a dead node's watchers lose it too). It stops being so at once
    /// when its watchers lose it too or a flow takes it on (`fencing`), else once it has not
    /// looked partitioned for `hold`. A node with a flow under way is never called partitioned:
    /// it is being fenced, or is off already.
    pub fn step(
        &mut self,
        opinions: &BTreeMap<String, PeerOpinion>,
        unreachable_since: impl Fn(&str) -> Option<Nanos>,
        fencing: &BTreeSet<String>,
        hold: Nanos,
        now: Nanos,
    ) -> PartitionChange {
        let looks: BTreeMap<&String, &Vec<String>> = opinions
            .iter()
            .filter(|(n, _)| !fencing.contains(*n))
            .filter_map(|(n, o)| match o {
                PeerOpinion::Partitioned { hearers } => Some((n, hearers)),
                _ => None,
            })
            .filter(|(n, _)| unreachable_since(n).is_some_and(|t| now.saturating_sub(t) >= hold))
            .collect();
        let began: Vec<(String, Vec<String>)> = looks
            .iter()
            .filter(|(n, _)| !self.called.contains(n.as_str()))
            .map(|(n, h)| ((*n).clone(), (*h).clone()))
            .collect();
        for n in looks.keys() {
            self.clear.remove(*n);
        }
        let mut ended = Vec::new();
        for n in self.called.iter().filter(|n| !looks.contains_key(n)) {
            let since = *self.clear.entry(n.clone()).or_insert(now);
            let lost = matches!(opinions.get(n), Some(PeerOpinion::Lost { .. }));
            if lost || fencing.contains(n) || now.saturating_sub(since) >= hold {
                ended.push(n.clone());
            }
        }
        for n in &ended {
            self.called.remove(n);
            self.clear.remove(n);
        }
        self.called.extend(began.iter().map(|(n, _)| n.clone()));
        PartitionChange { began, ended }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const HOLD: Nanos = 5 * S;

    fn heard() -> BTreeMap<String, PeerOpinion> {
        BTreeMap::from([(
            "n1".to_string(),
            PeerOpinion::Partitioned {
                hearers: vec!["n2".into()],
            },
        )])
    }

    fn lost() -> BTreeMap<String, PeerOpinion> {
        BTreeMap::from([("n1".to_string(), PeerOpinion::Lost { agreed: Vec::new() })])
    }

    #[test]
    fn partitioned_only_after_the_hold_and_cleared_only_after_as_long() {
        let mut p = Partitions::default();
        let none = BTreeSet::new();
        let since = |_: &str| Some(0);
        assert_eq!(
            p.step(&heard(), since, &none, HOLD, 4 * S),
            PartitionChange::default()
        );
        let c = p.step(&heard(), since, &none, HOLD, 5 * S);
        assert_eq!(c.began, vec![("n1".to_string(), vec!["n2".to_string()])]);
        assert!(p.called().contains("n1"));
        // It flickers: heard by the master for a moment, then not.
        let quiet = BTreeMap::new();
        assert_eq!(
            p.step(&quiet, |_| None, &none, HOLD, 6 * S),
            PartitionChange::default()
        );
        assert_eq!(
            p.step(&heard(), since, &none, HOLD, 7 * S),
            PartitionChange::default()
        );
        // Clear for the hold: ended.
        assert!(
            p.step(&quiet, |_| None, &none, HOLD, 8 * S)
                .ended
                .is_empty()
        );
        let c = p.step(&quiet, |_| None, &none, HOLD, 13 * S);
        assert_eq!(c.ended, vec!["n1".to_string()]);
        assert!(p.called().is_empty());
    }

    #[test]
    fn lost_by_its_watchers_or_taken_on_by_a_flow_ends_it_at_once() {
        let none = BTreeSet::new();
        let since = |_: &str| Some(0);
        let mut p = Partitions::default();
        p.step(&heard(), since, &none, HOLD, 5 * S);
        assert_eq!(
            p.step(&lost(), since, &none, HOLD, 6 * S).ended,
            vec!["n1".to_string()]
        );
        let mut p = Partitions::default();
        p.step(&heard(), since, &none, HOLD, 5 * S);
        let fencing = BTreeSet::from(["n1".to_string()]);
        let c = p.step(&heard(), since, &fencing, HOLD, 6 * S);
        assert_eq!((c.began.len(), c.ended.len()), (0, 1));
        // And while the flow runs it is never called partitioned again.
        assert!(
            p.step(&heard(), since, &fencing, HOLD, 60 * S)
                .began
                .is_empty()
        );
    }
}
