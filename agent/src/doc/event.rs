//! Sampled events: one record per RoCE packet that shows trouble (CE in its outer or
//! inner header, a CNP, a NAK, an RNR NAK, a PSN gap), as `GET /events` serves them
//! (JSON lines) and `roce-agent events` prints or writes to pcapng.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

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
    /// A round trip longer than the configured threshold (`rtt_spike_us`), on the
    /// response that ended it.
    RttSpike,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Ce,
        EventKind::Cnp,
        EventKind::Nak,
        EventKind::RnrNak,
        EventKind::PsnGap,
        EventKind::RttSpike,
    ];

    /// The name in JSON, in `--kind` and in metric labels.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Ce => "ce",
            EventKind::Cnp => "cnp",
            EventKind::Nak => "nak",
            EventKind::RnrNak => "rnr_nak",
            EventKind::PsnGap => "psn_gap",
            EventKind::RttSpike => "rtt_spike",
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
    /// Added: the frame's bytes up to the end of its last transport header (Ethernet,
    /// IP, UDP [, VXLAN and the inner Ethernet, IP and UDP], BTH and the extension
    /// headers of its opcode), plus `events_payload_bytes` of payload (0 by default: no
    /// application data), of the first 128 bytes of the frame; as lowercase hex.
    pub packet: String,
    /// Added: `ts_ns` on the wall clock (ns since the Unix epoch), for pcapng; 0 when
    /// unknown.
    #[serde(default)]
    pub time_unix_ns: u64,
    /// Added: the round trip of an `rtt_spike`, µs; absent for the other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_us: Option<u32>,
}

impl Event {
    /// The kept bytes (`packet` decoded; None when it is not even-length hex).
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
