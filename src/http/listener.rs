//! The bounded HTTP/1 listener of the daemon (1816) and the collector (1815): connection caps per
//! listener and per client address, header, idle and request deadlines, and eviction of the
//! oldest connection that is not running a handler, so a flood of idle or slow clients can
//! neither exhaust file descriptors nor lock out the daemon's own polls.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::LockExt;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tracing::{debug, warn};

pub use super::limits::{LimitsError, ListenerLimits};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloseLabel {
    pub reason: String,
}

/// Connection counts of one listener, for `/metrics`.
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    pub open: Gauge,
    /// Connections the listener closed itself: evicted, refused, timeout.
    pub closed: Family<CloseLabel, Counter>,
}

impl ListenerMetrics {
    pub fn register(reg: &mut Registry) -> ListenerMetrics {
        let m = ListenerMetrics::default();
        reg.register(
            "maintd_http_connections",
            "Open connections of the API listener (and of the metrics listener, when there is one)",
            m.open.clone(),
        );
        reg.register(
            "maintd_http_connections_closed",
            "Connections the API listener closed itself, by reason (evicted, refused, timeout)",
            m.closed.clone(),
        );
        m
    }

    fn count(&self, reason: &str) {
        self.closed
            .get_or_create(&CloseLabel {
                reason: reason.into(),
            })
            .inc();
    }
}

/// One connection's activity, shared between its task, the governor and its handlers.
struct Conn {
    id: u64,
    ip: IpAddr,
    /// Handlers running on it; a connection with none is idle, reading a head or a body, or
    /// writing a response, and may be evicted.
    busy: AtomicUsize,
    /// Milliseconds since the governor's start at the last change of `busy`.
    last: AtomicU64,
    /// A request head was read at least once.
    served: AtomicBool,
    /// Bytes of the next request head arrived while it was idle: it reads a head.
    reading: AtomicBool,
    /// Milliseconds a handler holds its request open on purpose (a watch): the request
    /// timeout counts from the end of that span.
    hold: AtomicU64,
    /// Its deadline moved earlier (a head began): the connection's loop looks again.
    moved: tokio::sync::Notify,
    close: tokio::sync::Notify,
}

impl Conn {
    fn touch(&self, base: Instant) {
        self.last
            .store(base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Handed to handlers in the request's extensions: a handler marks the stretch where it waits
/// for an unauthenticated client (reading a body), so that connection stays evictable.
#[derive(Clone)]
pub struct ConnActivity {
    conn: Arc<Conn>,
    base: Instant,
    /// Becomes true when the listener stops: a held request answers at once.
    stop: tokio::sync::watch::Receiver<bool>,
}

/// While held, the request may stay open for its span beyond the request timeout.
pub struct Holding(ConnActivity);

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.conn.hold.store(0, Ordering::Relaxed);
    }
}

/// While held, the connection counts as idle for eviction.
pub struct Unprotected(ConnActivity);

impl ConnActivity {
    pub fn unprotected(&self) -> Unprotected {
        self.conn.busy.fetch_sub(1, Ordering::Relaxed);
        self.conn.touch(self.base);
        Unprotected(self.clone())
    }

    /// Marks the request as held open on purpose for up to `span` (a watch); the request
    /// timeout then applies after it.
    pub fn hold(&self, span: Duration) -> Holding {
        self.conn
            .hold
            .store(span.as_millis() as u64, Ordering::Relaxed);
        Holding(self.clone())
    }

