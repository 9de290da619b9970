//! The master daemon (`maintd daemon`): master lock, state store, backend, poller, engine and
//! the HTTP API, wired together and shut down together.

pub mod api;
pub mod lock;

use std::future::Future;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tracing::{Instrument, info, info_span};

use crate::cluster::kube::KubeCluster;
use crate::cluster::{Cluster, ClusterError, Inventory};
use crate::config::Config;
use crate::node::NodeConfig;
use crate::report::{Key, KeyError};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Listen(#[source] std::io::Error),
    #[error("API server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// A task that runs for the daemon's lifetime ended before shutdown was asked for.
    #[error("{task} stopped unexpectedly: {detail}")]
    TaskEnded { task: &'static str, detail: String },
    #[error(transparent)]
    Rules(#[from] crate::repair::conditions::RuleError),
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
}

impl DaemonError {
    /// Process exit code: 11 when another daemon is the master, as in Ganeti.
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Lock(lock::LockError::Held { .. }) => lock::EXIT_NOT_MASTER,
            DaemonError::Leader(_) => crate::leader::EXIT_LOST_LEADERSHIP,
            _ => 1,
        }
    }
}

pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let lock = lock::acquire(&cfg.daemon.state_dir)?;
    warn_lost_database(&cfg);
    let store = Arc::new(Store::open(&cfg.db_path())?);
    if cfg.cluster.backend == "kubernetes" {
        let k = KubeCluster::connect(cfg.kubernetes.clone()).await?;
        // The managed nodes and their collectors come from the API (read at start-up; the node
        // watch keeps them current).
        let nodes: Vec<NodeConfig> = k
            .nodes()
            .await?
            .into_iter()
            .map(|(name, collector)| NodeConfig { name, collector })
            .collect();
        info!(nodes = nodes.len(), selector = %cfg.kubernetes.label_selector, "nodes discovered from the Kubernetes API");
        let k = Arc::new(k);
        let rules = cfg
            .kubernetes
            .conditions
            .iter()
            .map(|r| r.rule())
            .collect::<Result<Vec<_>, _>>()?;
        let watch = Arc::new(crate::members::NodeView::new(
            rules,
            cfg.kubernetes.node_interval,
        ));
        let le = cfg.kubernetes.leader_election.clone();
        let leadership = if le.enabled {
            crate::leader::Leadership::elected(k.clone(), le, store.clone())
        } else {
            crate::leader::Leadership::single(le.identity(), store.clone())
        };
        run_with(
            &cfg,
            nodes,
            store,
            k,
            lock,
            leadership,
            Some(watch),
            shutdown,
        )
        .await
    } else {
        let inv = Inventory::new(cfg.inventory_settings(), store.clone())?;
        let me = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        let leadership = crate::leader::Leadership::single(me, store.clone());
        let nodes = cfg.nodes.clone();
        let inv = Arc::new(inv);
        run_with(&cfg, nodes, store, inv, lock, leadership, None, shutdown).await
    }
}

