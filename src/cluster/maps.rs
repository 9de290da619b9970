//! The seam fence configuration from ConfigMaps is read through: the kept maps with their
//! versions, and the Secret values they name. The Kubernetes backend implements it over a watch
//! of the fence namespace; the plan book follows it.

use std::collections::BTreeMap;

/// Where fence ConfigMaps are read (on Kubernetes, a watch of the fence namespace).
#[async_trait::async_trait]
pub trait MapSource: Send + Sync + 'static {
    /// The kept maps and their versions, failing while the source is broken (the plans in
    /// force then stay).
    async fn snapshot(&self) -> Result<MapSnapshot, super::ClusterError>;
    /// One key of one Secret; `None` when either is missing or cannot be read.
    async fn secret(&self, name: &str, key: &str) -> Option<String>;
    /// Where the maps are, for the log.
    fn location(&self) -> String;
}

/// Each kept map's data by name, and each one's version (a change shows there).
pub type MapSnapshot = (
    BTreeMap<String, BTreeMap<String, String>>,
    Vec<(String, String)>,
);
