//! Each flow's transitions, one function per phase: isolation, power-off (verified), release,
//! recovery, with retries, restarts and stand-downs. Pure, like the rest of the machine.

use super::ctx::Ctx;
use super::{
    Effect, FenceAction, FenceState, FenceStatus, Flow, PlanSummary, Record, StageLimits, Step,
    fence_failed_tag,
};
use crate::verdict::{Nanos, Outcome};

/// Where a flow stands, which decides the transition it takes next. Derived from the stored
/// `(step, status)`, so flows already in a database or a checkpoint keep their meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing more to do.
    Final,
    /// A step failed for good: restart, or tag the node and wait for the operator.
    Failed,
    /// A step waits for its (next) attempt to be due.
    Pending(Step),
    /// An attempt runs; its outcome is awaited.
    Attempting(Step),
    /// Isolation worked: power off, or recover if the node came back.
    Isolated,
    /// Power-off verified (or a self-fencing node's proven reset moment passed): release the
    /// workloads, then recover.
    PoweredOff,
    /// A self-fencing node is marked unschedulable: wait for the proof of its reset.
    AwaitingReset,
    /// The released node's power-on is verified: recover.
    PoweredOn,
    /// Recovery worked: clear the release, then finish.
    Recovered,
}

impl Flow {
    pub fn phase(&self) -> Phase {
        match (self.status, self.step) {
            (FenceStatus::Final, _) => Phase::Final,
            (FenceStatus::Error, _) => Phase::Failed,
            (FenceStatus::New, step) => Phase::Pending(step),
            (FenceStatus::Running, step) => Phase::Attempting(step),
            (FenceStatus::Done, Step::Isolation) => Phase::Isolated,
            (FenceStatus::Done, Step::PowerManagement) => Phase::PoweredOff,
            (FenceStatus::Done, Step::SelfFence) if self.fenced() => Phase::PoweredOff,
            (FenceStatus::Done, Step::SelfFence) => Phase::AwaitingReset,
            (FenceStatus::Done, Step::PowerOn) => Phase::PoweredOn,
            (FenceStatus::Done, Step::Recovery) => Phase::Recovered,
        }
    }
}

/// The plan of a node no longer configured: no retries, no isolation.
const NO_PLAN: PlanSummary = PlanSummary {
    isolation: None,
    power_management: None,
    power_on: None,
    recovery: StageLimits {
        retries: 0,
        retry_interval: 0,
    },
    self_fence: false,
    kdump: false,
};

