//! The real tc programs through BPF_PROG_TEST_RUN against the reference in
//! `roce_common::policy`: every TOS value x IPv4/IPv6 x plain/VXLAN x every interface
//! mode. Output bytes equal the reference's, the IPv4 header checksum equals one
//! computed from scratch, length and ICRC stay, skb->priority comes back through the
//! `__sk_buff` context, and STATS hold exactly what the reference counted. The egress
//! flows `tc_egress` counts equal the reference classifier's flows of the bytes the
//! reference policy wrote (what leaves the wire). Needs root.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use roce_common::counters::*;
use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, KEY_EGRESS};
use roce_common::packet::SlicePacket;
use roce_common::parsed::Class;
use roce_common::policy::{
    action_stats, apply, decap_check, decap_stats, ipv4_checksum, DscpEntry, IfaceQos, Kind,
    Policy, VtepStats, ECN_KERNEL, ECN_RFC6040, ENTRY_LOSSLESS, HOST_AUDIT, HOST_ENFORCE, HOST_OFF,
};
use roce_common::reference::ReferenceTable;
use roce_common::wire::{ETH_HLEN, ETH_P_IPV4};
use roce_testkit::frame::{cnp, roce_frame, udp_frame, vxlan_frame, Eth, RoceMsg, L3};
use roce_tests::expect::{key, tunnel_key, untimed, Counts};
use roce_tests::hex;
use roce_tests::tc::{TcHarness, TC_NEXT, TEST_RUN_IFINDEX};

const PRIO_IN: u32 = 0x1234;

fn iface(host: u8, vtep: u8, ecn: u8) -> IfaceQos {
    IfaceQos {
        host,
        vtep,
        ecn,
        _pad: 0,
    }
}

/// Every interface mode: nothing, audit, enforce, VTEP (both ECN modes), VTEP + enforce.
fn modes() -> Vec<(&'static str, IfaceQos)> {
    vec![
        ("off", iface(HOST_OFF, 0, ECN_KERNEL)),
        ("audit", iface(HOST_AUDIT, 0, ECN_KERNEL)),
        ("enforce", iface(HOST_ENFORCE, 0, ECN_KERNEL)),
        ("vtep_kernel", iface(HOST_OFF, 1, ECN_KERNEL)),
        ("vtep_rfc6040", iface(HOST_OFF, 1, ECN_RFC6040)),
        ("vtep_enforce_rfc6040", iface(HOST_ENFORCE, 1, ECN_RFC6040)),
        ("vtep_audit", iface(HOST_AUDIT, 1, ECN_KERNEL)),
    ]
}

fn l3(v6: bool, inner: bool, tos: u8) -> L3 {
    let n = if inner { 19 } else { 18 };
    if v6 {
        L3::v6(
            Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 2),
        )
        .with_tos(tos)
    } else {
        L3::v4(
            Ipv4Addr::new(198, n as u8, 0, 1),
            Ipv4Addr::new(198, n as u8, 0, 2),
        )
        .with_tos(tos)
    }
}

/// The frames of one TOS value: plain RoCE data, CNP and other UDP, and VXLAN carrying
/// each of them over IPv4 and IPv6 inner headers (outer TOS varied too).
fn frames(v6: bool, tos: u8) -> Vec<(String, Vec<u8>)> {
    let eth = Eth::default();
    let write = RoceMsg::write_only(0x1234, 7, 64);
    let inner_kinds = |v6i: bool, t: u8| {
        let l = l3(v6i, true, t);
        vec![
            ("roce", roce_frame(&eth, &l, 0xC000, &write)),
            ("cnp", roce_frame(&eth, &l, 0xC000, &cnp(0x1234))),
            ("udp", udp_frame(&eth, &l, 40000, 5001, &[0xAB; 32])),
        ]
    };
    let mut out = Vec::new();
    for (name, f) in inner_kinds(v6, tos) {
        // Plain: the same kinds with the outer header only.
        let plain = match name {
            "roce" => roce_frame(&eth, &l3(v6, false, tos), 0xC000, &write),
            "cnp" => roce_frame(&eth, &l3(v6, false, tos), 0xC000, &cnp(0x1234)),
            _ => udp_frame(&eth, &l3(v6, false, tos), 40000, 5001, &[0xAB; 32]),
        };
        let _ = f;
        out.push((format!("plain_{name}"), plain));
    }
    for v6i in [false, true] {
        for (name, inner) in inner_kinds(v6i, tos) {
            let outer = l3(v6, false, tos ^ 0xA5);
            out.push((
                format!("vxlan_inner{}_{name}", if v6i { 6 } else { 4 }),
                vxlan_frame(&eth, &outer, 0xD000, 5001, &inner),
            ));
        }
    }
    out
}

