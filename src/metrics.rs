//! The vocabulary of the daemon's Prometheus metrics: their labels, the `metric_set!` a part
//! declares its own set with (each set lives beside the code that produces it: `repair::metrics`,
//! `fencing::metrics`, `leader`), the gauges read from the store at each scrape (`state`), and
//! the classic text format.

mod state;
pub use state::StateGauges;

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// How an operation ended (`ok`, `conflict`, `error`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
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

/// A set of metrics declared once each, with its name and help, and registered together:
/// `field: Type = initial value => ("name", "help")`.
macro_rules! metric_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $init:expr => ($metric:literal, $help:literal) ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// The set, not yet registered (a part that exists before the registry does).
            pub fn new() -> $name {
                $name { $( $field: $init, )* }
            }

            /// Registers this set's metrics (each handle is shared with the registry).
            pub fn register_in(&self, reg: &mut ::prometheus_client::registry::Registry) {
                $( reg.register($metric, $help, self.$field.clone()); )*
            }

            pub fn register(reg: &mut ::prometheus_client::registry::Registry) -> $name {
                let m = $name::new();
                m.register_in(reg);
                m
            }
        }

        impl Default for $name {
            fn default() -> $name {
                $name::new()
            }
        }
    };
}
pub(crate) use metric_set;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabel {
    pub step: &'static str,
    pub status: &'static str,
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