pub(super) fn advance(
    s: &FenceState,
    f: &Flow,
    hold_power: bool,
    now: Nanos,
    out: &mut Vec<FenceAction>,
) {
    let c = Ctx {
        s,
        f,
        l: s.liveness.get(&f.node).copied().unwrap_or_default(),
        plan: s.plans.get(&f.node).unwrap_or(&NO_PLAN),
        hold_power,
        maintenance: super::in_maintenance(s, &f.node).is_some(),
        now,
    };
    if super::kdump::kdump(&c, out) {
        return;
    }
    match f.phase() {
        Phase::Final => {}
        Phase::Failed => failed(&c, out),
        Phase::Attempting(_) => attempted(&c, out),
        Phase::Pending(_) => pending(&c, out),
        Phase::Isolated => isolated(&c, out),
        Phase::PoweredOff => powered_off(&c, out),
        Phase::AwaitingReset => super::reset::awaiting_reset(&c, out),
        Phase::PoweredOn => {
            let mut n = f.clone();
            n.go(
                now,
                Step::Recovery,
                FenceStatus::New,
                "power-on verified: recovery starts (the node stays out of service until its new boot is proven)",
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        Phase::Recovered => recovered(&c, out),
    }
}

/// Restart while restarts remain (never once the workloads were released: the node is off or
/// alarmed, and powering it off again proves nothing new); else tag the node, and finish once
/// the operator removes the tag.
fn failed(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx {
        s, f, plan, now, ..
    } = *c;
    let p = &s.policy;
    if f.canceled && is_power_step(f.step) && !f.fenced() && !f.tagged {
        // The operator stood the flow down: undo what it may have done, no tag to acknowledge.
        // (A flow already tagged keeps its tag for the operator to remove, as before.)
        stand_down(c, out);
        return;
    }
    if let Some(by) = &f.acknowledged {
        if f.released() && !f.reclaimed {
            super::back::acknowledged(c, by, out);
        } else {
            let mut n = f.clone();
            n.go(
                now,
                f.step,
                FenceStatus::Final,
                format!("acknowledged by {by}"),
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        return;
    }
    let mut n = f.clone();
    if f.restarts < p.max_restarts && !f.canceled && !f.released() && f.alarm.is_none() {
        n.restarts += 1;
        n.retries = 0;
        n.result = None;
        n.release_result = None;
        n.next_attempt = now;
        n.go(
            now,
            plan.first_step(),
            FenceStatus::New,
            format!("restart {} of {} after error", n.restarts, p.max_restarts),
        );
        out.push(FenceAction::Record(Record::Save(n)));
    } else if !f.tagged {
        out.push(FenceAction::Effect(Effect::TagFailed {
            flow: f.id,
            node: f.node.clone(),
            tag: fence_failed_tag(&f.id),
        }));
    } else if !s
        .tags
        .get(&f.node)
        .is_some_and(|t| t.contains(&fence_failed_tag(&f.id)))
    {
        if f.released() && !f.reclaimed {
            // The same acknowledgement as `maintd fences ack`: the node returns to service
            // once it answers healthy, rather than staying released with nothing to say why.
            n.acknowledged = Some("the removal of its fencefailed tag".into());
            n.note(now, "fencefailed tag removed (acknowledged)");
        } else {
            n.go(
                now,
                f.step,
                FenceStatus::Final,
                "fencefailed tag removed (acknowledged)",
            );
        }
        out.push(FenceAction::Record(Record::Save(n)));
    }
}

/// The running attempt's outcome: done, retry later, or failed for good.
fn attempted(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, plan, now, .. } = *c;
    let mut n = f.clone();
    let Some(r) = &f.result else {
        return;
    };
    n.result = None;
    if r.ok() {
        match f.step {
            Step::Isolation => {
                n.isolated_at = Some(now);
            }
            Step::PowerManagement => {
                n.fenced_at = Some(now);
                n.marked = true;
                n.boot_before = f.boot_before.or(c.l.boot.map(|b| b.id));
            }
            Step::PowerOn => n.powered_on_at = Some(now),
            Step::SelfFence => n.marked = true,
            Step::Recovery => {}
        }
        n.retries = 0;
        n.go(now, f.step, FenceStatus::Done, r.detail());
    } else if f.retries < plan.limits(f.step).retries {
        n.retries += 1;
        n.next_attempt = now + plan.limits(f.step).retry_interval;
        let note = format!(
            "attempt failed ({}); retry {} of {}",
            r.detail(),
            n.retries,
            plan.limits(f.step).retries
        );
        n.go(now, f.step, FenceStatus::New, note);
    } else if f.step == Step::PowerManagement && plan.self_fence {
        // The last level: the node's own watchdog.
        n.retries = 0;
        n.next_attempt = now;
        let note = format!(
            "power-management failed after {} attempts ({}); falling back to self-fencing",
            f.retries + 1,
            r.detail()
        );
        n.go(now, Step::SelfFence, FenceStatus::New, note);
    } else if f.step == Step::PowerOn {
        let note = format!(
            "power-on failed after {} attempts: {}; the workloads stay released and the node stays out of service",
            f.retries + 1,
            r.detail()
        );
        n.go(now, f.step, FenceStatus::Error, note);
    } else {
        let note = format!("failed after {} attempts: {}", f.retries + 1, r.detail());
        n.go(now, f.step, FenceStatus::Error, note);
    }
    out.push(FenceAction::Record(Record::Save(n)));
}

/// A step before the power-off is proven: one a cancel or the node's answer still stands down.
fn is_power_step(step: Step) -> bool {
    !matches!(step, Step::Recovery | Step::PowerOn)
}

/// Ends a flow before its power-off (canceled, or the node answered): through recovery when
/// anything may need undoing, else at once.
fn stand_down(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, now, .. } = *c;
    let mut n = f.clone();
    let why = if f.canceled {
        "canceled before power-off"
    } else {
        "node answered again before power-off"
    };
    // A power-off attempt marked the node: its recovery clears the mark. An isolation attempt
    // that failed may have isolated the node all the same: recovery undoes it too.
    let marked = f.marked || f.step_reached(Step::PowerManagement);
    if f.isolated() || f.released() || marked || f.step_attempted(Step::Isolation) {
        n.marked = marked;
        n.result = None;
        n.retries = 0;
        n.next_attempt = now;
        n.go(
            now,
            Step::Recovery,
            FenceStatus::New,
            format!("{why}; undoing isolation and release"),
        );
    } else {
        n.go(now, f.step, FenceStatus::Final, why);
    }
    out.push(FenceAction::Record(Record::Save(n)));
}

/// Stand down if the node answered (or the operator canceled) before the power-off; else start
/// the attempt once it is due, power held back during a storm or a pause, recovery held back
/// until every witness is healthy.
fn pending(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx {
        f,
        l,
        hold_power,
        now,
        ..
    } = *c;
    let mut n = f.clone();
    let power_step = is_power_step(f.step);
    if power_step && !f.fenced() && ((l.answered && f.yields_to_answer()) || f.canceled) {
        stand_down(c, out);
        return;
    }
    if (power_step && hold_power) || c.maintenance || now < f.next_attempt {
        return;
    }
    let dumping = f
        .kdump_at
        .is_some_and(|t| now < t.saturating_add(c.s.policy.kdump_timeout));
    if dumping && matches!(f.step, Step::PowerManagement | Step::SelfFence) {
        // The crash kernel writes its dump: power-off waits for it (an attempt that was
        // already running when the notification came is not started again meanwhile).
        return;
    }
    if super::kdump::window_open(c, out) {
        return;
    }
    // Left off (or reset by itself): recovery's agents wait for the proof of its return.
    // Powered on: they run now (its fabric may need them to answer at all), and the return to
    // service waits for the proof instead.
    if f.step == Step::Recovery
        && f.powered_on_at.is_none()
        && !matches!(super::back::gate(c, out), super::back::Gate::Pass(_))
    {
        return;
    }
    n.go(
        now,
        f.step,
        FenceStatus::Running,
        format!("attempt {}", f.retries + 1),
    );
    out.push(FenceAction::Effect(Effect::run_step(&n)));
    out.push(FenceAction::Record(Record::Save(n)));
}

/// Power off the node if it is still silent; recover without a power-off if it answered.
fn isolated(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, l, now, .. } = *c;
    let mut n = f.clone();
    if (l.answered && f.yields_to_answer()) || f.canceled {
        n.go(
            now,
            Step::Recovery,
            FenceStatus::New,
            "node answered during isolation: recovery, no power-off",
        );
    } else {
        n.next_attempt = now;
        n.go(
            now,
            c.plan.power_step(),
            FenceStatus::New,
            "isolated; node still silent",
        );
    }
    out.push(FenceAction::Record(Record::Save(n)));
}

/// Release the workloads (the power-off is verified), then wait for recovery.
fn powered_off(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, plan, now, .. } = *c;
    let mut n = f.clone();
    match (&f.release_result, f.released()) {
        (_, true) if plan.power_on.is_some() && f.step != Step::SelfFence => {
            n.next_attempt = now;
            n.go(
                now,
                Step::PowerOn,
                FenceStatus::New,
                "released; powering the node back on",
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        (_, true) => {
            n.go(
                now,
                Step::Recovery,
                FenceStatus::New,
                "released; waiting for the node to return with a new boot",
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        (None, false) => out.push(FenceAction::Effect(Effect::Release {
            flow: f.id,
            node: f.node.clone(),
            attempt: f.restarts,
        })),
        (Some(Outcome::Done { detail }), false) => {
            n.released_at = Some(now);
            n.release_result = None;
            n.go(
                now,
                f.step,
                FenceStatus::Done,
                format!("workloads released: {detail}"),
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        (Some(Outcome::Failed { detail, .. }), false) => {
            n.release_result = None;
            n.go(
                now,
                f.step,
                FenceStatus::Error,
                format!("release failed: {detail}"),
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
    }
}

/// Return the node to service once its return is proven (clear the release and the mark),
/// then finish.
fn recovered(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, now, .. } = *c;
    let mut n = f.clone();
    match (&f.reclaim_result, f.released() && !f.reclaimed) {
        (_, false) => {
            n.go(now, Step::Recovery, FenceStatus::Final, "recovered");
            out.push(FenceAction::Record(Record::Save(n)));
        }
        (None, true) if f.returned_at.is_none() => match super::back::gate(c, out) {
            super::back::Gate::Pass(why) => {
                n.returned_at = Some(now);
                n.updated = now;
                n.history.push(super::Transition {
                    at: now,
                    step: f.step,
                    status: f.status,
                    note: format!("return to service proven: {why}"),
                });
                out.push(FenceAction::Record(Record::Save(n)));
                out.push(Effect::reclaim(f).into());
            }
            super::back::Gate::Wait | super::back::Gate::Decided => {}
        },
        (None, true) => out.push(Effect::reclaim(f).into()),
        (Some(Outcome::Done { detail }), true) => {
            n.reclaimed = true;
            n.reclaim_result = None;
            n.go(
                now,
                Step::Recovery,
                FenceStatus::Final,
                format!("returned to service: {detail}"),
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
        (Some(Outcome::Failed { detail, .. }), true) => {
            n.reclaim_result = None;
            n.go(
                now,
                Step::Recovery,
                FenceStatus::Error,
                format!("clearing the release failed: {detail}"),
            );
            out.push(FenceAction::Record(Record::Save(n)));
        }
    }
}
