//! Reading secret files (the cluster key, fence-agent passwords): a file that group or others
//! can access is refused before its content is read, so a leaked-permission secret is never
//! used, and the error says how to fix it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("{source}")]
    Read {
        #[source]
        source: std::io::Error,
    },
    #[error("accessible by group or others (mode {mode:o})")]
    Permissions { mode: u32 },
}

/// The file's content, if only its owner may access it.
pub fn read(path: &Path) -> Result<String, SecretFileError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretFileError::Read { source })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Permissions { mode });
    }
    std::fs::read_to_string(path).map_err(|source| SecretFileError::Read { source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owner_only_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        std::fs::write(&p, "hunter2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read(&p),
            Err(SecretFileError::Permissions { mode: 0o640 })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&p).unwrap(), "hunter2\n");
        assert!(matches!(
            read(&d.path().join("absent")),
            Err(SecretFileError::Read { .. })
        ));
    }
}
