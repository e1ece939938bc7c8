//! The client of the agent's HTTP API: `roce-agent flows`, `events` and `top` read a
//! running agent with it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::doc::event::{Event, EventKind};

/// Why a request to a running agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{addr} is not a HOST:PORT address: {error}")]
    Resolve { addr: String, error: std::io::Error },
    #[error("no roce-agent answers at {addr} ({error}); is `roce-agent run` running, listening there (--listen, default 127.0.0.1:9473)?")]
    Connect { addr: String, error: std::io::Error },
    #[error("reading the answer from {addr}: {error}")]
    Io { addr: String, error: std::io::Error },
    #[error("{addr} answered {path} with HTTP status {status}: {body}")]
    Status {
        addr: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("{addr} did not answer with HTTP: {detail}")]
    Malformed { addr: String, detail: String },
}

/// Connects to `addr` and sends `GET path` (HTTP/1.0, the connection closes after the
/// answer): the stream to read the answer from, with `timeout` on every read.
pub fn send_request(addr: &str, path: &str, timeout: Duration) -> Result<TcpStream, ClientError> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|error| ClientError::Resolve {
            addr: addr.to_string(),
            error,
        })?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    let mut stream = None;
    for t in &targets {
        match TcpStream::connect_timeout(t, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| ClientError::Connect {
        addr: addr.to_string(),
        error: last,
    })?;
    let io = |error| ClientError::Io {
        addr: addr.to_string(),
        error,
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    Ok(stream)
}

/// Largest answer accepted (a full 16M-entry table is far below this).
const MAX_RESPONSE: u64 = 1 << 32;

/// `GET path` from `addr` (`HOST:PORT`), returning the body of a 200 answer.
/// Plain HTTP/1.0, one request per connection.
pub fn get_body(addr: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
    let stream = send_request(addr, path, timeout)?;
    let io = |error| ClientError::Io {
        addr: addr.to_string(),
        error,
    };
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .map_err(io)?;
    let (status, body) = parse_response(&raw).map_err(|detail| ClientError::Malformed {
        addr: addr.to_string(),
        detail,
    })?;
    if status != 200 {
        return Err(ClientError::Status {
            addr: addr.to_string(),
            path: path.to_string(),
            status,
            body: String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(200)
                .collect(),
        });
    }
    Ok(body)
}

/// Splits a whole HTTP/1.x response into its status and (de-chunked) body.
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no complete header")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "the header is not text")?;
    let body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unexpected status line {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("unexpected status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        }
    }
    if chunked {
        return dechunk(body).map(|b| (status, b));
    }
    match length {
        Some(n) if n > body.len() => Err(format!(
            "the answer was cut short ({} of {n} bytes)",
            body.len()
        )),
        Some(n) => Ok((status, body[..n].to_vec())),
        None => Ok((status, body.to_vec())),
    }
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk size line is cut short")?;
        let size_text = std::str::from_utf8(&body[..eol]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            return Err("a chunk is cut short".to_string());
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// One line of `GET /events`: an event, or a note that events were lost.
#[derive(Debug)]
pub enum Line {
    Event(Box<Event>),
    /// The agent dropped this many events for this reader (it read too slowly).
    Lagged(u64),
}

/// Follows `GET /events` of the agent at `addr` until `duration` (None: until the agent
/// closes the stream) or until `each` returns false. Kinds are filtered by the agent.
pub fn follow(
    addr: &str,
    kinds: &[EventKind],
    duration: Option<Duration>,
    mut each: impl FnMut(Line) -> bool,
) -> Result<(), ClientError> {
    let path = if kinds.is_empty() {
        "/events".to_string()
    } else {
        format!(
            "/events?kind={}",
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
        )
    };
    // Short reads, so that --duration ends on time even when nothing arrives.
    let stream = send_request(addr, &path, Duration::from_millis(200))?;
    let io = |error| ClientError::Io {
        addr: addr.to_string(),
        error,
    };
    let malformed = |detail: String| ClientError::Malformed {
        addr: addr.to_string(),
        detail,
    };
    let deadline = duration.map(|d| Instant::now() + d);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut in_headers = true;
    let mut status_seen = false;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(());
        }
        match reader.read_line(&mut line) {
            Ok(0) => {
                return if status_seen {
                    Ok(())
                } else {
                    Err(malformed("the connection closed before an answer".into()))
                }
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                // A partial line stays in `line` and is completed by the next read.
                continue;
            }
            Err(e) => return Err(io(e)),
        }
        if !line.ends_with('\n') {
            continue;
        }
        let text = line.trim_end().to_string();
        line.clear();
        if !status_seen {
            let code: u16 = text
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| malformed(format!("not an HTTP status line: {text:?}")))?;
            if code != 200 {
                let mut body = String::new();
                let _ = std::io::Read::read_to_string(&mut reader, &mut body);
                let body = body
                    .rsplit("\r\n\r\n")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                return Err(ClientError::Status {
                    addr: addr.to_string(),
                    path,
                    status: code,
                    body,
                });
            }
            status_seen = true;
            continue;
        }
        if in_headers {
            if text.is_empty() {
                in_headers = false;
            }
            continue;
        }
        if text.is_empty() {
            continue;
        }
        let parsed = if let Ok(ev) = serde_json::from_str::<Event>(&text) {
            Line::Event(Box::new(ev))
        } else if let Some(n) = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("lagged").and_then(serde_json::Value::as_u64))
        {
            Line::Lagged(n)
        } else {
            return Err(malformed(format!(
                "not an event line: {}",
                text.chars().take(200).collect::<String>()
            )));
        };
        if !each(parsed) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_answers() {
        let raw =
            b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(raw).unwrap(), (200, b"{}".to_vec()));
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap(), (200, b"abcde".to_vec()));
        let raw = b"HTTP/1.1 404 Not Found\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap().0, 404);
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_response(b"HTTP/1.0 200 OK\r\ncontent-length: 9\r\n\r\n{}").is_err());
    }

    #[test]
    fn nothing_listening_is_a_clear_error() {
        // Bind then drop to find a port that is (almost certainly) closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = get_body(
            &format!("127.0.0.1:{port}"),
            "/flows",
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("no roce-agent answers at 127.0.0.1:"),
            "{e}"
        );
    }
}
