//! `cargo xtask fuzz`: set-up, then the differential fuzzer (`roce-fuzz` in the tests
//! crate, `roce_tests::differential`): N random and structure-aware mutated frames
//! through the real XDP and tc programs and the reference, zero disagreements allowed.
//! The cargo-fuzz targets of the parsers (`fuzz/`) run apart: docs/testing.md.

use anyhow::{bail, Result};

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
    let mut cli = vec![
        "--packets".to_string(),
        args.packets.to_string(),
        "--policy".to_string(),
        args.policy.clone(),
    ];
    if let Some(seed) = args.seed {
        cli.extend(["--seed".to_string(), seed.to_string()]);
    }
    xtask::run_tests_bin("roce-fuzz", &cli, "roce-fuzz found disagreements or failed")?;
    Ok(())
}
