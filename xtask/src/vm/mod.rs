//! `cargo xtask vm`: the VM lab with real soft-RoCE. Four parts:
//!
//! - `image`: the Debian image (bookworm packages, one kernel), built once per
//!   recipe and kernel and cached under `target/vm/images/`.
//! - `qemu`: one boot of it under TCG with a share directory over 9p.
//! - the guest side, `tests/vm/` (shell): the lab of two rxe devices on one veth
//!   pair, and the scenarios of `tests/vm/scenarios.list`, each leaving captures,
//!   the agent's flows, rxe's counters and logs in the share.
//! - `judge`: back on the host, each scenario's results against tshark's decode of
//!   its captures, flow for flow, and the table per kernel; `host`, `qp`, `mirror`
//!   and `overhead` judge the scenarios with checks of their own.
//!
//! A run's share stays in `target/vm/runs/<kernel>/` when it failed or with
//! `--keep`; a passing run without `--keep` keeps only the summary there.

mod host;
mod image;
mod judge;
mod mirror;
mod overhead;
mod qemu;
mod qp;
mod rtt;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Bookworm's kernel (6.1): no TCX, the clsact path.
pub const DEFAULT_KERNEL: &str = "linux-image-amd64";

/// What `--all-kernels` boots: bookworm's 6.1, the newest kernel Debian builds for
/// bookworm (backports), and bullseye's 5.10 (installed into the bookworm image).
pub const ALL_KERNELS: [&str; 3] = [
    DEFAULT_KERNEL,
    "linux-image-amd64/bookworm-backports",
    "linux-image-amd64/bullseye",
];

/// A boot's time limit: booting and the lab's set-up, then each scenario.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(150);

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The Debian kernel package to boot, PKG or PKG/SUITE (a suite of the same
    /// mirror, e.g. linux-image-amd64/bookworm-backports)
    #[arg(long, value_name = "DEBIAN_PACKAGE", default_value = DEFAULT_KERNEL)]
    pub kernel: String,
    /// Run the scenarios on each kernel of ALL_KERNELS: bookworm's, bookworm-backports', bullseye's
    #[arg(long)]
    pub all_kernels: bool,
    /// Only these scenarios (names of tests/vm/scenarios.list), in the list's order
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub scenario: Vec<String>,
    /// Keep every result of a passing run (captures, flows, logs) in target/vm/runs/
    #[arg(long)]
    pub keep: bool,
    /// Judge the results kept from the last run again (after --keep or a failure), without building or booting
    #[arg(long)]
    pub rejudge: bool,
}

impl Default for Args {
    fn default() -> Args {
        Args {
            kernel: DEFAULT_KERNEL.to_string(),
            all_kernels: false,
            scenario: Vec::new(),
            keep: false,
            rejudge: false,
        }
    }
}

/// One line of `tests/vm/scenarios.list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub name: String,
    /// How the host judges it: one of `judge::CHECKS`.
    pub check: String,
    pub what: String,
}

/// Parses scenarios.list: `NAME CHECK WHAT...`, `#` comments.
pub fn parse_scenarios(text: &str) -> Result<Vec<Scenario>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [name, check, what @ ..] = words.as_slice() else {
            bail!("scenarios.list:{}: expected NAME CHECK WHAT", n + 1);
        };
        let (name, check, what) = (name.to_string(), check.to_string(), what.join(" "));
        if !judge::CHECKS.contains(&check.as_str()) {
            bail!("scenarios.list:{}: unknown check {check:?}", n + 1);
        }
        out.push(Scenario { name, check, what });
    }
    Ok(out)
}

