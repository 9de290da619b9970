//! The report poll over UDP: one socket per address family for the whole fleet, a signed
//! request per node and cycle, each answer paired to its request by a random nonce, and the
//! whole cycle's exchange run as one loop on a blocking thread.
//!
//! The loop owns the sockets for the cycle: it sends a wave of requests, reads whatever answers
//! are there, and sleeps in `poll(2)` only when there is nothing to read and no room to send.
//! The sockets are never registered with the runtime's reactor. A registered socket has the
//! kernel wake the reactor each time a sent datagram's buffer is freed (its writability edge),
//! which cost more than the send itself; and a future, a channel and a timer per node cost more
//! than the datagram they wait for.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::node::{NodeConfig, collector_address};
use crate::report::keyring::Keyring;
use crate::report::now_ns;
use crate::report::poll::{Answer, MAX_REPORT, read_answer, request};
use crate::sync::LockExt;

/// A node whose collector does not answer over UDP (down, switched off, an older version, a
/// firewall, a lost datagram) is asked over HTTP only for a while, so its polls do not wait for
/// UDP each cycle.
pub struct UdpPoll {
    io: Arc<Exchange>,
    http_only: std::sync::Mutex<HashMap<String, Instant>>,
    /// Each collector's address as resolved, with the text it was resolved from.
    resolved: std::sync::Mutex<HashMap<String, (String, SocketAddr)>>,
    counts: UdpCounts,
}

/// What one cycle's exchange needs, moved to the blocking thread that runs it.
struct Exchange {
    v4: UdpSocket,
    v6: Option<UdpSocket>,
    /// Each node's poll is signed with that node's key.
    keys: Arc<Keyring>,
    /// How long an answer is awaited before the poll goes over HTTP.
    patience: Duration,
    /// Requests awaiting their answer at once, at most: no more answers arrive together than
    /// the receive buffer holds, so none is dropped for want of room.
    in_flight: usize,
    /// Each request's nonce, which its report must answer.
    nonces: crate::report::poll::Nonces,
    /// One exchange at a time: each reads every answer that arrives while it runs.
    turn: std::sync::Mutex<()>,
}

/// The receive buffer asked for (the kernel may give less).
const RECEIVE_BUFFER: usize = 4 << 20;

/// What became of UDP polls: `answered`, `ask-http` and `no-answer` (both then asked over
/// HTTP), `http-only` (not asked over UDP for now), and `stray` (an answer that matched no
/// waiting request: late, duplicated or forged; dropped).
pub type UdpCounts = prometheus_client::metrics::family::Family<
    UdpOutcome,
    prometheus_client::metrics::counter::Counter,
>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UdpOutcome {
    pub outcome: &'static str,
}

fn count(counts: &UdpCounts, outcome: &'static str, n: u64) {
    if n > 0 {
        counts.get_or_create(&UdpOutcome { outcome }).inc_by(n);
    }
}

/// How a UDP poll went.
#[derive(Debug, PartialEq, Eq)]
pub enum UdpPolled {
    /// The answer's signed report, still to be verified, and the nonce of the request it came
    /// back to (the report must answer it).
    Report { nonce: u64, body: Vec<u8> },
    /// Ask over HTTP: the report does not fit, no answer came, or the node is asked over HTTP
    /// for now.
    Http,
}

/// What one request brought back within its patience.
enum Heard {
    Report(u64, Vec<u8>),
    AskHttp,
    Silent,
}

/// How long a UDP poll waits for its answer before it asks over HTTP: a quarter of the poll's
/// deadline, at most half a second (an answer on a LAN takes well under a millisecond).
pub fn udp_patience(poll_timeout: Duration) -> Duration {
    (poll_timeout / 4).min(Duration::from_millis(500))
}

/// How long a node that did not answer over UDP is asked over HTTP only.
const HTTP_ONLY_FOR: Duration = Duration::from_secs(60);

/// Collectors named by host name resolved at once, at most.
const LOOKUPS_AT_ONCE: usize = 64;

