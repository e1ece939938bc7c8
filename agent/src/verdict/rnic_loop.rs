//! The ECN -> CNP loop from the RNIC's own counters, for hosts whose RNIC offloads
//! RoCE (the agent sees none of its packets): the notification point counts the
//! CE-marked RoCE packets it received (`np_ecn_marked_roce_packets`) and the CNPs it
//! sent (`np_cnp_sent`, mlx5's names; rdma_rxe has neither). Marks received and no
//! CNP sent in the window is `ce_unanswered` for the port, as the wire says it for a
//! path. When the agent also counted CE-marked RoCE packets arriving on the port's
//! netdev in the window, the evidence gives both counts side by side (they count the
//! same packets only where the kernel and the RNIC both see them).

use std::collections::BTreeMap;

use super::Window;
use crate::doc::finding::{Finding, Severity};

/// The counters the loop reads.
pub const ECN_MARKED: &str = "np_ecn_marked_roce_packets";
pub const CNP_SENT: &str = "np_cnp_sent";

/// One RDMA port's notification-point counters, as read this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpReading {
    pub device: String,
    pub port: u32,
    /// The port's netdev (empty on an InfiniBand port).
    pub netdev: String,
    pub ecn_marked: u64,
    pub cnp_sent: u64,
}

/// The readings by port, and what the wire showed on their netdevs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    ports: BTreeMap<(String, u32), NpReading>,
}

impl Totals {
    /// The ports that export both counters.
    pub fn of(readings: &[NpReading]) -> Totals {
        Totals {
            ports: readings
                .iter()
                .map(|r| ((r.device.clone(), r.port), r.clone()))
                .collect(),
        }
    }
}

/// `ce_unanswered` for every port whose notification point counted `min_ce` or more
/// CE-marked packets since `before` and sent no CNP. `wire_ce` gives the CE-marked
/// RoCE packets the agent counted arriving on a netdev in the same window.
pub fn unanswered(
    now: &Totals,
    before: &Totals,
    window: Window,
    min_ce: u64,
    wire_ce: &dyn Fn(&str) -> Option<u64>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (port, r) in &now.ports {
        let Some(b) = before.ports.get(port) else {
            continue;
        };
        // A counter that went back (the driver reloaded) reads as nothing new.
        let marked = r.ecn_marked.saturating_sub(b.ecn_marked);
        let sent = r.cnp_sent.saturating_sub(b.cnp_sent);
        if marked < min_ce || sent > 0 {
            continue;
        }
        let name = if r.netdev.is_empty() {
            format!("{} port {}", r.device, r.port)
        } else {
            format!("{} port {} ({})", r.device, r.port, r.netdev)
        };
        let wire = match wire_ce(&r.netdev) {
            Some(n) => format!(
                "; the agent counted {n} CE-marked RoCE packets arriving on {}",
                r.netdev
            ),
            None => String::new(),
        };
        out.push(Finding {
            check: "ce_unanswered".to_string(),
            interface: Some(if r.netdev.is_empty() {
                r.device.clone()
            } else {
                r.netdev.clone()
            }),
            severity: Severity::Error,
            found: format!(
                "{name} received {marked} CE-marked RoCE packets {window} and sent no CNP ({ECN_MARKED}, {CNP_SENT}){wire}"
            ),
            expected: format!(
                "CNPs from {name}'s notification point answering the CE marks (DCQCN), so that their senders slow down"
            ),
            fix: format!(
                "turn the notification point on for the lossless priority (NVIDIA: echo 1 > /sys/class/net/{}/ecn/roce_np/enable/PRIO; `roce-agent check` audits it as ecn_np)",
                if r.netdev.is_empty() { "DEV" } else { &r.netdev }
            ),
            flows: None,
            flow_keys: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const WINDOW: Window = Window::Live(Duration::from_secs(2));

    fn port(ecn_marked: u64, cnp_sent: u64) -> Totals {
        Totals::of(&[NpReading {
            device: "mlx5_0".into(),
            port: 1,
            netdev: "eth1".into(),
            ecn_marked,
            cnp_sent,
        }])
    }

    #[test]
    fn marks_counted_by_the_rnic_and_no_cnp_sent_are_unanswered() {
        let none = |_: &str| None;
        let before = port(18_240, 0);
        let found = unanswered(&port(18_480, 0), &before, WINDOW, 10, &none);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].interface.as_deref(), Some("eth1"));
        assert_eq!(
            found[0].found,
            "mlx5_0 port 1 (eth1) received 240 CE-marked RoCE packets in the last 2.0 s and sent no CNP (np_ecn_marked_roce_packets, np_cnp_sent)"
        );
        // Near misses: 9 marks; one CNP sent; nothing to compare with; a reset counter.
        assert!(unanswered(&port(18_249, 0), &before, WINDOW, 10, &none).is_empty());
        assert!(unanswered(&port(18_480, 1), &before, WINDOW, 10, &none).is_empty());
        assert!(unanswered(&port(18_480, 0), &Totals::default(), WINDOW, 10, &none).is_empty());
        assert!(unanswered(&port(5, 0), &before, WINDOW, 10, &none).is_empty());
        // The wire's count on the same netdev, beside the RNIC's.
        let wire = |n: &str| (n == "eth1").then_some(230);
        let found = unanswered(&port(18_480, 0), &before, WINDOW, 10, &wire);
        assert!(
            found[0]
                .found
                .ends_with("; the agent counted 230 CE-marked RoCE packets arriving on eth1"),
            "{}",
            found[0].found
        );
    }
}
