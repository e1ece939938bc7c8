//! Host QoS policy, in one place: which DSCP a packet leaves with, which skb priority
//! it gets, how a VTEP maps the inner DSCP/ECN onto the outer header, and what the
//! decapsulating side checks.
//!
//! The tc programs and the reference [`apply`] call the same [`decide`] and
//! [`decap_check`], generic over [`Packet`], so the kernel and the reference agree by
//! construction; the tests compare the bytes both produce. Nothing here is a constant
//! of the datapath: every DSCP, the lossless set and the priority table come from the
//! maps the agent fills ([`QosConfig`], [`DscpEntry`], [`IfaceQos`]).

use crate::bth;
use crate::classify::{ip_addresses, tunnel_layers, walk};
use crate::config::RuntimeConfig;
use crate::counters::*;
use crate::key::addr_v4_mapped;
use crate::packet::Packet;
use crate::wire::*;

/// Number of DSCP values (the POLICY map's size).
pub const DSCP_COUNT: u32 = 64;

/// The default policy (README, "Host QoS"): the one place these values are written.
pub const DEFAULT_ROCE_DSCP: u8 = 26;
pub const DEFAULT_CNP_DSCP: u8 = 48;
pub const DEFAULT_REMARK_DSCP: u8 = 0;
pub const DEFAULT_LOSSLESS: [u8; 1] = [26];

/// `DscpEntry::flags`: non-RoCE traffic carrying this DSCP is an intruder in a lossless queue.
pub const ENTRY_LOSSLESS: u8 = 1 << 0;

/// One POLICY map entry, indexed by DSCP.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DscpEntry {
    /// skb->priority of a packet that leaves with this DSCP (default DSCP >> 3).
    pub priority: u32,
    /// The outer DSCP a VTEP writes for an inner packet of this DSCP (default: the same).
    pub vtep_outer: u8,
    /// `ENTRY_*` bits.
    pub flags: u8,
    pub _pad: [u8; 2],
}

impl IfaceQos {
    /// Neither the host policy nor VTEP handling: the programs touch nothing.
    #[inline(always)]
    pub fn is_off(&self) -> bool {
        self.host == HOST_OFF && self.vtep == 0
    }

    /// The host policy applies (audit or enforce): one of the agent's `--iface`
    /// interfaces, whose egress RoCE flows `tc_egress` counts as XDP counts its ingress
    /// ones. A VTEP-only underlay has no XDP program, so it counts neither direction.
    #[inline(always)]
    pub fn counts_flows(&self) -> bool {
        self.host != HOST_OFF
    }
}

impl DscpEntry {
    pub fn lossless(&self) -> bool {
        self.flags & ENTRY_LOSSLESS != 0
    }
}

/// The QOS map's single entry: the DSCPs the host policy writes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QosConfig {
    /// DSCP of RoCEv2 data (everything RoCE but CNPs).
    pub roce_dscp: u8,
    /// DSCP of CNPs.
    pub cnp_dscp: u8,
    /// DSCP that non-RoCE traffic on a lossless DSCP is remarked to.
    pub remark_dscp: u8,
    pub _pad: [u8; 5],
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig {
            roce_dscp: DEFAULT_ROCE_DSCP,
            cnp_dscp: DEFAULT_CNP_DSCP,
            remark_dscp: DEFAULT_REMARK_DSCP,
            _pad: [0; 5],
        }
    }
}

/// `IfaceQos::host`: what the host DSCP policy does on this interface's egress.
pub const HOST_OFF: u8 = 0;
/// Count what would change, change nothing.
pub const HOST_AUDIT: u8 = 1;
/// Rewrite DSCPs and set skb->priority.
pub const HOST_ENFORCE: u8 = 2;

/// `IfaceQos::ecn`: how a VTEP derives the outer ECN field from the inner one.
pub const ECN_KERNEL: u8 = 0;
pub const ECN_RFC6040: u8 = 1;

/// Interfaces with an ifindex below this are configured in the IFACE_QOS_DIRECT array
/// (indexed by ifindex: an array lookup is several times cheaper than a hash lookup);
/// the rare larger ifindex goes to the IFACE_QOS hash.
pub const IFACE_DIRECT: u32 = 4096;

