//! Scenarios of the real `xdp_classify` program through BPF_PROG_TEST_RUN: a frame
//! built with `roce_testkit::frame`, the program's verdict and output bytes, and the
//! exact FLOWS and STATS it leaves behind. Needs root. Each test loads its own copy of
//! the program (its own maps), so tests run in parallel safely.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use roce_common::bth;
use roce_common::config::RuntimeConfig;
use roce_common::flow::FlowStats;
use roce_common::key::FlowKey;
use roce_common::parsed::{Class, Reason};
use roce_common::reference::ReferenceTable;
use roce_common::wire::{ETH_HLEN, UDP_HLEN, VLAN_HLEN, VXLAN_HLEN};
use roce_testkit::frame::{
    cnp, defined_opcodes, eth_frame, ext_headers, ip_frame, opcode, roce_frame, roce_frame_to,
    udp_frame, vxlan_frame, Eth, ExtHeader, Ipv6Ext, RoceMsg, VlanTag, L3,
};
use roce_tests::expect::{assert_stats, compare_with_reference, key, tunnel_key, Counts, Stats};
use roce_tests::harness::Harness;
use roce_tests::hex;

// ---------------------------------------------------------------------------------
// Fixtures

const SPORT: u16 = 0xC0DE;
const VXLAN_SPORT: u16 = 0xD00D;
const VNI: u32 = 5001;
const QP: u32 = 0x01_2345;

fn eth() -> Eth {
    Eth::default()
}

/// RoCE data addresses, DSCP 26 + ECT(0) as RoCE data usually carries.
fn host4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106)
}

fn host6() -> L3 {
    L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2),
    )
    .with_tos(106)
}

/// Underlay addresses.
fn under4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106)
}

fn under6() -> L3 {
    L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 2),
    )
    .with_tos(106)
}

/// One packet of `frame` on a flow with outer (and inner) TOS `tos`/`inner_tos`.
fn one_packet(frame: &[u8], tos: u8, inner_tos: Option<u8>, sport: u16) -> Counts {
    let mut c = Counts {
        packets: 1,
        bytes: frame.len() as u64,
        sport,
        last_dscp: tos >> 2,
        ..Counts::default()
    };
    c.ecn[(tos & 3) as usize] = 1;
    if let Some(t) = inner_tos {
        c.inner_ecn[(t & 3) as usize] = 1;
    }
    c
}

fn counts(flows: &BTreeMap<FlowKey, FlowStats>) -> BTreeMap<FlowKey, Counts> {
    flows.iter().map(|(k, v)| (*k, Counts::from(v))).collect()
}

/// Asserts the table holds exactly `expected`.
#[track_caller]
fn assert_flows(h: &Harness, expected: &[(FlowKey, Counts)], context: &str) {
    let got = counts(&h.flows());
    let want: BTreeMap<FlowKey, Counts> = expected.iter().copied().collect();
    assert!(
        got == want,
        "{context}: flows differ\n  kernel:   {got:#?}\n  expected: {want:#?}"
    );
}

/// The one flow in the table.
#[track_caller]
fn only_flow(h: &Harness) -> (FlowKey, FlowStats) {
    let f = h.flows();
    assert_eq!(f.len(), 1, "expected exactly one flow, got {f:#?}");
    f.into_iter().next().unwrap()
}

fn roce_stats(flows: u64, packets: u64) -> Stats {
    Stats::new().class(Class::Roce, packets).created(flows)
}

fn vxlan_stats(flows: u64, packets: u64) -> Stats {
    Stats::new()
        .class(Class::RoceInVxlan, packets)
        .created(flows)
}

/// A message of `op` with the fields every extension header needs.
fn msg(op: u8, psn: u32, payload: usize) -> RoceMsg {
    RoceMsg::new(op, QP, psn)
        .with_payload(payload)
        .with_reth(0x1000, 0x100, payload as u32)
}

// ---------------------------------------------------------------------------------
// Opcode families

#[test]
fn every_defined_opcode_counts_one_packet_on_its_qp_flow() {
    let mut h = Harness::load();
    for op in defined_opcodes() {
        h.reset();
        let payload = if ext_headers(op).contains(&ExtHeader::Aeth) {
            0
        } else {
            40
        };
        let m = msg(op, 7, payload);
        let f = roce_frame(&eth(), &host4(), SPORT, &m);
        h.pass(&f);
        let mut want = one_packet(&f, 106, None, SPORT);
        if bth::is_cnp(op) {
            want.cnps = 1;
        }
        // The default syndrome 0x1F is an ACK with 31 credits.
        if op == opcode::RC_ACKNOWLEDGE || op == opcode::XRC | 0x11 {
            want.acks = 1;
        }
        let ctx = format!("opcode {op:#04x} {}", bth::opcode_name(op));
        assert_flows(&h, &[(key(&host4(), QP), want)], &ctx);
        assert_stats(&h.stats(), &roce_stats(1, 1), &ctx);
    }
}

#[test]
fn rc_send_and_write_in_order_across_psn_wrap_have_no_gap() {
    let h = Harness::load();
    let psns = [0xFF_FFFD, 0xFF_FFFE, 0xFF_FFFF, 0, 1, 2];
    let ops = [
        opcode::RC_SEND_FIRST,
        opcode::RC_SEND_MIDDLE,
        opcode::RC_SEND_LAST,
        opcode::RC_WRITE_FIRST,
        opcode::RC_WRITE_MIDDLE,
        opcode::RC_WRITE_LAST_IMM,
    ];
    for (op, psn) in ops.into_iter().zip(psns) {
        h.pass(&roce_frame(&eth(), &host4(), SPORT, &msg(op, psn, 4096)));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps), (6, 0));
    assert_stats(&h.stats(), &roce_stats(1, 6), "in-order RC");
}

#[test]
fn rc_request_skipping_a_psn_counts_one_gap_and_the_retransmission_none() {
    let h = Harness::load();
    for psn in [10, 11, 13, 12, 13, 14] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &RoceMsg::send_only(QP, psn, 64),
        ));
    }
    let (k, s) = only_flow(&h);
    assert_eq!(k, key(&host4(), QP));
    assert_eq!((s.packets, s.psn_gaps), (6, 1));
    assert_eq!(s.psn.next, 15);
}

