//! Flow keys: the wide key every path builds, and the compact shapes the kernel's
//! tables hold (FLOWS4, FLOWS_MID, FLOWS; mirrored flows FLOWS_MIRROR).

use crate::mirror::MirrorTag;

/// `FlowKey::flags` bits.
pub const KEY_OUTER_V6: u32 = 1 << 0;
pub const KEY_INNER_V6: u32 = 1 << 1;
pub const KEY_TUNNELLED: u32 = 1 << 2;
/// Counted on egress (tc) rather than on ingress (XDP): the same queue pair seen
/// leaving an interface is another flow than it arriving.
pub const KEY_EGRESS: u32 = 1 << 3;
/// Decapsulated from a mirror copy: the flow is the mirrored packet's, keyed also by
/// its mirror session ([`FlowKeyMirror`], FLOWS_MIRROR; the slot's session is in
/// MIRROR_TAGS).
pub const KEY_MIRROR: u32 = 1 << 4;

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
    /// Decapsulated from a mirror copy.
    pub fn mirrored(&self) -> bool {
        self.flags & KEY_MIRROR != 0
    }
}

/// The key of a mirrored flow in FLOWS_MIRROR: the mirrored packet's wide key (with
/// [`KEY_MIRROR`]) and the session it arrived in. A table of its own, so that the
/// common shapes' keys stay as short as they are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKeyMirror {
    pub key: FlowKey,
    pub tag: MirrorTag,
}

/// `FlowKey4::qp_dir` bit: counted on egress (a QP number has 24 bits).
pub const KEY4_EGRESS: u32 = 1 << 31;

/// The key of a plain (untunnelled) IPv4 flow in FLOWS4: the same flow as its
/// [`FlowKey`] (see [`FlowKey4::widen`]) in 16 bytes, which the kernel hashes and
/// compares in a fifth of the time of the 80-byte key (BENCHMARKS.md).
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
/// kernel's hash (jhash) costs a round per 12 bytes of key, and on an 80-byte key the
/// hash alone costs about as much as an empty program.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
