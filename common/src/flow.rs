//! The flow tables' keys and slots, and the one function that counts a packet on a flow.

use crate::bth::{self, SyndromeClass};
use crate::classify::Parsed;
use crate::event::{Trouble, EVENT_CNP, EVENT_NAK, EVENT_NONE, EVENT_PSN_GAP, EVENT_RNR_NAK};
use crate::psn;
use crate::wire::ECN_CE;

/// `FlowKey::flags` bits.
pub const KEY_OUTER_V6: u32 = 1 << 0;
pub const KEY_INNER_V6: u32 = 1 << 1;
pub const KEY_TUNNELLED: u32 = 1 << 2;
/// Counted on egress (tc) rather than on ingress (XDP): the same queue pair seen
/// leaving an interface is another flow than it arriving.
pub const KEY_EGRESS: u32 = 1 << 3;

/// One direction of one queue pair, as seen on one interface.
/// Addresses are four raw (network-order) words; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d).
/// Built from whole words only, so that the kernel never needs a byte-wise memset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Inner addresses when tunnelled, zero otherwise.
    pub inner_src: [u32; 4],
    pub inner_dst: [u32; 4],
    /// VXLAN network identifier (valid when `KEY_TUNNELLED`).
    pub vni: u32,
    /// BTH destination QP.
    pub dest_qp: u32,
    pub ifindex: u32,
    /// `KEY_*` bits: address families, tunnelled, direction.
    pub flags: u32,
}

impl FlowKey {
    pub fn tunnelled(&self) -> bool {
        self.flags & KEY_TUNNELLED != 0
    }
    pub fn outer_v6(&self) -> bool {
        self.flags & KEY_OUTER_V6 != 0
    }
    pub fn inner_v6(&self) -> bool {
        self.flags & KEY_INNER_V6 != 0
    }
    /// Counted by the tc egress program (false: by XDP, on ingress).
    pub fn egress(&self) -> bool {
        self.flags & KEY_EGRESS != 0
    }
}

/// `FlowKey4::qp_dir` bit: counted on egress (a QP number has 24 bits).
pub const KEY4_EGRESS: u32 = 1 << 31;

/// The key of a plain (untunnelled) IPv4 flow in FLOWS4: the same flow as its
/// [`FlowKey`] (see [`FlowKey4::widen`]) in 16 bytes, which the kernel hashes and
/// compares in a fifth of the time of the 80-byte key (BENCHMARKS.md, issue 15).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey4 {
    /// Source and destination address, raw (network order).
    pub src: u32,
    pub dst: u32,
    /// BTH destination QP, with [`KEY4_EGRESS`] set when counted on egress.
    pub qp_dir: u32,
    pub ifindex: u32,
}

impl FlowKey4 {
    /// The compact key of a wide one, when the flow is plain IPv4.
    #[inline(always)]
    pub fn narrow(key: &FlowKey) -> Option<FlowKey4> {
        if key.flags & !KEY_EGRESS != 0 {
            return None;
        }
        let dir = if key.egress() { KEY4_EGRESS } else { 0 };
        Some(FlowKey4 {
            src: key.src[3],
            dst: key.dst[3],
            qp_dir: key.dest_qp | dir,
            ifindex: key.ifindex,
        })
    }

    /// The wide key of the same flow, as the flows document and events show it.
    #[inline(always)]
    pub fn widen(&self) -> FlowKey {
        FlowKey {
            src: addr_v4_mapped(self.src),
            dst: addr_v4_mapped(self.dst),
            inner_src: [0; 4],
            inner_dst: [0; 4],
            vni: 0,
            dest_qp: self.qp_dir & !KEY4_EGRESS,
            ifindex: self.ifindex,
            flags: if self.qp_dir & KEY4_EGRESS != 0 {
                KEY_EGRESS
            } else {
                0
            },
        }
    }
}

/// `FlowKeyMid::qp_flags`: the key's `KEY_*` flags sit above the 24-bit QP.
const MID_FLAGS_SHIFT: u32 = 24;

/// The key of a plain IPv6 flow, or of an IPv4 flow in VXLAN over IPv4, in FLOWS_MID:
/// the same flow as its [`FlowKey`] (see [`FlowKeyMid::widen`]) in 40 bytes. The
/// kernel's hash (jhash) costs a round per 12 bytes of key, and on the 80-byte key it
/// was most of the IPv6 and VXLAN packets' time (BENCHMARKS.md, "Keys by shape").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKeyMid {
    /// Plain IPv6: source then destination address. IPv4 in VXLAN over IPv4: outer
    /// source, outer destination, inner source, inner destination, VNI, then zeros.
    /// All raw (network order), as in [`FlowKey`].
    pub addr: [u32; 8],
    /// BTH destination QP, with the wide key's `KEY_*` flags (shape and direction) in
    /// the top byte, so that the two shapes never share a key.
    pub qp_flags: u32,
    pub ifindex: u32,
}

