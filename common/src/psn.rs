//! PSN tracking for RC/XRC requests (the counting rules in the README, "The flow
//! document"): a request whose PSN is ahead of the flow's expected next PSN is a gap
//! (24-bit arithmetic, so wrap-around is no gap); behind it (by less than half the PSN
//! space) is a retransmission, and a retransmission that goes back (the first after a
//! new request, or one at or before the previous retransmission) starts a go-back. A
//! READ request of N bytes uses ceil(N / PMTU) PSNs; the PMTU is learnt per flow from
//! the payload of FIRST/MIDDLE packets, or from the PSN distance after a READ when
//! exactly one IB MTU fits it, and is the configured default until then.

use crate::bth::{self, op};
use crate::config::{pmtu_log2, IB_MTU_LOG2};
use crate::parsed::Parsed;

pub const PSN_MASK: u32 = 0x00FF_FFFF;
/// Distances below this are "ahead", at or above it "behind" (half the PSN space).
pub const PSN_HALF: u32 = 0x0080_0000;

const VALID: u8 = 1;
const PENDING_READ: u8 = 2;
/// The last request was a retransmission: `last_psn` is its PSN, and a retransmission
/// after it continues the same go-back.
const RESENDING: u8 = 8;
/// Set by `FlowStats::merge` (user side, never by the kernel): requests of the flow
/// were tracked in more than one state, so a state that missed the requests another
/// one saw counts a false gap. (The kernel keeps one state per flow for all CPUs.)
const SPLIT: u8 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PsnState {
    /// The PSN the next request should carry.
    pub next: u32,
    /// The PSN of the last READ request while a READ is pending (until the next
    /// request shows how many PSNs it used), of the last retransmission while resending.
    pub last_psn: u32,
    /// DMA length of the pending READ.
    pub read_len: u32,
    /// log2 of the learnt path MTU, 0 while unknown.
    pub pmtu_log2: u8,
    pub flags: u8,
    pub _pad: [u8; 2],
}

impl PsnState {
    /// Requests of the flow were tracked in this state.
    pub fn tracked(&self) -> bool {
        self.flags & VALID != 0
    }
    /// Merged from more than one state: the flow's gap count may hold
    /// false gaps.
    pub fn split(&self) -> bool {
        self.flags & SPLIT != 0
    }
    pub(crate) fn mark_split(&mut self) {
        self.flags |= SPLIT;
    }
}

/// PSNs that a READ of `len` bytes uses at a path MTU of 2^`log2`.
#[inline(always)]
pub fn read_psns(len: u32, log2: u8) -> u32 {
    let n = ((len as u64 + (1u64 << log2) - 1) >> log2) as u32;
    if n == 0 {
        1
    } else {
        n
    }
}

/// What a request's PSN says, against the flow's expected next PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Seen {
    /// The expected PSN (or the flow's first request).
    InOrder,
    /// Ahead of the expected PSN, and no READ explains the distance: PSNs are missing.
    Gap,
    /// Behind the expected PSN: sent before, sent again, continuing a go-back.
    Resent,
    /// Behind the expected PSN, and going back: the first retransmission after a new
    /// request, or one at or before the previous retransmission.
    GoBack,
}

impl PsnState {
    /// Takes one RC/XRC request into account: in order, a gap, or a retransmission.
    #[inline(always)]
    pub fn observe(&mut self, p: &Parsed, default_pmtu_log2: u8) -> Seen {
        let opcode = p.bth.opcode;
        let psn = p.bth.psn;
        if bth::is_first_or_middle(opcode) {
            if let Some(l) = pmtu_log2(p.payload_len()) {
                self.pmtu_log2 = l;
            }
        }
        let mut seen = Seen::InOrder;
        if self.flags & VALID != 0 {
            let ahead = psn.wrapping_sub(self.next) & PSN_MASK;
            if ahead >= PSN_HALF {
                // A retransmission: the expected PSN stays where it is. It continues
                // the go-back under way when it is after the previous one.
                let after_last = psn.wrapping_sub(self.last_psn) & PSN_MASK;
                let goes_on =
                    self.flags & RESENDING != 0 && after_last != 0 && after_last < PSN_HALF;
                self.flags = (self.flags & !PENDING_READ) | RESENDING;
                self.last_psn = psn;
                return if goes_on { Seen::Resent } else { Seen::GoBack };
            }
            if ahead != 0 && !self.learn_from_read(psn) {
                seen = Seen::Gap;
            }
        }
        let is_read = opcode & 0x1F == op::READ_REQUEST;
        let pmtu = if self.pmtu_log2 != 0 {
            self.pmtu_log2
        } else {
            default_pmtu_log2
        };
        let used = if is_read {
            read_psns(p.read_len, pmtu)
        } else {
            1
        };
        self.next = psn.wrapping_add(used) & PSN_MASK;
        self.flags = VALID;
        if is_read {
            self.flags |= PENDING_READ;
            self.last_psn = psn;
            self.read_len = p.read_len;
        }
        seen
    }

