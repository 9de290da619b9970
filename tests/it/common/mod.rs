//! Test harness: a daemon plus collectors as real `maintd` processes on 127.0.0.1 ports handed
//! out once per process, with scripted diagnose output, generated configs, and helpers to wait
//! and query.

#![allow(dead_code)]

pub mod attack;
pub mod browser;
pub mod certs;
pub mod etcd;
pub mod fake_kube;
pub mod ganeti;
pub mod jobpods;
pub mod k8s;
pub mod netns;
pub mod parts;
pub mod sims;
pub mod spec;
pub mod watchdog;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test; `MAINTD_TEST_BIN` runs the same tests against another build (an
/// earlier release, to show that a new test catches what it was written for).
pub static BIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    std::env::var("MAINTD_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_maintd").to_string())
});
/// The value at fraction `p` (0.5: the median) of sorted values, as the benchmarks report.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Generous: tests must pass on a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

/// Whether `tool` is on the PATH.
pub fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `tool` is installed. A missing one skips the test with a notice, or fails it where
/// the environment variable `require` is set (`scripts/test` sets it where it installs `tool`).
pub fn have_tool(tool: &str, require: &str) -> bool {
    let found = installed(tool);
    if !found {
        assert!(
            std::env::var_os(require).is_none(),
            "{tool} is required here ({require}) but missing"
        );
        eprintln!("skipping: {tool} not installed");
    }
    found
}

/// A port no other test of this process has been given. Asking the kernel for port 0 and
/// releasing it is racy: the tests of one binary run in parallel, and the kernel hands a
/// released ephemeral port to the next bind or outgoing connection, so a daemon could come up on
/// another test's collector port. Ports come from a per-process counter below the ephemeral range
/// (32768+), starting at an offset from the pid so that two test processes rarely meet, and each
/// is checked free for both TCP and UDP before it is handed out.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() * 97) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// Copied by `cp` rather than written here: a descriptor this process holds open for writing is
/// inherited by any child another test thread forks meanwhile, and executing the script while
/// that child lives fails with ETXTBSY ("Text file busy").
pub fn write_exec(path: &Path, body: &str) {
    let tmp = path.with_extension("new");
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), format!("#!/bin/sh\n{body}\n")).unwrap();
    let cp = Command::new("cp")
        .arg(src.path())
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(cp.success(), "cp {} failed", tmp.display());
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Renamed into place so a running collector never executes a half-written script.
    std::fs::rename(&tmp, path).unwrap();
}

fn mkdir755(p: &Path) {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in power switch for [`Cluster::stub_fencing`]: each node's power is a file next to
/// the agent. `off` kills the node's collector (it is off: its next start is a new boot, as
/// [`Cluster::kill_collector`] leaves it) unless `lie-<node>` exists there (a device that
/// reports OFF and switches nothing); `on` only records power (the test boots the node by
/// starting its collector); `status` answers as recorded. The agents themselves are
/// tests/it/fencing.rs's business; here what happens around a fence is.
pub const POWER_AGENT: &str = r#"in=$(cat)
act=$(printf '%s\n' "$in" | sed -n 's/^action=//p')
node=$(printf '%s\n' "$in" | sed -n 's/^port=//p')
dir=$(dirname "$0")
case "$act" in
off)
    echo 0 > "$dir/power-$node"
    if [ ! -e "$dir/lie-$node" ]; then
        rm -f "$(dirname "$dir")/boot-id-$node"
        pkill -KILL -f "^[^ ]*/maintd --config $(dirname "$dir")/collector-$node.toml" || true
    fi ;;
on) echo 1 > "$dir/power-$node" ;;
status) [ "$(cat "$dir/power-$node" 2>/dev/null || echo 1)" = 0 ] && exit 2 ;;
esac
exit 0"#;

/// Seeded moments and choices for tests that strike at random but must replay: the same seed,
/// the same schedule.
pub struct Moments(pub u64);

