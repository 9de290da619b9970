//! The collector's side of the report poll over UDP: a signed request on the heartbeat socket is
//! answered with the signed report in one datagram (or a note that it does not fit); anything
//! else gets no answer, and is counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::debug;

use super::Collector;
use crate::http::RefusalLabel;
use crate::report::poll::{self, PollError};
use crate::sync::LockExt;

/// Poll requests remembered within the window: a daemon and its standbys send a few per
/// interval, so this is far above what they need, and it bounds what a flood can hold.
const REMEMBERED: usize = 4096;

/// Answers per second at most, and the burst allowed: a daemon and its standbys ask about once
/// per poll interval each. A request played back after it left the memory is answered again
/// (nothing compares the daemon's timestamp with this clock), so this bounds how much traffic
/// copies of captured requests can make this node send toward a spoofed address.
const ANSWERS_PER_S: i64 = 16;
const BURST: i64 = 32;

/// Answers poll requests for one collector.
pub struct PollAnswers {
    collector: Arc<Collector>,
    /// How long a nonce is remembered, on this node's boot clock.
    window_ns: i64,
    /// Nonces answered lately, with when they came (this node's boot clock).
    seen: Mutex<HashMap<u64, i64>>,
    /// Tokens (ns of credit at `ANSWERS_PER_S`), and when they were last counted.
    bucket: Mutex<(i64, i64)>,
}

impl PollAnswers {
    pub fn new(collector: Arc<Collector>) -> PollAnswers {
        let window_ns = i64::try_from(collector.cfg.request_window.as_nanos()).unwrap_or(i64::MAX);
        PollAnswers {
            collector,
            window_ns,
            seen: Mutex::new(HashMap::new()),
            bucket: Mutex::new((BURST * 1_000_000_000, 0)),
        }
    }

    /// The answer to datagram `d` received at `mono` (this node's boot clock), if it is a
    /// genuine poll request not seen lately. The request's timestamp is the daemon's clock and
    /// is never compared with this one: a daemon whose clock is off still polls every node, and
    /// the report it gets back is fresh because it answers the nonce.
    pub fn answer(&self, d: &[u8], mono: i64) -> Option<Vec<u8>> {
        let c = &self.collector;
        let asked = poll::verify_request(&c.cred, &c.node, d)
            .and_then(|a| self.first_time(a, mono).map(|()| a))
            .and_then(|a| self.take_token(mono).map(|()| a));
        let asked = match asked {
            Ok(a) => a,
            Err(e) => {
                debug!(reason = %e, "poll request refused");
                c.refused
                    .get_or_create(&RefusalLabel {
                        reason: refusal_label(&e),
                    })
                    .inc();
                return None;
            }
        };
        // Without a report yet, the daemon is told to ask over HTTP, which says why; no answer
        // at all would have it take this collector for one that does not poll over UDP.
        let report = c.signed_report(asked.nonce).map(|r| r.to_wire());
        Some(poll::answer(asked.nonce, report.as_deref()))
    }

    /// Remembers a request's nonce, refusing one seen within the window (a copy played back
    /// would make this node send its report again).
    fn first_time(&self, a: poll::Asked, mono: i64) -> Result<(), PollError> {
        let mut seen = self.seen.lock_unpoisoned();
        if seen.len() >= REMEMBERED {
            seen.retain(|_, at| mono.saturating_sub(*at) <= self.window_ns);
        }
        if seen.len() >= REMEMBERED {
            // Only signed requests get here: the daemon's own, far too many. Refused until
            // the window moves on, rather than forgetting one that could then be replayed.
            return Err(PollError::Replay);
        }
        if seen
            .get(&a.nonce)
            .is_some_and(|at| mono.saturating_sub(*at) <= self.window_ns)
        {
            return Err(PollError::Replay);
        }
        seen.insert(a.nonce, mono);
        Ok(())
    }

    fn take_token(&self, mono: i64) -> Result<(), PollError> {
        let mut b = self.bucket.lock_unpoisoned();
        let (credit, at) = *b;
        let earned = mono.saturating_sub(at).max(0).saturating_mul(ANSWERS_PER_S);
        let credit = credit.saturating_add(earned).min(BURST * 1_000_000_000);
        if credit < 1_000_000_000 {
            *b = (credit, mono);
            return Err(PollError::Rate);
        }
        *b = (credit - 1_000_000_000, mono);
        Ok(())
    }
}

