//! Frame builder: RoCEv2 (and anything around it) as bytes on the wire, for tests,
//! the traffic generator and benchmarks.
//!
//! Ethernet, VLAN, IPv4, IPv6 and UDP headers are written with `pnet`'s mutable
//! packet views; the InfiniBand transport headers (BTH and its extension headers) and
//! the ICRC are ours. Every builder is a pure function from a description to a
//! `Vec<u8>` holding one frame from the Ethernet header on (no FCS).
//!
//! ```
//! use roce_testkit::frame::*;
//! use std::net::Ipv4Addr;
//!
//! let eth = Eth::default();
//! let ip = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106);
//! // An RDMA WRITE ONLY of 64 bytes to QP 0x1234, PSN 7.
//! let msg = RoceMsg::new(opcode::RC_WRITE_ONLY, 0x1234, 7).with_reth(0x1000, 0x42, 64).with_payload(64);
//! let frame = roce_frame(&eth, &ip, 0xC000, &msg);
//! assert_eq!(frame.len(), 14 + 20 + 8 + 12 + 16 + 64 + 4);
//! // The same, carried in VXLAN VNI 5001 over an IPv4 underlay.
//! let outer = L3::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
//! let tunnelled = vxlan_frame(&eth, &outer, 0xD000, 5001, &frame);
//! assert_eq!(tunnelled.len(), frame.len() + 50);
//! // A CNP throttling QP 0x1234: 74 bytes untagged over IPv4.
//! assert_eq!(roce_frame(&eth, &ip, 0xC000, &cnp(0x1234)).len(), 74);
//! ```
//!
//! Layout: a frame built by [`udp_frame`] or [`roce_frame`] has its IP header at
//! `eth.header_len()`, its UDP header at `eth.header_len() + l3.header_len()`, and
//! (for RoCE) its BTH 8 bytes later. In a VXLAN frame the inner Ethernet header starts
//! at `eth.header_len() + outer.header_len() + 16`.
//!
//! Checksums: the IPv4 header checksum is always correct; the UDP checksum is 0 over
//! IPv4 (as RoCE NICs send it) and computed over IPv6. The ICRC is computed with
//! [`roce_common::icrc::icrc`] over the final headers; for IPv6 with extension
//! headers it covers the fixed header only (nobody carries RoCE behind those; the
//! frames exist to test parsers).

use std::net::{Ipv4Addr, Ipv6Addr};

use pnet::packet::ethernet::{EtherType, MutableEthernetPacket};
use pnet::packet::ip::IpNextHeaderProtocol;
use pnet::packet::ipv4::{self, MutableIpv4Packet};
use pnet::packet::ipv6::{
    MutableExtensionPacket, MutableFragmentPacket, MutableIpv6Packet, MutableRoutingPacket,
};
use pnet::packet::udp::{self, MutableUdpPacket};
use pnet::packet::vlan::{ClassOfService, MutableVlanPacket};
use pnet::packet::vxlan::MutableVxlanPacket;
use pnet::packet::MutablePacket as _;
use pnet::util::MacAddr;
use roce_common::bth::{
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, BTH_LEN, DETH_LEN, ICRC_LEN, IETH_LEN, IMMDT_LEN,
    RETH_LEN, XRCETH_LEN,
};
use roce_common::wire::{
    DEFAULT_ROCE_PORT, DEFAULT_VXLAN_PORT, ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4,
    ETH_P_IPV6, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPPROTO_UDP,
    IPV4_MIN_HLEN, IPV6_HLEN, UDP_HLEN, VLAN_HLEN, VXLAN_FLAG_I, VXLAN_HLEN,
};

/// Operation codes with their transport bits, by name.
pub mod opcode {
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_IMM: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_IMM: u8 = 0x05;
    pub const RC_WRITE_FIRST: u8 = 0x06;
    pub const RC_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_WRITE_LAST: u8 = 0x08;
    pub const RC_WRITE_LAST_IMM: u8 = 0x09;
    pub const RC_WRITE_ONLY: u8 = 0x0A;
    pub const RC_WRITE_ONLY_IMM: u8 = 0x0B;
    pub const RC_READ_REQUEST: u8 = 0x0C;
    pub const RC_READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const RC_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const RC_READ_RESPONSE_LAST: u8 = 0x0F;
    pub const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_INV: u8 = 0x16;
    pub const RC_SEND_ONLY_INV: u8 = 0x17;
    pub const UC_SEND_ONLY: u8 = 0x24;
    pub const UC_WRITE_ONLY: u8 = 0x2A;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
    pub const CNP: u8 = 0x81;
    /// The CNP opcode some NICs send (accepted as a CNP).
    pub const CNP_ALT: u8 = 0x80;
    /// Transport bits; OR one with a low-five-bit operation.
    pub const RC: u8 = 0x00;
    pub const UC: u8 = 0x20;
    pub const UD: u8 = 0x60;
    pub const XRC: u8 = 0xA0;
}

/// Every opcode the InfiniBand spec defines for RoCEv2 (RC, UC, UD, XRC) plus both CNP
/// opcodes, in ascending order.
pub fn defined_opcodes() -> Vec<u8> {
    let mut v = Vec::new();
    for t in [opcode::RC, opcode::XRC] {
        v.extend((0x00..=0x14).map(|o| t | o));
        v.extend([t | 0x16, t | 0x17]);
    }
    v.extend((0x00..=0x0B).map(|o| opcode::UC | o));
    v.extend([opcode::UD_SEND_ONLY, opcode::UD_SEND_ONLY_IMM]);
    v.extend([opcode::CNP_ALT, opcode::CNP]);
    v.sort_unstable();
    v
}

// ---------------------------------------------------------------------------------
// Link layer

/// One 802.1Q (TPID 0x8100) or 802.1ad (TPID 0x88A8) tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VlanTag {
    pub tpid: u16,
    /// Priority code point (3 bits).
    pub pcp: u8,
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// A customer tag (802.1Q, TPID 0x8100).
    pub fn dot1q(vid: u16) -> Self {
        VlanTag {
            tpid: ETH_P_8021Q,
            pcp: 0,
            dei: false,
            vid,
        }
    }
    /// A service tag (802.1ad, TPID 0x88A8), the outer tag of a QinQ frame.
    pub fn dot1ad(vid: u16) -> Self {
        VlanTag {
            tpid: ETH_P_8021AD,
            ..VlanTag::dot1q(vid)
        }
    }
    pub fn with_pcp(mut self, pcp: u8) -> Self {
        self.pcp = pcp;
        self
    }
}

