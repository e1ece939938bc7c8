//! Makes a fresh machine ready: nightly rust-src, bpf-linker, clippy, cargo-deny, the
//! Debian tools that tests, demo and bench use, kubernetes-validate and scapy (PyPI). Each
//! step says what it does; nothing is done twice.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The bpf-linker release whose BTF this kernel accepts (0.11 and later need a newer LLVM than the nightly has; 0.10.0 emits BTF the kernel rejects).
pub const BPF_LINKER_VERSION: &str = "0.10.4";

/// Debian packages and a command each provides, to tell whether it is installed.
const DEBIAN_TOOLS: [(&str, &str); 13] = [
    ("tshark", "tshark"),
    // The tests scrape `GET /metrics` with it.
    ("curl", "curl"),
    ("tcpdump", "tcpdump"),
    ("tcpreplay", "tcpreplay"),
    ("ip", "iproute2"),
    ("bpftool", "bpftool"),
    ("iptables", "iptables"),
    ("ethtool", "ethtool"),
    // `roce-agent top`'s terminal test runs it in a tmux pane.
    ("tmux", "tmux"),
    // promtool (`check metrics`, `check rules`, `test rules`) comes with the server.
    ("promtool", "prometheus"),
    // The VM lab (`cargo xtask vm`): its image is built with debootstrap, booted with qemu.
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("debootstrap", "debootstrap"),
    // agent/tests/rdma_netlink.rs compiles a program against the kernel's RDMA headers.
    ("gcc", "gcc"),
];

/// Debian packages that install files, not commands: a file each provides.
const DEBIAN_FILES: [(&str, &str); 1] = [
    // The kernel's RDMA netlink numbers, which agent/tests/rdma_netlink.rs checks the
    // agent's against.
    ("/usr/include/rdma/rdma_netlink.h", "linux-libc-dev"),
];

fn say(msg: &str) {
    eprintln!("[setup] {msg}");
}

/// True when `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Runs a step that downloads (apt, rustup, crates.io, PyPI) up to three times, 10 s
/// and 30 s apart: a fresh CI machine meets mirror hiccups and the dpkg lock of its
/// boot-time apt timers, and one refused download must not fail the whole run.
fn run_retrying(what: &str, make: impl Fn() -> Command) -> Result<()> {
    let pauses = [10, 30];
    let mut attempt = 0;
    loop {
        match run(&mut make()) {
            Ok(()) => return Ok(()),
            Err(e) if attempt < pauses.len() => {
                say(&format!(
                    "{what} failed ({e:#}); trying again in {} s",
                    pauses[attempt]
                ));
                std::thread::sleep(std::time::Duration::from_secs(pauses[attempt]));
                attempt += 1;
            }
            Err(e) => return Err(e).with_context(|| format!("{what}, {} attempts", attempt + 1)),
        }
    }
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The kubernetes-validate release agent/tests/deploy.rs checks the Kubernetes
/// manifest with (it ships the schemas: no cluster or network needed).
pub const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

/// The cargo-deny release `cargo xtask lint` checks deny.toml with (0.20 needs rustc
/// 1.88; it builds here with `--locked` in about two and a half minutes, 2 cores).
pub const CARGO_DENY_VERSION: &str = "0.20.2";

/// Everything at once: the Rust side, the Debian tools, then the Python ones.
pub fn ensure_all() -> Result<()> {
    ensure_rust()?;
    ensure_cargo_deny()?;
    ensure_debian_tools()?;
    ensure_python_tools()
}

/// Whether `cmd` runs and exits 0 (its output thrown away).
fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The scapy release tests/tests/mirror_e2e.rs crafts mirror copies with: its
/// `scapy.contrib.erspan` has ERSPAN_II, ERSPAN_III and the platform subheader, and
/// `scapy.contrib.roce` the BTH with its ICRC (Debian's 2.5.0 has them too; PyPI's is
/// the one the tests were written against).
pub const SCAPY_VERSION: &str = "2.8.0";

/// kubernetes-validate from PyPI (it brings PyYAML), for `python3 -m kubernetes_validate`,
/// and scapy (mirror copies for the mirror tests).
pub fn ensure_python_tools() -> Result<()> {
    ensure_scapy()?;
    if succeeds(Command::new("python3").args(["-c", "import kubernetes_validate, yaml"])) {
        return Ok(());
    }
    say(&format!(
        "installing kubernetes-validate {KUBERNETES_VALIDATE_VERSION} (python3 -m pip)"
    ));
    run_retrying("pip install kubernetes-validate", || {
        let mut cmd = Command::new("python3");
        cmd.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            &format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"),
        ]);
        cmd
    })
    .context("installing kubernetes-validate (needs python3 with pip)")
}