impl UdpPoll {
    /// Binds the sockets (IPv6 only where the host has it).
    pub fn bind(
        keys: Arc<Keyring>,
        patience: Duration,
        counts: UdpCounts,
    ) -> std::io::Result<UdpPoll> {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt::RcvBuf};
        let mut room = usize::MAX;
        let mut bind = |addr: &str| -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(addr)?;
            s.set_nonblocking(true)?;
            // Answers to a whole wave of requests arrive together; the kernel caps this at
            // net.core.rmem_max, and the requests in flight are bounded by what it gave.
            let _ = setsockopt(&s, RcvBuf, &RECEIVE_BUFFER);
            room = room.min(getsockopt(&s, RcvBuf).unwrap_or(RECEIVE_BUFFER / 16));
            Ok(s)
        };
        let v4 = bind("0.0.0.0:0")?;
        let v6 = bind("[::]:0").ok();
        // Each datagram held costs the buffer about 4 KiB of kernel memory, whatever its size.
        let in_flight = (room / 4096).clamp(16, 1024);
        Ok(UdpPoll {
            io: Arc::new(Exchange {
                v4,
                v6,
                keys,
                patience,
                in_flight,
                nonces: Default::default(),
                turn: Default::default(),
            }),
            http_only: Default::default(),
            resolved: Default::default(),
            counts,
        })
    }

    /// At most `n` requests awaiting their answer at once, whatever the receive buffer holds.
    #[cfg(test)]
    pub fn with_in_flight(mut self, n: usize) -> UdpPoll {
        Arc::get_mut(&mut self.io)
            .expect("not shared yet")
            .in_flight = n;
        self
    }

    /// Asks `node` for its report over UDP.
    pub async fn ask(&self, node: &NodeConfig) -> UdpPolled {
        let mut polled = self.ask_all(Arc::new(vec![node.clone()])).await;
        polled.pop().unwrap_or(UdpPolled::Http)
    }

    /// Asks every node in `nodes` for its report over UDP, in one exchange; the answers come
    /// back in the same order.
    pub async fn ask_all(&self, nodes: Arc<Vec<NodeConfig>>) -> Vec<UdpPolled> {
        let now = Instant::now();
        let (mut plan, unresolved, skipped) = self.plan(&nodes, now);
        count(&self.counts, "http-only", skipped);
        let looked_up: Vec<(usize, Option<SocketAddr>)> = futures::stream::iter(unresolved)
            .map(|i| {
                let node = &nodes[i];
                async move { (i, self.resolve(node).await) }
            })
            .buffer_unordered(LOOKUPS_AT_ONCE)
            .collect()
            .await;
        let has_v6 = self.io.v6.is_some();
        plan.extend(looked_up.into_iter().filter_map(|(i, a)| {
            // Without an IPv6 socket, an IPv6 collector is asked over HTTP.
            a.filter(|a| a.is_ipv4() || has_v6).map(|a| (i, a))
        }));
        let mut polled: Vec<UdpPolled> = nodes.iter().map(|_| UdpPolled::Http).collect();
        if plan.is_empty() {
            return polled;
        }
        let (io, asked) = (self.io.clone(), nodes.clone());
        let exchanged = tokio::task::spawn_blocking(move || {
            let (heard, strays) = io.run(&asked, &plan);
            (plan, heard, strays)
        })
        .await;
        let (plan, heard, strays) = match exchanged {
            Ok(r) => r,
            // Only a runtime shutting down gets here; the cycle goes over HTTP.
            Err(_) => return polled,
        };
        count(&self.counts, "stray", strays);
        let (mut answered, mut ask_http, mut silent) = (0, 0, 0);
        let until = Instant::now() + HTTP_ONLY_FOR;
        for ((i, _), h) in plan.into_iter().zip(heard) {
            match h {
                Heard::Report(nonce, body) => {
                    answered += 1;
                    polled[i] = UdpPolled::Report { nonce, body };
                }
                Heard::AskHttp => ask_http += 1,
                Heard::Silent => {
                    silent += 1;
                    let name = &nodes[i].name;
                    self.http_only.lock_unpoisoned().insert(name.clone(), until);
                    // Resolved again next time: the name may point elsewhere now.
                    self.resolved.lock_unpoisoned().remove(name);
                }
            }
        }
        count(&self.counts, "answered", answered);
        count(&self.counts, "ask-http", ask_http);
        count(&self.counts, "no-answer", silent);
        polled
    }

    /// Which nodes are asked over UDP and at which address (each lock taken once per cycle):
    /// the planned ones, the ones still to resolve, and how many are asked over HTTP only.
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        nodes: &[NodeConfig],
        now: Instant,
    ) -> (Vec<(usize, SocketAddr)>, Vec<usize>, u64) {
        let http_only = self.http_only.lock_unpoisoned();
        let resolved = self.resolved.lock_unpoisoned();
        let (mut plan, mut unresolved, mut skipped) = (Vec::with_capacity(nodes.len()), vec![], 0);
        for (i, node) in nodes.iter().enumerate() {
            // A revoked node is asked over HTTP, where its report is refused and counted.
            if http_only.get(&node.name).is_some_and(|until| now < *until)
                || self.io.keys.generation(&node.name).is_err()
            {
                skipped += 1;
                continue;
            }
            match resolved.get(&node.name) {
                Some((text, addr)) if *text == node.collector => plan.push((i, *addr)),
                _ => unresolved.push(i),
            }
        }
        (plan, unresolved, skipped)
    }

    async fn resolve(&self, node: &NodeConfig) -> Option<SocketAddr> {
        let hostport = collector_address(&node.collector).ok()?;
        let addr = match hostport.parse() {
            Ok(a) => a,
            Err(_) => tokio::net::lookup_host(hostport.as_str())
                .await
                .ok()?
                .next()?,
        };
        self.resolved
            .lock_unpoisoned()
            .insert(node.name.clone(), (node.collector.clone(), addr));
        Some(addr)
    }
}

/// A request sent and not yet answered: its place in the plan and when its patience ends.
struct Asked {
    at: usize,
    deadline: Instant,
}

