//! State that survives a crash, and a lost one that is never mistaken for the present: the
//! database deleted, emptied, or rolled back to an earlier copy between two events, with real
//! hooks, collectors and daemon processes. No job adopts a result it did not produce, every hook
//! that should run runs exactly once, and the daemon says what it found.

use crate::common;

use common::*;

/// The hook calls of `action` on `node` in the log.
fn calls(c: &Cluster, action: &str, node: &str) -> usize {
    let prefix = format!("{action} {node} ");
    c.hook_log()
        .iter()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

/// `node` reports evacuate; waits until its event has completed (evacuated, offlined, tagged).
async fn evacuated(c: &Cluster, node: &str) {
    c.set_verdict(node, r#"{"status":"evacuate","details":"disk"}"#);
    c.wait_status(node, "completed").await;
}

/// `node` is healed (reports Ok again), and its collector says so before the stopped daemon is
/// started again and asks: the next events are the only new ones.
async fn restart_with_healed(c: &mut Cluster, node: &str) {
    c.set_verdict(node, r#"{"status":"Ok"}"#);
    c.wait_collectors_ready().await;
    c.start_daemon();
    c.wait_api().await;
}

fn remove_db(c: &Cluster) {
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(c.path(&format!("state/{f}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_emptied_or_rolled_back_database_makes_no_job_adopt_an_earlier_result() {
    let mut c = Cluster::new(4);
    c.start().await;
    evacuated(&c, "node1").await;
    assert_eq!(calls(&c, "evacuate", "node1"), 1);

    // Deleted: node2's evacuation gets job numbers node1's had. Its hooks run, once each.
    c.kill_daemon();
    remove_db(&c);
    restart_with_healed(&mut c, "node1").await;
    evacuated(&c, "node2").await;
    assert_eq!(calls(&c, "evacuate", "node2"), 1, "{:?}", c.hook_log());
    assert_eq!(calls(&c, "offline", "node2"), 1, "{:?}", c.hook_log());
    let (code, health) = c.get("/1/health").await;
    assert_eq!(code, 200, "{health}");
    let found = health["found"].to_string();
    assert!(
        found.contains("directories of earlier hook jobs"),
        "{health:#}"
    );
    assert!(c.daemon_log().contains("state database holds nothing"));

    // Emptied (the schema kept, every row gone): the same for node3.
    c.kill_daemon();
    {
        let db = rusqlite::Connection::open(c.path("state/state.db")).unwrap();
        db.execute_batch(
            "DELETE FROM jobs; DELETE FROM rounds; DELETE FROM events; DELETE FROM fences;
             DELETE FROM inventory_tags; DELETE FROM inventory_offline; DELETE FROM nodes;
             DELETE FROM sqlite_sequence;",
        )
        .unwrap();
    }
    restart_with_healed(&mut c, "node2").await;
    evacuated(&c, "node3").await;
    assert_eq!(calls(&c, "evacuate", "node3"), 1, "{:?}", c.hook_log());
    assert_eq!(calls(&c, "offline", "node3"), 1, "{:?}", c.hook_log());

    // Rolled back: a copy taken now, node4 evacuated after it, then the copy put back. The
    // numbers node4's jobs had are handed out again, to node1's new evacuation.
    c.kill_daemon();
    let copy = c.path("state/copy.db");
    rusqlite::Connection::open(c.path("state/state.db"))
        .unwrap()
        .execute("VACUUM INTO ?1", [copy.to_str().unwrap()])
        .unwrap();
    restart_with_healed(&mut c, "node3").await;
    evacuated(&c, "node4").await;
    c.kill_daemon();
    remove_db(&c);
    std::fs::rename(&copy, c.path("state/state.db")).unwrap();
    restart_with_healed(&mut c, "node4").await;
    evacuated(&c, "node1").await;
    assert_eq!(
        calls(&c, "evacuate", "node1"),
        2,
        "its first evacuation, before the loss, and this one: {:?}",
        c.hook_log()
    );
    assert_eq!(calls(&c, "offline", "node1"), 2, "{:?}", c.hook_log());
    assert_eq!(calls(&c, "evacuate", "node4"), 1, "{:?}", c.hook_log());
    c.kill_daemon();
}

/// A database that cannot be written is refused at the start, whether it exists or not; and
/// `/1/health` turns unhealthy while writes fail (needs root for the mounts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_is_refused_at_start_and_failing_writes_make_the_daemon_unhealthy() {
    let mut c = Cluster::new(1);
    let ro = c.path("ro");
    let Some(fs) = Tmpfs::mount(&ro, "4m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    fs.writable(false);
    c.extra_daemon_toml = format!("db = \"{}\"", ro.join("state.db").display());
    let (code, e) = c.daemon_exit(&c.daemon_config(), &[]);
    assert_eq!(code, Some(1), "{e}");
    assert!(e.contains("cannot be written"), "{e}");

    // Writable at the start, then full: every write fails, and /1/health says so.
    fs.writable(true);
    c.start().await;
    wait_for("a healthy daemon", || async {
        (c.get("/1/health").await.0 == 200).then_some(())
    })
    .await;
    let filler = ro.join("filler");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .output();
    // Nothing is left to write the next change with.
    c.set_verdict("node1", r#"{"status":"evacuate","details":"disk"}"#);
    let (code, body) = wait_for("an unhealthy daemon", || async {
        let (code, body) = c.get_text("/1/health").await;
        (code == 503).then_some((code, body))
    })
    .await;
    assert_eq!(code, 503);
    assert!(body.contains("cannot be written"), "{body}");
    std::fs::remove_file(&filler).unwrap();
    wait_for("healthy again once writes succeed", || async {
        (c.get("/1/health").await.0 == 200).then_some(())
    })
    .await;
    c.kill_daemon();
}

/// A small reproducible stream of delays (a linear congruential generator), so a failing run
/// can be run again with the same kills.
/// `<what> <unix ns>` lines of `file`.
fn stamped(file: &std::path::Path, what: &str) -> Vec<i64> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(what)?.trim().parse().ok())
        .collect()
}

/// kill -9 of the daemon at 15 random moments of a repair round (its hooks take half a second
/// each, run by detached runners that outlive the daemon): every hook runs exactly once, and
/// every event completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_of_a_round_loses_no_job_and_runs_none_twice() {
    let mut at = Moments(40);
    for round in 0..15 {
        let mut c = Cluster::new(2);
        let log = c.path("hooks.log");
        for hook in ["evacuate", "offline"] {
            c.set_hook(
                hook,
                &format!(
                    "sleep 0.5; echo \"$MAINTD_ACTION $1 $2 $MAINTD_REASON\" >> {}",
                    log.display()
                ),
            );
        }
        c.set_verdict("node1", r#"{"status":"evacuate","details":"disk"}"#);
        c.start_collectors();
        c.wait_collectors_ready().await;
        c.start_daemon();
        let kill = at.next(200, 1800);
        tokio::time::sleep(kill).await;
        c.kill_daemon();
        c.start_daemon();
        c.wait_api().await;
        c.wait_status("node1", "completed").await;
        for hook in ["evacuate", "offline"] {
            assert_eq!(
                calls(&c, hook, "node1"),
                1,
                "round {round}, killed {kill:?} in: {:?}\n{}",
                c.hook_log(),
                c.daemon_log()
            );
        }
    }
}

/// kill -9 of the daemon at 15 random moments of a fence flow (its agent's off takes half a
/// second): the node is released exactly once, and no power-off starts after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_of_a_fence_releases_once_and_powers_off_nothing_after() {
    let mut at = Moments(7);
    for round in 0..15 {
        let mut c = Cluster::new(3);
        let agent = c.path("agent.log");
        let released = c.path("released.log");
        c.extra_daemon_toml = c.stub_fencing(
            "fence_stub",
            &format!(
                "opts=$(cat); case \"$opts\" in *action=status*) exit 2;; *action=off*) echo \"off $(date +%s%N)\" >> {}; sleep 0.5;; esac; exit 0",
                agent.display()
            ),
            "1s",
            &["node1"],
        );
        c.set_hook(
            "release",
            &format!(
                "echo \"release $(date +%s%N)\" >> {}; echo \"$MAINTD_ACTION $1 $2 $MAINTD_REASON\" >> {}",
                released.display(),
                c.path("hooks.log").display()
            ),
        );
        c.start().await;
        wait_for("node1 heard by its watchers", || async {
            let w = c.node("node1").await;
            (w["witnesses"]["heard-by"].as_array().map(Vec::len) == Some(2)).then_some(())
        })
        .await;
        c.kill_collector(0);
        let kill = at.next(500, 4000);
        tokio::time::sleep(kill).await;
        c.kill_daemon();
        c.start_daemon();
        c.wait_api().await;
        let f = c
            .wait_flow("node1's release", |f| {
                f["node"] == "node1" && f["released"] == true
            })
            .await;
        assert_eq!(f["fenced"], true, "{f:#}");
        // Whatever was still to finish finishes.
        c.some_polls(5).await;
        let releases = stamped(&released, "release ");
        let offs = stamped(&agent, "off ");
        let why = format!(
            "round {round}, killed {kill:?} after the death: offs {offs:?}, releases {releases:?}"
        );
        assert_eq!(releases.len(), 1, "{why}");
        assert!(!offs.is_empty(), "{why}");
        assert!(offs.iter().all(|o| *o < releases[0]), "{why}");
        c.kill_daemon();
    }
}
