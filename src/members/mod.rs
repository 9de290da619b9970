//! The managed nodes: the one membership the poller, the fencer and live repairs read
//! (`Members`, here), each node's health as the poller saw it (`health`), what the cluster says
//! of the nodes and their conditions on Kubernetes (`view`), and the membership read again from
//! a backend without a watch (`refresh`).

use std::sync::{Arc, RwLock};

use crate::node::NodeConfig;
use crate::sync::RwLockExt;

mod health;
mod refresh;
mod view;

pub use health::{Health, NodeHealth};
pub use refresh::refresh;
pub use view::NodeView;

/// The managed nodes, replaced as a whole when discovery sees a change.
pub struct Members(RwLock<Arc<Vec<NodeConfig>>>);

impl Members {
    pub fn new(nodes: Vec<NodeConfig>) -> Members {
        Members(RwLock::new(Arc::new(nodes)))
    }

    pub fn get(&self) -> Arc<Vec<NodeConfig>> {
        self.0.read_unpoisoned().clone()
    }

    pub fn set(&self, nodes: Vec<NodeConfig>) {
        *self.0.write_unpoisoned() = Arc::new(nodes);
    }

    pub fn find(&self, node: &str) -> Option<NodeConfig> {
        self.get().iter().find(|n| n.name == node).cloned()
    }
}
