//! The agent's configuration: an optional TOML file, command-line flags over it, and
//! the checks that turn both into [`Settings`]. Two parts:
//!
//! - `file`: the TOML file as written ([`ConfigFile`]), parsed with line and column
//!   spans; why a configuration was refused ([`ConfigError`], [`Origin`]).
//! - `settings`: the defaults and limits, the flags ([`Overrides`]), and resolving
//!   defaults, then the file, then the flags into checked [`Settings`].
//!
//! This file holds the modes that the file and the flags both name.
//!
//! Every key is optional; `roce-agent run --iface IF` needs no file at all. A file
//! with an unknown key, a value of the wrong type or a value out of range is refused
//! with `FILE:LINE:COLUMN: message`, naming the key.
//!
//! ```toml
//! interfaces = ["eth1"]          # XDP attaches to each (flags: --iface, repeatable)
//! listen = "127.0.0.1:9473"      # the JSON API; ":9473" is every address, port 9473 (flag: --listen)
//! interval = 1                   # seconds between two polls of the kernel maps (flag: --interval)
//! flows_map_size = 65536         # flows the kernel table holds (the agent evicts the least recently seen)
//! roce_port = 4791               # UDP destination port of RoCEv2
//! vxlan_port = 4789              # UDP destination port of VXLAN
//! default_pmtu = 4096            # the RoCE path MTU: assumed for READs until a flow's own is learnt, and what `check` requires
//! mtu = 9000                     # netdev MTU the RoCE interfaces need (default: the one carrying default_pmtu, 4192) (flag: --mtu)
//! peers = ["198.18.0.2"]         # `check`: hosts whose path must carry `mtu` with DF set (flag: --peer)
//! mode = "audit"                 # host DSCP policy on egress of `interfaces`: "audit" | "enforce" (flag: --mode)
//! vteps = ["eth0"]               # VTEP underlays: inner->outer DSCP/ECN, decap checks (flag: --vtep)
//! ecn_propagation = "kernel"     # outer ECN on VTEPs: "kernel" (tos inherit) | "rfc6040" (flag: --ecn-propagation)
//! top_flows = 10                 # GET /metrics: the flows with the most problems get roce_top_flow_* series (0 to 1000)
//! events_sample = 1              # sampled events: 1 in N of each kind per CPU, rate-limited; 0 emits none (flag: --events-sample)
//! rtt_spike_us = 1000            # a round trip longer than this (µs) is an rtt_spike event; 0: none (flag: --rtt-spike-us)
//! log_format = "text"            # the log on stderr: "text" | "json" (a JSON object a line) | "logfmt" (flag: --log-format)
//! events_payload_bytes = 0       # sampled events keep the frame's headers up to the last transport header (BTH and its extension headers) only; N keeps N bytes of payload after them (0 to 128)
//! web_config_file = "web.yml"    # TLS, basic auth and headers of the API, as Prometheus exporters' --web.config.file (flag: --web-config-file)
//!
//! [qos]                          # the host DSCP policy (all keys optional)
//! roce_dscp = 26                 # DSCP of RoCEv2 data
//! cnp_dscp = 48                  # DSCP of CNPs
//! lossless_dscps = [26]          # non-RoCE traffic on these is remarked ...
//! remark_dscp = 0                # ... to this DSCP
//! priority = { "26" = 3, "48" = 6 }   # DSCP -> skb priority overrides (default DSCP >> 3)
//! vtep_dscp = { "10" = 26 }      # inner DSCP -> outer DSCP overrides on VTEPs (default: the same)
//!
//! [verdicts]                     # the fabric verdicts' thresholds (all keys optional)
//! window_secs = 30               # how far back the live verdicts look (1 to 3600)
//! min_ce = 10                    # ce_unanswered: CE-marked packets in the window, at least
//! pause_storm_share = 0.5        # pause_storm: paused more than this share of a round ...
//! pause_storm_rounds = 3         # ... this many rounds running
//! slow_receiver_pauses_per_s = 1000   # slow_receiver: pause frames sent a second over the window
//! ecmp_min_qps = 8               # ecmp_low_entropy: queue pairs on a path, at least ...
//! ecmp_qps_per_port = 4          # ... and this many a UDP source port, or more
//! ```
//!
//! Imports nothing of the crate: every other folder may use it.

mod file;
mod settings;
mod verdicts;

use roce_common::policy::{ECN_KERNEL, ECN_RFC6040, HOST_AUDIT, HOST_ENFORCE};
use serde::Deserialize;

pub use file::{line_col, ConfigError, ConfigFile, FileConfig, Origin, QosFile, VerdictsFile};
pub(crate) use settings::check_ifname;
pub use settings::{
    bind_addresses, Overrides, Settings, DEFAULT_EVENTS_SAMPLE, DEFAULT_FLOWS_MAP_SIZE,
    DEFAULT_INTERVAL_SECS, DEFAULT_LISTEN, DEFAULT_PMTU, DEFAULT_TOP_FLOWS, MAX_EVENTS_SAMPLE,
    MAX_FLOWS_MAP_SIZE, MAX_INTERVAL_SECS, MAX_TOP_FLOWS, MIN_INTERVAL_SECS,
};
pub use verdicts::*;

/// What the host DSCP policy does on egress of the `--iface` interfaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HostMode {
    /// Count what would change, change no byte.
    #[default]
    Audit,
    /// Rewrite DSCPs and set skb->priority.
    Enforce,
}

impl HostMode {
    /// The IFACE_QOS value.
    pub fn code(self) -> u8 {
        match self {
            HostMode::Audit => HOST_AUDIT,
            HostMode::Enforce => HOST_ENFORCE,
        }
    }
}

/// How a VTEP derives the outer ECN field from the inner one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EcnPropagation {
    /// What Linux `tos inherit` does: copy, but inner CE becomes outer ECT(0).
    #[default]
    Kernel,
    /// RFC 6040 normal mode: copy, CE included.
    Rfc6040,
}

impl EcnPropagation {
    /// The IFACE_QOS value.
    pub fn code(self) -> u8 {
        match self {
            EcnPropagation::Kernel => ECN_KERNEL,
            EcnPropagation::Rfc6040 => ECN_RFC6040,
        }
    }
}

impl std::fmt::Display for HostMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HostMode::Audit => "audit",
            HostMode::Enforce => "enforce",
        })
    }
}

impl std::fmt::Display for EcnPropagation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EcnPropagation::Kernel => "kernel",
            EcnPropagation::Rfc6040 => "rfc6040",
        })
    }
}

/// How `run` writes its log records on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people: a line a record, the fields as `key=value` after the message.
    #[default]
    Text,
    /// A JSON object a line: `ts`, `level`, `target`, `msg`, then the fields.
    Json,
    /// A logfmt line a record: the keys of `json`, values with a space, `=` or `"`
    /// quoted.
    Logfmt,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_written_as_the_file_and_the_flags_name_them() {
        use clap::ValueEnum as _;
        for mode in HostMode::value_variants() {
            let name = mode.to_string();
            assert_eq!(HostMode::from_str(&name, false), Ok(*mode));
            let parsed: HostMode = toml::Value::String(name).try_into().unwrap();
            assert_eq!(parsed, *mode);
        }
        for ecn in EcnPropagation::value_variants() {
            let name = ecn.to_string();
            assert_eq!(EcnPropagation::from_str(&name, false), Ok(*ecn));
            let parsed: EcnPropagation = toml::Value::String(name).try_into().unwrap();
            assert_eq!(parsed, *ecn);
        }
    }
}
