//! CNPs off the CNP class (`cnp_wrong_class`): the policy gives CNPs a DSCP of their
//! own (48 by default, priority 6), which switches queue with strict priority, so that
//! a notification of congestion is never queued behind the data it should slow down.
//! A notification point that marks CNPs otherwise (the RNIC's `cnp_dscp` left at its
//! default, a host policy that missed them) makes DCQCN react late, or in a lossless
//! class, behind a pause.
//!
//! Per path and where the CNPs were seen: live, arriving (the sending host's NIC marks
//! them) or leaving (this host's, as written: CNPs the agent's enforce mode moved are
//! not off class); in `analyze` and on mirror sessions, in the copies. An error when
//! the DSCP they carry maps to another priority than the CNP DSCP's (another queue), a
//! warning when only the DSCP differs.

use std::collections::BTreeMap;

use roce_common::cnp::CnpWrongClass;
use roce_common::policy::Policy;

use super::{FlowFacts, Path, Window};
use crate::doc::finding::{Finding, Severity};
use crate::doc::Direction;

/// Where one path's CNPs were seen: the interface and direction (live), or none.
type Seen = (Option<String>, Option<Direction>);

/// One path's CNPs where they were seen: all of them, and those off class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub cnps: u64,
    pub wrong: CnpWrongClass,
    /// Flows whose CNPs were off class.
    pub flows: u64,
}

/// The counts of every path that carried CNPs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    paths: BTreeMap<(Path, Seen), Counts>,
}

impl Totals {
    pub fn add(&mut self, f: &FlowFacts<'_>) {
        if f.cnps == 0 {
            return;
        }
        let seen = (f.ifname.map(str::to_string), f.direction);
        let c = self.paths.entry((Path::of(f), seen)).or_default();
        c.cnps += f.cnps;
        c.wrong.packets += f.cnps_wrong_class.packets;
        c.wrong.dscps |= f.cnps_wrong_class.dscps;
        c.flows += u64::from(f.cnps_wrong_class.packets > 0);
    }
}

/// `cnp_wrong_class` for every path that carried CNPs off the policy's CNP DSCP in the
/// window (since `before`, or all of `now`).
pub fn wrong_class(
    now: &Totals,
    before: Option<&Totals>,
    window: Window,
    policy: &Policy,
) -> Vec<Finding> {
    let cnp_dscp = policy.qos.cnp_dscp;
    let priority = |dscp: u8| policy.table.get(dscp as usize).map(|e| e.priority);
    let mut out = Vec::new();
    for ((path, (ifname, direction)), c) in &now.paths {
        let (cnps, wrong) =
            match before.and_then(|b| b.paths.get(&(*path, (ifname.clone(), *direction)))) {
                Some(b) => (
                    c.cnps.saturating_sub(b.cnps),
                    c.wrong.packets.saturating_sub(b.wrong.packets),
                ),
                None => (c.cnps, c.wrong.packets),
            };
        if wrong == 0 {
            continue;
        }
        let dscps: Vec<u8> = c.wrong.dscp_list().collect();
        let other_queue = dscps.iter().any(|d| priority(*d) != priority(cnp_dscp));
        let classes = dscps
            .iter()
            .map(|d| match priority(*d) {
                Some(p) => format!("DSCP {d} (priority {p})"),
                None => format!("DSCP {d}"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let seen = match direction {
            Some(Direction::Ingress) => " arriving",
            Some(Direction::Egress) => " leaving",
            None => "",
        };
        // The host whose notification point marks them: this one for CNPs leaving it.
        let fix = match direction {
            Some(Direction::Egress) => format!(
                "set this host's CNP DSCP to {cnp_dscp} (NVIDIA: echo {cnp_dscp} > /sys/class/net/DEV/ecn/roce_np/cnp_dscp; `roce-agent check` audits it as cnp_dscp), or let the agent rewrite them (`run --mode enforce`)"
            ),
            _ => format!(
                "set the CNP DSCP to {cnp_dscp} at {}, the host that sends them (NVIDIA: echo {cnp_dscp} > /sys/class/net/DEV/ecn/roce_np/cnp_dscp; `roce-agent check` there audits it as cnp_dscp)",
                path.from
            ),
        };
        out.push(Finding {
            check: "cnp_wrong_class".to_string(),
            interface: ifname.clone(),
            severity: if other_queue {
                Severity::Error
            } else {
                Severity::Warning
            },
            found: format!(
                "{wrong} of {cnps} CNPs {path}{seen} {window} on {classes}"
            ),
            expected: format!(
                "CNPs on DSCP {cnp_dscp}{}, the CNP class: a strict-priority queue, so that congestion notification is never queued behind data",
                priority(cnp_dscp).map_or(String::new(), |p| format!(" (priority {p})"))
            ),
            fix,
            flows: matches!(window, Window::Capture(_)).then_some(c.flows),
            flow_keys: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::verdict::test_flow as flow;
    use crate::verdict::tests_common::{A, B, WINDOW};

    /// CNPs from B to A seen at B leaving, `wrong` of them on `dscp`.
    fn cnps(total: u64, wrong: u64, dscp: u8) -> Totals {
        let mut t = Totals::default();
        let mut f = flow(B, A, Some(Direction::Egress));
        f.cnps = total;
        for _ in 0..wrong {
            f.cnps_wrong_class.count(dscp);
        }
        t.add(&f);
        t
    }

    #[test]
    fn cnps_in_another_queue_are_an_error_and_only_the_dscp_a_warning() {
        let policy = Policy::default();
        let found = wrong_class(&cnps(10, 3, 26), None, WINDOW, &policy);
        assert_eq!(found.len(), 1);
        let f = &found[0];
        assert_eq!(
            (f.check.as_str(), f.severity),
            ("cnp_wrong_class", Severity::Error)
        );
        assert_eq!(
            f.found,
            "3 of 10 CNPs 198.18.0.2→198.18.0.1 leaving in the last 1.0 s on DSCP 26 (priority 3)"
        );
        assert!(
            f.expected.starts_with("CNPs on DSCP 48 (priority 6)"),
            "{}",
            f.expected
        );
        assert!(
            f.fix.starts_with("set this host's CNP DSCP to 48"),
            "{}",
            f.fix
        );
        // DSCP 49 is priority 6 too (the default map: DSCP / 8): the same queue.
        let same_queue = wrong_class(&cnps(10, 10, 49), None, WINDOW, &policy);
        assert_eq!(same_queue[0].severity, Severity::Warning);
        // The near miss: every CNP on the CNP DSCP.
        assert!(wrong_class(&cnps(10, 0, 0), None, WINDOW, &policy).is_empty());
    }

    #[test]
    fn a_window_judges_the_cnps_since_the_last_one_and_arrivals_name_the_sender() {
        let policy = Policy::default();
        let before = cnps(10, 3, 26);
        assert!(wrong_class(&cnps(20, 3, 26), Some(&before), WINDOW, &policy).is_empty());
        assert_eq!(
            wrong_class(&cnps(20, 4, 26), Some(&before), WINDOW, &policy).len(),
            1
        );
        let mut t = Totals::default();
        let mut f = flow(B, A, Some(Direction::Ingress));
        f.cnps = 1;
        f.cnps_wrong_class.count(0);
        t.add(&f);
        let found = wrong_class(&t, None, WINDOW, &policy);
        assert!(found[0].found.contains(" arriving "), "{}", found[0].found);
        assert!(
            found[0]
                .fix
                .contains("at 198.18.0.2, the host that sends them"),
            "{}",
            found[0].fix
        );
    }
}
