//! Prometheus metrics of the daemon: poll cycles, report verification, jobs; the gauges read
//! from the store at each scrape are in `state`.

mod state;
pub use state::StateGauges;

use prometheus_client::encoding::EncodeLabelSet;

use maintd_core::fencing::machine::{FenceStatus, Step};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KdumpLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabel {
    pub reason: &'static str,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub kind: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub stage: &'static str,
}

/// A failed fence effect: its stage and its failure's kind (`agent`, `still-on`,
/// `unconfirmed`, `backend`, `other`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailLabel {
    pub stage: &'static str,
    pub kind: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    pub poll_cycle_seconds: Histogram,
    pub reports_accepted: Counter,
    pub reports_rejected: Family<RejectLabel, Counter>,
    /// kdump notifications heard, accepted or refused (with the reason; node "" when unknown).
    pub kdump_notifications: Family<KdumpLabel, Counter>,
    pub nodes_unreachable: Gauge,
    /// Polls a collector did not answer (refused, timed out, broken off).
    pub polls_failed: Counter,
    pub jobs_started: Counter,
    pub jobs_finished: Family<JobLabel, Counter>,
    pub events_created: Counter,
    pub fences_started: Counter,
    /// Fence flows not final, by step and status, as the fencer last read them.
    pub fence_flows: Family<FlowLabel, Gauge>,
    pub fencing_storm: Gauge,
    /// 1 while fencing is paused (the configuration's `paused`, or an operator's pause).
    pub fencing_paused: Gauge,
    /// Seconds during which a storm held every fence start (f64 counter).
    pub fencing_storm_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Liveness probes that got no answer in time.
    pub probe_failures: Counter,
    /// Collectors that came to count as silent (`liveness-misses` probes in a row unanswered).
    pub probe_silences: Counter,
    /// The liveness probe's current patience per node.
    pub probe_timeout_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// How far each node's wall clock is from the master's, from the probe's round trip.
    pub node_clock_offset_seconds: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Time from detection to release, per stage (detection, isolation, power-off, release, total).
    pub fence_stage_seconds: Family<StepLabel, Histogram>,
    /// Actions a standby decided and did not carry out (repair and fence decisions).
    pub standby_dropped: Counter,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
    /// Unix time of the last completed decision.
    pub last_decision: Gauge,
    /// Decisions skipped, by what failed (store, tags, capacity).
    pub tick_failures: Family<ReasonLabel, Counter>,
    /// Failed fence attempts, by step (isolation, power-management, recovery, release, reclaim).
    pub fence_failures: Family<FailLabel, Counter>,
    /// Actions the engine could not carry out, by `ActionError::metric_label`.
    pub action_failures: Family<ReasonLabel, Counter>,
    /// 1 while every fencing level of a node passes its readiness check, 0 when not.
    pub fencing_ready: Family<NodeLabel, Gauge>,
    /// 1 while the master has lost a node that a watcher still hears.
    pub partitioned: Family<NodeLabel, Gauge>,
    /// Peer views refused, by reason (signature, node, stale, replayed, malformed).
    pub views_rejected: Family<ReasonLabel, Counter>,
    /// Peer sets pushed to collectors, and pushes that failed.
    pub peer_sets_pushed: Counter,
    pub peer_set_push_failures: Counter,
    /// Nodes that answered with their boot id from before a verified power-off.
    pub fence_alarms: Family<NodeLabel, Counter>,
    /// Fenced nodes returned to service on proof of a new boot.
    pub fence_returns: Counter,
    /// When each node's last fencing drill ended (Unix seconds), and whether it passed.
    pub drill_last: Family<NodeLabel, Gauge>,
    pub drill_passed: Family<NodeLabel, Gauge>,
}

