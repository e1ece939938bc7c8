//! roce-bench's `analyze` case: how fast `roce-agent analyze` reads a large capture
//! with each engine, in how much memory, against tshark decoding the same file to
//! fields in the same run.
//!
//! A capture of `--analyze-frames` frames (default 1,000,000) is written to a
//! temporary directory with the project's frame builder: 1,024 queue pairs, a quarter
//! of them in VXLAN, SENDs of 64 to 960 payload bytes with ACKs and CNPs between, a CE
//! mark in every 50 frames. `roce-agent analyze FILE --json` (the default engine),
//! `--engine reference`, `--engine kernel` and `tshark -r FILE -T fields -e ...` then
//! run as child processes: wall time from spawn to exit (the median of `runs` runs of
//! each analyze case; tshark once), peak RSS from `wait4`'s `ru_maxrss`. The file is
//! read once beforehand, so every reader finds it in the page cache. tshark
//! decodes about 30-50k frames/s here: `--analyze-tshark-frames N` gives it the first
//! N frames only (a second file written in the same pass), and the output says so.
//!
//! What bounds the kernel engine is measured in this process with the engine's own
//! parts ([`kernel_bound`]): its load, and every frame through `xdp_classify` and
//! through the empty XDP program on the same pinned workers.
//!
//! The agent binary is the release build next to this one (`cargo build --release -p
//! roce-agent` runs first), or `ROCE_AGENT_BIN`.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use roce_agent::analyze::engine::{allowed_cpus, kernel_workers, load_kernel};
use roce_agent::analyze::workers::{self, Icrc};
use roce_agent::analyze::{CaptureReader, Split};
use roce_agent::datapath::loader::LoadOptions;
use roce_common::config::RuntimeConfig;
use roce_common::names::program::{XDP_BASELINE, XDP_CLASSIFY};
use roce_common::policy::Policy;
use roce_testkit::frame::{self, Eth, RoceMsg, L3};
use roce_testkit::tshark;

use crate::median;

/// What to measure.
pub struct Options {
    pub json: bool,
    /// Frames of the capture analyze reads.
    pub frames: u64,
    /// Frames tshark decodes (a prefix of the same capture); 0 or more than `frames`:
    /// all of them.
    pub tshark_frames: u64,
    /// Keep the capture here (written when missing, reused when present).
    pub capture: Option<PathBuf>,
    /// Runs of each `roce-agent analyze` case; the median wall time is reported.
    pub runs: usize,
}

/// The ratios the project aims for: the default engine reads at least 100
/// times as many frames per second as tshark decoding to fields, in at most 64 MB;
/// the kernel engine (every frame through BPF_PROG_TEST_RUN) at least 20 times.
const TARGET_RATIO: f64 = 100.0;
const TARGET_RSS_MB: f64 = 64.0;
const TARGET_RATIO_KERNEL: f64 = 20.0;

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

/// One `roce-agent analyze` run measured: which engine (as asked, or as the agent
/// said it chose), the median wall time over the runs, the largest peak RSS.
struct AgentRun {
    label: &'static str,
    engine: String,
    wall: Duration,
    peak_rss_kib: u64,
    out: PathBuf,
}

/// Runs `roce-agent analyze FILE --json [--engine E]` `runs` times; `None` is the
/// default engine, which the agent names in its debug log.
fn run_agent(
    agent: &Path,
    file: &Path,
    engine: Option<&'static str>,
    runs: usize,
    frames: u64,
    tmp: &Path,
) -> Result<AgentRun> {
    let label = engine.unwrap_or("default");
    let out = tmp.join(format!("{label}.json"));
    let err = tmp.join(format!("{label}.err"));
    let mut walls = Vec::new();
    let mut rss = 0;
    for _ in 0..runs.max(1) {
        let mut cmd = Command::new(agent);
        cmd.arg("analyze")
            .arg(file)
            .arg("--json")
            .args(["--fail-on", "never"]);
        match engine {
            Some(e) => {
                cmd.args(["--engine", e]).env_remove("RUST_LOG");
            }
            None => {
                cmd.env("RUST_LOG", "roce_agent=debug");
            }
        }
        let m = measure(
            &format!("roce-agent analyze ({label} engine)"),
            cmd,
            &out,
            &err,
        )?;
        walls.push(m.wall);
        rss = rss.max(m.peak_rss_kib);
        let counted = frames_in_report(&out)?;
        if counted != frames {
            bail!("analyze ({label} engine) read {counted} frames of {frames}");
        }
    }
    let engine = match engine {
        Some(e) => e.to_string(),
        None => {
            let log = fs::read_to_string(&err).unwrap_or_default();
            if log.contains("engine=kernel") {
                "kernel".to_string()
            } else if log.contains("engine=reference") {
                "reference".to_string()
            } else {
                "unknown".to_string()
            }
        }
    };
    Ok(AgentRun {
        label,
        engine,
        wall: median(walls),
        peak_rss_kib: rss,
        out,
    })
}

