//! The classifier: Ethernet [+VLAN] / IPv4|IPv6 / UDP / (BTH | VXLAN / Ethernet / IP / UDP / BTH).
//!
//! A pure function over any [`Packet`]; the XDP program and the reference
//! classifier both call [`classify`], so they agree by construction.

use crate::bth::{self, Bth, BTH_LEN, XRCETH_LEN};
use crate::config::RuntimeConfig;
use crate::counters::{Class, Reason};
use crate::flow::{addr_v4_mapped, FlowKey, KEY_INNER_V6, KEY_OUTER_V6, KEY_TUNNELLED};
use crate::packet::Packet;
use crate::wire::*;

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
    /// UDP length of the RoCE datagram.
    pub udp_len: u16,
    pub bth: Bth,
    /// AETH syndrome, when the opcode carries one and it was present.
    pub syndrome: Option<u8>,
    /// RETH DMA length of a READ request.
    pub read_len: u32,
    /// An AETH or RETH that counting needs was cut off.
    pub ext_truncated: bool,
}

impl Parsed {
    pub fn class(&self) -> Class {
        if self.tunnelled {
            Class::RoceInVxlan
        } else {
            Class::Roce
        }
    }

    /// Payload bytes of the RoCE packet (after extension headers, before pad and ICRC).
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

/// The IP layer of one header chain (the DSCP policy walks headers with it too).
pub(crate) struct Ip {
    pub(crate) proto: u8,
    pub(crate) l4: usize,
    pub(crate) tos: u8,
    pub(crate) v6: bool,
    pub(crate) src: [u32; 4],
    pub(crate) dst: [u32; 4],
}

pub(crate) enum IpStep {
    Ip(Ip),
    NotIp,
    Bad(Reason),
}

/// Reasons of the outer or the inner header chain.
pub(crate) struct Reasons {
    ipv4: Reason,
    ihl: Reason,
    frag4: Reason,
    ipv6: Reason,
    ext: Reason,
    too_many_ext: Reason,
    frag6: Reason,
    bth: Reason,
}

pub(crate) const OUTER: Reasons = Reasons {
    ipv4: Reason::TruncatedIpv4,
    ihl: Reason::BadIpv4Ihl,
    frag4: Reason::Ipv4Fragment,
    ipv6: Reason::TruncatedIpv6,
    ext: Reason::TruncatedIpv6Ext,
    too_many_ext: Reason::TooManyIpv6Ext,
    frag6: Reason::Ipv6Fragment,
    bth: Reason::TruncatedBth,
};

pub(crate) const INNER: Reasons = Reasons {
    ipv4: Reason::TruncatedInnerIpv4,
    ihl: Reason::BadInnerIpv4Ihl,
    frag4: Reason::InnerIpv4Fragment,
    ipv6: Reason::TruncatedInnerIpv6,
    ext: Reason::TruncatedInnerIpv6Ext,
    too_many_ext: Reason::TooManyInnerIpv6Ext,
    frag6: Reason::InnerIpv6Fragment,
    bth: Reason::TruncatedInnerBth,
};

/// Classifies one frame (starting at its Ethernet header).
// The key is filled field by field on a zeroed value: whole-word stores in the kernel build.
#[allow(clippy::field_reassign_with_default)]
#[inline(always)]
pub fn classify<P: Packet>(p: &P, cfg: &RuntimeConfig) -> Outcome {
    let mut ethertype = match p.be16_at(12) {
        Some(t) => t,
        None => return Outcome::Malformed(Reason::TruncatedEth),
    };
    let mut off = ETH_HLEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        ethertype = match p.be16_at(off + 2) {
            Some(t) => t,
            None => return Outcome::Malformed(Reason::TruncatedVlan),
        };
        off += VLAN_HLEN;
    }
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        return Outcome::Malformed(Reason::TooManyVlanTags);
    }
    let outer = match parse_ip(p, off, ethertype, &OUTER) {
        IpStep::Ip(ip) => ip,
        IpStep::NotIp => return Outcome::Other(Class::NonIp),
        IpStep::Bad(r) => return Outcome::Malformed(r),
    };
    if outer.proto != IPPROTO_UDP {
        return Outcome::Other(Class::OtherIp);
    }
    let Some(dport) = p.be16_at(outer.l4 + 2) else {
        return Outcome::Malformed(Reason::TruncatedUdp);
    };
    // Read the rest of the UDP header (source port and length) in one checked step.
    let Some(udp_len) = p.be16_at(outer.l4 + 4) else {
        return Outcome::Malformed(Reason::TruncatedUdp);
    };
    if p.be16_at(outer.l4 + 6).is_none() {
        return Outcome::Malformed(Reason::TruncatedUdp);
    }
    let sport = p.be16_at(outer.l4).unwrap_or(0);

    let mut key = FlowKey::default();
    key.src = outer.src;
    key.dst = outer.dst;
    if outer.v6 {
        key.flags |= KEY_OUTER_V6;
    }

    if dport == cfg.roce_port {
        return match parse_roce(p, outer.l4 + UDP_HLEN, &OUTER) {
            Ok(mut parsed) => {
                key.dest_qp = parsed.bth.dest_qp;
                parsed.key = key;
                parsed.outer_tos = outer.tos;
                parsed.sport = sport;
                parsed.udp_len = udp_len;
                Outcome::Flow(parsed)
            }
            Err(r) => Outcome::Malformed(r),
        };
    }
    if dport != cfg.vxlan_port {
        return Outcome::Other(Class::OtherUdp);
    }

    // VXLAN (RFC 7348): flags, 3 reserved, VNI, 1 reserved.
    let vx = outer.l4 + UDP_HLEN;
    let Some(vni_word) = p.be32_at(vx + 4) else {
        return Outcome::Malformed(Reason::TruncatedVxlan);
    };
    let Some(vx_flags) = p.u8_at(vx) else {
        return Outcome::Malformed(Reason::TruncatedVxlan);
    };
    if vx_flags & VXLAN_FLAG_I == 0 {
        // The Linux VXLAN driver drops these too.
        return Outcome::Malformed(Reason::BadVxlanFlags);
    }
    let inner_eth = vx + VXLAN_HLEN;
    let Some(inner_type) = p.be16_at(inner_eth + 12) else {
        return Outcome::Malformed(Reason::TruncatedInnerEth);
    };
    let inner = match parse_ip(p, inner_eth + ETH_HLEN, inner_type, &INNER) {
        IpStep::Ip(ip) => ip,
        IpStep::NotIp => return Outcome::Other(Class::VxlanOther),
        IpStep::Bad(r) => return Outcome::Malformed(r),
    };
    if inner.proto != IPPROTO_UDP {
        return Outcome::Other(Class::VxlanOther);
    }
    if p.be16_at(inner.l4 + 6).is_none() {
        return Outcome::Malformed(Reason::TruncatedInnerUdp);
    }
    let Some(inner_udp_len) = p.be16_at(inner.l4 + 4) else {
        return Outcome::Malformed(Reason::TruncatedInnerUdp);
    };
    let Some(inner_dport) = p.be16_at(inner.l4 + 2) else {
        return Outcome::Malformed(Reason::TruncatedInnerUdp);
    };
    let Some(inner_sport) = p.be16_at(inner.l4) else {
        return Outcome::Malformed(Reason::TruncatedInnerUdp);
    };
    if inner_dport != cfg.roce_port {
        return Outcome::Other(Class::VxlanOther);
    }
    match parse_roce(p, inner.l4 + UDP_HLEN, &INNER) {
        Ok(mut parsed) => {
            key.vni = vni_word >> 8;
            key.inner_src = inner.src;
            key.inner_dst = inner.dst;
            key.flags |= KEY_TUNNELLED;
            key.dest_qp = parsed.bth.dest_qp;
            if inner.v6 {
                key.flags |= KEY_INNER_V6;
            }
            parsed.tunnelled = true;
            parsed.key = key;
            parsed.outer_tos = outer.tos;
            parsed.inner_tos = inner.tos;
            parsed.sport = inner_sport;
            parsed.udp_len = inner_udp_len;
            Outcome::Flow(parsed)
        }
        Err(r) => Outcome::Malformed(r),
    }
}

