//! The API's lists (`/1/status`, `/1/nodes`, `/1/fences`): filters, pages behind an opaque
//! cursor, an ETag answered with 304, and the watch, a long poll that answers as soon as the
//! filtered list differs from the one the client holds.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::http::ApiError;
use crate::http::listener::ConnActivity;
use crate::store::changes::{Changes, Generation};

/// The longest a watch may hold a request.
pub const MAX_WAIT_S: u64 = 60;
/// The largest page.
pub const MAX_LIMIT: usize = 10_000;
/// Where the next page starts; absent on the last page.
pub const NEXT_CURSOR: &str = "x-next-cursor";

/// A list's query string. Each list takes the filters its items have; any other is refused,
/// never silently ignored.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub node: Option<String>,
    pub status: Option<String>,
    pub action: Option<String>,
    /// Only items updated at or after this time (ns since the epoch).
    pub since: Option<i64>,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
    /// With `If-None-Match`: hold the request up to this many seconds until the list changes.
    pub wait: Option<u64>,
}

impl ListQuery {
    /// Refuses the filters a list does not have, and limits out of range.
    pub fn check(&self, unsupported: &[&str]) -> Result<(), ApiError> {
        for name in unsupported {
            let given = match *name {
                "status" => self.status.is_some(),
                "action" => self.action.is_some(),
                "since" => self.since.is_some(),
                _ => false,
            };
            if given {
                return Err(ApiError::bad_request(format!(
                    "this list has no `{name}` filter"
                )));
            }
        }
        if let Some(l) = self.limit
            && !(1..=MAX_LIMIT).contains(&l)
        {
            return Err(ApiError::bad_request(format!(
                "limit {l} is outside 1..={MAX_LIMIT}"
            )));
        }
        if let Some(w) = self.wait
            && w > MAX_WAIT_S
        {
            return Err(ApiError::bad_request(format!(
                "wait {w} is over the {MAX_WAIT_S}-second maximum"
            )));
        }
        Ok(())
    }

    /// What names the page this query asks for, among the pages kept (`wait` aside: a watch
    /// and a read of the same page share it).
    fn page_key(&self, list: &str) -> String {
        format!(
            "{list}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
            self.node, self.status, self.action, self.since, self.limit, self.cursor
        )
    }

    /// The sort key the cursor names (items after it come next).
    pub fn after(&self) -> Result<Option<String>, ApiError> {
        let Some(c) = &self.cursor else {
            return Ok(None);
        };
        let bad = || ApiError::bad_request(format!("cursor {c:?} is not one this API gave"));
        if c.len() % 2 != 0 || c.len() > 512 {
            return Err(bad());
        }
        let bytes: Option<Vec<u8>> = (0..c.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(c.get(i..i + 2)?, 16).ok())
            .collect();
        // Keys are compared as text; a cursor that was never a key still orders somewhere.
        Ok(Some(
            String::from_utf8_lossy(&bytes.ok_or_else(bad)?).into_owned(),
        ))
    }

    /// Whether `value` passes the `node` filter.
    pub fn node_ok(&self, node: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == node)
    }

    pub fn status_ok(&self, status: &str) -> bool {
        self.status.as_deref().is_none_or(|s| s == status)
    }

    pub fn action_ok(&self, action: &str) -> bool {
        self.action.as_deref().is_none_or(|a| a == action)
    }

    pub fn since_ok(&self, updated: i64) -> bool {
        self.since.is_none_or(|s| updated >= s)
    }

    /// Whether a repair event (or a fence flow shown as one) passes every filter.
    pub fn event_ok(&self, node: &str, status: &str, action: &str, updated: i64) -> bool {
        self.node_ok(node)
            && self.status_ok(status)
            && self.action_ok(action)
            && self.since_ok(updated)
    }
}

