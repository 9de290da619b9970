//! One hook run per job across machines: before a runner runs a job's hook it claims the job
//! in a shared store (a key bound to a short lease it keeps alive), and it records the hook's
//! end there. A runner on another machine (a new leader resuming the job) adopts that end, or
//! waits while the claim lives, and runs the hook itself only once the claim has lapsed. A
//! runner that cannot renew its claim kills its hook before the claim can lapse in the store's
//! eyes, so two runs of one job never overlap.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use maintd_core::verdict::Outcome;

/// A claim a runner holds: its lease, and the lease's time to live as the store granted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub lease: i64,
    pub ttl: Duration,
    /// The claim key's revision, which recording the end compares.
    pub rev: i64,
    /// Who claimed it (unique per runner).
    pub holder: String,
}

/// What a store that shares claims must do. Errors are the store's own words, for the log.
#[async_trait::async_trait]
pub trait ClaimStore: Send + Sync {
    /// The recorded end of job `key`, if any.
    async fn ended(&self, key: &str) -> Result<Option<Vec<u8>>, String>;
    /// Claims job `key` for `holder` for `ttl`, unless it is claimed or has ended; `None` then.
    async fn claim(&self, key: &str, holder: &str, ttl: Duration) -> Result<Option<Claim>, String>;
    /// Keeps the claim alive; `false` once it is gone.
    async fn renew(&self, claim: &Claim) -> Result<bool, String>;
    /// Records the end and drops the claim in one step; `false` when the claim was gone (the
    /// end is then not recorded: another runner may have claimed the job).
    async fn finish(&self, key: &str, claim: &Claim, end: &[u8]) -> Result<bool, String>;
    /// Who holds the claim on `key` now, for the log.
    async fn holder(&self, key: &str) -> Result<Option<String>, String>;
}

/// How a claimed run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// Another runner's end, adopted.
    Adopted(Vec<u8>),
    /// The hook ran here; `recorded` says whether its end reached the store.
    Ran { outcome: Outcome, recorded: bool },
    /// The claim could not be kept: the hook was stopped (or never started).
    Lost(Outcome),
}

/// How often the store is asked again while another runner holds the job.
const POLL: Duration = Duration::from_millis(250);

