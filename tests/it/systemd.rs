//! maintd under systemd: the units pass `systemd-analyze verify`, and a real daemon speaks the
//! notification protocol to a socket as systemd's own: ready once it serves, the watchdog fed
//! while its loop turns, stopping on SIGTERM.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn the_units_pass_systemd_analyze_verify() {
    if !have_tool("systemd-analyze", "MAINTD_REQUIRE_SYSTEMD") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The units name /usr/bin/maintd and its man pages; verify checks that both exist, so
    // they point at this build and at pages generated from it.
    let man = dir.path().join("man/man1");
    let out = std::process::Command::new(&*BIN)
        .arg("manpages")
        .arg(&man)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
    let mut units = Vec::new();
    for name in ["maintd.service", "maintd-collector.service"] {
        let text = std::fs::read_to_string(root.join(name)).unwrap();
        assert!(text.contains("ExecStart=/usr/bin/maintd "), "{name}");
        let unit = dir.path().join(name);
        std::fs::write(&unit, text.replace("/usr/bin/maintd", BIN.as_str())).unwrap();
        units.push(unit);
    }
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    let daemon = std::fs::read_to_string(root.join("maintd.service")).unwrap();
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ] {
        assert!(daemon.contains(line), "maintd.service lacks {line}");
    }
}

/// What the kernel says of process `pid` and of each of its threads (state, where it waits), to
/// tell a stopped or killed daemon from a stuck one.
fn process_state(pid: u32) -> String {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("process {pid} is gone");
    };
    let mut said = vec![format!("process {pid}")];
    for t in tasks.flatten() {
        let dir = t.path().display().to_string();
        let stat = read(format!("{dir}/stat"));
        // After the command's closing parenthesis: the state letter.
        let state = stat.rsplit_once(") ").map_or("?", |(_, r)| &r[..1]);
        let name = read(format!("{dir}/comm"));
        let wchan = read(format!("{dir}/wchan"));
        said.push(format!("{} {state} {wchan}", name.trim()));
    }
    said.join("; ")
}

/// The next notification within `patience`, without the newline that may end its last line.
/// A read interrupted by a signal is read again: a socket timeout makes `recv` fail with EINTR
/// even under `SA_RESTART`, and every child of this test binary that exits (another test's
/// daemon, a `kill` command) raises SIGCHLD, which tokio's process support handles.
fn next(sock: &UnixDatagram, patience: Duration) -> Option<String> {
    let deadline = Instant::now() + patience;
    let mut buf = [0u8; 1024];
    let n = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(e) => panic!("reading the notification socket: {e}"),
        }
    };
    let m = String::from_utf8_lossy(&buf[..n]);
    Some(m.strip_suffix('\n').unwrap_or(&m).to_string())
}

#[tokio::test]
async fn the_daemon_is_ready_once_it_serves_feeds_the_watchdog_and_says_it_stops() {
    let mut c = Cluster::new(1);
    c.start_collectors();
    let path = c.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    c.env = vec![
        ("NOTIFY_SOCKET".into(), path.to_str().unwrap().into()),
        ("WATCHDOG_USEC".into(), "2000000".into()),
    ];
    c.start_daemon();
    let ready = next(&sock, WAIT).expect("READY=1 within the wait");
    assert!(
        ready.starts_with("READY=1\nSTATUS=polling 1 nodes"),
        "{ready:?}"
    );
    // Ready means served: the API answers now, without waiting.
    let r = c.client.get(format!("{}/", c.url())).send().await.unwrap();
    assert!(r.status().is_success());
    // Fed every second (half of 2 s) while the engine's loop turns.
    let start = Instant::now();
    let mut fed = 0;
    while fed < 3 {
        let Some(m) = next(&sock, WAIT) else {
            panic!(
                "the watchdog is not fed; the daemon: {}; its log:\n{}",
                process_state(c.daemon.as_ref().unwrap().child.id()),
                c.daemon_log()
            )
        };
        assert_eq!(m, "WATCHDOG=1");
        fed += 1;
    }
    assert!(start.elapsed() < WAIT);
    let pid = c.daemon.as_ref().unwrap().child.id();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut said = Vec::new();
    while let Some(m) = next(&sock, WAIT) {
        if m == "STOPPING=1" {
            return;
        }
        said.push(m);
    }
    panic!("no STOPPING=1 after SIGTERM; heard {said:?}");
}

/// Every file the docs suggest the daemon or its hooks write (the hook log in
/// `hook-env`) lies in a directory the shipped unit makes writable under `ProtectSystem=strict`:
/// otherwise every hook would fail with "Read-only file system".
#[test]
fn the_documented_writable_paths_are_writable_under_the_unit() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(repo.join("deploy/systemd/maintd.service")).unwrap();
    let mut writable: Vec<String> = Vec::new();
    for line in unit.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let base = match key {
            "StateDirectory" => "/var/lib/",
            "LogsDirectory" => "/var/log/",
            "CacheDirectory" => "/var/cache/",
            "RuntimeDirectory" => "/run/",
            "ReadWritePaths" => "",
            _ => continue,
        };
        writable.extend(value.split_whitespace().map(|v| format!("{base}{v}/")));
    }
    let docs = std::fs::read_to_string(repo.join("docs/configuration.md")).unwrap();
    let suggested: Vec<&str> = docs
        .split('"')
        .filter(|w| w.starts_with("/var/") && w.contains("hooks"))
        .collect();
    assert!(!suggested.is_empty(), "the docs suggest a hook log");
    for path in suggested {
        assert!(
            writable.iter().any(|w| path.starts_with(w.as_str())),
            "{path} is not writable under maintd.service (writable: {writable:?})"
        );
    }
}
