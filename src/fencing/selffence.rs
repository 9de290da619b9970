//! Self-fencing by watchdog (issue 13 §4, seed 003), the pure part: whether a node keeps feeding
//! its watchdog, judged from whom it is in two-way contact with, and the safe time after which
//! the master may count a silent self-fencing node as reset. The rules mirror the master's second
//! opinion (`opinion`), so the two sides can never both act: whenever the master could judge the
//! node dead, the node stops feeding. No I/O, no clock.

use crate::verdict::Nanos;

/// One of the node's watchers, as the node hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatcherContact {
    pub name: String,
    /// Heard within `lost-after`: what its heartbeats say counts (they are signed and fresh).
    pub heard: bool,
    /// Heard, and its last heartbeat said it hears this node.
    pub two_way: bool,
    /// Its last heartbeat said the master reaches it (two-way).
    pub master_ok: bool,
    /// Its last heartbeat said the master has marked this node for fencing.
    pub marked_me: bool,
}

/// What the node knows at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedInputs {
    pub now: Nanos,
    /// The last signed probe of the master that said it hears this node.
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
    /// A probe of the master counts for this long.
    pub master_fresh: Nanos,
    /// With no rule holding for this long, the node is the isolated one.
    pub isolation: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Reason {
    /// The master hears this node.
    Master,
    /// A watcher the master reaches hears this node: the master sees it partitioned, never dead.
    WatcherVouches,
    /// Most of its watchers hear it and none reaches the master: the master cannot hear enough
    /// of them to judge (a master or network-core outage). No reboot storm.
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

/// Whether to feed now.
pub fn decide_feed(i: &FeedInputs, s: &FeedSettings) -> Feed {
    let contacts: Vec<&WatcherContact> =
        i.watchers.iter().filter(|w| w.heard && w.two_way).collect();
    // A node whose own traffic does not get out still hears the mark through its watchers.
    if i.master_marked || i.watchers.iter().any(|w| w.heard && w.marked_me) {
        return Feed::Starve(Reason::Marked);
    }
    let vouched = |reason| Feed::Feed {
        reason,
        vouched: true,
    };
    if i.master_contact
        .is_some_and(|t| i.now.saturating_sub(t) <= s.master_fresh)
    {
        return vouched(Reason::Master);
    }
    if contacts.iter().any(|w| w.master_ok) {
        return vouched(Reason::WatcherVouches);
    }
    // A strict majority: the master then hears fewer than half of the watchers, too few to
    // judge (`opinion::second_opinion` needs at least half).
    if contacts.len() * 2 > i.watchers.len() {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfFenceTimes {
    /// A peer unheard for this long is lost.
    pub lost_after: Nanos,
    /// Heartbeat interval.
    pub heartbeat: Nanos,
    /// How often the watchdog is fed.
    pub feed_every: Nanos,
    pub isolation: Nanos,
    pub watchdog_timeout: Nanos,
}

/// The time after the last moment any witness heard the node by which it has certainly been
/// reset: its watchers stop vouching for it within `lost-after` plus one heartbeat (which
/// carries the news), it then feeds for at most the isolation timeout (plus the feed
/// interval, for the decision in flight), and its watchdog fires within its timeout. `margin`
/// covers clock rates and scheduling.
pub fn safe_time(t: &SelfFenceTimes, margin: Nanos) -> Nanos {
    t.lost_after + t.heartbeat + t.isolation + t.feed_every + t.watchdog_timeout + margin
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;

    fn settings() -> FeedSettings {
        FeedSettings {
            master_fresh: 3 * S,
            isolation: 10 * S,
        }
    }

    fn w(two_way: bool, master_ok: bool) -> WatcherContact {
        WatcherContact {
            name: "w".into(),
            heard: true,
            two_way,
            master_ok,
            marked_me: false,
        }
    }

    fn inputs(watchers: Vec<WatcherContact>) -> FeedInputs {
        FeedInputs {
            now: 100 * S,
            master_contact: None,
            master_marked: false,
            watchers,
            last_vouched: Some(95 * S),
            armed_at: 0,
        }
    }

    fn reason(f: Feed) -> Reason {
        match f {
            Feed::Feed { reason, .. } | Feed::Starve(reason) => reason,
        }
    }

    #[test]
    fn the_master_hearing_the_node_keeps_it_fed_until_it_marks_it() {
        let mut i = inputs(vec![]);
        i.master_contact = Some(98 * S);
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::Master);
        i.master_marked = true;
        assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Marked));
    }

    #[test]
    fn a_mark_relayed_by_a_watcher_stops_feeding_at_once() {
        let mut m = w(true, true);
        m.marked_me = true;
        let i = inputs(vec![m, w(true, true), w(true, true)]);
        assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Marked));
        // Outbound traffic cut: no watcher hears this node, but it hears their marks.
        let mut m = w(false, true);
        m.marked_me = true;
        let i = inputs(vec![m, w(false, true)]);
        assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Marked));
        // A watcher not heard within lost-after says nothing.
        let mut gone = w(false, true);
        gone.heard = false;
        gone.marked_me = true;
        let i = inputs(vec![gone, w(true, true)]);
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::WatcherVouches);
    }

    #[test]
    fn cut_from_the_master_only_a_watcher_that_reaches_it_vouches() {
        let i = inputs(vec![w(true, true), w(false, false), w(false, false)]);
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::WatcherVouches);
    }

    #[test]
    fn a_master_outage_never_starves_a_node_most_of_whose_watchers_hear_it() {
        let i = inputs(vec![w(true, false), w(true, false), w(false, false)]);
        assert_eq!(
            decide_feed(&i, &settings()),
            Feed::Feed {
                reason: Reason::MasterUnreachable,
                vouched: true
            }
        );
        // Exactly half is not enough: the master could hear the other half and judge.
        let i = inputs(vec![w(true, false), w(false, false)]);
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
    }

    #[test]
    fn isolated_for_the_isolation_timeout_it_starves() {
        let mut i = inputs(vec![w(false, false), w(false, true)]);
        i.now = 104 * S;
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
        i.now = 105 * S;
        assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Isolated));
        // Never vouched for since arming: counted from the arming.
        i.last_vouched = None;
        i.armed_at = 100 * S;
        assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
    }

    #[test]
    fn the_safe_time_adds_up_every_stage() {
        let t = SelfFenceTimes {
            lost_after: 2 * S,
            heartbeat: S / 2,
            feed_every: S,
            isolation: 10 * S,
            watchdog_timeout: 10 * S,
        };
        assert_eq!(safe_time(&t, 2 * S), 51 * S / 2);
    }

    fn contact() -> impl Strategy<Value = WatcherContact> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(heard, two_way, master_ok, marked_me)| WatcherContact {
                name: "w".into(),
                heard,
                two_way: heard && two_way,
                master_ok,
                marked_me,
            },
        )
    }

    proptest! {
        /// The node never keeps feeding on its peers' word while the master could judge it dead:
        /// when every watcher that hears it says the master is away and they are no majority, and
        /// nothing vouched for the isolation timeout, it starves.
        #[test]
        fn whenever_the_master_could_judge_it_dead_it_starves(
            ws in prop::collection::vec(contact(), 0..10),
            last in prop::option::of(0i64..200),
        ) {
            let i = FeedInputs {
                now: 200 * S,
                master_contact: None,
                master_marked: false,
                watchers: ws.clone(),
                last_vouched: last.map(|s| s * S),
                armed_at: 0,
            };
            let hearers: Vec<&WatcherContact> = ws.iter().filter(|w| w.two_way).collect();
            let master_could_judge = hearers.iter().all(|w| !w.master_ok)
                && hearers.len() * 2 <= ws.len();
            let quiet = last.is_none_or(|l| (200 - l) * S >= settings().isolation);
            let f = decide_feed(&i, &settings());
            if master_could_judge && quiet {
                prop_assert!(matches!(f, Feed::Starve(_)), "{f:?}");
            }
            if ws.iter().any(|w| w.heard && w.marked_me) {
                prop_assert_eq!(f, Feed::Starve(Reason::Marked));
            }
        }
    }
}
