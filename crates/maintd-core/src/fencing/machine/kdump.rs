//! kdump in a flow: no power-off before the kdump window has decided; a notification heard
//! after the node went silent releases its workloads at once (the power-off waits for the dump,
//! in `transitions::pending`). Pure.

use super::ctx::Ctx;
use super::{Effect, FenceAction, FenceStatus, Record, Step};

const WAITING: &str = "power-off waits for a kdump notification";

/// A kdump node's power-off is not sent until its kdump window has decided: until the window
/// after it went silent has passed with no notification (one within it is handled by `kdump`,
/// and the dump then holds the power-off). Returns whether it holds the flow now; says so once.
pub(super) fn window_open(c: &Ctx, out: &mut Vec<FenceAction>) -> bool {
    let Ctx {
        s, f, plan, now, ..
    } = *c;
    if f.step != Step::PowerManagement || !plan.kdump || f.kdump_at.is_some() {
        return false;
    }
    let until = f.detected.saturating_add(s.policy.kdump_window);
    if now >= until {
        return false;
    }
    if !f.history.iter().any(|t| t.note.starts_with(WAITING)) {
        let mut n = f.clone();
        n.note(now, format!(
                "{WAITING} until {:.1} s after it went silent ({:.1} s from now): a crash kernel writing its dump is never cut off; silence until then lets the power-off proceed",
                s.policy.kdump_window as f64 / 1e9,
                (until - now) as f64 / 1e9
            ));
        out.push(FenceAction::Record(Record::Save(n)));
    }
    true
}

/// A node that sends a kdump notification after it went silent runs its crash kernel, and no
/// workload: its workloads are released at once (power-management waits for the dump, in
/// `pending`). Returns whether it decided the flow's record for this tick.
pub(super) fn kdump(c: &Ctx, out: &mut Vec<FenceAction>) -> bool {
    let Ctx { s, f, now, .. } = *c;
    if f.fenced() || f.canceled || matches!(f.status, FenceStatus::Final | FenceStatus::Error) {
        return false;
    }
    let mut n = f.clone();
    if f.kdump_at.is_none() {
        let Some(&t) = s.kdump.get(&f.node).filter(|t| **t > f.detected) else {
            return false;
        };
        n.kdump_at = Some(t);
        n.note(now, format!(
                "kdump notification: the node runs its crash kernel; its workloads are released now, power-management waits {:.0} s for the dump",
                s.policy.kdump_timeout as f64 / 1e9
            ));
        out.push(FenceAction::Record(Record::Save(n)));
        return true;
    }
    if f.released() {
        return false;
    }
    match &f.release_result {
        None => {
            out.push(FenceAction::Effect(Effect::Release {
                flow: f.id,
                node: f.node.clone(),
                attempt: f.restarts,
            }));
            false
        }
        Some(r) => {
            n.release_result = None;
            n.updated = now;
            let note = if r.ok() {
                n.released_at = Some(now);
                format!(
                    "workloads released after the kdump notification: {}",
                    r.detail()
                )
            } else {
                format!(
                    "release after the kdump notification failed ({}); retried",
                    r.detail()
                )
            };
            n.note(now, note);
            out.push(FenceAction::Record(Record::Save(n)));
            true
        }
    }
}
