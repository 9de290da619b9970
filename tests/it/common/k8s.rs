//! A real Kubernetes control plane on loopback for the tests: PKI and kubeconfigs made with
//! openssl, etcd (Debian) plus kube-apiserver, kube-controller-manager and kube-scheduler
//! v1.36.2 (unpacked by scripts/test under target/k8s), on free ports. Nodes are simulated:
//! their Leases and Ready heartbeats come from the test, and a small kubelet stand-in marks pods
//! on live nodes Running/Ready, runs Jobs' pods (`jobpods`) and completes graceful deletions. A dropped `ControlPlane`
//! stops every process it started.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Cluster, Proc, free_port};

/// The unpacked Kubernetes binaries.
pub fn bin_dir() -> PathBuf {
    super::sims::repo("target/k8s")
}

/// Whether etcd and the Kubernetes binaries are installed. When not, the tests that need them
/// skip with a notice, unless MAINTD_REQUIRE_K8S=1 (scripts/test), which makes it a failure.
pub fn available() -> bool {
    let ok = Command::new("etcd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        && [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
        ]
        .iter()
        .all(|b| bin_dir().join(b).exists());
    if !ok {
        assert!(
            std::env::var("MAINTD_REQUIRE_K8S").as_deref() != Ok("1"),
            "etcd or the Kubernetes binaries are missing: run scripts/test"
        );
        eprintln!("skipped: etcd or target/k8s missing (scripts/test installs them)");
    }
    ok
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

fn spawn(cmd: &mut Command, log: &Path) -> Proc {
    let f = std::fs::File::create(log).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    Proc {
        child,
        log: log.into(),
    }
}

/// Nodes whose heartbeats the test keeps alive (the others are dead as the node lifecycle
/// controller sees them).
#[derive(Clone, Default)]
pub struct Heartbeats(Arc<Mutex<std::collections::BTreeSet<String>>>);

impl Heartbeats {
    pub fn alive(&self, node: &str, on: bool) {
        let mut s = self.0.lock().unwrap();
        if on {
            s.insert(node.into());
        } else {
            s.remove(node);
        }
    }

    fn live(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().cloned().collect()
    }
}

pub struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub url: String,
    /// cluster-admin (a client certificate in system:masters).
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
    pub heartbeats: Heartbeats,
    /// With `start_audited`: the apiserver's audit log (JSON lines, one per request of `user`).
    pub audit_log: Option<PathBuf>,
    // Dropped in reverse order of start: scheduler, controller-manager, apiserver, etcd.
    procs: Vec<Proc>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
    }
}

impl ControlPlane {
    /// Starts etcd, the apiserver, the controller-manager (node monitor grace `grace`) and the
    /// scheduler, and waits until the apiserver is ready and the default namespace exists.
    pub async fn start(node_monitor_grace: Duration) -> ControlPlane {
        ControlPlane::start_inner(node_monitor_grace, None).await
    }

    /// As `start`, with an audit log of every request `user` sends (one line per request, at
    /// receipt, with its verb and resource), for counting a client's requests.
    pub async fn start_audited(node_monitor_grace: Duration, user: &str) -> ControlPlane {
        ControlPlane::start_inner(node_monitor_grace, Some(user)).await
    }

