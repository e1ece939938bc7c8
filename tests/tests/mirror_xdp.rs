//! `xdp_mirror`, the XDP program of mirror collector interfaces, through
//! BPF_PROG_TEST_RUN: GRE and ERSPAN II/III copies of RoCE frames counted on the
//! mirrored flows with their session and sender and their original length (truncated
//! copies included), exact STATS for every copy that holds no RoCE, and
//! `xdp_classify` (no --mirror) leaving the same copies `other_ip` as it always did.

use std::net::{Ipv4Addr, Ipv6Addr};

use roce_common::classify::classify;
use roce_common::config::RuntimeConfig;
use roce_common::counters::{class_index, reason_index, STAT_FLOW_CREATED};
use roce_common::key::{addr_v4_mapped, FlowKey, FlowKeyMirror, KEY_MIRROR, KEY_OUTER_V6};
use roce_common::mirror::{
    MirrorTag, MIRROR_ERSPAN2, MIRROR_ERSPAN3, MIRROR_GRE, MIRROR_SOURCE_V6,
};
use roce_common::packet::SlicePacket;
use roce_common::parsed::{Class, Outcome, Reason};
use roce_testkit::frame::{roce_frame, Eth, RoceMsg, L3};
use roce_testkit::mirror::{mirror_frame, truncated_copy, Encap};
use roce_tests::harness::Harness;

/// BPF_PROG_TEST_RUN's ifindex: the loopback device.
const IFINDEX: u32 = 1;

fn sender4() -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 9, 1)
}

fn sender6() -> Ipv6Addr {
    "2001:db8:9::1".parse().unwrap()
}

fn outer(v6: bool) -> L3 {
    if v6 {
        L3::v6(sender6(), "2001:db8:9::2".parse().unwrap())
    } else {
        L3::v4(sender4(), Ipv4Addr::new(198, 18, 9, 2))
    }
}

fn words6(a: Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    std::array::from_fn(|w| {
        u32::from_ne_bytes([o[4 * w], o[4 * w + 1], o[4 * w + 2], o[4 * w + 3]])
    })
}

fn tag(v6: bool, kind: u32, session: u32) -> MirrorTag {
    if v6 {
        MirrorTag {
            source: words6(sender6()),
            session,
            kind: kind | MIRROR_SOURCE_V6,
        }
    } else {
        MirrorTag {
            source: addr_v4_mapped(u32::from_ne_bytes(sender4().octets())),
            session,
            kind,
        }
    }
}

/// A RoCE RDMA WRITE of `payload` bytes from 198.18.0.1 (or 2001:db8::1) to QP `qp`.
fn roce(v6: bool, qp: u32, payload: usize) -> Vec<u8> {
    let l3 = if v6 {
        L3::v6(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        )
    } else {
        L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2))
    }
    .with_tos(0x6A);
    roce_frame(
        &Eth::default(),
        &l3,
        49152,
        &RoceMsg::write_only(qp, 7, payload),
    )
}

#[test]
fn copies_count_on_the_mirrored_flow_with_session_sender_and_original_length() {
    let h = Harness::load_mirror();
    let eth = Eth::default();
    let mut want: Vec<(FlowKeyMirror, u64, u64)> = Vec::new();
    let mut qp = 0x100;
    for outer_v6 in [false, true] {
        for (encap, kind, session) in [
            (
                Encap::Gre {
                    key: None,
                    seq: None,
                    csum: false,
                },
                MIRROR_GRE,
                0,
            ),
            (
                Encap::Gre {
                    key: Some(0xA1B2_C3D4),
                    seq: Some(9),
                    csum: true,
                },
                MIRROR_GRE,
                0xA1B2_C3D4,
            ),
            (Encap::erspan2(0x3FF), MIRROR_ERSPAN2, 0x3FF),
            (Encap::erspan3(17), MIRROR_ERSPAN3, 17),
            (
                Encap::Erspan3 {
                    session: 18,
                    truncated: false,
                    ft: 0,
                    platform: true,
                    seq: 3,
                },
                MIRROR_ERSPAN3,
                18,
            ),
        ] {
            for inner_v6 in [false, true] {
                qp += 1;
                let m = roce(inner_v6, qp, 256);
                let copy = mirror_frame(&eth, &outer(outer_v6), &encap, &m);
                for _ in 0..3 {
                    h.pass(&copy);
                }
                // Each copy also truncated at 128 bytes: counted with its original length.
                let cut = truncated_copy(&eth, &outer(outer_v6), &encap, &m, 128);
                h.pass(&cut);
                let Outcome::Flow(parsed) = classify(&SlicePacket(&m), &RuntimeConfig::default())
                else {
                    panic!("the mirrored frame is RoCE");
                };
                let mut key = parsed.key;
                key.flags |= KEY_MIRROR;
                key.ifindex = IFINDEX;
                assert_eq!(key.flags & KEY_OUTER_V6 != 0, inner_v6);
                want.push((
                    FlowKeyMirror {
                        key,
                        tag: tag(outer_v6, kind, session),
                    },
                    4,
                    4 * m.len() as u64,
                ));
            }
        }
    }
    let flows = h.mirrored_flows();
    let got: Vec<(FlowKeyMirror, u64, u64)> = flows
        .iter()
        .map(|(k, s)| (*k, s.packets, s.bytes))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert!(h.flows().is_empty(), "no plain flow");
    let stats = h.stats();
    assert_eq!(
        stats[class_index(Class::Roce) as usize],
        4 * want.len() as u64
    );
    assert_eq!(stats[STAT_FLOW_CREATED as usize], want.len() as u64);
}

