//! An in-process fake Kubernetes API server for what maintd uses, following the API's documented
//! behaviour: list and get (label and field selectors), JSON merge patch (RFC 7386) and
//! strategic-merge patch (lists with a patch merge key merge by key, `$patch: delete|replace`)
//! with a resourceVersion precondition (409 Conflict when stale), pod delete, the eviction
//! subresource (429 TooManyRequests while a PodDisruptionBudget allows no disruption), PDB lists,
//! Leases and ConfigMaps (create: 409 AlreadyExists; replace: 409 Conflict on a stale
//! resourceVersion), and Events. Errors are `Status` objects. Every write bumps the object's
//! resourceVersion. Lists and watches: every list remembers what it returned under a new
//! resourceVersion; a watch from that version streams the differences (ADDED, MODIFIED, DELETED)
//! between it and the world, however a test changed the world, with a BOOKMARK after each batch
//! and every second; a watch from a version it does not remember gets 410 Expired, so the client
//! relists, as from a real apiserver whose watch cache has moved on.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

#[derive(Default)]
pub struct World {
    /// While set, every request is answered 503 (an apiserver outage).
    pub down: bool,
    /// As a kubelet with a termination grace: an eviction or a delete without grace 0 marks the
    /// pod terminating (deletionTimestamp) and leaves it until `finish_terminating`.
    pub graceful: bool,
    pub nodes: BTreeMap<String, Value>,
    /// (namespace, name) -> pod
    pub pods: BTreeMap<(String, String), Value>,
    pub pdbs: Vec<Value>,
    pub events: Vec<Value>,
    /// Pods deleted, with the grace period asked for.
    pub deleted: Vec<(String, Option<i64>)>,
    /// Every pod delete or eviction request, with the UID precondition it carried (if any).
    pub delete_requests: Vec<(String, Option<String>)>,
    pub evictions_refused: usize,
    /// The next this-many versioned node patches lose a race with another writer: the node
    /// changes just before they land, so they get 409 Conflict.
    pub races: usize,
    pub conflicts: usize,
    /// Namespaced objects served generically: (resource, namespace, name) -> object.
    pub objects: BTreeMap<(String, String, String), Value>,
    /// Every successful write to a generic object, in order: (resource, name, holder or "").
    pub writes: Vec<(String, String, String)>,
    /// Every change of a node's taints: (wall-clock ns, node, taints after it).
    pub taint_log: Vec<(i64, String, Vec<String>)>,
    /// Requests by verb and path (without the query), for tests of the request budget.
    pub requests: Vec<(String, String)>,
    version: u64,
    /// What recent lists and bookmarks saw, by the resourceVersion they returned.
    snapshots: VecDeque<(String, Items)>,
}

/// A list's objects by namespace/name.
type Items = BTreeMap<String, Value>;
/// What one list or watch selects from the world.
type Select = Arc<dyn Fn(&World) -> Vec<Value> + Send + Sync>;

fn keyed(items: Vec<Value>) -> Items {
    items
        .into_iter()
        .map(|o| {
            let m = &o["metadata"];
            (
                format!(
                    "{}/{}",
                    m["namespace"].as_str().unwrap_or(""),
                    m["name"].as_str().unwrap_or("")
                ),
                o,
            )
        })
        .collect()
}

impl World {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Remembers what a list or bookmark saw; returns the resourceVersion that names it.
    fn remember(&mut self, items: Items) -> String {
        let rv = self.bump();
        self.snapshots.push_back((rv.clone(), items));
        if self.snapshots.len() > 256 {
            self.snapshots.pop_front();
        }
        rv
    }

    /// How many requests matched `verb` (GET, PATCH, ...) and contained `path_part`.
    pub fn count_requests(&self, verb: &str, path_part: &str) -> usize {
        self.requests
            .iter()
            .filter(|(v, p)| v == verb && p.contains(path_part))
            .count()
    }