impl Moments {
    fn step(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// A delay between `lo` and `hi` milliseconds.
    pub fn next(&mut self, lo: u64, hi: u64) -> std::time::Duration {
        std::time::Duration::from_millis(lo + self.step() % (hi - lo))
    }

    /// One of `0..n`.
    pub fn pick(&mut self, n: usize) -> usize {
        (self.step() % n as u64) as usize
    }
}

pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Sends SIGTERM and waits (up to `WAIT`) for the process to exit; returns its status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "did not stop on SIGTERM; its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<String>,
    pub ports: Vec<u16>,
    pub api_port: u16,
    pub collectors: Vec<Option<Proc>>,
    pub daemon: Option<Proc>,
    pub extra_daemon_toml: String,
    /// The daemon's `poll-interval` and the collectors' `diagnose-interval`: fast for tests,
    /// the defaults for a benchmark that measures them.
    pub poll_interval: String,
    /// The daemon's per-request poll deadline.
    pub poll_timeout: String,
    pub diagnose_interval: String,
    /// Appended to every collector's config (after its `[collector]` keys).
    pub extra_collector_toml: String,
    /// Per node: its `key-files` (file names in the cluster's directory); none: the cluster
    /// key.
    pub collector_keys: Vec<Vec<String>>,
    /// Extra environment for every process spawned.
    pub env: Vec<(String, String)>,
    /// List the nodes in the daemon's config (the inventory backend); off for Kubernetes, where
    /// the daemon discovers them from the API.
    pub inventory_nodes: bool,
    pub client: reqwest::Client,
    /// Where the daemon listens and each collector listens (127.0.0.1 unless the test puts
    /// them in network namespaces).
    pub daemon_host: String,
    pub node_hosts: Vec<String>,
}

