//! `roce-agent analyze`: the flow table of a pcap or pcapng capture, with the same
//! classifier and the same counting rules as the live agent.
//!
//! The parts, each in its own module and none importing a later one:
//! - [`capture`]: reading pcap/pcapng in large reads, frames in batches (never loaded
//!   whole, never copied one by one);
//! - [`tally`]: what the engines cannot know offline (timestamps, ICRC, snap length,
//!   DSCP observations), from the reference classifier's walk of every frame;
//! - [`gaps`]: whether a PSN gap was lost by the capture or in the fabric, from what
//!   the other direction of its queue pair shows later;
//! - [`engine`]: the two engines that count frames into flows and STATS (the reference
//!   classifier, or the real XDP program through BPF_PROG_TEST_RUN), and the worker
//!   that runs one on the flows it owns;
//! - [`workers`]: the reader thread and the workers, the flows split by the hash of
//!   their host pair;
//! - [`report`]: the report and its text rendering;
//! - [`findings`]: what an operator should look at, judged against the DSCP policy
//!   (`roce_common::policy::Policy`, from the config's `[qos]` table).
//!
//! This module joins them: [`analyze`] streams the capture through the workers, merges
//! what they counted and builds the report. Both engines, and any number of workers,
//! print byte-identical JSON for the same capture.
//!
//! The capture is a file or standard input ([`Input`]), read as a stream either way.
//! The kernel engine reads it twice: standard input, unless it is a regular file
//! (`< FILE`, read twice from where it stood), is first copied to an unlinked file in
//! the temporary directory (`$TMPDIR`, else /tmp), never held in memory.
//!
//! May import `datapath` (the kernel engine), `config` and `doc`; only `cli` uses it.

pub mod capture;
pub mod cnp_timing;
pub mod engine;
mod error;
pub mod findings;
pub mod gaps;
pub mod report;
pub mod tally;
pub mod workers;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use roce_common::key::FlowKeyMirror;
use roce_common::names::program::XDP_MIRROR;
use roce_common::policy::Policy;

pub use capture::{Batch, CaptureReader, Format, Frame, UnsupportedLink};
pub use engine::{
    Counted, Engine, FlowId, KernelWorker, Shard, Split, Work, Worker, MIN_TEST_RUN_LEN,
};
pub use error::AnalyzeError;
pub use report::{render, AnalyzedFlow, CaptureInfo, FlowIdent, Report};
pub use tally::{check_icrc, FlowExtra, NonRoceLossless, Talkers, Tally, MAX_TALKERS};

use crate::datapath::loader::LoadOptions;
use crate::doc::{Document, Rtt};

/// Workers by default, at most: the reader thread walks every frame to assign it,
/// so beyond a few workers it is the limit.
pub const MAX_WORKERS: usize = 8;

/// Workers at most, asked for or not (a worker's number is a `u16` in a batch).
pub const WORKERS_LIMIT: usize = 1024;

/// How to analyze.
#[derive(Clone, Debug)]
pub struct AnalyzeOptions {
    /// `None`: the reference engine.
    pub engine: Option<Engine>,
    pub load: LoadOptions,
    pub policy: Policy,
    /// The fabric verdicts' thresholds (the config's `[verdicts]`).
    pub verdicts: crate::config::VerdictThresholds,
    /// Show a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Worker threads besides the reader. `None`: for the reference engine one per
    /// CPU this process may use but the reader's (at least 1, at most
    /// [`MAX_WORKERS`]); for the kernel engine's test runs one per CPU (its reference
    /// pass as the reference engine). The report is the same for any number.
    pub workers: Option<usize>,
}

/// An analysis: the report of everything read, and the error that stopped reading
/// early, if any (the report then covers the frames before it).
pub struct Analysis {
    pub report: Report,
    pub error: Option<AnalyzeError>,
    pub engine: Engine,
}

/// Where a capture comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    File(PathBuf),
    /// Standard input (`-` on the command line).
    Stdin,
}