#[track_caller]
fn assert_ipv4_checksum_from_scratch(f: &[u8], context: &str) {
    if u16::from_be_bytes([f[12], f[13]]) != ETH_P_IPV4 {
        return;
    }
    let hlen = ((f[ETH_HLEN] & 0x0F) as usize) * 4;
    let mut h = f[ETH_HLEN..ETH_HLEN + hlen].to_vec();
    let stored = u16::from_be_bytes([h[10], h[11]]);
    h[10] = 0;
    h[11] = 0;
    assert_eq!(stored, ipv4_checksum(&h), "{context}: IPv4 header checksum");
}

/// What the reference expects after a run: QoS STATS, and the egress flows.
struct Expected {
    stats: Vec<u64>,
    flows: BTreeMap<FlowKey, FlowStats>,
}

/// The kernel's flows without timestamps.
fn untimed_flows(h: &TcHarness) -> BTreeMap<FlowKey, FlowStats> {
    h.flows()
        .into_iter()
        .map(|(k, v)| (k, untimed(v)))
        .collect()
}

/// Runs every frame of every TOS through `tc_egress` on an interface in `mode`, and
/// checks bytes, checksum, length, ICRC, priority and verdict against the reference.
/// Returns the STATS and the egress flows the reference expects: the reference
/// classifier's flows of the bytes the reference policy left (keys marked egress), on
/// interfaces where the host policy applies.
fn run_all(h: &mut TcHarness, policy: &Policy, mode: IfaceQos, label: &str) -> Expected {
    let mut want = vec![0u64; STATS_LEN as usize];
    let mut reference = ReferenceTable::new(policy.config);
    for v6 in [false, true] {
        for tos in 0..=255u8 {
            for (name, frame) in frames(v6, tos) {
                let context = format!("{label} {name} v6={v6} tos={tos}");
                let mut expected = frame.clone();
                let action = apply(&mut expected, policy, &mode);
                let out = h.egress(&frame, PRIO_IN);
                assert_eq!(out.retval, TC_NEXT, "{context}: verdict");
                assert!(
                    out.data == expected,
                    "{context}: bytes differ from the reference ({action:?})\nin:\n{}kernel:\n{}reference:\n{}",
                    hex(&frame),
                    hex(&out.data),
                    hex(&expected)
                );
                assert_eq!(out.data.len(), frame.len(), "{context}: length");
                assert_eq!(
                    out.data[frame.len() - 4..],
                    frame[frame.len() - 4..],
                    "{context}: ICRC"
                );
                assert_ipv4_checksum_from_scratch(&out.data, &context);
                assert_eq!(
                    out.priority,
                    action.sets_priority().unwrap_or(PRIO_IN),
                    "{context}: skb->priority ({action:?})"
                );
                for s in action_stats(&action).into_iter().flatten() {
                    want[s as usize] += 1;
                }
                if mode.counts_flows() {
                    reference.process(&expected, TEST_RUN_IFINDEX, 0);
                }
            }
        }
    }
    let flows = reference
        .flows
        .into_iter()
        .map(|(mut k, v)| {
            k.flags |= KEY_EGRESS;
            (k, untimed(v))
        })
        .collect();
    Expected { stats: want, flows }
}

fn qos_stats(v: &[u64]) -> Vec<(&'static str, u64)> {
    STAT_NAMES_QOS
        .iter()
        .map(|(i, n)| (*n, v[*i as usize]))
        .collect()
}

#[test]
fn every_tos_family_encapsulation_and_mode_matches_the_reference_bytes_priority_and_counters() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_OFF, 0, ECN_KERNEL));
    for (label, mode) in modes() {
        h.reset();
        h.set_iface(mode);
        let want = run_all(&mut h, &policy, mode, label);
        let got = h.stats();
        assert_eq!(
            qos_stats(&got),
            qos_stats(&want.stats),
            "{label}: QoS counters"
        );
        let flows = untimed_flows(&h);
        assert!(
            flows == want.flows,
            "{label}: egress flows differ\n  kernel:    {flows:#?}\n  reference: {:#?}",
            want.flows
        );
        assert_eq!(
            got[STAT_FLOW_CREATED as usize],
            want.flows.len() as u64,
            "{label}"
        );
        // Egress frames have no class counters: `counters` stays what XDP saw.
        assert!(got[..STAT_FLOW_CREATED as usize].iter().all(|&n| n == 0));
    }
}

