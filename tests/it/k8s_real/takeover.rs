//! A takeover mid-call on the real control plane: the daemon is killed (SIGKILL) while its
//! power-off call runs. The call was written to the NodeFence before it was made, so the next
//! daemon's record keeps it (pending, no answer) beside its own calls, and the return's note
//! counts from that first power-off.

use super::*;

/// The stand-in power agent, its `off` taking 4 s.
fn slow_off_agent() -> String {
    format!(
        "in=$(cat)\ncase \"$in\" in *action=off*) sleep 4 ;; esac\nprintf '%s\\n' \"$in\" | {{\n{POWER_AGENT}\n}}"
    )
}

pub async fn a_takeover_mid_call_keeps_the_earlier_daemons_power_off_in_the_record(
    cp: &ControlPlane,
) {
    let (mut c, nodes) = managed_cluster(cp, "tk").await;
    stub_fenced_admin_daemon_with(cp, &mut c, &nodes, ("fence_slow", &slow_off_agent()));
    start_all(&mut c).await;
    let victim = nodes[0].clone();
    heard_by_its_peers(&c, &victim).await;
    hang(cp, &c, 0);
    // The power-off call is on record before its answer: the daemon dies mid-call.
    let pending = c
        .wait_flow("the pending power-off", |f| {
            f["node"] == victim.as_str()
                && f["calls"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|x| x["action"] == "off" && x["pending"] == true)
                })
        })
        .await;
    c.kill_daemon();
    let first_off = pending["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["action"] == "off")
        .unwrap()["at"]
        .as_i64()
        .unwrap();
    c.start_kube_daemon();
    c.wait_api().await;
    let f = c
        .wait_flow("the release by the next daemon", |f| {
            f["node"] == victim.as_str() && f["released"] == true
        })
        .await;
    let offs: Vec<&serde_json::Value> = f["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["action"] == "off")
        .collect();
    assert_eq!(offs.len(), 2, "the earlier daemon's and its own: {f:#}");
    assert_eq!(
        (offs[0]["at"].as_i64(), &offs[0]["pending"]),
        (Some(first_off), &json!(true)),
        "{f:#}"
    );
    assert_eq!(offs[1]["ok"], true, "{f:#}");
    assert!(offs[1]["pending"].is_null(), "{f:#}");
    // The node boots again: its return counts from the first power-off call, not the second.
    boot_again(cp, &mut c, 0);
    wait_recovered(cp, &c, &victim).await;
    let id = f["id"].as_str().unwrap();
    let (_, done) = c.get(&format!("/1/fences/{id}")).await;
    let note = done["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["note"].as_str())
        .find(|n| n.starts_with("new boot id"))
        .unwrap_or_else(|| panic!("{done:#}"))
        .to_string();
    let secs: f64 = note
        .split("booted ")
        .nth(1)
        .and_then(|r| r.split(" s ").next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{note}"));
    assert!(secs >= 4.0, "counted from the second power-off: {note}");
    remove_nodes(cp, &mut c, &nodes);
}