impl Input {
    /// `-` is standard input, anything else a file.
    pub fn from_arg(arg: &Path) -> Input {
        if arg == Path::new("-") {
            Input::Stdin
        } else {
            Input::File(arg.to_path_buf())
        }
    }

    /// The name the report gives it (`capture.file`): the path as given, `-` for
    /// standard input.
    pub fn name(&self) -> String {
        match self {
            Input::File(p) => p.display().to_string(),
            Input::Stdin => "-".to_string(),
        }
    }
}

/// An input opened so that it can be read more than once (the kernel engine's two
/// passes), or once.
enum Source<'a> {
    File(&'a Path),
    Stdin,
    /// A file holding standard input (standard input itself when it is a regular
    /// file), read from the offset.
    Seekable(File, u64),
}

impl Source<'_> {
    /// `again`: the engine reads the capture twice.
    fn new(input: &Input, again: bool) -> Result<Source<'_>, AnalyzeError> {
        Ok(match input {
            Input::File(p) => Source::File(p),
            Input::Stdin if !again => Source::Stdin,
            Input::Stdin => {
                let mut stdin = capture::stdin_file()?;
                let dir = std::env::temp_dir();
                let spool_err = |source| AnalyzeError::Spool {
                    dir: dir.clone(),
                    source,
                };
                let regular = stdin.metadata().map(|m| m.is_file()).unwrap_or(false);
                match regular.then(|| stdin.stream_position()) {
                    Some(Ok(at)) => Source::Seekable(stdin, at),
                    _ => {
                        let spool = spool_file(&dir).map_err(spool_err)?;
                        let mut to = &spool;
                        io::copy(&mut stdin, &mut to).map_err(spool_err)?;
                        Source::Seekable(spool, 0)
                    }
                }
            }
        })
    }

    fn open(&self) -> Result<CaptureReader, AnalyzeError> {
        match self {
            Source::File(p) => CaptureReader::open(p),
            Source::Stdin => CaptureReader::stdin(),
            Source::Seekable(f, at) => {
                let name = Path::new(capture::STDIN_NAME);
                let open_err = |source| AnalyzeError::Open {
                    path: name.to_path_buf(),
                    source,
                };
                // The passes follow each other: the clone's shared offset is free.
                let mut f = f.try_clone().map_err(open_err)?;
                f.seek(SeekFrom::Start(*at)).map_err(open_err)?;
                let size = f.metadata().map_or(0, |m| m.len().saturating_sub(*at));
                CaptureReader::from_reader(name, Box::new(f), size)
            }
        }
    }
}