/// One IFACE_QOS / IFACE_QOS_DIRECT entry (key: ifindex): what the tc programs do on
/// that interface. All zero: nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceQos {
    /// `HOST_OFF`, `HOST_AUDIT` or `HOST_ENFORCE`.
    pub host: u8,
    /// Non-zero: an underlay interface of a VTEP. Egress VXLAN packets get the inner
    /// DSCP/ECN propagated (always rewritten); ingress VXLAN packets are checked.
    pub vtep: u8,
    /// `ECN_KERNEL` or `ECN_RFC6040`.
    pub ecn: u8,
    pub _pad: u8,
}

/// The whole policy as the user side holds it (the kernel reads the same from three maps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub config: RuntimeConfig,
    pub qos: QosConfig,
    pub table: [DscpEntry; DSCP_COUNT as usize],
}

impl Default for Policy {
    fn default() -> Self {
        let mut table = [DscpEntry {
            priority: 0,
            vtep_outer: 0,
            flags: 0,
            _pad: [0; 2],
        }; DSCP_COUNT as usize];
        for (d, e) in table.iter_mut().enumerate() {
            e.priority = (d >> 3) as u32;
            e.vtep_outer = d as u8;
        }
        for d in DEFAULT_LOSSLESS {
            table[d as usize].flags |= ENTRY_LOSSLESS;
        }
        Policy {
            config: RuntimeConfig::default(),
            qos: QosConfig::default(),
            table,
        }
    }
}

impl Policy {
    /// Makes `dscps` the lossless set (values of 64 or more are ignored).
    pub fn set_lossless(&mut self, dscps: &[u8]) {
        for e in self.table.iter_mut() {
            e.flags &= !ENTRY_LOSSLESS;
        }
        for d in dscps {
            if let Some(e) = self.table.get_mut(*d as usize) {
                e.flags |= ENTRY_LOSSLESS;
            }
        }
    }

    /// Whether `dscp` is in the lossless (PFC-protected) set.
    pub fn is_lossless(&self, dscp: u8) -> bool {
        self.table
            .get(dscp as usize)
            .is_some_and(DscpEntry::lossless)
    }
}

/// DSCP -> entry lookup: an array on the user side, the POLICY map in the kernel.
pub trait DscpTable {
    fn entry(&self, dscp: u8) -> Option<DscpEntry>;
}

impl DscpTable for [DscpEntry; DSCP_COUNT as usize] {
    fn entry(&self, dscp: u8) -> Option<DscpEntry> {
        self.get(dscp as usize).copied()
    }
}

// ---------------------------------------------------------------------------------
// ECN and checksum arithmetic

#[inline(always)]
pub fn dscp_of(tos: u8) -> u8 {
    tos >> 2
}

#[inline(always)]
pub fn ecn_of(tos: u8) -> u8 {
    tos & 3
}

/// A TOS byte with its DSCP replaced and its ECN bits kept.
#[inline(always)]
pub fn with_dscp(tos: u8, dscp: u8) -> u8 {
    (dscp << 2) | (tos & 3)
}

/// Outer ECN of an encapsulated packet. `ECN_KERNEL` is what Linux does with
/// `tos inherit` (`INET_ECN_encapsulate`, RFC 3168 full functionality: inner CE becomes
/// ECT(0)); `ECN_RFC6040` is RFC 6040 normal mode (copy, CE included).
#[inline(always)]
pub fn ecn_encapsulate(inner_ecn: u8, mode: u8) -> u8 {
    let e = inner_ecn & 3;
    if e == ECN_CE && mode != ECN_RFC6040 {
        ECN_ECT0
    } else {
        e
    }
}

/// RFC 6040 decapsulation (Linux `__INET_ECN_decapsulate`): the inner ECN after
/// decapsulation, or None when the packet must be dropped (outer CE over inner Not-ECT).
#[inline(always)]
pub fn ecn_decapsulate(outer_ecn: u8, inner_ecn: u8) -> Option<u8> {
    let (o, i) = (outer_ecn & 3, inner_ecn & 3);
    if i == ECN_NOT_ECT {
        return if o == ECN_CE { None } else { Some(ECN_NOT_ECT) };
    }
    if i == ECN_CE || o == ECN_CE {
        return Some(ECN_CE);
    }
    if o == ECN_ECT1 {
        return Some(ECN_ECT1);
    }
    Some(i)
}

/// RFC 1624 eqn. 3: the header checksum after one 16-bit word changed from `old` to `new`:
/// HC' = ~(~HC + ~m + m').
#[inline(always)]
pub fn csum_replace16(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!check as u32) + (!old as u32 & 0xFFFF) + new as u32;
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    !(sum as u16)
}

