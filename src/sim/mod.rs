//! The simulated-time harness: the engine, the fencer and the poller, wired as the daemon wires
//! them, against in-memory collectors, an in-memory cluster and scripted fence agents, on
//! tokio's paused clock. No socket and no sleep: time moves only when every task waits, so a
//! scenario over simulated minutes runs in milliseconds and always the same way. Reports are
//! signed and verified and the store is real SQLite; what crosses a process or a network (hooks,
//! fence agents, HTTP) is proven by the tests under `tests/` instead.

mod scenarios;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::clock::{Clock, RuntimeClock};
use crate::cluster::{Cluster, ClusterError};
use crate::collector::{LiveRepairRecord, RepairRequest, RepairState};
use crate::fencing::agent::{AgentRunner, EXIT_OFF, EXIT_OK};
use crate::fencing::config::{ExecPolicy, FencePlan, FencingConfig, Method, Stage};
use crate::fencing::executor::Fencer;
use crate::fencing::machine::Flow;
use crate::leader::Leadership;
use crate::link::{Answer, CollectorLink, LinkError};
use crate::members::Members;
use crate::metrics::Metrics;
use crate::node::NodeConfig;
use crate::repair::engine::{Engine, Health};
use crate::repair::live::LiveRepairs;
use crate::repair::poller::{PollSettings, Poller, REPORT_PATH};
use crate::repair::{Event, Job, JobKind, Policy};
use crate::report::{Envelope, Key, VerifyRules};
use crate::store::Store;
use crate::sync::LockExt;
use crate::verdict::{Nanos, Outcome, Verdict};

/// Where simulated time starts: a fixed Unix time, so runs are reproducible.
pub const T0: Nanos = 1_800_000_000_000_000_000;

pub const OK: &str = r#"{"status":"Ok"}"#;

fn verdict(json: &str) -> Verdict {
    Verdict::parse_bytes(json.as_bytes()).expect("a scenario's verdict is valid")
}

struct SimNode {
    powered: bool,
    /// The collector process answers (a powered node may still be silent: a hung kernel).
    answering: bool,
    verdict: Verdict,
    seq: u64,
    repairs: BTreeMap<String, LiveRepairRecord>,
}

/// In-memory collectors: each report is diagnosed when asked and signed with the cluster key,
/// so the poller verifies it exactly as it verifies one from the network.
pub struct SimCollectors {
    key: Key,
    clock: Arc<dyn Clock>,
    nodes: Mutex<BTreeMap<String, SimNode>>,
}

impl SimCollectors {
    fn with<T>(&self, node: &str, f: impl FnOnce(&mut SimNode) -> T) -> T {
        let mut nodes = self.nodes.lock_unpoisoned();
        f(nodes.get_mut(node).expect("a simulated node"))
    }

    pub fn set_verdict(&self, node: &str, json: &str) {
        let v = verdict(json);
        self.with(node, |n| n.verdict = v);
    }

    /// The collector stops answering; the node stays powered.
    pub fn silence(&self, node: &str) {
        self.with(node, |n| n.answering = false);
    }

    pub fn answer_again(&self, node: &str) {
        self.with(node, |n| n.answering = true);
    }

    pub fn powered(&self, node: &str) -> bool {
        self.with(node, |n| n.powered)
    }

    fn set_power(&self, node: &str, on: bool) {
        self.with(node, |n| n.powered = on);
    }

    /// The live-repair commands the node ran, once each.
    pub fn repairs(&self, node: &str) -> Vec<String> {
        self.with(node, |n| {
            n.repairs.values().map(|r| r.command.clone()).collect()
        })
    }

    fn up(&self, node: &str) -> Result<(), LinkError> {
        if self.with(node, |n| n.powered && n.answering) {
            Ok(())
        } else {
            Err(LinkError::Down(
                "simulated: the collector does not answer".into(),
            ))
        }
    }
}

fn answer(status: u16, body: Vec<u8>, cap: usize) -> Result<Answer, LinkError> {
    if body.len() > cap {
        return Err(LinkError::TooLarge { cap });
    }
    Ok(Answer {
        status: reqwest::StatusCode::from_u16(status).expect("a valid status"),
        body,
    })
}

