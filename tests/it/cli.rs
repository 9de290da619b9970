//! The CLI as an operator's shell uses it: every listing command ends quietly when its reader
//! goes away (`| head -1`), a configuration named but missing is an error, and logs written to
//! a file carry no colour codes.

use crate::common;

use std::process::Stdio;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_end_quietly_on_a_closed_pipe_and_a_missing_config_is_an_error() {
    let mut c = Cluster::new(2);
    c.start().await;
    c.wait_collectors_ready().await;
    // Something to list in each: an event, a tag, a node in maintenance.
    c.set_verdict("node2", r#"{"status":"evacuate","details":"disk"}"#);
    wait_for("node2's event", || async {
        let (_, v) = c.get("/1/status").await;
        (!v.as_array()?.is_empty()).then_some(())
    })
    .await;
    let out = c.cli(&["maintenance", "start", "node1", "--reason", "rack work"]);
    assert!(out.status.success(), "{out:?}");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["nodes"],
        &["nodes", "--json"],
        &["tags", "list"],
        &["fences", "list"],
        &["drills"],
        &["fencing", "status"],
        &["maintenance", "list"],
    ] {
        let mut child = c
            .cli_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the command has written a byte.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(0) && !err.contains("panicked"),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
    // A configuration named on the command line must exist, whatever the command.
    let out = c.cli(&["--config", "/nonexistent/maintd.toml", "status"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/maintd.toml"), "{err}");
    // The daemon's log goes to a file: no colour codes.
    let log = c.daemon_log();
    assert!(
        log.contains("daemon started") && !log.contains('\u{1b}'),
        "{log}"
    );
    c.kill_daemon();
}