/// One flow whose requests arrive on two CPUs (as under RPS or a rehashed RSS queue):
/// the flow's value is shared by all CPUs, so its PSN state follows the requests
/// wherever they run. PSNs 1, 2 on one CPU, 3 on another, 4 on the first: no gap (with
/// a state per CPU, the first would have counted a false one at 4), and nothing for
/// the document to flag (`psn_split` is absent).
#[test]
fn one_flow_on_two_cpus_shares_its_psn_state_and_counts_no_false_gap() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs two CPUs, the machine has {cpus}"
    );
    let h = Harness::load();
    let on_cpu = |cpu: usize, psns: &[u32]| {
        if let Err(e) = roce_testkit::sock::pin_thread_to_cpu(cpu) {
            panic!("pinning to CPU {cpu}: {e}");
        }
        for &psn in psns {
            h.pass(&roce_frame(
                &eth(),
                &host4(),
                SPORT,
                &RoceMsg::send_only(QP, psn, 64),
            ));
        }
    };
    on_cpu(0, &[1, 2]);
    on_cpu(1, &[3]);
    on_cpu(0, &[4]);
    let (k, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps), (4, 0), "no false gap");
    assert_eq!(s.psn.next, 5);
    assert!(!s.psn.split());
    let doc = roce_agent::doc::Document::build(vec![(k, s)], &h.stats(), None);
    let json = serde_json::to_value(&doc.flows[0]).expect("a flow serializes");
    assert!(json.get("psn_split").is_none(), "{json}");
    // A real gap is still one, whichever CPU sees it.
    on_cpu(1, &[7]);
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps), (5, 1));
}

/// Two CPUs counting the same flow at the same moment (each runs the packet 200,000
/// times through BPF_PROG_TEST_RUN, started together): the shared counters are added
/// atomically, so not one packet or byte is lost.
#[test]
fn two_cpus_counting_one_flow_at_once_lose_no_count() {
    use roce_agent::datapath::testrun::{test_run, TestRun};
    const RUNS: u32 = 200_000;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs two CPUs, the machine has {cpus}"
    );
    let h = Harness::load();
    // An ACK: counted on the flow, no PSN tracking to depend on the interleaving.
    let frame = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::ack(QP, 9, 0x1f));
    let fd = h.loaded().xdp_fd().expect("xdp_classify is loaded");
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        for cpu in [0, 1] {
            let (frame, start) = (&frame, &start);
            scope.spawn(move || {
                if let Err(e) = roce_testkit::sock::pin_thread_to_cpu(cpu) {
                    panic!("pinning to CPU {cpu}: {e}");
                }
                start.wait();
                let run = TestRun {
                    data: frame,
                    repeat: RUNS,
                    ..Default::default()
                };
                let out = test_run(fd, &run).expect("BPF_PROG_TEST_RUN");
                assert_eq!(out.retval, roce_tests::harness::XDP_PASS);
            });
        }
    });
    let (_, s) = only_flow(&h);
    let n = 2 * RUNS as u64;
    assert_eq!(
        (s.packets, s.bytes, s.acks, s.ecn.iter().sum::<u64>()),
        (n, n * frame.len() as u64, n, n)
    );
}

#[test]
fn read_request_of_3000_bytes_at_pmtu_1024_is_no_gap_and_teaches_the_pmtu() {
    let h = Harness::load();
    for psn in [0, 3, 6] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &RoceMsg::read_request(QP, psn, 3000),
        ));
    }
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::send_only(QP, 9, 8),
    ));
    let (_, s) = only_flow(&h);
    assert_eq!(
        (s.packets, s.psn_gaps, s.psn.pmtu_log2, s.psn.next),
        (4, 0, 10, 10)
    );
}

#[test]
fn read_request_followed_by_a_psn_no_mtu_explains_is_a_gap() {
    let h = Harness::load();
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::read_request(QP, 0, 3000),
    ));
    // 3000 bytes take 12, 6, 3, 2 or 1 PSNs; 5 fits none.
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::send_only(QP, 5, 8),
    ));
    assert_eq!(only_flow(&h).1.psn_gaps, 1);
}

#[test]
fn write_first_payload_of_1024_teaches_the_pmtu() {
    let h = Harness::load();
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &msg(opcode::RC_WRITE_FIRST, 0, 1024),
    ));
    assert_eq!(only_flow(&h).1.psn.pmtu_log2, 10);
    // A READ of 2048 bytes then uses 2 PSNs: the request at +2 is in order.
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::read_request(QP, 1, 2048),
    ));
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::send_only(QP, 3, 8),
    ));
    let (_, s) = only_flow(&h);
    assert_eq!((s.psn_gaps, s.psn.next, s.psn.pmtu_log2), (0, 4, 10));
}

#[test]
fn read_responses_and_acknowledges_are_not_psn_tracked() {
    let h = Harness::load();
    for (op, psn) in [
        (opcode::RC_READ_RESPONSE_FIRST, 1),
        (opcode::RC_READ_RESPONSE_MIDDLE, 9),
        (opcode::RC_READ_RESPONSE_LAST, 40),
        (opcode::RC_ACKNOWLEDGE, 100),
        (opcode::RC_ATOMIC_ACKNOWLEDGE, 200),
    ] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &msg(op, psn, 0).with_syndrome(0),
        ));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps, s.psn.flags), (5, 0, 0));
    // Only the ACKNOWLEDGE counts as an ACK, not the READ responses' or atomic ACK's AETH.
    assert_eq!((s.acks, s.naks, s.rnr_naks), (1, 0, 0));
}

#[test]
fn atomic_requests_are_psn_tracked() {
    let h = Harness::load();
    for (op, psn) in [
        (opcode::RC_FETCH_ADD, 1),
        (opcode::RC_COMPARE_SWAP, 2),
        (opcode::RC_FETCH_ADD, 4),
    ] {
        h.pass(&roce_frame(&eth(), &host4(), SPORT, &msg(op, psn, 0)));
    }
    assert_eq!(only_flow(&h).1.psn_gaps, 1);
}

#[test]
fn uc_and_ud_requests_are_not_psn_tracked() {
    let h = Harness::load();
    for (op, psn) in [
        (opcode::UC_SEND_ONLY, 1),
        (opcode::UC_WRITE_ONLY, 5),
        (opcode::UC, 50), // UC SEND_FIRST
        (opcode::UD_SEND_ONLY, 60),
        (opcode::UD_SEND_ONLY_IMM, 90),
    ] {
        h.pass(&roce_frame(&eth(), &host4(), SPORT, &msg(op, psn, 16)));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps, s.psn.flags), (5, 0, 0));
}

