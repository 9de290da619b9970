//! Small file-system helpers shared by the daemon's and the collector's state files.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` so a crash leaves the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