/// `cargo xtask vm`.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let root_dir = roce_testkit::lab::bins::workspace_root();
    let recipe = root_dir.join("tests/vm");
    let vm_dir = roce_testkit::lab::bins::target_dir().join("vm");
    let all = parse_scenarios(
        &std::fs::read_to_string(recipe.join("scenarios.list"))
            .context("reading tests/vm/scenarios.list")?,
    )?;
    let plan: Vec<Scenario> = if args.scenario.is_empty() {
        all.clone()
    } else {
        for s in &args.scenario {
            if !all.iter().any(|a| &a.name == s) {
                let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
                bail!("no scenario {s:?} (there are: {})", names.join(", "));
            }
        }
        all.into_iter()
            .filter(|a| args.scenario.contains(&a.name))
            .collect()
    };
    for tool in ["qemu-system-x86_64", "tshark"] {
        if !xtask::setup::have(tool) {
            bail!("{tool} is missing: `cargo xtask setup` installs it");
        }
    }
    if !xtask::setup::is_root() {
        bail!("the VM lab needs root (image build, qemu's 9p share of root-owned files)");
    }
    let kernels: Vec<String> = if args.all_kernels {
        ALL_KERNELS.iter().map(|k| k.to_string()).collect()
    } else {
        vec![args.kernel.clone()]
    };
    if args.rejudge {
        return rejudge(&vm_dir, &kernels, &plan);
    }
    eprintln!("[vm] building roce-agent (release)");
    let bins = roce_testkit::lab::bins::build_agent(true)?;
    let agent = bins.join("roce-agent");
    let mut failed = Vec::new();
    let mut tables = String::new();
    for kernel in &kernels {
        match run_kernel(&vm_dir, &recipe, kernel, &agent, &plan, args.keep) {
            Ok((table, ok)) => {
                tables.push_str(&table);
                if !ok {
                    failed.push(kernel.clone());
                }
            }
            Err(e) => {
                eprintln!("[vm] {kernel}: {e:#}");
                tables.push_str(&format!("\n{kernel}: no results ({e:#})\n"));
                failed.push(kernel.clone());
            }
        }
    }
    print!("{tables}");
    eprintln!(
        "[vm] {} kernel(s) in {:.0} s",
        kernels.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        bail!("the VM lab failed on {}", failed.join(", "));
    }
    Ok(())
}

/// `--rejudge`: the kept results of each kernel's last run, judged again.
fn rejudge(vm_dir: &Path, kernels: &[String], plan: &[Scenario]) -> Result<()> {
    let mut ok = true;
    for kernel in kernels {
        let share = vm_dir.join("runs").join(image::slug(kernel));
        let release = std::fs::read_to_string(share.join("out/versions.txt"))
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or("?")
            .to_string();
        let results = judge::judge_all(&share.join("out"), plan)?;
        ok &= results.iter().all(judge::Outcome::passed);
        print!("{}", judge::table(kernel, &release, &results));
    }
    if !ok {
        bail!("the VM lab's results do not agree");
    }
    Ok(())
}

/// Image, boot and judgement on one kernel: the table and whether all passed.
fn run_kernel(
    vm_dir: &Path,
    recipe: &Path,
    kernel: &str,
    agent: &Path,
    plan: &[Scenario],
    keep: bool,
) -> Result<(String, bool)> {
    // One lab at a time on a machine: images, the package cache and a kernel's share
    // are shared between runs (two sessions, or a test beside a hand-made run).
    let _lock = lock(vm_dir)?;
    let image = image::ensure(vm_dir, recipe, kernel)?;
    let share = vm_dir.join("runs").join(image::slug(kernel));
    prepare_share(&share, recipe, agent, plan)?;
    let timeout = BOOT_TIMEOUT + SCENARIO_TIMEOUT * plan.len() as u32;
    qemu::boot(&image, &share, timeout, kernel)?;
    let results = judge::judge_all(&share.join("out"), plan)?;
    let table = judge::table(kernel, &image.release, &results);
    std::fs::write(share.join("summary.txt"), &table)?;
    let ok = results.iter().all(judge::Outcome::passed);
    if ok && !keep {
        image::remove_dir(&share.join("out"))?;
        image::remove_dir(&share.join("bin"))?;
    } else {
        eprintln!("[vm] {kernel}: results in {}", share.join("out").display());
    }
    Ok((table, ok))
}

