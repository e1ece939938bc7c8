//! The user-space tally: what the engines cannot know offline, learnt from every
//! frame and the reference classifier's walk of it: capture timestamps (first/last
//! seen), the ICRC of every RoCE packet, bytes cut off by the capture's snap length,
//! and the DSCP observations that the findings report.

use std::collections::HashMap;
use std::net::IpAddr;

use roce_common::bth::{self, ICRC_LEN};
use roce_common::classify::{ip_addresses, IpLayer, Outcome, Parsed, Walk};
use roce_common::counters::Class;
use roce_common::flow::FlowKey;
use roce_common::packet::SlicePacket;
use roce_common::policy::Policy;
use roce_common::wire::{ECN_NOT_ECT, UDP_HLEN};

use super::capture::Frame;
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
    /// CNPs on a DSCP other than the CNP DSCP, and which DSCPs (bit mask).
    pub cnp_off_dscp: u64,
    pub cnp_dscps: u64,
    /// Packets whose outer ECN was Not-ECT (ECN off: switches cannot mark them).
    pub not_ect: u64,
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

/// What the user side learns from every frame.
#[derive(Debug, Default)]
pub struct Tally {
    pub flows: HashMap<FlowKey, FlowExtra>,
    pub non_roce_lossless: NonRoceLossless,
    pub icrc_checked: u64,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
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

impl Tally {
    /// Takes one frame and the reference classifier's walk of it into account.
    pub fn observe(&mut self, f: &Frame<'_>, walk: &Walk, policy: &Policy) {
        if self.first_ns.is_none() {
            self.first_ns = Some(f.ts_ns);
        }
        self.last_ns = Some(f.ts_ns);
        match &walk.outcome {
            Outcome::Flow(p) => {
                let e = self.flows.entry(p.key).or_default();
                if e.packets == 0 {
                    e.first_ns = f.ts_ns;
                }
                e.packets += 1;
                e.last_ns = f.ts_ns;
                e.captured_bytes += f.data.len() as u64;
                e.snapped_bytes += f.wire_len.saturating_sub(f.data.len() as u64);
                match check_icrc(f.data, p, walk.layers.roce_ip(p.tunnelled)) {
                    Some(true) => self.icrc_checked += 1,
                    Some(false) => {
                        self.icrc_checked += 1;
                        e.icrc_errors += 1;
                    }
                    None => e.icrc_unchecked += 1,
                }
                let dscp = p.outer_tos >> 2;
                if p.outer_tos & 3 == ECN_NOT_ECT {
                    e.not_ect += 1;
                }
                if bth::is_cnp(p.bth.opcode) {
                    if dscp != policy.qos.cnp_dscp {
                        e.cnp_off_dscp += 1;
                        e.cnp_dscps |= 1 << dscp;
                    }
                } else if !policy.is_lossless(dscp) {
                    e.off_lossless += 1;
                    e.off_lossless_dscps |= 1 << dscp;
                }
            }
            Outcome::Other(class) => {
                if matches!(class, Class::NonIp) {
                    return;
                }
                let Some(ip) = walk.layers.outer else {
                    return;
                };
                if !policy.is_lossless(ip.tos >> 2) {
                    return;
                }
                let Some((src, dst)) = ip_addresses(&SlicePacket(f.data), &ip) else {
                    return;
                };
                let (proto, src, dst) = (ip.proto, key_addr(&src, ip.v6), key_addr(&dst, ip.v6));
                let n = &mut self.non_roce_lossless;
                n.frames += 1;
                *n.by_proto.entry(proto).or_default() += 1;
                let key = (src, dst, proto);
                if let Some(c) = n.talkers.get_mut(&key) {
                    *c += 1;
                } else if n.talkers.len() < MAX_TALKERS {
                    n.talkers.insert(key, 1);
                }
            }
            Outcome::Malformed(_) => {}
        }
    }
}
