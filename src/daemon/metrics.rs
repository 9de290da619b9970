//! Prometheus metrics of the daemon: poll cycles, report verification, jobs.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub kind: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub stage: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub poll_cycle_seconds: Histogram,
    pub reports_accepted: Counter,
    pub reports_rejected: Family<ReasonLabel, Counter>,
    pub nodes_unreachable: Gauge,
    pub jobs_started: Counter,
    pub jobs_finished: Family<JobLabel, Counter>,
    pub events_created: Counter,
    pub fences_started: Counter,
    pub fencing_storm: Gauge,
    /// Time from detection to release, per stage (detection, isolation, power-off, release, total).
    pub fence_stage_seconds: Family<StepLabel, Histogram>,
    /// Actions a standby decided and did not carry out (repair and fence decisions).
    pub standby_dropped: Counter,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
}

impl Metrics {
    pub fn register(reg: &mut Registry) -> Metrics {
        let m = Metrics {
            poll_cycle_seconds: Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]),
            reports_accepted: Counter::default(),
            reports_rejected: Family::default(),
            nodes_unreachable: Gauge::default(),
            jobs_started: Counter::default(),
            jobs_finished: Family::default(),
            events_created: Counter::default(),
            fences_started: Counter::default(),
            fencing_storm: Gauge::default(),
            standby_dropped: Counter::default(),
            leader: Gauge::default(),
            fence_stage_seconds: Family::new_with_constructor(|| {
                Histogram::new([
                    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
                ])
            }),
        };
        reg.register(
            "maintd_poll_cycle_seconds",
            "Time to poll and verify every collector once",
            m.poll_cycle_seconds.clone(),
        );
        reg.register(
            "maintd_reports_accepted",
            "Reports that passed verification",
            m.reports_accepted.clone(),
        );
        reg.register(
            "maintd_reports_rejected",
            "Reports rejected, by reason",
            m.reports_rejected.clone(),
        );
        reg.register(
            "maintd_nodes_unreachable",
            "Nodes whose collector did not answer the last poll",
            m.nodes_unreachable.clone(),
        );
        reg.register(
            "maintd_jobs_started",
            "Jobs submitted",
            m.jobs_started.clone(),
        );
        reg.register(
            "maintd_jobs_finished",
            "Jobs finished, by kind and outcome",
            m.jobs_finished.clone(),
        );
        reg.register(
            "maintd_events_created",
            "Repair events created",
            m.events_created.clone(),
        );
        reg.register(
            "maintd_fences_started",
            "Fence flows started",
            m.fences_started.clone(),
        );
        reg.register(
            "maintd_fencing_storm",
            "1 while more nodes than the storm threshold are unreachable",
            m.fencing_storm.clone(),
        );
        reg.register(
            "maintd_fence_stage_seconds",
            "Latency of each stage from detection to release",
            m.fence_stage_seconds.clone(),
        );
        reg.register(
            "maintd_standby_dropped_actions",
            "Actions this replica decided as a standby and did not carry out",
            m.standby_dropped.clone(),
        );
        reg.register(
            "maintd_leader",
            "1 while this replica is the leader",
            m.leader.clone(),
        );
        m
    }
}
