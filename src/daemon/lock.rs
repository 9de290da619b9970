//! Master-only guard: an exclusive lock on a file in the state directory, naming its holder.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Ganeti's exit code for "not the master".
pub const EXIT_NOT_MASTER: i32 = 11;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another maintd daemon holds the master lock {path} ({holder})")]
    Held { path: String, holder: String },
    #[error("cannot open the master lock {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Held for the daemon's lifetime; the kernel releases it when the process dies, however it dies.
#[derive(Debug)]
pub struct MasterLock {
    _file: File,
}

pub fn acquire(state_dir: &Path, host: &str) -> Result<MasterLock, LockError> {
    let path = state_dir.join("maintd.lock");
    let shown = path.display().to_string();
    let io = |source| LockError::Io {
        path: shown.clone(),
        source,
    };
    std::fs::create_dir_all(state_dir).map_err(io)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(LockError::Held {
                path: shown,
                holder: holder.trim().to_string(),
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(
        file,
        "pid {} on {host}, since {}",
        std::process::id(),
        crate::report::now_ns() / 1_000_000_000
    )
    .map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(MasterLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_named() {
        let d = tempfile::tempdir().unwrap();
        let first = acquire(d.path(), "test-host").unwrap();
        let err = acquire(d.path(), "test-host").unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        // Other tests of this process spawn subprocesses: a child forked while `first` was open
        // holds a copy of its descriptor, and so the lock, until it execs (close-on-exec).
        // That window is short; wait it out rather than read it as a held lock.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match acquire(d.path(), "test-host") {
                Ok(_) => break,
                Err(LockError::Held { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
