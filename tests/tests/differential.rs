//! Differential testing: random and structure-aware mutated frames (`roce_tests::gen`)
//! through the real `xdp_classify`, `tc_egress` (audit, enforce, VTEP, VTEP + enforce)
//! and `tc_ingress` (VTEP) programs (BPF_PROG_TEST_RUN) and through the pure reference
//! (`ReferenceTable`, `policy::apply`, `policy::decap_check`): verdicts, output bytes,
//! skb priority, STATS, FLOWS and VTEPS must agree (`roce_tests::differential`). On a
//! disagreement the seed and the first frame that shows it are printed in hex.
//!
//! `ROCE_DIFF_SEED=<u64>` replays a run; `ROCE_DIFF_PACKETS=<n>` changes its size
//! (`cargo xtask fuzz` runs a million). Needs root.

use roce_agent::datapath::loader::TC_EGRESS;
use roce_common::config::RuntimeConfig;
use roce_common::counters::{
    class_index, reason_index, STAT_FLOW_INSERT_FAILED, STAT_QOS_AUDIT_INTRUDER_REMARK,
    STAT_QOS_AUDIT_ROCE_REWRITE,
};
use roce_common::parsed::{Class, Reason, CLASS_NAMES, REASON_COUNT};
use roce_common::policy::{Policy, ENTRY_LOSSLESS};
use roce_common::reference::ReferenceTable;
use roce_tests::differential::{
    kernel_ifindex, narrow_down_xdp, other_policy, DiffOptions, Differential, Report,
};
use roce_tests::expect::{compare_with_reference, stat_name};
use roce_tests::gen::{Gen, Sample};
use roce_tests::harness::Harness;
use roce_tests::tc::{refuses_skb_test_run, TcHarness};

fn seed() -> u64 {
    match std::env::var("ROCE_DIFF_SEED") {
        Ok(s) => s.parse().expect("ROCE_DIFF_SEED is a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (std::process::id() as u64) << 32
        }
    }
}

