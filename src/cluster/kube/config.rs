//! The `[kubernetes]` settings: which nodes, drain timings, Events, condition rules and leader
//! election, remedies, with the checks serde cannot make.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::cache;
use maintd_core::repair::conditions::{Rule, RuleError};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct KubeConfig {
    /// API server URL, e.g. `http://127.0.0.1:8001` behind `kubectl proxy`. Unset: the
    /// kubeconfig, or the in-cluster service account.
    pub api_url: Option<String>,
    /// Which Nodes maintd manages (a label selector; empty = all).
    pub label_selector: String,
    /// Annotation that overrides a node's collector address (default: InternalIP:1815).
    pub collector_annotation: String,
    /// An evacuation that cannot evict every pod by then fails, naming the blocking pods.
    #[serde(with = "humantime_serde")]
    pub drain_deadline: Duration,
    /// First backoff after a 429 from the Eviction API (doubles up to 5 s).
    #[serde(with = "humantime_serde")]
    pub eviction_backoff: Duration,
    /// Namespace for the Events maintd records on Nodes.
    pub events_namespace: String,
    /// How often the node list is read: membership, conditions and the fencing source.
    #[serde(with = "humantime_serde")]
    pub node_interval: Duration,
    /// At most this many nodes drain in one round (capacity and PDBs may allow fewer).
    pub max_disruptions: usize,
    /// Node-condition rules, checked in order.
    pub conditions: Vec<ConditionRuleConfig>,
    pub leader_election: LeaderElectionConfig,
    /// Fence flows are NodeFence objects (`maintd.io/v1alpha1`, the CRD in `deploy/crd.yaml`):
    /// visible with kubectl, triggerable and cancelable with it, and resumed by any leader from
    /// the objects alone. `false` keeps them in the local database and the state checkpoint.
    pub nodefences: bool,
    /// Fence configuration is also read from ConfigMaps in the leader-election namespace
    /// (`fence-config-<node>`, `fence-method-…`, `fence-stage-…`), hot-reloaded; the TOML
    /// `[fencing]` section wins for a node it configures.
    pub fence_configmaps: bool,
    /// Leases that prove a node alive, as its kubelet's does: a storage agent's or SBD-like
    /// software's, one per node, named by a pattern. A renewal seen after the node's collector
    /// went silent vetoes its fence; a stale one joins the witnesses.
    pub storage_leases: Vec<StorageLeaseConfig>,
    /// Remedies by name (`remedy:<name>` in a condition rule, `"remedy": "<name>"` in a
    /// verdict): pod templates run as Jobs. A name not here is read from the ConfigMap
    /// `remedy-<name>` in maintd's namespace when it runs.
    pub remedies: BTreeMap<String, super::RemedyConfig>,
    /// At most this many remedy Jobs run at once, cluster-wide (one per node at most).
    pub max_remedies: usize,
    /// The API also takes a Kubernetes bearer token in place of an operator key: checked with
    /// a TokenReview, then a SubjectAccessReview of verb `get` (reads) or `operate` (commands)
    /// on `nodefences.maintd.io`.
    pub operator_tokens: bool,
    /// This replica's host name, as Events report it (resolved at load).
    #[serde(skip)]
    pub instance: String,
}

/// A node's storage Lease: `name` with `{node}` replaced by the node's name, in `namespace`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StorageLeaseConfig {
    pub namespace: String,
    pub name: String,
    /// How often its holder renews it, when the operator knows: checked at start against the
    /// fence grace, so a witness that could never veto in time is refused, not ignored.
    #[serde(default, with = "humantime_serde")]
    pub renew_interval: Option<std::time::Duration>,
}

/// `(type, status) for <duration> -> actions`, escalating one step per `escalate-after`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConditionRuleConfig {
    #[serde(rename = "type")]
    pub condition: String,
    pub status: String,
    #[serde(rename = "for", with = "humantime_serde", default)]
    pub after: Duration,
    pub actions: Vec<String>,
    #[serde(with = "humantime_serde", default)]
    pub escalate_after: Option<Duration>,
}

impl ConditionRuleConfig {
    pub fn rule(&self) -> Result<Rule, RuleError> {
        Rule::new(
            &self.condition,
            &self.status,
            self.after.as_nanos() as i64,
            &self.actions,
            self.escalate_after.map(|d| d.as_nanos() as i64),
        )
    }
}

