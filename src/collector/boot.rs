//! This node's boot as its reports carry it: the kernel's boot id and when the node booted.

use super::CollectorError;

/// Reads this node's boot: its id from `path`, its time from the kernel's `btime` (or, for
/// another file than the kernel's, from the file's modification time).
pub fn read_boot(path: &std::path::Path) -> Result<crate::report::BootReport, CollectorError> {
    let fail = |e: String| CollectorError::Boot {
        path: path.display().to_string(),
        problem: e,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let id = uuid::Uuid::parse_str(text.trim())
        .map_err(|e| fail(format!("not a boot id ({e}): {:?}", text.trim())))?;
    let at = if path == std::path::Path::new(crate::report::KERNEL_BOOT_ID) {
        let stat = std::fs::read_to_string("/proc/stat").map_err(|e| fail(e.to_string()))?;
        let btime = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<i64>().ok())
            .ok_or_else(|| fail("/proc/stat has no btime".into()))?;
        btime.saturating_mul(1_000_000_000)
    } else {
        let m = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .map_err(|e| fail(e.to_string()))?;
        m.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    };
    Ok(crate::report::BootReport { id, at })
}
