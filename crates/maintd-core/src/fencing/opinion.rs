//! The second opinion: what a node's watchers, as far as the master can hear them,
//! say about it. A node the master has lost is a fence candidate only when the watchers the master
//! hears have lost it too; a node a watcher still hears is partitioned from the master, not dead;
//! too few watchers heard means no judgement (nothing is fenced). Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};

use crate::verdict::Nanos;

/// What one watcher says about the node, as the master last heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Says {
    /// The master holds no fresh, verified view from this watcher, or the watcher does not hold
    /// the node in its peer set yet.
    Unheard,
    /// The watcher hears the node's heartbeats (within its `lost-after`).
    Hears { view_at: Nanos },
    /// The watcher has lost the node; `last_heard` is its last heartbeat, if there ever was one.
    Lost {
        view_at: Nanos,
        last_heard: Option<Nanos>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Testimony {
    pub watcher: String,
    pub says: Says,
}

/// A watcher that agreed the node is gone, recorded in the flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct PeerWitness {
    pub watcher: String,
    /// When its view said so (its own clock, signed).
    pub view_at: Nanos,
    /// The node's last heartbeat it received.
    pub last_heard: Option<Nanos>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PeerOpinion {
    /// No second opinion was asked (the check is off).
    #[default]
    NotAsked,
    /// Every watcher the master hears has lost the node, and they are enough to judge.
    Lost { agreed: Vec<PeerWitness> },
    /// At least one watcher the master hears still hears the node: it is partitioned from the
    /// master, not dead.
    Partitioned { hearers: Vec<String> },
    /// Fewer than half of the node's watchers are heard: no judgement.
    TooFew { heard: usize, watchers: usize },
}

/// The name the kubelet's Lease goes by among the witnesses (no node name has a colon).
pub const KUBELET_WITNESS: &str = "lease:kubelet";

/// What the node's kubelet Lease says (Kubernetes), judged by the master's own observations:
/// a renewal it saw after it lost the collector proves the node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletSays {
    RenewedSinceLoss,
    /// No renewal seen since the loss; `last_renewal` is when the master last saw one.
    NotSinceLoss {
        checked_at: Nanos,
        last_renewal: Option<Nanos>,
    },
}

/// The name a storage Lease goes by among the witnesses: `lease:<namespace>/<name>`.
pub fn lease_witness(namespace: &str, name: &str) -> String {
    format!("lease:{namespace}/{name}")
}