impl FlowKeyMid {
    /// The 40-byte key of a wide one, when the flow is plain IPv6 or IPv4 in VXLAN
    /// over IPv4.
    #[inline(always)]
    pub fn narrow(key: &FlowKey) -> Option<FlowKeyMid> {
        let addr = match key.flags & !KEY_EGRESS {
            KEY_OUTER_V6 => [
                key.src[0], key.src[1], key.src[2], key.src[3], key.dst[0], key.dst[1], key.dst[2],
                key.dst[3],
            ],
            KEY_TUNNELLED => [
                key.src[3],
                key.dst[3],
                key.inner_src[3],
                key.inner_dst[3],
                key.vni,
                0,
                0,
                0,
            ],
            _ => return None,
        };
        Some(FlowKeyMid {
            addr,
            qp_flags: key.dest_qp | key.flags << MID_FLAGS_SHIFT,
            ifindex: key.ifindex,
        })
    }

    /// The wide key of the same flow, as the flows document and events show it.
    pub fn widen(&self) -> FlowKey {
        let flags = self.qp_flags >> MID_FLAGS_SHIFT;
        let a = &self.addr;
        let mut key = FlowKey {
            dest_qp: self.qp_flags & ((1 << MID_FLAGS_SHIFT) - 1),
            ifindex: self.ifindex,
            flags,
            ..FlowKey::default()
        };
        if flags & KEY_TUNNELLED != 0 {
            key.src = addr_v4_mapped(a[0]);
            key.dst = addr_v4_mapped(a[1]);
            key.inner_src = addr_v4_mapped(a[2]);
            key.inner_dst = addr_v4_mapped(a[3]);
            key.vni = a[4];
        } else {
            key.src = [a[0], a[1], a[2], a[3]];
            key.dst = [a[4], a[5], a[6], a[7]];
        }
        key
    }
}

/// A flow key as the table that holds it spells it: the compact key in FLOWS4, the
/// 40-byte one in FLOWS_MID, the wide one (IPv6 on either side of a tunnel) in FLOWS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapedKey {
    Plain4(FlowKey4),
    Mid(FlowKeyMid),
    Wide(FlowKey),
}

impl ShapedKey {
    #[inline(always)]
    pub fn of(key: &FlowKey) -> ShapedKey {
        if let Some(k) = FlowKey4::narrow(key) {
            ShapedKey::Plain4(k)
        } else if let Some(k) = FlowKeyMid::narrow(key) {
            ShapedKey::Mid(k)
        } else {
            ShapedKey::Wide(*key)
        }
    }
}

/// The IPv4-mapped form of a raw IPv4 address word.
#[inline(always)]
pub fn addr_v4_mapped(raw: u32) -> [u32; 4] {
    [0, 0, u32::from_ne_bytes([0, 0, 0xFF, 0xFF]), raw]
}

/// The counters of one flow. In the kernel one value is shared by all CPUs (a slot of
/// FLOW_SLOTS): its counts are added atomically, the rest (clock, PSN state, last DSCP
/// and port) is written by whichever CPU counts the packet. [`FlowStats::merge`] adds
/// the values of one flow kept apart (other tables, other engines).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub packets: u64,
    /// Frame bytes from the Ethernet header on, no FCS.
    pub bytes: u64,
    /// Outer ECN codepoints, indexed by codepoint (Not-ECT, ECT(1), ECT(0), CE).
    pub ecn: [u64; 4],
    /// Inner ECN codepoints (tunnelled flows only).
    pub inner_ecn: [u64; 4],
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    /// PSN tracking state (see `psn`).
    pub psn: psn::PsnState,
    pub sport: u16,
    /// Outer DSCP of the last packet.
    pub last_dscp: u8,
    pub _pad: u8,
    /// The clock tick (jiffies, low 32 bits, in the kernel) `last_seen_ns` was read
    /// in: the clock is read again only when the tick changed (see `record`).
    pub seen_tick: u32,
}