#[test]
fn a_policy_from_config_is_what_the_datapath_applies() {
    // Nothing is a constant of the datapath: other DSCPs, lossless set, priorities and
    // VTEP table give other bytes, and the kernel still matches the reference.
    let mut policy = Policy::default();
    policy.qos.roce_dscp = 24;
    policy.qos.cnp_dscp = 56;
    policy.qos.remark_dscp = 8;
    policy.table[26].flags = 0;
    policy.table[24].flags |= ENTRY_LOSSLESS;
    policy.table[46].flags |= ENTRY_LOSSLESS;
    policy.table[24].priority = 4;
    policy.table[56].priority = 7;
    policy.table[10] = DscpEntry {
        priority: 2,
        vtep_outer: 26,
        flags: 0,
        _pad: [0; 2],
    };
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    for (label, mode) in modes() {
        h.reset();
        h.set_iface(mode);
        let want = run_all(&mut h, &policy, mode, label);
        assert_eq!(qos_stats(&h.stats()), qos_stats(&want.stats), "{label}");
        assert!(untimed_flows(&h) == want.flows, "{label}: egress flows");
    }
}

#[test]
fn audit_changes_no_byte_and_counts_exactly_what_enforce_changes() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_AUDIT, 0, ECN_KERNEL));
    let mut changed_by_enforce = 0u64;
    let mut all = Vec::new();
    for v6 in [false, true] {
        for tos in 0..=255u8 {
            all.extend(frames(v6, tos).into_iter().map(|(_, f)| f));
        }
    }
    for f in &all {
        let out = h.egress(f, PRIO_IN);
        assert_eq!(&out.data, f, "audit changed a byte:\n{}", hex(f));
        assert_eq!(out.priority, PRIO_IN, "audit set the priority");
    }
    let audit = h.stats();
    h.reset();
    h.set_iface(iface(HOST_ENFORCE, 0, ECN_KERNEL));
    for f in &all {
        if h.egress(f, PRIO_IN).data != *f {
            changed_by_enforce += 1;
        }
    }
    let enforce = h.stats();
    assert!(changed_by_enforce > 0);
    assert_eq!(
        audit[STAT_QOS_AUDIT_ROCE_REWRITE as usize]
            + audit[STAT_QOS_AUDIT_INTRUDER_REMARK as usize],
        changed_by_enforce
    );
    assert_eq!(
        (
            audit[STAT_QOS_AUDIT_ROCE_REWRITE as usize],
            audit[STAT_QOS_AUDIT_INTRUDER_REMARK as usize],
            audit[STAT_QOS_AUDIT_PRIORITY as usize],
        ),
        (
            enforce[STAT_QOS_ROCE_REWRITTEN as usize],
            enforce[STAT_QOS_INTRUDER_REMARKED as usize],
            enforce[STAT_QOS_PRIORITY_SET as usize],
        )
    );
    for i in [
        STAT_QOS_ROCE_REWRITTEN,
        STAT_QOS_INTRUDER_REMARKED,
        STAT_QOS_PRIORITY_SET,
    ] {
        assert_eq!(audit[i as usize], 0, "audit bumped an enforce counter {i}");
    }
    for i in [
        STAT_QOS_AUDIT_ROCE_REWRITE,
        STAT_QOS_AUDIT_INTRUDER_REMARK,
        STAT_QOS_AUDIT_PRIORITY,
    ] {
        assert_eq!(
            enforce[i as usize], 0,
            "enforce bumped an audit counter {i}"
        );
    }
}

