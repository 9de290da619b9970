//! A self-fencing node's wait for the proof of its reset: stand down if it answers, else count
//! it reset only once the proof holds, from its signed report of an armed watchdog. Pure.

use super::ctx::Ctx;
use super::{FenceAction, FenceStatus, Record, Step};
use crate::verdict::Nanos;

/// A self-fencing node, marked: stand down if it answers; else count it reset only once its
/// reset is proven (`selffence::reset_proof`) from its signed report of an armed watchdog. Held
/// during a storm or a pause, like a power-off.
pub(super) fn awaiting_reset(c: &Ctx, out: &mut Vec<FenceAction>) {
    let Ctx {
        s,
        f,
        l,
        hold_power,
        now,
        ..
    } = *c;
    let mut n = f.clone();
    if (l.answered && f.yields_to_answer()) || f.canceled {
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
        out.push(FenceAction::Record(Record::Save(n)));
        return;
    }
    if hold_power {
        return;
    }
    // A proof outlives the process that made it: a starved watchdog is never fed again, so a
    // restart on the same boot resumes the wait at the proven moment of the boot clock, exactly,
    // whatever the wall clock did meanwhile. Another boot (the master rebooted, or another
    // replica leads) cannot tell how much time has passed since: it proves the reset again.
    if f.safe_proven {
        match f.safe_boot {
            Some(at) if at.boot == s.boot.boot => {
                let left = at.ns.saturating_sub(s.boot.ns);
                // The proven moment on this process's steady timeline: the recorded one, unless
                // that timeline was another (its offset lost with the database's record).
                let until = now.saturating_add(left);
                let shown = match f.safe_until {
                    Some(u) if (u - until).abs() < 1_000_000_000 => u,
                    _ => until,
                };
                if left <= 0 {
                    n.fenced_at = Some(now);
                    n.safe_until = Some(shown);
                    n.go(
                        now,
                        Step::SelfFence,
                        FenceStatus::Done,
                        "reset proven: the node starved its watchdog and the watchdog's timeout has passed",
                    );
                    out.push(FenceAction::Record(Record::Save(n)));
                } else if f.safe_until != Some(shown) {
                    n.safe_until = Some(shown);
                    n.updated = now;
                    out.push(FenceAction::Record(Record::Save(n)));
                }
            }
            _ => {
                n.safe_proven = false;
                n.safe_boot = None;
                n.note(now, "the reset was proven by another boot of the master (it rebooted, or another replica led): its clock says nothing about this one's, so the reset is proven again from this process's start");
                out.push(FenceAction::Record(Record::Save(n)));
            }
        }
        return;
    }
    let facts = s.self_fence.get(&f.node).cloned().unwrap_or_default();
    let Some(times) = facts.times.or(f.self_fence_times) else {
        n.go(
            now,
            Step::SelfFence,
            FenceStatus::Error,
            "no signed report of an armed watchdog from this node: it is never counted as reset, and nothing is released",
        );
        out.push(FenceAction::Record(Record::Save(n)));
        return;
    };
    let margin = s.policy.self_fence_margin;
    let after = times.after_quiet(margin);
    n.self_fence_times = Some(times);
    n.safe_time_ms = Some((after / 1_000_000) as u64);
    let Some(evidence) = facts.evidence else {
        // Not leading, or the node's watchers are not known: nothing can be proven yet.
        if f.self_fence_times != Some(times) {
            n.updated = now;
            out.push(FenceAction::Record(Record::Save(n)));
        }
        return;
    };
    let secs = |t: Nanos| t as f64 / 1e9;
    match crate::fencing::selffence::reset_proof(&evidence, &times, margin, now) {
        crate::fencing::selffence::ResetProof::Proven {
            quiet_from,
            reset_by,
        } => {
            n.safe_until = Some(reset_by);
            n.safe_proven = true;
            n.safe_boot = Some(crate::verdict::BootInstant {
                boot: s.boot.boot,
                ns: s.boot.ns.saturating_add(reset_by.saturating_sub(now)),
            });
            n.note(now, format!(
                    "reset proven: no rule could keep the node fed from {:.1} s ago for isolation {:.1} + feed {:.1} s, so its watchdog ({:.1} s, margin {:.1} s) has fired {:.1} s from now",
                    secs(now.saturating_sub(quiet_from)),
                    secs(times.isolation),
                    secs(times.feed_every),
                    secs(times.watchdog_timeout),
                    secs(margin),
                    secs(reset_by.saturating_sub(now)),
                ));
            out.push(FenceAction::Record(Record::Save(n)));
        }
        crate::fencing::selffence::ResetProof::Pending {
            reset_by,
            quiet_from,
            covered,
            needed,
        } => {
            // Recorded when it moves by a second or more (an estimate, not yet a proof).
            let moved = f
                .safe_until
                .is_none_or(|u| (u - reset_by).abs() >= 1_000_000_000);
            if moved || f.self_fence_times != Some(times) {
                let first = f.safe_until.is_none();
                // A process that began to lead after the earlier estimate was made proves from
                // its own start: said once, with the new estimate, so no log repeats the old one.
                let relay = times.master_lost_after.max(times.lost_after);
                let restarted = f.safe_until.is_some_and(|u| reset_by - u >= 5_000_000_000)
                    && quiet_from <= evidence.leading_since.saturating_add(relay);
                n.safe_until = Some(reset_by);
                n.updated = now;
                if restarted {
                    n.note(now, format!(
                            "proving the reset again from this process's start: release not before {:.1} s from now, {:.1} s after the earlier estimate",
                            secs(reset_by.saturating_sub(now)),
                            secs(reset_by - f.safe_until.unwrap_or(reset_by)),
                        ));
                }
                if first {
                    n.note(now, format!(
                            "waiting for proof of the reset: release not before {:.1} s from now (quiet window of isolation {:.1} + feed {:.1} s after lost-after {:.1} / master-lost-after {:.1} s, then watchdog {:.1} + margin {:.1} s); {covered} of {needed} watchers needed have lost the node for the whole window",
                            secs(reset_by.saturating_sub(now)),
                            secs(times.isolation),
                            secs(times.feed_every),
                            secs(times.lost_after),
                            secs(times.master_lost_after.max(times.lost_after)),
                            secs(times.watchdog_timeout),
                            secs(margin),
                        ));
                }
                out.push(FenceAction::Record(Record::Save(n)));
            }
        }
    }
}
