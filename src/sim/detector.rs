//! The adaptive failure detector, observed in simulated time: on a lossy, jittery link with every
//! node healthy, how often it would have suspected a live node (beside how often the probe
//! counted one silent), and on a steady link how soon after a node hangs it suspects it, against
//! the probe's own silence and the grace. The figures are printed for BENCHMARKS.md.

use std::time::Duration;

use super::fakes::Impairment;
use super::*;

const MIN: Duration = Duration::from_secs(60);

/// `nodes` nodes with the default fencing (no readiness checks).
fn fenced_sim(nodes: usize) -> Sim {
    Sim::start(SimOptions {
        nodes,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            ..FencingConfig::default()
        }),
        ..SimOptions::default()
    })
}

/// Over five minutes of five healthy nodes on `link`: the probe's silences and the detector's
/// suspicions. Nothing is fenced.
async fn healthy(link: Option<Impairment>, seed: u64) -> (u64, u64) {
    let sim = fenced_sim(5);
    if let Some(l) = link {
        sim.collectors.impair(l, seed);
    }
    sim.run_for(5 * MIN).await;
    let probe = &sim.metrics.fencing.probe;
    let counts = (probe.probe_silences.get(), probe.probe_suspicions.get());
    let flows = sim.flows();
    assert!(flows.is_empty(), "a healthy node was fenced: {flows:?}");
    sim.stop().await;
    counts
}

#[tokio::test(start_paused = true)]
async fn the_detector_suspects_no_node_on_a_steady_link_and_says_what_loss_costs() {
    let (silences, suspicions) = healthy(None, 1).await;
    assert_eq!((silences, suspicions), (0, 0), "a steady link: no silence");
    // One segment in five lost each way (retransmitted a second later), 200 ± 100 ms one way.
    let lossy = Impairment {
        one_way: Duration::from_millis(200),
        jitter: Duration::from_millis(100),
        loss_percent: 20,
    };
    let mut total = (0, 0);
    for seed in [7, 11, 13] {
        let (silences, suspicions) = healthy(Some(lossy), seed).await;
        println!(
            "20 % loss, 200 ± 100 ms, seed {seed}: the probe counted {silences} silences, the detector {suspicions} suspicions in five minutes of five healthy nodes"
        );
        total = (total.0 + silences, total.1 + suspicions);
    }
    // The impairment bites: lost answers make silences, and the detector (which learns the
    // link's gaps) does not suspect more often than the probe falls silent.
    assert!(total.0 > 0, "the loss must bite the probe");
    assert!(total.1 <= total.0, "{total:?}");
}

#[tokio::test(start_paused = true)]
async fn on_a_steady_link_the_detector_suspects_a_hung_node_before_the_probe_and_the_grace() {
    // Four nodes: one silent is under the storm threshold (30 %).
    let sim = fenced_sim(4);
    sim.run_for(MIN).await;
    let node = node_name(1);
    let hung = sim.elapsed_s();
    sim.collectors.silence(&node);
    let probe = &sim.metrics.fencing.probe;
    let suspected = sim
        .until("the detector's suspicion", MIN, |_| {
            (probe.probe_suspicions.get() > 0).then(|| sim.elapsed_s())
        })
        .await;
    let silent = sim
        .until("the probe's silence", MIN, |_| {
            (probe.probe_silences.get() > 0).then(|| sim.elapsed_s())
        })
        .await;
    let fenced = sim
        .until("the fence's start", MIN, |s| {
            s.flows().first().map(|_| s.elapsed_s())
        })
        .await;
    println!(
        "a hung node on a steady link (probe every 1 s): the detector suspects it {:.1} s after, the probe counts it silent {:.1} s after, the fence starts {:.1} s after (grace 5 s)",
        suspected - hung,
        silent - hung,
        fenced - hung
    );
    // One interval plus about half a second, at the probe's granularity of one interval.
    assert!(suspected - hung <= 2.6, "{}", suspected - hung);
    assert!(suspected <= silent && silent < fenced);
    sim.stop().await;
}

/// A node back from an outage (a hang of half a minute, fencing paused) is suspected as soon
/// as before when it hangs again: the outage's gap is no sample of its link. Taken as one, it
/// would stretch the next wait to the detector's bound.
#[tokio::test(start_paused = true)]
async fn a_node_back_from_an_outage_is_suspected_as_soon_as_before() {
    let sim = Sim::start(SimOptions {
        nodes: 4,
        fencing: Some(FencingConfig {
            check_interval: Duration::ZERO,
            paused: true,
            ..FencingConfig::default()
        }),
        ..SimOptions::default()
    });
    sim.run_for(MIN).await;
    let node = node_name(1);
    let probe = &sim.metrics.fencing.probe;
    let mut took = Vec::new();
    for _ in 0..2 {
        let (before, hung) = (probe.probe_suspicions.get(), sim.elapsed_s());
        sim.collectors.silence(&node);
        let at = sim
            .until("the detector's suspicion", MIN, |_| {
                (probe.probe_suspicions.get() > before).then(|| sim.elapsed_s())
            })
            .await;
        took.push(at - hung);
        sim.run_for(Duration::from_secs(30)).await;
        sim.collectors.answer_again(&node);
        sim.run_for(MIN).await;
    }
    assert!(took[1] <= took[0] + 1.0, "suspected after {took:?}");
    assert!(sim.flows().is_empty(), "fencing is paused");
    sim.stop().await;
}
