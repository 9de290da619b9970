//! A real two-node Ganeti 3.0 cluster (`scripts/ganeti-cluster`) for the Ganeti backend's tests:
//! brought up in a tempdir with its RAPI forwarded to a loopback port, torn down when dropped.
//! Needs root and Debian's ganeti; skipped with a notice without them, required under
//! `MAINTD_REQUIRE_GANETI=1` (scripts/test).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use maintd::cluster::ganeti::RapiSettings;

pub struct Ganeti {
    pub dir: tempfile::TempDir,
    pub port: u16,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/ganeti-cluster")
}

impl Ganeti {
    pub fn up() -> Option<Ganeti> {
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
        let out = Command::new(script())
            .arg("up")
            .arg(g.dir.path())
            .arg(g.port.to_string())
            .output()
            .unwrap();
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
        let out = Command::new(script())
            .arg("run")
            .arg(self.dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A gnt-* command on the master.
    pub fn gnt(&self, args: &[&str]) -> String {
        let mut all = vec!["node1/cmd"];
        all.extend(args);
        self.run(&all)
    }

    /// A diskless instance `name`, running on `node` (the fake hypervisor, the no-op OS).
    pub fn running_instance(&self, name: &str, node: &str) {
        self.gnt(&[
            "gnt-instance",
            "add",
            "-t",
            "diskless",
            "-o",
            "noop",
            "-n",
            node,
            "--no-name-check",
            "--no-ip-check",
            "--no-install",
            "-B",
            "memory=128",
            "--net=0:link=gnt-br",
            name,
        ]);
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
