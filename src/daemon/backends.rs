//! What each backend hands the daemon before its parts are assembled: the backend itself, the
//! managed nodes, who leads, where fence flows live, the fence plans in force and where the
//! ConfigMap ones come from. Kubernetes discovers nodes and may elect a leader; Ganeti acts
//! only on its master and watches for a failover; the inventory reads the configuration.

use crate::cluster::Backend;
use std::sync::Arc;

use tracing::info;

use super::DaemonError;
use crate::cluster::etcd::flows::EtcdFlows;
use crate::cluster::etcd::{Etcd, StoreBackend};
use crate::cluster::ganeti::Ganeti;
use crate::cluster::kube::KubeCluster;
use crate::cluster::maps::MapSource;
use crate::cluster::{ClusterError, Inventory};
use crate::config::Config;
use crate::fencing::book::{PlanBook, Plans};
use crate::leader::{Election, Leadership};
use crate::members::NodeView;
use crate::node::NodeConfig;
use crate::store::checkpoint::WithoutFlows;
use crate::store::{FlowStore, Store};

/// The managed nodes, who leads, the node watch (Kubernetes), and where fence flows live.
pub struct Membership {
    pub nodes: Vec<NodeConfig>,
    pub leadership: Leadership,
    pub watch: Option<Arc<NodeView>>,
    pub flows: Arc<dyn FlowStore>,
}

/// A backend ready for the assembly.
pub struct Ready {
    pub cluster: Backend,
    pub membership: Membership,
    pub book: Arc<PlanBook>,
    /// The fence ConfigMaps the book follows (Kubernetes, with `fence-configmaps`).
    pub maps: Option<Arc<dyn MapSource>>,
}

/// The Kubernetes backend: nodes discovered from the API (the node watch keeps them current),
/// leader election when enabled, flows in NodeFence objects when enabled.
pub async fn kubernetes(
    cfg: &Config,
    store: &Arc<Store>,
    plans: Plans,
) -> Result<Ready, DaemonError> {
    let k = Arc::new(KubeCluster::connect(cfg.kubernetes.clone()).await?);
    let nodes: Vec<NodeConfig> = k
        .nodes()
        .await?
        .into_iter()
        .map(|(name, collector)| NodeConfig { name, collector })
        .collect();
    info!(nodes = nodes.len(), selector = %cfg.kubernetes.label_selector, "nodes discovered from the Kubernetes API");
    let rules = cfg
        .kubernetes
        .conditions
        .iter()
        .map(|r| r.rule())
        .collect::<Result<Vec<_>, _>>()?;
    let watch = NodeView::new(rules, cfg.kubernetes.node_interval);
    let le = cfg.kubernetes.leader_election.clone();
    // With NodeFences the flows are shared by the objects themselves: the checkpoint carries
    // the rest of the decision state only.
    let (flows, state): (Arc<dyn FlowStore>, Arc<dyn crate::store::Checkpoint>) =
        if cfg.kubernetes.nodefences {
            let fences = k.node_fences();
            fences.check_installed().await?;
            (Arc::new(fences), Arc::new(WithoutFlows(store.clone())))
        } else {
            (store.clone(), store.clone())
        };
    let leadership = if le.enabled {
        Leadership::elected(k.clone(), (&le).into(), state)
    } else {
        Leadership::single(le.identity(), state)
    };
    let (book, maps) = if cfg.kubernetes.fence_configmaps {
        let maps = k.watch_configmaps(crate::fencing::configmaps::is_fence_map);
        let maps: Arc<dyn MapSource> = Arc::new(maps);
        (Arc::new(PlanBook::with_configmaps(plans)), Some(maps))
    } else {
        (Arc::new(PlanBook::fixed(plans)), None)
    };
    let membership = Membership {
        nodes,
        leadership,
        watch: Some(Arc::new(watch)),
        flows,
    };
    Ok(Ready {
        cluster: k.backend(),
        membership,
        book,
        maps,
    })
}