#[test]
fn xrc_requests_are_psn_tracked_and_xrc_acknowledge_counts() {
    let h = Harness::load();
    for psn in [1, 2, 4] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &msg(opcode::XRC | 0x04, psn, 8),
        ));
    }
    for syndrome in [0x00, 0x60, 0x21] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &msg(opcode::XRC | 0x11, 9, 0).with_syndrome(syndrome),
        ));
    }
    let (_, s) = only_flow(&h);
    assert_eq!(
        (s.packets, s.psn_gaps, s.acks, s.naks, s.rnr_naks),
        (6, 1, 1, 1, 1)
    );
}

#[test]
fn xrc_read_request_length_is_read_after_the_xrceth() {
    let h = Harness::load();
    // 8192 bytes at the default PMTU 4096: 2 PSNs. The R_Key (0x100) sits where a
    // parser that forgot the XRCETH would read the length: 1 PSN, and a gap.
    let read = RoceMsg::new(opcode::XRC | 0x0C, QP, 100).with_reth(0x1000, 0x100, 8192);
    h.pass(&roce_frame(&eth(), &host4(), SPORT, &read));
    h.pass(&roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &msg(opcode::XRC | 0x04, 102, 8),
    ));
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.psn_gaps, s.psn.next), (2, 0, 103));
}

// ---------------------------------------------------------------------------------
// ACK, NAK, RNR NAK

#[test]
fn acknowledge_syndromes_count_by_class() {
    let mut h = Harness::load();
    for syndrome in 0..=255u8 {
        h.reset();
        let f = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::ack(QP, 3, syndrome));
        h.pass(&f);
        let mut want = one_packet(&f, 106, None, SPORT);
        match syndrome >> 5 {
            0b000 => want.acks = 1,
            0b001 => want.rnr_naks = 1,
            0b011 => want.naks = 1,
            _ => {} // reserved classes count as packets only
        }
        let ctx = format!("syndrome {syndrome:#04x}");
        assert_flows(&h, &[(key(&host4(), QP), want)], &ctx);
        assert_stats(&h.stats(), &roce_stats(1, 1), &ctx);
    }
}

#[test]
fn ack_nak_and_rnr_nak_accumulate_on_one_flow() {
    let h = Harness::load();
    let syndromes = [0x1F, 0x00, 0x60, 0x61, 0x62, 0x63, 0x20, 0x3F, 0x1F];
    for s in syndromes {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            SPORT,
            &RoceMsg::ack(QP, 1, s),
        ));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.acks, s.naks, s.rnr_naks), (9, 3, 4, 2));
}

#[test]
fn acknowledge_cut_before_its_aeth_counts_the_packet_without_a_class() {
    let h = Harness::load();
    let f = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::ack(QP, 1, 0x60));
    let cut = &f[..14 + 20 + 8 + 12];
    h.pass(cut);
    let want = one_packet(cut, 106, None, SPORT);
    assert_flows(&h, &[(key(&host4(), QP), want)], "ACK without AETH");
    assert_stats(
        &h.stats(),
        &roce_stats(1, 1).reason(Reason::TruncatedExtHeader, 1),
        "ACK without AETH",
    );
}

// ---------------------------------------------------------------------------------
// CNP

#[test]
fn cnp_counts_on_the_flow_of_the_throttled_qp() {
    let mut h = Harness::load();
    for op in [opcode::CNP, opcode::CNP_ALT] {
        h.reset();
        let c = RoceMsg {
            opcode: op,
            ..cnp(QP)
        };
        let f = roce_frame(&eth(), &host4().with_tos(0xC0), SPORT, &c);
        assert_eq!(f.len(), 74);
        h.pass(&f);
        h.pass(&f);
        let mut want = one_packet(&f, 0xC0, None, SPORT);
        want.packets = 2;
        want.bytes = 148;
        want.ecn = [2, 0, 0, 0];
        want.cnps = 2;
        let ctx = format!("CNP opcode {op:#04x}");
        assert_flows(&h, &[(key(&host4(), QP), want)], &ctx);
        assert_stats(&h.stats(), &roce_stats(1, 2), &ctx);
        // CNPs are not requests: their PSN 0 is not tracked.
        assert_eq!(only_flow(&h).1.psn.flags, 0);
    }
}

#[test]
fn cnp_in_vxlan_counts_on_inner_flow() {
    let mut h = Harness::load();
    for op in [opcode::CNP, opcode::CNP_ALT] {
        for (outer, inner) in [
            (under4(), host4()),
            (under6(), host4()),
            (under4(), host6()),
            (under6(), host6()),
        ] {
            h.reset();
            let outer = outer.with_tos(0xC2);
            let inner = inner.with_tos(0xC3);
            let c = RoceMsg {
                opcode: op,
                ..cnp(QP)
            };
            let f = vxlan_frame(
                &eth(),
                &outer,
                VXLAN_SPORT,
                VNI,
                &roce_frame(&eth(), &inner, SPORT, &c),
            );
            h.pass(&f);
            let mut want = one_packet(&f, 0xC2, Some(0xC3), SPORT);
            want.cnps = 1;
            let ctx = format!("CNP {op:#04x} outer {outer:?} inner {inner:?}");
            assert_flows(&h, &[(tunnel_key(&outer, VNI, &inner, QP), want)], &ctx);
            assert_stats(&h.stats(), &vxlan_stats(1, 1), &ctx);
        }
    }
}

// ---------------------------------------------------------------------------------
// ECN and DSCP

#[test]
fn every_tos_value_counts_its_ecn_codepoint_and_dscp_plain_and_tunnelled() {
    let mut h = Harness::load();
    let inner_tos = 0x6A;
    for variant in 0..4 {
        for tos in 0..=255u8 {
            h.reset();
            let (f, k, inner, stats) = match variant {
                0 | 1 => {
                    let l3 = if variant == 0 { host4() } else { host6() }.with_tos(tos);
                    let f = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 32));
                    (f, key(&l3, QP), None, roce_stats(1, 1))
                }
                _ => {
                    let outer = if variant == 2 { under4() } else { under6() }.with_tos(tos);
                    let inner_l3 = host4().with_tos(inner_tos);
                    let inner =
                        roce_frame(&eth(), &inner_l3, SPORT, &RoceMsg::send_only(QP, 0, 32));
                    let f = vxlan_frame(&eth(), &outer, VXLAN_SPORT, VNI, &inner);
                    (
                        f,
                        tunnel_key(&outer, VNI, &inner_l3, QP),
                        Some(inner_tos),
                        vxlan_stats(1, 1),
                    )
                }
            };
            h.pass(&f);
            let ctx = format!("variant {variant} tos {tos:#04x}");
            assert_flows(&h, &[(k, one_packet(&f, tos, inner, SPORT))], &ctx);
            assert_stats(&h.stats(), &stats, &ctx);
        }
    }
}

