//! A seeded schedule of faults (Jepsen-style) against the three daemons and etcd members while
//! repairs go on: each fault (a daemon killed, stopped, or cut from the others' hosts; an etcd
//! member killed) strikes while a repair is in flight and is healed after a drawn span; a
//! daemon that exited is started again, as its supervisor would. Halfway, node1 dies. Checked
//! at the end, against the hooks' own log and the simulator: every repair asked for became one
//! event that completed (none lost), each of its actions ran as one job (none duplicated)
//! whose hook ran to its end once (a second time only where the machine that ran it was cut
//! off before it could record the end), node1 was told to power off once and released once. `MAINTD_FAULTS` (10 by default) and
//! `MAINTD_FAULT_SEED` (drawn from the clock by default) set the schedule; both are printed, so
//! a failing schedule runs again as it was.

use super::*;

use std::collections::{BTreeMap, BTreeSet};

use common::Moments;

#[derive(Debug, Clone, Copy)]
enum Strike {
    Kill(usize),
    Stop(usize),
    Cut(usize),
    Member(usize),
}

impl Ha {
    /// Heals what `strike` did; a daemon that exited (killed, or deposed) starts again.
    fn heal(&mut self, strike: Strike) {
        match strike {
            Strike::Kill(_) => {}
            Strike::Stop(i) => {
                if let Some(p) = &self.daemons[i] {
                    signal(p, nix::sys::signal::Signal::SIGCONT);
                }
            }
            Strike::Cut(i) => {
                for o in MASTERS.into_iter().filter(|&o| o != i) {
                    self.net.heal(i, o);
                }
            }
            Strike::Member(m) => self.etcd.start_member(m),
        }
    }