/// The Ethernet header and its VLAN tags, outermost first. Any number of tags can be
/// written (the classifier walks two; three make a `too_many_vlan_tags` frame).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eth {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub vlans: Vec<VlanTag>,
}

impl Default for Eth {
    /// Locally administered 02:00:00:00:00:01 -> 02:00:00:00:00:02, untagged.
    fn default() -> Self {
        Eth {
            dst: [0x02, 0, 0, 0, 0, 0x02],
            src: [0x02, 0, 0, 0, 0, 0x01],
            vlans: Vec::new(),
        }
    }
}

impl Eth {
    pub fn new(src: [u8; 6], dst: [u8; 6]) -> Self {
        Eth {
            dst,
            src,
            vlans: Vec::new(),
        }
    }
    /// Adds a tag inside the ones already there.
    pub fn with_vlan(mut self, tag: VlanTag) -> Self {
        self.vlans.push(tag);
        self
    }
    /// Bytes from the destination MAC to the (innermost) EtherType inclusive.
    pub fn header_len(&self) -> usize {
        ETH_HLEN + VLAN_HLEN * self.vlans.len()
    }
}

// ---------------------------------------------------------------------------------
// Network layer

/// An IPv4 header. Total length, protocol and checksum are filled in by the builders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Hdr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// DSCP (high 6 bits) and ECN (low 2 bits).
    pub tos: u8,
    pub ttl: u8,
    pub id: u16,
    /// Flags (3 high bits) and fragment offset (13 bits) as on the wire; default DF (0x4000).
    pub flags_frag: u16,
    /// Option bytes; padded with End-of-Option-List (0) to a multiple of 4. IHL follows
    /// from their length (at most 40 bytes of options, IHL 15).
    pub options: Vec<u8>,
}

impl Ipv4Hdr {
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Ipv4Hdr {
            src,
            dst,
            tos: 0,
            ttl: 64,
            id: 0,
            flags_frag: 0x4000,
            options: Vec::new(),
        }
    }
    fn options_len(&self) -> usize {
        self.options.len().div_ceil(4) * 4
    }
}

/// One IPv6 extension header. `len` is the Hdr Ext Len field: the header takes
/// `8 * (len + 1)` bytes (filled with a PadN option, or zeros for routing data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Ext {
    HopByHop {
        len: u8,
    },
    Routing {
        len: u8,
        routing_type: u8,
        segments_left: u8,
    },
    DestOpts {
        len: u8,
    },
    /// 8 bytes; `offset` in 8-byte units (13 bits). A first fragment has offset 0.
    Fragment {
        offset: u16,
        more: bool,
        id: u32,
    },
}

impl Ipv6Ext {
    pub fn len(&self) -> usize {
        match *self {
            Ipv6Ext::HopByHop { len }
            | Ipv6Ext::DestOpts { len }
            | Ipv6Ext::Routing { len, .. } => 8 * (len as usize + 1),
            Ipv6Ext::Fragment { .. } => 8,
        }
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The Next Header value that announces this header.
    pub fn protocol(&self) -> u8 {
        match self {
            Ipv6Ext::HopByHop { .. } => IPPROTO_HOPOPTS,
            Ipv6Ext::Routing { .. } => IPPROTO_ROUTING,
            Ipv6Ext::DestOpts { .. } => IPPROTO_DSTOPTS,
            Ipv6Ext::Fragment { .. } => IPPROTO_FRAGMENT,
        }
    }
}

/// An IPv6 header and its extension headers (in order). Payload length and next
/// header are filled in by the builders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6Hdr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// DSCP (high 6 bits) and ECN (low 2 bits).
    pub tclass: u8,
    /// 20 bits.
    pub flow_label: u32,
    pub hop_limit: u8,
    pub ext: Vec<Ipv6Ext>,
}

impl Ipv6Hdr {
    pub fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Ipv6Hdr {
            src,
            dst,
            tclass: 0,
            flow_label: 0,
            hop_limit: 64,
            ext: Vec::new(),
        }
    }
}

/// The IP layer of a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum L3 {
    V4(Ipv4Hdr),
    V6(Ipv6Hdr),
}

impl L3 {
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        L3::V4(Ipv4Hdr::new(src, dst))
    }
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        L3::V6(Ipv6Hdr::new(src, dst))
    }
    /// Sets the IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN).
    pub fn with_tos(mut self, tos: u8) -> Self {
        match &mut self {
            L3::V4(h) => h.tos = tos,
            L3::V6(h) => h.tclass = tos,
        }
        self
    }
    /// Sets the ECN codepoint, keeping the DSCP.
    pub fn with_ecn(self, ecn: u8) -> Self {
        let tos = (self.tos() & !3) | (ecn & 3);
        self.with_tos(tos)
    }
    /// IPv4 options (see [`Ipv4Hdr::options`]); no effect on IPv6.
    pub fn with_options(mut self, options: &[u8]) -> Self {
        if let L3::V4(h) = &mut self {
            h.options = options.to_vec();
        }
        self
    }
    /// Appends an IPv6 extension header; no effect on IPv4.
    pub fn with_ext(mut self, ext: Ipv6Ext) -> Self {
        if let L3::V6(h) = &mut self {
            h.ext.push(ext);
        }
        self
    }
    pub fn tos(&self) -> u8 {
        match self {
            L3::V4(h) => h.tos,
            L3::V6(h) => h.tclass,
        }
    }
    pub fn ethertype(&self) -> u16 {
        match self {
            L3::V4(_) => ETH_P_IPV4,
            L3::V6(_) => ETH_P_IPV6,
        }
    }
    /// Bytes of the IP header including IPv4 options or IPv6 extension headers.
    pub fn header_len(&self) -> usize {
        match self {
            L3::V4(h) => IPV4_MIN_HLEN + h.options_len(),
            L3::V6(h) => IPV6_HLEN + h.ext.iter().map(Ipv6Ext::len).sum::<usize>(),
        }
    }
}

// ---------------------------------------------------------------------------------
// Transport headers of InfiniBand

/// RDMA Extended Transport Header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

/// Datagram Extended Transport Header (UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deth {
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl Default for Deth {
    fn default() -> Self {
        Deth {
            qkey: 0x1111_1111,
            src_qp: 1,
        }
    }
}

