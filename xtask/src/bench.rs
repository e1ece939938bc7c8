//! `cargo xtask bench`: set-up, then the benchmark harness (`roce-bench` in the
//! tests crate, which loads the real programs), printing its table or JSON lines.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// One JSON object per line (name, ns_per_packet, baseline_ns_per_packet, added_ns, ...).
    #[arg(long)]
    pub json: bool,
    /// Runs of each packet through BPF_PROG_TEST_RUN (at least 10^6 for stable figures).
    #[arg(long, default_value_t = 2_000_000)]
    pub repeat: u32,
    /// Only `roce-agent analyze` against tshark (no per-packet, tc or throughput cases).
    #[arg(long)]
    pub only_analyze: bool,
    /// Only the cases and sections whose name contains this (e.g. `agent`: the agent at
    /// a million flows).
    #[arg(long)]
    pub only: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    xtask::setup::ensure_all()?;
    if !xtask::setup::is_root() {
        bail!("benchmarks load eBPF programs: run as root");
    }
    let mut cli = vec!["--repeat".to_string(), args.repeat.to_string()];
    if args.json {
        cli.push("--json".to_string());
    }
    if args.only_analyze {
        cli.push("--only-analyze".to_string());
    }
    if let Some(only) = &args.only {
        cli.extend(["--only".to_string(), only.clone()]);
    }
    xtask::run_tests_bin("roce-bench", &cli, "roce-bench failed")?;
    Ok(())
}
