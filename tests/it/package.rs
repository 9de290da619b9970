//! The Debian package: `scripts/package` builds it with this build's binary, it carries what
//! an operator installs (binary, units, conffiles, collectors, man pages, completions), and it
//! installs into a fresh Debian root (mmdebstrap), where the binary runs and the shipped
//! configuration produces a signed report.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_shipped_configuration_is_valid() {
    let text = std::fs::read_to_string(repo().join("deploy/debian/maintd.toml")).unwrap();
    let c = maintd::config::Config::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.collector.diagnose, "maintd-diagnose");
}

#[test]
fn the_package_installs_into_a_fresh_debian_root_and_runs() {
    if !have_tool("dpkg-deb", "MAINTD_REQUIRE_DEBIAN") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let deb = run(Command::new(repo().join("scripts/package"))
        .env("MAINTD_BIN", &*BIN)
        .env(
            "MAINTD_MAINTAINER",
            "maintd maintainers <maintainers@maintd.dev>",
        )
        .env("MAINTD_PACKAGE_OUT", &out));
    let deb = Path::new(deb.trim());
    assert!(deb.exists(), "{}", deb.display());

    let contents = run(Command::new("dpkg-deb").arg("-c").arg(deb));
    for path in [
        "./usr/bin/maintd",
        "./lib/systemd/system/maintd.service",
        "./lib/systemd/system/maintd-collector.service",
        "./etc/maintd/maintd.toml",
        "./etc/maintd/operators/",
        "./etc/maintd/node/",
        "./etc/maintd/diagnose.d/maintd-diagnose",
        "./etc/maintd/repair.d/offline",
        "./usr/lib/maintd/collectors/fs-check",
        "./usr/share/man/man1/maintd-daemon.1.gz",
        "./usr/share/bash-completion/completions/maintd",
        "./usr/share/zsh/vendor-completions/_maintd",
        "./usr/share/fish/vendor_completions.d/maintd.fish",
        "./usr/share/doc/maintd/copyright",
        "./usr/share/doc/maintd/changelog.gz",
        "./usr/share/doc/maintd/docs/configuration.md",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} is not in the package:\n{contents}"
        );
    }
    // clap's generated `help` subcommands get no man pages.
    let help: Vec<&str> = contents
        .lines()
        .filter(|l| l.contains("/man1/") && l.contains("help"))
        .collect();
    assert!(help.is_empty(), "{help:#?}");
    // Every path the shipped configuration points an operator to is in the package.
    let shipped = std::fs::read_to_string(repo().join("deploy/debian/maintd.toml")).unwrap();
    for doc in shipped
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| w.starts_with("/usr/share/doc/"))
    {
        assert!(
            contents.lines().any(|l| l.ends_with(&format!(".{doc}"))),
            "the configuration points at {doc}, which the package does not ship"
        );
    }
    assert!(
        !shipped.contains(" docs/") && !shipped.contains("(docs/"),
        "a path relative to the source tree"
    );
    // lintian, Debian's package checker: no error, no warning that is not overridden with a
    // reason in deploy/debian/lintian-overrides.
    if have_tool("lintian", "MAINTD_REQUIRE_DEBIAN") {
        let out = Command::new("lintian")
            .args(["--tag-display-limit", "0", "--fail-on", "error,warning"])
            .arg(deb)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "lintian: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let conffiles = run(Command::new("dpkg-deb")
        .args(["--info"])
        .arg(deb)
        .arg("conffiles"));
    assert!(conffiles.contains("/etc/maintd/maintd.toml"), "{conffiles}");
    assert!(
        conffiles.contains("/etc/maintd/repair.d/offline"),
        "{conffiles}"
    );

    // Installing it needs a Debian root (mmdebstrap, the archive) and root for chroot.
    if !have_tool("mmdebstrap", "MAINTD_REQUIRE_DEBIAN") {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("MAINTD_REQUIRE_DEBIAN").is_none(),
            "installing the package needs root"
        );
        eprintln!("skipping the install: not root");
        return;
    }
    let suite = std::fs::read_to_string("/etc/os-release")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_string))
        .expect("a Debian release to build the root from");
    let root = dir.path().join("root");
    run(Command::new("mmdebstrap")
        .args(["--quiet", "--variant=essential", "--include=passwd,python3"])
        .arg(&suite)
        .arg(&root));
    std::fs::copy(deb, root.join("tmp/maintd.deb")).unwrap();
    let before = tree(&root);
    let chroot = |args: &[&str]| run(Command::new("chroot").arg(&root).args(args));
    chroot(&["dpkg", "-i", "/tmp/maintd.deb"]);
    let version = chroot(&["/usr/bin/maintd", "--version"]);
    assert_eq!(
        version.trim(),
        format!("maintd {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(chroot(&["getent", "passwd", "maintd"]).contains("/usr/sbin/nologin"));
    // The operators' keys: a directory only the daemon's user may enter.
    let ops = chroot(&["stat", "-c", "%a %U", "/etc/maintd/operators"]);
    assert_eq!(ops.trim(), "700 maintd");
    chroot(&[
        "/usr/bin/maintd",
        "keygen",
        "--operator",
        "alice",
        "--out",
        "/etc/maintd/operators/alice.key",
    ]);
    let mode = chroot(&["stat", "-c", "%a", "/etc/maintd/operators/alice.key"]);
    assert_eq!(mode.trim(), "600");
    // A node's own key, from the master's secret, in the directory the package made for it;
    // the shipped diagnose signs with it.
    let node = chroot(&["stat", "-c", "%a %U", "/etc/maintd/node"]);
    assert_eq!(node.trim(), "700 root");
    std::fs::write(
        root.join("tmp/keys.toml"),
        "[daemon.node-keys]\nsecret-file = \"/etc/maintd/node-keys.secret\"\n[collector]\nnode = \"host1\"\nkey-files = [\"/etc/maintd/node/node.key\"]\ndiagnose = \"maintd-diagnose\"\ndiagnose-dir = \"/etc/maintd/diagnose.d\"\n",
    )
    .unwrap();
    let keys = ["/usr/bin/maintd", "--config", "/tmp/keys.toml"];
    chroot(&[&keys[..], &["keygen", "--node-secret"]].concat());
    chroot(
        &[
            &keys[..],
            &[
                "keygen",
                "--node",
                "host1",
                "--out",
                "/etc/maintd/node/node.key",
            ],
        ]
        .concat(),
    );
    let signed = chroot(&[&keys[..], &["diagnose", "--once"]].concat());
    let v: serde_json::Value = serde_json::from_str(&signed).unwrap();
    assert_eq!(v["node"], "host1", "{signed}");
    // The shipped configuration runs the shipped diagnose and collectors into a signed report.
    chroot(&["/usr/bin/maintd", "keygen"]);
    let report = chroot(&["/usr/bin/maintd", "diagnose", "--once"]);
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(v["name"], "diagnose", "{report}");
    assert!(v["data"]["status"].is_string(), "{report}");
    assert_eq!(v["signature"].as_str().unwrap().len(), 64, "{report}");
    // Removing keeps the configuration (conffiles); purging deletes it.
    chroot(&["dpkg", "-r", "maintd"]);
    assert!(root.join("etc/maintd/maintd.toml").exists());
    assert!(!root.join("usr/bin/maintd").exists());
    chroot(&["dpkg", "-P", "maintd"]);
    assert!(!root.join("etc/maintd/maintd.toml").exists());
    // A purge leaves nothing behind: no keys, no byte-code caches, no state, no directories.
    // (The system user stays, as Debian's packages leave theirs.)
    let leftovers: Vec<String> = tree(&root)
        .difference(&before)
        .filter(|p| !USER_FILES.contains(&p.as_str()))
        .cloned()
        .collect();
    assert!(leftovers.is_empty(), "left after purge: {leftovers:#?}");
}

/// Files the system user's creation changes or backs up, which a purge keeps.
const USER_FILES: &[&str] = &[
    "etc/passwd-",
    "etc/group-",
    "etc/shadow-",
    "etc/gshadow-",
    "etc/subuid-",
    "etc/subgid-",
];

/// Every path under `root`, but the scratch space, logs and dpkg's own records.
fn tree(root: &Path) -> std::collections::BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut std::collections::BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if [
                "tmp",
                "proc",
                "sys",
                "dev",
                "run",
                "var/log",
                "var/cache",
                "var/lib/dpkg",
            ]
            .iter()
            .any(|skip| rel == *skip || rel.starts_with(&format!("{skip}/")))
            {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, root, out);
            }
            out.insert(rel);
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(root, root, &mut out);
    out
}