/// Atomic Extended Transport Header (COMPARE_SWAP, FETCH_ADD).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicEth {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// The extension headers of an opcode, in wire order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtHeader {
    Xrceth,
    Deth,
    Reth,
    AtomicEth,
    Aeth,
    AtomicAckEth,
    ImmDt,
    Ieth,
    /// The 16 reserved bytes of a CNP.
    CnpReserved,
}

impl ExtHeader {
    pub fn len(self) -> usize {
        match self {
            ExtHeader::Xrceth => XRCETH_LEN,
            ExtHeader::Deth => DETH_LEN,
            ExtHeader::Reth => RETH_LEN,
            ExtHeader::AtomicEth => ATOMIC_ETH_LEN,
            ExtHeader::Aeth => AETH_LEN,
            ExtHeader::AtomicAckEth => ATOMIC_ACK_ETH_LEN,
            ExtHeader::ImmDt => IMMDT_LEN,
            ExtHeader::Ieth => IETH_LEN,
            ExtHeader::CnpReserved => 16,
        }
    }
    pub fn is_empty(self) -> bool {
        false
    }
}

/// The extension headers that follow the BTH of `opcode` (IBA 9.2 / Annex A17), in wire
/// order. Reliable Datagram and reserved opcodes get none.
pub fn ext_headers(opcode: u8) -> Vec<ExtHeader> {
    use ExtHeader::*;
    let t = opcode & 0xE0;
    let o = opcode & 0x1F;
    if t == 0x80 {
        return vec![CnpReserved];
    }
    let mut v = Vec::new();
    match t {
        opcode::RC | opcode::UC | opcode::XRC => {
            let request = o <= 0x0C || o == 0x13 || o == 0x14 || o == 0x16 || o == 0x17;
            let defined = if t == opcode::UC {
                o <= 0x0B
            } else {
                o <= 0x17 && o != 0x15
            };
            if !defined {
                return v;
            }
            if t == opcode::XRC && request {
                v.push(Xrceth);
            }
            match o {
                0x03 | 0x05 | 0x09 => v.push(ImmDt),
                0x06 | 0x0A | 0x0C => v.push(Reth),
                0x0B => v.extend([Reth, ImmDt]),
                0x0D | 0x0F | 0x10 | 0x11 => v.push(Aeth),
                0x12 => v.extend([Aeth, AtomicAckEth]),
                0x13 | 0x14 => v.push(AtomicEth),
                0x16 | 0x17 => v.push(Ieth),
                _ => {}
            }
        }
        opcode::UD => match o {
            0x04 => v.push(Deth),
            0x05 => v.extend([Deth, ImmDt]),
            _ => {}
        },
        _ => {}
    }
    v
}

/// One RoCE packet (what follows the UDP header): BTH fields, the values of whichever
/// extension headers the opcode carries (others are ignored), and the payload size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoceMsg {
    pub opcode: u8,
    /// Solicited event (BTH byte 1 bit 7).
    pub solicited: bool,
    /// MigReq (BTH byte 1 bit 6).
    pub mig_req: bool,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// AETH syndrome: 0x00-0x1F ACK (credits), 0x20-0x3F RNR NAK (timer), 0x60-0x63 NAK.
    pub syndrome: u8,
    /// AETH message sequence number (24 bits).
    pub msn: u32,
    pub reth: Reth,
    pub deth: Deth,
    pub atomic: AtomicEth,
    /// AtomicAckETH: original remote data.
    pub atomic_orig: u64,
    /// ImmDt.
    pub imm: u32,
    /// IETH: the R_Key to invalidate.
    pub ieth_rkey: u32,
    /// XRCETH: XRC shared receive queue (24 bits).
    pub xrc_srq: u32,
    /// Payload bytes: `payload_pattern` repeated, or a counting pattern 0, 1, 2, ...
    pub payload_len: usize,
    /// What the payload repeats (empty: the counting pattern).
    pub payload_pattern: Vec<u8>,
    /// PadCnt and pad bytes; `None` pads the payload to a multiple of 4, as senders do.
    pub pad: Option<u8>,
}

impl RoceMsg {
    /// A packet of `opcode` to `dest_qp` at `psn`: P_Key 0xFFFF, no flags, no payload.
    pub fn new(opcode: u8, dest_qp: u32, psn: u32) -> Self {
        RoceMsg {
            opcode,
            solicited: false,
            mig_req: false,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
            syndrome: 0x1F,
            msn: 0,
            reth: Reth::default(),
            deth: Deth::default(),
            atomic: AtomicEth::default(),
            atomic_orig: 0,
            imm: 0,
            ieth_rkey: 0,
            xrc_srq: 0,
            payload_len: 0,
            payload_pattern: Vec::new(),
            pad: None,
        }
    }
    pub fn with_payload(mut self, len: usize) -> Self {
        self.payload_len = len;
        self
    }
    /// A payload that repeats `pattern` (cut at `payload_len`) instead of counting.
    pub fn with_payload_pattern(mut self, pattern: &[u8]) -> Self {
        self.payload_pattern = pattern.to_vec();
        self
    }
    pub fn with_ack_req(mut self, ack_req: bool) -> Self {
        self.ack_req = ack_req;
        self
    }
    pub fn with_fecn(mut self, fecn: bool) -> Self {
        self.fecn = fecn;
        self
    }
    pub fn with_becn(mut self, becn: bool) -> Self {
        self.becn = becn;
        self
    }
    pub fn with_pkey(mut self, pkey: u16) -> Self {
        self.pkey = pkey;
        self
    }
    pub fn with_syndrome(mut self, syndrome: u8) -> Self {
        self.syndrome = syndrome;
        self
    }
    pub fn with_reth(mut self, va: u64, rkey: u32, dma_len: u32) -> Self {
        self.reth = Reth { va, rkey, dma_len };
        self
    }
    pub fn with_pad(mut self, pad: u8) -> Self {
        self.pad = Some(pad & 3);
        self
    }

