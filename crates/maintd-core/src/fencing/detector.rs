//! An adaptive failure detector for one node, in the manner of phi accrual: from the spacing of
//! the node's answers on the steady clock, how long a silence may last before the link's own
//! jitter and loss no longer explain it. A steady link suspects a node soon after one answer is
//! missed; a jittery or lossy link waits longer on its own. Pure: fed arrival times.
//!
//! The suspicion level after `t` of silence is `phi = -log10(P(an interval > t))`, the
//! intervals taken as normally distributed with the mean and deviation of the last
//! [`WINDOW`] ones (the deviation never below `min_deviation`: a perfectly regular link would
//! otherwise make any lateness a certainty). The node is suspected once `phi` reaches the
//! threshold; [`Detector::suspect_after`] is that moment, counted from the last answer.

use std::collections::VecDeque;
use std::time::Duration;

use crate::verdict::Nanos;

/// Intervals remembered: enough for a stable estimate, few enough to follow a link that
/// changes within minutes.
pub const WINDOW: usize = 100;

/// Intervals needed before the estimate is trusted; until then the detector has no opinion.
pub const MIN_SAMPLES: usize = 4;

/// How the detector turns intervals into a suspicion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectorSettings {
    /// The suspicion level at which the node is suspected: `phi = 8` is a chance of one in
    /// 10^8 that a live node on this link is silent that long.
    pub threshold: f64,
    /// The least deviation the intervals are taken to have.
    pub min_deviation: Duration,
    /// The longest the detector ever asks to wait after the last answer, however bad the link:
    /// a link lossy enough to need more is treated as gone.
    pub max_wait: Duration,
}

impl Default for DetectorSettings {
    fn default() -> Self {
        DetectorSettings {
            threshold: 8.0,
            min_deviation: Duration::from_millis(100),
            max_wait: Duration::from_secs(30),
        }
    }
}

/// One node's answers as the detector keeps them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Detector {
    /// The last [`WINDOW`] intervals between answers, in seconds.
    intervals: VecDeque<f64>,
    /// When the latest answer arrived.
    last: Option<Nanos>,
    /// The probe counted the node silent since the latest answer: the gap the next answer
    /// closes is an outage (a death, a reboot, a fence and its return), not the link's own
    /// spacing, and is not taken as an interval.
    outage: bool,
}

/// `P(X > mean + y * deviation)` for a normal `X`: the logistic approximation phi-accrual
/// detectors use (error under 1e-4), which stays finite in the far tail.
fn later_than(y: f64) -> f64 {
    1.0 / (1.0 + (y * (1.5976 + 0.070566 * y * y)).exp())
}

impl Detector {
    /// An answer arrived at `at` (steady clock). One that does not come after the latest (a
    /// duplicate, or one reordered behind it) says nothing new and is ignored.
    pub fn heard(&mut self, at: Nanos) {
        match self.last {
            Some(last) if at <= last => {}
            Some(_) if self.outage => {
                self.outage = false;
                self.last = Some(at);
            }
            Some(last) => {
                if self.intervals.len() == WINDOW {
                    self.intervals.pop_front();
                }
                self.intervals.push_back((at - last) as f64 / 1e9);
                self.last = Some(at);
            }
            None => self.last = Some(at),
        }
    }

    /// The probe counted the node silent: the gap up to its next answer is not a sample of
    /// the link. The wait while silent still counts from the latest answer.
    pub fn outage(&mut self) {
        if self.last.is_some() {
            self.outage = true;
        }
    }

    /// When the latest answer arrived.
    pub fn last(&self) -> Option<Nanos> {
        self.last
    }

