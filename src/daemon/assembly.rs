//! The one assembly of the daemon's long-running parts: the poller and live repairs into the
//! engine, the peering, the fencer and the readiness checks, each built from its own settings
//! and the dependencies every part shares. The daemon calls it with the production backend,
//! HTTP links and fence agents; the simulated-time harness with its fakes, so the two can never
//! be wired differently. `Running` stops the parts in the order a fence needs: the executors
//! first (running fence steps finish), the election last (the final checkpoint and the lease
//! release come after the last effect).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span};

use crate::cluster::maps::MapSource;
use crate::fencing::agent::AgentRunner;
use crate::fencing::book::PlanBook;
use crate::fencing::executor::{Fencer, FencerSettings};
use crate::fencing::metrics::FencingMetrics;
use crate::fencing::peering::{Peering, PeeringSettings};
use crate::fencing::readiness::{CheckSettings, Readiness, WatchdogViews};
use crate::link::Links;
use crate::parts::Shared;
use crate::repair::engine::{Engine, EngineSettings};
use crate::repair::live::LiveRepairs;
use crate::repair::metrics::{PollMetrics, RepairMetrics};
use crate::repair::poller::{PollSettings, Poller};
use crate::report::keyring::Keyring;
use crate::sdnotify::Notifier;
use crate::store::StoreError;

/// Every part's settings, resolved from the configuration (or set by a scenario).
#[derive(Debug, Clone)]
pub struct Settings {
    pub poll: PollSettings,
    pub engine: EngineSettings,
    /// How long a collector's live repair may take.
    pub repair_timeout: Duration,
    /// Fencing, when any node has a fence plan.
    pub fencing: Option<FencingSettings>,
}

impl Settings {
    /// Every part's settings, with the fence plans in force (none now or to come from
    /// ConfigMaps: no fencing).
    pub fn from_config(
        cfg: &crate::config::Config,
        book: Arc<crate::fencing::book::PlanBook>,
    ) -> Settings {
        let f = &cfg.fencing;
        let fencing = book.active().then(|| FencingSettings {
            checks: CheckSettings::new(f),
            peering: cfg.peering_settings(),
            fencer: crate::fencing::executor::FencerSettings::new(f, book),
        });
        Settings {
            poll: cfg.poll_settings(),
            engine: crate::repair::engine::EngineSettings {
                policy: cfg.actions,
                poll_interval: cfg.daemon.poll_interval,
                max_disruptions: cfg.kubernetes.max_disruptions,
                max_remedies: cfg.kubernetes.max_remedies,
            },
            repair_timeout: cfg.daemon.live_repair_timeout,
            fencing,
        }
    }
}

#[derive(Debug, Clone)]
pub struct FencingSettings {
    pub fencer: FencerSettings,
    pub checks: CheckSettings,
    pub peering: PeeringSettings,
}

/// What the parts act through: the shared dependencies, the links to the collectors, the fence
/// agents and the cluster key.
pub struct Deps {
    pub shared: Shared,
    /// Each part's own metrics.
    pub metrics: PartMetrics,
    pub links: Links,
    pub agents: Arc<dyn AgentRunner>,
    /// Each node's keys.
    pub keys: Arc<Keyring>,
    /// Where fence ConfigMaps are read, when plans come from them.
    pub maps: Option<Arc<dyn MapSource>>,
    /// The service manager to feed while the engine's loop turns.
    pub systemd: Option<Arc<Notifier>>,
}

/// Each part's metrics: every set is declared and registered beside the code that produces
/// it, and each part is handed its own set alone.
#[derive(Clone)]
pub struct PartMetrics {
    pub poll: PollMetrics,
    pub repair: RepairMetrics,
    pub fencing: FencingMetrics,
}

impl PartMetrics {
    pub fn register(reg: &mut Registry) -> PartMetrics {
        PartMetrics {
            poll: PollMetrics::register(reg),
            repair: RepairMetrics::register(reg),
            fencing: FencingMetrics::register(reg),
        }
    }
}

/// The assembled parts, not yet running.
pub struct Assembly {
    pub engine: Arc<Engine>,
    pub fencer: Option<Arc<Fencer>>,
    pub readiness: Option<Arc<Readiness>>,
    /// The fencer's peer sets and views, which the API and readiness read.
    pub peering: Option<Arc<Peering>>,
    pub shared: Shared,
    /// The fence ConfigMaps the plans in force follow.
    maps: Option<(Arc<dyn MapSource>, Arc<PlanBook>)>,
    /// The service manager's watchdog, and the longest a turn of the engine's loop takes.
    systemd: Option<(Arc<Notifier>, Duration)>,
}

