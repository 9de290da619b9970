//! Events, jobs and rounds: the decision state the engine loads and the actions it applies,
//! one transaction per change, plus operators' cancels and the counts metrics read.

use super::*;

/// An event, its jobs, and why it was cleared (None while it is live).
pub type EventRecord = (Event, Vec<Job>, Option<String>);

/// Outcome of an operator's cancel request.
#[derive(Debug, PartialEq)]
pub enum CancelOutcome {
    Canceled,
    NotFound,
    AlreadyFinal(RepairStatus),
}

const EVENT_COLS: &str = "id, node, canonical, action, command, status, tag, tagged, acknowledged, superseded_by, note, created_ns, updated_ns";

fn event_from_row(r: &Row) -> Result<Event> {
    let id: String = r.get(0)?;
    let canonical: String = r.get(2)?;
    let action: String = r.get(3)?;
    let status: String = r.get(5)?;
    let sup: Option<String> = r.get(9)?;
    Ok(Event {
        id: parse_uuid(&id)?,
        node: r.get(1)?,
        original: maintd_core::verdict::ExactJson::parse(canonical.as_bytes())
            .map_err(|e| corrupt(format!("event {id}: {e}")))?
            .value(),
        canonical,
        action: Status::parse(&action).ok_or_else(|| corrupt(format!("action {action:?}")))?,
        command: r.get(4)?,
        status: RepairStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("status {status:?}")))?,
        tag: r.get(6)?,
        tagged: r.get(7)?,
        acknowledged: r.get(8)?,
        superseded_by: sup.as_deref().map(parse_uuid).transpose()?,
        note: r.get(10)?,
        created: r.get(11)?,
        updated: r.get(12)?,
    })
}

const JOB_COLS: &str =
    "id, event_id, node, round, kind, command, status, reason, detail, created_ns, finished_ns";

fn job_from_row(r: &Row) -> Result<Job> {
    let ev: String = r.get(1)?;
    let kind: String = r.get(4)?;
    let status: String = r.get(6)?;
    Ok(Job {
        id: r.get(0)?,
        event: parse_uuid(&ev)?,
        node: r.get(2)?,
        round: r.get(3)?,
        kind: JobKind::parse(&kind).ok_or_else(|| corrupt(format!("job kind {kind:?}")))?,
        command: r.get(5)?,
        status: JobStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("job status {status:?}")))?,
        reason: r.get(7)?,
        detail: r.get(8)?,
        created: r.get(9)?,
        finished: r.get(10)?,
    })
}

/// Live (non-cleared) events, oldest first, and all their jobs; only `node`'s when given.
fn live_events_and_jobs(c: &Connection, node: Option<&str>) -> Result<(Vec<Event>, Vec<Job>)> {
    // Two statements, not `?1 IS NULL OR ...`: each is planned for its own index (the live
    // index gives the order without a sort; the node index finds one node's events).
    let only = if node.is_some() { " AND node = ?1" } else { "" };
    let events = collect(
        c.prepare_cached(&format!(
            "SELECT {EVENT_COLS} FROM events WHERE cleared_ns IS NULL{only} ORDER BY created_ns, id"
        ))?,
        rusqlite::params_from_iter(node),
        event_from_row,
    )?;
    let jobs = collect(
        c.prepare_cached(&format!(
            "SELECT {JOB_COLS} FROM jobs WHERE event_id IN (SELECT id FROM events WHERE cleared_ns IS NULL{only}) ORDER BY id"
        ))?,
        rusqlite::params_from_iter(node),
        job_from_row,
    )?;
    Ok((events, jobs))
}

