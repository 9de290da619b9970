//! The master daemon (`maintd daemon`): master lock, state store, backend, poller, engine and
//! the HTTP API, wired together and shut down together.

pub mod api;
mod api_state;
pub mod assembly;
mod audit;
mod backends;
pub mod fence_ack;
mod fencing_api;
mod found;
mod listing;
mod lists;
pub mod lock;
pub mod maintenance;
mod node_index;
mod pages;
mod reload;
mod status_cache;
mod ui;

use std::future::Future;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing::info;

use crate::cluster::ClusterError;
use crate::config::{Backend, Config};
use crate::fencing::agent::Agents;
use crate::fencing::redact::Redactor;
use crate::link::Links;
use crate::members::NodeHealth;
use crate::parts::Shared;
use crate::report::keyring::Keyring;
use crate::report::{Key, KeyError};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Operators(#[from] crate::http::OperatorsError),
    #[error(transparent)]
    Tls(#[from] crate::http::tls::TlsError),
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
    Rules(#[from] maintd_core::repair::conditions::RuleError),
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
    /// Ganeti's vote made another node master: maintd acts only on the master.
    #[error("this node ({node}) is not the Ganeti master ({master})")]
    NotGanetiMaster { node: String, master: String },
}

impl DaemonError {
    /// Process exit code: 11 when another daemon is the master, as in Ganeti.
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Lock(lock::LockError::Held { .. }) => lock::EXIT_NOT_MASTER,
            DaemonError::NotGanetiMaster { .. } => lock::EXIT_NOT_MASTER,
            DaemonError::Leader(_) => crate::leader::EXIT_LOST_LEADERSHIP,
            _ => 1,
        }
    }
}

pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    // Every configuration error is reported before anything is opened: `[fencing]` is loaded
    // here (its secrets read once), and checked against the membership once that is known;
    // the cluster key and the operators' keys are read too.
    let plans = cfg
        .fencing
        .load_plans()
        .map_err(crate::config::ConfigError::from)?;
    let creds = Credentials::load(&cfg)?;
    let lock = lock::acquire(&cfg.daemon.state_dir, &cfg.host)?;
    let store = Arc::new(Store::open(&cfg.db_path())?);
    continue_steady_clock(&store)?;
    match cfg.cluster.backend {
        Backend::Kubernetes => {
            let ready = backends::kubernetes(&cfg, &store, plans).await?;
            run_with(&cfg, creds, store, ready, lock, shutdown).await
        }
        Backend::Ganeti => {
            let (ready, master) = backends::ganeti(&cfg, &store, plans).await?;
            let node = master.node.clone();
            // After a master failover this daemon stops acting (a graceful stop, fence steps
            // finished) and exits with 11; the new master's daemon takes over.
            let (lost, new_master) = tokio::sync::oneshot::channel();
            let either = async move {
                tokio::select! {
                    _ = shutdown => {}
                    m = master.lost() => { let _ = lost.send(m); }
                }
            };
            run_with(&cfg, creds, store, ready, lock, either).await?;
            match new_master.await {
                Ok(master) => Err(DaemonError::NotGanetiMaster { node, master }),
                Err(_) => Ok(()),
            }
        }
        Backend::Inventory => {
            let ready = backends::inventory(&cfg, &store, plans).await?;
            run_with(&cfg, creds, store, ready, lock, shutdown).await
        }
    }
}

/// A missing database beside job directories means the previous state was lost (deleted, or a
/// wrong `db` path): jobs those directories describe will not be resumed.
/// Continues this boot's steady timeline where an earlier daemon on the same boot left it, so
/// every span the database records (retries, windows, deadlines, waits) means the same after a
/// restart, whatever the wall clock did meanwhile; says so when the wall clock has moved.
fn continue_steady_clock(store: &Store) -> Result<(), DaemonError> {
    let proposed = crate::clock::wall_offset_now();
    let offset = store.steady_offset(crate::clock::boot_id(), proposed)?;
    if !crate::clock::continue_timeline(offset) {
        tracing::warn!(
            "the steady clock was read before its offset was loaded; spans recorded by an earlier process on this boot may be shifted"
        );
    }
    let stepped = proposed - offset;
    if stepped.abs() >= 1_000_000_000 {
        tracing::warn!(
            stepped_s = stepped as f64 / 1e9,
            "the wall clock has moved {:+.1} s from this boot's steady clock since the daemon first started on it: every span is measured on the steady clock, and the times the daemon records and shows are that far from the wall clock (maintd_clock_step_seconds)",
            stepped as f64 / 1e9
        );
    }
    Ok(())
}

/// The keys the daemon checks signatures with: the cluster key (reports, heartbeats, and
/// operator commands until an operator is configured) and the operators'.
pub struct Credentials {
    pub key: Key,
    /// Each node's keys (the cluster key, or keys derived from the node-key secret).
    pub keyring: Arc<Keyring>,
    pub operators: Arc<crate::http::Operators>,
    /// The API's certificate, when it speaks HTTPS.
    pub tls: Option<crate::http::tls::ServerTls>,
}