/// The collector's refusal counter's reasons, as its signed HTTP requests use them.
fn refusal_label(e: &PollError) -> &'static str {
    match e {
        PollError::Shape => "malformed",
        PollError::WrongNode(_) | PollError::Signature => "forged",
        PollError::Replay => "replayed",
        PollError::Rate => "rate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::diagnose::Diagnosis;
    use crate::link::{UdpCounts, UdpOutcome, UdpPoll, UdpPolled};
    use crate::node::NodeConfig;
    use crate::report::{Envelope, Key, VerifyRules, now_ns};
    use maintd_core::verdict::Verdict;
    use std::time::Duration;

    fn refused(c: &Collector, reason: &'static str) -> u64 {
        c.refused.get_or_create(&RefusalLabel { reason }).get()
    }

    /// A collector answering polls on a real UDP socket, as its heartbeat socket does.
    async fn serving(key: &Key, details: &str) -> (Arc<Collector>, NodeConfig, tempfile::TempDir) {
        let (c, state) = crate::collector::tests::collector(key);
        let verdict = format!(r#"{{"status":"evacuate","details":{details}}}"#);
        c.set_diagnosis(Diagnosis {
            verdict: Verdict::parse_bytes(verdict.as_bytes()).unwrap(),
            error: None,
            at: now_ns(),
        });
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let node = NodeConfig {
            name: "n1".into(),
            collector: udp.local_addr().unwrap().to_string(),
        };
        let answers = PollAnswers::new(c.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                if let Some(a) = answers.answer(&buf[..n], crate::clock::mono_ns()) {
                    udp.send_to(&a, from).await.unwrap();
                }
            }
        });
        (c, node, state)
    }

    fn outcome(counts: &UdpCounts, outcome: &'static str) -> u64 {
        counts.get_or_create(&UdpOutcome { outcome }).get()
    }

    #[tokio::test]
    async fn a_signed_poll_brings_back_a_report_that_verifies() {
        let key = Key::from_bytes(vec![3; 32]);
        let (_c, node, _state) = serving(&key, r#"{"disk":"sda"}"#).await;
        let counts = UdpCounts::default();
        let udp = UdpPoll::bind(
            crate::report::keyring::Keyring::arc(key.clone()),
            Duration::from_secs(5),
            counts.clone(),
        )
        .unwrap();
        let rules = VerifyRules { max_bytes: 1 << 20 };
        let mut last = None;
        let mut nonces = std::collections::BTreeSet::new();
        for _ in 0..3 {
            let UdpPolled::Report { nonce, body } = udp.ask(&node).await else {
                panic!("no report over UDP");
            };
            // Each report answers its own request, and no other.
            assert!(nonces.insert(nonce));
            assert!(Envelope::verify(&body, &key, "n1", last, nonce ^ 1, rules).is_err());
            let r = Envelope::verify(&body, &key, "n1", last, nonce, rules).unwrap();
            assert!(r.envelope.data.as_str().contains("sda"));
            last = Some(r.envelope.seq);
        }
        assert_eq!(outcome(&counts, "answered"), 3);
    }

    #[tokio::test]
    async fn a_report_too_large_for_a_datagram_is_asked_over_http() {
        let key = Key::from_bytes(vec![3; 32]);
        let big = format!(r#"{{"log":"{}"}}"#, "x".repeat(poll::MAX_REPORT));
        let (_c, node, _state) = serving(&key, &big).await;
        let counts = UdpCounts::default();
        let udp = UdpPoll::bind(
            crate::report::keyring::Keyring::arc(key),
            Duration::from_secs(5),
            counts.clone(),
        )
        .unwrap();
        assert_eq!(udp.ask(&node).await, UdpPolled::Http);
        assert_eq!(outcome(&counts, "ask-http"), 1);
    }

    #[tokio::test]
    async fn forged_replayed_flooding_and_foreign_requests_get_no_answer_and_are_counted() {
        let key = Key::from_bytes(vec![3; 32]);
        let (c, node, _state) = serving(&key, "{}").await;
        let a = PollAnswers::new(c.clone());
        let (now, mono) = (now_ns(), crate::clock::mono_ns());
        let genuine = poll::request(&key, "n1", 7, now);
        assert!(a.answer(&genuine, mono).is_some());
        assert!(a.answer(&genuine, mono).is_none(), "a copy played back");
        assert_eq!(refused(&c, "replayed"), 1);
        let other_key = Key::from_bytes(vec![4; 32]);
        assert!(
            a.answer(&poll::request(&other_key, "n1", 8, now), mono)
                .is_none()
        );
        assert!(a.answer(&poll::request(&key, "n2", 9, now), mono).is_none());
        assert_eq!(refused(&c, "forged"), 2);
        // A daemon whose clock is two minutes off is answered: nothing here compares clocks.
        let old = now - 120 * 1_000_000_000;
        assert!(
            a.answer(&poll::request(&key, "n1", 10, old), mono)
                .is_some()
        );
        // A copy played back once the window has passed is answered again, but no faster than
        // the rate a daemon and its standbys poll at: a burst, then one per 1/16 s.
        let later = mono + 61 * 1_000_000_000;
        assert!(
            a.answer(&genuine, later).is_some(),
            "forgotten after the window"
        );
        let burst = (100..200)
            .filter(|n| {
                a.answer(&poll::request(&key, "n1", *n, now), later)
                    .is_some()
            })
            .count();
        assert_eq!(burst, 31, "the rest of the burst");
        assert_eq!(refused(&c, "rate"), 69);
        let next = later + 1_000_000_000 / 16;
        assert!(
            a.answer(&poll::request(&key, "n1", 300, now), next)
                .is_some()
        );
        assert!(
            a.answer(&poll::request(&key, "n1", 301, now), next)
                .is_none()
        );
        assert!(a.answer(b"MDP1 not a request", mono).is_none());
        assert_eq!(refused(&c, "malformed"), 1);
        // Over the wire: a collector that answers nothing leaves the poll to HTTP.
        let key_elsewhere = Key::from_bytes(vec![5; 32]);
        let counts = UdpCounts::default();
        let udp = UdpPoll::bind(
            crate::report::keyring::Keyring::arc(key_elsewhere),
            Duration::from_millis(300),
            counts.clone(),
        )
        .unwrap();
        assert_eq!(udp.ask(&node).await, UdpPolled::Http);
        assert_eq!(outcome(&counts, "no-answer"), 1);
        // Then it is asked over HTTP only for a while.
        assert_eq!(udp.ask(&node).await, UdpPolled::Http);
        assert_eq!(outcome(&counts, "http-only"), 1);
    }

    #[tokio::test]
    async fn one_exchange_asks_the_whole_fleet_in_waves_and_keeps_each_answer_in_its_place() {
        let key = Key::from_bytes(vec![3; 32]);
        let mut serving_now = Vec::new();
        let mut answering = Vec::new();
        for k in 0..6 {
            let (c, node, state) = serving(&key, &format!(r#"{{"disk":"sd{k}"}}"#)).await;
            answering.push(node);
            serving_now.push((c, state));
        }
        let big = format!(r#"{{"log":"{}"}}"#, "x".repeat(poll::MAX_REPORT));
        let (_b, too_big, _sb) = serving(&key, &big).await;
        // Bound, never answering: a collector that is down.
        let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent = NodeConfig {
            name: "n9".into(),
            collector: mute.local_addr().unwrap().to_string(),
        };
        // Eight times as many nodes as requests in flight, so the exchange goes in waves.
        let mut nodes: Vec<NodeConfig> = (0..64).map(|i| answering[i % 6].clone()).collect();
        nodes[3] = silent;
        nodes[40] = too_big;
        let counts = UdpCounts::default();
        let udp = UdpPoll::bind(
            crate::report::keyring::Keyring::arc(key.clone()),
            Duration::from_secs(2),
            counts.clone(),
        )
        .unwrap()
        .with_in_flight(8);
        let polled = udp.ask_all(Arc::new(nodes.clone())).await;
        assert_eq!(polled.len(), nodes.len());
        for (i, p) in polled.iter().enumerate() {
            match i {
                3 | 40 => assert_eq!(*p, UdpPolled::Http, "node {i}"),
                _ => assert!(matches!(p, UdpPolled::Report { .. }), "node {i}: {p:?}"),
            }
        }
        assert_eq!(outcome(&counts, "answered"), 62);
        assert_eq!(outcome(&counts, "no-answer"), 1);
        assert_eq!(outcome(&counts, "ask-http"), 1);
        // Each answer is the report of the collector that node names, and no report is
        // handed to two nodes.
        let rules = VerifyRules { max_bytes: 1 << 20 };
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in polled.iter().enumerate() {
            if let UdpPolled::Report { nonce, body } = p {
                let r = Envelope::verify(body, &key, "n1", None, *nonce, rules).unwrap();
                let k = answering
                    .iter()
                    .position(|a| a.collector == nodes[i].collector);
                let own = format!("sd{}", k.unwrap());
                assert!(r.envelope.data.as_str().contains(&own), "node {i}");
                assert!(
                    seen.insert((&nodes[i].collector, r.envelope.seq)),
                    "node {i}"
                );
            }
        }
        // The next cycle asks the silent node over HTTP only, and the rest over UDP again.
        let polled = udp.ask_all(Arc::new(nodes)).await;
        assert_eq!(polled[3], UdpPolled::Http);
        assert_eq!(outcome(&counts, "http-only"), 1);
        assert_eq!(outcome(&counts, "answered"), 2 * 62);
    }

    #[tokio::test]
    async fn answers_no_request_waits_for_are_dropped_and_counted() {
        let key = Key::from_bytes(vec![3; 32]);
        let counts = UdpCounts::default();
        let udp = UdpPoll::bind(
            crate::report::keyring::Keyring::arc(key),
            Duration::from_millis(300),
            counts.clone(),
        )
        .unwrap();
        // A peer that answers with another nonce (a late copy, or a guess).
        let peer = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let node = NodeConfig {
            name: "n1".into(),
            collector: peer.local_addr().unwrap().to_string(),
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok((_, from)) = peer.recv_from(&mut buf).await {
                peer.send_to(&poll::answer(12345, Some(b"{}")), from)
                    .await
                    .unwrap();
            }
        });
        assert_eq!(udp.ask(&node).await, UdpPolled::Http);
        assert_eq!(outcome(&counts, "stray"), 1);
    }
}
