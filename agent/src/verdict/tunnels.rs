//! Overlay against underlay, per tunnel: the RoCE flows in VXLAN summed per interface,
//! direction, VTEP pair and VNI (`counters.tunnels`), each flow matched with the same
//! queue pair on the tunnel's inner side where the agent sees that too (a flow of the
//! inner addresses and QP, unencapsulated, in the same direction: on the VXLAN device,
//! or a bridge port behind it). A PSN gap one side shows and the other does not was
//! made between the two, in this host's VTEP: arriving, inner gaps beyond the outer
//! ones were lost in decapsulation (the kernel drops outer CE over a Not-ECT inner
//! header, a bad inner header, an inner packet too long); leaving, outer gaps beyond
//! the inner ones in encapsulation (an encapsulated packet too long for the underlay).
//! Not a verdict: the numbers, for `/metrics` and the document.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::FlowFacts;
use crate::doc::tunnel::TunnelRecord;
use crate::doc::Direction;

/// A tunnel: interface, direction, outer source and destination, VNI.
type TunnelKey = (Option<String>, Option<Direction>, IpAddr, IpAddr, u32);

/// A queue pair's direction as its inner side shows it: direction, addresses, QP.
pub type InnerKey = (Option<Direction>, IpAddr, IpAddr, u32);

#[derive(Clone, Debug, Default)]
struct Sums {
    flows: u64,
    packets: u64,
    ce: u64,
    inner_ce: u64,
    psn_gaps: u64,
}

/// The best inner-side flow of a queue pair seen so far: the one with the most packets
/// (then the first interface by name), as it stands for the pair's inner side.
#[derive(Clone, Debug)]
struct InnerSide {
    ifname: Option<String>,
    packets: u64,
    psn_gaps: u64,
}

/// The tunnels of a flow table, fed in two passes: every tunnelled flow first
/// ([`Tunnels::add_tunnelled`]), then the unencapsulated flows the first pass asked
/// for ([`Tunnels::wants`], [`Tunnels::add_inner`]), so that a large table's plain
/// flows cost a lookup each and only when there are tunnels.
#[derive(Debug, Default)]
pub struct Tunnels {
    sums: BTreeMap<TunnelKey, Sums>,
    /// Each tunnelled flow: its tunnel and PSN gaps, by its inner side's key.
    by_inner: HashMap<InnerKey, Vec<(TunnelKey, u64)>>,
    inner: HashMap<InnerKey, InnerSide>,
}

