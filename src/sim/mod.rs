//! The simulated-time harness: the engine, the fencer and the poller, built by the daemon's own
//! assembly (`daemon::assembly`), against in-memory collectors, an in-memory cluster and scripted fence agents, on
//! tokio's paused clock. No socket and no sleep: time moves only when every task waits, so a
//! scenario over simulated minutes runs in milliseconds and always the same way. Reports are
//! signed and verified and the store is real SQLite; what crosses a process or a network (hooks,
//! fence agents, HTTP) is proven by the tests under `tests/` instead.

mod clocks;
mod detector;
mod fakes;
mod latency;
mod plans;
mod returns;
mod scenarios;
mod selffence;
mod witnesses;

use fakes::SimNode;
pub use fakes::{SimAgents, SimCluster, SimCollectors, SimMaps};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use uuid::Uuid;

use crate::clock::{Clock, RuntimeClock};
use crate::cluster::{Backend, ClusterError, EventReason, Events, FenceRelease, TagsAndJobs};
use crate::daemon::assembly::PartMetrics;
use crate::daemon::assembly::{Deps, FencingSettings, Running, Settings, assemble};
use crate::fencing::agent::{AgentRunner, EXIT_OFF, EXIT_OK};
use crate::fencing::config::{ExecPolicy, FencePlan, FencingConfig, Method, Stage};
use crate::fencing::executor::FencerSettings;
use crate::fencing::peering::PeeringSettings;
use crate::fencing::readiness::{Board, CheckSettings};
use crate::leader::Leadership;
use crate::link::{Answer, CollectorLink, LinkError, Links};
use crate::members::{Members, NodeHealth};
use crate::node::NodeConfig;
use crate::parts::Shared;
use crate::repair::engine::EngineSettings;
use crate::repair::poller::{PollSettings, REPORT_PATH};
use crate::report::heartbeat::{PeerSet, PeerState, PeerView, SignedView};
use crate::report::live::{LiveRepairRecord, RepairRequest, RepairState};
use crate::report::{Envelope, Key, VerifyRules};
use crate::store::Store;
use crate::sync::LockExt;
use maintd_core::fencing::machine::Flow;
use maintd_core::repair::{Event, Job, JobKind, Policy};
use maintd_core::verdict::{Nanos, Outcome, Verdict};

/// Where simulated time starts: a fixed Unix time, so runs are reproducible.
pub const T0: Nanos = 1_800_000_000_000_000_000;

pub const OK: &str = r#"{"status":"Ok"}"#;

fn verdict(json: &str) -> Verdict {
    Verdict::parse_bytes(json.as_bytes()).expect("a scenario's verdict is valid")
}

/// What a scenario sets up.
#[derive(Clone)]
pub struct SimOptions {
    pub nodes: usize,
    pub policy: Policy,
    pub poll_interval: Duration,
    /// Fencing with a simulated power switch on every node, when set.
    pub fencing: Option<FencingConfig>,
    /// Retries of the power-management stage.
    pub power_retries: u32,
    /// Nodes that self-fence (`self-fence = true`).
    pub self_fence: Vec<String>,
    /// Nodes without a power switch (no power-management stage).
    pub no_power: Vec<String>,
    /// Power-management powers nodes back on after the release (`after-release = "on"`);
    /// off leaves them off for a person.
    pub power_on: bool,
    /// Changes every node's plan as the configuration would (a restart takes it up).
    pub edit_plans: Option<fn(&mut FencePlan)>,
    /// Plans come from these fence ConfigMaps (followed as they change) instead of the file.
    pub configmaps: Option<Arc<SimMaps>>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            nodes: 3,
            policy: Policy::default(),
            poll_interval: Duration::from_secs(2),
            fencing: None,
            power_retries: 0,
            self_fence: Vec::new(),
            no_power: Vec::new(),
            power_on: false,
            edit_plans: None,
            configmaps: None,
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
            required: true,
            power_on: false,
            executor: Default::default(),
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
    /// The fence readiness checks, with fencing.
    pub readiness: Option<Arc<Board>>,
    /// The fencer's peer sets and views, with fencing.
    pub peering: Option<Arc<crate::fencing::peering::Peering>>,
    /// What the daemon's parts count.
    pub metrics: PartMetrics,
    running: Option<Running>,
    world: World,
    options: SimOptions,
    _dir: tempfile::TempDir,
}

/// What outlives a restart of the simulated daemon: the store, the clock, the nodes and the
/// fakes they are reached through.
struct World {
    names: Vec<String>,
    nodes: Vec<NodeConfig>,
    key: Key,
    store: Arc<Store>,
    cluster: Arc<SimCluster>,
    collectors: Arc<SimCollectors>,
    agents: Arc<SimAgents>,
    clock: Arc<RuntimeClock>,
    /// Counted across restarts, so a scenario reads its whole run.
    metrics: PartMetrics,
}

