//! How a replica is elected: the lease's timing and where it is kept, from the Kubernetes
//! leader-election settings or `[store]`'s.

use std::time::Duration;

use crate::cluster::kube::LeaderElectionConfig;

/// How a replica is elected, whatever keeps the lease (a Kubernetes Lease, an etcd key).
#[derive(Debug, Clone)]
pub struct Election {
    /// This replica's name in the lease.
    pub identity: String,
    /// Where the lease is, for logs and `/1/leader` (`Lease default/maintd`, `etcd …`).
    pub place: String,
    /// Which kind of lease: `kubernetes` or `etcd`.
    pub backend: &'static str,
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops acting, before its lease can expire.
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl From<&LeaderElectionConfig> for Election {
    fn from(c: &LeaderElectionConfig) -> Election {
        Election {
            identity: c.identity(),
            place: format!("Lease {}/{}", c.namespace(), c.lease_name),
            backend: "kubernetes",
            lease_duration: c.lease_duration,
            renew_deadline: c.renew_deadline,
            retry_period: c.retry_period,
        }
    }
}
