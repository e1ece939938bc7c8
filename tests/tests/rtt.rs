//! Passive round trips through the real programs (BPF_PROG_TEST_RUN): a request
//! leaving through `tc_egress` starts a sample, the response arriving in
//! `xdp_classify` with its PSN ends it, and the sample lands in RTT_HIST under the
//! response flow's slot (`roce_common::rtt`). Which requests start one, which
//! responses end one, Karn's rule, and that the responder's host (requests in XDP,
//! responses out through tc) measures nothing. Needs root.

use std::net::Ipv4Addr;
use std::time::Duration;

use roce_common::key::{FlowKey, KEY_EGRESS};
use roce_common::policy::Policy;
use roce_common::rtt::RttHist;
use roce_testkit::frame::{roce_frame, Eth, RoceMsg, L3};
use roce_tests::expect::key;
use roce_tests::harness::XDP_PASS;
use roce_tests::tc::{audit_iface, TcHarness, TC_NEXT};

const SPORT: u16 = 0xC0DE;
const RESPONDER_QP: u32 = 0x11;
const REQUESTER_QP: u32 = 0x22;
const ACK: u8 = 0x1F;
const NAK_PSN_SEQ_ERR: u8 = 0x60;

fn requests4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106)
}

fn responses4() -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1)).with_tos(106)
}

fn request(msg: RoceMsg) -> Vec<u8> {
    roce_frame(&Eth::default(), &requests4(), SPORT, &msg)
}

fn response(msg: RoceMsg) -> Vec<u8> {
    roce_frame(&Eth::default(), &responses4(), SPORT, &msg)
}

/// A SEND ONLY at `psn`, asking for an ACK or not.
fn send(psn: u32, ack_req: bool) -> Vec<u8> {
    request(RoceMsg::send_only(RESPONDER_QP, psn, 256).with_ack_req(ack_req))
}

fn ack(psn: u32, syndrome: u8) -> Vec<u8> {
    response(RoceMsg::ack(REQUESTER_QP, psn, syndrome))
}

fn load() -> TcHarness {
    TcHarness::load(&Policy::default(), audit_iface())
}

/// A flow starts at most one sample a tick of the kernel's coarse clock (10 ms at
/// HZ=100, the coarsest): waits past one.
fn next_tick() {
    std::thread::sleep(Duration::from_millis(11));
}

fn out(h: &mut TcHarness, frame: &[u8]) {
    assert_eq!(h.egress(frame, 0).retval, TC_NEXT);
}

fn arrive(h: &mut TcHarness, frame: &[u8]) {
    assert_eq!(h.xdp(frame), XDP_PASS);
}

/// The round trips of the flow `k` (None: no histogram).
fn hist(h: &mut TcHarness, k: &FlowKey) -> Option<RttHist> {
    let loaded = h.loaded_mut();
    let index = match loaded.flow_index(k) {
        Ok(Some(i)) => i,
        Ok(None) => panic!("no flow {k:?}"),
        Err(e) => panic!("reading the flow tables: {e}"),
    };
    match loaded.rtt_hists() {
        Ok(m) => m.get(&index).copied(),
        Err(e) => panic!("reading RTT_HIST: {e}"),
    }
}

fn acks_flow() -> FlowKey {
    key(&responses4(), REQUESTER_QP)
}

fn requests_flow() -> FlowKey {
    FlowKey {
        flags: KEY_EGRESS,
        ..key(&requests4(), RESPONDER_QP)
    }
}

#[test]
fn an_ack_of_the_sampled_psn_ends_the_sample_on_the_ack_flow() {
    let mut h = load();
    // No AckReq: no sample; the ACK of PSN 1 ends nothing.
    out(&mut h, &send(1, false));
    arrive(&mut h, &ack(1, ACK));
    assert_eq!(hist(&mut h, &acks_flow()), None);
    // AckReq: PSN 2 sampled, 3 not (one outstanding), the ACK of 2 ends it after the
    // time slept, then 4 starts the next (a tick later: one sample a tick per flow).
    out(&mut h, &send(2, true));
    out(&mut h, &send(3, true));
    std::thread::sleep(Duration::from_millis(2));
    arrive(&mut h, &ack(300, ACK));
    assert_eq!(
        hist(&mut h, &acks_flow()),
        None,
        "ACK 300 answers no sample"
    );
    arrive(&mut h, &ack(3, ACK));
    assert_eq!(hist(&mut h, &acks_flow()), None, "ACK 3 answers no sample");
    arrive(&mut h, &ack(2, ACK));
    let one = hist(&mut h, &acks_flow()).expect("a histogram after ACK 2");
    assert_eq!(one.samples, 1);
    assert!(one.min_ns >= 2_000_000, "slept 2 ms: {} ns", one.min_ns);
    assert!(one.min_ns < 2_000_000_000, "{} ns", one.min_ns);
    assert_eq!(one.buckets.iter().map(|&b| u64::from(b)).sum::<u64>(), 1);
    next_tick();
    out(&mut h, &send(4, true));
    arrive(&mut h, &ack(4, ACK));
    arrive(&mut h, &ack(4, ACK));
    let two = hist(&mut h, &acks_flow()).expect("a histogram");
    assert_eq!(two.samples, 2);
    assert!(two.min_ns < one.min_ns, "no sleep before ACK 4");
    // The request flow has none: samples land where the responses travel.
    assert_eq!(hist(&mut h, &requests_flow()), None);
}