    pub fn add_node(&mut self, name: &str, ip: &str) {
        let rv = self.bump();
        self.nodes.insert(
            name.into(),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv, "labels": {"kubernetes.io/hostname": name}},
                "spec": {},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": ip}],
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                },
            }),
        );
    }

    /// Sets a node condition as the kubelet or node-problem-detector would, with its
    /// lastTransitionTime `ago` seconds in the past when the status changes.
    pub fn set_condition(&mut self, node: &str, kind: &str, st: &str, ago: i64) {
        let rv = self.bump();
        let since =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago);
        let n = self.nodes.get_mut(node).unwrap();
        n["metadata"]["resourceVersion"] = json!(rv);
        let conds = n["status"]["conditions"].as_array_mut().unwrap();
        match conds.iter_mut().find(|c| c["type"] == kind) {
            Some(c) if c["status"] == st => {}
            Some(c) => {
                c["status"] = json!(st);
                c["lastTransitionTime"] = json!(since.to_string());
            }
            None => conds.push(json!({"type": kind, "status": st,
                "lastTransitionTime": since.to_string()})),
        }
    }

    /// CPU and memory requests of a pod's one container, e.g. ("500m", "1Gi").
    pub fn set_requests(&mut self, ns: &str, name: &str, cpu: &str, mem: &str) {
        let p = self
            .pods
            .get_mut(&(ns.to_string(), name.to_string()))
            .unwrap();
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": cpu, "memory": mem}});
    }

    pub fn set_allocatable(&mut self, node: &str, cpu: &str, mem: &str) {
        let n = self.nodes.get_mut(node).unwrap();
        n["status"]["allocatable"] = json!({"cpu": cpu, "memory": mem});
    }

    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&(resource.into(), ns.into(), name.into()))
            .cloned()
    }

    /// A pod on `node`; `owner` is e.g. "ReplicaSet" or "DaemonSet".
    pub fn add_pod(&mut self, ns: &str, name: &str, node: &str, labels: Value, owner: &str) {
        let rv = self.bump();
        self.pods.insert(
            (ns.into(), name.into()),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}-{rv}"), "resourceVersion": rv, "labels": labels,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner, "name": format!("{name}-owner"), "uid": "u"}]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running"},
            }),
        );
    }

    /// Completes every graceful deletion, as the kubelet does once the containers stopped.
    pub fn finish_terminating(&mut self) {
        let done: Vec<_> = self
            .pods
            .iter()
            .filter(|(_, p)| p["metadata"]["deletionTimestamp"].is_string())
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            self.pods.remove(&k);
            self.deleted.push((format!("{}/{}", k.0, k.1), None));
        }
    }

    pub fn add_mirror_pod(&mut self, ns: &str, name: &str, node: &str) {
        self.add_pod(ns, name, node, json!({}), "Node");
        let p = self
            .pods
            .get_mut(&(ns.to_string(), name.to_string()))
            .unwrap();
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    }

    pub fn add_pdb(&mut self, ns: &str, name: &str, match_labels: Value, allowed: i64) {
        self.pdbs.push(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": match_labels}},
            "status": {"disruptionsAllowed": allowed},
        }));
    }

    pub fn set_pdb_allowed(&mut self, name: &str, allowed: i64) {
        for p in &mut self.pdbs {
            if p["metadata"]["name"] == name {
                p["status"]["disruptionsAllowed"] = json!(allowed);
            }
        }
    }

    pub fn pods_on(&self, node: &str) -> Vec<String> {
        self.pods
            .values()
            .filter(|p| p["spec"]["nodeName"] == node)
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn taints(&self, node: &str) -> Vec<String> {
        self.nodes[node]["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t["key"].as_str().unwrap_or(""),
                    t["value"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap_or("")
                )
            })
            .collect()
    }
}

pub type Shared = Arc<Mutex<World>>;

fn status(code: u16, reason: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        axum::Json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        })),
    )
        .into_response()
}

/// A list (or, with `watch=true`, a watch) of what `select` picks.
fn list_or_watch(
    w: &Shared,
    kind: &'static str,
    api_version: &'static str,
    q: &BTreeMap<String, String>,
    select: Select,
) -> Response {
    if q.get("watch").map(String::as_str) == Some("true") {
        return watch(w.clone(), kind, api_version, q, select);
    }
    let mut g = w.lock().unwrap();
    let items = select(&g);
    let rv = g.remember(keyed(items.clone()));
    axum::Json(json!({
        "kind": format!("{kind}List"), "apiVersion": api_version,
        "metadata": {"resourceVersion": rv}, "items": items,
    }))
    .into_response()
}

