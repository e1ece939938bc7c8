//! The kernel side under the agent's control: loading the eBPF object, pinning,
//! attaching to interfaces (XDP, tc), the QoS maps, the flow table's upkeep, batch
//! map syscalls and BPF_PROG_TEST_RUN.
//!
//! May import: `sys`, `config`, `doc`. Nothing here reads the host's other state
//! (that is `audit` and `telemetry`) or knows the HTTP API.

pub mod attach;
pub mod batch;
pub mod clsact;
pub mod flow_table;
pub mod loader;
pub mod pin;
pub mod qos;
pub mod testrun;
