//! Operators' NodeFences: requests to fence (objects without a flow yet), cancels (a delete or
//! the cancel annotation before the power-off), and the reasons written back into them.

use uuid::Uuid;

use super::{NodeFences, Result};
use crate::cluster::kube::nodefence::{
    CANCEL_ANNOTATION, flow_id, flow_of, has_condition, set_condition, time,
};
use crate::store::Requests;
use maintd_core::fencing::machine::{FenceRequest, FenceStatus};

impl NodeFences {
    /// NodeFences operators created (fences to start, oldest first), deleted or annotated
    /// (flows to cancel); a final flow's object being deleted loses its finalizer here.
    pub(super) async fn operator_requests(&self) -> Result<Requests> {
        let mut r = Requests::default();
        let mut start = Vec::new();
        for o in self.objects().await? {
            let name = o.metadata.name.clone().unwrap_or_default();
            let deleting = o.metadata.deletion_timestamp.is_some();
            let annotated = o
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CANCEL_ANNOTATION));
            match flow_of(&o) {
                Ok(Some(f)) => {
                    let answered = has_condition(o.status.as_ref(), "Canceled", "PoweredOff");
                    let open = f.status != FenceStatus::Final && !f.canceled && !answered;
                    if (deleting || annotated) && open {
                        r.cancel.push(f.id);
                    } else if deleting && f.status == FenceStatus::Final && Self::has_finalizer(&o)
                    {
                        self.finalizer(&o, false).await?;
                    }
                }
                Ok(None) => {
                    let refused = has_condition(o.status.as_ref(), "Accepted", "Refused");
                    let Some(id) = flow_id(&o) else { continue };
                    if deleting || annotated || refused {
                        continue;
                    }
                    let created = o.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    start.push((
                        created,
                        FenceRequest {
                            id,
                            node: o.spec.node.clone(),
                            by: format!("NodeFence/{name}"),
                            held: o.status.as_ref().and_then(|s| s.message.clone()),
                        },
                    ));
                }
                Err(e) => self.warn_unreadable(&o, &e),
            }
        }
        // Oldest first, as the gates let them through.
        start.sort_by(|a, b| (a.0, &a.1.by).cmp(&(b.0, &b.1.by)));
        r.start = start.into_iter().map(|(_, q)| q).collect();
        Ok(r)
    }

    /// Writes why a request waits (or is refused for good) into its status.
    pub(super) async fn hold_request(
        &self,
        request: &Uuid,
        why: &str,
        refused: bool,
    ) -> Result<()> {
        let Some(o) = self.find(request).await? else {
            return Ok(());
        };
        let now = time(crate::clock::steady_ns());
        let mut s = o.status.clone().unwrap_or_default();
        s.message = Some(why.to_string());
        let reason = if refused { "Refused" } else { "Waiting" };
        if refused && !has_condition(Some(&s), "Accepted", "Refused") {
            // The refusal is dated by itself, not by when the request began to wait: the
            // record is pruned a retention after it.
            s.conditions.retain(|c| c.type_ != "Accepted");
        }
        set_condition(&mut s.conditions, "Accepted", false, reason, why, &now);
        if refused {
            s.status = None;
        }
        self.put_status(&o, s).await?;
        Ok(())
    }
}

/// Runs the suite every flow store passes against the NodeFences of a cluster that has none
/// yet (for the real-control-plane tests, under the deploy RBAC).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub async fn conformance(client: kube::Client) {
    let store = NodeFences::new(client);
    store.check_installed().await.expect("the CRD is installed");
    crate::store::flow_conformance::suite(&store).await;
}
