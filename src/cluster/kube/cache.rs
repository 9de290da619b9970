//! The watch caches of the Kubernetes backend: one reflector per resource maintd reads (Nodes,
//! Pods, PodDisruptionBudgets, the kubelets' Leases, and the election Lease and state
//! ConfigMap), fed by kube's watcher with bookmarks, relisting only when a watch breaks. Reads
//! cost no API request, so an idle daemon sends only its Lease renewals and the watches'
//! periodic reconnects.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::core::{Expression, Selector, SelectorExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::super::ClusterError;
use crate::sync::LockExt;

/// How long a read waits for a cache's first full list before it fails.
const SYNC_WAIT: Duration = Duration::from_secs(30);

/// Exponential backoff between failed watch or list attempts, 0.5 s doubling to 5 s, reset by
/// a success. kube's default caps at 30 s, too long for the election Lease: a standby whose
/// watch waits out an outage would see a new leader's lease late.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: BACKOFF_MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (d * 2).min(BACKOFF_MAX);
        Some(d)
    }
}

impl WatchBackoff {
    fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// Whether a watch's last word was a success, and the error that broke it if not.
#[derive(Debug, Default)]
struct Health {
    broken: Mutex<Option<(Instant, String)>>,
}

impl Health {
    fn ok(&self, what: &str) {
        let was = self.broken.lock_unpoisoned().take();
        if let Some((since, _)) = was {
            tracing::info!(watch = what, after = ?since.elapsed(), "watch resumed");
        }
    }

    fn failed(&self, what: &str, e: &watcher::Error) {
        let mut b = self.broken.lock_unpoisoned();
        if b.is_none() {
            tracing::warn!(watch = what, error = %e, "watch broken; retrying with backoff");
        }
        *b = Some((
            b.as_ref().map_or_else(Instant::now, |(t, _)| *t),
            e.to_string(),
        ));
    }

    fn error(&self) -> Option<String> {
        self.broken
            .lock_unpoisoned()
            .as_ref()
            .map(|(_, e)| e.clone())
    }
}

/// A reflector's store and the health of the watch that feeds it. The watch task ends when the
/// cache is dropped.
pub struct Watched<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    what: &'static str,
    store: Store<K>,
    health: Arc<Health>,
    task: tokio::task::AbortHandle,
    arrivals: Option<Arc<Arrivals>>,
}

/// When each object's marker (a Lease's `renewTime`) last changed on a live watch, by this
/// process's clock: the moment a renewal was delivered, which a renewal can only precede. A
/// marker learned from a list (the first one, or a relist after a broken watch) has no moment:
/// it may have changed at any time while nothing was watched.
#[derive(Default)]
pub struct Arrivals(Mutex<std::collections::HashMap<String, (String, Option<Instant>)>>);

impl Arrivals {
    fn note<K: kube::Resource>(&self, ev: &watcher::Event<K>, marker: fn(&K) -> Option<String>) {
        let (obj, live) = match ev {
            watcher::Event::Apply(o) => (o, true),
            watcher::Event::InitApply(o) => (o, false),
            watcher::Event::Delete(o) => {
                if let Some(n) = o.meta().name.as_ref() {
                    self.0.lock_unpoisoned().remove(n);
                }
                return;
            }
            watcher::Event::Init | watcher::Event::InitDone => return,
        };
        let (Some(name), Some(m)) = (obj.meta().name.clone(), marker(obj)) else {
            return;
        };
        let mut all = self.0.lock_unpoisoned();
        if all.get(&name).is_some_and(|(was, _)| *was == m) {
            return;
        }
        all.insert(name, (m, live.then(Instant::now)));
    }

    /// When `name`'s current `marker` arrived on a live watch.
    pub fn of(&self, name: &str, marker: &str) -> Option<Instant> {
        let all = self.0.lock_unpoisoned();
        all.get(name)
            .filter(|(m, _)| m == marker)
            .and_then(|(_, at)| *at)
    }
}

