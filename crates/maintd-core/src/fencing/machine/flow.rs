//! A fence flow as it is stored: its step and status, the proofs it gathered, its history and
//! agent calls, and what declared the node dead.

use super::*;

mod facts;
pub use facts::established;

const FLOW_NAMESPACE: Uuid = Uuid::from_u128(0x6d61_696e_7464_4665_6e63_6500_0000_0001);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Transition {
    pub at: Nanos,
    pub step: Step,
    pub status: FenceStatus,
    pub note: String,
}

/// One agent call, as recorded for the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Call {
    pub at: Nanos,
    pub step: Step,
    pub method: String,
    pub agent: String,
    pub action: String,
    pub code: Option<i32>,
    pub ok: bool,
    #[serde(rename = "elapsed-ms")]
    pub elapsed_ms: u64,
    pub output: String,
    /// The node the call ran on, as a Job; absent when the daemon ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Recorded before it was made, its answer not (yet): a call whose daemon stopped before
    /// the answer came stays so, and tells a successor the device may have acted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

impl Call {
    /// The same call: a pending record and its answer share when it started and what it was.
    pub fn same(&self, other: &Call) -> bool {
        (self.at, self.step, &self.method, &self.agent, &self.action)
            == (
                other.at,
                other.step,
                &other.method,
                &other.agent,
                &other.action,
            )
    }
}

/// The output of a call recorded before it was made, until its answer replaces it.
pub const PENDING: &str = "started; no answer recorded yet";

/// How the output of an agent call killed at its deadline begins.
pub const KILLED: &str = "no answer within";

