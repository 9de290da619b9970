//! A real two-node Ganeti 3.0 cluster (`scripts/ganeti-cluster`) for the Ganeti backend's tests:
//! brought up in a tempdir with its RAPI forwarded to a loopback port. A test that moves
//! Ganeti's master owns its cluster (torn down when dropped); the others borrow one from a pool,
//! reset to the state `up` leaves, and hand it back, so the binary brings up one cluster per
//! test thread instead of one per test. Needs root and Debian's ganeti; skipped with a notice
//! without them, required under `MAINTD_REQUIRE_GANETI=1` (scripts/test).

use std::ops::Deref;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use maintd::cluster::ganeti::RapiSettings;

pub struct Ganeti {
    pub dir: tempfile::TempDir,
    pub port: u16,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/ganeti-cluster")
}

/// Clusters handed back by the tests that borrowed them; reset when borrowed again. Statics
/// are never dropped: each was brought up with this process as its owner, and the script's
/// watcher takes it down once the process has exited.
static POOL: Mutex<Vec<Ganeti>> = Mutex::new(Vec::new());

/// A borrowed cluster; back to the pool when dropped (after a failed test too: the next
/// borrower's reset undoes what it left, and a cluster that will not reset is dropped).
pub struct Shared(Option<Ganeti>);

impl Deref for Shared {
    type Target = Ganeti;
    fn deref(&self) -> &Ganeti {
        self.0.as_ref().expect("held until dropped")
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(g) = self.0.take() {
            POOL.lock().unwrap_or_else(|e| e.into_inner()).push(g);
        }
    }
}

impl Ganeti {
    /// A cluster of its own, torn down when dropped: for a test that moves Ganeti's master or
    /// changes what a reset does not restore.
    pub fn up() -> Option<Ganeti> {
        Self::bring_up(false)
    }

    /// A cluster as `up` leaves it (node1 the master, node2 an online candidate, no instance,
    /// tag, hook or unfinished job; earlier jobs archived, so the RAPI lists none), borrowed
    /// from the pool. A test that borrows one must leave Ganeti's master on node1.
    pub fn shared() -> Option<Shared> {
        loop {
            let pooled = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let Some(g) = pooled else { break };
            match g.reset() {
                Ok(()) => return Some(Shared(Some(g))),
                // Dropped: taken down, and the next one tried.
                Err(e) => eprintln!("a pooled Ganeti cluster did not reset, discarded: {e}"),
            }
        }
        Self::bring_up(true).map(|g| Shared(Some(g)))
    }