#[test]
fn truncated_copies_count_their_original_length_at_64_128_and_256_bytes() {
    let mut h = Harness::load_mirror();
    let eth = Eth::default();
    for inner_v6 in [false, true] {
        for encap in [Encap::erspan2(5), Encap::erspan3(6)] {
            h.reset();
            // A 1,000-byte write: the switch keeps 64, 128 or 256 bytes of it.
            let m = roce(inner_v6, 0x42, 1000);
            let mut kept_bth = 0;
            for keep in [64, 128, 256] {
                let cut = truncated_copy(&eth, &outer(false), &encap, &m, keep);
                h.pass(&cut);
                // The BTH ends at 54 (IPv4) or 74 (IPv6): inside what was kept, a flow.
                if (if inner_v6 { 74 } else { 54 }) <= keep {
                    kept_bth += 1;
                }
            }
            let flows = h.mirrored_flows();
            let (_, st) = flows.iter().next().expect("the mirrored flow");
            assert_eq!(flows.len(), 1);
            assert_eq!(
                (st.packets, st.bytes),
                (kept_bth, kept_bth * m.len() as u64)
            );
            let stats = h.stats();
            assert_eq!(stats[class_index(Class::Roce) as usize], kept_bth);
            assert_eq!(
                stats[class_index(Class::MirrorTruncated) as usize],
                3 - kept_bth
            );
            assert!(
                roce_common::parsed::REASON_NAMES
                    .iter()
                    .enumerate()
                    .all(|(i, _)| stats[reason_index(Reason::TruncatedEth) as usize + i] == 0),
                "a truncated copy is no parse error: {stats:?}"
            );
        }
    }
}

#[test]
fn copies_that_hold_no_roce_count_where_their_walk_ends() {
    let mut h = Harness::load_mirror();
    let eth = Eth::default();
    let m = roce(false, 0x42, 64);
    let arp = {
        let mut a = m.clone();
        a[12..14].copy_from_slice(&[0x08, 0x06]);
        a
    };
    let ft2 = Encap::Erspan3 {
        session: 1,
        truncated: false,
        ft: 2,
        platform: false,
        seq: 1,
    };
    let cases: Vec<(Vec<u8>, Result<Class, Reason>)> = vec![
        (
            mirror_frame(&eth, &outer(false), &ft2, &m),
            Ok(Class::MirrorOther),
        ),
        (
            mirror_frame(&eth, &outer(true), &Encap::gre(3), &arp),
            Ok(Class::MirrorOther),
        ),
        // ERSPAN type I: 0x88BE without S.
        (
            {
                let mut f = mirror_frame(&eth, &outer(false), &Encap::erspan2(1), &m);
                f[34] = 0; // GRE flags: S cleared; the sequence number becomes the "frame"
                f
            },
            Ok(Class::MirrorOther),
        ),
        (
            {
                let mut f = mirror_frame(&eth, &outer(false), &Encap::erspan2(1), &m);
                f[42] = 0x20; // ERSPAN version 2 under 0x88BE
                f
            },
            Err(Reason::BadErspanVersion),
        ),
        (
            {
                let f = mirror_frame(&eth, &outer(false), &Encap::erspan3(1), &m);
                let mut cut = f[..34 + 8 + 6].to_vec();
                let total = (cut.len() - 14) as u16;
                cut[16..18].copy_from_slice(&total.to_be_bytes());
                cut
            },
            Err(Reason::TruncatedErspan),
        ),
        (
            {
                let f = mirror_frame(&eth, &outer(false), &Encap::gre(1), &m);
                let mut cut = f[..34 + 6].to_vec();
                let total = (cut.len() - 14) as u16;
                cut[16..18].copy_from_slice(&total.to_be_bytes());
                cut
            },
            Err(Reason::TruncatedGre),
        ),
        (
            truncated_copy(&eth, &outer(false), &Encap::erspan2(1), &m, 40),
            Ok(Class::MirrorTruncated),
        ),
        // Less than an Ethernet header of the mirrored frame left.
        (
            truncated_copy(&eth, &outer(false), &Encap::erspan2(1), &m, 5),
            Ok(Class::MirrorTruncated),
        ),
    ];
    for (frame, want) in &cases {
        h.reset();
        h.pass(frame);
        let mut expected = roce_tests::expect::Stats::new();
        expected = match want {
            Ok(c) => expected.class(*c, 1),
            Err(r) => expected.reason(*r, 1),
        };
        assert_eq!(h.stats(), expected.0, "{want:?}");
        assert!(h.flows().is_empty(), "{want:?}");
    }
}