impl Store {
    /// The decision input: live events, their jobs, and the round bookkeeping.
    pub fn load_state(
        &self,
        policy: Policy,
        tags: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<State> {
        let c = self.engine_reader();
        // One read transaction: the events, the jobs and the rounds of one committed state.
        let c = c.unchecked_transaction()?;
        let (events, jobs) = live_events_and_jobs(&c, None)?;
        let round_running: Option<i64> = c
            .query_row(
                "SELECT MIN(round) FROM jobs WHERE status = 'running'",
                [],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        let last_round: i64 =
            c.query_row("SELECT COALESCE(MAX(id), 0) FROM rounds", [], |r| r.get(0))?;
        Ok(State {
            events,
            jobs,
            round_running,
            last_round,
            tags,
            policy,
            capacity: None,
            members: None,
            max_remedies: None,
            upkeep_running: false,
            maintenance: BTreeMap::new(),
        })
    }

    /// Applies one event-level action in its own transaction. Tags and rounds go elsewhere:
    /// `finalize`/`mark_tagged` and `start_round`.
    pub fn apply(&self, action: &Action, now: Nanos) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        match action {
            Action::CreateEvent(e) => {
                tx.execute(
                    &format!("INSERT INTO events ({EVENT_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)"),
                    params![
                        e.id.to_string(),
                        e.node,
                        e.canonical,
                        e.action.as_str(),
                        e.command,
                        e.status.as_str(),
                        e.tag,
                        e.tagged,
                        e.acknowledged,
                        e.superseded_by.map(|u| u.to_string()),
                        e.note,
                        e.created,
                        e.updated
                    ],
                )?;
            }
            Action::Cancel {
                event,
                superseded_by,
            } => {
                tx.execute(
                    "UPDATE events SET status='canceled', superseded_by=?2, note=?3, updated_ns=?4 WHERE id=?1",
                    params![
                        event.to_string(),
                        superseded_by.to_string(),
                        format!("superseded by more invasive event {superseded_by}"),
                        now
                    ],
                )?;
            }
            Action::Acknowledge { event } => {
                tx.execute(
                    "UPDATE events SET acknowledged=1, note='acknowledged (tag removed)', updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now],
                )?;
            }
            Action::Clear { event, why } => {
                tx.execute(
                    "UPDATE events SET cleared_ns=?2, cleared_why=?3, updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now, why],
                )?;
            }
            Action::Forget { event, why, .. } => {
                tx.execute(
                    "UPDATE events SET cleared_ns=?2, cleared_why=?3, updated_ns=?2 WHERE id=?1",
                    params![event.to_string(), now, why],
                )?;
                tx.execute(
                    "UPDATE jobs SET status='failed', detail=?3, finished_ns=?2 WHERE event_id=?1 AND status='running'",
                    params![event.to_string(), now, why],
                )?;
            }
            Action::Finalize {
                event,
                status,
                tag,
                note,
                ..
            } => {
                tx.execute(
                    "UPDATE events SET status=?2, tag=?3, tagged=0, acknowledged=0, note=?4, updated_ns=?5 WHERE id=?1",
                    params![event.to_string(), status.as_str(), tag, note, now],
                )?;
            }
            Action::Note { event, note } => {
                tx.execute(
                    "UPDATE events SET note=?2 WHERE id=?1",
                    params![event.to_string(), note],
                )?;
            }
            Action::ApplyTag { .. } | Action::StartRound { .. } => {}
        }
        tx.commit()?;
        self.changes.events_changed();
        Ok(())
    }

    pub fn mark_tagged(&self, event: &Uuid, now: Nanos) -> Result<()> {
        self.conn().execute(
            "UPDATE events SET tagged=1, updated_ns=?2 WHERE id=?1",
            params![event.to_string(), now],
        )?;
        self.changes.events_changed();
        Ok(())
    }

    /// Records a round and all its jobs at once, marking their events pending.
    pub fn start_round(&self, round: i64, specs: &[JobSpec], now: Nanos) -> Result<Vec<Job>> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        tx.execute(
            "INSERT INTO rounds (id, started_ns) VALUES (?1, ?2)",
            params![round, now],
        )?;
        let mut jobs = Vec::new();
        for s in specs {
            let reason = reason_trail(&s.event);
            tx.execute(
                "INSERT INTO jobs (event_id, node, round, kind, command, status, reason, created_ns) VALUES (?1,?2,?3,?4,?5,'running',?6,?7)",
                params![s.event.to_string(), s.node, round, s.kind.as_str(), s.command, reason, now],
            )?;
            let id = tx.last_insert_rowid();
            if s.kind != JobKind::Online {
                tx.execute(
                    "UPDATE events SET status='pending', note=NULL, updated_ns=?2 WHERE id=?1 AND status IN ('noted','pending')",
                    params![s.event.to_string(), now],
                )?;
            }
            jobs.push(Job {
                id,
                event: s.event,
                node: s.node.clone(),
                round,
                kind: s.kind,
                command: s.command.clone(),
                status: JobStatus::Running,
                reason,
                detail: None,
                created: now,
                finished: None,
            });
        }
        tx.commit()?;
        self.changes.events_changed();
        Ok(jobs)
    }

