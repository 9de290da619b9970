//! The probe on a slow, lossy network (simulated time): every node healthy, every probe's round
//! trip 400 ± 200 ms, and 5 % of segments lost each way and retransmitted a second later. A
//! fixed 800 ms timeout that counts one unanswered probe as silence takes many healthy nodes for
//! silent, and two at once for a storm that holds every fence start; the adaptive patience with
//! backoff, silent after two misses, takes far fewer. The figures are printed for
//! BENCHMARKS.md.

use std::time::Duration;

use super::fakes::Impairment;
use super::*;

const MIN: Duration = Duration::from_secs(60);

/// Collectors taken for silent, and storm-held seconds, over five minutes with `fencing`.
async fn five_minutes(fencing: FencingConfig, seed: u64) -> (u64, f64) {
    let sim = Sim::start(SimOptions {
        nodes: 5,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..fencing
        }),
        ..SimOptions::default()
    });
    sim.collectors.impair(
        Impairment {
            one_way: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
            loss_percent: 5,
        },
        seed,
    );
    sim.run_for(5 * MIN).await;
    let failures = sim.metrics.fencing.probe.probe_silences.get();
    let storm = sim.metrics.fencing.fence.fencing_storm_seconds.get();
    let flows = sim.flows();
    assert!(flows.is_empty(), "a healthy node was fenced: {flows:?}");
    sim.stop().await;
    (failures, storm)
}

#[tokio::test(start_paused = true)]
async fn on_a_slow_lossy_network_the_adaptive_probe_takes_far_fewer_collectors_for_silent() {
    let mut fixed = (0, 0.0);
    let mut adaptive = (0, 0.0);
    // The earlier probe: a fixed 800 ms, and silent at the first unanswered probe.
    let old = FencingConfig {
        liveness_timeout_max: Duration::from_millis(800),
        liveness_misses: 1,
        ..FencingConfig::default()
    };
    for seed in [7, 11, 13] {
        let f = five_minutes(old.clone(), seed).await;
        let a = five_minutes(FencingConfig::default(), seed).await;
        println!(
            "seed {seed}: fixed 800 ms, one miss: {} taken for silent, storm {:.0} s; adaptive, two misses: {} taken for silent, storm {:.0} s",
            f.0, f.1, a.0, a.1
        );
        fixed = (fixed.0 + f.0, fixed.1 + f.1);
        adaptive = (adaptive.0 + a.0, adaptive.1 + a.1);
    }
    assert!(fixed.0 > 0, "the impairment must bite the fixed timeout");
    assert!(
        adaptive.0 * 4 <= fixed.0,
        "adaptive {} failures against fixed {}",
        adaptive.0,
        fixed.0
    );
    assert!(adaptive.1 <= fixed.1, "{adaptive:?} {fixed:?}");
}
