//! Tests of self-fencing's rules: unit cases, and a discrete-event model of one node, its
//! watchers and the master under an adversarial network.
use super::*;
use proptest::prelude::*;

const S: Nanos = 1_000_000_000;

fn settings() -> FeedSettings {
    FeedSettings {
        lost_after: 2 * S,
        master_lost_after: 4 * S,
        isolation: 10 * S,
    }
}

/// A watcher whose last echo and vouch were of beats sent at those times.
fn w(echoed: Option<Nanos>, vouched: Option<Nanos>) -> WatcherContact {
    WatcherContact {
        name: "w".into(),
        heard: true,
        echoed,
        vouched,
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
fn the_master_echoing_a_recent_view_keeps_it_fed_until_it_marks_it() {
    let mut i = inputs(vec![]);
    i.master_contact = Some(98 * S);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Master);
    // An echo of a view taken 4.5 s ago, however recently it arrived, is no contact now.
    i.master_contact = Some(95 * S + S / 2);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
    i.master_contact = Some(99 * S);
    i.master_marked = true;
    assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Marked));
}

#[test]
fn a_mark_relayed_by_a_watcher_stops_feeding_at_once() {
    let mut m = w(Some(99 * S), Some(99 * S));
    m.marked_me = true;
    let i = inputs(vec![m, w(Some(99 * S), None)]);
    assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Marked));
    // A watcher not heard within lost-after says nothing.
    let mut gone = w(None, None);
    gone.heard = false;
    gone.marked_me = true;
    let i = inputs(vec![gone, w(None, Some(99 * S))]);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::WatcherVouches);
}

#[test]
fn a_late_heartbeat_echoes_an_old_beat_and_counts_for_nothing() {
    // Both watchers' heartbeats arrive now, but echo beats sent 9.3 s ago: that is what a
    // queue or an attacker holding them inside their window delivers.
    let old = Some(100 * S - 9_300_000_000);
    let i = inputs(vec![w(old, old), w(old, old)]);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
    let mut i = i;
    i.now = 105 * S;
    assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Isolated));
}

#[test]
fn cut_from_the_master_only_a_relayed_beat_keeps_it_fed_for_master_lost_after() {
    let i = inputs(vec![w(None, Some(97 * S)), w(None, None), w(None, None)]);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::WatcherVouches);
    let i = inputs(vec![w(None, Some(95 * S)), w(None, None), w(None, None)]);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
}

#[test]
fn a_master_outage_never_starves_a_node_most_of_whose_watchers_echo_it() {
    let fresh = Some(99 * S);
    let i = inputs(vec![w(fresh, None), w(fresh, None), w(None, None)]);
    assert_eq!(
        decide_feed(&i, &settings()),
        Feed::Feed {
            reason: Reason::MasterUnreachable,
            vouched: true
        }
    );
    // Exactly half is not enough: the master could hear the other half and judge.
    let i = inputs(vec![w(fresh, None), w(None, None)]);
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
}

#[test]
fn isolated_for_the_isolation_timeout_it_starves() {
    let mut i = inputs(vec![w(None, None), w(None, None)]);
    i.now = 104 * S;
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
    i.now = 105 * S;
    assert_eq!(decide_feed(&i, &settings()), Feed::Starve(Reason::Isolated));
    // Never vouched for since arming: counted from the arming.
    i.last_vouched = None;
    i.armed_at = 100 * S;
    assert_eq!(reason(decide_feed(&i, &settings())), Reason::Waiting);
}

fn times() -> SelfFenceTimes {
    SelfFenceTimes {
        lost_after: 2 * S,
        heartbeat: S / 2,
        feed_every: S,
        isolation: 5 * S,
        watchdog_timeout: 10 * S,
        master_lost_after: 4 * S,
    }
}

fn lost(from: Nanos, until: Nanos) -> WatcherEvidence {
    WatcherEvidence {
        hears_at: None,
        lost: Some(LostRun { from, until }),
    }
}

