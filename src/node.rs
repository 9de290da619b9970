//! A managed node as the daemon knows it: its name and its collector's address, normalized to
//! `host:port` (port 1815 by default). Config files, the Kubernetes node list and the CLI all
//! produce these; the poller, the fencer and live repairs consume them.

use serde::Deserialize;

pub const COLLECTOR_PORT: u16 = 1815;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeConfig {
    pub name: String,
    /// `host:port` of the node's collector; the port defaults to 1815.
    pub collector: String,
}

impl NodeConfig {
    /// `http://host:port<path>` of the node's collector (the address is validated on load and on
    /// discovery).
    pub fn collector_url(&self, path: &str) -> String {
        format!(
            "http://{}{path}",
            collector_address(&self.collector).unwrap_or_default()
        )
    }
}

/// Why a collector address is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AddressError {
    #[error("collector address {0:?} must be host or host:port")]
    Shape(String),
    #[error("collector address {0:?} has a bad port")]
    Port(String),
}

/// Normalizes a collector address to `host:port` (port 1815 when omitted).
pub fn collector_address(addr: &str) -> Result<String, AddressError> {
    let addr = addr.trim();
    if addr.is_empty() || addr.contains('/') || addr.contains(char::is_whitespace) {
        return Err(AddressError::Shape(addr.into()));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.ends_with(':') => {
            port.parse::<u16>()
                .map_err(|_| AddressError::Port(addr.into()))?;
            Ok(addr.to_string())
        }
        _ => Ok(format!("{addr}:{COLLECTOR_PORT}")),
    }
}
