//! Sampled events through the real programs (BPF_PROG_TEST_RUN): which packets make a
//! record, every field of it, sampling 1 in N per kind, the per-CPU rate limit, a full
//! ring, and that events never change a verdict or a byte. Then the agent's reader
//! in-process: records become `Event`s on the broadcast channel. Needs root.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use roce_common::event::{
    EventRecord, EVENTS_PER_CPU_PER_WINDOW, EVENT_CE, EVENT_CNP, EVENT_NAK, EVENT_PACKET_BYTES,
    EVENT_PSN_GAP, EVENT_RNR_NAK,
};
use roce_common::key::{FlowKey, KEY_EGRESS};
use roce_common::policy::{
    apply, IfaceQos, Policy, ECN_KERNEL, HOST_AUDIT, HOST_ENFORCE, HOST_OFF,
};
use roce_testkit::frame::{
    cnp, ip_frame, opcode, roce_frame, udp_frame, vxlan_frame, Eth, RoceMsg, L3,
};
use roce_tests::events::{EventStats, EventsHarness, EventsOptions};
use roce_tests::expect::{key, tunnel_key};
use roce_tests::tc::audit_iface;

const QP: u32 = 0x01_2345;
const SPORT: u16 = 0xC0DE;

fn eth() -> Eth {
    Eth::default()
}

fn host4(tos: u8) -> L3 {
    L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(tos)
}

fn host6(tos: u8) -> L3 {
    L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2),
    )
    .with_tos(tos)
}

fn under4(tos: u8) -> L3 {
    L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(tos)
}

/// DSCP 26 with ECN `ecn`.
fn tos(ecn: u8) -> u8 {
    (26 << 2) | ecn
}

/// An RC WRITE ONLY of 200 bytes (a frame longer than the 128 bytes an event keeps).
fn write(l3: &L3, psn: u32) -> Vec<u8> {
    roce_frame(&eth(), l3, SPORT, &RoceMsg::write_only(QP, psn, 200))
}

fn harness() -> EventsHarness {
    EventsHarness::load(EventsOptions::default())
}

fn kinds(records: &[EventRecord]) -> Vec<u8> {
    records.iter().map(|r| r.kind).collect()
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn emitted(kind: u8, n: u64) -> EventStats {
    let mut s = EventStats::default();
    s.emitted[kind as usize] = n;
    s
}

// ---------------------------------------------------------------------------------
// Which packets make an event, and what it holds

#[test]
fn a_ce_packet_yields_one_ce_record_with_every_field() {
    let mut h = harness();
    let l3 = host4(tos(3));
    let f = write(&l3, 7);
    assert!(f.len() > EVENT_PACKET_BYTES);
    let before = monotonic_ns();
    h.xdp(&f, 1);
    let after = monotonic_ns();
    let records = h.drain();
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(r.kind, EVENT_CE);
    assert!(
        (before..=after).contains(&r.ts_ns),
        "ts {} not in {before}..{after}",
        r.ts_ns
    );
    // The key as the flow counted it: loopback (the test run's device), ingress.
    assert_eq!(r.key, key(&l3, QP));
    assert!(!r.egress());
    assert_eq!(r.ifindex(), 1);
    assert_eq!(
        (r.psn, r.opcode, r.sport),
        (7, opcode::RC_WRITE_ONLY, SPORT)
    );
    assert_eq!((r.dscp(), r.ecn(), r.inner_tos), (26, 3, 0));
    assert_eq!((r.frame_len, r.sample), (f.len() as u32, 1));
    assert_eq!(r.captured as usize, EVENT_PACKET_BYTES);
    assert_eq!(r.packet(), &f[..EVENT_PACKET_BYTES]);
    assert_eq!(h.stats(), emitted(EVENT_CE, 1));
}

#[test]
fn a_short_frame_is_captured_whole() {
    let mut h = harness();
    let f = roce_frame(&eth(), &host6(tos(2)), SPORT, &cnp(QP));
    assert!(f.len() < EVENT_PACKET_BYTES);
    h.xdp(&f, 1);
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_CNP]);
    assert_eq!(records[0].captured as usize, f.len());
    assert_eq!(records[0].packet(), &f[..]);
    assert_eq!(records[0].key, key(&host6(0), QP));
}

