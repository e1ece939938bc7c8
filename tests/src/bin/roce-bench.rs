//! roce-bench: what `xdp_classify` costs per packet, against an empty XDP program
//! measured in the same run (the machines are noisy: only the difference means much).
//! Run through `cargo xtask bench`; needs root to load BPF programs.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::BorrowedFd;

use anyhow::{Context, Result};
use clap::Parser;
use roce_agent::loader::{self, LoadOptions};
use roce_agent::packet::{self, Eth, RoceMsg, L3};
use roce_agent::testrun::{test_run, TestRun};

#[derive(Parser)]
#[command(name = "roce-bench", about = "Per-packet cost of roce-agent's XDP classifier vs an empty XDP program")]
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
}

/// One packet kind to measure, with the added cost the project aims for.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    target_added_ns: f64,
}

fn cases() -> Vec<Case> {
    let eth = Eth::default();
    let a4 = Ipv4Addr::new(198, 18, 0, 1);
    let b4 = Ipv4Addr::new(198, 18, 0, 2);
    let write = RoceMsg::write_only(0x1234, 100, 256);
    let roce_v4 = packet::roce_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xC000, &write);
    let inner = packet::roce_frame(
        &eth,
        &L3::v4(Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)).with_tos(106),
        0xC001,
        &write,
    );
    let vxlan = packet::vxlan_frame(&eth, &L3::v4(a4, b4).with_tos(106), 0xD000, 5001, &inner);
    let v6 = L3::v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2));
    let roce_v6 = packet::roce_frame(&eth, &v6.with_tos(106), 0xC000, &write);
    let udp = packet::udp_frame(&eth, &L3::v4(a4, b4), 40000, 53, &[0u8; 64]);
    let tcp = packet::ip_frame(&eth, &L3::v4(a4, b4), 6, &[0u8; 40]);
    vec![
        Case { name: "xdp_roce_ipv4", frame: roce_v4, target_added_ns: 15.0 },
        Case { name: "xdp_roce_in_vxlan", frame: vxlan, target_added_ns: 25.0 },
        Case { name: "xdp_roce_ipv6", frame: roce_v6, target_added_ns: 15.0 },
        Case { name: "xdp_other_udp", frame: udp, target_added_ns: 5.0 },
        Case { name: "xdp_tcp", frame: tcp, target_added_ns: 5.0 },
    ]
}

fn ns_per_packet(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> Result<u32> {
    let out = test_run(prog, &TestRun { data: frame, repeat, ..Default::default() }).context("BPF_PROG_TEST_RUN")?;
    Ok(out.duration_ns)
}

fn median(mut v: Vec<u32>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rounds = args.rounds.max(1);
    let mut loaded = loader::load(&LoadOptions::default()).context("loading the eBPF programs (root needed)")?;
    if !args.json {
        println!("{:<20} {:>10} {:>10} {:>9} {:>8}", "case", "ns/pkt", "empty", "added", "target");
    }
    for case in cases() {
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        // Interleave the two programs so that drift in the machine hits both alike.
        for _ in 0..rounds {
            base.push(ns_per_packet(loaded.baseline_xdp_fd()?, &case.frame, args.repeat)?);
            ours.push(ns_per_packet(loaded.xdp_fd()?, &case.frame, args.repeat)?);
        }
        let (ns, baseline) = (median(ours), median(base));
        let added = ns - baseline;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "name": case.name,
                    "ns_per_packet": ns,
                    "baseline_ns_per_packet": baseline,
                    "added_ns": added,
                    "target_added_ns": case.target_added_ns,
                    "repeat": args.repeat,
                    "rounds": rounds,
                })
            );
        } else {
            println!(
                "{:<20} {:>10.0} {:>10.0} {:>9.0} {:>8}",
                case.name,
                ns,
                baseline,
                added,
                format!("<= {}", case.target_added_ns)
            );
        }
    }
    Ok(())
}
