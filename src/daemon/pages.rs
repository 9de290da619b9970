//! List pages as the API last sent them, shared by every reader until the list changes: each
//! with the store's change count it reflects, its ETag and, once a reader asks for it, its gzip
//! form. A reader of an unchanged list then costs a lookup, a 304 a comparison, and a gzip
//! answer a copy of bytes compressed once.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use tokio::time::Instant;

use crate::sync::LockExt;

/// How long a page is served again while the store counts no change of what it shows. What a
/// list shows that the store does not count (another replica's writes, the nodes' peers, the
/// cluster's objects) reaches readers within this; a watch's recheck waits as long.
pub const MAX_AGE: Duration = Duration::from_secs(1);
/// Pages kept at once; beyond, those older than [`MAX_AGE`] go first, then all the others.
const KEPT: usize = 256;
/// The bytes the kept pages may hold (bodies, and their gzip forms counted as a body again):
/// a client asking for many distinct large pages within a second (another `since`, another
/// cursor) evicts pages, it never makes the daemon hold more than this.
const KEPT_BYTES: usize = 64 << 20;
/// Smaller bodies go as they are: compressing them would save little.
const GZIP_FROM: usize = 1024;

/// A page of a list as the API sends it.
pub struct Page {
    pub body: Bytes,
    pub next: Option<String>,
    pub etag: String,
}

/// A page as built, shared by the readers of one list, one query, one count of changes.
pub struct Built {
    pub page: Page,
    mark: (u64, u64),
    at: Instant,
    gzip: OnceLock<Option<Bytes>>,
}

impl Built {
    /// What it holds, its gzip form counted as a body again whether built yet or not.
    fn weight(&self) -> usize {
        2 * self.page.body.len()
    }

    /// The body gzip-compressed, built by the first reader that asks: `None` for a body too
    /// small to be worth it.
    pub fn gzip(&self) -> Option<Bytes> {
        self.gzip
            .get_or_init(|| {
                if self.page.body.len() < GZIP_FROM {
                    return None;
                }
                let mut z = flate2::write::GzEncoder::new(
                    Vec::with_capacity(self.page.body.len() / 8),
                    flate2::Compression::fast(),
                );
                z.write_all(&self.page.body).ok()?;
                z.finish().ok().map(Bytes::from)
            })
            .clone()
    }
}

/// A body sent in slices of [`SLICE`], the connection yielding to the API's other tasks
/// between two: however many readers pull large pages, a signed change, a watch's answer or a
/// scrape waits for one slice each, not for whole pages. Its exact length is known, so the
/// answer still carries `Content-Length`.
pub struct Paced {
    rest: Bytes,
    yielded: bool,
}

/// What a connection writes before it lets the others run.
pub const SLICE: usize = 64 * 1024;

impl Paced {
    pub fn new(body: Bytes) -> Paced {
        Paced {
            rest: body,
            yielded: true,
        }
    }
}