#[test]
fn inner_ce_in_vxlan_is_one_ce_event_and_ce_in_both_headers_is_still_one() {
    let mut h = harness();
    let inner_l3 = host4(tos(3));
    let inner = write(&inner_l3, 1);
    let f = vxlan_frame(&eth(), &under4(tos(2)), 0xD00D, 5001, &inner);
    h.xdp(&f, 1);
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_CE]);
    let r = &records[0];
    assert_eq!(r.key, tunnel_key(&under4(0), 5001, &inner_l3, QP));
    assert_eq!((r.ecn(), r.inner_ecn(), r.inner_tos), (2, 3, tos(3)));
    assert_eq!(r.packet(), &f[..EVENT_PACKET_BYTES]);

    let both = vxlan_frame(&eth(), &under4(tos(3)), 0xD00D, 5001, &write(&inner_l3, 2));
    h.xdp(&both, 1);
    assert_eq!(kinds(&h.drain()), [EVENT_CE]);
    assert_eq!(h.stats(), emitted(EVENT_CE, 2));
}

#[test]
fn a_cnp_a_nak_and_an_rnr_nak_each_yield_one_record_of_their_kind() {
    let mut h = harness();
    let l3 = host4(tos(2));
    let cases = [
        (
            roce_frame(&eth(), &l3, SPORT, &cnp(QP)),
            EVENT_CNP,
            opcode::CNP,
        ),
        (
            roce_frame(&eth(), &l3, SPORT, &RoceMsg::new(opcode::CNP_ALT, QP, 0)),
            EVENT_CNP,
            opcode::CNP_ALT,
        ),
        (
            roce_frame(&eth(), &l3, SPORT, &RoceMsg::ack(QP, 9, 0x60)),
            EVENT_NAK,
            opcode::RC_ACKNOWLEDGE,
        ),
        (
            roce_frame(&eth(), &l3, SPORT, &RoceMsg::ack(QP, 9, 0x23)),
            EVENT_RNR_NAK,
            opcode::RC_ACKNOWLEDGE,
        ),
    ];
    for (f, kind, op) in &cases {
        h.xdp(f, 1);
        let records = h.drain();
        assert_eq!(kinds(&records), [*kind], "opcode {op:#04x}");
        assert_eq!(records[0].opcode, *op);
        assert_eq!(records[0].key, key(&l3, QP));
        assert_eq!(records[0].packet(), &f[..f.len().min(EVENT_PACKET_BYTES)]);
    }
    // A positive ACK is no trouble.
    h.xdp(
        &roce_frame(&eth(), &l3, SPORT, &RoceMsg::ack(QP, 9, 0x1F)),
        1,
    );
    assert!(h.drain().is_empty());
    let s = h.stats();
    assert_eq!(s.emitted, [0, 2, 1, 1, 0, 0]);
}

#[test]
fn a_psn_gap_yields_one_psn_gap_record_and_a_retransmission_none() {
    let mut h = harness();
    let l3 = host4(tos(2));
    for psn in [1, 2, 5, 3] {
        h.xdp(&write(&l3, psn), 1);
    }
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_PSN_GAP]);
    assert_eq!(records[0].psn, 5);
    assert_eq!(h.stats(), emitted(EVENT_PSN_GAP, 1));
}

#[test]
fn ce_on_a_packet_that_skips_psns_is_two_records() {
    let mut h = harness();
    h.xdp(&write(&host4(tos(2)), 10), 1);
    h.xdp(&write(&host4(tos(3)), 20), 1);
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_CE, EVENT_PSN_GAP]);
    assert!(records.iter().all(|r| r.psn == 20));
}

