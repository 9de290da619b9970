//! Two daemons on the inventory backend sharing their decision state on a real etcd
//! (`[store] backend = "etcd"`): one leads, the other follows; killed with SIGKILL, the leader
//! is replaced by the standby within the lease and a little more, and the standby carries on
//! from the shared state (the same event, its tag waiting for the operator, no hook run
//! again). A leader stopped with SIGSTOP for three leases does nothing when it continues: it
//! finds the lease taken and exits with 12. Needs etcd (Debian's `etcd-server`; skipped with a
//! notice without it, required by `scripts/test`).

use crate::common;

use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::{Cluster, Proc, wait_for};
use serde_json::Value;

const EVAC: &str = r#"{"status":"evacuate","details":{"disk":"sdb"}}"#;
const LEASE_S: u64 = 3;

/// The two daemons: `a` as the cluster's own (its API on `c.api_port`), `b` beside it with a
/// state directory and an API port of its own.
struct Pair {
    c: Cluster,
    ports: [u16; 2],
    b: Option<Proc>,
}

impl Pair {
    async fn start(etcd: &Etcd) -> Pair {
        let mut c = Cluster::new(2);
        c.extra_daemon_toml = etcd.store_toml("a", LEASE_S);
        c.start().await;
        let a_port = c.api_port;
        let b_port = common::free_port();
        let mut p = Pair {
            c,
            ports: [a_port, b_port],
            b: None,
        };
        p.start_b();
        p
    }

    fn config_b(&self) -> std::path::PathBuf {
        let root = self.c.dir.path().display().to_string();
        let text = std::fs::read_to_string(self.c.path("daemon.toml")).unwrap();
        let text = text
            .replace(&format!("{root}/state\""), &format!("{root}/state-b\""))
            .replace(
                &format!(":{}\"", self.ports[0]),
                &format!(":{}\"", self.ports[1]),
            )
            .replace("identity = \"a\"", "identity = \"b\"");
        let path = self.c.path("daemon-b.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn start_b(&mut self) {
        let cfg = self.config_b();
        self.b = Some(
            self.c
                .spawn("daemon-b", &["--config", cfg.to_str().unwrap(), "daemon"]),
        );
    }

    fn start_a(&mut self) {
        let cfg = self.c.path("daemon.toml");
        self.c.daemon = Some(
            self.c
                .spawn("daemon", &["--config", cfg.to_str().unwrap(), "daemon"]),
        );
    }

    /// Starts daemon `i` again and waits until it follows `leader`.
    async fn restart_following(&mut self, i: usize, leader: &str) -> Value {
        if i == 0 {
            self.start_a();
        } else {
            self.start_b();
        }
        wait_for("the restarted daemon to follow", || async {
            let v = self.leader_view(i).await?;
            (v["holder"] == leader).then_some(v)
        })
        .await
    }

    /// `/1/leader` of daemon `i` (0: a, 1: b), if it answers.
    async fn leader_view(&self, i: usize) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}/1/leader", self.ports[i]);
        let r = self.c.client.get(url).send().await.ok()?;
        r.json().await.ok()
    }

    /// Waits until daemon `i` says it leads.
    async fn wait_leads(&self, i: usize) -> Value {
        wait_for("the daemon to lead", || async {
            let v = self.leader_view(i).await?;
            (v["leader"] == true).then_some(v)
        })
        .await
    }

    /// Waits until exactly one leads and the other names it; returns the leader's index.
    async fn one_leader(&self) -> usize {
        wait_for("one leader, named by the other", || async {
            let (a, b) = (self.leader_view(0).await?, self.leader_view(1).await?);
            match (a["leader"] == true, b["leader"] == true) {
                (true, false) if b["holder"] == "a" => Some(0),
                (false, true) if a["holder"] == "b" => Some(1),
                _ => None,
            }
        })
        .await
    }

    /// Points the cluster's API calls (and its CLI) at daemon `i`.
    fn talk_to(&mut self, i: usize) {
        self.c.api_port = self.ports[i];
    }

    fn proc(&mut self, i: usize) -> &mut Option<Proc> {
        if i == 0 {
            &mut self.c.daemon
        } else {
            &mut self.b
        }
    }
}