/// Refuses a filter value outside the list's vocabulary, naming the values it has.
pub fn one_of(what: &str, given: Option<&str>, known: &[&str]) -> Result<(), ApiError> {
    match given {
        Some(v) if !known.contains(&v) => Err(ApiError::bad_request(format!(
            "{what} {v:?} is not one of {}",
            known.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// One item of a list: its sort key and its JSON.
pub struct Item {
    pub key: String,
    pub json: std::sync::Arc<[u8]>,
}

pub use super::pages::Page;
use super::pages::{Built, Pages};

/// Sorts `items` by key, skips up to the cursor, and cuts the page.
pub fn page(mut items: Vec<Item>, q: &ListQuery) -> Result<Page, ApiError> {
    items.sort_by(|a, b| a.key.cmp(&b.key));
    let after = q.after()?;
    let start = after.as_ref().map_or(0, |a| {
        items.partition_point(|i| i.key.as_str() <= a.as_str())
    });
    let rest = &items[start..];
    let take = q.limit.unwrap_or(usize::MAX).min(rest.len());
    let shown = &rest[..take];
    let next = (take < rest.len())
        .then(|| shown.last().map(|i| hex(i.key.as_bytes())))
        .flatten();
    let mut body = Vec::with_capacity(shown.iter().map(|i| i.json.len() + 1).sum::<usize>() + 2);
    body.push(b'[');
    for (n, i) in shown.iter().enumerate() {
        if n > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&i.json);
    }
    body.push(b']');
    // The page and where it stops: two pages with equal bodies but different ends differ.
    let mut h = std::hash::DefaultHasher::new();
    body.hash(&mut h);
    next.hash(&mut h);
    let etag = format!("\"{:016x}\"", h.finish());
    Ok(Page {
        body: body.into(),
        next,
        etag,
    })
}

/// `page`, on a thread of the blocking pool: sorting and joining a large list takes the API's
/// own thread from no other request (a signed change, a watch answering, `/metrics`).
pub async fn page_apart(items: Vec<Item>, q: &ListQuery) -> Result<Page, ApiError> {
    let q = q.clone();
    tokio::task::spawn_blocking(move || page(items, &q))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

/// `page_apart` of views not serialized yet (each with its sort key): serialized on the same
/// thread of the blocking pool.
pub async fn page_of<T>(views: Vec<(String, T)>, q: &ListQuery) -> Result<Page, ApiError>
where
    T: serde::Serialize + Send + 'static,
{
    let q = q.clone();
    tokio::task::spawn_blocking(move || {
        let items = views
            .into_iter()
            .map(|(key, v)| {
                let json = serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))?;
                Ok(Item {
                    key,
                    json: json.into(),
                })
            })
            .collect::<Result<Vec<Item>, ApiError>>()?;
        page(items, &q)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether the client already holds this version (`If-None-Match`); `*` holds any.
fn holds(headers: &HeaderMap, etag: &str) -> bool {
    held(headers).any(|t| t == etag || t == "*")
}

/// Whether the client names this very version, the only one a watch waits on.
fn names_exactly(headers: &HeaderMap, etag: &str) -> bool {
    held(headers).any(|t| t == etag)
}

fn held(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
}

/// Which part of the state a list shows, so a watcher wakes only for its own changes.
#[derive(Clone, Copy)]
pub enum Watches {
    Events,
    Nodes,
}

impl Watches {
    /// The part of the store's count of changes that the list follows.
    fn mark(self, g: Generation) -> (u64, u64) {
        match self {
            Watches::Events => (g.events, 0),
            Watches::Nodes => (g.events, g.nodes),
        }
    }

    fn moved(self, a: Generation, b: Generation) -> bool {
        self.mark(a) != self.mark(b)
    }
}

/// Where a list's pages are built and kept: the builders' permits, the pages kept, and the
/// store's count of changes.
pub struct Lists<'a> {
    pub builders: &'a tokio::sync::Semaphore,
    pub pages: &'a Pages,
    pub changes: &'a Changes,
}

/// Answers a request for `list`: 200 with the page, or 304 when the client holds it already.
/// A page is built once per counted change of what it shows (`watches`, the part of the count
/// it follows), and at most [`super::pages::MAX_AGE`] apart for what the store does not count;
/// every reader meanwhile gets the page kept. With `wait`, a request that holds the current
/// version is kept open until the page changes (a change counted by the store, or one seen by
/// a recheck each second for what the store does not count) or the wait ends with 304. A held
/// watch is not cut by the request timeout (`conn`, the listener's view of the connection,
/// extends it), and answers at once when the daemon stops.
pub async fn answer<F, Fut>(
    lists: Lists<'_>,
    list: &'static str,
    watches: Watches,
    conn: Option<&ConnActivity>,
    headers: &HeaderMap,
    q: &ListQuery,
    build: F,
) -> Result<Response, ApiError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Page, ApiError>>,
{
    let mut rx = lists.changes.subscribe();
    let mut seen = *rx.borrow_and_update();
    // The list's own name: lists that follow the same changes never share a page.
    let key = q.page_key(list);
    let build = || async {
        // Read before the page is built: a change meanwhile leaves the older count, and the
        // next reader builds again.
        let mark = watches.mark(lists.changes.now());
        if let Some(b) = lists.pages.fresh(&key, mark) {
            return Ok(b);
        }
        // Only building takes a permit; a held watch waits without one.
        let _permit = lists
            .builders
            .acquire()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        // Built by another reader while this one waited for its permit.
        if let Some(b) = lists.pages.fresh(&key, mark) {
            return Ok(b);
        }
        Ok(lists.pages.keep(key.clone(), mark, build().await?))
    };
    let mut p = build().await?;
    let span = Duration::from_secs(q.wait.unwrap_or(0));
    let deadline = tokio::time::Instant::now() + span;
    let _holding = conn.map(|c| c.hold(span));
    let stopping = async {
        match conn {
            Some(c) => c.stopping().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stopping);
    // Set after each build only: changes the watch does not follow must not keep putting the
    // recheck off.
    let mut recheck = tokio::time::Instant::now() + Duration::from_secs(1);
    while names_exactly(headers, &p.page.etag) && tokio::time::Instant::now() < deadline {
        tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    break;
                }
                let now = *rx.borrow_and_update();
                if !watches.moved(seen, now) {
                    continue;
                }
                seen = now;
            }
            _ = tokio::time::sleep_until(recheck.min(deadline)) => {}
            _ = &mut stopping => break,
        }
        p = build().await?;
        recheck = tokio::time::Instant::now() + Duration::from_secs(1);
    }
    Ok(respond(headers, &p))
}

/// Whether the client takes a gzip body (`Accept-Encoding`, a `q` of 0 refusing it).
fn takes_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

fn respond(headers: &HeaderMap, b: &Built) -> Response {
    let p = &b.page;
    let etag = HeaderValue::from_str(&p.etag).expect("an ETag is ASCII");
    if holds(headers, &p.etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    // The kept page's own gzip form, compressed once for every reader that takes it.
    let gzip = takes_gzip(headers).then(|| b.gzip()).flatten();
    let body = gzip.clone().unwrap_or_else(|| p.body.clone());
    let body = axum::body::Body::new(super::pages::Paced::new(body));
    let mut r = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, etag),
        ],
        body,
    )
        .into_response();
    let h = r.headers_mut();
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if gzip.is_some() {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if let Some(n) = p.next.as_ref().and_then(|n| HeaderValue::from_str(n).ok()) {
        h.insert(NEXT_CURSOR, n);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(keys: &[&str]) -> Vec<Item> {
        keys.iter()
            .map(|k| Item {
                key: k.to_string(),
                json: format!("\"{k}\"").into_bytes().into(),
            })
            .collect()
    }

    #[test]
    fn pages_follow_the_cursor_to_the_end_without_loss_or_repeat() {
        let keys = ["c", "a", "e", "b", "d"];
        let mut q = ListQuery {
            limit: Some(2),
            ..Default::default()
        };
        let mut seen = String::new();
        loop {
            let p = page(items(&keys), &q).unwrap();
            seen.push_str(std::str::from_utf8(&p.body).unwrap());
            match p.next {
                Some(n) => q.cursor = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, r#"["a","b"]["c","d"]["e"]"#);
        q.cursor = Some("zz".into());
        assert!(page(items(&keys), &q).is_err());
        q.cursor = Some("7a7a".into()); // "zz": past the end, an empty last page
        assert_eq!(&page(items(&keys), &q).unwrap().body[..], b"[]");
    }

    #[test]
    fn the_etag_names_the_page_and_if_none_match_finds_it() {
        let q = ListQuery::default();
        let a = page(items(&["a"]), &q).unwrap();
        let b = page(items(&["b"]), &q).unwrap();
        assert_ne!(a.etag, b.etag);
        assert_eq!(a.etag, page(items(&["a"]), &q).unwrap().etag);
        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&format!("\"x\", W/{}", a.etag)).unwrap(),
        );
        assert!(holds(&h, &a.etag));
        assert!(!holds(&h, &b.etag));
    }

    /// A watch of events wakes for a counted change at once, and sees an uncounted one (another
    /// replica's write) at its recheck, however often node polls move the counter meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_watch_answers_a_change_it_was_not_told_of_despite_a_stream_of_poll_changes() {
        let changes = Changes::default();
        let builds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let build = || {
            let n = builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let keys: &[&str] = if n < 3 { &["a"] } else { &["a", "b"] };
            async move { page(items(keys), &ListQuery::default()) }
        };
        let held = page(items(&["a"]), &ListQuery::default()).unwrap().etag;
        let mut headers = HeaderMap::new();
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&held).unwrap());
        let q = ListQuery {
            wait: Some(30),
            ..Default::default()
        };
        let polls = changes.clone();
        let noise = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                polls.nodes_changed();
            }
        });
        let start = tokio::time::Instant::now();
        let sem = tokio::sync::Semaphore::new(1);
        let pages = Pages::default();
        let lists = Lists {
            builders: &sem,
            pages: &pages,
            changes: &changes,
        };
        let r = answer(lists, "status", Watches::Events, None, &headers, &q, build)
            .await
            .unwrap();
        noise.abort();
        assert_eq!(r.status(), StatusCode::OK);
        // Two rechecks (a second apart) before the third build saw the change.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    /// Readers of an unchanged list share one build: a 304 and a second 200 build nothing,
    /// a counted change builds again, and a gzip reader gets the kept page compressed.
    #[tokio::test(start_paused = true)]
    async fn an_unchanged_list_is_built_once_for_every_reader_and_gzip_is_the_kept_page() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let changes = Changes::default();
        let builds = AtomicUsize::new(0);
        let body = format!("[{}]", vec!["\"some node's item\""; 100].join(","));
        let build = || {
            builds.fetch_add(1, Ordering::SeqCst);
            let keys: Vec<String> = (0..100).map(|_| "some node's item".to_string()).collect();
            async move {
                let items = keys
                    .into_iter()
                    .map(|k| Item {
                        json: format!("\"{k}\"").into_bytes().into(),
                        key: k,
                    })
                    .collect();
                page(items, &ListQuery::default())
            }
        };
        let (sem, pages) = (tokio::sync::Semaphore::new(1), Pages::default());
        let lists = || Lists {
            builders: &sem,
            pages: &pages,
            changes: &changes,
        };
        let q = ListQuery::default();
        let ask = |h: HeaderMap| {
            let lists = lists();
            let q = &q;
            async move {
                answer(lists, "status", Watches::Events, None, &h, q, build)
                    .await
                    .unwrap()
            }
        };
        let first = ask(HeaderMap::new()).await;
        let etag = first.headers()[header::ETAG].clone();
        let mut held = HeaderMap::new();
        held.insert(header::IF_NONE_MATCH, etag.clone());
        assert_eq!(ask(held.clone()).await.status(), StatusCode::NOT_MODIFIED);
        let mut gz = HeaderMap::new();
        gz.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br, gzip;q=0.8"),
        );
        let zipped = ask(gz).await;
        assert_eq!(zipped.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(zipped.headers()[header::ETAG], etag, "the same page");
        let bytes = axum::body::to_bytes(zipped.into_body(), usize::MAX)
            .await
            .unwrap();
        let mut back = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut back)
            .unwrap();
        assert_eq!(back, body);
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1,
            "one build for three readers"
        );
        changes.events_changed();
        assert_eq!(
            ask(held).await.status(),
            StatusCode::NOT_MODIFIED,
            "same content"
        );
        assert_eq!(
            builds.load(Ordering::SeqCst),
            2,
            "a counted change builds again"
        );
        // Another list that follows the same changes has pages of its own.
        let other = || async { page(items(&["f"]), &ListQuery::default()) };
        let r = answer(
            lists(),
            "fences",
            Watches::Events,
            None,
            &HeaderMap::new(),
            &q,
            other,
        )
        .await
        .unwrap();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&bytes[..], br#"["f"]"#, "never the status list's page");
    }

    #[test]
    fn gzip_is_taken_unless_refused() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
            takes_gzip(&h)
        };
        assert!(with("gzip"));
        assert!(with("deflate, GZIP;q=0.5"));
        assert!(with("*"));
        assert!(!with("gzip;q=0"));
        assert!(!with("identity"));
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn filters_and_limits_out_of_range_are_refused_by_name() {
        let q = ListQuery {
            action: Some("evacuate".into()),
            ..Default::default()
        };
        assert!(
            q.check(&["action"])
                .unwrap_err()
                .message
                .contains("`action`")
        );
        let q = ListQuery {
            limit: Some(0),
            ..Default::default()
        };
        assert!(q.check(&[]).unwrap_err().message.contains("limit 0"));
        let q = ListQuery {
            wait: Some(61),
            ..Default::default()
        };
        assert!(q.check(&[]).unwrap_err().message.contains("wait 61"));
        assert!(
            one_of("status", Some("x"), &["a", "b"])
                .unwrap_err()
                .message
                .contains("a, b")
        );
    }
}