#[inline(always)]
pub(crate) fn parse_ip<P: Packet>(p: &P, off: usize, ethertype: u16, r: &Reasons) -> IpStep {
    if ethertype == ETH_P_IPV4 {
        parse_ipv4(p, off, r)
    } else if ethertype == ETH_P_IPV6 {
        parse_ipv6(p, off, r)
    } else {
        IpStep::NotIp
    }
}

#[inline(always)]
fn parse_ipv4<P: Packet>(p: &P, off: usize, r: &Reasons) -> IpStep {
    let Some(ver_ihl) = p.u8_at(off) else {
        return IpStep::Bad(r.ipv4);
    };
    if ver_ihl >> 4 != 4 {
        return IpStep::Bad(Reason::BadIpVersion);
    }
    let hlen = ((ver_ihl & 0x0F) as usize) * 4;
    if hlen < IPV4_MIN_HLEN {
        return IpStep::Bad(r.ihl);
    }
    // Fixed fields first, then the options: checking the deeper, variable offset first
    // lets the compiler drop the fixed checks, which the verifier cannot follow. Reads
    // are one after another, each with its own early return: evaluated together, the
    // compiler merges their checks into flags that the verifier cannot follow either.
    let Some(dst) = p.raw32_at(off + 16) else {
        return IpStep::Bad(r.ipv4);
    };
    let Some(src) = p.raw32_at(off + 12) else {
        return IpStep::Bad(r.ipv4);
    };
    let Some(proto) = p.u8_at(off + 9) else {
        return IpStep::Bad(r.ipv4);
    };
    let Some(frag) = p.be16_at(off + 6) else {
        return IpStep::Bad(r.ipv4);
    };
    let Some(tos) = p.u8_at(off + 1) else {
        return IpStep::Bad(r.ipv4);
    };
    if p.u8_at(off + hlen - 1).is_none() {
        return IpStep::Bad(r.ipv4);
    }
    if frag & 0x1FFF != 0 {
        return IpStep::Bad(r.frag4);
    }
    IpStep::Ip(Ip {
        proto,
        l4: off + hlen,
        tos,
        v6: false,
        src: addr_v4_mapped(src),
        dst: addr_v4_mapped(dst),
    })
}