#[async_trait::async_trait]
impl CollectorLink for SimCollectors {
    async fn get(&self, node: &NodeConfig, path: &str, cap: usize) -> Result<Answer, LinkError> {
        self.up(&node.name)?;
        match path {
            "/" => answer(200, b"[1]".to_vec(), cap),
            REPORT_PATH => {
                let now = self.clock.now();
                let env = self.with(&node.name, |n| {
                    n.seq += 1;
                    Envelope::new(&node.name, n.seq, now, now, &n.verdict, None)
                });
                let body = serde_json::to_vec(&env.sign(&self.key)).expect("serializes");
                answer(200, body, cap)
            }
            _ => answer(404, br#"{"error":"not-found"}"#.to_vec(), cap),
        }
    }

    /// Live repairs finish at once with exit 0; a job key is run once, as on a real collector.
    async fn signed(
        &self,
        node: &NodeConfig,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        self.up(&node.name)?;
        let record = if method == reqwest::Method::POST && path == "/1/repair" {
            let req: RepairRequest = serde_json::from_slice(&body.unwrap_or_default())
                .map_err(|e| LinkError::Broken(e.to_string()))?;
            let r = self.with(&node.name, |n| {
                n.repairs
                    .entry(req.job.clone())
                    .or_insert_with(|| LiveRepairRecord {
                        job: req.job.clone(),
                        event: req.event.clone(),
                        command: req.command.clone(),
                        state: RepairState::Done,
                        exit_code: Some(0),
                        error: None,
                        output: "repaired".into(),
                        seq: 1,
                    })
                    .clone()
            });
            Some(r)
        } else if let Some(job) = path.strip_prefix("/1/repair/") {
            self.with(&node.name, |n| n.repairs.get(job).cloned())
        } else {
            None
        };
        match record {
            Some(r) => answer(200, serde_json::to_vec(&r).expect("serializes"), cap),
            None => answer(404, br#"{"error":"not-found"}"#.to_vec(), cap),
        }
    }
}

/// An in-memory cluster: tags, offline marks, and jobs that take a scripted simulated time and
/// succeed unless told to fail.
pub struct SimCluster {
    nodes: BTreeSet<String>,
    tags: Mutex<BTreeMap<String, BTreeSet<String>>>,
    offline: Mutex<BTreeSet<String>>,
    job_time: Mutex<HashMap<JobKind, Duration>>,
    failing: Mutex<HashSet<JobKind>>,
    /// Every job started, in order, as `<kind> <node>`.
    pub jobs: Mutex<Vec<String>>,
    pub releases: Mutex<Vec<(String, Uuid, u32)>>,
    pub reclaims: Mutex<Vec<(String, Uuid)>>,
}

impl SimCluster {
    pub fn job_takes(&self, kind: JobKind, d: Duration) {
        self.job_time.lock_unpoisoned().insert(kind, d);
    }

    pub fn fail(&self, kind: JobKind) {
        self.failing.lock_unpoisoned().insert(kind);
    }

    pub fn tags_of(&self, node: &str) -> BTreeSet<String> {
        self.tags
            .lock_unpoisoned()
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    pub fn jobs(&self) -> Vec<String> {
        self.jobs.lock_unpoisoned().clone()
    }

    pub fn releases(&self) -> usize {
        self.releases.lock_unpoisoned().len()
    }

    fn known(&self, node: &str) -> Result<(), ClusterError> {
        if self.nodes.contains(node) {
            Ok(())
        } else {
            Err(ClusterError::UnknownNode(node.into()))
        }
    }
}

#[async_trait::async_trait]
impl Cluster for SimCluster {
    async fn tags(&self) -> Result<BTreeMap<String, BTreeSet<String>>, ClusterError> {
        Ok(self.tags.lock_unpoisoned().clone())
    }

    async fn add_tag(&self, node: &str, tag: &str) -> Result<(), ClusterError> {
        self.known(node)?;
        let mut tags = self.tags.lock_unpoisoned();
        tags.entry(node.into()).or_default().insert(tag.into());
        Ok(())
    }

    async fn remove_tag(&self, node: &str, tag: &str) -> Result<bool, ClusterError> {
        self.known(node)?;
        let mut tags = self.tags.lock_unpoisoned();
        Ok(tags.get_mut(node).is_some_and(|t| t.remove(tag)))
    }

    async fn run_job(&self, job: &Job, _event: &Value) -> Outcome {
        self.jobs
            .lock_unpoisoned()
            .push(format!("{} {}", job.kind.as_str(), job.node));
        let d = self.job_time.lock_unpoisoned().get(&job.kind).copied();
        if let Some(d) = d {
            tokio::time::sleep(d).await;
        }
        if self.failing.lock_unpoisoned().contains(&job.kind) {
            return Outcome::failed(format!("simulated {} failure", job.kind.as_str()));
        }
        match job.kind {
            JobKind::Offline => {
                self.offline.lock_unpoisoned().insert(job.node.clone());
            }
            JobKind::Online => {
                self.offline.lock_unpoisoned().remove(&job.node);
            }
            _ => {}
        }
        Outcome {
            ok: true,
            detail: format!("simulated {} done", job.kind.as_str()),
        }
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self.offline.lock_unpoisoned().clone())
    }

    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome {
        self.releases
            .lock_unpoisoned()
            .push((node.into(), *flow, attempt));
        self.offline.lock_unpoisoned().insert(node.into());
        Outcome {
            ok: true,
            detail: "simulated release".into(),
        }
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        self.reclaims.lock_unpoisoned().push((node.into(), *flow));
        self.offline.lock_unpoisoned().remove(node);
        Outcome {
            ok: true,
            detail: "simulated reclaim".into(),
        }
    }
}

/// Fence agents that switch the simulated node's power: `off` powers it off, `status` answers
/// as the power is, `on` powers it on. Failures and hangs are scripted.
pub struct SimAgents {
    collectors: Arc<SimCollectors>,
    /// Every call, in order, as `<action> <node>`.
    pub calls: Mutex<Vec<String>>,
    /// Calls of an action that fail (exit 1) before it works again.
    failures: Mutex<BTreeMap<String, u32>>,
    /// Every call hangs until the stage's deadline kills it (a dead BMC).
    pub hang: AtomicBool,
}

impl SimAgents {
    pub fn fail_next(&self, action: &str, times: u32) {
        self.failures.lock_unpoisoned().insert(action.into(), times);
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock_unpoisoned().clone()
    }
}

#[async_trait::async_trait]
impl AgentRunner for SimAgents {
    async fn call(
        &self,
        method: &Method,
        action: &str,
        deadline: Duration,
    ) -> (Option<i32>, String) {
        let node = method.params.get("node").cloned().unwrap_or_default();
        self.calls
            .lock_unpoisoned()
            .push(format!("{action} {node}"));
        if self.hang.load(Ordering::SeqCst) {
            tokio::time::sleep(deadline).await;
            return (None, "killed at the deadline".into());
        }
        if let Some(left) = self.failures.lock_unpoisoned().get_mut(action)
            && *left > 0
        {
            *left -= 1;
            return (Some(1), "simulated agent failure".into());
        }
        match action {
            "off" => {
                self.collectors.set_power(&node, false);
                (Some(EXIT_OK), "Success: Powered OFF".into())
            }
            "on" => {
                self.collectors.set_power(&node, true);
                (Some(EXIT_OK), "Success: Powered ON".into())
            }
            "status" if self.collectors.powered(&node) => (Some(EXIT_OK), "Status: ON".into()),
            "status" => (Some(EXIT_OFF), "Status: OFF".into()),
            _ => (Some(1), format!("unknown action {action}")),
        }
    }
}

/// What a scenario sets up.
pub struct SimOptions {
    pub nodes: usize,
    pub policy: Policy,
    pub poll_interval: Duration,
    /// Fencing with a simulated power switch on every node, when set.
    pub fencing: Option<FencingConfig>,
    /// Retries of the power-management stage.
    pub power_retries: u32,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            nodes: 3,
            policy: Policy::default(),
            poll_interval: Duration::from_secs(2),
            fencing: None,
            power_retries: 0,
        }
    }
}

