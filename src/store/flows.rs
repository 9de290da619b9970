//! Fence flows: the `FlowStore` seam the fencer and the API read and write them through, and
//! its SQLite implementation (each flow as JSON with an optimistic version).

use super::*;
use maintd_core::fencing::machine::FlowOutcome;

/// The suite every `FlowStore` passes; public so that the real-control-plane tests run it
/// against NodeFences. Test code only: built for this crate's tests and with the `testing`
/// feature, never shipped.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod conformance;

/// Where fence flows live. The fencer decides from what it reads here on every tick and writes
/// back each decision and each effect's outcome, so a second implementation (fence state kept
/// in cluster objects, say) slots in behind this trait and must pass `conformance::suite`.
#[async_trait::async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// Records a new flow (version 0).
    async fn insert(&self, f: &Flow) -> Result<()>;
    /// Saves `f` unless it changed since it was read (its `version`); returns whether it did.
    async fn save(&self, f: &Flow) -> Result<bool>;
    /// Reads flow `id`, lets `change` change it (false: nothing to write) and writes it back
    /// unless another write landed meanwhile (then reads and tries again): the one
    /// read-modify-write every record below is made of. The flow as changed; `None` when
    /// there is no such flow.
    async fn update(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>>;
    /// Records what an effect saw: a step attempt (with its agent calls), a release or a reclaim.
    async fn set_outcome(
        &self,
        id: &Uuid,
        which: FlowOutcome,
        outcome: Outcome,
        calls: Vec<Call>,
    ) -> Result<()> {
        self.update(id, &mut |f| {
            f.record_outcome(which, outcome.clone(), calls.clone());
            true
        })
        .await?;
        Ok(())
    }
    /// Records an agent call before it is made (`call.pending`), so a successor knows of it
    /// even when this daemon stops before the answer; its outcome later replaces it.
    async fn note_call(&self, id: &Uuid, call: Call) -> Result<()> {
        self.update(id, &mut |f| {
            f.record_call(call.clone());
            true
        })
        .await?;
        Ok(())
    }
    /// Notes that the node carries the flow's failure tag.
    async fn mark_tagged(&self, id: &Uuid) -> Result<()> {
        self.update(id, &mut |f| {
            f.tagged = true;
            true
        })
        .await?;
        Ok(())
    }
    /// An operator's cancel: only before the node was powered off.
    async fn cancel(&self, id: &Uuid, now: Nanos) -> Result<FenceCancel> {
        let mut verdict = FenceCancel::NotFound;
        let f = self
            .update(id, &mut |f| {
                verdict = apply_cancel(f, now);
                matches!(verdict, FenceCancel::Canceled(_))
            })
            .await?;
        Ok(if f.is_none() {
            FenceCancel::NotFound
        } else {
            verdict
        })
    }
    /// The flows the fencer decides on: every one not final, and final ones ended at or after
    /// `since`, oldest first.
    async fn active(&self, since: Nanos) -> Result<Vec<Flow>>;
    /// What `active` returns, read to be shown: where the store has a reading path of its
    /// own, the API's reads then neither wait for the fencer's and the engine's nor hold
    /// them up.
    async fn shown(&self, since: Nanos) -> Result<Vec<Flow>> {
        self.active(since).await
    }
    /// Up to `limit` flows, newest first, to be shown (read as `shown` is).
    async fn recent(&self, limit: usize) -> Result<Vec<Flow>>;
    async fn get(&self, id: &Uuid) -> Result<Option<Flow>>;
    /// Deletes final flows that ended before `ended_before`; returns how many, so the store
    /// of record never grows without bound.
    async fn prune(&self, ended_before: Nanos) -> Result<usize>;
    /// What operators asked for outside the API (on Kubernetes: NodeFence objects created,
    /// deleted or annotated with kubectl). A store without such objects has none.
    async fn requests(&self) -> Result<Requests> {
        Ok(Requests::default())
    }
    /// Records why a request did not start (yet): its gate, or its refusal for good.
    async fn hold(&self, _request: &Uuid, _why: &str, _refused: bool) -> Result<()> {
        Ok(())
    }
    /// Whether every replica reads the same flows (cluster objects): a write is then shared
    /// when it returns, with no checkpoint needed before an effect.
    fn shared(&self) -> bool {
        false
    }
    /// Where the flows are, for error messages.
    fn location(&self) -> String;
}

/// Operators' requests found in the flow store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    /// Fences to start, oldest first.
    pub start: Vec<FenceRequest>,
    /// Flows to cancel (the same rules as the API's cancel).
    pub cancel: Vec<Uuid>,
}