/// The IPv4 header checksum computed from scratch over `hdr` (checksum field included
/// as it is: pass a header whose checksum bytes are zero to compute a new one).
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in hdr.chunks(2) {
        let hi = pair[0] as u32;
        let lo = pair.get(1).copied().unwrap_or(0) as u32;
        sum += (hi << 8) | lo;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

// ---------------------------------------------------------------------------------
// The decision

/// What the policy made of one egress frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No policy on the interface, not IP, or an outer IP header that does not parse:
    /// nothing is read further, written or counted.
    Untouched,
    /// RoCEv2 data (plain or in VXLAN): gets the RoCE DSCP.
    RoceData,
    /// A CNP: gets the CNP DSCP.
    Cnp,
    /// Not RoCE, on a lossless DSCP: remarked.
    Intruder,
    /// Not RoCE, not on a lossless DSCP: DSCP kept, priority from the table.
    Other,
    /// VXLAN leaving a VTEP underlay: outer DSCP/ECN from the inner header.
    Vtep,
}

/// The decision for one egress frame: where its (outer) IP header is, the TOS it has
/// and the one it leaves with, the skb priority to set, and whether to write at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    pub kind: Kind,
    /// Offset of the IP header to write (the outer one when tunnelled).
    pub l3: usize,
    pub v6: bool,
    pub old_tos: u8,
    pub new_tos: u8,
    /// skb->priority the packet should get (None: leave it).
    pub priority: Option<u32>,
    /// True in enforce mode and on VTEPs; false in audit mode (count, change nothing).
    pub enforce: bool,
    /// The frame is RoCEv2 (plain or in VXLAN: a whole BTH behind the RoCE port).
    pub roce: bool,
}

impl Action {
    const UNTOUCHED: Action = Action {
        kind: Kind::Untouched,
        l3: 0,
        v6: false,
        old_tos: 0,
        new_tos: 0,
        priority: None,
        enforce: false,
        roce: false,
    };

    /// The TOS byte changes.
    pub fn rewrites(&self) -> bool {
        self.kind != Kind::Untouched && self.old_tos != self.new_tos
    }

    /// Bytes are written: the TOS changes and the mode allows it.
    pub fn writes(&self) -> bool {
        self.enforce && self.rewrites()
    }

    /// skb->priority is set (enforce mode or VTEP).
    pub fn sets_priority(&self) -> Option<u32> {
        if self.enforce {
            self.priority
        } else {
            None
        }
    }
}

/// The STATS entries one egress decision bumps (at most three).
pub fn action_stats(a: &Action) -> [Option<u32>; 3] {
    let mut out = [None; 3];
    if a.kind == Kind::Untouched {
        return out;
    }
    if a.kind == Kind::Vtep {
        out[0] = Some(STAT_VTEP_PACKETS);
        if a.rewrites() {
            out[1] = Some(STAT_VTEP_REWRITTEN);
        }
    } else if a.rewrites() {
        out[0] = Some(match (a.kind, a.enforce) {
            (Kind::Intruder, true) => STAT_QOS_INTRUDER_REMARKED,
            (Kind::Intruder, false) => STAT_QOS_AUDIT_INTRUDER_REMARK,
            (_, true) => STAT_QOS_ROCE_REWRITTEN,
            (_, false) => STAT_QOS_AUDIT_ROCE_REWRITE,
        });
    }
    if a.priority.is_some() {
        out[2] = Some(if a.enforce {
            STAT_QOS_PRIORITY_SET
        } else {
            STAT_QOS_AUDIT_PRIORITY
        });
    }
    out
}

