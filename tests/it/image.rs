//! The OCI image: `scripts/image` builds it from Debian packages with this build's binary, and
//! rootful podman runs it: `maintd --version`, then a daemon and a collector in two containers
//! that exchange signed reports and create an event.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// A container removed when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time", "2", &self.0])
            .output();
    }
}

/// `podman run`'s arguments that work on this kind of host: runc where it is installed (crun
/// refuses hybrid cgroups), and limits within the host's own (podman asks for more by default).
fn run_args() -> Vec<String> {
    let mut a = vec!["run".to_string()];
    if installed("runc") {
        a.splice(0..0, ["--runtime".to_string(), "runc".to_string()]);
    }
    a.extend(
        [
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
            "--network",
            "host",
        ]
        .map(String::from),
    );
    a
}

#[tokio::test]
async fn the_image_runs_a_daemon_and_a_collector_that_create_an_event() {
    let require = "MAINTD_REQUIRE_IMAGE";
    if !["podman", "mmdebstrap", "dpkg-deb"]
        .iter()
        .all(|t| have_tool(t, require))
    {
        return;
    }
    let tag = format!("localhost/maintd:test-{}", std::process::id());
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image"))
        .env("MAINTD_BIN", &*BIN)
        .env("MAINTD_IMAGE_TAG", &tag)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    struct Image(String);
    impl Drop for Image {
        fn drop(&mut self) {
            let _ = Command::new("podman")
                .args(["rmi", "--force", &self.0])
                .output();
        }
    }
    let _image = Image(tag.clone());

    let version = Command::new("podman")
        .args(run_args())
        .args(["--rm", &tag, "--version"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("maintd {}", env!("CARGO_PKG_VERSION")),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );

    // The agents run in it (their Python dependencies are there), dpkg's records are whole, and
    // the two cloud agents whose SDKs the image leaves out are not there to fail at import.
    let inside = |entry: &str, args: &[&str]| {
        let o = Command::new("podman")
            .args(run_args())
            .args(["--rm", "--entrypoint", entry, &tag])
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    for agent in ["fence_ipmilan", "fence_redfish", "fence_apc_snmp"] {
        let (ok, out) = inside(&format!("/usr/sbin/{agent}"), &["-o", "metadata"]);
        assert!(ok && out.contains("<resource-agent"), "{agent}: {out}");
    }
    assert_eq!(inside("dpkg", &["--audit"]), (true, String::new()));
    let (_, listed) = inside("ls", &["/usr/sbin"]);
    assert!(
        !listed.contains("fence_aws") && !listed.contains("fence_gce"),
        "{listed}"
    );

    // The test cluster's configs, keys and scripts, mounted at the same path in both
    // containers; the binary that runs is the image's. The node holds its own key only; the
    // daemon derives it from its secret.
    let mut c = Cluster::new(1);
    c.extra_daemon_toml = format!(
        "[actions]\nevacuate = false\n[daemon.node-keys]\nsecret-file = \"{}\"\n",
        c.path("node-keys.secret").display()
    );
    c.keygen(&["--node-secret"]);
    c.keygen(&["--node", "node1", "--out", "node1.key"]);
    c.collector_keys[0] = vec!["node1.key".into()];
    c.set_verdict(
        &c.nodes[0],
        r#"{"status":"evacuate","details":{"disk":"sdb"}}"#,
    );
    let dir = c.dir.path().display().to_string();
    let start = |name: &str, args: &[&str], log: &str| {
        let cname = format!("maintd-test-{}-{name}", std::process::id());
        let log = std::fs::File::create(c.path(log)).unwrap();
        let status = Command::new("podman")
            .args(run_args())
            .args([
                "--detach",
                "--name",
                &cname,
                "--volume",
                &format!("{dir}:{dir}"),
            ])
            .arg(&tag)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .status()
            .unwrap();
        assert!(status.success(), "podman run {name}");
        Container(cname)
    };
    let ccfg = c.collector_config(0, "scripted", "cluster.key");
    let collector = start(
        "collector",
        &["--config", ccfg.to_str().unwrap(), "collector"],
        "collector.err",
    );
    let dcfg = c.daemon_config();
    let daemon = start(
        "daemon",
        &["--config", dcfg.to_str().unwrap(), "daemon"],
        "daemon.err",
    );
    let logs = |name: &str| {
        let o = Command::new("podman")
            .args(["logs", name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
    };
    let node = c.nodes[0].clone();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let events = match c.client.get(format!("{}/1/status", c.url())).send().await {
            Ok(r) => r.json::<Vec<serde_json::Value>>().await.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        if let Some(e) = events.iter().find(|e| e["node"] == node.as_str()) {
            assert_eq!(e["action"], "evacuate");
            assert_eq!(e["original"]["details"]["disk"], "sdb");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no event from the containers; daemon:\n{}\ncollector:\n{}",
            logs(&daemon.0),
            logs(&collector.0)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The report was verified under the key the daemon derived, so the node's key file and the
    // signature crossed between the containers.
    let (_, nodes) = c.get("/1/nodes").await;
    assert!(nodes.to_string().contains("evacuate"), "{nodes}");
}