#[test]
fn intruder_on_dscp_26_leaves_with_dscp_0_and_its_ecn_roce_keeps_26_priority_3() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    let eth = Eth::default();
    let udp = udp_frame(&eth, &l3(false, false, 107), 40000, 5001, &[0; 32]);
    let out = h.egress(&udp, PRIO_IN);
    assert_eq!((out.data[15], out.priority), (3, 0));
    let roce = roce_frame(
        &eth,
        &l3(false, false, 106),
        0xC000,
        &RoceMsg::write_only(1, 1, 64),
    );
    let out = h.egress(&roce, PRIO_IN);
    assert_eq!((&out.data, out.priority), (&roce, 3));
    let c = roce_frame(&eth, &l3(true, false, 106), 0xC000, &cnp(1));
    let out = h.egress(&c, PRIO_IN);
    // IPv6 traffic class 48 << 2 | ECT(0) = 0xC2 across bytes 0-1.
    assert_eq!(
        (out.data[14], out.data[15] & 0xF0, out.priority),
        (0x6C, 0x20, 6)
    );
    let s = h.stats();
    assert_eq!(
        (
            s[STAT_QOS_INTRUDER_REMARKED as usize],
            s[STAT_QOS_ROCE_REWRITTEN as usize],
            s[STAT_QOS_PRIORITY_SET as usize]
        ),
        (1, 1, 3)
    );
}

#[test]
fn decap_checks_count_per_remote_vtep_and_rewrite_nothing() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_OFF, 1, ECN_KERNEL));
    let eth = Eth::default();
    let mut want_stats = vec![0u64; STATS_LEN as usize];
    let mut want_vtep = std::collections::BTreeMap::new();
    for v6 in [false, true] {
        for outer_tos in 0..=255u8 {
            for inner_tos in [0u8, 1, 2, 3, 104, 105, 106, 107, 0xC3, 0xFF] {
                let inner = udp_frame(&eth, &l3(false, true, inner_tos), 40000, 7, &[0; 8]);
                let f = vxlan_frame(&eth, &l3(v6, false, outer_tos), 0xD000, 5001, &inner);
                let out = h.ingress(&f);
                assert_eq!((out.retval, &out.data), (TC_NEXT, &f), "ingress rewrote");
                let c = decap_check(&SlicePacket(&f), &policy.config, &policy.table)
                    .expect("a VXLAN frame");
                for s in decap_stats(&c).into_iter().flatten() {
                    want_stats[s as usize] += 1;
                }
                want_vtep
                    .entry(c.remote)
                    .or_insert_with(VtepStats::default)
                    .record(&c);
            }
        }
    }
    // Plain RoCE is no VXLAN: not counted.
    let plain = roce_frame(
        &eth,
        &l3(false, false, 3),
        0xC000,
        &RoceMsg::write_only(1, 1, 8),
    );
    h.ingress(&plain);
    assert_eq!(qos_stats(&h.stats()), qos_stats(&want_stats));
    let got: Vec<_> = h.vteps();
    let want: Vec<_> = want_vtep.into_iter().collect();
    assert_eq!(got, want);
    // 2 remotes x 256 outer TOS x 10 inner: the CE cases are fixed numbers.
    let ce_over_ect: u64 = got.iter().map(|(_, s)| s.ce_over_ect).sum();
    let ce_over_not_ect: u64 = got.iter().map(|(_, s)| s.ce_over_not_ect).sum();
    // Outer CE: 64 TOS values per family; inner ECT: 1, 2, 105, 106; inner Not-ECT: 0, 104.
    assert_eq!((ce_over_ect, ce_over_not_ect), (2 * 64 * 4, 2 * 64 * 2));
}

#[test]
fn kinds_cover_every_branch_of_the_decision() {
    // Guards the exhaustive test against a frame set that misses a branch.
    let policy = Policy::default();
    let mut kinds = std::collections::BTreeSet::new();
    for (_, mode) in modes() {
        for (_, mut f) in frames(false, 106).into_iter().chain(frames(true, 0)) {
            kinds.insert(format!("{:?}", apply(&mut f, &policy, &mode).kind));
        }
    }
    let all: std::collections::BTreeSet<String> = [
        Kind::Untouched,
        Kind::RoceData,
        Kind::Cnp,
        Kind::Intruder,
        Kind::Other,
        Kind::Vtep,
    ]
    .iter()
    .map(|k| format!("{k:?}"))
    .collect();
    assert_eq!(kinds, all);
}