/// The egress decision for one frame on an interface configured as `iface`.
#[inline(always)]
pub fn decide<P: Packet, T: DscpTable>(
    p: &P,
    cfg: &RuntimeConfig,
    qos: &QosConfig,
    table: &T,
    iface: &IfaceQos,
) -> Action {
    if iface.is_off() {
        return Action::UNTOUCHED;
    }
    let layers = walk(p, cfg).layers;
    let Some(ip) = layers.outer else {
        return Action::UNTOUCHED;
    };
    // RoCE means what the classifier means: a whole BTH behind the RoCE port.
    let (roce, cnp) = (layers.roce, layers.roce && bth::is_cnp(layers.bth_opcode));
    let inner_tos = layers.inner.map(|i| i.tos);
    let old = ip.tos;
    let mut a = Action {
        kind: Kind::Other,
        l3: ip.l3,
        v6: ip.v6,
        old_tos: old,
        new_tos: old,
        priority: None,
        enforce: iface.host == HOST_ENFORCE,
        roce,
    };
    if iface.vtep != 0 {
        if let Some(inner_tos) = inner_tos {
            let Some(e) = table.entry(dscp_of(inner_tos)) else {
                return Action::UNTOUCHED;
            };
            a.kind = Kind::Vtep;
            a.enforce = true;
            // A CE mark already on the outer header (set by a queue between the
            // encapsulation and here) is congestion news: never erased (RFC 3168).
            let outer_ecn = if ecn_of(old) == ECN_CE {
                ECN_CE
            } else {
                ecn_encapsulate(inner_tos, iface.ecn)
            };
            a.new_tos = ((e.vtep_outer & 0x3F) << 2) | outer_ecn;
            a.priority = table.entry(dscp_of(a.new_tos)).map(|e| e.priority);
            return a;
        }
    }
    if iface.host == HOST_OFF {
        return Action::UNTOUCHED;
    }
    let new_dscp = if cnp {
        a.kind = Kind::Cnp;
        qos.cnp_dscp
    } else if roce {
        a.kind = Kind::RoceData;
        qos.roce_dscp
    } else {
        match table.entry(dscp_of(old)) {
            Some(e) if e.lossless() => {
                a.kind = Kind::Intruder;
                qos.remark_dscp
            }
            _ => dscp_of(old),
        }
    };
    a.new_tos = with_dscp(old, new_dscp & 0x3F);
    a.priority = table.entry(dscp_of(a.new_tos)).map(|e| e.priority);
    a
}

// ---------------------------------------------------------------------------------
// The reference

/// The word of the IP header that holds the TOS / traffic class, as written:
/// IPv4 bytes 0-1 (version/IHL, TOS), IPv6 bytes 0-1 (version, traffic class, flow label top).
#[inline(always)]
pub fn tos_word(first: u8, second: u8, v6: bool, tos: u8) -> u16 {
    if v6 {
        let w = u16::from_be_bytes([first, second]);
        (w & 0xF00F) | ((tos as u16) << 4)
    } else {
        u16::from_be_bytes([first, tos])
    }
}

/// Applies the policy to `frame` in place, as the tc program does, and returns the
/// decision. The tests compare the kernel's output bytes with this.
pub fn apply(frame: &mut [u8], policy: &Policy, iface: &IfaceQos) -> Action {
    let a = decide(
        &crate::packet::SlicePacket(frame),
        &policy.config,
        &policy.qos,
        &policy.table,
        iface,
    );
    if a.writes() {
        let (b0, b1) = (frame[a.l3], frame[a.l3 + 1]);
        let old = u16::from_be_bytes([b0, b1]);
        let new = tos_word(b0, b1, a.v6, a.new_tos);
        frame[a.l3..a.l3 + 2].copy_from_slice(&new.to_be_bytes());
        if !a.v6 {
            let c = a.l3 + 10;
            let check = u16::from_be_bytes([frame[c], frame[c + 1]]);
            frame[c..c + 2].copy_from_slice(&csum_replace16(check, old, new).to_be_bytes());
        }
    }
    a
}

// ---------------------------------------------------------------------------------
// Decapsulation side

/// VTEPS map key: the remote VTEP (outer source address, IPv4-mapped for IPv4) and
/// the VNI of its packets: one tenant's overlay apart from another's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VtepKey {
    pub addr: [u32; 4],
    pub vni: u32,
}

/// VTEPS map value: what arrived from one remote VTEP (per CPU; merge by adding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VtepStats {
    /// VXLAN packets with an inner IP header.
    pub packets: u64,
    /// Outer DSCP differs from the table applied to the inner DSCP (a peer that loses markings).
    pub dscp_mismatch: u64,
    /// Outer CE over inner ECT(0)/ECT(1): decapsulation propagates the mark.
    pub ce_over_ect: u64,
    /// Outer CE over inner Not-ECT: decapsulation drops the packet (the mark is lost).
    pub ce_over_not_ect: u64,
    /// Inner CE: marked before encapsulation, on the sender's side of the overlay
    /// (whatever the outer header says: Linux encapsulates inner CE as outer ECT(0),
    /// RFC 6040's normal mode as outer CE). The two `ce_over_*` are the underlay's.
    pub inner_ce: u64,
    pub last_outer_tos: u8,
    pub last_inner_tos: u8,
    pub _pad: [u8; 6],
}

