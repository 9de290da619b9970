//! A connection's stream that notes when the next request head begins, so the governor times
//! a head from its first byte and an idle kept-alive connection by the idle timeout.

use super::*;

/// The connection's stream, noting the first byte of each request head that arrives while it
/// is idle (from then on the header timeout applies, not the idle timeout).
pub(super) struct Watched {
    pub(super) inner: tokio::net::TcpStream,
    pub(super) conn: Arc<Conn>,
    pub(super) base: Instant,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let c = &self.conn;
        if buf.filled().len() > before
            && c.busy.load(Ordering::Relaxed) == 0
            && !c.reading.swap(true, Ordering::Relaxed)
        {
            c.touch(self.base);
            c.moved.notify_one();
        }
        r
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