#[test]
fn inner_ecn_is_counted_apart_from_outer_ecn_in_vxlan() {
    let mut h = Harness::load();
    for outer_ecn in 0..4u8 {
        for inner_ecn in 0..4u8 {
            h.reset();
            let outer = under4().with_ecn(outer_ecn);
            let inner_l3 = host6().with_ecn(inner_ecn);
            let inner = roce_frame(&eth(), &inner_l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
            let f = vxlan_frame(&eth(), &outer, VXLAN_SPORT, VNI, &inner);
            h.pass(&f);
            let want = one_packet(&f, outer.tos(), Some(inner_l3.tos()), SPORT);
            let ctx = format!("outer ECN {outer_ecn} inner ECN {inner_ecn}");
            assert_flows(&h, &[(tunnel_key(&outer, VNI, &inner_l3, QP), want)], &ctx);
        }
    }
}

#[test]
fn last_dscp_follows_the_last_packet() {
    let h = Harness::load();
    for tos in [106, 0xB8, 0] {
        h.pass(&roce_frame(
            &eth(),
            &host4().with_tos(tos),
            SPORT,
            &RoceMsg::send_only(QP, 0, 8),
        ));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.ecn, s.last_dscp), (3, [2, 0, 1, 0], 0));
}

// ---------------------------------------------------------------------------------
// Flow keys

#[test]
fn ipv6_roce_flow_is_keyed_by_ipv6_addresses() {
    let h = Harness::load();
    let f = roce_frame(&eth(), &host6(), SPORT, &RoceMsg::write_only(QP, 0, 100));
    h.pass(&f);
    assert_flows(
        &h,
        &[(key(&host6(), QP), one_packet(&f, 106, None, SPORT))],
        "IPv6",
    );
    assert_stats(&h.stats(), &roce_stats(1, 1), "IPv6");
}

#[test]
fn udp_source_port_is_not_part_of_the_key_and_the_last_one_is_kept() {
    let h = Harness::load();
    for sport in [0xC000, 0xC001, 69] {
        h.pass(&roce_frame(
            &eth(),
            &host4(),
            sport,
            &RoceMsg::send_only(QP, 0, 8),
        ));
    }
    let (_, s) = only_flow(&h);
    assert_eq!((s.packets, s.sport), (3, 69));
}

#[test]
fn qps_directions_vnis_and_inner_addresses_make_distinct_flows() {
    let h = Harness::load();
    let m = |qp| RoceMsg::send_only(qp, 0, 8);
    let rev = L3::v4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1)).with_tos(106);
    let other_inner =
        L3::v4(Ipv4Addr::new(198, 19, 0, 3), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106);
    let frames = [
        roce_frame(&eth(), &host4(), SPORT, &m(1)),
        roce_frame(&eth(), &host4(), SPORT, &m(2)),
        roce_frame(&eth(), &rev, SPORT, &m(1)),
        vxlan_frame(
            &eth(),
            &under4(),
            1,
            10,
            &roce_frame(&eth(), &host4(), SPORT, &m(1)),
        ),
        vxlan_frame(
            &eth(),
            &under4(),
            1,
            11,
            &roce_frame(&eth(), &host4(), SPORT, &m(1)),
        ),
        vxlan_frame(
            &eth(),
            &under4(),
            1,
            10,
            &roce_frame(&eth(), &other_inner, SPORT, &m(1)),
        ),
    ];
    for f in &frames {
        h.pass(f);
    }
    let want = [
        (key(&host4(), 1), one_packet(&frames[0], 106, None, SPORT)),
        (key(&host4(), 2), one_packet(&frames[1], 106, None, SPORT)),
        (key(&rev, 1), one_packet(&frames[2], 106, None, SPORT)),
        (
            tunnel_key(&under4(), 10, &host4(), 1),
            one_packet(&frames[3], 106, Some(106), SPORT),
        ),
        (
            tunnel_key(&under4(), 11, &host4(), 1),
            one_packet(&frames[4], 106, Some(106), SPORT),
        ),
        (
            tunnel_key(&under4(), 10, &other_inner, 1),
            one_packet(&frames[5], 106, Some(106), SPORT),
        ),
    ];
    assert_flows(&h, &want, "six flows");
    assert_stats(
        &h.stats(),
        &Stats::new()
            .class(Class::Roce, 3)
            .class(Class::RoceInVxlan, 3)
            .created(6),
        "six flows",
    );
}

#[test]
fn vxlan_vni_uses_all_24_bits() {
    let h = Harness::load();
    let f = vxlan_frame(
        &eth(),
        &under4(),
        VXLAN_SPORT,
        0xFF_FFFF,
        &roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8)),
    );
    h.pass(&f);
    assert_eq!(
        only_flow(&h).0,
        tunnel_key(&under4(), 0xFF_FFFF, &host4(), QP)
    );
}

// ---------------------------------------------------------------------------------
// VLAN tags

#[test]
fn vlan_tagged_and_double_tagged_roce_count_like_untagged() {
    let mut h = Harness::load();
    let tags: [&[VlanTag]; 5] = [
        &[VlanTag::dot1q(10)],
        &[VlanTag::dot1ad(10)],
        &[VlanTag::dot1ad(100), VlanTag::dot1q(10)],
        &[VlanTag::dot1q(100), VlanTag::dot1q(10)],
        &[
            VlanTag::dot1ad(100).with_pcp(3),
            VlanTag::dot1ad(10).with_pcp(5),
        ],
    ];
    for t in tags {
        for l3 in [host4(), host6()] {
            h.reset();
            let e = Eth {
                vlans: t.to_vec(),
                ..eth()
            };
            let f = roce_frame(&e, &l3, SPORT, &RoceMsg::ack(QP, 0, 0x60));
            h.pass(&f);
            let mut want = one_packet(&f, 106, None, SPORT);
            want.naks = 1;
            let ctx = format!("tags {t:?}");
            assert_flows(&h, &[(key(&l3, QP), want)], &ctx);
            assert_stats(&h.stats(), &roce_stats(1, 1), &ctx);
        }
    }
}