impl Credentials {
    /// The keys and the API's certificate, read from their files.
    fn load(cfg: &Config) -> Result<Credentials, DaemonError> {
        let key = reload::cluster_key(cfg)?;
        Ok(Credentials {
            keyring: Arc::new(Keyring::load(key.clone(), &cfg.daemon.node_keys)?),
            key,
            operators: Arc::new(crate::http::Operators::load(&cfg.daemon.operators)?),
            tls: match (&cfg.daemon.tls_cert_file, &cfg.daemon.tls_key_file) {
                (Some(c), Some(k)) => Some(crate::http::tls::ServerTls::load(c, k)?),
                _ => None,
            },
        })
    }
}

/// Builds the parts with the production links and agents, serves the API, and stops it all
/// together.
async fn run_with(
    cfg: &Config,
    creds: Credentials,
    store: Arc<Store>,
    ready: backends::Ready,
    _lock: lock::MasterLock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let names: Vec<String> = ready
        .membership
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    cfg.fencing
        .check_members(&names)
        .map_err(crate::config::ConfigError::from)?;
    let listener = crate::http::bind(cfg.daemon.listen)
        .await
        .map_err(DaemonError::Listen)?;
    let mut registry = Registry::default();
    let book = ready.book.clone();
    let systemd = crate::sdnotify::from_env();
    let deps = production_deps(cfg, &creds, store, ready, systemd.clone(), &mut registry)?;
    let found = found::leftovers(cfg, &deps.shared).await;
    let parts = assembly::assemble(assembly::Settings::from_config(cfg, book), deps)?;
    parts.engine.health().set_found(found);
    let listener_metrics = crate::http::listener::ListenerMetrics::register(&mut registry);
    let (tls, keys) = (creds.tls.clone(), reload::Reloadable::of(cfg, &creds));
    let api = api::ApiState::new(&parts, creds, cfg, &mut registry);
    info!(listen = %cfg.daemon.listen, nodes = names.len(), db = %cfg.db_path().display(), "daemon started");
    let mut running = parts.spawn();
    reload::on_sighup(keys)?;
    let api = Arc::new(api);
    if let Some(addr) = cfg.daemon.metrics_listen {
        let metrics = crate::http::bind(addr).await.map_err(DaemonError::Listen)?;
        let (limits, stopping) = (cfg.daemon.limits, running.stopping());
        let app = api::metrics_router(api.clone());
        serve_metrics(metrics, app, limits, listener_metrics.clone(), stopping)?;
        info!(listen = %addr, "metrics listener started");
    }
    let app = api::router(api);
    let (limits, stopping) = (cfg.daemon.limits, running.stopping());
    let mut server = serve_apart(listener, app, limits, listener_metrics, tls, stopping)?;
    let status = format!(
        "polling {} nodes, API on {}",
        names.len(),
        cfg.daemon.listen
    );
    if let Some(n) = &systemd {
        n.ready(&status);
    }
    // A critical task that ends on its own takes the daemon down rather than leave it half-alive.
    let early = tokio::select! {
        biased;
        _ = shutdown => None,
        r = &mut server => Some(served(r.map(|r| r.and(Err(std::io::Error::other("API server stopped")))))),
        detail = running.engine_ended() => Some(Err(DaemonError::TaskEnded { task: "engine", detail })),
        why = parts.shared.leadership.lost() => Some(Err(crate::leader::LeaderError::Lost(why).into())),
    };
    info!("shutting down");
    if let Some(n) = &systemd {
        n.stopping();
    }
    stop(early, running, server).await
}

/// Stops the parts (at once when `early` says the daemon is failing anyway: a critical task
/// ended), then waits for the API server.
async fn stop(
    early: Option<Result<(), DaemonError>>,
    running: assembly::Running,
    server: tokio::sync::oneshot::Receiver<std::io::Result<()>>,
) -> Result<(), DaemonError> {
    if let Some(result) = early {
        running.abort();
        return result;
    }
    if let Err(e) = running.stop().await {
        tracing::error!(error = %e, "a part of the daemon panicked");
    }
    let result = served(server.await);
    info!("daemon stopped");
    result
}

/// What the parts act through in production: the backend, the store, HTTP (and UDP) links to
/// the collectors, the real fence agents (or Jobs), the fence ConfigMaps and systemd.
fn production_deps(
    cfg: &Config,
    creds: &Credentials,
    store: Arc<Store>,
    ready: backends::Ready,
    systemd: Option<Arc<crate::sdnotify::Notifier>>,
    registry: &mut Registry,
) -> Result<assembly::Deps, DaemonError> {
    let backends::Ready {
        cluster,
        membership,
        book,
        maps,
    } = ready;
    let jobs = cluster
        .pods
        .clone()
        .map(|pods| crate::fencing::agentjob::AgentJobs {
            pods,
            image: cfg.fencing.agent_image.clone(),
        });
    let agents = Arc::new(Agents {
        dir: cfg.fencing.agents_dir.clone(),
        redact: Redactor::new(book.secrets()),
        jobs,
    });
    let keyring = &creds.keyring;
    let links = Links {
        udp: udp_poll(cfg, keyring, registry)?,
        ..Links::http(
            keyring,
            cfg.daemon.poll_timeout,
            cfg.fencing.liveness_timeout_max,
            cfg.daemon.poll_connections,
            cfg.daemon.poll_concurrency,
        )
    };
    membership.leadership.metrics().register_in(registry);
    let shared = Shared {
        health: Arc::new(NodeHealth::from_store(&store)),
        // Every flow write also moves the API's view of events (flows are events there).
        flows: crate::store::changes::CountedFlows::wrap(membership.flows, store.changes().clone()),
        store,
        cluster,
        leadership: Arc::new(membership.leadership),
        clock: Arc::new(crate::clock::SystemClock),
        members: Arc::new(crate::members::Members::new(membership.nodes)),
        watch: membership.watch,
    };
    Ok(assembly::Deps {
        shared,
        metrics: assembly::PartMetrics::register(registry),
        links,
        agents,
        keys: keyring.clone(),
        maps,
        systemd,
    })
}