fn watch(
    w: Shared,
    kind: &'static str,
    api_version: &'static str,
    q: &BTreeMap<String, String>,
    select: Select,
) -> Response {
    let rv = q.get("resourceVersion").cloned().unwrap_or_default();
    let baseline = w
        .lock()
        .unwrap()
        .snapshots
        .iter()
        .find(|(v, _)| *v == rv)
        .map(|(_, items)| items.clone());
    let Some(mut last) = baseline else {
        return status(410, "Expired", &format!("too old resource version: {rv}"));
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(290);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let mut bookmarked = tokio::time::Instant::now();
        let line = |kind: &str, object: &Value| {
            let mut b = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
            b.push(b'\n');
            Bytes::from(b)
        };
        while tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (now, down) = {
                let g = w.lock().unwrap();
                (keyed(select(&g)), g.down)
            };
            if down {
                return;
            }
            let mut out = Vec::new();
            for (k, o) in &now {
                match last.get(k) {
                    None => out.push(line("ADDED", o)),
                    Some(old) if old != o => out.push(line("MODIFIED", o)),
                    Some(_) => {}
                }
            }
            for (k, o) in &last {
                if !now.contains_key(k) {
                    out.push(line("DELETED", o));
                }
            }
            last = now;
            if !out.is_empty() || bookmarked.elapsed() >= Duration::from_secs(1) {
                let rv = w.lock().unwrap().remember(last.clone());
                out.push(line(
                    "BOOKMARK",
                    &json!({"kind": kind, "apiVersion": api_version,
                            "metadata": {"resourceVersion": rv}}),
                ));
                bookmarked = tokio::time::Instant::now();
            }
            for b in out {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(body))
        .unwrap()
}

/// `a=b,c` style selectors: equality and existence.
fn labels_match(selector: &str, labels: &Value) -> bool {
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels[k.trim()] == v.trim(),
            None => labels.get(term.trim()).is_some(),
        })
}

/// Strategic-merge patch over a Node, for the lists of the Node schema that declare a patch
/// merge key (conditions and addresses: `type`); other lists are replaced, maps merge, null
/// deletes, and `$patch: replace|delete` directives apply to maps and keyed list elements.
fn strategic(target: &mut Value, patch: &Value, path: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = p.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        let here = format!("{path}/{k}");
        let merge_key = match here.as_str() {
            "/status/conditions" | "/status/addresses" => Some("type"),
            _ => None,
        };
        match (v, merge_key) {
            (Value::Null, _) => {
                t.remove(k);
            }
            (Value::Array(items), Some(key)) => {
                let cur = t.entry(k.clone()).or_insert(json!([]));
                let list = cur.as_array_mut().unwrap();
                for item in items {
                    let id = &item[key];
                    let pos = list.iter().position(|e| &e[key] == id);
                    let delete = item["$patch"] == "delete";
                    match (pos, delete) {
                        (Some(i), true) => {
                            list.remove(i);
                        }
                        (None, true) => {}
                        (Some(i), false) => strategic(&mut list[i], item, &here),
                        (None, false) => list.push(item.clone()),
                    }
                }
            }
            _ => strategic(t.entry(k.clone()).or_insert(Value::Null), v, &here),
        }
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn list_nodes(
    State(w): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let sel = q.get("labelSelector").cloned().unwrap_or_default();
    let select: Select = Arc::new(move |w: &World| {
        w.nodes
            .values()
            .filter(|n| labels_match(&sel, &n["metadata"]["labels"]))
            .cloned()
            .collect()
    });
    list_or_watch(&w, "Node", "v1", &q, select)
}

async fn get_node(State(w): State<Shared>, Path(name): Path<String>) -> Response {
    match w.lock().unwrap().nodes.get(&name) {
        Some(n) => axum::Json(n.clone()).into_response(),
        None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
    }
}

async fn patch_node(
    State(w): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let strategic_patch = match ct {
        "application/merge-patch+json" => false,
        "application/strategic-merge-patch+json" => true,
        _ => {
            return status(
                415,
                "UnsupportedMediaType",
                &format!("the fake supports merge and strategic-merge patches, not {ct}"),
            );
        }
    };
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "invalid JSON patch");
    };
    let mut w = w.lock().unwrap();
    if !w.nodes.contains_key(&name) {
        return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
    }
    let versioned = patch["metadata"]["resourceVersion"].is_string();
    if versioned && w.races > 0 {
        w.races -= 1;
        let rv = w.bump();
        w.nodes.get_mut(&name).unwrap()["metadata"]["resourceVersion"] = json!(rv);
    }
    let rv = w.bump();
    let node = w.nodes.get_mut(&name).unwrap();
    if let Some(want) = patch["metadata"]["resourceVersion"].as_str()
        && node["metadata"]["resourceVersion"] != want
    {
        w.conflicts += 1;
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    let before = node["spec"]["taints"].clone();
    if strategic_patch {
        strategic(node, &patch, "");
    } else {
        merge(node, &patch);
    }
    node["metadata"]["resourceVersion"] = json!(rv);
    let out = node.clone();
    if out["spec"]["taints"] != before {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let taints = w.taints(&name);
        w.taint_log.push((at, name, taints));
    }
    axum::Json(out).into_response()
}

