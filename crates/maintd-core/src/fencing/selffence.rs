//! Self-fencing by watchdog, the pure part: whether a node keeps feeding its watchdog, judged
//! from round trips it measured on its own clock, and when the master may count a silent
//! self-fencing node as reset. No I/O, no clock.
//!
//! Contact is never judged by when a message arrived: a heartbeat or probe can be delayed by up
//! to its acceptance window (a congested link, or an attacker holding genuine messages). The
//! node counts contact only for an echo of a beat it sent itself, from the moment it sent that
//! beat; the master counts only what it received, at the moment it received it, on its own
//! clock. Each rule the node feeds by then has a bound the master can see (see `reset_proof`).

use serde::{Deserialize, Serialize};

use crate::verdict::Nanos;

/// One of the node's watchers, as the node hears it. Times are the node's own monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatcherContact {
    pub name: String,
    /// A heartbeat of it arrived within `lost-after`: its marks count (a mark only ever stops
    /// feeding, so its arrival time is enough).
    pub heard: bool,
    /// When this node sent the latest of its own beats that this watcher echoed: two-way
    /// contact, as of then.
    pub echoed: Option<Nanos>,
    /// When this node sent the latest beat that this watcher heard before a view the master
    /// acknowledged: the master has seen that the watcher hears this node.
    pub vouched: Option<Nanos>,
    /// Its last heartbeat said the master has marked this node for fencing.
    pub marked_me: bool,
}

/// What the node knows at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedInputs {
    /// The node's monotonic clock.
    pub now: Nanos,
    /// When this node took the view whose beat the master last echoed in a signed probe.
    pub master_contact: Option<Nanos>,
    /// The master's last probe marked this node for fencing.
    pub master_marked: bool,
    /// Every watcher of this node (from the pushed peer set).
    pub watchers: Vec<WatcherContact>,
    /// The last moment a keep-feeding rule held (`None`: never since arming).
    pub last_vouched: Option<Nanos>,
    /// When the watchdog was armed.
    pub armed_at: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedSettings {
    /// A watcher's echo counts for this long after the echoed beat.
    pub lost_after: Nanos,
    /// What came through the master's probe (its echo of this node's view, or a beat a watcher
    /// vouched for) counts for this long after the beat: the round trip takes a probe cycle.
    pub master_lost_after: Nanos,
    /// With no rule holding for this long, the node is the isolated one.
    pub isolation: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Reason {
    /// The master echoed a recent view of this node.
    Master,
    /// A watcher relayed a recent beat of this node that the master saw it hear: the master
    /// sees the node partitioned, never dead.
    WatcherVouches,
    /// Most of its watchers echo recent beats: the master, which needs at least half of them
    /// to say the node is lost, cannot judge it dead (a master or network-core outage). No
    /// reboot storm.
    MasterUnreachable,
    /// No rule holds, but not yet for the isolation timeout.
    Waiting,
    /// The master marked it, directly or through a watcher.
    Marked,
    /// No rule held for the isolation timeout: it is the isolated one.
    Isolated,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Feed the watchdog; `vouched` when a rule held (the shell remembers when).
    Feed { reason: Reason, vouched: bool },
    /// Stop feeding: the watchdog resets the node within its timeout.
    Starve(Reason),
}

fn recent(now: Nanos, at: Option<Nanos>, within: Nanos) -> bool {
    at.is_some_and(|t| now.saturating_sub(t) <= within)
}

/// Whether to feed now.
pub fn decide_feed(i: &FeedInputs, s: &FeedSettings) -> Feed {
    // A node whose own traffic does not get out still hears the mark through its watchers.
    if i.master_marked || i.watchers.iter().any(|w| w.heard && w.marked_me) {
        return Feed::Starve(Reason::Marked);
    }
    let vouched = |reason| Feed::Feed {
        reason,
        vouched: true,
    };
    if recent(i.now, i.master_contact, s.master_lost_after) {
        return vouched(Reason::Master);
    }
    if i.watchers
        .iter()
        .any(|w| recent(i.now, w.vouched, s.master_lost_after))
    {
        return vouched(Reason::WatcherVouches);
    }
    let two_way = i
        .watchers
        .iter()
        .filter(|w| recent(i.now, w.echoed, s.lost_after))
        .count();
    // A strict majority: the master then hears fewer than half of the watchers say the node is
    // lost, too few to judge (`opinion::second_opinion` needs at least half).
    if two_way * 2 > i.watchers.len() {
        return vouched(Reason::MasterUnreachable);
    }
    let since = i.last_vouched.unwrap_or(i.armed_at);
    if i.now.saturating_sub(since) < s.isolation {
        Feed::Feed {
            reason: Reason::Waiting,
            vouched: false,
        }
    } else {
        Feed::Starve(Reason::Isolated)
    }
}

/// What a node reports of its self-fencing (signed in its view), all in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct SelfFenceTimes {
    /// A watcher's echo counts for this long (and a peer unheard for this long is lost).
    pub lost_after: Nanos,
    /// Heartbeat interval.
    pub heartbeat: Nanos,
    /// How often the watchdog is fed.
    pub feed_every: Nanos,
    pub isolation: Nanos,
    pub watchdog_timeout: Nanos,
    /// The master's echo, or a beat a watcher vouched for, counts for this long.
    #[serde(default)]
    pub master_lost_after: Nanos,
}

