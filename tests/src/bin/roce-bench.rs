//! roce-bench: what `xdp_classify` and the tc QoS programs cost per packet, against
//! an empty program of the same type measured in the same run (the machines are noisy:
//! only the difference means much), and the tc paths' throughput against their kernel
//! peers on the same namespace path (iptables DSCP target, VXLAN `tos inherit`).
//! Then `roce-agent analyze` of a 1,000,000-frame capture: frames/s of the default
//! engine and of each engine, and peak RSS, against tshark decoding the same file to
//! fields (`bench_analyze.rs`; `--only-analyze` runs that case alone).
//! Run through `cargo xtask bench`; needs root to load BPF programs.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::BorrowedFd;

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use clap::Parser;
use roce_agent::config::{HostMode, Settings};
use roce_agent::datapath::attach::Attachments;
use roce_agent::datapath::loader::{self, LoadOptions};
use roce_agent::datapath::qos::TcMechanism;
use roce_agent::datapath::testrun::{test_run, TestRun};
use roce_common::config::{RuntimeConfig, CONFIG_NO_RTT};
use roce_common::policy::{IfaceQos, Policy, ECN_KERNEL, HOST_ENFORCE};
use roce_testkit::frame::{self, Eth, RoceMsg, L3};
use roce_testkit::lab::{in_namespace, Lab, LabOptions};
use roce_testkit::sock::set_int_option;
use std::net::{SocketAddrV4, UdpSocket};
use std::time::Instant;

#[path = "../bench_agent.rs"]
mod bench_agent;
#[path = "../bench_analyze.rs"]
mod bench_analyze;
#[path = "../bench_qps.rs"]
mod bench_qps;

#[derive(Parser)]
#[command(
    name = "roce-bench",
    about = "Per-packet cost of roce-agent's XDP classifier vs an empty XDP program"
)]
struct Args {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Runs of each packet per measurement (BPF_PROG_TEST_RUN repeat).
    #[arg(long, default_value_t = 2_000_000)]
    repeat: u32,
    /// Measurements per case; the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds of traffic per throughput measurement (0 skips the throughput cases).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Frames of the capture that `roce-agent analyze` reads (0: no analyze case).
    #[arg(long, default_value_t = 1_000_000)]
    analyze_frames: u64,
    /// Frames of the same capture that tshark decodes (0: all).
    #[arg(long, default_value_t = 0)]
    analyze_tshark_frames: u64,
    /// Runs of each `roce-agent analyze` case (the median is reported; tshark runs once).
    #[arg(long, default_value_t = 3)]
    analyze_runs: usize,
    /// Only the analyze case (no BPF per-packet, tc or throughput cases).
    #[arg(long)]
    only_analyze: bool,
    /// Keep the analyze capture at FILE: written there when missing, read again when
    /// present (repeated runs then measure the same file without writing it anew).
    #[arg(long, value_name = "FILE")]
    analyze_capture: Option<std::path::PathBuf>,
    /// Sampled events in the measured tc programs: 1 in N of each kind (0: off, as
    /// `analyze` and the tests load them; `run` defaults to 1).
    #[arg(long, default_value_t = 0)]
    events_sample: u32,
    /// `xdp_classify` is measured with events off and with events on at 1 in N (the
    /// same loaded program, CONFIG switched before each measurement; 0: off only).
    #[arg(long, default_value_t = 1000)]
    events_cost_sample: u32,
    /// Only the cases whose name contains this (per-packet, cold table and tc cases;
    /// the throughput, analyze and agent sections run when their name matches too).
    #[arg(long)]
    only: Option<String>,
    /// Flows in the kernel tables of the agent section (0: no agent section).
    #[arg(long, default_value_t = 1_000_000)]
    agent_flows: u32,
    /// Collector polls in the agent section (the first makes no rates; the median of
    /// the others is reported).
    #[arg(long, default_value_t = 5)]
    agent_polls: usize,
    /// `GET /metrics` scrapes in the agent section.
    #[arg(long, default_value_t = 5)]
    agent_scrapes: usize,
    /// The agent section with CNPs on every flow (a congested fabric) instead of a
    /// tenth of them: the agent keeps such counters apart for the flows that have any.
    #[arg(long)]
    agent_troubled: bool,
    /// Refreshes of the QP table in the `qp_table_10k` case (the median is reported;
    /// 0: no QP table case).
    #[arg(long, default_value_t = 7)]
    qp_table_runs: usize,
    /// Internal: run the agent section itself (in the child process it starts).
    #[arg(long, hide = true)]
    agent_child: bool,
}

impl Args {
    fn wants(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|o| name.contains(o))
    }
}

/// The target for plain RoCE over IPv4: parsing and the flow update.
const PLAIN_ROCE_TARGET: f64 = 2.5;

/// One packet kind to measure, with the added cost the project aims for: at most
/// `target_ratio` times what the empty program itself costs in the same run.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    target_ratio: f64,
}