#[test]
fn three_vlan_tags_are_too_many() {
    let h = Harness::load();
    let e = eth()
        .with_vlan(VlanTag::dot1ad(1))
        .with_vlan(VlanTag::dot1q(2))
        .with_vlan(VlanTag::dot1q(3));
    h.pass(&roce_frame(
        &e,
        &host4(),
        SPORT,
        &RoceMsg::send_only(QP, 0, 8),
    ));
    assert!(h.flows().is_empty());
    assert_stats(
        &h.stats(),
        &Stats::new().reason(Reason::TooManyVlanTags, 1),
        "3 tags",
    );
}

#[test]
fn vlan_tagged_vxlan_underlay_counts_on_inner_flow() {
    let h = Harness::load();
    let e = eth()
        .with_vlan(VlanTag::dot1ad(7))
        .with_vlan(VlanTag::dot1q(8));
    let f = vxlan_frame(
        &e,
        &under6(),
        VXLAN_SPORT,
        VNI,
        &roce_frame(&eth(), &host4(), SPORT, &cnp(QP)),
    );
    h.pass(&f);
    let mut want = one_packet(&f, 106, Some(106), SPORT);
    want.cnps = 1;
    assert_flows(
        &h,
        &[(tunnel_key(&under6(), VNI, &host4(), QP), want)],
        "tagged underlay",
    );
}

#[test]
fn vlan_tagged_inner_frame_counts_as_vxlan_other() {
    // The classifier walks VLAN tags of the outer frame only.
    let h = Harness::load();
    let inner = roce_frame(
        &eth().with_vlan(VlanTag::dot1q(5)),
        &host4(),
        SPORT,
        &RoceMsg::send_only(QP, 0, 8),
    );
    h.pass(&vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner));
    assert!(h.flows().is_empty());
    assert_stats(
        &h.stats(),
        &Stats::new().class(Class::VxlanOther, 1),
        "tagged inner",
    );
}

// ---------------------------------------------------------------------------------
// IPv4 options, IHL, fragments

#[test]
fn ipv4_options_of_every_ihl_are_skipped_outer_and_inner() {
    let mut h = Harness::load();
    for ihl in 5..=15usize {
        let opts = vec![1u8; (ihl - 5) * 4]; // NOPs
        h.reset();
        let l3 = host4().with_options(&opts);
        let f = roce_frame(&eth(), &l3, SPORT, &RoceMsg::ack(QP, 0, 0x20));
        assert_eq!(f[14] & 0x0F, ihl as u8);
        h.pass(&f);
        let mut want = one_packet(&f, 106, None, SPORT);
        want.rnr_naks = 1;
        assert_flows(&h, &[(key(&l3, QP), want)], &format!("outer IHL {ihl}"));

        h.reset();
        let outer = under4().with_options(&opts);
        let inner_l3 = host4().with_options(&opts);
        let inner = roce_frame(&eth(), &inner_l3, SPORT, &RoceMsg::ack(QP, 0, 0x20));
        let f = vxlan_frame(&eth(), &outer, VXLAN_SPORT, VNI, &inner);
        h.pass(&f);
        let mut want = one_packet(&f, 106, Some(106), SPORT);
        want.rnr_naks = 1;
        assert_flows(
            &h,
            &[(tunnel_key(&outer, VNI, &inner_l3, QP), want)],
            &format!("outer and inner IHL {ihl}"),
        );
        assert_stats(&h.stats(), &vxlan_stats(1, 1), &format!("IHL {ihl}"));
    }
}

#[test]
fn ipv4_ihl_below_5_is_bad_ihl_outer_and_inner() {
    let mut h = Harness::load();
    for ihl in 0..5u8 {
        h.reset();
        let mut f = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8));
        f[14] = 0x40 | ihl;
        h.pass(&f);
        let inner = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8));
        let mut t = vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner);
        t[14 + 20 + 16 + 14] = 0x40 | ihl;
        h.pass(&t);
        assert!(h.flows().is_empty());
        assert_stats(
            &h.stats(),
            &Stats::new()
                .reason(Reason::BadIpv4Ihl, 1)
                .reason(Reason::BadInnerIpv4Ihl, 1),
            &format!("IHL {ihl}"),
        );
    }
}

#[test]
fn ip_version_not_matching_the_ethertype_is_bad_ip_version() {
    let h = Harness::load();
    let mut f = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8));
    f[14] = 0x65; // version 6 under EtherType IPv4
    h.pass(&f);
    let mut g = roce_frame(&eth(), &host6(), SPORT, &RoceMsg::send_only(QP, 0, 8));
    g[14] = 0x46; // version 4 under EtherType IPv6
    h.pass(&g);
    let inner = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8));
    let mut t = vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner);
    t[14 + 20 + 16 + 14] = 0x55;
    h.pass(&t);
    assert!(h.flows().is_empty());
    assert_stats(
        &h.stats(),
        &Stats::new().reason(Reason::BadIpVersion, 3),
        "versions",
    );
}

#[test]
fn ipv4_non_first_fragments_are_not_classified_but_first_fragments_are() {
    let mut h = Harness::load();
    let frag = |flags_frag: u16| {
        let mut l3 = host4();
        if let L3::V4(hdr) = &mut l3 {
            hdr.flags_frag = flags_frag;
        }
        l3
    };
    // MF set, offset 0: a first fragment, classified.
    let first = roce_frame(&eth(), &frag(0x2000), SPORT, &RoceMsg::send_only(QP, 0, 8));
    h.pass(&first);
    assert_stats(&h.stats(), &roce_stats(1, 1), "first fragment");
    for ff in [0x0001, 0x2001, 0x1FFF, 0x4010] {
        h.reset();
        h.pass(&roce_frame(
            &eth(),
            &frag(ff),
            SPORT,
            &RoceMsg::send_only(QP, 0, 8),
        ));
        let inner = roce_frame(&eth(), &frag(ff), SPORT, &RoceMsg::send_only(QP, 0, 8));
        h.pass(&vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner));
        assert!(h.flows().is_empty());
        assert_stats(
            &h.stats(),
            &Stats::new()
                .reason(Reason::Ipv4Fragment, 1)
                .reason(Reason::InnerIpv4Fragment, 1),
            &format!("flags/offset {ff:#06x}"),
        );
    }
}

// ---------------------------------------------------------------------------------
// IPv6 extension headers

fn hbh() -> Ipv6Ext {
    Ipv6Ext::HopByHop { len: 0 }
}
fn routing() -> Ipv6Ext {
    Ipv6Ext::Routing {
        len: 2,
        routing_type: 4,
        segments_left: 0,
    }
}
fn dstopts() -> Ipv6Ext {
    Ipv6Ext::DestOpts { len: 1 }
}
fn first_fragment() -> Ipv6Ext {
    Ipv6Ext::Fragment {
        offset: 0,
        more: true,
        id: 0xABCD,
    }
}

