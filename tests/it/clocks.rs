//! The master's wall clock stepped for real (libfaketime preloaded into the daemon, with its
//! monotonic clocks left alone, as NTP's `makestep`, a resumed VM or `date -s` move it) in the
//! namespaces of `partitions.rs`: a node cut off from everyone is released only after its
//! watchdog reset it, whenever the clock steps and by how much, across a restart too, and a node
//! that dies while the clock is a minute off is fenced on time. Times are compared on the real
//! clock (the stand-in watchdog's and the release hook's, which the daemon's faked clock never
//! reaches). Needs root and Debian's `faketime` (skipped with a notice without them).

use crate::common;

use std::time::Duration;

use common::parts::{Part, fate, released_at, setup_with, start_daemon};
use common::watchdog::Fate;
use common::*;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The daemon's clock offset, read from a file once a second.
struct FakeClock(tempfile::TempDir);

impl FakeClock {
    fn new() -> FakeClock {
        let f = FakeClock(tempfile::tempdir().unwrap());
        f.set(0);
        f
    }

    fn file(&self) -> std::path::PathBuf {
        self.0.path().join("faketime")
    }

    /// The daemon's wall clock is `secs` from the real one from now on.
    fn set(&self, secs: i64) {
        std::fs::write(self.file(), format!("{secs:+}s\n")).unwrap();
    }

    /// `env` that preloads libfaketime with this file.
    fn wrapper(&self) -> Vec<String> {
        vec![
            "env".into(),
            format!("LD_PRELOAD={LIBFAKETIME}"),
            format!("FAKETIME_TIMESTAMP_FILE={}", self.file().display()),
            "FAKETIME_CACHE_DURATION=1".into(),
            "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
        ]
    }
}

async fn start() -> Option<(Part, FakeClock)> {
    if !std::path::Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var_os("MAINTD_REQUIRE_FAKETIME").is_none(),
            "libfaketime missing (apt-get install faketime), and MAINTD_REQUIRE_FAKETIME is set"
        );
        eprintln!("skipped: libfaketime missing (apt-get install faketime)");
        return None;
    }
    let fake = FakeClock::new();
    let w = fake.wrapper();
    let p = setup_with(&w.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    Some((p, fake))
}

/// node2 was reset by its watchdog and released after that, by the real clock, with its
/// workload dead; its release came `bound` after the reset at most.
async fn released_after_reset(p: &Part, bound: Duration) {
    let reset_at = match fate(&p.fates[1], Duration::from_secs(60)).await {
        Some(Fate::Reset(at)) => at,
        other => panic!("node2's watchdog did not fire: {other:?}"),
    };
    let released = wait_for("node2's release hook", || async {
        released_at(&p.c, "node2")
    })
    .await;
    eprintln!(
        "node2: reset, then released {:.2} s later",
        (released - reset_at) as f64 / 1e9
    );
    assert!(
        released > reset_at,
        "released {:.2} s before the reset",
        (reset_at - released) as f64 / 1e9
    );
    assert!(
        released - reset_at < bound.as_nanos() as i64,
        "released {:.2} s after the reset",
        (released - reset_at) as f64 / 1e9
    );
    let log = p.c.hook_log();
    assert!(
        !log.iter().any(|l| l.starts_with("LIVE-COPY")),
        "two live copies: {log:?}"
    );
}

#[tokio::test]
async fn a_step_forward_right_after_the_proof_releases_nothing_before_the_reset() {
    let Some((p, fake)) = start().await else {
        return;
    };
    p.net.link(2, false);
    p.c.wait_flow("node2's proven wait", |f| {
        f["node"] == "node2" && f["safe-proven"] == true
    })
    .await;
    fake.set(30);
    released_after_reset(&p, Duration::from_secs(15)).await;
}

#[tokio::test]
async fn a_step_while_the_daemon_is_down_and_a_restart_mid_wait_release_nothing_early() {
    let Some((mut p, fake)) = start().await else {
        return;
    };
    p.net.link(2, false);
    p.c.wait_flow("node2's proven wait", |f| {
        f["node"] == "node2" && f["safe-proven"] == true
    })
    .await;
    p.c.kill_daemon();
    fake.set(30);
    let w = fake.wrapper();
    start_daemon(
        &mut p.c,
        &p.net,
        &w.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    p.c.wait_api().await;
    released_after_reset(&p, Duration::from_secs(15)).await;
}

/// A minute ahead, then a minute behind: reports and views answer the daemon's own probes and
/// polls, so every node is still heard and judged, and a node that dies meanwhile is released
/// within the usual time (grace 1 s, then the proof: about 12 s at these settings).
#[tokio::test]
async fn a_node_that_dies_while_the_masters_clock_is_a_minute_off_is_fenced_on_time() {
    let Some((p, fake)) = start().await else {
        return;
    };
    fake.set(60);
    // The step reaches the daemon within a second; every node is still heard after it.
    p.c.some_polls(15).await;
    for n in ["node1", "node3"] {
        let v = p.c.node(n).await;
        assert_eq!(
            v["witnesses"]["heard-by"].as_array().map(Vec::len),
            Some(2),
            "{v:#}"
        );
        let off = v["clock-offset-ms"].as_i64().expect("an offset");
        assert!(
            (-61_000..=-59_000).contains(&off),
            "the node is a minute behind: {v:#}"
        );
    }
    let died = maintd::report::now_ns();
    p.net.link(2, false);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // And a minute behind, halfway through node2's fence.
    fake.set(-60);
    released_after_reset(&p, Duration::from_secs(15)).await;
    // Detection was not blinded by the steps: the flow started within the usual time. Its
    // `detected` is on the daemon's steady clock, which started at the real wall clock and no
    // step has moved. (The release itself follows the node's own reset, which is the node's
    // watchdog's timing, checked above against the reset.)
    let f =
        p.c.wait_flow("node2's flow", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    let started = f["created"].as_i64().unwrap();
    assert!(
        started - died < 10_000_000_000,
        "the flow started {:.1} s after the death: {f:#}",
        (started - died) as f64 / 1e9
    );
    let released = released_at(&p.c, "node2").unwrap();
    eprintln!(
        "node2: flow {:.1} s, release {:.1} s after the death",
        (started - died) as f64 / 1e9,
        (released - died) as f64 / 1e9
    );
    let m = p.c.metrics().await;
    assert!(m.contains("maintd_clock_step_seconds"), "{m}");
}