fn cases() -> Vec<Case> {
    let eth = Eth::default();
    let a4 = Ipv4Addr::new(198, 18, 0, 1);
    let b4 = Ipv4Addr::new(198, 18, 0, 2);
    let write = RoceMsg::write_only(0x1234, 100, 256);
    let roce_v4 = frame::roce_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xC000, &write);
    let inner = frame::roce_frame(
        &eth,
        &L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106),
        0xC001,
        &write,
    );
    let vxlan = frame::vxlan_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xD000, 5001, &inner);
    let v6 = L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    );
    let roce_v6 = frame::roce_frame(&eth, &v6.with_tos(106), 0xC000, &write);
    // The same packet with CE: an event of each kind it shows, sampled.
    let roce_v4_ce = frame::roce_frame(&eth, &L3::v4(a4, b4).with_tos(107), 0xC000, &write);
    let udp = frame::udp_frame(&eth, &L3::v4(a4, b4), 40000, 53, &[0u8; 64]);
    let tcp = frame::ip_frame(&eth, &L3::v4(a4, b4), 6, &[0u8; 40]);
    vec![
        Case {
            name: "xdp_roce_ipv4",
            frame: roce_v4,
            target_ratio: PLAIN_ROCE_TARGET,
        },
        Case {
            name: "xdp_roce_ipv4_ce",
            frame: roce_v4_ce,
            target_ratio: PLAIN_ROCE_TARGET,
        },
        Case {
            name: "xdp_roce_in_vxlan",
            frame: vxlan,
            target_ratio: 3.5,
        },
        Case {
            name: "xdp_roce_ipv6",
            frame: roce_v6,
            target_ratio: 3.0,
        },
        Case {
            name: "xdp_other_udp",
            frame: udp,
            target_ratio: 0.5,
        },
        Case {
            name: "xdp_tcp",
            frame: tcp,
            target_ratio: 0.5,
        },
    ]
}

fn ns_per_packet(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> Result<u32> {
    let out = test_run(
        prog,
        &TestRun {
            data: frame,
            repeat,
            ..Default::default()
        },
    )
    .context("BPF_PROG_TEST_RUN")?;
    Ok(out.duration_ns)
}

/// The median of the measurements of one case (the upper one of an even count), as
/// every section of the bench reports them. `v` is never empty: rounds are at least 1.
fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------
// tc programs through BPF_PROG_TEST_RUN

/// One tc case: a frame, the interface mode, and whether the frame is rewritten (then
/// every run needs fresh input: repeats reuse the already-rewritten buffer).
struct TcCase {
    name: &'static str,
    frame: Vec<u8>,
    iface: IfaceQos,
    program: &'static str,
    rewrites: bool,
    /// Whether `tc_egress` counts the egress flow (tail call to `tc_egress_flows`);
    /// off, the case measures the policy decision alone.
    egress_flows: bool,
}

/// `case` with the TC_TAIL slot emptied, named `name`: the policy decision alone,
/// without the egress flow.
fn decision_only(case: &TcCase, name: &'static str) -> TcCase {
    TcCase {
        name,
        frame: case.frame.clone(),
        egress_flows: false,
        ..*case
    }
}

/// The tc target, for the cases of RoCE that already carries the right DSCP (the
/// rewrite cases are judged by throughput, the others have none). The decision costs
/// at most one empty program (1.0x); a kept frame that also counts its egress flow,
/// the same flow update as XDP's, may add plain RoCE's 2.5x: 3.5x.
fn kept_target(case: &TcCase) -> Option<f64> {
    const DECISION: f64 = 1.0;
    if case.rewrites || !case.name.contains("_kept") {
        return None;
    }
    Some(if case.egress_flows {
        DECISION + PLAIN_ROCE_TARGET
    } else {
        DECISION
    })
}

fn tc_cases() -> Vec<TcCase> {
    let eth = Eth::default();
    let a4 = Ipv4Addr::new(198, 18, 0, 1);
    let b4 = Ipv4Addr::new(198, 18, 0, 2);
    let v6 = L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    );
    let write = RoceMsg::write_only(0x1234, 100, 256);
    let enforce = IfaceQos {
        host: HOST_ENFORCE,
        vtep: 0,
        ecn: ECN_KERNEL,
        _pad: 0,
    };
    let vtep = IfaceQos {
        host: 0,
        vtep: 1,
        ecn: ECN_KERNEL,
        _pad: 0,
    };
    let inner = frame::roce_frame(
        &eth,
        &L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106),
        0xC001,
        &write,
    );
    // Non-RoCE UDP on the lossless DSCP 26: an intruder where the policy applies.
    let intruder = frame::udp_frame(
        &eth,
        &L3::v4(a4, b4).with_tos(106),
        40000,
        5001,
        &[0u8; 256],
    );
    let kept = TcCase {
        name: "tc_egress_roce_ipv4_kept",
        frame: frame::roce_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xC000, &write),
        iface: enforce,
        program: loader::TC_EGRESS,
        rewrites: false,
        egress_flows: true,
    };
    let v6_rewritten = TcCase {
        name: "tc_egress_roce_ipv6_rewritten",
        frame: frame::roce_frame(&eth, &v6.with_tos(2), 0xC000, &write),
        iface: enforce,
        program: loader::TC_EGRESS,
        rewrites: true,
        egress_flows: true,
    };
    let vtep_propagated = TcCase {
        name: "tc_egress_vtep_ipv4_propagated",
        frame: frame::vxlan_frame(&eth, &L3::v4(a4, b4), 0xD000, 5001, &inner),
        iface: vtep,
        program: loader::TC_EGRESS,
        rewrites: true,
        egress_flows: true,
    };
    let kept_decision_only = decision_only(&kept, "tc_egress_roce_ipv4_kept_decision_only");
    let v6_rewritten_decision_only =
        decision_only(&v6_rewritten, "tc_egress_roce_ipv6_rewritten_decision_only");
    let vtep_propagated_decision_only = decision_only(
        &vtep_propagated,
        "tc_egress_vtep_ipv4_propagated_decision_only",
    );
    vec![
        kept,
        kept_decision_only,
        TcCase {
            name: "tc_egress_roce_ipv4_ce_kept",
            frame: frame::roce_frame(&eth, &L3::v4(a4, b4).with_tos(107), 0xC000, &write),
            iface: enforce,
            program: loader::TC_EGRESS,
            rewrites: false,
            egress_flows: true,
        },
        TcCase {
            name: "tc_egress_intruder_ipv4_remarked",
            frame: intruder.clone(),
            iface: enforce,
            program: loader::TC_EGRESS,
            rewrites: true,
            egress_flows: true,
        },
        v6_rewritten,
        v6_rewritten_decision_only,
        vtep_propagated,
        vtep_propagated_decision_only,
        TcCase {
            name: "tc_ingress_decap_check",
            frame: frame::vxlan_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xD000, 5001, &inner),
            iface: vtep,
            program: loader::TC_INGRESS,
            rewrites: false,
            egress_flows: true,
        },
        TcCase {
            name: "tc_egress_unconfigured_iface",
            frame: intruder,
            iface: IfaceQos::default(),
            program: loader::TC_EGRESS,
            rewrites: false,
            egress_flows: true,
        },
    ]
}