#[test]
fn ipv6_each_extension_header_kind_is_walked_outer_and_inner() {
    let mut h = Harness::load();
    for ext in [hbh(), routing(), dstopts(), first_fragment()] {
        h.reset();
        let l3 = host6().with_ext(ext);
        let f = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
        h.pass(&f);
        assert_flows(
            &h,
            &[(key(&l3, QP), one_packet(&f, 106, None, SPORT))],
            &format!("{ext:?}"),
        );

        h.reset();
        let outer = under6().with_ext(ext);
        let inner = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
        let f = vxlan_frame(&eth(), &outer, VXLAN_SPORT, VNI, &inner);
        h.pass(&f);
        assert_flows(
            &h,
            &[(
                tunnel_key(&outer, VNI, &l3, QP),
                one_packet(&f, 106, Some(106), SPORT),
            )],
            &format!("tunnelled {ext:?}"),
        );
        assert_stats(&h.stats(), &vxlan_stats(1, 1), &format!("{ext:?}"));
    }
}

#[test]
fn ipv6_four_extension_headers_are_walked_and_five_are_too_many() {
    let mut h = Harness::load();
    let four = [hbh(), routing(), first_fragment(), dstopts()];
    let l3 = four.iter().fold(host6(), |l, e| l.with_ext(*e));
    let f = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
    h.pass(&f);
    assert_flows(
        &h,
        &[(key(&l3, QP), one_packet(&f, 106, None, SPORT))],
        "four",
    );

    h.reset();
    let five = l3.clone().with_ext(dstopts());
    h.pass(&roce_frame(
        &eth(),
        &five,
        SPORT,
        &RoceMsg::send_only(QP, 0, 8),
    ));
    let inner = roce_frame(&eth(), &five, SPORT, &RoceMsg::send_only(QP, 0, 8));
    h.pass(&vxlan_frame(&eth(), &under6(), VXLAN_SPORT, VNI, &inner));
    assert!(h.flows().is_empty());
    assert_stats(
        &h.stats(),
        &Stats::new()
            .reason(Reason::TooManyIpv6Ext, 1)
            .reason(Reason::TooManyInnerIpv6Ext, 1),
        "five",
    );
}

#[test]
fn ipv6_non_first_fragments_are_not_classified() {
    let mut h = Harness::load();
    for (offset, more) in [(1, true), (1, false), (0x1FFF, false)] {
        h.reset();
        let l3 = host6().with_ext(Ipv6Ext::Fragment {
            offset,
            more,
            id: 9,
        });
        h.pass(&roce_frame(
            &eth(),
            &l3,
            SPORT,
            &RoceMsg::send_only(QP, 0, 8),
        ));
        let inner = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
        h.pass(&vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner));
        assert!(h.flows().is_empty());
        assert_stats(
            &h.stats(),
            &Stats::new()
                .reason(Reason::Ipv6Fragment, 1)
                .reason(Reason::InnerIpv6Fragment, 1),
            &format!("offset {offset} more {more}"),
        );
    }
}

#[test]
fn ipv6_extension_header_cut_anywhere_is_truncated_ipv6_ext() {
    let mut h = Harness::load();
    let l3 = host6().with_ext(hbh()).with_ext(first_fragment());
    let f = roce_frame(&eth(), &l3, SPORT, &RoceMsg::send_only(QP, 0, 8));
    // Hop-by-hop at 54..62, fragment at 62..70; the UDP header starts at 70.
    for len in 54..70 {
        h.reset();
        h.pass(&f[..len]);
        assert!(h.flows().is_empty());
        assert_stats(
            &h.stats(),
            &Stats::new().reason(Reason::TruncatedIpv6Ext, 1),
            &format!("cut at {len}"),
        );
    }
}

// ---------------------------------------------------------------------------------
// Everything that is not RoCE

#[test]
fn non_roce_traffic_counts_in_its_class_and_makes_no_flow() {
    let h = Harness::load();
    let tcp = ip_frame(&eth(), &host4(), 6, &[0u8; 20]);
    let dns = udp_frame(&eth(), &host6(), 5353, 53, &[0u8; 12]);
    let from_4791 = udp_frame(&eth(), &host4(), 4791, 5000, &[0u8; 40]);
    let arp = eth_frame(&eth(), 0x0806, &[0u8; 28]);
    let frames = [
        tcp.clone(),
        dns.clone(),
        from_4791,
        arp.clone(),
        // RoCE to a port that is not 4791.
        roce_frame_to(&eth(), &host4(), SPORT, 4792, &RoceMsg::send_only(QP, 0, 8)),
        vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &tcp),
        vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &dns),
        vxlan_frame(&eth(), &under6(), VXLAN_SPORT, VNI, &arp),
        vxlan_frame(
            &eth(),
            &under4(),
            VXLAN_SPORT,
            VNI,
            &roce_frame_to(&eth(), &host4(), SPORT, 4792, &RoceMsg::send_only(QP, 0, 8)),
        ),
    ];
    for f in &frames {
        h.pass(f);
    }
    assert!(h.flows().is_empty());
    assert_stats(
        &h.stats(),
        &Stats::new()
            .class(Class::OtherIp, 1)
            .class(Class::OtherUdp, 3)
            .class(Class::NonIp, 1)
            .class(Class::VxlanOther, 4),
        "non-RoCE",
    );
}

#[test]
fn vxlan_without_the_i_flag_is_bad_vxlan_flags() {
    let h = Harness::load();
    let inner = roce_frame(&eth(), &host4(), SPORT, &RoceMsg::send_only(QP, 0, 8));
    for flags in [0x00, 0x80, 0xF7] {
        let mut f = vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner);
        f[14 + 20 + 8] = flags;
        h.pass(&f);
    }
    // Other flag bits beside I do not matter.
    let mut f = vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner);
    f[14 + 20 + 8] = 0xFF;
    h.pass(&f);
    assert_eq!(h.flows().len(), 1);
    assert_stats(
        &h.stats(),
        &vxlan_stats(1, 1).reason(Reason::BadVxlanFlags, 3),
        "VXLAN flags",
    );
}

// ---------------------------------------------------------------------------------
// Truncation

/// Where each part of a frame ends, and what the classifier says when the frame stops
/// inside that part.
struct Layout {
    parts: Vec<(usize, Reason)>,
    /// Bytes the counting needs after the BTH (AETH or READ RETH), from the BTH end.
    ext_needed: usize,
    tunnelled: bool,
}

