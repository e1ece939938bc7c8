//! The classifier, and the only code that walks packet headers:
//! Ethernet [+VLAN] / IPv4|IPv6 / UDP / (BTH | VXLAN / Ethernet / IP / UDP / BTH).
//!
//! A pure function over any [`Packet`]. The XDP program calls [`classify_into`],
//! which tells it of each frame that is not a flow where its walk ends;
//! `tc_egress_flows` calls [`classify`]; the reference classifier, the tc policy,
//! `analyze` and `headers` (where a sampled frame's headers end) call [`walk`], the
//! decapsulation check [`tunnel_layers`]. [`Layers`] say
//! where each header the walk parsed lies, so nothing else reads headers on its own
//! and the limits (VLAN tags, extension headers, parse depth, the lengths the headers
//! declare) are the same everywhere.
//!
//! Lengths: the IPv4 total length, the IPv6 payload length and the UDP length bound
//! what is parsed, as the receiving stack reads the datagram: bytes beyond them
//! (Ethernet padding, trailing garbage) are not the datagram's. A header that declares
//! more than the frame holds is read as far as the frame goes (a capture's snap length
//! cuts frames the same way). A datagram that ends before its BTH is not RoCE: it is
//! counted under the truncation reason of the header it ends in.
//!
//! Mirror copies (docs/mirror.md): on a mirror collector interface `xdp_mirror` calls
//! [`mirror_start`] (outer Ethernet/IP, GRE, ERSPAN II/III: where the mirrored frame
//! starts, and the session) and `xdp_mirror_flows` [`classify_from_into`] (the walk
//! above over the mirrored frame, its ends told as `mirror_other` /
//! `mirror_truncated`, and the length the mirrored frame had); the reference and
//! `analyze` call [`walk_mirror`], both steps at once. A truncated copy's mirrored IP
//! header declares more than the copy holds: read as far as the copy goes, as above.

use crate::bth::{self, Bth, BTH_LEN, XRCETH_LEN};
use crate::config::RuntimeConfig;
use crate::key::{addr_v4_mapped, FlowKey, KEY_INNER_V6, KEY_MIRROR, KEY_OUTER_V6, KEY_TUNNELLED};
use crate::mirror::*;
use crate::packet::{Header, Packet, SlicePacket};
use crate::parsed::{Class, Outcome, Parsed, Reason};
use crate::wire::*;

/// One IP header that parsed: where it is, where its upper layer starts and where
/// its datagram ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpLayer {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the upper-layer header (after IPv4 options / IPv6 extension headers).
    pub l4: usize,
    /// Offset just past the datagram, as far as the frame holds it: the smaller of
    /// the declared end (total / payload length) and the frame's end.
    pub end: usize,
    /// Upper-layer protocol (after IPv6 extension headers).
    pub proto: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub tos: u8,
    pub v6: bool,
}

/// The source and destination addresses of an IP layer, as the flow key holds them
/// (IPv4 mapped into IPv6, network order). Read where they are needed rather than
/// carried through the walk: carried (eight live words), they made the XDP program
/// spill to the stack at every bounds check.
#[inline(always)]
pub fn ip_addresses<P: Packet>(p: &P, ip: &IpLayer) -> Option<([u32; 4], [u32; 4])> {
    if ip.v6 {
        let h = p.header(ip.l3, IPV6_HLEN)?;
        let addr = |k| [h.raw32(k), h.raw32(k + 4), h.raw32(k + 8), h.raw32(k + 12)];
        Some((addr(8), addr(24)))
    } else {
        let h = p.header(ip.l3, IPV4_MIN_HLEN)?;
        Some((addr_v4_mapped(h.raw32(12)), addr_v4_mapped(h.raw32(16))))
    }
}

/// Where the headers of one frame lie, as far as the walk got (whatever its outcome).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layers {
    /// The outer IP header, when it parsed (None: not IP, or a bad/truncated/fragment
    /// outer header).
    pub outer: Option<IpLayer>,
    /// Offset of the inner Ethernet header of a VXLAN packet (the VXLAN header with
    /// its I flag was read).
    pub inner_eth: Option<usize>,
    /// That VXLAN header's VNI (0 before one was read).
    pub vni: u32,
    /// The inner IP header of a VXLAN packet, when it parsed.
    pub inner: Option<IpLayer>,
    /// A whole BTH behind the RoCE port (the outcome is `Flow`), and its opcode (0
    /// otherwise). Plain fields written on every path: the tc program reads them
    /// without matching on the outcome, which LLVM may compile into a computation on
    /// an unset register that the verifier rejects.
    pub roce: bool,
    pub bth_opcode: u8,
}

impl IpLayer {
    fn shifted(self, by: usize) -> IpLayer {
        IpLayer {
            l3: self.l3 + by,
            l4: self.l4 + by,
            end: self.end + by,
            ..self
        }
    }
}

impl Layers {
    /// The same layers `by` bytes further into the frame (a mirrored frame's, in its
    /// copy).
    fn shifted(self, by: usize) -> Layers {
        Layers {
            outer: self.outer.map(|l| l.shifted(by)),
            inner_eth: self.inner_eth.map(|e| e + by),
            inner: self.inner.map(|l| l.shifted(by)),
            ..self
        }
    }

    /// The IP layer that carries the RoCE datagram of a `Flow` outcome: the inner one
    /// when tunnelled.
    pub fn roce_ip(&self, tunnelled: bool) -> Option<IpLayer> {
        if tunnelled {
            self.inner
        } else {
            self.outer
        }
    }
}

/// The classifier's outcome for one frame and where its layers lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    pub outcome: Outcome,
    pub layers: Layers,
}

/// A view of a packet that ends where the innermost header read so far says its
/// datagram ends: reads past `end` fail as reads past the frame's end do.
struct Within<'a, P: Packet> {
    p: &'a P,
    end: usize,
}

impl<'a, P: Packet> Within<'a, P> {
    #[inline(always)]
    fn new(p: &'a P) -> Self {
        Within { p, end: p.len() }
    }

    /// The same packet, ending at `end` if that is earlier.
    #[inline(always)]
    fn ending_at(&self, end: usize) -> Self {
        Within {
            p: self.p,
            end: if end < self.end { end } else { self.end },
        }
    }

    #[inline(always)]
    fn fits(&self, off: usize, n: usize) -> bool {
        off + n <= self.end
    }
}

