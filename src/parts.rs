//! What every long-running part of the daemon is built from: the store, the backend, the
//! leadership, the clock and the membership. One value, handed to each part's
//! constructor, so adding a dependency changes one struct rather than every signature.

use std::sync::Arc;

use crate::clock::Clock;
use crate::cluster::{Backend, Unattached};
use crate::leader::Leadership;
use crate::members::{Members, NodeHealth, NodeView};
use crate::store::{FlowStore, Store};

#[derive(Clone)]
pub struct Shared {
    pub store: Arc<Store>,
    /// Where fence flows are read and written (the SQLite store by default).
    pub flows: Arc<dyn FlowStore>,
    /// The backend's capabilities.
    pub cluster: Backend,
    pub leadership: Arc<Leadership>,
    /// Read once per decision; simulated in the harness.
    pub clock: Arc<dyn Clock>,
    /// The managed nodes (kept current by the node watch on Kubernetes).
    pub members: Arc<Members>,
    /// Node conditions and kubelet Leases (Kubernetes only).
    pub watch: Option<Arc<NodeView>>,
    /// When each node last reported itself healthy (written by the poller).
    pub health: Arc<NodeHealth>,
}

impl Shared {
    /// The dependencies of a part run on its own (the benchmarks): no backend, one replica that
    /// leads, the system clock, nothing known of the nodes' health.
    pub fn standalone(store: Arc<Store>, members: Arc<Members>) -> Shared {
        Shared {
            flows: store.clone(),
            leadership: Arc::new(Leadership::single("bench".into(), store.clone())),
            store,
            cluster: Backend::basic(Arc::new(Unattached)),
            clock: Arc::new(crate::clock::SystemClock),
            members,
            watch: None,
            health: Arc::new(NodeHealth::default()),
        }
    }
}
