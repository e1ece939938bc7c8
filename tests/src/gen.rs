//! The frames of the differential runs (`crate::differential`): random and
//! structure-aware mutated Ethernet frames. RoCE (plain and in VXLAN, every BTH
//! opcode), other traffic, deep IPv6 extension chains and noise, built with the test
//! kit's frame builder; then, for most of them, one to three mutations aimed at the
//! fields parsers trip on: declared lengths, EtherTypes and VLAN stacks, IP versions,
//! IPv6 extension headers and fragments, UDP ports, VXLAN flags, the BTH opcode, and
//! cuts inside the headers. A seed makes a run reproducible.

use std::net::{Ipv4Addr, Ipv6Addr};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use roce_common::config::RuntimeConfig;
use roce_common::wire::{ETH_HLEN, UDP_HLEN, VLAN_HLEN, VXLAN_HLEN};
use roce_testkit::frame::{
    cnp, defined_opcodes, eth_frame, ip_frame, roce_frame_to, udp_frame, vxlan_frame, Eth, Ipv6Ext,
    RoceMsg, VlanTag, L3,
};

/// Offsets of the fields the structure-aware mutations aim at.
#[derive(Default, Debug)]
pub struct Marks {
    /// EtherType fields (outer Ethernet, each VLAN tag, inner Ethernet).
    ethertypes: Vec<usize>,
    /// IP headers and whether each is IPv6.
    ips: Vec<(usize, bool)>,
    /// IPv6 extension headers.
    v6_ext: Vec<usize>,
    udps: Vec<usize>,
    vxlan: Option<usize>,
    bth: Option<usize>,
}

/// A generated frame and where its fields lie (for the mutations).
pub struct Sample {
    pub frame: Vec<u8>,
    pub marks: Marks,
}

/// The frame generator: every frame follows from the seed and the frames before it.
pub struct Gen {
    rng: StdRng,
    opcodes: Vec<u8>,
    psn: u32,
    config: RuntimeConfig,
    /// The last plain request: its IP layer, QP and PSN (a NAK may name it).
    last_request: Option<(L3, u32, u32)>,
    /// A NAK named that request: its go-back may follow (`roce_common::nak`).
    go_back: Option<(L3, u32, u32)>,
}

impl Gen {
    pub fn new(seed: u64, config: RuntimeConfig) -> Self {
        Gen {
            rng: StdRng::seed_from_u64(seed),
            opcodes: defined_opcodes(),
            psn: 0xFF_FFF0,
            config,
            last_request: None,
            go_back: None,
        }
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        *items.choose(&mut self.rng).expect("non-empty")
    }

    /// One of `items`, or (as often as any one of them) a uniformly random value.
    fn pick_or_random<T: Copy>(&mut self, items: &[T]) -> T
    where
        rand::distr::StandardUniform: rand::distr::Distribution<T>,
    {
        if self.rng.random_range(0..=items.len()) == items.len() {
            self.rng.random()
        } else {
            self.pick(items)
        }
    }

    fn eth(&mut self) -> Eth {
        let tags = match self.rng.random_range(0..100) {
            0..60 => 0,
            60..85 => 1,
            85..97 => 2,
            _ => 3,
        };
        let mut e = Eth::default();
        for _ in 0..tags {
            let vid = self.rng.random_range(0..4096);
            let tag = if self.rng.random_bool(0.5) {
                VlanTag::dot1q(vid)
            } else {
                VlanTag::dot1ad(vid)
            };
            e = e.with_vlan(tag.with_pcp(self.rng.random_range(0..8)));
        }
        e
    }

    fn tos(&mut self) -> u8 {
        match self.rng.random_range(0..4) {
            0 => 106,
            1 => 0,
            2 => 0xC3,
            _ => self.rng.random(),
        }
    }

