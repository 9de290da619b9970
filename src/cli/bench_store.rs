//! `maintd bench store`: what a synced commit costs. The same commit the fencer makes for a
//! step (a flow's JSON document, a few KiB with its history, written under its version) timed
//! with SQLite's `synchronous = NORMAL` (synced at checkpoints) and `FULL` (synced at every
//! commit, what the daemon uses), in WAL mode, on the file system of `--dir`.

use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, params};

use super::bench::BenchError;

/// One series of `n` commits on a fresh database under `dir`; returns each commit's seconds.
fn series(dir: &Path, synchronous: &str, n: usize, doc: &str) -> Result<Vec<f64>, BenchError> {
    let path = dir.join(format!("bench-{synchronous}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let sql = |e: rusqlite::Error| BenchError::Io(std::io::Error::other(e));
    let c = Connection::open(&path).map_err(sql)?;
    c.pragma_update(None, "journal_mode", "WAL").map_err(sql)?;
    c.pragma_update(None, "synchronous", synchronous)
        .map_err(sql)?;
    c.execute_batch(
        "CREATE TABLE fences (id TEXT PRIMARY KEY, node TEXT NOT NULL, status TEXT NOT NULL,
           version INTEGER NOT NULL, created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL,
           data TEXT NOT NULL)",
    )
    .map_err(sql)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        // One flow per 16 commits: a new one inserted, then saved under its version.
        let id = format!("flow-{}", i / 16);
        c.execute(
            "INSERT INTO fences (id, node, status, version, created_ns, updated_ns, data)
             VALUES (?1, 'node1', 'running', 1, ?2, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET version = version + 1, updated_ns = ?2, data = ?3",
            params![id, i as i64, doc],
        )
        .map_err(sql)?;
        out.push(start.elapsed().as_secs_f64());
    }
    drop(c);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(out)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn store(dir: &Path, commits: usize) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir)?;
    // A flow with a dozen transitions and two agent calls, as the fencer saves one.
    let doc = format!(
        "{{\"history\":[{}],\"calls\":[{}]}}",
        [r#"{"at":1795880000000000000,"step":"power-management","status":"running","note":"attempt 1 of the power-off, with the agent's answer"}"#; 12].join(","),
        [r#"{"at":1795880000000000000,"method":"bmc","agent":"fence_ipmilan","action":"off","ok":true,"elapsed-ms":310,"output":"Success: Powered OFF"}"#; 2].join(",")
    );
    out!(
        "a fence step's commit ({} bytes) in WAL mode on {}, {commits} commits each",
        doc.len(),
        dir.display()
    );
    out!(
        "{:>9} {:>10} {:>10} {:>10} {:>12}",
        "sync",
        "p50 ms",
        "p99 ms",
        "max ms",
        "commits/s"
    );
    for mode in ["NORMAL", "FULL"] {
        let mut t = series(dir, mode, commits, &doc)?;
        let total: f64 = t.iter().sum();
        t.sort_by(f64::total_cmp);
        out!(
            "{:>9} {:>10.3} {:>10.3} {:>10.3} {:>12.0}",
            mode,
            pct(&t, 0.5) * 1e3,
            pct(&t, 0.99) * 1e3,
            t[t.len() - 1] * 1e3,
            commits as f64 / total
        );
    }
    Ok(())
}
