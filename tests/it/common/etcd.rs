//! A real etcd (Debian's `etcd-server`) for the tests of leadership and state on etcd: one member
//! on loopback ports of its own, its data in a tempdir, stopped when dropped. Skipped with a
//! notice when etcd is missing, required under `MAINTD_REQUIRE_ETCD=1` (scripts/test).

use std::process::{Command, Stdio};

use super::{Proc, free_port};

pub struct Etcd {
    pub endpoint: String,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub async fn start() -> Option<Etcd> {
        if !super::have_tool("etcd", "MAINTD_REQUIRE_ETCD") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = dir.path().join("etcd.log");
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new("etcd")
            .args(["--data-dir", &dir.path().join("data").display().to_string()])
            .args(["--name", "m1", "--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("m1={peer_url}")])
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        let e = Etcd {
            endpoint,
            _proc: Proc { child, log },
            _dir: dir,
        };
        let client = maintd::http::client_builder().build().unwrap();
        let health = format!("{}/health", e.endpoint);
        super::wait_for("etcd to answer", || async {
            let r = client.get(&health).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        Some(e)
    }

    /// The `[store]` section of a daemon named `identity` sharing its state here, with spans
    /// short enough for a test: a lease of `lease_s` seconds.
    pub fn store_toml(&self, identity: &str, lease_s: u64) -> String {
        store_toml(std::slice::from_ref(&self.endpoint), identity, lease_s)
    }
}

/// The `[store]` section of a daemon named `identity` on the etcd at `endpoints`: a lease of
/// `lease_s` seconds, renewed every 300 ms, given up after two thirds of it.
pub fn store_toml(endpoints: &[String], identity: &str, lease_s: u64) -> String {
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        "[store]\nbackend = \"etcd\"\nendpoints = [{}]\nprefix = \"/maintd-test\"\nidentity = \"{identity}\"\nlease-duration = \"{lease_s}s\"\nrenew-deadline = \"{}ms\"\nretry-period = \"300ms\"\ntimeout = \"1s\"\n",
        list.join(", "),
        lease_s * 1000 * 2 / 3,
    )
}

/// Three etcd members, each on a host of a test's network namespaces (its client port 2379 and
/// peer port 2380 on the host's address), their data in a tempdir: a member stopped and
/// started again keeps its data and rejoins.
pub struct Members {
    hosts: Vec<(String, String)>,
    procs: Vec<Option<Proc>>,
    dir: tempfile::TempDir,
}

impl Members {
    /// Members on `hosts` of `net` (namespace and address each); None (with a notice) when
    /// etcd is missing.
    pub async fn start(net: &super::netns::Net, hosts: &[usize]) -> Option<Members> {
        if !super::have_tool("etcd", "MAINTD_REQUIRE_ETCD") {
            return None;
        }
        let mut m = Members {
            hosts: hosts
                .iter()
                .map(|&i| (net.hosts[i].ns.clone(), net.hosts[i].ip.clone()))
                .collect(),
            procs: hosts.iter().map(|_| None).collect(),
            dir: tempfile::tempdir().unwrap(),
        };
        for i in 0..hosts.len() {
            m.start_member(i);
        }
        m.wait_healthy().await;
        Some(m)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.hosts
            .iter()
            .map(|(_, ip)| format!("http://{ip}:2379"))
            .collect()
    }

    /// Starts member `i` (again: from its data, rejoining the others).
    pub fn start_member(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(k, (_, ip))| format!("m{k}=http://{ip}:2380"))
            .collect();
        let (ns, ip) = &self.hosts[i];
        let (client, peer) = (format!("http://{ip}:2379"), format!("http://{ip}:2380"));
        let log = self.dir.path().join(format!("etcd-m{i}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "etcd"])
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster.join(",")])
            .args(["--initial-cluster-token", "maintd-test"])
            // Pre-vote: a member back from a partition does not depose a working raft leader
            // (etcd 3.4 leaves it off); the timeouts leave room for a loaded 2-core machine.
            .args(["--heartbeat-interval", "200", "--election-timeout", "2000"])
            .arg("--pre-vote")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        self.procs[i] = Some(Proc { child, log });
    }

    /// Member `i` killed (SIGKILL): its data stays for `start_member`.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Waits until a member answers that the cluster is healthy (it has a raft leader).
    pub async fn wait_healthy(&self) {
        let client = maintd::http::client_builder()
            .timeout(std::time::Duration::from_secs(2))
            .build()
            .unwrap();
        let urls: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("{e}/health"))
            .collect();
        super::wait_for("the etcd cluster to be healthy", || async {
            for u in &urls {
                let Ok(r) = client.get(u).send().await else {
                    continue;
                };
                let v: serde_json::Value = r.json().await.ok()?;
                if v["health"] == "true" {
                    return Some(());
                }
            }
            None
        })
        .await;
    }
}
