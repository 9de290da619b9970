//! The `[store]` section: where the decision state is kept and shared. SQLite alone (the
//! embedded default: one master) or etcd (several daemons, one of them leading).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the decision state is shared.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum StoreBackend {
    /// The state database in `daemon.state-dir`, one master (the embedded default).
    #[default]
    Sqlite,
    /// etcd: the daemons elect a leader there and the leader shares the state there.
    Etcd,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct StoreConfig {
    pub backend: StoreBackend,
    /// etcd's client URLs (`http://` or, with `ca-file`, `https://`).
    pub endpoints: Vec<String>,
    /// Every key maintd writes starts with this (`<prefix>/leader`, `/term`, `/state`).
    pub prefix: String,
    /// The CA that signed etcd's serving certificate; set for `https://` endpoints.
    pub ca_file: Option<PathBuf>,
    /// This daemon's client certificate and key, when etcd asks for one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// This daemon's name in the leader key (default: the host name).
    pub identity: Option<String>,
    /// How long a leader that stopped renewing is waited for before another takes over.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops acting (and exits), before its lease
    /// can expire in anyone's eyes.
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby looks.
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
    /// The longest one request to etcd may take.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Sqlite,
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/maintd".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            identity: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
        }
    }
}

/// What is wrong with the `[store]` section.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreConfigError {
    #[error("store.endpoints: at least one etcd endpoint is needed with backend = \"etcd\"")]
    NoEndpoints,
    #[error("store.endpoints: {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
    #[error("store.endpoints: {0:?} is https:// but store.ca-file is not set")]
    NoCa(String),
    #[error("store.cert-file and store.key-file go together: set both or neither")]
    HalfClientCert,
    #[error("store.prefix must start with / and not end with one (got {0:?})")]
    Prefix(String),
    #[error(
        "store: retry-period ({retry:?}) < renew-deadline ({renew:?}) < lease-duration ({lease:?}) must hold, so a leader stops acting before its lease can expire"
    )]
    Timing {
        retry: Duration,
        renew: Duration,
        lease: Duration,
    },
    #[error("store.timeout must be greater than zero and below store.renew-deadline")]
    Timeout,
    #[error(
        "store.backend = \"etcd\" is for the inventory backend: Kubernetes elects its leader with a Lease, and Ganeti's master is Ganeti's to choose"
    )]
    NotInventory,
}

impl StoreConfig {
    /// These settings, when several daemons share the store (etcd).
    pub fn shared(&self) -> Option<StoreConfig> {
        (self.backend == StoreBackend::Etcd).then(|| self.clone())
    }

    pub fn validate(&self) -> Result<(), StoreConfigError> {
        if self.backend == StoreBackend::Sqlite {
            return Ok(());
        }
        if self.endpoints.is_empty() {
            return Err(StoreConfigError::NoEndpoints);
        }
        for e in &self.endpoints {
            if e.starts_with("https://") {
                if self.ca_file.is_none() {
                    return Err(StoreConfigError::NoCa(e.clone()));
                }
            } else if !e.starts_with("http://") {
                return Err(StoreConfigError::Endpoint(e.clone()));
            }
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(StoreConfigError::HalfClientCert);
        }
        if !self.prefix.starts_with('/') || self.prefix.len() < 2 || self.prefix.ends_with('/') {
            return Err(StoreConfigError::Prefix(self.prefix.clone()));
        }
        let (retry, renew, lease) = (self.retry_period, self.renew_deadline, self.lease_duration);
        if retry.is_zero() || !(retry < renew && renew < lease) {
            return Err(StoreConfigError::Timing {
                retry,
                renew,
                lease,
            });
        }
        if self.timeout.is_zero() || self.timeout >= renew {
            return Err(StoreConfigError::Timeout);
        }
        Ok(())
    }

    /// This daemon's name in the leader key.
    pub fn identity(&self, host: &str) -> String {
        self.identity
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| host.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd() -> StoreConfig {
        StoreConfig {
            backend: StoreBackend::Etcd,
            ..Default::default()
        }
    }

    #[test]
    fn the_defaults_hold_and_sqlite_needs_nothing() {
        assert_eq!(StoreConfig::default().validate(), Ok(()));
        assert_eq!(etcd().validate(), Ok(()));
        let nothing = StoreConfig {
            endpoints: vec![],
            ..Default::default()
        };
        assert_eq!(nothing.validate(), Ok(()), "sqlite reads no etcd setting");
    }

    #[test]
    fn each_bad_setting_is_named() {
        let cases: Vec<(StoreConfig, StoreConfigError)> = vec![
            (
                StoreConfig {
                    endpoints: vec![],
                    ..etcd()
                },
                StoreConfigError::NoEndpoints,
            ),
            (
                StoreConfig {
                    endpoints: vec!["127.0.0.1:2379".into()],
                    ..etcd()
                },
                StoreConfigError::Endpoint("127.0.0.1:2379".into()),
            ),
            (
                StoreConfig {
                    endpoints: vec!["https://e1:2379".into()],
                    ..etcd()
                },
                StoreConfigError::NoCa("https://e1:2379".into()),
            ),
            (
                StoreConfig {
                    cert_file: Some("c.pem".into()),
                    ..etcd()
                },
                StoreConfigError::HalfClientCert,
            ),
            (
                StoreConfig {
                    prefix: "maintd/".into(),
                    ..etcd()
                },
                StoreConfigError::Prefix("maintd/".into()),
            ),
            (
                StoreConfig {
                    timeout: Duration::from_secs(10),
                    ..etcd()
                },
                StoreConfigError::Timeout,
            ),
        ];
        for (cfg, want) in cases {
            assert_eq!(cfg.validate(), Err(want));
        }
        let slow = StoreConfig {
            renew_deadline: Duration::from_secs(15),
            ..etcd()
        };
        let msg = slow.validate().unwrap_err().to_string();
        assert!(msg.contains("renew-deadline (15s)"), "{msg}");
    }
}
