//! Mirror sessions: the GRE and ERSPAN headers a switch (or a Linux `gretap`,
//! `erspan` device) wraps a mirrored frame in, and the tag a mirrored flow is keyed by
//! in addition to its own key (docs/mirror.md has the layouts and their sources).
//!
//! The bit layouts are here; the walk that reads them is `classify.rs`'s, like every
//! other header's.

/// IP protocol number of GRE.
pub const IPPROTO_GRE: u8 = 47;

/// GRE (RFC 2784, RFC 2890): flags and version (16 bits), then the protocol type.
pub const GRE_HLEN: usize = 4;
/// The checksum present bit (C): 4 bytes of checksum and reserved follow.
pub const GRE_FLAG_C: u16 = 0x8000;
/// The routing present bit of RFC 1701 (R): source routes follow, never in a mirror.
pub const GRE_FLAG_R: u16 = 0x4000;
/// The key present bit (K): a 4-byte key follows the checksum.
pub const GRE_FLAG_K: u16 = 0x2000;
/// The sequence number present bit (S): a 4-byte sequence number follows the key.
pub const GRE_FLAG_S: u16 = 0x1000;
/// The version field (0 for GRE; 1 is PPTP's enhanced GRE).
pub const GRE_VERSION_MASK: u16 = 0x0007;

/// Protocol types a mirror session carries.
/// Transparent Ethernet bridging (`gretap`, `ip6gretap`): an Ethernet frame follows.
pub const GRE_PROTO_TEB: u16 = 0x6558;
/// ERSPAN types I and II (type II with the S bit and an 8-byte header).
pub const GRE_PROTO_ERSPAN2: u16 = 0x88BE;
/// ERSPAN type III (a 12-byte header).
pub const GRE_PROTO_ERSPAN3: u16 = 0x22EB;

/// The ERSPAN type II header: Ver(4) VLAN(12) COS(3) En(2) T(1) Session ID(10),
/// Reserved(12) Index(20).
pub const ERSPAN2_HLEN: usize = 8;
/// The ERSPAN type III header: Ver(4) VLAN(12) COS(3) BSO(2) T(1) Session ID(10),
/// Timestamp(32), SGT(16) P(1) FT(5) HW ID(6) D(1) Gra(2) O(1).
pub const ERSPAN3_HLEN: usize = 12;
/// The platform-specific subheader of ERSPAN type III, present when O is set.
pub const ERSPAN3_PLATFORM_HLEN: usize = 8;
/// The version field of the ERSPAN header: 1 in type II, 2 in type III.
pub const ERSPAN_VERSION_II: u8 = 1;
pub const ERSPAN_VERSION_III: u8 = 2;

/// The version of an ERSPAN header's first word.
#[inline(always)]
pub fn erspan_version(word0: u32) -> u8 {
    (word0 >> 28) as u8
}

/// The session ID of an ERSPAN header's first word (10 bits, both types).
#[inline(always)]
pub fn erspan_session(word0: u32) -> u32 {
    word0 & 0x03FF
}

/// The T bit of an ERSPAN header's first word: the switch truncated the copy.
#[inline(always)]
pub fn erspan_truncated(word0: u32) -> bool {
    word0 & 0x0400 != 0
}

/// The frame type of an ERSPAN type III header's third word (0: Ethernet).
#[inline(always)]
pub fn erspan3_frame_type(word2: u32) -> u8 {
    ((word2 >> 10) & 0x1F) as u8
}

/// The O bit of an ERSPAN type III header's third word: a platform-specific
/// subheader follows.
#[inline(always)]
pub fn erspan3_has_platform(word2: u32) -> bool {
    word2 & 1 != 0
}

/// The length of a GRE header with the optional fields its flags announce.
#[inline(always)]
pub fn gre_header_len(flags: u16) -> usize {
    let mut len = GRE_HLEN;
    if flags & GRE_FLAG_C != 0 {
        len += 4;
    }
    if flags & GRE_FLAG_K != 0 {
        len += 4;
    }
    if flags & GRE_FLAG_S != 0 {
        len += 4;
    }
    len
}