    fn ext(&mut self) -> Ipv6Ext {
        let len = self.pick(&[0u8, 0, 1, 2, 3]);
        match self.rng.random_range(0..4) {
            0 => Ipv6Ext::HopByHop { len },
            1 => Ipv6Ext::Routing {
                len,
                routing_type: self.rng.random(),
                segments_left: self.rng.random(),
            },
            2 => Ipv6Ext::DestOpts { len },
            _ => Ipv6Ext::Fragment {
                offset: if self.rng.random_bool(0.8) {
                    0
                } else {
                    self.rng.random_range(1..0x2000)
                },
                more: self.rng.random(),
                id: self.rng.random(),
            },
        }
    }

    /// An IP layer from a small address pool, so that flows collide and accumulate.
    fn l3(&mut self) -> L3 {
        let a = self.rng.random_range(1..4u8);
        let b = self.rng.random_range(1..4u8);
        let l3 = if self.rng.random_bool(0.6) {
            let mut l = L3::v4(Ipv4Addr::new(198, 18, 0, a), Ipv4Addr::new(198, 18, 0, b));
            if self.rng.random_bool(0.2) {
                let n = self.rng.random_range(1..=40);
                let opts: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                l = l.with_options(&opts);
            }
            if self.rng.random_bool(0.05) {
                if let L3::V4(h) = &mut l {
                    h.flags_frag = self.rng.random();
                }
            }
            l
        } else {
            let mut l = L3::v6(
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, a as u16),
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, b as u16),
            );
            if self.rng.random_bool(0.3) {
                for _ in 0..self.rng.random_range(1..=5) {
                    let e = self.ext();
                    l = l.with_ext(e);
                }
            }
            l
        };
        l3.with_tos(self.tos())
    }

    fn msg(&mut self) -> RoceMsg {
        let op = if self.rng.random_bool(0.85) {
            let ops = self.opcodes.clone();
            self.pick(&ops)
        } else {
            self.rng.random()
        };
        // PSNs mostly in order, sometimes skipping ahead or going back.
        let step = self.pick(&[0i64, 1, 1, 1, 1, 2, 3, 6, -1, -5, 0x80_0000]);
        self.psn = (self.psn as i64 + step).rem_euclid(0x100_0000) as u32;
        let qp = self.pick(&[1u32, 2, 3, 0xFF_FFFF, 0x12_3456]);
        let payload = self.pick(&[0usize, 1, 2, 3, 4, 17, 64, 256, 512, 1024, 2048]);
        let mut m = RoceMsg::new(op, qp, self.psn)
            .with_payload(payload)
            .with_ack_req(self.rng.random())
            .with_fecn(self.rng.random_bool(0.1))
            .with_becn(self.rng.random_bool(0.1));
        m.syndrome = self.pick(&[0x00, 0x1F, 0x20, 0x3F, 0x60, 0x61, 0x62, 0x63, 0x40, 0xE0]);
        m.reth.dma_len = self.pick(&[0u32, 1, 256, 1000, 3000, 4096, 8192, 65536, u32::MAX]);
        m.reth.rkey = self.rng.random();
        m.xrc_srq = self.rng.random::<u32>() & 0xFF_FFFF;
        if self.rng.random_bool(0.05) {
            m.pad = Some(self.rng.random_range(0..4));
        }
        m
    }

    fn ip_marks(marks: &mut Marks, at: usize, l3: &L3) -> usize {
        match l3 {
            L3::V4(_) => marks.ips.push((at, false)),
            L3::V6(h) => {
                marks.ips.push((at, true));
                let mut e = at + 40;
                for x in &h.ext {
                    marks.v6_ext.push(e);
                    e += x.len();
                }
            }
        }
        at + l3.header_len()
    }

    fn eth_marks(marks: &mut Marks, at: usize, eth: &Eth) -> usize {
        marks.ethertypes.push(at + 12);
        for i in 0..eth.vlans.len() {
            marks.ethertypes.push(at + ETH_HLEN + VLAN_HLEN * i + 2);
        }
        at + eth.header_len()
    }

    /// A NAK (or RNR NAK) of the last plain request, from its responder, and now and
    /// then the go-back it asks for: the request again, at the NAK's PSN. Random PSNs
    /// would almost never meet so.
    fn nak_or_go_back(&mut self) -> Option<(L3, RoceMsg)> {
        if let Some((l3, qp, psn)) = self.go_back.take() {
            if self.rng.random_bool(0.7) {
                return Some((l3, RoceMsg::send_only(qp, psn, 64)));
            }
        }
        if !self.rng.random_bool(0.03) {
            return None;
        }
        let (l3, qp, psn) = self.last_request.clone()?;
        let back = match &l3 {
            L3::V4(h) => L3::v4(h.dst, h.src).with_tos(h.tos),
            L3::V6(h) => L3::v6(h.dst, h.src).with_tos(h.tclass),
        };
        let syndrome = self.pick(&[0x60, 0x20]);
        self.go_back = Some((l3, qp, psn));
        Some((back, RoceMsg::ack(self.pick(&[1u32, 2, 3]), psn, syndrome)))
    }

    /// A RoCE frame, plain or in VXLAN, with its marks.
    pub fn roce(&mut self, tunnelled: bool) -> Sample {
        if !tunnelled {
            if let Some((l3, m)) = self.nak_or_go_back() {
                let frame = roce_frame_to(&Eth::default(), &l3, 0xC000, self.config.roce_port, &m);
                let mut marks = Marks::default();
                let at = Self::eth_marks(&mut marks, 0, &Eth::default());
                let l4 = Self::ip_marks(&mut marks, at, &l3);
                marks.udps.push(l4);
                marks.bth = Some(l4 + UDP_HLEN);
                return Sample { frame, marks };
            }
        }
        let m = if self.rng.random_bool(0.08) {
            let mut c = cnp(self.pick(&[1, 2, 3]));
            c.opcode = self.pick(&[0x80, 0x81]);
            c
        } else {
            self.msg()
        };
        let sport = self.pick(&[0xC000u16, 0xC001, 0xFFFF, 69, 4791]);
        let inner_eth = if tunnelled {
            Eth::default()
        } else {
            self.eth()
        };
        let inner_l3 = self.l3();
        let inner = roce_frame_to(&inner_eth, &inner_l3, sport, self.config.roce_port, &m);
        let mut marks = Marks::default();
        if !tunnelled && roce_common::bth::is_tracked_request(m.opcode) {
            self.last_request = Some((inner_l3.clone(), m.dest_qp, m.psn));
        }
        if !tunnelled {
            let l3 = Self::eth_marks(&mut marks, 0, &inner_eth);
            let l4 = Self::ip_marks(&mut marks, l3, &inner_l3);
            marks.udps.push(l4);
            marks.bth = Some(l4 + UDP_HLEN);
            return Sample {
                frame: inner,
                marks,
            };
        }
        let eth = self.eth();
        let outer = self.l3();
        let vni = self.pick(&[1u32, 5001, 0xFF_FFFF]);
        let mut frame = vxlan_frame(&eth, &outer, 0xD000, vni, &inner);
        // vxlan_frame writes the default VXLAN port; follow the configuration.
        let l3 = Self::eth_marks(&mut marks, 0, &eth);
        let l4 = Self::ip_marks(&mut marks, l3, &outer);
        marks.udps.push(l4);
        frame[l4 + 2..l4 + 4].copy_from_slice(&self.config.vxlan_port.to_be_bytes());
        let vx = l4 + UDP_HLEN;
        marks.vxlan = Some(vx);
        let il3 = Self::eth_marks(&mut marks, vx + VXLAN_HLEN, &inner_eth);
        let il4 = Self::ip_marks(&mut marks, il3, &inner_l3);
        marks.udps.push(il4);
        marks.bth = Some(il4 + UDP_HLEN);
        Sample { frame, marks }
    }

    /// Traffic that is not RoCE: TCP, other UDP, ARP, VXLAN carrying those.
    pub fn other(&mut self) -> Sample {
        let eth = self.eth();
        let l3 = self.l3();
        let mut marks = Marks::default();
        let l3_off = Self::eth_marks(&mut marks, 0, &eth);
        let frame = match self.rng.random_range(0..5) {
            0 => {
                Self::ip_marks(&mut marks, l3_off, &l3);
                ip_frame(&eth, &l3, self.pick(&[6u8, 1, 58, 47]), &[0u8; 20])
            }
            1 => {
                let l4 = Self::ip_marks(&mut marks, l3_off, &l3);
                marks.udps.push(l4);
                let dport = self.pick(&[
                    53u16,
                    4790,
                    4792,
                    8472,
                    self.config.roce_port.wrapping_add(1),
                ]);
                udp_frame(&eth, &l3, self.config.roce_port, dport, &[0u8; 32])
            }
            2 => eth_frame(
                &eth,
                self.pick(&[0x0806u16, 0x88CC, 0x8915, 0x0000]),
                &[0u8; 46],
            ),
            _ => {
                let inner = match self.rng.random_range(0..3) {
                    0 => ip_frame(&Eth::default(), &self.l3(), 6, &[0u8; 20]),
                    1 => udp_frame(&Eth::default(), &self.l3(), 1, 53, &[0u8; 8]),
                    _ => eth_frame(&Eth::default(), 0x0806, &[0u8; 28]),
                };
                let l4 = Self::ip_marks(&mut marks, l3_off, &l3);
                marks.udps.push(l4);
                marks.vxlan = Some(l4 + UDP_HLEN);
                marks.ethertypes.push(l4 + UDP_HLEN + VXLAN_HLEN + 12);
                let mut f = vxlan_frame(&eth, &l3, 0xD000, 7, &inner);
                f[l4 + 2..l4 + 4].copy_from_slice(&self.config.vxlan_port.to_be_bytes());
                f
            }
        };
        Sample { frame, marks }
    }

    /// IPv6 extension headers long enough to push the rest past the parser's depth.
    fn deep(&mut self) -> Sample {
        let big = Ipv6Ext::HopByHop {
            len: self.rng.random_range(90..=127),
        };
        let tunnelled = self.rng.random();
        let mut s = self.roce(tunnelled);
        let eth = Eth::default();
        let l3 = L3::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST).with_ext(big);
        let inner = s.frame.clone();
        s.frame = vxlan_frame(&eth, &l3, 1, 1, &inner);
        let mut marks = Marks::default();
        let l3_off = Self::eth_marks(&mut marks, 0, &eth);
        let l4 = Self::ip_marks(&mut marks, l3_off, &l3);
        marks.udps.push(l4);
        marks.vxlan = Some(l4 + UDP_HLEN);
        s.frame[l4 + 2..l4 + 4].copy_from_slice(&self.config.vxlan_port.to_be_bytes());
        s.marks = marks;
        s
    }

    /// Random bytes behind a plausible EtherType (and sometimes a plausible IP version).
    fn noise(&mut self) -> Sample {
        let len = self.rng.random_range(14..200);
        let mut f: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        let t: u16 = self.pick_or_random(&[0x0800, 0x86DD, 0x8100, 0x88A8]);
        f[12..14].copy_from_slice(&t.to_be_bytes());
        if len > 14 && self.rng.random_bool(0.5) {
            f[14] = (f[14] & 0x0F) | if t == 0x86DD { 0x60 } else { 0x40 };
        }
        let mut marks = Marks::default();
        marks.ethertypes.push(12);
        Sample { frame: f, marks }
    }

    /// The next frame: 40 % plain RoCE, 35 % RoCE in VXLAN, 12 % other traffic, 5 %
    /// deep IPv6 extension chains, 8 % noise; 60 % of them then mutated one to three
    /// times. Never shorter than an Ethernet header (BPF_PROG_TEST_RUN refuses less).
    pub fn sample(&mut self) -> Sample {
        let mut s = match self.rng.random_range(0..100) {
            0..40 => self.roce(false),
            40..75 => self.roce(true),
            75..87 => self.other(),
            87..92 => self.deep(),
            _ => self.noise(),
        };
        if self.rng.random_bool(0.6) {
            for _ in 0..self.rng.random_range(1..=3) {
                self.mutate(&mut s);
            }
        }
        if s.frame.len() < ETH_HLEN {
            s.frame.resize(ETH_HLEN, 0);
        }
        s
    }

    /// Sets a declared length (IPv4 total length, IPv6 payload length, UDP length) to
    /// a value around the real one, around the headers' boundaries, beyond the frame,
    /// or at random: bytes beyond it are not the datagram's.
    fn mutate_length(&mut self, s: &mut Sample) {
        let mut fields: Vec<usize> = s
            .marks
            .ips
            .iter()
            .map(|&(at, v6)| if v6 { at + 4 } else { at + 2 })
            .collect();
        fields.extend(s.marks.udps.iter().map(|at| at + 4));
        let Some(&at) = fields.choose(&mut self.rng) else {
            return;
        };
        let f = &mut s.frame;
        if at + 2 > f.len() {
            return;
        }
        let old = u16::from_be_bytes([f[at], f[at + 1]]);
        let new = match self.rng.random_range(0..6) {
            0 => old.wrapping_sub(self.rng.random_range(1..=24)),
            1 => old.wrapping_add(self.rng.random_range(1..=24)),
            2 => self.rng.random_range(0..=40),
            3 => (f.len() + self.rng.random_range(1..=2000)) as u16,
            4 => 0,
            _ => self.rng.random(),
        };
        f[at..at + 2].copy_from_slice(&new.to_be_bytes());
    }

    fn mutate(&mut self, s: &mut Sample) {
        let f = &mut s.frame;
        let len = f.len();
        let set16 = |f: &mut Vec<u8>, at: usize, v: u16| {
            if at + 2 <= f.len() {
                f[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
        };
        match self.rng.random_range(0..13) {
            12 => self.mutate_length(s),
            0 => {
                let i = self.rng.random_range(0..len);
                f[i] ^= self.rng.random_range(1..=255u8);
            }
            1 => {
                let i = self.rng.random_range(0..len.min(160));
                f[i] = self.rng.random();
            }
            2 => {
                let n = self.rng.random_range(ETH_HLEN..=len);
                f.truncate(n);
            }
            3 => {
                if let Some(&at) = s.marks.ethertypes.choose(&mut self.rng) {
                    let t = self.pick_or_random(&[0x0800u16, 0x86DD, 0x8100, 0x88A8, 0x0806]);
                    set16(f, at, t);
                }
            }
            4 => {
                if let Some(&at) = s.marks.udps.choose(&mut self.rng) {
                    let p = self.pick_or_random(&[
                        self.config.roce_port,
                        self.config.vxlan_port,
                        4791,
                        4789,
                    ]);
                    // Mostly the destination port, sometimes the source port.
                    let field = if self.rng.random_bool(0.8) { 2 } else { 0 };
                    set16(f, at + field, p);
                }
            }
            5 => {
                if let Some(&(at, v6)) = s.marks.ips.choose(&mut self.rng) {
                    if at < f.len() {
                        if !v6 && self.rng.random_bool(0.7) {
                            f[at] = 0x40 | self.rng.random_range(0..16u8);
                        } else {
                            f[at] = (f[at] & 0x0F) | (self.rng.random_range(0..16u8) << 4);
                        }
                    }
                }
            }
            6 => {
                if let Some(at) = s.marks.vxlan {
                    if at < f.len() {
                        f[at] = self.pick_or_random(&[0x00, 0x08, 0x0C, 0xF7]);
                    }
                }
            }
            7 => {
                // IPv6 next header / extension header chain.
                let mut spots: Vec<usize> = s
                    .marks
                    .ips
                    .iter()
                    .filter(|(_, v6)| *v6)
                    .map(|(at, _)| at + 6)
                    .collect();
                spots.extend(s.marks.v6_ext.iter().copied());
                if let Some(&at) = spots.choose(&mut self.rng) {
                    if at + 1 < f.len() {
                        f[at] = self.pick_or_random(&[0u8, 43, 44, 60, 17, 6, 59]);
                        if self.rng.random_bool(0.3) && s.marks.v6_ext.contains(&at) {
                            f[at + 1] = self.rng.random();
                        }
                    }
                }
            }
            8 => {
                // Fragment fields: IPv4 flags/offset, IPv6 fragment offset.
                if let Some(&(at, v6)) = s.marks.ips.choose(&mut self.rng) {
                    let v: u16 = self.pick_or_random(&[0, 0x2000, 0x4000, 1, 0x2001]);
                    if !v6 {
                        set16(f, at + 6, v);
                    } else if let Some(&e) = s.marks.v6_ext.choose(&mut self.rng) {
                        set16(f, e + 2, v);
                    }
                }
            }
            9 => {
                let n = self.rng.random_range(1..64);
                f.extend((0..n).map(|_| self.rng.random::<u8>()));
            }
            10 => {
                if let Some(at) = s.marks.bth {
                    if at < f.len() {
                        f[at] = self.rng.random();
                    }
                }
            }
            _ => {
                // Cut inside the headers, where the interesting boundaries are.
                let n = self.rng.random_range(ETH_HLEN..=len.min(180));
                f.truncate(n);
            }
        }
    }
}

/// A mirror copy of `frame` for the mirror lane of the differential runs: GRE
/// (each option on or off), ERSPAN II or III (platform subheader or not, T set or not,
/// a frame type other than Ethernet now and then) over IPv4 or IPv6; a third of them
/// cut short as switches cut copies, a fifth with a byte of the GRE or ERSPAN headers
/// (or an outer length) changed, some cut inside those headers.
pub fn mirror_copy(rng: &mut StdRng, frame: &[u8]) -> Vec<u8> {
    use roce_testkit::mirror::{mirror_frame, Encap};
    let session = rng.random_range(0..1024u16);
    let encap = match rng.random_range(0..6) {
        0 => Encap::Gre {
            key: rng.random_bool(0.5).then(|| rng.random()),
            seq: rng.random_bool(0.5).then(|| rng.random()),
            csum: rng.random_bool(0.3),
        },
        1 | 2 => Encap::Erspan2 {
            session,
            truncated: rng.random_bool(0.3),
            seq: rng.random(),
        },
        _ => Encap::Erspan3 {
            session,
            truncated: rng.random_bool(0.3),
            ft: if rng.random_bool(0.1) {
                rng.random_range(1..32)
            } else {
                0
            },
            platform: rng.random_bool(0.4),
            seq: rng.random(),
        },
    };
    let mirrored = if rng.random_bool(0.33) {
        &frame[..rng.random_range(0..=frame.len())]
    } else {
        frame
    };
    let outer = if rng.random_bool(0.3) {
        L3::v6(
            Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, rng.random_range(1..4)),
            Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 0x10),
        )
    } else {
        L3::v4(
            Ipv4Addr::new(198, 18, 9, rng.random_range(1..4)),
            Ipv4Addr::new(198, 18, 9, 16),
        )
    };
    let mut f = mirror_frame(&Eth::default(), &outer, &encap, mirrored);
    let l4 = ETH_HLEN + if matches!(outer, L3::V6(_)) { 40 } else { 20 };
    let headers = encap.headers().len();
    if rng.random_bool(0.2) {
        // A byte of the GRE/ERSPAN headers, or the outer length.
        let at = if rng.random_bool(0.2) {
            if matches!(outer, L3::V6(_)) {
                ETH_HLEN + 4 + rng.random_range(0..2)
            } else {
                ETH_HLEN + 2 + rng.random_range(0..2)
            }
        } else {
            l4 + rng.random_range(0..headers)
        };
        f[at] = rng.random();
    }
    if rng.random_bool(0.05) {
        f.truncate(rng.random_range(ETH_HLEN..=(l4 + headers + 2).min(f.len())));
    }
    f
}
