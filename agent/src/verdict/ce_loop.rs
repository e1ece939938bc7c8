//! The ECN -> CNP loop (DCQCN): a switch marks CE on the packets of a congested queue,
//! the receiver's RNIC (the notification point) answers with CNPs to the sender's QP,
//! and the sender's RNIC (the reaction point) slows that QP down. CE marks that reach a
//! host and no CNP ever leaves it for their sender mean the notification point is off
//! (or cannot be on: rdma_rxe has none): the marks are lost on the host, the senders
//! never slow down, and the fabric falls back on PFC pauses.
//!
//! Per path (two hosts, and the VNI and inner hosts when tunnelled): the CE-marked
//! RoCE packets that travelled it against the CNPs on the way back, in the same window.
//! A path is judged only when the way back carried RoCE packets in the window (its
//! ACKs): a capture or an agent that sees one direction cannot tell. Live, CE counts on
//! the flows that arrive (XDP) and CNPs on those that leave (tc); in `analyze` both
//! directions are in the capture.

use std::collections::BTreeMap;

use super::{FlowFacts, Path, Window};
use crate::doc::finding::{Finding, Severity};
use crate::doc::Direction;

/// One path's counts: CE-marked packets on it, and on the way back CNPs and packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub ce: u64,
    pub cnps_back: u64,
    pub packets_back: u64,
    /// Flows that carried the marks.
    pub marked_flows: u64,
}

impl Counts {
    /// What happened since `before` (counts of flows evicted meanwhile read as none).
    fn since(&self, before: &Counts) -> Counts {
        Counts {
            ce: self.ce.saturating_sub(before.ce),
            cnps_back: self.cnps_back.saturating_sub(before.cnps_back),
            packets_back: self.packets_back.saturating_sub(before.packets_back),
            marked_flows: self.marked_flows,
        }
    }
}

/// The counts of every path, and the interface its marked packets arrived on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    paths: BTreeMap<Path, (Counts, Option<String>)>,
}

impl Totals {
    /// Adds one flow: its CE marks to its path (unless it leaves this host), its CNPs
    /// and packets to the way back of the reverse path (unless it arrives).
    pub fn add(&mut self, f: &FlowFacts<'_>) {
        let path = Path::of(f);
        if f.direction != Some(Direction::Egress) && f.ce > 0 {
            let e = self.paths.entry(path).or_default();
            e.0.ce += f.ce;
            e.0.marked_flows += 1;
            if e.1.is_none() {
                e.1 = f.ifname.map(str::to_string);
            }
        }
        if f.direction != Some(Direction::Ingress) {
            let e = self.paths.entry(path.reversed()).or_default();
            e.0.cnps_back += f.cnps;
            e.0.packets_back += f.packets;
        }
    }
}

impl Totals {
    /// The CE-marked packets counted arriving on `ifname` since `before` (all of them
    /// without), if any.
    pub fn ce_on(&self, before: Option<&Totals>, ifname: &str) -> Option<u64> {
        let mut n = 0;
        for (path, (c, name)) in &self.paths {
            if name.as_deref() == Some(ifname) {
                let b = before
                    .and_then(|b| b.paths.get(path))
                    .map_or(0, |(b, _)| b.ce);
                n += c.ce.saturating_sub(b);
            }
        }
        (n > 0).then_some(n)
    }
}

