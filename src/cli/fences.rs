//! `maintd fences` (list, show one with its timeline, acknowledge one in error) and `maintd fencing` (pause, resume,
//! status): the operator's view of fencing and its runtime switch.

use super::*;

#[derive(Debug, Subcommand)]
pub enum FencesCmd {
    /// Every recent fence flow, one line each (the default).
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filter: super::Filter,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// One flow: its state, its boots, and its timeline (every witness, decision and call).
    Show {
        id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Acknowledge a flow in error (an alarm, a missed return deadline) once the device and the
    /// node are checked: a released node returns to service when it answers and reports
    /// healthy. Says what is left (signed).
    Ack {
        id: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum FencingCmd {
    /// Pause fencing: no flow starts and no isolation or power-off runs until resumed (running
    /// steps finish). Kept across restarts and failovers.
    Pause {
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Resume fencing.
    Resume {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Whether fencing is paused, and whether every node's fencing can act.
    Status {
        #[command(flatten)]
        api: ApiArgs,
    },
}

fn time(ns: Nanos) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

use maintd_core::verdict::Nanos;

pub(super) async fn fences(cli: &Cli, cmd: &FencesCmd) -> Result<(), CliError> {
    match cmd {
        FencesCmd::Ack { id, reason, api } => {
            let q = reason
                .as_deref()
                .map(|r| format!("?reason={}", segment(r)))
                .unwrap_or_default();
            let path = format!("/1/fences/{}/ack{q}", segment(id));
            let cfg = cli.load_config()?;
            let a: crate::daemon::fence_ack::Acknowledged =
                view(api_signed(&cfg, api, reqwest::Method::POST, &path).await?)?;
            out!(
                "fence flow {} on {} acknowledged by {}",
                a.flow,
                a.node,
                a.by
            );
            out!("left: {}", a.left);
        }
        FencesCmd::List { json, filter, api } => {
            let v = api_get(api, &filter.query("/1/fences", &[])).await?;
            if *json {
                print_json(&v);
                return Ok(());
            }
            let flows: Vec<views::Fence> = view(v)?;
            if flows.is_empty() {
                out!("no fence flows");
            }
            for f in flows {
                let f = &f.flow;
                out!(
                    "{}  {}  {} {}  detected {}{}",
                    f.id,
                    f.node,
                    f.step.as_str(),
                    f.status.as_str(),
                    time(f.detected),
                    f.alarm.as_ref().map(|_| "  ALARM").unwrap_or_default()
                );
            }
        }
        FencesCmd::Show { id, json, api } => {
            let path = format!("/1/fences/{}", segment(id));
            let one = api_get(api, &path).await?;
            let timeline = api_get(api, &format!("{path}/timeline")).await?;
            if *json {
                let both = format!(r#"{{"flow":{one},"timeline":{timeline}}}"#);
                print_json(
                    &ExactJson::parse(both.as_bytes())
                        .map_err(|e| CliError::Decode(e.to_string()))?,
                );
                return Ok(());
            }
            let f: views::Fence = view(one)?;
            let entries: Vec<views::timeline::Entry> = view(timeline)?;
            let f = &f.flow;
            out!("flow     {}", f.id);
            out!("node     {}", f.node);
            out!("state    {} {}", f.step.as_str(), f.status.as_str());
            let boot = |b: Option<uuid::Uuid>| b.map_or("-".to_string(), |u| u.to_string());
            out!(
                "boots    before {}, returned {}",
                boot(f.boot_before),
                boot(f.returned_boot)
            );
            if let Some(a) = &f.alarm {
                out!("ALARM    {a}");
            }
            out!("timeline");
            for e in entries {
                out!("  {}  {:<11}  {}", time(e.at), kind(e.kind), e.what);
            }
        }
    }
    Ok(())
}

fn kind(k: views::timeline::EntryKind) -> &'static str {
    use views::timeline::EntryKind::*;
    match k {
        Observation => "observation",
        Witness => "witness",
        Decision => "decision",
        Effect => "effect",
        Command => "command",
    }
}

pub(super) async fn fencing(cli: &Cli, cmd: &FencingCmd) -> Result<(), CliError> {
    let (path, api) = match cmd {
        FencingCmd::Status { api } => {
            let s: views::FencingSummary = view(api_get(api, "/1/fences/summary").await?)?;
            match &s.paused {
                Some(p) => out!("fencing PAUSED since {}: {}", time(p.since), p.reason),
                None => out!("fencing active"),
            }
            out!(
                "{} nodes with fencing, {} inactive{}",
                s.nodes,
                s.inactive.len(),
                if s.inactive.is_empty() {
                    String::new()
                } else {
                    format!(": {}", s.inactive.join(", "))
                }
            );
            return Ok(());
        }
        FencingCmd::Pause { reason, api } => {
            let q = reason
                .as_deref()
                .map(|r| format!("?reason={}", segment(r)))
                .unwrap_or_default();
            (format!("/1/fencing/pause{q}"), api)
        }
        FencingCmd::Resume { api } => ("/1/fencing/resume".to_string(), api),
    };
    let cfg = cli.load_config()?;
    let p: views::FencingPause = view(api_signed(&cfg, api, reqwest::Method::POST, &path).await?)?;
    match p.pause {
        Some(p) => out!("fencing paused: {}", p.reason),
        None => out!("fencing resumed"),
    }
    Ok(())
}

fn drill_line(d: &maintd_core::fencing::drill::Drill) -> String {
    let stages: Vec<String> = d
        .stages
        .iter()
        .map(|s| format!("{} {:.1}s", s.stage, s.seconds))
        .collect();
    format!(
        "{}  {}  {}  {}{}{}",
        d.id,
        d.node,
        time(d.requested),
        d.status.as_str(),
        if stages.is_empty() {
            String::new()
        } else {
            format!("  {}", stages.join(", "))
        },
        d.detail
            .as_deref()
            .map(|x| format!("  ({x})"))
            .unwrap_or_default()
    )
}

pub(super) async fn drills(json: bool, api: &ApiArgs) -> Result<(), CliError> {
    let v = api_get(api, "/1/drills").await?;
    if json {
        print_json(&v);
        return Ok(());
    }
    let list: Vec<maintd_core::fencing::drill::Drill> = view(v)?;
    if list.is_empty() {
        out!("no drills");
    }
    for d in list {
        out!("{}", drill_line(&d));
    }
    Ok(())
}

/// Starts a drill; with `wait`, follows it to its end. Exit code 0 when it passed (or, without
/// `wait`, started), 1 when it failed or was refused.
pub(super) async fn drill(
    cli: &Cli,
    node: &str,
    wait: bool,
    api: &ApiArgs,
) -> Result<i32, CliError> {
    let cfg = cli.load_config()?;
    let path = format!("/1/nodes/{}/drill", segment(node));
    let d: maintd_core::fencing::drill::Drill =
        view(api_signed(&cfg, api, reqwest::Method::POST, &path).await?)?;
    out!("drill {} on {node} started", d.id);
    if !wait {
        return Ok(0);
    }
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let list: Vec<maintd_core::fencing::drill::Drill> = view(api_get(api, "/1/drills").await?)?;
        let Some(now) = list.into_iter().find(|x| x.id == d.id) else {
            continue;
        };
        if now.status.is_final() {
            out!("{}", drill_line(&now));
            return Ok(i32::from(
                now.status != maintd_core::fencing::drill::DrillStatus::Passed,
            ));
        }
    }
}