impl<P: Packet> Packet for Within<'_, P> {
    type Header = P::Header;

    #[inline(always)]
    fn header(&self, off: usize, n: usize) -> Option<P::Header> {
        if !self.fits(off, n) {
            return None;
        }
        self.p.header(off, n)
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.end
    }
    #[inline(always)]
    fn u8_at(&self, off: usize) -> Option<u8> {
        if !self.fits(off, 1) {
            return None;
        }
        self.p.u8_at(off)
    }
    #[inline(always)]
    fn be16_at(&self, off: usize) -> Option<u16> {
        if !self.fits(off, 2) {
            return None;
        }
        self.p.be16_at(off)
    }
    #[inline(always)]
    fn be32_at(&self, off: usize) -> Option<u32> {
        if !self.fits(off, 4) {
            return None;
        }
        self.p.be32_at(off)
    }
    #[inline(always)]
    fn raw32_at(&self, off: usize) -> Option<u32> {
        if !self.fits(off, 4) {
            return None;
        }
        self.p.raw32_at(off)
    }
}

#[derive(Debug, PartialEq, Eq)]
enum IpStep {
    Ip(IpLayer),
    NotIp,
    Bad(Reason),
}

/// Reasons of the outer or the inner header chain.
struct Reasons {
    ipv4: Reason,
    ihl: Reason,
    frag4: Reason,
    ipv6: Reason,
    ext: Reason,
    too_many_ext: Reason,
    frag6: Reason,
    udp: Reason,
    bth: Reason,
}

const OUTER: Reasons = Reasons {
    ipv4: Reason::TruncatedIpv4,
    ihl: Reason::BadIpv4Ihl,
    frag4: Reason::Ipv4Fragment,
    ipv6: Reason::TruncatedIpv6,
    ext: Reason::TruncatedIpv6Ext,
    too_many_ext: Reason::TooManyIpv6Ext,
    frag6: Reason::Ipv6Fragment,
    udp: Reason::TruncatedUdp,
    bth: Reason::TruncatedBth,
};

const INNER: Reasons = Reasons {
    ipv4: Reason::TruncatedInnerIpv4,
    ihl: Reason::BadInnerIpv4Ihl,
    frag4: Reason::InnerIpv4Fragment,
    ipv6: Reason::TruncatedInnerIpv6,
    ext: Reason::TruncatedInnerIpv6Ext,
    too_many_ext: Reason::TooManyInnerIpv6Ext,
    frag6: Reason::InnerIpv6Fragment,
    udp: Reason::TruncatedInnerUdp,
    bth: Reason::TruncatedInnerBth,
};

/// Classifies one frame (starting at its Ethernet header).
#[inline(always)]
pub fn classify<P: Packet>(p: &P, cfg: &RuntimeConfig) -> Outcome {
    walk(p, cfg).outcome
}

/// Told of each frame whose walk ends before a flow, where it ends.
///
/// The XDP program counts such a frame here and leaves, so that these paths never
/// join the flow path. Joined at one return, LLVM would carry the flow path's parsed
/// fields across every one of them (stack stores on each non-RoCE frame, and more
/// verifier work).
pub trait NotFlowSink {
    /// `outcome` is `Other` or `Malformed`: the walk returns it next.
    fn not_flow(&mut self, outcome: &Outcome);
}

/// The sink of walks whose callers read the outcome afterwards.
pub struct Unheard;

impl NotFlowSink for Unheard {
    #[inline(always)]
    fn not_flow(&mut self, _: &Outcome) {}
}

/// Tells `sink` of `outcome`, then gives it back to be returned.
#[inline(always)]
fn ended<S: NotFlowSink>(sink: &mut S, outcome: Outcome) -> Outcome {
    sink.not_flow(&outcome);
    outcome
}

/// [`classify`], telling `sink` of a frame that is not a flow where its walk ends.
#[inline(always)]
pub fn classify_into<P: Packet, S: NotFlowSink>(
    p: &P,
    cfg: &RuntimeConfig,
    sink: &mut S,
) -> Outcome {
    walk_into(p, cfg, &mut Layers::default(), Depth::Whole, sink)
}

/// A UDP header that parsed: ports, declared length, and the view bounded by it.
struct Udp<'a, P: Packet> {
    sport: u16,
    dport: u16,
    len: u16,
    rest: Within<'a, P>,
}

/// The UDP header at `l4` of `q` (which already ends where its IP datagram ends).
#[inline(always)]
fn parse_udp<'a, P: Packet>(
    q: &Within<'a, P>,
    l4: usize,
    r: &Reasons,
) -> Result<Udp<'a, P>, Reason> {
    let Some(h) = q.header(l4, UDP_HLEN) else {
        return Err(r.udp);
    };
    let (sport, dport, len) = (h.be16(0), h.be16(2), h.be16(4));
    // A length shorter than the header itself: the datagram ends inside its header.
    if (len as usize) < UDP_HLEN {
        return Err(r.udp);
    }
    Ok(Udp {
        sport,
        dport,
        len,
        rest: q.ending_at(l4 + len as usize),
    })
}

/// Classifies one frame and says where its layers lie.
#[inline(always)]
pub fn walk<P: Packet>(p: &P, cfg: &RuntimeConfig) -> Walk {
    let mut layers = Layers::default();
    let outcome = walk_into(p, cfg, &mut layers, Depth::Whole, &mut Unheard);
    Walk { outcome, layers }
}

/// How far a walk goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    /// To the BTH (or as far as the frame parses): the outcome is the frame's.
    Whole,
    /// To the inner IP header of a VXLAN packet: only the layers are worth keeping.
    InnerIp,
}

/// The layers of a frame as far as the inner IP header of a VXLAN packet, and no
/// further: what the decapsulation check needs, without the inner datagram's walk.
#[inline(always)]
pub fn tunnel_layers<P: Packet>(p: &P, cfg: &RuntimeConfig) -> Layers {
    let mut layers = Layers::default();
    // The outcome of a walk that stops early says nothing: only the layers are kept.
    let _ = walk_into(p, cfg, &mut layers, Depth::InnerIp, &mut Unheard);
    layers
}

/// A walk that decapsulates mirror copies: the outcome, and the copy's session and
/// length when the frame was one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorWalk {
    pub walk: Walk,
    pub copy: Option<MirrorCopy>,
}

