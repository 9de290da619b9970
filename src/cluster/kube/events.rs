//! Events on Nodes and ConfigMaps through kube's Events recorder (events.k8s.io/v1, a repeat of
//! the same message on the same object becomes one Event with a growing series count), behind
//! a budget: per object and reason a short burst, then one Event per `PER_KEY_REFILL`, and at
//! most `GLOBAL_BURST` at once cluster-wide, refilled at `GLOBAL_PER_SEC`, so a thousand nodes
//! changing at once cost the apiserver a bounded number of writes. What the budget holds back
//! is counted and said once per window in the log.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use sha2::Digest;
use tracing::warn;

use crate::cluster::EventReason;
use crate::sync::LockExt;

const PER_KEY_BURST: f64 = 10.0;
const PER_KEY_REFILL: Duration = Duration::from_secs(30);
const GLOBAL_BURST: f64 = 100.0;
const GLOBAL_PER_SEC: f64 = 5.0;

/// A token bucket: `burst` tokens, one more every `per`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, burst: f64, per_sec: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_sec).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How many Events may be written now.
#[derive(Debug)]
pub struct Budget {
    keys: BTreeMap<(String, &'static str), Bucket>,
    global: Bucket,
    /// Held back since the last report of it, and when that was.
    held: u64,
    reported: Instant,
}

impl Budget {
    pub fn new(now: Instant) -> Budget {
        Budget {
            keys: BTreeMap::new(),
            global: Bucket {
                tokens: GLOBAL_BURST,
                at: now,
            },
            held: 0,
            reported: now,
        }
    }

    /// Whether an Event of `reason` on `object` may be written at `now`.
    pub fn allow(&mut self, object: &str, reason: &'static str, now: Instant) -> bool {
        let per_key = 1.0 / PER_KEY_REFILL.as_secs_f64();
        // Full buckets hold no information: forget them, so the map stays small.
        self.keys.retain(|_, b| {
            let full = b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_key;
            full < PER_KEY_BURST
        });
        let key = self
            .keys
            .entry((object.to_string(), reason))
            .or_insert(Bucket {
                tokens: PER_KEY_BURST,
                at: now,
            });
        let ok = key.take(PER_KEY_BURST, per_key, now)
            && self.global.take(GLOBAL_BURST, GLOBAL_PER_SEC, now);
        if !ok {
            self.held += 1;
        }
        ok
    }

    /// Events held back since the last call, once per minute at most.
    pub fn held_report(&mut self, now: Instant) -> Option<u64> {
        if self.held == 0 || now.saturating_duration_since(self.reported) < Duration::from_secs(60)
        {
            return None;
        }
        self.reported = now;
        Some(std::mem::take(&mut self.held))
    }
}

/// The recorder and its budget.
pub struct Events {
    recorder: Recorder,
    budget: Mutex<Budget>,
}

impl Events {
    pub fn new(client: kube::Client, instance: &str) -> Events {
        let reporter = Reporter {
            controller: "maintd".into(),
            instance: Some(instance.to_string()),
        };
        Events {
            recorder: Recorder::new(client, reporter),
            budget: Mutex::new(Budget::new(Instant::now())),
        }
    }

    /// Publishes one Event on `object`, if the budget allows. A repeat of the same message is
    /// the same Event (its series counts it); another message is another Event.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        reason: EventReason,
        message: &str,
        warning: bool,
    ) {
        let name = object.name.clone().unwrap_or_default();
        let now = Instant::now();
        let held = {
            let mut b = self.budget.lock_unpoisoned();
            if !b.allow(&name, reason.as_str(), now) {
                if let Some(n) = b.held_report(now) {
                    warn!(
                        held = n,
                        "Events held back by their budget (per object and reason, and cluster-wide); the log has every change"
                    );
                }
                return;
            }
            b.held_report(now)
        };
        if let Some(n) = held {
            warn!(
                held = n,
                "Events held back by their budget (per object and reason, and cluster-wide); the log has every change"
            );
        }
        let note: String = message.chars().take(1024).collect();
        // The recorder merges Events by reason and action: a short digest of the message in
        // the action keeps each message its own Event, and a repeat one series.
        let digest = sha2::Sha256::digest(note.as_bytes());
        let ev = KEvent {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: format!("{}-{}", reason.as_str(), hex::encode(&digest[..4])),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, object).await {
            warn!(object = %name, %reason, error = %e, "cannot record a Kubernetes Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_object_then_one_per_refill_and_a_cluster_wide_cap() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let sent = (0..50)
            .filter(|_| b.allow("n1", "MaintdPartitioned", t0))
            .count();
        assert_eq!(sent, PER_KEY_BURST as usize, "a burst, then nothing");
        assert!(
            b.allow("n1", "MaintdFence", t0),
            "another reason has its own"
        );
        assert!(!b.allow("n1", "MaintdPartitioned", t0 + Duration::from_secs(10)));
        assert!(b.allow("n1", "MaintdPartitioned", t0 + PER_KEY_REFILL));
        // A thousand nodes at once: the cluster-wide budget caps the writes.
        let mut b = Budget::new(t0);
        let sent = (0..1000)
            .filter(|i| b.allow(&format!("n{i}"), "MaintdPartitioned", t0))
            .count();
        assert_eq!(sent, GLOBAL_BURST as usize);
        assert_eq!(b.held_report(t0), None, "said at most once a minute");
        assert_eq!(b.held_report(t0 + Duration::from_secs(60)), Some(900));
        // Half a minute later, 150 more may go.
        let later = t0 + Duration::from_secs(30);
        let sent = (0..1000)
            .filter(|i| b.allow(&format!("m{i}"), "MaintdPartitioned", later))
            .count();
        assert_eq!(sent, 100, "refilled up to the burst, not beyond");
    }
}
