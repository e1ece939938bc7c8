//! The user-space tally: what the engines cannot know offline, learnt from every
//! frame and the reference classifier's walk of it: capture timestamps (first/last
//! seen), the ICRC of every RoCE packet, bytes cut off by the capture's snap length,
//! and the DSCP observations that the findings report.
//!
//! Each worker tallies the flows and talkers it owns ([`FlowExtra::observe`],
//! [`Talkers`]); [`Tally`] is the merged result.

use std::collections::HashMap;
use std::net::IpAddr;

use roce_common::bth::{self, ICRC_LEN};
use roce_common::classify::{ip_addresses, IpLayer, Walk};
use roce_common::packet::SlicePacket;
use roce_common::parsed::Class;
use roce_common::parsed::{Outcome, Parsed};
use roce_common::policy::Policy;
use roce_common::wire::{ECN_NOT_ECT, UDP_HLEN};

use super::capture::{Frame, UnsupportedLink};
use super::engine::FlowId;
use crate::doc::key_addr;

/// Per-flow observations that the engines do not keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowExtra {
    pub first_ns: u64,
    pub last_ns: u64,
    pub packets: u64,
    /// Bytes of the frames as captured.
    pub captured_bytes: u64,
    /// Wire bytes beyond what the capture holds (snap length).
    pub snapped_bytes: u64,
    pub icrc_errors: u64,
    /// Packets whose ICRC could not be checked (cut off by the snap length).
    pub icrc_unchecked: u64,
    /// Non-CNP packets outside the lossless DSCP set, and which DSCPs (bit mask).
    pub off_lossless: u64,
    pub off_lossless_dscps: u64,
    /// CNPs on a DSCP other than the CNP DSCP (`Flow::cnps_wrong_class`).
    pub cnps_wrong_class: roce_common::cnp::CnpWrongClass,
    /// Packets whose outer ECN was Not-ECT (ECN off: switches cannot mark them).
    pub not_ect: u64,
    /// PSN gaps of this (request) flow that the other direction decided (`gaps`):
    /// lost by the capture (acknowledged with no NAK and no resend), or in the fabric
    /// (NAKed or resent). The flow's other gaps are undecided.
    pub capture_gaps: u64,
    pub fabric_gaps: u64,
    /// The flow's NAK-to-resend and recovery times on the capture's clock (the
    /// reference pass's: the kernel engine's clock is its test runs').
    pub nak_to_resend_ns: u64,
    pub recovery_ns: u64,
    pub recovery_max_us: u32,
    /// A tunnelled flow's outer UDP source port, from its first packet (as the kernel
    /// keeps it: `Flow::outer_sport`).
    pub outer_sport: u16,
}

/// Non-RoCE traffic seen on a lossless DSCP.
#[derive(Clone, Debug, Default)]
pub struct NonRoceLossless {
    pub frames: u64,
    /// By IP protocol number.
    pub by_proto: HashMap<u8, u64>,
    /// By (source, destination, protocol); bounded to [`MAX_TALKERS`] entries.
    pub talkers: HashMap<(IpAddr, IpAddr, u8), u64>,
}

/// Distinct talkers remembered for the non-RoCE-on-lossless finding.
pub const MAX_TALKERS: usize = 100_000;

/// What the user side learnt from every frame (all workers merged).
#[derive(Debug, Default)]
pub struct Tally {
    pub flows: HashMap<FlowId, FlowExtra>,
    /// Round trips of the flows that had any (`roce_common::rtt`).
    pub rtt: HashMap<FlowId, roce_common::rtt::RttHist>,
    /// Round-trip samples not taken (`counters.rtt_unpaired`).
    pub rtt_unpaired: crate::doc::RttUnpairedCounters,
    /// PSN gaps let go without a verdict (`counters.capture_gaps_undecided`).
    pub capture_gaps_undecided: u64,
    /// The CE -> CNP times of the flows that carried CNPs (`cnp_timing`).
    pub cnp_times: HashMap<FlowId, super::cnp_timing::CnpTimes>,
    pub non_roce_lossless: NonRoceLossless,
    pub icrc_checked: u64,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Frames not read: pcapng interfaces of a link type analyze does not read.
    pub unsupported: Vec<UnsupportedLink>,
}

/// The ICRC verdict of one RoCE frame: `Some(true)` valid, `Some(false)` bad,
/// `None` when the frame does not hold the whole datagram. `ip` is the IP layer that
/// carries the RoCE datagram (the inner one in VXLAN), as the walk found it.
pub fn check_icrc(frame: &[u8], p: &Parsed, ip: Option<IpLayer>) -> Option<bool> {
    let ip = ip?;
    let (l3, l4) = (ip.l3, ip.l4);
    let end = l4.checked_add(p.udp_len as usize)?;
    if end > frame.len() || (p.udp_len as usize) < UDP_HLEN + bth::BTH_LEN + ICRC_LEN || l3 > l4 {
        return None;
    }
    let icrc_at = end - ICRC_LEN;
    let want = roce_common::icrc::icrc(&frame[l3..l4], &frame[l4..icrc_at])?;
    Some(frame[icrc_at..end] == want.to_le_bytes())
}