/// [`walk`] on a mirror collector's frame: GRE (transparent Ethernet bridging) and
/// ERSPAN II/III copies are decapsulated and their mirrored frame walked; any other
/// frame is walked as [`walk`] walks it. `layers` are the mirrored frame's, at their
/// offsets in `frame`.
///
/// The mirrored frame is walked on its own, as the kernel walks it (`xdp_mirror` moves
/// the packet's start to it before `xdp_mirror_flows` walks it from offset 0): the
/// parse depth (`wire::MAX_PARSE_OFFSET`) counts from its first byte.
pub fn walk_mirror(frame: &[u8], cfg: &RuntimeConfig) -> MirrorWalk {
    let p = SlicePacket(frame);
    let mut layers = Layers::default();
    let (outcome, copy) = match mirror_start(&p) {
        MirrorStart::Frame => {
            let (outcome, _) = walk_from(&p, cfg, 0, frame.len(), false, &mut layers, &mut Unheard);
            (outcome, None)
        }
        MirrorStart::Copy(mut c, end) => {
            let mirrored = SlicePacket(frame.get(c.eth..end).unwrap_or(&[]));
            let (outcome, wire_len) = walk_from(
                &mirrored,
                cfg,
                0,
                mirrored.len(),
                true,
                &mut layers,
                &mut Unheard,
            );
            c.wire_len = wire_len;
            layers = layers.shifted(c.eth);
            (outcome, Some(c))
        }
        MirrorStart::End(outcome) => (outcome, None),
    };
    MirrorWalk {
        walk: Walk { outcome, layers },
        copy,
    }
}

/// Where the walk of a frame on a mirror collector starts ([`mirror_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorStart {
    /// Not a mirror copy: the frame itself.
    Frame,
    /// A copy: its mirrored frame, which ends at `end` (the copy's outer datagram).
    Copy(MirrorCopy, usize),
    /// A copy that ends before its mirrored frame, or holds none to walk: counted
    /// as this outcome.
    End(Outcome),
}

/// The second half of [`walk_mirror`], for the kernel program that `xdp_mirror`
/// tail-calls with what [`mirror_start`] found: walks the frame at `eth` (the kernel
/// passes 0: `xdp_mirror` moved the packet's start to a copy's mirrored frame), which
/// ends at `end` and is a mirror copy's mirrored frame when `copy`, telling `sink` of each frame that is not a flow where its walk ends (as
/// [`classify_into`] does). For a copy's flow, also the length to count
/// ([`MirrorCopy::wire_len`]; 0 otherwise). The session stays with the caller: carried
/// through the walk, it cost the program stack it does not have.
#[inline(always)]
pub fn classify_from_into<P: Packet, S: NotFlowSink>(
    p: &P,
    cfg: &RuntimeConfig,
    (eth, end, copy): (usize, usize, bool),
    sink: &mut S,
) -> (Outcome, u32) {
    walk_from(p, cfg, eth, end, copy, &mut Layers::default(), sink)
}

/// The walk of the frame at `eth` that ends at `end`: a mirror copy's mirrored frame
/// (`copy`), or the frame itself (0, its length, false).
#[inline(always)]
fn walk_from<P: Packet, S: NotFlowSink>(
    p: &P,
    cfg: &RuntimeConfig,
    eth: usize,
    end: usize,
    copy: bool,
    layers: &mut Layers,
    sink: &mut S,
) -> (Outcome, u32) {
    let frame = Within::new(p).ending_at(end);
    let mut copy_sink = CopySink { sink, copy };
    let outcome = walk_frame(p, &frame, eth, cfg, layers, Depth::Whole, &mut copy_sink);
    if !copy {
        return (outcome, 0);
    }
    match outcome {
        Outcome::Flow(mut parsed) => {
            parsed.key.flags |= KEY_MIRROR;
            let wire_len = match layers.outer {
                Some(ip) => mirrored_len(p, &ip, eth, end),
                None => 0,
            };
            // An AETH or RETH that the switch cut off with the rest of the copy is no
            // parse error (`truncated_ext_header`): the copy was meant to be short.
            if wire_len as usize > end - eth {
                parsed.ext_truncated = false;
            }
            (Outcome::Flow(parsed), wire_len)
        }
        other => (in_copy(other), 0),
    }
}

/// What a walk's end inside a mirror copy counts as: the mirrored frame's classes
/// are `mirror_other`, its truncations (a switch cutting copies) `mirror_truncated`;
/// other malformations (a bad version, a fragment) are the mirrored packet's own.
#[inline(always)]
fn in_copy(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Other(_) => Outcome::Other(Class::MirrorOther),
        Outcome::Malformed(r) if r.is_truncation() => Outcome::Other(Class::MirrorTruncated),
        other => other,
    }
}

/// The sink of a walk that may be a mirror copy's: tells the ends as [`in_copy`]
/// makes them.
struct CopySink<'s, S: NotFlowSink> {
    sink: &'s mut S,
    copy: bool,
}

impl<S: NotFlowSink> NotFlowSink for CopySink<'_, S> {
    #[inline(always)]
    fn not_flow(&mut self, outcome: &Outcome) {
        if self.copy {
            self.sink.not_flow(&in_copy(*outcome));
        } else {
            self.sink.not_flow(outcome);
        }
    }
}

/// The mirrored frame's length as sent: its L2 header (from `eth` to its IP header)
/// and its IP datagram as the header declares it, whatever the copy kept. An IPv6
/// jumbogram's length is in an option: the copy's end bounds it.
#[inline(always)]
fn mirrored_len<P: Packet>(p: &P, ip: &IpLayer, eth: usize, end: usize) -> u32 {
    let l2 = (ip.l3 - eth) as u32;
    // The IP header parsed: its first 8 bytes are in the frame.
    let Some(h) = p.header(ip.l3, 8) else {
        return (end - eth) as u32;
    };
    if !ip.v6 {
        return l2 + h.be16(2) as u32;
    }
    let payload = h.be16(4) as u32;
    if payload == 0 && h.u8(6) == IPPROTO_HOPOPTS {
        return (end - eth) as u32;
    }
    l2 + IPV6_HLEN as u32 + payload
}

