//! The agent's HTTP API (`GET /`: a landing page that links the others, with the
//! version; `GET /flows`: the flow document ([`LiveDocument`]) as JSON, each flow with
//! the owner of its local QP; `GET /findings`: the last host audit as `check --json`
//! prints it; `GET /qps`: the QP table joined with the wire ([`QpAnswer`]);
//! `GET /metrics`: the Prometheus text exposition of them, gzip-compressed when the
//! scraper asks, see [`metrics_router`]; `GET /events`: sampled events as JSON lines).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::doc::event::{monotonic_to_unix_offset_ns, Event, EventKind};
use crate::doc::finding::Findings;
use crate::doc::qp::QpDocument;
use crate::telemetry::live::LiveDocument;
use crate::telemetry::qps::QpView;
use tokio::sync::broadcast;

/// The newest document; the collector sends, every request reads.
pub type Latest = watch::Receiver<Arc<LiveDocument>>;
/// The findings of the newest host audit.
pub type LatestFindings = watch::Receiver<Arc<Findings>>;
/// The newest refresh of the QP table, joined with the flows.
pub type LatestQps = watch::Receiver<Arc<QpView>>;

/// `GET /qps`: the QP table document, and (added) the visibility of each interface
/// the agent watches.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QpAnswer {
    #[serde(flatten)]
    pub document: QpDocument,
    #[serde(default)]
    pub visibility: Vec<InterfaceVisibility>,
}

/// How RoCE shows on one interface: "kernel_path", "offloaded", "mirror" or "none".
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InterfaceVisibility {
    pub ifname: String,
    pub mode: String,
}

/// The `GET /qps` answer of `view`.
fn qp_answer(view: &QpView) -> QpAnswerRef<'_> {
    QpAnswerRef {
        document: &view.document,
        visibility: view
            .visibility
            .iter()
            .map(|(ifname, mode)| InterfaceVisibilityRef {
                ifname,
                mode: mode.as_str(),
            })
            .collect(),
    }
}

/// [`QpAnswer`] as it is written, borrowing the view.
#[derive(serde::Serialize)]
struct QpAnswerRef<'a> {
    #[serde(flatten)]
    document: &'a QpDocument,
    visibility: Vec<InterfaceVisibilityRef<'a>>,
}

#[derive(serde::Serialize)]
struct InterfaceVisibilityRef<'a> {
    ifname: &'a str,
    mode: &'a str,
}

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
    qps: Option<LatestQps>,
}

/// The API's routes: `GET /` (the landing page), `GET /flows`, `GET /findings`,
/// `GET /events`; no QP table (see [`router_with_qps`]).
pub fn router(flows: Latest, findings: LatestFindings, events: EventSender) -> Router {
    router_with_qps(flows, findings, events, None)
}

/// [`router`], and with `qps` the route `GET /qps` and the owners of `GET /flows`'s
/// flows.
pub fn router_with_qps(
    flows: Latest,
    findings: LatestFindings,
    events: EventSender,
    qps: Option<LatestQps>,
) -> Router {
    let mut routes = Router::new()
        .route("/", get(serve_landing_page))
        .route("/flows", get(serve_flows))
        .route("/findings", get(serve_findings))
        .route("/events", get(serve_events));
    if qps.is_some() {
        routes = routes.route("/qps", get(serve_qps));
    }
    routes.with_state(Sources {
        flows,
        findings,
        events,
        qps,
    })
}