/// How an agent call ended, for a message: an exit code, killed at the deadline, or never run
/// (a missing agent, one that could not be started).
pub fn ended(code: Option<i32>, output: &str) -> String {
    match code {
        None if output == PENDING => "no answer recorded".into(),
        Some(c) => format!("exit {c}"),
        None if output.starts_with(KILLED) => "killed at the deadline".into(),
        None => "not run".into(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Flow {
    pub id: Uuid,
    pub node: String,
    pub step: Step,
    pub status: FenceStatus,
    /// Failed attempts of the current step.
    pub retries: u32,
    pub restarts: u32,
    /// Outcome of the running attempt, written by the executor.
    pub result: Option<Outcome>,
    pub release_result: Option<Outcome>,
    pub reclaim_result: Option<Outcome>,
    pub next_attempt: Nanos,
    pub reclaimed: bool,
    pub canceled: bool,
    /// The fencefailed tag is on the node.
    pub tagged: bool,
    /// When the collector went silent.
    pub detected: Nanos,
    pub created: Nanos,
    pub updated: Nanos,
    /// When the node was isolated, if it was.
    #[serde(flatten, with = "facts::isolated")]
    pub isolated_at: Option<Nanos>,
    /// When its power-off was verified (status answered OFF), or a self-fencing node's reset
    /// proven and its moment passed: the only proof that allows a release.
    #[serde(flatten, with = "facts::fenced")]
    pub fenced_at: Option<Nanos>,
    /// When its workloads were released.
    #[serde(flatten, with = "facts::released")]
    pub released_at: Option<Nanos>,
    pub history: Vec<Transition>,
    pub calls: Vec<Call>,
    /// Self-fencing marked the node unschedulable (recovery clears it).
    #[serde(default)]
    pub marked: bool,
    /// Self-fencing: the time from the start of the quiet window to the reset (isolation +
    /// feed interval + watchdog timeout + margin, from the node's signed settings), and the
    /// moment the node has reset by: an estimate until `safe_proven`, then the proven moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_time_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_until: Option<Nanos>,
    /// The node's starving is proven: `safe_until` stands for any later leader (a starved
    /// watchdog is never fed again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub safe_proven: bool,
    /// The proven moment on the boot clock of the master that proved it: a restart on the same
    /// boot resumes the wait exactly, whatever the wall clock did; any other boot proves again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_boot: Option<crate::verdict::BootInstant>,
    /// The node's signed self-fencing settings, kept for a leader that never saw its report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_fence_times: Option<crate::fencing::selffence::SelfFenceTimes>,
    /// When a kdump notification from the node (after it went silent) said it runs its crash
    /// kernel: its workloads are released at once, and power-management waits for the dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kdump_at: Option<Nanos>,
    /// What declared the node dead when the flow started: recovery waits for each of them to
    /// be healthy again.
    #[serde(default = "Witnesses::legacy")]
    pub witnesses: Witnesses,
    /// The boot id the node reported last before the fence: it returns to service only with
    /// another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_before: Option<Uuid>,
    /// When its power-on was verified (status read ON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub powered_on_at: Option<Nanos>,
    /// The new boot id its reports proved, once seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_boot: Option<Uuid>,
    /// When it returned to service (its proof complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_at: Option<Nanos>,
    /// Why it must not return to service: it answered with its old boot id after a verified
    /// power-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
    /// Who acknowledged the flow's failure or alarm, and why (`maintd fences ack`): a released
    /// node then returns to service once it answers and reports healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<String>,
    /// The plan the flow started with, without its secrets: it runs by this one to its end,
    /// whatever the configuration became since (absent in flows recorded before plans were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRecord>,
    /// Store version this copy was loaded at (a save of a stale copy is refused).
    #[serde(skip)]
    pub version: u64,
}

/// Which executor-written outcome of a flow to set; also the key of an effect in progress (one
/// of each kind per flow at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum FlowOutcome {
    Step,
    Release,
    Reclaim,
}

impl FlowOutcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why an operator's cancel of a flow is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelRefused {
    Final,
    PoweredOff,
    /// The power-off runs: it goes to its verified end.
    PowerOffRunning,
    AlreadyCanceled,
}

/// The witnesses that declared a node dead.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub struct Witnesses {
    /// The collector stopped answering the liveness probe.
    pub collector: bool,
    /// The node-condition fence rule that held, as `Ready=Unknown for 5s`.
    pub condition: Option<String>,
    /// The watchers that had lost the node too (the second opinion), each with its view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerWitness>,
    /// An operator asked for this fence (the request's name, as `NodeFence/web-3`): the node
    /// may well be alive, so only a cancel stands the flow down before the power-off, and it
    /// returns to service only on a healthy report diagnosed after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manual: Option<String>,
    /// Who still heard the node when a condition rule started the flow (`collector`, its
    /// watchers, its Leases): a rule decides, but the record says the node looked alive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alive: Vec<String>,
}

impl Witnesses {
    /// Flows recorded before witnesses were: the collector decided, as it then always did.
    fn legacy() -> Witnesses {
        Witnesses {
            collector: true,
            condition: None,
            peers: Vec::new(),
            manual: None,
            alive: Vec::new(),
        }
    }
}

impl Flow {
    /// What an effect saw, in its own field, its agent calls appended: the same in every flow
    /// store. A call recorded before it was made gives way to its answer; a pending call of an
    /// earlier daemon (stopped mid-call) stays, as the record that it was made. Applying it
    /// twice (a write sent again whose first answer was lost) records each call once.
    pub fn record_outcome(&mut self, which: FlowOutcome, outcome: Outcome, calls: Vec<Call>) {
        match which {
            FlowOutcome::Step => self.result = Some(outcome),
            FlowOutcome::Release => self.release_result = Some(outcome),
            FlowOutcome::Reclaim => self.reclaim_result = Some(outcome),
        }
        self.calls
            .retain(|c| !(c.pending && calls.iter().any(|d| d.same(c))));
        for call in calls {
            if !self.calls.contains(&call) {
                self.calls.push(call);
            }
        }
    }

    /// A state-changing agent call about to be made, recorded first; once, however often it
    /// is applied, and never over the answer it already has.
    pub fn record_call(&mut self, call: Call) {
        if !self.calls.iter().any(|c| c.same(&call)) {
            self.calls.push(call);
        }
    }

