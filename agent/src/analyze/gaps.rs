//! Loss in the fabric or in the capture, in `analyze`: the gaps waiting for their
//! verdict, many per host pair, decided by the rule of `roce_common::gaps` (which live
//! mirror sessions share). A gap that nothing decides before the capture ends (no
//! response of that queue pair in the capture: one direction captured, or the capture
//! stopped) stays undecided.
//!
//! A response of another queue pair between the same hosts decides a gap only if its
//! PSN falls in that gap's window, from the first missing PSN to the flow's next one
//! (a few PSNs out of 2^24, the window of requests in flight). Both directions of a
//! host pair reach one worker (`engine::Split`), in capture order.

use std::collections::{HashMap, VecDeque};

pub use roce_common::gaps::Verdict;
use roce_common::gaps::{
    decides, pair_of_request, pair_of_response, resend_decides, response_verdict,
};
use roce_common::nak::NakKey;
use roce_common::parsed::Parsed;

/// Gaps waiting for a verdict at most, per worker: beyond, new gaps are left
/// undecided (a capture whose other direction never shows).
pub const MAX_PENDING: usize = 1 << 16;

/// Gaps waiting for a verdict at most between two hosts: beyond, the oldest of them is
/// left undecided. Every response between the hosts is held against each of them, so
/// this bounds that work (a window in flight holds a few gaps of each queue pair).
pub const MAX_PENDING_PER_PAIR: usize = 256;

/// A gap waiting for its verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending<K> {
    /// The request flow, as the worker's table keys it.
    flow: K,
    /// The first missing PSN, and the PSN that showed the gap: the missing ones lie
    /// from `first` up to, not including, `end`.
    first: u32,
    end: u32,
}

/// The pending gaps of one worker, by host pair.
#[derive(Clone, Debug)]
pub struct GapWatch<K> {
    /// Keyed as the NAK memory keys a pair (`NakKey` with PSN 0), oldest first. Every
    /// response looks here while a gap waits: a fast hash, seeded per run.
    pending: HashMap<NakKey, VecDeque<Pending<K>>, foldhash::fast::RandomState>,
    len: usize,
    /// Gaps let go without a verdict to make room (`counters.capture_gaps_undecided`).
    undecided: u64,
}

impl<K> Default for GapWatch<K> {
    fn default() -> Self {
        GapWatch {
            pending: HashMap::default(),
            len: 0,
            undecided: 0,
        }
    }
}

impl<K: Copy + PartialEq> GapWatch<K> {
    /// Gaps waiting for a verdict.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gaps let go without a verdict because the watch was full (per host pair, or
    /// in all): the live watch counts its own the same way.
    pub fn undecided(&self) -> u64 {
        self.undecided
    }

    /// A request `p` of `flow` showed a gap: the PSNs from `first` (the flow's
    /// expected PSN before it) up to its own are missing.
    pub fn gap(&mut self, p: &Parsed, scope: u32, flow: K, first: u32) {
        if self.len >= MAX_PENDING {
            self.undecided += 1;
            return;
        }
        let pair = pair_of_request(p, scope);
        let gaps = self.pending.entry(pair).or_default();
        if gaps.len() >= MAX_PENDING_PER_PAIR {
            gaps.pop_front();
            self.len -= 1;
            self.undecided += 1;
        }
        gaps.push_back(Pending {
            flow,
            first,
            end: p.bth.psn,
        });
        self.len += 1;
    }

    /// Removes the gaps of `pair` that `pick` picks, and returns their flows.
    fn take_where(&mut self, pair: &NakKey, mut pick: impl FnMut(&Pending<K>) -> bool) -> Vec<K> {
        let Some(gaps) = self.pending.get_mut(pair) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        gaps.retain(|g| {
            let take = pick(g);
            if take {
                taken.push(g.flow);
            }
            !take
        });
        if gaps.is_empty() {
            self.pending.remove(pair);
        }
        self.len -= taken.len();
        taken
    }

    /// A request `p` of `flow` was a retransmission: the gaps of that flow missing its
    /// PSN were lost in the fabric. Returns their flows.
    pub fn resent(&mut self, p: &Parsed, scope: u32, flow: &K) -> Vec<K> {
        let pair = pair_of_request(p, scope);
        let psn = p.bth.psn;
        self.take_where(&pair, |g| {
            g.flow == *flow && resend_decides(psn, g.first, g.end)
        })
    }