    pub fn finish_job(&self, id: i64, ok: bool, detail: &str, now: Nanos) -> Result<()> {
        let status = if ok {
            JobStatus::Succeeded
        } else {
            JobStatus::Failed
        };
        self.conn().execute(
            "UPDATE jobs SET status=?2, detail=?3, finished_ns=?4 WHERE id=?1 AND status='running'",
            params![id, status.as_str(), detail, now],
        )?;
        self.changes.events_changed();
        Ok(())
    }

    pub fn running_jobs(&self) -> Result<Vec<Job>> {
        let c = self.conn();
        collect(
            c.prepare_cached(&format!(
                "SELECT {JOB_COLS} FROM jobs WHERE status='running' ORDER BY id"
            ))?,
            [],
            job_from_row,
        )
    }

    /// Live (non-cleared) events with their jobs, oldest first; only `node`'s when given.
    pub fn events_with_jobs(&self, node: Option<&str>) -> Result<Vec<(Event, Vec<Job>)>> {
        let c = self.reader();
        // One read transaction: the jobs belong to the same committed state as the events.
        let c = c.unchecked_transaction()?;
        let (events, jobs) = live_events_and_jobs(&c, node)?;
        let mut by_event: HashMap<Uuid, Vec<Job>> = HashMap::new();
        for j in jobs {
            by_event.entry(j.event).or_default().push(j);
        }
        Ok(events
            .into_iter()
            .map(|e| {
                let j = by_event.remove(&e.id).unwrap_or_default();
                (e, j)
            })
            .collect())
    }

    /// One event (cleared ones included: an id stays resolvable) with its jobs.
    pub fn event(&self, id: &Uuid) -> Result<Option<EventRecord>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached(&format!(
            "SELECT {EVENT_COLS}, cleared_why FROM events WHERE id=?1"
        ))?;
        let mut rows = stmt.query([id.to_string()])?;
        let Some(r) = rows.next()? else {
            return Ok(None);
        };
        let e = event_from_row(r)?;
        let cleared: Option<String> = r.get(13)?;
        let jobs = collect(
            c.prepare_cached(&format!(
                "SELECT {JOB_COLS} FROM jobs WHERE event_id=?1 ORDER BY id"
            ))?,
            [id.to_string()],
            job_from_row,
        )?;
        Ok(Some((e, jobs, cleared)))
    }

    /// An operator's cancel: only a live event that is not final yet.
    pub fn cancel(&self, id: &Uuid, now: Nanos) -> Result<CancelOutcome> {
        let mut c = self.conn();
        let tx = c.transaction()?;
        let status: Option<String> = tx
            .query_row(
                "SELECT status FROM events WHERE id=?1 AND cleared_ns IS NULL",
                [id.to_string()],
                |r| r.get(0),
            )
            .optional()?;
        let Some(status) = status else {
            return Ok(CancelOutcome::NotFound);
        };
        let status =
            RepairStatus::parse(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?;
        if !status.is_active() {
            return Ok(CancelOutcome::AlreadyFinal(status));
        }
        tx.execute(
            "UPDATE events SET status='canceled', note='canceled by operator', updated_ns=?2 WHERE id=?1",
            params![id.to_string(), now],
        )?;
        tx.commit()?;
        self.changes.events_changed();
        Ok(CancelOutcome::Canceled)
    }

    /// Live (not cleared) events per repair status, for the metrics.
    pub fn event_status_counts(&self) -> Result<BTreeMap<String, i64>> {
        let c = self.conn();
        let mut stmt = c.prepare_cached(
            "SELECT status, count(*) FROM events WHERE cleared_ns IS NULL GROUP BY status",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// When the oldest job still running started, if any.
    pub fn oldest_running_job_ns(&self) -> Result<Option<Nanos>> {
        let c = self.conn();
        Ok(c.query_row(
            "SELECT min(created_ns) FROM jobs WHERE status='running'",
            [],
            |r| r.get(0),
        )?)
    }
}
