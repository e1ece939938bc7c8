//! The report of an analysis: the flow document's records with what analyze adds,
//! facts about the capture, and the findings; JSON through serde, text by [`render`].

use std::net::IpAddr;

use roce_common::flow::FlowStats;

use roce_common::key::FlowKeyMirror;
use serde::{Deserialize, Serialize};

use super::capture::Format;
use super::engine::Engine;
use super::engine::FlowId;
use crate::doc::finding::{self, Finding};
use crate::doc::{Counters, Document, Flow, Mirror};

/// A flow of the analysis: the flow document's record plus what analyze adds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnalyzedFlow {
    #[serde(flatten)]
    pub flow: Flow,
    /// Packets whose ICRC (recomputed over the masked headers, `roce_common::icrc`) did not match.
    pub icrc_errors: u64,
}

impl AnalyzedFlow {
    /// The flow's gaps lost by the capture (`Flow::capture_gaps`, always measured here).
    pub fn capture_gaps(&self) -> u64 {
        self.flow.capture_gaps.unwrap_or(0)
    }
}

/// Facts about the capture file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureInfo {
    pub file: String,
    pub format: Format,
    /// Frames read (up to the error, when there was one).
    pub frames: u64,
    /// Capture time of the first and last frame, ns since the epoch.
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// RoCE frames whose ICRC was checked (the rest were cut off by the snap length).
    pub icrc_checked: u64,
    /// False when reading stopped at a truncated or corrupt record.
    pub complete: bool,
    /// Why reading stopped early.
    pub error: Option<String>,
}

/// What `analyze --json` prints: the flow document's fields plus `capture`,
/// per-flow `icrc_errors` and `findings`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub capture: CaptureInfo,
    pub flows: Vec<AnalyzedFlow>,
    pub counters: Counters,
    pub findings: Vec<Finding>,
}

impl Report {
    /// The plain flow document (for the shared table renderer).
    pub fn document(&self) -> Document {
        Document {
            flows: self.flows.iter().map(|f| f.flow.clone()).collect(),
            counters: self.counters.clone(),
        }
    }
}

/// A flow's identity as the document shows it (to join the tally to document rows).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowIdent {
    src: IpAddr,
    dst: IpAddr,
    vni: Option<u32>,
    inner_src: Option<IpAddr>,
    inner_dst: Option<IpAddr>,
    dest_qp: u32,
    mirror: Option<Mirror>,
}

impl FlowIdent {
    pub fn of_key(k: &FlowId) -> FlowIdent {
        let f = match k.mirror {
            Some(tag) => Flow::from_mirrored_entry(
                &FlowKeyMirror { key: k.key, tag },
                &FlowStats::default(),
                None,
            ),
            None => Flow::from_entry(&k.key, &FlowStats::default(), None),
        };
        FlowIdent::of_flow(&f)
    }
    pub fn of_flow(f: &Flow) -> FlowIdent {
        FlowIdent {
            src: f.src,
            dst: f.dst,
            vni: f.vni,
            inner_src: f.inner_src,
            inner_dst: f.inner_dst,
            dest_qp: f.dest_qp,
            mirror: f.mirror.clone(),
        }
    }
}

/// Renders the human view: capture line, the flow table, findings.
pub fn render(report: &Report, engine: Engine) -> String {
    use std::fmt::Write as _;
    let c = &report.capture;
    let mut out = String::new();
    let span = match (c.first_ns, c.last_ns) {
        (Some(a), Some(b)) => format!(", {:.3} s", b.saturating_sub(a) as f64 / 1e9),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{}: {} frames ({}{span}), engine {engine}",
        c.file,
        c.frames,
        match c.format {
            Format::Pcap => "pcap",
            Format::Pcapng => "pcapng",
        }
    );
    out.push_str(&crate::doc::table::render(&report.document()));
    let icrc: u64 = report.flows.iter().map(|f| f.icrc_errors).sum();
    let _ = writeln!(
        out,
        "ICRC: {} RoCE frames checked, {icrc} bad",
        c.icrc_checked
    );
    out.push('\n');
    out.push_str(&finding::render(&report.findings));
    out
}
