//! The HTTP API on port 1816: status, nodes, tags and metrics for everyone; cancel and tag
//! removal only for requests signed with the cluster key.

use crate::cluster::Backend;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::cluster::ClusterError;
use crate::http::{ApiError, ReplayCache, SignedAuth, require_signed};
use crate::report::{DAEMON_TARGET, Key, now_ns};
use crate::store::{CancelOutcome, FenceCancel, Store};
use crate::views;

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
    pub status_cache: super::lists::StatusCache,
    /// Lists built at once: a crowd of readers queues here, and `/metrics`, `/1/health` and
    /// the signed changes are answered beside it.
    pub builders: tokio::sync::Semaphore,
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
            builders: tokio::sync::Semaphore::new(LIST_BUILDERS),
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

pub fn router(state: Arc<ApiState>) -> Router {
    // Every signed route of the daemon takes no body.
    let auth = SignedAuth {
        keys: Arc::new(state.key.clone()),
        nodes: Some(state.keyring.clone()),
        target: DAEMON_TARGET.into(),
        window_s: state.settings.request_window.as_secs(),
        max_body: 0,
        body_timeout: state.settings.body_timeout,
        replay: state.replay.clone(),
        refused: state.refused.clone(),
        operators: Some(state.operators.clone()),
        reads: false,
        tokens: state.tokens.clone(),
    };
    let readers = SignedAuth {
        reads: true,
        ..auth.clone()
    };
    let signed = Router::new()
        .route("/1/events/{id}/cancel", post(cancel))
        .route("/1/nodes/{node}/tags/{tag}", delete(remove_tag))
        .route("/1/nodes/{node}/reset-seq", post(reset_seq))
        .route("/1/fencing/pause", post(super::fencing_api::pause))
        .route("/1/fences/{id}/ack", post(super::fence_ack::ack))
        .route("/1/fencing/resume", post(super::fencing_api::resume))
        .route("/1/nodes/{node}/drill", post(super::fencing_api::drill))
        .route(
            "/1/nodes/{node}/maintenance",
            post(super::maintenance::start).delete(super::maintenance::stop),
        )
        // Inside the signature check: only a signed, accepted command is recorded, with its
        // signer.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            super::audit::audited,
        ))
        .route_layer(middleware::from_fn_with_state(auth, require_signed));
    let mut reads = Router::new()
        .route("/1/status", get(super::lists::status))
        .route("/1/status/{id}", get(one_status))
        .route("/1/nodes", get(super::lists::nodes))
        .route("/1/tags", get(tags))
        .route("/1/fences", get(super::lists::fences))
        .route("/1/fences/readiness", get(readiness))
        .route("/1/fences/summary", get(fencing_summary))
        .route("/1/fences/{id}", get(super::fencing_api::one))
        .route("/1/drills", get(super::fencing_api::drills))
        .route("/1/audit", get(super::audit::list))
        .route("/1/maintenance", get(super::maintenance::list))
        .route("/1/fences/{id}/timeline", get(super::fencing_api::timeline))
        .route("/1/leader", get(leader));
    if !state.settings.anonymous_read {
        reads = reads.route_layer(middleware::from_fn_with_state(readers, require_signed));
    }
    Router::new()
        .route("/", get(super::ui::root))
        .route("/1/health", get(health))
        .route("/metrics", get(metrics))
        .merge(reads)
        .merge(signed)
        .merge(super::ui::routes())
        .fallback(crate::http::not_found_fallback)
        .method_not_allowed_fallback(crate::http::method_not_allowed)
        .with_state(state)
        .layer(middleware::map_response(crate::http::json_errors))
        // gzip for a client that asks (a dump of thousands of events shrinks tenfold).
        .layer(tower_http::compression::CompressionLayer::new().gzip(true))
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

async fn leader(State(s): S) -> Json<views::Leader> {
    let l = &s.leadership;
    Json(views::Leader {
        identity: l.identity().to_string(),
        leader: l.is_leader(),
        holder: l.holder(),
        elected: l.elected_mode(),
        term: l.term(),
    })
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id)
        .map_err(|_| ApiError::bad_request(format!("{id:?} is not an event id (a uuid)")))
}

async fn fencing_summary(State(s): S) -> Result<Json<views::FencingSummary>, ApiError> {
    let checks = s.readiness.as_ref().map(|b| b.all()).unwrap_or_default();
    let mut summary = views::FencingSummary::of(&checks);
    summary.paused = super::fencing_api::current(&s)?;
    Ok(Json(summary))
}

async fn readiness(State(s): S) -> Json<views::Readiness> {
    Json(s.readiness.as_ref().map(|b| b.all()).unwrap_or_default())
}

async fn one_status(State(s): S, Path(id): Path<String>) -> Result<Json<views::Event>, ApiError> {
    let id = parse_id(&id)?;
    let commands = || {
        s.store
            .audit(Some(&id.to_string()), 100)
            .map_err(|e| db_error(&s.store, e))
    };
    if let Some(f) = s.flows.get(&id).await.map_err(|e| flows_error(&s, e))? {
        let mut v = views::Event::of_flow(&f);
        v.commands = commands()?;
        return Ok(Json(v));
    }
    match s.store.event(&id).map_err(|e| db_error(&s.store, e))? {
        Some((e, jobs, None)) => {
            let mut v = views::Event::of_repair(&e, &jobs);
            v.commands = commands()?;
            Ok(Json(v))
        }
        Some((_, _, Some(why))) => Err(ApiError::not_found(format!(
            "event {id} was cleared: {why}"
        ))),
        None => Err(ApiError::not_found(format!("no event {id}"))),
    }
}