pub fn assemble(settings: Settings, deps: Deps) -> Result<Assembly, StoreError> {
    let Deps {
        shared,
        metrics,
        links,
        agents,
        keys,
        maps,
        systemd,
    } = deps;
    let cycle = settings.engine.poll_interval + settings.poll.timeout;
    let poller = Poller::new(
        settings.poll,
        links.poll,
        keys.clone(),
        &shared,
        metrics.poll,
    )?
    .with_udp(links.udp);
    let repairs = LiveRepairs::new(
        links.repair,
        settings.repair_timeout,
        shared.members.clone(),
    );
    let engine = Arc::new(Engine::new(
        settings.engine,
        poller,
        repairs,
        &shared,
        metrics.repair,
    ));
    let (mut fencer, mut readiness, mut peering) = (None, None, None);
    let maps = maps.zip(settings.fencing.as_ref().map(|f| f.fencer.book.clone()));
    if let Some(f) = settings.fencing {
        let p = Arc::new(Peering::new(keys, f.peering));
        let views = Some(p.clone() as Arc<dyn WatchdogViews>);
        let book = f.fencer.book.clone();
        let checks = Readiness::new(
            f.checks,
            book,
            agents.clone(),
            views,
            &shared,
            metrics.fencing.fence.clone(),
        );
        readiness = Some(Arc::new(checks));
        let fence = Fencer::new(
            f.fencer,
            &shared,
            agents,
            links.probe,
            p.clone(),
            metrics.fencing,
        );
        fencer = Some(Arc::new(fence));
        peering = Some(p);
    }
    Ok(Assembly {
        engine,
        fencer,
        readiness,
        peering,
        shared,
        maps,
        systemd: systemd.map(|n| (n, cycle)),
    })
}

impl Assembly {
    /// Starts every part on the current runtime.
    pub fn spawn(&self) -> Running {
        let (stop, rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let engine = tokio::spawn(
            self.engine
                .clone()
                .run(stopped(rx.clone()))
                .instrument(info_span!("engine")),
        );
        let mut others = Vec::new();
        if let Some(f) = &self.fencer {
            info!(nodes = f.nodes(), "fencing enabled");
            let run = f.clone().run(stopped(rx.clone()));
            others.push(tokio::spawn(run.instrument(info_span!("fencer"))));
        }
        if let Some(r) = &self.readiness {
            let run = r.clone().run(stopped(rx.clone()));
            others.push(tokio::spawn(run.instrument(info_span!("readiness"))));
        }
        if let (Some(w), Some(witness)) = (&self.shared.watch, &self.shared.cluster.witness) {
            let members = self.shared.members.clone();
            let run = w.clone().run(witness.clone(), members, stopped(rx.clone()));
            others.push(tokio::spawn(run.instrument(info_span!("nodes"))));
        }
        if let Some((maps, book)) = &self.maps {
            let defaults = crate::fencing::configmaps::StageDefaults::default();
            let run = crate::fencing::book::follow(
                book.clone(),
                maps.clone(),
                defaults,
                stopped(rx.clone()),
            );
            others.push(tokio::spawn(run.instrument(info_span!("fence-configmaps"))));
        }
        if let Some((n, cycle)) = &self.systemd {
            let health = self.engine.health();
            let turns = move || health.turns();
            let run = crate::sdnotify::feed_watchdog(n.clone(), turns, *cycle, stopped(rx.clone()));
            others.push(tokio::spawn(run.instrument(info_span!("watchdog"))));
        }
        if let (None, Some(source)) = (&self.shared.watch, &self.shared.cluster.nodes) {
            let members = self.shared.members.clone();
            let run = crate::members::refresh(source.clone(), members, stopped(rx.clone()));
            others.push(tokio::spawn(run.instrument(info_span!("nodes"))));
        }
        let (elect_stop, elect_rx) = watch::channel(false);
        let election = tokio::spawn(
            self.shared
                .leadership
                .clone()
                .run(stopped(elect_rx))
                .instrument(info_span!("election")),
        );
        Running {
            stop,
            engine: Some(engine),
            others,
            elect_stop,
            election,
        }
    }
}

/// The running parts.
pub struct Running {
    stop: watch::Sender<bool>,
    engine: Option<JoinHandle<()>>,
    others: Vec<JoinHandle<()>>,
    elect_stop: watch::Sender<bool>,
    election: JoinHandle<()>,
}

impl Running {
    /// Resolves when the parts are told to stop (the API server stops with them).
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }

    /// Resolves if the engine ends on its own (it runs for the daemon's lifetime), with why.
    pub async fn engine_ended(&mut self) -> String {
        let Some(engine) = self.engine.as_mut() else {
            return std::future::pending().await;
        };
        let r = engine.await;
        self.engine = None;
        match r {
            Ok(()) => "returned".into(),
            Err(e) => e.to_string(),
        }
    }

    /// Stops every part and waits for them; `Err` names a part that panicked. Running fence
    /// steps reach a recorded state first.
    pub async fn stop(self) -> Result<(), tokio::task::JoinError> {
        let _ = self.stop.send(true);
        let mut panicked = None;
        for t in self.engine.into_iter().chain(self.others) {
            if let Err(e) = t.await {
                panicked.get_or_insert(e);
            }
        }
        let _ = self.elect_stop.send(true);
        if let Err(e) = self.election.await {
            panicked.get_or_insert(e);
        }
        panicked.map_or(Ok(()), Err)
    }

    /// Stops at once without waiting (the daemon is failing anyway): the election too, so a
    /// held lease is released.
    pub fn abort(self) {
        let _ = self.stop.send(true);
        let _ = self.elect_stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_registers_its_metrics_once_each() {
        let mut reg = Registry::default();
        let m = PartMetrics::register(&mut reg);
        crate::leader::LeaderMetrics::register(&mut reg);
        m.fencing.fence.fence_returns.inc();
        m.poll.reports_accepted.inc_by(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let distinct: std::collections::BTreeSet<&&str> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(names.len(), 42, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("maintd_")), "{names:?}");
        assert!(text.contains("maintd_fence_returns_total 1"), "{text}");
        assert!(text.contains("maintd_reports_accepted_total 2"), "{text}");
    }
}