    /// Mean and deviation of the intervals (the deviation at least `min_deviation`), once
    /// there are [`MIN_SAMPLES`].
    fn estimate(&self, s: &DetectorSettings) -> Option<(f64, f64)> {
        let n = self.intervals.len();
        if n < MIN_SAMPLES {
            return None;
        }
        let mean = self.intervals.iter().sum::<f64>() / n as f64;
        let var = self
            .intervals
            .iter()
            .map(|x| (x - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        Some((mean, var.sqrt().max(s.min_deviation.as_secs_f64())))
    }

    /// The suspicion level at `now`: `None` before enough answers.
    pub fn phi(&self, now: Nanos, s: &DetectorSettings) -> Option<f64> {
        let (mean, dev) = self.estimate(s)?;
        let silent = now.saturating_sub(self.last?) as f64 / 1e9;
        let p = later_than((silent - mean) / dev);
        Some(-p.max(f64::MIN_POSITIVE).log10())
    }

    /// How long after the latest answer the node is suspected: where `phi` reaches the
    /// threshold, at least the mean interval and at most `max_wait`. `None` before enough
    /// answers.
    pub fn suspect_after(&self, s: &DetectorSettings) -> Option<Duration> {
        let (mean, dev) = self.estimate(s)?;
        // `later_than` falls strictly with `y`: bisect for the point where it reaches the
        // threshold's chance.
        let target = 10f64.powf(-s.threshold.clamp(0.5, 300.0));
        let (mut lo, mut hi) = (0.0f64, 64.0f64);
        for _ in 0..80 {
            let mid = (lo + hi) / 2.0;
            if later_than(mid) > target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // At least the mean (`hi * dev` is not negative), at most the bound.
        let wait = (mean + hi * dev).min(s.max_wait.as_secs_f64());
        Some(Duration::from_secs_f64(wait))
    }

    /// When the node is suspected if nothing more arrives (steady clock).
    pub fn suspected_at(&self, s: &DetectorSettings) -> Option<Nanos> {
        let after = self.suspect_after(s)?;
        Some(
            self.last?
                .saturating_add(after.as_nanos().min(i64::MAX as u128) as i64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;

    fn fed(intervals_ms: &[u64]) -> Detector {
        let mut d = Detector::default();
        let mut t = 1_000 * MS;
        d.heard(t);
        for i in intervals_ms {
            t += *i as Nanos * MS;
            d.heard(t);
        }
        d
    }

    #[test]
    fn a_steady_link_is_suspected_soon_after_a_missed_answer() {
        let s = DetectorSettings::default();
        assert_eq!(
            fed(&[1000, 1000]).suspect_after(&s),
            None,
            "too few answers"
        );
        let d = fed(&[1000; 20]);
        let after = d.suspect_after(&s).unwrap();
        // One interval, plus about five of the least deviation (phi 8 lies 5.2 deviations out).
        assert!(after > Duration::from_millis(1400), "{after:?}");
        assert!(after < Duration::from_millis(1700), "{after:?}");
        let last = d.last().unwrap();
        assert!(
            d.phi(last + 1000 * MS, &s).unwrap() < 1.0,
            "on time: no suspicion"
        );
        let at = d.suspected_at(&s).unwrap();
        assert!(d.phi(at + MS, &s).unwrap() >= s.threshold);
        assert!(d.phi(at - 50 * MS, &s).unwrap() < s.threshold);
    }

    #[test]
    fn loss_and_jitter_stretch_the_wait_up_to_its_bound() {
        let s = DetectorSettings::default();
        let steady = fed(&[1000; 50]).suspect_after(&s).unwrap();
        // One answer in five lost (a 2 s gap), and 200 ms of jitter either way.
        let lossy: Vec<u64> = (0..50)
            .map(|i| {
                if i % 5 == 0 {
                    2000
                } else {
                    800 + (i * 97 % 400)
                }
            })
            .collect();
        let stretched = fed(&lossy).suspect_after(&s).unwrap();
        assert!(
            stretched > steady + Duration::from_secs(1),
            "{steady:?} {stretched:?}"
        );
        let awful = fed(&[100, 20_000, 100, 40_000, 100, 60_000]);
        assert_eq!(awful.suspect_after(&s), Some(s.max_wait));
    }

    /// A node that was silent (dead, rebooted, fenced and back) does not come back with a
    /// stretched wait: the outage's gap is no interval of its link.
    #[test]
    fn an_outage_is_no_sample_of_the_link() {
        let s = DetectorSettings::default();
        let mut d = fed(&[1000; 20]);
        let before = d.suspect_after(&s);
        let last = d.last().unwrap();
        d.outage();
        assert_eq!(
            d.suspected_at(&s),
            Some(last + before.unwrap().as_nanos() as Nanos)
        );
        d.heard(last + 40_000 * MS);
        assert_eq!(d.suspect_after(&s), before, "the gap was not taken");
        d.heard(last + 41_000 * MS);
        assert_eq!(d.intervals.len(), 21);
        assert_eq!(d.suspect_after(&s), before);
    }

    #[test]
    fn the_window_keeps_the_latest_intervals_only() {
        let s = DetectorSettings::default();
        // A slow past is forgotten once a window of fast answers followed it.
        let mut v = vec![5000u64; 30];
        v.extend([500u64; WINDOW]);
        let d = fed(&v);
        assert_eq!(d.intervals.len(), WINDOW);
        assert!(d.suspect_after(&s).unwrap() < Duration::from_secs(2));
    }

    proptest! {
        /// Whatever the answers, the suspicion only grows with the silence; the wait lies
        /// between the mean interval and the bound; an answer that does not come after the
        /// latest (a duplicate, a reordered one) changes nothing.
        #[test]
        fn phi_grows_with_silence_and_stale_answers_change_nothing(
            intervals in prop::collection::vec(1u64..5_000, 0..150),
            stale in prop::collection::vec(0u64..10_000, 0..10),
            probes in prop::collection::vec(0u64..60_000, 2..20),
        ) {
            let s = DetectorSettings::default();
            let mut d = fed(&intervals);
            let before = d.clone();
            let last = d.last().unwrap();
            for back in stale {
                d.heard(last - back as Nanos * MS);
            }
            prop_assert_eq!(&d, &before);
            prop_assert!(d.intervals.len() <= WINDOW);
            let mut probes = probes;
            probes.sort();
            let mut prev = f64::NEG_INFINITY;
            for p in probes {
                if let Some(phi) = d.phi(last + p as Nanos * MS, &s) {
                    prop_assert!(phi >= prev - 1e-9, "{} then {}", prev, phi);
                    prev = phi;
                }
            }
            if let Some(after) = d.suspect_after(&s) {
                let (mean, _) = d.estimate(&s).unwrap();
                prop_assert!(after.as_secs_f64() >= mean.min(s.max_wait.as_secs_f64()) - 1e-9);
                prop_assert!(after <= s.max_wait);
            }
        }

        /// More spread in the intervals, with the same mean, never shortens the wait.
        #[test]
        fn a_wider_spread_never_waits_less(base in 200u64..3_000, spread in 0u64..1_000, n in 10usize..60) {
            let s = DetectorSettings::default();
            let even = fed(&vec![base; n]);
            let spread = spread.min(base - 1);
            let uneven: Vec<u64> = (0..n).map(|i| if i % 2 == 0 { base + spread } else { base - spread }).collect();
            let uneven = fed(&uneven);
            prop_assert!(uneven.suspect_after(&s).unwrap() + Duration::from_micros(1) >= even.suspect_after(&s).unwrap());
        }
    }
}
