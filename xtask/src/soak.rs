//! `cargo xtask soak`: builds the agent, roce-gen and `roce-soak` (tests crate), then
//! runs the soak in a namespace lab (see `tests/src/bin/roce-soak.rs`): traffic, a
//! reload every minute, two kill -9 restarts and the veth pair re-created, then the
//! flows checked against what was sent and the agent's RSS against itself.

use anyhow::{bail, Result};

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
    // roce-soak runs the agent and roce-gen from the target directory.
    roce_testkit::lab::bins::build_agent(true)?;
    let mut cli = vec!["--minutes".to_string(), args.minutes.to_string()];
    if args.json {
        cli.push("--json".to_string());
    }
    xtask::run_tests_bin("roce-soak", &cli, "the soak failed")?;
    Ok(())
}