/// `MirrorTag::kind`: the encapsulation of the session.
pub const MIRROR_GRE: u32 = 1;
pub const MIRROR_ERSPAN2: u32 = 2;
pub const MIRROR_ERSPAN3: u32 = 3;
/// `MirrorTag::kind` bit: the sender's address is IPv6 (else IPv4, mapped).
pub const MIRROR_SOURCE_V6: u32 = 1 << 8;
/// The encapsulation part of `MirrorTag::kind`.
pub const MIRROR_KIND_MASK: u32 = 0xFF;

/// The mirror session a copy arrived in: what a mirrored flow is keyed by besides
/// the mirrored packet's own key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MirrorTag {
    /// The sender's address (the outer IP source), raw words, IPv4 mapped into IPv6
    /// as in the flow key.
    pub source: [u32; 4],
    /// The ERSPAN session ID, or the GRE key (0 without one).
    pub session: u32,
    /// `MIRROR_GRE`, `MIRROR_ERSPAN2` or `MIRROR_ERSPAN3`, with `MIRROR_SOURCE_V6`.
    pub kind: u32,
}

impl MirrorTag {
    /// `MIRROR_GRE`, `MIRROR_ERSPAN2` or `MIRROR_ERSPAN3`.
    pub fn encapsulation(&self) -> u32 {
        self.kind & MIRROR_KIND_MASK
    }

    pub fn source_v6(&self) -> bool {
        self.kind & MIRROR_SOURCE_V6 != 0
    }
}

/// A mirror copy's walk beyond its flow: the session, and the length of the mirrored
/// frame as sent (its L2 header and its IP datagram as the IP header declares it: a
/// truncated copy counts what the switch saw, not what it kept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorCopy {
    pub tag: MirrorTag,
    /// Offset of the mirrored Ethernet header in the frame.
    pub eth: usize,
    /// The ERSPAN T bit: the switch cut the copy.
    pub truncated: bool,
    /// Frame bytes to count: the mirrored frame's original length (0 until the
    /// mirrored IP header parsed).
    pub wire_len: u32,
}

/// What `xdp_mirror` hands the program it tail-calls for a mirror copy
/// (`xdp_mirror_flows`), through a per-CPU map entry: where the mirrored frame starts
/// and ends, and the copy's session.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorScratch {
    pub tag: MirrorTag,
    /// Offset of the mirrored frame in the copy: `xdp_mirror` moved the packet's start
    /// there, `xdp_mirror_flows` moves it back.
    pub eth: u32,
    /// Where the frame to walk ends, from its first byte (a copy's outer datagram
    /// ends there).
    pub end: u32,
    /// The ERSPAN T bit.
    pub truncated: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erspan_fields_follow_the_kernel_header() {
        // Ver 1, VLAN 0x123, COS 5, En 3, T 1, session 0x2AB (include/net/erspan.h).
        let word0 = (1 << 28) | (0x123 << 16) | (5 << 13) | (3 << 11) | (1 << 10) | 0x2AB;
        assert_eq!(erspan_version(word0), 1);
        assert_eq!(erspan_session(word0), 0x2AB);
        assert!(erspan_truncated(word0));
        assert!(!erspan_truncated(word0 & !0x0400));
        // SGT 0xBEEF, P 1, FT 2, HW ID 0x3F, D 1, Gra 2, O 1 (struct erspan_md2).
        let word2 = (0xBEEF << 16) | (1 << 15) | (2 << 10) | (0x3F << 4) | (1 << 3) | (2 << 1) | 1;
        assert_eq!(erspan3_frame_type(word2), 2);
        assert!(erspan3_has_platform(word2));
        assert_eq!(erspan3_frame_type(0xFFFF_83F6), 0);
        assert!(!erspan3_has_platform(0xFFFF_FFFE));
    }

    #[test]
    fn gre_options_add_four_bytes_each() {
        assert_eq!(gre_header_len(0), 4);
        assert_eq!(gre_header_len(GRE_FLAG_S), 8);
        assert_eq!(gre_header_len(GRE_FLAG_K | GRE_FLAG_S), 12);
        assert_eq!(gre_header_len(GRE_FLAG_C | GRE_FLAG_K | GRE_FLAG_S), 16);
    }
}