/// Mean ns per run: `repeat` runs of one buffer, or (fresh) many single runs of the
/// original frame, averaging the kernel's own per-run duration.
fn tc_ns(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32, fresh: bool) -> Result<f64> {
    let ctx = [0u8; 192];
    if !fresh {
        let out = test_run(
            prog,
            &TestRun {
                data: frame,
                repeat,
                ctx_in: Some(&ctx),
                ctx_out_len: 0,
            },
        )
        .context("BPF_PROG_TEST_RUN")?;
        return Ok(out.duration_ns as f64);
    }
    let runs = (repeat / 100).clamp(1000, 20_000);
    let mut total = 0u64;
    for _ in 0..runs {
        let out = test_run(
            prog,
            &TestRun {
                data: frame,
                repeat: 1,
                ctx_in: Some(&ctx),
                ctx_out_len: 0,
            },
        )
        .context("BPF_PROG_TEST_RUN")?;
        total += out.duration_ns as u64;
    }
    Ok(total as f64 / runs as f64)
}

/// What the measured programs are loaded with (`--events-sample`).
fn load_options(args: &Args) -> LoadOptions {
    LoadOptions {
        config: RuntimeConfig {
            events_sample: args.events_sample,
            ..RuntimeConfig::default()
        },
        ..LoadOptions::default()
    }
}

/// Empties the EVENTS ring between measurements, so that a full ring never changes
/// what is measured.
fn drain(ring: &mut Option<RingBuf<MapData>>) {
    if let Some(r) = ring.as_mut() {
        while r.next().is_some() {}
    }
}

/// `xdp_classify` per packet: each case through the empty program and through
/// `xdp_classify` with events off and with events 1 in N (the same loaded program, CONFIG
/// switched before each measurement), interleaved in every round, the order of the two
/// event settings alternating, so that the machine's drift hits all three alike.
fn bench_xdp(args: &Args, rounds: usize) -> Result<()> {
    let n = args.events_cost_sample;
    let config = |events_sample| RuntimeConfig {
        events_sample,
        ..RuntimeConfig::default()
    };
    let mut loaded =
        loader::load(&LoadOptions::default()).context("loading the eBPF programs (root needed)")?;
    let mut ring = Some(loaded.take_events()?);
    if !args.json && cases().iter().any(|c| args.wants(c.name)) {
        println!(
            "{:<34} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "xdp case", "ns/pkt", "empty", "added", "ratio", "target"
        );
    }
    for case in cases().into_iter().filter(|c| args.wants(c.name)) {
        let (mut base, mut off, mut on) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            drain(&mut ring);
            base.push(ns_per_packet(
                loaded.baseline_xdp_fd()?,
                &case.frame,
                args.repeat,
            )?);
            let order: &[u32] = match (n, round % 2) {
                (0, _) => &[0],
                (_, 0) => &[0, n],
                _ => &[n, 0],
            };
            for &sample in order {
                loaded.set_config(&config(sample))?;
                let ns = ns_per_packet(loaded.xdp_fd()?, &case.frame, args.repeat)?;
                if sample == 0 {
                    off.push(ns);
                } else {
                    on.push(ns);
                }
            }
        }
        let baseline = f64::from(median(base));
        report_per_packet(
            args,
            case.name,
            f64::from(median(off)),
            baseline,
            case.target_ratio,
            0,
            rounds,
        );
        if n > 0 {
            let label = format!("{}_events_1_in_{n}", case.name);
            report_per_packet(
                args,
                &label,
                f64::from(median(on)),
                baseline,
                case.target_ratio,
                n,
                rounds,
            );
        }
    }
    loaded.set_config(&config(0))?;
    Ok(())
}

