//! The flows' part of `/metrics`: one pass over the document that sums the flows per
//! (interface, direction, encapsulation) and keeps the K flows with the most problems.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::doc::{Direction, Flow};
use crate::telemetry::live::{Figures, LiveDocument};

/// Sums over the flows of one interface, direction and encapsulation.
#[derive(Debug, Default)]
pub(super) struct FlowSums<'a> {
    /// The first place in the document of a flow of the group: groups are written in
    /// the order the document meets them.
    pub(super) first: usize,
    pub(super) ifname: &'a str,
    pub(super) direction: &'static str,
    pub(super) tunnelled: bool,
    pub(super) flows: u64,
    pub(super) packets: u64,
    pub(super) bytes: u64,
    pub(super) ecn: [u64; 4],
    pub(super) inner_ecn: [u64; 4],
    pub(super) cnps: u64,
    pub(super) acks: u64,
    pub(super) naks: u64,
    pub(super) rnr_naks: u64,
    pub(super) psn_gaps: u64,
    pub(super) retransmitted_packets: u64,
    pub(super) retransmitted_bytes: u64,
    pub(super) retransmit_timeouts: u64,
}

/// The ECN codepoint labels, in the order `FlowSums::ecn` keeps them.
pub(super) const CODEPOINTS: [&str; 4] = ["not_ect", "ect0", "ect1", "ce"];

fn ecn_array(e: &crate::doc::Ecn) -> [u64; 4] {
    [e.not_ect, e.ect0, e.ect1, e.ce]
}

pub(super) fn direction_label(d: Option<Direction>) -> &'static str {
    match d {
        Some(Direction::Ingress) => "ingress",
        Some(Direction::Egress) => "egress",
        None => "",
    }
}

/// What the top-K ranking counts as a flow's problems: CE marks (outer and inner
/// header), CNPs, NAKs, RNR NAKs and PSN gaps.
pub fn problems(f: &Flow) -> u64 {
    problems_of(&Figures::of(f))
}

fn problems_of(f: &Figures<'_>) -> u64 {
    let inner_ce = f.inner_ecn.map_or(0, |e| e.ce);
    [f.ecn.ce, inner_ce, f.cnps, f.naks, f.rnr_naks, f.psn_gaps]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
}

pub(super) struct FlowPass<'a> {
    pub(super) sums: Vec<FlowSums<'a>>,
    /// Indexes into the document's flows, most problems first.
    pub(super) top: Vec<usize>,
}

impl<'a> FlowPass<'a> {
    pub(super) fn over(document: &'a LiveDocument, k: usize) -> FlowPass<'a> {
        let mut sums: Vec<FlowSums<'a>> = Vec::new();
        let mut last = usize::MAX;
        // Min-heap of the K best (problems, earlier in the document wins a tie).
        let mut heap: BinaryHeap<Reverse<(u64, Reverse<usize>)>> = BinaryHeap::with_capacity(k + 1);
        document.for_each_figures(|i, f| {
            let ifname = f.ifname.unwrap_or("");
            let direction = direction_label(f.direction);
            let tunnelled = f.tunnelled;
            // Few groups (interfaces x directions x encapsulations): the previous
            // flow's is often the right one, else a short search.
            let same = |g: &FlowSums<'_>| {
                g.tunnelled == tunnelled && g.direction == direction && g.ifname == ifname
            };
            let at = if sums.get(last).is_some_and(same) {
                last
            } else if let Some(p) = sums.iter().position(same) {
                p
            } else {
                sums.push(FlowSums {
                    first: i,
                    ifname,
                    direction,
                    tunnelled,
                    ..FlowSums::default()
                });
                sums.len() - 1
            };
            last = at;
            let g = &mut sums[at];
            g.first = g.first.min(i);
            g.flows += 1;
            g.packets = g.packets.wrapping_add(f.packets);
            g.bytes = g.bytes.wrapping_add(f.bytes);
            for (sum, v) in g.ecn.iter_mut().zip(ecn_array(&f.ecn)) {
                *sum = sum.wrapping_add(v);
            }
            if let Some(inner) = &f.inner_ecn {
                for (sum, v) in g.inner_ecn.iter_mut().zip(ecn_array(inner)) {
                    *sum = sum.wrapping_add(v);
                }
            }
            g.cnps = g.cnps.wrapping_add(f.cnps);
            g.acks = g.acks.wrapping_add(f.acks);
            g.naks = g.naks.wrapping_add(f.naks);
            g.rnr_naks = g.rnr_naks.wrapping_add(f.rnr_naks);
            g.psn_gaps = g.psn_gaps.wrapping_add(f.psn_gaps);
            g.retransmitted_packets = g
                .retransmitted_packets
                .wrapping_add(f.retransmitted_packets);
            g.retransmitted_bytes = g.retransmitted_bytes.wrapping_add(f.retransmitted_bytes);
            g.retransmit_timeouts = g.retransmit_timeouts.wrapping_add(f.retransmit_timeouts);

            if k == 0 {
                return;
            }
            let score = problems_of(&f);
            if score == 0 {
                return; // a flow without problems is nobody's top flow
            }
            let entry = Reverse((score, Reverse(i)));
            if heap.len() < k {
                heap.push(entry);
            } else if heap.peek().is_some_and(|worst| entry < *worst) {
                heap.pop();
                heap.push(entry);
            }
        });
        // The flows came in memory order: the groups go in the document's.
        sums.sort_by_key(|g| g.first);
        let mut top: Vec<(u64, Reverse<usize>)> = heap.into_iter().map(|Reverse(e)| e).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        FlowPass {
            sums,
            top: top.into_iter().map(|(_, Reverse(i))| i).collect(),
        }
    }
}

