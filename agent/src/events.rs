//! Sampled events: one record per RoCE packet that shows trouble (CE in its outer or
//! inner header, a CNP, a NAK, an RNR NAK, a PSN gap), as `GET /events` serves them
//! (JSON lines) and `roce-agent events` prints or writes to pcapng.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::api::{self, ClientError};
use crate::doc::{Direction, Family};

/// What an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// CE in the outer or the inner IP header (one event per packet).
    Ce,
    Cnp,
    Nak,
    RnrNak,
    PsnGap,
}

impl EventKind {
    pub const ALL: [EventKind; 5] = [
        EventKind::Ce,
        EventKind::Cnp,
        EventKind::Nak,
        EventKind::RnrNak,
        EventKind::PsnGap,
    ];

    /// The name in JSON, in `--kind` and in metric labels.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Ce => "ce",
            EventKind::Cnp => "cnp",
            EventKind::Nak => "nak",
            EventKind::RnrNak => "rnr_nak",
            EventKind::PsnGap => "psn_gap",
        }
    }

    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// ECN codepoint names, as the flows document's `ecn` object keys them.
pub fn ecn_name(codepoint: u8) -> &'static str {
    match codepoint & 3 {
        0 => "not_ect",
        1 => "ect1",
        2 => "ect0",
        _ => "ce",
    }
}

/// One sampled event, as a line of `GET /events`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The kernel's monotonic clock (bpf_ktime_get_ns) when the packet was seen.
    pub ts_ns: u64,
    pub ifname: String,
    pub direction: Direction,
    pub kind: EventKind,
    // The flow-key fields of the flows document.
    pub family: Family,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub vni: Option<u32>,
    pub inner_family: Option<Family>,
    pub inner_src: Option<IpAddr>,
    pub inner_dst: Option<IpAddr>,
    pub dest_qp: u32,
    /// BTH opcode.
    pub opcode: u8,
    pub psn: u32,
    /// Outer DSCP.
    pub dscp: u8,
    /// Outer ECN codepoint name ("not_ect", "ect1", "ect0", "ce").
    pub ecn: String,
    /// Inner ECN codepoint name; null when not tunnelled.
    pub inner_ecn: Option<String>,
    /// The sampling in force: 1 in `sample` events of this kind was kept.
    pub sample: u32,
    /// Added: the frame's length on the wire (Ethernet header on, no FCS).
    pub packet_len: u32,
    /// Added: the first bytes of the frame (at most 128), as lowercase hex.
    pub packet: String,
    /// Added: `ts_ns` on the wall clock (ns since the Unix epoch), for pcapng; 0 when
    /// unknown.
    #[serde(default)]
    pub time_unix_ns: u64,
}

impl Event {
    /// The captured bytes (`packet` decoded; None when it is not even-length hex).
    pub fn packet_bytes(&self) -> Option<Vec<u8>> {
        let hex = self.packet.as_bytes();
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        hex.chunks(2)
            .map(|pair| {
                let s = std::str::from_utf8(pair).ok()?;
                u8::from_str_radix(s, 16).ok()
            })
            .collect()
    }
}

/// Lowercase hex of `bytes` (the `packet` field).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The wall clock minus the monotonic clock (the kernel's `bpf_ktime_get_ns` clock):
/// added to `ts_ns`, the time of day.
pub fn monotonic_to_unix_offset_ns() -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a timespec to fill.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_MONOTONIC)
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

/// Parses `ce,cnp,...` (the `--kind` flag and the `kind` query parameter).
pub fn parse_kinds(list: &str) -> Result<Vec<EventKind>, String> {
    list.split(',')
        .filter(|k| !k.is_empty())
        .map(|k| {
            EventKind::from_name(k.trim()).ok_or_else(|| {
                format!(
                    "unknown event kind {k:?}: use {}",
                    EventKind::ALL.map(EventKind::name).join(", ")
                )
            })
        })
        .collect()
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
    let stream = api::send_request(addr, &path, Duration::from_millis(200))?;
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

/// One human line: time, interface/direction, kind, flow, BTH fields, DSCP/ECN.
pub fn human_line(ev: &Event) -> String {
    let dir = match ev.direction {
        Direction::Ingress => "in",
        Direction::Egress => "out",
    };
    let inner = match (ev.vni, ev.inner_src, ev.inner_dst) {
        (Some(vni), Some(s), Some(d)) => format!(" vni {vni} {s}→{d}"),
        _ => String::new(),
    };
    let secs = ev.time_unix_ns / 1_000_000_000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let frac = (ev.time_unix_ns % 1_000_000_000) / 1_000;
    format!(
        "{h:02}:{m:02}:{s:02}.{frac:06} {}/{dir} {:<7} {}→{}{inner} qp {:#x} opcode {:#04x} psn {} dscp {} ecn {}{} 1/{}",
        ev.ifname,
        ev.kind.name(),
        ev.src,
        ev.dst,
        ev.dest_qp,
        ev.opcode,
        ev.psn,
        ev.dscp,
        ev.ecn,
        ev.inner_ecn.as_deref().map_or(String::new(), |i| format!(" inner {i}")),
        ev.sample
    )
}