/// One per-packet line: the cost over the empty program of the same run, as ns and
/// as a ratio to what the empty program costs, against the target ratio.
fn report_per_packet(
    args: &Args,
    name: &str,
    ns: f64,
    baseline: f64,
    target_ratio: f64,
    events_sample: u32,
    rounds: usize,
) {
    let added = ns - baseline;
    let ratio = added / baseline;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "name": name,
                "ns_per_packet": ns,
                "baseline_ns_per_packet": baseline,
                "added_ns": added,
                "added_ratio": (ratio * 100.0).round() / 100.0,
                "target_added_ratio": target_ratio,
                "met": ratio <= target_ratio,
                "repeat": args.repeat,
                "rounds": rounds,
                "events_sample": events_sample,
            })
        );
    } else {
        println!(
            "{name:<34} {ns:>8.0} {baseline:>8.0} {added:>8.0} {ratio:>7.2}x {:>8}",
            format!("<= {target_ratio}x")
        );
    }
}

/// `xdp_mirror` (mirror collector interfaces, `run --mirror`) per packet against the
/// empty program: RoCE copies in ERSPAN III and GRE (its walk in `xdp_mirror`, then
/// the tail-called `xdp_mirror_flows`), and a plain RoCE frame, which it tail-calls to
/// `xdp_classify`. No target: mirror collectors are not the hot path of a GPU host;
/// the lines say what a copy costs.
fn bench_xdp_mirror(args: &Args, rounds: usize) -> Result<()> {
    use roce_testkit::mirror::{mirror_frame, Encap};
    let eth = Eth::default();
    let write = RoceMsg::write_only(0x1234, 100, 256);
    let a4 = Ipv4Addr::new(198, 18, 0, 1);
    let b4 = Ipv4Addr::new(198, 18, 0, 2);
    let roce_v4 = frame::roce_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xC000, &write);
    let outer4 = L3::v4(Ipv4Addr::new(198, 18, 9, 1), Ipv4Addr::new(198, 18, 9, 2));
    let outer6 = L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2),
    );
    let cases = [
        (
            "xdp_mirror_erspan3_roce_ipv4",
            mirror_frame(&eth, &outer4, &Encap::erspan3(17), &roce_v4),
        ),
        (
            "xdp_mirror_gre_over_ipv6_roce_ipv4",
            mirror_frame(&eth, &outer6, &Encap::gre(7), &roce_v4),
        ),
        ("xdp_mirror_plain_roce_ipv4", roce_v4.clone()),
    ];
    if !cases.iter().any(|(name, _)| args.wants(name)) {
        return Ok(());
    }
    let mut loaded =
        loader::load(&LoadOptions::default()).context("loading the eBPF programs (root needed)")?;
    loaded.xdp_mirror_fd()?;
    for (name, frame) in cases.iter().filter(|(name, _)| args.wants(name)) {
        let (mut base, mut ns) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            base.push(ns_per_packet(
                loaded.baseline_xdp_fd()?,
                frame,
                args.repeat,
            )?);
            let fd = loaded.loaded_xdp_fd(roce_common::names::program::XDP_MIRROR)?;
            ns.push(ns_per_packet(fd, frame, args.repeat)?);
        }
        report_per_packet(
            args,
            name,
            f64::from(median(ns)),
            f64::from(median(base)),
            f64::INFINITY,
            0,
            rounds,
        );
    }
    Ok(())
}

/// Flows in the cold-table case: each lookup finds its entry, none in the CPU's cache.
const COLD_FLOWS: u32 = 65_536;

/// `xdp_classify` on a cold table: COLD_FLOWS plain IPv4 flows (one QP each) sent
/// round-robin, one BPF_PROG_TEST_RUN per packet against the empty program on the same
/// frame, after a first pass that created every flow. The kernel's per-run duration
/// excludes the syscall, so the mean difference is the program's.
fn bench_xdp_cold(args: &Args, rounds: usize) -> Result<()> {
    let name = "xdp_roce_ipv4_cold_64k";
    if !args.wants(name) {
        return Ok(());
    }
    let opts = LoadOptions {
        // Twice the flows: no LRU eviction, every packet a hit.
        flows_max_entries: COLD_FLOWS * 2,
        ..LoadOptions::default()
    };
    let mut loaded = loader::load(&opts).context("loading the eBPF programs (root needed)")?;
    let eth = Eth::default();
    let l3 = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106);
    let frames: Vec<Vec<u8>> = (0..COLD_FLOWS)
        .map(|qp| frame::roce_frame(&eth, &l3, 0xC000, &RoceMsg::write_only(qp + 1, 100, 256)))
        .collect();
    let once = |fd: BorrowedFd<'_>, f: &[u8]| ns_per_packet(fd, f, 1);
    for f in &frames {
        once(loaded.xdp_fd()?, f)?;
    }
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..rounds.min(3) {
        let (mut o, mut b) = (0u64, 0u64);
        for f in &frames {
            b += once(loaded.baseline_xdp_fd()?, f)? as u64;
            o += once(loaded.xdp_fd()?, f)? as u64;
        }
        ours.push(o as f64 / COLD_FLOWS as f64);
        base.push(b as f64 / COLD_FLOWS as f64);
    }
    let created = loaded.stats()?[roce_common::counters::STAT_FLOW_CREATED as usize];
    let (ns, baseline) = (median(ours), median(base));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "name": name,
                "ns_per_packet": ns,
                "baseline_ns_per_packet": baseline,
                "added_ns": ns - baseline,
                "added_ratio": (((ns - baseline) / baseline) * 100.0).round() / 100.0,
                "flows": COLD_FLOWS,
                "flows_created": created,
                "repeat": 1,
            })
        );
    } else {
        println!(
            "{name:<34} {ns:>8.0} {baseline:>8.0} {:>8.0} {:>7.2}x {:>8}",
            ns - baseline,
            (ns - baseline) / baseline,
            format!("{created} flows")
        );
    }
    Ok(())
}

