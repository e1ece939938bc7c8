//! roce-bench's `analyze` case: how fast `roce-agent analyze` reads a large capture
//! with each engine, in how much memory, against tshark decoding the same file to
//! fields in the same run.
//!
//! A capture of `--analyze-frames` frames (default 1,000,000) is written to a
//! temporary directory with the project's frame builder: 1,024 queue pairs, a quarter
//! of them in VXLAN, SENDs of 64 to 960 payload bytes with ACKs and CNPs between, a CE
//! mark in every 50 frames. `roce-agent analyze FILE --json --engine reference` and
//! `--engine kernel` and `tshark -r FILE -T fields -e ...` then run as child
//! processes: wall time from spawn to exit, peak RSS from `wait4`'s `ru_maxrss`. The
//! file is read once beforehand, so every reader finds it in the page cache. tshark
//! decodes about 30-50k frames/s here: `--analyze-tshark-frames N` gives it the first
//! N frames only (a second file written in the same pass), and the output says so.
//!
//! The agent binary is the release build next to this one (`cargo build --release -p
//! roce-agent` runs first), or `ROCE_AGENT_BIN`.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use roce_testkit::frame::{self, Eth, RoceMsg, L3};
use roce_testkit::tshark;

/// What to measure.
pub struct Options {
    pub json: bool,
    /// Frames of the capture analyze reads.
    pub frames: u64,
    /// Frames tshark decodes (a prefix of the same capture); 0 or more than `frames`:
    /// all of them.
    pub tshark_frames: u64,
}

/// The ratio the project aims for: the reference engine reads at least 10 times as
/// many frames per second as tshark decoding to fields.
const TARGET_RATIO: f64 = 10.0;

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("roce-bench-analyze-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A classic pcap writer (nanosecond timestamps, Ethernet).
struct PcapOut {
    w: BufWriter<File>,
    bytes: u64,
}

impl PcapOut {
    fn create(path: &Path) -> Result<PcapOut> {
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_3C4Du32.to_le_bytes()); // nanosecond magic
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        w.write_all(&h)?;
        Ok(PcapOut { w, bytes: 24 })
    }

    fn frame(&mut self, ts_ns: u64, data: &[u8]) -> Result<()> {
        let mut r = [0u8; 16];
        r[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        r[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        r[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        r[12..16].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.w.write_all(&r)?;
        self.w.write_all(data)?;
        self.bytes += 16 + data.len() as u64;
        Ok(())
    }

    fn finish(mut self) -> Result<u64> {
        self.w.flush()?;
        Ok(self.bytes)
    }
}

/// Writes the capture (and, when `prefix < frames`, a second file of its first
/// `prefix` frames). Returns the size of the whole capture in bytes.
fn write_capture(full: &Path, frames: u64, prefix: Option<(&Path, u64)>) -> Result<u64> {
    const QPS: usize = 1024;
    const T0_NS: u64 = 1_700_000_000_000_000_000;
    let eth = Eth::default();
    let outer = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos(106);
    let mut out = PcapOut::create(full)?;
    let mut head = prefix
        .map(|(p, n)| PcapOut::create(p).map(|w| (w, n)))
        .transpose()?;
    let mut psn = vec![0u32; QPS];
    for i in 0..frames as usize {
        let qp = (i * 7919) % QPS;
        let tos = if i.is_multiple_of(50) { 107 } else { 106 }; // DSCP 26, CE or ECT(0)
        let l3 = L3::v4(
            Ipv4Addr::new(198, 18, 1, 1),
            Ipv4Addr::new(198, 18, 2, (qp % 250) as u8),
        )
        .with_tos(tos);
        let msg = match i % 10 {
            0 => RoceMsg::ack(qp as u32, psn[qp], 0x1F),
            1 => frame::cnp(qp as u32),
            _ => {
                psn[qp] = (psn[qp] + 1) & 0xFF_FFFF;
                RoceMsg::send_only(qp as u32, psn[qp], 64 + (i % 8) * 128)
            }
        };
        let frame = frame::roce_frame(&eth, &l3, 0xC000, &msg);
        let frame = if qp.is_multiple_of(4) {
            frame::vxlan_frame(&eth, &outer, 0xD000, 5000 + (qp as u32 % 8), &frame)
        } else {
            frame
        };
        let ts = T0_NS + i as u64 * 1000;
        out.frame(ts, &frame)?;
        if let Some((w, n)) = &mut head {
            if (i as u64) < *n {
                w.frame(ts, &frame)?;
            }
        }
    }
    if let Some((w, _)) = head {
        w.finish()?;
    }
    out.finish()
}

/// Reads a file once so that every reader finds it in the page cache.
fn warm(path: &Path) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Wall time, peak RSS and exit status of one child process.
struct Measured {
    wall: Duration,
    peak_rss_kib: u64,
}

/// Runs `cmd` to completion, stdout to `stdout`, stderr kept for an error message.
fn measure(what: &str, mut cmd: Command, stdout: &Path, stderr: &Path) -> Result<Measured> {
    cmd.stdin(Stdio::null())
        .stdout(File::create(stdout).with_context(|| format!("creating {}", stdout.display()))?)
        .stderr(File::create(stderr).with_context(|| format!("creating {}", stderr.display()))?);
    let start = Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers to status and rusage.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = start.elapsed();
    if rc != pid {
        bail!("{what}: wait4: {}", std::io::Error::last_os_error());
    }
    // The child is reaped: `Child` must not wait for it again (its drop does not).
    drop(child);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let err = fs::read_to_string(stderr).unwrap_or_default();
        bail!("{what} failed (wait status {status:#x}): {}", err.trim());
    }
    Ok(Measured {
        wall,
        peak_rss_kib: ru.ru_maxrss.max(0) as u64,
    })
}

/// The release `roce-agent` binary: `ROCE_AGENT_BIN`, or built next to this binary.
fn agent_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ROCE_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "roce-agent",
            "--bin",
            "roce-agent",
        ])
        .current_dir(&root)
        .status()
        .context("running cargo build -p roce-agent")?;
    if !status.success() {
        bail!("cargo build --release -p roce-agent failed ({status})");
    }
    let me = std::env::current_exe().context("locating roce-bench")?;
    let dir = me.parent().context("roce-bench has no directory")?;
    let agent = dir.join("roce-agent");
    if !agent.exists() {
        bail!(
            "{} is missing: set ROCE_AGENT_BIN to the roce-agent binary",
            agent.display()
        );
    }
    Ok(agent)
}