    /// Resolves once the listener stops (the daemon shuts down).
    pub async fn stopping(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }
}

impl Drop for Unprotected {
    fn drop(&mut self) {
        self.0.conn.busy.fetch_add(1, Ordering::Relaxed);
        self.0.conn.touch(self.0.base);
    }
}

struct Busy(ConnActivity);

impl Busy {
    fn enter(a: ConnActivity) -> Busy {
        a.conn.served.store(true, Ordering::Relaxed);
        a.conn.reading.store(false, Ordering::Relaxed);
        a.conn.busy.fetch_add(1, Ordering::Relaxed);
        a.conn.touch(a.base);
        Busy(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.conn.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.conn.touch(self.0.base);
    }
}

#[derive(Default)]
struct Table {
    conns: HashMap<u64, Arc<Conn>>,
    per_ip: HashMap<IpAddr, usize>,
    next: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Arc<Conn>> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&c.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&c.ip);
            }
        }
        Some(c)
    }

    /// The idle connection that has been idle longest, among those `from` admits.
    fn oldest_idle(&self, from: impl Fn(&Conn) -> bool) -> Option<u64> {
        self.conns
            .values()
            .filter(|c| c.busy.load(Ordering::Relaxed) == 0 && from(c))
            .min_by_key(|c| (c.last.load(Ordering::Relaxed), c.id))
            .map(|c| c.id)
    }
}

/// Admission of connections under the caps.
struct Governor {
    limits: ListenerLimits,
    table: Mutex<Table>,
    base: Instant,
    metrics: ListenerMetrics,
}

enum Admit {
    Admitted(Arc<Conn>),
    Refused,
}

impl Governor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock_unpoisoned()
    }

    fn admit(&self, ip: IpAddr) -> Admit {
        let mut t = self.lock();
        let ip_full = t.per_ip.get(&ip).copied().unwrap_or(0) >= self.limits.max_connections_per_ip;
        let all_full = t.conns.len() >= self.limits.max_connections;
        if ip_full || all_full {
            // The newcomer is the one most likely to be a real client about to send a request;
            // the longest-idle connection is the one most likely to be an attacker's.
            let victim = if ip_full {
                t.oldest_idle(|c| c.ip == ip)
            } else {
                t.oldest_idle(|_| true)
            };
            match victim.and_then(|id| t.remove(id)) {
                Some(v) => {
                    v.close.notify_one();
                    self.metrics.count("evicted");
                }
                None => {
                    self.metrics.count("refused");
                    return Admit::Refused;
                }
            }
        }
        t.next += 1;
        let c = Arc::new(Conn {
            id: t.next,
            ip,
            busy: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            served: AtomicBool::new(false),
            reading: AtomicBool::new(false),
            hold: AtomicU64::new(0),
            moved: tokio::sync::Notify::new(),
            close: tokio::sync::Notify::new(),
        });
        c.touch(self.base);
        t.conns.insert(c.id, c.clone());
        *t.per_ip.entry(ip).or_default() += 1;
        self.metrics.open.set(t.conns.len() as i64);
        Admit::Admitted(c)
    }

    fn release(&self, id: u64) {
        let mut t = self.lock();
        t.remove(id);
        self.metrics.open.set(t.conns.len() as i64);
    }

    /// When the connection's current stretch runs out.
    fn deadline(&self, c: &Conn) -> Instant {
        let limit = if c.busy.load(Ordering::Relaxed) > 0 {
            self.limits.request_timeout + Duration::from_millis(c.hold.load(Ordering::Relaxed))
        } else if c.served.load(Ordering::Relaxed) && !c.reading.load(Ordering::Relaxed) {
            self.limits.idle_timeout
        } else {
            self.limits.header_timeout
        };
        self.base + Duration::from_millis(c.last.load(Ordering::Relaxed)) + limit
    }
}

