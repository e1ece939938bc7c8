//! Retransmissions and the timeouts behind them, through the real programs
//! (BPF_PROG_TEST_RUN): `retransmitted_packets` and `retransmitted_bytes` count the
//! requests whose PSN is behind the flow's expected one, `retransmit_timeouts` the
//! go-backs that no NAK or RNR NAK of their PSN between the two hosts asked for
//! (`roce_common::nak`). A NAK and its go-back meet in NAK_PSNS, whichever program saw
//! each: on the requester's host the NAK arrives (XDP) and the go-back leaves (tc); on
//! the responder's the other way round. Exact counts, and the reference agrees. Needs
//! root.

use std::net::{Ipv4Addr, Ipv6Addr};

use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, KEY_EGRESS};
use roce_common::policy::Policy;
use roce_common::reference::ReferenceTable;
use roce_testkit::frame::{roce_frame, vxlan_frame, Eth, RoceMsg, L3};
use roce_tests::expect::{compare_with_reference, key, tunnel_key};
use roce_tests::harness::{Harness, XDP_PASS};
use roce_tests::tc::{audit_iface, TcHarness, TC_NEXT, TEST_RUN_IFINDEX};

const SPORT: u16 = 0xC0DE;
/// The responder's QP (the requests' destination) and the requester's (the ACKs').
const RESPONDER_QP: u32 = 0x11;
const REQUESTER_QP: u32 = 0x22;
const NAK_PSN_SEQ_ERR: u8 = 0x60;
const RNR_NAK: u8 = 0x2E;

/// Requester 198.19.0.1, responder 198.19.0.2.
fn requests4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106)
}

fn responses4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1)).with_tos(106)
}

fn send(psn: u32) -> Vec<u8> {
    roce_frame(
        &Eth::default(),
        &requests4(),
        SPORT,
        &RoceMsg::send_only(RESPONDER_QP, psn, 1000),
    )
}

fn nak(psn: u32, syndrome: u8) -> Vec<u8> {
    roce_frame(
        &Eth::default(),
        &responses4(),
        SPORT,
        &RoceMsg::ack(REQUESTER_QP, psn, syndrome),
    )
}

/// (retransmitted packets, retransmitted bytes, timeouts, PSN gaps) of a flow.
fn loss(s: &FlowStats) -> (u64, u64, u64, u64) {
    (
        s.retransmitted_packets,
        s.retransmitted_bytes,
        s.retransmit_timeouts,
        s.psn_gaps,
    )
}

/// Runs `frames` through `xdp_classify` and the reference; the table must agree.
fn xdp_run(frames: &[Vec<u8>]) -> Harness {
    let h = Harness::load();
    let mut reference = ReferenceTable::new(Default::default());
    for f in frames {
        h.pass(f);
        reference.process(f, TEST_RUN_IFINDEX, 0);
    }
    if let Err(e) = compare_with_reference(&h.flows(), &h.stats(), &reference) {
        panic!("kernel and reference differ: {e}");
    }
    h
}

fn flow_of(h: &Harness, k: &FlowKey) -> FlowStats {
    match h.flows().get(k) {
        Some(s) => *s,
        None => panic!("no flow {k:?} in {:#?}", h.flows()),
    }
}

#[test]
fn a_go_back_after_silence_is_a_timeout_and_after_a_nak_or_rnr_nak_is_not() {
    let len = send(0).len() as u64;
    let requests = key(&requests4(), RESPONDER_QP);
    // 1..=4 sent, no answer, the requester goes back to 3: 3 and 4 again.
    let h = xdp_run(&[
        send(1),
        send(2),
        send(3),
        send(4),
        send(3),
        send(4),
        send(5),
    ]);
    assert_eq!(loss(&flow_of(&h, &requests)), (2, 2 * len, 1, 0));
    // 3 lost: 4 arrives, the responder NAKs 3 (sequence error), the requester goes
    // back to 3. The NAK travels on the other flow; no timeout. An RNR NAK alike.
    for syndrome in [NAK_PSN_SEQ_ERR, RNR_NAK] {
        let h = xdp_run(&[
            send(1),
            send(2),
            send(4),
            nak(3, syndrome),
            send(3),
            send(4),
            send(5),
        ]);
        assert_eq!(
            loss(&flow_of(&h, &requests)),
            (2, 2 * len, 0, 1),
            "syndrome {syndrome:#x}"
        );
        let back = flow_of(&h, &key(&responses4(), REQUESTER_QP));
        assert_eq!(back.naks + back.rnr_naks, 1);
        assert_eq!(loss(&back), (0, 0, 0, 0), "a NAK is no request");
    }
}

