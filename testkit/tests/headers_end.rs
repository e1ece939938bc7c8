//! `roce_common::headers::transport_headers_end` on frames of the builder: where each
//! opcode class's headers end (so that a sampled event keeps no payload byte), in
//! VLAN tags, IPv6 and VXLAN, and on frames cut as a 128-byte sample cuts them.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{Ipv4Addr, Ipv6Addr};

use roce_common::bth;
use roce_common::config::RuntimeConfig;
use roce_common::headers::transport_headers_end;
use roce_testkit::frame::{
    bth_offset, cnp, defined_opcodes, ext_headers, inner_eth_offset, opcode, roce_frame,
    vxlan_frame, Eth, RoceMsg, VlanTag, L3,
};

/// What every payload here repeats: a byte of it in the kept headers is a leak.
const PATTERN: &[u8] = b"ROCEPAYLOADPATTERN";

fn v4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106)
}

fn v6() -> L3 {
    L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    )
    .with_tos(106)
}

fn end(frame: &[u8]) -> usize {
    transport_headers_end(frame, &RuntimeConfig::default())
}

/// `op` with 100 bytes of the pattern (none for opcodes that carry no payload: the
/// builder writes what it is asked).
fn msg(op: u8) -> RoceMsg {
    RoceMsg::new(op, 0x1234, 7)
        .with_payload(100)
        .with_payload_pattern(PATTERN)
}

/// Asserts that the headers of `frame`, whose BTH is at `bth_at`, end `headers` bytes
/// after the BTH's start, and that the payload starts there.
fn assert_ends(frame: &[u8], bth_at: usize, headers: usize, what: &str) {
    let e = end(frame);
    assert_eq!(e, bth_at + headers, "{what}");
    assert_eq!(
        &frame[e..e + PATTERN.len()],
        PATTERN,
        "{what}: the payload starts where the headers end"
    );
}

#[test]
fn rc_send_ends_after_its_bth() {
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::RC_SEND_ONLY));
    assert_ends(&f, 42, 12, "SEND ONLY");
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::RC_SEND_MIDDLE));
    assert_ends(&f, 42, 12, "SEND MIDDLE");
}

#[test]
fn write_first_ends_after_its_reth_and_write_only_imm_after_its_immdt() {
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::RC_WRITE_FIRST));
    assert_ends(&f, 42, 12 + 16, "WRITE FIRST");
    let f = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &msg(opcode::RC_WRITE_ONLY_IMM),
    );
    assert_ends(&f, 42, 12 + 16 + 4, "WRITE ONLY with immediate");
    let f = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &msg(opcode::RC_WRITE_LAST_IMM),
    );
    assert_ends(&f, 42, 12 + 4, "WRITE LAST with immediate");
}

#[test]
fn read_responses_and_acks_end_after_their_aeth() {
    for (op, headers) in [
        (opcode::RC_READ_RESPONSE_FIRST, 12 + 4),
        (opcode::RC_READ_RESPONSE_MIDDLE, 12),
        (opcode::RC_READ_RESPONSE_ONLY, 12 + 4),
    ] {
        let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(op));
        assert_ends(&f, 42, headers, &format!("READ response {op:#04x}"));
    }
    let ack = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &RoceMsg::ack(0x1234, 7, 0x60),
    );
    assert_eq!(end(&ack), 42 + 12 + 4, "ACKNOWLEDGE: up to the ICRC");
    assert_eq!(ack.len(), 42 + 12 + 4 + 4);
}

#[test]
fn atomics_end_after_their_atomic_eth_and_atomic_acks_after_aeth_and_atomic_ack_eth() {
    for op in [opcode::RC_COMPARE_SWAP, opcode::RC_FETCH_ADD] {
        let f = roce_frame(&Eth::default(), &v4(), 0xC000, &RoceMsg::new(op, 1, 2));
        assert_eq!(end(&f), 42 + 12 + 28, "{op:#04x}");
    }
    let f = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &RoceMsg::new(opcode::RC_ATOMIC_ACKNOWLEDGE, 1, 2),
    );
    assert_eq!(end(&f), 42 + 12 + 4 + 8);
}

#[test]
fn ud_send_ends_after_its_deth_and_send_with_invalidate_after_its_ieth() {
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::UD_SEND_ONLY));
    assert_ends(&f, 42, 12 + 8, "UD SEND ONLY");
    let f = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &msg(opcode::UD_SEND_ONLY_IMM),
    );
    assert_ends(&f, 42, 12 + 8 + 4, "UD SEND ONLY with immediate");
    let f = roce_frame(
        &Eth::default(),
        &v4(),
        0xC000,
        &msg(opcode::RC_SEND_ONLY_INV),
    );
    assert_ends(&f, 42, 12 + 4, "SEND ONLY with invalidate");
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::XRC | 0x0A));
    assert_ends(&f, 42, 12 + 4 + 16, "XRC WRITE ONLY: XRCETH, RETH");
}

