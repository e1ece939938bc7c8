//! Rates over the last collector interval: each flow's counts now minus its counts at
//! the previous poll, over the time between the two polls.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use crate::doc::{Direction, Document, Flow, Rates};

/// What identifies a flow across polls (the flow key, as the document shows it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FlowId {
    ifname: Option<String>,
    direction: Option<Direction>,
    src: IpAddr,
    dst: IpAddr,
    vni: Option<u32>,
    inner_src: Option<IpAddr>,
    inner_dst: Option<IpAddr>,
    dest_qp: u32,
}

impl FlowId {
    fn of(f: &Flow) -> FlowId {
        FlowId {
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

/// The counts a rate is made from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    packets: u64,
    bytes: u64,
    ce: u64,
    ecn_packets: u64,
    cnps: u64,
    naks: u64,
}

impl Totals {
    fn of(f: &Flow) -> Totals {
        Totals {
            packets: f.packets,
            bytes: f.bytes,
            ce: f.ecn.ce,
            ecn_packets: f.ecn.total(),
            cnps: f.cnps,
            naks: f.naks + f.rnr_naks,
        }
    }

    /// `self - before`, or None when a count went down (the flow was evicted and
    /// counted anew: no honest rate).
    fn since(&self, before: &Totals) -> Option<Totals> {
        Some(Totals {
            packets: self.packets.checked_sub(before.packets)?,
            bytes: self.bytes.checked_sub(before.bytes)?,
            ce: self.ce.checked_sub(before.ce)?,
            ecn_packets: self.ecn_packets.checked_sub(before.ecn_packets)?,
            cnps: self.cnps.checked_sub(before.cnps)?,
            naks: self.naks.checked_sub(before.naks)?,
        })
    }
}

/// Remembers the previous poll's counts.
#[derive(Debug, Default)]
pub struct RateTracker {
    previous: HashMap<FlowId, Totals>,
    at: Option<Instant>,
}

impl RateTracker {
    /// Fills each flow's `rates` from its counts at the previous call (a flow seen for
    /// the first time gets none) and remembers the counts for the next.
    pub fn apply(&mut self, doc: &mut Document, now: Instant) {
        let seconds = self.at.map(|at| now.duration_since(at).as_secs_f64());
        let mut current = HashMap::with_capacity(doc.flows.len());
        for f in &mut doc.flows {
            let id = FlowId::of(f);
            let totals = Totals::of(f);
            f.rates = match (seconds, self.previous.get(&id)) {
                (Some(s), Some(before)) if s > 0.0 => totals.since(before).map(|d| rates(&d, s)),
                _ => None,
            };
            current.insert(id, totals);
        }
        self.previous = current;
        self.at = Some(now);
    }
}

fn rates(d: &Totals, seconds: f64) -> Rates {
    let per_s = |n: u64| n as f64 / seconds;
    Rates {
        interval_s: seconds,
        packets_per_s: per_s(d.packets),
        bits_per_s: per_s(d.bytes) * 8.0,
        ce_per_s: per_s(d.ce),
        ce_ratio: if d.ecn_packets == 0 {
            0.0
        } else {
            d.ce as f64 / d.ecn_packets as f64
        },
        cnps_per_s: per_s(d.cnps),
        naks_per_s: per_s(d.naks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Ecn, Family};
    use std::time::Duration;

    fn flow(qp: u32, packets: u64, ce: u64, cnps: u64, naks: u64) -> Flow {
        Flow {
            ifname: Some("eth1".into()),
            direction: Some(Direction::Ingress),
            family: Family::Ipv4,
            src: "198.18.0.1".parse().unwrap(),
            dst: "198.18.0.2".parse().unwrap(),
            sport: 49152,
            vni: None,
            inner_family: None,
            inner_src: None,
            inner_dst: None,
            dest_qp: qp,
            packets,
            bytes: packets * 1000,
            ecn: Ecn {
                not_ect: 0,
                ect1: 0,
                ect0: packets - ce,
                ce,
            },
            inner_ecn: None,
            cnps,
            acks: 0,
            naks,
            rnr_naks: 0,
            psn_gaps: 0,
            psn_split: false,
            last_dscp: 26,
            first_seen_ns: 0,
            last_seen_ns: 0,
            rates: None,
        }
    }

    fn doc(flows: Vec<Flow>) -> Document {
        Document {
            flows,
            ..Document::default()
        }
    }

    #[test]
    fn rates_are_the_difference_over_the_interval() {
        let mut t = RateTracker::default();
        let t0 = Instant::now();
        let mut d = doc(vec![flow(1, 100, 10, 5, 1)]);
        t.apply(&mut d, t0);
        assert_eq!(d.flows[0].rates, None, "no rate on first sight");
        let mut d = doc(vec![flow(1, 300, 60, 15, 3), flow(2, 50, 0, 0, 0)]);
        t.apply(&mut d, t0 + Duration::from_secs(2));
        let r = d.flows[0].rates.expect("a rate");
        assert_eq!(r.interval_s, 2.0);
        assert_eq!(r.packets_per_s, 100.0);
        assert_eq!(r.bits_per_s, 800_000.0);
        assert_eq!(r.ce_per_s, 25.0);
        assert_eq!(r.ce_ratio, 0.25);
        assert_eq!(r.cnps_per_s, 5.0);
        assert_eq!(r.naks_per_s, 1.0);
        assert_eq!(d.flows[1].rates, None, "the new flow has none yet");
    }

    #[test]
    fn a_flow_counted_anew_gets_no_rate_and_an_idle_one_gets_zero() {
        let mut t = RateTracker::default();
        let t0 = Instant::now();
        t.apply(
            &mut doc(vec![flow(1, 100, 10, 0, 0), flow(2, 10, 0, 0, 0)]),
            t0,
        );
        let mut d = doc(vec![flow(1, 40, 0, 0, 0), flow(2, 10, 0, 0, 0)]);
        t.apply(&mut d, t0 + Duration::from_secs(1));
        assert_eq!(d.flows[0].rates, None);
        let idle = d.flows[1].rates.expect("a rate");
        assert_eq!((idle.packets_per_s, idle.ce_ratio), (0.0, 0.0));
    }
}