    /// Starts again each daemon that exited (deposed ones exit until the cluster settles)
    /// until one leads and the others name it.
    async fn settle(&mut self) -> usize {
        let deadline = Instant::now() + 2 * common::WAIT;
        loop {
            self.restart_exited();
            if let Some(l) = self.leader_now().await {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader after the fault");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn restart_exited(&mut self) {
        for i in MASTERS {
            let gone = match &mut self.daemons[i] {
                None => true,
                Some(p) => p.child.try_wait().unwrap().is_some(),
            };
            if gone {
                self.start_daemon(i);
            }
        }
    }
}

/// The hooks, logging `<action> <node> event=<id> job=<id>` as each one starts (in
/// `hooks-started.log`) and as it ends (in the hooks' log), a short span apart for a fault to
/// land in.
fn logging_hooks(c: &Cluster) {
    let log = c.path("hooks.log");
    let started = c.path("hooks-started.log");
    for hook in ["evacuate", "offline", "online", "release"] {
        c.set_hook(
            hook,
            &format!(
                "line=\"$MAINTD_ACTION $1 event=$MAINTD_EVENT job=$MAINTD_JOB\"; echo \"$line\" >> {}; sleep 0.3; echo \"$line\" >> {}",
                started.display(),
                log.display()
            ),
        );
    }
}

impl Ha {
    /// How many job runners, on any of the daemons' machines, ran a hook to its end but could
    /// not record that end before their claim lapsed (their machine cut off meanwhile): the
    /// only runs another machine may repeat.
    fn unrecorded_ends(&self) -> usize {
        MASTERS
            .into_iter()
            .map(|i| {
                let jobs = self.c.path(&format!("state-m{i}")).join("jobs");
                std::fs::read_dir(jobs)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|d| std::fs::read_to_string(d.path().join("runner.log")).ok())
                    .map(|t| {
                        t.matches("could not be recorded before its claim lapsed")
                            .count()
                    })
                    .sum::<usize>()
            })
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_schedule_of_faults_loses_no_event_and_runs_no_job_twice() {
    let faults: usize = std::env::var("MAINTD_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("MAINTD_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let Some(mut ha) = Ha::setup().await else {
        return;
    };
    eprintln!("fault schedule: MAINTD_FAULTS={faults} MAINTD_FAULT_SEED={seed}");
    logging_hooks(&ha.c);
    let mut rng = Moments(seed);
    let started = Instant::now();
    let mut events: Vec<String> = Vec::new();
    for k in 0..faults {
        // A repair in flight: node2 and node3 by turns.
        let node = ["node2", "node3"][k % 2];
        ha.c.set_verdict(
            node,
            &format!(r#"{{"status":"evacuate","details":{{"cycle":{k}}}}}"#),
        );
        if k == faults / 2 {
            ha.c.kill_collector(0);
        }
        tokio::time::sleep(rng.next(0, 1500)).await;
        let strike = match rng.pick(4) {
            0 => Strike::Kill(rng.pick(3)),
            1 => Strike::Stop(rng.pick(3)),
            2 => Strike::Cut(rng.pick(3)),
            _ => Strike::Member(rng.pick(3)),
        };
        let span = rng.next(500, 3 * LEASE_S * 1000);
        eprintln!(
            "{:>6.1} s  fault {k}: {strike:?} for {:.1} s, {node} asked to evacuate",
            started.elapsed().as_secs_f64(),
            span.as_secs_f64()
        );
        match strike {
            Strike::Kill(i) => drop(ha.daemons[i].take()),
            Strike::Stop(i) => {
                if let Some(p) = &ha.daemons[i] {
                    signal(p, nix::sys::signal::Signal::SIGSTOP);
                }
            }
            Strike::Cut(i) => {
                for o in MASTERS.into_iter().filter(|&o| o != i) {
                    ha.net.cut(i, o);
                }
            }
            Strike::Member(m) => ha.etcd.kill_member(m),
        }
        tokio::time::sleep(span).await;
        ha.heal(strike);
        // A daemon deposed by the fault exits once it runs again: wait a lease for that.
        tokio::time::sleep(Duration::from_secs(LEASE_S)).await;
        ha.etcd.wait_healthy().await;
        let l = ha.settle().await;
        ha.talk_to(l);
        // The repair completes; the operator acknowledges it and the node is healthy again.
        let e =
            ha.c.wait_event(node, "the repair completed", |e| {
                e["repair-status"] == "completed"
                    && e["tagged"] == true
                    && !events.iter().any(|id| e["id"] == id.as_str())
            })
            .await;
        let id = e["id"].as_str().unwrap().to_string();
        let tag = format!("maintd:repairready:{id}");
        let out = ha.c.cli(&["tags", "remove", node, &tag]);
        assert!(out.status.success(), "{out:?}");
        ha.c.set_verdict(node, r#"{"status":"Ok"}"#);
        let online = format!("online {node} event={id} ");
        wait_for("the node back online", || async {
            ha.c.hook_log()
                .iter()
                .any(|l| l.starts_with(&online))
                .then_some(())
        })
        .await;
        events.push(id);
    }
    let f =
        ha.c.wait_flow("node1 released", |f| {
            f["node"] == "node1" && f["released"] == true
        })
        .await;

    // The hooks' log: every event's evacuate, offline and online ran as one job each.
    let log = ha.c.hook_log();
    let mut jobs: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut runs = 0;
    for line in &log {
        let mut w = line.split(' ');
        let (Some(action), Some(node), Some(event), Some(job)) =
            (w.next(), w.next(), w.next(), w.next())
        else {
            continue;
        };
        // node1's are its fence flow's (marked, released), counted at the end.
        if node == "node1" {
            continue;
        }
        runs += 1;
        jobs.entry((event.to_string(), action.to_string()))
            .or_default()
            .insert(job.to_string());
    }
    for id in &events {
        for action in ["evacuate", "offline", "online"] {
            let ran = jobs.get(&(format!("event={id}"), action.to_string()));
            assert_eq!(
                ran.map(BTreeSet::len),
                Some(1),
                "event {id}'s {action}: {ran:?}\n{log:#?}"
            );
        }
    }
    let unknown: Vec<_> = jobs
        .keys()
        .filter(|(e, _)| !events.iter().any(|id| *e == format!("event={id}")))
        .collect();
    assert!(unknown.is_empty(), "events nobody asked for: {unknown:?}");
    // A job's hook ran to its end once, unless the machine running it was cut off between
    // the hook's end and the record of it (then the next runner cannot know, and runs it).
    let again = runs - jobs.len();
    let unrecorded = ha.unrecorded_ends();
    let starts = std::fs::read_to_string(ha.c.path("hooks-started.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(1) != Some("node1"))
        .count();
    eprintln!(
        "{faults} faults in {:.0} s: {} events, {} jobs, {runs} hook runs ended ({again} of a job that had ended before; {unrecorded} ends not recorded), {} stopped before their end, node1 powered off {} time(s), released {} time(s)",
        started.elapsed().as_secs_f64(),
        events.len(),
        jobs.len(),
        starts.saturating_sub(runs),
        ha.ipmi.power_offs(),
        ha.releases()
    );
    assert!(
        again <= unrecorded,
        "{again} hook runs of a job that had ended, but only {unrecorded} ends went unrecorded\n{log:#?}"
    );
    assert_eq!(ha.ipmi.power_offs(), 1, "{f:#}");
    assert_eq!(ha.releases(), 1, "{log:?}");
}
