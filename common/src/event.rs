//! Sampled events: the EVENTS ring buffer's record and the rules that decide which
//! packets make one. `FlowStats::record` says what a packet showed ([`Trouble`]);
//! `xdp_classify` (ingress) and `tc_egress` (egress) keep 1 in
//! `RuntimeConfig::events_sample` of each kind per CPU, at most
//! [`EVENTS_PER_CPU_PER_WINDOW`] per CPU and window, and write an [`EventRecord`]
//! into the ring; the agent reads it (`agent/src/events_reader.rs`).

use crate::key::FlowKey;

/// Event kinds. Each is also the offset of its `events` counter after
/// `counters::STAT_EVENTS_CE` and the index of its name in
/// `counters::STAT_NAMES_EVENTS` (a test keeps the three in one order).
pub const EVENT_CE: u8 = 0;
pub const EVENT_CNP: u8 = 1;
pub const EVENT_NAK: u8 = 2;
pub const EVENT_RNR_NAK: u8 = 3;
pub const EVENT_PSN_GAP: u8 = 4;
/// A round trip (`rtt`) longer than `RuntimeConfig::rtt_spike_us`, on the response
/// that ended it.
pub const EVENT_RTT_SPIKE: u8 = 5;
pub const EVENT_KIND_COUNT: usize = 6;
/// No event of the opcode kinds ([`Trouble::kind`]).
pub const EVENT_NONE: u8 = 0xFF;

/// Bytes of the frame an event carries (all of a shorter frame).
pub const EVENT_PACKET_BYTES: usize = 128;

/// `RuntimeConfig::events_sample` that emits nothing. It is `RuntimeConfig`'s default:
/// a loader without a ring-buffer reader (`analyze`, tests, benchmarks) has no use for
/// events; `roce-agent run` asks for them (`--events-sample`, default 1).
pub const EVENTS_OFF: u32 = 0;

/// The rate limit: at most this many events per CPU in one window of
/// [`EVENT_WINDOW_NS`] (1,000 events/s per CPU), whatever the sampling, so that a
/// storm of CE marks floods neither the ring nor the agent. Events above it are counted
/// as `events_dropped.rate_limit`.
pub const EVENTS_PER_CPU_PER_WINDOW: u32 = 100;
/// The rate limit's window: 100 ms of the monotonic clock (the coarse one where the
/// kernel has it: `ebpf/src/kernel.rs`).
pub const EVENT_WINDOW_NS: u64 = 100_000_000;

/// Bytes of the EVENTS ring buffer unless the loader says otherwise: about 4,200
/// records, 2 s of events at the rate limit on 2 CPUs.
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// What one packet counted on a flow showed: CE (in the outer or the inner header: one
/// event however many headers carry it) and at most one of CNP, NAK, RNR NAK and PSN
/// gap, which exclude each other (a CNP is no ACKNOWLEDGE, an ACKNOWLEDGE is no tracked
/// request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub ce: bool,
    /// `EVENT_CNP`, `EVENT_NAK`, `EVENT_RNR_NAK`, `EVENT_PSN_GAP`, `EVENT_RTT_SPIKE` or
    /// `EVENT_NONE`.
    pub kind: u8,
    /// The round trip of an `EVENT_RTT_SPIKE`, µs (0 otherwise).
    pub rtt_us: u32,
}

impl Trouble {
    pub const NONE: Trouble = Trouble {
        ce: false,
        kind: EVENT_NONE,
        rtt_us: 0,
    };

    /// Nothing to report: the clean path costs this one test.
    #[inline(always)]
    pub fn is_none(&self) -> bool {
        !self.ce && self.kind == EVENT_NONE
    }
}