impl Tunnels {
    /// The tunnels of a document's flows (a capture's, or a live table made of them).
    pub fn of_flows<'a>(flows: impl Iterator<Item = &'a crate::doc::Flow>) -> Vec<TunnelRecord> {
        let facts: Vec<FlowFacts<'a>> = flows.map(FlowFacts::of).collect();
        Tunnels::of(&facts)
    }

    /// The tunnels of `flows` (any order), both passes over the slice.
    pub fn of(flows: &[FlowFacts<'_>]) -> Vec<TunnelRecord> {
        let mut t = Tunnels::default();
        for f in flows {
            t.add_tunnelled(f);
        }
        if t.is_empty() {
            return Vec::new();
        }
        for f in flows {
            if f.vni.is_none() && t.wants(&(f.direction, f.src, f.dst, f.dest_qp)) {
                t.add_inner(f);
            }
        }
        t.records()
    }

    /// Takes a tunnelled flow into its tunnel (a plain one is ignored).
    pub fn add_tunnelled(&mut self, f: &FlowFacts<'_>) {
        let (Some(vni), Some(inner_src), Some(inner_dst)) = (f.vni, f.inner_src, f.inner_dst)
        else {
            return;
        };
        let key: TunnelKey = (f.ifname.map(str::to_string), f.direction, f.src, f.dst, vni);
        let s = self.sums.entry(key.clone()).or_default();
        s.flows += 1;
        s.packets += f.packets;
        s.ce += f.ce.saturating_sub(f.inner_ce);
        s.inner_ce += f.inner_ce;
        s.psn_gaps += f.psn_gaps;
        self.by_inner
            .entry((f.direction, inner_src, inner_dst, f.dest_qp))
            .or_default()
            .push((key, f.psn_gaps));
    }

    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Whether an unencapsulated flow of this key is a tunnelled flow's inner side.
    pub fn wants(&self, key: &InnerKey) -> bool {
        self.by_inner.contains_key(key)
    }

    /// Takes an unencapsulated flow that [`Self::wants`] as its queue pair's inner side.
    pub fn add_inner(&mut self, f: &FlowFacts<'_>) {
        let key = (f.direction, f.src, f.dst, f.dest_qp);
        let side = InnerSide {
            ifname: f.ifname.map(str::to_string),
            packets: f.packets,
            psn_gaps: f.psn_gaps,
        };
        match self.inner.get_mut(&key) {
            Some(best)
                if (best.packets, std::cmp::Reverse(&best.ifname))
                    >= (side.packets, std::cmp::Reverse(&side.ifname)) => {}
            Some(best) => *best = side,
            None => {
                self.inner.insert(key, side);
            }
        }
    }

    /// One record per tunnel, in the order of its key.
    pub fn records(self) -> Vec<TunnelRecord> {
        // Per tunnel: inner flows, their gaps, the gaps made in the VTEP, and the
        // interfaces the inner sides were seen on (with their flows).
        type Matched = (u64, u64, u64, BTreeMap<Option<String>, u64>);
        let mut matched: HashMap<TunnelKey, Matched> = HashMap::new();
        for (inner_key, flows) in &self.by_inner {
            let Some(side) = self.inner.get(inner_key) else {
                continue;
            };
            for (tunnel, outer_gaps) in flows {
                let m = matched.entry(tunnel.clone()).or_default();
                m.0 += 1;
                m.1 += side.psn_gaps;
                m.2 += match tunnel.1 {
                    Some(Direction::Ingress) => side.psn_gaps.saturating_sub(*outer_gaps),
                    Some(Direction::Egress) => outer_gaps.saturating_sub(side.psn_gaps),
                    None => 0,
                };
                *m.3.entry(side.ifname.clone()).or_default() += 1;
            }
        }
        self.sums
            .into_iter()
            .map(|(key, s)| {
                let m = matched.remove(&key);
                let (ifname, direction, src, dst, vni) = key;
                let inner_ifname = m.as_ref().and_then(|m| {
                    // The interface most flows were matched on (the first by name on a tie).
                    m.3.iter()
                        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                        .and_then(|(name, _)| name.clone())
                });
                TunnelRecord {
                    ifname,
                    direction,
                    src,
                    dst,
                    vni,
                    flows: s.flows,
                    packets: s.packets,
                    ce: s.ce,
                    inner_ce: s.inner_ce,
                    psn_gaps: s.psn_gaps,
                    inner_ifname,
                    inner_flows: m.as_ref().map(|m| m.0),
                    inner_psn_gaps: m.as_ref().map(|m| m.1),
                    vtep_psn_gaps: m.filter(|_| direction.is_some()).map(|m| m.2),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::test_flow;

    const VTEP_A: &str = "198.18.0.1";
    const VTEP_B: &str = "198.18.0.2";

    /// Queue pair `qp` from 198.19.0.1 to 198.19.0.2 in VNI 5001, arriving at B's
    /// underlay eth1 with `gaps` PSN gaps.
    fn tunnelled<'a>(qp: u32, gaps: u64, direction: Direction) -> FlowFacts<'a> {
        let (from, to) = match direction {
            Direction::Ingress => (VTEP_A, VTEP_B),
            Direction::Egress => (VTEP_B, VTEP_A),
        };
        FlowFacts {
            vni: Some(5001),
            inner_src: Some("198.19.0.1".parse().expect("an address")),
            inner_dst: Some("198.19.0.2".parse().expect("an address")),
            dest_qp: qp,
            psn_gaps: gaps,
            ce: 3,
            inner_ce: 1,
            ..test_flow(from, to, Some(direction))
        }
    }

    /// The same queue pair unencapsulated on `ifname`.
    fn inner<'a>(ifname: &'a str, qp: u32, gaps: u64, direction: Direction) -> FlowFacts<'a> {
        FlowFacts {
            ifname: Some(ifname),
            dest_qp: qp,
            psn_gaps: gaps,
            ..test_flow("198.19.0.1", "198.19.0.2", Some(direction))
        }
    }

    #[test]
    fn gaps_the_inner_side_shows_beyond_the_underlays_were_made_in_the_vtep() {
        let flows = [
            tunnelled(0x11, 1, Direction::Ingress),
            tunnelled(0x12, 0, Direction::Ingress),
            tunnelled(0x13, 2, Direction::Ingress),
            inner("vx0", 0x11, 1, Direction::Ingress),
            inner("vx0", 0x12, 3, Direction::Ingress),
            // Fewer gaps inside than outside: reordering, or a resend that filled one;
            // the VTEP made none.
            inner("vx0", 0x13, 1, Direction::Ingress),
            // Another direction, another QP: not these flows' inner side.
            inner("vx0", 0x11, 9, Direction::Egress),
            inner("vx0", 0x14, 9, Direction::Ingress),
        ];
        let t = Tunnels::of(&flows);
        assert_eq!(t.len(), 1, "{t:?}");
        let r = &t[0];
        assert_eq!(
            (r.ifname.as_deref(), r.direction),
            (Some("eth1"), Some(Direction::Ingress))
        );
        assert_eq!(
            (r.src.to_string(), r.dst.to_string(), r.vni),
            (VTEP_A.into(), VTEP_B.into(), 5001)
        );
        assert_eq!(
            (r.flows, r.packets, r.ce, r.inner_ce, r.psn_gaps),
            (3, 300, 6, 3, 3)
        );
        assert_eq!(r.inner_ifname.as_deref(), Some("vx0"));
        assert_eq!(
            (r.inner_flows, r.inner_psn_gaps, r.vtep_psn_gaps),
            (Some(3), Some(5), Some(3))
        );
    }

    #[test]
    fn leaving_the_outer_gaps_beyond_the_inner_ones_were_made_in_encapsulation() {
        let flows = [
            inner("vx0", 0x11, 0, Direction::Egress),
            tunnelled(0x11, 2, Direction::Egress),
        ];
        let t = Tunnels::of(&flows);
        assert_eq!(
            (t[0].inner_psn_gaps, t[0].vtep_psn_gaps),
            (Some(0), Some(2))
        );
    }

    #[test]
    fn without_an_inner_side_or_a_direction_nothing_is_put_on_the_vtep() {
        let t = Tunnels::of(&[tunnelled(0x11, 2, Direction::Ingress)]);
        assert_eq!(
            (
                t[0].inner_ifname.clone(),
                t[0].inner_flows,
                t[0].vtep_psn_gaps
            ),
            (None, None, None)
        );
        // A capture: no direction; the sides are matched, the VTEP is not judged.
        let capture = |f: FlowFacts<'static>| FlowFacts {
            ifname: None,
            direction: None,
            ..f
        };
        let t = Tunnels::of(&[
            capture(tunnelled(0x11, 0, Direction::Ingress)),
            capture(inner("vx0", 0x11, 4, Direction::Ingress)),
        ]);
        assert_eq!((t[0].inner_psn_gaps, t[0].vtep_psn_gaps), (Some(4), None));
        // No tunnel at all: nothing.
        assert!(Tunnels::of(&[inner("vx0", 0x11, 4, Direction::Ingress)]).is_empty());
    }

    #[test]
    fn the_inner_side_with_the_most_packets_stands_for_the_queue_pair() {
        let flows = [
            tunnelled(0x11, 0, Direction::Ingress),
            FlowFacts {
                packets: 5,
                ..inner("br0", 0x11, 7, Direction::Ingress)
            },
            inner("vx0", 0x11, 1, Direction::Ingress),
        ];
        let t = Tunnels::of(&flows);
        assert_eq!(
            (t[0].inner_ifname.as_deref(), t[0].inner_psn_gaps),
            (Some("vx0"), Some(1))
        );
    }
}