/// Runs the analyze benchmark and prints its figures (JSON lines or a table).
pub fn run(opts: &Options) -> Result<()> {
    if opts.frames == 0 {
        return Ok(());
    }
    let agent = agent_binary()?;
    let tmp = TempDir::new()?;
    let tshark_frames = if opts.tshark_frames == 0 || opts.tshark_frames >= opts.frames {
        opts.frames
    } else {
        opts.tshark_frames
    };
    let full = opts
        .capture
        .clone()
        .unwrap_or_else(|| tmp.0.join("analyze-bench.pcap"));
    let prefix_path = match &opts.capture {
        Some(c) => c.with_extension(format!("first-{tshark_frames}.pcap")),
        None => tmp.0.join("analyze-bench-prefix.pcap"),
    };
    let prefix = (tshark_frames < opts.frames).then_some((prefix_path.as_path(), tshark_frames));
    let gen_start = Instant::now();
    let file_bytes = if full.exists() && prefix.is_none_or(|(p, _)| p.exists()) {
        fs::metadata(&full)?.len()
    } else {
        write_capture(&full, opts.frames, prefix)?
    };
    let gen_s = gen_start.elapsed().as_secs_f64();
    let tshark_file = if prefix.is_some() {
        prefix_path.clone()
    } else {
        full.clone()
    };
    warm(&full)?;

    let mut runs = Vec::new();
    for engine in [None, Some("reference"), Some("kernel")] {
        runs.push(run_agent(
            &agent,
            &full,
            engine,
            opts.runs,
            opts.frames,
            &tmp.0,
        )?);
    }
    // Every engine must have counted the same: the reports are byte-identical.
    let first = fs::read(&runs[0].out)?;
    for r in &runs[1..] {
        if fs::read(&r.out)? != first {
            bail!(
                "analyze printed different reports for the benchmark capture ({} and {} engines)",
                runs[0].label,
                r.label
            );
        }
    }

    let bound = kernel_bound(&full, opts.runs)?;

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

    let fps = |frames: u64, wall: Duration| frames as f64 / wall.as_secs_f64().max(1e-9);
    let tshark_fps = fps(tshark_frames, tshark.wall);
    let prefix_note = if tshark_frames < opts.frames {
        format!("tshark decoded the first {tshark_frames} frames of the same capture")
    } else {
        "tshark decoded the whole capture".to_string()
    };
    let ratio = |r: &AgentRun| fps(opts.frames, r.wall) / tshark_fps;
    // The kernel engine with a program that costs nothing per frame.
    let bound_fps = fps(opts.frames, bound.load + bound.empty_runs);
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    let rss_mb = |kib: u64| (mb(kib) * 10.0).round() / 10.0;
    if opts.json {
        for r in &runs[1..] {
            let engine = &r.engine;
            println!(
                "{}",
                serde_json::json!({"name": format!("analyze_{engine}_frames_per_s"), "value": fps(opts.frames, r.wall).round(),
                    "unit": "frames/s", "frames": opts.frames, "seconds": r.wall.as_secs_f64(), "runs": opts.runs,
                    "capture_mb": file_bytes as f64 / 1e6})
            );
            println!(
                "{}",
                serde_json::json!({"name": format!("analyze_{engine}_peak_rss_mb"), "value": rss_mb(r.peak_rss_kib),
                    "unit": "MB", "frames": opts.frames, "capture_mb": file_bytes as f64 / 1e6})
            );
        }
        println!(
            "{}",
            serde_json::json!({"name": "tshark_fields_frames_per_s", "value": tshark_fps.round(), "unit": "frames/s",
                "frames": tshark_frames, "seconds": tshark.wall.as_secs_f64(), "peak_rss_mb": rss_mb(tshark.peak_rss_kib),
                "note": prefix_note})
        );
        for (name, wall, note) in [
            ("analyze_kernel_load_s", bound.load, "the kernel engine's load: the object, its maps, xdp_classify through the verifier"),
            ("analyze_kernel_test_runs_s", bound.classify_runs, "every frame through xdp_classify on the kernel engine's pinned workers, load excluded"),
            ("analyze_kernel_empty_test_runs_s", bound.empty_runs, "every frame through the empty XDP program on the same workers: BPF_PROG_TEST_RUN's own cost"),
        ] {
            println!(
                "{}",
                serde_json::json!({"name": name, "value": wall.as_secs_f64(), "unit": "s", "frames": opts.frames,
                    "runs": opts.runs, "workers": bound.workers, "note": note})
            );
        }
        println!(
            "{}",
            serde_json::json!({"name": "analyze_kernel_bound_vs_tshark", "engine": "kernel", "peer": "tshark",
                "pps": bound_fps.round(), "peer_pps": tshark_fps.round(),
                "ratio": round2(bound_fps / tshark_fps), "frames": opts.frames,
                "note": "the kernel engine with a program that costs nothing per frame: the load of xdp_classify plus the empty program's test runs"})
        );
        for r in &runs {
            let name = match r.label {
                "default" => "analyze_vs_tshark".to_string(),
                e => format!("analyze_{e}_vs_tshark"),
            };
            let target = match r.label {
                "default" => Some(TARGET_RATIO),
                "kernel" => Some(TARGET_RATIO_KERNEL),
                _ => None,
            };
            println!(
                "{}",
                serde_json::json!({"name": name, "engine": r.engine, "peer": "tshark", "pps": fps(opts.frames, r.wall).round(),
                    "peer_pps": tshark_fps.round(), "ratio": round2(ratio(r)), "peak_rss_mb": rss_mb(r.peak_rss_kib),
                    "target_ratio": target, "frames": opts.frames, "peer_frames": tshark_frames, "runs": opts.runs,
                    "note": prefix_note})
            );
        }
    } else {
        println!();
        println!(
            "analyze: {} frames, {:.0} MB capture ({}); {prefix_note}; median of {} runs each",
            opts.frames,
            file_bytes as f64 / 1e6,
            if opts.capture.is_some() && gen_s < 0.5 {
                format!("read from {}", full.display())
            } else {
                format!("written in {gen_s:.1} s")
            },
            opts.runs
        );
        println!(
            "{:<32} {:>9} {:>8} {:>12} {:>12} {:>8}",
            "analyze case", "frames", "s", "frames/s", "peak RSS MB", "ratio"
        );
        for r in &runs {
            let case = match r.label {
                "default" => format!("analyze (default: {})", r.engine),
                e => format!("analyze --engine {e}"),
            };
            println!(
                "{:<32} {:>9} {:>8.2} {:>12.0} {:>12.1} {:>7.1}x",
                case,
                opts.frames,
                r.wall.as_secs_f64(),
                fps(opts.frames, r.wall),
                mb(r.peak_rss_kib),
                ratio(r)
            );
        }
        println!(
            "{:<32} {:>9} {:>8.2} {:>12.0} {:>12.1}",
            "tshark -T fields",
            tshark_frames,
            tshark.wall.as_secs_f64(),
            tshark_fps,
            mb(tshark.peak_rss_kib)
        );
        println!(
            "kernel engine, what bounds it ({} pinned workers): load of xdp_classify {:.2} s, test runs {:.2} s; \
             the empty program's test runs {:.2} s, so at best {:.1}x tshark",
            bound.workers,
            bound.load.as_secs_f64(),
            bound.classify_runs.as_secs_f64(),
            bound.empty_runs.as_secs_f64(),
            bound_fps / tshark_fps
        );
        println!(
            "analyze_vs_tshark: default engine ({}) {:.1}x frames/s, peak RSS {:.1} MB (target >= {TARGET_RATIO}x, <= {TARGET_RSS_MB} MB); kernel engine {:.1}x (target >= {TARGET_RATIO_KERNEL}x)",
            runs[0].engine,
            ratio(&runs[0]),
            mb(runs[0].peak_rss_kib),
            ratio(&runs[2])
        );
    }
    Ok(())
}