/// An exclusive lock on `vm_dir` (flock on `vm_dir/lock`), held until dropped; waits,
/// saying so, while another run holds it.
fn lock(vm_dir: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(vm_dir)?;
    let path = vm_dir.join("lock");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!(
            "[vm] another run of the VM lab holds {}: waiting for it",
            path.display()
        );
        // SAFETY: as above; blocking this time.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// The run's share: bin/roce-agent and bin/empty-programs.o, vm/ (the guest scripts),
/// plan, an empty out/.
fn prepare_share(share: &Path, recipe: &Path, agent: &Path, plan: &[Scenario]) -> Result<()> {
    image::remove_dir(share)?;
    for d in ["bin", "vm", "out"] {
        std::fs::create_dir_all(share.join(d))?;
    }
    std::fs::copy(agent, share.join("bin/roce-agent"))
        .with_context(|| format!("copying {}", agent.display()))?;
    // The `overhead` scenario's baseline: empty programs on the agent's hooks.
    std::fs::write(
        share.join("bin/empty-programs.o"),
        overhead::empty_programs_object(),
    )?;
    for f in ["guest.sh", "scenarios.sh"] {
        std::fs::copy(recipe.join(f), share.join("vm").join(f))?;
    }
    let names: Vec<&str> = plan.iter().map(|s| s.name.as_str()).collect();
    std::fs::write(share.join("plan"), format!("{}\n", names.join("\n")))?;
    Ok(())
}

/// Why `cargo xtask test` skips the VM lab, if it does: only when qemu is missing
/// outside CI (with `CI` set it is required, and its absence fails the run).
pub fn skip_reason() -> Option<String> {
    if xtask::setup::have("qemu-system-x86_64") || std::env::var_os("CI").is_some() {
        None
    } else {
        Some("qemu-system-x86_64 is not installed (`cargo xtask setup` installs it; under CI it is required)".to_string())
    }
}

/// The last step of `cargo xtask test`: the VM lab on the default kernel (the
/// image cached between runs), or a note saying why it was skipped.
pub fn test_step() -> Result<()> {
    if let Some(why) = skip_reason() {
        eprintln!("[test] VM lab SKIPPED: {why}");
        return Ok(());
    }
    // The overhead scenarios are a benchmark (figures, not verdicts): `cargo xtask vm`
    // runs them, the test step does not.
    let list = roce_testkit::lab::bins::workspace_root().join("tests/vm/scenarios.list");
    let all = parse_scenarios(
        &std::fs::read_to_string(&list).context("reading tests/vm/scenarios.list")?,
    )?;
    let scenario: Vec<String> = all
        .into_iter()
        .filter(|s| s.check != "overhead")
        .map(|s| s.name)
        .collect();
    eprintln!(
        "[test] cargo xtask vm (real soft-RoCE on {DEFAULT_KERNEL}; not the overhead benchmark)"
    );
    run(Args {
        scenario,
        ..Args::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_scenario_list_parses_and_names_each_scenario_once() -> Result<()> {
        let text = std::fs::read_to_string(
            roce_testkit::lab::bins::workspace_root().join("tests/vm/scenarios.list"),
        )?;
        let list = parse_scenarios(&text)?;
        assert!(list
            .iter()
            .any(|s| s.name == "write_bw" && s.check == "flows"));
        let mut names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), list.len());
        // Each has its function in the guest's scenarios.sh.
        let sh = std::fs::read_to_string(
            roce_testkit::lab::bins::workspace_root().join("tests/vm/scenarios.sh"),
        )?;
        for s in &list {
            assert!(
                sh.contains(&format!("\nsc_{}() {{", s.name)),
                "no sc_{}",
                s.name
            );
        }
        Ok(())
    }

    #[test]
    fn an_unknown_check_is_refused() {
        assert!(parse_scenarios("x nonsense what\n").is_err());
        assert!(parse_scenarios("# only a comment\n").is_ok_and(|l| l.is_empty()));
    }
}
