//! ECMP entropy: RoCEv2 carries a flow's entropy in its UDP source port (the
//! destination port is always 4791), so ECMP spreads the queue pairs between two hosts
//! over the fabric's paths only as far as their source ports differ. Many queue pairs
//! on few ports pile onto few paths, however many the fabric has (Meta's RoCE fabric
//! for training, SIGCOMM 2024: QP-aware hashing and more QPs per connection gave up to
//! 40% on AllReduce). Per interface and path (the source host chose the ports): the
//! distinct queue pairs against the distinct source ports of the flows on it.
//!
//! In VXLAN the underlay hashes on the outer header, whose source port the VTEP
//! derives from the inner flow: the inner flows between two VTEPs (every VNI and inner
//! host pair) are judged against the outer ports, which shows a VTEP that pins them to
//! one path however well the RNICs spread theirs (the evidence gives the inner ports
//! too, to tell the two causes apart). A tunnelled flow whose outer port is not known
//! is judged on its inner path and ports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{FlowFacts, Path};
use crate::config::VerdictThresholds;
use crate::doc::finding::{Finding, Severity};

/// One queue pair's direction on a path: VNI, inner addresses and destination QP.
type QueuePair = (Option<u32>, Option<IpAddr>, Option<IpAddr>, u32);

/// What one path carries: its queue pairs, the source ports ECMP hashes on, and, on
/// an underlay path between VTEPs, the inner source ports behind them.
#[derive(Clone, Debug, Default)]
struct Spread {
    qps: BTreeSet<QueuePair>,
    ports: BTreeSet<u16>,
    inner_ports: BTreeSet<u16>,
    flows: u64,
}

/// Whether a path is an underlay path between two VTEPs (judged on outer ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Plain,
    Underlay,
}

/// The queue pairs and source ports of each path, by interface.
#[derive(Clone, Debug, Default)]
pub struct Ports {
    paths: BTreeMap<(Option<String>, Path, Layer), Spread>,
}

impl Ports {
    pub fn add(&mut self, f: &FlowFacts<'_>) {
        let (path, layer, port) = match f.outer_sport {
            Some(outer) if f.vni.is_some() => (
                Path {
                    vni: None,
                    inner_from: None,
                    inner_to: None,
                    ..Path::of(f)
                },
                Layer::Underlay,
                outer,
            ),
            _ => (Path::of(f), Layer::Plain, f.sport),
        };
        let e = self
            .paths
            .entry((f.ifname.map(str::to_string), path, layer))
            .or_default();
        e.qps.insert((f.vni, f.inner_src, f.inner_dst, f.dest_qp));
        e.ports.insert(port);
        if layer == Layer::Underlay {
            e.inner_ports.insert(f.sport);
        }
        e.flows += 1;
    }
}