/// One EVENTS record: whole words, no padding hole (the layout test below pins it).
/// The kernel writes each field straight into the reserved ring memory: nothing of it
/// is built on the 512-byte stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// bpf_ktime_get_ns() when the packet was seen (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The flow key as counted: `ifindex` is the interface, `KEY_EGRESS` in `flags`
    /// the direction.
    pub key: FlowKey,
    /// BTH PSN (24 bits).
    pub psn: u32,
    /// The frame's length (Ethernet header on, no FCS).
    pub frame_len: u32,
    /// The 1-in-N sampling in force when the event was kept.
    pub sample: u32,
    /// UDP source port of the RoCE datagram (the inner one when tunnelled).
    pub sport: u16,
    /// `EVENT_*`.
    pub kind: u8,
    /// BTH opcode.
    pub opcode: u8,
    /// Outer IPv4 TOS / IPv6 traffic class (DSCP and ECN), as the flow counted it.
    pub outer_tos: u8,
    /// Inner TOS / traffic class of a tunnelled packet (0 otherwise).
    pub inner_tos: u8,
    /// Bytes of `packet` that hold the frame: min(frame_len, EVENT_PACKET_BYTES), or 0
    /// when the copy failed.
    pub captured: u8,
    pub _pad: u8,
    /// The round trip of an `EVENT_RTT_SPIKE`, µs (0 for the other kinds).
    pub rtt_us: u32,
    /// The first `captured` bytes of the frame.
    pub packet: [u8; EVENT_PACKET_BYTES],
}

impl EventRecord {
    pub fn ifindex(&self) -> u32 {
        self.key.ifindex
    }
    pub fn egress(&self) -> bool {
        self.key.egress()
    }
    pub fn dscp(&self) -> u8 {
        self.outer_tos >> 2
    }
    pub fn ecn(&self) -> u8 {
        self.outer_tos & 3
    }
    pub fn inner_ecn(&self) -> u8 {
        self.inner_tos & 3
    }
    /// The captured bytes of the frame.
    pub fn packet(&self) -> &[u8] {
        let n = (self.captured as usize).min(EVENT_PACKET_BYTES);
        &self.packet[..n]
    }
}

/// Bytes of `frame_len` that an event copies.
#[inline(always)]
pub fn captured_len(frame_len: u32) -> u32 {
    if frame_len < EVENT_PACKET_BYTES as u32 {
        frame_len
    } else {
        EVENT_PACKET_BYTES as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn record_is_whole_words_without_holes() {
        // Each field starts where the one before ends: no padding anywhere.
        assert_eq!(offset_of!(EventRecord, key), 8);
        assert_eq!(offset_of!(EventRecord, psn), 8 + size_of::<FlowKey>());
        assert_eq!(offset_of!(EventRecord, frame_len), 92);
        assert_eq!(offset_of!(EventRecord, sample), 96);
        assert_eq!(offset_of!(EventRecord, sport), 100);
        assert_eq!(offset_of!(EventRecord, kind), 102);
        assert_eq!(offset_of!(EventRecord, opcode), 103);
        assert_eq!(offset_of!(EventRecord, outer_tos), 104);
        assert_eq!(offset_of!(EventRecord, inner_tos), 105);
        assert_eq!(offset_of!(EventRecord, captured), 106);
        assert_eq!(offset_of!(EventRecord, _pad), 107);
        assert_eq!(offset_of!(EventRecord, rtt_us), 108);
        assert_eq!(offset_of!(EventRecord, packet), 112);
        assert_eq!(size_of::<EventRecord>(), 112 + EVENT_PACKET_BYTES);
        assert_eq!(size_of::<EventRecord>() % 8, 0);
    }

    #[test]
    fn a_short_frame_is_captured_whole_a_long_one_cut_at_128() {
        assert_eq!(captured_len(60), 60);
        assert_eq!(captured_len(128), 128);
        assert_eq!(captured_len(9000), 128);
    }

    #[test]
    fn trouble_none_is_none() {
        assert!(Trouble::NONE.is_none());
        assert!(!Trouble {
            ce: true,
            kind: EVENT_NONE,
            rtt_us: 0
        }
        .is_none());
        assert!(!Trouble {
            ce: false,
            kind: EVENT_PSN_GAP,
            rtt_us: 0
        }
        .is_none());
    }
}
