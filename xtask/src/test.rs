//! `cargo xtask test`: set-up, the lint set (no import cycle among a crate's
//! top-level modules, clippy with warnings as errors, cargo-deny's licence, ban and
//! source check of deny.toml), then every
//! test of the workspace (unit tests, kernel tests through BPF_PROG_TEST_RUN,
//! namespace end-to-end runs), the demo (as the README runs it), the VM lab on the
//! default kernel (`cargo xtask vm`), then a check that nothing was left behind.
//! `cargo xtask lint` runs the lint set alone.

use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Only tests whose name contains this string.
    pub filter: Option<String>,
}

#[derive(clap::Args, Default)]
pub struct LintArgs {
    /// Only the import-cycle check (no clippy, no build): a second.
    #[arg(long)]
    pub cycles_only: bool,
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
    // The lint set first: it takes a minute and fails fast. Not with a filter (a
    // developer running a few tests); `cargo xtask lint` runs it alone.
    if args.filter.is_none() {
        lint(&LintArgs::default())?;
    }
    let before = namespaces();
    let mounts_before = test_bpffs_mounts();
    // The end-to-end tests run the real binaries (roce-agent, and roce-gen from the
    // test kit): build them first.
    roce_testkit::lab::bins::build_agent(true)?;
    // roce-ebpf targets bpfel-unknown-none only; the agent's build script builds it.
    let mut test = vec!["test", "--workspace", "--exclude", "roce-ebpf", "--release"];
    if let Some(f) = args.filter.as_deref() {
        test.push(f);
    }
    let mut result = cargo_test(&test);
    // The README's main command, as a user runs it: it must keep working.
    if result.is_ok() && args.filter.is_none() {
        result = demo();
    }
    // Last, the VM lab on the default kernel: real soft-RoCE, minutes (its image is
    // cached in target/vm); skipped with a note where qemu is missing outside CI.
    if result.is_ok() && args.filter.is_none() {
        result = crate::vm::test_step();
    }
    let after = namespaces();
    let new: Vec<_> = after.iter().filter(|x| !before.contains(x)).collect();
    let mounts: Vec<String> = test_bpffs_mounts()
        .into_iter()
        .filter(|m| !mounts_before.contains(m))
        .collect();
    if !new.is_empty() || !mounts.is_empty() {
        eprintln!("[test] left behind by the tests: {new:?} {mounts:?}");
        result?;
        bail!("tests left network namespaces {new:?} or bpffs mounts {mounts:?} behind");
    }
    result
}

/// The bpffs mounts the test kit makes for pinning agents (`roce_testkit::bpffs`).
fn test_bpffs_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| m.starts_with("/run/roce-test-bpf-"))
        .map(str::to_string)
        .collect()
}

/// The import-cycle check of the crates in `xtask::cycles::CHECKED` (no cycle among
/// a crate's top-level modules), then clippy over every crate but the kernel one,
/// warnings as errors: the workspace's lint set (no unwrap, expect or panic outside
/// tests in agent/ and common/, see [workspace.lints] in Cargo.toml) and clippy's
/// defaults everywhere; then cargo-deny over the dependency graph (deny.toml).
pub fn lint(args: &LintArgs) -> Result<()> {
    let root = roce_testkit::lab::bins::workspace_root();
    let summary = xtask::cycles::check(&root, xtask::cycles::CHECKED)?;
    eprintln!("[lint] {summary}");
    if args.cycles_only {
        return Ok(());
    }
    // clippy builds the agent's build script, which builds the kernel object.
    xtask::setup::ensure_rust()?;
    cargo(&[
        "clippy",
        "--workspace",
        "--exclude",
        "roce-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    deny()
}

/// `cargo deny check licenses bans sources`: accepted licences, no second TLS stack
/// nor duplicate crate versions beyond deny.toml's list, crates.io as the only source.
/// Not `advisories`: that needs the RustSec database from the network. After clippy,
/// every crate it reads is already downloaded: no network needed.
fn deny() -> Result<()> {
    let want = xtask::setup::CARGO_DENY_VERSION;
    match xtask::setup::cargo_deny_version() {
        Some(v) if v == want => {}
        Some(v) => bail!(
            "cargo-deny {v} is installed, deny.toml is checked with {want}: run cargo xtask setup"
        ),
        None => bail!("cargo-deny is not installed: run cargo xtask setup"),
    }
    cargo(&["deny", "check", "licenses", "bans", "sources"])
        .context("cargo deny found a dependency deny.toml does not accept (see above)")
}

/// Runs `cargo test ...` with every test binary run (`--no-fail-fast`), its output
/// passed through as it comes, and on failure a summary at the end: each failed test
/// and the first lines of why (its panic), so that a CI log says it in one place.
fn cargo_test(args: &[&str]) -> Result<()> {
    let mut args = args.to_vec();
    args.insert(1, "--no-fail-fast");
    eprintln!("[test] cargo {}", args.join(" "));
    let mut child = Command::new(env!("CARGO"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running cargo")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut failures = FailureLog::default();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line.context("reading cargo's output")?;
        println!("{line}");
        failures.feed(&line);
    }
    let status = child.wait().context("waiting for cargo")?;
    if status.success() {
        return Ok(());
    }
    eprintln!("[test] FAILED ({status}); the failed tests and why:");
    for (name, why) in &failures.failed {
        eprintln!("[test]   {name}");
        for l in why.iter().take(12) {
            eprintln!("[test]       {l}");
        }
    }
    if failures.failed.is_empty() {
        eprintln!("[test]   no test reported FAILED: a build or a test binary failed (see above)");
    }
    bail!(
        "cargo test failed: {} failed test(s)",
        failures.failed.len()
    )
}

/// The failures libtest reports: `---- NAME stdout ----` blocks (their panic
/// message), in the order they come.
#[derive(Default)]
struct FailureLog {
    failed: Vec<(String, Vec<String>)>,
    /// Inside a `---- NAME stdout ----` block.
    current: Option<usize>,
}

impl FailureLog {
    fn feed(&mut self, line: &str) {
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"))
        {
            self.failed.push((name.to_string(), Vec::new()));
            self.current = Some(self.failed.len() - 1);
            return;
        }
        if line == "failures:" || line.starts_with("test result:") {
            self.current = None;
            return;
        }
        if let Some(i) = self.current {
            let keep = !line.trim().is_empty()
                && !line.trim_start().starts_with("at ")
                && !line
                    .trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit());
            if keep {
                self.failed[i].1.push(line.to_string());
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::FailureLog;

    #[test]
    fn failure_log_keeps_each_failed_test_and_its_panic() {
        let mut log = FailureLog::default();
        for l in [
            "test a ... ok",
            "test b ... FAILED",
            "failures:",
            "",
            "---- b stdout ----",
            "thread 'b' panicked at tests/x.rs:3:5:",
            "assertion failed: 1 == 2",
            "stack backtrace:",
            "   0: rust_begin_unwind",
            "             at /rustc/abc/lib.rs:1:1",
            "",
            "failures:",
            "    b",
            "test result: FAILED. 1 passed; 1 failed",
        ] {
            log.feed(l);
        }
        assert_eq!(log.failed.len(), 1);
        assert_eq!(log.failed[0].0, "b");
        assert_eq!(
            log.failed[0].1,
            [
                "thread 'b' panicked at tests/x.rs:3:5:",
                "assertion failed: 1 == 2",
                "stack backtrace:"
            ]
        );
    }
}
