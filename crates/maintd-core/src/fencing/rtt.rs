//! How long the liveness probe waits for each collector: a round-trip estimate per node in the
//! manner of TCP's retransmission timer (a smoothed round trip plus four times its variation,
//! doubled after each unanswered probe until an answer comes), kept between the configured
//! `liveness-timeout` and `liveness-timeout-max`. A link with high
//! latency or jitter gets the patience it needs, so a slow answer is not taken for a dead node
//! (and many at once for a storm); a fast link keeps the short floor. Pure: fed durations.

use std::time::Duration;

/// The estimate for one node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RttEstimate {
    /// Smoothed round trip and its mean deviation, in seconds; `None` before the first answer.
    srtt: Option<f64>,
    rttvar: f64,
    /// Unanswered probes since the last answer: each doubles the patience.
    backoff: u32,
}

impl RttEstimate {
    /// An answer took `rtt`.
    pub fn observe(&mut self, rtt: Duration) {
        self.backoff = 0;
        let r = rtt.as_secs_f64();
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(s) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (s - r).abs();
                self.srtt = Some(0.875 * s + 0.125 * r);
            }
        }
    }

    /// A probe went unanswered.
    pub fn missed(&mut self) {
        self.backoff = (self.backoff + 1).min(8);
    }

    /// How long to wait for the next answer.
    pub fn timeout(&self, floor: Duration, max: Duration) -> Duration {
        let base = self.srtt.map_or(0.0, |s| s + 4.0 * self.rttvar);
        let rto = base.max(floor.as_secs_f64()) * f64::from(1u32 << self.backoff);
        Duration::from_secs_f64(rto.clamp(0.0, 3600.0)).clamp(floor, max.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FLOOR: Duration = Duration::from_millis(800);
    const MAX: Duration = Duration::from_millis(1500);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_fast_link_keeps_the_floor_and_a_jittery_one_gets_more_patience() {
        let mut e = RttEstimate::default();
        assert_eq!(e.timeout(FLOOR, MAX), FLOOR, "no answer yet");
        for _ in 0..20 {
            e.observe(ms(2));
        }
        assert_eq!(e.timeout(FLOOR, MAX), FLOOR);
        // 400 ± 300 ms round trips: the patience grows past the floor, up to the bound.
        let mut j = RttEstimate::default();
        for i in 0..50 {
            j.observe(ms(if i % 2 == 0 { 100 } else { 700 }));
        }
        let t = j.timeout(FLOOR, MAX);
        assert!(t > FLOOR && t <= MAX, "{t:?}");
        // However bad it gets, never past the bound.
        for _ in 0..10 {
            j.observe(ms(5000));
        }
        assert_eq!(j.timeout(FLOOR, MAX), MAX);
    }

    #[test]
    fn an_unanswered_probe_doubles_the_next_patience_until_an_answer() {
        let mut e = RttEstimate::default();
        e.observe(ms(2));
        e.missed();
        assert_eq!(e.timeout(FLOOR, Duration::from_secs(10)), ms(1600));
        e.missed();
        assert_eq!(e.timeout(FLOOR, Duration::from_secs(10)), ms(3200));
        assert_eq!(e.timeout(FLOOR, MAX), MAX);
        e.observe(ms(2));
        assert_eq!(e.timeout(FLOOR, MAX), FLOOR);
    }

    proptest! {
        #[test]
        fn the_patience_stays_within_its_bounds(samples in prop::collection::vec(prop::option::of(0u64..10_000), 0..50)) {
            let mut e = RttEstimate::default();
            for s in samples {
                match s {
                    Some(s) => e.observe(ms(s)),
                    None => e.missed(),
                }
                let t = e.timeout(FLOOR, MAX);
                prop_assert!(t >= FLOOR && t <= MAX);
            }
        }
    }
}