    /// After a READ, the next request's PSN tells the READ's PSN count: if exactly one
    /// IB MTU explains it, that is the path MTU and the distance is no gap.
    #[inline(always)]
    fn learn_from_read(&mut self, psn: u32) -> bool {
        if self.flags & PENDING_READ == 0 {
            return false;
        }
        let used = psn.wrapping_sub(self.last_psn) & PSN_MASK;
        let mut found = 0u8;
        let mut fits = 0u32;
        for l in IB_MTU_LOG2 {
            if read_psns(self.read_len, l) == used {
                found = l;
                fits += 1;
            }
        }
        if fits == 1 {
            self.pmtu_log2 = found;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bth::Bth;
    use std::vec::Vec;

    fn req(opcode: u8, psn: u32, read_len: u32) -> Parsed {
        Parsed {
            bth: Bth {
                opcode,
                psn,
                ..Bth::default()
            },
            read_len,
            udp_len: 8 + 12 + 4 + 64,
            ..Parsed::default()
        }
    }

    fn run(st: &mut PsnState, pkts: &[Parsed]) -> u32 {
        pkts.iter()
            .filter(|p| st.observe(p, 12) == Seen::Gap)
            .count() as u32
    }

    /// What each request was, in order.
    fn seen(pkts: &[Parsed]) -> Vec<Seen> {
        let mut st = PsnState::default();
        pkts.iter().map(|p| st.observe(p, 12)).collect()
    }

    use Seen::{Gap, GoBack, InOrder, Resent};

    #[test]
    fn a_go_back_starts_at_the_first_resend_and_again_at_each_step_back() {
        // 10..=14 sent, the requester goes back to 12 (timeout or NAK), resends 12, 13,
        // goes back to 12 once more, then 13, 14 and new 15.
        let psns = [10, 11, 12, 13, 14, 12, 13, 12, 13, 14, 15, 16];
        let pkts: Vec<Parsed> = psns.iter().map(|&n| req(4, n, 0)).collect();
        assert_eq!(
            seen(&pkts),
            [
                InOrder, InOrder, InOrder, InOrder, InOrder, GoBack, Resent, GoBack, Resent,
                Resent, InOrder, InOrder
            ]
        );
    }

    #[test]
    fn the_same_psn_twice_is_a_go_back_each_time_and_a_skip_within_a_resend_is_no_gap() {
        // A duplicate of the last request, twice: each one goes back (not after the
        // previous retransmission). A resend that skips 21 continues the go-back.
        let psns = [20, 21, 22, 22, 22, 20, 22, 23];
        let pkts: Vec<Parsed> = psns.iter().map(|&n| req(4, n, 0)).collect();
        assert_eq!(
            seen(&pkts),
            [InOrder, InOrder, InOrder, GoBack, GoBack, GoBack, Resent, InOrder]
        );
    }

    #[test]
    fn retransmissions_across_the_psn_wrap_are_told_from_new_requests() {
        let psns = [0xFF_FFFE, 0xFF_FFFF, 0, 1, 0xFF_FFFF, 0, 1, 2];
        let pkts: Vec<Parsed> = psns.iter().map(|&n| req(4, n, 0)).collect();
        assert_eq!(
            seen(&pkts),
            [InOrder, InOrder, InOrder, InOrder, GoBack, Resent, Resent, InOrder]
        );
    }

    #[test]
    fn a_read_re_issued_from_within_its_psns_is_a_retransmission() {
        // A READ of 3000 bytes at PMTU 1024 (learnt from a WRITE FIRST) takes PSNs
        // 1..=3, so the next request is 4; the READ re-issued for its last response
        // (PSN 3) is a retransmission, not a request behind one.
        let mut first = req(op::WRITE_FIRST, 0, 0);
        first.udp_len = (8 + 12 + 16 + 1024 + 4) as u16;
        let pkts = [
            first,
            req(op::READ_REQUEST, 1, 3000),
            req(4, 4, 0),
            req(op::READ_REQUEST, 3, 1000),
            req(4, 4, 0),
            req(4, 5, 0),
        ];
        assert_eq!(
            seen(&pkts),
            [InOrder, InOrder, InOrder, GoBack, Resent, InOrder]
        );
    }

    #[test]
    fn far_behind_is_ahead_and_a_gap() {
        // Half the PSN space or more behind reads as ahead: a gap, as the gap rule
        // has it, never a retransmission.
        let pkts = [req(4, 0x80_0005, 0), req(4, 5, 0)];
        assert_eq!(seen(&pkts), [InOrder, Gap]);
    }

    #[test]
    fn in_order_has_no_gap_across_wrap() {
        let mut st = PsnState::default();
        let pkts: [Parsed; 4] =
            core::array::from_fn(|i| req(op::SEND_ONLY, (0xFF_FFFE + i as u32) & PSN_MASK, 0));
        assert_eq!(run(&mut st, &pkts), 0);
    }

    #[test]
    fn skipped_psn_is_one_gap_and_retransmission_none() {
        let mut st = PsnState::default();
        let pkts = [
            req(4, 10, 0),
            req(4, 11, 0),
            req(4, 13, 0),
            req(4, 12, 0),
            req(4, 13, 0),
            req(4, 14, 0),
        ];
        assert_eq!(run(&mut st, &pkts), 1);
    }

    #[test]
    fn read_of_3000_bytes_at_pmtu_1024_learns_the_mtu() {
        let mut st = PsnState::default();
        let pkts = [
            req(op::READ_REQUEST, 0, 3000),
            req(op::READ_REQUEST, 3, 3000),
            req(op::READ_REQUEST, 6, 3000),
            req(4, 9, 0),
        ];
        assert_eq!(run(&mut st, &pkts), 0);
        assert_eq!(st.pmtu_log2, 10);
    }

    #[test]
    fn gap_after_read_that_no_mtu_explains() {
        let mut st = PsnState::default();
        // 3000 bytes: 12, 6, 3, 2 or 1 PSNs; 5 fits none.
        let pkts = [req(op::READ_REQUEST, 0, 3000), req(4, 5, 0)];
        assert_eq!(run(&mut st, &pkts), 1);
    }

    #[test]
    fn first_packet_payload_teaches_pmtu() {
        let mut st = PsnState::default();
        let mut first = req(op::WRITE_FIRST, 0, 0);
        first.udp_len = (8 + 12 + 16 + 1024 + 4) as u16;
        st.observe(&first, 12);
        assert_eq!(st.pmtu_log2, 10);
    }
}
