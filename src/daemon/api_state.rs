//! The API's state (what every handler reads: the store, the backend, the parts' views, the
//! credentials and caches) and the errors handlers share; the router and handlers are in `api`,
//! `lists`, `fencing_api` and beside them.

use std::sync::Arc;

use axum::extract::State;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::cluster::Backend;
use crate::http::{ApiError, ReplayCache};
use crate::report::{Key, now_ns};
use crate::store::Store;

pub struct ApiState {
    pub store: Arc<Store>,
    pub flows: Arc<dyn crate::store::FlowStore>,
    pub cluster: Backend,
    pub leadership: Arc<crate::leader::Leadership>,
    pub key: Key,
    /// Each node's keys: a request signed with one is named and refused.
    pub keyring: Arc<crate::report::keyring::Keyring>,
    /// Who may sign operator commands besides (until one is configured) the cluster key.
    pub operators: Arc<crate::http::Operators>,
    /// Who checks bearer tokens, when the cluster takes them (Kubernetes).
    pub tokens: Option<Arc<dyn crate::http::tokens::TokenReviewer>>,
    pub settings: ApiSettings,
    pub members: Arc<crate::members::Members>,
    pub wake: Arc<Notify>,
    pub registry: Arc<Registry>,
    pub seqs: Arc<crate::repair::poller::Seqs>,
    pub health: Arc<crate::repair::engine::Health>,
    /// What the poll heard of each node lately (fresher than the store's rows).
    pub heard: Arc<crate::members::NodeHealth>,
    /// The fence readiness checks, when fencing is configured.
    pub readiness: Option<Arc<crate::fencing::readiness::Board>>,
    /// The fencer's peer views, when fencing is configured.
    pub peering: Option<Arc<crate::fencing::peering::Peering>>,
    /// The fencer, when fencing is configured (drills ask it whether a node can be drilled).
    pub fencer: Option<Arc<crate::fencing::executor::Fencer>>,
    /// Signed requests accepted within their window, kept across restarts.
    pub replay: Arc<ReplayCache>,
    pub refused: crate::http::Refused,
    /// The repair events as `/1/status` last built them.
    pub status_cache: super::status_cache::StatusCache,
    /// The nodes `/1/nodes` lists, indexed by name and state.
    pub node_index: super::node_index::NodeIndexCache,
    /// Lists built at once: a crowd of readers queues here, and `/metrics`, `/1/health` and
    /// the signed changes are answered beside it.
    pub builders: tokio::sync::Semaphore,
    /// The list pages last built, shared until the list changes.
    pub pages: super::pages::Pages,
}

impl ApiState {
    /// The API over the assembled parts. It serves `registry`, to which it first adds the
    /// gauges read at each scrape (the state's, the process's).
    pub fn new(
        parts: &super::assembly::Assembly,
        creds: super::Credentials,
        cfg: &crate::config::Config,
        registry: &mut Registry,
    ) -> ApiState {
        let shared = &parts.shared;
        registry.register_collector(Box::new(crate::metrics::StateGauges {
            store: shared.store.clone(),
        }));
        let refused = crate::http::Refused::default();
        registry.register(
            "maintd_requests_refused",
            "Signed API requests refused, by reason (unsigned, malformed, stale, forged, replayed, too-large, body, busy, unknown-operator, forbidden, token)",
            refused.clone(),
        );
        let journal = cfg.daemon.state_dir.join("replay-requests");
        let replay = ReplayCache::persistent(&journal, now_ns()).unwrap_or_else(|e| {
            tracing::error!(error = %e, path = %journal.display(), "cannot keep signed requests across restarts; a request captured now could be replayed after a restart within its window");
            ReplayCache::default()
        });
        let process = registry.sub_registry_with_prefix("process");
        if let Err(e) = kubert_prometheus_process::register(process) {
            tracing::warn!(error = %e, "process metrics unavailable");
        }
        ApiState {
            store: shared.store.clone(),
            flows: shared.flows.clone(),
            cluster: shared.cluster.clone(),
            leadership: shared.leadership.clone(),
            key: creds.key,
            keyring: creds.keyring,
            operators: creds.operators,
            tokens: shared.cluster.tokens.clone(),
            settings: ApiSettings {
                request_window: cfg.daemon.request_window,
                body_timeout: cfg.daemon.limits.body_timeout,
                stall_after: cfg.daemon.stall_after,
                config_paused: cfg.fencing.paused,
                anonymous_read: cfg.daemon.anonymous_read,
            },
            members: shared.members.clone(),
            wake: parts.engine.waker(),
            registry: Arc::new(std::mem::take(registry)),
            seqs: parts.engine.seqs(),
            health: parts.engine.health(),
            heard: shared.health.clone(),
            readiness: parts.readiness.as_ref().map(|r| r.board()),
            peering: parts.peering.clone(),
            replay: Arc::new(replay),
            refused,
            fencer: parts.fencer.clone(),
            status_cache: Default::default(),
            node_index: Default::default(),
            builders: tokio::sync::Semaphore::new(LIST_BUILDERS),
            pages: Default::default(),
        }
    }

    /// Where the lists are built and kept.
    pub fn lists(&self) -> super::listing::Lists<'_> {
        super::listing::Lists {
            builders: &self.builders,
            pages: &self.pages,
            changes: self.store.changes(),
        }
    }
}

/// Lists built at the same time; more readers wait their turn.
const LIST_BUILDERS: usize = 4;

/// What the API needs of the configuration, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// How far a signed request's timestamp may be from the daemon's clock.
    pub request_window: std::time::Duration,
    pub body_timeout: std::time::Duration,
    /// `/1/health` fails when no decision completed for this long.
    pub stall_after: std::time::Duration,
    /// `fencing.paused` in the configuration.
    pub config_paused: bool,
    /// Reads answer unsigned requests (`daemon.anonymous-read`).
    pub anonymous_read: bool,
}

pub(super) type S = State<Arc<ApiState>>;

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

/// A store error as the API reports it: naming the database, so an operator knows which file.
pub(super) fn db_error(store: &Store, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{}: {e}", store.path()))
}

pub(super) fn flows_error(s: &ApiState, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("{}: {e}", s.flows.location()))
}

/// Operator changes go to the replica that acts; a standby's state is a copy it overwrites.
pub(super) fn require_leader(s: &ApiState) -> Result<(), ApiError> {
    if s.leadership.is_leader() {
        return Ok(());
    }
    let holder = s.leadership.holder().unwrap_or_else(|| "unknown".into());
    Err(ApiError::unavailable(format!(
        "this replica ({}) is a standby; send changes to the leader ({holder})",
        s.leadership.identity()
    )))
}
