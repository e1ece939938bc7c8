//! A connection whose writes must make progress: hyper has no write timeout, so a
//! client that stops reading (an `/events` follower gone to sleep, its buffers full)
//! would hold its connection and task for ever. [`WriteDeadline`] fails a write that
//! has waited `timeout` for the socket, which ends the connection.

use std::future::Future as _;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What a write that timed out fails with, inside an [`std::io::ErrorKind::TimedOut`].
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing of the response")]
pub struct Stalled;

/// `inner`, whose writes fail once one has waited `timeout` without progress.
#[derive(Debug)]
pub struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    /// Running while a write waits (armed at its first Pending); None otherwise.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, timeout: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            timeout,
            waiting: None,
        }
    }

    /// `result` of a write, flush or shutdown: progress disarms the deadline; a wait
    /// arms it (once) and fails when it has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if result.is_ready() {
            self.waiting = None;
            return result;
        }
        let timeout = self.timeout;
        let sleep = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.waiting = None;
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    Stalled,
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, result)
    }
}

/// Whether `error` (or one of its sources) is a write that timed out here.
pub fn is_stalled(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if e.is::<Stalled>() || inner.is_some_and(|i| i.is::<Stalled>()) {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// A connected pair of loopback sockets: (client, server).
    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    async fn write(
        s: &mut WriteDeadline<tokio::net::TcpStream>,
        buf: &[u8],
    ) -> std::io::Result<usize> {
        poll_fn(|cx| Pin::new(&mut *s).poll_write(cx, buf)).await
    }

    #[tokio::test]
    async fn a_write_the_client_never_takes_fails_after_the_timeout() {
        let (_client, server) = pair().await;
        let mut s = WriteDeadline::new(server, Duration::from_millis(300));
        let chunk = vec![b'x'; 64 * 1024];
        let start = std::time::Instant::now();
        let e = loop {
            match write(&mut s, &chunk).await {
                Ok(_) => assert!(start.elapsed() < Duration::from_secs(10), "never filled"),
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(is_stalled(&e), "{e}");
        assert!(start.elapsed() >= Duration::from_millis(300));
        // As hyper returns it: its own error, the I/O error its source.
        #[derive(Debug, thiserror::Error)]
        #[error("connection error")]
        struct Wrapper(#[source] std::io::Error);
        assert!(is_stalled(&Wrapper(e)));
        assert!(!is_stalled(&std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "something else"
        )));
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_taking_is_not_cut() {
        let (client, server) = pair().await;
        let mut s = WriteDeadline::new(server, Duration::from_millis(300));
        // Pauses between reads, each shorter than the timeout; drains what is there.
        let reader = tokio::spawn(async move {
            let mut total = 0usize;
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                client.readable().await.unwrap();
                loop {
                    match client.try_read(&mut buf) {
                        Ok(0) => return total,
                        Ok(n) => total += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        });
        let chunk = vec![b'x'; 256 * 1024];
        // Writing for longer than the timeout in all.
        let start = std::time::Instant::now();
        let mut sent = 0;
        while start.elapsed() < Duration::from_millis(900) {
            sent += write(&mut s, &chunk).await.unwrap();
        }
        poll_fn(|cx| Pin::new(&mut s).poll_shutdown(cx))
            .await
            .unwrap();
        assert_eq!(reader.await.unwrap(), sent);
    }
}
