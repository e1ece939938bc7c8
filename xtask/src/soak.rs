//! `cargo xtask soak`: builds the agent, roce-gen and `roce-soak` (tests crate), then
//! runs the soak in a namespace lab (see `tests/src/bin/roce-soak.rs`): traffic, a
//! reload every minute, two kill -9 restarts and the veth pair re-created, then the
//! flows checked against what was sent and the agent's RSS against itself.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// How long the soak runs (minutes).
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    xtask::setup::ensure_all()?;
    if !xtask::setup::is_root() {
        bail!("the soak runs the agent in network namespaces: run as root");
    }
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "roce-agent",
            "-p",
            "roce-testkit",
            "--bins",
        ])
        .args(["-p", "roce-tests", "--bin", "roce-soak"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building the soak's binaries failed ({status})");
    }
    let mut cmd = Command::new(roce_testkit::lab::bins::target_dir().join("release/roce-soak"));
    cmd.args(["--minutes", &args.minutes.to_string()]);
    if args.json {
        cmd.arg("--json");
    }
    let status = cmd.status().context("running roce-soak")?;
    if !status.success() {
        bail!("the soak failed ({status})");
    }
    Ok(())
}