#[test]
fn one_nak_answers_one_go_back_and_only_to_its_psn() {
    let len = send(0).len() as u64;
    let requests = key(&requests4(), RESPONDER_QP);
    let h = xdp_run(&[
        send(1),
        send(2),
        send(3),
        nak(2, NAK_PSN_SEQ_ERR),
        // The go-back the NAK asked for,
        send(2),
        send(3),
        // then, that resend lost too, the requester's timeout: back to 2 again.
        send(2),
        send(3),
        send(4),
        // A NAK of 4 does not answer a go-back to 3.
        nak(4, NAK_PSN_SEQ_ERR),
        send(3),
        send(4),
        send(5),
    ]);
    assert_eq!(loss(&flow_of(&h, &requests)), (6, 6 * len, 2, 0));
}

#[test]
fn another_queue_pair_between_the_same_hosts_takes_no_nak_of_its_neighbour() {
    // Two QPs between the same hosts, PSN spaces far apart (as rdma_cm picks them at
    // random): the NAK of QP 0x11's PSN 3 answers QP 0x11's go-back, not QP 0x33's
    // go-back to its own PSN 0x5003.
    let other = |psn| {
        roce_frame(
            &Eth::default(),
            &requests4(),
            SPORT,
            &RoceMsg::send_only(0x33, psn, 1000),
        )
    };
    let h = xdp_run(&[
        send(1),
        send(2),
        other(0x5001),
        other(0x5002),
        send(4),
        nak(3, NAK_PSN_SEQ_ERR),
        other(0x5001),
        send(3),
        send(4),
    ]);
    let a = flow_of(&h, &key(&requests4(), RESPONDER_QP));
    let b = flow_of(&h, &key(&requests4(), 0x33));
    assert_eq!((a.retransmitted_packets, a.retransmit_timeouts), (2, 0));
    assert_eq!((b.retransmitted_packets, b.retransmit_timeouts), (1, 1));
}

#[test]
fn read_requests_use_their_psns_and_a_read_re_issued_within_them_is_resent() {
    // READs of 8192 bytes at the default path MTU (4096) take 2 PSNs each: 10-11,
    // 12-13, so the SEND after them is 14, in order. Then the requester re-issues the
    // second READ from its last PSN (13), that response lost, and sends 14 again: two
    // retransmissions, one go-back that no NAK asked for, no gap.
    let read = |psn, len| {
        roce_frame(
            &Eth::default(),
            &requests4(),
            SPORT,
            &RoceMsg::new(0x0c, RESPONDER_QP, psn).with_reth(0x1000, 0x100, len),
        )
    };
    let h = xdp_run(&[
        read(10, 8192),
        read(12, 8192),
        send(14),
        read(13, 4096),
        send(14),
        send(15),
    ]);
    let s = flow_of(&h, &key(&requests4(), RESPONDER_QP));
    assert_eq!(
        (
            s.retransmitted_packets,
            s.retransmit_timeouts,
            s.psn_gaps,
            s.packets
        ),
        (2, 1, 0, 6)
    );
}