/// Adds `n` to a counter. In the kernel another CPU may count on the same flow at the
/// same time, so the add is atomic there (a `lock xadd`); the user side's values are
/// its own.
#[inline(always)]
fn add(counter: &mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: `counter` is a valid, aligned u64 (a field of a map value).
    unsafe {
        use core::intrinsics::{atomic_xadd, AtomicOrdering};
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, n);
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        *counter += n;
    }
}

/// `FlowSlot::state`: the slot is on the free queue (or on its way there).
pub const SLOT_FREE: u32 = 0;
/// `FlowSlot::state`: the slot holds a flow that FLOWS4, FLOWS_MID or FLOWS points at.
pub const SLOT_LIVE: u32 = 1;
/// `FlowSlot::state`: the agent evicted the flow (its key is gone from its flow table);
/// the slot waits a poll interval, so that no program still counting on it is left,
/// before the agent zeroes it and queues it on FLOW_FREE.
pub const SLOT_EVICTED: u32 = 2;

/// One entry of FLOW_SLOTS, the array the flow tables point into: a flow's counters
/// and its wide key, in four cache lines. The agent maps the array into its memory and
/// reads it in order (docs/architecture.md, "The flow table").
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowSlot {
    /// Written by the packets of the flow: first, so that they touch the first lines.
    pub stats: FlowStats,
    /// The flow's key as the flows document shows it (also for a FLOWS4 or FLOWS_MID flow), written
    /// once when the slot is taken.
    pub key: FlowKey,
    /// [`SLOT_FREE`], [`SLOT_LIVE`] or [`SLOT_EVICTED`].
    pub state: u32,
    pub _reserved: [u32; 3],
}

impl FlowStats {
    /// Counts one packet of `frame_len` bytes on this flow, and says what trouble it
    /// showed (the sampled events: CE in either header, CNP, NAK, RNR NAK, PSN gap).
    ///
    /// `tick` is a cheap clock (the kernel's jiffies) and `now_ns` reads the clock that
    /// first/last seen are kept in; it is called only for a flow's first packet and when
    /// the tick changed since the flow's last one. The coarse clock it stands for moves
    /// only once a tick, so this saves its helper call on all other packets (about a
    /// tenth of the XDP program's time, BENCHMARKS.md).
    #[inline(always)]
    pub fn record(
        &mut self,
        p: &Parsed,
        frame_len: u32,
        tick: u32,
        now_ns: impl FnOnce() -> u64,
        default_pmtu_log2: u8,
    ) -> Trouble {
        if self.packets == 0 {
            let now = now_ns();
            self.first_seen_ns = now;
            self.last_seen_ns = now;
            self.seen_tick = tick;
        } else if tick != self.seen_tick {
            self.last_seen_ns = now_ns();
            self.seen_tick = tick;
        }
        add(&mut self.packets, 1);
        add(&mut self.bytes, frame_len as u64);
        self.sport = p.sport;
        self.last_dscp = p.outer_tos >> 2;
        let outer_ecn = p.outer_tos & 3;
        add(&mut self.ecn[outer_ecn as usize], 1);
        let mut ce = outer_ecn == ECN_CE;
        if p.tunnelled {
            let inner_ecn = p.inner_tos & 3;
            add(&mut self.inner_ecn[inner_ecn as usize], 1);
            ce |= inner_ecn == ECN_CE;
        }
        let mut kind = EVENT_NONE;
        let opcode = p.bth.opcode;
        if bth::is_cnp(opcode) {
            add(&mut self.cnps, 1);
            kind = EVENT_CNP;
        } else if bth::is_acknowledge(opcode) {
            if p.has_syndrome {
                match bth::syndrome_class(p.aeth_syndrome) {
                    SyndromeClass::Ack => add(&mut self.acks, 1),
                    SyndromeClass::RnrNak => {
                        add(&mut self.rnr_naks, 1);
                        kind = EVENT_RNR_NAK;
                    }
                    SyndromeClass::Nak => {
                        add(&mut self.naks, 1);
                        kind = EVENT_NAK;
                    }
                    SyndromeClass::Reserved => {}
                }
            }
        } else if bth::is_tracked_request(opcode) && self.psn.observe(p, default_pmtu_log2) {
            add(&mut self.psn_gaps, 1);
            kind = EVENT_PSN_GAP;
        }
        Trouble { ce, kind }
    }