/// The Ganeti backend, on its master only. This node's ssconf is read first: on a non-master
/// the documented `rapi-url` (this host) has no RAPI to ask, and the answer there is "not
/// master" (exit 11), not a refused connection. A node whose ssconf says it is master asks
/// Ganeti's own vote. Returns the backend and this node's name.
pub async fn ganeti(
    cfg: &Config,
    store: &Arc<Store>,
    plans: Plans,
) -> Result<(Ready, MasterWatch), DaemonError> {
    let g = Arc::new(Ganeti::connect(&cfg.ganeti)?);
    let node = cfg.ganeti.this_node(&cfg.host);
    let master = match g.ssconf_master() {
        Some(m) if m != node => m,
        _ => g.master().await?,
    };
    if node != master {
        return Err(DaemonError::NotGanetiMaster { node, master });
    }
    let nodes = g.members().await?;
    info!(nodes = nodes.len(), %master, "nodes read from the Ganeti RAPI");
    let membership = Membership {
        nodes,
        leadership: Leadership::single(node.clone(), store.clone()),
        watch: None,
        flows: store.clone(),
    };
    let ready = Ready {
        cluster: g.clone().backend(),
        membership,
        book: Arc::new(PlanBook::fixed(plans)),
        maps: None,
    };
    Ok((ready, MasterWatch { g, node }))
}

/// The local inventory: the configured nodes and flows in SQLite; one master, or (with
/// `[store] backend = "etcd"`) a leader elected in etcd that keeps the fence flows and shares
/// the rest of the decision state there.
pub async fn inventory(
    cfg: &Config,
    store: &Arc<Store>,
    plans: Plans,
) -> Result<Ready, DaemonError> {
    let inv = Arc::new(Inventory::new(cfg.inventory_settings(), store.clone())?);
    let (leadership, flows): (Leadership, Arc<dyn FlowStore>) = match cfg.store.backend {
        StoreBackend::Sqlite => (
            Leadership::single(cfg.host.clone(), store.clone()),
            store.clone(),
        ),
        StoreBackend::Etcd => {
            let s = &cfg.store;
            let etcd = Arc::new(Etcd::connect(s).await.map_err(ClusterError::from)?);
            let election = Election {
                identity: s.identity(&cfg.host),
                place: etcd.location(),
                backend: "etcd",
                lease_duration: s.lease_duration,
                renew_deadline: s.renew_deadline,
                retry_period: s.retry_period,
            };
            info!(identity = %election.identity, at = %election.place, "the decision state is shared on etcd");
            // Fence flows live in keys of their own, each write shared as it lands (and
            // fenced by the token); the checkpoint carries the rest of the decision state.
            let flows = Arc::new(EtcdFlows::new(etcd.clone()));
            let state = Arc::new(WithoutFlows(store.clone()));
            (Leadership::elected(etcd, election, state), flows)
        }
    };
    let membership = Membership {
        nodes: cfg.nodes.clone(),
        leadership,
        watch: None,
        flows,
    };
    Ok(Ready {
        cluster: Backend::basic(inv),
        membership,
        book: Arc::new(PlanBook::fixed(plans)),
        maps: None,
    })
}

/// Who Ganeti says the master is, asked by this node, its master.
pub struct MasterWatch {
    g: Arc<Ganeti>,
    pub node: String,
}

impl MasterWatch {
    /// Every few seconds asks Ganeti who the master is; returns the new master once it is
    /// another node. A RAPI that does not answer is no proof of a failover.
    pub async fn lost(&self) -> String {
        let (g, node) = (&self.g, &self.node);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            match g.current_master().await {
                Ok(m) if m != *node => {
                    tracing::error!(node = %node, master = %m, "Ganeti made another node master: stopping");
                    return m;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot ask Ganeti who the master is"),
            }
        }
    }
}
