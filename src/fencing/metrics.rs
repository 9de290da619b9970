//! The fence room's metrics, declared and registered here, beside the fencer, its probe and
//! peering, and the readiness checks that produce them; the assembly hands each part its own set.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{
    FailLabel, FlowLabel, KdumpLabel, NodeLabel, ReasonLabel, StepLabel, metric_set,
};
use maintd_core::fencing::machine::{FenceStatus, Step};

metric_set! {
    /// The fencer's metrics: flows and their stages, storms and pauses, failures, alarms and returns, readiness, kdump notifications and drills.
    pub struct FenceMetrics {
        fences_started: Counter = Counter::default()
            => ("maintd_fences_started", "Fence flows started"),
        /// Fence flows not final, by step and status, as the fencer last read them.
        fence_flows: Family<FlowLabel, Gauge> = Family::default()
            => ("maintd_fence_flows", "Fence flows not final yet, by step and status"),
        fencing_storm: Gauge = Gauge::default()
            => ("maintd_fencing_storm", "1 while more nodes than the storm threshold are unreachable"),
        /// 1 while fencing is paused (the configuration's `paused`, or an operator's pause).
        fencing_paused: Gauge = Gauge::default()
            => ("maintd_fencing_paused", "1 while fencing is paused: no fence starts, and no isolation or power-off runs"),
        /// Seconds during which a storm held every fence start (f64 counter).
        fencing_storm_seconds: Counter<f64, std::sync::atomic::AtomicU64> = Counter::default()
            => ("maintd_fencing_storm_seconds", "Time during which a storm held every fence start"),
        /// Time from detection to release, per stage (detection, isolation, power-off, release, total).
        fence_stage_seconds: Family<StepLabel, Histogram> = Family::new_with_constructor(|| {
                Histogram::new([
                    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
                ])
            })
            => ("maintd_fence_stage_seconds", "Latency of each stage from detection to release"),
        /// Failed fence attempts, by step (isolation, power-management, recovery, release, reclaim).
        fence_failures: Family<FailLabel, Counter> = Family::default()
            => ("maintd_fence_failures", "Failed fence attempts, by step"),
        /// Nodes that answered with their boot id from before a verified power-off.
        fence_alarms: Family<NodeLabel, Counter> = Family::default()
            => ("maintd_fence_alarms", "Nodes that answered with their boot id from before a verified power-off (the device lied)"),
        /// Fenced nodes returned to service on proof of a new boot.
        fence_returns: Counter = Counter::default()
            => ("maintd_fence_returns", "Fenced nodes returned to service on proof of a new boot"),
        /// 1 while every fencing level of a node passes its readiness check, 0 when not.
        fencing_ready: Family<NodeLabel, Gauge> = Family::default()
            => ("maintd_fencing_ready", "1 while every fencing level of the node passes its readiness check, 0 when fencing is inactive"),
        /// kdump notifications heard, accepted or refused (with the reason; node "" when unknown).
        kdump_notifications: Family<KdumpLabel, Counter> = Family::default()
            => ("maintd_kdump_notifications", "kdump notifications heard: accepted (from a silent kdump node) or refused, by reason"),
        /// When each node's last fencing drill ended (Unix seconds), and whether it passed.
        drill_last: Family<NodeLabel, Gauge> = Family::default()
            => ("maintd_drill_last_timestamp_seconds", "When each node's last fencing drill ended"),
        drill_passed: Family<NodeLabel, Gauge> = Family::default()
            => ("maintd_drill_passed", "1 when each node's last fencing drill passed (its fence path works end to end), 0 when not"),
    }
}

impl FenceMetrics {
    pub fn fencing_ready(&self, node: &str, ready: bool) {
        self.fencing_ready
            .get_or_create(&NodeLabel { node: node.into() })
            .set(ready as i64);
    }