/// The poll over UDP, with its counts registered, when `daemon.poll-udp` is on.
fn udp_poll(
    cfg: &Config,
    keys: &Arc<Keyring>,
    registry: &mut Registry,
) -> Result<Option<Arc<crate::link::UdpPoll>>, DaemonError> {
    if !cfg.daemon.poll_udp {
        return Ok(None);
    }
    let counts = crate::link::UdpCounts::default();
    registry.register(
        "maintd_poll_udp",
        "Report polls over UDP by outcome: answered, ask-http (no report yet, or too large for a datagram) and no-answer (both then asked over HTTP), http-only (a collector that answers only over HTTP, for a minute), stray (an answer no request waited for)",
        counts.clone(),
    );
    let patience = crate::link::udp_patience(cfg.daemon.poll_timeout);
    let udp = crate::link::UdpPoll::bind(keys.clone(), patience, counts).map_err(|e| {
        DaemonError::Listen(std::io::Error::new(
            e.kind(),
            format!("the UDP poll socket: {e}"),
        ))
    })?;
    Ok(Some(Arc::new(udp)))
}

fn served(
    r: Result<std::io::Result<()>, tokio::sync::oneshot::error::RecvError>,
) -> Result<(), DaemonError> {
    match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(DaemonError::Serve(e)),
        Err(_) => Err(DaemonError::Serve(std::io::Error::other(
            "the API thread ended without a result",
        ))),
    }
}

/// How much lower than the poller the API's thread runs (a nice value): observation must
/// never take the CPU that detection needs, however many clients read. The API is one thread,
/// so it never holds more than one core; at this value it gets about half the poller's share
/// of a contended core. Ten (a tenth) left one node's events waiting tens of milliseconds
/// behind each poll cycle of a large fleet.
const API_NICENESS: i32 = 3;

/// Serves the API on a runtime of its own, one thread that the kernel schedules behind the
/// poller's and the fencer's. Readers then share the CPU left over; a flood of them slows the
/// API, never the poll.
fn serve_apart(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: crate::http::listener::ListenerLimits,
    metrics: crate::http::listener::ListenerMetrics,
    tls: Option<crate::http::tls::ServerTls>,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>, DaemonError> {
    let thread = ("maintd-api", Some(API_NICENESS));
    serve_on(thread, listener, app, (limits, metrics), tls, stopping)
}

/// Serves `/metrics` and `/1/health` on a thread of their own, at the poller's priority: a
/// scrape or a health check never queues behind the API's readers. It stops with the daemon;
/// a listener that fails is logged, the daemon carries on (the API serves both too).
fn serve_metrics(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: crate::http::listener::ListenerLimits,
    metrics: crate::http::listener::ListenerMetrics,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let thread = ("maintd-metrics", None);
    let served = serve_on(thread, listener, app, (limits, metrics), None, stopping)?;
    tokio::spawn(async move {
        if let Ok(Err(e)) = served.await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// Serves `app` on a runtime of one thread of its own, named `name` and reniced by `nice` when
/// given; the receiver gets how serving ended.
fn serve_on(
    (name, nice): (&'static str, Option<i32>),
    listener: tokio::net::TcpListener,
    app: axum::Router,
    (limits, metrics): (
        crate::http::listener::ListenerLimits,
        crate::http::listener::ListenerMetrics,
    ),
    tls: Option<crate::http::tls::ServerTls>,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>, DaemonError> {
    let listener = listener.into_std().map_err(DaemonError::Serve)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let lower = move || {
                // Per thread on Linux: only this runtime's threads are reniced.
                if let Some(n) = nice
                    && let Err(e) =
                        rustix::process::setpriority_process(Some(rustix::thread::gettid()), n)
                {
                    tracing::warn!(error = %e, thread = name, "cannot lower the thread's priority");
                }
            };
            let served = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name(name)
                .on_thread_start(lower)
                .enable_all()
                .build()
                .and_then(|rt| {
                    rt.block_on(async move {
                        let listener = tokio::net::TcpListener::from_std(listener)?;
                        crate::http::listener::serve(listener, app, limits, metrics, tls, stopping)
                            .await
                    })
                });
            let _ = tx.send(served);
        })
        .map_err(DaemonError::Serve)?;
    Ok(rx)
}
