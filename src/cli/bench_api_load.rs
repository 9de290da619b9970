//! `maintd bench api`, continued: the answers a crowd of readers should find cheap (a 304 of
//! the full dump, its gzip form, an empty filtered node list), and what must stay quick while
//! 50 readers pull a full list as fast as they can (a watcher seeing a change, `/metrics`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT_ENCODING, ETAG, HeaderMap, HeaderValue, IF_NONE_MATCH};

use super::bench::BenchError;
use super::bench_api::{WATCHES, closed_loop_with, gather, get_body_with, pct, watch_delays};
use crate::report::Key;

/// Readers of a full list while the quick answers are measured.
const CROWD: usize = 50;
/// `/metrics` scrapes per second while the crowd reads.
const SCRAPES: u32 = 10;

/// 304s of the full `/1/status`, its gzip form, and an empty filtered `/1/nodes`, with 1 and
/// 10 clients each.
pub(super) async fn cheap_answers(
    client: &reqwest::Client,
    base: &str,
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
    Ok(())
}

/// While [`CROWD`] readers pull the full `/1/status`, then the full `/1/nodes`: how soon a
/// waiting watcher sees a signed cancel, and how long `/metrics` takes at [`SCRAPES`] a second.
pub(super) async fn under_load(
    client: &reqwest::Client,
    base: &str,
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
        let batch = waiting.get(k * WATCHES..).unwrap_or_default();
        let (mut answered, mut seen) = watch_delays(client, base, key, batch).await?;
        let scrapes = scrapes.await?;
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
    }
    Ok(())
}

/// `/metrics` scraped [`SCRAPES`] times a second for `secs`, each on its own (open loop).
async fn scrape(client: reqwest::Client, url: String, secs: Duration) -> super::bench_api::Figures {
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
