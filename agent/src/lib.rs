//! roce-agent's user side: configuration, loading and attaching the kernel programs,
//! collecting their maps, and exporting what they saw.

/// The kernel object built from `ebpf/` by the build script.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/roce-ebpf"));

pub mod analyze;
pub mod api;
pub mod attach;
pub mod audit;
pub mod batch;
pub mod check;
pub mod cli;
pub mod collector;
pub mod config;
pub mod doc;
pub mod ethtool;
pub mod events;
pub mod events_reader;
pub mod finding;
pub mod flow_table;
pub mod live;
pub mod loader;
pub mod metrics;
pub mod netif;
pub mod pcapng;
pub mod pin;
pub mod qos;
pub mod rates;
pub mod ring_progress;
pub mod sys;
pub mod table;
pub mod testrun;
pub mod throttle;
pub mod top;
