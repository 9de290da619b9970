//! Scenarios of a changed fence plan: a flow runs to its end by the plan it started with,
//! across a restart of the daemon, and the next flow takes the new one.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use maintd_core::fencing::machine::{FenceStatus, Step};

const MIN: Duration = Duration::from_secs(60);

/// The configuration as an operator edits it: power-management without retries, its method
/// renamed (so a call says which plan it ran by).
fn edited(p: &mut FencePlan) {
    if let Some(s) = p.power_management.as_mut() {
        s.retries = 0;
        for m in &mut s.methods {
            m.name = "switch-2".into();
        }
    }
}

fn power_calls(f: &Flow) -> Vec<&str> {
    f.calls
        .iter()
        .filter(|c| c.step == Step::PowerManagement)
        .map(|c| c.method.as_str())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_flow_finishes_on_the_plan_it_started_with_across_a_restart_and_the_next_takes_the_new() {
    let mut sim = Sim::start(SimOptions {
        nodes: 10,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        power_retries: 3,
        ..SimOptions::default()
    });
    sim.run_for(Duration::from_secs(10)).await;
    // node2's BMC refuses the first two power-offs: its plan allows three retries.
    sim.agents.fail_next("off node2", 2);
    sim.collectors.silence("node2");
    let f = sim
        .until("a failed power-off", 2 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node2" && f.retries >= 1)
        })
        .await;
    let recorded = f.plan.clone().expect("the flow records its plan");
    assert_eq!(
        recorded.stage(Step::PowerManagement).map(|s| s.retries),
        Some(3)
    );
    // The operator edits the plan (no retries any more) and the daemon restarts mid-flow.
    sim.options.edit_plans = Some(edited);
    sim.restart().await;
    let f = sim
        .until("node2 fenced", 3 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node2" && (f.fenced() || f.status == FenceStatus::Error))
        })
        .await;
    assert!(
        f.fenced() && f.restarts == 0,
        "the third attempt, which the old plan allows, fenced it: {:?}",
        f.history
    );
    let calls = power_calls(&f);
    assert!(calls.len() >= 3, "{calls:?}");
    assert!(
        calls.iter().all(|m| *m == "switch"),
        "every call ran by the plan the flow started with: {calls:?}"
    );
    assert_eq!(f.plan, Some(recorded), "the record stays as it was");
    // The next flow takes the new plan.
    sim.agents.fail_next("off node4", 1);
    sim.collectors.silence("node4");
    let g = sim
        .until("node4's power-off failed", 10 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node4" && !power_calls(f).is_empty())
        })
        .await;
    assert_eq!(power_calls(&g)[0], "switch-2");
    assert_eq!(
        g.plan
            .as_ref()
            .and_then(|p| p.stage(Step::PowerManagement))
            .map(|s| s.retries),
        Some(0)
    );
    sim.stop().await;
}

/// node `n`'s ConfigMap in the single-map form: power-management by the method `method`, an
/// `off` of the simulated switch with the password of Secret `bmc/pw`.
fn node_map(maps: &SimMaps, n: &str, method: &str) {
    let name = format!("fence-config-{n}");
    maps.put(
        &name,
        "config.properties",
        &format!("node_name={n}\npower_management={method}\n"),
    );
    maps.put(
        &name,
        &format!("fence-method-{method}"),
        &format!("template=fence-method-template-sim\nnode={n}\naction=off\n"),
    );
}

#[tokio::test(start_paused = true)]
async fn a_configmap_changed_mid_flow_and_a_rotated_secret_reach_only_what_they_should() {
    let maps = Arc::new(SimMaps::default());
    maps.put(
        "fence-method-template-sim",
        "template.properties",
        "name=sim\nagent_name=fence_sim\npassword_secret=bmc/pw\n",
    );
    maps.set_secret("bmc", "pw", "old-pw");
    let names: Vec<String> = (0..10).map(node_name).collect();
    for n in &names {
        node_map(&maps, n, "sw");
    }
    let mut sim = Sim::start(SimOptions {
        nodes: 10,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        configmaps: Some(maps.clone()),
        ..SimOptions::default()
    });
    sim.run_for(Duration::from_secs(10)).await;
    // node2's BMC refuses the first power-off; the stage allows two retries.
    sim.agents.fail_next("off node2", 1);
    sim.collectors.silence("node2");
    sim.until("a failed power-off", 2 * MIN, |s| {
        s.flows()
            .into_iter()
            .find(|f| f.node == "node2" && f.retries >= 1)
    })
    .await;
    // The operator renames node2's method and rotates the BMC password; the daemon restarts.
    maps.put("fence-config-node2", "fence-method-sw", "");
    node_map(&maps, "node2", "sw2");
    maps.set_secret("bmc", "pw", "new-pw");
    sim.restart().await;
    let f = sim
        .until("node2 fenced", 2 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node2" && (f.fenced() || f.status == FenceStatus::Error))
        })
        .await;
    assert!(f.fenced(), "{:?}", f.history);
    let calls = power_calls(&f);
    assert!(
        calls.iter().all(|m| m.starts_with("sw#")),
        "the flow ran by the plan it started with: {calls:?}"
    );
    let passwords = sim.agents.passwords.lock().unwrap().clone();
    assert_eq!(
        passwords.first(),
        Some(&Some("old-pw".to_string())),
        "{passwords:?}"
    );
    assert_eq!(
        passwords.last(),
        Some(&Some("new-pw".to_string())),
        "the resumed flow's calls take the password in force: {passwords:?}"
    );
    let json = serde_json::to_string(&f).unwrap();
    assert!(
        !json.contains("old-pw") && !json.contains("new-pw"),
        "{json}"
    );
    // node4's flow takes the ConfigMaps as they are now: the rename applied to node2 only.
    node_map(&maps, "node4", "sw4");
    sim.run_for(Duration::from_secs(3)).await;
    sim.collectors.silence("node4");
    let g = sim
        .until("node4's power-off", 10 * MIN, |s| {
            s.flows()
                .into_iter()
                .find(|f| f.node == "node4" && !power_calls(f).is_empty())
        })
        .await;
    assert!(
        power_calls(&g)[0].starts_with("sw4#"),
        "{:?}",
        power_calls(&g)
    );
    sim.stop().await;
}