impl hyper::body::Body for Paced {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.yielded = false;
        let n = SLICE.min(self.rest.len());
        let slice = self.rest.split_to(n);
        Poll::Ready(Some(Ok(hyper::body::Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// The pages kept, by list and query.
#[derive(Default)]
pub struct Pages {
    kept: Mutex<HashMap<String, Arc<Built>>>,
}

impl Pages {
    /// The page kept for `key` if it reflects the change count `mark` and is younger than
    /// [`MAX_AGE`].
    pub fn fresh(&self, key: &str, mark: (u64, u64)) -> Option<Arc<Built>> {
        let kept = self.kept.lock_unpoisoned();
        kept.get(key)
            .filter(|b| b.mark == mark && b.at.elapsed() < MAX_AGE)
            .cloned()
    }

    /// Keeps `page`, built for `key` when the store's count was `mark` (read before building:
    /// a change while building leaves the older count, so the next reader builds again).
    pub fn keep(&self, key: String, mark: (u64, u64), page: Page) -> Arc<Built> {
        let built = Arc::new(Built {
            page,
            mark,
            at: Instant::now(),
            gzip: OnceLock::new(),
        });
        let size = built.weight();
        if size > KEPT_BYTES {
            // Sent once, never kept: larger than every kept page together may be.
            return built;
        }
        let mut kept = self.kept.lock_unpoisoned();
        kept.remove(&key);
        let full = |k: &HashMap<String, Arc<Built>>| {
            k.len() >= KEPT || k.values().map(|b| b.weight()).sum::<usize>() + size > KEPT_BYTES
        };
        if full(&kept) {
            kept.retain(|_, b| b.at.elapsed() < MAX_AGE);
            if full(&kept) {
                kept.clear();
            }
        }
        kept.insert(key, built.clone());
        built
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(body: &[u8]) -> Page {
        Page {
            body: Bytes::copy_from_slice(body),
            next: None,
            etag: "\"e\"".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_is_shared_until_a_change_or_its_age_and_the_kept_ones_are_bounded() {
        let pages = Pages::default();
        let a = pages.keep("status?".into(), (1, 0), page(b"[]"));
        assert!(Arc::ptr_eq(&pages.fresh("status?", (1, 0)).unwrap(), &a));
        assert!(pages.fresh("status?", (2, 0)).is_none(), "a counted change");
        assert!(
            pages.fresh("status?node=n1", (1, 0)).is_none(),
            "another query"
        );
        tokio::time::advance(MAX_AGE).await;
        assert!(pages.fresh("status?", (1, 0)).is_none(), "too old");
        for i in 0..KEPT + 10 {
            pages.keep(format!("q{i}"), (1, 0), page(b"[]"));
        }
        let kept = pages.kept.lock_unpoisoned().len();
        assert!(kept <= KEPT, "{kept}");
        assert!(pages.fresh(&format!("q{}", KEPT + 9), (1, 0)).is_some());
    }

    /// Many distinct large pages within a second (a client varying `since`) never hold more
    /// than the byte bound; a page larger than the bound is sent, never kept.
    #[test]
    fn the_kept_pages_hold_at_most_their_byte_bound() {
        let pages = Pages::default();
        let big = vec![b' '; 4 << 20];
        for i in 0..40 {
            let b = pages.keep(format!("since={i}"), (1, 0), page(&big));
            assert_eq!(b.page.body.len(), big.len(), "every reader gets its page");
            let held: usize = pages
                .kept
                .lock_unpoisoned()
                .values()
                .map(|b| b.weight())
                .sum();
            assert!(held <= KEPT_BYTES, "{held} bytes kept");
        }
        assert!(
            pages.fresh("since=39", (1, 0)).is_some(),
            "the newest is kept"
        );
        let huge = vec![b' '; KEPT_BYTES];
        pages.keep("huge".into(), (1, 0), page(&huge));
        assert!(pages.fresh("huge", (1, 0)).is_none());
    }

    /// A paced body gives its bytes whole, in slices, yielding between two, with its exact
    /// length known from the start.
    #[tokio::test]
    async fn a_paced_body_is_sent_whole_in_slices_with_its_length() {
        use http_body_util::BodyExt;
        use hyper::body::Body;
        let body: Vec<u8> = (0..SLICE * 3 + 17).map(|i| (i % 251) as u8).collect();
        let mut paced = Paced::new(Bytes::from(body.clone()));
        assert_eq!(paced.size_hint().exact(), Some(body.len() as u64));
        let (mut got, mut frames) = (Vec::new(), 0);
        while let Some(f) = paced.frame().await {
            let data = f.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            got.extend_from_slice(&data);
            frames += 1;
        }
        assert_eq!(got, body);
        assert_eq!(frames, 4);
        assert!(paced.is_end_stream());
    }

    #[test]
    fn a_large_body_is_compressed_once_and_a_small_one_not_at_all() {
        use std::io::Read;
        let pages = Pages::default();
        let body = "[".to_string() + &"{\"node\":\"n1\"},".repeat(200) + "{}]";
        let b = pages.keep("k".into(), (0, 0), page(body.as_bytes()));
        let z = b.gzip().expect("compressed");
        assert!(z.len() < body.len() / 4, "{} of {}", z.len(), body.len());
        assert_eq!(z, b.gzip().unwrap(), "the same bytes, kept");
        let mut back = String::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, body);
        assert!(pages.keep("s".into(), (0, 0), page(b"[]")).gzip().is_none());
    }
}