impl VtepStats {
    pub fn merge(&mut self, o: &VtepStats) {
        self.packets += o.packets;
        self.dscp_mismatch += o.dscp_mismatch;
        self.ce_over_ect += o.ce_over_ect;
        self.ce_over_not_ect += o.ce_over_not_ect;
        self.inner_ce += o.inner_ce;
        if o.packets > 0 {
            self.last_outer_tos = o.last_outer_tos;
            self.last_inner_tos = o.last_inner_tos;
        }
    }

    #[inline(always)]
    pub fn record(&mut self, c: &DecapCheck) {
        self.packets += 1;
        self.dscp_mismatch += c.dscp_mismatch as u64;
        self.ce_over_ect += c.ce_over_ect as u64;
        self.ce_over_not_ect += c.ce_over_not_ect as u64;
        self.inner_ce += c.inner_ce as u64;
        self.last_outer_tos = c.outer_tos;
        self.last_inner_tos = c.inner_tos;
    }
}

/// What the decapsulating side found in one VXLAN packet. Nothing is rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecapCheck {
    pub remote: VtepKey,
    pub outer_tos: u8,
    pub inner_tos: u8,
    pub dscp_mismatch: bool,
    pub ce_over_ect: bool,
    pub ce_over_not_ect: bool,
    pub inner_ce: bool,
}

/// Checks one ingress frame: a VXLAN packet with an inner IP header, or None.
#[inline(always)]
pub fn decap_check<P: Packet, T: DscpTable>(
    p: &P,
    cfg: &RuntimeConfig,
    table: &T,
) -> Option<DecapCheck> {
    let layers = tunnel_layers(p, cfg);
    let ip = layers.outer?;
    let inner_tos = layers.inner?.tos;
    let expected = table.entry(dscp_of(inner_tos))?.vtep_outer & 0x3F;
    let (o, i) = (ecn_of(ip.tos), ecn_of(inner_tos));
    Some(DecapCheck {
        remote: VtepKey {
            addr: ip_addresses(p, &ip)?.0,
            vni: layers.vni,
        },
        outer_tos: ip.tos,
        inner_tos,
        dscp_mismatch: dscp_of(ip.tos) != expected,
        ce_over_ect: o == ECN_CE && (i == ECN_ECT0 || i == ECN_ECT1),
        ce_over_not_ect: o == ECN_CE && i == ECN_NOT_ECT,
        inner_ce: i == ECN_CE,
    })
}

/// The STATS entries one decapsulation check bumps.
pub fn decap_stats(c: &DecapCheck) -> [Option<u32>; 4] {
    [
        Some(STAT_DECAP_PACKETS),
        c.dscp_mismatch.then_some(STAT_DECAP_DSCP_MISMATCH),
        c.ce_over_ect.then_some(STAT_DECAP_CE_OVER_ECT),
        c.ce_over_not_ect.then_some(STAT_DECAP_CE_OVER_NOT_ECT),
    ]
}

/// The IPv4-mapped form of an IPv4 address, for building VtepKeys on the user side.
pub fn vtep_key_v4(raw: u32, vni: u32) -> VtepKey {
    VtepKey {
        addr: addr_v4_mapped(raw),
        vni,
    }
}

#[cfg(test)]
mod tests {
    //! Host-side checks of the tables and of the decision on hand-made frames; the tc
    //! programs run the same code, and tests/tests/tc_policy.rs compares their bytes.
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    const ENFORCE: IfaceQos = IfaceQos {
        host: HOST_ENFORCE,
        vtep: 0,
        ecn: ECN_KERNEL,
        _pad: 0,
    };
    const AUDIT: IfaceQos = IfaceQos {
        host: HOST_AUDIT,
        ..ENFORCE
    };
    const VTEP: IfaceQos = IfaceQos {
        host: HOST_OFF,
        vtep: 1,
        ecn: ECN_KERNEL,
        _pad: 0,
    };

    fn ip4(tos: u8, proto: u8, l4: &[u8]) -> Vec<u8> {
        let total = (20 + l4.len()) as u16;
        let mut h = vec![0x45, tos];
        h.extend(total.to_be_bytes());
        h.extend([
            0x12, 0x34, 0x40, 0, 64, proto, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
        ]);
        let c = ipv4_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(l4);
        h
    }