    /// A response `p` (an RC or XRC response opcode) on the other direction of some
    /// gaps' host pair: their verdicts, with their flows. `next_of` gives a request
    /// flow's next expected PSN now.
    pub fn answered(
        &mut self,
        p: &Parsed,
        scope: u32,
        next_of: impl Fn(&K) -> Option<u32>,
    ) -> Vec<(K, Verdict)> {
        let Some(verdict) = response_verdict(p) else {
            return Vec::new();
        };
        let pair = pair_of_response(p, scope);
        let psn = p.bth.psn;
        let taken = self.take_where(&pair, |g| {
            // Read only for a capture verdict.
            let next = || next_of(&g.flow);
            match verdict {
                Verdict::Fabric => decides(verdict, psn, g.first, g.end, 0),
                Verdict::Capture => {
                    next().is_some_and(|n| decides(verdict, psn, g.first, g.end, n))
                }
            }
        });
        taken.into_iter().map(|k| (k, verdict)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::key::addr_v4_mapped;

    const A: [u8; 4] = [198, 18, 0, 1];
    const B: [u8; 4] = [198, 18, 0, 2];

    /// A packet from `src` to `dst`, QP `qp`.
    fn pkt(
        src: [u8; 4],
        dst: [u8; 4],
        qp: u32,
        opcode: u8,
        psn: u32,
        syndrome: Option<u8>,
    ) -> Parsed {
        let mut p = Parsed::default();
        p.key.src = addr_v4_mapped(u32::from_ne_bytes(src));
        p.key.dst = addr_v4_mapped(u32::from_ne_bytes(dst));
        p.key.dest_qp = qp;
        p.bth.opcode = opcode;
        p.bth.psn = psn;
        p.has_syndrome = syndrome.is_some();
        p.aeth_syndrome = syndrome.unwrap_or(0);
        p
    }

    const ACK: u8 = 0x11;

    #[test]
    fn a_response_in_the_window_says_capture_and_a_nak_or_resend_says_fabric() {
        // Flow 1 (A -> B, QP 0x11) missed PSNs 10, 11 (12 arrived); its next is 13.
        let mut w: GapWatch<u32> = GapWatch::default();
        let req = pkt(A, B, 0x11, 0x0a, 12, None);
        w.gap(&req, 0, 1, 10);
        let next = |_: &u32| Some(13);
        // An ACK of PSN 9 (before the gap), one between other hosts, one in the same
        // direction as the requests: no verdict.
        assert!(w
            .answered(&pkt(B, A, 0x22, ACK, 9, Some(0)), 0, next)
            .is_empty());
        assert!(w
            .answered(&pkt(B, [198, 18, 0, 3], 0x22, ACK, 11, Some(0)), 0, next)
            .is_empty());
        assert!(w
            .answered(&pkt(A, B, 0x22, ACK, 11, Some(0)), 0, next)
            .is_empty());
        // An ACK beyond the flow's next PSN is another queue pair's.
        assert!(w
            .answered(&pkt(B, A, 0x22, ACK, 13, Some(0)), 0, next)
            .is_empty());
        assert_eq!(w.len(), 1);
        // An ACK of 12 covers 10 and 11: the capture lost them.
        assert_eq!(
            w.answered(&pkt(B, A, 0x22, ACK, 12, Some(0)), 0, next),
            vec![(1, Verdict::Capture)]
        );
        assert!(w.is_empty());

        // A NAK of 10 (sequence error): the fabric.
        w.gap(&req, 0, 1, 10);
        assert_eq!(
            w.answered(&pkt(B, A, 0x22, ACK, 10, Some(0x60)), 0, next),
            vec![(1, Verdict::Fabric)]
        );
        // A resend of 11 on the flow: the fabric; on another flow: nothing.
        w.gap(&req, 0, 1, 10);
        assert!(w.resent(&pkt(A, B, 0x11, 0x0a, 11, None), 0, &2).is_empty());
        assert!(
            w.resent(&pkt(A, B, 0x11, 0x0a, 12, None), 0, &1).is_empty(),
            "12 was not missing"
        );
        assert_eq!(w.resent(&pkt(A, B, 0x11, 0x0a, 11, None), 0, &1), vec![1]);
        assert!(w.is_empty());
    }

    #[test]
    fn windows_wrap_with_the_psn_space() {
        let mut w: GapWatch<u32> = GapWatch::default();
        // Missing 0xFFFFFF and 0; 1 arrived; next 2.
        w.gap(&pkt(A, B, 0x11, 0x0a, 1, None), 0, 7, 0xFF_FFFF);
        assert_eq!(
            w.answered(&pkt(B, A, 0x22, ACK, 0, Some(0)), 0, |_| Some(2)),
            vec![(7, Verdict::Capture)]
        );
    }

    #[test]
    fn the_oldest_gap_of_a_pair_goes_first_beyond_its_bound() {
        let mut w: GapWatch<u32> = GapWatch::default();
        for i in 0..=MAX_PENDING_PER_PAIR as u32 {
            w.gap(&pkt(A, B, 0x11, 0x0a, 2 * i + 1, None), 0, i, 2 * i);
        }
        assert_eq!(w.len(), MAX_PENDING_PER_PAIR);
        assert_eq!(w.undecided(), 1, "gap 0 let go, and counted");
        // Gap 0 (missing PSN 0) is gone, gap 1 (missing PSN 2) is there: an ACK of 2
        // covers the gaps whose window holds it, only gap 1's.
        let next = |i: &u32| Some(2 * i + 2);
        assert!(w
            .answered(&pkt(B, A, 0x22, ACK, 0, Some(0)), 0, next)
            .is_empty());
        assert_eq!(
            w.answered(&pkt(B, A, 0x22, ACK, 2, Some(0)), 0, next),
            vec![(1, Verdict::Capture)]
        );
    }
}