/// Sums of the groups that share a key (e.g. both encapsulations of one interface and
/// direction), in first-seen order.
pub(super) fn merged<'a, K: PartialEq + Clone>(
    sums: &'a [FlowSums<'a>],
    key: impl Fn(&FlowSums<'a>) -> K,
) -> Vec<(K, Vec<&'a FlowSums<'a>>)> {
    let mut out: Vec<(K, Vec<&FlowSums<'a>>)> = Vec::new();
    for g in sums {
        let k = key(g);
        match out.iter_mut().find(|(other, _)| *other == k) {
            Some((_, members)) => members.push(g),
            None => out.push((k, vec![g])),
        }
    }
    out
}

pub(super) fn total(members: &[&FlowSums<'_>], field: impl Fn(&FlowSums<'_>) -> u64) -> u64 {
    members.iter().fold(0u64, |a, g| a.wrapping_add(field(g)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Counters, Document, Ecn};
    use crate::telemetry::metrics::encode;
    use crate::telemetry::metrics::tests::{flow, inputs, sample};

    #[test]
    fn top_flows_are_the_k_with_most_problems_ties_in_document_order() {
        let mut flows: Vec<Flow> = (0..6)
            .map(|i| flow("eth1", &format!("198.18.0.{}", i + 1), i, None))
            .collect();
        flows[0].cnps = 1; // 1
        flows[1].psn_gaps = 5; // 5
        flows[2].ecn.ce = 2;
        flows[2].naks = 1; // 3
        flows[3].rnr_naks = 3; // 3 (after flows[2] in the document)
                               // flows[4]: none; flows[5]: inner CE
        flows[5].vni = Some(7);
        flows[5].inner_src = Some("10.0.0.1".parse().unwrap());
        flows[5].inner_dst = Some("10.0.0.2".parse().unwrap());
        flows[5].inner_ecn = Some(Ecn {
            ce: 4,
            ..Ecn::default()
        });
        let doc = LiveDocument::from(Document {
            flows,
            counters: Counters::default(),
        });
        let pass = FlowPass::over(&doc, 3);
        assert_eq!(pass.top, [1, 5, 2]);
        assert_eq!(FlowPass::over(&doc, 10).top, [1, 5, 2, 3, 0]);
        assert!(FlowPass::over(&doc, 0).top.is_empty());

        let text = encode(&inputs(&doc, &[], 3)).unwrap();
        let problem_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("roce_top_flow_problems_total{"))
            .collect();
        assert_eq!(problem_lines.len(), 3, "{text}");
        assert_eq!(
            problem_lines[0],
            r#"roce_top_flow_problems_total{ifname="eth1",direction="ingress",src="198.18.0.2",dst="198.18.0.2",vni="",inner_src="",inner_dst="",dest_qp="1",dest_qp_hex="0x1"} 5"#
        );
        assert_eq!(
            sample(&text, r#"roce_top_flow_inner_ce_packets_total{ifname="eth1",direction="ingress",src="198.18.0.6",dst="198.18.0.2",vni="7",inner_src="10.0.0.1",inner_dst="10.0.0.2",dest_qp="5",dest_qp_hex="0x5"}"#).as_deref(),
            Some("4")
        );
        let inner_ce_lines = text
            .lines()
            .filter(|l| l.starts_with("roce_top_flow_inner_ce_packets_total{"))
            .count();
        assert_eq!(
            inner_ce_lines, 1,
            "only tunnelled flows have an inner header"
        );
    }
}