#[test]
fn plain_roce_on_a_mirror_interface_is_the_flow_it_always_is() {
    let h = Harness::load_mirror();
    let m = roce(false, 0x77, 100);
    h.pass(&m);
    let flows = h.flows();
    let (k, st) = flows.iter().next().expect("one flow");
    assert_eq!(flows.len(), 1);
    assert_eq!(k.flags, 0);
    assert_eq!((st.packets, st.bytes), (1, m.len() as u64));
    assert!(h.mirrored_flows().is_empty());
}

#[test]
fn without_mirror_decapsulation_copies_stay_other_ip() {
    let h = Harness::load();
    let eth = Eth::default();
    let m = roce(false, 0x42, 64);
    for encap in [Encap::gre(1), Encap::erspan2(2), Encap::erspan3(3)] {
        h.pass(&mirror_frame(&eth, &outer(false), &encap, &m));
    }
    assert!(h.flows().is_empty());
    assert_eq!(
        h.stats(),
        roce_tests::expect::Stats::new().class(Class::OtherIp, 3).0
    );
}

#[test]
fn the_mirror_programs_verify_well_inside_the_limit() {
    let h = Harness::load_mirror();
    let mut report = Vec::new();
    for name in [
        "xdp_classify",
        "xdp_count",
        "xdp_mirror",
        "xdp_mirror_flows",
        "xdp_count_mirror",
    ] {
        let n = h
            .loaded()
            .verified_insns(name)
            .expect("program info")
            .expect("verified_insns (Linux 5.16+)");
        report.push(format!("{name} {n}"));
        // The limit is 1,000,000 processed instructions: keep room for older
        // verifiers, which prune less.
        assert!(n < 500_000, "{name}: {n} instructions verified");
    }
    println!("verified instructions: {}", report.join(", "));
}