    /// A failed fence effect, under its stage and the kind of its failure.
    pub fn fence_failed(&self, stage: &'static str, o: &maintd_core::verdict::Outcome) {
        let kind = o
            .failure()
            .unwrap_or(maintd_core::verdict::FailureKind::Other);
        self.fence_failures
            .get_or_create(&FailLabel {
                stage,
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Sets the flow gauges from the flows just read (every step and status present, 0 when
    /// none), so the gauge follows the store of record, wherever it is.
    pub fn count_flows(&self, flows: &[maintd_core::fencing::machine::Flow]) {
        for step in [
            Step::Isolation,
            Step::PowerManagement,
            Step::SelfFence,
            Step::Recovery,
        ] {
            for status in [
                FenceStatus::New,
                FenceStatus::Running,
                FenceStatus::Done,
                FenceStatus::Error,
            ] {
                let n = flows
                    .iter()
                    .filter(|f| f.step == step && f.status == status)
                    .count() as i64;
                self.fence_flows
                    .get_or_create(&FlowLabel {
                        step: step.as_str(),
                        status: status.as_str(),
                    })
                    .set(n);
            }
        }
    }
}

metric_set! {
    /// The liveness probe's metrics: unanswered probes, silences, its patience and the clock offsets it measures.
    pub struct ProbeMetrics {
        /// Liveness probes that got no answer in time.
        probe_failures: Counter = Counter::default()
            => ("maintd_probe_failures", "Liveness probes that got no answer within their patience"),
        /// Collectors that came to count as silent (`liveness-misses` probes in a row unanswered).
        probe_silences: Counter = Counter::default()
            => ("maintd_probe_silences", "Collectors that came to count as silent (liveness-misses probes in a row unanswered)"),
        /// The liveness probe's current patience per node.
        probe_timeout_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
            => ("maintd_probe_timeout_seconds", "How long the liveness probe waits for each collector (adapted to its round trips)"),
        /// Silences the adaptive failure detector would have suspected (once per silence).
        probe_suspicions: Counter = Counter::default()
            => ("maintd_probe_suspicions", "Collector silences that lasted past the adaptive failure detector's wait (once per silence)"),
        /// The adaptive failure detector's wait per node, which may stretch the grace.
        probe_suspect_after_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
            => ("maintd_probe_suspect_after_seconds", "How long after a collector's last answer the adaptive failure detector suspects it (phi accrual over the spacing of its answers); a silent node is fenced only once this and the grace have passed"),
        /// How far each node's wall clock is from the master's, from the probe's round trip.
        node_clock_offset_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
            => ("maintd_node_clock_offset_seconds", "How far each node's wall clock is from the master's (positive: ahead), from the liveness probe's round trip; shown, never used to judge a node"),
    }
}

metric_set! {
    /// Peering's metrics: the views collectors send, the peer sets pushed to them, and partitions.
    pub struct PeerMetrics {
        /// Peer views refused, by reason (signature, node, stale, replayed, malformed).
        views_rejected: Family<ReasonLabel, Counter> = Family::default()
            => ("maintd_peer_views_rejected", "Peer views from collectors refused, by reason"),
        /// Peer sets pushed to collectors, and pushes that failed.
        peer_sets_pushed: Counter = Counter::default()
            => ("maintd_peer_sets_pushed", "Peer sets pushed to collectors"),
        peer_set_push_failures: Counter = Counter::default()
            => ("maintd_peer_set_push_failures", "Peer set pushes that a collector did not accept"),
        /// 1 while the master has lost a node that a watcher still hears.
        partitioned: Family<NodeLabel, Gauge> = Family::default()
            => ("maintd_node_partitioned", "1 while the master cannot reach the node but one of its watchers still hears it"),
    }
}

/// The fencer's sets: its flows and effects, its liveness probe, and peering.
#[derive(Clone)]
pub struct FencingMetrics {
    pub fence: FenceMetrics,
    pub probe: ProbeMetrics,
    pub peers: PeerMetrics,
}

impl FencingMetrics {
    pub fn register(reg: &mut Registry) -> FencingMetrics {
        FencingMetrics {
            fence: FenceMetrics::register(reg),
            probe: ProbeMetrics::register(reg),
            peers: PeerMetrics::register(reg),
        }
    }
}
