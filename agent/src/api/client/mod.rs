//! The client of the agent's HTTP API: `roce-agent flows`, `events`, `top` and `qps`
//! read a running agent with it.
//!
//! HTTP/1.1 over [`ureq`]; HTTPS through rustls when the agent serves TLS (`run
//! --web-config-file`). Addresses are `HOST:PORT` (`127.0.0.1:9473`, `[::1]:9473`) or
//! `http://HOST:PORT` for plain HTTP, `https://HOST:PORT`, and `:PORT` for the agent on
//! this host (`127.0.0.1:PORT`; an agent listening on `:PORT` answers there too).
//! [`parse_address`] checks them, also as the clients' `--api` parser. No proxy from
//! the environment, no redirects: the answer of the agent at that address, or an error
//! that says what to do about it.
//!
//! A [`Client`] is one agent and how to reach it. Its parts:
//! - this file: the address, the requests (`GET` a body, follow `/events`) and
//!   [`ClientError`];
//! - [`tls`]: [`TlsFiles`], the CAs to trust (`--ca-file`, else the built-in web roots)
//!   and the client certificate of mutual TLS, read from PEM files; and what a failed
//!   handshake means;
//! - [`auth`]: basic-auth [`Credentials`] (`ROCE_AGENT_AUTH` or `--auth-file`), sent as
//!   an `Authorization` header.

mod auth;
mod tls;

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::doc::event::{Event, EventKind};

pub use auth::{Credentials, AUTH_ENV};
pub use tls::TlsFiles;

/// Why a request to a running agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not one (a usage error: see [`parse_address`]).
    #[error("{addr} is not an agent address: {message}")]
    Address { addr: String, message: String },
    /// Options that do not go together (a usage error), e.g. `--ca-file` with an
    /// http:// address.
    #[error("{0}")]
    Usage(String),
    /// A TLS file (`--ca-file`, `--cert-file`, `--key-file`) that cannot be read or is
    /// not what it should be (a usage error).
    #[error("{flag} {}: {message}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        message: String,
    },
    /// Credentials that are not `user:password`, or their file unreadable (a usage
    /// error). `origin` is `ROCE_AGENT_AUTH` or `--auth-file FILE`.
    #[error("{origin}: {message}")]
    Credentials { origin: String, message: String },
    /// A well-formed address whose host name has no address.
    #[error("cannot resolve {addr}: {error}")]
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
    /// 401: the agent asks for basic auth. `credentials` says where those sent came
    /// from (None: none were sent).
    #[error("the agent refused the request: 401 Unauthorized ({})", unauthorized_hint(.credentials.as_deref()))]
    Unauthorized {
        addr: String,
        credentials: Option<String>,
    },
    /// An http:// request to an agent that serves HTTPS (it answered as exporter-toolkit
    /// does: 400 "Client sent an HTTP request to an HTTPS server.").
    #[error("the agent serves HTTPS: use --api https://{authority}")]
    WantsHttps { addr: String, authority: String },
    /// An https:// request to an agent that serves plain HTTP (it answered the TLS
    /// hello with HTTP).
    #[error("the agent serves plain HTTP at {authority}: use --api http://{authority} (or give it a web config)")]
    WantsHttp { addr: String, authority: String },
    /// The agent's certificate is not signed by a CA this client trusts.
    #[error("the agent's certificate is not trusted ({reason}): pass its CA with --ca-file")]
    Untrusted { addr: String, reason: String },
    /// The agent's certificate does not name the host of the address.
    #[error("the certificate is not valid for {host}: {detail}")]
    WrongName {
        addr: String,
        host: String,
        detail: String,
    },
    /// The agent's certificate is out of its validity period.
    #[error(
        "the agent's certificate {when}: renew it (the agent's cert_file) or check the clocks"
    )]
    Expired { addr: String, when: String },
    /// The agent asks for a client certificate and none was given.
    #[error("the agent requires a client certificate: pass --cert-file and --key-file")]
    ClientCertRequired { addr: String },
    /// The agent refused the client certificate given.
    #[error("the agent refused the client certificate of --cert-file {} ({alert}): it must be signed by a CA of the agent's client_ca_file", cert_file.display())]
    ClientCertRefused {
        addr: String,
        cert_file: PathBuf,
        alert: String,
    },
    /// Another TLS failure, in rustls's words.
    #[error("the TLS handshake with {addr} failed: {detail}")]
    Tls { addr: String, detail: String },
}