/// Frames of the in-order case: consecutive PSNs of one flow.
const IN_ORDER_FRAMES: u32 = 20_000;

/// `xdp_classify` on one flow whose PSNs advance, as a long flow's do: the repeated
/// frame of `xdp_roce_ipv4` carries one PSN again and again, a go-back every time
/// (counted as a retransmission and a timeout), where a flow in its steady state
/// sends each PSN once. One BPF_PROG_TEST_RUN per frame, PSNs 100, 101, ... in order,
/// against the empty program on the same frames; a round starts a new flow (a new
/// QP), so that each frame is in order.
fn bench_xdp_in_order(args: &Args, rounds: usize) -> Result<()> {
    let name = "xdp_roce_ipv4_in_order";
    if !args.wants(name) {
        return Ok(());
    }
    let mut loaded =
        loader::load(&LoadOptions::default()).context("loading the eBPF programs (root needed)")?;
    let eth = Eth::default();
    let l3 = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106);
    let once = |fd: BorrowedFd<'_>, f: &[u8]| ns_per_packet(fd, f, 1);
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..rounds as u32 {
        let frames: Vec<Vec<u8>> = (0..IN_ORDER_FRAMES)
            .map(|i| {
                let m = RoceMsg::write_only(0x2000 + round, 100 + i, 256);
                frame::roce_frame(&eth, &l3, 0xC000, &m)
            })
            .collect();
        // The flow's first packet makes it: not the steady state.
        once(loaded.xdp_fd()?, &frames[0])?;
        let (mut o, mut b) = (0u64, 0u64);
        for f in &frames[1..] {
            b += once(loaded.baseline_xdp_fd()?, f)? as u64;
            o += once(loaded.xdp_fd()?, f)? as u64;
        }
        let n = f64::from(IN_ORDER_FRAMES - 1);
        ours.push(o as f64 / n);
        base.push(b as f64 / n);
    }
    let resent: u64 = loaded
        .flows()?
        .iter()
        .map(|(_, st)| st.retransmitted_packets + st.psn_gaps)
        .sum();
    let (ns, baseline) = (median(ours), median(base));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "name": name,
                "ns_per_packet": ns,
                "baseline_ns_per_packet": baseline,
                "added_ns": ns - baseline,
                "added_ratio": (((ns - baseline) / baseline) * 100.0).round() / 100.0,
                "frames": IN_ORDER_FRAMES,
                "resent_or_gaps": resent,
                "repeat": 1,
                "rounds": rounds,
            })
        );
    } else {
        println!(
            "{name:<34} {ns:>8.0} {baseline:>8.0} {:>8.0} {:>7.2}x {:>8}",
            ns - baseline,
            (ns - baseline) / baseline,
            format!("{resent} resent")
        );
    }
    Ok(())
}

/// One `bench_rtt` line's measurements, by round: (name, sampling on, sampling off,
/// the empty programs), ns.
type RttMeasures<'a> = (&'a str, Vec<f64>, Vec<f64>, Vec<f64>);

/// Frames of each round of [`bench_rtt`], and request-ACK pairs.
const RTT_FRAMES: u32 = 2000;
const RTT_PAIRS: u32 = 500;

