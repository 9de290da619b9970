//! A lean HTTP/1.1 client for the daemon's conversations with its collectors: one connection
//! kept open per collector for a bounded set of collectors, a fresh connection (closed after the
//! answer) for the others, so the descriptors stay bounded whatever the fleet's size.
//!
//! The report poll and the liveness probe ask every collector in turn, so this client is on the
//! hottest path of the daemon. A general client (reqwest) parses a URL, looks up a pool and clones
//! a retry policy on every request; here a kept connection is one map lookup away, and the `Host`
//! header is built once per connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONNECTION, HOST, HeaderValue};
use tokio::task::AbortHandle;

use crate::sync::LockExt;

/// Why a request brought no whole answer.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// The address is unusable; trying again would not help.
    #[error("{0}")]
    Address(String),
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    /// The request failed before an answer's head arrived (refused, reset, closed).
    #[error("{}", super::error_chain(.0))]
    Request(hyper::Error),
    /// The answer's head came, its body broke off.
    #[error("{}", super::error_chain(.0.as_ref()))]
    Body(Box<dyn std::error::Error + Send + Sync>),
    #[error("body is over the {cap}-byte cap")]
    TooLarge { cap: usize },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

impl GetError {
    /// Worth another try: the connection failed without the deadline passing. A collector under
    /// a connection flood may close a kept or fresh connection to make room.
    pub fn is_retryable(&self) -> bool {
        matches!(self, GetError::Connect { .. } | GetError::Request(_))
    }
}

/// A kept connection: the sender and the task that drives its socket, stopped when this drops
/// (a timed-out request must not leave a socket behind for a collector that never answers).
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
    task: AbortHandle,
    /// This connection's share of the descriptor cap, given back when it closes.
    _open: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Requests with a deadline each, at most `keep` connections kept between requests, and at most
/// `open` connections at any time (kept and in use), whatever the number of peers or callers.
pub struct KeptClient {
    keep: usize,
    /// One permit per connection that may be open; a request that needs a new connection while
    /// all are open waits for one (within its deadline).
    open: Arc<tokio::sync::Semaphore>,
    /// A name present here may keep a connection (first come, at most `keep`); its slot is
    /// empty while a request uses the connection or after it failed.
    kept: std::sync::Mutex<HashMap<String, Option<Conn>>>,
}

impl KeptClient {
    /// At most `keep` peers keep a connection open between requests (first come). A poll visits
    /// every node in turn, so a least-recently-used pool smaller than the fleet would never hit:
    /// a fixed set keeps its connections and the others connect afresh.
    /// `keep` is capped below `open`, so requests to the others always find room.
    pub fn new(keep: usize, open: usize) -> KeptClient {
        let open = open.max(1);
        KeptClient {
            keep: keep.min(open - 1),
            open: Arc::new(tokio::sync::Semaphore::new(open)),
            kept: Default::default(),
        }
    }

    /// The connections open between requests now.
    pub fn idle(&self) -> usize {
        self.kept.lock_unpoisoned().values().flatten().count()
    }

