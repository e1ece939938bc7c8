//! Findings of `analyze`: what an operator of a lossless RoCE fabric should look at
//! in a capture. Same shape as `check --json`'s findings (`check`, `interface`,
//! `severity`, `found`, `expected`, `fix`), plus the affected `flows` count.

use std::fmt::Write as _;

use roce_common::policy::Policy;

use super::report::{AnalyzedFlow, CaptureInfo};
use super::tally::{FlowExtra, Tally};
use crate::doc::finding::{Finding, FlowRef, Severity};
use crate::doc::{Counters, Flow};

/// `{26}` or `{24, 26}`: the policy's lossless DSCP set.
fn lossless_text(policy: &Policy) -> String {
    let mask = (0..64u8)
        .filter(|d| policy.is_lossless(*d))
        .fold(0u64, |m, d| m | 1 << d);
    format!("{{{}}}", dscp_list(mask))
}

/// `0, 26` from a DSCP bit mask.
pub fn dscp_list(mask: u64) -> String {
    (0..64)
        .filter(|d| mask & (1u64 << d) != 0)
        .map(|d: u32| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many example flows a finding names.
const EXAMPLES: usize = 3;

fn flow_name(f: &Flow) -> String {
    let mut s = format!("{}→{}", f.src, f.dst);
    if let (Some(vni), Some(is), Some(id)) = (f.vni, f.inner_src, f.inner_dst) {
        let _ = write!(s, " vni {vni} {is}→{id}");
    }
    let _ = write!(s, " qp {:#x}", f.dest_qp);
    s
}

fn examples<'a>(
    flows: impl Iterator<Item = &'a AnalyzedFlow>,
    what: impl Fn(&Flow) -> String,
) -> String {
    examples_of(flows, |f| what(&f.flow))
}

/// [`examples`] with what analyze adds to a flow in view.
fn examples_of<'a>(
    flows: impl Iterator<Item = &'a AnalyzedFlow>,
    what: impl Fn(&AnalyzedFlow) -> String,
) -> String {
    let all: Vec<&AnalyzedFlow> = flows.collect();
    let mut s: Vec<String> = all
        .iter()
        .take(EXAMPLES)
        .map(|f| format!("{} ({})", flow_name(&f.flow), what(f)))
        .collect();
    if all.len() > EXAMPLES {
        s.push(format!("and {} more", all.len() - EXAMPLES));
    }
    s.join("; ")
}

/// What to do about other traffic on a lossless DSCP: remark it to the policy's
/// `remark_dscp`, unless that DSCP is itself lossless (`--lossless-dscp 0` with the
/// default remark DSCP 0), where remarking would only move it within the class.
fn remark_advice(policy: &Policy) -> String {
    let to = policy.qos.remark_dscp;
    if policy.is_lossless(to) {
        format!(
            "fix the application that sets that DSCP; remarking cannot help while the remark DSCP {to} is itself lossless: set `remark_dscp` in [qos] to a DSCP outside the lossless set"
        )
    } else {
        format!(
            "remark other traffic to DSCP {to} on egress (`roce-agent run --mode enforce`), or fix the application that sets that DSCP"
        )
    }
}

/// How many flows a finding lists by key (`flow_keys`); `flows` counts them all.
const MAX_FLOW_KEYS: usize = 1000;

/// Lists the flows the finding just pushed concerns, by key, in the order its text
/// names them: what a script needs to find them in the flows document.
fn name_flows<'a>(out: &mut [Finding], concerned: impl Iterator<Item = &'a AnalyzedFlow>) {
    if let Some(last) = out.last_mut() {
        last.flow_keys = concerned
            .take(MAX_FLOW_KEYS)
            .map(|f| FlowRef::of(&f.flow))
            .collect();
    }
}