/// `GET /`: what a person who points a browser at the agent sees, as exporters do
/// (node_exporter's landing page): the agent's name and version, and a link to each
/// endpoint.
const LANDING_PAGE: &str = concat!(
    "<!DOCTYPE html>\n",
    "<html lang=\"en\">\n",
    "<head><meta charset=\"utf-8\"><title>roce-agent</title></head>\n",
    "<body>\n",
    "<h1>roce-agent</h1>\n",
    "<p>eBPF RoCEv2 host agent, version ",
    env!("CARGO_PKG_VERSION"),
    "</p>\n",
    "<ul>\n",
    "<li><a href=\"/metrics\">/metrics</a>: Prometheus metrics (text format 0.0.4)</li>\n",
    "<li><a href=\"/flows\">/flows</a>: the flow table (JSON)</li>\n",
    "<li><a href=\"/findings\">/findings</a>: the findings of the last host audit (JSON)</li>\n",
    "<li><a href=\"/qps\">/qps</a>: the queue pairs of the host's RDMA devices, joined with the flows (JSON)</li>\n",
    "<li><a href=\"/events\">/events</a>: sampled events as they happen (JSON lines, streamed)</li>\n",
    "</ul>\n",
    "</body>\n",
    "</html>\n",
);

async fn serve_landing_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        LANDING_PAGE,
    )
        .into_response()
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
    // The owners of the last join; a flow newer than it has none until the next.
    let qps = s
        .qps
        .as_ref()
        .map(|q| q.borrow().clone())
        .filter(|v| !v.owners.is_empty());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, serde_json::Error>>(2);
    tokio::task::spawn_blocking(move || {
        let send = |piece| tx.blocking_send(piece).is_ok();
        if !send(Ok(b"{\"flows\":[".to_vec())) {
            return;
        }
        for start in (0..doc.len()).step_by(FLOWS_PER_PIECE) {
            let mut piece = Vec::with_capacity(FLOWS_PER_PIECE * 600);
            let range = start..start + FLOWS_PER_PIECE;
            let made = match &qps {
                Some(view) => write_owned_flows_json(&doc, view, range, &mut piece),
                None => doc.write_flows_json(range, &mut piece),
            };
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

/// [`LiveDocument::write_flows_json`] with each flow's owner from `view`.
fn write_owned_flows_json(
    doc: &LiveDocument,
    view: &QpView,
    range: std::ops::Range<usize>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let len = doc.len();
    for i in range.start.min(len)..range.end.min(len) {
        if let Some(mut f) = doc.flow(i) {
            f.owner = view.owners.owner_of(&f).cloned();
            serde_json::to_writer(&mut *out, &f)?;
        }
        if i + 1 < len {
            out.push(b',');
        }
    }
    Ok(())
}

async fn serve_findings(State(s): State<Sources>) -> Response {
    let findings = s.findings.borrow().clone();
    json(&*findings)
}

/// `GET /qps`: the last refresh of the QP table, joined with the flows of its poll,
/// and the visibility of each interface; written on a blocking thread (10,000 QPs
/// are some megabytes of JSON).
async fn serve_qps(State(s): State<Sources>) -> Response {
    let Some(qps) = &s.qps else {
        return (StatusCode::NOT_FOUND, "this agent has no QP table\n").into_response();
    };
    let view = qps.borrow().clone();
    match tokio::task::spawn_blocking(move || serde_json::to_vec(&qp_answer(&view))).await {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "serializing GET /qps failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "serialization failed\n").into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "the GET /qps task failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "serialization failed\n").into_response()
        }
    }
}

/// The state of `GET /metrics`.
#[derive(Clone)]
struct MetricsSources {
    flows: Latest,
    findings: LatestFindings,
    exporter: Arc<crate::telemetry::metrics::Exporter>,
    qps: Option<LatestQps>,
}

/// `GET /metrics` (Prometheus text format 0.0.4), to merge into [`router`]'s routes:
/// made at each scrape from the newest document and findings, with the host's RNIC
/// and PFC counters read then.
pub fn metrics_router(
    flows: Latest,
    findings: LatestFindings,
    exporter: Arc<crate::telemetry::metrics::Exporter>,
) -> Router {
    metrics_router_with_qps(flows, findings, exporter, None)
}

/// [`metrics_router`], and with `qps` the QP table's and the visibility's families
/// of its last refresh.
pub fn metrics_router_with_qps(
    flows: Latest,
    findings: LatestFindings,
    exporter: Arc<crate::telemetry::metrics::Exporter>,
    qps: Option<LatestQps>,
) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(MetricsSources {
            flows,
            findings,
            exporter,
            qps,
        })
}