/// Whether the frame is a mirror copy, and where its mirrored frame lies: outer
/// Ethernet (+VLAN) / IPv4 or IPv6 / GRE (RFC 2784, 2890: version 0, no routing; C,
/// K, S options) with protocol transparent Ethernet bridging, ERSPAN II (0x88BE with
/// S, 8-byte header, version 1) or ERSPAN III (0x22EB, 12-byte header, version 2,
/// and the 8-byte platform subheader when O is set). docs/mirror.md has the layouts.
#[inline(always)]
pub fn mirror_start<P: Packet>(p: &P) -> MirrorStart {
    let frame = Within::new(p);
    let outer = match common_ip(&frame, 0) {
        Some(ip) => ip,
        None => match outer_ip(&frame, 0) {
            IpStep::Ip(ip) => ip,
            // The walk of the frame itself counts it.
            _ => return MirrorStart::Frame,
        },
    };
    if outer.proto != IPPROTO_GRE {
        return MirrorStart::Frame;
    }
    let q = frame.ending_at(outer.end);
    let Some(gre) = q.header(outer.l4, GRE_HLEN) else {
        return MirrorStart::End(Outcome::Malformed(Reason::TruncatedGre));
    };
    let (flags, proto) = (gre.be16(0), gre.be16(2));
    // As Linux's GRE receive path: another version (PPTP) or source routes is not
    // GRE a mirror session sends.
    if flags & (GRE_FLAG_R | GRE_VERSION_MASK) != 0
        || !matches!(proto, GRE_PROTO_TEB | GRE_PROTO_ERSPAN2 | GRE_PROTO_ERSPAN3)
    {
        return MirrorStart::Frame;
    }
    let options = outer.l4 + GRE_HLEN;
    let key_at = if flags & GRE_FLAG_C != 0 {
        options + 4
    } else {
        options
    };
    let gre_end = outer.l4 + gre_header_len(flags);
    // The whole header with its options must be there.
    if q.u8_at(gre_end - 1).is_none() {
        return MirrorStart::End(Outcome::Malformed(Reason::TruncatedGre));
    }
    let mut copy = MirrorCopy::default();
    match ip_addresses(p, &outer) {
        Some((src, _)) => copy.tag.source = src,
        None => return MirrorStart::Frame,
    }
    let v6 = if outer.v6 { MIRROR_SOURCE_V6 } else { 0 };
    if proto == GRE_PROTO_TEB {
        if flags & GRE_FLAG_K != 0 {
            match q.be32_at(key_at) {
                Some(key) => copy.tag.session = key,
                None => return MirrorStart::End(Outcome::Malformed(Reason::TruncatedGre)),
            }
        }
        copy.tag.kind = MIRROR_GRE | v6;
        copy.eth = gre_end;
    } else if proto == GRE_PROTO_ERSPAN2 {
        // ERSPAN type I: no sequence number, no header, no session to key by.
        if flags & GRE_FLAG_S == 0 {
            return MirrorStart::End(Outcome::Other(Class::MirrorOther));
        }
        let Some(h) = q.header(gre_end, ERSPAN2_HLEN) else {
            return MirrorStart::End(Outcome::Malformed(Reason::TruncatedErspan));
        };
        let word0 = h.be32(0);
        if erspan_version(word0) != ERSPAN_VERSION_II {
            return MirrorStart::End(Outcome::Malformed(Reason::BadErspanVersion));
        }
        copy.tag.session = erspan_session(word0);
        copy.tag.kind = MIRROR_ERSPAN2 | v6;
        copy.truncated = erspan_truncated(word0);
        copy.eth = gre_end + ERSPAN2_HLEN;
    } else {
        let Some(h) = q.header(gre_end, ERSPAN3_HLEN) else {
            return MirrorStart::End(Outcome::Malformed(Reason::TruncatedErspan));
        };
        let (word0, word2) = (h.be32(0), h.be32(8));
        if erspan_version(word0) != ERSPAN_VERSION_III {
            return MirrorStart::End(Outcome::Malformed(Reason::BadErspanVersion));
        }
        if erspan3_frame_type(word2) != 0 {
            return MirrorStart::End(Outcome::Other(Class::MirrorOther));
        }
        copy.tag.session = erspan_session(word0);
        copy.tag.kind = MIRROR_ERSPAN3 | v6;
        copy.truncated = erspan_truncated(word0);
        copy.eth = gre_end + ERSPAN3_HLEN;
        if erspan3_has_platform(word2) {
            copy.eth += ERSPAN3_PLATFORM_HLEN;
            if q.u8_at(copy.eth - 1).is_none() {
                return MirrorStart::End(Outcome::Malformed(Reason::TruncatedErspan));
            }
        }
    }
    MirrorStart::Copy(copy, outer.end)
}

#[inline(always)]
fn walk_into<P: Packet, S: NotFlowSink>(
    p: &P,
    cfg: &RuntimeConfig,
    layers: &mut Layers,
    depth: Depth,
    sink: &mut S,
) -> Outcome {
    walk_frame(p, &Within::new(p), 0, cfg, layers, depth, sink)
}

/// The walk of the Ethernet frame at `eth` of `frame` (0: the frame itself; a mirror
/// copy's mirrored frame, which ends where the copy's outer datagram ends). Inlined
/// with a constant 0 where no mirror is decapsulated, it is the walk it always was.
#[inline(always)]
fn walk_frame<P: Packet, S: NotFlowSink>(
    p: &P,
    frame: &Within<'_, P>,
    eth: usize,
    cfg: &RuntimeConfig,
    layers: &mut Layers,
    depth: Depth,
    sink: &mut S,
) -> Outcome {
    let outer = match common_ip(frame, eth) {
        Some(ip) => ip,
        None => match outer_ip(frame, eth) {
            IpStep::Ip(ip) => ip,
            IpStep::NotIp => return ended(sink, Outcome::Other(Class::NonIp)),
            IpStep::Bad(r) => return ended(sink, Outcome::Malformed(r)),
        },
    };
    layers.outer = Some(outer);
    if outer.proto != IPPROTO_UDP {
        return ended(sink, Outcome::Other(Class::OtherIp));
    }
    let udp = match parse_udp(&frame.ending_at(outer.end), outer.l4, &OUTER) {
        Ok(u) => u,
        Err(r) => return ended(sink, Outcome::Malformed(r)),
    };

    if udp.dport == cfg.roce_port {
        return match parse_roce(&udp.rest, outer.l4 + UDP_HLEN, &OUTER) {
            Ok(mut parsed) => {
                layers.roce = true;
                layers.bth_opcode = parsed.bth.opcode;
                parsed.key = match flow_key(p, &outer, None, parsed.bth.dest_qp) {
                    Ok(key) => key,
                    Err(r) => return ended(sink, Outcome::Malformed(r)),
                };
                parsed.outer_tos = outer.tos;
                parsed.sport = udp.sport;
                parsed.udp_len = udp.len;
                Outcome::Flow(parsed)
            }
            Err(r) => ended(sink, Outcome::Malformed(r)),
        };
    }
    if udp.dport != cfg.vxlan_port {
        return ended(sink, Outcome::Other(Class::OtherUdp));
    }

    // VXLAN (RFC 7348): flags, 3 reserved, VNI, 1 reserved.
    let q = udp.rest;
    let vx = outer.l4 + UDP_HLEN;
    let Some(vxlan) = q.header(vx, VXLAN_HLEN) else {
        return ended(sink, Outcome::Malformed(Reason::TruncatedVxlan));
    };
    let (vx_flags, vni_word) = (vxlan.u8(0), vxlan.be32(4));
    if vx_flags & VXLAN_FLAG_I == 0 {
        // The Linux VXLAN driver drops these too.
        return ended(sink, Outcome::Malformed(Reason::BadVxlanFlags));
    }
    let inner_eth = vx + VXLAN_HLEN;
    layers.inner_eth = Some(inner_eth);
    layers.vni = vni_word >> 8;
    let inner = match common_ip(&q, inner_eth) {
        Some(ip) => ip,
        None => {
            let Some(inner_type) = q.header(inner_eth, ETH_HLEN).map(|h| h.be16(12)) else {
                return ended(sink, Outcome::Malformed(Reason::TruncatedInnerEth));
            };
            match parse_ip(&q, inner_eth + ETH_HLEN, inner_type, &INNER) {
                IpStep::Ip(ip) => ip,
                IpStep::NotIp => return ended(sink, Outcome::Other(Class::VxlanOther)),
                IpStep::Bad(r) => return ended(sink, Outcome::Malformed(r)),
            }
        }
    };
    layers.inner = Some(inner);
    if depth == Depth::InnerIp || inner.proto != IPPROTO_UDP {
        return ended(sink, Outcome::Other(Class::VxlanOther));
    }
    let inner_udp = match parse_udp(&q.ending_at(inner.end), inner.l4, &INNER) {
        Ok(u) => u,
        Err(r) => return ended(sink, Outcome::Malformed(r)),
    };
    if inner_udp.dport != cfg.roce_port {
        return ended(sink, Outcome::Other(Class::VxlanOther));
    }
    match parse_roce(&inner_udp.rest, inner.l4 + UDP_HLEN, &INNER) {
        Ok(mut parsed) => {
            layers.roce = true;
            layers.bth_opcode = parsed.bth.opcode;
            let tunnel = Some((&inner, vni_word >> 8));
            parsed.key = match flow_key(p, &outer, tunnel, parsed.bth.dest_qp) {
                Ok(key) => key,
                Err(r) => return ended(sink, Outcome::Malformed(r)),
            };
            parsed.tunnelled = true;
            parsed.outer_tos = outer.tos;
            parsed.inner_tos = inner.tos;
            parsed.sport = inner_udp.sport;
            parsed.outer_sport = udp.sport;
            parsed.udp_len = inner_udp.len;
            Outcome::Flow(parsed)
        }
        Err(r) => ended(sink, Outcome::Malformed(r)),
    }
}