#[test]
fn interfaces_beyond_the_direct_array_are_configured_through_the_hash() {
    // A device of index 5000 (> IFACE_DIRECT) in a namespace of the lab; test runs in
    // that namespace name it through __sk_buff.ifindex.
    let l = match roce_testkit::lab::Lab::new(roce_testkit::lab::LabOptions {
        vxlan: false,
        ipv6: false,
        ..Default::default()
    }) {
        Ok(l) => l,
        Err(e) => panic!("lab: {e:#}"),
    };
    let add = [
        "link", "add", "big0", "index", "5000", "type", "veth", "peer", "name", "big1",
    ];
    if let Err(e) = l.exec(&l.a.ns, "ip", &add) {
        panic!("ip {add:?}: {e:#}");
    }
    const { assert!(5000 >= roce_common::policy::IFACE_DIRECT) };
    let r = roce_testkit::lab::in_namespace(&l.a.ns, || {
        let policy = Policy::default();
        let mut h = TcHarness::load(&policy, iface(HOST_OFF, 0, ECN_KERNEL));
        let eth = Eth::default();
        let udp = udp_frame(&eth, &l3(false, false, 106), 40000, 5001, &[0; 32]);
        let before = h
            .run_on(roce_agent::datapath::loader::TC_EGRESS, &udp, PRIO_IN, 5000)
            .data;
        h.set_iface_at(5000, Some(iface(HOST_ENFORCE, 0, ECN_KERNEL)));
        let enforced = h.run_on(roce_agent::datapath::loader::TC_EGRESS, &udp, PRIO_IN, 5000);
        let on_lo = h.egress(&udp, PRIO_IN).data;
        h.set_iface_at(5000, None);
        let after = h
            .run_on(roce_agent::datapath::loader::TC_EGRESS, &udp, PRIO_IN, 5000)
            .data;
        Ok((udp, before, enforced, on_lo, after))
    });
    let (udp, before, enforced, on_lo, after) = match r {
        Ok(v) => v,
        Err(e) => panic!("{e:#}"),
    };
    assert_eq!(before, udp, "configured nowhere yet");
    assert_eq!(
        (enforced.data[15], enforced.priority),
        (2, 0),
        "remarked on ifindex 5000"
    );
    assert_eq!(on_lo, udp, "loopback is not configured");
    assert_eq!(after, udp, "removed again");
}

// ---------------------------------------------------------------------------------
// Egress flows

const QP: u32 = 0x1234;
const CNP_QP: u32 = 0x77;
const SPORT: u16 = 0xC000;

fn egress_key(k: FlowKey) -> FlowKey {
    FlowKey {
        flags: k.flags | KEY_EGRESS,
        ..k
    }
}

/// Plain IPv4 RoCE with DSCP 10 (which enforce rewrites to 26) and ECN `ecn`.
fn dscp10(ecn: u8) -> L3 {
    l3(false, false, (10 << 2) | ecn)
}

/// A data flow's packets leaving the host: ECT(0), a CE, a PSN gap (3 and 4 missing),
/// ECT(1) on a NAK, an RNR NAK; and a CNP on another QP.
fn egress_frames() -> (Vec<Vec<u8>>, Vec<u8>) {
    let eth = Eth::default();
    let data = vec![
        roce_frame(&eth, &dscp10(2), SPORT, &RoceMsg::write_only(QP, 1, 64)),
        roce_frame(&eth, &dscp10(3), SPORT, &RoceMsg::write_only(QP, 2, 64)),
        roce_frame(&eth, &dscp10(2), SPORT, &RoceMsg::write_only(QP, 5, 64)),
        roce_frame(&eth, &dscp10(1), SPORT, &RoceMsg::ack(QP, 5, 0x60)),
        roce_frame(&eth, &dscp10(2), SPORT, &RoceMsg::ack(QP, 5, 0x23)),
    ];
    let c = roce_frame(&eth, &dscp10(1), SPORT, &cnp(CNP_QP));
    (data, c)
}

/// The counts of `egress_frames` with the DSCPs the data and the CNP left with.
fn egress_counts(
    data: &[Vec<u8>],
    c: &[u8],
    data_dscp: u8,
    cnp_dscp: u8,
) -> Vec<(FlowKey, Counts)> {
    let data_counts = Counts {
        packets: 5,
        bytes: data.iter().map(|f| f.len() as u64).sum(),
        ecn: [0, 1, 3, 1],
        naks: 1,
        rnr_naks: 1,
        psn_gaps: 1,
        sport: SPORT,
        last_dscp: data_dscp,
        ..Counts::default()
    };
    let cnp_counts = Counts {
        packets: 1,
        bytes: c.len() as u64,
        ecn: [0, 1, 0, 0],
        cnps: 1,
        sport: SPORT,
        last_dscp: cnp_dscp,
        ..Counts::default()
    };
    vec![
        (egress_key(key(&dscp10(0), QP)), data_counts),
        (egress_key(key(&dscp10(0), CNP_QP)), cnp_counts),
    ]
}