    /// Sends the request `build` makes (given the `Host` header) to the peer called `name`,
    /// whose `host:port` `address` gives (asked only when a connection is opened), and reads the
    /// answer's body up to `cap` bytes, all within `timeout`.
    pub async fn send(
        &self,
        name: &str,
        address: impl Fn() -> Result<String, GetError>,
        build: impl Fn(HeaderValue) -> Result<hyper::Request<Full<Bytes>>, GetError>,
        cap: usize,
        timeout: Duration,
    ) -> Result<(hyper::StatusCode, Vec<u8>), GetError> {
        let (slot, taken) = {
            let mut kept = self.kept.lock_unpoisoned();
            let room = kept.len() < self.keep;
            match kept.get_mut(name) {
                Some(slot) => (true, slot.take()),
                None if room => {
                    kept.insert(name.to_owned(), None);
                    (true, None)
                }
                None => (false, None),
            }
        };
        let work = async {
            let mut reused = None;
            if let Some(mut c) = taken
                && c.sender.ready().await.is_ok()
            {
                reused = Some(c);
            }
            let (mut conn, reused) = match reused {
                Some(c) => (c, true),
                // Closed by the peer while idle (its idle timeout, a restart): open another.
                None => (self.connect(&address).await?, false),
            };
            let req = request(&build, &conn, slot)?;
            let again = idempotent(req.method());
            let resp = match conn.sender.send_request(req).await {
                Ok(r) => r,
                // The peer closed the kept connection as the request went out (its idle
                // timeout): the request goes again at once on a new connection if it was never
                // sent, or if sending it twice changes nothing.
                Err(e) if reused && (again || e.is_canceled()) => {
                    conn = self.connect(&address).await?;
                    let req = request(&build, &conn, slot)?;
                    conn.sender
                        .send_request(req)
                        .await
                        .map_err(GetError::Request)?
                }
                Err(e) => return Err(GetError::Request(e)),
            };
            let status = resp.status();
            let body = Limited::new(resp.into_body(), cap)
                .collect()
                .await
                .map_err(|e| match e.downcast::<LengthLimitError>() {
                    Ok(_) => GetError::TooLarge { cap },
                    Err(e) => GetError::Body(e),
                })?
                .to_bytes();
            Ok((status, body.to_vec(), conn))
        };
        let done = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| GetError::Timeout(timeout))
            .and_then(|r| r);
        let (status, body, conn) = match done {
            Ok(d) => d,
            Err(e) => {
                if slot && matches!(e, GetError::Connect { .. } | GetError::Timeout(_)) {
                    // A peer that cannot be reached (down, or gone from the fleet) gives up its
                    // place among the kept ones; it is admitted again if there is room.
                    self.kept.lock_unpoisoned().remove(name);
                }
                return Err(e);
            }
        };
        if slot && let Some(s) = self.kept.lock_unpoisoned().get_mut(name) {
            *s = Some(conn);
        }
        Ok((status, body))
    }

    async fn connect(
        &self,
        address: &impl Fn() -> Result<String, GetError>,
    ) -> Result<Conn, GetError> {
        let addr = address()?;
        let permit = self
            .open
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let host = HeaderValue::from_str(&addr)
            .map_err(|_| GetError::Address(format!("address {addr:?} is not a valid host")))?;
        let tcp = match tokio::net::TcpStream::connect(addr.as_str()).await {
            Ok(t) => t,
            Err(source) => return Err(GetError::Connect { addr, source }),
        };
        // One small request and one small answer: waiting to coalesce only adds latency.
        let _ = tcp.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .map_err(GetError::Request)?;
        let task = tokio::spawn(conn).abort_handle();
        Ok(Conn {
            sender,
            host,
            task,
            _open: permit,
        })
    }
}