/// The exposition; gzip-compressed (`Content-Encoding: gzip`) when the request's
/// `Accept-Encoding` accepts gzip, as Prometheus's scrapes do, else as it is. Either
/// answer says `Vary: Accept-Encoding`.
async fn serve_metrics(State(s): State<MetricsSources>, headers: HeaderMap) -> Response {
    let doc = s.flows.borrow().clone();
    let findings = s.findings.borrow().clone();
    let qps = s.qps.as_ref().map(|q| q.borrow().clone());
    let compress = accepts_gzip(&headers);
    // sysfs, ioctls, netlink, a pass over every flow and the compression: not on an
    // async worker.
    let made = tokio::task::spawn_blocking(move || {
        let text = s
            .exporter
            .render_with(&doc, &findings.findings, qps.as_deref())?;
        let body = if compress {
            gzip(text.as_bytes())
                .map_err(
                    |e| tracing::warn!(error = %e, "compressing /metrics failed; sent as it is"),
                )
                .ok()
        } else {
            None
        };
        Ok::<_, crate::telemetry::metrics::MetricsError>(match body {
            Some(gzipped) => (gzipped, true),
            None => (text.into_bytes(), false),
        })
    });
    match made.await {
        Ok(Ok((body, gzipped))) => {
            let mut response = (
                [
                    (
                        header::CONTENT_TYPE,
                        crate::telemetry::metrics::CONTENT_TYPE,
                    ),
                    (header::VARY, "Accept-Encoding"),
                ],
                body,
            )
                .into_response();
            if gzipped {
                response.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    header::HeaderValue::from_static("gzip"),
                );
            }
            response
        }
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

/// Whether `Accept-Encoding` accepts gzip (RFC 9110 12.5.3): `gzip` (or `x-gzip`)
/// with a q-value above 0, or else `*` with one. No header, or `gzip;q=0`: no.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut gzip = None;
    let mut any = None;
    let items = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for item in items {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let q = parts
            .filter_map(|p| p.trim().split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok());
        // An unreadable q-value accepts nothing.
        let accepted = q.is_some_and(|q| q > 0.0);
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(gzip.unwrap_or(false) || accepted);
        } else if coding == "*" {
            any = Some(any.unwrap_or(false) || accepted);
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// `body` as a gzip member (RFC 1952), at flate2's default level.
fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::default(),
    );
    encoder.write_all(body)?;
    encoder.finish()
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

    /// Findings with one error: eth1's MTU.
    fn one_finding() -> Findings {
        Findings {
            findings: vec![crate::audit::finding(
                "mtu",
                Some("eth1"),
                crate::doc::finding::Severity::Error,
                "MTU 1500",
                "MTU >= 9000",
                "ip link set dev eth1 mtu 9000",
            )],
        }
    }

    #[tokio::test]
    async fn serves_the_latest_document_and_the_client_reads_it() {
        let mut doc = Document::default();
        doc.counters.roce = 42;
        let (tx, rx) = watch::channel(Arc::new(LiveDocument::default()));
        let findings = one_finding();
        let (_ftx, frx) = watch::channel(Arc::new(findings.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server =
            tokio::spawn(async move { axum::serve(listener, router(rx, frx, None)).await });
        tx.send(Arc::new(LiveDocument::from(doc.clone()))).unwrap();
        let body = client_get(&addr, "/flows", Duration::from_secs(5))
            .await
            .unwrap();
        let got: Document = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, doc);
        let body = client_get(&addr, "/findings", Duration::from_secs(5))
            .await
            .unwrap();
        let got: Findings = serde_json::from_slice(&body).unwrap();
        assert_eq!(got, findings);
        let e = client_get(&addr, "/nope", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Status { status: 404, .. }), "{e}");
        server.abort();
    }

    /// A QP view of one QP (rxe0 17 on eth1) joined with `doc`, eth1 on the kernel
    /// path.
    fn qp_view(doc: &Document) -> QpView {
        let mut q = crate::telemetry::qps::join::tests::qp("rxe0", "eth1", 17, Some(18));
        q.src = Some("198.18.0.1".parse().unwrap());
        q.dst = Some("198.18.0.2".parse().unwrap());
        let joined = crate::telemetry::qps::join(vec![q], doc.flows.clone());
        QpView {
            document: QpDocument {
                qps: joined.qps,
                ports: Vec::new(),
                error: None,
            },
            owners: joined.owners,
            counts: joined.counts,
            visibility: vec![("eth1".to_string(), crate::telemetry::qps::Mode::KernelPath)],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn qps_are_served_and_flows_carry_their_owner() {
        let mut doc = Document::default();
        let mut mine = crate::doc::test_flow("eth1", "198.18.0.2", "198.18.0.1", 17);
        mine.packets = 4;
        doc.flows = vec![
            mine,
            crate::doc::test_flow("eth1", "198.18.0.3", "198.18.0.1", 99),
        ];
        let (_tx, rx) = watch::channel(Arc::new(LiveDocument::from(doc.clone())));
        let (_ftx, frx) = watch::channel(Arc::new(Findings::default()));
        let (_qtx, qrx) = watch::channel(Arc::new(qp_view(&doc)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let routes = router_with_qps(rx, frx, None, Some(qrx));
        let server = tokio::spawn(async move { axum::serve(listener, routes).await });

        let body = client_get(&addr, "/qps", Duration::from_secs(5))
            .await
            .unwrap();
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"qps":[{"device":"rxe0","port":1,"lqpn":17,"rqpn":18,"type":"RC","state":"RTS","#),
            "{text}"
        );
        assert!(
            text.ends_with(
                r#""ports":[],"error":null,"visibility":[{"ifname":"eth1","mode":"kernel_path"}]}"#
            ),
            "{text}"
        );
        let answer: QpAnswer = serde_json::from_slice(&body).unwrap();
        assert!(answer.document.qps[0].seen_on_wire);
        assert_eq!(answer.document.qps[0].wire.as_ref().unwrap().rx_packets, 4);

        let body = client_get(&addr, "/flows", Duration::from_secs(5))
            .await
            .unwrap();
        let got: Document = serde_json::from_slice(&body).unwrap();
        let owner = got.flows[0]
            .owner
            .as_ref()
            .expect("the flow of QP 17 has its owner");
        assert_eq!(
            (owner.device.as_str(), owner.lqpn, owner.pid),
            ("rxe0", 17, Some(117))
        );
        assert_eq!(got.flows[1].owner, None);
        // The rest of the document is as the collector made it.
        let mut without = got.clone();
        without.flows[0].owner = None;
        assert_eq!(without, doc);
        server.abort();
    }

    #[tokio::test]
    async fn an_agent_without_a_qp_table_answers_404() {
        let (_tx, rx) = watch::channel(Arc::new(LiveDocument::default()));
        let (_ftx, frx) = watch::channel(Arc::new(Findings::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server =
            tokio::spawn(async move { axum::serve(listener, router(rx, frx, None)).await });
        let e = client_get(&addr, "/qps", Duration::from_secs(5))
            .await
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
        let body = client_get(&addr, "/flows", Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(body.len(), want.len());
        assert!(body == want, "the streamed document differs");
        server.abort();
    }

    /// `GET path` of the API at `addr` with its own client (a blocking one, so on a
    /// thread of its own).
    async fn client_get(addr: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        let (addr, path) = (addr.to_string(), path.to_string());
        tokio::task::spawn_blocking(move || get_body(&addr, &path, timeout))
            .await
            .unwrap()
    }

    /// The API with `/metrics`, serving a document with one counter set, the RNIC
    /// counters of a fixture tree; its address and its task.
    async fn serve_everything() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let mut doc = Document::default();
        doc.counters.roce = 42;
        let (tx, rx) = watch::channel(Arc::new(LiveDocument::from(doc)));
        let findings = one_finding();
        let (ftx, frx) = watch::channel(Arc::new(findings));
        let exporter = Arc::new(crate::telemetry::metrics::Exporter {
            host: std::sync::RwLock::new(crate::telemetry::metrics::HostSources {
                sysfs_root: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/fixtures/sysfs/mlx5-good"),
                interfaces: Vec::new(),
            }),
            top_flows: 10,
            reloads: Default::default(),
            events_ring: None,
            events_feed: None,
        });
        let (qtx, qrx) = watch::channel(Arc::new(qp_view(&Document::default())));
        let routes = router_with_qps(rx.clone(), frx.clone(), None, Some(qrx.clone()))
            .merge(metrics_router_with_qps(rx, frx, exporter, Some(qrx)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // The senders live as long as the server.
            let _keep = (tx, ftx, qtx);
            axum::serve(listener, routes).await.unwrap();
        });
        (addr, server)
    }

    /// An HTTP/1.0 GET of `path` with `headers` (lines without CRLF): the head, in
    /// lower case, and the body's bytes.
    async fn get_raw(
        addr: std::net::SocketAddr,
        path: &str,
        headers: &[&str],
    ) -> (String, Vec<u8>) {
        let mut request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n");
        for h in headers {
            request.push_str(h);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8(raw[..end].to_vec()).unwrap();
            (head.to_ascii_lowercase(), raw[end + 4..].to_vec())
        })
        .await
        .unwrap()
    }

    /// The exposition without the lines of the `process_*` families, whose values
    /// change from one scrape to the next.
    fn without_process_families(text: &str) -> String {
        text.lines()
            .filter(|l| {
                let name = l
                    .strip_prefix("# HELP ")
                    .or_else(|| l.strip_prefix("# TYPE "))
                    .unwrap_or(l);
                !name.starts_with("process_")
            })
            .map(|l| format!("{l}\n"))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_are_served_as_text_format_0_0_4() {
        let (addr, server) = serve_everything().await;
        let (head, body) = get_raw(addr, "/metrics", &[]).await;
        let body = String::from_utf8(body).unwrap();
        assert!(head.starts_with("http/1.0 200"), "{head}");
        assert!(
            head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            body.contains("roce_frames_total{class=\"roce\"} 42\n"),
            "{body}"
        );
        assert!(body.contains(
            "roce_rnic_np_cnp_packets_sent_total{device=\"mlx5_0\",port=\"1\",netdev=\"eth1\"} 18234\n"
        ));
        // The QP table's families, from the last refresh.
        assert!(
            body.contains("roce_qp_info{device=\"rxe0\",port=\"1\",type=\"RC\",state=\"RTS\",comm=\"app17\",pod=\"\"} 1\n"),
            "{body}"
        );
        assert!(
            body.contains("roce_visibility{ifname=\"eth1\",mode=\"kernel_path\"} 1\n"),
            "{body}"
        );
        // The other routes are still there.
        let flows = client_get(&addr.to_string(), "/flows", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(serde_json::from_slice::<Document>(&flows).is_ok());
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_are_gzipped_when_asked_and_decode_to_the_identity_body() {
        let (addr, server) = serve_everything().await;
        let (head, identity) = get_raw(addr, "/metrics", &[]).await;
        assert!(head.starts_with("http/1.0 200"), "{head}");
        assert!(head.contains("\r\nvary: accept-encoding"), "{head}");
        assert!(!head.contains("content-encoding"), "{head}");
        let identity = String::from_utf8(identity).unwrap();
        assert!(identity.contains("roce_frames_total{class=\"roce\"} 42\n"));

        let (head, gzipped) = get_raw(addr, "/metrics", &["Accept-Encoding: gzip"]).await;
        assert!(head.starts_with("http/1.0 200"), "{head}");
        assert!(head.contains("\r\ncontent-encoding: gzip"), "{head}");
        assert!(head.contains("\r\nvary: accept-encoding"), "{head}");
        assert!(
            head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert_eq!(gzipped[..2], [0x1f_u8, 0x8b], "a gzip member");
        let mut decoded = String::new();
        flate2::read::GzDecoder::new(&gzipped[..])
            .read_to_string(&mut decoded)
            .unwrap();
        assert!(gzipped.len() < decoded.len() / 2, "{} bytes", gzipped.len());
        assert_eq!(
            without_process_families(&decoded),
            without_process_families(&identity)
        );
        // The same families, the process_* ones among them, either way.
        let families = |t: &str| -> Vec<String> {
            t.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(families(&decoded), families(&identity));
        assert!(decoded.contains("# TYPE process_resident_memory_bytes gauge\n"));

        // Prometheus's own header, and ones that refuse gzip.
        let (head, _) = get_raw(
            addr,
            "/metrics",
            &["Accept-Encoding: gzip, deflate, br, zstd"],
        )
        .await;
        assert!(head.contains("content-encoding: gzip"), "{head}");
        for refusal in [
            "Accept-Encoding: gzip;q=0",
            "Accept-Encoding: identity",
            "Accept-Encoding: br",
        ] {
            let (head, body) = get_raw(addr, "/metrics", &[refusal]).await;
            assert!(!head.contains("content-encoding"), "{refusal}: {head}");
            assert!(head.contains("vary: accept-encoding"), "{refusal}: {head}");
            assert!(String::from_utf8(body)
                .unwrap()
                .contains("# TYPE roce_frames_total counter\n"));
        }
        server.abort();
    }

    #[test]
    fn accept_encoding_is_read_with_its_q_values() {
        let accepts = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(header::ACCEPT_ENCODING, v.parse().unwrap());
            }
            accepts_gzip(&headers)
        };
        assert!(!accepts(&[]));
        assert!(accepts(&["gzip"]));
        assert!(accepts(&["GZIP"]));
        assert!(accepts(&["x-gzip"]));
        assert!(accepts(&["gzip, deflate, br, zstd"]));
        assert!(accepts(&["deflate", "gzip;q=0.5"]));
        assert!(accepts(&["br;q=1.0, gzip; q=0.8, *;q=0.1"]));
        assert!(accepts(&["*"]));
        assert!(!accepts(&["gzip;q=0"]));
        assert!(!accepts(&["gzip;q=0.000"]));
        assert!(
            !accepts(&["*, gzip;q=0"]),
            "an explicit refusal wins over *"
        );
        assert!(!accepts(&["*;q=0"]));
        assert!(!accepts(&["identity"]));
        assert!(!accepts(&["deflate, br"]));
        assert!(!accepts(&["gzip;q=nonsense"]));
        assert!(!accepts(&["gzipped"]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_landing_page_links_every_endpoint_and_names_the_version() {
        let (addr, server) = serve_everything().await;
        let (head, body) = get_raw(addr, "/", &[]).await;
        assert!(head.starts_with("http/1.0 200"), "{head}");
        assert!(
            head.contains("content-type: text/html; charset=utf-8"),
            "{head}"
        );
        let page = String::from_utf8(body).unwrap();
        for endpoint in ["/metrics", "/flows", "/findings", "/qps", "/events"] {
            assert!(
                page.contains(&format!("<a href=\"{endpoint}\">")),
                "no link to {endpoint}:\n{page}"
            );
        }
        assert!(
            page.contains(&format!("version {}", crate::telemetry::metrics::VERSION)),
            "{page}"
        );
        // The links lead somewhere.
        for endpoint in ["/metrics", "/flows", "/findings", "/qps"] {
            let (head, _) = get_raw(addr, endpoint, &[]).await;
            assert!(head.starts_with("http/1.0 200"), "{endpoint}: {head}");
        }
        server.abort();
    }
}
