//! `roce_rtt_seconds{ifname}`: the round trips of every flow on an interface, summed
//! into one histogram that only grows. The kernel keeps a histogram per flow
//! (RTT_HIST), and a flow's goes when the flow is evicted; so each poll adds what each
//! flow's histogram gained since the last poll. An evicted slot stays out of the table
//! at least one poll before it is reused, so a reused slot is met as a new flow.

use std::collections::{BTreeMap, HashMap};

use roce_common::rtt::{bucket_floor_ns, RttHist, RTT_OCTAVES, RTT_SUB_BUCKETS};

/// One interface's round trips: per octave of the kernel's buckets (the upper bound of
/// octave `o` is [`octave_bound_seconds`]`(o)`), their count and sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IfaceRtt {
    pub buckets: [u64; RTT_OCTAVES],
    pub count: u64,
    pub sum_seconds: f64,
}

/// The upper bound of octave `o`, in seconds: 2^(11 + o) ns; +Inf for the last one,
/// which also holds every longer round trip.
pub fn octave_bound_seconds(o: usize) -> f64 {
    let next = (o + 1) * RTT_SUB_BUCKETS;
    if next >= RTT_OCTAVES * RTT_SUB_BUCKETS {
        return f64::INFINITY;
    }
    bucket_floor_ns(next) as f64 / 1e9
}

/// The running sums, kept by the collector from poll to poll.
#[derive(Debug, Default)]
pub struct RttTotals {
    /// Slot -> (interface index, its histogram at the last poll).
    last: HashMap<u32, (u32, RttHist)>,
    by_ifindex: BTreeMap<u32, IfaceRtt>,
}

impl RttTotals {
    /// Adds what the histograms `now` (slot -> (interface index, histogram)) gained
    /// since the last call.
    pub fn update(&mut self, now: HashMap<u32, (u32, RttHist)>) {
        for (slot, (ifindex, h)) in &now {
            let before = self.last.get(slot).filter(|(i, _)| i == ifindex);
            let t = self.by_ifindex.entry(*ifindex).or_default();
            let (count_before, sum_before) = before.map_or((0, 0), |(_, b)| (b.samples, b.sum_ns));
            for (i, &n) in h.buckets.iter().enumerate() {
                let was = before.map_or(0, |(_, b)| b.buckets[i]);
                t.buckets[i / RTT_SUB_BUCKETS] += u64::from(n.saturating_sub(was));
            }
            t.count += h.samples.saturating_sub(count_before);
            t.sum_seconds += h.sum_ns.saturating_sub(sum_before) as f64 / 1e9;
        }
        self.last = now;
    }

    /// The sums by interface index.
    pub fn by_ifindex(&self) -> &BTreeMap<u32, IfaceRtt> {
        &self.by_ifindex
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(samples: &[u64]) -> RttHist {
        let mut h = RttHist::default();
        for &s in samples {
            h.add(s);
        }
        h
    }

    #[test]
    fn each_poll_adds_what_each_flow_gained_and_a_gone_flow_keeps_its_part() {
        let mut t = RttTotals::default();
        t.update(HashMap::from([
            (1, (7, hist(&[3_000, 3_000]))),
            (2, (7, hist(&[1_500_000]))),
        ]));
        t.update(HashMap::from([(1, (7, hist(&[3_000, 3_000, 3_100])))]));
        // Slot 2 evicted and then reused by a flow on interface 8.
        t.update(HashMap::from([
            (1, (7, hist(&[3_000, 3_000, 3_100]))),
            (2, (8, hist(&[40_000]))),
        ]));
        let s7 = &t.by_ifindex()[&7];
        assert_eq!(s7.count, 4);
        assert!(
            (s7.sum_seconds - (9.1e-6 + 1.5e-3)).abs() < 1e-12,
            "{}",
            s7.sum_seconds
        );
        // 3 µs: octave 1 (2.048 to 4.096 µs).
        assert_eq!(s7.buckets[1], 3);
        assert_eq!(s7.buckets.iter().sum::<u64>(), 4);
        assert_eq!(t.by_ifindex()[&8].count, 1);
        assert!((octave_bound_seconds(0) - 2.048e-6).abs() < 1e-15);
        assert!((octave_bound_seconds(1) - 4.096e-6).abs() < 1e-15);
        assert!((octave_bound_seconds(RTT_OCTAVES - 2) - 2.147483648).abs() < 1e-9);
        assert_eq!(octave_bound_seconds(RTT_OCTAVES - 1), f64::INFINITY);
    }
}
