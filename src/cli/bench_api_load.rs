//! `maintd bench api`'s clients: readers in closed and open loops with their figures, watchers
//! answered by signed cancels, the answers a crowd of readers should find cheap (a 304 of the
//! full dump, its gzip form, an empty filtered node list), and what must stay quick while 50
//! readers pull a full list as fast as they can (a watcher seeing a change, `/metrics`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT_ENCODING, ETAG, HeaderMap, HeaderValue, IF_NONE_MATCH};

use super::bench::BenchError;
use crate::report::Key;

/// Watches measured, each answered by one cancel.
pub(super) const WATCHES: usize = 20;

/// Readers of a full list while the quick answers are measured.
const CROWD: usize = 50;
/// `/metrics` scrapes per second while the crowd reads.
const SCRAPES: u32 = 10;

/// 304s of the full `/1/status`, its gzip form, and an empty filtered `/1/nodes`, with 1 and
/// 10 clients each; then that filter and a page of 50 nodes asked after a new cursor each time
/// (of `nodes` named `sim<i>`), so that each is built.
pub(super) async fn cheap_answers(
    client: &reqwest::Client,
    base: &str,
    nodes: usize,
    secs: Duration,
) -> Result<(), BenchError> {
    let status = format!("{base}/1/status");
    let etag = client
        .get(&status)
        .send()
        .await?
        .headers()
        .get(ETAG)
        .cloned()
        .ok_or_else(|| BenchError::Api("/1/status has no ETag".into()))?;
    let mut held = HeaderMap::new();
    held.insert(IF_NONE_MATCH, etag);
    let mut gzip = HeaderMap::new();
    gzip.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    // Every node answers its poll: none is unreachable.
    let empty = format!("{base}/1/nodes?status=unreachable");
    let cases = [
        ("/1/status 304", &status, &held),
        ("/1/status gzip", &status, &gzip),
        ("/1/nodes?status=unreachable", &empty, &HeaderMap::new()),
    ];
    for (what, url, headers) in cases {
        for n in [1, 10] {
            closed_loop_with(client, url, headers, n, secs)
                .await
                .print(what, &n.to_string());
        }
    }
    // The same filter, and a page of 50, each request after another node (a cursor no other
    // request gave): never a page kept, always picked from the index and built.
    let after = move |i: u64| {
        let name = format!("sim{}", i % nodes.max(1) as u64);
        name.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let fresh: [(&str, UrlOf); 2] = [
        (
            "  same, a new cursor each",
            Arc::new({
                let base = base.to_string();
                move |i| format!("{base}/1/nodes?status=unreachable&cursor={}", after(i))
            }),
        ),
        (
            "/1/nodes?limit=50, new cursor",
            Arc::new({
                let base = base.to_string();
                move |i| format!("{base}/1/nodes?limit=50&cursor={}", after(i))
            }),
        ),
    ];
    for (what, url_of) in fresh {
        for n in [1, 10] {
            closed_loop_of(client, url_of.clone(), &HeaderMap::new(), n, secs)
                .await
                .print(what, &n.to_string());
        }
    }
    Ok(())
}

/// While [`CROWD`] readers pull the full `/1/status`, then the full `/1/nodes`: how soon a
/// waiting watcher sees a signed cancel, and how long `/metrics` takes at [`SCRAPES`] a second,
/// on the API's port and on the metrics listener (`lane`).
pub(super) async fn under_load(
    client: &reqwest::Client,
    (base, lane): (&str, &str),
    key: &Key,
    waiting: &[(String, uuid::Uuid)],
    secs: Duration,
) -> Result<(), BenchError> {
    for (k, list) in ["/1/status", "/1/nodes"].into_iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let crowd: Vec<_> = (0..CROWD)
            .map(|_| {
                let (client, url, stop) = (client.clone(), format!("{base}{list}"), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = get_body_with(&client, &url, &HeaderMap::new()).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let scrapes = tokio::spawn(scrape(client.clone(), format!("{base}/metrics"), secs));
        let lane_scrapes = tokio::spawn(scrape(client.clone(), format!("{lane}/metrics"), secs));
        let batch = waiting.get(k * WATCHES..).unwrap_or_default();
        let (mut answered, mut seen) = watch_delays(client, base, key, batch).await?;
        let scrapes = scrapes.await?;
        let lane_scrapes = lane_scrapes.await?;
        stop.store(true, Ordering::Relaxed);
        for reader in crowd {
            reader.await?;
        }
        answered.sort_by(f64::total_cmp);
        seen.sort_by(f64::total_cmp);
        out!(
            "with {CROWD} readers of {list}: a cancel seen by its watcher after p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} changes; the cancel answered after p50 {:.1} ms, max {:.1} ms)",
            pct(&seen, 0.5),
            pct(&seen, 0.99),
            seen.last().copied().unwrap_or(f64::NAN),
            seen.len(),
            pct(&answered, 0.5),
            answered.last().copied().unwrap_or(f64::NAN),
        );
        scrapes.print(
            &format!("/metrics ({CROWD} on {list})"),
            &format!("{SCRAPES}/s"),
        );
        lane_scrapes.print(
            &format!("metrics-listen ({CROWD} on {list})"),
            &format!("{SCRAPES}/s"),
        );
    }
    Ok(())
}

/// `/metrics` scraped [`SCRAPES`] times a second for `secs`, each on its own (open loop).
async fn scrape(client: reqwest::Client, url: String, secs: Duration) -> Figures {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / SCRAPES);
    let mut tasks = Vec::new();
    while start.elapsed() < secs {
        tick.tick().await;
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            match get_body_with(&client, &url, &HeaderMap::new()).await {
                Ok(()) => (vec![t.elapsed().as_secs_f64() * 1e3], 0),
                Err(()) => (Vec::new(), 1),
            }
        }));
    }
    gather(tasks, start).await
}