impl ClientError {
    /// Whether the error is the user's to fix on the command line (exit 2): an address
    /// that is not one, options that do not go together, a bad file or credentials.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ClientError::Address { .. }
                | ClientError::Usage(_)
                | ClientError::File { .. }
                | ClientError::Credentials { .. }
        )
    }
}

/// What to do about a 401, given where the credentials sent came from.
fn unauthorized_hint(credentials: Option<&str>) -> String {
    match credentials {
        None => format!("set {AUTH_ENV}=user:password or --auth-file"),
        Some(origin) => format!("the credentials were refused: check {origin}"),
    }
}

/// Largest answer accepted (a full 16M-entry table is far below this).
const MAX_RESPONSE: u64 = 1 << 32;
/// How much of a non-200 answer's body is read (the error keeps its first 200 chars).
const MAX_ERROR_BODY: u64 = 64 * 1024;
/// Longest line of `GET /events` accepted (an event is well under 1 KiB).
const MAX_EVENT_LINE: u64 = 1 << 20;
/// What an agent serving HTTPS answers a plain HTTP request with (exporter-toolkit's,
/// that is Go's, words).
const HTTP_TO_HTTPS: &str = "Client sent an HTTP request to an HTTPS server";

/// `GET path` from the agent at `addr` over plain HTTP, or HTTPS trusting the built-in
/// web roots, without credentials: [`Client::get_body`] of [`Client::plain`].
pub fn get_body(addr: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
    Client::plain(addr)?.get_body(path, timeout)
}

/// An agent's address, checked: its scheme and `HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    tls: bool,
    /// `HOST:PORT` or `[IPV6]:PORT`.
    authority: String,
}

impl Endpoint {
    /// See [`parse_address`].
    fn parse(addr: &str) -> Result<Endpoint, String> {
        let scheme = |s: &str| {
            addr.get(..s.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(s))
        };
        let (tls, authority) = if scheme("https://") {
            (true, addr.get("https://".len()..).unwrap_or_default())
        } else if scheme("http://") {
            (false, addr.get("http://".len()..).unwrap_or_default())
        } else {
            (false, addr)
        };
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if let Some(port) = authority.strip_prefix(':') {
            if port.parse::<u16>().is_ok() {
                return Ok(Endpoint {
                    tls,
                    authority: format!("127.0.0.1:{port}"),
                });
            }
        }
        let well_formed = authority.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && port.parse::<u16>().is_ok()
                && !host.contains(['/', '?', '#', '@', ' '])
                // An IPv6 address is bracketed: [::1]:9473.
                && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')))
        });
        if !well_formed {
            return Err(format!(
                "{addr:?} is not HOST:PORT or https://HOST:PORT (e.g. 127.0.0.1:9473, [::1]:9473, https://agent1:9473, or :9473 for the agent on this host)"
            ));
        }
        Ok(Endpoint {
            tls,
            authority: authority.to_string(),
        })
    }

    /// The host, an IPv6 address without its brackets.
    fn host(&self) -> &str {
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The URL of `path` at this address.
    fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.authority)
    }
}

/// `HOST:PORT` for plain HTTP (as the clients always wrote it), `https://HOST:PORT`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tls {
            write!(f, "https://{}", self.authority)
        } else {
            f.write_str(&self.authority)
        }
    }
}

/// An agent's address as the clients take it (`--api`): `HOST:PORT`, `[IPV6]:PORT`,
/// `http://HOST:PORT`, `https://HOST:PORT`, or `:PORT` (also `https://:PORT`), the
/// agent on this host. Returns it as `HOST:PORT` for plain HTTP and
/// `https://HOST:PORT` for HTTPS (`:PORT` as `127.0.0.1:PORT`), or why it is not an
/// address. Only the form is checked: a name that does not resolve is
/// [`ClientError::Resolve`] when it is used.
pub fn parse_address(addr: &str) -> Result<String, String> {
    Endpoint::parse(addr).map(|e| e.to_string())
}