impl Cluster {
    /// A cluster of `n` nodes whose diagnose prints the file `verdict-<node>.json` (Ok at first),
    /// with hooks that log to `hooks.log` and a live repair `fix` that saves its stdin.
    pub fn new(n: usize) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path();
        for d in ["diagnose.d", "repair.d", "state"] {
            mkdir755(&root.join(d));
        }
        let out = Command::new(&*BIN)
            .args(["keygen", "--key-file"])
            .arg(root.join("cluster.key"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        write_exec(
            &root.join("diagnose.d/scripted"),
            &format!("cat {}/verdict-$NODE.json", root.display()),
        );
        let log = root.join("hooks.log");
        for hook in [
            "evacuate",
            "evacuate-failover",
            "offline",
            "online",
            "release",
            "reclaim",
        ] {
            write_exec(
                &root.join("repair.d").join(hook),
                &format!(
                    "echo \"$MAINTD_ACTION $1 $2 $MAINTD_REASON\" >> {}",
                    log.display()
                ),
            );
        }
        write_exec(
            &root.join("repair.d/fix"),
            &format!(
                "cat > {}/repair-input-$MAINTD_NODE.json; echo fixed",
                root.display()
            ),
        );
        let nodes: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
        let c = Cluster {
            daemon_host: "127.0.0.1".into(),
            node_hosts: nodes.iter().map(|_| "127.0.0.1".to_string()).collect(),
            ports: nodes.iter().map(|_| free_port()).collect(),
            api_port: free_port(),
            collectors: nodes.iter().map(|_| None).collect(),
            nodes,
            dir,
            daemon: None,
            extra_daemon_toml: String::new(),
            poll_interval: "200ms".into(),
            poll_timeout: "2s".into(),
            diagnose_interval: "100ms".into(),
            extra_collector_toml: String::new(),
            collector_keys: (0..n).map(|_| Vec::new()).collect(),
            env: Vec::new(),
            inventory_nodes: true,
            client: maintd::http::client_builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        for n in &c.nodes {
            c.set_verdict(n, r#"{"status":"Ok"}"#);
        }
        c
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn set_verdict(&self, node: &str, json: &str) {
        let p = self.path(&format!("verdict-{node}.json"));
        let tmp = p.with_extension("new");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(tmp, p).unwrap();
    }

    pub fn set_hook(&self, name: &str, body: &str) {
        write_exec(&self.path("repair.d").join(name), body);
    }

    pub fn hook_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("hooks.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.daemon_host, self.api_port)
    }

    pub fn daemon_config(&self) -> PathBuf {
        let root = self.dir.path().display();
        let mut toml = format!(
            r#"
[cluster]
key-file = "{root}/cluster.key"

[daemon]
listen = "{}:{}"
# In network namespaces the master's address is not loopback; the tests talk plain HTTP.
plain-http = true
state-dir = "{root}/state"
repair-dir = "{root}/repair.d"
poll-interval = "{poll}"
poll-timeout = "{poll_timeout}"
hook-timeout = "30s"
live-repair-timeout = "30s"
{}
"#,
            self.daemon_host,
            self.api_port,
            self.extra_daemon_toml,
            poll = self.poll_interval,
            poll_timeout = self.poll_timeout
        );
        for ((n, p), h) in self
            .nodes
            .iter()
            .zip(&self.ports)
            .zip(&self.node_hosts)
            .filter(|_| self.inventory_nodes)
        {
            toml.push_str(&format!(
                "[[nodes]]\nname = \"{n}\"\ncollector = \"{h}:{p}\"\n"
            ));
        }
        let path = self.path("daemon.toml");
        std::fs::write(&path, toml).unwrap();
        path
    }

    /// The stand-in of node `i`'s kernel boot id: written afresh when the node boots (its
    /// collector starts after `kill_collector`, or for the first time).
    pub fn boot_file(&self, i: usize) -> PathBuf {
        self.path(&format!("boot-id-{}", self.nodes[i]))
    }

    /// Node `i`'s current boot id.
    pub fn boot_id(&self, i: usize) -> String {
        std::fs::read_to_string(self.boot_file(i))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    pub fn collector_config(&self, i: usize, diagnose: &str, key: &str) -> PathBuf {
        let boot = self.boot_file(i);
        if !boot.exists() {
            std::fs::write(&boot, format!("{}\n", uuid::Uuid::new_v4())).unwrap();
        }
        let root = self.dir.path().display();
        let node = &self.nodes[i];
        let key_files: Vec<String> = self.collector_keys[i]
            .iter()
            .map(|f| format!("\"{root}/{f}\""))
            .collect();
        let toml = format!(
            r#"
[cluster]
key-file = "{root}/{key}"

[collector]
node = "{node}"
key-files = [{}]
listen = "{}:{}"
diagnose = "{diagnose}"
diagnose-dir = "{root}/diagnose.d"
repair-dir = "{root}/repair.d"
diagnose-interval = "{diag}"
diagnose-timeout = "1s"
repair-timeout = "20s"
state-dir = "{root}/collector-state-{node}"
boot-id-file = "{boot}"
env = {{ NODE = "{node}" }}
{}
"#,
            key_files.join(", "),
            self.node_hosts[i],
            self.ports[i],
            self.extra_collector_toml,
            boot = self.boot_file(i).display(),
            diag = self.diagnose_interval
        );
        let path = self.path(&format!("collector-{node}.toml"));
        std::fs::write(&path, toml).unwrap();
        path
    }

    pub fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        self.spawn_wrapped(name, &[], args)
    }

    /// Runs the binary under `wrapper` (e.g. `prlimit --nofile=1024:1024 --`), or directly when
    /// it is empty, logging to `<name>.log`.
    pub fn spawn_wrapped(&self, name: &str, wrapper: &[&str], args: &[&str]) -> Proc {
        let log = self.path(&format!("{name}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(&*BIN);
                c
            }
            None => Command::new(&*BIN),
        };
        let child = cmd
            .args(args)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        Proc { child, log }
    }

    /// Starts a collector under a wrapper command (e.g. `prlimit --nofile=1024:1024 --`).
    pub fn start_collector_wrapped(&mut self, i: usize, wrapper: &[&str]) {
        // The one it replaces lets go of its port first: started beside it, the new one
        // could lose the bind and exit, leaving the node silent.
        self.collectors[i] = None;
        let cfg = self.collector_config(i, "scripted", "cluster.key");
        let name = format!("collector-{}", self.nodes[i]);
        let p = self.spawn_wrapped(
            &name,
            wrapper,
            &["--config", cfg.to_str().unwrap(), "collector"],
        );
        self.collectors[i] = Some(p);
    }

    /// `[fencing]` with one stand-in agent `agent` (made from `body`, e.g. [`POWER_AGENT`]) as
    /// the power-management of `nodes` (each method gets `port = "<node>"`), fast detection
    /// (`grace`), and the storm threshold at 50 %.
    pub fn stub_fencing(&self, agent: &str, body: &str, grace: &str, nodes: &[&str]) -> String {
        let agents = self.stub_agents(&[(agent, body)]);
        let mut toml = format!(
            "[fencing]\nagents-dir = \"{}\"\ngrace = \"{grace}\"\nliveness-interval = \"200ms\"\nliveness-timeout = \"1s\"\nstorm-percent = 50\n[fencing.templates.stub]\nagent = \"{agent}\"\n",
            agents.display()
        );
        for n in nodes {
            toml.push_str(&format!(
                "[fencing.nodes.{n}.power-management]\nmethods = [{{ template = \"stub\", params = {{ port = \"{n}\" }} }}]\n"
            ));
        }
        toml
    }

    /// Stand-in fence agents in `<dir>/agents` (tests of what happens around a fence, not of
    /// the agents: tests/it/fencing.rs drives the real ones). Returns the directory.
    pub fn stub_agents(&self, agents: &[(&str, &str)]) -> PathBuf {
        let dir = self.path("agents");
        mkdir755(&dir);
        for (name, body) in agents {
            write_exec(&dir.join(name), body);
        }
        dir
    }

    pub fn start_collector_with(&mut self, i: usize, diagnose: &str, key: &str) {
        self.collectors[i] = None;
        let cfg = self.collector_config(i, diagnose, key);
        let name = format!("collector-{}", self.nodes[i]);
        let p = self.spawn(&name, &["--config", cfg.to_str().unwrap(), "collector"]);
        self.collectors[i] = Some(p);
    }

    /// `maintd --config <daemon.toml> keygen <args>` in the cluster's directory, which must
    /// succeed.
    pub fn keygen(&self, args: &[&str]) {
        let cfg = self.daemon_config();
        let out = Command::new(&*BIN)
            .arg("--config")
            .arg(&cfg)
            .arg("keygen")
            .args(args)
            .current_dir(self.path(""))
            .output()
            .unwrap();
        assert!(out.status.success(), "keygen {args:?}: {out:?}");
    }

    pub fn start_collectors(&mut self) {
        for i in 0..self.nodes.len() {
            self.start_collector_with(i, "scripted", "cluster.key");
        }
    }

    /// Waits until every running collector serves a report of a finished diagnose whose status
    /// is the one its verdict file holds, so the daemon's first poll sees them all (on a loaded
    /// machine a collector's first diagnose can otherwise land a poll later).
    pub async fn wait_collectors_ready(&self) {
        for (i, node) in self.nodes.iter().enumerate() {
            if self.collectors[i].is_none() {
                continue;
            }
            let want: Value = serde_json::from_str(
                &std::fs::read_to_string(self.path(&format!("verdict-{node}.json"))).unwrap(),
            )
            .unwrap();
            let url = format!(
                "http://{}:{}/1/report/diagnose",
                self.node_hosts[i], self.ports[i]
            );
            wait_for("a collector's first report", || async {
                let r = self.client.get(&url).send().await.ok()?;
                let v: Value = r.json().await.ok()?;
                (v["data"]["status"] == want["status"]).then_some(())
            })
            .await;
        }
    }

    /// Starts the daemon on the Kubernetes backend (its config's `[kubernetes]` section).
    pub fn start_kube_daemon(&mut self) {
        self.daemon = None;
        let cfg = self.daemon_config();
        self.daemon = Some(self.spawn(
            "daemon",
            &[
                "--config",
                cfg.to_str().unwrap(),
                "daemon",
                "--cluster",
                "kubernetes",
            ],
        ));
    }

    pub fn start_daemon(&mut self) {
        self.daemon = None;
        let cfg = self.daemon_config();
        self.daemon = Some(self.spawn("daemon", &["--config", cfg.to_str().unwrap(), "daemon"]));
    }

    pub async fn start(&mut self) {
        self.start_collectors();
        self.start_daemon();
        self.wait_api().await;
    }

    pub async fn wait_api(&self) {
        let url = format!("{}/", self.url());
        let deadline = Instant::now() + WAIT;
        while self.client.get(&url).send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the daemon's API; its log:\n{}",
                self.daemon_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A node's collector dies (a hard node failure, as the daemon sees it): its next start is
    /// a new boot.
    pub fn kill_collector(&mut self, i: usize) {
        self.collectors[i] = None;
        let _ = std::fs::remove_file(self.boot_file(i));
    }

    /// Node `i` was reset (its watchdog fired, or its power was cycled): its collector's next
    /// start is a new boot.
    pub fn reboot(&self, i: usize) {
        let _ = std::fs::remove_file(self.boot_file(i));
    }

    /// A node's collector stops while the node runs on (a hung collector, a device that never
    /// switched it): its next start keeps the boot.
    pub fn stop_collector_keeping_boot(&mut self, i: usize) {
        self.collectors[i] = None;
    }

    /// Writes a secret file with mode 0600 and returns its path.
    pub fn secret(&self, name: &str, value: &str) -> PathBuf {
        use std::os::unix::fs::OpenOptionsExt;
        let p = self.path(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .unwrap();
        std::io::Write::write_all(&mut f, value.as_bytes()).unwrap();
        p
    }

    /// Runs `maintd --config <config> daemon <extra>` that is expected to exit at start-up, and
    /// returns its exit code and stderr.
    pub fn daemon_exit(&self, config: &Path, extra: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(&*BIN)
            .args(["--config", config.to_str().unwrap(), "daemon"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Waits until a fence flow satisfies `pred`, and returns it.
    pub async fn wait_flow(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let fs = self.get("/1/fences").await.1;
            if let Some(f) = fs.as_array().into_iter().flatten().find(|f| pred(f)) {
                return f.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; flows: {fs:#}\ndaemon log:\n{}\ncollector logs:\n{}",
                self.daemon_log(),
                self.collector_log_tails(15)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the daemon with SIGKILL (no chance to clean up).
    pub fn kill_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.child.kill().unwrap();
            d.child.wait().unwrap();
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (s, text) = self.get_text(path).await;
        (s, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The body as sent, for what a `Value` would round (numbers past 64 bits or a float).
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let url = format!("{}{path}", self.url());
        // Once more on a broken connection: the daemon closes idle keep-alive connections on
        // its own deadlines, and a GET sent just as it does so meets a reset.
        let r = match self.client.get(&url).send().await {
            Ok(r) => Ok(r),
            Err(e) if e.is_request() || e.is_connect() => self.client.get(&url).send().await,
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("GET {path}: {e:?}\ndaemon log:\n{}", self.daemon_log()),
        };
        let s = r.status().as_u16();
        (s, r.text().await.unwrap_or_default())
    }

    /// The daemon's Prometheus metrics text.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Poll cycles the daemon has finished, by its own count.
    pub async fn poll_cycles(&self) -> u64 {
        let m = self.metrics().await;
        m.lines()
            .find_map(|l| l.strip_prefix("maintd_poll_cycle_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no poll cycle count in the metrics:\n{m}"))
    }

    /// Waits until the daemon has finished `n` whole poll cycles more (one more is counted: the
    /// first may have begun before the call): a check that something did not happen has then
    /// given it `n` chances to, however loaded the machine, where a fixed sleep may give it none.
    /// At the tests' 200 ms interval, `n` cycles never take less than `n` × 200 ms.
    pub async fn some_polls(&self, n: u64) {
        let from = self.poll_cycles().await;
        wait_for(&format!("{n} more poll cycles"), || async {
            (self.poll_cycles().await > from + n).then_some(())
        })
        .await;
    }

    pub async fn status(&self) -> Vec<Value> {
        self.get("/1/status")
            .await
            .1
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn node(&self, name: &str) -> Value {
        let (_, v) = self.get("/1/nodes").await;
        v.as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .cloned()
            .unwrap()
    }

    /// Waits until an event on `node` satisfies `pred`, and returns it.
    pub async fn wait_event(&self, node: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let evs = self.status().await;
            if let Some(e) = evs.iter().find(|e| e["node"] == node && pred(e)) {
                return e.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} on {node}; events: {evs:#?}\ndaemon log:\n{}",
                self.daemon_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for an event in `status`. A final status (completed, failed) counts only once its
    /// tag has reached the backend (`tagged`): the store records the status a moment before.
    pub async fn wait_status(&self, node: &str, status: &str) -> Value {
        let final_ = matches!(status, "completed" | "failed");
        self.wait_event(node, status, |e| {
            e["repair-status"] == status && (!final_ || e["tagged"] == true)
        })
        .await
    }

    /// The last `n` lines of every collector's log.
    pub fn collector_log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = std::fs::read_to_string(self.path(&format!("collector-{node}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {node}\n"));
            for l in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    /// Runs the CLI against this cluster.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cli_command(args).output().unwrap()
    }

    /// Runs the CLI with extra environment (a URL, a CA file).
    pub fn cli_command_env(&self, args: &[&str], env: &[(&str, String)]) -> std::process::Output {
        let mut c = self.cli_command(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// Runs the CLI as the operator whose key file is `key` (in this cluster's directory).
    pub fn cli_as(&self, key: &str, args: &[&str]) -> std::process::Output {
        let key = self.path(key).display().to_string();
        self.cli_command_env(args, &[("MAINTD_OPERATOR_KEY", key)])
    }

    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&*BIN);
        c.args(args)
            .env("MAINTD_URL", self.url())
            .env("MAINTD_KEY_FILE", self.path("cluster.key"))
            .env("MAINTD_CONFIG", self.path("daemon.toml"))
            // An operator key in the home of whoever runs the tests is not this cluster's.
            .env("HOME", self.dir.path());
        c
    }

    /// An operator key for `name` in `file` (in this cluster's directory), written by the CLI.
    pub fn operator_key(&self, name: &str, file: &str) -> maintd::report::operator::OperatorKey {
        let path = self.path(file);
        // Written before the daemon's configuration may exist: it needs none.
        let out = self
            .cli_command(&[
                "keygen",
                "--operator",
                name,
                "--out",
                path.to_str().unwrap(),
            ])
            .env_remove("MAINTD_CONFIG")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        maintd::report::operator::OperatorKey::load(&path).unwrap()
    }
}

/// A node's peer view (`GET /1/peers` at `addr`, host:port), verified as signed by `node`.
pub async fn fetch_view(
    client: &reqwest::Client,
    addr: &str,
    key: &maintd::report::Key,
    node: &str,
) -> maintd::report::heartbeat::PeerView {
    let s: maintd::report::heartbeat::SignedView = client
        .get(format!("http://{addr}/1/peers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    s.verify(key, node).expect("a view signed by the node")
}

/// Sends SIGHUP (what `systemctl reload` sends) to process `pid`.
pub fn hup(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

/// SIGHUP to the process in `slot`, then waits for its log to say `said` once more.
pub async fn reload(slot: &Option<Proc>, said: &str) {
    let p = slot.as_ref().expect("running");
    let count = || {
        std::fs::read_to_string(&p.log)
            .unwrap_or_default()
            .matches(said)
            .count()
    };
    let before = count();
    hup(p.child.id());
    wait_for(said, || async { (count() > before).then_some(()) }).await;
}

/// Whether the process in this slot is still running.
pub fn alive(p: &mut Option<Proc>) -> bool {
    p.as_mut()
        .is_some_and(|p| p.child.try_wait().unwrap().is_none())
}

/// Polls `f` until it yields a value, failing after `WAIT`.
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A tmpfs of `size` mounted on `dir` (root only), unmounted when dropped; `None` without root.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let opts = format!("size={size}");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Remounts it read-only (`false`) or read-write.
    pub fn writable(&self, rw: bool) {
        let opts = if rw { "remount,rw" } else { "remount,ro" };
        let st = Command::new("mount")
            .args(["-o", opts])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success(), "mount -o {opts}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Whether a flow's history has a note containing `text`.
pub fn has_note(f: &Value, text: &str) -> bool {
    f["history"].as_array().is_some_and(|h| {
        h.iter()
            .any(|t| t["note"].as_str().is_some_and(|n| n.contains(text)))
    })
}
