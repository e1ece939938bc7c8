//! `roce-agent analyze`: the flow table of a pcap or pcapng capture, with the same
//! classifier and the same counting rules as the live agent.
//!
//! The parts, each in its own module and none importing a later one:
//! - [`capture`]: reading pcap/pcapng frame by frame (never loaded whole);
//! - [`engine`]: the two engines that count frames into flows and STATS (the real XDP
//!   program through BPF_PROG_TEST_RUN, or the reference classifier);
//! - [`tally`]: what the engines cannot know offline (timestamps, ICRC, snap length,
//!   DSCP observations), from the reference classifier's walk of every frame;
//! - [`report`]: the report and its text rendering;
//! - [`findings`]: what an operator should look at, judged against the DSCP policy
//!   (`roce_common::policy::Policy`, from the config's `[qos]` table).
//!
//! This module joins them: [`analyze`] streams the capture through an engine and the
//! tally, then builds the report. Both engines print byte-identical JSON for the same
//! capture.

pub mod capture;
pub mod engine;
mod error;
pub mod findings;
pub mod report;
pub mod tally;

use std::collections::HashMap;
use std::io;
use std::path::Path;

use roce_common::policy::Policy;

pub use capture::{CaptureReader, Format, Frame};
pub use engine::{Counted, Counter, Engine, MIN_TEST_RUN_LEN};
pub use error::AnalyzeError;
pub use report::{render, AnalyzedFlow, CaptureInfo, FlowIdent, Report};
pub use tally::{check_icrc, FlowExtra, NonRoceLossless, Tally, MAX_TALKERS};

use crate::doc::Document;
use crate::loader::LoadOptions;

/// How to analyze.
#[derive(Clone, Debug)]
pub struct AnalyzeOptions {
    /// `None`: the kernel engine when this process may load BPF programs, else the
    /// reference engine.
    pub engine: Option<Engine>,
    pub load: LoadOptions,
    pub policy: Policy,
    /// Show a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
}

/// An analysis: the report of everything read, and the error that stopped reading
/// early, if any (the report then covers the frames before it).
pub struct Analysis {
    pub report: Report,
    pub error: Option<AnalyzeError>,
    pub engine: Engine,
}

/// Analyzes a capture. Errors before the first frame (cannot open, not a capture,
/// wrong link type, kernel engine unavailable) are returned as `Err`; errors while
/// reading come back in [`Analysis::error`] with the report so far.
pub fn analyze(path: &Path, opts: &AnalyzeOptions) -> Result<Analysis, AnalyzeError> {
    let mut reader = CaptureReader::open(path)?;
    let cfg = opts.load.config;
    let (mut counter, engine) = match opts.engine {
        Some(e) => (Counter::new(e, &opts.load)?, e),
        None => match Counter::new(Engine::Kernel, &opts.load) {
            Ok(c) => (c, Engine::Kernel),
            Err(e) => {
                tracing::info!(error = %e, "cannot load BPF programs: using the reference classifier");
                (
                    Counter::new(Engine::Reference, &opts.load)?,
                    Engine::Reference,
                )
            }
        },
    };
    let mut tally = Tally::default();
    let progress = progress_bar(opts.progress, reader.position().1);
    let mut error = None;
    loop {
        let frame = match reader.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        let walk = match counter.frame(&frame, &cfg) {
            Ok(w) => w,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        tally.observe(&frame, &walk, &opts.policy);
        let n = frame.number;
        if let Some(pb) = &progress {
            if n % 4096 == 0 {
                pb.set_position(reader.position().0);
            }
        }
    }
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    let frames = reader.frames();
    let counted = counter.finish()?;
    let capture = CaptureInfo {
        file: path.display().to_string(),
        format: reader.format(),
        frames,
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

fn progress_bar(wanted: bool, size: u64) -> Option<indicatif::ProgressBar> {
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
    let doc = Document::build(flows, &counted.stats, None);
    let counters = doc.counters;
    let extras: HashMap<FlowIdent, &FlowExtra> = tally
        .flows
        .iter()
        .map(|(k, e)| (FlowIdent::of_key(k), e))
        .collect();
    let mut flow_extras = Vec::with_capacity(doc.flows.len());
    let analyzed: Vec<AnalyzedFlow> = doc
        .flows
        .into_iter()
        .map(|flow| {
            let e = extras
                .get(&FlowIdent::of_flow(&flow))
                .map_or_else(FlowExtra::default, |e| **e);
            flow_extras.push(e);
            AnalyzedFlow {
                flow,
                icrc_errors: e.icrc_errors,
            }
        })
        .collect();
    let findings = findings::findings(
        &analyzed,
        &flow_extras,
        &counters,
        tally,
        &capture,
        &opts.policy,
        opts.load.flows_max_entries,
    );
    Report {
        capture,
        flows: analyzed,
        counters,
        findings,
    }
}