/// `ce_unanswered` for every path whose `min_ce` CE marks or more in the window (since
/// `before`, or all of `now`) went without a CNP back while the way back carried
/// packets (`min_ce`: below, a burst of marks may end before the notification point's
/// first CNP; DCQCN sends at most one per QP per `min_time_between_cnps`).
pub fn unanswered(
    now: &Totals,
    before: Option<&Totals>,
    window: Window,
    min_ce: u64,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (path, (counts, ifname)) in &now.paths {
        let c = match before.and_then(|b| b.paths.get(path)) {
            Some((b, _)) => counts.since(b),
            None => *counts,
        };
        if c.ce < min_ce || c.cnps_back > 0 || c.packets_back == 0 {
            continue;
        }
        out.push(Finding {
            check: "ce_unanswered".to_string(),
            interface: ifname.clone(),
            severity: Severity::Error,
            found: format!(
                "{} CE-marked RoCE packets {path} {window}, and no CNP back among the {} RoCE packets {}→{}",
                c.ce, c.packets_back, path.to, path.from
            ),
            expected: format!(
                "CNPs from {} answering the CE marks (DCQCN: the receiver's notification point), so that {}'s queue pairs slow down",
                path.to, path.from
            ),
            fix: format!(
                "turn the notification point on at {} for the lossless priority (NVIDIA: echo 1 > /sys/class/net/DEV/ecn/roce_np/enable/PRIO; `roce-agent check` audits it as ecn_np); a host without one (rdma_rxe) cannot answer: stop ECN marking towards it or keep its traffic off ECN-marked queues",
                path.to
            ),
            // `analyze` counts the flows of a finding (the host audit's have none).
            flows: matches!(window, Window::Capture(_)).then_some(c.marked_flows),
            flow_keys: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::verdict::test_flow as flow;
    use crate::verdict::tests_common::{A, B, WINDOW};

    /// B's view: data from A arriving with `ce` marks, ACKs (and `cnps` CNPs) leaving.
    fn at_b(ce: u64, cnps: u64, back: u64) -> Totals {
        let mut t = Totals::default();
        let mut data = flow(A, B, Some(Direction::Ingress));
        data.ce = ce;
        t.add(&data);
        let mut acks = flow(B, A, Some(Direction::Egress));
        acks.packets = back;
        acks.cnps = cnps;
        t.add(&acks);
        t
    }

    #[test]
    fn marks_without_a_cnp_back_are_unanswered_and_the_near_misses_are_not() {
        let found = unanswered(&at_b(10, 0, 50), None, WINDOW, 10);
        assert_eq!(found.len(), 1);
        let f = &found[0];
        assert_eq!(
            (f.check.as_str(), f.severity),
            ("ce_unanswered", Severity::Error)
        );
        assert_eq!(f.interface.as_deref(), Some("eth1"));
        assert!(f.found.starts_with("10 CE-marked RoCE packets 198.18.0.1→198.18.0.2 in the last 1.0 s, and no CNP back among the 50"), "{}", f.found);
        // 9 marks: too few to say; one CNP: answered; nothing back: one direction seen.
        assert!(unanswered(&at_b(9, 0, 50), None, WINDOW, 10).is_empty());
        assert!(unanswered(&at_b(1000, 1, 50), None, WINDOW, 10).is_empty());
        assert!(unanswered(&at_b(1000, 0, 0), None, WINDOW, 10).is_empty());
    }

    #[test]
    fn a_window_judges_what_happened_since_the_last_one() {
        let before = at_b(1000, 0, 50);
        // 5 more marks since: too few, however many came before.
        assert!(unanswered(&at_b(1005, 0, 100), Some(&before), WINDOW, 10).is_empty());
        assert_eq!(
            unanswered(&at_b(1010, 0, 100), Some(&before), WINDOW, 10).len(),
            1
        );
        // CNPs earlier answered earlier marks, not these.
        let answered_before = at_b(1000, 5, 50);
        assert_eq!(
            unanswered(&at_b(1020, 5, 100), Some(&answered_before), WINDOW, 10).len(),
            1
        );
    }

    #[test]
    fn in_a_capture_both_directions_count_and_marks_leaving_a_host_do_not() {
        let mut t = Totals::default();
        let mut data = flow(A, B, None);
        data.ce = 40;
        t.add(&data);
        t.add(&flow(B, A, None));
        let found = unanswered(
            &t,
            None,
            Window::Capture(Some(Duration::from_millis(2500))),
            10,
        );
        assert_eq!(found.len(), 1);
        assert!(
            found[0].found.contains("in the capture (2.5 s)"),
            "{}",
            found[0].found
        );
        // Live, CE on a flow leaving the host is no mark of the fabric's.
        let mut live = Totals::default();
        let mut out = flow(B, A, Some(Direction::Egress));
        out.ce = 40;
        live.add(&out);
        live.add(&flow(A, B, Some(Direction::Ingress)));
        assert!(unanswered(&live, None, WINDOW, 10).is_empty());
    }
}