/// The request `build` makes for `conn`; `kept` says whether the connection stays open after
/// the answer.
fn request(
    build: &impl Fn(HeaderValue) -> Result<hyper::Request<Full<Bytes>>, GetError>,
    conn: &Conn,
    kept: bool,
) -> Result<hyper::Request<Full<Bytes>>, GetError> {
    let mut req = build(conn.host.clone())?;
    if !kept {
        // The peer closes after answering, so its side holds the closed socket's TIME_WAIT,
        // not the daemon's ephemeral ports.
        req.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(req)
}

fn idempotent(m: &hyper::Method) -> bool {
    matches!(
        *m,
        hyper::Method::GET | hyper::Method::HEAD | hyper::Method::PUT | hyper::Method::DELETE
    )
}

/// A bodiless GET of `path` with the `Host` header given.
pub fn get(path: &str, host: HeaderValue) -> Result<hyper::Request<Full<Bytes>>, GetError> {
    hyper::Request::get(path)
        .header(HOST, host)
        .body(Full::default())
        .map_err(|e| GetError::Address(format!("bad request path {path:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A peer that answers every request on a connection with `body`, counting connections.
    async fn peer(body: &'static str) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = conns.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let Ok(n) = s.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                            seen.drain(..end + 4);
                            let close = head.contains("connection: close");
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{}\r\n{body}",
                                body.len(),
                                if close { "connection: close\r\n" } else { "" }
                            );
                            if s.write_all(answer.as_bytes()).await.is_err() || close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, conns)
    }

    fn at(addr: &str) -> impl Fn() -> Result<String, GetError> + '_ {
        move || Ok(addr.to_string())
    }

    impl KeptClient {
        async fn get(
            &self,
            name: &str,
            address: impl Fn() -> Result<String, GetError>,
            path: &str,
            cap: usize,
        ) -> Result<(hyper::StatusCode, Vec<u8>), GetError> {
            let patient = Duration::from_secs(5);
            self.send(name, address, |h| get(path, h), cap, patient)
                .await
        }
    }

    #[tokio::test]
    async fn kept_peers_reuse_one_connection_and_the_others_connect_each_time() {
        let (a, conns_a) = peer("a").await;
        let (b, conns_b) = peer("bb").await;
        let client = KeptClient::new(1, 8);
        for _ in 0..3 {
            let (s, body) = client.get("a", at(&a), "/x", 100).await.unwrap();
            assert_eq!((s.as_u16(), body.as_slice()), (200, &b"a"[..]));
            let (_, body) = client.get("b", at(&b), "/x", 100).await.unwrap();
            assert_eq!(body, b"bb");
        }
        assert_eq!(conns_a.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(conns_b.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(
            client.idle(),
            1,
            "only the kept peer's connection stays open"
        );
    }

    #[tokio::test]
    async fn a_body_over_the_cap_and_a_refused_connect_are_named() {
        let (a, _) = peer("0123456789").await;
        let client = KeptClient::new(8, 16);
        let e = client.get("a", at(&a), "/x", 4).await.unwrap_err();
        assert!(matches!(e, GetError::TooLarge { cap: 4 }), "{e}");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap().to_string();
        drop(closed);
        let e = client.get("g", at(&gone), "/x", 4).await.unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains(&gone), "{e}");
        assert!(
            !client.kept.lock_unpoisoned().contains_key("g"),
            "a peer that cannot be reached gives up its place among the kept"
        );
        let e = client
            .get(
                "z",
                || {
                    Err(GetError::Address(
                        "collector address \"a b\" must be host or host:port".into(),
                    ))
                },
                "/x",
                4,
            )
            .await
            .unwrap_err();
        assert!(!e.is_retryable() && e.to_string().contains("a b"), "{e}");
    }

    #[tokio::test]
    async fn a_peer_that_never_answers_times_out_and_its_socket_is_closed() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let client = KeptClient::new(8, 16);
        let deadline = Duration::from_millis(200);
        let get = client.send("s", at(&addr), |h| get("/x", h), 100, deadline);
        let (accepted, result) = tokio::join!(l.accept(), get);
        let e = result.unwrap_err();
        assert!(
            matches!(e, GetError::Timeout(_)) && !e.is_retryable(),
            "{e}"
        );
        // The client's side is gone: the peer reads the end of the stream.
        let (mut s, _) = accepted.unwrap();
        let mut buf = vec![0u8; 1024];
        let mut total = 0;
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("the client closes its socket")
                .unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        assert!(total > 0, "the request was sent before the deadline");
        assert_eq!(client.idle(), 0);
    }

    #[tokio::test]
    async fn a_kept_connection_the_peer_closed_is_replaced() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        // Accepts one connection, answers one request with `body`, and hands the socket back.
        let serve = |body: &'static str| {
            let l = &l;
            async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                s.write_all(format!("{head}{body}").as_bytes())
                    .await
                    .unwrap();
                s
            }
        };
        let client = KeptClient::new(8, 16);
        // The first socket is dropped once answered: closed while idle, as a collector's idle
        // timeout does.
        let (_, r) = tokio::join!(serve("ok"), client.get("a", at(&addr), "/x", 100));
        assert_eq!(r.unwrap().1, b"ok");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let serve_again = serve("again");
        let (_s, r) = tokio::join!(serve_again, client.get("a", at(&addr), "/x", 100));
        assert_eq!(r.unwrap().1, b"again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_connections_are_open_than_the_cap_however_many_ask() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        // A peer that holds every answer until told, so no connection closes before then.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let (go_tx, go) = tokio::sync::watch::channel(false);
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                counted.fetch_add(1, SeqCst);
                let mut go = go.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = go.wait_for(|g| *g).await;
                    let answer =
                        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\nx";
                    let _ = s.write_all(answer).await;
                });
            }
        });
        let client = std::sync::Arc::new(KeptClient::new(0, 3));
        let asks = (0..40).map(|i| {
            let (client, addr) = (client.clone(), addr.clone());
            tokio::spawn(async move { client.get(&format!("n{i}"), at(&addr), "/x", 10).await })
        });
        let asks: Vec<_> = asks.collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while accepted.load(SeqCst) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "three connections never opened"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            accepted.load(SeqCst),
            3,
            "40 requests, a cap of 3, no answer yet"
        );
        go_tx.send(true).unwrap();
        for a in asks {
            assert!(a.await.unwrap().is_ok());
        }
        assert_eq!(
            accepted.load(SeqCst),
            40,
            "none kept: each request had its own"
        );
    }
}