impl<K: kube::Resource + 'static> Drop for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> Watched<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    /// Starts the watch (on the current tokio runtime). `trim` drops what maintd never reads
    /// before an object is stored, which bounds the cache's memory on large clusters.
    ///
    /// After any error the watch starts over with a list (from the apiserver's watch cache,
    /// after a backoff unless the error was a routine 410 Gone): a watch that merely resumes
    /// says nothing until something changes, so only a list proves the cache current again.
    /// The store keeps serving the last state until that list completes, then swaps at once.
    pub fn spawn(
        what: &'static str,
        api: Api<K>,
        cfg: watcher::Config,
        trim: impl FnMut(&mut K) + Send + 'static,
    ) -> Self {
        Self::spawn_noting(what, api, cfg, trim, None)
    }

    /// `spawn`, also noting when each object's `marker` arrives on a live watch
    /// (`arrived`).
    pub fn spawn_noting(
        what: &'static str,
        api: Api<K>,
        cfg: watcher::Config,
        mut trim: impl FnMut(&mut K) + Send + 'static,
        marker: Option<fn(&K) -> Option<String>>,
    ) -> Self {
        let arrivals = marker.map(|_| Arc::new(Arrivals::default()));
        let noted = arrivals.clone();
        let (store, mut writer) = reflector::store();
        let health = Arc::new(Health::default());
        let h = health.clone();
        let task = tokio::spawn(async move {
            let mut backoff = WatchBackoff::default();
            loop {
                let mut stream = watcher(api.clone(), cfg.clone()).boxed();
                let gone = loop {
                    match stream.next().await {
                        Some(Ok(ev)) => {
                            let ev = ev.modify(&mut trim);
                            if let (Some(a), Some(m)) = (&noted, marker) {
                                a.note(&ev, m);
                            }
                            writer.apply_watcher_event(&ev);
                            // `Init` comes before the list is even sent: not a sign of life.
                            if !matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                                h.ok(what);
                                backoff.reset();
                            }
                        }
                        Some(Err(e)) if expired(&e) => break true,
                        Some(Err(e)) => {
                            h.failed(what, &e);
                            break false;
                        }
                        None => break false,
                    }
                };
                if !gone {
                    tokio::time::sleep(backoff.next().unwrap_or(BACKOFF_MAX)).await;
                }
            }
        })
        .abort_handle();
        Watched {
            what,
            store,
            health,
            task,
            arrivals,
        }
    }

    /// When `name`'s `marker` arrived on a live watch (see `Arrivals`); `None` without
    /// noting, or when it was learned from a list.
    pub fn arrived(&self, name: &str, marker: &str) -> Option<Instant> {
        self.arrivals.as_ref()?.of(name, marker)
    }

    /// Waits for the first full list (up to `SYNC_WAIT`).
    async fn synced(&self) -> Result<(), ClusterError> {
        match tokio::time::timeout(SYNC_WAIT, self.store.wait_until_ready()).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(ClusterError::NotSynced {
                what: self.what,
                detail: self
                    .health
                    .error()
                    .unwrap_or_else(|| format!("no list within {SYNC_WAIT:?}")),
            }),
        }
    }

    /// Every object, failing while the watch is broken: decisions (tags, conditions, capacity)
    /// never rest on facts that may have changed unseen, as they never rested on a failed list.
    pub async fn objects(&self) -> Result<Vec<Arc<K>>, ClusterError> {
        self.synced().await?;
        if let Some(detail) = self.health.error() {
            return Err(ClusterError::WatchBroken {
                what: self.what,
                detail,
            });
        }
        Ok(self.sorted())
    }

    /// In namespace/name order: decisions and job details must not depend on hash order.
    fn sorted(&self) -> Vec<Arc<K>> {
        let mut v = self.store.state();
        v.sort_by(|a, b| {
            (a.meta().namespace.as_deref(), a.meta().name.as_deref())
                .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
        });
        v
    }

    /// Every object as last seen, also while the watch reconnects (as a client-go lister): for
    /// a job under way, whose own requests go to the API and fail there if it is away.
    pub async fn last_known(&self) -> Result<Vec<Arc<K>>, ClusterError> {
        self.synced().await?;
        Ok(self.sorted())
    }

    /// One cluster-scoped object by name, as last seen.
    pub async fn get(&self, name: &str) -> Result<Option<Arc<K>>, ClusterError> {
        self.synced().await?;
        Ok(self.store.get(&reflector::ObjectRef::new(name)))
    }

    /// Every object, without waiting: `None` until the first list and while the watch is
    /// broken. For an optional fact (a kubelet's Lease) that must neither hold up nor mislead a
    /// decision.
    pub fn if_current(&self) -> Option<Vec<Arc<K>>> {
        use futures::FutureExt;
        let ready = self.store.wait_until_ready().now_or_never();
        (matches!(ready, Some(Ok(()))) && self.health.error().is_none()).then(|| self.sorted())
    }

    /// Every object as last seen, without waiting: nothing before the first list. For facts
    /// that must hold while a watch reconnects (another operator's maintenance).
    pub fn known(&self) -> Vec<Arc<K>> {
        use futures::FutureExt;
        match self.store.wait_until_ready().now_or_never() {
            Some(Ok(())) => self.sorted(),
            _ => Vec::new(),
        }
    }

    /// The one object of a single-object watch (`metadata.name=` field selector).
    pub async fn only(&self) -> Result<Option<Arc<K>>, ClusterError> {
        Ok(self.objects().await?.into_iter().next())
    }
}

