//! The fencer's metrics: flows and their stages, storms and pauses, failures, alarms and returns, readiness, kdump notifications and drills.

use super::*;

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