/// What round-trip sampling adds per packet: the same loaded programs with sampling on
/// and off (CONFIG_NO_RTT), one BPF_PROG_TEST_RUN per frame, alternating, against the
/// empty programs on the same frames.
/// - `rtt_tc_request`: requests with AckReq leaving through `tc_egress`, PSNs in order
///   on one flow whose sample waits (no response comes): each checks the flow's mark.
/// - `rtt_xdp_ack`: ACKs arriving in `xdp_classify` whose PSN no sample waits at: each
///   checks RTT_WAIT_PSNS.
/// - `rtt_sample_first`: a request and the ACK that ends its sample, per pair, each
///   pair on new flows: starting and ending a flow's first sample (RTT_WAIT insert and
///   delete, the clock twice, a new histogram in RTT_HIST).
/// - `rtt_sample`: the same pairs' flows a tick later: a sample of a flow that has its
///   histogram (the steady state; a flow samples at most once a tick).
fn bench_rtt(args: &Args, rounds: usize) -> Result<()> {
    let names = [
        "rtt_tc_request",
        "rtt_xdp_ack",
        "rtt_sample",
        "rtt_sample_first",
    ];
    if !names.iter().any(|n| args.wants(n)) {
        return Ok(());
    }
    let mut loaded =
        loader::load(&load_options(args)).context("loading the eBPF programs (root needed)")?;
    loaded.tc_fd(loader::TC_EGRESS)?;
    loaded.set_policy(&Policy::default())?;
    loaded.set_iface_qos(
        1,
        Some(IfaceQos {
            host: roce_common::policy::HOST_AUDIT,
            vtep: 0,
            ecn: roce_common::policy::ECN_KERNEL,
            _pad: 0,
        }),
    )?;
    loaded.set_egress_flow_counting(true)?;
    let mut ring = Some(loaded.take_events()?);
    let config = |flags| RuntimeConfig {
        flags,
        events_sample: args.events_sample,
        ..RuntimeConfig::default()
    };
    let eth = Eth::default();
    let out = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106);
    let back = L3::v4(Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1)).with_tos(106);
    let request = |qp: u32, psn: u32| {
        let m = RoceMsg::write_only(qp, psn, 256).with_ack_req(true);
        frame::roce_frame(&eth, &out, 0xC000, &m)
    };
    let ack =
        |qp: u32, psn: u32| frame::roce_frame(&eth, &back, 0xC000, &RoceMsg::ack(qp, psn, 0x1F));
    let tc_once = |fd: BorrowedFd<'_>, f: &[u8]| tc_ns(fd, f, 1, false);
    let xdp_once = |fd: BorrowedFd<'_>, f: &[u8]| ns_per_packet(fd, f, 1).map(f64::from);
    // (name, on, off, empty) ns per packet (per pair for rtt_sample), medians of rounds.
    let mut results: Vec<RttMeasures> = names
        .iter()
        .map(|n| (*n, Vec::new(), Vec::new(), Vec::new()))
        .collect();
    for round in 0..rounds as u32 {
        drain(&mut ring);
        // Sampling on and off alternate first from round to round.
        let order = if round % 2 == 0 {
            [0, CONFIG_NO_RTT]
        } else {
            [CONFIG_NO_RTT, 0]
        };
        for (k, flags) in order.into_iter().enumerate() {
            loaded.set_config(&config(flags))?;
            // A new flow each round and setting: its first request makes it (and
            // takes the sample that then waits); the others are measured.
            let qp = 0x3000 + round * 2 + k as u32;
            tc_once(loaded.tc_fd(loader::TC_EGRESS)?, &request(qp, 99))?;
            let (mut req, mut acks, mut pairs, mut first) = (0.0, 0.0, 0.0, 0.0);
            let (mut req_base, mut ack_base) = (0.0, 0.0);
            for psn in 100..100 + RTT_FRAMES {
                let r = request(qp, psn);
                req += tc_once(loaded.tc_fd(loader::TC_EGRESS)?, &r)?;
                req_base += tc_once(loaded.tc_fd(loader::TC_BASELINE)?, &r)?;
                // Not the waiting sample's PSN (99): nothing ends.
                let a = ack(qp + 0x10_0000, psn);
                acks += xdp_once(loaded.xdp_fd()?, &a)?;
                ack_base += xdp_once(loaded.baseline_xdp_fd()?, &a)?;
            }
            // Pairs, each on new flows (a flow samples at most once a tick): the
            // request starts a sample, its ACK ends it and makes the ACK flow's
            // histogram. New flows cost both settings alike.
            let pair_qp = 0x40_0000 + (round * 2 + k as u32) * RTT_PAIRS * 2;
            for i in 0..RTT_PAIRS {
                let q = pair_qp + 2 * i;
                first += tc_once(loaded.tc_fd(loader::TC_EGRESS)?, &request(q, 7))?;
                first += xdp_once(loaded.xdp_fd()?, &ack(q + 1, 7))?;
            }
            // The same flows a tick later (their histograms made): the steady state.
            std::thread::sleep(std::time::Duration::from_millis(11));
            for i in 0..RTT_PAIRS {
                let q = pair_qp + 2 * i;
                pairs += tc_once(loaded.tc_fd(loader::TC_EGRESS)?, &request(q, 8))?;
                pairs += xdp_once(loaded.xdp_fd()?, &ack(q + 1, 8))?;
            }
            let n = f64::from(RTT_FRAMES);
            let on = flags == 0;
            let per_pair = pairs / f64::from(RTT_PAIRS);
            let per_first = first / f64::from(RTT_PAIRS);
            for (i, v) in [req / n, acks / n, per_pair, per_first]
                .into_iter()
                .enumerate()
            {
                if on {
                    results[i].1.push(v);
                } else {
                    results[i].2.push(v);
                }
            }
            if k == 0 {
                results[0].3.push(req_base / n);
                results[1].3.push(ack_base / n);
                results[2].3.push((req_base + ack_base) / n);
                results[3].3.push((req_base + ack_base) / n);
            }
        }
    }
    loaded.set_config(&config(0))?;
    let samples: u64 = loaded.rtt_hists()?.values().map(|h| h.samples).sum();
    for (name, on, off, base) in results {
        if !args.wants(name) {
            continue;
        }
        let (on, off, base) = (fmedian(on), fmedian(off), fmedian(base));
        let added = on - off;
        // The per-packet target of issue 32; a sample is two packets' worth.
        let target = if name.starts_with("rtt_sample") {
            None
        } else {
            Some(15.0)
        };
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "name": name,
                    "ns_per_packet": on,
                    "rtt_off_ns_per_packet": off,
                    "baseline_ns_per_packet": base,
                    "added_ns": added,
                    "added_ratio_over_flow_update": ((added / (off - base)) * 100.0).round() / 100.0,
                    "target_added_ns": target,
                    "met": target.is_none_or(|t| added <= t),
                    "frames": RTT_FRAMES,
                    "samples": samples,
                    "rounds": rounds,
                })
            );
        } else {
            println!(
                "{name:<34} {on:>8.0} {off:>8.0} {base:>8.0} {added:>8.1} {:>10}",
                target.map_or("per pair".to_string(), |t| format!("<= {t} ns"))
            );
        }
    }
    Ok(())
}