/// One running agent and how to reach it: its address, for https:// the TLS to speak
/// ([`TlsFiles`], read once when the client is made), and the credentials to send.
#[derive(Clone)]
pub struct Client {
    /// The address as given, for messages.
    addr: String,
    endpoint: Endpoint,
    files: TlsFiles,
    /// ureq's TLS configuration of `files`, for an https:// address.
    tls: Option<ureq::tls::TlsConfig>,
    credentials: Option<Credentials>,
}

/// Without the keys and certificates (the credentials hide their password).
impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.addr)
            .field("endpoint", &self.endpoint)
            .field("files", &self.files)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl Client {
    /// The client of the agent at `addr` (see [`parse_address`]): for https://, the CAs
    /// and the client certificate of `files` are read now; `credentials` go with
    /// every request. TLS files with an http:// address, or a certificate without its
    /// key, are [`ClientError::Usage`]; a file that is not what it should be,
    /// [`ClientError::File`].
    pub fn new(
        addr: &str,
        files: TlsFiles,
        credentials: Option<Credentials>,
    ) -> Result<Client, ClientError> {
        let endpoint = Endpoint::parse(addr).map_err(|message| ClientError::Address {
            addr: addr.to_string(),
            message,
        })?;
        let tls = if endpoint.tls {
            Some(files.load()?)
        } else if files.is_empty() {
            None
        } else {
            return Err(ClientError::Usage(format!(
                "--ca-file, --cert-file and --key-file are for an agent that serves HTTPS: use --api https://{}",
                endpoint.authority
            )));
        };
        Ok(Client {
            addr: addr.to_string(),
            endpoint,
            files,
            tls,
            credentials,
        })
    }

    /// The client of the agent at `addr` with no TLS files (an https:// agent is
    /// trusted by the built-in web roots) and no credentials.
    pub fn plain(addr: &str) -> Result<Client, ClientError> {
        Client::new(addr, TlsFiles::default(), None)
    }

    /// The agent's address as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `GET path`, returning the body of a 200 answer. `timeout` bounds the connect
    /// (with the TLS handshake) and every read and write (not the whole transfer: a
    /// large table may take longer, as long as it keeps coming).
    pub fn get_body(&self, path: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        let mut body = Vec::new();
        self.get_reader(path, timeout)?
            .read_to_end(&mut body)
            .map_err(|e| self.error(ureq::Error::from(e)))?;
        Ok(body)
    }

    /// `GET path`: the body of a 200 answer, read as it comes (at most 4 GiB), with
    /// the timeouts of [`Client::get_body`]. Its read errors carry [`ureq::Error`]s.
    pub fn get_reader(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<impl Read + Send + 'static, ClientError> {
        let response = self.request(path, timeout, timeout)?;
        Ok(response
            .into_body()
            .into_with_config()
            .limit(MAX_RESPONSE)
            .reader())
    }

    /// Sends `GET path` and waits for the answer's head: the answer when it is 200,
    /// else what the status means ([`ClientError::Unauthorized`],
    /// [`ClientError::WantsHttps`], or [`ClientError::Status`] with the start of the
    /// body).
    fn request(
        &self,
        path: &str,
        connect: Duration,
        per_read: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, ClientError> {
        let mut config = ureq::Agent::config_builder()
            .proxy(None)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .http_status_as_error(false)
            .user_agent(concat!("roce-agent/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(connect))
            .timeout_per_read(Some(per_read))
            .timeout_per_write(Some(connect));
        if let Some(tls) = &self.tls {
            config = config.tls_config(tls.clone());
        }
        let agent = config.build().new_agent();
        let mut request = agent.get(self.endpoint.url(path));
        if let Some(credentials) = &self.credentials {
            request = request.header("authorization", credentials.header());
        }
        // ureq's error does not tell a failed name lookup from other I/O errors: the
        // name is looked up again only when the request failed.
        let response = request
            .call()
            .map_err(|e| self.resolves().err().unwrap_or_else(|| self.error(e)))?;
        let status = response.status().as_u16();
        if status == 200 {
            return Ok(response);
        }
        if status == 401 {
            return Err(ClientError::Unauthorized {
                addr: self.addr.clone(),
                credentials: self.credentials.as_ref().map(|c| c.origin().to_string()),
            });
        }
        // The reason is a courtesy: whatever arrives of it in time.
        let mut body = Vec::new();
        let _ = response
            .into_body()
            .into_reader()
            .take(MAX_ERROR_BODY)
            .read_to_end(&mut body);
        let body = String::from_utf8_lossy(&body);
        if status == 400 && !self.endpoint.tls && body.contains(HTTP_TO_HTTPS) {
            return Err(ClientError::WantsHttps {
                addr: self.addr.clone(),
                authority: self.endpoint.authority.clone(),
            });
        }
        Err(ClientError::Status {
            addr: self.addr.clone(),
            path: path.to_string(),
            status,
            body: body.trim().chars().take(200).collect(),
        })
    }

    /// Checks, after a failed request, that the host has an address: a failed name
    /// lookup is [`ClientError::Resolve`], which ureq's error does not tell apart.
    fn resolves(&self) -> Result<(), ClientError> {
        if self.endpoint.host().parse::<std::net::IpAddr>().is_ok() {
            return Ok(());
        }
        std::net::ToSocketAddrs::to_socket_addrs(self.endpoint.authority.as_str())
            .map(drop)
            .map_err(|error| ClientError::Resolve {
                addr: self.addr.clone(),
                error,
            })
    }

    /// A failed request, in the terms of [`ClientError`].
    fn error(&self, e: ureq::Error) -> ClientError {
        use std::io::{Error as IoError, ErrorKind};
        if let Some(tls) = tls::rustls_error(&e) {
            return tls::explain(self, tls);
        }
        let addr = self.addr.clone();
        match e {
            ureq::Error::Io(error) => match error.kind() {
                ErrorKind::ConnectionRefused
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::NetworkDown
                | ErrorKind::AddrNotAvailable => ClientError::Connect { addr, error },
                ErrorKind::UnexpectedEof => ClientError::Malformed {
                    addr,
                    detail: "the connection closed before the answer was complete".into(),
                },
                _ => ClientError::Io { addr, error },
            },
            ureq::Error::Timeout(ureq::Timeout::Connect) => ClientError::Connect {
                addr,
                error: IoError::new(ErrorKind::TimedOut, "connecting timed out"),
            },
            ureq::Error::Timeout(_) => ClientError::Io {
                addr,
                error: IoError::new(ErrorKind::TimedOut, "timed out"),
            },
            ureq::Error::HostNotFound => ClientError::Resolve {
                addr,
                error: IoError::new(ErrorKind::NotFound, "no such host"),
            },
            ureq::Error::BadUri(message) => ClientError::Address { addr, message },
            ureq::Error::Http(e) => ClientError::Address {
                addr,
                message: e.to_string(),
            },
            ureq::Error::BodyExceedsLimit(limit) => ClientError::Malformed {
                addr,
                detail: format!("the answer is larger than {limit} bytes"),
            },
            e @ (ureq::Error::Protocol(_) | ureq::Error::LargeResponseHeader(..)) => {
                ClientError::Malformed {
                    addr,
                    detail: e.to_string(),
                }
            }
            ureq::Error::Tls(detail) => ClientError::Tls {
                addr,
                detail: detail.to_string(),
            },
            other => ClientError::Io {
                addr,
                error: IoError::other(other.to_string()),
            },
        }
    }

    /// Follows `GET /events` until `duration` (None: until the agent closes the
    /// stream) or until `each` returns false. Kinds are filtered by the agent.
    pub fn follow(
        &self,
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
        let started = Instant::now();
        let deadline = duration.map(|d| started + d);
        let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
        let timed_out = |e: &ClientError| matches!(e, ClientError::Io { error, .. } if error.kind() == std::io::ErrorKind::TimedOut);
        // Reads are short so that `duration` ends on time while events are idle; the
        // head of the answer may take longer (a busy agent): ask again until
        // FOLLOW_CONNECT.
        let response = loop {
            match self.request(&path, FOLLOW_CONNECT, FOLLOW_READ) {
                Ok(response) => break response,
                Err(e) if timed_out(&e) && past_deadline() => return Ok(()),
                Err(e) if timed_out(&e) && started.elapsed() < FOLLOW_CONNECT => continue,
                Err(e) => return Err(e),
            }
        };
        let malformed = |detail: String| ClientError::Malformed {
            addr: self.addr.clone(),
            detail,
        };
        let mut reader = BufReader::new(response.into_body().into_reader());
        let mut line = Vec::new();
        loop {
            if past_deadline() {
                return Ok(());
            }
            let room = MAX_EVENT_LINE.saturating_sub(line.len() as u64);
            match reader.by_ref().take(room).read_until(b'\n', &mut line) {
                // The agent closed the stream.
                Ok(0) if room > 0 => return Ok(()),
                Ok(_) => {}
                // A partial line stays in `line` and is completed by the next read.
                Err(e) => match ureq::Error::from(e) {
                    ureq::Error::Timeout(ureq::Timeout::PerRead) => continue,
                    // The agent stopped (a stream cut short ends as a closed one).
                    ureq::Error::Io(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::UnexpectedEof
                                | std::io::ErrorKind::ConnectionReset
                                | std::io::ErrorKind::ConnectionAborted
                        ) =>
                    {
                        return Ok(())
                    }
                    e => return Err(self.error(e)),
                },
            }
            if line.last() != Some(&b'\n') {
                if line.len() as u64 >= MAX_EVENT_LINE {
                    return Err(malformed(format!(
                        "an event line is longer than {MAX_EVENT_LINE} bytes"
                    )));
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line).trim().to_string();
            line.clear();
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
}

/// One line of `GET /events`: an event, or a note that events were lost.
#[derive(Debug)]
pub enum Line {
    Event(Box<Event>),
    /// The agent dropped this many events for this reader (it read too slowly).
    Lagged(u64),
}

/// How long each read of `GET /events` waits: how late `--duration` may end the stream
/// when nothing arrives.
const FOLLOW_READ: Duration = Duration::from_millis(200);
/// How long `follow` tries to connect, and to get the head of the answer.
const FOLLOW_CONNECT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::thread::{self, JoinHandle};

    /// A one-connection HTTP server: reads the request's head, writes each piece after
    /// its pause, holds the connection open for `linger`, closes it. Joins to the head.
    pub(super) fn serve(
        pieces: Vec<(Duration, Vec<u8>)>,
        linger: Duration,
    ) -> (String, JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                head.push(byte[0]);
            }
            for (pause, piece) in pieces {
                thread::sleep(pause);
                // The client may have gone (a --duration end): not the test's concern.
                if conn.write_all(&piece).is_err() {
                    break;
                }
            }
            thread::sleep(linger);
            String::from_utf8(head).unwrap()
        });
        (addr, server)
    }

    pub(super) fn answer(text: &str) -> Vec<(Duration, Vec<u8>)> {
        vec![(Duration::ZERO, text.as_bytes().to_vec())]
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn content_length_chunked_and_close_delimited_bodies() {
        let (addr, server) = serve(
            answer(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
            ),
            Duration::ZERO,
        );
        assert_eq!(get_body(&addr, "/flows", T).unwrap(), b"{}");
        let head = server.join().unwrap();
        assert!(head.starts_with("GET /flows HTTP/1.1\r\n"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains(&format!("host: {addr}")),
            "{head}"
        );

        // In pieces, with a chunk extension.
        let (addr, server) = serve(
            vec![
                (
                    Duration::ZERO,
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab".to_vec(),
                ),
                (
                    Duration::from_millis(50),
                    b"c\r\n2;x=y\r\nde\r\n0\r\n\r\n".to_vec(),
                ),
            ],
            Duration::ZERO,
        );
        let url = format!("http://{addr}");
        assert_eq!(get_body(&url, "/findings", T).unwrap(), b"abcde");
        server.join().unwrap();

        let (addr, server) = serve(
            answer("HTTP/1.0 200 OK\r\n\r\nuntil the end"),
            Duration::ZERO,
        );
        assert_eq!(get_body(&addr, "/metrics", T).unwrap(), b"until the end");
        server.join().unwrap();
    }

    #[test]
    fn an_answer_cut_short_is_malformed() {
        let (addr, server) = serve(
            answer("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{}"),
            Duration::ZERO,
        );
        let e = get_body(&addr, "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::Malformed { .. }), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn a_status_other_than_200_is_an_error_with_the_reason() {
        let (addr, server) = serve(
            answer("HTTP/1.1 404 Not Found\r\ncontent-length: 16\r\n\r\n  no such path\r\n"),
            Duration::ZERO,
        );
        let e = get_body(&addr, "/nope", T).unwrap_err();
        assert!(
            matches!(&e, ClientError::Status { status: 404, path, body, .. } if path == "/nope" && body == "no such path"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("{addr} answered /nope with HTTP status 404: no such path")
        );
        server.join().unwrap();

        // A long reason is cut to its first 200 characters; a redirect is not followed.
        let long = "x".repeat(1000);
        let (addr, server) = serve(
            answer(&format!(
                "HTTP/1.1 301 Moved\r\nlocation: http://192.0.2.1/\r\ncontent-length: {}\r\n\r\n{long}",
                long.len()
            )),
            Duration::ZERO,
        );
        let e = get_body(&addr, "/flows", T).unwrap_err();
        assert!(
            matches!(&e, ClientError::Status { status: 301, body, .. } if body.len() == 200),
            "{e:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn an_answer_that_is_not_http_is_malformed() {
        let (addr, server) = serve(
            answer("SSH-2.0-OpenSSH_9.6\r\n"),
            Duration::from_millis(500),
        );
        let e = get_body(&addr, "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::Malformed { .. }), "{e:?}");
        assert!(e.to_string().contains("did not answer with HTTP"), "{e}");
        server.join().unwrap();
    }

    /// The URL of `path` at `addr`, or why `addr` is not an address.
    fn url(addr: &str, path: &str) -> Result<String, ClientError> {
        Client::plain(addr).map(|c| c.endpoint.url(path))
    }

    #[test]
    fn addresses_are_host_port_http_or_https() {
        assert_eq!(
            url("127.0.0.1:9473", "/flows").unwrap(),
            "http://127.0.0.1:9473/flows"
        );
        assert_eq!(
            url("[::1]:9473", "/flows").unwrap(),
            "http://[::1]:9473/flows"
        );
        assert_eq!(url("HTTP://host:1/", "/e").unwrap(), "http://host:1/e");
        assert_eq!(url("HTTPS://host:1/", "/e").unwrap(), "https://host:1/e");
        // `:PORT` is the agent on this host.
        assert_eq!(
            url(":9473", "/flows").unwrap(),
            "http://127.0.0.1:9473/flows"
        );
        assert_eq!(parse_address("http://:1").as_deref(), Ok("127.0.0.1:1"));
        // Plain HTTP is written HOST:PORT, as it always was; HTTPS keeps its scheme.
        assert_eq!(
            parse_address("https://:1").as_deref(),
            Ok("https://127.0.0.1:1")
        );
        assert_eq!(
            parse_address("https://[::1]:9473/").as_deref(),
            Ok("https://[::1]:9473")
        );
        assert_eq!(Endpoint::parse("https://[::1]:9473").unwrap().host(), "::1");
        for bad in [
            "localhost",
            "9473",
            "::1",
            "host:port",
            ":port",
            ":70000",
            "host:1/x",
            "user@host:1",
            "https://",
            "https://host",
            "ftp://host:1",
        ] {
            let e = url(bad, "/flows").unwrap_err();
            assert!(matches!(e, ClientError::Address { .. }), "{bad}: {e}");
            assert!(e.is_usage(), "{bad}: {e}");
            assert!(parse_address(bad).is_err(), "{bad}");
        }
        // Well-formed, but no such host: not a usage error, a failed lookup.
        let e = get_body("nosuchhost.invalid:9473", "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::Resolve { .. }), "{e}");
        assert!(!e.is_usage(), "{e}");
        let e = get_body("https://nosuchhost.invalid:9473", "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::Resolve { .. }), "{e}");
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
            matches!(&e, ClientError::Connect { error, .. } if error.kind() == std::io::ErrorKind::ConnectionRefused),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("no roce-agent answers at 127.0.0.1:"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_server_times_out() {
        // Bound but never accepting: the connection is made, no answer comes.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let start = Instant::now();
        let e = get_body(&addr, "/flows", Duration::from_millis(200)).unwrap_err();
        assert!(
            matches!(&e, ClientError::Io { error, .. } if error.kind() == std::io::ErrorKind::TimedOut),
            "{e:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    fn event_line(psn: u32) -> String {
        let ev = Event {
            ts_ns: 1,
            ifname: "eth1".into(),
            direction: crate::doc::Direction::Ingress,
            kind: EventKind::Cnp,
            family: crate::doc::Family::Ipv4,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 4791,
            vni: None,
            inner_family: None,
            inner_src: None,
            inner_dst: None,
            dest_qp: 17,
            opcode: 0x81,
            psn,
            dscp: 48,
            ecn: "ect0".into(),
            inner_ecn: None,
            sample: 1,
            packet_len: 60,
            packet: String::new(),
            time_unix_ns: 0,
            rtt_us: None,
        };
        format!("{}\n", serde_json::to_string(&ev).unwrap())
    }

    /// An HTTP chunk of `text`.
    fn chunk(text: &str) -> Vec<u8> {
        format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
    }

    fn collect(
        addr: &str,
        kinds: &[EventKind],
        duration: Option<Duration>,
    ) -> Result<Vec<String>, ClientError> {
        let mut got = Vec::new();
        Client::plain(addr)?.follow(kinds, duration, |line| {
            got.push(match line {
                Line::Event(ev) => format!("event {}", ev.psn),
                Line::Lagged(n) => format!("lagged {n}"),
            });
            true
        })?;
        Ok(got)
    }

    #[test]
    fn events_stream_through_idle_pauses_and_lagged_lines() {
        let split = event_line(3);
        let (first_half, second_half) = split.split_at(40);
        let (addr, server) = serve(
            vec![
                (Duration::ZERO, b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n".to_vec()),
                (Duration::ZERO, chunk(&event_line(1))),
                (Duration::ZERO, chunk("{\"lagged\":7}\n")),
                // Idle for longer than a read waits, then a line in two pieces.
                (Duration::from_millis(700), chunk(first_half)),
                (Duration::from_millis(300), chunk(second_half)),
                (Duration::ZERO, b"0\r\n\r\n".to_vec()),
            ],
            Duration::ZERO,
        );
        let got = collect(&addr, &[EventKind::Cnp, EventKind::Ce], None).unwrap();
        assert_eq!(got, ["event 1", "lagged 7", "event 3"]);
        let head = server.join().unwrap();
        assert!(
            head.starts_with("GET /events?kind=cnp,ce HTTP/1.1\r\n"),
            "{head}"
        );
    }

    #[test]
    fn events_end_on_duration_while_idle_and_when_the_agent_stops() {
        let mut pieces = answer("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        pieces.push((Duration::ZERO, chunk(&event_line(1))));
        let (addr, _server) = serve(pieces.clone(), Duration::from_secs(5));
        let start = Instant::now();
        let got = collect(&addr, &[], Some(Duration::from_millis(500))).unwrap();
        let took = start.elapsed();
        assert_eq!(got, ["event 1"]);
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
            "{took:?}"
        );

        // The agent goes away mid-stream: the end of the stream, not an error.
        let (addr, server) = serve(pieces, Duration::from_millis(300));
        let got = collect(&addr, &[], None).unwrap();
        assert_eq!(got, ["event 1"]);
        server.join().unwrap();
    }

    #[test]
    fn events_errors_are_clear() {
        let (addr, server) = serve(
            answer(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 16\r\n\r\nevents are off\r\n",
            ),
            Duration::ZERO,
        );
        let e = collect(&addr, &[], None).unwrap_err();
        assert!(
            matches!(&e, ClientError::Status { status: 503, body, .. } if body == "events are off"),
            "{e:?}"
        );
        server.join().unwrap();

        let mut pieces = answer("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        pieces.push((Duration::ZERO, chunk("<html>\n")));
        let (addr, server) = serve(pieces, Duration::ZERO);
        let e = collect(&addr, &[], None).unwrap_err();
        assert!(e.to_string().contains("not an event line: <html>"), "{e}");
        server.join().unwrap();

        let (addr, server) = serve(
            answer("SSH-2.0-OpenSSH_9.6\r\n"),
            Duration::from_millis(500),
        );
        let e = collect(&addr, &[], Some(Duration::from_secs(2))).unwrap_err();
        assert!(matches!(e, ClientError::Malformed { .. }), "{e:?}");
        server.join().unwrap();
    }
}