/// A 410 Gone: the apiserver no longer has the version a watch resumed from. Routine (etcd
/// compacts), answered by a relist at once.
fn expired(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(s) => s.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 410,
        _ => false,
    }
}

/// A label selector in the apiserver's string syntax (`a=b,c!=d,e,!f,g in (h,i),j notin (k)`),
/// parsed once so the node cache can apply it: the one Node watch also serves capacity, which
/// counts every node.
/// A label selector term maintd cannot read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    #[error("bad label selector term {0:?}")]
    Term(String),
    #[error("bad label key in selector term {0:?}")]
    Key(String),
}

pub fn parse_selector(s: &str) -> Result<Selector, SelectorError> {
    let mut exprs = Vec::new();
    for term in split_terms(s) {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        let bad = || SelectorError::Term(term.into());
        let set = |rest: &str| -> Result<std::collections::BTreeSet<String>, SelectorError> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(bad)?;
            Ok(inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect())
        };
        let e = if let Some((k, v)) = term.split_once("!=") {
            Expression::NotEqual(key(k, term)?, v.trim().into())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Expression::Equal(key(k, term)?, v.trim().into())
        } else if let Some((k, rest)) = term.split_once(" notin ") {
            Expression::NotIn(key(k, term)?, set(rest)?)
        } else if let Some((k, rest)) = term.split_once(" in ") {
            Expression::In(key(k, term)?, set(rest)?)
        } else if let Some(k) = term.strip_prefix('!') {
            Expression::DoesNotExist(key(k, term)?)
        } else {
            Expression::Exists(key(term, term)?)
        };
        exprs.push(e);
    }
    Ok(exprs.into_iter().collect())
}

fn key(k: &str, term: &str) -> Result<String, SelectorError> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_string())
    } else {
        Err(SelectorError::Key(term.into()))
    }
}

/// Commas separate terms except inside the parentheses of a set.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

pub fn selects(
    sel: &Selector,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    static EMPTY: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    sel.matches(labels.unwrap_or(&EMPTY))
}

