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
}
