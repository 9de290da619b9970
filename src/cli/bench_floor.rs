//! The CPU one datagram each way costs on this machine, measured beside the poll: the floor
//! that the poll's CPU per node is read against, since this machine's speed varies by day.

use std::net::UdpSocket;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

use crate::link::{UdpPoll, UdpPolled};
use crate::node::NodeConfig;
use crate::report::Key;

/// Exchanges measured: enough that the figure holds still from run to run.
const EXCHANGES: usize = 20_000;

/// The floor for polling `node`: its poll request's size out and its answer's size back (asked
/// once over `udp`; a typical report's size when the poll goes over HTTP). `None`, with the
/// reason printed, when loopback lost a datagram.
pub async fn floor_us(key: &Key, udp: Option<&UdpPoll>, node: &NodeConfig) -> Option<f64> {
    let request = crate::report::poll::request(key, &node.name, 1, 0).len();
    let answer = match udp {
        Some(u) => match u.ask(node).await {
            // The answer's header: its magic and nonce.
            UdpPolled::Report { body, .. } => body.len() + 12,
            UdpPolled::Http => TYPICAL_ANSWER,
        },
        None => TYPICAL_ANSWER,
    };
    let measured = tokio::task::spawn_blocking(move || udp_exchange_us(request, answer, EXCHANGES))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    measured
        .inspect_err(|e| eprintln!("the floor was not measured: {e}"))
        .ok()
}

/// About the size of a simulated collector's answer, in bytes.
const TYPICAL_ANSWER: usize = 600;

/// Requests sent before their answers are read, as the poll sends a wave. Small enough that a
/// wave of answers fits the default receive buffer (each datagram takes about 2 KiB of it).
const WAVE: usize = 64;

/// CPU seconds, user and system, of the process (`RUSAGE_SELF`) or the calling thread
/// (`RUSAGE_THREAD`).
pub fn cpu_seconds_of(who: UsageWho) -> f64 {
    getrusage(who)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

/// Microseconds of the asking thread's CPU per exchange: `request` bytes sent, `answer` bytes
/// read back from a thread that answers on loopback (whose CPU stands for the collector's and
/// is not counted). Blocking: run it off the runtime.
pub fn udp_exchange_us(request: usize, answer: usize, exchanges: usize) -> std::io::Result<f64> {
    let asker = UdpSocket::bind("127.0.0.1:0")?;
    let answerer = UdpSocket::bind("127.0.0.1:0")?;
    let to = answerer.local_addr()?;
    // A lost datagram ends the measurement with an error instead of a hang.
    asker.set_read_timeout(Some(Duration::from_secs(5)))?;
    let answers = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; 2048];
        let reply = vec![b'r'; answer];
        loop {
            let (n, from) = answerer.recv_from(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            answerer.send_to(&reply, from)?;
        }
    });
    let ask = vec![b'q'; request.max(1)];
    let mut buf = vec![0u8; 2048];
    let waves = exchanges.div_ceil(WAVE).max(1);
    let start = cpu_seconds_of(UsageWho::RUSAGE_THREAD);
    let mut measured = Ok(());
    'waves: for _ in 0..waves {
        for _ in 0..WAVE {
            if let Err(e) = asker.send_to(&ask, to) {
                measured = Err(e);
                break 'waves;
            }
        }
        for _ in 0..WAVE {
            if let Err(e) = asker.recv_from(&mut buf) {
                measured = Err(e);
                break 'waves;
            }
        }
    }
    let cpu = cpu_seconds_of(UsageWho::RUSAGE_THREAD) - start;
    // The empty datagram stops the answering thread.
    asker.send_to(&[], to)?;
    answers
        .join()
        .map_err(|_| std::io::Error::other("the answering thread panicked"))??;
    measured?;
    Ok(cpu / (waves * WAVE) as f64 * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exchange_is_answered_and_costs_some_cpu() {
        let us = udp_exchange_us(100, 600, 2 * WAVE).unwrap();
        assert!(us > 0.0 && us.is_finite(), "{us}");
    }
}
