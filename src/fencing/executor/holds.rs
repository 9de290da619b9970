//! What holds the fencer's hand on a node: an operator's maintenance, someone else working on
//! the node (another operator's maintenance or remediation, as the cluster knows it), and the
//! per-node claim maintd takes before it acts, so that it and another remediator never act on
//! one node at once.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{error, info, warn};

use crate::sync::LockExt;

use super::Fencer;
use crate::cluster::Purpose;
use maintd_core::fencing::machine::{FenceStatus, Flow, Ready, Record};
use maintd_core::verdict::Nanos;

impl Fencer {
    /// Asks for the fence Secrets while this replica leads (a standby reads none), and says
    /// whether a leader must wait for them: a plan from the ConfigMaps without its Secret
    /// values must never run an agent, resume a flow or start one.
    pub(super) fn secrets_pending(&self) -> bool {
        let leader = self.shared.leadership.is_leader();
        let book = &self.settings.book;
        book.want_secrets(leader);
        let pending = leader && book.secrets_pending();
        let mut said = self.secrets_wait_said.lock_unpoisoned();
        if pending && !*said {
            info!("leading: the fence Secrets are being read; fencing acts once they are");
        }
        *said = pending;
        pending
    }

    /// Nodes in maintenance, with why: operators' (from the store) and those someone else is
    /// working on (from the cluster). A store that cannot be read keeps every node's fence held
    /// rather than let one through that a person may be working on.
    pub(super) fn maintenance(&self, now: Nanos) -> BTreeMap<String, String> {
        let mut out = match self.shared.store.maintenance(now) {
            Ok(all) => all
                .into_iter()
                .map(|m| {
                    let why = format!("in maintenance by {} ({})", m.by, m.reason);
                    (m.node, why)
                })
                .collect(),
            Err(e) => {
                error!(error = %e, db = %self.shared.store.path(), "cannot read which nodes are in maintenance; every node is held as if it were");
                self.shared
                    .members
                    .get()
                    .iter()
                    .map(|n| (n.name.clone(), format!("maintenance unknown: {e}")))
                    .collect::<BTreeMap<_, _>>()
            }
        };
        for (node, why) in self.shared.cluster.held_elsewhere() {
            out.entry(node).or_insert(why);
        }
        out
    }

    /// Claims every node with an open flow or one about to start (and gives back the claims of
    /// flows that ended). Nothing decided for a node whose claim is refused is done this time:
    /// its next decision sees who holds it and holds the node as in maintenance.
    pub(super) async fn claim_nodes(&self, flows: &[Flow], mut ready: Ready) -> Ready {
        let mut want: BTreeSet<String> = flows
            .iter()
            .filter(|f| f.status != FenceStatus::Final)
            .map(|f| f.node.clone())
            .collect();
        want.extend(ready.records.iter().filter_map(|r| match r {
            Record::Start(f) => Some(f.node.clone()),
            _ => None,
        }));
        let Some(claims) = &self.shared.cluster.claims else {
            return ready;
        };
        let refused = claims.hold_nodes(Purpose::Fence, &want).await;
        if refused.is_empty() {
            return ready;
        }
        for (node, why) in &refused {
            warn!(node = %node, why = %why, "the node cannot be claimed: nothing is done on it this time");
        }
        ready.retain_nodes(|n| !refused.contains_key(n));
        ready
    }
}