/// The IP layer behind the Ethernet header at `eth` in the most common shapes, read
/// through one window: no VLAN tag, then IPv4 without options or fragment offset, or
/// IPv6 without extension headers. This is what the general walk ([`outer_ip`], or
/// [`parse_ip`] inside a tunnel) makes of such a frame, without its branches, spills
/// and second checks. None for any other frame, which the general walk then reads; a
/// test holds the two equal.
#[inline(always)]
fn common_ip<P: Packet>(q: &Within<'_, P>, eth: usize) -> Option<IpLayer> {
    let l3 = eth + ETH_HLEN;
    let h = q.header(eth, ETH_HLEN + IPV4_MIN_HLEN)?;
    match h.be16(12) {
        ETH_P_IPV4 => {
            let total = h.be16(ETH_HLEN + 2) as usize;
            if h.u8(ETH_HLEN) != IPV4_VER_IHL_NO_OPTIONS
                || total < IPV4_MIN_HLEN
                || h.be16(ETH_HLEN + 6) & IPV4_FRAG_OFFSET != 0
            {
                return None;
            }
            Some(IpLayer {
                l3,
                l4: l3 + IPV4_MIN_HLEN,
                end: q.ending_at(l3 + total).end,
                proto: h.u8(ETH_HLEN + 9),
                tos: h.u8(ETH_HLEN + 1),
                v6: false,
            })
        }
        ETH_P_IPV6 => {
            let h = q.header(l3, IPV6_HLEN)?;
            let (w0, payload, next) = (h.be32(0), h.be16(4), h.u8(6));
            if w0 >> 28 != 6 || is_ipv6_extension(next) {
                return None;
            }
            Some(IpLayer {
                l3,
                l4: l3 + IPV6_HLEN,
                end: q.ending_at(l3 + IPV6_HLEN + payload as usize).end,
                proto: next,
                tos: (w0 >> 20) as u8,
                v6: true,
            })
        }
        _ => None,
    }
}

/// The outer IP layer: Ethernet (at `eth`), up to `MAX_VLAN_TAGS` tags, IPv4 or IPv6.
#[inline(always)]
fn outer_ip<P: Packet>(frame: &Within<'_, P>, eth: usize) -> IpStep {
    let Some(h) = frame.header(eth, ETH_HLEN) else {
        return IpStep::Bad(Reason::TruncatedEth);
    };
    let mut ethertype = h.be16(12);
    let mut off = eth + ETH_HLEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        let Some(tag) = frame.header(off, VLAN_HLEN) else {
            return IpStep::Bad(Reason::TruncatedVlan);
        };
        ethertype = tag.be16(2);
        off += VLAN_HLEN;
    }
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        return IpStep::Bad(Reason::TooManyVlanTags);
    }
    parse_ip(frame, off, ethertype, &OUTER)
}

/// The flow key of a RoCE packet: outer addresses, and for a tunnelled one the inner
/// layer and the VNI (without ifindex and direction). The addresses lie in headers the
/// walk has already checked, so the error (that layer's truncation reason) is there
/// only because every kernel read is checked.
// The key is filled field by field on a zeroed value: whole-word stores in the kernel build.
#[allow(clippy::field_reassign_with_default)]
#[inline(always)]
fn flow_key<P: Packet>(
    p: &P,
    outer: &IpLayer,
    tunnel: Option<(&IpLayer, u32)>,
    dest_qp: u32,
) -> Result<FlowKey, Reason> {
    let truncated = |ip: &IpLayer, r: &Reasons| if ip.v6 { r.ipv6 } else { r.ipv4 };
    let mut key = FlowKey::default();
    (key.src, key.dst) = ip_addresses(p, outer).ok_or_else(|| truncated(outer, &OUTER))?;
    if outer.v6 {
        key.flags |= KEY_OUTER_V6;
    }
    if let Some((inner, vni)) = tunnel {
        (key.inner_src, key.inner_dst) =
            ip_addresses(p, inner).ok_or_else(|| truncated(inner, &INNER))?;
        key.vni = vni;
        key.flags |= KEY_TUNNELLED;
        if inner.v6 {
            key.flags |= KEY_INNER_V6;
        }
    }
    key.dest_qp = dest_qp;
    Ok(key)
}

#[inline(always)]
fn parse_ip<P: Packet>(q: &Within<'_, P>, off: usize, ethertype: u16, r: &Reasons) -> IpStep {
    if ethertype == ETH_P_IPV4 {
        parse_ipv4(q, off, r)
    } else if ethertype == ETH_P_IPV6 {
        parse_ipv6(q, off, r)
    } else {
        IpStep::NotIp
    }
}