async fn cancel(State(s): S, Path(id): Path<String>) -> Result<Json<views::Event>, ApiError> {
    let id = parse_id(&id)?;
    require_leader(&s)?;
    match s
        .store
        .cancel(&id, crate::clock::steady_ns())
        .map_err(|e| db_error(&s.store, e))?
    {
        CancelOutcome::NotFound => match s
            .flows
            .cancel(&id, crate::clock::steady_ns())
            .await
            .map_err(|e| flows_error(&s, e))?
        {
            FenceCancel::NotFound => Err(ApiError::not_found(format!("no live event {id}"))),
            FenceCancel::Final => Err(ApiError::conflict(format!(
                "fence flow {id} is already final"
            ))),
            FenceCancel::AlreadyCanceled => Err(ApiError::conflict(format!(
                "fence flow {id} is already canceled"
            ))),
            FenceCancel::PoweredOff => Err(ApiError::conflict(format!(
                "fence flow {id} has already powered the node off; it can no longer be canceled"
            ))),
            refused @ FenceCancel::PowerOffRunning => Err(ApiError::conflict(format!(
                "fence flow {id} cannot be canceled: {}",
                refused.describe()
            ))),
            FenceCancel::Canceled(f) => {
                tracing::info!(flow = %id, "fence flow canceled by operator");
                s.wake.notify_one();
                Ok(Json(views::Event::of_flow(&f)))
            }
        },
        CancelOutcome::AlreadyFinal(st) => Err(ApiError::conflict(format!(
            "event {id} is already {}; it cannot be canceled",
            st.as_str()
        ))),
        CancelOutcome::Canceled => {
            tracing::info!(event = %id, "event canceled by operator");
            s.wake.notify_one();
            let (e, jobs, _) = s
                .store
                .event(&id)
                .map_err(|e| db_error(&s.store, e))?
                .ok_or_else(|| ApiError::internal("event vanished"))?;
            Ok(Json(views::Event::of_repair(&e, &jobs)))
        }
    }
}

#[derive(Deserialize)]
struct TagQuery {
    node: Option<String>,
}

async fn tags(State(s): S, Query(q): Query<TagQuery>) -> Result<Json<views::Tags>, ApiError> {
    let mut all = s.cluster.jobs.tags().await.map_err(internal)?;
    for n in s.members.get().iter() {
        all.entry(n.name.clone()).or_default();
    }
    if let Some(node) = q.node {
        let t = all
            .remove(&node)
            .ok_or_else(|| ApiError::not_found(format!("unknown node {node:?}")))?;
        return Ok(Json(views::Tags::from([(node, t)])));
    }
    Ok(Json(all))
}

async fn remove_tag(
    State(s): S,
    Path((node, tag)): Path<(String, String)>,
) -> Result<Json<views::TagRemoved>, ApiError> {
    require_leader(&s)?;
    match s.cluster.jobs.remove_tag(&node, &tag).await {
        Ok(true) => {
            tracing::info!(node = %node, tag = %tag, "tag removed by operator");
            s.wake.notify_one();
            Ok(Json(views::TagRemoved { node, removed: tag }))
        }
        Ok(false) => Err(ApiError::not_found(format!(
            "node {node} has no tag {tag:?}"
        ))),
        Err(ClusterError::UnknownNode(n)) => {
            Err(ApiError::not_found(format!("unknown node {n:?}")))
        }
        Err(e) => Err(internal(e)),
    }
}

/// 200 while the engine decides and the database can be written, 503 naming the cause when
/// not: for a liveness probe and for alerting. What the daemon found at start-up and could not
/// match (earlier jobs or tags beside a lost database) is listed either way.
async fn health(State(s): S) -> Result<Json<views::Health>, ApiError> {
    let stale_ns = i64::try_from(s.settings.stall_after.as_nanos()).unwrap_or(i64::MAX);
    let now = crate::clock::steady_ns();
    if s.health.probe_due(now) {
        let wrote = s.store.probe_write(now);
        if let Err(e) = &wrote {
            tracing::error!(error = %e, db = %s.store.path(), "the state database cannot be written");
        }
        s.health.wrote(now, &wrote);
    }
    let found = s.health.found();
    match s.health.check(now, stale_ns) {
        Ok(age) => Ok(Json(views::Health {
            status: "ok".into(),
            last_decision_age_seconds: age.map(|a| a as f64 / 1e9),
            db: s.store.path().to_string(),
            found,
        })),
        Err(why) if found.is_empty() => Err(ApiError::unavailable(why.to_string())),
        Err(why) => Err(ApiError::unavailable(format!(
            "{why}; found at start-up: {}",
            found.join("; ")
        ))),
    }
}

async fn reset_seq(
    State(s): S,
    Path(node): Path<String>,
) -> Result<Json<views::SeqReset>, ApiError> {
    require_leader(&s)?;
    if !s.members.get().iter().any(|n| n.name == node) {
        return Err(ApiError::not_found(format!("unknown node {node:?}")));
    }
    let prev = s
        .seqs
        .reset(&s.store, &node)
        .map_err(|e| db_error(&s.store, e))?;
    tracing::warn!(node = %node, previous_seq = ?prev, "report sequence state reset by operator");
    Ok(Json(views::SeqReset {
        node,
        previous_seq: prev,
    }))
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), else the classic text format,
/// which `promtool check metrics` and older tools read.
async fn metrics(
    State(s): S,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &s.registry).map_err(internal)?;
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    Ok(if wants_openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::metrics::openmetrics_to_text(&text),
        )
    })
}
