//! The shipped scripts against fixture trees: subsystem collectors, the consolidated diagnose
//! (most invasive wins, byte-stable output), the repair hooks, and `maintd diagnose --once`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// A healthy fixture root: one rw ext4 mount, eth0 up with link, EDAC counters at zero.
fn healthy_root() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for p in [
        "proc",
        "sys/class/net/eth0/device",
        "sys/devices/system/edac/mc/mc0",
        "sys/block/sda",
    ] {
        std::fs::create_dir_all(r.join(p)).unwrap();
    }
    std::fs::write(
        r.join("proc/mounts"),
        "/dev/sda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n",
    )
    .unwrap();
    std::fs::write(r.join("sys/class/net/eth0/flags"), "0x1003\n").unwrap();
    std::fs::write(r.join("sys/class/net/eth0/operstate"), "up\n").unwrap();
    set(r, "sys/devices/system/edac/mc/mc0/ce_count", "0");
    set(r, "sys/devices/system/edac/mc/mc0/ue_count", "0");
    std::fs::write(r.join("usage.json"), "{}").unwrap();
    d
}

fn set(root: &Path, rel: &str, v: &str) {
    std::fs::write(root.join(rel), format!("{v}\n")).unwrap();
}

fn run(script: &Path, root: &Path, env: &[(&str, String)]) -> String {
    let out = Command::new(script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("MAINTD_ROOT", root)
        .env("MAINTD_COLLECTORS_DIR", repo("collectors"))
        .env("MAINTD_FS_USAGE", root.join("usage.json"))
        .env("MAINTD_SMARTCTL", root.join("no-smartctl"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{script:?}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

fn diagnose(root: &Path, env: &[(&str, String)]) -> Value {
    serde_json::from_str(&run(&repo("diagnose.d/maintd-diagnose"), root, env)).unwrap()
}

#[test]
fn a_healthy_node_is_ok_and_the_output_is_byte_stable() {
    let r = healthy_root();
    let a = run(&repo("diagnose.d/maintd-diagnose"), r.path(), &[]);
    let b = run(&repo("diagnose.d/maintd-diagnose"), r.path(), &[]);
    assert_eq!(a, b);
    let v: Value = serde_json::from_str(&a).unwrap();
    assert_eq!(v["status"], "Ok");
    // Sorted keys, no whitespace.
    assert!(!a.contains(' ') || a.contains("collector-errors"), "{a}");
    assert!(a.starts_with(r#"{"details":"#), "{a}");
}

#[test]
fn each_subsystem_check_emits_its_verdict() {
    let fs = repo("collectors/fs-check");
    let r = healthy_root();
    std::fs::write(
        r.path().join("proc/mounts"),
        "/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 /srv xfs ro,noatime 0 0\n",
    )
    .unwrap();
    assert_eq!(
        run(&fs, r.path(), &[]),
        r#"{"details":{"fs":{"read-only":["/srv"]}},"status":"evacuate"}"#
    );

    let r = healthy_root();
    std::fs::write(r.path().join("usage.json"), r#"{"/": 97}"#).unwrap();
    assert_eq!(
        run(&fs, r.path(), &[]),
        r#"{"command":"fs-cleanup","details":{"fs":{"full":["/"]}},"status":"live-repair"}"#
    );
    std::fs::write(r.path().join("usage.json"), r#"{"/": 90}"#).unwrap();
    assert_eq!(run(&fs, r.path(), &[]), r#"{"details":{},"status":"Ok"}"#);

    let edac = repo("collectors/edac-check");
    let r = healthy_root();
    set(r.path(), "sys/devices/system/edac/mc/mc0/ce_count", "150");
    let ce = run(&edac, r.path(), &[]);
    assert_eq!(
        ce,
        r#"{"details":{"edac":{"correctable":["mc0"]}},"status":"evacuate"}"#
    );
    // More errors on the same controller: the verdict does not change (no new event).
    set(r.path(), "sys/devices/system/edac/mc/mc0/ce_count", "4000");
    assert_eq!(run(&edac, r.path(), &[]), ce);
    set(r.path(), "sys/devices/system/edac/mc/mc0/ue_count", "1");
    assert_eq!(
        run(&edac, r.path(), &[]),
        r#"{"details":{"edac":{"correctable":[],"uncorrectable":["mc0"]}},"status":"evacuate-failover"}"#
    );
    set(r.path(), "sys/devices/system/edac/mc/mc0/ue_count", "0");
    set(r.path(), "sys/devices/system/edac/mc/mc0/ce_count", "3");
    assert_eq!(run(&edac, r.path(), &[]), r#"{"details":{},"status":"Ok"}"#);

    let net = repo("collectors/net-check");
    let r = healthy_root();
    assert_eq!(run(&net, r.path(), &[]), r#"{"details":{},"status":"Ok"}"#);
    set(r.path(), "sys/class/net/eth0/operstate", "down");
    assert_eq!(
        run(&net, r.path(), &[]),
        r#"{"command":"net-link-reset","details":{"net":{"link-down":["eth0"]}},"status":"live-repair"}"#
    );
    // Administratively down is not a fault.
    set(r.path(), "sys/class/net/eth0/flags", "0x1002");
    assert_eq!(run(&net, r.path(), &[]), r#"{"details":{},"status":"Ok"}"#);

    let smart = repo("collectors/smart-check");
    let r = healthy_root();
    let fake = r.path().join("smartctl");
    common::write_exec(&fake, r#"echo '{"smart_status":{"passed":false}}'"#);
    assert_eq!(
        run(
            &smart,
            r.path(),
            &[("MAINTD_SMARTCTL", fake.display().to_string())]
        ),
        r#"{"details":{"smart":{"failing":["sda"]}},"status":"evacuate"}"#
    );
    common::write_exec(&fake, r#"echo '{"smart_status":{"passed":true}}'"#);
    assert_eq!(
        run(
            &smart,
            r.path(),
            &[("MAINTD_SMARTCTL", fake.display().to_string())]
        ),
        r#"{"details":{},"status":"Ok"}"#
    );
}

#[test]
fn the_consolidated_diagnose_merges_and_the_most_invasive_wins() {
    let r = healthy_root();
    set(r.path(), "sys/class/net/eth0/operstate", "down");
    let v = diagnose(r.path(), &[]);
    assert_eq!(v["status"], "live-repair");
    assert_eq!(v["command"], "net-link-reset");

    std::fs::write(r.path().join("proc/mounts"), "/dev/sda1 / ext4 ro 0 0\n").unwrap();
    let v = diagnose(r.path(), &[]);
    assert_eq!(v["status"], "evacuate");
    assert!(
        v.get("command").is_none(),
        "a command only goes with live-repair: {v}"
    );
    assert_eq!(v["details"]["fs"], json!({"read-only": ["/"]}));
    assert_eq!(v["details"]["net"], json!({"link-down": ["eth0"]}));

    // A broken collector is listed, and never raises the status on its own.
    let cdir = tempfile::tempdir().unwrap();
    // `cp`, not `fs::copy`: see `write_exec` (ETXTBSY).
    let cp = std::process::Command::new("cp")
        .args(["-p", "--"])
        .arg(repo("collectors").join("net-check"))
        .arg(repo("collectors").join("_common.py"))
        .arg(cdir.path())
        .status()
        .unwrap();
    assert!(cp.success());
    common::write_exec(&cdir.path().join("broken-check"), "echo nonsense");
    let v = diagnose(
        r.path(),
        &[("MAINTD_COLLECTORS_DIR", cdir.path().display().to_string())],
    );
    assert_eq!(v["status"], "live-repair");
    assert!(
        v["details"]["collector-errors"]["broken-check"].is_string(),
        "{v}"
    );
}

#[test]
fn hooks_log_and_read_the_event_and_repairs_honour_the_root_prefix() {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("hooks.log");
    let out = Command::new(repo("repair.d/evacuate"))
        .args(["node1", "ev-1"])
        .env("MAINTD_ACTION", "evacuate")
        .env("MAINTD_REASON", "maintd:ev-1")
        .env("MAINTD_HOOK_LOG", &log)
        .stdin(std::fs::File::open(repo("Cargo.toml")).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "evacuate node1 ev-1 maintd:ev-1\n"
    );
    let out = Command::new(repo("repair.d/evacuate")).output().unwrap();
    assert!(!out.status.success(), "a hook without arguments must fail");

    let mut child = Command::new(repo("repair.d/net-link-reset"))
        .env("MAINTD_ROOT", d.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"status":"live-repair","command":"net-link-reset","details":{"net":{"link-down":["eth0","eth1"]}}}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "reset link eth0\nreset link eth1\n"
    );
}

#[test]
fn diagnose_once_prints_a_signed_envelope() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("k");
    assert!(
        Command::new(&*common::BIN)
            .args(["keygen", "--key-file"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let r = healthy_root();
    std::fs::write(r.path().join("proc/mounts"), "/dev/sda1 / ext4 ro 0 0\n").unwrap();
    let cfg = d.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[collector]\nnode = \"n1\"\ndiagnose = \"maintd-diagnose\"\ndiagnose-dir = \"{}\"\nenv = {{ MAINTD_ROOT = \"{}\", MAINTD_COLLECTORS_DIR = \"{}\", MAINTD_FS_USAGE = \"{}\" }}\n",
            repo("diagnose.d").display(),
            r.path().display(),
            repo("collectors").display(),
            r.path().join("usage.json").display()
        ),
    )
    .unwrap();
    let out = Command::new(&*common::BIN)
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
            "diagnose",
            "--once",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let k = maintd::report::Key::load(&key).unwrap();
    let rules = maintd::report::VerifyRules { max_bytes: 1 << 20 };
    // `diagnose --once` answers no poll (0).
    let v = maintd::report::Envelope::verify(&out.stdout, &k, "n1", None, 0, rules).unwrap();
    assert_eq!(v.verdict.status, maintd_core::verdict::Status::Evacuate);
    assert_eq!(v.envelope.name, "diagnose");
    assert_eq!(v.envelope.version, "B");

    // A missing key is a clear error.
    let out = Command::new(&*common::BIN)
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--key-file",
            "/nonexistent",
            "diagnose",
            "--once",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent"));
}

/// `diagnosed-at` is when the run started, not when it ended: a diagnose begun before a
/// power-off must never count as a report from after it.
#[test]
fn a_slow_diagnose_is_dated_from_its_start() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("k");
    assert!(
        Command::new(&*common::BIN)
            .args(["keygen", "--key-file"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let dir = d.path().join("diagnose.d");
    std::fs::create_dir(&dir).unwrap();
    common::write_exec(&dir.join("slow"), "sleep 2; echo '{\"status\":\"Ok\"}'");
    let cfg = d.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[collector]\nnode = \"n1\"\ndiagnose = \"slow\"\ndiagnose-dir = \"{}\"\ndiagnose-timeout = \"30s\"\n",
            dir.display()
        ),
    )
    .unwrap();
    let before = maintd::report::now_ns();
    let out = Command::new(&*common::BIN)
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--key-file",
            key.to_str().unwrap(),
            "diagnose",
            "--once",
        ])
        .output()
        .unwrap();
    let after = maintd::report::now_ns();
    assert!(out.status.success(), "{out:?}");
    let env: Value = serde_json::from_slice(&out.stdout).unwrap();
    let at = env["diagnosed-at"].as_i64().unwrap();
    assert!(env["diagnose-error"].is_null(), "{env}");
    assert!(
        at >= before && after - at >= 2_000_000_000,
        "diagnosed-at {:.2} s after the start and {:.2} s before the end",
        (at - before) as f64 / 1e9,
        (after - at) as f64 / 1e9
    );
}

/// `scripts/local-cluster` on an operator's machine where a port is taken: it says which port
/// and how to pick others, exits 1, and touches nothing. With free ports from the environment it
/// prints its banner only once the daemon answers, and a stop (SIGTERM) takes every process
/// with it.
#[test]
fn local_cluster_checks_its_ports_and_starts_on_the_ones_it_is_given() {
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let demo = tempfile::tempdir().unwrap();
    std::fs::write(demo.path().join("keep"), "").unwrap();
    let out = Command::new(repo("scripts/local-cluster"))
        .env("MAINTD_DEMO_DIR", demo.path())
        .env("MAINTD_API_PORT", port.to_string())
        .env("MAINTD_COLLECTOR_PORT", common::free_port().to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("port {port} ")) && err.contains("in use"),
        "{err}"
    );
    assert!(err.contains("MAINTD_API_PORT="), "{err}");
    assert!(
        demo.path().join("keep").exists(),
        "the demo directory was wiped"
    );
    drop(taken);

    // Free ports: the API's, and three collector ports in a row that nothing listens on.
    let api = common::free_port();
    let first = loop {
        let p = common::free_port();
        let clear = (1..3).all(|i| TcpListener::bind(("127.0.0.1", p + i)).is_ok());
        if p < 65000 && clear && !(p..p + 3).contains(&api) {
            break p;
        }
    };
    let mut child = Command::new(repo("scripts/local-cluster"))
        .env("MAINTD_DEMO_DIR", demo.path())
        .env("MAINTD_API_PORT", api.to_string())
        .env("MAINTD_COLLECTOR_PORT", first.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    if !first_line.contains("is running") {
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        panic!("no banner: {first_line:?}; stderr: {err}");
    }
    // The banner came after the daemon answered: it answers now.
    let answer = std::net::TcpStream::connect(("127.0.0.1", api)).map(|mut s| {
        use std::io::Write;
        s.write_all(b"GET /1/nodes HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut head = String::new();
        BufReader::new(s).read_line(&mut head).unwrap();
        head
    });
    // Only the script gets SIGTERM; it stops what it started.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
    let head = answer.expect("the daemon listens once the banner is out");
    assert!(head.contains(" 200"), "{head}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", api)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon outlived the script"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
