//! What the agent observes and exports: the collector (the kernel's maps into the
//! live flows document), rates, the sampled events reader, the EVENTS ring's
//! progress, host counters (ethtool), the QP table joined with the flows (`qps`) and
//! the Prometheus exposition.
//!
//! May import: `sys`, `config`, `doc`, `datapath`, `audit` (host readers). Not `api`.

pub mod collector;
pub mod ethtool;
pub mod events_reader;
pub mod live;
pub mod metrics;
pub mod qps;
pub mod rates;
pub mod ring_progress;
