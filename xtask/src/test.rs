//! `cargo xtask test`: set-up, then every test of the workspace (unit tests, kernel
//! tests through BPF_PROG_TEST_RUN, namespace end-to-end runs), the demo (as the
//! README runs it), then a check that nothing was left behind.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Only tests whose name contains this string.
    pub filter: Option<String>,
}

fn cargo(args: &[&str]) -> Result<()> {
    eprintln!("[test] cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    xtask::setup::ensure_all()?;
    if !xtask::setup::is_root() {
        bail!("the kernel and namespace tests need root (BPF_PROG_TEST_RUN, XDP attach, ip netns): run as root");
    }
    let before = namespaces();
    // The end-to-end tests run the real binaries (roce-agent, and roce-gen from the
    // test kit): build them first.
    cargo(&[
        "build",
        "--release",
        "-p",
        "roce-agent",
        "-p",
        "roce-testkit",
        "--bins",
    ])?;
    // roce-ebpf targets bpfel-unknown-none only; the agent's build script builds it.
    let mut test = vec!["test", "--workspace", "--exclude", "roce-ebpf", "--release"];
    if let Some(f) = args.filter.as_deref() {
        test.push(f);
    }
    let mut result = cargo(&test);
    // The README's main command, as a user runs it: it must keep working.
    if result.is_ok() && args.filter.is_none() {
        result = demo();
    }
    let after = namespaces();
    let new: Vec<_> = after.iter().filter(|x| !before.contains(x)).collect();
    if !new.is_empty() {
        eprintln!("[test] left behind by the tests: {new:?}");
        result?;
        bail!("tests left network namespaces behind: {new:?}");
    }
    result
}

/// Runs `cargo xtask demo --duration 3 --json` (this binary) and checks its verdict.
fn demo() -> Result<()> {
    eprintln!("[test] cargo xtask demo --duration 3 --json");
    let out = Command::new(std::env::current_exe().context("locating xtask")?)
        .args(["demo", "--duration", "3", "--json"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the demo")?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("the demo printed no JSON document on stdout")?;
    let matches = doc
        .pointer("/demo/matches")
        .and_then(serde_json::Value::as_bool);
    if !out.status.success() || matches != Some(true) {
        bail!("the demo failed ({}; matches: {matches:?})", out.status);
    }
    eprintln!("[test] demo: MATCH");
    Ok(())
}

/// Network namespaces present now (tests must not add any that outlive them).
fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect(),
        Err(_) => Vec::new(),
    }
}