/// Runs `hook` for job `key` at most once across every runner sharing `store`: adopts a
/// recorded end, waits while another runner's claim lives, else claims the job and runs the
/// hook while the claim is renewed. The hook is dropped (which kills it) when a third of the
/// claim's time to live is all that may remain of it. `encode` turns the hook's outcome into
/// the end recorded. Gives up after `patience` without a claim or an end.
pub async fn run_claimed<H>(
    store: &dyn ClaimStore,
    key: &str,
    holder: &str,
    ttl: Duration,
    patience: Duration,
    hook: H,
    encode: impl Fn(&Outcome) -> Vec<u8>,
) -> Claimed
where
    H: Future<Output = Outcome>,
{
    let give_up = Instant::now() + patience;
    let mut said_held = false;
    let (claim, sent) = loop {
        let asked = Instant::now();
        let problem = match store.ended(key).await {
            Ok(Some(end)) => return Claimed::Adopted(end),
            Ok(None) => match store.claim(key, holder, ttl).await {
                Ok(Some(c)) => break (c, asked),
                Ok(None) => {
                    if !said_held {
                        said_held = true;
                        let by = store.holder(key).await.ok().flatten();
                        tracing::info!(job = key, by = ?by, "another runner holds this job: waiting for its end, or for its claim to lapse");
                    }
                    None
                }
                Err(e) => Some(e),
            },
            Err(e) => Some(e),
        };
        if Instant::now() >= give_up {
            let why = problem.unwrap_or_else(|| "another runner still holds it".into());
            return Claimed::Lost(Outcome::failed(format!(
                "could not claim the job in the store within {patience:?}: {why}; the hook did not run here"
            )));
        }
        if let Some(e) = problem {
            tracing::warn!(job = key, error = %e, "cannot claim the job in the store yet");
        }
        tokio::time::sleep(POLL).await;
    };
    // The claim lapses `ttl` after the store last renewed it, which is after the renewal was
    // sent: measured from the send, the hook is stopped with a third of it to spare.
    let margin = claim.ttl / 3;
    // A floor, so that a store granting no time at all is not asked again in a busy loop
    // (the hook is then stopped at once: there is no claim to run it under).
    let every = (claim.ttl / 4).max(Duration::from_millis(50));
    let mut renewed = sent;
    let mut next_try = sent + every;
    let mut hook = std::pin::pin!(hook);
    let outcome = loop {
        let stop_at = renewed + claim.ttl - margin;
        tokio::select! {
            out = &mut hook => break out,
            _ = tokio::time::sleep_until(stop_at) => {
                tracing::error!(job = key, "could not renew the job's claim: its hook is stopped before the claim lapses");
                return Claimed::Lost(Outcome::failed(format!(
                    "stopped: the job's claim in the store could not be renewed for {:?}, and another machine may run it once the claim lapses",
                    claim.ttl - margin
                )));
            }
            _ = tokio::time::sleep_until(next_try) => {
                let asked = Instant::now();
                next_try = asked + every;
                let answer = tokio::select! {
                    a = store.renew(&claim) => a,
                    // A renewal that hangs still ends by the stop.
                    _ = tokio::time::sleep_until(stop_at) => continue,
                };
                match answer {
                    Ok(true) => renewed = asked,
                    Ok(false) => {
                        tracing::error!(job = key, "the job's claim is gone: its hook is stopped");
                        return Claimed::Lost(Outcome::failed(
                            "stopped: the job's claim in the store lapsed",
                        ));
                    }
                    Err(e) => tracing::warn!(job = key, error = %e, "cannot renew the job's claim"),
                }
            }
        }
    };
    // The end is recorded while the claim lives; a claim that lapses first leaves it
    // unrecorded, and the job may run again elsewhere.
    let end = encode(&outcome);
    loop {
        let asked = Instant::now();
        match store.finish(key, &claim, &end).await {
            Ok(true) => {
                return Claimed::Ran {
                    outcome,
                    recorded: true,
                };
            }
            Ok(false) => break,
            Err(e) => tracing::warn!(job = key, error = %e, "cannot record the job's end yet"),
        }
        if asked + POLL >= renewed + claim.ttl - margin {
            break;
        }
        if let Ok(true) = store.renew(&claim).await {
            renewed = asked;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::error!(
        job = key,
        "the job's end could not be recorded before its claim lapsed: another machine may run it again"
    );
    Claimed::Ran {
        outcome,
        recorded: false,
    }
}

#[cfg(test)]
mod tests {
    //! Runners of one job on several machines, in simulated time, over an in-memory store
    //! with etcd's lease semantics; each machine's link to the store is cut at drawn moments
    //! (its requests then time out, some after they were applied), and every request waits
    //! drawn delays before it is applied and before its answer.
    use super::*;
    use crate::sync::LockExt;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    const TTL: Duration = Duration::from_secs(3);
    const TIMEOUT: Duration = Duration::from_secs(1);

    #[derive(Default)]
    struct Shared {
        /// The claim: its lease, revision and when it lapses.
        claim: Option<(i64, i64, Instant)>,
        /// The end, and who recorded it.
        end: Option<(String, Vec<u8>)>,
        rev: i64,
        leases: i64,
    }

    impl Shared {
        fn lapse(&mut self) {
            if self.claim.is_some_and(|(_, _, at)| at <= Instant::now()) {
                self.claim = None;
            }
        }
    }

    /// One machine's link to the store.
    struct Link {
        shared: Arc<Mutex<Shared>>,
        cuts: Vec<(Duration, Duration)>,
        delays: (Duration, Duration),
        t0: Instant,
    }

    impl Link {
        fn cut(&self) -> bool {
            let at = Instant::now() - self.t0;
            self.cuts.iter().any(|&(s, len)| s <= at && at < s + len)
        }

        /// Applies `op` after the first delay unless the link is cut then; answers after the
        /// second unless it is cut then (applied, its answer lost).
        async fn around<T>(&self, op: impl FnOnce(&mut Shared) -> T) -> Result<T, String> {
            tokio::time::sleep(self.delays.0).await;
            if self.cut() {
                tokio::time::sleep(TIMEOUT).await;
                return Err("no answer (cut before it was applied)".into());
            }
            let out = {
                let mut s = self.shared.lock_unpoisoned();
                s.lapse();
                op(&mut s)
            };
            tokio::time::sleep(self.delays.1).await;
            if self.cut() {
                tokio::time::sleep(TIMEOUT).await;
                return Err("no answer (cut after it was applied)".into());
            }
            Ok(out)
        }
    }

    #[async_trait::async_trait]
    impl ClaimStore for Link {
        async fn ended(&self, _key: &str) -> Result<Option<Vec<u8>>, String> {
            self.around(|s| s.end.as_ref().map(|(_, e)| e.clone()))
                .await
        }

        async fn claim(
            &self,
            _key: &str,
            holder: &str,
            ttl: Duration,
        ) -> Result<Option<Claim>, String> {
            self.around(|s| {
                if s.claim.is_some() || s.end.is_some() {
                    return None;
                }
                s.rev += 1;
                s.leases += 1;
                s.claim = Some((s.leases, s.rev, Instant::now() + ttl));
                Some(Claim {
                    lease: s.leases,
                    ttl,
                    rev: s.rev,
                    holder: holder.to_string(),
                })
            })
            .await
        }

        async fn renew(&self, c: &Claim) -> Result<bool, String> {
            self.around(|s| match &mut s.claim {
                Some((lease, _, at)) if *lease == c.lease => {
                    *at = Instant::now() + c.ttl;
                    true
                }
                _ => false,
            })
            .await
        }

        async fn finish(&self, _key: &str, c: &Claim, end: &[u8]) -> Result<bool, String> {
            self.around(|s| {
                if s.claim.is_some_and(|(l, r, _)| l == c.lease && r == c.rev) {
                    s.claim = None;
                    s.end = Some((c.holder.clone(), end.to_vec()));
                    true
                } else {
                    // The etcd store reads back a finish sent again after it landed: its
                    // own end, not another runner's however alike.
                    s.end
                        .as_ref()
                        .is_some_and(|(h, e)| *h == c.holder && e == end)
                }
            })
            .await
        }

        async fn holder(&self, _key: &str) -> Result<Option<String>, String> {
            self.around(|s| s.claim.map(|(l, _, _)| format!("lease {l}")))
                .await
        }
    }

    /// Counts the hook runs alive at once; a run ends when it completes or is dropped.
    #[derive(Default)]
    struct Runs {
        alive: AtomicUsize,
        most: AtomicUsize,
        started: AtomicUsize,
        completed: AtomicUsize,
    }

    struct Alive<'a>(&'a Runs);

    impl Drop for Alive<'_> {
        fn drop(&mut self) {
            self.0.alive.fetch_sub(1, Ordering::SeqCst);
        }
    }

    async fn hook(runs: &Runs, who: usize, takes: Duration) -> Outcome {
        let n = runs.alive.fetch_add(1, Ordering::SeqCst) + 1;
        runs.most.fetch_max(n, Ordering::SeqCst);
        runs.started.fetch_add(1, Ordering::SeqCst);
        let _alive = Alive(runs);
        tokio::time::sleep(takes).await;
        runs.completed.fetch_add(1, Ordering::SeqCst);
        Outcome::done(format!("ran on machine {who}"))
    }

    fn encode(o: &Outcome) -> Vec<u8> {
        serde_json::to_vec(o).unwrap()
    }

    /// Runs one runner per machine (each starting at its drawn moment) and returns what each
    /// ended with, and the runs.
    fn machines(
        starts: &[u64],
        cuts: &[Vec<(u64, u64)>],
        delays: &[(u64, u64)],
        takes: u64,
    ) -> (Vec<Claimed>, Arc<Runs>, Option<Vec<u8>>) {
        crate::clock::simulated_runtime().block_on(async {
            let shared = Arc::new(Mutex::new(Shared::default()));
            let runs = Arc::new(Runs::default());
            let t0 = Instant::now();
            let ms = Duration::from_millis;
            let tasks = (0..starts.len()).map(|i| {
                let link = Link {
                    shared: shared.clone(),
                    cuts: cuts[i].iter().map(|&(s, l)| (ms(s), ms(l))).collect(),
                    delays: (ms(delays[i].0), ms(delays[i].1)),
                    t0,
                };
                let runs = runs.clone();
                let start = ms(starts[i]);
                async move {
                    tokio::time::sleep(start).await;
                    let patience = ms(takes) + 2 * TTL + Duration::from_secs(10);
                    run_claimed(
                        &link,
                        "e1-2",
                        &format!("machine {i}"),
                        TTL,
                        patience,
                        hook(&runs, i, ms(takes)),
                        encode,
                    )
                    .await
                }
            });
            let ends = futures::future::join_all(tasks).await;
            let end = shared.lock_unpoisoned().end.clone().map(|(_, e)| e);
            (ends, runs, end)
        })
    }

    #[test]
    fn without_faults_the_hook_runs_once_and_every_other_runner_adopts_its_end() {
        let (ends, runs, end) = machines(
            &[0, 500, 4000],
            &[vec![], vec![], vec![]],
            &[(20, 20); 3],
            6000,
        );
        assert_eq!(runs.started.load(Ordering::SeqCst), 1);
        assert_eq!(runs.completed.load(Ordering::SeqCst), 1);
        let end = end.expect("the end is recorded");
        assert_eq!(
            ends[0],
            Claimed::Ran {
                outcome: Outcome::done("ran on machine 0"),
                recorded: true
            }
        );
        assert_eq!(ends[1], Claimed::Adopted(end.clone()));
        assert_eq!(ends[2], Claimed::Adopted(end));
    }

    #[test]
    fn a_runner_cut_off_stops_its_hook_before_another_machine_runs_it() {
        // Machine 0 claims, then is cut for good 1 s into a 20 s hook; machine 1 waits.
        let (ends, runs, end) = machines(
            &[0, 200],
            &[vec![(1000, 600_000)], vec![]],
            &[(20, 20); 2],
            20_000,
        );
        assert!(
            matches!(&ends[0], Claimed::Lost(o) if o.detail().contains("could not be renewed")),
            "{:?}",
            ends[0]
        );
        assert!(
            matches!(&ends[1], Claimed::Ran { recorded: true, .. }),
            "{:?}",
            ends[1]
        );
        assert_eq!(
            runs.most.load(Ordering::SeqCst),
            1,
            "never two runs at once"
        );
        assert_eq!(runs.started.load(Ordering::SeqCst), 2);
        assert_eq!(runs.completed.load(Ordering::SeqCst), 1);
        assert!(end.is_some());
    }

    fn window() -> impl Strategy<Value = (u64, u64)> {
        (0u64..30_000, 100u64..8_000)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Whatever the cuts and delays: two runs of the job are never alive at once; every
        /// runner ends; an end recorded is the one every adopter took; and the hook completes
        /// more than once only when a run's end could not be recorded.
        #[test]
        fn two_runs_of_one_job_never_overlap(
            starts in proptest::collection::vec(0u64..10_000, 3),
            cuts in proptest::collection::vec(proptest::collection::vec(window(), 0..3), 3),
            delays in proptest::collection::vec((0u64..400, 0u64..400), 3),
            takes in 100u64..12_000,
        ) {
            let (ends, runs, end) = machines(&starts, &cuts, &delays, takes);
            prop_assert_eq!(runs.most.load(Ordering::SeqCst) <= 1, true, "two runs alive at once: {:?}", ends);
            let unrecorded = ends.iter().filter(|e| matches!(e, Claimed::Ran { recorded: false, .. })).count();
            let completed = runs.completed.load(Ordering::SeqCst);
            prop_assert!(completed <= 1 + unrecorded, "{} completed runs, {} unrecorded: {:?}", completed, unrecorded, ends);
            for e in &ends {
                if let Claimed::Adopted(a) = e {
                    prop_assert_eq!(Some(a), end.as_ref());
                }
                if let Claimed::Ran { outcome, recorded: true } = e {
                    prop_assert_eq!(Some(encode(outcome)), end.clone());
                }
            }
        }
    }
}
