//! The walk of mirror copies (`walk_mirror`; `mirror_start` and `classify_from_into`, the kernel's two steps) on hand-made
//! frames: GRE (transparent Ethernet bridging) with and without its options, ERSPAN
//! II and III (with and without the platform subheader), over IPv4 and IPv6, cut as
//! switches cut copies, and the ends that are not flows.
extern crate std;
use super::*;
use crate::packet::SlicePacket;
use std::vec;
use std::vec::Vec;

const SENDER4: [u8; 4] = [198, 18, 9, 1];
const SENDER6: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x09, 0x01,
];

fn cfg() -> RuntimeConfig {
    RuntimeConfig::default()
}

/// A RoCE frame to mirror: Ethernet / IPv4 or IPv6 / UDP 4791 / BTH (RDMA WRITE
/// ONLY, QP 0x000abc, PSN 0x10) / `payload` bytes / ICRC. 198.18.0.1 -> 198.18.0.2
/// or 2001:db8::1 -> 2001:db8::2, TOS / traffic class 0x6A (DSCP 26, ECT(0)).
fn roce(v6: bool, payload: usize) -> Vec<u8> {
    let mut bth = vec![0x0A, 0, 0xFF, 0xFF, 0, 0x00, 0x0A, 0xBC, 0, 0, 0, 0x10];
    bth.resize(12 + payload + 4, 0x5A);
    let udp_len = (8 + bth.len()) as u16;
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    if v6 {
        f.extend(ETH_P_IPV6.to_be_bytes());
        f.extend([0x66, 0xA0, 0, 0]);
        f.extend(udp_len.to_be_bytes());
        f.extend([IPPROTO_UDP, 64]);
        f.extend([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        f.extend(ETH_P_IPV4.to_be_bytes());
        f.extend([0x45, 0x6A]);
        f.extend((20 + udp_len).to_be_bytes());
        f.extend([0, 0, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
        f.extend([198, 18, 0, 1, 198, 18, 0, 2]);
    }
    f.extend(0xC0DEu16.to_be_bytes());
    f.extend(DEFAULT_ROCE_PORT.to_be_bytes());
    f.extend(udp_len.to_be_bytes());
    f.extend([0, 0]);
    f.extend(bth);
    f
}

/// GRE flags and protocol, then the options the flags announce.
fn gre(flags: u16, proto: u16, key: u32) -> Vec<u8> {
    let mut g = Vec::new();
    g.extend(flags.to_be_bytes());
    g.extend(proto.to_be_bytes());
    if flags & GRE_FLAG_C != 0 {
        g.extend([0xAB, 0xCD, 0, 0]);
    }
    if flags & GRE_FLAG_K != 0 {
        g.extend(key.to_be_bytes());
    }
    if flags & GRE_FLAG_S != 0 {
        g.extend(77u32.to_be_bytes());
    }
    g
}

/// ERSPAN II header: version, VLAN 0x064, COS 5, En 3, T, session, index 0x12345.
fn erspan2(version: u32, t: bool, session: u32) -> Vec<u8> {
    let word0 = version << 28 | 0x064 << 16 | 5 << 13 | 3 << 11 | (t as u32) << 10 | session;
    let mut h = word0.to_be_bytes().to_vec();
    h.extend(0x0001_2345u32.to_be_bytes());
    h
}

/// ERSPAN III header: version, T, session, a timestamp, SGT 0x1234, FT, HW ID 5,
/// D 1, Gra 1, O; with O the 8-byte platform subheader.
fn erspan3(version: u32, t: bool, session: u32, ft: u32, o: bool) -> Vec<u8> {
    let word0 = version << 28 | 0x064 << 16 | 2 << 11 | (t as u32) << 10 | session;
    let word2 = 0x1234 << 16 | ft << 10 | 5 << 4 | 1 << 3 | 1 << 1 | o as u32;
    let mut h = word0.to_be_bytes().to_vec();
    h.extend(0xDEAD_BEEFu32.to_be_bytes());
    h.extend(word2.to_be_bytes());
    if o {
        h.extend([0x0C, 0, 0, 1, 0xFE, 0xED, 0xF0, 0x0D]);
    }
    h
}

/// Outer Ethernet / IPv4 or IPv6 (protocol GRE) from the sender / `payload`.
fn outer(v6: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x10, 0x02, 0, 0, 0, 0, 0x11];
    if v6 {
        f.extend(ETH_P_IPV6.to_be_bytes());
        f.extend([0x60, 0, 0, 0]);
        f.extend((payload.len() as u16).to_be_bytes());
        f.extend([IPPROTO_GRE, 64]);
        f.extend(SENDER6);
        f.extend([
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x09, 0x02,
        ]);
    } else {
        f.extend(ETH_P_IPV4.to_be_bytes());
        f.extend([0x45, 0]);
        f.extend(((20 + payload.len()) as u16).to_be_bytes());
        f.extend([0, 0, 0x40, 0, 64, IPPROTO_GRE, 0, 0]);
        f.extend(SENDER4);
        f.extend([198, 18, 9, 2]);
    }
    f.extend_from_slice(payload);
    f
}

/// `outer(v6, headers ++ mirrored)`.
fn copy_of(v6: bool, headers: &[Vec<u8>], mirrored: &[u8]) -> Vec<u8> {
    let mut payload: Vec<u8> = headers.concat();
    payload.extend_from_slice(mirrored);
    outer(v6, &payload)
}

fn sender(v6: bool) -> [u32; 4] {
    if v6 {
        let w = |k: usize| {
            u32::from_ne_bytes([SENDER6[k], SENDER6[k + 1], SENDER6[k + 2], SENDER6[k + 3]])
        };
        [w(0), w(4), w(8), w(12)]
    } else {
        addr_v4_mapped(u32::from_ne_bytes(SENDER4))
    }
}

fn tag(v6: bool, kind: u32, session: u32) -> MirrorTag {
    MirrorTag {
        source: sender(v6),
        session,
        kind: kind | if v6 { MIRROR_SOURCE_V6 } else { 0 },
    }
}

/// The parsed packet of `mirrored` walked on its own, keyed as mirrored.
fn mirrored_parsed(mirrored: &[u8]) -> Parsed {
    let Outcome::Flow(mut p) = walk(&SlicePacket(mirrored), &cfg()).outcome else {
        panic!("not a flow on its own: {mirrored:02x?}")
    };
    p.key.flags |= KEY_MIRROR;
    p
}

/// What `xdp_mirror` and the program it tail-calls make of a frame: the start,
/// then the walk from it; a start that ends the walk is told to the sink there.
fn kernel_steps<S: NotFlowSink>(f: &[u8], sink: &mut S) -> (Outcome, Option<MirrorCopy>) {
    let p = SlicePacket(f);
    match mirror_start(&p) {
        MirrorStart::Frame => (
            classify_from_into(&p, &cfg(), (0, f.len(), false), sink).0,
            None,
        ),
        MirrorStart::Copy(mut c, end) => {
            // xdp_mirror moves the packet's start to the mirrored frame.
            let m = SlicePacket(&f[c.eth..]);
            let (outcome, wire_len) = classify_from_into(&m, &cfg(), (0, end - c.eth, true), sink);
            c.wire_len = wire_len;
            (outcome, Some(c))
        }
        MirrorStart::End(o) => {
            sink.not_flow(&o);
            (o, None)
        }
    }
}

fn mirror_walk(f: &[u8]) -> MirrorWalk {
    let w = walk_mirror(f, &cfg());
    // The kernel's two steps make the same of it.
    assert_eq!(
        kernel_steps(f, &mut Unheard),
        (w.walk.outcome, w.copy),
        "{f:02x?}"
    );
    w
}

/// Checks one copy that must be a flow: the mirrored packet's own fields, the
/// session, where the mirrored frame starts and the length counted.
fn assert_copy(f: &[u8], mirrored: &[u8], want: MirrorTag, eth: usize, wire_len: usize) {
    let w = mirror_walk(f);
    assert_eq!(
        w.walk.outcome,
        Outcome::Flow(mirrored_parsed(mirrored)),
        "{f:02x?}"
    );
    let c = w.copy.expect("a copy");
    assert_eq!((c.tag, c.eth, c.wire_len as usize), (want, eth, wire_len));
    // Without decapsulation the copy is GRE, as it always was.
    assert_eq!(
        walk(&SlicePacket(f), &cfg()).outcome,
        Outcome::Other(Class::OtherIp)
    );
}

#[test]
fn gre_teb_with_every_combination_of_its_options() {
    for v6 in [false, true] {
        for inner_v6 in [false, true] {
            let m = roce(inner_v6, 64);
            let hlen = if v6 { 54 } else { 34 };
            for flags in [
                0,
                GRE_FLAG_K,
                GRE_FLAG_S,
                GRE_FLAG_C,
                GRE_FLAG_K | GRE_FLAG_S,
                GRE_FLAG_C | GRE_FLAG_K,
                GRE_FLAG_C | GRE_FLAG_K | GRE_FLAG_S,
            ] {
                let f = copy_of(v6, &[gre(flags, GRE_PROTO_TEB, 0xA1B2_C3D4)], &m);
                let session = if flags & GRE_FLAG_K != 0 {
                    0xA1B2_C3D4
                } else {
                    0
                };
                let eth = hlen + gre_header_len(flags);
                assert_copy(&f, &m, tag(v6, MIRROR_GRE, session), eth, m.len());
            }
        }
    }
}

#[test]
fn erspan_ii_and_iii_with_and_without_the_platform_subheader() {
    for v6 in [false, true] {
        let hlen = if v6 { 54 } else { 34 };
        for inner_v6 in [false, true] {
            let m = roce(inner_v6, 100);
            let g2 = gre(GRE_FLAG_S, GRE_PROTO_ERSPAN2, 0);
            let f = copy_of(v6, &[g2.clone(), erspan2(1, false, 0x3FF)], &m);
            assert_copy(
                &f,
                &m,
                tag(v6, MIRROR_ERSPAN2, 0x3FF),
                hlen + 8 + 8,
                m.len(),
            );
            // Linux's erspan devices send a key as well.
            let g2k = gre(GRE_FLAG_K | GRE_FLAG_S, GRE_PROTO_ERSPAN2, 9);
            let f = copy_of(v6, &[g2k, erspan2(1, false, 17)], &m);
            assert_copy(&f, &m, tag(v6, MIRROR_ERSPAN2, 17), hlen + 12 + 8, m.len());
            for o in [false, true] {
                let g3 = gre(GRE_FLAG_S, GRE_PROTO_ERSPAN3, 0);
                let f = copy_of(v6, &[g3, erspan3(2, false, 0x155, 0, o)], &m);
                let eth = hlen + 8 + 12 + if o { 8 } else { 0 };
                assert_copy(&f, &m, tag(v6, MIRROR_ERSPAN3, 0x155), eth, m.len());
            }
        }
    }
}

#[test]
fn a_mirrored_vxlan_frame_is_the_inner_roce_flow_with_its_vni() {
    let inner = roce(true, 32);
    let mut vx = vec![VXLAN_FLAG_I, 0, 0, 0, 0x00, 0x12, 0x34, 0];
    vx.extend(&inner);
    // Ethernet / IPv4 / UDP 4789 / VXLAN / the RoCE frame.
    let mut m = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    m.extend(ETH_P_IPV4.to_be_bytes());
    m.extend([0x45, 0]);
    m.extend(((20 + 8 + vx.len()) as u16).to_be_bytes());
    m.extend([
        0,
        0,
        0x40,
        0,
        64,
        IPPROTO_UDP,
        0,
        0,
        198,
        18,
        1,
        1,
        198,
        18,
        1,
        2,
    ]);
    m.extend([0x30, 0x39]);
    m.extend(DEFAULT_VXLAN_PORT.to_be_bytes());
    m.extend(((8 + vx.len()) as u16).to_be_bytes());
    m.extend([0, 0]);
    m.extend(&vx);
    let f = copy_of(
        false,
        &[gre(GRE_FLAG_S, GRE_PROTO_ERSPAN2, 0), erspan2(1, false, 5)],
        &m,
    );
    assert_copy(&f, &m, tag(false, MIRROR_ERSPAN2, 5), 50, m.len());
    let Outcome::Flow(p) = mirror_walk(&f).walk.outcome else {
        panic!()
    };
    assert_eq!(p.key.flags, KEY_MIRROR | KEY_TUNNELLED | KEY_INNER_V6);
    assert_eq!(p.key.vni, 0x1234);
}

#[test]
fn truncated_copies_count_their_original_length() {
    // A switch cuts the mirrored frame to 64, 128 or 256 bytes, sets T and wraps
    // the rest: the copy counts 14 + the IP header's length, and is a flow as long as
    // the BTH is inside what was kept.
    for inner_v6 in [false, true] {
        let m = roce(inner_v6, 1000);
        let bth_end = if inner_v6 { 74 } else { 54 };
        for cut in [64usize, 128, 256] {
            let kept = &m[..cut];
            for erspan3_header in [false, true] {
                let (g, h, kind) = if erspan3_header {
                    (
                        gre(GRE_FLAG_S, GRE_PROTO_ERSPAN3, 0),
                        erspan3(2, true, 7, 0, false),
                        MIRROR_ERSPAN3,
                    )
                } else {
                    (
                        gre(GRE_FLAG_S, GRE_PROTO_ERSPAN2, 0),
                        erspan2(1, true, 7),
                        MIRROR_ERSPAN2,
                    )
                };
                let eth = 34 + g.len() + h.len();
                let f = copy_of(false, &[g, h], kept);
                let w = mirror_walk(&f);
                let c = w.copy.expect("a copy");
                assert!(c.truncated);
                if bth_end <= cut {
                    // Parsed as the whole frame parses: the BTH is all it reads.
                    assert_eq!(w.walk.outcome, Outcome::Flow(mirrored_parsed(&m)), "{cut}");
                    assert_eq!((c.tag, c.eth), (tag(false, kind, 7), eth));
                    assert_eq!(c.wire_len as usize, m.len(), "cut at {cut}");
                } else {
                    assert_eq!(
                        w.walk.outcome,
                        Outcome::Other(Class::MirrorTruncated),
                        "{cut}"
                    );
                }
            }
        }
    }
}

#[test]
fn an_aeth_the_switch_cut_off_is_no_parse_error() {
    // An ACKNOWLEDGE whose AETH (bytes 54..58 of the mirrored frame) the copy cuts:
    // the copy keeps the BTH and no more.
    let mut m = roce(false, 0);
    m[42] = 0x11; // RC ACKNOWLEDGE: an AETH follows the BTH
    m.resize(m.len() + 4, 0x61); // NAK syndrome, then the ICRC of `roce`
    let total = (m.len() - 14) as u16;
    m[16..18].copy_from_slice(&total.to_be_bytes());
    let udp = (m.len() - 34) as u16;
    m[38..40].copy_from_slice(&udp.to_be_bytes());
    let Outcome::Flow(whole) = walk(&SlicePacket(&m), &cfg()).outcome else {
        panic!("an ACK")
    };
    assert!(whole.has_syndrome);
    let cut = copy_of(
        false,
        &[gre(GRE_FLAG_S, GRE_PROTO_ERSPAN2, 0), erspan2(1, true, 4)],
        &m[..54],
    );
    let w = mirror_walk(&cut);
    let Outcome::Flow(p) = w.walk.outcome else {
        panic!("{:?}", w.walk.outcome)
    };
    assert_eq!((p.has_syndrome, p.ext_truncated), (false, false));
    assert_eq!(w.copy.map(|c| c.wire_len as usize), Some(m.len()));
    // The same cut in a frame that arrived itself is a truncated extension header.
    let mut alone = m[..54].to_vec();
    alone[16..18].copy_from_slice(&40u16.to_be_bytes());
    alone[38..40].copy_from_slice(&20u16.to_be_bytes());
    assert!(
        matches!(walk(&SlicePacket(&alone), &cfg()).outcome, Outcome::Flow(p) if p.ext_truncated)
    );
}

#[test]
fn the_counted_length_is_the_declared_one_not_the_padding() {
    // A short mirrored frame padded to the Ethernet minimum: its IP header says
    // where it ends.
    let mut m = roce(false, 0);
    let real = m.len();
    m.resize(real + 6, 0);
    let f = copy_of(false, &[gre(0, GRE_PROTO_TEB, 0)], &m);
    assert_eq!(
        mirror_walk(&f).copy.map(|c| c.wire_len as usize),
        Some(real)
    );
    // Behind a VLAN tag: the tag is part of the L2 header counted.
    let plain = roce(false, 8);
    let mut tagged = plain[..12].to_vec();
    tagged.extend([0x81, 0x00, 0x00, 0x64]);
    tagged.extend(&plain[12..]);
    let f = copy_of(false, &[gre(0, GRE_PROTO_TEB, 0)], &tagged);
    let w = mirror_walk(&f);
    assert!(matches!(w.walk.outcome, Outcome::Flow(_)));
    assert_eq!(w.copy.map(|c| c.wire_len as usize), Some(plain.len() + 4));
}

#[test]
fn copies_that_hold_no_roce() {
    let m = roce(false, 16);
    let erspan3_ft = |ft| {
        copy_of(
            false,
            &[
                gre(GRE_FLAG_S, GRE_PROTO_ERSPAN3, 0),
                erspan3(2, false, 1, ft, false),
            ],
            &m,
        )
    };
    // A frame type other than Ethernet.
    for ft in [2, 1, 0x1F] {
        assert_eq!(
            mirror_walk(&erspan3_ft(ft)).walk.outcome,
            Outcome::Other(Class::MirrorOther)
        );
    }
    // ERSPAN type I: 0x88BE without a sequence number, no header.
    let f = copy_of(false, &[gre(0, GRE_PROTO_ERSPAN2, 0)], &m);
    assert_eq!(
        mirror_walk(&f).walk.outcome,
        Outcome::Other(Class::MirrorOther)
    );
    // A mirrored frame that is not RoCE: another UDP port, TCP, ARP.
    let mut other_udp = m.clone();
    other_udp[36..38].copy_from_slice(&53u16.to_be_bytes());
    let mut tcp = m.clone();
    tcp[23] = IPPROTO_TCP;
    let mut arp = m.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    for mirrored in [other_udp, tcp, arp] {
        let f = copy_of(true, &[gre(GRE_FLAG_K, GRE_PROTO_TEB, 3)], &mirrored);
        let w = mirror_walk(&f);
        assert_eq!(w.walk.outcome, Outcome::Other(Class::MirrorOther));
        assert_eq!(w.copy.map(|c| c.tag), Some(tag(true, MIRROR_GRE, 3)));
    }
    // A mirrored frame that is a fragment: the mirrored packet's own malformation.
    let mut frag = m.clone();
    frag[20] = 0x01;
    let f = copy_of(false, &[gre(0, GRE_PROTO_TEB, 0)], &frag);
    assert_eq!(
        mirror_walk(&f).walk.outcome,
        Outcome::Malformed(Reason::Ipv4Fragment)
    );
}

#[test]
fn bad_versions_and_cut_headers() {
    let m = roce(false, 16);
    let e2 = |v| {
        copy_of(
            false,
            &[gre(GRE_FLAG_S, GRE_PROTO_ERSPAN2, 0), erspan2(v, false, 1)],
            &m,
        )
    };
    let e3 = |v| {
        copy_of(
            false,
            &[
                gre(GRE_FLAG_S, GRE_PROTO_ERSPAN3, 0),
                erspan3(v, false, 1, 0, false),
            ],
            &m,
        )
    };
    for v in [0, 2, 3, 15] {
        assert_eq!(
            mirror_walk(&e2(v)).walk.outcome,
            Outcome::Malformed(Reason::BadErspanVersion)
        );
    }
    for v in [0, 1, 3, 15] {
        assert_eq!(
            mirror_walk(&e3(v)).walk.outcome,
            Outcome::Malformed(Reason::BadErspanVersion)
        );
    }
    // Every cut inside the GRE and ERSPAN headers: 34 is where GRE starts.
    let full = copy_of(
        false,
        &[
            gre(GRE_FLAG_C | GRE_FLAG_K | GRE_FLAG_S, GRE_PROTO_ERSPAN3, 1),
            erspan3(2, false, 1, 0, true),
        ],
        &m,
    );
    for n in 34..34 + 16 {
        let mut f = full[..n].to_vec();
        f[16..18].copy_from_slice(&((n - 14) as u16).to_be_bytes());
        assert_eq!(
            mirror_walk(&f).walk.outcome,
            Outcome::Malformed(Reason::TruncatedGre),
            "{n}"
        );
    }
    for n in 34 + 16..34 + 16 + 20 {
        let mut f = full[..n].to_vec();
        f[16..18].copy_from_slice(&((n - 14) as u16).to_be_bytes());
        assert_eq!(
            mirror_walk(&f).walk.outcome,
            Outcome::Malformed(Reason::TruncatedErspan),
            "{n}"
        );
    }
    // The outer datagram's length bounds the GRE header as it bounds every other.
    let mut short = full.clone();
    short[16..18].copy_from_slice(&(20u16 + 10).to_be_bytes());
    assert_eq!(
        mirror_walk(&short).walk.outcome,
        Outcome::Malformed(Reason::TruncatedGre)
    );
    // Cut right after the headers: the mirrored frame's Ethernet header is missing.
    let mut f = full[..34 + 36].to_vec();
    f[16..18].copy_from_slice(&(20u16 + 36).to_be_bytes());
    assert_eq!(
        mirror_walk(&f).walk.outcome,
        Outcome::Other(Class::MirrorTruncated)
    );
}

#[test]
fn gre_that_is_no_mirror_session_is_walked_as_the_frame_it_is() {
    let m = roce(false, 16);
    // Version 1 (PPTP), source routes, another protocol (IPv4 in GRE).
    for (flags, proto) in [
        (1u16, GRE_PROTO_TEB),
        (GRE_FLAG_R, GRE_PROTO_TEB),
        (0, ETH_P_IPV4),
    ] {
        let f = copy_of(false, &[gre(flags, proto, 0)], &m);
        let w = mirror_walk(&f);
        assert_eq!(
            (w.walk.outcome, w.copy),
            (Outcome::Other(Class::OtherIp), None),
            "{flags:#x} {proto:#x}"
        );
    }
    // Plain RoCE on a mirror interface is the flow it always is.
    let w = mirror_walk(&m);
    assert_eq!(
        (w.walk.outcome, w.copy),
        (walk(&SlicePacket(&m), &cfg()).outcome, None)
    );
}

/// What a walk told its sink.
struct Heard(Vec<Outcome>);

impl NotFlowSink for Heard {
    fn not_flow(&mut self, outcome: &Outcome) {
        self.0.push(*outcome);
    }
}

#[test]
fn the_sink_hears_each_copy_that_is_not_a_flow_once_as_the_walk_ends_it() {
    let m = roce(true, 300);
    let full = copy_of(
        true,
        &[
            gre(GRE_FLAG_S, GRE_PROTO_ERSPAN3, 0),
            erspan3(2, true, 2, 0, true),
        ],
        &m,
    );
    let mut ends = Vec::new();
    for n in 14..full.len() {
        let mut f = full[..n].to_vec();
        if n >= 54 {
            f[18..20].copy_from_slice(&((n - 54) as u16).to_be_bytes());
        }
        let mut heard = Heard(Vec::new());
        let (outcome, _) = kernel_steps(&f, &mut heard);
        match outcome {
            Outcome::Flow(_) => assert!(heard.0.is_empty(), "{n}"),
            other => assert_eq!(heard.0, vec![other], "{n}"),
        }
        if !ends.contains(&outcome) {
            ends.push(outcome);
        }
    }
    for end in [
        Outcome::Malformed(Reason::TruncatedIpv6),
        Outcome::Malformed(Reason::TruncatedGre),
        Outcome::Malformed(Reason::TruncatedErspan),
        Outcome::Other(Class::MirrorTruncated),
    ] {
        assert!(ends.contains(&end), "no cut ended in {end:?}");
    }
    assert!(ends.iter().any(|o| matches!(o, Outcome::Flow(_))));
}