    fn reset(&self) -> Result<(), String> {
        let out = Command::new(script())
            .arg("reset")
            .arg(self.dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn bring_up(pooled: bool) -> Option<Ganeti> {
        let require = "MAINTD_REQUIRE_GANETI";
        if !super::have_tool("gnt-cluster", require) || !super::have_tool("socat", require) {
            return None;
        }
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os(require).is_none(),
                "{require} is set but the Ganeti tests need root"
            );
            eprintln!("skipping: a Ganeti cluster needs root");
            return None;
        }
        let g = Ganeti {
            dir: tempfile::tempdir().unwrap(),
            port: super::free_port(),
        };
        let mut up = Command::new(script());
        up.arg("up").arg(g.dir.path()).arg(g.port.to_string());
        if pooled {
            up.env("GANETI_OWNER", std::process::id().to_string());
        }
        let out = up.output().unwrap();
        assert!(
            out.status.success(),
            "scripts/ganeti-cluster up: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(g)
    }

    /// Runs a command on the cluster (`node1/cmd gnt-node list`); its stdout, or a panic.
    pub fn run(&self, args: &[&str]) -> String {
        self.try_run(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Runs a command on the cluster; its stdout, or what it said when it failed.
    pub fn try_run(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(script())
            .arg("run")
            .arg(self.dir.path())
            .args(args)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// A gnt-* command on the master.
    pub fn gnt(&self, args: &[&str]) -> String {
        let mut all = vec!["node1/cmd"];
        all.extend(args);
        self.run(&all)
    }

    /// A diskless instance `name`, running on `node` (the fake hypervisor, the no-op OS).
    pub fn running_instance(&self, name: &str, node: &str) {
        self.instance_of("diskless", name, node)
    }

    /// A running instance with disk template `template` (a 1 GiB disk unless diskless).
    pub fn instance_of(&self, template: &str, name: &str, node: &str) {
        let mut args = vec![
            "gnt-instance",
            "add",
            "-t",
            template,
            "-o",
            "noop",
            "-n",
            node,
        ];
        if template != "diskless" {
            args.extend(["--disk", "0:size=1G", "--no-wait-for-sync"]);
        }
        args.extend([
            "--no-name-check",
            "--no-ip-check",
            "--no-install",
            "-B",
            "memory=128",
            "--net=0:link=gnt-br",
            name,
        ]);
        self.gnt(&args);
        self.gnt(&["gnt-instance", "startup", name]);
    }

    /// The command prefix that runs a program in the cluster's network namespace.
    pub fn inside(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net={}", self.path("ns/net").display()),
            "--".into(),
        ]
    }

    /// `target` (an address in the namespace) on `127.0.0.1:<port>`; stops when dropped.
    pub fn forward(&self, target: &str) -> (u16, super::Proc) {
        let port = super::free_port();
        let child = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!(
                "EXEC:nsenter --net={} socat STDIO TCP\\:{}",
                self.path("ns/net").display(),
                target.replace(':', "\\:")
            ))
            // Connections refused before the daemon listens are the caller's to retry.
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        (
            port,
            super::Proc {
                child,
                log: PathBuf::new(),
            },
        )
    }

    /// `gnt-instance list`: one `name pnode status` line per instance.
    pub fn instances(&self) -> String {
        self.gnt(&[
            "gnt-instance",
            "list",
            "--no-headers",
            "-o",
            "name,pnode,status",
        ])
    }

    /// `gnt-node list`: one `name offline` (Y/N) line per node.
    pub fn offline(&self) -> String {
        self.gnt(&["gnt-node", "list", "--no-headers", "-o", "name,offline"])
    }

    /// The `[ganeti]` section of a daemon on `node` reaching the RAPI at `url`, then `extra`.
    pub fn daemon_toml(&self, url: &str, node: &str, extra: &str) -> String {
        format!(
            "[ganeti]\nrapi-url = \"{url}\"\nrapi-certificate = \"{}\"\nrapi-password-file = \"{}\"\nnode-name = \"{node}\"\nrapi-timeout = \"20s\"\nssconf-dir = \"{}\"\nluxi-socket = \"{}\"\n{extra}",
            self.path("rapi.crt").display(),
            self.path("rapi-password").display(),
            self.path(&format!("vc/{node}/var/lib/ganeti")).display(),
            self.path(&format!("vc/{node}/var/run/ganeti/socket/ganeti-query"))
                .display(),
        )
    }

    /// A test cluster of maintd for this Ganeti: collectors on both nodes' addresses (port
    /// 1817), the daemon on node1's, all in the cluster's network namespace.
    pub fn maintd(&self, extra: &str) -> super::Cluster {
        let mut c = super::Cluster::new(2);
        c.inventory_nodes = false;
        c.node_hosts = vec!["192.0.2.10".into(), "192.0.2.11".into()];
        c.ports = vec![1817; 2];
        c.daemon_host = "192.0.2.10".into();
        c.extra_daemon_toml = self.daemon_toml("https://192.0.2.10:5080", "node1", extra);
        c
    }

    /// Starts the collectors of `c` that are not running, inside the namespace.
    pub fn start_collectors(&self, c: &mut super::Cluster) {
        let inside = self.inside();
        let wrap: Vec<&str> = inside.iter().map(String::as_str).collect();
        for i in 0..2 {
            if c.collectors[i].is_none() {
                let ccfg = c.collector_config(i, "scripted", "cluster.key");
                let name = format!("collector-{}", c.nodes[i]);
                c.collectors[i] = Some(c.spawn_wrapped(
                    &name,
                    &wrap,
                    &["--config", ccfg.to_str().unwrap(), "collector"],
                ));
            }
        }
    }

    /// Starts the collectors (when not running) and the daemon of `c` inside the namespace,
    /// and points `c` at the daemon's API through a forward (returned: it stops when dropped).
    #[must_use = "the forwarder stops when dropped: hold it while the daemon is talked to"]
    pub async fn start(
        &self,
        c: &mut super::Cluster,
        daemon_port: u16,
        fwd: Option<(u16, super::Proc)>,
    ) -> (u16, super::Proc) {
        self.start_collectors(c);
        let inside = self.inside();
        let wrap: Vec<&str> = inside.iter().map(String::as_str).collect();
        c.daemon_host = "192.0.2.10".into();
        c.api_port = daemon_port;
        let cfg = c.daemon_config();
        c.daemon = Some(c.spawn_wrapped(
            "daemon",
            &wrap,
            &[
                "--config",
                cfg.to_str().unwrap(),
                "daemon",
                "--cluster",
                "ganeti",
            ],
        ));
        let fwd = fwd.unwrap_or_else(|| self.forward(&format!("192.0.2.10:{daemon_port}")));
        c.daemon_host = "127.0.0.1".into();
        c.api_port = fwd.0;
        c.wait_api().await;
        fwd
    }

    /// How many jobs in Ganeti's queue carry `reason` in their reason trail and run opcode
    /// `op` (child jobs inherit their parent's trail).
    pub async fn jobs_with_reason(&self, reason: &str, op: &str) -> usize {
        let rapi = maintd::cluster::ganeti::Rapi::new(&self.settings()).unwrap();
        let jobs = rapi.get("/2/jobs?bulk=1").await.unwrap();
        jobs.as_array()
            .unwrap()
            .iter()
            .filter(|j| j["ops"][0]["OP_ID"] == op)
            .filter(|j| {
                j["ops"].as_array().into_iter().flatten().any(|op| {
                    op["reason"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|e| e[1].as_str() == Some(reason))
                })
            })
            .count()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn settings(&self) -> RapiSettings {
        RapiSettings {
            url: format!("https://127.0.0.1:{}", self.port),
            certificate: self.path("rapi.crt"),
            user: "maintd".into(),
            password_file: self.path("rapi-password"),
            timeout: Duration::from_secs(30),
            retries: 3,
        }
    }
}

impl Drop for Ganeti {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .output();
    }
}