/// Every finding, most severe first (stable order within a severity).
/// The flows of the capture sources (the capture itself, each mirror session of it)
/// whose every checked frame failed its ICRC while their PSNs ran in sequence (`fn
/// findings`, `icrc_not_preserved`): at least [`ICRC_NOT_KEPT_MIN`] frames checked.
fn icrc_not_kept<'a>(flows: &'a [AnalyzedFlow], extras: &[FlowExtra]) -> Vec<&'a AnalyzedFlow> {
    use std::collections::BTreeMap;
    // Source -> (frames checked, frames failed, sound, its flows).
    let mut sources: BTreeMap<Option<crate::doc::Mirror>, (u64, u64, bool, Vec<&AnalyzedFlow>)> =
        BTreeMap::new();
    for (f, e) in flows.iter().zip(extras) {
        let s = sources
            .entry(f.flow.mirror.clone())
            .or_insert((0, 0, true, Vec::new()));
        s.0 += f.flow.packets.saturating_sub(e.icrc_unchecked);
        s.1 += f.icrc_errors;
        s.2 &= f.flow.psn_gaps <= f.capture_gaps() && f.flow.naks == 0;
        s.3.push(f);
    }
    sources
        .into_values()
        .filter(|(checked, failed, sound, _)| {
            *checked >= ICRC_NOT_KEPT_MIN && failed == checked && *sound
        })
        .flat_map(|(_, _, _, fl)| fl.into_iter().filter(|f| f.icrc_errors > 0))
        .collect()
}

/// Frames a source must have had checked before "every ICRC fails" says more than
/// bad luck.
const ICRC_NOT_KEPT_MIN: u64 = 8;

