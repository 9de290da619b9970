//! The per-node operator commands: `maintd tags` (list, remove: removing a maintd tag
//! acknowledges the repair) and `maintd maintenance` (start, stop, list).

use clap::Subcommand;

use super::client::*;
use super::{ApiArgs, Cli, CliError};
use crate::views;

#[derive(Debug, Subcommand)]
pub enum TagsCmd {
    /// List tags of every node, or of one.
    List {
        node: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Remove a tag from a node.
    Remove {
        node: String,
        tag: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub(super) async fn tags(cli: &Cli, cmd: &TagsCmd) -> Result<(), CliError> {
    match cmd {
        TagsCmd::List { node, api } => {
            let path = match node {
                Some(n) => format!("/1/tags?node={}", segment(n)),
                None => "/1/tags".into(),
            };
            let tags: views::Tags = view(api_get(api, &path).await?)?;
            for (node, tags) in tags {
                let list: Vec<String> = tags.into_iter().collect();
                out!("{node}: {}", list.join(" "));
            }
        }
        TagsCmd::Remove { node, tag, api } => {
            let cfg = cli.load_config()?;
            api_signed(
                &cfg,
                api,
                reqwest::Method::DELETE,
                &format!("/1/nodes/{}/tags/{}", segment(node), segment(tag)),
            )
            .await?;
            out!("removed {tag} from {node}");
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum MaintenanceCmd {
    /// Put a node in maintenance: never fenced, powered on or off, out of the storm count,
    /// until stopped (or `--until`). Kept across restarts and failovers.
    Start {
        node: String,
        #[arg(long)]
        reason: Option<String>,
        /// When it ends by itself: a duration from now (`2h`, `90m`) or an RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// End a node's maintenance: normal handling resumes.
    Stop {
        node: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Every node in maintenance, set by an operator or waiting for its repair's
    /// acknowledgement.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// `--until` as ns since the epoch: a duration from now, or an RFC 3339 time.
fn until(text: &str) -> Result<i64, CliError> {
    let at = match humantime::parse_duration(text) {
        Ok(d) => std::time::SystemTime::now() + d,
        Err(_) => humantime::parse_rfc3339_weak(text).map_err(|_| {
            CliError::Usage(format!(
                "--until {text:?} is neither a duration (2h, 90m) nor an RFC 3339 time"
            ))
        })?,
    };
    let ns = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    Ok(ns)
}

pub(super) async fn maintenance(cli: &Cli, cmd: &MaintenanceCmd) -> Result<(), CliError> {
    use crate::daemon::maintenance::InMaintenance;
    match cmd {
        MaintenanceCmd::List { json, api } => {
            let all: Vec<InMaintenance> = view(api_get(api, "/1/maintenance").await?)?;
            if *json {
                out!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
                return Ok(());
            }
            for m in all {
                let by = m.by.map(|b| format!(" by {b}")).unwrap_or_default();
                out!("{}  {}{by}: {}", m.node, m.source, m.reason);
            }
        }
        MaintenanceCmd::Start {
            node,
            reason,
            until: end,
            api,
        } => {
            let mut q = Vec::new();
            if let Some(r) = reason {
                q.push(format!("reason={}", segment(r)));
            }
            if let Some(u) = end {
                q.push(format!("until={}", until(u)?));
            }
            let q = if q.is_empty() {
                String::new()
            } else {
                format!("?{}", q.join("&"))
            };
            let path = format!("/1/nodes/{}/maintenance{q}", segment(node));
            let cfg = cli.load_config()?;
            let m: InMaintenance =
                view(api_signed(&cfg, api, reqwest::Method::POST, &path).await?)?;
            out!("{} in maintenance: {}", m.node, m.reason);
        }
        MaintenanceCmd::Stop { node, api } => {
            let path = format!("/1/nodes/{}/maintenance", segment(node));
            let cfg = cli.load_config()?;
            api_signed(&cfg, api, reqwest::Method::DELETE, &path).await?;
            out!("{node} out of maintenance");
        }
    }
    Ok(())
}
