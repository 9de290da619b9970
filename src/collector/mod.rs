//! The node agent (`maintd collector`): runs the whitelisted diagnose on its own interval, serves
//! the cached verdict as a signed report on port 1815, and runs signed live-repair requests one at
//! a time.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use serde_json::json;
use tokio::sync::Semaphore;
use tracing::{Instrument, info, info_span, warn};

use crate::config::{CollectorConfig, Config};
use crate::exec::hooks::HookCall;
use crate::exec::{self, RunSpec};
use crate::http::{ApiError, SignedAuth, parse_json, require_signed};
use crate::report::nodekey::Credential;
use crate::report::{Envelope, KeyError, now_ns};
use crate::sync::{LockExt, RwLockExt};

mod boot;
mod diagnose;
mod journal;
pub mod peers;
pub mod poll;
mod probe;
mod reload;
pub mod watchdog;

pub use diagnose::{Diagnosis, diagnose};
use journal::Journal;

/// Output of a repair kept for the daemon.
const REPAIR_TAIL_CHARS: usize = 4096;
/// How long a collector that disarmed its watchdog keeps answering before it stops: more than
/// two liveness probes.
const DISARMED_NOTICE: Duration = Duration::from_millis(2500);
/// Finished repairs remembered for the daemon to collect.
const REPAIRS_KEPT: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("{0}")]
    Listen(#[source] std::io::Error),
    #[error("collector server failed: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Watchdog(#[from] watchdog::WatchdogError),
    #[error("boot id file {path}: {problem}")]
    Boot { path: String, problem: String },
    #[error("repair journal {path}: {source}")]
    Journal {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub use crate::report::live::{LiveRepairRecord, RepairRequest, RepairState};

async fn metrics(State(c): State<Arc<Collector>>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        c.metrics_text(),
    )
}

pub struct Collector {
    node: String,
    /// This node's keys: the first signs; the master's requests and polls may use any.
    cred: Credential,
    cfg: CollectorConfig,
    latest: RwLock<Option<Diagnosis>>,
    seq: AtomicU64,
    repairs: Mutex<BTreeMap<String, LiveRepairRecord>>,
    repair_seq: AtomicU64,
    /// One repair at a time per node.
    repair_slot: Semaphore,
    journal: Journal,
    replay: Arc<crate::http::ReplayCache>,
    /// Signed requests refused, by reason (served at `/metrics`).
    refused: crate::http::Refused,
    /// Peer heartbeats: the set the leader assigned, and what this node hears.
    pub peers: Arc<peers::Peers>,
    /// This boot, read once: a boot id changes only with a reboot, which restarts the collector.
    boot: crate::report::BootReport,
}

impl Collector {
    /// Opens the repair journal in `cfg.state-dir`; every repair it holds is known again, and
    /// one that was queued or running when the collector stopped is marked failed, never re-run.
    pub fn new(
        node: String,
        cred: impl Into<Credential>,
        cfg: CollectorConfig,
    ) -> Result<Arc<Collector>, CollectorError> {
        let cred = cred.into();
        // Seeded from the clock so the sequence keeps increasing across restarts without a
        // state file; the daemon rejects any sequence not above the last one it accepted.
        let seed = (now_ns() / 1000).max(1) as u64;
        let boot = boot::read_boot(&cfg.boot_id_file)?;
        let journal = Journal::open(&cfg.state_dir)?;
        // Opened after the journal, which makes the state directory.
        let replays = cfg.state_dir.join("replay-requests");
        let replay =
            crate::http::ReplayCache::persistent(&replays, now_ns()).map_err(|source| {
                CollectorError::Journal {
                    path: replays.display().to_string(),
                    source,
                }
            })?;
        let repairs = journal.load()?;
        let next = repairs.values().map(|r| r.seq + 1).max().unwrap_or(0);
        let peers = Arc::new(
            peers::Peers::new(node.clone(), cred.clone(), cfg.heartbeat)
                .persist_in(cfg.state_dir.join("peers.json")),
        );
        Ok(Arc::new(Collector {
            boot,
            peers,
            node,
            cred,
            cfg,
            latest: RwLock::new(None),
            seq: AtomicU64::new(seed),
            repairs: Mutex::new(repairs),
            repair_seq: AtomicU64::new(next),
            repair_slot: Semaphore::new(1),
            journal,
            replay: Arc::new(replay),
            refused: crate::http::Refused::default(),
        }))
    }

    pub fn set_diagnosis(&self, d: Diagnosis) {
        *self.latest.write_unpoisoned() = Some(d);
    }

    /// Signs the cached verdict now, with the next sequence number, in answer to the poll
    /// numbered `answers` (0: none).
    pub fn signed_report(&self, answers: u64) -> Option<Envelope> {
        let d = self.latest.read_unpoisoned().clone()?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let mut env = Envelope::new(&self.node, seq, now_ns(), d.at, &d.verdict, d.error.clone());
        env.watchdog = *self.peers.watchdog.read_unpoisoned();
        env.boot = Some(self.boot);
        env.answers = answers;
        Some(env.sign(self.cred.now().signer()))
    }

    pub fn router(self: &Arc<Self>) -> Router {
        let auth = |max_body| SignedAuth {
            keys: Arc::new(self.cred.clone()),
            nodes: None,
            target: self.node.clone(),
            window_s: self.cfg.request_window.as_secs(),
            max_body,
            body_timeout: self.cfg.limits.body_timeout,
            replay: self.replay.clone(),
            refused: self.refused.clone(),
            operators: None,
            reads: false,
            tokens: None,
        };
        // The request carries the event's diagnose JSON, which the diagnose cap bounds.
        let repair_cap = self.cfg.diagnose_output_cap.saturating_mul(2) + 4096;
        let signed = Router::new()
            .route(
                "/1/repair",
                post(start_repair).route_layer(middleware::from_fn_with_state(
                    auth(repair_cap),
                    require_signed,
                )),
            )
            .route(
                "/1/repair/{job}",
                get(repair_status)
                    .route_layer(middleware::from_fn_with_state(auth(0), require_signed)),
            )
            .route(
                "/1/peers",
                axum::routing::put(probe::set_peers).route_layer(middleware::from_fn_with_state(
                    auth(probe::PEER_SET_CAP),
                    require_signed,
                )),
            )
            .with_state(self.clone());
        Router::new()
            .route("/", get(|| async { Json(json!([1])) }))
            .route("/1/report/diagnose", get(report))
            .route("/1/peers", get(probe::peer_view))
            .route("/metrics", get(metrics))
            .fallback(crate::http::not_found_fallback)
            .method_not_allowed_fallback(crate::http::method_not_allowed)
            .with_state(self.clone())
            .merge(signed)
            .layer(middleware::map_response(crate::http::json_errors))
    }

    /// The collector's own counters, in the Prometheus text format.
    fn metrics_text(&self) -> String {
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register(
            "maintd_collector_requests_refused",
            "Signed requests refused, by reason (unsigned, malformed, stale, forged, replayed, too-large, body, busy)",
            self.refused.clone(),
        );
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }

    async fn run_repair(self: Arc<Self>, req: RepairRequest) {
        let _slot = self.repair_slot.acquire().await;
        self.update(&req.job, |r| r.state = RepairState::Running);
        info!(job = %req.job, event = %req.event, command = %req.command, "live repair started");
        let result = match exec::resolve(&self.cfg.repair_dir, &req.command) {
            Err(e) => Err(format!("repair command refused: {e}")),
            Ok(program) => {
                let extra: Vec<(String, String)> = self
                    .cfg
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let env = HookCall {
                    node: &self.node,
                    event: &req.event,
                    job: None,
                    action: None,
                }
                .env(&extra);
                exec::run(&RunSpec {
                    program,
                    args: vec![],
                    stdin: req.input.as_str().as_bytes().to_vec(),
                    env,
                    timeout: self.cfg.repair_timeout,
                    output_cap: REPAIR_TAIL_CHARS,
                })
                .await
                .map_err(|e| e.to_string())
            }
        };
        self.update(&req.job, |r| {
            r.state = RepairState::Done;
            match &result {
                Ok(out) => {
                    r.exit_code = out.code;
                    r.output = out.tail(REPAIR_TAIL_CHARS);
                    if out.code.is_none() {
                        r.error = Some("repair command was killed by a signal".into());
                    }
                }
                Err(e) => r.error = Some(e.clone()),
            }
        });
        info!(job = %req.job, ok = matches!(&result, Ok(o) if o.success()), "live repair finished");
    }

    fn update(&self, job: &str, f: impl FnOnce(&mut LiveRepairRecord)) {
        let mut repairs = self.repairs.lock_unpoisoned();
        if let Some(r) = repairs.get_mut(job) {
            f(r);
            if let Err(e) = self.journal.save(r) {
                warn!(job = %job, error = %e, "cannot write the repair journal");
            }
        }
    }
}

/// The report, signed now; `?nonce=N` makes it answer the daemon's poll numbered `N` (anyone may
/// read a report: what the nonce proves is only that it was signed after the question).
async fn report(State(c): State<Arc<Collector>>, uri: axum::http::Uri) -> Response {
    let nonce = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|kv| kv.strip_prefix("nonce="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    match c.signed_report(nonce) {
        Some(env) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            env.to_wire(),
        )
            .into_response(),
        None => ApiError::unavailable("no diagnose has finished yet").into_response(),
    }
}

/// A job key names its journal file: no leading dot, so never `.`, `..` or a hidden file.
fn valid_job_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

async fn start_repair(State(c): State<Arc<Collector>>, body: Bytes) -> Result<Response, ApiError> {
    let req: RepairRequest = parse_json(&body)?;
    if !valid_job_key(&req.job) {
        return Err(ApiError::bad_request(
            "job must be 1-128 chars of [A-Za-z0-9._-], not starting with '.'",
        ));
    }
    exec::validate_name(&req.command).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut repairs = c.repairs.lock_unpoisoned();
    if let Some(existing) = repairs.get(&req.job) {
        return Ok((StatusCode::OK, Json(existing.clone())).into_response());
    }
    if repairs.len() >= REPAIRS_KEPT
        && let Some(oldest) = repairs
            .values()
            .filter(|r| r.state == RepairState::Done)
            .min_by_key(|r| r.seq)
            .map(|r| r.job.clone())
    {
        repairs.remove(&oldest);
        c.journal.remove(&oldest);
    }
    let status = LiveRepairRecord {
        job: req.job.clone(),
        event: req.event.clone(),
        command: req.command.clone(),
        state: RepairState::Queued,
        exit_code: None,
        error: None,
        output: String::new(),
        seq: c.repair_seq.fetch_add(1, Ordering::SeqCst),
    };
    // On disk before it runs: a request re-sent after a restart finds it and runs nothing.
    c.journal.save(&status).map_err(|e| {
        ApiError::unavailable(format!("cannot record the repair in the journal: {e}"))
    })?;
    repairs.insert(req.job.clone(), status.clone());
    drop(repairs);
    let span = info_span!("repair", job = %req.job);
    tokio::spawn(c.clone().run_repair(req).instrument(span));
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

async fn repair_status(
    State(c): State<Arc<Collector>>,
    Path(job): Path<String>,
) -> Result<Json<LiveRepairRecord>, ApiError> {
    c.repairs
        .lock_unpoisoned()
        .get(&job)
        .cloned()
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no repair {job:?} on this collector")))
}

/// Arms the watchdog when configured and feeds it from the heartbeats; returns `shutdown`
/// extended by the feeder's stop and, when armed, a short wait so the master reads "disarmed"
/// before the collector goes silent, and never counts on a reset that will not come.
fn watchdog_until(
    collector: &Arc<Collector>,
    ccfg: &crate::config::CollectorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = ()> + Send + 'static, CollectorError> {
    let device = if ccfg.watchdog.enabled {
        Some(watchdog::Device::arm(&ccfg.watchdog)?)
    } else {
        None
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let feeder = device.map(|d| {
        tokio::spawn(
            watchdog::run(
                d,
                ccfg.watchdog.clone(),
                ccfg.heartbeat,
                collector.peers.clone(),
                stop_rx,
                ccfg.state_dir.join("watchdog.json"),
                collector.boot.id.to_string(),
            )
            .instrument(info_span!("watchdog")),
        )
    });
    Ok(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        if let Some(f) = feeder {
            // A feeder that stopped feeding never returns: the node is being reset anyway.
            let _ = tokio::time::timeout(Duration::from_secs(2), f).await;
            tokio::time::sleep(DISARMED_NOTICE).await;
        }
    })
}

/// Peer heartbeats, and the answers to the daemon's UDP polls, on one socket on the
/// collector's own address.
async fn heartbeats(
    collector: &Arc<Collector>,
    ccfg: &crate::config::CollectorConfig,
) -> Result<tokio::task::JoinHandle<()>, CollectorError> {
    let socket = tokio::net::UdpSocket::bind(ccfg.listen)
        .await
        .map_err(|e| {
            warn!(listen = %ccfg.listen, error = %e, "cannot bind the heartbeat socket");
            CollectorError::Listen(e)
        })?;
    let polls = ccfg
        .poll_udp
        .then(|| Arc::new(poll::PollAnswers::new(collector.clone())));
    let run = collector.peers.clone().run(socket, polls);
    Ok(tokio::spawn(run.instrument(info_span!("heartbeats"))))
}

/// Runs the diagnose every interval and keeps its latest verdict.
async fn diagnose_loop(c: Arc<Collector>) {
    let mut tick = tokio::time::interval(c.cfg.diagnose_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let d = diagnose(&c.cfg).await;
        if let Some(e) = &d.error {
            warn!(error = %e, "diagnose error; reporting Ok");
        }
        c.set_diagnosis(d);
    }
}

/// Runs the collector until `shutdown` resolves.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CollectorError> {
    let node = cfg.node_name();
    let cred = Credential::load(&cfg.collector_key_files(), &node)?;
    tracing::info!(node = %node, signs_with = %cred.now().describe(), "collector keys loaded");
    let ccfg = cfg.collector.clone();
    let listener = crate::http::bind(ccfg.listen)
        .await
        .map_err(CollectorError::Listen)?;
    let source = reload::KeySource {
        config: cfg.source.clone(),
        cluster_key_file: cfg.cluster.key_file.clone(),
        node: node.clone(),
    };
    reload::on_sighup(source, cred.clone()).map_err(CollectorError::Listen)?;
    let collector = Collector::new(node.clone(), cred, ccfg.clone())?;
    // Armed before anything listens: a device that cannot be armed stops the start-up.
    let shutdown = watchdog_until(&collector, &ccfg, shutdown)?;
    let heartbeats = heartbeats(&collector, &ccfg).await?;
    info!(node = %node, listen = %ccfg.listen, diagnose = %ccfg.diagnose, state_dir = %ccfg.state_dir.display(), "collector started");
    let systemd =
        crate::sdnotify::announce_ready(&format!("node {node}, listening on {}", ccfg.listen));

    let diag_loop =
        tokio::spawn(diagnose_loop(collector.clone()).instrument(info_span!("diagnose")));
    let result = crate::http::listener::serve(
        listener,
        collector.router(),
        ccfg.limits,
        Default::default(),
        // Reports, views and repairs carry no secret, and each is signed: see the security model.
        None,
        shutdown,
    )
    .await
    .map_err(CollectorError::Serve);
    if let Some(n) = &systemd {
        n.stopping();
    }
    diag_loop.abort();
    heartbeats.abort();
    // Let a running repair reach its end rather than abandon it half-way.
    let _ = tokio::time::timeout(Duration::from_secs(30), collector.repair_slot.acquire()).await;
    info!("collector stopped");
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::testing::{script, whitelist_dir};
    use crate::report::Key;

    /// A job key names a file in the journal: never `.`, `..` or a hidden file.
    #[test]
    fn a_job_key_is_a_plain_file_name() {
        for bad in ["", ".", "..", ".x", "a/b", &"a".repeat(129)] {
            assert!(!valid_job_key(bad), "{bad:?}");
        }
        for good in ["a", "a.b", "ev-1_2", "7..x"] {
            assert!(valid_job_key(good), "{good:?}");
        }
    }
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn cfg(dir: &std::path::Path, name: &str) -> CollectorConfig {
        CollectorConfig {
            state_dir: dir.join("state"),
            diagnose: name.into(),
            diagnose_dir: dir.into(),
            repair_dir: dir.into(),
            // Generous: a loaded 2-core machine can take seconds to start a script.
            diagnose_timeout: Duration::from_secs(20),
            diagnose_output_cap: 256,
            ..CollectorConfig::default()
        }
    }

    #[tokio::test]
    async fn broken_diagnose_scripts_report_ok_with_the_reason() {
        let d = whitelist_dir();
        script(
            d.path(),
            "good",
            r#"echo '{"status":"evacuate","details":{"d":1}}'"#,
        );
        script(d.path(), "badjson", "echo '{nope'");
        script(d.path(), "badstatus", r#"echo '{"status":"panic"}'"#);
        script(d.path(), "fails", "echo boom >&2; exit 4");
        script(d.path(), "slow", "sleep 60");
        script(d.path(), "huge", "head -c 1000 /dev/zero | tr '\\0' 'a'");
        let ok = diagnose(&cfg(d.path(), "good")).await;
        assert!(ok.error.is_none());
        assert_eq!(ok.verdict.status, maintd_core::verdict::Status::Evacuate);
        for (name, expect) in [
            ("badjson", "invalid output"),
            ("badstatus", "unknown status"),
            ("fails", "code 4: boom"),
            ("slow", "timed out"),
            ("huge", "over the 256-byte cap"),
            ("../good", "refused"),
            ("absent", "refused"),
        ] {
            let mut c = cfg(d.path(), name);
            if name == "slow" {
                c.diagnose_timeout = Duration::from_millis(300);
            }
            let r = diagnose(&c).await;
            let err = r.error.unwrap_or_default();
            assert!(err.contains(expect), "{name}: {err}");
            assert_eq!(r.verdict.status, maintd_core::verdict::Status::Ok);
            assert_eq!(r.verdict.original["details"]["diagnose-error"], err);
        }
        let builtin = diagnose(&cfg(d.path(), "")).await;
        assert!(builtin.error.is_none());
        assert_eq!(builtin.verdict.status, maintd_core::verdict::Status::Ok);
    }

    /// Collector `n1` with the built-in diagnose and its journal in a fresh directory.
    pub(super) fn collector(key: &Key) -> (Arc<Collector>, tempfile::TempDir) {
        let state = tempfile::tempdir().unwrap();
        let cfg = CollectorConfig {
            state_dir: state.path().into(),
            ..CollectorConfig::default()
        };
        (
            Collector::new("n1".into(), key.clone(), cfg).unwrap(),
            state,
        )
    }

    #[tokio::test]
    async fn reports_are_signed_with_increasing_sequence() {
        let key = Key::from_bytes(vec![1; 32]);
        let (c, _state) = collector(&key);
        let app = c.router();
        let get_report = || {
            app.clone().oneshot(
                Request::get("/1/report/diagnose?nonce=77")
                    .body(Body::empty())
                    .unwrap(),
            )
        };
        let resp = get_report().await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        c.set_diagnosis(diagnose(&CollectorConfig::default()).await);
        let mut last = None;
        for _ in 0..2 {
            let resp = get_report().await.unwrap();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            let rules = crate::report::VerifyRules { max_bytes: 1 << 20 };
            let v = Envelope::verify(&body, &key, "n1", last, 77, rules).unwrap();
            last = Some(v.envelope.seq);
        }
    }

    #[tokio::test]
    async fn unsigned_repair_requests_are_refused_and_run_nothing() {
        let d = whitelist_dir();
        let marker = d.path().join("ran");
        script(d.path(), "fix", &format!("touch {}", marker.display()));
        let c =
            Collector::new("n1".into(), Key::from_bytes(vec![1; 32]), cfg(d.path(), "")).unwrap();
        let body = serde_json::to_vec(&json!({"job":"j1","event":"e","command":"fix","input":{}}))
            .unwrap();
        let resp = c
            .router()
            .oneshot(
                Request::post("/1/repair")
                    .header("x-maintd-timestamp", now_ns().to_string())
                    .header("x-maintd-signature", "00".repeat(32))
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let v: serde_json::Value = serde_json::from_slice(
            &axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(v["error"], "unauthorized");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!marker.exists());
    }
}
