//! The gauges read from the store (and the clocks) at each scrape.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::store::Store;
use maintd_core::repair::RepairStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepairStatusLabel {
    repair_status: &'static str,
}

/// Gauges read from the store at each scrape, so they can never drift from the state: events
/// by repair status, the age of the oldest running job, and unfinished fence flows by step
/// and status. Every label value is always present (0 when none), so alerts see a series.
pub struct StateGauges {
    pub store: Arc<Store>,
}

impl std::fmt::Debug for StateGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateGauges({})", self.store.path())
    }
}

impl Collector for StateGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = crate::clock::steady_ns();
        ConstGauge::new(crate::clock::wall_step_ns() as f64 / 1e9).encode(
            encoder.encode_descriptor(
                "maintd_clock_step_seconds",
                "How far the master's wall clock has stepped from its steady clock since the daemon started (spans are measured on the steady clock; this is what its records' times are off by)",
                None,
                MetricType::Gauge,
            )?,
        )?;
        if let Ok(counts) = self.store.event_status_counts() {
            let mut family = encoder.encode_descriptor(
                "maintd_events",
                "Live repair events, by repair status",
                None,
                MetricType::Gauge,
            )?;
            for st in [
                RepairStatus::Noted,
                RepairStatus::Pending,
                RepairStatus::Canceled,
                RepairStatus::Failed,
                RepairStatus::Completed,
            ] {
                let repair_status = st.as_str();
                let n = counts.get(repair_status).copied().unwrap_or(0);
                ConstGauge::new(n)
                    .encode(family.encode_family(&RepairStatusLabel { repair_status })?)?;
            }
        }
        if let Ok(oldest) = self.store.oldest_running_job_ns() {
            let age = oldest.map_or(0.0, |t| now.saturating_sub(t).max(0) as f64 / 1e9);
            ConstGauge::new(age).encode(encoder.encode_descriptor(
                "maintd_oldest_running_job_age_seconds",
                "Age of the oldest job still running (0 when none runs)",
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}