/// A `coordination.k8s.io/v1` Lease elects the one replica that acts; the state it acts on is
/// checkpointed to a ConfigMap, so a successor resumes it. Defaults are client-go's.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LeaderElectionConfig {
    pub enabled: bool,
    /// Namespace of the Lease and the state ConfigMap (default: `$POD_NAMESPACE`, else
    /// `default`).
    pub namespace: Option<String>,
    pub lease_name: String,
    pub state_configmap: String,
    /// This replica's name in the Lease (default: `$POD_NAME`, else the host name).
    pub identity: Option<String>,
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long stops acting (exits) before its lease expires.
    #[serde(with = "humantime_serde")]
    pub renew_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: true,
            namespace: None,
            lease_name: "maintd".into(),
            state_configmap: "maintd-state".into(),
            identity: None,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaderElectionConfig {
    /// Fills what the file left out from the environment, once, when the config loads: the
    /// namespace from `POD_NAMESPACE` (else `default`), the identity from `POD_NAME`, else
    /// `host`.
    pub fn resolve(&mut self, host: &str) {
        let env = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
        if self.namespace.is_none() {
            self.namespace = Some(env("POD_NAMESPACE").unwrap_or_else(|| "default".into()));
        }
        if self.identity.is_none() {
            let host = (!host.is_empty()).then(|| host.to_string());
            self.identity = Some(env("POD_NAME").or(host).unwrap_or_else(|| "maintd".into()));
        }
    }

    pub fn namespace(&self) -> String {
        self.namespace.clone().unwrap_or_else(|| "default".into())
    }

    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| "maintd".into())
    }
}

/// What is wrong with the `[kubernetes]` section.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KubeConfigError {
    #[error("kubernetes.conditions: {0}")]
    Rule(#[from] RuleError),
    #[error("kubernetes.label-selector: {0}")]
    Selector(#[from] cache::SelectorError),
    #[error("kubernetes.node-interval must be greater than zero")]
    NodeInterval,
    #[error("kubernetes.max-disruptions must be at least 1")]
    MaxDisruptions,
    #[error(
        "kubernetes.events-namespace {0:?}: Events about Nodes (cluster-scoped objects) are accepted only in \"default\" (or \"kube-system\"); the apiserver refuses any other namespace with 422"
    )]
    EventsNamespace(String),
    #[error("kubernetes.leader-election needs retry-period < renew-deadline < lease-duration")]
    LeaseTimings,
    #[error("kubernetes.max-remedies must be at least 1")]
    MaxRemedies,
    #[error("kubernetes.remedies: {0}")]
    Remedy(#[from] super::RemedyError),
    #[error("kubernetes.remedies: {0:?} is not a remedy name (1 to 40 of a-z, 0-9 and '-')")]
    RemedyName(String),
    #[error(
        "kubernetes.storage-leases {lease}: renewed every {every:?}, a renewal is seen as proof of life up to {seen:?} after the node went silent, not before fencing.grace ({grace:?}): this witness could never veto a fence in time; raise fencing.grace above {seen:?} or renew the Lease more often"
    )]
    WitnessTooSlow {
        lease: String,
        every: Duration,
        seen: Duration,
        grace: Duration,
    },
}

impl KubeConfig {
    /// A storage Lease is a witness only if one of its renewals can be seen as proof of life
    /// within the fence grace: its renew interval, the watch's delivery and the fencer's next
    /// look must all fit in it. One that could never veto in time is refused with the numbers.
    pub fn check_witness_timing(
        &self,
        grace: Duration,
        liveness_interval: Duration,
    ) -> Result<(), KubeConfigError> {
        let margin = crate::cluster::LEASE_DELIVERY + liveness_interval;
        for l in &self.storage_leases {
            let Some(every) = l.renew_interval else {
                continue;
            };
            if every + margin >= grace {
                return Err(KubeConfigError::WitnessTooSlow {
                    lease: format!("{}/{}", l.namespace, l.name),
                    every,
                    seen: every + margin,
                    grace,
                });
            }
        }
        Ok(())
    }

    /// Checks what serde cannot: rules, and timings that only work in one order.
    pub fn validate(&self) -> Result<(), KubeConfigError> {
        for r in &self.conditions {
            r.rule()?;
        }
        cache::parse_selector(&self.label_selector)?;
        if self.node_interval.is_zero() {
            return Err(KubeConfigError::NodeInterval);
        }
        if self.max_disruptions == 0 {
            return Err(KubeConfigError::MaxDisruptions);
        }
        if self.max_remedies == 0 {
            return Err(KubeConfigError::MaxRemedies);
        }
        for (name, r) in &self.remedies {
            if !maintd_core::verdict::valid_remedy_name(name) {
                return Err(KubeConfigError::RemedyName(name.clone()));
            }
            r.check(name, &format!("[kubernetes.remedies.{name}]"))?;
        }
        if !matches!(self.events_namespace.as_str(), "default" | "kube-system") {
            return Err(KubeConfigError::EventsNamespace(
                self.events_namespace.clone(),
            ));
        }
        let l = &self.leader_election;
        if l.enabled && !(l.retry_period < l.renew_deadline && l.renew_deadline < l.lease_duration)
        {
            return Err(KubeConfigError::LeaseTimings);
        }
        Ok(())
    }
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            api_url: None,
            label_selector: String::new(),
            collector_annotation: "maintd.io/collector".into(),
            drain_deadline: Duration::from_secs(600),
            eviction_backoff: Duration::from_millis(500),
            events_namespace: "default".into(),
            node_interval: Duration::from_secs(2),
            max_disruptions: 1,
            conditions: vec![],
            leader_election: LeaderElectionConfig::default(),
            nodefences: true,
            fence_configmaps: true,
            operator_tokens: false,
            storage_leases: vec![],
            remedies: BTreeMap::new(),
            max_remedies: 5,
            instance: String::new(),
        }
    }
}
