//! Where a frame's headers end: what a sampled event keeps of a frame, so that it
//! carries no application data unless the operator asks for some
//! (`events_payload_bytes`).
//!
//! The classifier's walk ([`walk`]) says where the IP and UDP layers lie, plain or in
//! VXLAN; the BTH opcode says which extension headers follow the BTH
//! ([`bth::ext_headers_len`]). Nothing here reads a header of its own.
//!
//! The rule, for a frame the walk takes for RoCE: Ethernet [+ VLAN tags] / IP / UDP
//! [/ VXLAN / Ethernet / IP / UDP] / BTH / the extension headers of its opcode. A CNP's
//! 16 reserved bytes count as its header (Annex A17 makes them part of the CNP, and
//! they carry no data). The payload, the pad and the ICRC are not headers. An opcode
//! the spec does not define ends at its BTH (what follows it is unknown). A frame the
//! walk cannot take that far (a sample cut before its BTH, a header cut short) ends
//! with the last header that parsed whole. Never past the frame's bytes, nor past the
//! end of the datagram its IP header declares (Ethernet padding is no header).

use crate::bth::{self, BTH_LEN};
use crate::classify::{walk, Layers};
use crate::config::RuntimeConfig;
use crate::packet::SlicePacket;
use crate::parsed::{Class, Outcome, Reason};
use crate::wire::{ETH_HLEN, UDP_HLEN};

/// The offset just past the last transport header of `frame` (which starts at its
/// Ethernet header and may be cut short, as a 128-byte sample is), as the classifier
/// configured with `cfg`'s ports reads it. At most `frame.len()`.
pub fn transport_headers_end(frame: &[u8], cfg: &RuntimeConfig) -> usize {
    let w = walk(&SlicePacket(frame), cfg);
    let end = match w.outcome {
        Outcome::Flow(parsed) => match w.layers.roce_ip(parsed.tunnelled) {
            Some(ip) => {
                let opcode = parsed.bth.opcode;
                let ext = if bth::is_defined(opcode) {
                    bth::ext_headers_len(opcode)
                } else {
                    0
                };
                (ip.l4 + UDP_HLEN + BTH_LEN + ext).min(ip.end)
            }
            // A flow always has the IP layer of its datagram.
            None => 0,
        },
        other => parsed_end(&w.layers, other),
    };
    end.min(frame.len())
}

/// Where the last header that parsed whole ends, for a walk that stopped before a BTH.
fn parsed_end(layers: &Layers, outcome: Outcome) -> usize {
    use Reason::*;
    let ended_in = |r: Reason| outcome == Outcome::Malformed(r);
    if let Some(inner) = layers.inner {
        // Cut inside the inner BTH: the inner UDP header was whole.
        return inner.l4
            + if ended_in(TruncatedInnerBth) {
                UDP_HLEN
            } else {
                0
            };
    }
    if let Some(inner_eth) = layers.inner_eth {
        return if ended_in(TruncatedInnerEth) {
            inner_eth
        } else {
            inner_eth + ETH_HLEN
        };
    }
    if let Some(outer) = layers.outer {
        // The walk went past the UDP header: cut in the BTH or the VXLAN header, or a
        // port that is neither.
        let udp = matches!(
            outcome,
            Outcome::Malformed(TruncatedBth | TruncatedVxlan | BadVxlanFlags)
                | Outcome::Other(Class::OtherUdp)
        );
        return outer.l4 + if udp { UDP_HLEN } else { 0 };
    }
    if ended_in(TruncatedEth) {
        0
    } else {
        ETH_HLEN
    }
}

#[cfg(test)]
mod tests {
    //! Hand-made frames; the test kit checks every opcode class on frames of its
    //! builder (`testkit/tests/headers_end.rs`).
    extern crate std;
    use super::*;
    use crate::wire::{DEFAULT_ROCE_PORT, ETH_P_IPV4, IPPROTO_UDP};
    use std::vec;
    use std::vec::Vec;

    /// Ethernet / IPv4 / UDP to `dport` / `payload`.
    fn ipv4_udp(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(ETH_P_IPV4.to_be_bytes());
        f.extend([0x45, 0]);
        f.extend(((20 + 8 + payload.len()) as u16).to_be_bytes());
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

    fn end(f: &[u8]) -> usize {
        transport_headers_end(f, &RuntimeConfig::default())
    }

    /// A BTH of `opcode`, then `rest`.
    fn roce(opcode: u8, rest: &[u8]) -> Vec<u8> {
        let mut b = vec![opcode, 0, 0xFF, 0xFF, 0, 0, 0, 7, 0, 0, 0, 1];
        b.extend_from_slice(rest);
        b
    }

    #[test]
    fn a_write_only_ends_after_its_reth_and_a_send_after_its_bth() {
        let payload = [0xAAu8; 64];
        let mut rest = vec![0u8; 16];
        rest.extend(payload);
        let write = ipv4_udp(DEFAULT_ROCE_PORT, &roce(0x0A, &rest));
        assert_eq!(end(&write), 42 + 12 + 16);
        let send = ipv4_udp(DEFAULT_ROCE_PORT, &roce(0x04, &payload));
        assert_eq!(end(&send), 42 + 12);
    }

    #[test]
    fn a_reserved_opcode_ends_at_its_bth() {
        let f = ipv4_udp(DEFAULT_ROCE_PORT, &roce(0x1F, &[0xAA; 40]));
        assert_eq!(end(&f), 42 + 12);
    }

    #[test]
    fn a_cut_frame_keeps_what_it_holds_and_what_parsed() {
        let f = ipv4_udp(DEFAULT_ROCE_PORT, &roce(0x0A, &[0u8; 80]));
        // Cut inside the RETH: all of it that is there.
        assert_eq!(end(&f[..60]), 60);
        // Cut inside the BTH: up to the UDP header.
        assert_eq!(end(&f[..50]), 42);
        // Cut inside the UDP header: up to the IP header.
        assert_eq!(end(&f[..40]), 34);
        assert_eq!(end(&f[..20]), 14);
        assert_eq!(end(&f[..10]), 0);
        assert_eq!(end(&[]), 0);
    }

    #[test]
    fn not_roce_ends_at_its_udp_header() {
        let f = ipv4_udp(53, &[0xAA; 40]);
        assert_eq!(end(&f), 42);
        let cfg = RuntimeConfig {
            roce_port: 53,
            ..RuntimeConfig::default()
        };
        let g = ipv4_udp(53, &roce(0x04, &[0xAA; 40]));
        assert_eq!(transport_headers_end(&g, &cfg), 54);
    }

    #[test]
    fn ethernet_padding_after_the_datagram_is_not_kept() {
        // An ACKNOWLEDGE whose UDP length leaves out its AETH, padded to 60 bytes.
        let mut f = ipv4_udp(DEFAULT_ROCE_PORT, &roce(0x11, &[]));
        f.resize(60, 0);
        assert_eq!(end(&f), 54);
    }
}
