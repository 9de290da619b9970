//! The documentation a newcomer navigates: a short README, and links between the pages that
//! all lead somewhere (a file that exists, a heading that is there).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The pages: the README, BENCHMARKS.md and everything under docs/.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.push(anchor(l.trim_start_matches('#')));
        }
    }
    out
}

/// Every `](target)` of a page outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = l;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_between_pages_leads_to_a_file_and_a_heading() {
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, frag) = link.split_once('#').unwrap_or((&link, ""));
            let target: PathBuf = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            assert!(
                target.exists(),
                "{}: link {link:?} leads nowhere",
                page.display()
            );
            if !frag.is_empty() {
                let t = std::fs::read_to_string(&target).unwrap();
                assert!(
                    anchors(&t).iter().any(|a| a == frag),
                    "{}: link {link:?}: no heading #{frag} in {}",
                    page.display(),
                    target.display()
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 15,
        "the pages link to each other ({checked} links)"
    );
}

#[test]
fn the_readme_is_short_and_links_every_page_of_docs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "the README is {lines} lines; the detail goes in docs/"
    );
    for page in pages() {
        let name = page.file_name().unwrap().to_str().unwrap();
        if page.parent() == Some(Path::new(&root().join("docs"))) {
            assert!(
                readme.contains(&format!("(docs/{name})")),
                "the README does not link docs/{name}"
            );
        }
    }
}

#[test]
fn every_shipped_alert_has_a_runbook_entry() {
    let rules = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yaml")).unwrap();
    let ops = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for a in alerts {
        let at = ops
            .find(&format!("\n### {a}\n"))
            .unwrap_or_else(|| panic!("no runbook entry for {a} in docs/operations.md"));
        let entry = ops[at + 1..].split("\n#").next().unwrap();
        assert!(
            entry.len() > 150,
            "{a}: the entry says what it means and what to do"
        );
    }
}

/// The CLI list in operations.md names every command an operator can run (every visible
/// subcommand, down to the leaves), so its runbook never uses a command the list leaves out.
#[test]
fn the_operations_cli_list_names_every_command() {
    use clap::CommandFactory;
    fn leaves(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let path = format!("{prefix}{}", sub.get_name());
            if sub.has_subcommands() {
                leaves(sub, &format!("{path} "), out);
            } else {
                out.push(path);
            }
        }
    }
    let mut commands = Vec::new();
    leaves(&maintd::cli::Cli::command(), "", &mut commands);
    let text = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let list = text
        .split("## CLI")
        .nth(1)
        .and_then(|t| t.split("```").nth(1))
        .expect("operations.md has a CLI list in a code block");
    let missing: Vec<&String> = commands
        .iter()
        .filter(|c| {
            !list.lines().any(|l| {
                l.strip_prefix(&format!("maintd {c}"))
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '|']))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "operations.md's CLI list lacks {missing:?}"
    );
}

#[test]
fn every_test_module_is_listed_where_a_newcomer_looks() {
    let main = std::fs::read_to_string(root().join("tests/it/main.rs")).unwrap();
    let arch = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let (doc, code): (Vec<&str>, Vec<&str>) = main.lines().partition(|l| l.starts_with("//!"));
    let doc = doc.join("\n");
    let modules: Vec<&str> = code
        .iter()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|m| *m != "common")
        .collect();
    assert!(modules.len() > 20, "{modules:?}");
    for m in &modules {
        let named = format!("`{m}`");
        assert!(
            doc.contains(&named),
            "tests/it/main.rs's list lacks {named}"
        );
        assert!(
            arch.contains(&named),
            "docs/ARCHITECTURE.md lacks the test module {named}"
        );
    }
    // And every file of tests/it/ is a module of the binary (a file nobody declares never runs).
    for e in std::fs::read_dir(root().join("tests/it")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(m) = name.strip_suffix(".rs").filter(|m| *m != "main") {
            assert!(
                modules.contains(&m),
                "tests/it/{name} is not declared in main.rs"
            );
        }
    }
}