/// A missing database beside job directories means the previous state was lost (deleted, or a
/// wrong `db` path): jobs those directories describe will not be resumed.
fn warn_lost_database(cfg: &Config) {
    let db = cfg.db_path();
    let jobs = cfg.daemon.state_dir.join("jobs");
    if db.exists() {
        return;
    }
    let n = std::fs::read_dir(&jobs).map(|d| d.count()).unwrap_or(0);
    if n > 0 {
        tracing::warn!(
            db = %db.display(),
            jobs = %jobs.display(),
            count = n,
            "the state database is missing but job directories exist: the previous state is lost and those jobs will not be resumed"
        );
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_with<C: Cluster>(
    cfg: &Config,
    nodes: Vec<NodeConfig>,
    store: Arc<Store>,
    cluster: Arc<C>,
    _lock: lock::MasterLock,
    mut leadership: crate::leader::Leadership,
    watch: Option<Arc<crate::members::NodeView>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let key = Key::load(&cfg.cluster.key_file)?;
    let node_names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let plans = cfg
        .fencing
        .plans(&node_names)
        .map_err(crate::config::ConfigError::from)?;
    let listener = crate::http::bind(cfg.daemon.listen)
        .await
        .map_err(DaemonError::Listen)?;
    let mut registry = Registry::default();
    let metrics = crate::metrics::Metrics::register(&mut registry);
    let wake = Arc::new(Notify::new());
    let fence_wake = Arc::new(Notify::new());
    leadership.wake = vec![wake.clone(), fence_wake.clone()];
    let leadership = Arc::new(leadership);
    let node_count = nodes.len();
    let members = Arc::new(crate::members::Members::new(nodes));
    let engine = Arc::new(crate::repair::engine::Engine {
        store: store.clone(),
        cluster: cluster.clone(),
        poller: crate::repair::poller::Poller::new(
            cfg.poll_settings(),
            members.clone(),
            key.clone(),
            store.clone(),
            metrics.clone(),
        )?,
        repairs: crate::repair::live::LiveRepairs::new(
            key.clone(),
            cfg.daemon.live_repair_timeout,
            members.clone(),
        ),
        policy: cfg.actions,
        poll_interval: cfg.daemon.poll_interval,
        wake: wake.clone(),
        metrics,
        leadership: leadership.clone(),
        watch: watch.clone(),
        max_disruptions: cfg.kubernetes.max_disruptions,
        resumed_term: std::sync::atomic::AtomicU64::new(0),
        health: Arc::new(crate::repair::engine::Health::new(crate::report::now_ns())),
        clock: Arc::new(crate::clock::SystemClock),
    });
    let redact =
        crate::fencing::redact::Redactor::new(plans.values().flat_map(|p| p.secrets()).cloned());
    let agents: Arc<dyn crate::fencing::agent::AgentRunner> =
        Arc::new(crate::fencing::agent::Agents {
            dir: cfg.fencing.agents_dir.clone(),
            redact,
        });
    let fencer = (!plans.is_empty()).then(|| {
        let mut f = crate::fencing::executor::Fencer::new(
            &cfg.fencing,
            plans.clone(),
            store.clone(),
            cluster.clone(),
            agents.clone(),
            // The client's own deadline is the longest patience; each probe waits its node's.
            Arc::new(crate::link::HttpLink::new(
                key.clone(),
                cfg.fencing.liveness_timeout_max,
            )),
            engine.metrics.clone(),
            leadership.clone(),
            members.clone(),
            cfg.peering_settings(),
            key.clone(),
        );
        f.wake = fence_wake.clone();
        f.watch = watch.clone();
        Arc::new(f)
    });
    let readiness = (!plans.is_empty()).then(|| {
        let f = &cfg.fencing;
        let mut r = crate::fencing::readiness::Readiness::new(
            crate::fencing::readiness::CheckSettings {
                interval: f.check_interval,
                timeout: f.check_timeout,
                concurrency: f.check_concurrency,
            },
            plans,
            agents,
            cluster.clone(),
            engine.metrics.clone(),
            leadership.clone(),
        );
        r.views = fencer
            .as_ref()
            .map(|f| f.peering.clone() as Arc<dyn crate::fencing::readiness::WatchdogViews>);
        Arc::new(r)
    });
    let listener_metrics = crate::http::listener::ListenerMetrics::register(&mut registry);
    registry.register_collector(Box::new(crate::metrics::StateGauges {
        store: store.clone(),
    }));
    if let Err(e) =
        kubert_prometheus_process::register(registry.sub_registry_with_prefix("process"))
    {
        tracing::warn!(error = %e, "process metrics unavailable");
    }
    let seqs = engine.poller.seqs();
    let app = api::router(Arc::new(api::ApiState {
        store,
        cluster: cluster.clone(),
        leadership: leadership.clone(),
        key,
        settings: api::ApiSettings {
            request_window: cfg.daemon.request_window,
            body_timeout: cfg.daemon.limits.body_timeout,
            stall_after: cfg.daemon.stall_after,
        },
        members: members.clone(),
        wake,
        registry: Arc::new(registry),
        seqs,
        health: engine.health.clone(),
        readiness: readiness.as_ref().map(|r| r.board.clone()),
        peering: fencer.as_ref().map(|f| f.peering.clone()),
    }));
    info!(listen = %cfg.daemon.listen, nodes = node_count, db = %cfg.db_path().display(), "daemon started");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let mut engine_task = tokio::spawn(
        engine
            .clone()
            .run(stop(stop_rx.clone()))
            .instrument(info_span!("engine")),
    );
    let fencer_task = fencer.clone().map(|f| {
        info!(nodes = f.plans.len(), "fencing enabled");
        tokio::spawn(
            f.run(stop(stop_rx.clone()))
                .instrument(info_span!("fencer")),
        )
    });
    let readiness_task = readiness.map(|r| {
        tokio::spawn(
            r.run(stop(stop_rx.clone()))
                .instrument(info_span!("readiness")),
        )
    });
    let watch_task = watch.map(|w| {
        tokio::spawn(
            w.run(
                cluster,
                cfg.kubernetes.node_interval,
                members,
                stop(stop_rx.clone()),
            )
            .instrument(info_span!("nodes")),
        )
    });
    // The election stops after the executors (see below), so the last checkpoint and the lease
    // release come after the last effect.
    let (elect_tx, elect_rx) = tokio::sync::watch::channel(false);
    let election_task = tokio::spawn(
        leadership
            .clone()
            .run(stop(elect_rx))
            .instrument(info_span!("election")),
    );
    let server = crate::http::listener::serve(
        listener,
        app,
        cfg.daemon.limits,
        listener_metrics,
        stop(stop_rx),
    );
    let mut server_task = tokio::spawn(server);
    // A critical task that ends on its own takes the daemon down rather than leave it half-alive.
    let early = tokio::select! {
        biased;
        _ = shutdown => None,
        r = &mut server_task => Some(match r {
            Ok(Ok(())) => Err(DaemonError::Serve(std::io::Error::other("API server stopped"))),
            Ok(Err(e)) => Err(DaemonError::Serve(e)),
            Err(e) => Err(DaemonError::Serve(std::io::Error::other(e))),
        }),
        r = &mut engine_task => Some(Err(DaemonError::TaskEnded {
            task: "engine",
            detail: match r {
                Ok(()) => "returned".into(),
                Err(e) => e.to_string(),
            },
        })),
        why = leadership.lost() => Some(Err(crate::leader::LeaderError::Lost(why).into())),
    };
    info!("shutting down");
    let _ = stop_tx.send(true);
    if let Some(result) = early {
        let _ = elect_tx.send(true);
        return result;
    }
    let _ = engine_task.await;
    if let Some(t) = fencer_task {
        // Running fence steps reach a recorded state before the process exits.
        let _ = t.await;
    }
    if let Some(t) = watch_task {
        let _ = t.await;
    }
    if let Some(t) = readiness_task {
        let _ = t.await;
    }
    let _ = elect_tx.send(true);
    let _ = election_task.await;
    let served = server_task.await;
    info!("daemon stopped");
    match served {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(DaemonError::Serve(e)),
        Err(e) => Err(DaemonError::Serve(std::io::Error::other(e))),
    }
}