#[test]
fn the_proof_waits_for_every_bound_and_a_covering_half_of_the_watchers() {
    let t = times();
    // The master last heard the node at 100 s; its two watchers lost it from 99 s.
    let mut e = ResetEvidence {
        master_heard: Some(100 * S),
        leading_since: 0,
        watchers: vec![lost(99 * S, 107 * S), lost(99 * S, 103 * S)],
    };
    // Quiet from 104 s (the master's echo counts master-lost-after 4 s), for isolation +
    // feed = 6 s.
    assert_eq!(
        reset_proof(&e, &t, 5 * S, 109 * S),
        ResetProof::Pending {
            quiet_from: 104 * S,
            reset_by: 125 * S,
            covered: 0,
            needed: 1,
        }
    );
    e.watchers[0].lost = Some(LostRun {
        from: 99 * S,
        until: 110 * S,
    });
    assert_eq!(
        reset_proof(&e, &t, 5 * S, 110 * S),
        ResetProof::Proven {
            quiet_from: 104 * S,
            reset_by: 125 * S
        }
    );
    // A watcher's view that still heard the node at 101 s pushes the quiet to 105 s.
    e.watchers[1].hears_at = Some(101 * S);
    assert!(matches!(
        reset_proof(&e, &t, 5 * S, 110 * S),
        ResetProof::Pending {
            quiet_from: q, ..
        } if q == 105 * S
    ));
    // A new leader counts nothing before it led.
    let fresh = ResetEvidence {
        leading_since: 200 * S,
        ..e.clone()
    };
    assert!(matches!(
        reset_proof(&fresh, &t, 5 * S, 300 * S),
        ResetProof::Pending { quiet_from: q, .. } if q == 204 * S
    ));
}

#[test]
fn a_lost_run_covers_the_quiet_each_view_reports_and_joins_overlapping_views() {
    // Quiet for 2 s when taken, between 10 s (sent) and 10.5 s (received).
    let r = LostRun::extend(None, 10 * S, 10 * S + S / 2, 2 * S);
    assert_eq!(
        r,
        LostRun {
            from: 8 * S + S / 2,
            until: 10 * S
        }
    );
    // Views 3 s apart (a slow probe cycle): the quiet has grown with them, so they join.
    let r = LostRun::extend(Some(r), 13 * S, 13 * S + S / 2, 5 * S);
    assert_eq!(
        r,
        LostRun {
            from: 8 * S + S / 2,
            until: 13 * S
        }
    );
    // It heard the node in between (quiet 1 s only): what came before is not joined.
    let r = LostRun::extend(Some(r), 16 * S, 16 * S + S / 2, S);
    assert_eq!(
        r,
        LostRun {
            from: 15 * S + S / 2,
            until: 16 * S
        }
    );
}

#[test]
fn without_watchers_only_the_masters_bound_counts() {
    let e = ResetEvidence {
        master_heard: Some(100 * S),
        leading_since: 0,
        watchers: vec![],
    };
    // Quiet from 104 s for isolation + feed: proven at 110 s, reset by 120 s.
    assert!(matches!(
        reset_proof(&e, &times(), 0, 110 * S),
        ResetProof::Proven { reset_by, .. } if reset_by == 120 * S
    ));
    assert!(matches!(
        reset_proof(&e, &times(), 0, 110 * S - 1),
        ResetProof::Pending { .. }
    ));
}

/// A discrete-event model of one self-fencing node, its watchers and the master, all
/// running the real rules above, with an adversary that decides every message's fate.
mod model {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::{BTreeMap, BinaryHeap};

    pub const MS: Nanos = 1_000_000;

    /// Message fates come from this tape (xorshift), so a failing case replays by seed.
    pub struct Tape(pub u64);

    impl Tape {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    #[derive(Debug, Clone)]
    enum Msg {
        /// Node to watcher `w`: the node's beat.
        Beat {
            w: usize,
            seq: u64,
        },
        /// Watcher `w` to the node.
        Reply {
            w: usize,
            seq: u64,
            echo: u64,
            vouch: u64,
        },
        /// The master's probe of the node (`None`) or of watcher `w`.
        Probe {
            to: Option<usize>,
            nonce: u64,
            echo: u64,
        },
        /// An answer to probe `nonce`: a view with its beat, and whether it hears the
        /// node (from a watcher) and the node's beat it heard last, or how long it has
        /// heard nothing.
        View {
            from: Option<usize>,
            nonce: u64,
            beat: u64,
            alive: Option<u64>,
            quiet: Nanos,
        },
        /// The node's heartbeats, its feeding decision, watcher `w`'s heartbeat, the master's
        /// probe cycle: each on a phase of its own.
        NodeBeat,
        Feed,
        WatcherBeat(usize),
        ProbeCycle,
    }

