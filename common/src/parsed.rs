//! What the classifier makes of a frame: a RoCE packet parsed as far as its BTH
//! ([`Parsed`]), or the class of a frame that is not RoCE, or the reason it could not
//! be parsed ([`Outcome`]). The names of classes and reasons are what `/flows` and
//! `/metrics` show.

use crate::bth::{self, Bth, BTH_LEN};
use crate::key::FlowKey;
use crate::wire::UDP_HLEN;

/// An enum, its names and its count from one list: the names are what `/flows` and
/// `/metrics` show, in the enum's order.
macro_rules! named_enum {
    ($(#[$em:meta])* pub enum $E:ident, $NAMES:ident, $COUNT:ident {
        $( $(#[$m:meta])* $V:ident = $name:literal ),* $(,)?
    }) => {
        $(#[$em])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u32)]
        pub enum $E { $( $(#[$m])* $V ),* }
        pub const $COUNT: usize = [$($name),*].len();
        pub const $NAMES: [&str; $COUNT] = [$($name),*];
    };
}

named_enum! {
    /// What the classifier made of a frame that it could parse.
    pub enum Class, CLASS_NAMES, CLASS_COUNT {
        Roce = "roce",
        RoceInVxlan = "roce_in_vxlan",
        VxlanOther = "vxlan_other",
        OtherUdp = "other_udp",
        OtherIp = "other_ip",
        NonIp = "non_ip",
        /// A mirror copy (GRE, ERSPAN II or III on a mirror interface, or in `analyze`)
        /// whose mirrored frame is not RoCE: not IP, not UDP, another port, VXLAN
        /// without RoCE, an ERSPAN III frame type other than Ethernet, or ERSPAN type I.
        MirrorOther = "mirror_other",
        /// A mirror copy cut before its mirrored frame's BTH (a switch truncating
        /// copies, ERSPAN's T bit): what it held cannot be told.
        MirrorTruncated = "mirror_truncated",
    }
}

named_enum! {
    /// Why a frame could not be parsed as far as the BTH (or, for the last one, why an
    /// extension header that counting needs was missing). Each has its own counter.
    pub enum Reason, REASON_NAMES, REASON_COUNT {
        TruncatedEth = "truncated_eth",
        TruncatedVlan = "truncated_vlan",
        TooManyVlanTags = "too_many_vlan_tags",
        TruncatedIpv4 = "truncated_ipv4",
        BadIpv4Ihl = "bad_ipv4_ihl",
        BadIpVersion = "bad_ip_version",
        Ipv4Fragment = "ipv4_fragment",
        TruncatedIpv6 = "truncated_ipv6",
        TruncatedIpv6Ext = "truncated_ipv6_ext",
        TooManyIpv6Ext = "too_many_ipv6_ext",
        Ipv6Fragment = "ipv6_fragment",
        TruncatedUdp = "truncated_udp",
        TruncatedBth = "truncated_bth",
        TruncatedVxlan = "truncated_vxlan",
        BadVxlanFlags = "bad_vxlan_flags",
        TruncatedInnerEth = "truncated_inner_eth",
        TruncatedInnerIpv4 = "truncated_inner_ipv4",
        BadInnerIpv4Ihl = "bad_inner_ipv4_ihl",
        InnerIpv4Fragment = "inner_ipv4_fragment",
        TruncatedInnerIpv6 = "truncated_inner_ipv6",
        TruncatedInnerIpv6Ext = "truncated_inner_ipv6_ext",
        TooManyInnerIpv6Ext = "too_many_inner_ipv6_ext",
        InnerIpv6Fragment = "inner_ipv6_fragment",
        TruncatedInnerUdp = "truncated_inner_udp",
        TruncatedInnerBth = "truncated_inner_bth",
        /// The BTH parsed but the AETH/RETH that counting needs was cut off: the packet
        /// still counts on its flow, without its ACK/NAK class or READ length.
        TruncatedExtHeader = "truncated_ext_header",
        /// A mirror copy's GRE header (with the checksum, key and sequence number its
        /// flags announce) cut short.
        TruncatedGre = "truncated_gre",
        /// A mirror copy's ERSPAN header (or ERSPAN III's platform subheader) cut short.
        TruncatedErspan = "truncated_erspan",
        /// An ERSPAN header whose version is not its GRE protocol's (1 under 0x88BE,
        /// 2 under 0x22EB).
        BadErspanVersion = "bad_erspan_version",
    }
}

impl Reason {
    /// The frame (or a datagram its headers declare) ended inside a header.
    pub fn is_truncation(self) -> bool {
        use Reason::*;
        matches!(
            self,
            TruncatedEth
                | TruncatedVlan
                | TruncatedIpv4
                | TruncatedIpv6
                | TruncatedIpv6Ext
                | TruncatedUdp
                | TruncatedBth
                | TruncatedVxlan
                | TruncatedInnerEth
                | TruncatedInnerIpv4
                | TruncatedInnerIpv6
                | TruncatedInnerIpv6Ext
                | TruncatedInnerUdp
                | TruncatedInnerBth
        )
    }
}

/// A RoCEv2 packet parsed as far as its BTH (and the AETH/RETH that counting needs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// `Class::Roce` or `Class::RoceInVxlan`.
    pub tunnelled: bool,
    /// Flow key without ifindex and direction (the caller knows those).
    pub key: FlowKey,
    /// Outer IPv4 TOS / IPv6 traffic class.
    pub outer_tos: u8,
    /// Inner TOS / traffic class (0 when not tunnelled).
    pub inner_tos: u8,
    /// UDP source port of the RoCE datagram (the inner one when tunnelled).
    pub sport: u16,
    /// The outer UDP source port of a tunnelled packet: the one the underlay's ECMP
    /// hashes on, which the VTEP chose (0 when not tunnelled).
    pub outer_sport: u16,
    /// UDP length of the RoCE datagram, as its header declares it.
    pub udp_len: u16,
    pub bth: Bth,
    /// AETH syndrome when `has_syndrome` (0 otherwise); see [`Parsed::syndrome`].
    /// Plain fields written on every path, like `Layers::roce`: with an `Option`,
    /// LLVM computed the syndrome class from an unset stack slot on paths without
    /// one, which the verifier rejects (a packet pointer had been spilled there).
    pub aeth_syndrome: u8,
    /// The opcode carries an AETH and its syndrome was in the frame.
    pub has_syndrome: bool,
    /// RETH DMA length of a READ request.
    pub read_len: u32,
    /// An AETH or RETH that counting needs was cut off.
    pub ext_truncated: bool,
}

/// What `xdp_classify` hands `xdp_count` (COUNT_SCRATCH): the packet as parsed, the
/// interface and the frame's length.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountScratch {
    pub parsed: Parsed,
    pub ifindex: u32,
    pub frame_len: u32,
}

impl Parsed {
    /// The AETH syndrome, when the opcode carries one and it was present.
    #[inline(always)]
    pub fn syndrome(&self) -> Option<u8> {
        self.has_syndrome.then_some(self.aeth_syndrome)
    }

    pub fn class(&self) -> Class {
        if self.tunnelled {
            Class::RoceInVxlan
        } else {
            Class::Roce
        }
    }

    /// Payload bytes of the RoCE packet (after extension headers, before pad and ICRC).
    // Inlined: called from both kernel programs, LLVM would otherwise make it a BPF
    // subprogram taking `&Parsed`, which forces the whole Parsed onto the stack.
    #[inline(always)]
    pub fn payload_len(&self) -> u32 {
        let overhead = (UDP_HLEN + BTH_LEN + bth::ext_headers_len(self.bth.opcode) + bth::ICRC_LEN)
            as u32
            + self.bth.pad_count() as u32;
        (self.udp_len as u32).saturating_sub(overhead)
    }
}

/// What the classifier made of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// RoCEv2, plain or in VXLAN: counts on a flow.
    Flow(Parsed),
    /// Parsed, but not RoCE: counts only in its class.
    Other(Class),
    /// Could not be parsed as far as the BTH: counts under its reason, creates no flow.
    Malformed(Reason),
}
