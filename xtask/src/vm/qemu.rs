//! One boot of the lab's image under qemu (TCG: KVM is not usable on these
//! machines), with the run's share directory over 9p. The guest writes `progress`
//! lines into the share (`BOOTED`, `LAB_UP`, `START name`, `END name rc secs`,
//! `DONE`); they are followed here and told on stderr. A guest that is not done
//! within the timeout is killed and reported with the tail of its console.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::image::Image;

/// How many console lines a failure report shows.
const CONSOLE_TAIL: usize = 40;

/// Boots `image` with `share` as the 9p tag `share`; returns when the guest has
/// powered off after writing `DONE`, or fails (timeout, no `DONE`).
pub fn boot(image: &Image, share: &Path, timeout: Duration, label: &str) -> Result<()> {
    let out = share.join("out");
    let console = out.join("console.log");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048"])
        .args(["-display", "none", "-monitor", "none", "-nodefaults"])
        .args(["-no-reboot", "-snapshot", "-nic", "none"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(image.vmlinuz())
        .arg("-initrd")
        .arg(image.initrd())
        .args([
            "-append",
            "root=/dev/vda rw console=ttyS0 quiet net.ifnames=0 panic=-1",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=raw,cache=unsafe",
            image.disk().display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=share,security_model=none",
            share.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(out.join("qemu.log")).context("creating qemu.log")?);
    eprintln!(
        "[vm] {label}: booting {} (timeout {} s)",
        image.release,
        timeout.as_secs()
    );
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let mut progress = Follow::new(out.join("progress"));
    let mut done = false;
    let status = loop {
        for line in progress.new_lines() {
            done |= line == "DONE";
            tell(label, &line, started);
        }
        if let Some(status) = child.try_wait().context("waiting for qemu")? {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "[vm] {label}: the guest did not finish within {} s; the last {CONSOLE_TAIL} lines of its console ({}):",
                timeout.as_secs(),
                console.display()
            );
            eprint!("{}", tail(&console, CONSOLE_TAIL));
            bail!(
                "{label}: the guest hung (killed after {} s)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    for line in progress.new_lines() {
        done |= line == "DONE";
        tell(label, &line, started);
    }
    if !status.success() || !done {
        eprintln!(
            "[vm] {label}: the last {CONSOLE_TAIL} lines of the console ({}):",
            console.display()
        );
        eprint!("{}", tail(&console, CONSOLE_TAIL));
        eprintln!("[vm] {label}: the end of the guest's log:");
        eprint!("{}", tail(&out.join("guest.log"), 20));
        if out.join("lab.log").exists() && !progress.seen("LAB_UP") {
            eprintln!("[vm] {label}: the lab set-up failed:");
            eprint!("{}", tail(&out.join("lab.log"), 20));
        }
        eprint!("{}", tail(&out.join("qemu.log"), 10));
        bail!(
            "{label}: qemu exited ({status}) {} the guest was done",
            if done { "after" } else { "before" }
        );
    }
    eprintln!(
        "[vm] {label}: powered off after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Tells one progress line of the guest on stderr.
fn tell(label: &str, line: &str, started: Instant) {
    let at = started.elapsed().as_secs_f64();
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("BOOTED"), Some(release), ..) => {
            eprintln!("[vm] {label}: booted {release} ({at:.0} s after start)")
        }
        (Some("LAB_UP"), ..) => eprintln!("[vm] {label}: soft-RoCE lab up ({at:.0} s)"),
        (Some("START"), Some(name), ..) => eprintln!("[vm] {label}: {name} ..."),
        (Some("END"), Some(name), Some(rc), Some(secs)) => {
            let verdict = if rc == "0" {
                "ran".to_string()
            } else {
                format!("FAILED (exit {rc})")
            };
            eprintln!("[vm] {label}: {name} {verdict} in {secs} s")
        }
        (Some("DONE"), ..) => eprintln!("[vm] {label}: all scenarios ran ({at:.0} s)"),
        _ => eprintln!("[vm] {label}: {line}"),
    }
}

/// The last `n` lines of a file (empty when it cannot be read).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for l in &lines[lines.len().saturating_sub(n)..] {
        out.push_str("    ");
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// Follows a file that the guest appends lines to.
struct Follow {
    path: std::path::PathBuf,
    offset: u64,
    partial: String,
    all: Vec<String>,
}

impl Follow {
    fn new(path: std::path::PathBuf) -> Follow {
        Follow {
            path,
            offset: 0,
            partial: String::new(),
            all: Vec::new(),
        }
    }

    /// Complete lines added since the last call.
    fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut reader = BufReader::new(f);
        let mut lines = Vec::new();
        let mut buf = String::new();
        while let Ok(n) = reader.read_line(&mut buf) {
            if n == 0 {
                break;
            }
            self.offset += n as u64;
            if buf.ends_with('\n') {
                let line = format!("{}{}", self.partial, buf.trim_end());
                self.partial.clear();
                lines.push(line);
            } else {
                self.partial.push_str(&buf);
            }
            buf.clear();
        }
        self.all.extend(lines.iter().cloned());
        lines
    }

    fn seen(&self, line: &str) -> bool {
        self.all.iter().any(|l| l == line)
    }
}