impl Layout {
    fn new(eth: &Eth, l3: &L3, m: &RoceMsg) -> Self {
        let mut parts = Vec::new();
        let mut at = ETH_HLEN;
        for _ in &eth.vlans {
            at += VLAN_HLEN;
            parts.push((at, Reason::TruncatedVlan));
        }
        at = ip_parts(&mut parts, at, l3, false);
        at += UDP_HLEN;
        parts.push((at, Reason::TruncatedUdp));
        at += bth::BTH_LEN;
        parts.push((at, Reason::TruncatedBth));
        Layout {
            parts,
            ext_needed: ext_needed(m),
            tunnelled: false,
        }
    }

    fn tunnel(eth: &Eth, outer: &L3, inner_l3: &L3, m: &RoceMsg) -> Self {
        let mut l = Layout::new(eth, outer, m);
        l.parts.pop(); // no BTH after the outer UDP header
        let mut at = l.parts.last().unwrap().0;
        at += VXLAN_HLEN;
        l.parts.push((at, Reason::TruncatedVxlan));
        at += ETH_HLEN;
        l.parts.push((at, Reason::TruncatedInnerEth));
        at = ip_parts(&mut l.parts, at, inner_l3, true);
        at += UDP_HLEN;
        l.parts.push((at, Reason::TruncatedInnerUdp));
        at += bth::BTH_LEN;
        l.parts.push((at, Reason::TruncatedInnerBth));
        l.tunnelled = true;
        l
    }

    /// What a frame cut to `len` bytes must count: a reason, or a flow (with or
    /// without its extension header).
    fn expect(&self, len: usize) -> Result<bool, Reason> {
        for &(end, reason) in &self.parts {
            if len < end {
                return Err(reason);
            }
        }
        let bth_end = self.parts.last().unwrap().0;
        Ok(len < bth_end + self.ext_needed)
    }
}

/// The parts of an IP header starting at `at`: the fixed header, then each IPv6
/// extension header (IPv4 options belong to the header). Returns where it ends.
fn ip_parts(parts: &mut Vec<(usize, Reason)>, mut at: usize, l3: &L3, inner: bool) -> usize {
    match l3 {
        L3::V4(_) => {
            at += l3.header_len();
            let r = if inner {
                Reason::TruncatedInnerIpv4
            } else {
                Reason::TruncatedIpv4
            };
            parts.push((at, r));
        }
        L3::V6(h) => {
            at += 40;
            let r = if inner {
                Reason::TruncatedInnerIpv6
            } else {
                Reason::TruncatedIpv6
            };
            parts.push((at, r));
            for e in &h.ext {
                at += e.len();
                let r = if inner {
                    Reason::TruncatedInnerIpv6Ext
                } else {
                    Reason::TruncatedIpv6Ext
                };
                parts.push((at, r));
            }
        }
    }
    at
}

/// Bytes after the BTH that counting reads: the AETH's syndrome, or a READ's DMA length.
fn ext_needed(m: &RoceMsg) -> usize {
    if bth::has_aeth(m.opcode) {
        1
    } else if m.opcode & 0x1F == 0x0C && bth::is_tracked_request(m.opcode) {
        let xrc = if m.opcode & 0xE0 == opcode::XRC { 4 } else { 0 };
        xrc + 16
    } else {
        0
    }
}

fn check_every_truncation(
    h: &mut Harness,
    f: &[u8],
    layout: &Layout,
    k: FlowKey,
    full: Counts,
    name: &str,
) {
    for len in 14..=f.len() {
        h.reset();
        let cut = &f[..len];
        h.pass(cut);
        let ctx = format!("{name}, cut at {len} of {}:\n{}", f.len(), hex(cut));
        let class = if layout.tunnelled {
            Class::RoceInVxlan
        } else {
            Class::Roce
        };
        match layout.expect(len) {
            Err(reason) => {
                assert_flows(h, &[], &ctx);
                assert_stats(&h.stats(), &Stats::new().reason(reason, 1), &ctx);
            }
            Ok(ext_cut) => {
                let mut want = full;
                want.bytes = len as u64;
                if ext_cut {
                    want.acks = 0;
                    want.naks = 0;
                    want.rnr_naks = 0;
                }
                assert_flows(h, &[(k, want)], &ctx);
                let mut stats = Stats::new().class(class, 1).created(1);
                if ext_cut {
                    stats = stats.reason(Reason::TruncatedExtHeader, 1);
                }
                assert_stats(&h.stats(), &stats, &ctx);
            }
        }
    }
}

#[test]
fn every_truncation_of_roce_in_vxlan_counts_exactly_its_reason() {
    let mut h = Harness::load();
    let cases: Vec<(Eth, L3, L3, RoceMsg)> = vec![
        (eth(), under4(), host4(), RoceMsg::read_request(QP, 5, 3000)),
        (eth(), under6(), host6(), RoceMsg::ack(QP, 5, 0x61)),
        (
            eth()
                .with_vlan(VlanTag::dot1ad(3))
                .with_vlan(VlanTag::dot1q(4)),
            under4().with_options(&[1; 8]),
            host6(),
            cnp(QP),
        ),
        (
            eth().with_vlan(VlanTag::dot1q(3)),
            under6(),
            host4().with_options(&[1; 12]),
            RoceMsg::ack(QP, 5, 0x22),
        ),
        (
            eth(),
            under4(),
            host4(),
            RoceMsg::new(opcode::XRC | 0x0C, QP, 9).with_reth(1, 2, 3),
        ),
        (eth(), under4(), host4(), RoceMsg::write_only(QP, 5, 33)),
        (
            eth(),
            under6().with_ext(routing()).with_ext(first_fragment()),
            host6().with_ext(hbh()).with_ext(dstopts()),
            RoceMsg::ack(QP, 5, 0x00),
        ),
    ];
    for (e, outer, inner_l3, m) in cases {
        let inner = roce_frame(&eth(), &inner_l3, SPORT, &m);
        let f = vxlan_frame(&e, &outer, VXLAN_SPORT, VNI, &inner);
        let mut full = one_packet(&f, outer.tos(), Some(inner_l3.tos()), SPORT);
        full.cnps = bth::is_cnp(m.opcode) as u64;
        if bth::is_acknowledge(m.opcode) {
            match bth::syndrome_class(m.syndrome) {
                bth::SyndromeClass::Ack => full.acks = 1,
                bth::SyndromeClass::Nak => full.naks = 1,
                bth::SyndromeClass::RnrNak => full.rnr_naks = 1,
                bth::SyndromeClass::Reserved => {}
            }
        }
        let layout = Layout::tunnel(&e, &outer, &inner_l3, &m);
        let k = tunnel_key(&outer, VNI, &inner_l3, QP);
        let name = format!("{} in VXLAN over {:?}", bth::opcode_name(m.opcode), outer);
        check_every_truncation(&mut h, &f, &layout, k, full, &name);
    }
}