/// Judges a node from its watchers' testimony and, on Kubernetes, its Leases (the kubelet's,
/// and any storage Lease the operator names, each with its witness name). A single witness that
/// still hears the node outweighs any number that lost it: a power-off kills a running node,
/// waiting does not. A node without watchers (a one-node cluster) cannot be judged. A Lease
/// never makes up for missing watchers: it can only veto or add its word.
pub fn second_opinion(testimony: &[Testimony], leases: &[(String, KubeletSays)]) -> PeerOpinion {
    let watchers = testimony.len();
    let mut hearers: Vec<String> = testimony
        .iter()
        .filter(|t| matches!(t.says, Says::Hears { .. }))
        .map(|t| t.watcher.clone())
        .collect();
    hearers.extend(
        leases
            .iter()
            .filter(|(_, says)| *says == KubeletSays::RenewedSinceLoss)
            .map(|(name, _)| name.clone()),
    );
    if !hearers.is_empty() {
        return PeerOpinion::Partitioned { hearers };
    }
    let mut agreed: Vec<PeerWitness> = testimony
        .iter()
        .filter_map(|t| match t.says {
            Says::Lost {
                view_at,
                last_heard,
            } => Some(PeerWitness {
                watcher: t.watcher.clone(),
                view_at,
                last_heard,
            }),
            _ => None,
        })
        .collect();
    let heard = agreed.len();
    if heard == 0 || heard * 2 < watchers {
        return PeerOpinion::TooFew { heard, watchers };
    }
    for (name, says) in leases {
        if let KubeletSays::NotSinceLoss {
            checked_at,
            last_renewal,
        } = says
        {
            agreed.push(PeerWitness {
                watcher: name.clone(),
                view_at: *checked_at,
                last_heard: *last_renewal,
            });
        }
    }
    PeerOpinion::Lost { agreed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(w: &str, says: Says) -> Testimony {
        Testimony {
            watcher: w.into(),
            says,
        }
    }

    fn lost(at: Nanos) -> Says {
        Says::Lost {
            view_at: at,
            last_heard: Some(at - 3),
        }
    }

    #[test]
    fn all_heard_watchers_lost_it_is_a_verdict_of_lost_with_each_witness() {
        let o = second_opinion(
            &[t("a", lost(10)), t("b", lost(11)), t("c", Says::Unheard)],
            &[],
        );
        let PeerOpinion::Lost { agreed } = o else {
            panic!("{o:?}")
        };
        assert_eq!(
            agreed
                .iter()
                .map(|w| w.watcher.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(agreed[1].last_heard, Some(8));
    }

    #[test]
    fn one_watcher_that_hears_the_node_makes_it_partitioned() {
        let o = second_opinion(
            &[
                t("a", lost(10)),
                t("b", lost(10)),
                t("c", Says::Hears { view_at: 10 }),
            ],
            &[],
        );
        assert_eq!(
            o,
            PeerOpinion::Partitioned {
                hearers: vec!["c".into()]
            }
        );
    }

    #[test]
    fn fewer_than_half_heard_or_no_watchers_is_no_judgement() {
        let o = second_opinion(
            &[
                t("a", lost(1)),
                t("b", Says::Unheard),
                t("c", Says::Unheard),
            ],
            &[],
        );
        assert_eq!(
            o,
            PeerOpinion::TooFew {
                heard: 1,
                watchers: 3
            }
        );
        assert_eq!(
            second_opinion(&[], &[]),
            PeerOpinion::TooFew {
                heard: 0,
                watchers: 0
            }
        );
        // Half is enough: in a three-node cluster one dead node leaves one of two watchers of
        // the next.
        assert!(matches!(
            second_opinion(&[t("a", lost(1)), t("b", Says::Unheard)], &[]),
            PeerOpinion::Lost { .. }
        ));
    }

    /// A storage Lease the node still renews is a witness of its life like the kubelet's: it
    /// vetoes the fence even when the kubelet's Lease is stale; stale, each adds its word.
    #[test]
    fn a_renewed_storage_lease_vetoes_and_stale_leases_each_add_their_word() {
        let peers = [t("a", lost(10)), t("b", lost(10))];
        let stale = KubeletSays::NotSinceLoss {
            checked_at: 20,
            last_renewal: Some(4),
        };
        let storage = lease_witness("storage", "n1-lease");
        assert_eq!(storage, "lease:storage/n1-lease");
        let o = second_opinion(
            &peers,
            &[
                (KUBELET_WITNESS.into(), stale.clone()),
                (storage.clone(), KubeletSays::RenewedSinceLoss),
            ],
        );
        assert_eq!(
            o,
            PeerOpinion::Partitioned {
                hearers: vec![storage.clone()]
            }
        );
        let PeerOpinion::Lost { agreed } = second_opinion(
            &peers,
            &[
                (KUBELET_WITNESS.into(), stale.clone()),
                (storage.clone(), stale),
            ],
        ) else {
            panic!()
        };
        let names: Vec<&str> = agreed.iter().map(|w| w.watcher.as_str()).collect();
        assert_eq!(names, ["a", "b", KUBELET_WITNESS, storage.as_str()]);
    }

    #[test]
    fn a_kubelet_lease_renewed_since_the_loss_vetoes_and_a_stale_one_adds_its_word() {
        let peers = [t("a", lost(10)), t("b", lost(10))];
        assert_eq!(
            second_opinion(
                &peers,
                &[(KUBELET_WITNESS.into(), KubeletSays::RenewedSinceLoss)]
            ),
            PeerOpinion::Partitioned {
                hearers: vec![KUBELET_WITNESS.into()]
            }
        );
        let stale = KubeletSays::NotSinceLoss {
            checked_at: 20,
            last_renewal: Some(4),
        };
        let PeerOpinion::Lost { agreed } =
            second_opinion(&peers, &[(KUBELET_WITNESS.into(), stale.clone())])
        else {
            panic!()
        };
        assert_eq!(agreed.len(), 3);
        assert_eq!(agreed[2].watcher, KUBELET_WITNESS);
        assert_eq!(agreed[2].last_heard, Some(4));
        // It never stands in for the watchers.
        assert!(matches!(
            second_opinion(
                &[t("a", Says::Unheard)],
                &[(KUBELET_WITNESS.into(), stale.clone())]
            ),
            PeerOpinion::TooFew { .. }
        ));
    }

    fn says() -> impl Strategy<Value = Says> {
        prop_oneof![
            Just(Says::Unheard),
            (0i64..100).prop_map(|v| Says::Hears { view_at: v }),
            (0i64..100).prop_map(|v| Says::Lost {
                view_at: v,
                last_heard: None
            }),
        ]
    }

    proptest! {
        /// Lost is never the verdict while any watcher hears the node, and always needs at
        /// least half of the watchers; the order of the testimony does not matter.
        #[test]
        fn lost_needs_half_and_nobody_hearing(v in prop::collection::vec(says(), 0..12)) {
            let ts: Vec<Testimony> = v.iter().enumerate()
                .map(|(i, s)| t(&format!("w{i}"), s.clone())).collect();
            let o = second_opinion(&ts, &[]);
            let hears = v.iter().any(|s| matches!(s, Says::Hears { .. }));
            let lost = v.iter().filter(|s| matches!(s, Says::Lost { .. })).count();
            if let PeerOpinion::Lost { agreed } = &o {
                prop_assert!(!hears);
                prop_assert!(lost * 2 >= v.len() && lost > 0);
                prop_assert_eq!(agreed.len(), lost);
            }
            let mut rev = ts.clone();
            rev.reverse();
            prop_assert_eq!(std::mem::discriminant(&o), std::mem::discriminant(&second_opinion(&rev, &[])));
        }
    }
}