async fn list_pods(State(w): State<Shared>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let field = q.get("fieldSelector").cloned().unwrap_or_default();
    let node = field.strip_prefix("spec.nodeName=").map(String::from);
    let select: Select = Arc::new(move |w: &World| {
        w.pods
            .values()
            .filter(|p| {
                node.as_ref()
                    .is_none_or(|n| p["spec"]["nodeName"] == n.as_str())
            })
            .cloned()
            .collect()
    });
    list_or_watch(&w, "Pod", "v1", &q, select)
}

async fn delete_pod(
    State(w): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let opts = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let grace = opts["gracePeriodSeconds"].as_i64();
    let mut w = w.lock().unwrap();
    if let Some(r) = precondition_failed(&mut w, &ns, &name, &opts) {
        return r;
    }
    if w.graceful && grace != Some(0) {
        return match w.pods.get_mut(&(ns.clone(), name.clone())) {
            Some(p) => {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                axum::Json(p.clone()).into_response()
            }
            None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
        };
    }
    match w.pods.remove(&(ns.clone(), name.clone())) {
        Some(p) => {
            w.deleted.push((format!("{ns}/{name}"), grace));
            axum::Json(p).into_response()
        }
        None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

/// Records the request and answers 409 as the apiserver does when the UID precondition names
/// another object than the one under that name.
fn precondition_failed(w: &mut World, ns: &str, name: &str, opts: &Value) -> Option<Response> {
    let want = opts["preconditions"]["uid"].as_str().map(String::from);
    w.delete_requests
        .push((format!("{ns}/{name}"), want.clone()));
    let have = w.pods.get(&(ns.to_string(), name.to_string()))?["metadata"]["uid"]
        .as_str()
        .map(String::from);
    match want {
        Some(u) if Some(&u) != have.as_ref() => Some(status(
            409,
            "Conflict",
            &format!("Precondition failed: UID in precondition: {u}, UID in object meta: {have:?}"),
        )),
        _ => None,
    }
}

async fn evict_pod(
    State(w): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let eviction = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let mut w = w.lock().unwrap();
    if let Some(r) = precondition_failed(&mut w, &ns, &name, &eviction["deleteOptions"]) {
        return r;
    }
    let Some(pod) = w.pods.get(&(ns.clone(), name.clone())).cloned() else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let labels = pod["metadata"]["labels"].clone();
    let matching: Vec<usize> = w
        .pdbs
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            p["metadata"]["namespace"] == ns.as_str()
                && p["spec"]["selector"]["matchLabels"]
                    .as_object()
                    .is_some_and(|m| m.iter().all(|(k, v)| labels[k] == *v))
        })
        .map(|(i, _)| i)
        .collect();
    if matching.iter().any(|&i| {
        w.pdbs[i]["status"]["disruptionsAllowed"]
            .as_i64()
            .unwrap_or(0)
            <= 0
    }) {
        w.evictions_refused += 1;
        return status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        );
    }
    for i in matching {
        let a = w.pdbs[i]["status"]["disruptionsAllowed"]
            .as_i64()
            .unwrap_or(0);
        w.pdbs[i]["status"]["disruptionsAllowed"] = json!(a - 1);
    }
    if w.graceful {
        if let Some(p) = w.pods.get_mut(&(ns.clone(), name.clone())) {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
    } else {
        w.pods.remove(&(ns.clone(), name.clone()));
        w.deleted.push((format!("{ns}/{name}"), None));
    }
    (
        StatusCode::CREATED,
        axum::Json(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        ),
    )
        .into_response()
}