/// The frame count that `analyze --json` reports.
fn frames_in_report(path: &Path) -> Result<u64> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is no JSON", path.display()))?;
    doc["capture"]["frames"]
        .as_u64()
        .context("analyze --json has no capture.frames")
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the analyze benchmark and prints its figures (JSON lines or a table).
pub fn run(opts: &Options) -> Result<()> {
    if opts.frames == 0 {
        return Ok(());
    }
    let agent = agent_binary()?;
    let tmp = TempDir::new()?;
    let full = tmp.0.join("analyze-bench.pcap");
    let tshark_frames = if opts.tshark_frames == 0 || opts.tshark_frames >= opts.frames {
        opts.frames
    } else {
        opts.tshark_frames
    };
    let prefix_path = tmp.0.join("analyze-bench-prefix.pcap");
    let prefix = (tshark_frames < opts.frames).then_some((prefix_path.as_path(), tshark_frames));
    let gen_start = Instant::now();
    let file_bytes = write_capture(&full, opts.frames, prefix)?;
    let gen_s = gen_start.elapsed().as_secs_f64();
    let tshark_file = if prefix.is_some() {
        prefix_path.clone()
    } else {
        full.clone()
    };
    warm(&full)?;

    let mut engines = Vec::new();
    for engine in ["reference", "kernel"] {
        let mut cmd = Command::new(&agent);
        cmd.arg("analyze")
            .arg(&full)
            .args(["--json", "--engine", engine])
            .env_remove("RUST_LOG");
        let out = tmp.0.join(format!("{engine}.json"));
        let m = measure(
            &format!("roce-agent analyze --engine {engine}"),
            cmd,
            &out,
            &tmp.0.join(format!("{engine}.err")),
        )?;
        let counted = frames_in_report(&out)?;
        if counted != opts.frames {
            bail!(
                "analyze --engine {engine} read {counted} frames of {}",
                opts.frames
            );
        }
        engines.push((engine, m, out));
    }
    // Both engines must have counted the same: the reports are byte-identical.
    if fs::read(&engines[0].2)? != fs::read(&engines[1].2)? {
        bail!(
            "the kernel and reference engines printed different reports for the benchmark capture"
        );
    }

    if tshark_file != full {
        warm(&tshark_file)?;
    }
    let cmd = tshark::Fields::new(&[
        "frame.len",
        "ip.src",
        "ip.dst",
        "ip.dsfield.ecn",
        "udp.dstport",
        "vxlan.vni",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.aeth.syndrome",
    ])
    .decode_as("udp.port==4791,infiniband")
    .command(&tshark_file);
    let tshark_out = tmp.0.join("tshark.tsv");
    let tshark = measure(
        "tshark -T fields",
        cmd,
        &tshark_out,
        &tmp.0.join("tshark.err"),
    )?;
    let lines = fs::read(&tshark_out)?
        .iter()
        .filter(|b| **b == b'\n')
        .count() as u64;
    if lines != tshark_frames {
        bail!("tshark printed {lines} lines for {tshark_frames} frames");
    }

    let fps = |frames: u64, m: &Measured| frames as f64 / m.wall.as_secs_f64().max(1e-9);
    let tshark_fps = fps(tshark_frames, &tshark);
    let prefix_note = if tshark_frames < opts.frames {
        format!("tshark decoded the first {tshark_frames} frames of the same capture")
    } else {
        "tshark decoded the whole capture".to_string()
    };
    if opts.json {
        for (engine, m, _) in &engines {
            println!(
                "{}",
                serde_json::json!({"name": format!("analyze_{engine}_frames_per_s"), "value": fps(opts.frames, m).round(),
                    "unit": "frames/s", "frames": opts.frames, "seconds": m.wall.as_secs_f64(), "capture_mb": file_bytes as f64 / 1e6})
            );
            println!(
                "{}",
                serde_json::json!({"name": format!("analyze_{engine}_peak_rss_mb"), "value": (mb(m.peak_rss_kib) * 10.0).round() / 10.0,
                    "unit": "MB", "frames": opts.frames, "capture_mb": file_bytes as f64 / 1e6})
            );
        }
        println!(
            "{}",
            serde_json::json!({"name": "tshark_fields_frames_per_s", "value": tshark_fps.round(), "unit": "frames/s",
                "frames": tshark_frames, "seconds": tshark.wall.as_secs_f64(), "peak_rss_mb": (mb(tshark.peak_rss_kib) * 10.0).round() / 10.0,
                "note": prefix_note})
        );
        for (engine, m, _) in &engines {
            let pps = fps(opts.frames, m);
            println!(
                "{}",
                serde_json::json!({"name": format!("analyze_{engine}_vs_tshark"), "peer": "tshark", "pps": pps.round(),
                    "peer_pps": tshark_fps.round(), "ratio": (pps / tshark_fps * 100.0).round() / 100.0,
                    "target_ratio": if *engine == "reference" { Some(TARGET_RATIO) } else { None },
                    "frames": opts.frames, "peer_frames": tshark_frames, "note": prefix_note})
            );
        }
    } else {
        println!();
        println!(
            "analyze: {} frames, {:.0} MB capture (written in {gen_s:.1} s); {prefix_note}",
            opts.frames,
            file_bytes as f64 / 1e6
        );
        println!(
            "{:<28} {:>9} {:>8} {:>12} {:>12}",
            "analyze case", "frames", "s", "frames/s", "peak RSS MB"
        );
        for (engine, m, _) in &engines {
            println!(
                "{:<28} {:>9} {:>8.2} {:>12.0} {:>12.1}",
                format!("analyze --engine {engine}"),
                opts.frames,
                m.wall.as_secs_f64(),
                fps(opts.frames, m),
                mb(m.peak_rss_kib)
            );
        }
        println!(
            "{:<28} {:>9} {:>8.2} {:>12.0} {:>12.1}",
            "tshark -T fields",
            tshark_frames,
            tshark.wall.as_secs_f64(),
            tshark_fps,
            mb(tshark.peak_rss_kib)
        );
        let ratio = fps(opts.frames, &engines[0].1) / tshark_fps;
        println!("reference engine / tshark: {ratio:.1}x frames/s (target >= {TARGET_RATIO}x)");
    }
    Ok(())
}