#[test]
fn a_cnp_keeps_its_16_reserved_bytes_as_header_and_not_its_icrc() {
    for op in [opcode::CNP, opcode::CNP_ALT] {
        let c = RoceMsg {
            opcode: op,
            ..cnp(0x1234)
        };
        let f = roce_frame(&Eth::default(), &v4(), 0xC000, &c);
        assert_eq!(f.len(), 74);
        assert_eq!(end(&f), 70, "{op:#04x}");
    }
}

#[test]
fn every_defined_opcode_ends_where_its_payload_starts() {
    for (eth, l3) in [
        (Eth::default(), v4()),
        (Eth::default(), v6()),
        (
            Eth::default()
                .with_vlan(VlanTag::dot1ad(100))
                .with_vlan(VlanTag::dot1q(7)),
            v4(),
        ),
    ] {
        for op in defined_opcodes() {
            let f = roce_frame(&eth, &l3, 0xC000, &msg(op));
            let headers = 12 + ext_headers(op).iter().map(|e| e.len()).sum::<usize>();
            let at = bth_offset(&eth, &l3);
            assert_ends(&f, at, headers, &format!("{op:#04x} at {at}"));
        }
    }
    // The builder's opcodes are RoCE's; the parser knows RD's too.
    for op in 0..=255u8 {
        let rd = op & 0xE0 == 0x40;
        assert_eq!(
            bth::is_defined(op),
            defined_opcodes().contains(&op) || (rd && op & 0x1F <= 0x15),
            "{op:#04x}"
        );
    }
}

#[test]
fn a_reserved_opcode_ends_at_its_bth() {
    for op in [0x18, 0x1F, 0x2C, 0x66, 0x82, 0xC0, 0xFF] {
        let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(op));
        assert_eq!(end(&f), 42 + 12, "{op:#04x}");
    }
}

#[test]
fn ipv6_and_vlan_tags_move_the_end_with_the_bth() {
    let f = roce_frame(&Eth::default(), &v6(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    assert_ends(&f, 62, 12 + 16, "IPv6");
    let eth = Eth::default().with_vlan(VlanTag::dot1q(10));
    let f = roce_frame(&eth, &v4(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    assert_ends(&f, 46, 12 + 16, "one VLAN tag");
}

#[test]
fn vxlan_ends_after_the_inner_transport_headers() {
    let eth = Eth::default();
    let inner = roce_frame(&eth, &v4(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    for outer in [
        L3::v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
        L3::v6(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        ),
    ] {
        let f = vxlan_frame(&eth, &outer, 0xD000, 5001, &inner);
        let bth_at = inner_eth_offset(&eth, &outer) + 42;
        assert_ends(&f, bth_at, 12 + 16, "VXLAN");
    }
    // A CNP in VXLAN over IPv4: 50 bytes of tunnel, then the 70 of the CNP's headers.
    let c = roce_frame(&eth, &v4(), 0xC000, &cnp(0x1234));
    let f = vxlan_frame(&eth, &v4(), 0xD000, 5001, &c);
    assert_eq!(end(&f), 50 + 70);
}

#[test]
fn a_frame_cut_at_128_bytes_keeps_the_headers_it_holds() {
    let eth = Eth::default();
    // A WRITE in VXLAN over IPv4: inner BTH at 92, RETH to 120, payload after.
    let inner = roce_frame(&eth, &v4(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    let f = vxlan_frame(&eth, &v4(), 0xD000, 5001, &inner);
    assert_eq!(end(&f[..128]), 120);
    // Cut inside the RETH: all of it that is there.
    assert_eq!(end(&f[..110]), 110);
    // Cut inside the inner BTH: up to the inner UDP header.
    assert_eq!(end(&f[..100]), 92);
    // IPv6 in VXLAN over IPv6 behind two tags: the inner IPv6 header (92 to 132) runs
    // past the sample, which keeps the headers up to the inner Ethernet header's end.
    let tagged = Eth::default()
        .with_vlan(VlanTag::dot1ad(100))
        .with_vlan(VlanTag::dot1q(7));
    let inner6 = roce_frame(&eth, &v6(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    let deep = vxlan_frame(&tagged, &v6(), 0xD000, 5001, &inner6);
    let inner_eth = inner_eth_offset(&tagged, &v6());
    assert_eq!(inner_eth, 14 + 8 + 40 + 8 + 8);
    assert_eq!(end(&deep[..128]), inner_eth + 14);
    assert_eq!(end(&deep), inner_eth + 14 + 40 + 8 + 12 + 16);
    // Cut inside a VLAN tag, inside the outer IP header: the Ethernet header only.
    assert_eq!(end(&deep[..16]), 14);
    assert_eq!(end(&deep[..40]), 14);
}

#[test]
fn another_roce_port_is_read_with_the_configs_ports() {
    let f = roce_frame(&Eth::default(), &v4(), 0xC000, &msg(opcode::RC_WRITE_ONLY));
    let mut moved = f.clone();
    moved[36..38].copy_from_slice(&4792u16.to_be_bytes());
    // Not RoCE on the default port: up to the UDP header.
    assert_eq!(end(&moved), 42);
    let cfg = RuntimeConfig {
        roce_port: 4792,
        ..RuntimeConfig::default()
    };
    assert_eq!(transport_headers_end(&moved, &cfg), 42 + 12 + 16);
}