fn stage(node: &str, action: &str, retries: u32) -> Stage {
    Stage {
        policy: ExecPolicy::All,
        timeout: Duration::from_secs(20),
        retries,
        retry_interval: Duration::from_secs(5),
        methods: vec![Method {
            name: "switch".into(),
            agent: "fence_sim".into(),
            action: action.into(),
            params: BTreeMap::from([("node".to_string(), node.to_string())]),
            secrets: vec![],
        }],
    }
}

pub fn node_name(i: usize) -> String {
    format!("node{}", i + 1)
}

/// The running world of one scenario.
pub struct Sim {
    pub clock: Arc<RuntimeClock>,
    pub store: Arc<Store>,
    pub cluster: Arc<SimCluster>,
    pub collectors: Arc<SimCollectors>,
    pub agents: Arc<SimAgents>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Sim {
    /// Starts the engine (and the fencer, with fencing) on the current runtime, which must run
    /// on paused time.
    pub fn start(o: SimOptions) -> Sim {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let clock = Arc::new(RuntimeClock::starting_at(T0));
        let key = Key::from_bytes(vec![7; 32]);
        let names: Vec<String> = (0..o.nodes).map(node_name).collect();
        let nodes: Vec<NodeConfig> = names
            .iter()
            .map(|n| NodeConfig {
                name: n.clone(),
                collector: format!("{n}.sim:1815"),
            })
            .collect();
        let collectors = Arc::new(SimCollectors {
            key: key.clone(),
            clock: clock.clone(),
            nodes: Mutex::new(
                names
                    .iter()
                    .map(|n| {
                        let node = SimNode {
                            powered: true,
                            answering: true,
                            verdict: verdict(OK),
                            seq: 0,
                            repairs: BTreeMap::new(),
                        };
                        (n.clone(), node)
                    })
                    .collect(),
            ),
        });
        let cluster = Arc::new(SimCluster {
            nodes: names.iter().cloned().collect(),
            tags: Mutex::new(BTreeMap::new()),
            offline: Mutex::new(BTreeSet::new()),
            job_time: Mutex::new(HashMap::new()),
            failing: Mutex::new(HashSet::new()),
            jobs: Mutex::new(Vec::new()),
            releases: Mutex::new(Vec::new()),
            reclaims: Mutex::new(Vec::new()),
        });
        let agents = Arc::new(SimAgents {
            collectors: collectors.clone(),
            calls: Mutex::new(Vec::new()),
            failures: Mutex::new(BTreeMap::new()),
            hang: AtomicBool::new(false),
        });
        let store = Arc::new(Store::open(&dir.path().join("state.db")).expect("a store"));
        let metrics = Metrics::register(&mut Registry::default());
        let members = Arc::new(Members::new(nodes));
        let link: Arc<dyn CollectorLink> = collectors.clone();
        let wake = Arc::new(Notify::new());
        let fence_wake = Arc::new(Notify::new());
        let mut leadership = Leadership::single("sim".into(), store.clone());
        leadership.wake = vec![wake.clone(), fence_wake.clone()];
        let leadership = Arc::new(leadership);
        let settings = PollSettings {
            rules: VerifyRules {
                window_s: 30,
                max_bytes: 64 * 1024,
            },
            concurrency: 16,
            timeout: Duration::from_secs(5),
        };
        let mut poller = Poller::with_link(
            settings,
            link.clone(),
            members.clone(),
            key,
            store.clone(),
            metrics.clone(),
        )
        .expect("a poller");
        poller.clock = clock.clone();
        let engine = Arc::new(Engine {
            store: store.clone(),
            cluster: cluster.clone(),
            poller,
            repairs: LiveRepairs::with_link(link.clone(), Duration::from_secs(60), members.clone()),
            policy: o.policy,
            poll_interval: o.poll_interval,
            wake,
            metrics: metrics.clone(),
            leadership: leadership.clone(),
            watch: None,
            max_disruptions: 1,
            resumed_term: AtomicU64::new(0),
            health: Arc::new(Health::new(clock.now())),
            clock: clock.clone(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let mut tasks = vec![tokio::spawn(engine.clone().run(stopped(stop_rx.clone())))];
        if let Some(f) = &o.fencing {
            let plans: BTreeMap<String, FencePlan> = names
                .iter()
                .map(|n| {
                    let plan = FencePlan {
                        isolation: None,
                        power_management: stage(n, "off", o.power_retries),
                        recovery: Some(stage(n, "on", 0)),
                    };
                    (n.clone(), plan)
                })
                .collect();
            let mut fencer = Fencer::new(
                f,
                plans,
                store.clone(),
                cluster.clone(),
                agents.clone(),
                link,
                metrics,
                leadership,
                members,
            );
            fencer.wake = fence_wake;
            fencer.clock = clock.clone();
            tasks.push(tokio::spawn(Arc::new(fencer).run(stopped(stop_rx))));
        }
        Sim {
            clock,
            store,
            cluster,
            collectors,
            agents,
            stop,
            tasks,
            _dir: dir,
        }
    }

    /// Lets `d` of simulated time pass.
    pub async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Simulated seconds since the start.
    pub fn elapsed_s(&self) -> f64 {
        (self.clock.now() - T0) as f64 / 1e9
    }

    /// Waits, in simulated time, until `check` gives a value; fails the scenario naming `what`
    /// once `within` has passed.
    pub async fn until<T>(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&Sim) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(v) = check(self) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {within:?} of simulated time (at {:.1} s)",
                self.elapsed_s()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every event the store holds, with its jobs, oldest first.
    pub fn events(&self) -> Vec<(Event, Vec<Job>)> {
        let mut v = self.store.events_with_jobs().expect("events");
        v.sort_by_key(|(e, _)| e.created);
        v
    }

    pub fn events_of(&self, node: &str) -> Vec<(Event, Vec<Job>)> {
        self.events()
            .into_iter()
            .filter(|(e, _)| e.node == node)
            .collect()
    }

    pub fn flows(&self) -> Vec<Flow> {
        self.store.all_flows(100).expect("flows")
    }

    /// Stops every task as the daemon does on SIGTERM (running fence steps finish first).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.await.expect("a task of the simulation panicked");
        }
    }
}