#[inline(always)]
fn parse_ipv6<P: Packet>(p: &P, off: usize, r: &Reasons) -> IpStep {
    let Some(dst) = p.addr6_at(off + 24) else {
        return IpStep::Bad(r.ipv6);
    };
    let Some(src) = p.addr6_at(off + 8) else {
        return IpStep::Bad(r.ipv6);
    };
    let Some(next) = p.u8_at(off + 6) else {
        return IpStep::Bad(r.ipv6);
    };
    let Some(w0) = p.be32_at(off) else {
        return IpStep::Bad(r.ipv6);
    };
    if w0 >> 28 != 6 {
        return IpStep::Bad(Reason::BadIpVersion);
    }
    let tos = (w0 >> 20) as u8;
    let mut proto = next;
    let mut l4 = off + IPV6_HLEN;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match proto {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let Some(len) = p.u8_at(l4 + 1) else {
                    return IpStep::Bad(r.ext);
                };
                let Some(n) = p.u8_at(l4) else {
                    return IpStep::Bad(r.ext);
                };
                proto = n;
                l4 += (len as usize + 1) * 8;
                // The whole header must be there (as IPv4 options must): a frame cut
                // inside it is a truncated extension header, not a truncated UDP header.
                if p.u8_at(l4 - 1).is_none() {
                    return IpStep::Bad(r.ext);
                }
            }
            IPPROTO_FRAGMENT => {
                // Its last word first: the whole 8-byte header must be there.
                if p.be32_at(l4 + 4).is_none() {
                    return IpStep::Bad(r.ext);
                }
                let Some(frag) = p.be16_at(l4 + 2) else {
                    return IpStep::Bad(r.ext);
                };
                let Some(n) = p.u8_at(l4) else {
                    return IpStep::Bad(r.ext);
                };
                if frag & 0xFFF8 != 0 {
                    return IpStep::Bad(r.frag6);
                }
                proto = n;
                l4 += 8;
            }
            _ => break,
        }
    }
    if matches!(
        proto,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_FRAGMENT
    ) {
        return IpStep::Bad(r.too_many_ext);
    }
    IpStep::Ip(Ip {
        proto,
        l4,
        tos,
        v6: true,
        src,
        dst,
    })
}

