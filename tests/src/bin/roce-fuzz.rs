//! roce-fuzz: the differential run of `roce_tests::differential` at scale. Random and
//! structure-aware mutated frames through the real `xdp_classify`, `tc_egress` (audit,
//! enforce, VTEP, VTEP + enforce) and `tc_ingress` (VTEP) programs and through the
//! pure reference; prints progress, then a summary (packets, frames per class and
//! parse-error reason, per-lane decisions, disagreements, elapsed, packets/s) and
//! the first disagreements with the seed that replays them. Exit status 1 when there
//! is any. Run through `cargo xtask fuzz`; needs root to load BPF programs.

use std::time::Instant;

use clap::Parser;
use roce_common::counters::{STAT_CLASS_BASE, STAT_REASON_BASE};
use roce_common::parsed::{CLASS_NAMES, REASON_NAMES};
use roce_tests::differential::{other_policy, DiffOptions, Differential, Report};

#[derive(Parser)]
#[command(
    name = "roce-fuzz",
    about = "Differential fuzzing of the XDP and tc programs against the reference"
)]
struct Args {
    /// Frames to generate and run.
    #[arg(long, default_value_t = 1_000_000)]
    packets: u64,
    /// Seed of the generator (default: from the clock; printed, to replay a run).
    #[arg(long)]
    seed: Option<u64>,
    /// The policy and ports: `default`, or `other` (ports 4792/8472, PMTU 1024, other
    /// DSCPs, lossless set and priorities).
    #[arg(long, default_value = "default")]
    policy: String,
    /// XDP only (no tc lanes).
    #[arg(long)]
    no_tc: bool,
    /// Progress every this many packets (0: none).
    #[arg(long, default_value_t = 100_000)]
    progress: u64,
}

fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (std::process::id() as u64) << 32
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(clock_seed);
    let policy = match args.policy.as_str() {
        "default" => roce_common::policy::Policy::default(),
        "other" => other_policy(),
        p => anyhow::bail!("--policy {p}: expected `default` or `other`"),
    };
    let mut o = DiffOptions::new(policy);
    o.tc = !args.no_tc;
    let load = Instant::now();
    let mut d = Differential::new(&o, seed);
    eprintln!(
        "[fuzz] seed {seed} (--seed {seed} replays it), {} packets, policy {}, programs loaded in {:.1?}",
        args.packets,
        args.policy,
        load.elapsed()
    );
    let mut next = args.progress;
    let report = d
        .run(args.packets, |r| {
            if args.progress > 0 && r.packets >= next {
                next += args.progress;
                eprintln!(
                    "[fuzz] {}/{} packets, {} disagreements, {:.1?}, {:.0} packets/s",
                    r.packets,
                    args.packets,
                    r.disagreements,
                    r.elapsed,
                    r.packets_per_s()
                );
            }
        })
        .clone();
    print_summary(&report);
    if report.disagreements > 0 {
        for d in &report.first {
            println!("\n{d}");
        }
        anyhow::bail!(
            "{} disagreement(s); replay with --seed {}",
            report.disagreements,
            report.seed
        );
    }
    Ok(())
}

fn print_summary(r: &Report) {
    println!(
        "roce-fuzz: seed {}, {} packets, {} disagreements, {:.1?}, {:.0} packets/s",
        r.seed,
        r.packets,
        r.disagreements,
        r.elapsed,
        r.packets_per_s()
    );
    let classes: Vec<String> = CLASS_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| format!("{name}={}", r.xdp_stats[STAT_CLASS_BASE as usize + i]))
        .collect();
    println!("  classes: {}", classes.join(" "));
    let reasons: Vec<String> = REASON_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| format!("{name}={}", r.xdp_stats[STAT_REASON_BASE as usize + i]))
        .collect();
    println!("  parse errors: {}", reasons.join(" "));
    println!(
        "  flows: {:?}\n  BTH opcodes seen: {} of 256",
        r.flows,
        r.opcodes.len()
    );
    for (name, t) in &r.lanes {
        println!(
            "  {name}: {:?}; rewritten {}, priority set {}, decap checked {}, egress flows {}, refused by the test run {}",
            t.kinds, t.rewritten, t.priority_set, t.decap_checked, t.flows, t.refused
        );
    }
}