#[test]
fn non_roce_and_clean_roce_emit_nothing() {
    let mut h = harness();
    let ce = tos(3);
    let mut truncated = write(&host4(ce), 1);
    // Cut inside the BTH, lengths kept: a parse error, no flow, no event.
    truncated.truncate(14 + 20 + 8 + 6);
    let frames = [
        udp_frame(&eth(), &host4(ce), 40000, 5001, &[0; 64]),
        ip_frame(&eth(), &host4(ce), 6, &[0; 40]),
        vxlan_frame(
            &eth(),
            &under4(ce),
            0xD00D,
            5001,
            &udp_frame(&eth(), &host4(ce), 1, 2, &[0; 16]),
        ),
        truncated,
        // Clean RoCE: in-order PSNs, ECT(0), a positive ACK, a READ response.
        write(&host4(tos(2)), 1),
        write(&host4(tos(2)), 2),
        write(&host6(tos(1)), 1),
        roce_frame(&eth(), &host4(tos(2)), SPORT, &RoceMsg::ack(QP, 2, 0x00)),
        roce_frame(
            &eth(),
            &host4(tos(2)),
            SPORT,
            &RoceMsg::new(opcode::RC_READ_RESPONSE_ONLY, QP, 3).with_payload(64),
        ),
    ];
    for f in &frames {
        h.xdp(f, 1);
    }
    assert!(h.drain().is_empty());
    assert_eq!(h.stats(), EventStats::default());
}

#[test]
fn events_sample_zero_emits_nothing() {
    let mut h = EventsHarness::load(EventsOptions {
        sample: 0,
        ..EventsOptions::default()
    });
    h.xdp(&write(&host4(tos(3)), 1), 10);
    h.xdp(&roce_frame(&eth(), &host4(tos(3)), SPORT, &cnp(QP)), 10);
    assert!(h.drain().is_empty());
    assert_eq!(h.stats(), EventStats::default());
}

// ---------------------------------------------------------------------------------
// Sampling, rate limit, full ring

#[test]
fn one_in_ten_over_100_ce_packets_gives_10_records_per_kind() {
    let mut h = EventsHarness::load(EventsOptions {
        sample: 10,
        ..EventsOptions::default()
    });
    // The same packet 100 times: CE every time (no PSN gap: a retransmission after the
    // first), and 100 CE CNPs: 10 CE and 10 CNP events from those.
    h.xdp(&write(&host4(tos(3)), 1), 100);
    h.xdp(&roce_frame(&eth(), &host4(tos(3)), SPORT, &cnp(QP)), 100);
    let records = h.drain();
    let count = |k| records.iter().filter(|r| r.kind == k).count();
    assert_eq!((count(EVENT_CE), count(EVENT_CNP)), (20, 10));
    assert!(records.iter().all(|r| r.sample == 10));
    let s = h.stats();
    assert_eq!(s.emitted, [20, 10, 0, 0, 0, 0]);
    assert_eq!((s.rate_limit, s.ring_full), (0, 0));
}

#[test]
fn the_rate_limit_caps_a_burst_per_cpu_and_counts_the_rest_as_dropped() {
    let mut h = harness();
    // One BPF_PROG_TEST_RUN of 250 repeats: microseconds, well inside one window.
    h.xdp(&write(&host4(tos(3)), 1), 250);
    let records = h.drain();
    let limit = EVENTS_PER_CPU_PER_WINDOW as u64;
    assert_eq!(records.len() as u64, limit);
    let s = h.stats();
    assert_eq!(s.emitted[EVENT_CE as usize], limit);
    assert_eq!((s.rate_limit, s.ring_full), (250 - limit, 0));
}