#[inline(always)]
fn parse_ipv4<P: Packet>(q: &Within<'_, P>, off: usize, r: &Reasons) -> IpStep {
    // The fixed header in one check, then the options: checking the deeper, variable
    // offset first lets the compiler drop the fixed check, which the verifier cannot
    // follow.
    let Some(h) = q.header(off, IPV4_MIN_HLEN) else {
        // Cut short: a wrong version or IHL, if its byte is there, is still the reason
        // (as when the header is whole).
        return IpStep::Bad(match q.u8_at(off) {
            Some(v) if v >> 4 != 4 => Reason::BadIpVersion,
            Some(v) if ((v & 0x0F) as usize) * 4 < IPV4_MIN_HLEN => r.ihl,
            _ => r.ipv4,
        });
    };
    let ver_ihl = h.u8(0);
    if ver_ihl >> 4 != 4 {
        return IpStep::Bad(Reason::BadIpVersion);
    }
    let hlen = ((ver_ihl & 0x0F) as usize) * 4;
    if hlen < IPV4_MIN_HLEN {
        return IpStep::Bad(r.ihl);
    }
    let (tos, total, frag, proto) = (h.u8(1), h.be16(2), h.be16(6), h.u8(9));
    // A total length shorter than the header: the datagram ends inside its header.
    if (total as usize) < hlen {
        return IpStep::Bad(r.ipv4);
    }
    let datagram = q.ending_at(off + total as usize);
    // The options' last byte. Without options the fixed header's check covers it:
    // the frame holds 20 bytes and the total length is at least the header's.
    if hlen > IPV4_MIN_HLEN && datagram.u8_at(off + hlen - 1).is_none() {
        return IpStep::Bad(r.ipv4);
    }
    if frag & IPV4_FRAG_OFFSET != 0 {
        return IpStep::Bad(r.frag4);
    }
    IpStep::Ip(IpLayer {
        l3: off,
        l4: off + hlen,
        end: datagram.end,
        proto,
        tos,
        v6: false,
    })
}

#[inline(always)]
fn parse_ipv6<P: Packet>(q: &Within<'_, P>, off: usize, r: &Reasons) -> IpStep {
    let Some(h) = q.header(off, IPV6_HLEN) else {
        return IpStep::Bad(r.ipv6);
    };
    let (w0, payload, next) = (h.be32(0), h.be16(4), h.u8(6));
    if w0 >> 28 != 6 {
        return IpStep::Bad(Reason::BadIpVersion);
    }
    let tos = (w0 >> 20) as u8;
    // Payload length 0 with a hop-by-hop header is a jumbogram (RFC 2675): its length
    // is in an option; the frame bounds it.
    let datagram = if payload == 0 && next == IPPROTO_HOPOPTS {
        q.ending_at(q.end)
    } else {
        q.ending_at(off + IPV6_HLEN + payload as usize)
    };
    let mut proto = next;
    let mut l4 = off + IPV6_HLEN;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match proto {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let Some(ext) = datagram.header(l4, 2) else {
                    return IpStep::Bad(r.ext);
                };
                let len = ext.u8(1);
                proto = ext.u8(0);
                l4 += (len as usize + 1) * 8;
                // The whole header must be there (as IPv4 options must): a frame cut
                // inside it is a truncated extension header, not a truncated UDP header.
                if datagram.u8_at(l4 - 1).is_none() {
                    return IpStep::Bad(r.ext);
                }
            }
            IPPROTO_FRAGMENT => {
                // The whole 8-byte header must be there.
                let Some(ext) = datagram.header(l4, 8) else {
                    return IpStep::Bad(r.ext);
                };
                if ext.be16(2) & 0xFFF8 != 0 {
                    return IpStep::Bad(r.frag6);
                }
                proto = ext.u8(0);
                l4 += 8;
            }
            _ => break,
        }
    }
    if is_ipv6_extension(proto) {
        return IpStep::Bad(r.too_many_ext);
    }
    IpStep::Ip(IpLayer {
        l3: off,
        l4,
        end: datagram.end,
        proto,
        tos,
        v6: true,
    })
}

