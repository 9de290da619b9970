//! Maintenance against a real daemon, a real fence agent and an IPMI simulator: the
//! hardware swap. node2 reports `evacuate`, is evacuated and offlined and waits for its
//! acknowledgement; a technician powers it down through its BMC to swap a disk. maintd calls
//! no agent and powers nothing on while the repair waits and while an operator's maintenance
//! stands, and fences the node in the normal way once both have ended and it is still silent.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::sims::{self, Ipmi, PoweredNode};
use common::*;
use serde_json::Value;

/// What a technician does at the BMC: the real agent, outside maintd.
fn at_the_bmc(ipmi: &Ipmi, action: &str) {
    let out = Command::new("fence_ipmilan")
        .args([
            "--ip=127.0.0.1",
            &format!("--ipport={}", ipmi.port),
            &format!("--username={}", ipmi.user),
            &format!("--password={}", ipmi.password),
            "--lanplus",
            "--cipher=3",
            &format!("--action={action}"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

async fn fences(c: &Cluster) -> Vec<Value> {
    c.get("/1/fences")
        .await
        .1
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn in_maintenance(c: &Cluster) -> Vec<(String, String)> {
    let (_, all) = c.get("/1/maintenance").await;
    all.as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["node"].as_str().unwrap().to_string(),
                m["source"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Watches for `secs` that node2 stays off, with no fence flow and no agent call.
async fn stays_off_untouched(c: &Cluster, ipmi: &Ipmi, secs: u64) {
    for _ in 0..secs * 5 {
        assert!(fences(c).await.is_empty(), "a fence flow started");
        assert!(!ipmi.powered_on(), "node2 was powered on");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_being_repaired_by_hand_is_never_fenced_or_powered_on() {
    if !sims::available() {
        return;
    }
    let mut c = Cluster::new(2);
    let ipmi = Ipmi::start(c.dir.path(), "node2");
    c.extra_daemon_toml = sims::ipmi_fencing(&c, &ipmi, "node2", false);
    c.start().await;
    let _node = PoweredNode::start(&mut c, 1, &ipmi);
    c.wait_collectors_ready().await;

    // The repair: evacuated, offlined, tagged, and waiting for its acknowledgement.
    c.set_verdict("node2", r#"{"status":"evacuate","details":"disk"}"#);
    let tag = wait_for("node2's repairready tag", || async {
        let (_, tags) = c.get("/1/tags?node=node2").await;
        tags["node2"]
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .find(|t| t.starts_with("maintd:repairready:"))
            .map(String::from)
    })
    .await;
    assert_eq!(
        in_maintenance(&c).await,
        [("node2".into(), "repair".into())]
    );

    // The technician powers it down at its BMC: its collector goes silent, and stays so far
    // past the grace. No flow, no agent call, no power-on.
    at_the_bmc(&ipmi, "off");
    stays_off_untouched(&c, &ipmi, 6).await;
    assert_eq!(c.node("node2").await["reachable"], false);

    // An operator's maintenance holds it too once the repair is acknowledged; an operator's
    // fence request waits.
    let out = c.cli(&[
        "maintenance",
        "start",
        "node2",
        "--reason",
        "disk swap",
        "--until",
        "1h",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = c.cli(&["tags", "remove", "node2", &tag]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        in_maintenance(&c).await,
        [("node2".into(), "operator".into())]
    );
    stays_off_untouched(&c, &ipmi, 4).await;
    let shown = c.node("node2").await["maintenance"].clone();
    assert!(shown.as_str().unwrap().contains("disk swap"), "{shown}");
    let out = c.cli(&["nodes"]);
    let nodes = String::from_utf8_lossy(&out.stdout);
    assert!(
        nodes.contains("MAINTENANCE (in maintenance by cluster-key (disk swap))"),
        "{nodes}"
    );
    let out = c.cli(&["maintenance", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("node2  operator by cluster-key: disk swap"),
        "{listed}"
    );
    // Audited, with its operator.
    let (_, audit) = c.get("/1/audit").await;
    assert!(
        audit.to_string().contains("/1/nodes/node2/maintenance"),
        "{audit}"
    );

    // Maintenance ends with the node still off: it is fenced in the normal way (its verified
    // power-off, then the release).
    let out = c.cli(&["maintenance", "stop", "node2"]);
    assert!(out.status.success(), "{out:?}");
    assert!(in_maintenance(&c).await.is_empty());
    let f = c
        .wait_flow("node2's fence once out of maintenance", |f| {
            f["node"] == "node2" && f["released"] == true
        })
        .await;
    assert!(f.to_string().contains("collector silent"), "{f}");
    c.kill_daemon();
}