fn flow_counts(h: &TcHarness) -> BTreeMap<FlowKey, Counts> {
    h.flows()
        .iter()
        .map(|(k, v)| (*k, Counts::from(v)))
        .collect()
}

#[test]
fn roce_leaving_an_enforce_interface_counts_on_an_egress_flow_with_the_dscp_as_written() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    let (data, c) = egress_frames();
    for f in data.iter().chain([&c]) {
        let out = h.egress(f, PRIO_IN);
        assert_eq!(out.retval, TC_NEXT);
        assert_eq!(out.data.len(), f.len());
    }
    // Data leaves with DSCP 26, the CNP with 48: that is what the flows show; the ECN
    // codepoints are the ones sent (enforce never changes them).
    let want: BTreeMap<_, _> = egress_counts(&data, &c, 26, 48).into_iter().collect();
    assert_eq!(flow_counts(&h), want);
    let s = h.stats();
    assert_eq!(s[STAT_FLOW_CREATED as usize], 2);
    assert_eq!(s[STAT_QOS_ROCE_REWRITTEN as usize], 6);
}

/// The benchmarks' "decision only" case empties the tail-call slot of the egress flows:
/// the policy must still rewrite and count exactly as with it, and no flow may appear;
/// filled again, the same frames count as in the test above.
#[test]
fn egress_flow_counting_switched_off_keeps_the_decision_and_counts_no_flow() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    let (data, c) = egress_frames();
    let mut counted = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    h.loaded_mut()
        .set_egress_flow_counting(false)
        .expect("emptying the tail-call slot");
    for f in data.iter().chain([&c]) {
        let off = h.egress(f, PRIO_IN);
        let on = counted.egress(f, PRIO_IN);
        assert_eq!(off.retval, TC_NEXT);
        assert_eq!(off.data, on.data, "the same bytes leave either way");
    }
    assert!(
        flow_counts(&h).is_empty(),
        "no egress flow while counting is off"
    );
    let s = h.stats();
    assert_eq!(s[STAT_FLOW_CREATED as usize], 0);
    assert_eq!(s[STAT_QOS_ROCE_REWRITTEN as usize], 6);
    h.loaded_mut()
        .set_egress_flow_counting(true)
        .expect("filling the tail-call slot");
    for f in data.iter().chain([&c]) {
        h.egress(f, PRIO_IN);
    }
    let want: BTreeMap<_, _> = egress_counts(&data, &c, 26, 48).into_iter().collect();
    assert_eq!(flow_counts(&h), want);
}

#[test]
fn audit_mode_counts_egress_flows_with_the_dscp_unchanged() {
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_AUDIT, 0, ECN_KERNEL));
    let (data, c) = egress_frames();
    for f in data.iter().chain([&c]) {
        assert_eq!(&h.egress(f, PRIO_IN).data, f);
    }
    let want: BTreeMap<_, _> = egress_counts(&data, &c, 10, 10).into_iter().collect();
    assert_eq!(flow_counts(&h), want);
    assert_eq!(h.stats()[STAT_QOS_AUDIT_ROCE_REWRITE as usize], 6);
}

#[test]
fn vtep_only_underlays_and_unconfigured_interfaces_count_no_flow() {
    let policy = Policy::default();
    let (data, c) = egress_frames();
    for mode in [
        iface(HOST_OFF, 0, ECN_KERNEL),
        iface(HOST_OFF, 1, ECN_KERNEL),
    ] {
        let mut h = TcHarness::load(&policy, mode);
        for f in data.iter().chain([&c]) {
            h.egress(f, PRIO_IN);
        }
        assert!(h.flows().is_empty(), "{mode:?}");
        assert_eq!(h.stats()[STAT_FLOW_CREATED as usize], 0);
    }
}

