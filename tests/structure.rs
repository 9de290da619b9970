//! The module structure docs/ARCHITECTURE.md promises: no import cycle between the top-level
//! modules of `src/`, and a pure core that imports nothing but itself and `verdict`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules its non-test code names as `crate::<module>`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if top == "lib" || top == "main" || rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let deps = g.entry(top.clone()).or_default();
            for part in code.split("crate::").skip(1) {
                let m: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !m.is_empty() && m != top {
                    deps.insert(m);
                }
            }
        }
    }
    g
}

fn reaches(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(m) = stack.pop() {
        for d in g.get(&m).into_iter().flatten() {
            if d == to {
                return true;
            }
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    false
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 10, "{g:?}");
    let cycles: Vec<&String> = g.keys().filter(|m| reaches(&g, m, m)).collect();
    assert!(
        cycles.is_empty(),
        "modules on an import cycle: {cycles:?}\n{g:#?}"
    );
}

#[test]
fn the_core_imports_only_the_verdict_types() {
    let g = graph();
    assert_eq!(
        g["core"],
        BTreeSet::from(["verdict".to_string()]),
        "core must stay pure"
    );
}
