//! maintd's functional core: the vocabulary (verdicts, tags) and every pure decision, from
//! what a repair round runs to each step of a fence flow. Time comes in as a number, state as a
//! value, and decisions go out as values: nothing here reads a clock, a file or a socket, and
//! the crate's dependencies do no I/O, so Cargo keeps it so.

pub mod lease;
pub mod tags;
pub mod verdict;

/// Repairs: events, jobs and rounds (`model`), what to do now (`decide`), whether a node may be
/// evacuated (`capacity`), node-condition rules (`conditions`), and what the cluster's own
/// upkeep is told (`upkeep`).
pub mod repair {
    pub mod capacity;
    pub mod conditions;
    pub mod decide;
    pub mod model;
    pub mod upkeep;

    #[cfg(test)]
    mod tests;

    pub use decide::decide;
    pub use model::*;
}

/// Fencing: the staged fence state machine (`machine`), who watches whom and what they say
/// (`watchers`, `opinion`), when a node counts as partitioned from the master (`partitions`), self-fencing's rules and the proof of a reset (`selffence`), drills
/// (`drill`) and the probe's patience (`rtt`).
pub mod fencing {
    pub mod detector;
    pub mod drill;
    pub mod machine;
    pub mod opinion;
    pub mod partitions;
    pub mod rtt;
    pub mod selffence;
    pub mod watchers;
}

/// What the shell's tests share with the core's: the boot id of test clocks, and property-test
/// strategies.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing {
    /// The boot id the test clocks report.
    pub const TEST_BOOT: uuid::Uuid =
        uuid::Uuid::from_u128(0x7465_7374_2d62_6f6f_7400_0000_0000_0001);

    pub use crate::verdict::strategies::json;
}