/// The median of `v` (0 when empty).
fn fmedian(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench_tc(args: &Args, rounds: usize) -> Result<()> {
    let mut loaded =
        loader::load(&load_options(args)).context("loading the eBPF programs (root needed)")?;
    loaded.tc_fd(loader::TC_EGRESS)?;
    let mut ring = Some(loaded.take_events()?);
    loaded.set_policy(&Policy::default())?;
    for case in tc_cases().into_iter().filter(|c| args.wants(c.name)) {
        loaded.set_iface_qos(1, Some(case.iface))?;
        loaded.set_egress_flow_counting(case.egress_flows)?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            drain(&mut ring);
            base.push(tc_ns(
                loaded.tc_fd(loader::TC_BASELINE)?,
                &case.frame,
                args.repeat,
                case.rewrites,
            )?);
            ours.push(tc_ns(
                loaded.tc_fd(case.program)?,
                &case.frame,
                args.repeat,
                case.rewrites,
            )?);
        }
        let (ns, baseline) = (median(ours), median(base));
        let ratio = (ns - baseline) / baseline;
        let target = kept_target(&case);
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "name": case.name,
                    "ns_per_packet": ns,
                    "baseline_ns_per_packet": baseline,
                    "added_ns": ns - baseline,
                    "added_ratio": (ratio * 100.0).round() / 100.0,
                    "target_added_ratio": target,
                    "met": target.map(|t| ratio <= t),
                    "fresh_input": case.rewrites,
                    "egress_flow_counted": case.egress_flows,
                    "repeat": args.repeat,
                    "rounds": rounds,
                    "events_sample": args.events_sample,
                })
            );
        } else {
            println!(
                "{:<38} {:>8.0} {:>8.0} {:>8.0} {:>7.2}x {:>8} {:>8}",
                case.name,
                ns,
                baseline,
                ns - baseline,
                ratio,
                target.map_or(String::new(), |t| format!("<= {t}x")),
                if case.rewrites { "fresh" } else { "repeat" }
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Throughput on a namespace path

/// Sends UDP datagrams with TOS `tos` to `dst` for `secs` seconds from the calling
/// thread's namespace; returns packets per second.
fn flood(dst: Ipv4Addr, tos: u8, secs: f64) -> Result<f64> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, tos as i32).context("IP_TOS")?;
    sock.connect(SocketAddrV4::new(dst, 9))?;
    let payload = [0u8; 64];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..256 {
            // ENOBUFS / ECONNREFUSED (ICMP from the peer) are part of a flood.
            if sock.send(&payload).is_ok() {
                n += 1;
            }
        }
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Floods from namespace `ns`, with the QoS programs attached as `settings` say (None: none).
fn flood_in(ns: &str, settings: Option<Settings>, dst: Ipv4Addr, secs: f64) -> Result<f64> {
    in_namespace(ns, move || {
        let mut loaded = loader::load(&LoadOptions::default())?;
        let _attached = match &settings {
            Some(s) => Some(Attachments::tc_only(&mut loaded, s, TcMechanism::Auto)?),
            None => None,
        };
        flood(dst, 106, secs)
    })
}

/// Prints one throughput comparison. `ours[i]` and `theirs[i]` are the floods of
/// round i, back to back: the ratio is the median of the rounds' own ratios (a pair
/// shares the machine's state of its moment), the pps the medians of each side. The
/// rounds' ratios are printed too: on these VMs they spread by a third, so a ratio
/// near 1.0 says "no difference this bench can see", not which is faster.
fn throughput_line(args: &Args, name: &str, peer: &str, ours: &[f64], theirs: &[f64]) {
    let pps = median(ours.to_vec());
    let peer_pps = median(theirs.to_vec());
    let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(o, t)| o / t).collect();
    let ratio = median(ratios.clone());
    let extra_pct = (1.0 / ratio - 1.0) * 100.0;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"name": name, "peer": peer, "pps": pps, "peer_pps": peer_pps,
                "ratio": ratio, "round_ratios": ratios, "extra_pct": extra_pct,
                "seconds": args.seconds, "target_ratio": 1.0, "met": ratio >= 1.0})
        );
    } else {
        let spread = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        println!(
            "{name:<34} {pps:>10.0} pps vs {peer} {peer_pps:>10.0} pps: ratio {ratio:.3} (median of {} rounds, {:.2}-{:.2}), extra {extra_pct:+.1} %",
            ratios.len(),
            spread.0,
            spread.1
        );
    }
}

