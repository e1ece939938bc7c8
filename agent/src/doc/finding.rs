//! A finding: one thing an operator should look at, with what was found, what was
//! expected and the fix. `analyze` reports findings about a capture; the host audit
//! (`check`, `agent/src/audit/`) reports its own in the same shape (`check`,
//! `interface`, `severity`, `found`, `expected`, `fix`).

use std::fmt::Write as _;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{Direction, Flow};

/// How much a finding matters (ordered: errors sort last, most severe first with `Reverse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// A stable name, e.g. `roce_outside_lossless_dscp`.
    pub check: String,
    /// null in analyze (no interface).
    pub interface: Option<String>,
    pub severity: Severity,
    pub found: String,
    pub expected: String,
    pub fix: String,
    /// Flows the finding concerns (analyze only: 0 when it is about other traffic;
    /// absent from the host audit's findings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<u64>,
    /// The flows behind the finding by key, as the flows document names them (at most
    /// 1,000, in the order the text names them; `flows` counts them all). Absent when
    /// the finding is about no flow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flow_keys: Vec<FlowRef>,
}

/// A flow by its key: the fields that tell it apart in the flows document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRef {
    pub ifname: Option<String>,
    pub direction: Option<Direction>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub vni: Option<u32>,
    pub inner_src: Option<IpAddr>,
    pub inner_dst: Option<IpAddr>,
    #[serde(flatten, with = "super::dest_qp_json")]
    pub dest_qp: u32,
}

impl FlowRef {
    pub fn of(f: &Flow) -> FlowRef {
        FlowRef {
            ifname: f.ifname.clone(),
            direction: f.direction,
            src: f.src,
            dst: f.dst,
            vni: f.vni,
            inner_src: f.inner_src,
            inner_dst: f.inner_dst,
            dest_qp: f.dest_qp,
        }
    }
}

/// The findings as text, one paragraph each.
pub fn render(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "findings: none\n".to_string();
    }
    let mut out = String::from("findings:\n");
    for f in findings {
        let sev = match f.severity {
            Severity::Error => "ERROR",
            Severity::Warning => "WARN",
            Severity::Info => "INFO",
        };
        let _ = writeln!(out, "  {sev:<5} {}: {}", f.check, f.found);
        let _ = writeln!(out, "        expected: {}", f.expected);
        let _ = writeln!(out, "        fix: {}", f.fix);
    }
    out
}

/// The body of `GET /findings`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Findings {
    pub findings: Vec<Finding>,
}