impl Metrics {
    pub fn register(reg: &mut Registry) -> Metrics {
        let m = Metrics {
            poll_cycle_seconds: Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]),
            reports_accepted: Counter::default(),
            reports_rejected: Family::default(),
            kdump_notifications: Family::default(),
            nodes_unreachable: Gauge::default(),
            polls_failed: Counter::default(),
            jobs_started: Counter::default(),
            jobs_finished: Family::default(),
            events_created: Counter::default(),
            fences_started: Counter::default(),
            fence_flows: Family::default(),
            fencing_storm: Gauge::default(),
            fencing_paused: Gauge::default(),
            fencing_storm_seconds: Counter::default(),
            probe_timeout_seconds: Family::default(),
            node_clock_offset_seconds: Family::default(),
            probe_failures: Counter::default(),
            probe_silences: Counter::default(),
            standby_dropped: Counter::default(),
            leader: Gauge::default(),
            last_decision: Gauge::default(),
            tick_failures: Family::default(),
            fence_failures: Family::default(),
            action_failures: Family::default(),
            fence_alarms: Family::default(),
            fence_returns: Counter::default(),
            drill_last: Family::default(),
            drill_passed: Family::default(),
            fencing_ready: Family::default(),
            partitioned: Family::default(),
            views_rejected: Family::default(),
            peer_sets_pushed: Counter::default(),
            peer_set_push_failures: Counter::default(),
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
            "Reports rejected, by reason and node",
            m.reports_rejected.clone(),
        );
        reg.register(
            "maintd_kdump_notifications",
            "kdump notifications heard: accepted (from a silent kdump node) or refused, by reason",
            m.kdump_notifications.clone(),
        );
        reg.register(
            "maintd_nodes_unreachable",
            "Nodes whose collector did not answer the last poll",
            m.nodes_unreachable.clone(),
        );
        reg.register(
            "maintd_polls_failed",
            "Report polls a collector did not answer (refused, timed out or broken off)",
            m.polls_failed.clone(),
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
            "maintd_fence_alarms",
            "Nodes that answered with their boot id from before a verified power-off (the device lied)",
            m.fence_alarms.clone(),
        );
        reg.register(
            "maintd_fence_returns",
            "Fenced nodes returned to service on proof of a new boot",
            m.fence_returns.clone(),
        );
        reg.register(
            "maintd_drill_last_timestamp_seconds",
            "When each node's last fencing drill ended",
            m.drill_last.clone(),
        );
        reg.register(
            "maintd_drill_passed",
            "1 when each node's last fencing drill passed (its fence path works end to end), 0 when not",
            m.drill_passed.clone(),
        );
        reg.register(
            "maintd_fence_flows",
            "Fence flows not final yet, by step and status",
            m.fence_flows.clone(),
        );
        reg.register(
            "maintd_fencing_paused",
            "1 while fencing is paused: no fence starts, and no isolation or power-off runs",
            m.fencing_paused.clone(),
        );
        reg.register(
            "maintd_fencing_storm",
            "1 while more nodes than the storm threshold are unreachable",
            m.fencing_storm.clone(),
        );
        reg.register(
            "maintd_fencing_storm_seconds",
            "Time during which a storm held every fence start",
            m.fencing_storm_seconds.clone(),
        );
        reg.register(
            "maintd_probe_failures",
            "Liveness probes that got no answer within their patience",
            m.probe_failures.clone(),
        );
        reg.register(
            "maintd_probe_silences",
            "Collectors that came to count as silent (liveness-misses probes in a row unanswered)",
            m.probe_silences.clone(),
        );
        reg.register(
            "maintd_probe_timeout_seconds",
            "How long the liveness probe waits for each collector (adapted to its round trips)",
            m.probe_timeout_seconds.clone(),
        );
        reg.register(
            "maintd_node_clock_offset_seconds",
            "How far each node's wall clock is from the master's (positive: ahead), from the liveness probe's round trip; shown, never used to judge a node",
            m.node_clock_offset_seconds.clone(),
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
        reg.register(
            "maintd_engine_last_decision_timestamp_seconds",
            "Unix time of the engine's last completed decision",
            m.last_decision.clone(),
        );
        reg.register(
            "maintd_engine_skipped_decisions",
            "Decisions skipped because an input could not be read, by input",
            m.tick_failures.clone(),
        );
        reg.register(
            "maintd_fencing_ready",
            "1 while every fencing level of the node passes its readiness check, 0 when fencing is inactive",
            m.fencing_ready.clone(),
        );
        reg.register(
            "maintd_node_partitioned",
            "1 while the master cannot reach the node but one of its watchers still hears it",
            m.partitioned.clone(),
        );
        reg.register(
            "maintd_peer_views_rejected",
            "Peer views from collectors refused, by reason",
            m.views_rejected.clone(),
        );
        reg.register(
            "maintd_peer_sets_pushed",
            "Peer sets pushed to collectors",
            m.peer_sets_pushed.clone(),
        );
        reg.register(
            "maintd_peer_set_push_failures",
            "Peer set pushes that a collector did not accept",
            m.peer_set_push_failures.clone(),
        );
        reg.register(
            "maintd_fence_failures",
            "Failed fence attempts, by step",
            m.fence_failures.clone(),
        );
        reg.register(
            "maintd_engine_action_failures",
            "Actions the engine could not carry out (retried from the store next tick), by reason",
            m.action_failures.clone(),
        );
        m
    }

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

    pub fn action_failed(&self, reason: &'static str) {
        self.action_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn tick_failed(&self, reason: &'static str) {
        self.tick_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabel {
    step: &'static str,
    status: &'static str,
}

impl Metrics {
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

/// Rewrites OpenMetrics text as the classic Prometheus text format (0.0.4): a counter's HELP and
/// TYPE name its `_total` series, `_created` samples, `# UNIT` and `# EOF` go, and
/// `unknown` becomes `untyped`.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        if let Some((kind, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let tail = if kind == "# TYPE " && tail == "unknown" {
                "untyped"
            } else {
                tail
            };
            let name = if counters.contains(name) {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            out.push_str(&format!("{kind}{name} {tail}\n"));
            continue;
        }
        let series = line.split(['{', ' ']).next().unwrap_or("");
        if series
            .strip_suffix("_created")
            .is_some_and(|base| counters.contains(base))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_counters_become_classic_text() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total 3\na_events_created 1.5\n# HELP g A gauge.\n# TYPE g gauge\n# UNIT g seconds\ng{x=\"1\"} 2\n# TYPE u unknown\nu 1\n# EOF\n";
        let t = openmetrics_to_text(om);
        assert_eq!(
            t,
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total 3\n# HELP g A gauge.\n# TYPE g gauge\ng{x=\"1\"} 2\n# TYPE u untyped\nu 1\n"
        );
    }
}