/// scapy from PyPI, with the ERSPAN and RoCE layers the mirror tests use.
pub fn ensure_scapy() -> Result<()> {
    let layers =
        "from scapy.contrib.erspan import ERSPAN_II, ERSPAN_III, ERSPAN_PlatformSpecific; \
                  from scapy.contrib.roce import BTH; from scapy.layers.l2 import GRE";
    if succeeds(Command::new("python3").args(["-c", layers])) {
        return Ok(());
    }
    say(&format!(
        "installing scapy {SCAPY_VERSION} (python3 -m pip)"
    ));
    run_retrying("pip install scapy", || {
        let mut cmd = Command::new("python3");
        cmd.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            &format!("scapy=={SCAPY_VERSION}"),
        ]);
        cmd
    })
    .context("installing scapy (needs python3 with pip)")?;
    if !succeeds(Command::new("python3").args(["-c", layers])) {
        bail!("scapy {SCAPY_VERSION} is installed but lacks its ERSPAN or RoCE layers");
    }
    Ok(())
}

/// clippy on the toolchain that builds the workspace: `cargo xtask test` runs the
/// workspace's lint set ([workspace.lints] in Cargo.toml) before the tests.
pub fn ensure_clippy() -> Result<()> {
    if succeeds(Command::new(env!("CARGO")).args(["clippy", "--version"])) {
        return Ok(());
    }
    if !have("rustup") {
        bail!("cargo clippy is missing and there is no rustup to add it");
    }
    say("adding clippy to the toolchain");
    run_retrying("rustup component add clippy", || {
        let mut cmd = Command::new("rustup");
        cmd.args(["component", "add", "clippy"]);
        cmd
    })
    .context("adding clippy (rustup component add clippy)")
}

/// The installed cargo-deny's version ("0.20.2"), if `cargo deny` runs.
pub fn cargo_deny_version() -> Option<String> {
    let out = Command::new(env!("CARGO"))
        .args(["deny", "--version"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    // "cargo-deny 0.20.2"
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_string)
}

/// cargo-deny [`CARGO_DENY_VERSION`] from crates.io, for `cargo xtask lint`'s
/// licence, ban and source check (deny.toml). It has no optional features to trim:
/// since 0.19.1 it fetches advisory databases with the `git` program, not a Git library.
pub fn ensure_cargo_deny() -> Result<()> {
    if cargo_deny_version().as_deref() == Some(CARGO_DENY_VERSION) {
        return Ok(());
    }
    say(&format!(
        "installing cargo-deny {CARGO_DENY_VERSION} (about two and a half minutes)"
    ));
    run_retrying("cargo install cargo-deny", || {
        let mut cmd = Command::new("cargo");
        cmd.args([
            "install",
            &format!("cargo-deny@{CARGO_DENY_VERSION}"),
            "--locked",
            "--force",
        ]);
        cmd
    })
    .context("installing cargo-deny")
}

/// nightly with rust-src (for `-Z build-std=core`), bpf-linker, and clippy.
pub fn ensure_rust() -> Result<()> {
    if !have("rustup") {
        bail!(
            "rustup is not installed: the eBPF programs need a nightly toolchain managed by rustup"
        );
    }
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        say("installing the nightly toolchain");
        run_retrying("rustup toolchain install nightly", || {
            let mut cmd = Command::new("rustup");
            cmd.args(["toolchain", "install", "nightly", "--profile", "minimal"]);
            cmd
        })
        .context("the eBPF programs need a nightly toolchain")?;
    }
    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        say("adding rust-src to the nightly toolchain");
        run_retrying("rustup component add rust-src", || {
            let mut cmd = Command::new("rustup");
            cmd.args(["component", "add", "rust-src", "--toolchain", "nightly"]);
            cmd
        })?;
    }
    let linker = if have("bpf-linker") {
        output(Command::new("bpf-linker").arg("--version"))?
    } else {
        String::new()
    };
    if !linker.contains(BPF_LINKER_VERSION) {
        say(&format!(
            "installing bpf-linker {BPF_LINKER_VERSION} (about a minute)"
        ));
        run_retrying("cargo install bpf-linker", || {
            let mut cmd = Command::new("cargo");
            cmd.args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--force",
            ]);
            cmd
        })
        .context("installing bpf-linker")?;
    }
    ensure_clippy()
}

/// tshark, curl, tcpdump, tcpreplay, iproute2, bpftool, iptables, ethtool, tmux, prometheus
/// (promtool), qemu-system-x86, debootstrap, gcc and linux-libc-dev from Debian.
pub fn ensure_debian_tools() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_TOOLS
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .chain(
            DEBIAN_FILES
                .iter()
                .filter(|(file, _)| !std::path::Path::new(file).exists()),
        )
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !have("apt-get") {
        bail!(
            "missing tools ({}) and no apt-get to install them",
            missing.join(", ")
        );
    }
    say(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    // tshark asks whether non-root users may capture; answer it up front.
    run(Command::new("sh").arg("-c").arg(
        "echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections",
    ))?;
    // DPkg::Lock::Timeout: wait for apt's own timers instead of failing on their lock.
    run_retrying("apt-get update", || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["update", "-q", "-o", "DPkg::Lock::Timeout=120"])
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    })
    .context("apt-get update (are you root?)")?;
    run_retrying("apt-get install", || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "-q", "-o", "DPkg::Lock::Timeout=120"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    })
    .context("apt-get install")?;
    Ok(())
}

/// True when this process runs as root (kernel tests, namespaces, XDP attach need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
