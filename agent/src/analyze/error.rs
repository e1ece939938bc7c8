//! Why an analysis failed or stopped early.

use std::io;
use std::path::PathBuf;

use crate::datapath::loader::LoadError;

/// Why an analysis failed or stopped early.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("{}: cannot open the capture: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("{}: not a pcap or pcapng file ({detail})", path.display())]
    NotACapture { path: PathBuf, detail: String },
    #[error(
        "{}: link type {linktype} is not supported: roce-agent reads {} \
         (capture on the interface, `tcpdump -i eth1 -w FILE`, or on all of them, `tcpdump -i any -w FILE`)",
        path.display(), super::capture::LINK_TYPES_READ
    )]
    LinkType {
        path: PathBuf,
        /// Number and name, e.g. "127 (IEEE802_11_RADIOTAP)".
        linktype: String,
    },
    #[error(
        "standard input: cannot keep a copy in {} for the kernel engine, which reads the \
         capture twice (use --engine reference, which reads it once, or pass a file): {source}",
        dir.display()
    )]
    Spool { dir: PathBuf, source: io::Error },
    #[error("{}: frame {frame}: the capture is truncated or corrupt: {detail}", path.display())]
    Corrupt {
        path: PathBuf,
        /// The frame that could not be read (1-based, as tshark numbers them).
        frame: u64,
        detail: String,
    },
    #[error("the kernel engine cannot run (use --engine reference): {0}")]
    Load(#[from] LoadError),
    #[error("frame {frame}: BPF_PROG_TEST_RUN failed: {source}")]
    TestRun { frame: u64, source: io::Error },
    #[error("cannot pin a kernel-engine worker to CPU {cpu}: {source}")]
    Pin { cpu: usize, source: io::Error },
    #[error("a worker thread ended without its result (it panicked)")]
    Worker,
}
