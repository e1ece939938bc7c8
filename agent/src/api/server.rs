//! The agent's HTTP API (`GET /flows`: the flow document ([`LiveDocument`]) as JSON; `GET /findings`:
//! the last host audit as `check --json` prints it; `GET /metrics`: the Prometheus text
//! exposition of both, see [`metrics_router`]; `GET /events`: sampled events as JSON lines).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::doc::event::{monotonic_to_unix_offset_ns, Event, EventKind};
use crate::doc::finding::Findings;
use crate::telemetry::live::LiveDocument;
use tokio::sync::broadcast;

/// The newest document; the collector sends, every request reads.
pub type Latest = watch::Receiver<Arc<LiveDocument>>;
/// The findings of the newest host audit.
pub type LatestFindings = watch::Receiver<Arc<Findings>>;

/// Where sampled events are published, and the sampling in force.
#[derive(Clone, Debug)]
pub struct EventFeed {
    pub sender: tokio::sync::broadcast::Sender<Arc<crate::doc::event::Event>>,
    /// `events_sample` now: 0 while events are off (a reload may turn them on).
    pub sample: Arc<std::sync::atomic::AtomicU32>,
}

/// The events of `GET /events` (None: the agent has no reader of the kernel's ring).
pub type EventSender = Option<EventFeed>;

#[derive(Clone)]
struct Sources {
    flows: Latest,
    findings: LatestFindings,
    events: EventSender,
}

/// The API's routes: `GET /flows`, `GET /findings`, `GET /events`.
pub fn router(flows: Latest, findings: LatestFindings, events: EventSender) -> Router {
    Router::new()
        .route("/flows", get(serve_flows))
        .route("/findings", get(serve_findings))
        .route("/events", get(serve_events))
        .with_state(Sources {
            flows,
            findings,
            events,
        })
}