#[test]
fn a_full_ring_counts_ring_full_and_takes_events_again_once_read() {
    // 16 KiB (4 pages) hold 66 records of 240 bytes + the 8-byte ring header each.
    let ring_bytes = 16 * 1024;
    let slot = (size_of::<EventRecord>() + 8).next_multiple_of(8);
    let capacity = (ring_bytes / slot) as u64;
    let mut h = EventsHarness::load(EventsOptions {
        ring_bytes: ring_bytes as u32,
        ..EventsOptions::default()
    });
    let burst = 90;
    assert!(burst > capacity && burst < EVENTS_PER_CPU_PER_WINDOW as u64);
    h.xdp(&write(&host4(tos(3)), 1), burst as u32);
    let s = h.stats();
    assert_eq!(
        (s.emitted_total(), s.ring_full, s.rate_limit),
        (capacity, burst - capacity, 0)
    );
    // The kernel's positions say the same (roce_agent_events_ring_*).
    let progress = |written, read| roce_agent::telemetry::ring_progress::Progress { written, read };
    assert_eq!(h.progress(), progress(capacity, 0));
    assert_eq!(h.drain().len() as u64, capacity);
    assert_eq!(h.progress(), progress(capacity, capacity));
    h.xdp(&write(&host4(tos(3)), 1), 1);
    assert_eq!(h.progress(), progress(capacity + 1, capacity));
    assert_eq!(h.drain().len(), 1);
    assert_eq!(h.progress(), progress(capacity + 1, capacity + 1));
}

// ---------------------------------------------------------------------------------
// Egress

fn iface(host: u8) -> IfaceQos {
    IfaceQos {
        host,
        vtep: 0,
        ecn: ECN_KERNEL,
        _pad: 0,
    }
}

#[test]
fn a_ce_packet_leaving_in_enforce_mode_is_an_egress_event_of_the_bytes_as_written() {
    let mut h = EventsHarness::load(EventsOptions {
        iface: iface(HOST_ENFORCE),
        ..EventsOptions::default()
    });
    let l3 = host4((10 << 2) | 3);
    let f = write(&l3, 4);
    let out = h.tc_egress(&f);
    let mut want = f.clone();
    apply(&mut want, &Policy::default(), &iface(HOST_ENFORCE));
    assert_eq!(out, want, "events change no byte of the policy's output");
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_CE]);
    let r = &records[0];
    assert!(r.egress());
    assert_eq!(
        r.key,
        FlowKey {
            flags: KEY_EGRESS,
            ..key(&l3, QP)
        }
    );
    assert_eq!((r.dscp(), r.ecn()), (26, 3), "the DSCP as written");
    assert_eq!(r.packet(), &out[..EVENT_PACKET_BYTES]);
    assert_eq!(r.frame_len as usize, f.len());
}

#[test]
fn audit_mode_egress_events_leave_every_byte_alone() {
    let mut h = EventsHarness::load(EventsOptions {
        iface: iface(HOST_AUDIT),
        ..EventsOptions::default()
    });
    let f = write(&host4((10 << 2) | 3), 4);
    assert_eq!(h.tc_egress(&f), f);
    let records = h.drain();
    assert_eq!(kinds(&records), [EVENT_CE]);
    assert_eq!((records[0].dscp(), records[0].packet()), (10, &f[..128]));
}

#[test]
fn no_egress_event_where_no_egress_flow_is_counted() {
    let mut h = EventsHarness::load(EventsOptions {
        iface: IfaceQos {
            vtep: 1,
            ..iface(HOST_OFF)
        },
        ..EventsOptions::default()
    });
    h.tc_egress(&write(&host4(tos(3)), 4));
    assert!(h.drain().is_empty());
}

// ---------------------------------------------------------------------------------
// The agent's reader, in-process

fn run(
    fd: std::os::fd::BorrowedFd<'_>,
    frame: &[u8],
    ctx: Option<&[u8]>,
) -> roce_agent::datapath::testrun::TestRunOutput {
    let run = roce_agent::datapath::testrun::TestRun {
        data: frame,
        repeat: 1,
        ctx_in: ctx,
        ctx_out_len: ctx.map_or(0, <[u8]>::len),
    };
    match roce_agent::datapath::testrun::test_run(fd, &run) {
        Ok(out) => out,
        Err(e) => panic!("test run: {e}"),
    }
}