/// What bounds the kernel engine here, measured in this process with the engine's own
/// parts (a capture reader, the flow-hash split, one pinned worker per CPU).
struct KernelBound {
    workers: usize,
    /// `load_kernel` (the object, its maps, `xdp_classify` through the verifier), which
    /// the engine waits for.
    load: Duration,
    /// Every frame through `xdp_classify`, the load excluded.
    classify_runs: Duration,
    /// Every frame through the empty XDP program: the floor of BPF_PROG_TEST_RUN.
    empty_runs: Duration,
}

/// Medians over `runs` rounds, each on a freshly loaded object (empty tables, as the
/// engine starts), the empty program first.
fn kernel_bound(capture: &Path, runs: usize) -> Result<KernelBound> {
    let cpus = allowed_cpus();
    let n = cpus.len().max(1);
    let policy = Policy::default();
    let split = Split::new(n, RuntimeConfig::default(), &policy);
    let through = |prog: BorrowedFd<'_>, name: &'static str| -> Result<Duration> {
        let workers = kernel_workers(prog, name, n, &cpus)?;
        let reader = CaptureReader::open(capture)?;
        let start = Instant::now();
        let run = workers::run(reader, &split, Icrc::Skip, workers, false);
        let wall = start.elapsed();
        if let Some(e) = run.error.or(run.read.error) {
            bail!("test runs over {}: {e}", capture.display());
        }
        Ok(wall)
    };
    let (mut load, mut classify, mut empty) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let mut loaded = load_kernel(&LoadOptions::default())?;
        load.push(start.elapsed());
        // The engine queues a slot per flow of its first pass (a few ms here); every
        // slot will do for a measure of the test runs.
        loaded.free_first_slots(usize::MAX)?;
        empty.push(through(loaded.baseline_xdp_fd()?, XDP_BASELINE)?);
        classify.push(through(loaded.xdp_fd()?, XDP_CLASSIFY)?);
    }
    Ok(KernelBound {
        workers: n,
        load: median(load),
        classify_runs: median(classify),
        empty_runs: median(empty),
    })
}