fn packets(default: u64) -> u64 {
    std::env::var("ROCE_DIFF_PACKETS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs `n` frames through every lane; panics with the first disagreement.
fn differential(name: &str, o: &DiffOptions, seed: u64, n: u64) -> Report {
    let mut d = Differential::new(o, seed);
    println!(
        "{name}: seed {seed} (ROCE_DIFF_SEED={seed} to replay), {n} packets, ifindex {}",
        d.ifindex()
    );
    let report = d.run(n, |_| {}).clone();
    if let Some(first) = report.first_disagreement() {
        panic!("{name}: kernel and reference differ\n{first}");
    }
    println!("{name}: {report}");
    report
}

#[test]
fn kernel_and_reference_agree_on_100k_random_and_mutated_frames() {
    let seed = seed();
    let n = packets(100_000);
    let r = differential("default policy", &DiffOptions::default(), seed, n);
    assert_eq!(r.xdp_stats[STAT_FLOW_INSERT_FAILED as usize], 0);
    // The generator must reach every class, every reason a frame of 14 bytes or more
    // can have, every BTH opcode and every decision of the policy; otherwise this test
    // proves less than it claims.
    if n >= 100_000 {
        // The mirror classes and reasons come from the mirror lane (xdp_mirror on
        // copies of the frames); every other from either lane.
        let all: Vec<u64> = r
            .xdp_stats
            .iter()
            .zip(&r.mirror_stats)
            .map(|(a, b)| a + b)
            .collect();
        let mut missing = Vec::new();
        for (i, name) in CLASS_NAMES.iter().enumerate() {
            if all[class_index(class_at(i)) as usize] == 0 {
                missing.push(name.to_string());
            }
        }
        for i in 0..REASON_COUNT {
            let idx = reason_index(Reason::TruncatedEth) as usize + i;
            if i != Reason::TruncatedEth as usize && all[idx] == 0 {
                missing.push(stat_name(idx));
            }
        }
        for c in [
            Class::MirrorOther,
            Class::MirrorTruncated,
            Class::Roce,
            Class::RoceInVxlan,
        ] {
            if r.mirror_stats[class_index(c) as usize] == 0 {
                missing.push(format!("xdp_mirror: {c:?}"));
            }
        }
        for reason in [
            Reason::TruncatedGre,
            Reason::TruncatedErspan,
            Reason::BadErspanVersion,
        ] {
            if r.mirror_stats[reason_index(reason) as usize] == 0 {
                missing.push(format!("xdp_mirror: {reason:?}"));
            }
        }
        assert!(r.mirrored_flows > 0, "seed {seed}: no mirrored flow");
        assert!(
            missing.is_empty(),
            "seed {seed}: never produced: {missing:?}"
        );
        assert_eq!(r.opcodes.len(), 256, "seed {seed}: BTH opcodes seen");
        let f = &r.flows;
        assert!(
            [
                f.cnps,
                f.acks,
                f.naks,
                f.rnr_naks,
                f.psn_gaps,
                f.retransmitted_packets,
                f.retransmit_timeouts,
                f.naks_answered,
                f.inner_ce,
                f.pmtu_learnt
            ]
            .iter()
            .all(|&c| c > 0),
            "seed {seed}: some flow counter never moved: {f:?}"
        );
        for (lane, t) in &r.lanes {
            let moved = match *lane {
                "tc_ingress/vtep" => t.decap_checked > 0,
                // Audit mode counts what enforce would do and writes nothing.
                "tc_egress/audit" => {
                    t.stats[STAT_QOS_AUDIT_ROCE_REWRITE as usize] > 0
                        && t.stats[STAT_QOS_AUDIT_INTRUDER_REMARK as usize] > 0
                        && t.rewritten == 0
                        && t.priority_set == 0
                }
                _ => t.rewritten > 0 && t.priority_set > 0,
            };
            assert!(moved, "seed {seed}: {lane} never acted: {t:?}");
        }
        let kinds = |lane: &str| {
            r.lanes
                .iter()
                .find(|(n, _)| *n == lane)
                .map(|(_, t)| t.kinds.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(
            kinds("tc_egress/enforce"),
            ["Cnp", "Intruder", "Other", "RoceData", "Untouched"]
        );
        assert_eq!(kinds("tc_egress/vtep"), ["Untouched", "Vtep"]);
        let flows = |lane: &str| {
            r.lanes
                .iter()
                .find(|(n, _)| *n == lane)
                .map(|(_, t)| t.flows)
        };
        assert!(flows("tc_egress/audit") > Some(0) && flows("tc_egress/enforce") > Some(0));
    }
}

#[test]
fn kernel_and_reference_agree_with_other_ports_policy_and_default_pmtu() {
    let seed = seed() ^ 0x5EED;
    let r = differential(
        "ports 4792/8472, PMTU 1024, other DSCPs",
        &DiffOptions::new(other_policy()),
        seed,
        packets(100_000) / 2,
    );
    assert!(r.xdp_stats[class_index(Class::RoceInVxlan) as usize] > 0);
}

#[test]
fn a_difference_is_caught_and_narrowed_to_the_first_packet_that_shows_it() {
    // A reference told the wrong ifindex disagrees on every flow key: the comparison
    // must fail and name the first RoCE packet of the batch.
    let config = RuntimeConfig::default();
    let mut h = Harness::load();
    let ifindex = kernel_ifindex(&mut h, &config);
    let mut gen = Gen::new(1, config);
    let mut batch: Vec<Sample> = (0..3).map(|_| gen.other()).collect();
    batch.push(gen.roce(true));
    batch.push(gen.roce(false));
    for s in &batch {
        h.pass(&s.frame);
    }
    let mut wrong = ReferenceTable::new(config);
    for s in &batch {
        wrong.process(&s.frame, ifindex + 1, 0);
    }
    assert!(compare_with_reference(&h.flows(), &h.stats(), &wrong).is_err());
    let (index, report) = narrow_down_xdp(&mut h, config, ifindex + 1, &batch);
    assert_eq!(index, Some(3), "{report}");
    assert!(
        report.starts_with("first differing packet: #3 of the batch"),
        "{report}"
    );
    assert!(report.contains("on its own: differs too"), "{report}");
}

/// Plain RoCE on DSCP 26 and non-RoCE on DSCP 26: the frames the wrong references
/// below must trip over.
fn roce_then_intruder() -> Vec<Sample> {
    let mut gen = Gen::new(7, RuntimeConfig::default());
    let mut batch: Vec<Sample> = Vec::new();
    // Frames the policy leaves alone first, so that the culprit is not frame 0.
    while batch.len() < 3 {
        let s = gen.other();
        let mut f = s.frame.clone();
        let a = roce_common::policy::apply(
            &mut f,
            &Policy::default(),
            &roce_tests::differential::tc_lanes()[1].2,
        );
        if !a.rewrites() && a.priority.is_none() {
            batch.push(s);
        }
    }
    batch.push(gen.roce(false));
    batch
}

#[test]
fn a_wrong_dscp_in_the_reference_is_caught_on_the_first_rewritten_frame() {
    // The kernel writes DSCP 26 for RoCE, the reference (wrongly) 30: enforce-mode
    // bytes differ on the first RoCE frame (audit mode writes nothing, but counts the
    // same; the priority differs too).
    let mut o = DiffOptions::default();
    o.reference_policy.qos.roce_dscp = 30;
    let mut d = Differential::new(&o, 1);
    let batch = roce_then_intruder();
    d.run_frames(&batch);
    let r = d.report().clone();
    let enforce: Vec<_> = r
        .first
        .iter()
        .filter(|x| x.lane == "tc_egress/enforce")
        .collect();
    assert!(!enforce.is_empty(), "not caught: {r}");
    assert_eq!(enforce[0].index, Some(3), "{}", enforce[0]);
    assert!(
        enforce[0].detail.contains("output bytes differ"),
        "{}",
        enforce[0]
    );
    assert_eq!(enforce[0].frame, batch[3].frame);
    let text = r.first_disagreement().unwrap_or_default();
    assert!(text.starts_with("seed 1 (ROCE_DIFF_SEED=1"), "{text}");
    assert!(text.contains("0000  "), "the frame in hex: {text}");
}

#[test]
fn a_wrong_counter_in_the_reference_is_caught_and_narrowed_to_its_frame() {
    // The reference (wrongly) thinks DSCP 48 is lossless: in audit mode no byte and no
    // priority differs, only the QoS counters at the end of the batch; narrowing down
    // must name the first frame on DSCP 48 that is not RoCE.
    let mut o = DiffOptions::default();
    o.reference_policy.table[48].flags |= ENTRY_LOSSLESS;
    let mut d = Differential::new(&o, 1);
    let mut gen = Gen::new(3, RuntimeConfig::default());
    let mut batch = roce_then_intruder();
    // A non-RoCE frame on DSCP 48, last.
    loop {
        let s = gen.other();
        let mut f = s.frame.clone();
        let a = roce_common::policy::apply(
            &mut f,
            &Policy::default(),
            &roce_tests::differential::tc_lanes()[0].2,
        );
        if a.kind == roce_common::policy::Kind::Other && a.old_tos >> 2 == 48 {
            batch.push(s);
            break;
        }
    }
    d.run_frames(&batch);
    let r = d.report().clone();
    let audit: Vec<_> = r
        .first
        .iter()
        .filter(|x| x.lane == "tc_egress/audit")
        .collect();
    assert_eq!(audit.len(), 1, "{r}");
    assert_eq!(audit[0].index, Some(batch.len() - 1), "{}", audit[0]);
    assert!(audit[0].detail.contains("STATS differ"), "{}", audit[0]);
    assert!(
        audit[0].detail.contains("audit_intruders_would_remark"),
        "{}",
        audit[0]
    );
}

#[test]
fn skb_test_runs_refuse_ip_frames_shorter_than_their_ip_header() {
    // The tc lanes skip what the kernel will not run (`tc::refuses_skb_test_run`):
    // the rule must be the kernel's, neither more nor less.
    let mut h = TcHarness::load(
        &Policy::default(),
        roce_tests::differential::tc_lanes()[0].2,
    );
    for ethertype in [0x0800u16, 0x86DD, 0x8100, 0x88A8, 0x0806, 0x1234] {
        for fill in [0u8, 0x45, 0x60, 0xFF] {
            for len in 14..100 {
                let mut f = vec![fill; len];
                f[12..14].copy_from_slice(&ethertype.to_be_bytes());
                let refused = match h.try_run_on(TC_EGRESS, &f, 0, 0) {
                    Ok(_) => false,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => true,
                    Err(e) => panic!("{ethertype:#x} len {len}: {e}"),
                };
                assert_eq!(
                    refused,
                    refuses_skb_test_run(&f),
                    "EtherType {ethertype:#06x}, {len} bytes of {fill:#04x}"
                );
            }
        }
    }
}

/// The class with STATS index `i`.
fn class_at(i: usize) -> Class {
    use Class::*;
    [
        Roce,
        RoceInVxlan,
        VxlanOther,
        OtherUdp,
        OtherIp,
        NonIp,
        MirrorOther,
        MirrorTruncated,
    ][i]
}