#[test]
fn a_vxlan_flow_leaving_counts_outer_ecn_as_written_and_inner_ecn_as_carried() {
    // VTEP + enforce: the outer TOS is rewritten from the inner one (ECN included).
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 1, ECN_RFC6040));
    let eth = Eth::default();
    let inner_l3 = l3(false, true, (26 << 2) | 3);
    let outer_l3 = l3(false, false, 0);
    let inner = roce_frame(&eth, &inner_l3, SPORT, &RoceMsg::write_only(QP, 9, 32));
    let f = vxlan_frame(&eth, &outer_l3, 0xD000, 5001, &inner);
    let out = h.egress(&f, PRIO_IN);
    assert_eq!(
        out.data[15],
        (26 << 2) | 3,
        "outer TOS from the inner (RFC 6040)"
    );
    let mut ecn = [0; 4];
    ecn[3] = 1;
    let want = Counts {
        packets: 1,
        bytes: f.len() as u64,
        ecn,
        inner_ecn: ecn,
        sport: SPORT,
        last_dscp: 26,
        ..Counts::default()
    };
    let k = egress_key(tunnel_key(&outer_l3, 5001, &inner_l3, QP));
    assert_eq!(flow_counts(&h), BTreeMap::from([(k, want)]));
}

#[test]
fn one_frame_in_and_out_is_two_flows_and_one_frame_in_the_class_counters() {
    // XDP counts the frame arriving (and its class), tc_egress the frame leaving: the
    // flows differ by direction, and `counters` (STATS classes) counts the frame once.
    let policy = Policy::default();
    let mut h = TcHarness::load(&policy, iface(HOST_AUDIT, 0, ECN_KERNEL));
    let (data, _) = egress_frames();
    let f = &data[0];
    h.egress(f, PRIO_IN);
    let fd = match h.loaded_mut().xdp_fd() {
        Ok(fd) => fd,
        Err(e) => panic!("{e}"),
    };
    let run = roce_agent::datapath::testrun::TestRun {
        data: f,
        repeat: 1,
        ..Default::default()
    };
    if let Err(e) = roce_agent::datapath::testrun::test_run(fd, &run) {
        panic!("XDP test run: {e}");
    }
    let flows = h.flows();
    let ingress = key(&dscp10(0), QP);
    assert_eq!(
        flows.keys().copied().collect::<Vec<_>>(),
        vec![ingress, egress_key(ingress)]
    );
    assert!(flows.values().all(|s| s.packets == 1 && s.last_dscp == 10));
    let s = h.stats();
    assert_eq!(s[class_index(Class::Roce) as usize], 1);
    assert_eq!(s[STAT_FLOW_CREATED as usize], 2);
}

/// The CNPs off the CNP DSCP of the flow `k` (CNP_WRONG_CLASS: packets, DSCPs).
fn cnps_wrong_class(h: &mut TcHarness, k: &FlowKey) -> Option<(u64, Vec<u8>)> {
    let loaded = h.loaded_mut();
    let index = match loaded.flow_index(k) {
        Ok(Some(i)) => i,
        other => panic!("the flow {k:?}: {other:?}"),
    };
    let all = loaded.cnps_wrong_class().expect("reading CNP_WRONG_CLASS");
    all.get(&index)
        .map(|c| (c.packets, c.dscp_list().collect()))
}

#[test]
fn cnps_off_the_cnp_dscp_count_on_their_flow_as_they_arrive_and_as_they_leave() {
    let policy = Policy::default();
    let eth = Eth::default();
    let frame =
        |dscp: u8, msg: &RoceMsg| roce_frame(&eth, &l3(false, false, dscp << 2 | 1), SPORT, msg);
    // Arriving: CNPs on DSCP 26 and 0 count, on 48 (the CNP DSCP) not; an ACK on 26 is
    // no CNP.
    let mut h = TcHarness::load(&policy, iface(HOST_AUDIT, 0, ECN_KERNEL));
    for f in [
        frame(26, &cnp(CNP_QP)),
        frame(48, &cnp(CNP_QP)),
        frame(0, &cnp(CNP_QP)),
        frame(26, &RoceMsg::ack(QP, 5, 0x1F)),
    ] {
        h.xdp(&f);
    }
    let ingress = |qp| key(&l3(false, false, 0), qp);
    assert_eq!(
        cnps_wrong_class(&mut h, &ingress(CNP_QP)),
        Some((2, vec![0, 26]))
    );
    assert_eq!(cnps_wrong_class(&mut h, &ingress(QP)), None, "an ACK");
    // Leaving an audit interface, as written (audit writes nothing): counted.
    let leaving = frame(10, &cnp(CNP_QP));
    h.egress(&leaving, PRIO_IN);
    let egress = egress_key(key(&l3(false, false, 0), CNP_QP));
    assert_eq!(cnps_wrong_class(&mut h, &egress), Some((1, vec![10])));
    // Leaving an enforce interface: rewritten to the CNP DSCP before it is counted.
    let mut h = TcHarness::load(&policy, iface(HOST_ENFORCE, 0, ECN_KERNEL));
    h.egress(&leaving, PRIO_IN);
    assert_eq!(cnps_wrong_class(&mut h, &egress), None);
    assert_eq!(h.flows()[&egress].cnps, 1);
}