impl FlowExtra {
    /// Takes one RoCE frame of this flow into account (frames of a flow in capture
    /// order), with its ICRC verdict ([`check_icrc`]). `counted`: a mirror copy's
    /// bytes (its mirrored frame's original length), which stand for the frame's.
    pub fn observe(
        &mut self,
        f: &Frame<'_>,
        p: &Parsed,
        icrc: Option<bool>,
        counted: Option<u32>,
        policy: &Policy,
    ) {
        if self.packets == 0 {
            self.first_ns = f.ts_ns;
            self.outer_sport = p.outer_sport;
        }
        self.packets += 1;
        self.last_ns = f.ts_ns;
        match counted {
            Some(n) => self.captured_bytes += u64::from(n),
            None => {
                self.captured_bytes += f.data.len() as u64;
                self.snapped_bytes += f.wire_len.saturating_sub(f.data.len() as u64);
            }
        }
        match icrc {
            Some(true) => {}
            Some(false) => self.icrc_errors += 1,
            None => self.icrc_unchecked += 1,
        }
        let dscp = p.outer_tos >> 2;
        if p.outer_tos & 3 == ECN_NOT_ECT {
            self.not_ect += 1;
        }
        if bth::is_cnp(p.bth.opcode) {
            if roce_common::cnp::wrong_class(p.bth.opcode, dscp, policy.qos.cnp_dscp) {
                self.cnps_wrong_class.count(dscp);
            }
        } else if !policy.is_lossless(dscp) {
            self.off_lossless += 1;
            self.off_lossless_dscps |= 1 << dscp;
        }
    }
}

/// A non-RoCE IP frame's talker (source, destination, protocol) as the header holds
/// it (raw address words, the outer family), when it counts for the
/// non-RoCE-on-lossless finding: an IP frame on a lossless DSCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Talker {
    src: [u32; 4],
    dst: [u32; 4],
    proto: u8,
    v6: bool,
}

impl Talker {
    pub fn of(f: &Frame<'_>, walk: &Walk, policy: &Policy) -> Option<Talker> {
        let Outcome::Other(class) = walk.outcome else {
            return None;
        };
        // A mirror copy cut before its BTH may well have been RoCE.
        if matches!(class, Class::NonIp | Class::MirrorTruncated) {
            return None;
        }
        let ip = walk.layers.outer?;
        if !policy.is_lossless(ip.tos >> 2) {
            return None;
        }
        let (src, dst) = ip_addresses(&SlicePacket(f.data), &ip)?;
        Some(Talker {
            src,
            dst,
            proto: ip.proto,
            v6: ip.v6,
        })
    }

    fn key(&self) -> (IpAddr, IpAddr, u8) {
        (
            key_addr(&self.src, self.v6),
            key_addr(&self.dst, self.v6),
            self.proto,
        )
    }
}

/// One worker's non-RoCE-on-lossless observations: its talkers (a worker sees every
/// frame of the talkers it owns) with the frame each was first seen in, so that the
/// merge keeps the same [`MAX_TALKERS`] first talkers as one pass would.
#[derive(Debug, Default)]
pub struct Talkers {
    frames: u64,
    by_proto: HashMap<u8, u64>,
    /// Talker -> (first frame number, frames).
    seen: HashMap<Talker, (u64, u64)>,
}

impl Talkers {
    pub fn observe(&mut self, t: Talker, frame: u64) {
        self.frames += 1;
        *self.by_proto.entry(t.proto).or_default() += 1;
        if let Some(c) = self.seen.get_mut(&t) {
            c.1 += 1;
        } else if self.seen.len() < MAX_TALKERS {
            self.seen.insert(t, (frame, 1));
        }
    }

    /// Merges the workers' talkers. A talker among the first [`MAX_TALKERS`] of the
    /// capture is among the first of its worker (the worker's earlier talkers are
    /// earlier in the capture too), with all its frames: keeping the first by frame
    /// number gives what one pass keeps.
    pub fn merge(parts: Vec<Talkers>) -> NonRoceLossless {
        let mut out = NonRoceLossless::default();
        let mut all: Vec<(Talker, (u64, u64))> = Vec::new();
        for p in parts {
            out.frames += p.frames;
            for (proto, n) in p.by_proto {
                *out.by_proto.entry(proto).or_default() += n;
            }
            all.extend(p.seen);
        }
        if all.len() > MAX_TALKERS {
            all.sort_unstable_by_key(|(_, (first, _))| *first);
            all.truncate(MAX_TALKERS);
        }
        out.talkers = all.into_iter().map(|(t, (_, n))| (t.key(), n)).collect();
        out
    }
}