pub fn findings(
    flows: &[AnalyzedFlow],
    extras: &[FlowExtra],
    counters: &Counters,
    tally: &Tally,
    capture: &CaptureInfo,
    opts: &super::AnalyzeOptions,
) -> Vec<Finding> {
    let (policy, flows_max_entries) = (&opts.policy, opts.load.flows_max_entries);
    let mut out = Vec::new();
    let finding =
        |check: &str, severity, flows: usize, found: String, expected: String, fix: &str| Finding {
            check: check.to_string(),
            interface: None,
            severity,
            found,
            expected,
            fix: fix.to_string(),
            flows: Some(flows as u64),
            flow_keys: Vec::new(),
        };

    // Loss: PSN gaps in a fabric that should be lossless, but those the capture lost.
    let gaps: Vec<(&AnalyzedFlow, &FlowExtra)> = flows
        .iter()
        .zip(extras)
        .filter(|(f, _)| f.flow.psn_gaps > f.capture_gaps())
        .collect();
    if !gaps.is_empty() {
        let total: u64 = gaps
            .iter()
            .map(|(f, _)| f.flow.psn_gaps - f.capture_gaps())
            .sum();
        let fabric: u64 = gaps.iter().map(|(_, e)| e.fabric_gaps).sum();
        out.push(finding(
            "psn_gaps",
            Severity::Error,
            gaps.len(),
            format!(
                "{total} PSN gaps on {} flows (packets lost before the capture point; {fabric} of them resent or NAKed: lost in the fabric; {} with no later response of their queue pair in the capture to tell): {}",
                gaps.len(),
                total - fabric,
                examples(gaps.iter().map(|g| g.0), |f| format!("{} gaps", f.psn_gaps))
            ),
            "no PSN gap: a lossless (PFC) class loses no packet".into(),
            "check PFC on the path (same priority enabled on hosts and switch ports, DSCP->priority maps agree), switch drop counters, and the capture point itself (a SPAN port may drop)",
        ));
        name_flows(&mut out, gaps.iter().map(|g| g.0));
    }

    // Gaps the capture lost: the responder acknowledged what the capture never held.
    let lost: Vec<&AnalyzedFlow> = flows.iter().filter(|f| f.capture_gaps() > 0).collect();
    if !lost.is_empty() {
        let total: u64 = lost.iter().map(|f| f.capture_gaps()).sum();
        out.push(finding(
            "capture_gaps",
            Severity::Warning,
            lost.len(),
            format!(
                "{total} PSN gaps on {} flows were lost by the capture, not the fabric: later responses of their queue pairs acknowledged the missing requests, with no NAK and no resend: {}",
                lost.len(),
                examples_of(lost.iter().copied(), |f| format!(
                    "{} of {} gaps",
                    f.capture_gaps(), f.flow.psn_gaps
                ))
            ),
            "a capture that holds every frame (its gaps are not the fabric's, and its counts are short of the wire's)".into(),
            "the capture point dropped frames: give tcpdump a larger buffer (`-B 65536`) and a fast disk, capture fewer bytes per frame (`-s 128`), or use a mirror port (and collector) with headroom for the traffic mirrored",
        ));
        name_flows(&mut out, lost.iter().copied());
    }

    // Retransmissions: what loss (or a receiver not ready) cost.
    let resent: Vec<&AnalyzedFlow> = flows
        .iter()
        .filter(|f| f.flow.retransmitted_packets > 0)
        .collect();
    if !resent.is_empty() {
        let packets: u64 = resent.iter().map(|f| f.flow.retransmitted_packets).sum();
        let bytes: u64 = resent.iter().map(|f| f.flow.retransmitted_bytes).sum();
        let timeouts: u64 = resent.iter().map(|f| f.flow.retransmit_timeouts).sum();
        out.push(finding(
            "retransmissions",
            Severity::Warning,
            resent.len(),
            format!(
                "{packets} requests ({bytes} bytes) sent again on {} flows; {timeouts} go-backs followed no NAK (the requester's ACK timeout): {}",
                resent.len(),
                examples(resent.iter().copied(), |f| format!(
                    "{} resent, {} timeouts",
                    f.retransmitted_packets, f.retransmit_timeouts
                ))
            ),
            "no retransmission: a lossless class loses nothing to resend".into(),
            "a go-back after a NAK follows loss the responder saw (see psn_gaps, naks); after a timeout, loss at the tail of a message or of the responses (ACKs, NAKs) themselves, or an ACK timeout shorter than the path's round trip (raise the QP's timeout, e.g. NCCL_IB_TIMEOUT)",
        ));
        name_flows(&mut out, resent.iter().copied());
    }

    // NAKs: the receiver saw a sequence error or could not take the message.
    let naks: Vec<&AnalyzedFlow> = flows
        .iter()
        .filter(|f| f.flow.naks + f.flow.rnr_naks > 0)
        .collect();
    if !naks.is_empty() {
        let n: u64 = naks.iter().map(|f| f.flow.naks).sum();
        let r: u64 = naks.iter().map(|f| f.flow.rnr_naks).sum();
        out.push(finding(
            "naks",
            Severity::Warning,
            naks.len(),
            format!(
                "{n} NAKs and {r} RNR NAKs on {} flows: {}",
                naks.len(),
                examples(naks.iter().copied(), |f| format!("{} NAK, {} RNR NAK", f.naks, f.rnr_naks))
            ),
            "no NAK (sequence errors mean loss; RNR NAKs mean the receiver had no buffer posted)".into(),
            "NAK (PSN sequence error): find the loss (PFC, drops); RNR NAK: the application posts receives too late (raise the RNR retry timer or post more receive buffers)",
        ));
        name_flows(&mut out, naks.iter().copied());
    }

    // ICRC that the capture path did not keep: every frame of a source (the capture,
    // or one mirror session of it) fails, while its PSNs run in sequence. An RDMA
    // sniffer or an offloaded capture hands over frames whose ICRC the NIC stripped
    // or never wrote; corruption in the fabric would not hit every frame, and would
    // show as loss.
    let unkept = icrc_not_kept(flows, extras);
    if !unkept.is_empty() {
        let frames: u64 = unkept.iter().map(|f| f.icrc_errors).sum();
        out.push(finding(
            "icrc_not_preserved",
            Severity::Info,
            unkept.len(),
            format!(
                "all {frames} RoCE frames whose ICRC could be checked fail it, on {} flows whose PSNs run in sequence (no gap the fabric lost, no NAK): the capture path did not keep the ICRC, these are no corrupted frames",
                unkept.len()
            ),
            "frames with the ICRC they carried on the wire".into(),
            "nothing in the fabric; to check ICRCs, capture with a path that keeps them (a mirror port or a tap rather than an RDMA sniffer such as ibdump, or an offloaded capture)",
        ));
    }
    // ICRC errors: corruption, or a middlebox that rewrote covered fields.
    let bad: Vec<&AnalyzedFlow> = flows
        .iter()
        .filter(|f| f.icrc_errors > 0 && !unkept.iter().any(|u| std::ptr::eq(*u, *f)))
        .collect();
    if !bad.is_empty() {
        let total: u64 = bad.iter().map(|f| f.icrc_errors).sum();
        out.push(finding(
            "icrc_errors",
            Severity::Error,
            bad.len(),
            format!(
                "{total} RoCE packets with a bad ICRC on {} flows: {}",
                bad.len(),
                examples(bad.iter().copied(), |f| format!("{} packets", f.packets))
            ),
            "every ICRC valid (receivers drop packets whose ICRC is wrong)".into(),
            "look for a device that rewrites addresses or ports (NAT, a load balancer) or corrupts frames; RoCE's ICRC covers everything but TOS/ECN, TTL, checksums and FECN/BECN",
        ));
        name_flows(&mut out, bad.iter().copied());
    }

    // RoCE outside the lossless class.
    let off: Vec<(&AnalyzedFlow, u64, u64)> = flows
        .iter()
        .zip(extras)
        .filter(|(_, e)| e.off_lossless > 0)
        .map(|(f, e)| (f, e.off_lossless, e.off_lossless_dscps))
        .collect();
    if !off.is_empty() {
        let pkts: u64 = off.iter().map(|o| o.1).sum();
        let mask = off.iter().fold(0, |m, o| m | o.2);
        out.push(finding(
            "roce_outside_lossless_dscp",
            Severity::Error,
            off.len(),
            format!(
                "{pkts} RoCE packets on {} flows carry DSCP {} (outside the lossless set): {}",
                off.len(),
                dscp_list(mask),
                examples(off.iter().map(|o| o.0), |f| format!("DSCP {}", f.last_dscp))
            ),
            format!("RoCE traffic on a lossless DSCP {}", lossless_text(policy)),
            "set the RoCE traffic class on the hosts (e.g. `cma_roce_tos -d DEV -t 106` for DSCP 26 + ECT(0), or the application's/NCCL's traffic class: NCCL_IB_TC=106) and trust DSCP on NICs and switches",
        ));
        name_flows(&mut out, off.iter().map(|o| o.0));
    }

    // ECN off: switches cannot mark, DCQCN cannot react.
    let not_ect: Vec<(&AnalyzedFlow, u64)> = flows
        .iter()
        .zip(extras)
        .filter(|(_, e)| e.not_ect > 0)
        .map(|(f, e)| (f, e.not_ect))
        .collect();
    if !not_ect.is_empty() {
        let pkts: u64 = not_ect.iter().map(|o| o.1).sum();
        out.push(finding(
            "roce_not_ect",
            Severity::Warning,
            not_ect.len(),
            format!(
                "{pkts} RoCE packets on {} flows are Not-ECT (ECN off): {}",
                not_ect.len(),
                examples(not_ect.iter().map(|o| o.0), |f| format!("{} of {} packets", f.ecn.not_ect, f.packets))
            ),
            "RoCE data ECN-capable (ECT(0)), so that switches mark CE instead of pausing or dropping and DCQCN can slow the sender".into(),
            "enable ECN for RoCE on the hosts (ToS 106 = DSCP 26 + ECT(0); on NVIDIA NICs enable DCQCN: /sys/class/net/DEV/ecn/roce_np/enable/3 and roce_rp/enable/3)",
        ));
        name_flows(&mut out, not_ect.iter().map(|o| o.0));
    }

    // Other traffic in the lossless class.
    let n = &tally.non_roce_lossless;
    if n.frames > 0 {
        let mut protos: Vec<(u8, u64)> = n.by_proto.iter().map(|(p, c)| (*p, *c)).collect();
        protos.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let protos: Vec<String> = protos
            .iter()
            .map(|(p, c)| format!("{} {c}", proto_name(*p)))
            .collect();
        let mut talkers: Vec<(&(std::net::IpAddr, std::net::IpAddr, u8), &u64)> =
            n.talkers.iter().collect();
        talkers.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top: Vec<String> = talkers
            .iter()
            .take(EXAMPLES)
            .map(|((s, d, p), c)| format!("{s}→{d} {} ({c} frames)", proto_name(*p)))
            .collect();
        out.push(finding(
            "non_roce_on_lossless_dscp",
            Severity::Warning,
            0,
            format!(
                "{} non-RoCE frames on lossless DSCP {} ({}); top: {}",
                n.frames,
                lossless_text(policy),
                protos.join(", "),
                top.join("; ")
            ),
            "only RoCE in the lossless class (other traffic there can trigger PFC pauses that stall RoCE)".into(),
            &remark_advice(policy),
        ));
    }

    // The most CE-marked flows.
    let mut ce: Vec<&AnalyzedFlow> = flows.iter().filter(|f| f.flow.ecn.ce > 0).collect();
    if !ce.is_empty() {
        ce.sort_by(|a, b| {
            b.flow
                .ce_ratio()
                .total_cmp(&a.flow.ce_ratio())
                .then(b.flow.bytes.cmp(&a.flow.bytes))
                .then(a.flow.canonical_cmp(&b.flow))
        });
        out.push(finding(
            "ce_marked",
            Severity::Info,
            ce.len(),
            format!(
                "{} flows saw CE marks; most marked: {}",
                ce.len(),
                examples(ce.iter().copied(), |f| format!(
                    "{:.1}% CE, {} CNPs",
                    f.ce_ratio() * 100.0,
                    f.cnps
                ))
            ),
            "few CE marks; each CE-marked flow answered by CNPs from its receiver".into(),
            "CE marks mean congestion at a switch queue: look for incast (many senders to one receiver) and check that ECN thresholds sit below the PFC thresholds",
        ));
        name_flows(&mut out, ce.iter().copied());
    }

    // Frames that could not be parsed.
    let errors = counters.parse_errors_total();
    if errors > 0 {
        let reasons: Vec<String> = counters
            .parse_errors
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(r, c)| format!("{r} {c}"))
            .collect();
        out.push(finding(
            "parse_errors",
            Severity::Info,
            0,
            format!("{errors} frames could not be parsed as far as the BTH: {}", reasons.join(", ")),
            "every frame parseable".into(),
            "truncated frames usually mean a small snap length (capture with `tcpdump -s 0`); bad_vxlan_flags means VXLAN without the I flag, which Linux drops",
        ));
    }

    // Flow table overflow (kernel engine: nothing evicts there, so the flows beyond
    // the table's size find no slot and their packets count on no flow).
    if counters.flows_created > flows_max_entries as u64
        || counters.flows_evicted > 0
        || counters.flow_insert_failed > 0
    {
        out.push(finding(
            "flow_table_full",
            Severity::Warning,
            counters.flows_created as usize,
            format!(
                "the flow table holds {} flows: {} packets of flows beyond them were counted on no flow ({} flows evicted)",
                flows_max_entries, counters.flow_insert_failed, counters.flows_evicted
            ),
            "every flow in the table".into(),
            "raise flows_map_size in the config file, or use --engine reference (no limit)",
        ));
    }

    // Frames of pcapng interfaces whose link type is not read: not in the counts.
    if !tally.unsupported.is_empty() {
        let skipped: u64 = tally.unsupported.iter().map(|u| u.frames).sum();
        let ifaces: Vec<String> = tally
            .unsupported
            .iter()
            .map(|u| {
                format!(
                    "interface {}, link type {}: {} frames",
                    u.interface, u.linktype, u.frames
                )
            })
            .collect();
        // Nothing read at all is an error; frames of another interface beside the
        // Ethernet or cooked ones, a warning.
        let severity = if skipped >= capture.frames {
            Severity::Error
        } else {
            Severity::Warning
        };
        out.push(finding(
            "link_type_unsupported",
            severity,
            0,
            format!(
                "{skipped} of {} frames were not analyzed, their link type is not supported: {}",
                capture.frames,
                ifaces.join("; ")
            ),
            format!(
                "frames of a link type roce-agent reads: {}",
                super::capture::LINK_TYPES_READ
            ),
            "capture on the Ethernet interfaces that carry RoCE (`tcpdump -i eth1 -w FILE`) or on all of them (`tcpdump -i any -w FILE`, a Linux cooked capture)",
        ));
    }

    if !capture.complete {
        out.push(finding(
            "capture_incomplete",
            Severity::Error,
            0,
            capture.error.clone().unwrap_or_default(),
            "a complete capture file".into(),
            "the counts cover the frames before the error only; copy the file again or stop the capture cleanly",
        ));
    }

    // The fabric verdicts, over the capture's time.
    let span = match (capture.first_ns, capture.last_ns) {
        (Some(a), Some(b)) if b > a => Some(std::time::Duration::from_nanos(b - a)),
        _ => None,
    };
    out.extend(crate::verdict::of_capture(
        flows.iter().map(|f| &f.flow),
        span,
        policy,
        &opts.verdicts,
    ));

    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

fn proto_name(p: u8) -> String {
    match p {
        1 => "ICMP".into(),
        6 => "TCP".into(),
        17 => "UDP".into(),
        58 => "ICMPv6".into(),
        p => format!("IP proto {p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remark_advice_names_the_remark_dscp_and_never_a_lossless_one() {
        let mut policy = Policy::default();
        assert!(remark_advice(&policy).starts_with("remark other traffic to DSCP 0 "));
        policy.qos.remark_dscp = 10;
        assert!(remark_advice(&policy).starts_with("remark other traffic to DSCP 10 "));
        // `--lossless-dscp 0` with the default remark DSCP: remarking to 0 would keep
        // the traffic in the lossless class.
        policy.qos.remark_dscp = 0;
        policy.set_lossless(&[0]);
        let advice = remark_advice(&policy);
        assert!(
            !advice.contains("remark other traffic to DSCP 0"),
            "{advice}"
        );
        assert!(advice.contains("remark_dscp"), "{advice}");
    }
}