/// The ECN -> CNP times of the flow `k` (CNP_TIMES: CE-to-CNP samples and their
/// shortest in ns, CNP interval samples and their shortest).
fn cnp_times(h: &mut TcHarness, k: &FlowKey) -> Option<((u64, u64), (u64, u64))> {
    let loaded = h.loaded_mut();
    let index = match loaded.flow_index(k) {
        Ok(Some(i)) => i,
        other => panic!("the flow {k:?}: {other:?}"),
    };
    let all = loaded.cnp_times().expect("reading CNP_TIMES");
    all.get(&index).map(|t| {
        (
            (t.ce_to_cnp.samples, t.ce_to_cnp.min_ns),
            (t.interval.samples, t.interval.min_ns),
        )
    })
}

#[test]
fn a_cnp_leaving_times_the_first_ce_mark_it_answers_and_the_cnp_before_it() {
    use std::time::Duration;
    let policy = Policy::default();
    let eth = Eth::default();
    let mut h = TcHarness::load(&policy, iface(HOST_AUDIT, 0, ECN_KERNEL));
    // A (198.18.0.1) sends data to our QP 0x1234; we answer its QP 0x77 with CNPs.
    let data = |psn, tos| {
        roce_frame(
            &eth,
            &l3(false, false, tos),
            SPORT,
            &RoceMsg::send_only(QP, psn, 64),
        )
    };
    let back = L3::v4(Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1)).with_tos(48 << 2);
    let our_cnp = roce_frame(&eth, &back, SPORT, &cnp(CNP_QP));
    let leaving = egress_key(key(&back, CNP_QP));
    let ms = |n: u64| n * 1_000_000;
    // Two marks arrive 3 ms before our CNP: the first one's wait is timed.
    h.xdp(&data(1, 26 << 2 | 3));
    std::thread::sleep(Duration::from_millis(1));
    h.xdp(&data(2, 26 << 2 | 3));
    std::thread::sleep(Duration::from_millis(2));
    h.egress(&our_cnp, PRIO_IN);
    let ((answered, first), (intervals, _)) = cnp_times(&mut h, &leaving).expect("times");
    assert_eq!((answered, intervals), (1, 0));
    assert!((ms(3)..ms(1000)).contains(&first), "{first} ns");
    // A second CNP 2 ms later: no mark waits (the CNP took it), one interval.
    std::thread::sleep(Duration::from_millis(2));
    h.egress(&our_cnp, PRIO_IN);
    let ((answered, _), (intervals, interval)) = cnp_times(&mut h, &leaving).expect("times");
    assert_eq!((answered, intervals), (1, 1));
    assert!((ms(2)..ms(1000)).contains(&interval), "{interval} ns");
    // The near misses: an unmarked packet starts no wait; a CNP arriving (our peer's)
    // answers no mark of ours, and is timed on its own flow.
    h.xdp(&data(3, 26 << 2 | 2));
    h.egress(&our_cnp, PRIO_IN);
    assert_eq!(cnp_times(&mut h, &leaving).expect("times").0 .0, 1);
    h.xdp(&data(4, 26 << 2 | 3));
    let theirs = roce_frame(&eth, &back, SPORT, &cnp(CNP_QP));
    h.xdp(&theirs);
    let arriving = key(&back, CNP_QP);
    assert_eq!(cnp_times(&mut h, &arriving).expect("times").0 .0, 0);
    // The wait it left is ours to answer.
    h.egress(&our_cnp, PRIO_IN);
    assert_eq!(cnp_times(&mut h, &leaving).expect("times").0 .0, 2);
}