async fn create_event(State(w): State<Shared>, Path(ns): Path<String>, body: Bytes) -> Response {
    let Ok(mut ev) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "invalid Event");
    };
    // As the apiserver: an Event about a cluster-scoped object lives in default or kube-system.
    if ev["involvedObject"]["kind"] == "Node" && !matches!(ns.as_str(), "default" | "kube-system") {
        return status(
            422,
            "Invalid",
            "Event.involvedObject.namespace: Invalid value: \"\": does not match event.namespace",
        );
    }
    let mut w = w.lock().unwrap();
    let n = w.events.len();
    ev["metadata"]["namespace"] = json!(ns);
    ev["metadata"]["name"] = json!(format!(
        "{}{n}",
        ev["metadata"]["generateName"].as_str().unwrap_or("e")
    ));
    w.events.push(ev.clone());
    (StatusCode::CREATED, axum::Json(ev)).into_response()
}

/// events.k8s.io/v1, as kube's recorder writes them: stored as the core/v1 Event the same
/// object reads as (`regarding` is `involvedObject`, `note` is `message`), as the apiserver does.
async fn create_event_v1(State(w): State<Shared>, Path(ns): Path<String>, body: Bytes) -> Response {
    let Ok(mut ev) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "invalid Event");
    };
    if ev["regarding"]["kind"] == "Node" && !matches!(ns.as_str(), "default" | "kube-system") {
        return status(
            422,
            "Invalid",
            "Event.regarding.namespace: Invalid value: \"\": does not match event.namespace",
        );
    }
    ev["involvedObject"] = ev["regarding"].clone();
    ev["message"] = ev["note"].clone();
    ev["metadata"]["namespace"] = json!(ns);
    let mut w = w.lock().unwrap();
    w.events.push(ev.clone());
    (StatusCode::CREATED, axum::Json(ev)).into_response()
}

/// A series update of a recorded Event (merge patch by name).
async fn patch_event_v1(
    State(w): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "invalid patch");
    };
    let mut w = w.lock().unwrap();
    let Some(ev) = w
        .events
        .iter_mut()
        .find(|e| e["metadata"]["name"] == name.as_str())
    else {
        return status(404, "NotFound", "no such Event");
    };
    merge(ev, &patch);
    (StatusCode::OK, axum::Json(ev.clone())).into_response()
}

async fn list_pdbs(State(w): State<Shared>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let select: Select = Arc::new(|w: &World| w.pdbs.clone());
    list_or_watch(&w, "PodDisruptionBudget", "policy/v1", &q, select)
}

/// Generic namespaced objects (Leases, ConfigMaps): get, create and replace.
fn get_object(w: &Shared, resource: &str, ns: String, name: String) -> Response {
    match w
        .lock()
        .unwrap()
        .objects
        .get(&(resource.into(), ns, name.clone()))
    {
        Some(o) => axum::Json(o.clone()).into_response(),
        None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
    }
}

/// Who wrote: a Lease's holder, or the writer a ConfigMap names in `maintd.io/leader`.
fn holder(o: &Value) -> String {
    o["spec"]["holderIdentity"]
        .as_str()
        .or(o["metadata"]["annotations"]["maintd.io/leader"].as_str())
        .unwrap_or("")
        .to_string()
}

fn create_object(w: &Shared, resource: &str, ns: String, body: &[u8]) -> Response {
    let Ok(mut o) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid object");
    };
    let Some(name) = o["metadata"]["name"].as_str().map(String::from) else {
        return status(422, "Invalid", "metadata.name: Required value");
    };
    let mut w = w.lock().unwrap();
    let key = (resource.to_string(), ns.clone(), name.clone());
    if w.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("{resource} \"{name}\" already exists"),
        );
    }
    let rv = w.bump();
    o["metadata"]["resourceVersion"] = json!(rv);
    o["metadata"]["namespace"] = json!(ns);
    w.writes.push((resource.into(), name, holder(&o)));
    w.objects.insert(key, o.clone());
    (StatusCode::CREATED, axum::Json(o)).into_response()
}

