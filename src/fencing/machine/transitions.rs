//! Each flow's transitions, one function per phase: isolation, power-off (verified), release,
//! recovery, with retries, restarts and stand-downs. Pure, like the rest of the machine.

use super::{
    FenceAction, FenceState, FenceStatus, Flow, Liveness, PlanSummary, StageLimits, Step,
    fence_failed_tag,
};
use crate::verdict::Nanos;

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
    /// Power-off verified (or the safe time of a self-fencing node passed): release the
    /// workloads, then recover.
    PoweredOff,
    /// A self-fencing node is marked unschedulable: wait for its safe time.
    AwaitingReset,
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
            (FenceStatus::Done, Step::SelfFence) if self.fenced => Phase::PoweredOff,
            (FenceStatus::Done, Step::SelfFence) => Phase::AwaitingReset,
            (FenceStatus::Done, Step::Recovery) => Phase::Recovered,
        }
    }
}

/// What every transition of one flow reads.
struct Ctx<'a> {
    s: &'a FenceState,
    f: &'a Flow,
    l: Liveness,
    plan: &'a PlanSummary,
    hold_power: bool,
    now: Nanos,
}

/// The plan of a node no longer configured: no retries, no isolation.
const NO_PLAN: PlanSummary = PlanSummary {
    isolation: None,
    power_management: None,
    recovery: StageLimits {
        retries: 0,
        retry_interval: 0,
    },
    self_fence: false,
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
        now,
    };
    match f.phase() {
        Phase::Final => {}
        Phase::Failed => failed(&c, out),
        Phase::Attempting(_) => attempted(&c, out),
        Phase::Pending(_) => pending(&c, out),
        Phase::Isolated => isolated(&c, out),
        Phase::PoweredOff => powered_off(&c, out),
        Phase::AwaitingReset => awaiting_reset(&c, out),
        Phase::Recovered => recovered(&c, out),
    }
}

/// Restart while restarts remain; else tag the node, and finish once the operator removes the
/// tag.
fn failed(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx {
        s, f, plan, now, ..
    } = *c;
    let p = &s.policy;
    let mut n = f.clone();
    if f.restarts < p.max_restarts && !f.canceled {
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
        out.push(FenceAction::Save(n));
    } else if !f.tagged {
        out.push(FenceAction::TagFailed {
            flow: f.id,
            node: f.node.clone(),
            tag: fence_failed_tag(&f.id),
        });
    } else if !s
        .tags
        .get(&f.node)
        .is_some_and(|t| t.contains(&fence_failed_tag(&f.id)))
    {
        n.go(
            now,
            f.step,
            FenceStatus::Final,
            "fencefailed tag removed (acknowledged)",
        );
        out.push(FenceAction::Save(n));
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
    if r.ok {
        match f.step {
            Step::Isolation => {
                n.isolated = true;
                n.isolated_at = Some(now);
            }
            Step::PowerManagement => {
                n.fenced = true;
                n.fenced_at = Some(now);
            }
            Step::SelfFence => n.marked = true,
            Step::Recovery => {}
        }
        n.retries = 0;
        n.go(now, f.step, FenceStatus::Done, r.detail.clone());
    } else if f.retries < plan.limits(f.step).retries {
        n.retries += 1;
        n.next_attempt = now + plan.limits(f.step).retry_interval;
        let note = format!(
            "attempt failed ({}); retry {} of {}",
            r.detail,
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
            r.detail
        );
        n.go(now, Step::SelfFence, FenceStatus::New, note);
    } else {
        let note = format!("failed after {} attempts: {}", f.retries + 1, r.detail);
        n.go(now, f.step, FenceStatus::Error, note);
    }
    out.push(FenceAction::Save(n));
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
    let power_step = f.step != Step::Recovery;
    if power_step && !f.fenced && (l.reachable || f.canceled) {
        let why = if f.canceled {
            "canceled before power-off"
        } else {
            "node answered again before power-off"
        };
        if f.isolated {
            n.go(
                now,
                Step::Recovery,
                FenceStatus::New,
                format!("{why}; undoing isolation"),
            );
        } else {
            n.go(now, f.step, FenceStatus::Final, why);
        }
        out.push(FenceAction::Save(n));
        return;
    }
    if (power_step && hold_power) || now < f.next_attempt {
        return;
    }
    if f.step == Step::Recovery && f.fenced && !f.witnesses.recovered(&l, f.fenced_at) {
        // Powered off: wait until every witness that declared it dead is healthy again.
        return;
    }
    n.go(
        now,
        f.step,
        FenceStatus::Running,
        format!("attempt {}", f.retries + 1),
    );
    out.push(FenceAction::Save(n));
    out.push(FenceAction::RunStep {
        flow: f.id,
        node: f.node.clone(),
        step: f.step,
    });
}

/// Power off the node if it is still silent; recover without a power-off if it answered.
fn isolated(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, l, now, .. } = *c;
    let mut n = f.clone();
    if l.reachable || f.canceled {
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
    out.push(FenceAction::Save(n));
}

/// Release the workloads (the power-off is verified), then wait for recovery.
fn powered_off(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, now, .. } = *c;
    let mut n = f.clone();
    match (&f.release_result, f.released) {
        (_, true) => {
            n.go(
                now,
                Step::Recovery,
                FenceStatus::New,
                "released; waiting for the node to return healthy",
            );
            out.push(FenceAction::Save(n));
        }
        (None, false) => out.push(FenceAction::Release {
            flow: f.id,
            node: f.node.clone(),
            attempt: f.restarts,
        }),
        (Some(r), false) if r.ok => {
            n.released = true;
            n.released_at = Some(now);
            n.release_result = None;
            n.go(
                now,
                f.step,
                FenceStatus::Done,
                format!("workloads released: {}", r.detail),
            );
            out.push(FenceAction::Save(n));
        }
        (Some(r), false) => {
            n.release_result = None;
            n.go(
                now,
                f.step,
                FenceStatus::Error,
                format!("release failed: {}", r.detail),
            );
            out.push(FenceAction::Save(n));
        }
    }
}

