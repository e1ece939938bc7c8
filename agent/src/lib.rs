//! roce-agent's user side: configuration, loading and attaching the kernel programs,
//! collecting their maps, and exporting what they saw.

/// The kernel object built from `ebpf/` by the build script.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce-ebpf"));

pub mod analyze;
pub mod api;
pub mod audit;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod doc;
pub mod rdma;
pub mod sys;
pub mod telemetry;
pub mod top;
pub mod verdict;
