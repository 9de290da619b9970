//! Hostile clients without the key, shared by tests/it/hostile.rs and benches/attack.rs: raw TCP
//! on 127.0.0.1, bounded in count and time.

use std::time::Duration;

use maintd::report::{SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub async fn connect(port: u16) -> Option<TcpStream> {
    tokio::time::timeout(
        Duration::from_secs(2),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .ok()?
    .ok()
}

/// Sends `head`, then up to `body` bytes of filler, and returns the status code if an answer
/// came within 5 s.
pub async fn raw_request(port: u16, head: String, body: usize) -> Option<u16> {
    let mut s = connect(port).await?;
    s.write_all(head.as_bytes()).await.ok()?;
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < body {
        let n = chunk.len().min(body - sent);
        if s.write_all(&chunk[..n]).await.is_err() {
            break;
        }
        sent += n;
    }
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// `n` unsigned POSTs of ~960 KiB, two thirds to the collector's `/1/repair`, one third to the
/// daemon's cancel; returns the status codes that came back.
pub async fn big_unsigned_posts(collector: u16, daemon: u16, n: usize) -> Vec<Option<u16>> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (p, path) = if i % 3 == 0 {
            (daemon, "/1/events/x/cancel")
        } else {
            (collector, "/1/repair")
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 983040\r\n\r\n"
        );
        tasks.spawn(raw_request(p, head, 983_040));
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.unwrap_or(None));
    }
    out
}

/// Opens `n` connections that send half a request head and then hang.
pub async fn slow_headers(port: u16, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::new();
    for _ in 0..n {
        if let Some(mut s) = connect(port).await {
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
            v.push(s);
        }
    }
    v
}

/// One more byte on every slow connection (the server may have closed some).
pub async fn trickle(conns: &mut [TcpStream]) {
    for s in conns {
        let _ = s.write_all(b"X").await;
    }
}

/// Opens `n` connections that send nothing.
pub async fn idle(port: u16, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::new();
    for _ in 0..n {
        if let Some(s) = connect(port).await {
            v.push(s);
        }
    }
    v
}

/// A signed-looking head (fresh timestamp, a 64-hex-digit signature) for `path`.
pub fn signed_looking_head(path: &str, content_length: u64) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{TIMESTAMP_HEADER}: {}\r\n{SIGNATURE_HEADER}: {}\r\nContent-Length: {content_length}\r\n\r\n",
        now_ns(),
        "0".repeat(64)
    )
}