    async fn start_inner(node_monitor_grace: Duration, audit_user: Option<&str>) -> ControlPlane {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        super::certs::ca(
            d,
            "ca",
            "ca.crt",
            &["-newkey", "rsa:2048"],
            "/CN=maintd-test-ca",
        );
        // Version-3 certificates with their usages: rustls refuses version-1 ones.
        std::fs::write(
            d.join("apiserver.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n",
        )
        .unwrap();
        std::fs::write(
            d.join("admin.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        for (name, subj) in [
            ("apiserver", "/CN=kube-apiserver"),
            ("admin", "/O=system:masters/CN=admin"),
        ] {
            super::certs::issue(d, "ca.crt", "ca.key", name, &["-newkey", "rsa:2048"], subj);
        }
        super::certs::openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        super::certs::openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);

        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let url = format!("https://127.0.0.1:{api_port}");
        let p = |f: &str| d.join(f).display().to_string();
        let kubeconfig = d.join("admin.kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {{certificate-authority: {}, server: \"{url}\"}}\n  name: t\nusers:\n- name: admin\n  user: {{client-certificate: {}, client-key: {}}}\ncontexts:\n- context: {{cluster: t, user: admin}}\n  name: t\ncurrent-context: t\n",
                p("ca.crt"),
                p("admin.crt"),
                p("admin.key")
            ),
        )
        .unwrap();
        let data = d.join("etcd");
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let mut audit = vec![];
        let audit_log = audit_user.map(|user| {
            let policy = d.join("audit-policy.yaml");
            std::fs::write(
                &policy,
                format!(
                    "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [ResponseStarted, ResponseComplete, Panic]\nrules:\n- level: Metadata\n  users: [\"{user}\"]\n- level: None\n"
                ),
            )
            .unwrap();
            let log = d.join("audit.log");
            audit.push(format!("--audit-policy-file={}", policy.display()));
            audit.push(format!("--audit-log-path={}", log.display()));
            audit.push("--audit-log-format=json".into());
            audit.push("--audit-log-mode=blocking".into());
            log
        });
        let mut procs = vec![spawn(
            Command::new("etcd").args([
                "--data-dir",
                &data.display().to_string(),
                "--name",
                "t",
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("t=http://127.0.0.1:{peer_port}"),
            ]),
            &d.join("etcd.log"),
        )];
        procs.push(spawn(
            Command::new(bin_dir().join("kube-apiserver"))
                .args([
                    format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                    "--bind-address=127.0.0.1".into(),
                    "--advertise-address=127.0.0.1".into(),
                    format!("--secure-port={api_port}"),
                    format!("--tls-cert-file={}", p("apiserver.crt")),
                    format!("--tls-private-key-file={}", p("apiserver.key")),
                    format!("--client-ca-file={}", p("ca.crt")),
                    "--service-account-issuer=https://kubernetes.default.svc".into(),
                    format!("--service-account-key-file={}", p("sa.pub")),
                    format!("--service-account-signing-key-file={}", p("sa.key")),
                    "--api-audiences=https://kubernetes.default.svc".into(),
                    "--service-cluster-ip-range=10.96.0.0/16".into(),
                    "--authorization-mode=Node,RBAC".into(),
                    "--endpoint-reconciler-type=none".into(),
                    // As kubeadm and every distribution set it: the collector DaemonSet is privileged.
                    "--allow-privileged=true".into(),
                ])
                .args(&audit),
            &d.join("apiserver.log"),
        ));
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = client
                .request_text(axum::http::Request::get("/readyz").body(vec![]).unwrap())
                .await
                .is_ok_and(|t| t.trim() == "ok");
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready in 120 s:\n{}",
                std::fs::read_to_string(d.join("apiserver.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let kc = kubeconfig.display().to_string();
        procs.push(spawn(
            Command::new(bin_dir().join("kube-controller-manager")).args([
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--controllers=*".into(),
                "--leader-elect=false".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--allocate-node-cidrs=false".into(),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--node-monitor-grace-period={}s",
                    node_monitor_grace.as_secs().max(1)
                ),
            ]),
            &d.join("controller-manager.log"),
        ));
        procs.push(spawn(
            Command::new(bin_dir().join("kube-scheduler")).args([
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--leader-elect=false".into(),
            ]),
            &d.join("scheduler.log"),
        ));
        let mut cp = ControlPlane {
            dir,
            url,
            kubeconfig,
            client,
            heartbeats: Heartbeats::default(),
            audit_log,
            procs,
            tasks: vec![],
        };
        // The controller-manager's service-account controller creates `default` accounts;
        // waiting for one means the controllers run.
        cp.wait_for("the controller-manager", |cp| {
            cp.kubectl(&["get", "serviceaccount", "default", "-n", "default"])
                .status
                .success()
        })
        .await;
        // maintd's CRD, as deploy/ ships it: NodeFences are the fence flows' record.
        let crd = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd.yaml");
        cp.kubectl_ok(&["apply", "-f", crd]);
        cp.wait_for("the NodeFence CRD", |cp| {
            cp.kubectl(&["get", "nodefences"]).status.success()
        })
        .await;
        cp.tasks.push(tokio::spawn(heartbeat_loop(
            cp.client.clone(),
            cp.heartbeats.clone(),
        )));
        cp.tasks.push(tokio::spawn(kubelet_loop(
            cp.client.clone(),
            cp.heartbeats.clone(),
        )));
        cp
    }

    /// The audit log's entries (`start_audited`) received since `since` (Unix ns).
    pub fn audited(&self, since: i64) -> Vec<serde_json::Value> {
        let Some(log) = &self.audit_log else {
            return vec![];
        };
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["requestReceivedTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .is_some_and(|t| t.as_nanosecond() as i64 >= since)
            })
            .collect()
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap()
    }

    /// `kubectl` that must succeed; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn wait_for(&self, what: &str, mut ok: impl FnMut(&ControlPlane) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ok(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A simulated node: capacity, labels and annotations, Ready, kept alive by heartbeats.
    pub async fn add_node(
        &self,
        name: &str,
        labels: serde_json::Value,
        annotations: serde_json::Value,
    ) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        self.heartbeats.alive(name, true);
        heartbeat(&self.client, name).await;
    }

    /// A kubeconfig for `sa` in `ns`, authenticated by a token from `kubectl create token`.
    pub fn service_account_kubeconfig(&self, ns: &str, sa: &str) -> PathBuf {
        let token = self.kubectl_ok(&["create", "token", sa, "-n", ns, "--duration=2h"]);
        let path = self.dir.path().join(format!("{ns}-{sa}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {{certificate-authority: {}, server: \"{}\"}}\n  name: t\nusers:\n- name: {sa}\n  user: {{token: \"{}\"}}\ncontexts:\n- context: {{cluster: t, user: {sa}}}\n  name: t\ncurrent-context: t\n",
                self.dir.path().join("ca.crt").display(),
                self.url,
                token.trim()
            ),
        )
        .unwrap();
        path
    }
}