    /// An ACKNOWLEDGE (RC) carrying `syndrome` (ACK, RNR NAK or NAK).
    pub fn ack(dest_qp: u32, psn: u32, syndrome: u8) -> Self {
        RoceMsg::new(opcode::RC_ACKNOWLEDGE, dest_qp, psn).with_syndrome(syndrome)
    }
    /// An RC RDMA READ request of `len` bytes.
    pub fn read_request(dest_qp: u32, psn: u32, len: u32) -> Self {
        RoceMsg::new(opcode::RC_READ_REQUEST, dest_qp, psn)
            .with_ack_req(true)
            .with_reth(0x1000, 0x100, len)
    }
    /// An RC RDMA WRITE ONLY of `len` bytes.
    pub fn write_only(dest_qp: u32, psn: u32, len: usize) -> Self {
        RoceMsg::new(opcode::RC_WRITE_ONLY, dest_qp, psn)
            .with_ack_req(true)
            .with_reth(0x1000, 0x100, len as u32)
            .with_payload(len)
    }
    /// An RC SEND ONLY of `len` bytes.
    pub fn send_only(dest_qp: u32, psn: u32, len: usize) -> Self {
        RoceMsg::new(opcode::RC_SEND_ONLY, dest_qp, psn)
            .with_ack_req(true)
            .with_payload(len)
    }

    /// PadCnt as written into the BTH.
    pub fn pad_count(&self) -> u8 {
        match self.pad {
            Some(p) => p & 3,
            None => ((4 - self.payload_len % 4) % 4) as u8,
        }
    }

    /// Bytes from the BTH to the ICRC, exclusive.
    pub fn len(&self) -> usize {
        BTH_LEN
            + ext_headers(self.opcode)
                .iter()
                .map(|e| e.len())
                .sum::<usize>()
            + self.payload_len
            + self.pad_count() as usize
    }
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The BTH, extension headers, payload and pad (everything but the ICRC).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.len());
        let pad = self.pad_count();
        b.push(self.opcode);
        b.push((self.solicited as u8) << 7 | (self.mig_req as u8) << 6 | pad << 4);
        b.extend(self.pkey.to_be_bytes());
        b.push((self.fecn as u8) << 7 | (self.becn as u8) << 6);
        b.extend(&be24(self.dest_qp));
        b.push((self.ack_req as u8) << 7);
        b.extend(&be24(self.psn));
        for e in ext_headers(self.opcode) {
            match e {
                ExtHeader::Xrceth => {
                    b.push(0);
                    b.extend(&be24(self.xrc_srq));
                }
                ExtHeader::Deth => {
                    b.extend(self.deth.qkey.to_be_bytes());
                    b.push(0);
                    b.extend(&be24(self.deth.src_qp));
                }
                ExtHeader::Reth => {
                    b.extend(self.reth.va.to_be_bytes());
                    b.extend(self.reth.rkey.to_be_bytes());
                    b.extend(self.reth.dma_len.to_be_bytes());
                }
                ExtHeader::AtomicEth => {
                    b.extend(self.atomic.va.to_be_bytes());
                    b.extend(self.atomic.rkey.to_be_bytes());
                    b.extend(self.atomic.swap_add.to_be_bytes());
                    b.extend(self.atomic.compare.to_be_bytes());
                }
                ExtHeader::Aeth => {
                    b.push(self.syndrome);
                    b.extend(&be24(self.msn));
                }
                ExtHeader::AtomicAckEth => b.extend(self.atomic_orig.to_be_bytes()),
                ExtHeader::ImmDt => b.extend(self.imm.to_be_bytes()),
                ExtHeader::Ieth => b.extend(self.ieth_rkey.to_be_bytes()),
                ExtHeader::CnpReserved => b.extend([0u8; 16]),
            }
        }
        if self.payload_pattern.is_empty() {
            b.extend((0..self.payload_len).map(|i| i as u8));
        } else {
            b.extend(self.payload_pattern.iter().cycle().take(self.payload_len));
        }
        b.extend(std::iter::repeat_n(0u8, pad as usize));
        b
    }
}

/// A CNP (RoCEv2 Annex A17.9.3) throttling `dest_qp`: opcode 0x81, BECN set, P_Key
/// 0xFFFF, PSN 0, 16 reserved bytes. Use `RoceMsg { opcode: opcode::CNP_ALT, ..cnp(qp) }`
/// for the 0x80 variant.
pub fn cnp(dest_qp: u32) -> RoceMsg {
    RoceMsg::new(opcode::CNP, dest_qp, 0).with_becn(true)
}

fn be24(v: u32) -> [u8; 3] {
    let b = v.to_be_bytes();
    [b[1], b[2], b[3]]
}

// ---------------------------------------------------------------------------------
// Frames

/// An Ethernet frame: `eth` (with its tags), `ethertype`, then `payload`.
pub fn eth_frame(eth: &Eth, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let hlen = eth.header_len();
    let mut f = vec![0u8; hlen + payload.len()];
    // The EtherType after the MACs is the first tag's TPID, each tag names the next.
    let mut types: Vec<u16> = eth.vlans.iter().map(|v| v.tpid).collect();
    types.push(ethertype);
    if let Some(mut e) = MutableEthernetPacket::new(&mut f[..ETH_HLEN]) {
        e.set_destination(MacAddr::from(eth.dst));
        e.set_source(MacAddr::from(eth.src));
        e.set_ethertype(EtherType(types[0]));
    }
    for (i, tag) in eth.vlans.iter().enumerate() {
        // A tag on the wire is TCI (2) + next EtherType (2), after the previous type field.
        let at = ETH_HLEN - 2 + VLAN_HLEN * i + 2;
        if let Some(mut v) = MutableVlanPacket::new(&mut f[at..at + VLAN_HLEN]) {
            v.set_priority_code_point(ClassOfService(tag.pcp & 7));
            v.set_drop_eligible_indicator(tag.dei as u8);
            v.set_vlan_identifier(tag.vid & 0x0FFF);
            v.set_ethertype(EtherType(types[i + 1]));
        }
    }
    f[hlen..].copy_from_slice(payload);
    f
}