#[test]
fn tunnelled_and_ipv6_flows_pair_their_naks_too() {
    let outer = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
    let outer_back = L3::v4(Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1));
    let in_vxlan = |outer: &L3, inner: &L3, m: &RoceMsg| {
        let inner_frame = roce_frame(&Eth::default(), inner, SPORT, m);
        vxlan_frame(&Eth::default(), outer, 0xD00D, 5001, &inner_frame)
    };
    let req = |psn| {
        in_vxlan(
            &outer,
            &requests4(),
            &RoceMsg::send_only(RESPONDER_QP, psn, 100),
        )
    };
    let h = xdp_run(&[
        req(1),
        req(3),
        in_vxlan(
            &outer_back,
            &responses4(),
            &RoceMsg::ack(REQUESTER_QP, 2, NAK_PSN_SEQ_ERR),
        ),
        req(2),
        req(3),
    ]);
    let s = flow_of(&h, &tunnel_key(&outer, 5001, &requests4(), RESPONDER_QP));
    assert_eq!((s.retransmitted_packets, s.retransmit_timeouts), (2, 0));

    let (a, b) = (
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2),
    );
    let fwd = L3::v6(a, b);
    let h = xdp_run(&[
        roce_frame(&Eth::default(), &fwd, SPORT, &RoceMsg::send_only(7, 1, 64)),
        roce_frame(&Eth::default(), &fwd, SPORT, &RoceMsg::send_only(7, 3, 64)),
        roce_frame(
            &Eth::default(),
            &L3::v6(b, a),
            SPORT,
            &RoceMsg::ack(8, 2, RNR_NAK),
        ),
        roce_frame(&Eth::default(), &fwd, SPORT, &RoceMsg::send_only(7, 2, 64)),
    ]);
    let s = flow_of(&h, &key(&fwd, 7));
    assert_eq!((s.retransmitted_packets, s.retransmit_timeouts), (1, 0));
}

fn egress_key(k: FlowKey) -> FlowKey {
    FlowKey {
        flags: k.flags | KEY_EGRESS,
        ..k
    }
}

#[test]
fn on_the_requesters_host_the_nak_arrives_in_xdp_and_its_go_back_leaves_through_tc() {
    let mut h = TcHarness::load(&Policy::default(), audit_iface());
    let len = send(0).len() as u64;
    let out = |h: &mut TcHarness, psn| {
        let o = h.egress(&send(psn), 0);
        assert_eq!(o.retval, TC_NEXT);
    };
    for psn in [1, 2, 3, 4] {
        out(&mut h, psn);
    }
    assert_eq!(h.xdp(&nak(2, NAK_PSN_SEQ_ERR)), XDP_PASS);
    for psn in [2, 3, 4, 5] {
        out(&mut h, psn);
    }
    // Silence, then the timeout: back to 5.
    out(&mut h, 5);
    let flows = h.flows();
    let requests = egress_key(key(&requests4(), RESPONDER_QP));
    let s = match flows.get(&requests) {
        Some(s) => *s,
        None => panic!("no egress flow {requests:?}: {flows:#?}"),
    };
    assert_eq!(loss(&s), (4, 4 * len, 1, 0));
    let back = flows.get(&key(&responses4(), REQUESTER_QP)).map(|s| s.naks);
    assert_eq!(back, Some(1), "the NAK counted on ingress: {flows:#?}");
}

#[test]
fn on_the_responders_host_the_nak_leaves_through_tc_and_its_go_back_arrives_in_xdp() {
    let mut h = TcHarness::load(&Policy::default(), audit_iface());
    for psn in [1, 2, 4] {
        assert_eq!(h.xdp(&send(psn)), XDP_PASS);
    }
    assert_eq!(h.egress(&nak(3, NAK_PSN_SEQ_ERR), 0).retval, TC_NEXT);
    for psn in [3, 4, 5] {
        assert_eq!(h.xdp(&send(psn)), XDP_PASS);
    }
    let flows = h.flows();
    let s = flows[&key(&requests4(), RESPONDER_QP)];
    assert_eq!(
        (s.retransmitted_packets, s.retransmit_timeouts, s.psn_gaps),
        (2, 0, 1)
    );
    assert_eq!(flows[&egress_key(key(&responses4(), REQUESTER_QP))].naks, 1);
}
