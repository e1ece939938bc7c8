//! The ECN -> CNP loop timed on the capture's clock (Lumina's CNP checks), for each
//! flow that carries CNPs (the flow to the reaction point's QP):
//! - `ce_to_cnp`: from the first CE-marked RoCE packet between two hosts that no CNP
//!   answered yet to the CNP that comes back (the notification point's reaction time,
//!   plus the way back to the capture point);
//! - `cnp_interval`: the time between the flow's successive CNPs (the notification
//!   point's pacing: DCQCN sends at most one per QP per `min_time_between_cnps`).
//!
//! Marks and CNPs are matched by host pair (the CNP names the marked packets' sender
//! QP, which the wire does not tie to their destination QP), as NAKs are (`nak`); both
//! directions of a host pair reach one worker (`engine::Split`), in capture order.

use std::collections::HashMap;
use std::hash::Hash;

use roce_common::bth;
use roce_common::nak::NakKey;
use roce_common::parsed::Parsed;
use roce_common::wire::ECN_CE;

/// Host pairs with a CE mark waiting for its CNP at most, per worker: beyond, new marks
/// wait for none (a capture of one direction never answers them).
pub const MAX_WAITING: usize = 1 << 16;

/// The two histograms of a flow that carries CNPs, as the kernel keeps them live.
pub use roce_common::cnp::CnpTimes;

/// One worker's marks waiting for their CNP, and the CNP flows' times.
#[derive(Clone, Debug)]
pub struct CnpTiming<K> {
    /// Host pair in the marked packets' direction (`NakKey` with PSN 0) -> when the
    /// first mark no CNP has answered yet was captured.
    waiting: HashMap<NakKey, u64>,
    pub flows: HashMap<K, Box<CnpTimes>>,
}

impl<K> Default for CnpTiming<K> {
    fn default() -> Self {
        CnpTiming {
            waiting: HashMap::new(),
            flows: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Copy> CnpTiming<K> {
    /// The RoCE packet `p` of flow `k`, captured at `ts` (ns), in mirror scope `scope`.
    pub fn packet(&mut self, p: &Parsed, k: &K, ts: u64, scope: u32) {
        if bth::is_cnp(p.bth.opcode) {
            let t = self.flows.entry(*k).or_default();
            if t.last_cnp_ns != 0 {
                t.interval.add(ts.saturating_sub(t.last_cnp_ns));
            }
            t.last_cnp_ns = ts;
            // The marks it answers travelled the other way.
            if let Some(first) = self.waiting.remove(&NakKey::of_nak(&p.key, 0, scope)) {
                t.ce_to_cnp.add(ts.saturating_sub(first));
            }
            return;
        }
        let ce = p.outer_tos & 3 == ECN_CE || (p.tunnelled && p.inner_tos & 3 == ECN_CE);
        if ce && self.waiting.len() < MAX_WAITING {
            self.waiting
                .entry(NakKey::of_request(&p.key, 0, scope))
                .or_insert(ts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::key::addr_v4_mapped;

    const A: [u8; 4] = [198, 18, 0, 1];
    const B: [u8; 4] = [198, 18, 0, 2];

    fn pkt(src: [u8; 4], dst: [u8; 4], opcode: u8, tos: u8) -> Parsed {
        let mut p = Parsed::default();
        p.key.src = addr_v4_mapped(u32::from_ne_bytes(src));
        p.key.dst = addr_v4_mapped(u32::from_ne_bytes(dst));
        p.bth.opcode = opcode;
        p.outer_tos = tos;
        p
    }

    #[test]
    fn a_cnp_times_the_first_unanswered_mark_and_the_flows_cnps_their_spacing() {
        let mut t: CnpTiming<u32> = CnpTiming::default();
        let data_ce = pkt(A, B, 0x0a, 0x6b);
        let cnp = pkt(B, A, 0x81, 0xc0);
        // Marks at 1000 and 1500 ns; the CNP at 9000 answers from the first.
        t.packet(&data_ce, &1, 1000, 0);
        t.packet(&data_ce, &1, 1500, 0);
        t.packet(&cnp, &2, 9000, 0);
        // No mark since: the next CNP times nothing but its spacing.
        t.packet(&cnp, &2, 59_000, 0);
        // A mark between other hosts is not this pair's.
        t.packet(&pkt(A, [198, 18, 0, 3], 0x0a, 0x6b), &3, 60_000, 0);
        t.packet(&data_ce, &1, 70_000, 0);
        t.packet(&cnp, &2, 74_000, 0);
        let times = &t.flows[&2];
        assert_eq!(times.ce_to_cnp.samples, 2);
        assert_eq!(
            (times.ce_to_cnp.min_ns, times.ce_to_cnp.max_ns),
            (4000, 8000)
        );
        assert_eq!(times.interval.samples, 2);
        assert_eq!(
            (times.interval.min_ns, times.interval.max_ns),
            (15_000, 50_000)
        );
        // A CNP of another mirror session answers nothing of this one.
        let mut t: CnpTiming<u32> = CnpTiming::default();
        t.packet(&data_ce, &1, 1000, 7);
        t.packet(&cnp, &2, 2000, 8);
        assert_eq!(t.flows[&2].ce_to_cnp.samples, 0);
    }
}