#[test]
fn the_reader_needs_a_runtime_and_takes_the_ring_once() {
    let mut h = harness();
    let resolve: roce_agent::telemetry::events_reader::Resolver = Arc::new(|_| None);
    let keep = roce_agent::telemetry::events_reader::Keep::default();
    let err =
        roce_agent::telemetry::events_reader::spawn(h.loaded_mut(), resolve.clone(), keep).err();
    assert!(
        matches!(
            err,
            Some(roce_agent::telemetry::events_reader::EventsError::NoRuntime)
        ),
        "{err:?}"
    );
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    // The harness took the ring already: a reader finds none.
    let err = rt.block_on(async {
        roce_agent::telemetry::events_reader::spawn(h.loaded_mut(), resolve, keep).err()
    });
    assert!(err.is_some_and(|e| e.to_string().contains("EVENTS")));
}

#[tokio::test]
async fn the_reader_publishes_ingress_and_egress_events_on_the_broadcast() {
    roce_tests::harness::pin_to_current_cpu();
    let opts = roce_agent::datapath::loader::LoadOptions {
        config: roce_common::config::RuntimeConfig {
            events_sample: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut loaded = match roce_agent::datapath::loader::load(&opts) {
        Ok(l) => l,
        Err(e) => panic!("loading (needs root): {e}"),
    };
    if let Err(e) = loaded
        .set_policy(&Policy::default())
        .and_then(|()| loaded.set_iface_qos(1, Some(iface(HOST_ENFORCE))))
    {
        panic!("{e}");
    }
    if let Err(e) = loaded.tc_fd(roce_agent::datapath::loader::TC_EGRESS) {
        panic!("{e}");
    }
    let tx = match roce_agent::telemetry::events_reader::spawn(
        &mut loaded,
        Arc::new(roce_agent::sys::netif::name_of),
        roce_agent::telemetry::events_reader::Keep::default(),
    ) {
        Ok(spawned) => spawned.sender,
        Err(e) => panic!("spawning the reader: {e}"),
    };
    let mut rx = tx.subscribe();
    let ce = write(&host4(tos(3)), 7);
    let c = roce_frame(&eth(), &host4(tos(2)), SPORT, &cnp(QP));
    for f in [&ce, &c] {
        let fd = match loaded.xdp_fd() {
            Ok(fd) => fd,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(run(fd, f, None).retval, roce_tests::harness::XDP_PASS);
    }
    let skb = [0u8; roce_tests::tc::SKB_CTX_LEN];
    let egress = write(&host4((10 << 2) | 3), 8);
    let fd = match loaded.tc_fd(roce_agent::datapath::loader::TC_EGRESS) {
        Ok(fd) => fd,
        Err(e) => panic!("{e}"),
    };
    run(fd, &egress, Some(&skb));

    let mut events = Vec::new();
    while events.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Ok(ev)) => events.push(ev),
            Ok(Err(e)) => panic!("receiving: {e}"),
            Err(_) => panic!("only {} events within 5 s: {events:#?}", events.len()),
        }
    }
    let lo = roce_agent::sys::netif::name_of(1).unwrap_or_else(|| "if#1".to_string());
    let v: Vec<serde_json::Value> = events
        .iter()
        .map(|e| serde_json::to_value(&**e).unwrap_or_default())
        .collect();
    assert_eq!(v[0]["kind"], "ce");
    assert_eq!(v[0]["ifname"], lo.as_str());
    assert_eq!(v[0]["direction"], "ingress");
    assert_eq!(v[0]["src"], "198.19.0.1");
    assert_eq!(v[0]["dst"], "198.19.0.2");
    assert_eq!(v[0]["sport"], SPORT);
    assert_eq!(v[0]["dest_qp"], QP);
    assert_eq!(v[0]["opcode"], opcode::RC_WRITE_ONLY);
    assert_eq!(v[0]["psn"], 7);
    assert_eq!(v[0]["dscp"], 26);
    assert_eq!(v[0]["ecn"], "ce");
    assert!(v[0]["inner_ecn"].is_null() && v[0]["vni"].is_null());
    assert_eq!(v[0]["sample"], 1);
    assert_eq!(v[0]["packet_len"], ce.len());
    // The headers only (Ethernet, IPv4, UDP, BTH, RETH): none of the WRITE's payload.
    assert_eq!(events[0].packet_bytes().as_deref(), Some(&ce[..70]));
    assert!(events[0].time_unix_ns > 0);
    assert_eq!(
        (v[1]["kind"].as_str(), v[1]["opcode"].as_u64()),
        (Some("cnp"), Some(0x81))
    );
    assert_eq!(v[1]["ecn"], "ect0");
    assert_eq!(v[2]["kind"], "ce");
    assert_eq!(v[2]["direction"], "egress");
    assert_eq!(v[2]["dscp"], 26, "the DSCP enforce wrote");
    assert_eq!(v[2]["psn"], 8);
}

