//! The module structure docs/ARCHITECTURE.md promises. The unit is the top-level module of
//! `src/`, except in the two rooms (`repair`, `fencing`), where each file is its own unit because
//! a room holds both pure decisions and their executor. Checked: no import cycle between units,
//! and the pure units import nothing but pure units and touch no clock, file, socket or process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOMS: [&str; 2] = ["repair", "fencing"];

const PURE: [&str; 11] = [
    "verdict",
    "tags",
    "repair::model",
    "repair::decide",
    "repair::capacity",
    "repair::conditions",
    "fencing::machine",
    "fencing::watchers",
    "fencing::opinion",
    "fencing::selffence",
    "fencing::drill",
];

struct Unit {
    name: String,
    /// A file below a room's file (`fencing/machine/transitions.rs`): its `super` is its unit.
    nested: bool,
    /// Source without its `#[cfg(test)]` tail.
    code: String,
}

fn units() -> Vec<Unit> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            // Test code (unit-test files and folders, the simulated-time harness) may import
            // anything.
            let rel = p.strip_prefix(&src).unwrap().to_path_buf();
            let test_code = rel.ends_with("tests.rs")
                || rel.components().any(|c| c.as_os_str() == "tests")
                || rel.starts_with("sim");
            if p.extension().is_none_or(|x| x != "rs") || test_code {
                continue;
            }
            let parts: Vec<String> = p
                .strip_prefix(&src)
                .unwrap()
                .components()
                .map(|c| {
                    c.as_os_str()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .collect();
            let top = parts[0].clone();
            if top == "lib" || top == "main" {
                continue;
            }
            let name = if ROOMS.contains(&top.as_str()) && parts.len() > 1 && parts[1] != "mod" {
                format!("{top}::{}", parts[1])
            } else {
                top
            };
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            let nested = parts.len() > 2;
            out.push(Unit { name, nested, code });
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
        .collect()
}

/// Unit -> the units its non-test code names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let units = units();
    let names: BTreeSet<String> = units.iter().map(|u| u.name.clone()).collect();
    let in_room = |room: &str, file: &str| {
        let n = format!("{room}::{file}");
        if names.contains(&n) {
            n
        } else {
            room.to_string()
        }
    };
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for u in &units {
        let top = u.name.split("::").next().unwrap().to_string();
        let mut deps = BTreeSet::new();
        for part in u.code.split("crate::").skip(1) {
            let m = ident(part);
            if m.is_empty() {
                continue;
            }
            if ROOMS.contains(&m.as_str()) {
                let rest = &part[m.len()..];
                let file = rest.strip_prefix("::").map(ident).unwrap_or_default();
                deps.insert(in_room(&m, &file));
            } else {
                deps.insert(m);
            }
        }
        if ROOMS.contains(&top.as_str()) && !u.nested {
            for part in u.code.split("super::").skip(1) {
                deps.insert(in_room(&top, &ident(part)));
            }
            if u.name == top {
                // A room's mod.rs re-exports its files' items.
                for line in u.code.lines() {
                    if let Some(rest) = line.trim().strip_prefix("pub use ") {
                        deps.insert(in_room(&top, &ident(rest)));
                    }
                }
            }
        }
        deps.remove(&u.name);
        g.entry(u.name.clone()).or_default().extend(deps);
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
fn modules_import_each_other_without_a_cycle() {
    let g = graph();
    assert!(g.len() > 20, "{g:?}");
    assert!(g["repair::engine"].contains("store"), "{g:#?}");
    let cycles: Vec<&String> = g.keys().filter(|m| reaches(&g, m, m)).collect();
    assert!(
        cycles.is_empty(),
        "modules on an import cycle: {cycles:?}\n{g:#?}"
    );
}

#[test]
fn the_pure_decisions_import_only_pure_code() {
    let g = graph();
    for p in PURE {
        let impure: Vec<&String> = g[p]
            .iter()
            .filter(|d| !PURE.contains(&d.as_str()))
            .collect();
        assert!(
            impure.is_empty(),
            "{p} must stay pure but imports {impure:?}"
        );
    }
    assert!(g["repair::decide"].contains("repair::model"));
}

#[test]
fn the_pure_decisions_touch_no_clock_file_socket_or_process() {
    let forbidden = [
        "SystemTime",
        "Instant::now",
        "std::fs",
        "std::net",
        "std::process",
        "tokio::",
        "rand::",
        "std::env",
        "new_v4",
    ];
    for u in units() {
        if !PURE.contains(&u.name.as_str()) {
            continue;
        }
        for f in forbidden {
            assert!(!u.code.contains(f), "{} is pure but names {f}", u.name);
        }
    }
}

/// The folders' order, lowest first: a unit imports only units of its own layer or below, so
/// the coupling shows in the folder list. The shared vocabulary and the pure decisions at the
/// bottom; the plumbing every part uses; state, backends and membership; the rooms' executors;
/// the two processes; the command line on top.
fn layer(g: &BTreeMap<String, BTreeSet<String>>, unit: &str) -> usize {
    let top = unit.split("::").next().unwrap();
    if PURE.contains(&unit) {
        return 0;
    }
    // A room's own module only re-exports: it sits where what it re-exports sits.
    if ROOMS.contains(&unit) {
        return g[unit].iter().map(|d| layer(g, d)).max().unwrap_or(0);
    }
    match top {
        "clock" | "sync" | "fsutil" | "secret" | "exec" | "node" | "report" | "http" | "ticker"
        | "sdnotify" => 1,
        "store" | "cluster" | "leader" | "members" | "link" | "metrics" | "parts" | "views" => 2,
        "repair" | "fencing" => 3,
        "collector" | "daemon" | "config" => 4,
        "cli" => 5,
        other => panic!("{other}: no layer; add it to `layer`"),
    }
}

#[test]
fn no_import_points_up_the_layers() {
    let g = graph();
    let mut up = Vec::new();
    for (from, deps) in &g {
        for to in deps {
            if layer(&g, to) > layer(&g, from) {
                up.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports that point up the layers:\n{}",
        up.join("\n")
    );
}

/// A file that outgrows this is doing more than one thing: split it along its seams. Test code
/// (an inline `#[cfg(test)]` tail, a test file, the simulated-time harness) is not counted.
#[test]
fn no_source_file_is_over_500_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(&src).unwrap().to_path_buf();
            if p.is_dir() {
                if !rel.ends_with("tests") && !rel.starts_with("sim") {
                    stack.push(p);
                }
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") || rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let n = code.lines().count();
            if n > 500 {
                long.push(format!("{} ({n} lines)", rel.display()));
            }
        }
    }
    assert!(long.is_empty(), "over 500 lines: {long:?}");
}