#[test]
fn mirrored_flows_are_evicted_by_their_key_and_session_and_come_back_as_new_flows() {
    use roce_common::counters::STAT_FLOW_CREATED;
    let mut h = Harness::load_mirror_with(&roce_agent::datapath::loader::LoadOptions {
        flows_max_entries: 64,
        ..Default::default()
    });
    let eth = Eth::default();
    let copy = |qp: u32, session: u16| {
        mirror_frame(
            &eth,
            &outer(false),
            &Encap::erspan2(session),
            &roce(false, qp, 16),
        )
    };
    // 31 flows in two sessions each (the same packets: only the session tells them
    // apart): 62 of 64 slots taken; then one of them again, a few ticks later.
    for qp in 1..=31 {
        h.pass(&copy(qp, 1));
        h.pass(&copy(qp, 2));
    }
    assert_eq!(h.mirrored_flows().len(), 62);
    std::thread::sleep(std::time::Duration::from_millis(30));
    h.pass(&copy(1, 1));
    // Fewer than a sixteenth free: six evicted, the least recently seen.
    assert_eq!(h.loaded_mut().maintain_flows(62).expect("upkeep"), 6);
    let left = h.mirrored_flows();
    assert_eq!(left.len(), 56);
    assert!(
        left.keys()
            .any(|k| k.key.dest_qp == 1 && k.tag.session == 1),
        "seen last"
    );
    // Gone from FLOWS_MIRROR too: a gone flow's next copy makes it anew, once its slot
    // came back (the next poll).
    let gone: Vec<(u32, u16)> = (1..=31u32)
        .flat_map(|qp| [(qp, 1u16), (qp, 2u16)])
        .filter(|(qp, s)| {
            !left
                .keys()
                .any(|k| k.key.dest_qp == *qp && k.tag.session == u32::from(*s))
        })
        .collect();
    assert_eq!(gone.len(), 6);
    for k in h.loaded().mirrored_flows().expect("read") {
        assert!(h
            .loaded()
            .mirrored_flow_index(&k.0)
            .expect("lookup")
            .is_some());
    }
    let Some((some, _)) = left.iter().next() else {
        panic!("flows left")
    };
    for (qp, session) in &gone {
        let key = FlowKeyMirror {
            key: FlowKey {
                dest_qp: *qp,
                ..some.key
            },
            tag: tag(false, MIRROR_ERSPAN2, u32::from(*session)),
        };
        assert_eq!(h.loaded().mirrored_flow_index(&key).expect("lookup"), None);
    }
    h.loaded_mut().maintain_flows(56).expect("give back");
    let created = h.stats()[STAT_FLOW_CREATED as usize];
    let (qp, session) = gone[0];
    h.pass(&copy(qp, session));
    assert_eq!(h.stats()[STAT_FLOW_CREATED as usize], created + 1);
    let back = h.mirrored_flows();
    let (_, st) = back
        .iter()
        .find(|(k, _)| k.key.dest_qp == qp && k.tag.session == u32::from(session))
        .expect("made anew");
    assert_eq!(
        st.packets, 1,
        "counted on a fresh slot, not the evicted one"
    );
}

#[test]
fn a_session_that_copies_both_directions_measures_round_trips() {
    let mut h = Harness::load_mirror();
    let eth = Eth::default();
    let requests =
        L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(0x6A);
    let responses =
        L3::v4(Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1)).with_tos(0x6A);
    let copy = |l3: &L3, msg: &RoceMsg, session: u16| {
        mirror_frame(
            &eth,
            &outer(false),
            &Encap::erspan2(session),
            &roce_frame(&eth, l3, 49152, msg),
        )
    };
    h.pass(&copy(
        &requests,
        &RoceMsg::send_only(0x11, 100, 64).with_ack_req(true),
        5,
    ));
    std::thread::sleep(std::time::Duration::from_millis(2));
    h.pass(&copy(&responses, &RoceMsg::ack(0x22, 100, 0x1F), 5));
    let acks = FlowKeyMirror {
        key: FlowKey {
            flags: KEY_MIRROR,
            ..roce_tests::expect::key(&responses, 0x22)
        },
        tag: tag(false, MIRROR_ERSPAN2, 5),
    };
    let loaded = h.loaded_mut();
    let index = match loaded.mirrored_flow_index(&acks) {
        Ok(Some(i)) => i,
        other => panic!("the ACK's mirrored flow: {other:?}"),
    };
    let hists = loaded.rtt_hists().expect("reading RTT_HIST");
    let rtt = hists.get(&index).expect("a round trip on the ACK's flow");
    assert_eq!(rtt.samples, 1);
    assert!(rtt.min_ns >= 2_000_000, "slept 2 ms: {} ns", rtt.min_ns);
    assert_eq!(hists.len(), 1, "the request's flow has none");
}

/// Copies of one queue pair's two directions, as one ERSPAN II session sends them.
struct Session {
    eth: Eth,
    session: u16,
}

impl Session {
    const REQUESTS: ([u8; 4], [u8; 4]) = ([198, 18, 0, 1], [198, 18, 0, 2]);

    fn l3(from_requester: bool) -> L3 {
        let (a, b) = Self::REQUESTS;
        let (src, dst) = if from_requester { (a, b) } else { (b, a) };
        L3::v4(Ipv4Addr::from(src), Ipv4Addr::from(dst)).with_tos(0x6A)
    }

