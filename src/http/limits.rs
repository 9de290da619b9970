//! What a listener tolerates from its clients: the `[*.limits]` settings, each table read over
//! its own listener's defaults.

use std::time::Duration;

use serde::Deserialize;

/// What a listener tolerates from its clients. The defaults suit a collector or a daemon on a
/// network where an attacker may connect (see the security model in docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ListenerLimits {
    /// Open connections at most; past it the oldest connection not running a handler is closed
    /// to make room (or the new one is refused when every connection is running a handler).
    pub max_connections: usize,
    /// Open connections from one client address at most, with the same eviction.
    pub max_connections_per_ip: usize,
    /// A client must send a whole request head within this time.
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in flight is closed after this time.
    pub idle_timeout: Duration,
    /// A signed request's body must arrive within this time.
    pub body_timeout: Duration,
    /// A handler that runs longer than this has its connection closed.
    pub request_timeout: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 256,
            max_connections_per_ip: 64,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Listener limits that cannot work; each names its config section.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitsError {
    #[error("{section}: connection caps must be at least 1")]
    NoConnections { section: String },
    #[error("{section}: max-connections-per-ip ({per_ip}) is above max-connections ({total})")]
    PerIpAboveTotal {
        section: String,
        per_ip: usize,
        total: usize,
    },
    #[error("{section}: {name} must be above zero")]
    ZeroTimeout { section: String, name: &'static str },
}

impl ListenerLimits {
    pub fn validate(&self, section: &str) -> Result<(), LimitsError> {
        let section = section.to_string();
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            return Err(LimitsError::NoConnections { section });
        }
        if self.max_connections_per_ip > self.max_connections {
            return Err(LimitsError::PerIpAboveTotal {
                section,
                per_ip: self.max_connections_per_ip,
                total: self.max_connections,
            });
        }
        for (name, d) in [
            ("header-timeout", self.header_timeout),
            ("idle-timeout", self.idle_timeout),
            ("body-timeout", self.body_timeout),
            ("request-timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return Err(LimitsError::ZeroTimeout { section, name });
            }
        }
        Ok(())
    }
}

/// A `[*.limits]` table as written: the keys it leaves out are not there, so that each keeps
/// the default of the listener it configures, not another listener's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PartialLimits {
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    header_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    body_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    request_timeout: Option<Duration>,
}

impl ListenerLimits {
    /// Reads a `[*.limits]` table over `base`: each key it sets replaces `base`'s, every other
    /// key keeps `base`'s value.
    pub fn deserialize_over<'de, D: serde::Deserializer<'de>>(
        d: D,
        base: ListenerLimits,
    ) -> Result<ListenerLimits, D::Error> {
        let p = PartialLimits::deserialize(d)?;
        Ok(ListenerLimits {
            max_connections: p.max_connections.unwrap_or(base.max_connections),
            max_connections_per_ip: p
                .max_connections_per_ip
                .unwrap_or(base.max_connections_per_ip),
            header_timeout: p.header_timeout.unwrap_or(base.header_timeout),
            idle_timeout: p.idle_timeout.unwrap_or(base.idle_timeout),
            body_timeout: p.body_timeout.unwrap_or(base.body_timeout),
            request_timeout: p.request_timeout.unwrap_or(base.request_timeout),
        })
    }
}