/// `a, b, c` of at most 8 ports, then `...`.
fn port_list(ports: &BTreeSet<u16>) -> String {
    let mut list: Vec<String> = ports.iter().take(8).map(u16::to_string).collect();
    if ports.len() > 8 {
        list.push("...".to_string());
    }
    list.join(", ")
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `ecmp_low_entropy` for every path with `ecmp_min_qps` queue pairs or more that
/// share their source ports `ecmp_qps_per_port` or more to a port; `in_capture` counts
/// the flows of each finding, as `analyze`'s findings do.
pub fn low_entropy(ports: &Ports, in_capture: bool, t: &VerdictThresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for ((ifname, path, layer), spread) in &ports.paths {
        let (qps, sports) = (spread.qps.len(), &spread.ports);
        if qps < t.ecmp_min_qps as usize || sports.len() * t.ecmp_qps_per_port as usize > qps {
            continue;
        }
        let n = sports.len();
        let (found, expected, fix) = match layer {
            Layer::Plain => (
                format!(
                    "{qps} queue pairs {path} on {n} UDP source port{} ({}): ECMP spreads them over {n} path{} at most",
                    plural(n),
                    port_list(sports),
                    plural(n),
                ),
                "a UDP source port per queue pair (RoCEv2's only flow entropy: the destination port is always 4791)".to_string(),
                format!(
                    "at {}: let the RNIC derive each QP's UDP source port from the QP (its default; a fixed port is a driver, firmware or rdma_cm setting to undo), or spread the traffic over more ports; on the switches, hash on more than the 5-tuple (QP-aware hashing) where they can",
                    path.from
                ),
            ),
            Layer::Underlay => {
                let inner = &spread.inner_ports;
                let cause = if inner.len() * t.ecmp_qps_per_port as usize > qps {
                    format!(
                        "at VTEP {}: derive the outer UDP source port from the inner flow, over a wide range (Linux vxlan hashes the inner headers into its `srcport` range: a range of one port pins every queue pair to one path; a VTEP that hashes only the inner addresses does the same); on the switches, hash on the inner headers where they can",
                        path.from
                    )
                } else {
                    format!(
                        "behind VTEP {}: the inner ports are as few, so the RNICs' ports are the cause: let each derive a QP's UDP source port from the QP (its default), then the VTEP spreads them",
                        path.from
                    )
                };
                (
                    format!(
                        "{qps} queue pairs through VTEPs {path} on {n} outer UDP source port{} ({}), from {} inner port{}: the underlay's ECMP spreads them over {n} path{} at most",
                        plural(n),
                        port_list(sports),
                        inner.len(),
                        plural(inner.len()),
                        plural(n),
                    ),
                    "an outer UDP source port per inner queue pair (the underlay hashes the outer header; VXLAN's entropy is its source port)".to_string(),
                    cause,
                )
            }
        };
        out.push(Finding {
            check: "ecmp_low_entropy".to_string(),
            interface: ifname.clone(),
            severity: Severity::Warning,
            found,
            expected,
            fix,
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

    /// `qps` queue pairs in VNI 5001 and 5002 between VTEPs 198.18.0.1 and .2, inner
    /// ports spread over `inner` and outer ones over `outer` (None: not known).
    fn tunnelled(qps: u32, inner: u16, outer: Option<u16>) -> Ports {
        let mut p = Ports::default();
        for qp in 0..qps {
            p.add(&FlowFacts {
                vni: Some(5001 + qp % 2),
                inner_src: Some("198.19.0.1".parse().expect("an address")),
                inner_dst: Some("198.19.0.2".parse().expect("an address")),
                // The same QP number in both VNIs: two queue pairs all the same.
                dest_qp: 0x100 + qp / 2,
                sport: 49152 + (qp as u16 % inner),
                outer_sport: outer.map(|n| 40000 + (qp as u16 % n)),
                ..crate::verdict::test_flow("198.18.0.1", "198.18.0.2", Some(Direction::Ingress))
            });
        }
        p
    }

    #[test]
    fn between_vteps_the_outer_ports_are_judged_and_the_inner_ones_name_the_cause() {
        // The RNICs spread their ports, the VTEP pins them to one outer port.
        let found = low_entropy_live(&tunnelled(8, 8, Some(1)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].found,
            "8 queue pairs through VTEPs 198.18.0.1→198.18.0.2 on 1 outer UDP source port (40000), from 8 inner ports: the underlay's ECMP spreads them over 1 path at most"
        );
        assert!(
            found[0]
                .fix
                .starts_with("at VTEP 198.18.0.1: derive the outer UDP source port"),
            "{}",
            found[0].fix
        );
        // Few inner ports make few outer ones: the RNICs are the cause.
        let found = low_entropy_live(&tunnelled(8, 1, Some(1)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .fix
                .starts_with("behind VTEP 198.18.0.1: the inner ports are as few"),
            "{}",
            found[0].fix
        );
        // The near misses: outer ports spread (however few the inner ones), too few
        // queue pairs.
        assert!(low_entropy_live(&tunnelled(8, 1, Some(8))).is_empty());
        assert!(low_entropy_live(&tunnelled(16, 16, Some(5))).is_empty());
        assert!(low_entropy_live(&tunnelled(7, 7, Some(1))).is_empty());
        // Without the outer ports, each inner path is judged on its inner ports: 4
        // queue pairs a VNI are too few.
        assert!(low_entropy_live(&tunnelled(8, 1, None)).is_empty());
        let found = low_entropy_live(&tunnelled(16, 1, None));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0]
                .found
                .starts_with("8 queue pairs 198.18.0.1→198.18.0.2 (vni 5001"),
            "{}",
            found[0].found
        );
    }
}