    fn copy(&self, from_requester: bool, msg: &RoceMsg) -> Vec<u8> {
        mirror_frame(
            &self.eth,
            &outer(false),
            &Encap::erspan2(self.session),
            &roce_frame(&self.eth, &Self::l3(from_requester), 49152, msg),
        )
    }

    fn send(&self, psn: u32) -> Vec<u8> {
        self.copy(true, &RoceMsg::send_only(0x11, psn, 64))
    }

    fn ack(&self, psn: u32, syndrome: u8) -> Vec<u8> {
        self.copy(false, &RoceMsg::ack(0x22, psn, syndrome))
    }

    /// The gaps the copies lost on the request flow (None: no CAPTURE_GAPS entry).
    fn capture_gaps(&self, h: &Harness) -> Option<u64> {
        let requests = FlowKeyMirror {
            key: FlowKey {
                flags: KEY_MIRROR,
                ..roce_tests::expect::key(&Self::l3(true), 0x11)
            },
            tag: tag(false, MIRROR_ERSPAN2, u32::from(self.session)),
        };
        let index = match h.loaded().mirrored_flow_index(&requests) {
            Ok(Some(i)) => i,
            other => panic!("the request flow: {other:?}"),
        };
        let gaps = h.loaded().capture_gaps().expect("reading CAPTURE_GAPS");
        gaps.get(&index).copied()
    }
}

const ACK: u8 = 0x1F;
const NAK_SEQ: u8 = 0x60;

#[test]
fn a_gap_that_a_later_ack_covers_was_lost_by_the_copies() {
    let h = Harness::load_mirror();
    let s = Session {
        eth: Eth::default(),
        session: 7,
    };
    // 10, 11 copied, 12 and 13 not, 14 shows the gap; the flow expects 15.
    for psn in [10, 11, 14] {
        h.pass(&s.send(psn));
    }
    // Near misses: an ACK before the gap, one beyond the flow's next PSN.
    h.pass(&s.ack(11, ACK));
    h.pass(&s.ack(15, ACK));
    assert_eq!(s.capture_gaps(&h), None);
    // An ACK of 14 says the responder took 12 and 13: the copies lost them.
    h.pass(&s.ack(14, ACK));
    assert_eq!(s.capture_gaps(&h), Some(1));
    // Decided once.
    h.pass(&s.ack(14, ACK));
    assert_eq!(s.capture_gaps(&h), Some(1));
}

#[test]
fn a_gap_that_is_resent_or_naked_was_lost_by_the_fabric() {
    let h = Harness::load_mirror();
    // A resend of a missing PSN: the requester had to send it again.
    let resent = Session {
        eth: Eth::default(),
        session: 8,
    };
    for psn in [20, 23, 21, 22, 23] {
        h.pass(&resent.send(psn));
    }
    h.pass(&resent.ack(23, ACK));
    assert_eq!(resent.capture_gaps(&h), None);
    // A NAK of the first missing PSN, then the go-back and its ACK.
    let naked = Session {
        eth: Eth::default(),
        session: 9,
    };
    for psn in [30, 33] {
        h.pass(&naked.send(psn));
    }
    h.pass(&naked.ack(31, NAK_SEQ));
    h.pass(&naked.ack(33, ACK));
    assert_eq!(naked.capture_gaps(&h), None);
    let stats = h.mirrored_flows();
    let gaps: u64 = stats.values().map(|st| st.psn_gaps).sum();
    assert_eq!(gaps, 2, "both gaps counted as gaps");
}

#[test]
fn a_gap_that_a_newer_one_displaces_is_counted_undecided() {
    use roce_common::counters::STAT_CAPTURE_GAPS_UNDECIDED;
    let h = Harness::load_mirror();
    let s = Session {
        eth: Eth::default(),
        session: 10,
    };
    let undecided = |h: &Harness| h.stats()[STAT_CAPTURE_GAPS_UNDECIDED as usize];
    // 41 missing (40 -> 42), then 44 missing (43 -> 45) before any response: the
    // session's one watch moves to the second gap.
    for psn in [40, 42, 43] {
        h.pass(&s.send(psn));
    }
    assert_eq!(undecided(&h), 0, "one gap waits");
    h.pass(&s.send(45));
    assert_eq!(undecided(&h), 1, "the first gap let go");
    // An ACK of 45 covers both; only the watched one is decided.
    h.pass(&s.ack(45, ACK));
    assert_eq!(s.capture_gaps(&h), Some(1));
    assert_eq!(undecided(&h), 1);
}
