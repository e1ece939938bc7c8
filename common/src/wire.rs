//! Wire constants: EtherTypes, IP protocol numbers, header sizes (docs/architecture.md, "Wire facts the code relies on").

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;
pub const VLAN_HLEN: usize = 4;
/// How many VLAN tags the parser walks through (802.1ad outer + 802.1Q inner).
pub const MAX_VLAN_TAGS: usize = 2;

pub const IPV4_MIN_HLEN: usize = 20;
pub const IPV6_HLEN: usize = 40;
pub const UDP_HLEN: usize = 8;
pub const VXLAN_HLEN: usize = 8;
/// The VXLAN "I" flag: the VNI field is valid (RFC 7348).
pub const VXLAN_FLAG_I: u8 = 0x08;

pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// The IPv6 extension headers the parser walks through (all others end the chain).
#[inline(always)]
pub fn is_ipv6_extension(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_FRAGMENT
    )
}

/// IPv4 version 4 with a 20-byte header (IHL 5): no options.
pub const IPV4_VER_IHL_NO_OPTIONS: u8 = 0x45;
/// The fragment offset of the IPv4 flags/fragment-offset field: non-zero in every
/// fragment but the first.
pub const IPV4_FRAG_OFFSET: u16 = 0x1FFF;
/// IPv6 extension headers skipped before giving up (counted as `ipv6_too_many_ext`).
pub const MAX_IPV6_EXT_HEADERS: usize = 4;

pub const DEFAULT_ROCE_PORT: u16 = 4791;
pub const DEFAULT_VXLAN_PORT: u16 = 4789;

/// ECN codepoints (low two bits of IPv4 TOS / IPv6 traffic class).
pub const ECN_NOT_ECT: u8 = 0;
pub const ECN_ECT1: u8 = 1;
pub const ECN_ECT0: u8 = 2;
pub const ECN_CE: u8 = 3;

/// Deepest byte the parser ever reads: 2 VLAN tags, IPv6 with 4 extension headers of
/// at most 2 KiB in theory, but we bound each extension header to keep the verifier's
/// offset range small; anything deeper is reported as truncated/too many headers.
pub const MAX_PARSE_OFFSET: usize = 1024;
