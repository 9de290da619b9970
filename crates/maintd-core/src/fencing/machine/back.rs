//! A fenced node's return to service, only on proof: a boot id other than the one it had
//! before the fence, enough healthy reports from diagnoses started after that boot, and every
//! other witness that declared it dead alive again; the alarm when it answers with its old boot
//! id after a verified power-off; the deadline after its power-on. Pure.

use super::ctx::Ctx;
use super::{BootSeen, Effect, FenceAction, FenceStatus, Record, Step, Transition};
use crate::verdict::Nanos;

/// Folds one verified report into what is known of the node's boot: a new boot id starts the
/// count again; a healthy report from a diagnose that started after the boot, and that was not
/// counted yet, adds one; any other report breaks the run. A report re-served from the same
/// diagnose changes nothing.
pub fn observe_report(
    prev: Option<BootSeen>,
    boot: Option<(uuid::Uuid, Nanos)>,
    diagnosed_at: Nanos,
    healthy: bool,
) -> Option<BootSeen> {
    let (id, booted_at) = boot?;
    let mut b = match prev {
        Some(p) if p.id == id => p,
        _ => BootSeen {
            id,
            booted_at,
            reported_at: Nanos::MIN,
            clean: 0,
        },
    };
    if diagnosed_at == b.reported_at {
        return Some(b);
    }
    // A report older than one already counted (reordered on the way) proves nothing new.
    if diagnosed_at < b.reported_at {
        return Some(b);
    }
    b.reported_at = diagnosed_at;
    b.clean = if healthy && diagnosed_at > b.booted_at {
        b.clean.saturating_add(1)
    } else {
        0
    };
    Some(b)
}

/// When the flow's first power-off call was made, whichever daemon made it (one that stopped
/// mid-call left it recorded without an answer): the device may have acted from then on.
fn first_power_off(f: &super::Flow) -> Option<Nanos> {
    f.calls
        .iter()
        .filter(|c| c.step == Step::PowerManagement && c.action != "status")
        .filter(|c| c.ok || c.pending)
        .map(|c| c.at)
        .min()
}

/// What the return gate decided.
pub(super) enum Gate {
    /// Proven: return to service (the note says on what).
    Pass(String),
    /// Not yet; nothing to record.
    Wait,
    /// Recorded (a milestone, the alarm or the deadline): decided for this tick.
    Decided,
}

/// Whether a node that was fenced (powered off, reset, or released after a kdump) has proven
/// its return. Flows that never fenced pass at once: the node never went down.
pub(super) fn gate(c: &Ctx, out: &mut Vec<FenceAction>) -> Gate {
    let Ctx { s, f, l, now, .. } = *c;
    if f.canceled && !f.fenced() {
        // Never powered off, and the operator stood it down: what this flow did is undone now,
        // whether or not the node ever comes back (a dead one would hold it for good).
        return Gate::Pass("canceled by an operator before any power-off".into());
    }
    let proven = f.fenced_at.or(f.kdump_at);
    let Some(down_at) = proven.filter(|_| f.fenced() || f.kdump_at.is_some()) else {
        return Gate::Pass("the node was never powered off".into());
    };
    let secs = |t: Nanos| t as f64 / 1e9;
    let mut n = f.clone();
    let boot = l.boot;
    // A diagnose that started after the verified off, run under the boot from before it:
    // the node never went down.
    if let (Some(b), Some(before)) = (boot, f.boot_before)
        && b.id == before
        && b.reported_at > down_at
    {
        let detail = format!(
            "ALARM: the node answered with its boot id {before} from before the verified power-off (a diagnose {:.1} s after it): the fence device lied or switched another node; the node stays out of service",
            secs(b.reported_at - down_at)
        );
        n.alarm = Some(detail.clone());
        n.go(now, Step::Recovery, FenceStatus::Error, detail.clone());
        out.push(FenceAction::Effect(Effect::Alarm {
            flow: f.id,
            node: f.node.clone(),
            detail,
        }));
        out.push(FenceAction::Record(Record::Save(n)));
        return Gate::Decided;
    }
    // The deadline runs from the power-on, or from the proven reset of a node that resets
    // itself; a node left off waits for a person, without one.
    let since = f
        .powered_on_at
        .or_else(|| (f.step_reached(Step::SelfFence) || f.kdump_at.is_some()).then_some(down_at));
    if let Some(since) = since
        && now.saturating_sub(since) > s.policy.return_deadline
    {
        let note = format!(
            "did not return to service within {:.0} s of its {}: {}; it stays out of service",
            secs(s.policy.return_deadline),
            if f.powered_on_at.is_some() {
                "power-on"
            } else {
                "reset"
            },
            missing(c, down_at).unwrap_or_else(|| "no proof yet".into()),
        );
        n.go(now, Step::Recovery, FenceStatus::Error, note);
        out.push(FenceAction::Record(Record::Save(n)));
        return Gate::Decided;
    }
    // The new boot is a milestone of its own in the record.
    if f.returned_boot.is_none()
        && let Some(b) = boot.filter(|b| new_boot(f.boot_before, b, down_at))
    {
        n.returned_boot = Some(b.id);
        n.updated = now;
        n.history.push(Transition {
            at: now,
            step: f.step,
            status: f.status,
            note: format!(
                "new boot id {} (before the fence: {}), booted {:.1} s after the power-off",
                b.id,
                f.boot_before
                    .map_or_else(|| "never reported".to_string(), |u| u.to_string()),
                secs(
                    b.booted_at
                        .saturating_sub(first_power_off(f).unwrap_or(down_at))
                ),
            ),
        });
        out.push(FenceAction::Record(Record::Save(n)));
        return Gate::Decided;
    }
    match missing(c, down_at) {
        // Once the new boot and its healthy reports are in, the record says what the return
        // still waits for (the kubelet's Ready, a Lease, a condition), and again only when that
        // changes: a node back up but out of service is never left unexplained.
        Some(why) if f.returned_boot.is_some() && reports_in(c) => {
            let note = format!("the return to service waits for: {why}");
            if f.history.last().is_some_and(|t| t.note == note) {
                return Gate::Wait;
            }
            n.updated = now;
            n.history.push(Transition {
                at: now,
                step: f.step,
                status: f.status,
                note,
            });
            out.push(FenceAction::Record(Record::Save(n)));
            Gate::Decided
        }
        Some(_) => Gate::Wait,
        None => {
            let b = boot.expect("a proof has a boot");
            let mut why = format!(
                "boot id {}, {} healthy reports from diagnoses after the boot",
                b.id, b.clean
            );
            if s.returns.get(&f.node).and_then(|r| r.ready) == Some(true) {
                why.push_str(", kubelet Ready");
            }
            let leases = lease_witnesses(f);
            if !leases.is_empty() {
                why.push_str(&format!(", renewed: {}", leases.join(", ")));
            }
            Gate::Pass(why)
        }
    }
}

