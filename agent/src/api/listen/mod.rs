//! The API's listener: accepts connections and serves the routes on each, in a task of
//! its own (the accept loop never waits for a client), as the web configuration in
//! force says and within [`Limits`].
//!
//! Parts: this file is the accept loop and a connection's life (the cap on
//! connections, TLS or not, hyper's HTTP/1.1 with its header-read timeout and head
//! cap, the graceful shutdown); `tls` is the handshake and the answer to plain HTTP on
//! the TLS port; `guard` checks each request (body, rate limit, basic auth) and adds
//! the configured headers; `deadline` ends a connection whose client stopped reading;
//! `limits` holds the bounds and raises the open-files limit.
//!
//! The web configuration is a `watch`: a reload sends a new one. A connection uses the
//! TLS configuration in force when it was accepted; each request, the users, rate limit
//! and headers in force when it arrives.

mod deadline;
mod guard;
mod limits;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::api::web_config::WebConfig;

use guard::guard;
pub use limits::{raise_open_files_limit, Limits};
pub use tls::PLAIN_HTTP_ANSWER;

/// The web configuration in force; a reload sends the next one.
pub type WebConfigs = watch::Receiver<Arc<WebConfig>>;

/// Serves `routes` on `listener` until `shutdown` completes: then accepts no more,
/// lets open requests finish for [`Limits::shutdown_grace`] and cuts what is still open
/// (an `/events` stream).
pub async fn serve(
    listener: TcpListener,
    routes: Router,
    web: WebConfigs,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let cap = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(cap as usize));
    let (stop_tx, stop) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_head_bytes.max(limits::MIN_HEAD_BYTES))
        .keep_alive(true);
    let shared = Arc::new(Shared {
        app: guard(routes, web.clone(), limits.max_body_bytes),
        http,
        stop,
        limits,
        notes: Notes::default(),
    });
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(&shared.notes, e).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            if let Some(left_out) = shared.notes.over_cap.allow() {
                tracing::warn!(%peer, max_connections = cap, left_out, "an API connection over the cap was closed at once");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let config = Arc::clone(&web.borrow());
        tokio::spawn(connection(shared.clone(), stream, peer, config, permit));
    }
    drop(listener);
    stop_tx.send_replace(true);
    // Every connection gives its slot back when it ends, the last after the grace.
    let grace = shared.limits.shutdown_grace + Duration::from_millis(100);
    let _ = tokio::time::timeout(grace, slots.acquire_many(cap)).await;
}

/// What every connection task shares.
struct Shared {
    /// The routes behind the guard.
    app: Router,
    http: hyper::server::conn::http1::Builder,
    /// True once the server stops.
    stop: watch::Receiver<bool>,
    limits: Limits,
    notes: Notes,
}

/// One connection, holding its slot: served until it ends, or cut a grace after the
/// server stopped.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    web: Arc<WebConfig>,
    _slot: OwnedSemaphorePermit,
) {
    let mut stop = shared.stop.clone();
    let grace = shared.limits.shutdown_grace;
    tokio::select! {
        () = handle(&shared, stream, peer, &web) => {}
        () = async {
            stopped(&mut stop).await;
            tokio::time::sleep(grace).await;
        } => {}
    }
}

async fn handle(shared: &Shared, stream: TcpStream, peer: SocketAddr, web: &WebConfig) {
    let limits = &shared.limits;
    let Some(config) = &web.tls else {
        let io = deadline::WriteDeadline::new(stream, limits.write_timeout);
        return serve_http(shared, io, peer).await;
    };
    let accepted = tokio::time::timeout(
        limits.header_read_timeout,
        tls::accept(stream, config.clone(), limits.write_timeout),
    )
    .await;
    match accepted {
        Ok(Ok(io)) => serve_http(shared, io, peer).await,
        Ok(Err(tls::Refusal::Closed)) => {}
        Ok(Err(refusal)) => {
            if let Some(left_out) = shared.notes.refused.allow() {
                tracing::info!(%peer, reason = %refusal, left_out, "an API connection was refused");
            }
        }
        Err(_) => {
            tracing::debug!(%peer, "an API client did not complete its TLS handshake in time")
        }
    }
}

/// HTTP/1.1 on `io` until the client or the server closes it; at a shutdown, the
/// request in progress is finished first.
async fn serve_http<I>(shared: &Shared, io: I, peer: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(shared.app.clone());
    let conn = shared.http.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let mut stop = shared.stop.clone();
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    match ended {
        Ok(()) => {}
        Err(e) if deadline::is_stalled(&e) => {
            if let Some(left_out) = shared.notes.stalled.allow() {
                tracing::info!(%peer, write_timeout_s = shared.limits.write_timeout.as_secs_f64(), left_out, "an API client took nothing of its response in time: its connection was closed");
            }
        }
        Err(e) => tracing::debug!(%peer, error = %e, "an API connection ended"),
    }
}

