//! Rates over the last collector interval: each flow's counts now minus its counts at
//! the previous poll, over the time between the two polls. The collector pairs the
//! flows of two polls (`live::Builder::finish`); this module says what a rate is.

use crate::doc::Rates;

/// The counts a rate is made from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub packets: u64,
    pub bytes: u64,
    /// Packets with outer CE.
    pub ce: u64,
    /// Packets counted under any outer ECN codepoint.
    pub ecn_packets: u64,
    pub cnps: u64,
    /// NAKs and RNR NAKs.
    pub naks: u64,
}

impl Totals {
    /// `self - before`, or None when a count went down (the flow was evicted and
    /// counted anew: no honest rate).
    pub fn since(&self, before: &Totals) -> Option<Totals> {
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

/// The rates of counts `d` made over `seconds`.
pub fn rates(d: &Totals, seconds: f64) -> Rates {
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

    #[test]
    fn rates_are_the_counts_over_the_interval() {
        let d = Totals {
            packets: 200,
            bytes: 200_000,
            ce: 50,
            ecn_packets: 200,
            cnps: 10,
            naks: 2,
        };
        let r = rates(&d, 2.0);
        assert_eq!(r.interval_s, 2.0);
        assert_eq!(r.packets_per_s, 100.0);
        assert_eq!(r.bits_per_s, 800_000.0);
        assert_eq!(r.ce_per_s, 25.0);
        assert_eq!(r.ce_ratio, 0.25);
        assert_eq!(r.cnps_per_s, 5.0);
        assert_eq!(r.naks_per_s, 1.0);
        assert_eq!(rates(&Totals::default(), 1.0).ce_ratio, 0.0);
    }

    #[test]
    fn a_count_that_went_down_has_no_difference() {
        let now = Totals {
            packets: 40,
            ..Totals::default()
        };
        let before = Totals {
            packets: 100,
            ..Totals::default()
        };
        assert_eq!(now.since(&before), None);
        assert_eq!(before.since(&now).map(|d| d.packets), Some(60));
    }
}