/// A boot other than the one from before the fence; when that one is unknown, a boot after
/// the power-off by the node's own clock.
fn new_boot(before: Option<uuid::Uuid>, b: &BootSeen, down_at: Nanos) -> bool {
    match before {
        Some(id) => b.id != id,
        None => b.booted_at > down_at,
    }
}

/// The Lease witnesses that declared the node dead.
fn lease_witnesses(f: &super::Flow) -> Vec<String> {
    f.witnesses
        .peers
        .iter()
        .map(|p| p.watcher.clone())
        .filter(|w| w.starts_with("lease:"))
        .collect()
}

/// The node's own part of the proof is in: enough healthy reports from its new boot, and its
/// collector answers.
fn reports_in(c: &Ctx) -> bool {
    let need = c.s.policy.clean_reports.max(1);
    c.l.boot.is_some_and(|b| b.clean >= need) && !c.l.probe_silent
}

/// What the proof still lacks, or `None` once it is complete.
fn missing(c: &Ctx, down_at: Nanos) -> Option<String> {
    let Ctx { s, f, l, .. } = *c;
    let need = s.policy.clean_reports.max(1);
    let Some(b) = l.boot else {
        return Some("no report with a boot id since the fence".into());
    };
    if !new_boot(f.boot_before, &b, down_at) {
        return Some(format!("no report from a new boot (boot id {})", b.id));
    }
    if b.clean < need || l.probe_silent {
        return Some(format!(
            "{} of {need} healthy reports from diagnoses after the boot",
            b.clean
        ));
    }
    if f.witnesses.condition.is_some() && l.condition_fence {
        return Some(format!(
            "the fence rule {} still holds",
            f.witnesses.condition.as_deref().unwrap_or_default()
        ));
    }
    let facts = s.returns.get(&f.node);
    if facts.and_then(|r| r.ready) == Some(false) {
        return Some("the kubelet is not Ready".into());
    }
    let since = f.powered_on_at.unwrap_or(down_at);
    for w in lease_witnesses(f) {
        let renewed = facts.and_then(|r| r.renewed.get(&w)).copied();
        if renewed.is_none_or(|t| t <= since) {
            return Some(format!("{w} not renewed since the node came back"));
        }
    }
    None
}

impl super::Flow {
    /// Whether any transition of the flow was in `step`.
    pub(super) fn step_reached(&self, step: Step) -> bool {
        self.history.iter().any(|t| t.step == step)
    }

    /// Whether an attempt of `step` ever ran. An agent may act and still fail (a timeout after
    /// the switch took the port down, a status check that did not answer), so an attempt that
    /// failed may have done its work all the same.
    pub(super) fn step_attempted(&self, step: Step) -> bool {
        self.history
            .iter()
            .any(|t| t.step == step && t.status == super::FenceStatus::Running)
    }
}

/// An operator acknowledged a released node's failure or alarm (they checked the device and
/// the node): it returns to service as soon as it answers and reports healthy, and until then
/// the flow waits, saying so once.
pub(super) fn acknowledged(c: &Ctx, by: &str, out: &mut Vec<FenceAction>) {
    let Ctx { f, l, now, .. } = *c;
    let mut n = f.clone();
    // Its latest report healthy (an unhealthy one resets the count) and its probe answered.
    if l.answered && l.boot.is_some_and(|b| b.clean > 0) {
        n.returned_at = Some(now);
        n.go(
            now,
            Step::Recovery,
            FenceStatus::Done,
            format!(
                "acknowledged by {by}; the node answers and reports healthy: it returns to service"
            ),
        );
        out.push(FenceAction::Record(Record::Save(n)));
    } else if !f
        .history
        .last()
        .is_some_and(|t| t.note.starts_with(ACK_WAIT))
    {
        n.updated = now;
        n.history.push(super::Transition {
            at: now,
            step: f.step,
            status: f.status,
            note: format!("{ACK_WAIT} (acknowledged by {by})"),
        });
        out.push(FenceAction::Record(Record::Save(n)));
    }
}

/// What an acknowledged flow of a released node still waits for.
pub const ACK_WAIT: &str = "the return to service waits for the node to answer and report healthy";
