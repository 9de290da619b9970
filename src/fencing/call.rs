//! One fence-agent call, whoever runs it: what it is made for, how it ended, and the options
//! the agent reads on its standard input (never its command line).

use super::config::Method;

/// What a call is made for: the node being fenced, the flow (none for a readiness check), how
/// many calls the flow made before, and the node where the last failed call ran (a call run as
/// a Job goes elsewhere next time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallSite {
    pub node: String,
    pub flow: Option<uuid::Uuid>,
    pub seq: usize,
    pub failed_on: Option<String>,
}

/// How one call ended: the exit code (None when killed or never run), the output's tail, and
/// where it ran when not on the daemon's host.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub code: Option<i32>,
    pub output: String,
    pub host: Option<String>,
}

impl Answer {
    /// A call the daemon ran itself.
    pub fn here((code, output): (Option<i32>, String)) -> Answer {
        Answer {
            code,
            output,
            host: None,
        }
    }
}

pub(super) fn stdin_params(method: &Method, action: &str) -> Vec<u8> {
    let mut s = format!("action={action}\n");
    for (k, v) in &method.params {
        s.push_str(&format!("{k}={v}\n"));
    }
    s.into_bytes()
}

/// Where a state-changing call is written before it is made, so that a daemon taking over
/// knows of a call whose answer this one never recorded (it stopped mid-call).
#[async_trait::async_trait]
pub trait CallJournal: Send + Sync {
    /// Records `call` (pending); an error keeps the call from being made.
    async fn begin(&self, call: &maintd_core::fencing::machine::Call) -> Result<(), JournalError>;
}

/// A call that could not be written before it was made (so it was not made), and why.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The flow store refused the record (`at` names it).
    #[error("{at}: {source}")]
    Store {
        at: String,
        #[source]
        source: crate::store::StoreError,
    },
    /// The record was kept here but could not be shared with a successor (the state on etcd):
    /// this replica may no longer lead, so it makes no call a successor would not know of.
    #[error("the call's record could not be shared with a successor: {0}")]
    Share(#[source] crate::leader::CheckpointError),
}

/// No record before a call: the agent module's own tests.
#[cfg(test)]
pub struct NoJournal;

#[cfg(test)]
#[async_trait::async_trait]
impl CallJournal for NoJournal {
    async fn begin(&self, _call: &maintd_core::fencing::machine::Call) -> Result<(), JournalError> {
        Ok(())
    }
}