    /// Adds another CPU's (or another table's) counters of the same flow.
    pub fn merge(&mut self, o: &FlowStats) {
        if o.packets == 0 {
            return;
        }
        let split = self.psn.split()
            || o.psn.split()
            || (self.packets != 0 && self.psn.tracked() && o.psn.tracked());
        let newer = o.last_seen_ns >= self.last_seen_ns || self.packets == 0;
        if self.packets == 0 || o.first_seen_ns < self.first_seen_ns {
            self.first_seen_ns = o.first_seen_ns;
        }
        self.packets += o.packets;
        self.bytes += o.bytes;
        for i in 0..4 {
            self.ecn[i] += o.ecn[i];
            self.inner_ecn[i] += o.inner_ecn[i];
        }
        self.cnps += o.cnps;
        self.acks += o.acks;
        self.naks += o.naks;
        self.rnr_naks += o.rnr_naks;
        self.psn_gaps += o.psn_gaps;
        if newer {
            self.last_seen_ns = o.last_seen_ns;
            self.sport = o.sport;
            self.last_dscp = o.last_dscp;
            self.psn = o.psn;
        }
        if split {
            self.psn.mark_split();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_whole_words() {
        assert_eq!(core::mem::size_of::<FlowSlot>(), 256);
        assert_eq!(core::mem::size_of::<FlowStats>(), 160);
        assert_eq!(core::mem::size_of::<FlowKey>(), 80);
        assert_eq!(core::mem::size_of::<FlowKey4>(), 16);
        assert_eq!(core::mem::size_of::<FlowKeyMid>(), 40);
        assert_eq!(core::mem::size_of::<FlowStats>() % 8, 0);
    }

    #[test]
    fn compact_keys_are_plain_ipv4_only_and_widen_back() {
        let plain = FlowKey {
            src: addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 1])),
            dst: addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 2])),
            dest_qp: 0x00ab_cdef,
            ifindex: 7,
            ..Default::default()
        };
        for flags in [0, KEY_EGRESS] {
            let wide = FlowKey { flags, ..plain };
            let narrow = FlowKey4::narrow(&wide).expect("plain IPv4");
            assert_eq!(narrow.qp_dir & KEY4_EGRESS != 0, flags != 0);
            assert_eq!(narrow.widen(), wide);
        }
        for flags in [KEY_OUTER_V6, KEY_TUNNELLED, KEY_TUNNELLED | KEY_INNER_V6] {
            assert_eq!(FlowKey4::narrow(&FlowKey { flags, ..plain }), None);
        }
    }

    #[test]
    fn each_shape_has_one_table_and_its_key_widens_back() {
        let v4 = |last| addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, last]));
        let v6 = |last| [u32::from_ne_bytes([0x20, 0x01, 0x0d, 0xb8]), 0, 0, last];
        let plain4 = FlowKey {
            src: v4(1),
            dst: v4(2),
            dest_qp: 0x00ab_cdef,
            ifindex: 7,
            ..Default::default()
        };
        let plain6 = FlowKey {
            src: v6(1),
            dst: v6(2),
            flags: KEY_OUTER_V6,
            ..plain4
        };
        let tunnel4 = FlowKey {
            inner_src: v4(3),
            inner_dst: v4(4),
            vni: 0x12_3456,
            flags: KEY_TUNNELLED,
            ..plain4
        };
        let tunnel6 = FlowKey {
            inner_src: v6(3),
            inner_dst: v6(4),
            flags: KEY_TUNNELLED | KEY_INNER_V6,
            ..tunnel4
        };
        let over6 = FlowKey {
            src: v6(1),
            dst: v6(2),
            flags: KEY_TUNNELLED | KEY_OUTER_V6,
            ..tunnel4
        };
        for egress in [0, KEY_EGRESS] {
            let with = |k: FlowKey| FlowKey {
                flags: k.flags | egress,
                ..k
            };
            match ShapedKey::of(&with(plain4)) {
                ShapedKey::Plain4(k) => assert_eq!(k.widen(), with(plain4)),
                other => panic!("{other:?}"),
            }
            for mid in [plain6, tunnel4] {
                match ShapedKey::of(&with(mid)) {
                    ShapedKey::Mid(k) => assert_eq!(k.widen(), with(mid)),
                    other => panic!("{other:?}"),
                }
            }
            for wide in [tunnel6, over6] {
                assert_eq!(ShapedKey::of(&with(wide)), ShapedKey::Wide(with(wide)));
            }
        }
        // The same words in both mid shapes are two flows: the flags tell them apart.
        let a = FlowKeyMid::narrow(&tunnel4).expect("mid");
        let b = FlowKeyMid::narrow(&FlowKey {
            src: [a.addr[0], a.addr[1], a.addr[2], a.addr[3]],
            dst: [a.addr[4], 0, 0, 0],
            flags: KEY_OUTER_V6,
            ..plain4
        })
        .expect("mid");
        assert_eq!(a.addr, b.addr);
        assert_ne!(a, b);
    }

    fn packet(opcode: u8, psn: u32, outer_tos: u8) -> Parsed {
        let mut p = Parsed::default();
        p.bth.opcode = opcode;
        p.bth.psn = psn;
        p.outer_tos = outer_tos;
        p
    }

    #[test]
    fn record_says_what_trouble_a_packet_showed() {
        use crate::event::{EVENT_CNP, EVENT_NAK, EVENT_NONE, EVENT_PSN_GAP, EVENT_RNR_NAK};
        let mut f = FlowStats::default();
        let t = |ce, kind| Trouble { ce, kind };
        // RC WRITE ONLY (0x0a) in order, ECT(0): nothing; CE: ce.
        assert_eq!(
            f.record(&packet(0x0a, 1, 0x6a), 60, 0, || 0, 12),
            Trouble::NONE
        );
        assert_eq!(
            f.record(&packet(0x0a, 2, 0x6b), 60, 0, || 0, 12),
            t(true, EVENT_NONE)
        );
        // A PSN ahead of the expected one, with CE: both.
        assert_eq!(
            f.record(&packet(0x0a, 9, 0x6b), 60, 0, || 0, 12),
            t(true, EVENT_PSN_GAP)
        );
        assert_eq!(
            f.record(&packet(0x81, 0, 0xc2), 60, 0, || 0, 12),
            t(false, EVENT_CNP)
        );
        let mut ack = packet(0x11, 3, 0x6a);
        ack.has_syndrome = true;
        for (syndrome, kind) in [(0x1f, EVENT_NONE), (0x21, EVENT_RNR_NAK), (0x60, EVENT_NAK)] {
            ack.aeth_syndrome = syndrome;
            assert_eq!(
                f.record(&ack, 60, 0, || 0, 12),
                t(false, kind),
                "{syndrome:#x}"
            );
        }
        // Inner CE of a tunnelled packet is CE too.
        let mut inner = packet(0x0a, 3, 0x6a);
        inner.tunnelled = true;
        inner.inner_tos = 0x03;
        let mut g = FlowStats::default();
        assert_eq!(g.record(&inner, 60, 0, || 0, 12), t(true, EVENT_NONE));
        assert_eq!(
            (f.psn_gaps, f.cnps, f.naks, f.rnr_naks, f.acks),
            (1, 1, 1, 1, 1)
        );
    }

    #[test]
    fn merging_two_cpus_that_tracked_requests_marks_the_psn_state_split() {
        let mut one = FlowStats::default();
        let mut other = FlowStats::default();
        // PSNs 1, 2 on one CPU, 3 on the other, 4 on the first again: a false gap there.
        one.record(&packet(0x0a, 1, 0x6a), 60, 0, || 0, 12);
        one.record(&packet(0x0a, 2, 0x6a), 60, 0, || 0, 12);
        other.record(&packet(0x0a, 3, 0x6a), 60, 0, || 0, 12);
        one.record(&packet(0x0a, 4, 0x6a), 60, 0, || 0, 12);
        let mut merged = FlowStats::default();
        merged.merge(&one);
        assert!(!merged.psn.split(), "one CPU is not split");
        merged.merge(&other);
        assert!(merged.psn.split());
        assert_eq!((merged.packets, merged.psn_gaps), (4, 1));
        // A CPU that saw only ACKs or CNPs of the flow tracked nothing: not split.
        let mut acks = FlowStats::default();
        acks.record(&packet(0x81, 0, 0x6a), 60, 0, || 0, 12);
        let mut merged = FlowStats::default();
        merged.merge(&one);
        merged.merge(&acks);
        assert!(!merged.psn.split());
    }

    #[test]
    fn merge_keeps_newest_dscp_and_sums_counts() {
        let mut a = FlowStats {
            packets: 2,
            bytes: 100,
            last_seen_ns: 10,
            first_seen_ns: 5,
            last_dscp: 26,
            ..Default::default()
        };
        let b = FlowStats {
            packets: 1,
            bytes: 50,
            last_seen_ns: 20,
            first_seen_ns: 3,
            last_dscp: 0,
            ..Default::default()
        };
        a.merge(&b);
        assert_eq!(
            (
                a.packets,
                a.bytes,
                a.first_seen_ns,
                a.last_seen_ns,
                a.last_dscp
            ),
            (3, 150, 3, 20, 0)
        );
    }
}
