//! The kubelet stand-in's part for run-to-completion pods (Jobs' pods): a pod bound to a live
//! node runs its container's command as a process on this host (the image is not pulled: the
//! host has what the tests' images would hold, e.g. the fence agents), with the pod's
//! environment, its Secret volumes written to a private directory and the paths that name them
//! (and the termination-message path) pointed there. Its exit becomes the pod's phase and its
//! container's terminated state, with the termination message, as a kubelet reports them; the
//! Job controller decides the rest. A node labelled `NO_BMC_NETWORK` stands for one that cannot
//! reach the BMC network: its pods fail as an agent there would, without running.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The label of a node whose pods cannot reach the BMC network.
pub const NO_BMC_NETWORK: &str = "maintd-test/no-bmc-network";

/// Pods already started, by uid.
#[derive(Clone, Default)]
pub struct Started(Arc<Mutex<BTreeSet<String>>>);

/// Whether the pod is one that runs to completion (a Job's).
pub fn runs_to_completion(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .is_some_and(|r| r == "Never" || r == "OnFailure")
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Starts the pod if it has not been: once every Secret it mounts exists (a kubelet waits for
/// them too).
pub async fn start(client: &kube::Client, p: &Pod, started: &Started) {
    let (Some(uid), Some(ns), Some(name)) = (
        p.metadata.uid.clone(),
        p.metadata.namespace.clone(),
        p.metadata.name.clone(),
    ) else {
        return;
    };
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) || started.0.lock().unwrap().contains(&uid) {
        return;
    }
    let spec = p.spec.clone().unwrap_or_default();
    let Some(c) = spec.containers.first().cloned() else {
        return;
    };
    // Secret volumes, by name.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut volumes: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            match secrets.get_opt(&s).await {
                Ok(Some(sec)) => {
                    let data = sec
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect();
                    volumes.insert(v.name.clone(), data);
                }
                _ => return,
            }
        }
    }
    started.0.lock().unwrap().insert(uid);
    let node = spec.node_name.clone().unwrap_or_default();
    let cut_off = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get_opt(&node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.labels)
        .is_some_and(|l| l.contains_key(NO_BMC_NETWORK));
    let client = client.clone();
    tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(client, &ns);
        let started_at = now();
        let running = json!({"status": {"phase": "Running", "startTime": started_at}});
        let _ = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&running))
            .await;
        let root = tempfile::tempdir().unwrap();
        let mut mounts: Vec<(String, std::path::PathBuf)> = Vec::new();
        for m in c.volume_mounts.iter().flatten() {
            if let Some(files) = volumes.get(&m.name) {
                let dir = root.path().join(m.mount_path.trim_start_matches('/'));
                std::fs::create_dir_all(&dir).unwrap();
                for (k, v) in files {
                    std::fs::write(dir.join(k), v).unwrap();
                }
                mounts.push((m.mount_path.clone(), dir));
            }
        }
        let term_path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let term_file = root.path().join("termination-log");
        let here = |v: &str| -> String {
            if v == term_path {
                return term_file.to_string_lossy().into_owned();
            }
            for (path, dir) in &mounts {
                if let Some(rest) = v.strip_prefix(path.as_str()) {
                    return format!("{}{rest}", dir.display());
                }
            }
            v.to_string()
        };
        let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
        argv.extend(c.args.clone().unwrap_or_default());
        let mut cmd = tokio::process::Command::new(argv.first().cloned().unwrap_or_default());
        cmd.args(&argv[1..]).env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        for e in c.env.iter().flatten() {
            if let Some(v) = &e.value {
                cmd.env(&e.name, here(v));
            }
        }
        let out = if cut_off {
            Err(std::io::Error::other("connect: network is unreachable"))
        } else {
            cmd.output().await
        };
        let (code, output) = match out {
            Ok(o) => (
                o.status.code().unwrap_or(137),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            ),
            Err(e) if cut_off => (1, e.to_string()),
            Err(e) => (128, format!("cannot start {argv:?}: {e}")),
        };
        let mut message = std::fs::read_to_string(&term_file).unwrap_or_default();
        let fallback = c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        if message.is_empty() && fallback && code != 0 {
            message = output
                .chars()
                .rev()
                .take(2048)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
        }
        let done = json!({"status": {
            "phase": if code == 0 { "Succeeded" } else { "Failed" },
            "containerStatuses": [{
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": false, "restartCount": 0, "started": false,
                "state": {"terminated": {
                    "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": message, "startedAt": started_at, "finishedAt": now()}}}]}});
        let _ = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&done))
            .await;
    });
}