/// Raises the soft limit of open files to the hard limit, so the caps above, not the
/// process's fd limit, decide what is refused. Returns the new soft limit.
pub fn raise_fd_limit() -> Result<u64, nix::Error> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves; then stops
/// accepting, lets requests in flight finish (up to the request timeout) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    metrics: ListenerMetrics,
    tls: Option<super::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let gov = Arc::new(Governor {
        limits,
        table: Mutex::new(Table::default()),
        base: Instant::now(),
        metrics,
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let mut last_accept_error: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning; say so at most every 10 s.
                    if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        warn!(error = %e, "cannot accept a connection");
                        last_accept_error = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let conn = match gov.admit(peer.ip()) {
            Admit::Admitted(c) => c,
            Admit::Refused => {
                debug!(peer = %peer, "connection refused: every slot is running a handler");
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tasks.spawn(run_conn(
            gov.clone(),
            conn,
            stream,
            peer,
            router.clone(),
            tls.clone(),
            stop_rx.clone(),
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let grace = gov.limits.request_timeout + Duration::from_secs(1);
    if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        tasks.abort_all();
    }
    Ok(())
}

/// What hyper reads and writes: the connection itself, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The connection as hyper sees it: on a TLS listener, after a handshake that must end within
/// the header timeout. A client that opens with anything but a TLS handshake record is told,
/// in plain HTTP, that this port speaks HTTPS, and the connection closes.
async fn open(
    gov: &Governor,
    conn: &Arc<Conn>,
    mut stream: tokio::net::TcpStream,
    tls: Option<super::tls::ServerTls>,
) -> Option<Box<dyn Io>> {
    let io = |stream| watched::Watched {
        inner: stream,
        conn: conn.clone(),
        base: gov.base,
    };
    let Some(tls) = tls else {
        return Some(Box::new(io(stream)));
    };
    let patience = gov.limits.header_timeout;
    let mut first = [0u8; 1];
    match tokio::time::timeout(patience, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == 0x16 => {}
        Ok(Ok(1)) => {
            use tokio::io::AsyncWriteExt;
            let _ = stream.write_all(super::tls::PLAIN_HTTP_ANSWER).await;
            let _ = stream.shutdown().await;
            return None;
        }
        _ => return None,
    }
    match tokio::time::timeout(patience, tls.acceptor.accept(io(stream))).await {
        Ok(Ok(s)) => Some(Box::new(s)),
        Ok(Err(e)) => {
            debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

async fn run_conn(
    gov: Arc<Governor>,
    conn: Arc<Conn>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
    tls: Option<super::tls::ServerTls>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(io) = open(&gov, &conn, stream, tls).await else {
        gov.release(conn.id);
        return;
    };
    let activity = ConnActivity {
        conn: conn.clone(),
        base: gov.base,
        stop: stop.clone(),
    };
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let busy = Busy::enter(activity.clone());
        req.extensions_mut().insert(activity.clone());
        let router = router.clone();
        async move {
            if let Err(e) = super::hygiene::check_head(&req) {
                drop(busy);
                return Ok::<_, Infallible>(axum::response::IntoResponse::into_response(e));
            }
            let resp = router.oneshot(req).await;
            drop(busy);
            Ok::<_, Infallible>(resp.unwrap_or_else(|e| match e {}))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own head timer runs while a kept-alive connection waits for its next request,
    // which would close it at the header timeout: the governor times heads from their first
    // byte instead, and idle connections at the idle timeout.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(64 * 1024);
    let http = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(http);
    let mut stopping = false;
    loop {
        let deadline = tokio::time::Instant::from_std(gov.deadline(&conn));
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    debug!(peer = %peer, error = %e, "connection ended with an error");
                }
                break;
            }
            _ = conn.close.notified() => {
                debug!(peer = %peer, "connection evicted");
                break;
            }
            _ = conn.moved.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {
                if tokio::time::Instant::from_std(gov.deadline(&conn)) <= tokio::time::Instant::now() {
                    gov.metrics.count("timeout");
                    debug!(peer = %peer, "connection timed out");
                    break;
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                http.as_mut().graceful_shutdown();
            }
        }
    }
    gov.release(conn.id);
}

mod watched;

#[cfg(test)]
mod tests {
    use super::*;

    fn gov(max: usize, per_ip: usize) -> Governor {
        Governor {
            limits: ListenerLimits {
                max_connections: max,
                max_connections_per_ip: per_ip,
                ..ListenerLimits::default()
            },
            table: Mutex::new(Table::default()),
            base: Instant::now(),
            metrics: ListenerMetrics::default(),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn admitted(a: Admit) -> Arc<Conn> {
        match a {
            Admit::Admitted(c) => c,
            Admit::Refused => panic!("refused"),
        }
    }

    #[test]
    fn a_full_address_evicts_its_own_longest_idle_connection() {
        let g = gov(10, 2);
        let a = admitted(g.admit(ip(1)));
        a.last.store(0, Ordering::Relaxed);
        let b = admitted(g.admit(ip(1)));
        b.last.store(5, Ordering::Relaxed);
        let other = admitted(g.admit(ip(2)));
        other.last.store(0, Ordering::Relaxed);
        let _c = admitted(g.admit(ip(1)));
        let t = g.lock();
        assert!(
            !t.conns.contains_key(&a.id),
            "the oldest idle of that address goes"
        );
        assert!(t.conns.contains_key(&b.id));
        assert!(
            t.conns.contains_key(&other.id),
            "another address is not touched"
        );
        assert_eq!(t.per_ip[&ip(1)], 2);
    }

    #[test]
    fn connections_running_a_handler_are_never_evicted() {
        let g = gov(2, 2);
        let a = admitted(g.admit(ip(1)));
        let b = admitted(g.admit(ip(1)));
        a.busy.store(1, Ordering::Relaxed);
        b.busy.store(1, Ordering::Relaxed);
        assert!(matches!(g.admit(ip(1)), Admit::Refused));
        b.busy.store(0, Ordering::Relaxed);
        let _c = admitted(g.admit(ip(1)));
        let t = g.lock();
        assert!(t.conns.contains_key(&a.id) && !t.conns.contains_key(&b.id));
        assert_eq!(t.conns.len(), 2);
    }

    #[test]
    fn a_full_listener_evicts_across_addresses_and_release_frees_slots() {
        let g = gov(2, 2);
        let a = admitted(g.admit(ip(1)));
        let _b = admitted(g.admit(ip(2)));
        let c = admitted(g.admit(ip(3)));
        assert_eq!(g.lock().conns.len(), 2);
        assert!(!g.lock().conns.contains_key(&a.id));
        g.release(c.id);
        g.release(c.id);
        assert_eq!(g.lock().conns.len(), 1);
        assert!(!g.lock().per_ip.contains_key(&ip(3)));
    }

    /// A kept-alive connection waits for its next request for the idle timeout, not the header
    /// timeout; a head that starts and stalls is cut at the header timeout from its first byte.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_last_the_idle_timeout_and_heads_the_header_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ListenerLimits {
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(6),
            ..ListenerLimits::default()
        };
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            l,
            router,
            limits,
            ListenerMetrics::default(),
            None,
            async {
                let _ = rx.await;
            },
        ));
        let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        async fn answer(s: &mut tokio::net::TcpStream) -> usize {
            let mut buf = [0u8; 512];
            s.read(&mut buf).await.unwrap()
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(get).await.unwrap();
        assert!(answer(&mut s).await > 0);
        // Four header timeouts of silence: still open, and it serves the next request.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        s.write_all(get).await.unwrap();
        assert!(answer(&mut s).await > 0, "closed before its idle timeout");
        // A head that starts and stalls: closed long before the idle timeout.
        let start = Instant::now();
        s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert_eq!(answer(&mut s).await, 0, "a stalled head is closed");
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        // Idle past the idle timeout: closed.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(get).await.unwrap();
        assert!(answer(&mut s).await > 0);
        let start = Instant::now();
        assert_eq!(answer(&mut s).await, 0);
        assert!(
            start.elapsed() >= Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let _ = tx.send(());
        server.await.unwrap().unwrap();
    }

    #[test]
    fn limits_are_validated() {
        assert!(ListenerLimits::default().validate("x").is_ok());
        let bad = ListenerLimits {
            max_connections_per_ip: 300,
            ..ListenerLimits::default()
        };
        assert!(
            bad.validate("x")
                .unwrap_err()
                .to_string()
                .contains("per-ip")
        );
        let zero = ListenerLimits {
            idle_timeout: Duration::ZERO,
            ..ListenerLimits::default()
        };
        assert!(
            zero.validate("x")
                .unwrap_err()
                .to_string()
                .contains("idle-timeout")
        );
    }
}
