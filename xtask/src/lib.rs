//! Project tasks shared by `cargo xtask ...`. The namespace lab and the other test
//! tooling live in `roce-testkit` (`testkit/`).

pub mod cycles;
pub mod setup;

/// `cargo run --quiet --release -p roce-tests --bin BIN -- ARGS`: the tests crate's
/// tools (roce-bench, roce-fuzz, roce-soak), built if needed and run with this
/// terminal. `Err` when it cannot start or exits non-zero (`what` says what failed).
pub fn run_tests_bin(bin: &str, args: &[String], what: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new(env!("CARGO"))
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "roce-tests",
            "--bin",
            bin,
            "--",
        ])
        .args(args)
        .status()
        .map_err(|e| anyhow::anyhow!("running {bin}: {e}"))?;
    if !status.success() {
        anyhow::bail!("{what} ({status})");
    }
    Ok(())
}
