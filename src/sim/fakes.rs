//! The in-memory world of the harness: collectors that sign what they diagnose, a cluster that
//! keeps tags and runs jobs in simulated time, and fence agents that switch simulated power.

use super::*;
use std::sync::atomic::Ordering;

pub(super) struct SimNode {
    pub(super) powered: bool,
    /// The collector process answers (a powered node may still be silent: a hung kernel).
    pub(super) answering: bool,
    pub(super) verdict: Verdict,
    pub(super) seq: u64,
    pub(super) repairs: BTreeMap<String, LiveRepairRecord>,
    /// The peer set the leader pushed.
    pub(super) peers: PeerSet,
    /// The master's requests do not reach the collector, but its peers' heartbeats flow.
    pub(super) cut_from_master: bool,
    /// When its heartbeats stopped (powered off or hung); `None` while it beats.
    pub(super) silent_since: Option<Nanos>,
    /// It signs with another key: its peers refuse its heartbeats, the master its view.
    pub(super) wrong_key: bool,
    /// Its armed watchdog, as its view reports it.
    pub(super) watchdog: Option<crate::report::WatchdogReport>,
    /// The master's last signed probe marked it for fencing.
    pub(super) marked: bool,
    /// Its boot: a new one each time it is powered on.
    pub(super) boot: crate::report::BootReport,
}

/// A node's boot from `at`: its id derived from the node and the moment, so runs repeat.
pub(super) fn boot_of(node: &str, at: Nanos) -> crate::report::BootReport {
    crate::report::BootReport {
        id: uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{node}\n{at}").as_bytes(),
        ),
        at,
    }
}

/// A collector's `lost-after`: a peer silent for longer is lost.
const LOST_AFTER: Nanos = 2_000_000_000;

/// In-memory collectors: each report is diagnosed when asked and signed with the cluster key,
/// so the poller verifies it exactly as it verifies one from the network.
pub struct SimCollectors {
    pub(super) key: Key,
    /// The key a misconfigured node signs with.
    pub(super) wrong: Key,
    pub(super) clock: Arc<crate::clock::RuntimeClock>,
    pub(super) nodes: Mutex<BTreeMap<String, SimNode>>,
    /// Latency and loss on the liveness probe's path, with the state of its random numbers.
    pub(super) impairment: Mutex<Option<(Impairment, u64)>>,
}

/// A lossy, jittery link, as the probe sees it: each direction takes `one_way` ± `jitter`, and
/// a direction loses its segment with `loss_percent` chance, which TCP retransmits after a
/// second.
#[derive(Debug, Clone, Copy)]
pub struct Impairment {
    pub one_way: Duration,
    pub jitter: Duration,
    pub loss_percent: u64,
}

impl SimCollectors {
    /// Every liveness probe from now on crosses this link (deterministic, from `seed`).
    pub fn impair(&self, i: Impairment, seed: u64) {
        *self.impairment.lock_unpoisoned() = Some((i, seed.max(1)));
    }

    /// How long the next probe's round trip takes.
    fn round_trip(&self) -> Option<Duration> {
        let mut guard = self.impairment.lock_unpoisoned();
        let (i, state) = guard.as_mut()?;
        let mut next = || {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state
        };
        let mut total = Duration::ZERO;
        for _ in 0..2 {
            let j = i.jitter.as_millis() as u64;
            let ms = i.one_way.as_millis() as u64 + next() % (2 * j + 1);
            total += Duration::from_millis(ms.saturating_sub(j));
            if next() % 100 < i.loss_percent {
                total += Duration::from_secs(1);
            }
        }
        Some(total)
    }

    fn with<T>(&self, node: &str, f: impl FnOnce(&mut SimNode) -> T) -> T {
        let mut nodes = self.nodes.lock_unpoisoned();
        f(nodes.get_mut(node).expect("a simulated node"))
    }

    pub fn set_verdict(&self, node: &str, json: &str) {
        let v = verdict(json);
        self.with(node, |n| n.verdict = v);
    }

    /// The collector hangs: it answers nothing and sends no heartbeat; the node stays powered.
    pub fn silence(&self, node: &str) {
        let now = self.clock.true_now();
        self.with(node, |n| {
            n.answering = false;
            n.silent_since.get_or_insert(now);
        });
    }

