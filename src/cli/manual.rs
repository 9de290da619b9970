//! The manual generated from the command line's own definition: shell completions and man
//! pages, so that neither can fall behind a flag or a subcommand.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;

/// The command line as users see it: built (global flags propagated to every subcommand).
fn command() -> clap::Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

/// Writes the completion script for `shell`.
pub fn completions(shell: Shell, out: &mut dyn Write) {
    let mut cmd = command();
    clap_complete::generate(shell, &mut cmd, "maintd", out);
}

/// Writes `maintd.1` and one page per visible subcommand (`maintd-tags-list.1`, …) into
/// `dir`, and returns the pages written.
pub fn man_pages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    page(&command(), "maintd", dir, &mut written)?;
    Ok(written)
}

fn page(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    // The page is titled by its full name, so `man maintd-tags-list` finds it.
    let titled = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut roff = Vec::new();
    clap_mangen::Man::new(titled).render(&mut roff)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, roff)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| shown(s)) {
        page(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

/// A subcommand with a page of its own: not hidden, and not clap's generated `help` (whose
/// page would only repeat the parent's).
fn shown(s: &clap::Command) -> bool {
    !s.is_hide_set() && s.get_name() != "help"
}

/// Every visible subcommand's path (`tags list`), for checks that nothing is left out.
#[cfg(test)]
fn visible(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands().filter(|s| shown(s)) {
        let path = format!("{prefix}{}", sub.get_name());
        out.push(path.clone());
        visible(sub, &format!("{path} "), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subcommands() -> Vec<String> {
        let mut out = Vec::new();
        visible(&command(), "", &mut out);
        out
    }

    #[test]
    fn every_shell_completes_every_visible_subcommand() {
        let subs = subcommands();
        assert!(subs.iter().any(|s| s == "tags list"), "{subs:?}");
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            completions(shell, &mut out);
            let text = String::from_utf8(out).unwrap();
            for s in &subs {
                let last = s.rsplit(' ').next().unwrap();
                assert!(text.contains(last), "{shell}: no {s:?} in its completions");
            }
            assert!(text.contains("key-file"), "{shell}: global flags complete");
        }
    }

    #[test]
    fn a_man_page_is_written_for_every_visible_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let pages = man_pages(dir.path()).unwrap();
        let mut names: Vec<String> = subcommands()
            .iter()
            .map(|s| format!("maintd-{}.1", s.replace(' ', "-")))
            .collect();
        names.push("maintd.1".into());
        for name in &names {
            let text = std::fs::read_to_string(dir.path().join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                text.starts_with(".ie") || text.contains(".TH"),
                "{name}: {text}"
            );
        }
        assert_eq!(pages.len(), names.len(), "one page per command, no more");
        let status = std::fs::read_to_string(dir.path().join("maintd-status.1")).unwrap();
        assert!(status.contains("Show the repair events"), "{status}");
        assert!(
            status.contains("\\-\\-json"),
            "its flags are listed: {status}"
        );
        assert!(!dir.path().join("maintd-run-job.1").exists());
        // clap's generated `help` subcommands get no pages of their own.
        let help: Vec<_> = pages
            .iter()
            .filter(|p| p.to_string_lossy().contains("help"))
            .collect();
        assert!(help.is_empty(), "{help:?}");
    }
}