#[inline(always)]
fn parse_roce<P: Packet>(q: &Within<'_, P>, off: usize, r: &Reasons) -> Result<Parsed, Reason> {
    let Some(h) = q.header(off, BTH_LEN) else {
        return Err(r.bth);
    };
    let bth = Bth::from_words(h.be32(0), h.be32(4), h.be32(8));
    let mut parsed = Parsed {
        bth,
        ..Parsed::default()
    };
    let ext = off + BTH_LEN;
    if bth::has_aeth(bth.opcode) {
        match q.u8_at(ext) {
            Some(s) => {
                parsed.aeth_syndrome = s;
                parsed.has_syndrome = true;
            }
            None => parsed.ext_truncated = true,
        }
    } else if bth.opcode & 0x1F == bth::op::READ_REQUEST && bth::is_tracked_request(bth.opcode) {
        let reth = if bth.transport() == bth::TRANSPORT_XRC {
            ext + XRCETH_LEN
        } else {
            ext
        };
        match q.be32_at(reth + 12) {
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
        assert_eq!(p.outer_sport, 0, "no tunnel, no outer port");
        assert_eq!(
            (p.bth.opcode, p.bth.psn, p.syndrome()),
            (0x11, 7, Some(0x61))
        );
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

    /// What a walk told its sink.
    struct Heard(Vec<Outcome>);

    impl NotFlowSink for Heard {
        fn not_flow(&mut self, outcome: &Outcome) {
            self.0.push(*outcome);
        }
    }

    #[test]
    fn the_sink_hears_each_frame_that_is_not_a_flow_once_and_never_a_flow() {
        let inner = ipv6_udp(IPPROTO_UDP, &[], DEFAULT_ROCE_PORT, &ack());
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0x12, 0x34, 0x56, 0];
        vx.extend(&inner);
        let vxlan = ipv4_udp(DEFAULT_VXLAN_PORT, &vx);
        let plain = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        // Every cut of both frames ends the walk in another header.
        let mut frames: Vec<Vec<u8>> = (14..=vxlan.len()).map(|n| vxlan[..n].to_vec()).collect();
        frames.extend((14..=plain.len()).map(|n| plain[..n].to_vec()));
        frames.push(ipv4_udp(53, b"not roce"));
        let mut tcp = plain.clone();
        tcp[23] = 6;
        frames.push(tcp);
        let mut arp = plain.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        frames.push(arp);
        let mut no_i_flag = vxlan.clone();
        no_i_flag[42] = 0;
        frames.push(no_i_flag);
        let mut inner_not_roce = vxlan.clone();
        inner_not_roce[42 + 8 + 14 + 40 + 2..][..2].copy_from_slice(&53u16.to_be_bytes());
        frames.push(inner_not_roce);

        let mut distinct: Vec<Outcome> = Vec::new();
        for f in &frames {
            let mut heard = Heard(Vec::new());
            let outcome = classify_into(&SlicePacket(f), &RuntimeConfig::default(), &mut heard);
            assert_eq!(outcome, run(f), "{f:02x?}");
            match outcome {
                Outcome::Flow(_) => assert!(heard.0.is_empty(), "{f:02x?}"),
                not_flow => assert_eq!(heard.0, vec![not_flow], "{f:02x?}"),
            }
            if !distinct.contains(&outcome) {
                distinct.push(outcome);
            }
        }
        // The frames reach most of the walk's ends, and both flows.
        for end in [
            Outcome::Other(Class::NonIp),
            Outcome::Other(Class::OtherIp),
            Outcome::Other(Class::OtherUdp),
            Outcome::Other(Class::VxlanOther),
            Outcome::Malformed(Reason::TruncatedIpv4),
            Outcome::Malformed(Reason::TruncatedUdp),
            Outcome::Malformed(Reason::TruncatedBth),
            Outcome::Malformed(Reason::TruncatedVxlan),
            Outcome::Malformed(Reason::BadVxlanFlags),
            Outcome::Malformed(Reason::TruncatedInnerEth),
            Outcome::Malformed(Reason::TruncatedInnerIpv6),
            Outcome::Malformed(Reason::TruncatedInnerUdp),
            Outcome::Malformed(Reason::TruncatedInnerBth),
        ] {
            assert!(distinct.contains(&end), "no frame ended in {end:?}");
        }
        assert!(matches!(run(&plain), Outcome::Flow(_)));
        assert!(matches!(run(&vxlan), Outcome::Flow(_)));
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
        // The outer port is the VTEP's, the one the underlay hashes on.
        assert_eq!(p.outer_sport, 0xC000);
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

    /// Sets a big-endian 16-bit field of a frame.
    fn set16(f: &mut [u8], at: usize, v: u16) {
        f[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    #[test]
    fn ethernet_padding_after_a_short_datagram_is_not_its_bth() {
        // Four bytes of BTH, padded with zeros to the 60-byte Ethernet minimum: the
        // padding would complete a BTH, but the datagram ended before it.
        let mut f = ipv4_udp(DEFAULT_ROCE_PORT, &[0x04, 0, 0xFF, 0xFF]);
        f.resize(60, 0);
        assert_eq!(run(&f), Outcome::Malformed(Reason::TruncatedBth));
        // The same BTH whole and padded: a flow, the padding counted in no header.
        let mut g = ipv4_udp(DEFAULT_ROCE_PORT, &ack()[..12]);
        g.resize(60, 0);
        let Outcome::Flow(p) = run(&g) else {
            panic!("{:?}", run(&g))
        };
        assert_eq!((p.udp_len, p.syndrome(), p.ext_truncated), (20, None, true));
    }

    #[test]
    fn udp_length_bounds_the_datagram() {
        let f = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        // Shorter than the frame, ending after the BTH: the AETH is not the datagram's.
        let mut g = f.clone();
        set16(&mut g, 38, 8 + 12);
        let Outcome::Flow(p) = run(&g) else {
            panic!("{:?}", run(&g))
        };
        assert_eq!((p.syndrome(), p.ext_truncated), (None, true));
        // Ending inside the BTH: not RoCE.
        for len in 8..20 {
            set16(&mut g, 38, len);
            assert_eq!(run(&g), Outcome::Malformed(Reason::TruncatedBth), "{len}");
        }
        // Shorter than the UDP header itself.
        for len in 0..8 {
            set16(&mut g, 38, len);
            assert_eq!(run(&g), Outcome::Malformed(Reason::TruncatedUdp), "{len}");
        }
        // Longer than the frame: read as far as the frame goes.
        set16(&mut g, 38, 1000);
        let Outcome::Flow(p) = run(&g) else {
            panic!("{:?}", run(&g))
        };
        assert_eq!((p.syndrome(), p.udp_len), (Some(0x61), 1000));
    }

    #[test]
    fn ipv4_total_length_bounds_the_datagram() {
        let f = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        let mut g = f.clone();
        let cases = [
            (0u16, Reason::TruncatedIpv4),
            (19, Reason::TruncatedIpv4),
            (20, Reason::TruncatedUdp),
            (27, Reason::TruncatedUdp),
            (28, Reason::TruncatedBth),
            (39, Reason::TruncatedBth),
        ];
        for (total, reason) in cases {
            set16(&mut g, 16, total);
            assert_eq!(run(&g), Outcome::Malformed(reason), "total length {total}");
        }
        set16(&mut g, 16, 40);
        let Outcome::Flow(p) = run(&g) else {
            panic!("{:?}", run(&g))
        };
        assert!(p.ext_truncated, "the AETH lies beyond the total length");
        set16(&mut g, 16, 1500);
        assert_eq!(
            run(&g),
            run(&f),
            "longer than the frame: the frame bounds it"
        );
    }

    #[test]
    fn ipv6_payload_length_bounds_extension_headers_and_datagram() {
        let mut hbh = vec![IPPROTO_UDP, 1, 1, 12];
        hbh.extend([0u8; 12]);
        let f = ipv6_udp(IPPROTO_HOPOPTS, &hbh, DEFAULT_ROCE_PORT, &ack());
        let mut g = f.clone();
        let cases = [
            (15u16, Reason::TruncatedIpv6Ext),
            (16, Reason::TruncatedUdp),
            (24, Reason::TruncatedBth),
            (35, Reason::TruncatedBth),
        ];
        for (payload, reason) in cases {
            set16(&mut g, 18, payload);
            assert_eq!(
                run(&g),
                Outcome::Malformed(reason),
                "payload length {payload}"
            );
        }
        set16(&mut g, 18, 36);
        assert!(matches!(run(&g), Outcome::Flow(p) if p.ext_truncated));
        set16(&mut g, 18, 9000);
        assert_eq!(run(&g), run(&f));
        // Payload length 0 without hop-by-hop: an empty datagram. With it: a jumbogram,
        // bounded by the frame.
        let mut plain = ipv6_udp(IPPROTO_UDP, &[], DEFAULT_ROCE_PORT, &ack());
        set16(&mut plain, 18, 0);
        assert_eq!(run(&plain), Outcome::Malformed(Reason::TruncatedUdp));
        set16(&mut g, 18, 0);
        assert_eq!(run(&g), run(&f));
    }

    #[test]
    fn inner_lengths_bound_the_inner_datagram() {
        let inner = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0, 0, 7, 0];
        vx.extend(&inner);
        let f = ipv4_udp(DEFAULT_VXLAN_PORT, &vx);
        assert!(matches!(run(&f), Outcome::Flow(p) if p.tunnelled));
        // Inner UDP length ending inside the inner BTH (inner UDP header at 84).
        let mut g = f.clone();
        set16(&mut g, 84 + 4, 8 + 4);
        assert_eq!(run(&g), Outcome::Malformed(Reason::TruncatedInnerBth));
        // Inner IPv4 total length ending inside the inner UDP header (inner IP at 64).
        let mut h = f.clone();
        set16(&mut h, 64 + 2, 24);
        assert_eq!(run(&h), Outcome::Malformed(Reason::TruncatedInnerUdp));
        // The outer UDP length ending inside the inner IP header (outer UDP at 34).
        let mut o = f.clone();
        set16(&mut o, 34 + 4, 8 + 8 + 14 + 10);
        assert_eq!(run(&o), Outcome::Malformed(Reason::TruncatedInnerIpv4));
    }

    /// What the general walk makes of the IP layer behind the Ethernet header at `eth`
    /// of `q` (no VLAN tags), when it parses.
    fn general_ip(q: &Within<'_, SlicePacket>, eth: usize) -> Option<IpLayer> {
        let ethertype = q.header(eth, ETH_HLEN)?.be16(12);
        match parse_ip(q, eth + ETH_HLEN, ethertype, &INNER) {
            IpStep::Ip(ip) => Some(ip),
            _ => None,
        }
    }

    /// Checks `common_ip` against the general walk on every cut of `f`, outside a
    /// tunnel and as the inner frame of one; returns how many cuts it decided, by
    /// family (IPv4, IPv6).
    fn window_agrees_with_the_walk(f: &[u8], what: &str) -> [usize; 2] {
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0, 0, 7, 0];
        vx.extend(f);
        let tunnel = ipv4_udp(DEFAULT_VXLAN_PORT, &vx);
        let inner_eth = 14 + 20 + 8 + 8;
        let mut taken = [0, 0];
        for len in [0, 13, 14, 33, 34, 35, 41, 42, 53, 54, 55, 61, 62, f.len()] {
            let len = len.min(f.len());
            let p = SlicePacket(&f[..len]);
            let frame = Within::new(&p);
            if let Some(ip) = common_ip(&frame, 0) {
                taken[ip.v6 as usize] += 1;
                assert_eq!(outer_ip(&frame, 0), IpStep::Ip(ip), "{what}, cut at {len}");
            }
            let p = SlicePacket(&tunnel[..inner_eth + len]);
            let q = Within::new(&p);
            if let Some(ip) = common_ip(&q, inner_eth) {
                assert_eq!(
                    general_ip(&q, inner_eth),
                    Some(ip),
                    "inner {what}, cut at {len}"
                );
            }
        }
        taken
    }

    #[test]
    fn the_one_window_reading_of_common_ip_headers_is_the_general_walks() {
        // Every field the window reads, at values on both sides of each of its tests,
        // on frames cut at every length around the headers' ends.
        let base = ipv4_udp(DEFAULT_ROCE_PORT, &ack());
        let mut taken = 0;
        for ethertype in [ETH_P_IPV4, ETH_P_IPV6, ETH_P_8021Q, 0x0806] {
            for ver_ihl in [0x45u8, 0x44, 0x46, 0x4F, 0x55, 0x65, 0x05] {
                for total in [0u16, 19, 20, 21, 27, 28, 40, 48, 1500] {
                    for frag in [0u16, 0x2000, 0x4000, 0x0001, 0x1FFF, 0x8000] {
                        let mut f = base.clone();
                        set16(&mut f, 12, ethertype);
                        f[14] = ver_ihl;
                        set16(&mut f, 16, total);
                        set16(&mut f, 20, frag);
                        let what = std::format!("{ethertype:#x} {ver_ihl:#x} {total} {frag:#x}");
                        taken += window_agrees_with_the_walk(&f, &what)[0];
                    }
                }
            }
        }
        // IPv4 decided: total >= 20 (7 values), offset 0 (4 of 6), cut at 34 or
        // later (10 of 14).
        assert_eq!(taken, 7 * 4 * 10);
        let base = ipv6_udp(IPPROTO_UDP, &[], DEFAULT_ROCE_PORT, &ack());
        let mut taken = 0;
        for version in [0x60u8, 0x40, 0x70] {
            for payload in [0u16, 7, 8, 20, 36, 1500] {
                for next in [
                    IPPROTO_UDP,
                    IPPROTO_TCP,
                    IPPROTO_HOPOPTS,
                    IPPROTO_ROUTING,
                    IPPROTO_DSTOPTS,
                    IPPROTO_FRAGMENT,
                    59,
                ] {
                    let mut f = base.clone();
                    f[14] = version | (f[14] & 0x0F);
                    set16(&mut f, 18, payload);
                    f[20] = next;
                    let what = std::format!("{version:#x} {payload} {next}");
                    taken += window_agrees_with_the_walk(&f, &what)[1];
                }
            }
        }
        // IPv6 decided: version 6, no extension header (3 of 7), cut at 54 or later
        // (5 of 14).
        assert_eq!(taken, 6 * 3 * 5);
    }

    #[test]
    fn walk_says_where_each_layer_lies() {
        let inner = ipv6_udp(IPPROTO_UDP, &[], 5000, &[0u8; 4]);
        let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0, 0, 7, 0];
        vx.extend(&inner);
        let mut f = ipv4_udp(DEFAULT_VXLAN_PORT, &vx);
        let datagram_end = f.len();
        f.resize(f.len() + 6, 0xEE); // trailing garbage
        let w = walk(&SlicePacket(&f), &RuntimeConfig::default());
        assert_eq!(w.outcome, Outcome::Other(Class::VxlanOther));
        let outer = w.layers.outer.expect("outer IP");
        assert_eq!((outer.l3, outer.l4, outer.end), (14, 34, datagram_end));
        assert_eq!(
            (outer.proto, outer.tos, outer.v6),
            (IPPROTO_UDP, 106, false)
        );
        assert_eq!(w.layers.inner_eth, Some(50));
        let inner = w.layers.inner.expect("inner IP");
        assert_eq!((inner.l3, inner.l4, inner.end), (64, 104, datagram_end));
        assert_eq!((inner.tos, inner.v6), (0x6A, true));
        // A TCP frame: the outer layer only.
        let mut tcp = ipv4_udp(80, &[0u8; 20]);
        tcp[23] = IPPROTO_TCP;
        let w = walk(&SlicePacket(&tcp), &RuntimeConfig::default());
        assert_eq!(w.outcome, Outcome::Other(Class::OtherIp));
        assert_eq!(w.layers.outer.map(|o| o.proto), Some(IPPROTO_TCP));
        assert_eq!((w.layers.inner_eth, w.layers.inner), (None, None));
    }
}

#[cfg(test)]
#[path = "classify_mirror_tests.rs"]
mod mirror_tests;