    pub fn answer_again(&self, node: &str) {
        self.with(node, |n| {
            n.answering = true;
            if n.powered {
                n.silent_since = None;
            }
        });
    }

    /// The node reset (its watchdog fired, or a person cycled it) and answers from a new boot.
    pub fn reboot(&self, node: &str) {
        let now = self.clock.true_now();
        self.with(node, |n| n.boot = boot_of(node, now));
        self.answer_again(node);
    }

    /// The node's collector is given another cluster key (a misconfiguration).
    pub fn use_wrong_key(&self, node: &str) {
        self.with(node, |n| n.wrong_key = true);
    }

    /// The link between the master and the node breaks; the node and its peers hear each
    /// other.
    pub fn cut_from_master(&self, node: &str, cut: bool) {
        self.with(node, |n| n.cut_from_master = cut);
    }

    /// The node's collector arms a watchdog with the default settings.
    pub fn arm_watchdog(&self, node: &str) {
        let w = crate::collector::watchdog::report(&Default::default(), &Default::default());
        self.with(node, |n| n.watchdog = Some(w));
    }

    /// Whether the master's last probe that reached the node marked it.
    pub fn marked(&self, node: &str) -> bool {
        self.with(node, |n| n.marked)
    }

    pub fn powered(&self, node: &str) -> bool {
        self.with(node, |n| n.powered)
    }

    pub(super) fn set_power(&self, node: &str, on: bool) {
        let now = self.clock.true_now();
        self.with(node, |n| {
            // Powered on, it boots afresh: a hang ends with the old kernel.
            if on && !n.powered {
                n.boot = boot_of(node, now);
                n.answering = true;
            }
            n.powered = on;
            if !on {
                n.silent_since.get_or_insert(now);
            } else if n.answering {
                n.silent_since = None;
            }
        });
    }

    /// `node`'s signed view of its peers: a peer is alive until `LOST_AFTER` past its last
    /// heartbeat, as on a real collector.
    fn view(&self, node: &str, answers: u64) -> SignedView {
        let now = self.clock.true_now();
        let nodes = self.nodes.lock_unpoisoned();
        let me = &nodes[node];
        let peers = me
            .peers
            .peers
            .keys()
            .map(|p| {
                // A peer signing with another key is never heard: its beats are refused.
                let heard_at = nodes
                    .get(p)
                    .filter(|x| x.wrong_key == me.wrong_key)
                    .map(|x| x.silent_since.unwrap_or(now));
                let alive = heard_at.is_some_and(|h| now - h <= LOST_AFTER);
                PeerState {
                    name: p.clone(),
                    heard_at,
                    alive,
                    hears_me: alive,
                    quiet_ms: heard_at.map(|h| ((now - h).max(0) / 1_000_000) as u64),
                }
            })
            .collect();
        PeerView {
            node: node.into(),
            epoch: me.peers.epoch,
            at: now,
            peers,
            rejected: BTreeMap::new(),
            watchdog: me.watchdog,
            beat: answers,
            answers,
        }
        .sign(if me.wrong_key { &self.wrong } else { &self.key })
    }

    /// The live-repair commands the node ran, once each.
    pub fn repairs(&self, node: &str) -> Vec<String> {
        self.with(node, |n| {
            n.repairs.values().map(|r| r.command.clone()).collect()
        })
    }

    fn up(&self, node: &str) -> Result<(), LinkError> {
        if self.with(node, |n| n.powered && n.answering && !n.cut_from_master) {
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
        status: http::StatusCode::from_u16(status).expect("a valid status"),
        body,
    })
}

