//! What the operator commands print: the status table and one line per node.

use crate::fencing::readiness::FencingState;
use crate::views;

pub(super) fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The readable table of `maintd status`.
pub fn status_table(events: &[views::Event]) -> String {
    if events.is_empty() {
        return "no repair events\n".into();
    }
    let rows: Vec<[String; 6]> = events
        .iter()
        .map(|e| {
            let jobs = e
                .jobs
                .iter()
                .map(|j| format!("{}:{}:{}", j.id, j.kind.as_str(), j.status.as_str()))
                .collect::<Vec<_>>()
                .join(",");
            let tag_or_note = match &e.note {
                Some(n) => format!("{} ({})", e.tag, short(n, 60)),
                None => e.tag.clone(),
            };
            [
                e.id.to_string(),
                e.node.clone(),
                e.action.as_str().into(),
                e.repair_status.as_str().into(),
                jobs,
                tag_or_note,
            ]
        })
        .collect();
    let head = ["ID", "NODE", "ACTION", "STATUS", "JOBS", "TAG / NOTE"];
    let mut w = head.map(|h| h.len());
    for r in &rows {
        for (i, c) in r.iter().enumerate().take(5) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i < 5 {
                out.push_str(&format!("{c:<width$}  ", width = w[i]));
            } else {
                out.push_str(c);
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(head);
    for r in &rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
    }
    out
}

/// One node of `maintd nodes`: reachability, offline, rejected reports, fence readiness, what
/// its watchers say, and a diagnose error.
pub fn node_line(n: &views::Node) -> String {
    let state = if n.reachable { "up" } else { "DOWN" };
    let diag = n
        .diagnose_error
        .as_ref()
        .map(|e| format!(" diagnose-error: {e}"))
        .unwrap_or_default();
    let off = if n.offline { " offline" } else { "" };
    let fencing = match &n.fencing {
        Some(f) if f.state == FencingState::Inactive => {
            format!(" fencing=INACTIVE ({})", short(&f.detail, 80))
        }
        Some(_) => " fencing=active".into(),
        None => String::new(),
    };
    let peers = match &n.witnesses {
        Some(w) if w.partitioned => format!(
            " PARTITIONED from the master (heard by {})",
            w.heard_by.join(", ")
        ),
        Some(w) => format!(
            " watchers={}/{} hear it",
            w.heard_by.len(),
            w.watchers.len()
        ),
        None => String::new(),
    };
    let watchdog = match n.witnesses.as_ref().and_then(|w| w.watchdog) {
        Some(w) => format!(" watchdog={:.0}s", w.timeout_ms as f64 / 1000.0),
        None => String::new(),
    };
    let maintenance = match &n.maintenance {
        Some(m) => format!(" MAINTENANCE ({})", short(m, 80)),
        None => String::new(),
    };
    format!(
        "{:<20} {state:<5}{off}{maintenance} rejected={}{fencing}{peers}{watchdog}{diag}",
        n.name, n.rejected_reports
    )
}