fn replace_object(w: &Shared, resource: &str, ns: String, name: String, body: &[u8]) -> Response {
    let Ok(mut o) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid object");
    };
    let mut w = w.lock().unwrap();
    let key = (resource.to_string(), ns.clone(), name.clone());
    let Some(cur) = w.objects.get(&key) else {
        return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
    };
    // An update with a resourceVersion is conditional on it; without one it is unconditional.
    if let Some(want) = o["metadata"]["resourceVersion"].as_str()
        && cur["metadata"]["resourceVersion"] != want
    {
        w.conflicts += 1;
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    let rv = w.bump();
    o["metadata"]["resourceVersion"] = json!(rv);
    o["metadata"]["namespace"] = json!(ns);
    w.writes.push((resource.into(), name, holder(&o)));
    w.objects.insert(key, o.clone());
    axum::Json(o).into_response()
}

/// A namespaced list or watch of generic objects, by `metadata.name=` field selector if given.
fn list_objects(
    w: &Shared,
    resource: &'static str,
    kind: &'static str,
    api_version: &'static str,
    ns: String,
    q: BTreeMap<String, String>,
) -> Response {
    let name = q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(String::from);
    let select: Select = Arc::new(move |w: &World| {
        w.objects
            .iter()
            .filter(|((r, n, o), _)| {
                r == resource && *n == ns && name.as_ref().is_none_or(|x| x == o)
            })
            .map(|(_, v)| v.clone())
            .collect()
    });
    list_or_watch(w, kind, api_version, &q, select)
}

fn object_routes(
    router: Router<Shared>,
    base: &'static str,
    resource: &'static str,
    kind: &'static str,
) -> Router<Shared> {
    let api_version = base
        .trim_start_matches("/apis/")
        .trim_start_matches("/api/");
    router
        .route(
            &format!("{base}/namespaces/{{ns}}/{resource}"),
            post(
                move |State(w): State<Shared>, Path(ns): Path<String>, body: Bytes| async move {
                    create_object(&w, resource, ns, &body)
                },
            )
            .get(
                move |State(w): State<Shared>,
                      Path(ns): Path<String>,
                      Query(q): Query<BTreeMap<String, String>>| async move {
                    list_objects(&w, resource, kind, api_version, ns, q)
                },
            ),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/{resource}/{{name}}"),
            get(
                move |State(w): State<Shared>, Path((ns, name)): Path<(String, String)>| async move {
                    get_object(&w, resource, ns, name)
                },
            )
            .put(
                move |State(w): State<Shared>,
                      Path((ns, name)): Path<(String, String)>,
                      body: Bytes| async move {
                    replace_object(&w, resource, ns, name, &body)
                },
            ),
        )
}

/// Starts the fake on a free loopback port; returns its URL and the shared world.
pub async fn start() -> (String, Shared) {
    let world: Shared = Arc::default();
    let app = Router::new();
    let app = object_routes(app, "/apis/coordination.k8s.io/v1", "leases", "Lease");
    let app = object_routes(app, "/api/v1", "configmaps", "ConfigMap");
    let app =
        app.route("/apis/policy/v1/poddisruptionbudgets", get(list_pdbs))
            .route("/api/v1/nodes", get(list_nodes))
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route("/api/v1/pods", get(list_pods))
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                axum::routing::delete(delete_pod),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}/eviction",
                post(evict_pod),
            )
            .route("/api/v1/namespaces/{ns}/events", post(create_event))
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                post(create_event_v1),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events/{name}",
                axum::routing::patch(patch_event_v1),
            )
            .fallback(|uri: axum::http::Uri| async move {
                status(404, "NotFound", &format!("the fake does not serve {uri}"))
            })
            .layer(axum::middleware::from_fn_with_state(
                world.clone(),
                |State(w): State<Shared>,
                 req: axum::extract::Request,
                 next: axum::middleware::Next| async move {
                    {
                        let mut g = w.lock().unwrap();
                        if g.down {
                            return status(503, "ServiceUnavailable", "the apiserver is down");
                        }
                        let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
                        let verb = match (req.method().as_str(), watch) {
                            (_, true) => "WATCH".to_string(),
                            (m, false) => m.to_string(),
                        };
                        g.requests.push((verb, req.uri().path().to_string()));
                    }
                    next.run(req).await
                },
            ))
            .with_state(world.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, world)
}