#[test]
fn a_round_trip_over_the_threshold_is_an_rtt_spike_on_its_response() {
    // Egress flows are counted where the host policy is on (audit here).
    let mut h = EventsHarness::load(EventsOptions {
        rtt_spike_us: 1000,
        iface: audit_iface(),
        ..EventsOptions::default()
    });
    let out = host4(0x6a);
    let back = L3::v4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1)).with_tos(0x6a);
    let request = |psn| {
        roce_frame(
            &eth(),
            &out,
            SPORT,
            &RoceMsg::send_only(0x11, psn, 64).with_ack_req(true),
        )
    };
    let ack = |psn| roce_frame(&eth(), &back, SPORT, &RoceMsg::ack(QP, psn, 0x1F));
    // Answered at once: under the threshold, no event.
    h.tc_egress(&request(1));
    h.xdp(&ack(1), 1);
    assert!(h.drain().is_empty());
    // Answered after 3 ms: a spike, on the ACK, with its round trip (a tick later: one
    // sample a tick per flow).
    std::thread::sleep(Duration::from_millis(11));
    h.tc_egress(&request(2));
    std::thread::sleep(Duration::from_millis(3));
    h.xdp(&ack(2), 1);
    let records = h.drain();
    assert_eq!(kinds(&records), [roce_common::event::EVENT_RTT_SPIKE]);
    let r = &records[0];
    assert_eq!((r.psn, r.opcode), (2, opcode::RC_ACKNOWLEDGE));
    assert_eq!(r.key, key(&back, QP));
    assert!(r.rtt_us >= 3000 && r.rtt_us < 3_000_000, "{} µs", r.rtt_us);
    assert_eq!(h.stats().emitted, [0, 0, 0, 0, 0, 1]);
}

#[test]
fn no_rtt_spike_when_the_threshold_is_zero() {
    let mut h = EventsHarness::load(EventsOptions {
        rtt_spike_us: 0,
        iface: audit_iface(),
        ..EventsOptions::default()
    });
    let out = host4(0x6a);
    let back = L3::v4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1)).with_tos(0x6a);
    h.tc_egress(&roce_frame(
        &eth(),
        &out,
        SPORT,
        &RoceMsg::send_only(0x11, 5, 64).with_ack_req(true),
    ));
    std::thread::sleep(Duration::from_millis(2));
    h.xdp(
        &roce_frame(&eth(), &back, SPORT, &RoceMsg::ack(QP, 5, 0x1F)),
        1,
    );
    assert!(h.drain().is_empty());
    assert_eq!(h.stats().emitted, [0; 6]);
}