    fn ip6(tos: u8, proto: u8, l4: &[u8]) -> Vec<u8> {
        let w0: u32 = (6 << 28) | ((tos as u32) << 20) | 0xABCDE;
        let mut h = w0.to_be_bytes().to_vec();
        h.extend((l4.len() as u16).to_be_bytes());
        h.extend([proto, 64]);
        h.extend(
            [0x20, 0x01, 0x0d, 0xb8]
                .iter()
                .chain([0u8; 11].iter())
                .chain([1].iter()),
        );
        h.extend(
            [0x20, 0x01, 0x0d, 0xb8]
                .iter()
                .chain([0u8; 11].iter())
                .chain([2].iter()),
        );
        h.extend_from_slice(l4);
        h
    }

    fn eth(v6: bool, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(if v6 { ETH_P_IPV6 } else { ETH_P_IPV4 }.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    fn udp(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = 0xC000u16.to_be_bytes().to_vec();
        u.extend(dport.to_be_bytes());
        u.extend(((8 + payload.len()) as u16).to_be_bytes());
        u.extend([0, 0]);
        u.extend_from_slice(payload);
        u
    }

    fn bth(opcode: u8) -> Vec<u8> {
        let mut b = vec![opcode, 0, 0xFF, 0xFF, 0, 0, 0x12, 0x34, 0, 0, 0, 1];
        b.extend([0u8; 16]);
        b.extend([0xDE, 0xAD, 0xBE, 0xEF]); // ICRC
        b
    }

    fn frame(v6: bool, tos: u8, l4: &[u8]) -> Vec<u8> {
        if v6 {
            eth(true, &ip6(tos, IPPROTO_UDP, l4))
        } else {
            eth(false, &ip4(tos, IPPROTO_UDP, l4))
        }
    }

    fn vxlan(outer_v6: bool, outer_tos: u8, inner: &[u8]) -> Vec<u8> {
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0, 0x13, 0x89, 0];
        vx.extend_from_slice(inner);
        frame(outer_v6, outer_tos, &udp(DEFAULT_VXLAN_PORT, &vx))
    }

    fn tos_at(f: &[u8], l3: usize, v6: bool) -> u8 {
        if v6 {
            ((u16::from_be_bytes([f[l3], f[l3 + 1]]) >> 4) & 0xFF) as u8
        } else {
            f[l3 + 1]
        }
    }

    #[test]
    fn ecn_encapsulation_kernel_mode_turns_inner_ce_into_ect0_rfc6040_copies_it() {
        let kernel: Vec<u8> = (0..4).map(|e| ecn_encapsulate(e, ECN_KERNEL)).collect();
        let rfc: Vec<u8> = (0..4).map(|e| ecn_encapsulate(e, ECN_RFC6040)).collect();
        assert_eq!(kernel, [ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_ECT0]);
        assert_eq!(rfc, [ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE]);
    }

    #[test]
    fn ecn_decapsulation_follows_the_rfc6040_table() {
        // Rows: inner Not-ECT, ECT(0), ECT(1), CE; columns: outer Not-ECT, ECT(0), ECT(1), CE.
        let n = Some(ECN_NOT_ECT);
        let (e0, e1, ce) = (Some(ECN_ECT0), Some(ECN_ECT1), Some(ECN_CE));
        let table = [
            (ECN_NOT_ECT, [n, n, n, None]),
            (ECN_ECT0, [e0, e0, e1, ce]),
            (ECN_ECT1, [e1, e1, e1, ce]),
            (ECN_CE, [ce, ce, ce, ce]),
        ];
        for (inner, row) in table {
            for (outer, want) in [ECN_NOT_ECT, ECN_ECT0, ECN_ECT1, ECN_CE]
                .into_iter()
                .zip(row)
            {
                assert_eq!(
                    ecn_decapsulate(outer, inner),
                    want,
                    "inner {inner} outer {outer}"
                );
            }
        }
    }

    #[test]
    fn incremental_checksum_equals_one_from_scratch_for_every_tos_pair() {
        for from in 0..=255u8 {
            let h = ip4(from, IPPROTO_UDP, &[]);
            let check = u16::from_be_bytes([h[10], h[11]]);
            for to in 0..=255u8 {
                let mut g = h[..20].to_vec();
                g[1] = to;
                let inc = csum_replace16(
                    check,
                    u16::from_be_bytes([0x45, from]),
                    u16::from_be_bytes([0x45, to]),
                );
                g[10..12].copy_from_slice(&[0, 0]);
                assert_eq!(inc, ipv4_checksum(&g), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn roce_data_gets_the_roce_dscp_and_keeps_its_ecn() {
        for v6 in [false, true] {
            for ecn in 0..4 {
                let mut f = frame(v6, (10 << 2) | ecn, &udp(DEFAULT_ROCE_PORT, &bth(0x04)));
                let before = f.clone();
                let a = apply(&mut f, &Policy::default(), &ENFORCE);
                assert_eq!(
                    (a.kind, a.new_tos, a.priority),
                    (Kind::RoceData, (26 << 2) | ecn, Some(3))
                );
                assert_eq!(tos_at(&f, 14, v6), (26 << 2) | ecn);
                assert_eq!(f.len(), before.len());
                // Only the TOS word (and the IPv4 checksum) changed; the ICRC is untouched.
                let changed: Vec<usize> = (0..f.len()).filter(|&i| f[i] != before[i]).collect();
                assert!(
                    changed
                        .iter()
                        .all(|&i| i == 14 || i == 15 || (!v6 && (i == 24 || i == 25))),
                    "{changed:?}"
                );
                if !v6 {
                    let mut h = f[14..34].to_vec();
                    let c = u16::from_be_bytes([h[10], h[11]]);
                    h[10..12].copy_from_slice(&[0, 0]);
                    assert_eq!(c, ipv4_checksum(&h));
                } else {
                    // Flow label kept.
                    assert_eq!(
                        u32::from_be_bytes([f[14], f[15], f[16], f[17]]) & 0xFFFFF,
                        0xABCDE
                    );
                }
            }
        }
    }

    #[test]
    fn cnp_gets_the_cnp_dscp_and_priority_six() {
        let mut f = frame(false, 106, &udp(DEFAULT_ROCE_PORT, &bth(0x81)));
        let a = apply(&mut f, &Policy::default(), &ENFORCE);
        assert_eq!(
            (a.kind, a.new_tos, a.priority),
            (Kind::Cnp, (48 << 2) | 2, Some(6))
        );
    }

    #[test]
    fn non_roce_on_a_lossless_dscp_is_remarked_others_keep_theirs() {
        let mut f = frame(false, 106, &udp(5000, &[0; 16]));
        let a = apply(&mut f, &Policy::default(), &ENFORCE);
        assert_eq!(
            (a.kind, a.old_tos, a.new_tos, a.priority),
            (Kind::Intruder, 106, 2, Some(0))
        );
        assert_eq!(f[15], 2);
        let mut g = frame(false, 46 << 2, &udp(5000, &[0; 16]));
        let a = apply(&mut g, &Policy::default(), &ENFORCE);
        assert_eq!(
            (a.kind, a.new_tos, a.priority),
            (Kind::Other, 46 << 2, Some(5))
        );
        assert!(!a.rewrites());
    }

    #[test]
    fn a_truncated_bth_is_not_roce() {
        let mut short = bth(0x04);
        short.truncate(11);
        let mut f = frame(false, 106, &udp(DEFAULT_ROCE_PORT, &short));
        assert_eq!(
            apply(&mut f, &Policy::default(), &ENFORCE).kind,
            Kind::Intruder
        );
    }

    #[test]
    fn audit_mode_changes_no_byte_and_reports_what_enforce_would_do() {
        for tos in 0..=255u8 {
            for payload in [udp(DEFAULT_ROCE_PORT, &bth(0x0A)), udp(9, &[1; 8])] {
                let mut f = frame(false, tos, &payload);
                let before = f.clone();
                let audit = apply(&mut f, &Policy::default(), &AUDIT);
                assert_eq!(f, before);
                let mut g = before.clone();
                let enforce = apply(&mut g, &Policy::default(), &ENFORCE);
                assert_eq!(
                    Action {
                        enforce: true,
                        ..audit
                    },
                    enforce
                );
                let rename = |s: Option<u32>| {
                    s.map(|i| match i {
                        STAT_QOS_AUDIT_ROCE_REWRITE => STAT_QOS_ROCE_REWRITTEN,
                        STAT_QOS_AUDIT_INTRUDER_REMARK => STAT_QOS_INTRUDER_REMARKED,
                        STAT_QOS_AUDIT_PRIORITY => STAT_QOS_PRIORITY_SET,
                        other => panic!("audit bumped {other}"),
                    })
                };
                assert_eq!(action_stats(&audit).map(rename), action_stats(&enforce));
            }
        }
    }

    #[test]
    fn vtep_propagates_inner_dscp_and_ecn_and_leaves_the_inner_packet_alone() {
        for outer_v6 in [false, true] {
            for inner_tos in 0..=255u8 {
                let inner = eth(false, &ip4(inner_tos, IPPROTO_UDP, &udp(7, &[0; 8])));
                for mode in [ECN_KERNEL, ECN_RFC6040] {
                    let mut f = vxlan(outer_v6, 0, &inner);
                    let a = apply(&mut f, &Policy::default(), &IfaceQos { ecn: mode, ..VTEP });
                    let want = (inner_tos & 0xFC) | ecn_encapsulate(inner_tos & 3, mode);
                    assert_eq!((a.kind, a.new_tos), (Kind::Vtep, want));
                    assert_eq!(tos_at(&f, 14, outer_v6), want);
                    assert_eq!(&f[f.len() - inner.len()..], &inner[..]);
                    assert_eq!(a.priority, Some((inner_tos >> 5) as u32));
                }
            }
        }
    }

    #[test]
    fn vtep_never_erases_an_outer_ce_mark() {
        for inner_tos in 0..=255u8 {
            let inner = eth(false, &ip4(inner_tos, IPPROTO_UDP, &udp(7, &[0; 8])));
            for mode in [ECN_KERNEL, ECN_RFC6040] {
                for outer_ecn in 0..4u8 {
                    let mut f = vxlan(false, outer_ecn, &inner);
                    let iface = IfaceQos { ecn: mode, ..VTEP };
                    let a = apply(&mut f, &Policy::default(), &iface);
                    let want_ecn = if outer_ecn == ECN_CE {
                        ECN_CE
                    } else {
                        ecn_encapsulate(inner_tos & 3, mode)
                    };
                    assert_eq!(a.new_tos, (inner_tos & 0xFC) | want_ecn);
                    assert_eq!(tos_at(&f, 14, false), a.new_tos);
                }
            }
        }
    }

    #[test]
    fn vtep_table_overrides_the_outer_dscp() {
        let mut p = Policy::default();
        p.table[10].vtep_outer = 26;
        let inner = eth(true, &ip6((10 << 2) | 1, IPPROTO_UDP, &udp(7, &[0; 8])));
        let mut f = vxlan(false, 0, &inner);
        let a = apply(&mut f, &p, &VTEP);
        assert_eq!(a.new_tos, (26 << 2) | 1);
        assert_eq!(f[15], (26 << 2) | 1);
    }

    #[test]
    fn decap_check_counts_lost_markings_and_ce_cases() {
        let p = Policy::default();
        let check = |outer_tos: u8, inner_tos: u8| {
            let inner = eth(false, &ip4(inner_tos, IPPROTO_UDP, &udp(7, &[0; 8])));
            let f = vxlan(false, outer_tos, &inner);
            decap_check(&crate::packet::SlicePacket(&f), &p.config, &p.table).unwrap()
        };
        let c = check(0, 106);
        assert!(c.dscp_mismatch && !c.ce_over_ect && !c.ce_over_not_ect);
        assert_eq!(
            c.remote,
            vtep_key_v4(u32::from_ne_bytes([198, 18, 0, 1]), 5001)
        );
        let c = check(107, 106);
        assert!(!c.dscp_mismatch && c.ce_over_ect && !c.ce_over_not_ect);
        let c = check(107, 104);
        assert!(!c.dscp_mismatch && !c.ce_over_ect && c.ce_over_not_ect);
        assert!(!c.inner_ce);
        let c = check(107, 107);
        assert!(!c.dscp_mismatch && !c.ce_over_ect && !c.ce_over_not_ect);
        // Marked before encapsulation, whatever the outer header carries.
        assert!(c.inner_ce && check(106, 107).inner_ce);
        let plain = frame(false, 106, &udp(DEFAULT_ROCE_PORT, &bth(4)));
        assert_eq!(
            decap_check(&crate::packet::SlicePacket(&plain), &p.config, &p.table),
            None
        );
    }

    #[test]
    fn no_policy_on_the_interface_touches_nothing() {
        let mut f = frame(false, 106, &udp(5000, &[0; 8]));
        let before = f.clone();
        assert_eq!(
            apply(&mut f, &Policy::default(), &IfaceQos::default()).kind,
            Kind::Untouched
        );
        assert_eq!(f, before);
    }
}
