//! `cargo xtask fuzz`: set-up, then the differential fuzzer (`roce-fuzz` in the tests
//! crate, `roce_tests::differential`): N random and structure-aware mutated frames
//! through the real XDP and tc programs and the reference, zero disagreements allowed.
//! The cargo-fuzz targets of the parsers (`fuzz/`) run apart: docs/testing.md.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Frames to generate and run through every program and the reference.
    #[arg(long, default_value_t = 1_000_000)]
    pub packets: u64,
    /// Seed of the generator (default: from the clock; printed, to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// `default`, or `other` (ports 4792/8472, PMTU 1024, other DSCPs and priorities).
    #[arg(long, default_value = "default")]
    pub policy: String,
}

pub fn run(args: Args) -> Result<()> {
    // The eBPF object needs nightly and bpf-linker; no Debian tool is used.
    xtask::setup::ensure_rust()?;
    if !xtask::setup::is_root() {
        bail!("the differential fuzzer loads eBPF programs: run as root");
    }
    let packets = args.packets.to_string();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "roce-tests",
        "--bin",
        "roce-fuzz",
        "--",
        "--packets",
        &packets,
        "--policy",
        &args.policy,
    ]);
    if let Some(seed) = args.seed {
        cmd.args(["--seed", &seed.to_string()]);
    }
    let status = cmd.status().context("running roce-fuzz")?;
    if !status.success() {
        bail!("roce-fuzz found disagreements or failed ({status})");
    }
    Ok(())
}