impl Exchange {
    fn nonce(&self) -> u64 {
        self.nonces.next()
    }

    fn socket(&self, addr: &SocketAddr) -> &UdpSocket {
        match (addr, &self.v6) {
            (SocketAddr::V6(_), Some(v6)) => v6,
            _ => &self.v4,
        }
    }

    /// Asks each planned node (an index into `nodes` and its address) and returns what each
    /// brought back, in plan order, with the number of stray answers read. Blocking.
    fn run(&self, nodes: &[NodeConfig], plan: &[(usize, SocketAddr)]) -> (Vec<Heard>, u64) {
        let _turn = self.turn.lock_unpoisoned();
        let mut heard: Vec<Heard> = plan.iter().map(|_| Heard::Silent).collect();
        // By nonce; and in the order sent, which is the order their patience ends.
        let mut waiting: HashMap<u64, usize> = HashMap::with_capacity(self.in_flight);
        let mut sent: VecDeque<(u64, Asked)> = VecDeque::with_capacity(self.in_flight);
        // One byte over the largest answer, so an oversized datagram is seen as such.
        let mut buf = vec![0u8; MAX_REPORT + 13];
        // Answers that came after their request's patience ended, in an earlier cycle.
        let mut strays = self.read(&mut buf, &mut waiting, &mut heard).1;
        let mut next = 0;
        loop {
            let mut blocked = false;
            let now = Instant::now();
            let ts = now_ns();
            while next < plan.len() && waiting.len() < self.in_flight {
                let (i, addr) = plan[next];
                let nonce = self.nonce();
                // A node revoked since the plan was made is left silent.
                let Ok(key) = self.keys.signer(&nodes[i].name) else {
                    next += 1;
                    continue;
                };
                let req = request(&key, &nodes[i].name, nonce, ts);
                match self.socket(&addr).send_to(&req, addr) {
                    Ok(_) => {
                        waiting.insert(nonce, next);
                        let deadline = now + self.patience;
                        sent.push_back((nonce, Asked { at: next, deadline }));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        blocked = true;
                        break;
                    }
                    // Unreachable from here: no answer, so the node goes over HTTP.
                    Err(_) => {}
                }
                next += 1;
            }
            let (matched, stray) = self.read(&mut buf, &mut waiting, &mut heard);
            strays += stray;
            // Patience ends in the order requests were sent.
            let now = Instant::now();
            while let Some((nonce, asked)) = sent.front() {
                if !waiting.contains_key(nonce) {
                    sent.pop_front();
                } else if asked.deadline <= now {
                    debug_assert!(matches!(heard[asked.at], Heard::Silent));
                    waiting.remove(nonce);
                    sent.pop_front();
                } else {
                    break;
                }
            }
            if waiting.is_empty() && next == plan.len() {
                break;
            }
            let room = !blocked && next < plan.len() && waiting.len() < self.in_flight;
            if matched + stray > 0 || room {
                continue;
            }
            // Nothing in flight only when a send would block: a short wait for room, then on.
            let wait = sent
                .front()
                .map_or(Duration::from_millis(1), |(_, a)| a.deadline - now);
            self.sleep(wait, blocked);
        }
        (heard, strays)
    }

    /// Reads every datagram waiting on the sockets; returns how many matched a request and how
    /// many matched none.
    fn read(
        &self,
        buf: &mut [u8],
        waiting: &mut HashMap<u64, usize>,
        heard: &mut [Heard],
    ) -> (u64, u64) {
        let (mut matched, mut strays) = (0, 0);
        for s in std::iter::once(&self.v4).chain(&self.v6) {
            // Until nothing more is there to read; or an ICMP error from an earlier send to a
            // node that is down, which is all there is to read.
            while let Ok((n, _)) = s.recv_from(buf) {
                let found = match read_answer(&buf[..n]) {
                    Some((nonce, a)) if n < buf.len() => {
                        waiting.remove(&nonce).map(|at| (at, nonce, a))
                    }
                    _ => None,
                };
                let Some((at, nonce, a)) = found else {
                    strays += 1;
                    continue;
                };
                matched += 1;
                heard[at] = match a {
                    Answer::Report(r) => Heard::Report(nonce, r.to_vec()),
                    Answer::AskHttp => Heard::AskHttp,
                };
            }
        }
        (matched, strays)
    }

    /// Sleeps until a socket has something to read (or room to send, when `blocked`), or
    /// `wait` is over.
    fn sleep(&self, wait: Duration, blocked: bool) {
        let mut flags = PollFlags::POLLIN;
        if blocked {
            flags |= PollFlags::POLLOUT;
        }
        let mut fds: Vec<PollFd> = std::iter::once(&self.v4)
            .chain(&self.v6)
            .map(|s| PollFd::new(s.as_fd(), flags))
            .collect();
        // Rounded up: a deadline is never slept short of and then spun on.
        let ms = wait.as_micros().div_ceil(1000).min(u128::from(u16::MAX)) as u16;
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
}