/// Every job runner's log under a daemon's jobs directory, one after another.
fn runner_logs(jobs: &std::path::Path) -> String {
    let mut all = String::new();
    for d in std::fs::read_dir(jobs).into_iter().flatten().flatten() {
        if let Ok(text) = std::fs::read_to_string(d.path().join("runner.log")) {
            all.push_str(&text);
        }
    }
    all
}

fn count(log: &[String], prefix: &str) -> usize {
    log.iter().filter(|l| l.starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_its_successor_carries_on_from_etcd() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let mut p = Pair::start(&etcd).await;
    let l = p.one_leader().await;
    let s = 1 - l;
    let view = p.leader_view(l).await.unwrap();
    assert_eq!(view["backend"], "etcd", "{view}");
    assert!(view["token"].as_i64().is_some_and(|t| t > 0), "{view}");
    let standby = p.leader_view(s).await.unwrap();
    assert_eq!(standby["token"], Value::Null, "{standby}");

    // The leader repairs node1: evacuated, offlined, tagged, waiting for the operator.
    p.talk_to(l);
    p.c.set_verdict("node1", EVAC);
    let e = p.c.wait_status("node1", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    let hooks = p.c.hook_log();
    assert_eq!(count(&hooks, "evacuate node1"), 1, "{hooks:?}");
    assert_eq!(count(&hooks, "offline node1"), 1, "{hooks:?}");

    // SIGKILL: no release of the lease, no last checkpoint.
    let killed = Instant::now();
    let dead = p.proc(l).take().unwrap();
    drop(dead);
    let took = p.wait_leads(s).await;
    let failover = killed.elapsed();
    eprintln!("leader killed to the standby leading: {failover:?}");
    assert!(
        failover < Duration::from_secs(LEASE_S + 2),
        "the standby took {failover:?} with a {LEASE_S} s lease: {took}"
    );
    assert!(
        took["token"].as_i64() > view["token"].as_i64(),
        "{took} {view}"
    );

    // It carries on from the shared state: the same event, still waiting for the operator
    // (its tag is there, so it is not taken as acknowledged), and no hook runs again.
    p.talk_to(s);
    let again = p.c.wait_status("node1", "completed").await;
    assert_eq!(again["id"], id.as_str());
    let (_, tags) = p.c.get("/1/tags?node=node1").await;
    let tag = format!("maintd:repairready:{id}");
    assert!(tags.to_string().contains(&tag), "{tags}");
    p.c.some_polls(5).await;
    let hooks = p.c.hook_log();
    assert_eq!(hooks.len(), 2, "no hook ran again: {hooks:?}");

    // The operator acknowledges on the new leader; the node comes back once healthy.
    let out = p.c.cli(&["tags", "remove", "node1", &tag]);
    assert!(out.status.success(), "{out:?}");
    p.c.set_verdict("node1", r#"{"status":"Ok"}"#);
    wait_for("node1 back online", || async {
        (count(&p.c.hook_log(), "online node1") == 1).then_some(())
    })
    .await;

    // The killed daemon, started again, follows.
    let back = p.restart_following(l, ["a", "b"][s]).await;
    assert_eq!(back["leader"], false, "{back}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_past_its_lease_does_nothing_when_it_continues() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let mut p = Pair::start(&etcd).await;
    let l = p.one_leader().await;
    let s = 1 - l;
    let pid = nix::unistd::Pid::from_raw(p.proc(l).as_ref().unwrap().child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();

    // While it is stopped the standby takes over and repairs node2.
    p.wait_leads(s).await;
    p.talk_to(s);
    p.c.set_verdict("node2", EVAC);
    p.c.wait_status("node2", "completed").await;
    let stopped_for = Duration::from_secs(3 * LEASE_S);
    tokio::time::sleep(stopped_for.saturating_sub(Duration::from_secs(LEASE_S))).await;

    // It continues: it finds the lease taken, acts on nothing and exits with 12.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let mut deposed = p.proc(l).take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = deposed.child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "the deposed leader did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(code, Some(12), "exit status of the deposed leader");
    p.c.some_polls(3).await;
    let hooks = p.c.hook_log();
    assert_eq!(count(&hooks, "evacuate node2"), 1, "{hooks:?}");
    assert_eq!(count(&hooks, "offline node2"), 1, "{hooks:?}");
    let log = std::fs::read_to_string(&deposed.log).unwrap();
    assert!(log.contains("leadership lost"), "{log}");
    assert_eq!(p.leader_view(s).await.unwrap()["leader"], true);
}

/// `maintd store migrate` with every daemon stopped: a single master's state (an event with
/// its round and jobs, its tag, a fence flow that released its node) moved into etcd, where a daemon sharing it there carries on
/// with it (no hook run again); then back into a fresh database, for a single master again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_masters_state_moves_into_etcd_and_back() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let mut c = Cluster::new(3);
    c.extra_daemon_toml = c.stub_fencing("fence_ok", common::POWER_AGENT, "1s", &["node3"]);
    c.set_verdict("node1", EVAC);
    c.start().await;
    let e = c.wait_status("node1", "completed").await;
    let id = e["id"].as_str().unwrap().to_string();
    // node3 dies: fenced and released, its flow final.
    wait_for("node3 heard by its watchers", || async {
        let w = c.node("node3").await;
        (w["witnesses"]["heard-by"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await;
    c.kill_collector(2);
    let flow = c
        .wait_flow("node3 released", |f| {
            f["node"] == "node3" && f["released"] == true
        })
        .await;
    let flow_id = flow["id"].as_str().unwrap().to_string();
    let status = c.daemon.as_mut().unwrap().terminate().await;
    let ran = c.hook_log();
    assert!(status.success(), "{status:?}");
    c.daemon = None;

    // Into etcd; a second time it refuses (daemons may be using what is there).
    c.extra_daemon_toml = etcd.store_toml("a", LEASE_S);
    let cfg = c.daemon_config();
    let migrate = |args: &[&str]| {
        let mut all = vec!["--config", cfg.to_str().unwrap(), "store", "migrate"];
        all.extend(args);
        c.cli(&all)
    };
    let out = migrate(&["--to", "etcd"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert!(said.contains(": 1 events, 2 jobs,"), "{said}");
    assert!(said.contains(", 1 fence flows,"), "{said}");
    let carried = said.rsplit(": ").next().unwrap().trim().to_string();
    let out = migrate(&["--to", "etcd"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already holds a decision state"),
        "{out:?}"
    );

    // A daemon with an empty state directory, sharing its state on etcd, takes it from there.
    let root = c.dir.path().display().to_string();
    let fresh = |name: &str, text: &str| {
        let text = text.replace(&format!("{root}/state\""), &format!("{root}/{name}\""));
        let path = c.path(&format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let shared = fresh("state-b", &std::fs::read_to_string(&cfg).unwrap());
    let mut b = c.spawn(
        "daemon-b",
        &["--config", shared.to_str().unwrap(), "daemon"],
    );
    c.wait_api().await;
    wait_for("the daemon to lead", || async {
        let (_, v) = c.get("/1/leader").await;
        (v["leader"] == true).then_some(())
    })
    .await;
    let again = c.wait_status("node1", "completed").await;
    assert_eq!(again["id"], id.as_str());
    let (_, tags) = c.get("/1/tags?node=node1").await;
    assert!(
        tags.to_string()
            .contains(&format!("maintd:repairready:{id}")),
        "{tags}"
    );
    let (_, kept) = c.get(&format!("/1/fences/{flow_id}")).await;
    assert_eq!(kept["released"], true, "{kept}");
    c.some_polls(3).await;
    assert_eq!(c.hook_log(), ran, "no hook ran again");
    // SIGTERM releases the lease, so the way back need not wait a whole lease.
    assert!(b.terminate().await.success());

    // Back into a fresh database, for a single master.
    let back = fresh("state-c", &std::fs::read_to_string(&cfg).unwrap());
    let mut all = vec!["--config", back.to_str().unwrap(), "store", "migrate"];
    all.extend(["--to", "sqlite"]);
    let out = c.cli(&all);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.trim().ends_with(&carried), "{said} / {carried}");
    let single = std::fs::read_to_string(&back)
        .unwrap()
        .replace("backend = \"etcd\"", "backend = \"sqlite\"");
    std::fs::write(&back, single).unwrap();
    let _single = c.spawn("daemon-c", &["--config", back.to_str().unwrap(), "daemon"]);
    c.wait_api().await;
    let kept = c.wait_status("node1", "completed").await;
    assert_eq!(kept["id"], id.as_str());
    let (_, flow_back) = c.get(&format!("/1/fences/{flow_id}")).await;
    assert_eq!(flow_back["released"], true, "{flow_back}");
}

/// A benchmark, run by hand (`cargo test --test it etcd:: -- --ignored --nocapture`): with the
/// state on etcd, what an idle fleet writes there per poll cycle (state shares; the lease's
/// own renewals are counted apart), and how long from a leader's SIGKILL until the standby
/// leads, over `MAINTD_BENCH_FAILOVERS` kills (10 by default), each killed daemon started again
/// to follow. Prints the figures for BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints figures for BENCHMARKS.md"]
async fn failover_time_and_writes_of_an_idle_fleet() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let rounds: usize = std::env::var("MAINTD_BENCH_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut p = Pair::start(&etcd).await;
    let l = p.one_leader().await;
    p.talk_to(l);
    let counter = |text: &str, series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    p.c.some_polls(3).await;
    let before = p.c.metrics().await;
    p.c.some_polls(50).await;
    let after = p.c.metrics().await;
    let cycles = counter(&after, "maintd_poll_cycle_seconds_count")
        - counter(&before, "maintd_poll_cycle_seconds_count");
    let shares = r#"maintd_state_shares_total{result="written"}"#;
    let leases = r#"maintd_lease_writes_total{result="ok"}"#;
    let written = counter(&after, shares) - counter(&before, shares);
    let renewed = counter(&after, leases) - counter(&before, leases);
    eprintln!(
        "idle: {cycles} poll cycles, {written} state writes ({:.3} per cycle), {renewed} lease renewals",
        written / cycles
    );

    // What a repair round costs etcd: node1 evacuated, acknowledged and back, five times; the
    // shares of the state written meanwhile (before each round's jobs start and after each
    // change, in the engine's tick), and how long each took.
    let shares_before = p.c.metrics().await;
    let mut seen: Vec<String> = Vec::new();
    for k in 1..=5 {
        p.c.set_verdict("node1", EVAC);
        let e =
            p.c.wait_event("node1", "a new repair completed", |e| {
                e["repair-status"] == "completed"
                    && e["tagged"] == true
                    && !seen.iter().any(|id| e["id"] == id.as_str())
            })
            .await;
        let id = e["id"].as_str().unwrap().to_string();
        let tag = format!("maintd:repairready:{id}");
        let out = p.c.cli(&["tags", "remove", "node1", &tag]);
        assert!(out.status.success(), "{out:?}");
        p.c.set_verdict("node1", r#"{"status":"Ok"}"#);
        wait_for("node1 back online", || async {
            (count(&p.c.hook_log(), "online node1") == k).then_some(())
        })
        .await;
        seen.push(id);
    }
    let shares_after = p.c.metrics().await;
    let d = |series: &str| counter(&shares_after, series) - counter(&shares_before, series);
    let (n, secs) = (
        d("maintd_state_share_seconds_count"),
        d("maintd_state_share_seconds_sum"),
    );
    eprintln!(
        "5 repairs (3 rounds each: evacuate, offline, online): {n} state shares, {:.1} per repair, {:.1} ms each on average",
        n / 5.0,
        1000.0 * secs / n
    );

    let mut leader = l;
    let mut times = Vec::new();
    for _ in 0..rounds {
        let standby = 1 - leader;
        let killed = Instant::now();
        drop(p.proc(leader).take());
        p.wait_leads(standby).await;
        times.push(killed.elapsed().as_secs_f64());
        p.restart_following(leader, ["a", "b"][standby]).await;
        leader = standby;
    }
    times.sort_by(f64::total_cmp);
    eprintln!(
        "failover (SIGKILL to the standby leading, {LEASE_S} s lease, {rounds} kills): p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        common::percentile(&times, 0.5),
        common::percentile(&times, 0.99),
        times.last().unwrap()
    );
}

/// A leader killed while a round's hook runs: the new leader resumes the job recorded as running
/// in the shared state (after confirming its lease). The old leader's runner outlives it and
/// still holds the job's claim in etcd, so the new leader's runner waits for it and adopts the
/// end it records: the hook runs once, and the event completes under the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_when_its_leader_dies_is_resumed_by_the_next() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let mut p = Pair::start(&etcd).await;
    let l = p.one_leader().await;
    let s = 1 - l;
    let log = p.c.path("hooks.log");
    let started = p.c.path("evacuate-started");
    p.c.set_hook(
        "evacuate",
        &format!(
            "echo $2 >> {}; sleep 3; echo \"$MAINTD_ACTION $1 $2 $MAINTD_REASON\" >> {}",
            started.display(),
            log.display()
        ),
    );
    p.talk_to(l);
    p.c.set_verdict("node1", EVAC);
    let job = wait_for("the evacuate hook to start", || async {
        let text = std::fs::read_to_string(&started).ok()?;
        text.lines().next().map(str::to_string)
    })
    .await;
    drop(p.proc(l).take());

    p.wait_leads(s).await;
    p.talk_to(s);
    let e = p.c.wait_status("node1", "completed").await;
    let runs = std::fs::read_to_string(&started).unwrap();
    assert!(
        runs.lines().all(|j| j == job) && runs.lines().count() == 1,
        "the job's hook ran once, on the machine that started it: {runs}"
    );
    let name = if s == 0 { "daemon.log" } else { "daemon-b.log" };
    let said = std::fs::read_to_string(p.c.path(name)).unwrap();
    assert!(said.contains("resuming job"), "{said}");
    // The new leader's runner says what it did: adopted the end the old runner recorded
    // (after waiting for it, when it came while that run was still going).
    let state = p.c.path(if s == 0 { "state" } else { "state-b" });
    let runner = runner_logs(&state.join("jobs"));
    assert!(
        runner.contains("adopted the end another machine's runner recorded"),
        "{runner}"
    );
    assert_eq!(
        count(&p.c.hook_log(), "offline node1"),
        1,
        "{:?}",
        p.c.hook_log()
    );
    assert!(
        e["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["status"] == "succeeded"),
        "{e}"
    );
}

/// Fence flows kept on a real etcd pass the suite every flow store passes.
#[cfg(feature = "testing")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_flows_on_etcd_pass_the_flow_store_suite() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    maintd::cluster::etcd::flows::conformance(&etcd.endpoint, "/maintd-conformance").await;
}

/// Job claims on a real etcd: one holder at a time; a claim its runner stops renewing lapses
/// with its lease, after which another runner claims the job; the lapsed runner can neither
/// renew nor record an end; the end recorded is kept, and no one claims an ended job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_claims_lapse_with_their_runner_and_keep_the_end() {
    use maintd::cluster::etcd::claims::ClaimStore;
    use maintd::cluster::etcd::claims::EtcdClaims;
    use maintd::cluster::etcd::{StoreBackend, StoreConfig};
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let cfg = StoreConfig {
        backend: StoreBackend::Etcd,
        endpoints: vec![etcd.endpoint.clone()],
        prefix: "/claims".into(),
        ..Default::default()
    };
    let claims = EtcdClaims::connect(&cfg).await.unwrap();
    let ttl = Duration::from_secs(LEASE_S);
    let a = claims
        .claim("e1-1", "runner a", ttl)
        .await
        .unwrap()
        .expect("claimed");
    assert!(a.ttl >= ttl, "{a:?}");
    assert_eq!(claims.claim("e1-1", "runner b", ttl).await.unwrap(), None);
    assert_eq!(
        claims.holder("e1-1").await.unwrap().as_deref(),
        Some("runner a")
    );
    assert!(claims.renew(&a).await.unwrap());
    assert_eq!(claims.ended("e1-1").await.unwrap(), None);

    // Runner a stops renewing: its claim lapses with the lease, in etcd's own time.
    let b = wait_for("runner a's claim to lapse", || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        claims.claim("e1-1", "runner b", ttl).await.unwrap()
    })
    .await;
    assert_eq!(
        claims.holder("e1-1").await.unwrap().as_deref(),
        Some("runner b")
    );
    assert!(
        !claims.renew(&a).await.unwrap(),
        "a lapsed claim is not renewed"
    );
    assert!(
        !claims.finish("e1-1", &a, b"a's end").await.unwrap(),
        "a lapsed runner records no end"
    );
    assert!(claims.finish("e1-1", &b, b"b's end").await.unwrap());
    assert!(
        !claims.finish("e1-1", &a, b"b's end").await.unwrap(),
        "another runner's end, however alike, is not taken for this one's"
    );
    assert_eq!(
        claims.ended("e1-1").await.unwrap().as_deref(),
        Some(&b"b's end"[..])
    );
    assert_eq!(claims.holder("e1-1").await.unwrap(), None);
    assert_eq!(claims.claim("e1-1", "runner c", ttl).await.unwrap(), None);
}