impl World {
    /// One daemon process: its parts assembled from `o` and this world, and started.
    fn daemon(&self, o: &SimOptions) -> (crate::daemon::assembly::Assembly, Running) {
        let World {
            names,
            nodes,
            key,
            store,
            cluster,
            collectors,
            agents,
            clock,
            metrics,
        } = self;
        let (nodes, key) = (nodes.clone(), key.clone());
        let link: Arc<dyn CollectorLink> = collectors.clone();
        let fencing = o.fencing.as_ref().map(|f| {
            let plans: BTreeMap<String, FencePlan> = names
                .iter()
                .map(|n| {
                    let power = !o.no_power.contains(n);
                    let mut plan = FencePlan {
                        isolation: None,
                        power_management: power.then(|| stage(n, "off", o.power_retries)),
                        power_on: (power && o.power_on).then(|| stage(n, "on", 2)),
                        recovery: (power && !o.power_on).then(|| stage(n, "on", 0)),
                        self_fence: o.self_fence.contains(n),
                        kdump: false,
                    };
                    if let Some(edit) = o.edit_plans {
                        edit(&mut plan);
                    }
                    (n.clone(), plan)
                })
                .collect();
            let book = match &o.configmaps {
                Some(_) => crate::fencing::book::PlanBook::with_configmaps(BTreeMap::new()),
                None => crate::fencing::book::PlanBook::fixed(plans),
            };
            FencingSettings {
                fencer: FencerSettings::new(f, Arc::new(book)),
                checks: CheckSettings::new(f),
                peering: PeeringSettings {
                    watchers: f.watchers,
                    fresh_for: f.liveness_interval * 3,
                },
            }
        });
        let settings = Settings {
            poll: PollSettings {
                rules: VerifyRules {
                    max_bytes: 64 * 1024,
                },
                concurrency: 16,
                timeout: Duration::from_secs(5),
            },
            engine: EngineSettings {
                policy: o.policy,
                poll_interval: o.poll_interval,
                max_disruptions: 1,
                max_remedies: 1,
            },
            repair_timeout: Duration::from_secs(60),
            fencing,
        };
        let deps = Deps {
            metrics: metrics.clone(),
            shared: Shared {
                flows: store.clone(),
                leadership: Arc::new(Leadership::single("sim".into(), store.clone())),
                store: store.clone(),
                cluster: Backend {
                    events: Some(cluster.clone()),
                    ..Backend::basic(cluster.clone())
                },
                clock: clock.clone(),
                members: Arc::new(Members::new(nodes)),
                watch: None,
                health: Arc::new(NodeHealth::default()),
            },
            links: Links::same(link),
            agents: agents.clone(),
            keys: crate::report::keyring::Keyring::arc(key),
            maps: o
                .configmaps
                .clone()
                .map(|m| m as Arc<dyn crate::cluster::maps::MapSource>),
            // No service manager watches the simulation.
            systemd: None,
        };
        let parts = assemble(settings, deps).expect("the parts assemble");
        let running = parts.spawn();
        (parts, running)
    }
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
            .enumerate()
            .map(|(i, n)| NodeConfig {
                name: n.clone(),
                // Addresses, not names: the fencer resolves names for the peer sets.
                collector: format!("10.0.{}.{}:1815", i / 250, i % 250 + 1),
            })
            .collect();
        let collectors = Arc::new(SimCollectors {
            key: key.clone(),
            wrong: Key::from_bytes(vec![8; 32]),
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
                            peers: Default::default(),
                            cut_from_master: false,
                            silent_since: None,
                            wrong_key: false,
                            watchdog: None,
                            marked: false,
                            boot: fakes::boot_of(n, -1),
                        };
                        (n.clone(), node)
                    })
                    .collect(),
            ),
            impairment: Mutex::new(None),
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
            events: Mutex::new(Vec::new()),
        });
        let agents = Arc::new(SimAgents {
            collectors: collectors.clone(),
            calls: Mutex::new(Vec::new()),
            passwords: Mutex::new(Vec::new()),
            failures: Mutex::new(BTreeMap::new()),
            hang: AtomicBool::new(false),
            lies: AtomicBool::new(false),
            lied_on: AtomicBool::new(false),
        });
        let store = Arc::new(Store::open(&dir.path().join("state.db")).expect("a store"));
        let mut registry = Registry::default();
        let metrics = PartMetrics::register(&mut registry);
        let world = World {
            names,
            nodes,
            key,
            store: store.clone(),
            cluster: cluster.clone(),
            collectors: collectors.clone(),
            agents: agents.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
        };
        let (parts, running) = world.daemon(&o);
        Sim {
            clock,
            store,
            cluster,
            collectors,
            agents,
            readiness: parts.readiness.as_ref().map(|r| r.board()),
            peering: parts.peering.clone(),
            metrics,
            running: Some(running),
            world,
            options: o,
            _dir: dir,
        }
    }

    /// Stops the daemon as SIGTERM does and starts another on the same store, clock and
    /// collectors: what it knows after is what the store kept.
    pub async fn restart(&mut self) {
        if let Some(r) = self.running.take()
            && let Err(e) = r.stop().await
        {
            panic!("a task of the simulation panicked: {e}");
        }
        self.clock.new_process();
        let (parts, running) = self.world.daemon(&self.options);
        self.readiness = parts.readiness.as_ref().map(|r| r.board());
        self.peering = parts.peering.clone();
        self.running = Some(running);
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
        let mut v = self.store.events_with_jobs(None).expect("events");
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
        if let Some(r) = self.running
            && let Err(e) = r.stop().await
        {
            panic!("a task of the simulation panicked: {e}");
        }
    }
}