/// A self-fencing node, marked: stand down if it answers; else count it reset once the safe
/// time has passed since any witness last heard it, and only with its signed report of an
/// armed watchdog. Held during a storm or a pause, like a power-off.
fn awaiting_reset(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx {
        s,
        f,
        l,
        hold_power,
        now,
        ..
    } = *c;
    let mut n = f.clone();
    if l.reachable || f.canceled {
        let why = if f.canceled {
            "canceled before its safe time"
        } else {
            "node answered before its safe time"
        };
        n.go(
            now,
            Step::Recovery,
            FenceStatus::New,
            format!("{why}: nothing released; clearing the mark"),
        );
        out.push(FenceAction::Save(n));
        return;
    }
    if hold_power {
        return;
    }
    let facts = s.self_fence.get(&f.node).copied().unwrap_or_default();
    // The proof outlives the leader: once a leader that held the node's signed report has put
    // the safe time in the flow, a restart or a failover mid-wait (a new leader holds no view
    // of a node that is already silent) resumes the wait instead of failing it.
    let safe = match (facts.times, f.safe_time_ms) {
        (Some(times), _) => {
            crate::fencing::selffence::safe_time(&times, s.policy.self_fence_margin)
        }
        (None, Some(ms)) => (ms as Nanos).saturating_mul(1_000_000),
        (None, None) => {
            n.go(
                now,
                Step::SelfFence,
                FenceStatus::Error,
                "no signed report of an armed watchdog from this node: it is never counted as reset, and nothing is released",
            );
            out.push(FenceAction::Save(n));
            return;
        }
    };
    let from = facts.last_heard.unwrap_or(f.detected).max(f.detected);
    // Never shorter than a wait already recorded: a leader that heard less of the node's
    // watchers must not release earlier than one that heard more.
    let until = from.saturating_add(safe).max(f.safe_until.unwrap_or(0));
    if now >= until {
        n.fenced = true;
        n.fenced_at = Some(now);
        n.safe_until = Some(until);
        n.go(
            now,
            Step::SelfFence,
            FenceStatus::Done,
            format!(
                "safe time {:.1} s passed since the node was last heard: its watchdog has reset it",
                safe as f64 / 1e9
            ),
        );
        out.push(FenceAction::Save(n));
    } else if f.safe_until != Some(until) {
        n.safe_time_ms = Some((safe / 1_000_000) as u64);
        n.safe_until = Some(until);
        n.updated = now;
        let left = until.saturating_sub(now) as f64 / 1e9;
        let note = match facts.times {
            Some(times) => format!(
                "safe time {:.1} s = lost-after {:.1} + heartbeat {:.1} + isolation {:.1} + feed {:.1} + watchdog {:.1} + margin {:.1}, from last heard; release not before {left:.1} s from now",
                safe as f64 / 1e9,
                times.lost_after as f64 / 1e9,
                times.heartbeat as f64 / 1e9,
                times.isolation as f64 / 1e9,
                times.feed_every as f64 / 1e9,
                times.watchdog_timeout as f64 / 1e9,
                s.policy.self_fence_margin as f64 / 1e9,
            ),
            None => format!(
                "safe time {:.1} s as recorded in the flow (the node's signed report was held by an earlier leader), from last heard; release not before {left:.1} s from now",
                safe as f64 / 1e9
            ),
        };
        n.history.push(super::Transition {
            at: now,
            step: Step::SelfFence,
            status: FenceStatus::Done,
            note,
        });
        out.push(FenceAction::Save(n));
    }
}

/// Clear the release once the node is back, then finish.
fn recovered(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx { f, now, .. } = *c;
    let mut n = f.clone();
    match (&f.reclaim_result, f.released && !f.reclaimed) {
        (_, false) => {
            n.go(now, Step::Recovery, FenceStatus::Final, "recovered");
            out.push(FenceAction::Save(n));
        }
        (None, true) => out.push(FenceAction::Reclaim {
            flow: f.id,
            node: f.node.clone(),
        }),
        (Some(r), true) if r.ok => {
            n.reclaimed = true;
            n.reclaim_result = None;
            n.go(
                now,
                Step::Recovery,
                FenceStatus::Final,
                format!("release cleared; recovered: {}", r.detail),
            );
            out.push(FenceAction::Save(n));
        }
        (Some(r), true) => {
            n.reclaim_result = None;
            n.go(
                now,
                Step::Recovery,
                FenceStatus::Error,
                format!("clearing the release failed: {}", r.detail),
            );
            out.push(FenceAction::Save(n));
        }
    }
}