#[test]
fn every_truncation_of_plain_roce_counts_exactly_its_reason() {
    let mut h = Harness::load();
    let cases: Vec<(Eth, L3, RoceMsg)> = vec![
        (eth(), host4(), RoceMsg::read_request(QP, 5, 3000)),
        (
            eth().with_vlan(VlanTag::dot1q(3)),
            host6(),
            RoceMsg::ack(QP, 5, 0x00),
        ),
        (
            eth(),
            host4().with_options(&[1; 40]),
            RoceMsg::send_only(QP, 5, 3),
        ),
        (
            eth(),
            host6()
                .with_ext(hbh())
                .with_ext(routing())
                .with_ext(first_fragment())
                .with_ext(dstopts()),
            RoceMsg::read_request(QP, 5, 3000),
        ),
    ];
    for (e, l3, m) in cases {
        let f = roce_frame(&e, &l3, SPORT, &m);
        let mut full = one_packet(&f, l3.tos(), None, SPORT);
        full.acks = bth::is_acknowledge(m.opcode) as u64;
        let layout = Layout::new(&e, &l3, &m);
        let name = format!("{} over {:?}", bth::opcode_name(m.opcode), l3);
        check_every_truncation(&mut h, &f, &layout, key(&l3, QP), full, &name);
    }
}

#[test]
fn frames_shorter_than_an_ethernet_header_are_refused_by_the_kernel() {
    let h = Harness::load();
    let fd = h.loaded().xdp_fd().expect("loaded");
    for len in [0, 1, 13] {
        let frame = vec![0u8; len];
        let r = roce_agent::datapath::testrun::test_run(
            fd,
            &roce_agent::datapath::testrun::TestRun {
                data: &frame,
                repeat: 1,
                ..Default::default()
            },
        );
        assert!(r.is_err(), "{len} bytes accepted");
    }
    assert_stats(&h.stats(), &Stats::new(), "nothing ran");
}

// ---------------------------------------------------------------------------------
// Declared lengths bound the datagram

/// Sets the big-endian 16-bit field at `at`.
fn set16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// The reference's verdict on one frame, as the kernel must count it.
fn reference_of(frame: &[u8]) -> ReferenceTable {
    let mut r = ReferenceTable::new(RuntimeConfig::default());
    r.process(frame, roce_tests::expect::TEST_RUN_IFINDEX, 0);
    r
}

#[test]
fn ethernet_padding_after_a_datagram_that_ends_in_its_bth_is_not_roce() {
    let h = Harness::load();
    // A minimum-size frame whose UDP datagram holds only 4 bytes of BTH: the zero
    // padding after it would complete the BTH, but it is not the datagram's.
    let mut f = roce_frame(
        &eth(),
        &host4(),
        SPORT,
        &RoceMsg::new(opcode::RC_ACKNOWLEDGE, QP, 7),
    );
    set16(&mut f, ETH_HLEN + 2, 20 + 8 + 4);
    set16(&mut f, ETH_HLEN + 20 + 4, 8 + 4);
    f.truncate(ETH_HLEN + 20 + 8 + 4);
    f.resize(60, 0);
    h.pass(&f);
    let ctx = format!("padded short datagram:\n{}", hex(&f));
    assert_flows(&h, &[], &ctx);
    assert_stats(
        &h.stats(),
        &Stats::new().reason(Reason::TruncatedBth, 1),
        &ctx,
    );
}

#[test]
fn every_length_field_bounds_the_datagram_in_the_kernel_as_in_the_reference() {
    let mut h = Harness::load();
    let ack = RoceMsg::new(opcode::RC_ACKNOWLEDGE, QP, 7);
    let inner = roce_frame(&eth(), &host4(), SPORT, &ack);
    // (name, frame, [(offset of a length field, its value)])
    let plain4 = roce_frame(&eth(), &host4(), SPORT, &ack);
    let plain6 = roce_frame(&eth(), &host6(), SPORT, &ack);
    let tunnel = vxlan_frame(&eth(), &under4(), VXLAN_SPORT, VNI, &inner);
    let l4_4 = ETH_HLEN + 20;
    let l4_6 = ETH_HLEN + 40;
    let inner_l3 = l4_4 + UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
    let fields: Vec<(&str, &[u8], usize)> = vec![
        ("ipv4 total length", &plain4, ETH_HLEN + 2),
        ("udp length (ipv4)", &plain4, l4_4 + 4),
        ("ipv6 payload length", &plain6, ETH_HLEN + 4),
        ("udp length (ipv6)", &plain6, l4_6 + 4),
        ("outer udp length", &tunnel, l4_4 + 4),
        ("inner ipv4 total length", &tunnel, inner_l3 + 2),
        ("inner udp length", &tunnel, inner_l3 + 20 + 4),
    ];
    let mut flows_seen = 0;
    let mut rejected = 0;
    for (name, frame, at) in fields {
        let real = u16::from_be_bytes([frame[at], frame[at + 1]]);
        let mut values: Vec<u16> = (0..=48).collect();
        values.extend((real.saturating_sub(20)..=real.saturating_add(4)).collect::<Vec<_>>());
        values.extend([real + 100, 1500, 9000, u16::MAX]);
        for v in values {
            let mut f = frame.to_vec();
            set16(&mut f, at, v);
            h.reset();
            h.pass(&f);
            let r = reference_of(&f);
            let ctx = format!("{name} = {v} (real {real}):\n{}", hex(&f));
            if let Err(diff) = compare_with_reference(&h.flows(), &h.stats(), &r) {
                panic!("{ctx}\n{diff}");
            }
            if r.flows.is_empty() {
                rejected += 1;
            } else {
                flows_seen += 1;
            }
            // Longer than the frame: read as far as the frame goes, same as the original.
            if v > real {
                assert_eq!(r.flows.len(), 1, "{ctx}");
            }
        }
    }
    assert!(
        flows_seen > 0 && rejected > 0,
        "{flows_seen} flows, {rejected} rejected"
    );
}
