//! A counter of writes that change what the API shows (events, jobs, fence flows, node polls),
//! with a signal for whoever waits on it: API watchers answer within moments of a change
//! instead of polling, and the API keeps a built answer until the counter moves.

use std::sync::Arc;

use tokio::sync::watch;
use uuid::Uuid;

use super::{FenceCancel, FlowStore, Requests, Result};
use maintd_core::fencing::machine::FlowOutcome;
use maintd_core::fencing::machine::{Call, Flow};
use maintd_core::verdict::{Nanos, Outcome};

/// Which part of the state moved: watchers of events need not wake for a poll cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generation {
    /// Events, their jobs and fence flows.
    pub events: u64,
    /// Node poll records.
    pub nodes: u64,
}

#[derive(Clone)]
pub struct Changes(Arc<watch::Sender<Generation>>);

impl Default for Changes {
    fn default() -> Self {
        Changes(Arc::new(watch::channel(Generation::default()).0))
    }
}

impl Changes {
    pub fn events_changed(&self) {
        self.0.send_modify(|g| g.events += 1);
    }

    pub fn nodes_changed(&self) {
        self.0.send_modify(|g| g.nodes += 1);
    }

    pub fn now(&self) -> Generation {
        *self.0.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<Generation> {
        self.0.subscribe()
    }
}

/// A flow store that counts its writes as event changes (fence flows show in `/1/status`).
pub struct CountedFlows {
    inner: Arc<dyn FlowStore>,
    changes: Changes,
}

impl CountedFlows {
    pub fn wrap(inner: Arc<dyn FlowStore>, changes: Changes) -> Arc<dyn FlowStore> {
        Arc::new(CountedFlows { inner, changes })
    }

    fn counted<T>(&self, r: Result<T>) -> Result<T> {
        self.changes.events_changed();
        r
    }
}

#[async_trait::async_trait]
impl FlowStore for CountedFlows {
    async fn insert(&self, f: &Flow) -> Result<()> {
        self.counted(self.inner.insert(f).await)
    }
    async fn save(&self, f: &Flow) -> Result<bool> {
        self.counted(self.inner.save(f).await)
    }
    async fn update(
        &self,
        id: &Uuid,
        change: &mut (dyn for<'f> FnMut(&'f mut Flow) -> bool + Send),
    ) -> Result<Option<Flow>> {
        self.counted(self.inner.update(id, change).await)
    }
    async fn set_outcome(
        &self,
        id: &Uuid,
        which: FlowOutcome,
        outcome: Outcome,
        calls: Vec<Call>,
    ) -> Result<()> {
        self.counted(self.inner.set_outcome(id, which, outcome, calls).await)
    }
    async fn mark_tagged(&self, id: &Uuid) -> Result<()> {
        self.counted(self.inner.mark_tagged(id).await)
    }
    async fn note_call(&self, id: &Uuid, call: Call) -> Result<()> {
        self.counted(self.inner.note_call(id, call).await)
    }
    async fn cancel(&self, id: &Uuid, now: Nanos) -> Result<FenceCancel> {
        self.counted(self.inner.cancel(id, now).await)
    }
    async fn active(&self, since: Nanos) -> Result<Vec<Flow>> {
        self.inner.active(since).await
    }
    async fn shown(&self, since: Nanos) -> Result<Vec<Flow>> {
        self.inner.shown(since).await
    }
    async fn recent(&self, limit: usize) -> Result<Vec<Flow>> {
        self.inner.recent(limit).await
    }
    async fn get(&self, id: &Uuid) -> Result<Option<Flow>> {
        self.inner.get(id).await
    }
    async fn prune(&self, ended_before: Nanos) -> Result<usize> {
        self.counted(self.inner.prune(ended_before).await)
    }
    async fn requests(&self) -> Result<Requests> {
        self.inner.requests().await
    }
    async fn hold(&self, request: &Uuid, why: &str, refused: bool) -> Result<()> {
        self.counted(self.inner.hold(request, why, refused).await)
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}