#[async_trait::async_trait]
impl CollectorLink for SimCollectors {
    async fn get(&self, node: &NodeConfig, path: &str, cap: usize) -> Result<Answer, LinkError> {
        self.up(&node.name)?;
        let (path, nonce) = match path.split_once("?nonce=") {
            Some((p, n)) => (p, n.parse().unwrap_or(0)),
            None => (path, 0),
        };
        match path {
            "/" => answer(200, b"[1]".to_vec(), cap),
            "/1/peers" => {
                let body = serde_json::to_vec(&self.view(&node.name, 0)).expect("serializes");
                answer(200, body, cap)
            }
            REPORT_PATH => {
                let now = self.clock.true_now();
                let env = self.with(&node.name, |n| {
                    n.seq += 1;
                    let mut e = Envelope::new(&node.name, n.seq, now, now, &n.verdict, None)
                        .answering(nonce);
                    e.boot = Some(n.boot);
                    e
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
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Answer, LinkError> {
        self.up(&node.name)?;
        if method == http::Method::GET
            && let Some(query) = path.strip_prefix("/1/peers?")
        {
            if let Some(rtt) = self.round_trip() {
                tokio::time::sleep(rtt).await;
            }
            let marked = query
                .split('&')
                .filter_map(|kv| kv.strip_prefix("marked="))
                .any(|m| m.split(',').any(|m| m == node.name));
            self.with(&node.name, |n| n.marked = marked);
            let probe = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("probe="))
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let body = serde_json::to_vec(&self.view(&node.name, probe)).expect("serializes");
            return answer(200, body, cap);
        }
        if method == http::Method::PUT && path == "/1/peers" {
            let set: PeerSet = serde_json::from_slice(&body.unwrap_or_default())
                .map_err(|e| LinkError::Broken(e.to_string()))?;
            if let Err(e) = set.check(&node.name) {
                return answer(400, e.to_string().into_bytes(), cap);
            }
            self.with(&node.name, |n| n.peers = set);
            return answer(200, b"{}".to_vec(), cap);
        }
        let record = if method == http::Method::POST && path == "/1/repair" {
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
    pub(super) nodes: BTreeSet<String>,
    pub(super) tags: Mutex<BTreeMap<String, BTreeSet<String>>>,
    pub(super) offline: Mutex<BTreeSet<String>>,
    pub(super) job_time: Mutex<HashMap<JobKind, Duration>>,
    pub(super) failing: Mutex<HashSet<JobKind>>,
    /// Every job started, in order, as `<kind> <node>`.
    pub jobs: Mutex<Vec<String>>,
    pub releases: Mutex<Vec<(String, Uuid, u32)>>,
    /// Events recorded on nodes, as `<node> <reason>`.
    pub(super) events: Mutex<Vec<String>>,
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

    pub fn events(&self) -> Vec<String> {
        self.events.lock_unpoisoned().clone()
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
impl TagsAndJobs for SimCluster {
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

    async fn run_job(&self, job: &Job, _event: &str) -> Outcome {
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
        Outcome::done(format!("simulated {} done", job.kind.as_str()))
    }

    async fn offline_nodes(&self) -> Result<BTreeSet<String>, ClusterError> {
        Ok(self.offline.lock_unpoisoned().clone())
    }
}

#[async_trait::async_trait]
impl FenceRelease for SimCluster {
    async fn release(&self, node: &str, flow: &Uuid, attempt: u32) -> Outcome {
        self.releases
            .lock_unpoisoned()
            .push((node.into(), *flow, attempt));
        self.offline.lock_unpoisoned().insert(node.into());
        Outcome::done("simulated release")
    }

    async fn reclaim(&self, node: &str, flow: &Uuid) -> Outcome {
        self.reclaims.lock_unpoisoned().push((node.into(), *flow));
        self.offline.lock_unpoisoned().remove(node);
        Outcome::done("simulated reclaim")
    }

    async fn mark_unschedulable(&self, node: &str, _flow: &Uuid, on: bool) -> Outcome {
        self.jobs
            .lock_unpoisoned()
            .push(format!("{} {node}", if on { "mark" } else { "unmark" }));
        Outcome::done(format!("simulated {}", if on { "mark" } else { "unmark" }))
    }
}

#[async_trait::async_trait]
impl Events for SimCluster {
    async fn record(&self, node: &str, reason: EventReason, _message: &str, _warning: bool) {
        self.events
            .lock_unpoisoned()
            .push(format!("{node} {reason}"));
    }

    async fn record_config(&self, configmap: &str, reason: EventReason, _message: &str) {
        self.events
            .lock_unpoisoned()
            .push(format!("configmap/{configmap} {reason}"));
    }
}

/// Fence agents that switch the simulated node's power: `off` powers it off, `status` answers
/// as the power is, `on` powers it on. Failures and hangs are scripted.
pub struct SimAgents {
    pub(super) collectors: Arc<SimCollectors>,
    /// Every call, in order, as `<action> <node>`.
    pub calls: Mutex<Vec<String>>,
    /// The `password` each call was given, in order (absent: none).
    pub passwords: Mutex<Vec<Option<String>>>,
    /// Calls of an action that fail (exit 1) before it works again.
    pub(super) failures: Mutex<BTreeMap<String, u32>>,
    /// Every call hangs until the stage's deadline kills it (a dead BMC).
    pub hang: AtomicBool,
    /// The device lies: `off` and `on` switch nothing, and `status` answers as told.
    pub lies: AtomicBool,
    pub(super) lied_on: AtomicBool,
}

impl SimAgents {
    /// `what` is an action (`off`) or an action on one node (`status node2`).
    pub fn fail_next(&self, what: &str, times: u32) {
        self.failures.lock_unpoisoned().insert(what.into(), times);
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
        self.passwords
            .lock_unpoisoned()
            .push(method.params.get("password").cloned());
        if self.hang.load(Ordering::SeqCst) {
            tokio::time::sleep(deadline).await;
            return (None, "killed at the deadline".into());
        }
        {
            let mut failures = self.failures.lock_unpoisoned();
            for key in [format!("{action} {node}"), action.to_string()] {
                if let Some(left) = failures.get_mut(&key)
                    && *left > 0
                {
                    *left -= 1;
                    return (Some(1), "simulated agent failure: bad credentials".into());
                }
            }
        }
        if self.lies.load(Ordering::SeqCst) {
            return match action {
                "status" if self.lied_on.load(Ordering::SeqCst) => {
                    (Some(EXIT_OK), "Status: ON".into())
                }
                "status" => (Some(EXIT_OFF), "Status: OFF".into()),
                act => {
                    self.lied_on.store(act == "on", Ordering::SeqCst);
                    (
                        Some(EXIT_OK),
                        format!("Success: Powered {}", act.to_uppercase()),
                    )
                }
            };
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

/// One map's data, and its version.
type Versioned = (BTreeMap<String, String>, u64);

/// Fence ConfigMaps and the Secrets they name, as a scenario writes them; each map's version
/// moves with every write to it.
#[derive(Default)]
pub struct SimMaps {
    maps: Mutex<BTreeMap<String, Versioned>>,
    secrets: Mutex<BTreeMap<(String, String), String>>,
}

impl SimMaps {
    /// Writes `key` of the map `name` (created when missing); an empty value removes the key.
    pub fn put(&self, name: &str, key: &str, value: &str) {
        let mut maps = self.maps.lock_unpoisoned();
        let (data, version) = maps.entry(name.to_string()).or_default();
        if value.is_empty() {
            data.remove(key);
        } else {
            data.insert(key.to_string(), value.to_string());
        }
        *version += 1;
    }

    pub fn set_secret(&self, name: &str, key: &str, value: &str) {
        self.secrets
            .lock_unpoisoned()
            .insert((name.to_string(), key.to_string()), value.to_string());
    }
}

#[async_trait::async_trait]
impl crate::cluster::maps::MapSource for SimMaps {
    async fn snapshot(
        &self,
    ) -> Result<crate::cluster::maps::MapSnapshot, crate::cluster::ClusterError> {
        let maps = self.maps.lock_unpoisoned();
        let data = maps
            .iter()
            .map(|(n, (d, _))| (n.clone(), d.clone()))
            .collect();
        let versions = maps
            .iter()
            .map(|(n, (_, v))| (n.clone(), v.to_string()))
            .collect();
        Ok((data, versions))
    }

    async fn secret(&self, name: &str, key: &str) -> Option<String> {
        self.secrets
            .lock_unpoisoned()
            .get(&(name.to_string(), key.to_string()))
            .cloned()
    }

    fn location(&self) -> String {
        "the simulation's ConfigMaps".into()
    }
}