#[async_trait::async_trait]
impl FlowStore for Store {
    async fn insert(&self, f: &Flow) -> Result<()> {
        self.insert_flow(f)
    }
    async fn save(&self, f: &Flow) -> Result<bool> {
        self.save_flow(f)
    }
    async fn update(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>> {
        self.update_flow(id, change)
    }
    async fn active(&self, since: Nanos) -> Result<Vec<Flow>> {
        self.fence_flows(&self.conn(), since)
    }
    async fn shown(&self, since: Nanos) -> Result<Vec<Flow>> {
        self.fence_flows(&self.reader(), since)
    }
    async fn recent(&self, limit: usize) -> Result<Vec<Flow>> {
        self.all_flows(limit)
    }
    async fn get(&self, id: &Uuid) -> Result<Option<Flow>> {
        self.flow(id)
    }
    async fn prune(&self, ended_before: Nanos) -> Result<usize> {
        Ok(self.conn().execute(
            "DELETE FROM fences WHERE status = 'final' AND updated_ns < ?1",
            [ended_before],
        )?)
    }
    fn location(&self) -> String {
        self.path().to_string()
    }
}

/// Outcome of an operator's cancel of a fence flow.
#[derive(Debug, PartialEq)]
pub enum FenceCancel {
    Canceled(Box<Flow>),
    NotFound,
    Final,
    PoweredOff,
    PowerOffRunning,
    AlreadyCanceled,
}

/// An operator's cancel of `f` at `now`, and what it came to: the same in every flow store.
pub(crate) fn apply_cancel(f: &mut Flow, now: Nanos) -> FenceCancel {
    use maintd_core::fencing::machine::CancelRefused;
    match f.cancel(now) {
        Ok(()) => FenceCancel::Canceled(Box::new(f.clone())),
        Err(CancelRefused::Final) => FenceCancel::Final,
        Err(CancelRefused::PoweredOff) => FenceCancel::PoweredOff,
        Err(CancelRefused::PowerOffRunning) => FenceCancel::PowerOffRunning,
        Err(CancelRefused::AlreadyCanceled) => FenceCancel::AlreadyCanceled,
    }
}

impl FenceCancel {
    /// What the cancel did, or why it was refused, for the log and the flow's record.
    pub fn describe(&self) -> &'static str {
        match self {
            FenceCancel::Canceled(_) => "canceled",
            FenceCancel::NotFound => "no such fence flow",
            FenceCancel::Final => "the flow is already final",
            FenceCancel::PoweredOff => {
                "the node is already powered off; only its recovery returns it to service"
            }
            FenceCancel::PowerOffRunning => {
                "the power-off is running; it goes to its verified end, then only recovery returns the node to service"
            }
            FenceCancel::AlreadyCanceled => "already canceled",
        }
    }
}

fn flow_from_row(r: &Row) -> Result<Flow> {
    let data: String = r.get(0)?;
    let version: i64 = r.get(1)?;
    let mut f: Flow =
        serde_json::from_str(&data).map_err(|e| corrupt(format!("fence flow: {e}")))?;
    f.version = version as u64;
    Ok(f)
}

/// A new flow's row (version 0).
fn insert_row(c: &Connection, f: &Flow) -> Result<()> {
    let data = serde_json::to_string(f).map_err(|e| corrupt(e.to_string()))?;
    c.execute(
        "INSERT INTO fences (id, node, status, version, created_ns, updated_ns, data) VALUES (?1,?2,?3,0,?4,?5,?6)",
        params![f.id.to_string(), f.node, f.status.as_str(), f.created, f.updated, data],
    )?;
    Ok(())
}

impl Store {
    pub fn insert_flow(&self, f: &Flow) -> Result<()> {
        insert_row(&self.conn(), f)
    }

    /// Saves a flow unless someone changed it since it was loaded; returns whether it was saved.
    pub fn save_flow(&self, f: &Flow) -> Result<bool> {
        let data = serde_json::to_string(f).map_err(|e| corrupt(e.to_string()))?;
        let n = self.conn().execute(
            "UPDATE fences SET status=?2, updated_ns=?3, data=?4, version=version+1 WHERE id=?1 AND version=?5",
            params![f.id.to_string(), f.status.as_str(), f.updated, data, f.version as i64],
        )?;
        Ok(n == 1)
    }

    /// Read-modify-write of one flow in a transaction.
    fn update_flow(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let f = {
            let mut stmt = tx.prepare_cached("SELECT data, version FROM fences WHERE id=?1")?;
            let mut rows = stmt.query([id.to_string()])?;
            match rows.next()? {
                Some(r) => Some(flow_from_row(r)?),
                None => None,
            }
        };
        let Some(mut f) = f else {
            return Ok(None);
        };
        if !change(&mut f) {
            return Ok(Some(f));
        }
        let data = serde_json::to_string(&f).map_err(|e| corrupt(e.to_string()))?;
        tx.execute(
            "UPDATE fences SET status=?2, updated_ns=?3, data=?4, version=version+1 WHERE id=?1",
            params![id.to_string(), f.status.as_str(), f.updated, data],
        )?;
        tx.commit()?;
        Ok(Some(f))
    }

    /// Flows the fencer decides on: every one not final, and final ones ended after `since`.
    fn fence_flows(&self, c: &Connection, since: Nanos) -> Result<Vec<Flow>> {
        collect(
            c.prepare_cached(
                "SELECT data, version FROM fences WHERE status != 'final' OR updated_ns >= ?1 ORDER BY created_ns",
            )?,
            [since],
            flow_from_row,
        )
    }

    /// Writes `flows` as they are (`maintd store migrate --to sqlite`), after deleting every
    /// flow here when `replace`; in one transaction.
    pub fn put_flows(&self, flows: &[Flow], replace: bool) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        if replace {
            tx.execute("DELETE FROM fences", [])?;
        }
        for f in flows {
            insert_row(&tx, f)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every flow, newest first, for the API.
    pub fn all_flows(&self, limit: usize) -> Result<Vec<Flow>> {
        let c = self.reader();
        collect(
            c.prepare_cached("SELECT data, version FROM fences ORDER BY created_ns DESC LIMIT ?1")?,
            [limit as i64],
            flow_from_row,
        )
    }

    pub fn flow(&self, id: &Uuid) -> Result<Option<Flow>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached("SELECT data, version FROM fences WHERE id=?1")?;
        let mut rows = stmt.query([id.to_string()])?;
        match rows.next()? {
            Some(r) => Ok(Some(flow_from_row(r)?)),
            None => Ok(None),
        }
    }
}