impl ControlPlane {
    /// Simulated nodes for maintd to manage, each pointing at the collector of the same index
    /// in `c`.
    pub async fn add_managed_nodes(&self, c: &Cluster, nodes: &[String]) {
        for (i, n) in nodes.iter().enumerate() {
            self.add_node(
                n,
                json!({"maintd.io/managed": "true"}),
                json!({"maintd.io/collector": format!("{}:{}", c.node_hosts[i], c.ports[i])}),
            )
            .await;
        }
    }

    /// Namespace `ns` with a one-replica StatefulSet `db` (30 s termination grace, 100m CPU),
    /// and the API of its pods.
    pub fn statefulset(&self, ns: &str) -> Api<Pod> {
        self.kubectl_ok(&["create", "namespace", ns]);
        let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": ns},
            "spec": {"serviceName": "db", "replicas": 1,
                "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                    "spec": {"terminationGracePeriodSeconds": 30, "containers": [{"name": "db",
                        "image": "db:1", "resources": {"requests": {"cpu": "100m"}}}]}}}});
        let file = self.dir.path().join(format!("sts-{ns}.json"));
        std::fs::write(&file, sts.to_string()).unwrap();
        self.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
        Api::namespaced(self.client.clone(), ns)
    }
}

pub fn pod_running(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Running")
}

/// Waits until pod `name` runs, and returns it.
pub async fn running_pod(pods: &Api<Pod>, name: &str) -> Pod {
    super::wait_for("the pod running", || async {
        let p = pods.get_opt(name).await.ok()??;
        pod_running(&p).then_some(p)
    })
    .await
}

/// Every change to `pods` from now on.
pub async fn watch_pods(
    pods: &Api<Pod>,
) -> futures::stream::BoxStream<'static, Result<kube::api::WatchEvent<Pod>, kube::Error>> {
    use futures::StreamExt;
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    pods.watch(&kube::api::WatchParams::default().timeout(290), &rv)
        .await
        .unwrap()
        .boxed()
}

/// What a kubelet reports: a Ready condition with a fresh heartbeat, capacity, and a renewed
/// Lease in kube-node-lease.
async fn heartbeat(client: &kube::Client, node: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated", "lastHeartbeatTime": now}],
    }});
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&status))
        .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
            "renewTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
    });
    let _ = leases
        .patch(
            node,
            &PatchParams::apply("maintd-test-kubelet").force(),
            &Patch::Apply(&lease),
        )
        .await;
}

async fn heartbeat_loop(client: kube::Client, hb: Heartbeats) {
    loop {
        for n in hb.live() {
            heartbeat(&client, &n).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Label of a pod whose containers take this many seconds to stop once it is deleted (a real
/// application's shutdown), capped by its grace period as a kubelet would.
pub const EXIT_AFTER: &str = "maintd-test/exit-after";

fn termination_done(
    p: &Pod,
    deleted: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> bool {
    let Some(secs) = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(EXIT_AFTER))
        .and_then(|v| v.parse::<i64>().ok())
    else {
        return true;
    };
    // deletionTimestamp is the delete plus the grace period.
    let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
    let asked = deleted.0.as_second() - grace;
    k8s_openapi::jiff::Timestamp::now().as_second() >= asked + secs.min(grace)
}

/// The kubelet stand-in: pods bound to live nodes become Running/Ready, and their graceful
/// deletions complete (after `EXIT_AFTER` seconds if the pod says so) (a dead node's pods stay as they are, as a dead kubelet leaves them).
async fn kubelet_loop(client: kube::Client, hb: Heartbeats) {
    let pods: Api<Pod> = Api::all(client.clone());
    let started = super::jobpods::Started::default();
    loop {
        let live = hb.live();
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                    continue;
                };
                if !live.contains(&node) {
                    continue;
                }
                let (Some(ns), Some(name)) =
                    (p.metadata.namespace.clone(), p.metadata.name.clone())
                else {
                    continue;
                };
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                if let Some(deleted) = &p.metadata.deletion_timestamp {
                    if !termination_done(&p, deleted) {
                        continue;
                    }
                    let dp = DeleteParams {
                        preconditions: Some(kube::api::Preconditions {
                            uid: p.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default().grace_period(0)
                    };
                    let _ = api.delete(&name, &dp).await;
                    continue;
                }
                if super::jobpods::runs_to_completion(&p) {
                    super::jobpods::start(&client, &p, &started).await;
                    continue;
                }
                let running = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|ph| ph == "Running");
                if !running {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let status = json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
                        "startTime": now}});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
