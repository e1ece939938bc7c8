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
        "{}: link type {linktype} is not Ethernet: analyze reads Ethernet captures \
         (capture on the interface itself, e.g. `tcpdump -i eth1 -w FILE`, not `-i any`)",
        path.display()
    )]
    LinkType { path: PathBuf, linktype: String },
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
