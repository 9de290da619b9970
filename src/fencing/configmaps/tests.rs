//! The ConfigMap formats operators write, parsed into plans, and every problem named where it is.

use super::*;

fn maps(items: &[(&str, &[(&str, &str)])]) -> Maps {
    items
        .iter()
        .map(|(n, kv)| {
            (
                n.to_string(),
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

fn secrets() -> BTreeMap<(String, String), String> {
    BTreeMap::from([(("pdu".into(), "password".into()), "eaton-pw".into())])
}

/// A two-device cluster's configuration (a Brocade switch and an Eaton PDU), with its passwords as Secret
/// references: isolation by the switch, power off by the PDU (its `on` method becomes the
/// recovery's), per-node plugs over the templates' defaults.
fn two_devices() -> Maps {
    maps(&[
        (
            "fence-method-template-fc-switch-brocade",
            &[(
                "template.properties",
                "name=fc_switch_brocade\nagent_name=fence_brocade\nipaddr=192.168.1.2\npassword_secret=pdu/password\nusername=brocade_admin\n",
            )],
        ),
        (
            "fence-method-template-eaton-pdu",
            &[(
                "template.properties",
                "name=eaton_pdu\nagent_name=fence_eaton_snmp\nmust_sucess=yes\nipaddr=192.168.1.4\nusername=eaton_admin\nsnmp-priv-prot=AES\nsnmp-priv-passwd_secret=pdu/password\n",
            )],
        ),
        (
            "fence-method-fc-off-host0",
            &[(
                "method.properties",
                "template=fence-method-template-fc-switch-brocade\nplug=2\n",
            )],
        ),
        (
            "fence-method-fc-on-host0",
            &[(
                "method.properties",
                "template=fc-switch-brocade\nplug=2\naction=on\n",
            )],
        ),
        (
            "fence-method-eaton-off-host0",
            &[(
                "method.properties",
                "template=fence-method-template-eaton-pdu\nplug=1\naction=off\n",
            )],
        ),
        (
            "fence-method-eaton-on-host0",
            &[(
                "method.properties",
                "template=fence-method-template-eaton-pdu\nplug=1\naction=on\n",
            )],
        ),
        (
            "fence-config-host0",
            &[(
                "config.properties",
                "node_name=host0\nisolation=fc-off\npower_management=eaton-off eaton-on\nrecovery=fc-on\nkdump=yes\n",
            )],
        ),
    ])
}

#[test]
fn the_node_method_template_format_becomes_a_staged_plan_with_secrets_from_secrets() {
    let m = two_devices();
    let refs = secret_refs(&m);
    assert_eq!(
        refs,
        BTreeSet::from([("pdu".to_string(), "password".to_string())])
    );
    let p = parse(&m, &secrets(), StageDefaults::default());
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    let plan = &p.plans["host0"];
    let iso = plan.isolation.as_ref().unwrap();
    assert_eq!(iso.methods[0].agent, "fence_brocade");
    assert_eq!(iso.methods[0].params["plug"], "2");
    assert_eq!(iso.methods[0].params["password"], "eaton-pw");
    let pm = plan.power_management.as_ref().unwrap();
    assert_eq!(pm.methods.len(), 1, "only the off method powers off");
    assert_eq!(pm.methods[0].action, "off");
    assert_eq!(pm.methods[0].params["snmp_priv_prot"], "AES");
    assert_eq!(pm.methods[0].params["snmp_priv_passwd"], "eaton-pw");
    // `eaton-off eaton-on`: the on powers the node back on after the release.
    let on = plan.power_on.as_ref().unwrap();
    assert_eq!(on.methods.len(), 1);
    assert_eq!(
        (on.methods[0].agent.as_str(), on.methods[0].action.as_str()),
        ("fence_eaton_snmp", "on")
    );
    let rec = plan.recovery.as_ref().unwrap();
    let actions: Vec<(&str, &str)> = rec
        .methods
        .iter()
        .map(|m| (m.agent.as_str(), m.action.as_str()))
        .collect();
    assert_eq!(actions, [("fence_brocade", "on")]);
    assert!(
        plan.secrets().any(|s| s == "eaton-pw"),
        "resolved secrets are redacted"
    );
    assert!(plan.kdump);
}

#[test]
fn the_stage_format_maps_onto_isolation_power_off_and_recovery() {
    let mut m = two_devices();
    m.remove("fence-config-host0");
    m.extend(maps(&[
        (
            "fence-stage-storage",
            &[
                ("priority", "5"),
                ("execution_policy", "all"),
                ("fence_method1", "fc-off"),
            ],
        ),
        (
            "fence-stage-power",
            &[
                ("execution_policy", "only one"),
                ("fence_method1", "eaton-off"),
                ("fence_method2", "eaton-off"),
            ],
        ),
        ("fence-stage-back", &[("fence_method1", "fc-on")]),
        (
            "fence-config-host0",
            &[
                ("node_name", "host0"),
                ("fence_stage1", "storage"),
                ("fence_stage2", "power"),
                ("recover_stage", "back"),
            ],
        ),
    ]));
    let p = parse(&m, &secrets(), StageDefaults::default());
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    let plan = &p.plans["host0"];
    assert_eq!(
        plan.isolation.as_ref().unwrap().methods[0].agent,
        "fence_brocade"
    );
    let pm = plan.power_management.as_ref().unwrap();
    assert_eq!(pm.policy, ExecPolicy::Any);
    assert_eq!(pm.methods.len(), 2);
    assert_eq!(plan.recovery.as_ref().unwrap().methods[0].action, "on");
}

#[test]
fn must_success_no_makes_a_method_optional() {
    let mut m = two_devices();
    m.insert(
        "fence-method-template-fc-switch-brocade".into(),
        BTreeMap::from([
            ("agent_name".into(), "fence_brocade".into()),
            ("must_success".into(), "no".into()),
        ]),
    );
    let p = parse(&m, &secrets(), StageDefaults::default());
    assert!(!p.plans["host0"].isolation.as_ref().unwrap().methods[0].required);
    assert!(p.plans["host0"].power_management.as_ref().unwrap().methods[0].required);
}

/// The single-map form: the node's methods (and a template) as `fence-method-*` keys of its
/// own `fence-config-<node>` give the same plan as separate ConfigMaps; a key of the node's map
/// wins over a ConfigMap of the same name, and its problems name the map and the key.
#[test]
fn a_node_configured_in_one_configmap_with_its_methods_embedded_gets_the_same_plan() {
    let sep = two_devices();
    let body = |n: &str| sep[n]["method.properties"].clone();
    let mut one = maps(&[(
        "fence-method-template-eaton-pdu",
        &[(
            "template.properties",
            sep["fence-method-template-eaton-pdu"]["template.properties"].as_str(),
        )],
    )]);
    one.insert(
        "fence-config-host0".into(),
        BTreeMap::from([
            (
                "config.properties".to_string(),
                sep["fence-config-host0"]["config.properties"].clone(),
            ),
            (
                "fence-method-fc-off".into(),
                body("fence-method-fc-off-host0"),
            ),
            (
                "fence-method-fc-on".into(),
                body("fence-method-fc-on-host0"),
            ),
            (
                "fence-method-eaton-off".into(),
                body("fence-method-eaton-off-host0"),
            ),
            (
                "fence-method-eaton-on".into(),
                body("fence-method-eaton-on-host0"),
            ),
            (
                "fence-method-template-fc-switch-brocade".into(),
                sep["fence-method-template-fc-switch-brocade"]["template.properties"].clone(),
            ),
        ]),
    );
    assert_eq!(
        secret_refs(&one),
        BTreeSet::from([("pdu".to_string(), "password".to_string())])
    );
    let a = parse(&sep, &secrets(), StageDefaults::default());
    let b = parse(&one, &secrets(), StageDefaults::default());
    assert!(b.problems.is_empty(), "{:?}", b.problems);
    let names = |p: &Parsed| {
        let plan = &p.plans["host0"];
        let mut m: Vec<String> = plan
            .isolation
            .iter()
            .chain(&plan.power_management)
            .chain(&plan.power_on)
            .chain(&plan.recovery)
            .flat_map(|s| {
                s.methods
                    .iter()
                    .map(|m| format!("{} {} {:?}", m.agent, m.action, m.params))
            })
            .collect();
        m.sort();
        m
    };
    assert_eq!(names(&a), names(&b));
    // A problem in an embedded method names the node's map and the key.
    one.get_mut("fence-config-host0")
        .unwrap()
        .insert("fence-method-eaton-off".into(), "plug=1\n".into());
    let p = parse(&one, &secrets(), StageDefaults::default());
    let pr = &p.problems["host0"];
    assert_eq!(
        (pr.configmap.as_str(), pr.key.as_str()),
        ("fence-config-host0", "fence-method-eaton-off"),
        "{pr}"
    );
    assert!(pr.problem.contains("no template="), "{pr}");
}

/// Each problem names the ConfigMap, the key and what is wrong, and leaves only its node
/// unfenced.
#[test]
fn problems_name_the_configmap_and_the_key_and_touch_no_other_node() {
    let base = two_devices();
    let check = |m: Maps, cm: &str, what: &str| {
        let p = parse(&m, &secrets(), StageDefaults::default());
        let pr = p
            .problems
            .get("host0")
            .unwrap_or_else(|| panic!("{what}: no problem"));
        assert_eq!(pr.configmap, cm, "{pr}");
        assert!(pr.problem.contains(what), "{pr}");
        assert!(!p.plans.contains_key("host0"));
    };
    // An inline password is refused: ConfigMaps are readable by many.
    let mut m = base.clone();
    m.insert(
        "fence-method-eaton-off-host0".into(),
        BTreeMap::from([(
            "method.properties".into(),
            "template=eaton-pdu\nplug=1\npassword=hunter2\n".into(),
        )]),
    );
    check(
        m,
        "fence-method-eaton-off-host0",
        "password is given inline",
    );
    let mut m = base.clone();
    m.insert(
        "fence-method-template-eaton-pdu".into(),
        BTreeMap::from([(
            "template.properties".into(),
            "agent_name=fence_eaton_snmp\ncommunity=private\n".into(),
        )]),
    );
    check(
        m,
        "fence-method-template-eaton-pdu",
        "community is given inline",
    );
    // A Secret maintd cannot read.
    let p = parse(&base, &BTreeMap::new(), StageDefaults::default());
    assert!(
        p.problems["host0"]
            .problem
            .contains("Secret pdu has no key password"),
        "{:?}",
        p.problems
    );
    // Unknown method, template and agent; a bad action; no power-off.
    let mut m = base.clone();
    m.insert(
        "fence-config-host0".into(),
        BTreeMap::from([("config.properties".into(), "power_management=nope\n".into())]),
    );
    check(
        m,
        "fence-config-host0",
        "method \"nope\" has no key fence-method-nope in fence-config-host0, and no ConfigMap",
    );
    let mut m = base.clone();
    m.insert(
        "fence-method-eaton-off-host0".into(),
        BTreeMap::from([("method.properties".into(), "template=gone\n".into())]),
    );
    check(
        m,
        "fence-method-eaton-off-host0",
        "template \"gone\" has no key fence-method-template-gone in fence-config-host0, and no ConfigMap",
    );
    let mut m = base.clone();
    m.insert(
        "fence-method-template-eaton-pdu".into(),
        BTreeMap::from([("agent_name".into(), "rm -rf".into())]),
    );
    check(
        m,
        "fence-method-template-eaton-pdu",
        "must be a fence_* name",
    );
    let mut m = base.clone();
    m.insert(
        "fence-method-eaton-off-host0".into(),
        BTreeMap::from([(
            "method.properties".into(),
            "template=eaton-pdu\naction=reboot\n".into(),
        )]),
    );
    check(m, "fence-method-eaton-off-host0", "action \"reboot\"");
    let mut m = base.clone();
    m.insert(
        "fence-config-host0".into(),
        BTreeMap::from([(
            "config.properties".into(),
            "isolation=fc-off\npower_management=eaton-on\n".into(),
        )]),
    );
    check(
        m,
        "fence-config-host0",
        "no power_management method that powers off",
    );
    // Another node's good configuration stands.
    let mut m = base;
    m.insert(
        "fence-config-host1".into(),
        BTreeMap::from([("config.properties".into(), "power_management=bad\n".into())]),
    );
    let p = parse(&m, &secrets(), StageDefaults::default());
    assert!(p.plans.contains_key("host0") && p.problems.contains_key("host1"));
}