#[test]
fn a_read_is_answered_by_its_first_response_and_an_atomic_by_its_ack() {
    let mut h = load();
    // READ of 3 PMTUs at PSN 10 (no AckReq bit needed): responses 10, 11, 12.
    out(
        &mut h,
        &request(RoceMsg::read_request(RESPONDER_QP, 10, 3 * 4096)),
    );
    arrive(
        &mut h,
        &response(RoceMsg::new(0x0D, REQUESTER_QP, 10).with_payload(4096)),
    );
    arrive(
        &mut h,
        &response(RoceMsg::new(0x0E, REQUESTER_QP, 11).with_payload(4096)),
    );
    arrive(
        &mut h,
        &response(RoceMsg::new(0x0F, REQUESTER_QP, 12).with_payload(4096)),
    );
    assert_eq!(hist(&mut h, &acks_flow()).map(|x| x.samples), Some(1));
    next_tick();
    // FETCH_ADD at PSN 13, its ATOMIC ACKNOWLEDGE.
    out(&mut h, &request(RoceMsg::new(0x14, RESPONDER_QP, 13)));
    arrive(&mut h, &response(RoceMsg::new(0x12, REQUESTER_QP, 13)));
    assert_eq!(hist(&mut h, &acks_flow()).map(|x| x.samples), Some(2));
}

#[test]
fn karns_rule_a_resent_request_voids_its_sample() {
    let mut h = load();
    out(&mut h, &send(5, true));
    // NAK of 5 and the go-back: the ACK of 5 may answer either copy.
    arrive(&mut h, &ack(5, NAK_PSN_SEQ_ERR));
    out(&mut h, &send(5, true));
    arrive(&mut h, &ack(5, ACK));
    assert_eq!(hist(&mut h, &acks_flow()), None);
    // The resend itself started no sample either (a retransmission); the next new
    // request does, a tick later.
    next_tick();
    out(&mut h, &send(6, true));
    arrive(&mut h, &ack(6, ACK));
    assert_eq!(hist(&mut h, &acks_flow()).map(|x| x.samples), Some(1));
}

#[test]
fn the_responders_host_measures_no_round_trip() {
    let mut h = load();
    // Requests arrive (XDP), ACKs leave (tc): the responder's turnaround, no round trip.
    for psn in 1..=4 {
        arrive(&mut h, &send(psn, true));
        out(&mut h, &ack(psn, ACK));
    }
    let acks_out = FlowKey {
        flags: KEY_EGRESS,
        ..acks_flow()
    };
    assert_eq!(hist(&mut h, &acks_out), None);
    assert_eq!(hist(&mut h, &key(&requests4(), RESPONDER_QP)), None);
}

#[test]
fn a_flow_given_back_forgets_its_round_trips() {
    let mut h = load();
    out(&mut h, &send(7, true));
    arrive(&mut h, &ack(7, ACK));
    assert!(hist(&mut h, &acks_flow()).is_some());
    h.reset();
    match h.loaded_mut().rtt_hists() {
        Ok(m) => assert!(
            m.is_empty(),
            "RTT_HIST after the slots were given back: {m:?}"
        ),
        Err(e) => panic!("reading RTT_HIST: {e}"),
    }
}

/// The `counters.rtt_unpaired` STATS: (shared_psn, other_qp).
fn unpaired(h: &TcHarness) -> (u64, u64) {
    use roce_common::counters::{STAT_RTT_OTHER_QP, STAT_RTT_SHARED_PSN};
    let stats = h.stats();
    (
        stats[STAT_RTT_SHARED_PSN as usize],
        stats[STAT_RTT_OTHER_QP as usize],
    )
}

#[test]
fn two_queue_pairs_sampling_one_psn_take_one_sample_and_count_the_other() {
    let mut h = load();
    let to = |qp: u32| request(RoceMsg::send_only(qp, 50, 256).with_ack_req(true));
    out(&mut h, &to(RESPONDER_QP));
    out(&mut h, &to(RESPONDER_QP + 1));
    assert_eq!(
        unpaired(&h),
        (1, 0),
        "the second QP's PSN 50 is not sampled"
    );
    // One ACK of PSN 50 ends the one sample; the other QP's ends nothing.
    arrive(&mut h, &ack(50, ACK));
    arrive(&mut h, &response(RoceMsg::ack(REQUESTER_QP + 1, 50, ACK)));
    assert_eq!(hist(&mut h, &acks_flow()).map(|r| r.samples), Some(1));
    assert_eq!(
        hist(&mut h, &key(&responses4(), REQUESTER_QP + 1)),
        None,
        "nothing waited for the other QP's ACK"
    );
    assert_eq!(unpaired(&h), (1, 0));
}

#[test]
fn a_request_flow_answers_to_one_qp_and_a_coincident_psn_of_another_ends_nothing() {
    let mut h = load();
    // The first sample pairs the request flow with the QP its ACK went to.
    out(&mut h, &send(60, true));
    arrive(&mut h, &ack(60, ACK));
    next_tick();
    out(&mut h, &send(61, true));
    // Another QP between the same hosts acknowledges its own PSN 61: not this flow's.
    let other = key(&responses4(), REQUESTER_QP + 1);
    arrive(&mut h, &response(RoceMsg::ack(REQUESTER_QP + 1, 61, ACK)));
    assert_eq!(unpaired(&h), (0, 1));
    assert_eq!(hist(&mut h, &other), None);
    // The sample waited on: its own ACK ends it.
    arrive(&mut h, &ack(61, ACK));
    assert_eq!(hist(&mut h, &acks_flow()).map(|r| r.samples), Some(2));
    assert_eq!(unpaired(&h), (0, 1));
}