/// What maintd reads of a Node: labels, the collector annotation, taints, unschedulable,
/// addresses, allocatable and conditions. Images and managed fields are most of a Node's size.
pub fn trim_node(keep_annotation: &str) -> impl Fn(&mut Node) + use<> {
    let keep = keep_annotation.to_string();
    move |n: &mut Node| {
        n.metadata.managed_fields = None;
        if let Some(a) = n.metadata.annotations.as_mut() {
            a.retain(|k, _| *k == keep);
        }
        if let Some(s) = n.status.as_mut() {
            s.images = None;
            s.volumes_attached = None;
            s.volumes_in_use = None;
            s.node_info = None;
            s.capacity = None;
            s.daemon_endpoints = None;
            s.config = None;
            s.features = None;
            s.runtime_handlers = None;
        }
    }
}

/// What maintd reads of a Pod: identity, labels, owners, the mirror annotation, deletion,
/// node, scheduling constraints, container requests and phase.
pub fn trim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.retain(|k, _| k == super::drain::MIRROR_ANNOTATION);
    }
    if let Some(s) = p.spec.as_mut() {
        s.volumes = None;
        s.affinity = None;
        s.topology_spread_constraints = None;
        for c in s
            .containers
            .iter_mut()
            .chain(s.init_containers.iter_mut().flatten())
        {
            let keep = k8s_openapi::api::core::v1::Container {
                name: std::mem::take(&mut c.name),
                resources: c.resources.take(),
                ..Default::default()
            };
            *c = keep;
        }
        s.ephemeral_containers = None;
    }
    if let Some(st) = p.status.as_mut() {
        *st = k8s_openapi::api::core::v1::PodStatus {
            phase: st.phase.take(),
            ..Default::default()
        };
    }
}

/// Objects whose whole content is read (PDBs, the Lease, the state ConfigMap) drop only their
/// managed fields.
pub fn trim_meta<K: kube::Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_parse_as_the_apiserver_reads_them() {
        let s =
            parse_selector("role=worker, zone in (a, b),!gpu,maintd.io/managed,tier!=db").unwrap();
        let m = labels(&[("role", "worker"), ("zone", "b"), ("maintd.io/managed", "")]);
        assert!(selects(&s, Some(&m)));
        let mut gpu = m.clone();
        gpu.insert("gpu".into(), "1".into());
        assert!(!selects(&s, Some(&gpu)));
        let mut zone = m.clone();
        zone.insert("zone".into(), "c".into());
        assert!(!selects(&s, Some(&zone)));
        let mut db = m.clone();
        db.insert("tier".into(), "db".into());
        assert!(!selects(&s, Some(&db)));
        assert!(!selects(&s, None));
        assert!(selects(&parse_selector("").unwrap(), None));
        let notin = parse_selector("zone notin (a,b),x==y").unwrap();
        assert!(selects(&notin, Some(&labels(&[("zone", "c"), ("x", "y")]))));
        assert!(!selects(
            &notin,
            Some(&labels(&[("zone", "a"), ("x", "y")]))
        ));
        for bad in ["=x", "zone in a,b", "a b=c", "zone in (a"] {
            assert!(parse_selector(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = WatchBackoff::default();
        let first: Vec<_> = (&mut b).take(6).collect();
        assert_eq!(first[0], BACKOFF_MIN);
        assert_eq!(first[1], BACKOFF_MIN * 2);
        assert_eq!(first[5], BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next(), Some(BACKOFF_MIN));
    }

    #[test]
    fn trimming_keeps_what_decisions_read() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u",
                "annotations": {"kubernetes.io/config.mirror": "x", "big": "y"},
                "managedFields": [{"manager": "m"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                "env": [{"name": "E", "value": "v"}],
                "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .unwrap();
        trim_pod(&mut p);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["annotations"].as_object().unwrap().len(), 1);
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
        assert!(v["spec"]["containers"][0].get("env").is_none());
        assert_eq!(v["spec"]["nodeName"], "n1");
        assert_eq!(v["status"], serde_json::json!({"phase": "Running"}));
    }
}
