//! `cargo xtask`: set-up, tests, the lab demo, benchmarks and differential fuzzing.

use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod fuzz;
mod intruder;
mod soak;
mod test;
mod vm;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "roce-agent project tasks (each one installs what it needs first)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and testing need: nightly rust-src, bpf-linker, clippy, cargo-deny, Debian tools, kubernetes-validate.
    Setup,
    /// Run the lint set, then every test: unit tests, BPF_PROG_TEST_RUN cases, namespace end-to-end runs.
    Test(test::Args),
    /// Check that no crate has an import cycle among its top-level modules, then run
    /// clippy over the workspace (but the kernel crate) with warnings as errors, then
    /// `cargo deny check licenses bans sources` (deny.toml).
    Lint(test::LintArgs),
    /// Build a namespace lab, run the agent and a traffic generator, show the flow table.
    Demo(demo::Args),
    /// Measure per-packet cost and throughput against baselines in the same run.
    Bench(bench::Args),
    /// Soak the agent in a namespace lab (10 minutes): traffic, reloads, kill -9 restarts, an interface re-created.
    Soak(soak::Args),
    /// Differential fuzzing: N random and mutated frames through the real XDP and tc
    /// programs and the reference (default 1,000,000); any disagreement fails.
    Fuzz(fuzz::Args),
    /// The VM lab: real soft-RoCE (rdma_rxe, perftest) on Debian kernels under qemu,
    /// the agent's flows against tshark per scenario.
    Vm(vm::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup => xtask::setup::ensure_all(),
        Cmd::Test(a) => test::run(a),
        Cmd::Lint(a) => test::lint(&a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Soak(a) => soak::run(a),
        Cmd::Fuzz(a) => fuzz::run(a),
        Cmd::Vm(a) => vm::run(a),
    }
}