    pub struct Params {
        pub watchers: usize,
        pub window: Nanos,
        pub probe_timeout: Nanos,
        /// The node's outbound traffic dies then (its watchdog goes on by its rules).
        pub cut_at: Option<Nanos>,
        /// Out of 100: how often a message is dropped, and how often held back.
        pub drop: u64,
        pub hold: u64,
        /// The master and the watchers cannot reach each other in this span.
        pub outage: Option<(Nanos, Nanos)>,
        /// How often the master probes (its cycle stretches on a large or loaded fleet).
        pub probe_every: Nanos,
    }

    #[derive(Default)]
    struct Watcher {
        last_from_node: u64,
        node_heard_at: Option<Nanos>,
        seq: u64,
        views: BTreeMap<u64, (Nanos, Option<u64>)>,
        ack: Option<(Nanos, Option<u64>)>,
    }

    pub struct Outcome {
        pub last_feed: Option<Nanos>,
        pub proven: Option<(Nanos, Nanos)>,
        pub starved: bool,
    }

    pub fn run(p: &Params, tape: &mut Tape, t: &SelfFenceTimes, until: Nanos) -> Outcome {
        let hb = t.heartbeat;
        let probe_every = p.probe_every;
        let mut q: BinaryHeap<Reverse<(Nanos, u64, usize)>> = BinaryHeap::new();
        let mut msgs: Vec<Msg> = Vec::new();
        let push = |q: &mut BinaryHeap<_>, msgs: &mut Vec<Msg>, at: Nanos, m: Msg| {
            msgs.push(m);
            q.push(Reverse((at, msgs.len() as u64, msgs.len() - 1)));
        };
        // Node state.
        let mut seq: u64 = 0;
        let mut sent: BTreeMap<u64, Nanos> = BTreeMap::new();
        let mut heard: Vec<(u64, u64, u64, Nanos)> = vec![(0, 0, 0, 0); p.watchers];
        let mut master_contact: Option<Nanos> = None;
        let mut last_vouched: Option<Nanos> = None;
        let mut starved = false;
        let mut last_feed = None;
        // Watchers and master.
        let mut ws: Vec<Watcher> = (0..p.watchers).map(|_| Watcher::default()).collect();
        let mut nonce = 0u64;
        let mut outstanding: BTreeMap<Option<usize>, (u64, Nanos)> = BTreeMap::new();
        let mut echo_of: BTreeMap<Option<usize>, u64> = BTreeMap::new();
        let mut ev = ResetEvidence {
            master_heard: None,
            leading_since: 0,
            watchers: vec![WatcherEvidence::default(); p.watchers],
        };
        let mut proven = None;
        // Every actor ticks on a phase of its own (10 ms grain), chosen by the adversary too.
        let phase = |tape: &mut Tape, every: Nanos| {
            tape.below((every / (10 * MS)) as u64) as Nanos * 10 * MS
        };
        let ticks: Vec<(Nanos, Nanos, Msg)> = std::iter::once((hb, phase(tape, hb), Msg::NodeBeat))
            .chain(std::iter::once((
                t.feed_every,
                phase(tape, t.feed_every),
                Msg::Feed,
            )))
            .chain(std::iter::once((
                probe_every,
                phase(tape, probe_every),
                Msg::ProbeCycle,
            )))
            .chain((0..p.watchers).map(|w| (hb, phase(tape, hb), Msg::WatcherBeat(w))))
            .collect();
        for (every, first, m) in ticks {
            let mut at = first;
            while at < until {
                push(&mut q, &mut msgs, at, m.clone());
                at += every;
            }
        }
        // The adversary: deliver at once, drop, or hold up to `max`.
        let fate = |tape: &mut Tape, now: Nanos, max: Nanos| -> Option<Nanos> {
            let r = tape.below(100);
            if r < p.drop {
                None
            } else if r < p.drop + p.hold {
                Some(now + tape.below(max as u64 + 1) as Nanos)
            } else {
                Some(now + tape.below(5 * MS as u64) as Nanos)
            }
        };
        while let Some(Reverse((now, _, idx))) = q.pop() {
            let node_out = p.cut_at.is_none_or(|c| now < c);
            match msgs[idx].clone() {
                Msg::NodeBeat => {
                    for w in 0..p.watchers {
                        seq += 1;
                        sent.insert(seq, now);
                        if node_out && let Some(at) = fate(tape, now, p.window) {
                            push(&mut q, &mut msgs, at, Msg::Beat { w, seq });
                            // A duplicate, delivered later.
                            if tape.below(10) == 0 {
                                push(&mut q, &mut msgs, at + 100 * MS, Msg::Beat { w, seq });
                            }
                        }
                    }
                }
                Msg::WatcherBeat(w) => {
                    let wt = &mut ws[w];
                    wt.seq += 1;
                    let vouch = wt
                        .ack
                        .filter(|(at, _)| now - at <= t.master_lost_after)
                        .and_then(|(_, b)| b)
                        .unwrap_or(0);
                    let m = Msg::Reply {
                        w,
                        seq: wt.seq,
                        echo: wt.last_from_node,
                        vouch,
                    };
                    if let Some(at) = fate(tape, now, p.window) {
                        push(&mut q, &mut msgs, at, m.clone());
                        if tape.below(10) == 0 {
                            push(&mut q, &mut msgs, at + 200 * MS, m);
                        }
                    }
                }
                Msg::ProbeCycle => {
                    for to in std::iter::once(None).chain((0..p.watchers).map(Some)) {
                        nonce += 1;
                        outstanding.insert(to, (nonce, now));
                        let echo = echo_of.get(&to).copied().unwrap_or(0);
                        let cut =
                            to.is_some() && p.outage.is_some_and(|(a, b)| now >= a && now < b);
                        if !cut && let Some(at) = fate(tape, now, p.probe_timeout) {
                            push(&mut q, &mut msgs, at, Msg::Probe { to, nonce, echo });
                        }
                    }
                    if proven.is_none()
                        && let ResetProof::Proven { reset_by, .. } = reset_proof(&ev, t, 0, now)
                    {
                        proven = Some((now, reset_by));
                    }
                }
                Msg::Feed if !starved => {
                    let watchers = heard
                        .iter()
                        .enumerate()
                        .map(|(i, (_, echo, vouch, at))| WatcherContact {
                            name: format!("w{i}"),
                            heard: *at > 0 && now - at <= t.lost_after,
                            echoed: sent.get(echo).copied(),
                            vouched: sent.get(vouch).copied(),
                            marked_me: false,
                        })
                        .collect();
                    let i = FeedInputs {
                        now,
                        master_contact,
                        master_marked: false,
                        watchers,
                        last_vouched,
                        armed_at: 0,
                    };
                    let s = FeedSettings {
                        lost_after: t.lost_after,
                        master_lost_after: t.master_lost_after,
                        isolation: t.isolation,
                    };
                    match decide_feed(&i, &s) {
                        Feed::Feed { vouched, .. } => {
                            if vouched {
                                last_vouched = Some(now);
                            }
                            last_feed = Some(now);
                        }
                        Feed::Starve(_) => starved = true,
                    }
                }
                Msg::Feed => {}
                Msg::Beat { w, seq: s } => {
                    let wt = &mut ws[w];
                    if s > wt.last_from_node {
                        wt.last_from_node = s;
                        wt.node_heard_at = Some(now);
                    }
                }
                Msg::Reply {
                    w,
                    seq: s,
                    echo,
                    vouch,
                } => {
                    let h = &mut heard[w];
                    if s > h.0 {
                        *h = (s, echo, vouch, now);
                    }
                }
                Msg::Probe { to, nonce: n, echo } => {
                    // The view is taken now, and answers only within the probe's timeout.
                    let sent_at = outstanding.get(&to).map(|o| o.1).unwrap_or(0);
                    let left = (sent_at + p.probe_timeout).saturating_sub(now);
                    let view = match to {
                        None => {
                            seq += 1;
                            sent.insert(seq, now);
                            if let Some(at) = sent.get(&echo) {
                                master_contact = master_contact.max(Some(*at));
                            }
                            if !node_out {
                                continue;
                            }
                            Msg::View {
                                from: None,
                                nonce: n,
                                beat: seq,
                                alive: None,
                                quiet: 0,
                            }
                        }
                        Some(w) => {
                            let wt = &mut ws[w];
                            if let Some(v) = wt.views.get(&echo).copied() {
                                wt.ack = wt.ack.max(Some(v));
                            }
                            wt.seq += 1;
                            let alive = wt
                                .node_heard_at
                                .filter(|h| now - h <= t.lost_after)
                                .map(|_| wt.last_from_node);
                            wt.views.insert(wt.seq, (now, alive));
                            let quiet = now - wt.node_heard_at.unwrap_or(0);
                            Msg::View {
                                from: Some(w),
                                nonce: n,
                                beat: wt.seq,
                                alive,
                                quiet,
                            }
                        }
                    };
                    if let Some(at) = fate(tape, now, left) {
                        push(&mut q, &mut msgs, at, view);
                    }
                }
                Msg::View {
                    from,
                    nonce: n,
                    beat,
                    alive,
                    quiet,
                } => {
                    // Only the answer to the probe just sent, within its timeout.
                    let Some((want, sent_at)) = outstanding.get(&from).copied() else {
                        continue;
                    };
                    if want != n || now > sent_at + p.probe_timeout {
                        continue;
                    }
                    outstanding.remove(&from);
                    echo_of.insert(from, beat);
                    match from {
                        None => ev.master_heard = Some(now),
                        Some(w) => {
                            let e = &mut ev.watchers[w];
                            if alive.is_some() {
                                e.hears_at = Some(now);
                                e.lost = None;
                            } else {
                                e.lost = Some(LostRun::extend(e.lost, sent_at, now, quiet));
                            }
                        }
                    }
                }
            }
        }
        Outcome {
            last_feed,
            proven,
            starved,
        }
    }
}

/// The defaults, as the model runs them.
fn model_times() -> SelfFenceTimes {
    use model::MS;
    SelfFenceTimes {
        lost_after: 2000 * MS,
        heartbeat: 500 * MS,
        feed_every: 1000 * MS,
        isolation: 5000 * MS,
        watchdog_timeout: 10_000 * MS,
        master_lost_after: 4000 * MS,
    }
}

/// A healthy network: no cut, no loss, no delay, no outage, a probe every second.
fn healthy(watchers: usize) -> model::Params {
    use model::MS;
    model::Params {
        watchers,
        window: 10_000 * MS,
        probe_timeout: 800 * MS,
        cut_at: None,
        drop: 0,
        hold: 0,
        outage: None,
        probe_every: 1000 * MS,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Never two live copies: whatever the adversary does to every heartbeat, probe and
    /// view inside its acceptance window (hold, drop, duplicate, reorder), once the master
    /// proves the node reset, the node's last feed plus its watchdog timeout is behind it.
    #[test]
    fn the_master_never_proves_a_reset_before_the_watchdog_fires(
        seed in 1u64..u64::MAX,
        watchers in 0usize..5,
        cut_s in prop::option::of(0i64..40),
        drop in 0u64..40,
        hold in 0u64..60,
        outage in prop::option::of((0i64..40, 1i64..40)),
    ) {
        use model::*;
        let t = model_times();
        let p = Params {
            cut_at: cut_s.map(|s| s * 1000 * MS),
            drop,
            hold,
            outage: outage.map(|(a, l)| (a * 1000 * MS, (a + l) * 1000 * MS)),
            ..healthy(watchers)
        };
        let out = run(&p, &mut Tape(seed), &t, 90_000 * MS);
        // The proof may come after the moment it proves (the release is then at once): what
        // must hold is the moment itself.
        if let Some((_, reset_by)) = out.proven
            && let Some(f) = out.last_feed
        {
            prop_assert!(
                f + t.watchdog_timeout <= reset_by,
                "fed at {} ms, so it runs until {} ms, but the master releases at {} ms",
                f / MS, (f + t.watchdog_timeout) / MS, reset_by / MS
            );
        }
    }

    /// And the proof comes: a node cut off with its links otherwise healthy is proven reset.
    #[test]
    fn a_node_cut_off_on_healthy_links_is_proven_reset(
        seed in 1u64..u64::MAX,
        watchers in 1usize..5,
        cut_s in 5i64..20,
    ) {
        use model::*;
        let t = model_times();
        let p = Params {
            cut_at: Some(cut_s * 1000 * MS),
            ..healthy(watchers)
        };
        let out = run(&p, &mut Tape(seed), &t, 90_000 * MS);
        let (at, _) = out.proven.expect("proven");
        prop_assert!(at <= (cut_s + 20) * 1000 * MS, "proven only at {} ms", at / MS);
    }

    /// And no false self-fence: on healthy links a node keeps feeding, even while the
    /// master's probe cycle stretches (up to 1.8 s here, with master-lost-after 4 s), and
    /// even with no watchers at all.
    #[test]
    fn a_healthy_node_never_starves_however_slow_the_probe_cycle(
        seed in 1u64..u64::MAX,
        watchers in 0usize..5,
        cycle_ms in 1000i64..1800,
    ) {
        use model::*;
        let t = model_times();
        let p = Params {
            probe_every: cycle_ms / 10 * 10 * MS,
            ..healthy(watchers)
        };
        let out = run(&p, &mut Tape(seed), &t, 60_000 * MS);
        prop_assert!(!out.starved);
        prop_assert!(out.proven.is_none());
    }
}
