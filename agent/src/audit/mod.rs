//! The host audit (`roce-agent check`, and `run` every interval): is this host's
//! configuration the one a lossless RoCE fabric needs?
//!
//! One module per source of facts, each turning what it read into [`Finding`]s:
//! - `link`: interfaces, MTUs and VXLAN devices over rtnetlink (`mtu`, `vxlan_overhead`);
//! - `path`: DF probes towards peers, the path MTU learnt from ICMP (`mtu_path`);
//! - `dcb`: the NIC's DCB state over dcbnl (`dcb_app`, `pfc`, `dcb_unsupported`);
//! - `rnic`: RNIC and ECN knobs in sysfs (`ecn_np`, `ecn_rp`, `cnp_dscp`, `roce_tos`).
//!
//! Reading is separate from judging: each module has a reader (netlink, sockets, files)
//! and pure functions from what was read and the policy to findings, tested on their own.

use serde::Serialize;

pub mod path;

pub use crate::finding::{Finding, Severity};

/// One change `--fix` (or `run --mode enforce`) made on the host, printed before/after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The check whose finding the change answers (`mtu`, `dcb_app`, `ecn_np`, ...).
    pub check: String,
    pub interface: String,
    /// What was changed, e.g. `mtu` or `/sys/class/net/eth1/ecn/roce_np/enable/3`.
    pub what: String,
    pub before: String,
    pub after: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} {} -> {}",
            self.check, self.interface, self.what, self.before, self.after
        )
    }
}

/// A finding of the audit (no flow count: that is analyze's).
pub fn finding(
    check: &str,
    interface: Option<&str>,
    severity: Severity,
    found: impl Into<String>,
    expected: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check: check.to_string(),
        interface: interface.map(str::to_string),
        severity,
        found: found.into(),
        expected: expected.into(),
        fix: fix.into(),
        flows: None,
    }
}
