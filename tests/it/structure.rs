//! The module structure docs/ARCHITECTURE.md promises. The unit is a top-level module of
//! `src/` (a folder or a file); the pure core is the `maintd-core` crate, one unit below them all.
//! Checked: no import cycle between units or between files, no import up the layers, and a core whose
//! dependencies do no I/O and whose code names no clock, file, socket or process. That the core
//! imports nothing of the shell, Cargo checks: it cannot name the crate that depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` but test code (unit-test files and folders, the simulated-time
/// harness), with its path relative to `dir` and its text before any `#[cfg(test)]`.
fn code_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
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
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            out.push((rel, code));
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
        .collect()
}

/// Unit -> the units its non-test code names (`crate::x`, and `maintd_core` as `core`).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, code) in code_files(&root().join("src")) {
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let unit = first.trim_end_matches(".rs").to_string();
        if unit == "lib" || unit == "main" {
            continue;
        }
        let mut deps: BTreeSet<String> = code
            .split("crate::")
            .skip(1)
            .map(ident)
            .filter(|m| !m.is_empty())
            .collect();
        if code.contains("maintd_core::") {
            deps.insert("core".into());
        }
        deps.remove(&unit);
        g.entry(unit).or_default().extend(deps);
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
    assert!(g.len() > 15, "{g:?}");
    assert!(g["repair"].contains("store"), "{g:#?}");
    assert!(g["store"].contains("core"), "{g:#?}");
    let cycles: Vec<&String> = g.keys().filter(|m| reaches(&g, m, m)).collect();
    assert!(
        cycles.is_empty(),
        "modules on an import cycle: {cycles:?}\n{g:#?}"
    );
}

/// A file's module path (`daemon/api`, `report` for `report/mod.rs`) -> the modules of `src`
/// its non-test code names through `super::x` or `crate::x::y`.
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let exists =
        |m: &str| src.join(format!("{m}.rs")).exists() || src.join(m).join("mod.rs").exists();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, code) in code_files(&src) {
        let mut parts: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        let me = parts.join("/");
        let parent = parts[..parts.len().saturating_sub(1)].join("/");
        let mut deps = BTreeSet::new();
        for rest in code.split("super::").skip(1) {
            let m = format!("{parent}/{}", ident(rest));
            let m = m.trim_start_matches('/').to_string();
            if !ident(rest).is_empty() && exists(&m) {
                deps.insert(m);
            }
        }
        for rest in code.split("crate::").skip(1) {
            let first = ident(rest);
            let Some(after) = rest[first.len()..].strip_prefix("::") else {
                continue;
            };
            let m = format!("{first}/{}", ident(after));
            if !ident(after).is_empty() && exists(&m) && !me.starts_with(&m) {
                deps.insert(m);
            }
        }
        deps.remove(&me);
        g.entry(me).or_default().extend(deps);
    }
    g
}

/// Files import each other without a circle too, so each file can be read after the ones it
/// names: a router and its handlers share their state through a third file, not each other.
#[test]
fn files_import_each_other_without_a_cycle() {
    let g = file_graph();
    assert!(g["daemon/lists"].contains("daemon/api_state"), "{g:#?}");
    assert!(g["collector/peers"].contains("report/peerkeys"), "{g:#?}");
    let cycles: Vec<&String> = g.keys().filter(|m| reaches(&g, m, m)).collect();
    assert!(
        cycles.is_empty(),
        "files on an import cycle: {cycles:?}\n{g:#?}"
    );
}

/// The units' order, lowest first: a unit imports only units of its own layer or below, so the
/// coupling shows in the folder list. The core (the vocabulary and the pure decisions) at the
/// bottom; the plumbing every part uses; state, backends and membership; the two rooms'
/// executors; the two processes; the command line on top.
fn layer(unit: &str) -> usize {
    match unit {
        "core" => 0,
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
            if layer(to) > layer(from) {
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

/// The core's `[dependencies]`: what its decisions may use. Adding one means asking whether it
/// does I/O; none of these does.
const CORE_DEPENDENCIES: [&str; 9] = [
    "humantime",
    "proptest",
    "schemars",
    "serde",
    "serde_json",
    "sha2",
    "strum",
    "thiserror",
    "uuid",
];

#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let manifest = std::fs::read_to_string(root().join("crates/maintd-core/Cargo.toml")).unwrap();
    let deps: BTreeSet<String> = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .flat_map(|section| section.lines().skip(1))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split([' ', '=']).next().unwrap().replace('-', "_"))
        .collect();
    assert_eq!(
        deps,
        CORE_DEPENDENCIES.iter().map(|d| d.to_string()).collect(),
        "the core's dependencies changed: none may do I/O (tokio, hyper, kube, rusqlite, nix…)"
    );
    // `proptest` only behind the `testing` feature, for the shell's tests.
    assert!(manifest.contains("proptest = { version = \"1\", optional = true }"));
}

#[test]
fn the_core_names_no_clock_file_socket_or_process() {
    let forbidden = [
        "SystemTime",
        "Instant::now",
        "std::fs",
        "std::net",
        "std::process",
        "std::thread",
        "std::env",
        "new_v4",
    ];
    let files = code_files(&root().join("crates/maintd-core/src"));
    assert!(files.len() > 20, "{}", files.len());
    for (rel, code) in files {
        for f in forbidden {
            assert!(!code.contains(f), "{} is core but names {f}", rel.display());
        }
    }
}

/// A file that outgrows this is doing more than one thing: split it along its seams. Test code
/// (an inline `#[cfg(test)]` tail, a test file, the simulated-time harness) is not counted.
#[test]
fn no_source_file_is_over_500_lines() {
    let mut long = Vec::new();
    for dir in ["src", "crates/maintd-core/src"] {
        for (rel, code) in code_files(&root().join(dir)) {
            let n = code.lines().count();
            if n > 500 {
                long.push(format!("{dir}/{} ({n} lines)", rel.display()));
            }
        }
    }
    assert!(long.is_empty(), "over 500 lines: {long:?}");
}