#[inline(always)]
fn parse_roce<P: Packet>(p: &P, off: usize, r: &Reasons) -> Result<Parsed, Reason> {
    let Some(w2) = p.be32_at(off + 8) else {
        return Err(r.bth);
    };
    let Some(w1) = p.be32_at(off + 4) else {
        return Err(r.bth);
    };
    let Some(w0) = p.be32_at(off) else {
        return Err(r.bth);
    };
    let bth = Bth::from_words(w0, w1, w2);
    let mut parsed = Parsed {
        bth,
        ..Parsed::default()
    };
    let ext = off + BTH_LEN;
    if bth::has_aeth(bth.opcode) {
        match p.u8_at(ext) {
            Some(s) => parsed.syndrome = Some(s),
            None => parsed.ext_truncated = true,
        }
    } else if bth.opcode & 0x1F == bth::op::READ_REQUEST && bth::is_tracked_request(bth.opcode) {
        let reth = if bth.transport() == bth::TRANSPORT_XRC {
            ext + XRCETH_LEN
        } else {
            ext
        };
        match p.be32_at(reth + 12) {
            Some(len) => parsed.read_len = len,
            None => parsed.ext_truncated = true,
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    //! Host-side checks of the parser on hand-made frames (the XDP program runs the
    //! same code; tests/ checks it there with frames from the agent's builder).
    extern crate std;
    use super::*;
    use crate::packet::SlicePacket;
    use std::vec;
    use std::vec::Vec;

    fn run(f: &[u8]) -> Outcome {
        classify(&SlicePacket(f), &RuntimeConfig::default())
    }

    /// Ethernet / IPv4 (TOS 106) / UDP to `dport` / `payload`.
    fn ipv4_udp(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(ETH_P_IPV4.to_be_bytes());
        let total = (20 + 8 + payload.len()) as u16;
        f.extend([0x45, 106]);
        f.extend(total.to_be_bytes());
        f.extend([
            0,
            0,
            0x40,
            0,
            64,
            IPPROTO_UDP,
            0,
            0,
            10,
            0,
            0,
            1,
            10,
            0,
            0,
            2,
        ]);
        f.extend(0xC000u16.to_be_bytes());
        f.extend(dport.to_be_bytes());
        f.extend(((8 + payload.len()) as u16).to_be_bytes());
        f.extend([0, 0]);
        f.extend_from_slice(payload);
        f
    }

    /// Ethernet / IPv6 with `ext` (raw extension headers, first announced by `first`) / UDP.
    fn ipv6_udp(first: u8, ext: &[u8], dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(ETH_P_IPV6.to_be_bytes());
        f.extend([0x66, 0xA0, 0, 0]); // traffic class 0x6A
        f.extend(((ext.len() + 8 + payload.len()) as u16).to_be_bytes());
        f.extend([first, 64]);
        f.extend(
            [0x20, 0x01, 0x0d, 0xb8]
                .iter()
                .chain([0u8; 11].iter())
                .chain([1u8].iter()),
        );
        f.extend(
            [0x20, 0x01, 0x0d, 0xb8]
                .iter()
                .chain([0u8; 11].iter())
                .chain([2u8].iter()),
        );
        f.extend_from_slice(ext);
        f.extend(0xC001u16.to_be_bytes());
        f.extend(dport.to_be_bytes());
        f.extend(((8 + payload.len()) as u16).to_be_bytes());
        f.extend([0, 0]);
        f.extend_from_slice(payload);
        f
    }

    /// BTH (ACKNOWLEDGE to QP 0x123456, PSN 7) + AETH (NAK 0x61) + ICRC.
    fn ack() -> Vec<u8> {
        let mut b = vec![0x11, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0, 0, 0, 7];
        b.extend([0x61, 0, 0, 1]);
        b.extend([0; 4]);
        b
    }

    #[test]
    fn plain_ipv4_roce_is_a_flow_with_its_bth_and_aeth() {
        let f = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        let Outcome::Flow(p) = run(&f) else {
            panic!("{:?}", run(&f))
        };
        assert!(!p.tunnelled);
        assert_eq!(p.key.dest_qp, 0x12_3456);
        assert_eq!(p.key.src, addr_v4_mapped(u32::from_ne_bytes([10, 0, 0, 1])));
        assert_eq!((p.outer_tos, p.sport, p.udp_len), (106, 0xC000, 8 + 20));
        assert_eq!((p.bth.opcode, p.bth.psn, p.syndrome), (0x11, 7, Some(0x61)));
        assert!(!p.ext_truncated);
    }

    #[test]
    fn ipv6_extension_header_cut_inside_its_body_is_truncated_ipv6_ext() {
        // Hop-by-hop of 16 bytes (Hdr Ext Len 1), then UDP.
        let mut hbh = vec![IPPROTO_UDP, 1, 1, 12];
        hbh.extend([0u8; 12]);
        let f = ipv6_udp(IPPROTO_HOPOPTS, &hbh, DEFAULT_ROCE_PORT, &ack());
        let Outcome::Flow(p) = run(&f) else {
            panic!("{:?}", run(&f))
        };
        assert_eq!((p.key.flags, p.outer_tos), (KEY_OUTER_V6, 0x6A));
        for len in 54..70 {
            assert_eq!(
                run(&f[..len]),
                Outcome::Malformed(Reason::TruncatedIpv6Ext),
                "cut at {len}"
            );
        }
        assert_eq!(run(&f[..70]), Outcome::Malformed(Reason::TruncatedUdp));
    }

    #[test]
    fn ipv6_fragment_header_must_be_whole_and_first() {
        let frag = |offset_flags: u16| {
            let mut h = vec![IPPROTO_UDP, 0];
            h.extend(offset_flags.to_be_bytes());
            h.extend([0, 0, 0, 9]);
            h
        };
        let first = ipv6_udp(IPPROTO_FRAGMENT, &frag(0x0001), DEFAULT_ROCE_PORT, &ack());
        assert!(matches!(run(&first), Outcome::Flow(_)));
        for len in 54..62 {
            assert_eq!(
                run(&first[..len]),
                Outcome::Malformed(Reason::TruncatedIpv6Ext)
            );
        }
        let later = ipv6_udp(IPPROTO_FRAGMENT, &frag(0x0008), DEFAULT_ROCE_PORT, &ack());
        assert_eq!(run(&later), Outcome::Malformed(Reason::Ipv6Fragment));
    }

    #[test]
    fn ipv4_fragments_and_ihl() {
        let mut f = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        f[20] = 0x20; // MF, offset 0: a first fragment
        assert!(matches!(run(&f), Outcome::Flow(_)));
        f[21] = 1; // offset 1
        assert_eq!(run(&f), Outcome::Malformed(Reason::Ipv4Fragment));
        let mut g = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        g[14] = 0x44;
        assert_eq!(run(&g), Outcome::Malformed(Reason::BadIpv4Ihl));
        g[14] = 0x4F; // a 60-byte header: the 62-byte frame ends inside it
        assert_eq!(run(&g), Outcome::Malformed(Reason::TruncatedIpv4));
    }

    #[test]
    fn vxlan_needs_the_i_flag_and_keys_on_the_inner_flow() {
        let inner = ipv6_udp(IPPROTO_UDP, &[], DEFAULT_ROCE_PORT, &ack());
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0x12, 0x34, 0x56, 0];
        vx.extend(&inner);
        let f = ipv4_udp(DEFAULT_VXLAN_PORT, &vx);
        let Outcome::Flow(p) = run(&f) else {
            panic!("{:?}", run(&f))
        };
        assert!(p.tunnelled);
        assert_eq!(p.key.flags, KEY_TUNNELLED | KEY_INNER_V6);
        assert_eq!((p.key.vni, p.key.dest_qp), (0x12_3456, 0x12_3456));
        assert_eq!((p.outer_tos, p.inner_tos, p.sport), (106, 0x6A, 0xC001));
        let mut bad = f.clone();
        bad[42] = 0;
        assert_eq!(run(&bad), Outcome::Malformed(Reason::BadVxlanFlags));
    }

    #[test]
    fn headers_beyond_the_parse_depth_count_as_truncated() {
        // A hop-by-hop header of 1024 bytes ends past MAX_PARSE_OFFSET: the reader
        // stops there, as the kernel's does, however long the frame is.
        let mut hbh = vec![IPPROTO_UDP, 127, 1, 255];
        hbh.resize(1024, 0);
        let f = ipv6_udp(IPPROTO_HOPOPTS, &hbh, DEFAULT_ROCE_PORT, &ack());
        assert_eq!(run(&f), Outcome::Malformed(Reason::TruncatedIpv6Ext));
    }
}