/// JSON lines, one per event published from now on (`?kind=ce,cnp` filters).
async fn serve_events(State(s): State<Sources>, uri: axum::http::Uri) -> Response {
    let Some(feed) = &s.events else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "this agent collects no events\n",
        )
            .into_response();
    };
    if feed.sample.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "events are off (events_sample = 0): set events_sample in the config file and reload the agent (SIGHUP)\n",
        )
            .into_response();
    }
    let kinds = match uri
        .query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("kind="))
        .map(crate::doc::event::parse_kinds)
        .transpose()
    {
        Ok(k) => k,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let lines = stream_lines(feed.sender.subscribe(), kinds);
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// Flows per piece of a streamed `GET /flows` body.
const FLOWS_PER_PIECE: usize = 4096;

/// The document as JSON, the same bytes `serde_json::to_vec` would make of it, sent a
/// piece at a time as a blocking thread writes them: a million flows are some 500 MB
/// of JSON, which the agent never holds at once.
async fn serve_flows(State(s): State<Sources>) -> Response {
    let doc = s.flows.borrow().clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, serde_json::Error>>(2);
    tokio::task::spawn_blocking(move || {
        let send = |piece| tx.blocking_send(piece).is_ok();
        if !send(Ok(b"{\"flows\":[".to_vec())) {
            return;
        }
        for start in (0..doc.len()).step_by(FLOWS_PER_PIECE) {
            let mut piece = Vec::with_capacity(FLOWS_PER_PIECE * 600);
            let made = doc.write_flows_json(start..start + FLOWS_PER_PIECE, &mut piece);
            if !send(made.map(|()| piece)) {
                return; // the client went away, or writing failed
            }
        }
        let tail = serde_json::to_vec(&doc.counters).map(|counters| {
            let mut t = b"],\"counters\":".to_vec();
            t.extend(counters);
            t.push(b'}');
            t
        });
        send(tail);
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        let piece = rx.recv().await?;
        if let Err(e) = &piece {
            tracing::error!(error = %e, "serializing GET /flows failed");
        }
        Some((piece, rx))
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

async fn serve_findings(State(s): State<Sources>) -> Response {
    let findings = s.findings.borrow().clone();
    json(&*findings)
}

/// The state of `GET /metrics`.
#[derive(Clone)]
struct MetricsSources {
    flows: Latest,
    findings: LatestFindings,
    exporter: Arc<crate::telemetry::metrics::Exporter>,
}

/// `GET /metrics` (Prometheus text format 0.0.4), to merge into [`router`]'s routes:
/// made at each scrape from the newest document and findings, with the host's RNIC
/// and PFC counters read then.
pub fn metrics_router(
    flows: Latest,
    findings: LatestFindings,
    exporter: Arc<crate::telemetry::metrics::Exporter>,
) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(MetricsSources {
            flows,
            findings,
            exporter,
        })
}

async fn serve_metrics(State(s): State<MetricsSources>) -> Response {
    let doc = s.flows.borrow().clone();
    let findings = s.findings.borrow().clone();
    // sysfs, ioctls, netlink and a pass over every flow: not on an async worker.
    let made = tokio::task::spawn_blocking(move || s.exporter.render(&doc, &findings.findings));
    match made.await {
        Ok(Ok(body)) => (
            [(
                header::CONTENT_TYPE,
                crate::telemetry::metrics::CONTENT_TYPE,
            )],
            body,
        )
            .into_response(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "making /metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "metrics failed\n").into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "the /metrics task failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "metrics failed\n").into_response()
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "serializing an API answer failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "serialization failed\n").into_response()
        }
    }
}

/// What `GET /events` streams: the events published after the request arrived, one
/// JSON line each, filtered by kind (`?kind=ce,cnp`). A reader that falls behind the
/// broadcast's capacity loses the oldest events, with a `{"lagged": N}` line saying
/// how many; the collector never waits for it.
pub fn stream_lines(
    receiver: broadcast::Receiver<Arc<Event>>,
    kinds: Option<Vec<EventKind>>,
) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> + Send {
    let offset = monotonic_to_unix_offset_ns();
    futures_util::stream::unfold(receiver, move |mut rx| {
        let kinds = kinds.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        if kinds.as_ref().is_some_and(|k| !k.contains(&ev.kind)) {
                            continue;
                        }
                        let mut ev = (*ev).clone();
                        if ev.time_unix_ns == 0 {
                            ev.time_unix_ns = u64::try_from(ev.ts_ns as i128 + offset).unwrap_or(0);
                        }
                        let mut line = serde_json::to_string(&ev).unwrap_or_default();
                        line.push('\n');
                        return Some((Ok(line), rx));
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        return Some((Ok(format!("{{\"lagged\":{n}}}\n")), rx));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::client::{get_body, ClientError};
    use crate::doc::Document;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    #[tokio::test]
    async fn serves_the_latest_document_and_the_client_reads_it() {
        let mut doc = Document::default();
        doc.counters.roce = 42;
        let (tx, rx) = watch::channel(Arc::new(LiveDocument::default()));
        let findings = Findings {
            findings: vec![crate::audit::finding(
                "mtu",
                Some("eth1"),
                crate::doc::finding::Severity::Error,
                "MTU 1500",
                "MTU >= 9000",
                "ip link set dev eth1 mtu 9000",
            )],
        };
        let (_ftx, frx) = watch::channel(Arc::new(findings.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server =
            tokio::spawn(async move { axum::serve(listener, router(rx, frx, None)).await });
        tx.send(Arc::new(LiveDocument::from(doc.clone()))).unwrap();
        let a = addr.clone();
        let body =
            tokio::task::spawn_blocking(move || get_body(&a, "/flows", Duration::from_secs(5)))
                .await
                .unwrap()
                .unwrap();
        let got: Document = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, doc);
        let a = addr.clone();
        let body =
            tokio::task::spawn_blocking(move || get_body(&a, "/findings", Duration::from_secs(5)))
                .await
                .unwrap()
                .unwrap();
        let got: Findings = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, findings);
        let a = addr.clone();
        let e = tokio::task::spawn_blocking(move || get_body(&a, "/nope", Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, ClientError::Status { status: 404, .. }), "{e}");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_table_is_streamed_as_the_same_bytes() {
        use roce_common::flow::FlowStats;
        use roce_common::key::FlowKey4;
        // More flows than one piece holds, and not a whole number of pieces.
        let n = FLOWS_PER_PIECE as u32 * 2 + 17;
        let mut b = crate::telemetry::live::Builder::new(0, |i| Some(format!("eth{i}")));
        for i in 0..n {
            let key = FlowKey4 {
                src: i,
                dst: 7,
                qp_dir: i & 0xFF,
                ifindex: i % 3,
            };
            let st = FlowStats {
                packets: 1 + i as u64,
                ecn: [0, 0, 1 + i as u64, 0],
                ..FlowStats::default()
            };
            b.add(&key.widen(), &st);
        }
        let live = b.finish(&[5, 6, 7], None);
        let want = serde_json::to_vec(&live.to_document()).unwrap();
        let (_tx, rx) = watch::channel(Arc::new(live));
        let (_ftx, frx) = watch::channel(Arc::new(Findings::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server =
            tokio::spawn(async move { axum::serve(listener, router(rx, frx, None)).await });
        let body =
            tokio::task::spawn_blocking(move || get_body(&addr, "/flows", Duration::from_secs(30)))
                .await
                .unwrap()
                .unwrap();
        assert_eq!(body.len(), want.len());
        assert!(body == want, "the streamed document differs");
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_are_served_as_text_format_0_0_4() {
        let mut doc = Document::default();
        doc.counters.roce = 42;
        let (_tx, rx) = watch::channel(Arc::new(LiveDocument::from(doc)));
        let (_ftx, frx) = watch::channel(Arc::new(Findings::default()));
        let exporter = Arc::new(crate::telemetry::metrics::Exporter {
            host: std::sync::RwLock::new(crate::telemetry::metrics::HostSources {
                sysfs_root: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/fixtures/sysfs/mlx5-good"),
                interfaces: Vec::new(),
            }),
            top_flows: 10,
            reloads: Default::default(),
            events_ring: None,
        });
        let routes = router(rx.clone(), frx.clone(), None).merge(metrics_router(rx, frx, exporter));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, routes).await });
        let raw = tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            String::from_utf8(raw).unwrap()
        })
        .await
        .unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            body.contains("roce_frames_total{ifname=\"all\",class=\"roce\"} 42\n"),
            "{body}"
        );
        assert!(body.contains(
            "roce_rnic_np_cnp_packets_sent_total{device=\"mlx5_0\",port=\"1\",netdev=\"eth1\"} 18234\n"
        ));
        // The other routes are still there.
        let a = addr.to_string();
        let flows =
            tokio::task::spawn_blocking(move || get_body(&a, "/flows", Duration::from_secs(5)))
                .await
                .unwrap()
                .unwrap();
        assert!(serde_json::from_slice::<Document>(&flows).is_ok());
        server.abort();
    }
}