impl SelfFenceTimes {
    /// From the last moment no rule can hold, the node starves within the isolation timeout
    /// (plus a feed interval for a decision taken just before and written just after), and
    /// its watchdog fires within its timeout. `margin` covers clock rates and scheduling.
    pub fn after_quiet(&self, margin: Nanos) -> Nanos {
        self.isolation + self.feed_every + self.watchdog_timeout + margin
    }

    fn relay(&self) -> Nanos {
        self.master_lost_after.max(self.lost_after)
    }
}

/// What the master saw of one of the node's watchers, on the master's own clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatcherEvidence {
    /// When the master received the latest view of this watcher that said it hears the node.
    pub hears_at: Option<Nanos>,
    /// Since its views began to say it has lost the node: the watcher received nothing from
    /// the node in `(from, until]`.
    pub lost: Option<LostRun>,
}

/// What a watcher's "lost" views cover, on the master's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostRun {
    pub from: Nanos,
    pub until: Nanos,
}

impl LostRun {
    /// A "lost" view answering a probe sent at `sent` and received at `received` was taken
    /// between the two, and says the watcher had received nothing from the node for `quiet`
    /// (its own monotonic clock) when it took it. Conservatively that covers
    /// `(received - quiet, sent]`, which joins the run when the two overlap.
    pub fn extend(run: Option<LostRun>, sent: Nanos, received: Nanos, quiet: Nanos) -> LostRun {
        let from = received.saturating_sub(quiet);
        match run {
            Some(r) if from <= r.until => LostRun {
                from: r.from.min(from),
                until: r.until.max(sent),
            },
            _ => LostRun { from, until: sent },
        }
    }
}

/// Everything the master holds about a silent self-fencing node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetEvidence {
    /// When the master last received a view of the node itself (the master's echo of it keeps
    /// the node fed for at most `master-lost-after` after the node took it, so before then).
    pub master_heard: Option<Nanos>,
    /// Since when this process leads: echoes sent by an earlier leader are older than this.
    pub leading_since: Nanos,
    /// Every watcher of the node, as the node holds them.
    pub watchers: Vec<WatcherEvidence>,
}

/// Whether the master can prove the node has reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetProof {
    /// No rule could hold at the node from `quiet_from` for the isolation timeout: it starved
    /// and never feeds again, and its watchdog has fired by `reset_by`.
    Proven { quiet_from: Nanos, reset_by: Nanos },
    /// Not yet: `covered` of the `needed` watchers have said "lost" for the whole quiet window
    /// so far; `reset_by` is the earliest the proof can give.
    Pending {
        quiet_from: Nanos,
        reset_by: Nanos,
        covered: usize,
        needed: usize,
    },
}

/// The proof, at `now`. The node feeds only while one of its rules held within the isolation
/// timeout, and each rule has a bound in what the master received:
/// - the master's echo: the node took the echoed view before the master received it, and counts
///   it for `master-lost-after`, so not after `master_heard + master-lost-after`;
/// - a watcher's vouch: the master received the acknowledged view (which said the watcher
///   hears the node) after the vouched beat was sent, so not after
///   `hears_at + master-lost-after`;
/// - echoes of a strict majority of watchers: each such watcher received a beat in the
///   `lost-after` before; at least half of the watchers saying "lost" over the whole window
///   leaves no majority (`LostRun`);
/// - an earlier leader's echoes are older than `leading_since`.
///
/// The quiet window starts after all of these and lasts the isolation timeout plus a feed
/// interval; once the master has received every view that falls in it, a rule that held
/// there would show in them.
pub fn reset_proof(e: &ResetEvidence, t: &SelfFenceTimes, margin: Nanos, now: Nanos) -> ResetProof {
    let lost_after = t.lost_after;
    let relay = t.relay();
    let span = t.isolation + t.feed_every;
    let mut quiet_from = e.leading_since.saturating_add(relay);
    if let Some(m) = e.master_heard {
        quiet_from = quiet_from.max(m.saturating_add(relay));
    }
    for h in e.watchers.iter().filter_map(|w| w.hears_at) {
        quiet_from = quiet_from.max(h.saturating_add(relay));
    }
    // At least half of the watchers must have received nothing from `quiet_from - lost-after`
    // (an echo from then still counts at `quiet_from`) to the window's end.
    let needed = e.watchers.len().div_ceil(2);
    let mut starts: Vec<Nanos> = e
        .watchers
        .iter()
        .filter_map(|w| w.lost)
        .map(|r| r.from.saturating_add(lost_after))
        .collect();
    starts.sort_unstable();
    if needed > 0
        && let Some(s) = starts.get(needed - 1)
    {
        quiet_from = quiet_from.max(*s);
    }
    let end = quiet_from.saturating_add(span);
    let covered = e
        .watchers
        .iter()
        .filter_map(|w| w.lost)
        .filter(|r| r.from.saturating_add(lost_after) <= quiet_from && r.until >= end)
        .count();
    let reset_by = quiet_from.saturating_add(t.after_quiet(margin));
    if covered >= needed && now >= end {
        ResetProof::Proven {
            quiet_from,
            reset_by,
        }
    } else {
        ResetProof::Pending {
            quiet_from,
            reset_by,
            covered,
            needed,
        }
    }
}

#[cfg(test)]
mod tests;