/// `rounds` measurements of each side, in ABBA order: which goes first alternates
/// (ours in even rounds), so that neither gains from its place in a round.
fn interleaved(
    rounds: usize,
    mut ours: impl FnMut() -> Result<f64>,
    mut theirs: impl FnMut() -> Result<f64>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut o, mut t) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round.is_multiple_of(2) {
            o.push(ours()?);
            t.push(theirs()?);
        } else {
            t.push(theirs()?);
            o.push(ours()?);
        }
    }
    Ok((o, t))
}

fn bench_throughput(args: &Args, rounds: usize) -> Result<()> {
    let lab = |tos_inherit: bool| {
        Lab::new(LabOptions {
            vxlan: true,
            tos_inherit,
            ipv6: false,
            ..LabOptions::default()
        })
    };
    // 1. Remarking intruders on a veth: our tc_egress (enforce) vs the iptables DSCP target.
    {
        let l = lab(false)?;
        let veth = l.a.veth.clone();
        let rule = [
            "-t",
            "mangle",
            "-A",
            "POSTROUTING",
            "-o",
            veth.as_str(),
            "-p",
            "udp",
            "-m",
            "dscp",
            "--dscp",
            "26",
            "-j",
            "DSCP",
            "--set-dscp",
            "0",
        ];
        let del: Vec<&str> = rule
            .iter()
            .map(|a| if *a == "-A" { "-D" } else { *a })
            .collect();
        let settings = Settings {
            interfaces: vec![veth.clone()],
            mode: HostMode::Enforce,
            ..Settings::default()
        };
        let (ours, theirs) = interleaved(
            rounds,
            || flood_in(&l.a.ns, Some(settings.clone()), l.b.ip4, args.seconds),
            || {
                l.exec(&l.a.ns, "iptables", &rule)?;
                let peer = flood_in(&l.a.ns, None, l.b.ip4, args.seconds);
                l.exec(&l.a.ns, "iptables", &del)?;
                peer
            },
        )?;
        throughput_line(
            args,
            "tc_remark_intruders_veth",
            "iptables_dscp_target",
            &ours,
            &theirs,
        );
    }
    // 2. VTEP propagation: a tos 0 tunnel + tc_egress on its underlay vs tos inherit.
    {
        let inherit = lab(true)?;
        let ours_lab = lab(false)?;
        let settings = Settings {
            vteps: vec![ours_lab.a.veth.clone()],
            ..Settings::default()
        };
        let ours_dst = ours_lab.b.vxlan_ip4.context("VXLAN lab")?;
        let inherit_dst = inherit.b.vxlan_ip4.context("VXLAN lab")?;
        let (ours, theirs) = interleaved(
            rounds,
            || {
                flood_in(
                    &ours_lab.a.ns,
                    Some(settings.clone()),
                    ours_dst,
                    args.seconds,
                )
            },
            || flood_in(&inherit.a.ns, None, inherit_dst, args.seconds),
        )?;
        throughput_line(
            args,
            "tc_vtep_propagation_vxlan",
            "kernel_tos_inherit",
            &ours,
            &theirs,
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let analyze = bench_analyze::Options {
        json: args.json,
        frames: args.analyze_frames,
        tshark_frames: args.analyze_tshark_frames,
        capture: args.analyze_capture.clone(),
        runs: args.analyze_runs,
    };
    if args.only_analyze {
        return bench_analyze::run(&analyze);
    }
    let agent = bench_agent::Options {
        json: args.json,
        flows: args.agent_flows,
        troubled: args.agent_troubled,
        polls: args.agent_polls,
        scrapes: args.agent_scrapes,
    };
    if args.agent_child {
        return bench_agent::child(&agent);
    }
    let rounds = args.rounds.max(1);
    if cases().iter().any(|c| args.wants(c.name)) {
        bench_xdp(&args, rounds)?;
    }
    bench_xdp_mirror(&args, rounds)?;
    bench_xdp_cold(&args, rounds)?;
    bench_xdp_in_order(&args, rounds)?;
    bench_rtt(&args, rounds)?;
    if tc_cases().iter().any(|c| args.wants(c.name)) {
        if !args.json {
            println!(
                "{:<38} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
                "tc case", "ns/pkt", "empty", "added", "ratio", "target", "input"
            );
        }
        bench_tc(&args, rounds)?;
    }
    if args.seconds > 0.0 && args.wants("throughput") {
        bench_throughput(&args, rounds)?;
    }
    if args.analyze_frames > 0 && args.wants("analyze") {
        bench_analyze::run(&analyze)?;
    }
    if args.agent_flows > 0 && args.wants("agent") {
        bench_agent::run(&agent)?;
    }
    if args.qp_table_runs > 0 && args.wants("qp_table") {
        bench_qps::run(&bench_qps::Options {
            json: args.json,
            runs: args.qp_table_runs,
        })?;
    }
    Ok(())
}