/// An IP packet: `l3` (options / extension headers included) announcing `proto`, then `l4`.
pub fn ip_packet(l3: &L3, proto: u8, l4: &[u8]) -> Vec<u8> {
    let hlen = l3.header_len();
    let mut p = vec![0u8; hlen + l4.len()];
    p[hlen..].copy_from_slice(l4);
    match l3 {
        L3::V4(h) => {
            let mut ip = MutableIpv4Packet::new(&mut p).expect("buffer holds a 20-byte header");
            ip.set_version(4);
            ip.set_header_length((hlen / 4) as u8);
            ip.set_dscp(h.tos >> 2);
            ip.set_ecn(h.tos & 3);
            ip.set_total_length((hlen + l4.len()) as u16);
            ip.set_identification(h.id);
            ip.set_flags((h.flags_frag >> 13) as u8);
            ip.set_fragment_offset(h.flags_frag & 0x1FFF);
            ip.set_ttl(h.ttl);
            ip.set_next_level_protocol(IpNextHeaderProtocol(proto));
            ip.set_source(h.src);
            ip.set_destination(h.dst);
            ip.get_options_raw_mut()[..h.options.len()].copy_from_slice(&h.options);
            let sum = ipv4::checksum(&ip.to_immutable());
            ip.set_checksum(sum);
        }
        L3::V6(h) => {
            let first_next = h.ext.first().map_or(proto, Ipv6Ext::protocol);
            {
                let mut ip = MutableIpv6Packet::new(&mut p).expect("buffer holds a 40-byte header");
                ip.set_version(6);
                ip.set_traffic_class(h.tclass);
                ip.set_flow_label(h.flow_label & 0xF_FFFF);
                ip.set_payload_length((hlen - IPV6_HLEN + l4.len()) as u16);
                ip.set_next_header(IpNextHeaderProtocol(first_next));
                ip.set_hop_limit(h.hop_limit);
                ip.set_source(h.src);
                ip.set_destination(h.dst);
            }
            let mut at = IPV6_HLEN;
            for (i, ext) in h.ext.iter().enumerate() {
                let next = h.ext.get(i + 1).map_or(proto, Ipv6Ext::protocol);
                write_ipv6_ext(&mut p[at..at + ext.len()], ext, next);
                at += ext.len();
            }
        }
    }
    p
}

fn write_ipv6_ext(buf: &mut [u8], ext: &Ipv6Ext, next: u8) {
    match *ext {
        Ipv6Ext::HopByHop { len } | Ipv6Ext::DestOpts { len } => {
            if let Some(mut e) = MutableExtensionPacket::new(buf) {
                e.set_next_header(IpNextHeaderProtocol(next));
                e.set_hdr_ext_len(len);
                // One PadN option fills the rest: type 1, length, zeros.
                let opts = e.payload_mut();
                let n = opts.len();
                opts[0] = 1;
                opts[1] = (n - 2) as u8;
            }
        }
        Ipv6Ext::Routing {
            len,
            routing_type,
            segments_left,
        } => {
            if let Some(mut r) = MutableRoutingPacket::new(buf) {
                r.set_next_header(IpNextHeaderProtocol(next));
                r.set_hdr_ext_len(len);
                r.set_routing_type(routing_type);
                r.set_segments_left(segments_left);
            }
        }
        Ipv6Ext::Fragment { offset, more, id } => {
            if let Some(mut fr) = MutableFragmentPacket::new(buf) {
                fr.set_next_header(IpNextHeaderProtocol(next));
                fr.set_fragment_offset_with_flags((offset & 0x1FFF) << 3 | more as u16);
                fr.set_id(id);
            }
        }
    }
}

/// An IP frame carrying protocol `proto` (e.g. 6 for a TCP-looking frame).
pub fn ip_frame(eth: &Eth, l3: &L3, proto: u8, l4: &[u8]) -> Vec<u8> {
    eth_frame(eth, l3.ethertype(), &ip_packet(l3, proto, l4))
}

/// A UDP frame. The UDP checksum is 0 over IPv4 and computed over IPv6.
pub fn udp_frame(eth: &Eth, l3: &L3, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut dgram = vec![0u8; UDP_HLEN + payload.len()];
    if let Some(mut u) = MutableUdpPacket::new(&mut dgram) {
        u.set_source(sport);
        u.set_destination(dport);
        u.set_length((UDP_HLEN + payload.len()) as u16);
        u.set_checksum(0);
    }
    dgram[UDP_HLEN..].copy_from_slice(payload);
    let mut f = ip_frame(eth, l3, IPPROTO_UDP, &dgram);
    set_udp_checksum(&mut f, eth, l3);
    f
}

/// Fills in the UDP checksum of a frame built by these builders (IPv6 only; IPv4 keeps 0).
fn set_udp_checksum(frame: &mut [u8], eth: &Eth, l3: &L3) {
    let L3::V6(h) = l3 else { return };
    let at = eth.header_len() + l3.header_len();
    if let Some(mut u) = MutableUdpPacket::new(&mut frame[at..]) {
        u.set_checksum(0);
        let sum = udp::ipv6_checksum(&u.to_immutable(), &h.src, &h.dst);
        // 0 means "no checksum"; RFC 8200 says send 0xFFFF then.
        u.set_checksum(if sum == 0 { 0xFFFF } else { sum });
    }
}

/// A RoCEv2 frame: UDP to port 4791 from `sport` (flow entropy, 0xC000-0xFFFF
/// typically), carrying `msg` and its ICRC.
pub fn roce_frame(eth: &Eth, l3: &L3, sport: u16, msg: &RoceMsg) -> Vec<u8> {
    roce_frame_to(eth, l3, sport, DEFAULT_ROCE_PORT, msg)
}

/// [`roce_frame`] to another UDP destination port.
pub fn roce_frame_to(eth: &Eth, l3: &L3, sport: u16, dport: u16, msg: &RoceMsg) -> Vec<u8> {
    let mut body = msg.encode();
    body.extend([0u8; ICRC_LEN]);
    let mut f = udp_frame(eth, l3, sport, dport, &body);
    let l3_off = eth.header_len();
    let l4_off = l3_off + l3.header_len();
    let end = f.len() - ICRC_LEN;
    // The ICRC masks the UDP checksum, so it can be computed before that is final.
    if let Some(c) = roce_common::icrc::icrc(&f[l3_off..l4_off], &f[l4_off..end]) {
        f[end..].copy_from_slice(&c.to_le_bytes());
    }
    set_udp_checksum(&mut f, eth, l3);
    f
}

/// The 8-byte VXLAN header with `flags` (0x08 = I, VNI valid) and a 24-bit `vni`.
pub fn vxlan_header(flags: u8, vni: u32) -> [u8; VXLAN_HLEN] {
    let mut h = [0u8; VXLAN_HLEN];
    if let Some(mut v) = MutableVxlanPacket::new(&mut h) {
        v.set_flags(flags);
        v.set_vni(vni & 0x00FF_FFFF);
    }
    h
}

