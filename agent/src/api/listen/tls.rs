//! The TLS side of a connection: what its first bytes are, the handshake, and Go's
//! answer to a client that speaks plain HTTP to the TLS port.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::deadline::WriteDeadline;

/// What exporter-toolkit (Go's net/http) answers plain HTTP on a TLS port, before it
/// closes the connection.
pub const PLAIN_HTTP_ANSWER: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// The stream of a connection that completed its handshake.
pub type Tls = tokio_rustls::server::TlsStream<WriteDeadline<TcpStream>>;

/// Why a connection to the TLS port did not become a TLS one.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the client closed the connection before its handshake")]
    Closed,
    #[error("the client sent an HTTP request to the TLS port (answered 400)")]
    PlainHttp,
    #[error("TLS handshake: {0}")]
    Handshake(std::io::Error),
    #[error("reading from the client: {0}")]
    Io(std::io::Error),
}

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// A TLS record (a handshake starts with 0x16), or something that is no HTTP
    /// either: the handshake tells the client why it fails.
    Tls,
    /// A request line (`GET /`: a method is upper-case letters).
    PlainHttp,
}

/// Tells plain HTTP from TLS by the first byte a client sent.
pub fn classify(first: &[u8]) -> FirstBytes {
    match first.first() {
        Some(b) if b.is_ascii_uppercase() => FirstBytes::PlainHttp,
        _ => FirstBytes::Tls,
    }
}

/// The handshake of `stream` under `config`, or Go's 400 to a client that speaks plain
/// HTTP. The caller bounds the time it takes.
pub async fn accept(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    write_timeout: Duration,
) -> Result<Tls, Refusal> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await.map_err(Refusal::Io)?;
    if n == 0 {
        return Err(Refusal::Closed);
    }
    if classify(&first[..n]) == FirstBytes::PlainHttp {
        answer_plain_http(stream).await;
        return Err(Refusal::PlainHttp);
    }
    tokio_rustls::TlsAcceptor::from(config)
        .accept(WriteDeadline::new(stream, write_timeout))
        .await
        .map_err(Refusal::Handshake)
}

/// Bytes of a request read (and dropped) before and after the answer.
const DRAIN_BYTES: usize = 64 * 1024;
/// How long the client has to close after the answer.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Writes [`PLAIN_HTTP_ANSWER`] and closes. The request is read first, and what follows
/// until the client closes (a second at most): closing a socket with unread bytes
/// would reset the connection, which can destroy the answer before the client reads it.
async fn answer_plain_http(mut stream: TcpStream) {
    let mut sink = vec![0u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_BYTES {
        match stream.try_read(&mut sink) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(_) => break, // nothing more now (WouldBlock), or gone
        }
    }
    let mut answer = PLAIN_HTTP_ANSWER;
    while !answer.is_empty() {
        if stream.writable().await.is_err() {
            return;
        }
        match stream.try_write(answer) {
            Ok(n) => answer = &answer[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
    let shutdown = std::future::poll_fn(|cx| {
        tokio::io::AsyncWrite::poll_shutdown(std::pin::Pin::new(&mut stream), cx)
    });
    if shutdown.await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while drained < DRAIN_BYTES {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut sink) {
                Ok(0) => return,
                Ok(n) => drained += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_is_plain_http_and_a_handshake_is_tls() {
        assert_eq!(classify(b"GET / HTTP/1.1"), FirstBytes::PlainHttp);
        assert_eq!(classify(b"P"), FirstBytes::PlainHttp);
        assert_eq!(classify(&[0x16, 0x03, 0x01]), FirstBytes::Tls);
        // Neither: the handshake refuses it with its own reason.
        assert_eq!(classify(b"\x00\x01"), FirstBytes::Tls);
        assert_eq!(classify(b"get / http/1.1"), FirstBytes::Tls);
    }
}
