//! ECMP entropy: RoCEv2 carries a flow's entropy in its UDP source port (the
//! destination port is always 4791), so ECMP spreads the queue pairs between two hosts
//! over the fabric's paths only as far as their source ports differ. Many queue pairs
//! on few ports pile onto few paths, however many the fabric has (Meta's RoCE fabric
//! for training, SIGCOMM 2024: QP-aware hashing and more QPs per connection gave up to
//! 40% on AllReduce). Per interface and path (the source host chose the ports): the
//! distinct destination QPs against the distinct source ports of the flows on it. In
//! VXLAN the VTEP derives the outer port from the inner flow, so the inner ports count.

use std::collections::{BTreeMap, BTreeSet};

use super::{FlowFacts, Path};
use crate::config::VerdictThresholds;
use crate::doc::finding::{Finding, Severity};

/// What one path carries: its destination QPs, source ports and flows.
#[derive(Clone, Debug, Default)]
struct Spread {
    qps: BTreeSet<u32>,
    ports: BTreeSet<u16>,
    flows: u64,
}

/// The queue pairs and source ports of each path, by interface.
#[derive(Clone, Debug, Default)]
pub struct Ports {
    paths: BTreeMap<(Option<String>, Path), Spread>,
}

impl Ports {
    pub fn add(&mut self, f: &FlowFacts<'_>) {
        let e = self
            .paths
            .entry((f.ifname.map(str::to_string), Path::of(f)))
            .or_default();
        e.qps.insert(f.dest_qp);
        e.ports.insert(f.sport);
        e.flows += 1;
    }
}

/// `ecmp_low_entropy` for every path with `ecmp_min_qps` queue pairs or more that
/// share their source ports `ecmp_qps_per_port` or more to a port; `in_capture` counts
/// the flows of each finding, as `analyze`'s findings do.
pub fn low_entropy(ports: &Ports, in_capture: bool, t: &VerdictThresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for ((ifname, path), spread) in &ports.paths {
        let (qps, sports) = (&spread.qps, &spread.ports);
        if qps.len() < t.ecmp_min_qps as usize
            || sports.len() * t.ecmp_qps_per_port as usize > qps.len()
        {
            continue;
        }
        let mut list: Vec<String> = sports.iter().take(8).map(u16::to_string).collect();
        if sports.len() > 8 {
            list.push("...".to_string());
        }
        out.push(Finding {
            check: "ecmp_low_entropy".to_string(),
            interface: ifname.clone(),
            severity: Severity::Warning,
            found: format!(
                "{} queue pairs {path} on {} UDP source port{} ({}): ECMP spreads them over {} path{} at most",
                qps.len(),
                sports.len(),
                if sports.len() == 1 { "" } else { "s" },
                list.join(", "),
                sports.len(),
                if sports.len() == 1 { "" } else { "s" },
            ),
            expected: "a UDP source port per queue pair (RoCEv2's only flow entropy: the destination port is always 4791)".to_string(),
            fix: format!(
                "at {}: let the RNIC derive each QP's UDP source port from the QP (its default; a fixed port is a driver, firmware or rdma_cm setting to undo), or spread the traffic over more ports; on the switches, hash on more than the 5-tuple (QP-aware hashing) where they can",
                path.from
            ),
            flows: in_capture.then_some(spread.flows),
            flow_keys: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::Direction;

    fn flows(qps: u32, ports: u16) -> Ports {
        let mut p = Ports::default();
        for qp in 0..qps {
            p.add(&FlowFacts {
                dest_qp: 0x100 + qp,
                sport: 49152 + (qp as u16 % ports),
                packets: 10,
                ..crate::verdict::test_flow("198.18.0.1", "198.18.0.2", Some(Direction::Egress))
            });
        }
        p
    }

    fn low_entropy_live(p: &Ports) -> Vec<Finding> {
        low_entropy(p, false, &VerdictThresholds::default())
    }

    #[test]
    fn many_queue_pairs_on_few_ports_are_low_entropy_and_the_near_misses_are_not() {
        let found = low_entropy_live(&flows(8, 1));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].check, "ecmp_low_entropy");
        assert_eq!(found[0].interface.as_deref(), Some("eth1"));
        assert_eq!(
            found[0].found,
            "8 queue pairs 198.18.0.1→198.18.0.2 on 1 UDP source port (49152): ECMP spreads them over 1 path at most"
        );
        assert_eq!(low_entropy_live(&flows(16, 4)).len(), 1);
        // 7 queue pairs: too few to judge; 8 on 3 ports, 16 on 5: spread enough.
        assert!(low_entropy_live(&flows(7, 1)).is_empty());
        assert!(low_entropy_live(&flows(8, 3)).is_empty());
        assert!(low_entropy_live(&flows(16, 5)).is_empty());
        assert!(low_entropy_live(&flows(64, 64)).is_empty());
        // A fabric that wants fewer than two QPs a port: 8 on 4 ports is low there.
        let strict = VerdictThresholds {
            ecmp_qps_per_port: 2,
            ..VerdictThresholds::default()
        };
        assert_eq!(low_entropy(&flows(8, 4), false, &strict).len(), 1);
        assert!(low_entropy(&flows(8, 5), false, &strict).is_empty());
    }
}