    /// The node is isolated from its storage and network.
    pub fn isolated(&self) -> bool {
        self.isolated_at.is_some()
    }

    /// The node is proven off (or reset): its workloads may be released.
    pub fn fenced(&self) -> bool {
        self.fenced_at.is_some()
    }

    /// Its workloads are released.
    pub fn released(&self) -> bool {
        self.released_at.is_some()
    }

    /// Whether the node's answer stands the flow down before the power-off: not for an
    /// operator's fence, which asked for a node that may well answer.
    pub(super) fn yields_to_answer(&self) -> bool {
        self.witnesses.manual.is_none()
    }

    /// A new flow for `node`, silent since `detected`, starting at `step` (its id is derived
    /// from the node and the moment, so a decision made twice names the same flow).
    pub fn new(
        node: &str,
        detected: Nanos,
        now: Nanos,
        step: Step,
        witnesses: Witnesses,
        why: impl Into<String>,
    ) -> Flow {
        let mut f = Flow {
            id: Uuid::new_v5(&FLOW_NAMESPACE, format!("{node}\n{now}").as_bytes()),
            node: node.to_string(),
            step,
            status: FenceStatus::New,
            retries: 0,
            restarts: 0,
            result: None,
            release_result: None,
            reclaim_result: None,
            next_attempt: now,
            marked: false,
            safe_time_ms: None,
            safe_until: None,
            safe_proven: false,
            safe_boot: None,
            self_fence_times: None,
            kdump_at: None,
            reclaimed: false,
            canceled: false,
            tagged: false,
            detected,
            created: now,
            updated: now,
            isolated_at: None,
            fenced_at: None,
            released_at: None,
            history: Vec::new(),
            calls: Vec::new(),
            witnesses,
            boot_before: None,
            powered_on_at: None,
            returned_boot: None,
            returned_at: None,
            alarm: None,
            acknowledged: None,
            plan: None,
            version: 0,
        };
        f.go(now, step, FenceStatus::New, why);
        f
    }

    pub(super) fn go(
        &mut self,
        now: Nanos,
        step: Step,
        status: FenceStatus,
        note: impl Into<String>,
    ) {
        self.step = step;
        self.status = status;
        self.updated = now;
        self.history.push(Transition {
            at: now,
            step,
            status,
            note: note.into(),
        });
    }

    /// Records `note` in the history at the flow's current step and status (no transition).
    pub(super) fn note(&mut self, now: Nanos, note: impl Into<String>) {
        self.updated = now;
        self.history.push(Transition {
            at: now,
            step: self.step,
            status: self.status,
            note: note.into(),
        });
    }

    /// An operator's cancel: only before the node was powered off (after it, only recovery
    /// brings the node back); a repeated cancel changes nothing and says so.
    pub fn cancel(&mut self, now: Nanos) -> Result<(), CancelRefused> {
        if self.status == FenceStatus::Final {
            return Err(CancelRefused::Final);
        }
        if self.fenced() {
            return Err(CancelRefused::PoweredOff);
        }
        if self.step == Step::PowerManagement && self.status == FenceStatus::Running {
            return Err(CancelRefused::PowerOffRunning);
        }
        if self.canceled {
            return Err(CancelRefused::AlreadyCanceled);
        }
        self.canceled = true;
        self.updated = now;
        self.history.push(Transition {
            at: now,
            step: self.step,
            status: self.status,
            note: "canceled by operator".into(),
        });
        Ok(())
    }

    /// Still heading for a power-off (counts against the in-flight cap).
    pub fn in_flight(&self, max_restarts: u32) -> bool {
        !self.fenced()
            && match self.status {
                FenceStatus::Final => false,
                FenceStatus::Error => self.restarts < max_restarts && !self.canceled,
                _ => self.step != Step::Recovery,
            }
    }
}
