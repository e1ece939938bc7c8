//! Mirror copies as switches and Linux's `gretap`, `erspan` and `ip6erspan` devices
//! send them: a mirrored frame wrapped in GRE (transparent Ethernet bridging) or GRE
//! and an ERSPAN type II or III header, over IPv4 or IPv6 (layouts: docs/mirror.md).

use roce_common::mirror::{
    GRE_FLAG_C, GRE_FLAG_K, GRE_FLAG_S, GRE_PROTO_ERSPAN2, GRE_PROTO_ERSPAN3, GRE_PROTO_TEB,
    IPPROTO_GRE,
};

use crate::frame::{ip_frame, Eth, L3};

/// How a copy is wrapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encap {
    /// GRE with protocol 0x6558; each option present when given (the checksum field
    /// is written as zero).
    Gre {
        key: Option<u32>,
        seq: Option<u32>,
        csum: bool,
    },
    /// GRE (S set, sequence `seq`) and the 8-byte ERSPAN II header, version 1.
    Erspan2 {
        session: u16,
        truncated: bool,
        seq: u32,
    },
    /// GRE (S set) and the 12-byte ERSPAN III header, version 2, frame type `ft`,
    /// with the 8-byte platform subheader when `platform`.
    Erspan3 {
        session: u16,
        truncated: bool,
        ft: u8,
        platform: bool,
        seq: u32,
    },
}

impl Encap {
    /// GRE with a key and a sequence number, as `gretap ... key K oseq` sends it.
    pub fn gre(key: u32) -> Encap {
        Encap::Gre {
            key: Some(key),
            seq: Some(1),
            csum: false,
        }
    }

    pub fn erspan2(session: u16) -> Encap {
        Encap::Erspan2 {
            session,
            truncated: false,
            seq: 1,
        }
    }

    pub fn erspan3(session: u16) -> Encap {
        Encap::Erspan3 {
            session,
            truncated: false,
            ft: 0,
            platform: false,
            seq: 1,
        }
    }

    /// The same session with the T bit set (ERSPAN; GRE has none).
    pub fn truncated(self) -> Encap {
        match self {
            Encap::Erspan2 { session, seq, .. } => Encap::Erspan2 {
                session,
                truncated: true,
                seq,
            },
            Encap::Erspan3 {
                session,
                ft,
                platform,
                seq,
                ..
            } => Encap::Erspan3 {
                session,
                truncated: true,
                ft,
                platform,
                seq,
            },
            gre => gre,
        }
    }

    /// The GRE and ERSPAN headers in front of the mirrored frame.
    pub fn headers(&self) -> Vec<u8> {
        let (flags, proto, key, seq) = match *self {
            Encap::Gre { key, seq, csum } => {
                let mut f = 0;
                if csum {
                    f |= GRE_FLAG_C;
                }
                if key.is_some() {
                    f |= GRE_FLAG_K;
                }
                if seq.is_some() {
                    f |= GRE_FLAG_S;
                }
                (f, GRE_PROTO_TEB, key, seq)
            }
            Encap::Erspan2 { seq, .. } => (GRE_FLAG_S, GRE_PROTO_ERSPAN2, None, Some(seq)),
            Encap::Erspan3 { seq, .. } => (GRE_FLAG_S, GRE_PROTO_ERSPAN3, None, Some(seq)),
        };
        let mut h = Vec::new();
        h.extend(flags.to_be_bytes());
        h.extend(proto.to_be_bytes());
        if flags & GRE_FLAG_C != 0 {
            h.extend([0, 0, 0, 0]);
        }
        if let Some(k) = key {
            h.extend(k.to_be_bytes());
        }
        if let Some(s) = seq {
            h.extend(s.to_be_bytes());
        }
        match *self {
            Encap::Gre { .. } => {}
            Encap::Erspan2 {
                session, truncated, ..
            } => {
                // Ver 1, VLAN 0, COS 0, En 3 (VLAN tag kept in the frame), T, session;
                // reserved 0, index 0.
                let w0 = 1u32 << 28 | 3 << 11 | (truncated as u32) << 10 | (session as u32 & 0x3FF);
                h.extend(w0.to_be_bytes());
                h.extend([0, 0, 0, 0]);
            }
            Encap::Erspan3 {
                session,
                truncated,
                ft,
                platform,
                ..
            } => {
                // Ver 2, VLAN 0, COS 0, BSO 0, T, session; a timestamp; SGT 0, P 0, FT,
                // HW ID 1, D 0, Gra 1 (100 ns), O.
                let w0 = 2u32 << 28 | (truncated as u32) << 10 | (session as u32 & 0x3FF);
                let w2 = ((ft as u32) & 0x1F) << 10 | 1 << 4 | 1 << 1 | platform as u32;
                h.extend(w0.to_be_bytes());
                h.extend(0x0102_0304u32.to_be_bytes());
                h.extend(w2.to_be_bytes());
                if platform {
                    // Platform ID 3 (a timestamp's upper bits), as Cisco's NX-OS sends it.
                    h.extend([0x0C, 0, 0, 0, 0, 0, 0, 1]);
                }
            }
        }
        h
    }
}

/// A mirror copy: `mirrored` (an Ethernet frame, cut or whole) in `encap`, sent from
/// `outer`'s source to its destination.
pub fn mirror_frame(eth: &Eth, outer: &L3, encap: &Encap, mirrored: &[u8]) -> Vec<u8> {
    let mut payload = encap.headers();
    payload.extend_from_slice(mirrored);
    ip_frame(eth, outer, IPPROTO_GRE, &payload)
}

/// A copy of `mirrored` cut to `keep` bytes as a switch truncates copies (ERSPAN
/// sets T), in `encap`.
pub fn truncated_copy(
    eth: &Eth,
    outer: &L3,
    encap: &Encap,
    mirrored: &[u8],
    keep: usize,
) -> Vec<u8> {
    let kept = &mirrored[..keep.min(mirrored.len())];
    mirror_frame(eth, outer, &encap.truncated(), kept)
}