pub(super) struct Figures {
    latencies_ms: Vec<f64>,
    errors: usize,
    elapsed: Duration,
}

impl Figures {
    pub(super) fn print(mut self, what: &str, clients: &str) {
        self.latencies_ms.sort_by(f64::total_cmp);
        out!(
            "{:<28} {:>7} {:>9.0} {:>9.2} {:>9.2} {:>8}",
            what,
            clients,
            self.latencies_ms.len() as f64 / self.elapsed.as_secs_f64(),
            pct(&self.latencies_ms, 0.5),
            pct(&self.latencies_ms, 0.99),
            self.errors
        );
    }
}

pub(super) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `closed_loop`, each request carrying `headers` (a 304 counts as an answer).
pub(super) async fn closed_loop_with(
    client: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    n: usize,
    secs: Duration,
) -> Figures {
    let url = url.to_string();
    closed_loop_of(client, Arc::new(move |_| url.clone()), headers, n, secs).await
}

/// The URL of the `i`th request of a closed loop.
type UrlOf = Arc<dyn Fn(u64) -> String + Send + Sync>;

/// As [`closed_loop_with`], each request to the URL `url_of` gives for its number: distinct
/// pages, so that none is answered from the pages kept.
async fn closed_loop_of(
    client: &reqwest::Client,
    url_of: UrlOf,
    headers: &reqwest::header::HeaderMap,
    n: usize,
    secs: Duration,
) -> Figures {
    let start = Instant::now();
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, headers) = (client.clone(), headers.clone());
            let (url_of, count) = (url_of.clone(), count.clone());
            tokio::spawn(async move {
                let (mut lat, mut errors) = (Vec::new(), 0);
                while start.elapsed() < secs {
                    let url = url_of(count.fetch_add(1, Ordering::Relaxed));
                    let t = Instant::now();
                    match get_body_with(&client, &url, &headers).await {
                        Ok(()) => lat.push(t.elapsed().as_secs_f64() * 1e3),
                        Err(()) => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    gather(tasks, start).await
}

pub(super) async fn gather(
    tasks: Vec<tokio::task::JoinHandle<(Vec<f64>, usize)>>,
    start: Instant,
) -> Figures {
    let mut f = Figures {
        latencies_ms: Vec::new(),
        errors: 0,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        let (lat, errors) = t.await.unwrap_or_default();
        f.latencies_ms.extend(lat);
        f.errors += errors;
    }
    f.elapsed = start.elapsed();
    f
}

/// A GET with `headers`, its body read whole; a 304 is an answer too.
pub(super) async fn get_body_with(
    client: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
) -> Result<(), ()> {
    let r = client
        .get(url)
        .headers(headers.clone())
        .send()
        .await
        .map_err(|_| ())?;
    if !r.status().is_success() && r.status() != reqwest::StatusCode::NOT_MODIFIED {
        return Err(());
    }
    r.bytes().await.map(drop).map_err(|_| ())
}

/// For each of up to [`WATCHES`] waiting events: a watcher holds `/1/status?node=` with the
/// page's ETag, the event is canceled with a signed request, and the delays from sending the
/// cancel to its own answer and to the watcher's are recorded (the first, apart: how long the
/// write took; the watcher cannot see a change before it is written).
pub(super) async fn watch_delays(
    client: &reqwest::Client,
    base: &str,
    key: &Key,
    waiting: &[(String, uuid::Uuid)],
) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
    let (mut canceled_after, mut seen_after) = (Vec::new(), Vec::new());
    for (node, id) in waiting.iter().take(WATCHES) {
        let url = format!("{base}/1/status?node={node}");
        let r = client.get(&url).send().await?;
        let etag = r
            .headers()
            .get(ETAG)
            .cloned()
            .ok_or_else(|| BenchError::Api("/1/status has no ETag".into()))?;
        let watcher = {
            let client = client.clone();
            let url = format!("{url}&wait=30");
            tokio::spawn(async move {
                let r = client.get(&url).header(IF_NONE_MATCH, etag).send().await;
                (Instant::now(), r.map(|r| r.status()))
            })
        };
        // Long enough for the watch to be held before the change.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        let path = format!("/1/events/{id}/cancel");
        let c = crate::http::send_signed(
            client,
            key,
            crate::report::DAEMON_TARGET,
            reqwest::Method::POST,
            base,
            &path,
            None,
        )
        .await?;
        let canceled = Instant::now();
        if !c.status().is_success() {
            let why = c.text().await.unwrap_or_default();
            return Err(BenchError::Api(format!("cancel of {id} refused: {why}")));
        }
        let (answered, status) = watcher.await?;
        let status = status?;
        if status != reqwest::StatusCode::OK {
            return Err(BenchError::Api(format!(
                "the watcher got {status}, not the changed page"
            )));
        }
        let ms = |t: Instant| t.saturating_duration_since(sent).as_secs_f64() * 1e3;
        canceled_after.push(ms(canceled));
        seen_after.push(ms(answered));
    }
    Ok((canceled_after, seen_after))
}