/// `inner_frame` (an Ethernet frame, e.g. from [`roce_frame`]) in VXLAN (UDP 4789,
/// I flag, `vni`) from `sport` over the `outer` IPv4 or IPv6 underlay.
pub fn vxlan_frame(eth: &Eth, outer: &L3, sport: u16, vni: u32, inner_frame: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(VXLAN_HLEN + inner_frame.len());
    payload.extend(vxlan_header(VXLAN_FLAG_I, vni));
    payload.extend_from_slice(inner_frame);
    udp_frame(eth, outer, sport, DEFAULT_VXLAN_PORT, &payload)
}

/// Offset of the BTH in a frame built by [`roce_frame`] with `eth` and `l3`.
pub fn bth_offset(eth: &Eth, l3: &L3) -> usize {
    eth.header_len() + l3.header_len() + UDP_HLEN
}

/// Offset of the inner Ethernet header in a frame built by [`vxlan_frame`].
pub fn inner_eth_offset(eth: &Eth, outer: &L3) -> usize {
    eth.header_len() + outer.header_len() + UDP_HLEN + VXLAN_HLEN
}

/// Checks the ICRC of a RoCE frame whose IP header starts at `l3_off` and UDP header at
/// `l4_off`: true when the last 4 bytes hold what [`roce_common::icrc::icrc`] computes.
pub fn icrc_ok(frame: &[u8], l3_off: usize, l4_off: usize) -> bool {
    let Some(end) = frame.len().checked_sub(ICRC_LEN) else {
        return false;
    };
    if l3_off > l4_off || l4_off > end {
        return false;
    }
    let Some(c) = roce_common::icrc::icrc(&frame[l3_off..l4_off], &frame[l4_off..end]) else {
        return false;
    };
    frame[end..] == c.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pnet::packet::ethernet::EthernetPacket;
    use pnet::packet::ipv4::Ipv4Packet;
    use pnet::packet::ipv6::{ExtensionPacket, FragmentPacket, Ipv6Packet};
    use pnet::packet::udp::UdpPacket;
    use pnet::packet::vlan::VlanPacket;
    use pnet::packet::Packet as _;
    use roce_common::bth;
    use roce_common::classify::classify;
    use roce_common::config::RuntimeConfig;
    use roce_common::key::{addr_v4_mapped, KEY_INNER_V6, KEY_OUTER_V6, KEY_TUNNELLED};
    use roce_common::packet::SlicePacket;
    use roce_common::parsed::Outcome;
    use roce_common::parsed::{Class, Reason};

    const A4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    fn v6(last: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last)
    }

    fn classify_default(f: &[u8]) -> Outcome {
        classify(&SlicePacket(f), &RuntimeConfig::default())
    }

    fn raw(a: Ipv4Addr) -> u32 {
        u32::from_ne_bytes(a.octets())
    }

    fn raw6(a: Ipv6Addr) -> [u32; 4] {
        let o = a.octets();
        core::array::from_fn(|i| {
            u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
        })
    }

    /// Frame 22 of rxe-read.pcap (soft-RoCE, CC BY-SA 4.0, see shared/captures/README.md):
    /// an RDMA READ request of 3000 bytes, with the ICRC rxe computed.
    const RXE_READ_REQUEST: [u8; 74] = [
        0x00, 0x50, 0x56, 0xa7, 0x12, 0x9f, 0x00, 0x50, 0x56, 0xa7, 0x7d, 0x03, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3c, 0x3a, 0x6a, 0x40, 0x00, 0x40, 0x11, 0xcb, 0xca, 0x0a, 0x01, 0x10, 0x3e,
        0x0a, 0x01, 0x10, 0x3d, 0xc3, 0x48, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x0c, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x1c, 0x80, 0x62, 0x2c, 0x76, 0x00, 0x00, 0x62, 0xac, 0x53, 0x3f,
        0xd0, 0x00, 0x00, 0x00, 0x0d, 0x48, 0x00, 0x00, 0x0b, 0xb8, 0x74, 0x1a, 0x73, 0x0c,
    ];

    #[test]
    fn rebuilds_a_soft_roce_read_request_byte_for_byte() {
        let eth = Eth::new(
            [0x00, 0x50, 0x56, 0xa7, 0x7d, 0x03],
            [0x00, 0x50, 0x56, 0xa7, 0x12, 0x9f],
        );
        let mut ip = Ipv4Hdr::new(Ipv4Addr::new(10, 1, 16, 62), Ipv4Addr::new(10, 1, 16, 61));
        ip.id = 0x3a6a;
        let msg = RoceMsg::new(opcode::RC_READ_REQUEST, 0x1c, 6433910)
            .with_ack_req(true)
            .with_reth(0x62ac_533f_d000, 0xd48, 3000);
        let f = roce_frame(&eth, &L3::V4(ip), 49992, &msg);
        assert_eq!(f, RXE_READ_REQUEST);
    }

    #[test]
    fn cnp_is_74_bytes_with_becn_and_16_reserved_bytes() {
        let f = roce_frame(&Eth::default(), &L3::v4(A4, B4), 0xC000, &cnp(0xABCDEF));
        assert_eq!(f.len(), 74);
        let udp = UdpPacket::new(&f[34..]).unwrap();
        assert_eq!((udp.get_destination(), udp.get_length()), (4791, 40));
        assert_eq!(
            &f[42..54],
            &[0x81, 0, 0xFF, 0xFF, 0x40, 0xAB, 0xCD, 0xEF, 0, 0, 0, 0]
        );
        assert_eq!(&f[54..70], &[0u8; 16]);
        assert!(icrc_ok(&f, 14, 34));
        let Outcome::Flow(p) = classify_default(&f) else {
            panic!("not a flow")
        };
        assert!(p.bth.is_cnp() && p.bth.becn);
        assert_eq!(p.key.dest_qp, 0xABCDEF);
        assert_eq!(p.payload_len(), 0);
    }

    #[test]
    fn ipv4_header_parses_back_with_correct_checksum_and_options() {
        let l3 = L3::v4(A4, B4)
            .with_tos(106)
            .with_options(&[0x94, 0x04, 0, 0, 1]);
        let f = roce_frame(&Eth::default(), &l3, 0xC123, &RoceMsg::send_only(7, 1, 5));
        let ip = Ipv4Packet::new(&f[14..]).unwrap();
        assert_eq!(ip.get_header_length(), 7);
        assert_eq!((ip.get_dscp(), ip.get_ecn()), (26, 2));
        assert_eq!(ip.get_checksum(), ipv4::checksum(&ip));
        assert_eq!(ip.get_total_length() as usize, f.len() - 14);
        assert_eq!(&ip.packet()[20..28], &[0x94, 0x04, 0, 0, 1, 0, 0, 0]);
        assert_eq!((ip.get_source(), ip.get_destination()), (A4, B4));
        let udp = UdpPacket::new(ip.payload()).unwrap();
        assert_eq!((udp.get_source(), udp.get_destination()), (0xC123, 4791));
        assert_eq!(udp.get_length() as usize, f.len() - 14 - 28);
        assert!(icrc_ok(&f, 14, 42));
        let Outcome::Flow(p) = classify_default(&f) else {
            panic!("not a flow")
        };
        assert_eq!(p.key.src, addr_v4_mapped(raw(A4)));
        assert_eq!(p.key.dst, addr_v4_mapped(raw(B4)));
        assert_eq!(
            (p.outer_tos, p.sport, p.key.dest_qp, p.bth.psn),
            (106, 0xC123, 7, 1)
        );
        // 5 payload bytes: 3 of pad.
        assert_eq!(p.bth.pad_count(), 3);
        assert_eq!(p.payload_len(), 5);
    }

    #[test]
    fn vlan_tags_are_written_outermost_first() {
        let eth = Eth::default()
            .with_vlan(VlanTag::dot1ad(100).with_pcp(3))
            .with_vlan(VlanTag::dot1q(200));
        let f = roce_frame(&eth, &L3::v4(A4, B4), 0xC000, &RoceMsg::send_only(9, 0, 8));
        let e = EthernetPacket::new(&f).unwrap();
        assert_eq!(e.get_ethertype(), EtherType(0x88A8));
        let outer = VlanPacket::new(e.payload()).unwrap();
        assert_eq!(
            (
                outer.get_vlan_identifier(),
                outer.get_priority_code_point().0
            ),
            (100, 3)
        );
        assert_eq!(outer.get_ethertype(), EtherType(0x8100));
        let inner = VlanPacket::new(outer.payload()).unwrap();
        assert_eq!(
            (inner.get_vlan_identifier(), inner.get_ethertype()),
            (200, EtherType(0x0800))
        );
        assert!(icrc_ok(&f, 22, 42));
        let Outcome::Flow(p) = classify_default(&f) else {
            panic!("not a flow")
        };
        assert_eq!(p.key.dest_qp, 9);
        // A third tag is one too many for the classifier.
        let eth3 = eth.with_vlan(VlanTag::dot1q(300));
        let f3 = roce_frame(&eth3, &L3::v4(A4, B4), 0xC000, &RoceMsg::send_only(9, 0, 8));
        assert_eq!(
            classify_default(&f3),
            Outcome::Malformed(Reason::TooManyVlanTags)
        );
    }

    #[test]
    fn ipv6_extension_chain_parses_back_and_classifies() {
        let l3 = L3::v6(v6(1), v6(2))
            .with_tos(0x6B)
            .with_ext(Ipv6Ext::HopByHop { len: 0 })
            .with_ext(Ipv6Ext::Routing {
                len: 1,
                routing_type: 4,
                segments_left: 0,
            })
            .with_ext(Ipv6Ext::Fragment {
                offset: 0,
                more: true,
                id: 77,
            })
            .with_ext(Ipv6Ext::DestOpts { len: 2 });
        assert_eq!(l3.header_len(), 40 + 8 + 16 + 8 + 24);
        let f = roce_frame(&Eth::default(), &l3, 0xC001, &RoceMsg::ack(0x10, 5, 0x61));
        let ip = Ipv6Packet::new(&f[14..]).unwrap();
        assert_eq!(ip.get_traffic_class(), 0x6B);
        assert_eq!(ip.get_payload_length() as usize, f.len() - 14 - 40);
        assert_eq!(ip.get_next_header().0, IPPROTO_HOPOPTS);
        let hbh = ExtensionPacket::new(&f[54..]).unwrap();
        assert_eq!(
            (hbh.get_next_header().0, hbh.get_hdr_ext_len()),
            (IPPROTO_ROUTING, 0)
        );
        assert_eq!(&f[56..58], &[1, 4]); // PadN over the 6 option bytes
        let rt = ExtensionPacket::new(&f[62..]).unwrap();
        assert_eq!(rt.get_next_header().0, IPPROTO_FRAGMENT);
        let fr = FragmentPacket::new(&f[78..]).unwrap();
        assert_eq!(
            (
                fr.get_next_header().0,
                fr.get_fragment_offset(),
                fr.is_last_fragment()
            ),
            (IPPROTO_DSTOPTS, 0, false)
        );
        assert_eq!(fr.get_id(), 77);
        let dst = ExtensionPacket::new(&f[86..]).unwrap();
        assert_eq!(dst.get_next_header().0, IPPROTO_UDP);
        let udp = UdpPacket::new(&f[110..]).unwrap();
        assert_eq!(udp.get_destination(), 4791);
        assert_ne!(udp.get_checksum(), 0);
        let Outcome::Flow(p) = classify_default(&f) else {
            panic!("not a flow")
        };
        assert_eq!(p.key.flags, KEY_OUTER_V6);
        assert_eq!((p.key.src, p.key.dst), (raw6(v6(1)), raw6(v6(2))));
        assert_eq!(
            (p.syndrome(), p.outer_tos, p.key.dest_qp),
            (Some(0x61), 0x6B, 0x10)
        );
    }

    #[test]
    fn ipv6_udp_checksum_verifies() {
        let l3 = L3::v6(v6(1), v6(2));
        let f = roce_frame(&Eth::default(), &l3, 0xC001, &RoceMsg::send_only(1, 2, 33));
        let udp = UdpPacket::new(&f[54..]).unwrap();
        let L3::V6(h) = &l3 else { unreachable!() };
        // Recomputing over the datagram with its checksum in place gives 0 (or 0xFFFF).
        let mut copy = f[54..].to_vec();
        let mut u = MutableUdpPacket::new(&mut copy).unwrap();
        let sent = u.get_checksum();
        u.set_checksum(0);
        assert_eq!(udp::ipv6_checksum(&u.to_immutable(), &h.src, &h.dst), sent);
        assert_eq!(udp.get_checksum(), sent);
        assert!(icrc_ok(&f, 14, 54));
    }

    #[test]
    fn non_first_ipv6_fragment_is_rejected_by_the_classifier() {
        let l3 = L3::v6(v6(1), v6(2)).with_ext(Ipv6Ext::Fragment {
            offset: 3,
            more: false,
            id: 1,
        });
        let f = roce_frame(&Eth::default(), &l3, 0xC001, &RoceMsg::send_only(1, 2, 0));
        assert_eq!(
            classify_default(&f),
            Outcome::Malformed(Reason::Ipv6Fragment)
        );
    }

    #[test]
    fn vxlan_over_ipv4_and_ipv6_classifies_on_the_inner_flow() {
        let inner_l3 = L3::v4(A4, B4).with_tos(0x6B);
        let inner = roce_frame(&Eth::default(), &inner_l3, 0xC0DE, &cnp(0x42));
        for outer in [
            L3::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)).with_tos(0x6A),
            L3::v6(v6(0x11), v6(0x22)).with_tos(0x6A),
        ] {
            let f = vxlan_frame(&Eth::default(), &outer, 0xD00D, 0xABCDE, &inner);
            let off = inner_eth_offset(&Eth::default(), &outer);
            assert_eq!(&f[off..], &inner[..]);
            assert_eq!(&f[off - 8..off], &[0x08, 0, 0, 0, 0x0A, 0xBC, 0xDE, 0]);
            let udp = UdpPacket::new(&f[off - 16..]).unwrap();
            assert_eq!((udp.get_source(), udp.get_destination()), (0xD00D, 4789));
            assert_eq!(udp.get_length() as usize, f.len() - (off - 16));
            let Outcome::Flow(p) = classify_default(&f) else {
                panic!("not a flow")
            };
            let v6_flag = if matches!(outer, L3::V6(_)) {
                KEY_OUTER_V6
            } else {
                0
            };
            assert_eq!(p.key.flags, KEY_TUNNELLED | v6_flag);
            assert_eq!((p.key.vni, p.key.dest_qp), (0xABCDE, 0x42));
            assert_eq!(p.key.inner_src, addr_v4_mapped(raw(A4)));
            assert_eq!((p.outer_tos, p.inner_tos, p.sport), (0x6A, 0x6B, 0xC0DE));
            assert!(p.bth.is_cnp());
            // The inner ICRC is still right inside the tunnel.
            assert!(icrc_ok(&f, off + 14, off + 34));
        }
        // IPv6 inside IPv4.
        let inner6 = roce_frame(
            &Eth::default(),
            &L3::v6(v6(1), v6(2)),
            1,
            &RoceMsg::send_only(3, 4, 0),
        );
        let f = vxlan_frame(&Eth::default(), &L3::v4(A4, B4), 2, 1, &inner6);
        let Outcome::Flow(p) = classify_default(&f) else {
            panic!("not a flow")
        };
        assert_eq!(p.key.flags, KEY_TUNNELLED | KEY_INNER_V6);
        assert_eq!(p.key.inner_dst, raw6(v6(2)));
    }

    #[test]
    fn other_traffic_classes() {
        let eth = Eth::default();
        let l3 = L3::v4(A4, B4);
        assert_eq!(
            classify_default(&udp_frame(&eth, &l3, 1, 53, &[0; 10])),
            Outcome::Other(Class::OtherUdp)
        );
        assert_eq!(
            classify_default(&ip_frame(&eth, &l3, 6, &[0; 20])),
            Outcome::Other(Class::OtherIp)
        );
        assert_eq!(
            classify_default(&eth_frame(&eth, 0x0806, &[0; 28])),
            Outcome::Other(Class::NonIp)
        );
        let inner_tcp = ip_frame(&eth, &l3, 6, &[0; 20]);
        assert_eq!(
            classify_default(&vxlan_frame(&eth, &l3, 1, 1, &inner_tcp)),
            Outcome::Other(Class::VxlanOther)
        );
        let mut no_i = vxlan_frame(&eth, &l3, 1, 1, &inner_tcp);
        no_i[42] = 0;
        assert_eq!(
            classify_default(&no_i),
            Outcome::Malformed(Reason::BadVxlanFlags)
        );
    }

    #[test]
    fn extension_headers_agree_with_the_classifier_for_every_opcode() {
        for op in defined_opcodes() {
            let ours: usize = ext_headers(op).iter().map(|e| e.len()).sum();
            assert_eq!(ours, bth::ext_headers_len(op), "opcode {op:#04x}");
            assert_eq!(
                ext_headers(op).contains(&ExtHeader::Reth),
                bth::has_reth(op),
                "opcode {op:#04x}"
            );
            assert_eq!(
                ext_headers(op).contains(&ExtHeader::Aeth),
                bth::has_aeth(op),
                "opcode {op:#04x}"
            );
        }
        assert_eq!(defined_opcodes().len(), 23 + 23 + 12 + 2 + 2);
    }

    #[test]
    fn every_opcode_round_trips_through_the_classifier() {
        for op in defined_opcodes() {
            for len in [0usize, 1, 2, 3, 4, 256] {
                let mut m = RoceMsg::new(op, 0x00C0FFEE & 0xFF_FFFF, 0xFF_FFFF)
                    .with_payload(len)
                    .with_ack_req(true)
                    .with_fecn(true);
                m.syndrome = 0x20;
                m.reth.dma_len = 0x1234;
                let f = roce_frame(&Eth::default(), &L3::v4(A4, B4), 0xC000, &m);
                assert!(icrc_ok(&f, 14, 34));
                let Outcome::Flow(p) = classify_default(&f) else {
                    panic!("{op:#x} not a flow")
                };
                assert_eq!(p.bth.opcode, op);
                assert_eq!(
                    (p.bth.dest_qp, p.bth.psn, p.bth.ack_req, p.bth.fecn),
                    (0xC0FFEE, 0xFF_FFFF, true, true)
                );
                assert_eq!(p.bth.pkey, 0xFFFF);
                assert_eq!(p.payload_len() as usize, len, "opcode {op:#04x}");
                assert_eq!(p.syndrome(), bth::has_aeth(op).then_some(0x20));
                let read = op & 0x1F == 0x0C && op & 0xE0 != 0x20;
                assert_eq!(
                    p.read_len,
                    if read { 0x1234 } else { 0 },
                    "opcode {op:#04x}"
                );
                assert!(!p.ext_truncated);
            }
        }
    }
}