/// A new file in `dir`, readable by this user only and unlinked at once (it lives
/// while it is open).
fn spool_file(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut n = 0u32;
    loop {
        let path = dir.join(format!("roce-agent-stdin-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Analyzes a capture file: [`analyze_input`] of [`Input::File`].
pub fn analyze(path: &Path, opts: &AnalyzeOptions) -> Result<Analysis, AnalyzeError> {
    analyze_input(&Input::File(path.to_path_buf()), opts)
}

/// Analyzes a capture. Errors before the first frame (cannot open, not a capture,
/// a link type not read, kernel engine unavailable) are returned as `Err`; errors
/// while reading come back in [`Analysis::error`] with the report so far.
///
/// The kernel engine reads the capture twice: a reference pass for the tally while
/// its program loads (the verifier takes 0.1-0.2 s over `xdp_classify`), then every
/// frame through the program, up to where the first pass stopped.
pub fn analyze_input(input: &Input, opts: &AnalyzeOptions) -> Result<Analysis, AnalyzeError> {
    let engine = opts.engine.unwrap_or(Engine::Reference);
    let source = Source::new(input, engine == Engine::Kernel)?;
    let reader = source.open()?;
    let engine = opts.engine.unwrap_or(Engine::Reference);
    let cpus = engine::allowed_cpus();
    let cfg = opts.load.config;
    // The reader takes a CPU of its own.
    let reference_workers = opts
        .workers
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(1)
                .min(MAX_WORKERS)
        })
        .clamp(1, WORKERS_LIMIT);
    let reference = |reader: CaptureReader, progress: bool| {
        let split = Split::new(reference_workers, cfg, &opts.policy);
        let workers = (0..reference_workers)
            .map(|i| (Worker::new(i, cfg, &opts.policy), None))
            .collect();
        workers::run(reader, &split, workers::Icrc::Balance, workers, progress)
    };
    let (run, counted) = match engine {
        Engine::Reference => {
            let run = reference(reader, opts.progress);
            let counted = engine::counted_reference(run.workers.iter().map(|w| &w.shard));
            (run, counted)
        }
        Engine::Kernel => std::thread::scope(|s| {
            let loading = s.spawn(|| engine::load_kernel(&opts.load));
            let run = reference(reader, false);
            let mut loaded = loading.join().map_err(|_| AnalyzeError::Worker)??;
            // A free slot for each flow the first pass counted, at most the table's
            // size: the program takes one per new flow, so it counts as it would with
            // every slot queued, and the load skips a syscall per slot it would never
            // use (65,536 by default, about 30 ms).
            let flows = run.workers.iter().map(|w| w.shard.flows.len()).sum();
            loaded.free_first_slots(flows)?;
            let mut again = source.open()?;
            again.limit_frames(run.read.frames);
            // One worker per CPU, pinned: the test runs are the cost.
            let n = opts.workers.unwrap_or(cpus.len()).clamp(1, WORKERS_LIMIT);
            if cpus.is_empty() {
                tracing::warn!(
                    "cannot read this process's CPUs: the kernel engine's workers are not pinned"
                );
            }
            // xdp_mirror: a capture of a mirror port is decapsulated, any other frame
            // counted as xdp_classify counts it.
            let workers = engine::kernel_workers(loaded.xdp_mirror_fd()?, XDP_MIRROR, n, &cpus)?;
            let split = Split::new(n, cfg, &opts.policy);
            let kernel = workers::run(again, &split, workers::Icrc::Skip, workers, opts.progress);
            let short = kernel.workers.iter().map(|w| w.short).sum();
            let counted = engine::counted_kernel(&loaded, short)?;
            let mut run = run;
            // A test run that failed stops the analysis; reading errors are the first pass's.
            if let Some(e) = kernel.error {
                run.error = Some(e);
            }
            Ok::<_, AnalyzeError>((run, counted))
        })?,
    };
    let error = run.error.or(run.read.error);
    let mut tally = Tally {
        first_ns: run.read.first_ns,
        last_ns: run.read.last_ns,
        unsupported: run.read.unsupported,
        ..Tally::default()
    };
    let mut talkers = Vec::with_capacity(run.workers.len());
    for w in run.workers {
        let shard = w.shard;
        tally.icrc_checked += shard.icrc_checked;
        tally.flows.extend(shard.flows.into_iter().map(|(k, e)| {
            let mut extra = e.extra;
            extra.nak_to_resend_ns = e.stats.nak_to_resend_ns;
            extra.recovery_ns = e.stats.recovery_ns;
            extra.recovery_max_us = e.stats.recovery_max_us;
            (k.key, extra)
        }));
        tally.rtt_unpaired.shared_psn += shard.rtt.shared_psn;
        tally.rtt_unpaired.other_qp += shard.rtt.other_qp;
        tally.capture_gaps_undecided += shard.gaps.undecided();
        for (k, t) in shard.cnps.flows {
            tally.cnp_times.entry(k.key).or_default().merge(&t);
        }
        tally
            .rtt
            .extend(shard.rtt.hists.into_iter().map(|(k, h)| (k.key, h)));
        talkers.push(shard.talkers);
    }
    tally.non_roce_lossless = Talkers::merge(talkers);
    let capture = CaptureInfo {
        file: input.name(),
        format: run.read.format,
        frames: run.read.frames,
        first_ns: tally.first_ns,
        last_ns: tally.last_ns,
        icrc_checked: tally.icrc_checked,
        complete: error.is_none(),
        error: error.as_ref().map(|e| e.to_string()),
    };
    let report = build_report(capture, counted, &tally, opts);
    Ok(Analysis {
        report,
        error,
        engine,
    })
}

pub(crate) fn progress_bar(wanted: bool, size: u64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal as _;
    if !wanted || !io::stderr().is_terminal() || size < (64 << 20) {
        return None;
    }
    let pb = indicatif::ProgressBar::new(size);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} analyzing [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    Some(pb)
}

/// Joins the engine's counts and the tally into the report.
pub fn build_report(
    capture: CaptureInfo,
    counted: Counted,
    tally: &Tally,
    opts: &AnalyzeOptions,
) -> Report {
    let mut flows = counted.flows;
    for (k, st) in flows.iter_mut() {
        if let Some(e) = tally.flows.get(k) {
            st.first_seen_ns = e.first_ns;
            st.last_seen_ns = e.last_ns;
            st.nak_to_resend_ns = e.nak_to_resend_ns;
            st.recovery_ns = e.recovery_ns;
            st.recovery_max_us = e.recovery_max_us;
            // BPF_PROG_TEST_RUN hands XDP at most ~3.5 KB of linear data (the rest of
            // a jumbo frame goes into fragments, which `data_end - data` does not
            // count): bytes are the frames' wire lengths, counted here.
            if st.bytes != e.captured_bytes {
                tracing::debug!(
                    engine_bytes = st.bytes,
                    captured_bytes = e.captured_bytes,
                    "the engine saw fewer bytes than captured (jumbo frames)"
                );
            }
            st.bytes = e.captured_bytes + e.snapped_bytes;
        }
    }
    let (mut plain, mut mirrored) = (Vec::new(), Vec::new());
    for (id, st) in flows {
        match id.mirror {
            Some(tag) => mirrored.push((FlowKeyMirror { key: id.key, tag }, st)),
            None => plain.push((id.key, st)),
        }
    }
    let doc = Document::build_with_mirrored(plain, mirrored, &counted.stats, None);
    let mut counters = doc.counters;
    counters.rtt_unpaired = tally.rtt_unpaired;
    counters.capture_gaps_undecided = tally.capture_gaps_undecided;
    let extras: HashMap<FlowIdent, &FlowExtra> = tally
        .flows
        .iter()
        .map(|(k, e)| (FlowIdent::of_key(k), e))
        .collect();
    let rtts: HashMap<FlowIdent, Rtt> = tally
        .rtt
        .iter()
        .filter_map(|(k, h)| Some((FlowIdent::of_key(k), Rtt::of(h)?)))
        .collect();
    let cnp_times: HashMap<FlowIdent, &cnp_timing::CnpTimes> = tally
        .cnp_times
        .iter()
        .map(|(k, t)| (FlowIdent::of_key(k), t))
        .collect();
    let mut flow_extras = Vec::with_capacity(doc.flows.len());
    let analyzed: Vec<AnalyzedFlow> = doc
        .flows
        .into_iter()
        .map(|mut flow| {
            let ident = FlowIdent::of_flow(&flow);
            let e = extras.get(&ident).map_or_else(FlowExtra::default, |e| **e);
            flow.rtt = rtts.get(&ident).copied();
            flow.capture_gaps = Some(e.capture_gaps);
            flow.set_cnps_wrong_class(&e.cnps_wrong_class);
            flow.outer_sport = flow.vni.map(|_| e.outer_sport);
            if let Some(t) = cnp_times.get(&ident) {
                flow.ce_to_cnp = Rtt::of(&t.ce_to_cnp);
                flow.cnp_interval = Rtt::of(&t.interval);
            }
            flow_extras.push(e);
            AnalyzedFlow {
                flow,
                icrc_errors: e.icrc_errors,
            }
        })
        .collect();
    counters.tunnels = crate::verdict::tunnels::Tunnels::of_flows(analyzed.iter().map(|a| &a.flow));
    let findings = findings::findings(&analyzed, &flow_extras, &counters, tally, &capture, opts);
    Report {
        capture,
        flows: analyzed,
        counters,
        findings,
    }
}
