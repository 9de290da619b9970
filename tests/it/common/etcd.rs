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
        format!(
            "[store]\nbackend = \"etcd\"\nendpoints = [\"{}\"]\nprefix = \"/maintd-test\"\nidentity = \"{identity}\"\nlease-duration = \"{lease_s}s\"\nrenew-deadline = \"{}ms\"\nretry-period = \"300ms\"\ntimeout = \"1s\"\n",
            self.endpoint,
            lease_s * 1000 * 2 / 3,
        )
    }
}