/// Returns once the server stops.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error: the server is gone, which stops it too.
    let _ = stop.wait_for(|s| *s).await;
}

/// A failed accept: the client gave up before it (go on), or the agent is out of file
/// descriptors or memory (wait a little for some to be freed).
async fn accept_failed(notes: &Notes, e: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    if let Some(left_out) = notes.accept.allow() {
        tracing::warn!(error = %e, left_out, "accepting an API connection failed");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The listener's log lines about clients, each kind once a minute at most.
#[derive(Default)]
struct Notes {
    over_cap: Throttled,
    refused: Throttled,
    stalled: Throttled,
    accept: Throttled,
}

/// Once a minute: when it was last let through, and how many were left out since.
#[derive(Default)]
struct Throttled {
    last: Mutex<Option<Instant>>,
    left_out: AtomicU64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(60);

    /// `Some(left_out)` to write the line now, None to leave it out.
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Self::EVERY) {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.left_out.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::io::{Read, Write};
    use std::net::SocketAddr;

    /// A web configuration read from `yaml` (and the files it names, in `dir`).
    fn load(dir: &std::path::Path, yaml: &str) -> WebConfig {
        let path = dir.join("web.yml");
        std::fs::write(&path, yaml).unwrap();
        WebConfig::load(&path).unwrap()
    }

    /// `GET /` answers "hello"; `GET /stream` never ends.
    fn routes() -> Router {
        Router::new().route("/", get(|| async { "hello" })).route(
            "/stream",
            get(|| async {
                let first = futures_util::stream::once(async {
                    Ok::<_, std::convert::Infallible>("first\n".to_string())
                });
                axum::body::Body::from_stream(futures_util::StreamExt::chain(
                    first,
                    futures_util::stream::pending(),
                ))
            }),
        )
    }

    /// A server of [`routes`] on loopback: its address, the sender of its web
    /// configuration, what stops it, and its task.
    struct Running {
        addr: SocketAddr,
        web: watch::Sender<Arc<WebConfig>>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    async fn start(web: WebConfig, limits: Limits) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (web, rx) = watch::channel(Arc::new(web));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, routes(), rx, limits, async {
            let _ = stopped.await;
        }));
        Running {
            addr,
            web,
            stop: Some(stop),
            task,
        }
    }

    /// Sends `request` and reads until the server closes (5 s at most): the answer and
    /// how long it took.
    async fn exchange(addr: SocketAddr, request: &str) -> (String, Duration) {
        let request = request.to_string();
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let start = Instant::now();
            let _ = s.write_all(request.as_bytes());
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            (String::from_utf8_lossy(&raw).into_owned(), start.elapsed())
        })
        .await
        .unwrap()
    }

    fn get_request(path: &str, extra: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}\r\n")
    }

    const USER_PASSWORD_BASE64: &str = "dXNlcjpwYXNzd29yZA=="; // user:password

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn basic_auth_guards_every_path_and_headers_go_on_every_answer() {
        let dir = roce_testkit::temp::TempDir::new("listen-auth");
        let hash = bcrypt::hash("password", 4).unwrap();
        let web = load(
            dir.path(),
            &format!(
                "basic_auth_users:\n  user: {hash}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
            ),
        );
        let server = start(web, Limits::default()).await;
        let auth = format!("Authorization: Basic {USER_PASSWORD_BASE64}\r\n");

        let (raw, _) = exchange(server.addr, &get_request("/", "")).await;
        assert!(raw.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{raw}");
        let lower = raw.to_ascii_lowercase();
        assert!(lower.contains("\r\nwww-authenticate: basic\r\n"), "{raw}");
        assert!(lower.contains("\r\nx-frame-options: deny\r\n"), "{raw}");
        assert!(raw.ends_with("\r\n\r\nUnauthorized\n"), "{raw}");
        // A path that does not exist is no way around it.
        let (raw, _) = exchange(server.addr, &get_request("/nope", "")).await;
        assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
        let wrong = "Authorization: Basic dXNlcjp3cm9uZw==\r\n"; // user:wrong
        let (raw, _) = exchange(server.addr, &get_request("/", wrong)).await;
        assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");

        let (raw, _) = exchange(server.addr, &get_request("/", &auth)).await;
        assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
        assert!(
            raw.to_ascii_lowercase()
                .contains("\r\nx-frame-options: deny\r\n"),
            "{raw}"
        );
        assert!(raw.ends_with("\r\n\r\nhello"), "{raw}");
        let (raw, _) = exchange(server.addr, &get_request("/nope", &auth)).await;
        assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
        assert!(
            raw.to_ascii_lowercase()
                .contains("\r\nx-frame-options: deny\r\n"),
            "{raw}"
        );

        // A reload applies to the next request.
        server.web.send_replace(Arc::new(WebConfig::plain()));
        let (raw, _) = exchange(server.addr, &get_request("/", "")).await;
        assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
        assert!(
            !raw.to_ascii_lowercase().contains("x-frame-options"),
            "{raw}"
        );
        server.task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_http_to_the_tls_port_gets_gos_answer() {
        let dir = roce_testkit::temp::TempDir::new("listen-tls");
        let ca = roce_testkit::pki::TestCa::new("test");
        ca.server(&["127.0.0.1"], 7).write(dir.path(), "server");
        let web = load(
            dir.path(),
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
        );
        let server = start(web, Limits::default()).await;
        let (raw, took) = exchange(server.addr, &get_request("/", "")).await;
        assert_eq!(raw.as_bytes(), PLAIN_HTTP_ANSWER);
        assert!(took < Duration::from_secs(2), "{took:?}");
        server.task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn request_bodies_and_long_heads_are_refused() {
        let server = start(WebConfig::plain(), Limits::default()).await;
        let (raw, _) = exchange(server.addr, &get_request("/", "Content-Length: 5000\r\n")).await;
        assert!(
            raw.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
            "{raw}"
        );
        let chunked = get_request("/", "Transfer-Encoding: chunked\r\n") + "0\r\n\r\n";
        let (raw, _) = exchange(server.addr, &chunked).await;
        assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
        let long = format!("X-Long: {}\r\n", "x".repeat(20_000));
        let (raw, _) = exchange(server.addr, &get_request("/", &long)).await;
        assert!(raw.starts_with("HTTP/1.1 431"), "{raw}");
        let (raw, _) = exchange(
            server.addr,
            &(get_request("/", "Content-Length: 2\r\n") + "hi"),
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        server.task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_partial_and_kept_alive_connections_are_closed_at_the_header_timeout() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let server = start(WebConfig::plain(), limits).await;
        let within = Duration::from_millis(250)..Duration::from_secs(2);
        let (raw, took) = exchange(server.addr, "").await;
        assert!(raw.is_empty() && within.contains(&took), "{raw} {took:?}");
        let (raw, took) = exchange(server.addr, "GET / HTTP/1.1\r\nHo").await;
        assert!(
            !raw.contains("200") && within.contains(&took),
            "{raw} {took:?}"
        );
        let (raw, took) = exchange(server.addr, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(
            raw.starts_with("HTTP/1.1 200") && within.contains(&took),
            "{raw} {took:?}"
        );
        server.task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_over_the_cap_is_closed_at_once() {
        let limits = Limits {
            max_connections: 1,
            ..Limits::default()
        };
        let server = start(WebConfig::plain(), limits).await;
        let addr = server.addr;
        let first =
            tokio::task::spawn_blocking(move || std::net::TcpStream::connect(addr).unwrap())
                .await
                .unwrap();
        let (raw, took) = exchange(server.addr, &get_request("/", "")).await;
        assert!(
            raw.is_empty() && took < Duration::from_secs(1),
            "{raw} {took:?}"
        );
        drop(first);
        // The slot is free again.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (raw, _) = exchange(server.addr, &get_request("/", "")).await;
            if raw.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "{raw}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shutdown_finishes_requests_and_cuts_streams_after_the_grace() {
        let limits = Limits {
            shutdown_grace: Duration::from_millis(300),
            ..Limits::default()
        };
        let mut server = start(WebConfig::plain(), limits).await;
        let addr = server.addr;
        let (got_first, first) = std::sync::mpsc::channel();
        let streamer = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            let mut raw = vec![0u8; 4096];
            let n = s.read(&mut raw).unwrap();
            got_first.send(()).unwrap();
            let mut rest = Vec::new();
            // Ends (EOF) when the server cuts the stream.
            s.read_to_end(&mut rest).unwrap();
            String::from_utf8_lossy(&raw[..n]).into_owned()
        });
        tokio::task::spawn_blocking(move || first.recv_timeout(Duration::from_secs(5)).unwrap())
            .await
            .unwrap();
        let start = Instant::now();
        server.stop.take().unwrap().send(()).unwrap();
        (&mut server.task).await.unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
        let head = streamer.await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        // No more connections.
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
