//! PSN gap tracking for RC/XRC requests (the counting rule in the README, "The flow document"):
//! a request whose PSN is ahead of the flow's expected next PSN is a gap (24-bit
//! arithmetic, so wrap-around is no gap); behind it is a retransmission. A READ
//! request of N bytes uses ceil(N / PMTU) PSNs; the PMTU is learnt per flow from the
//! payload of FIRST/MIDDLE packets, or from the PSN distance after a READ when
//! exactly one IB MTU fits it, and is the configured default until then.

use crate::bth::{self, op};
use crate::config::{pmtu_log2, IB_MTU_LOG2};
use crate::parsed::Parsed;

pub const PSN_MASK: u32 = 0x00FF_FFFF;
/// Distances below this are "ahead", at or above it "behind" (half the PSN space).
pub const PSN_HALF: u32 = 0x0080_0000;

const VALID: u8 = 1;
const PENDING_READ: u8 = 2;
/// Set by `FlowStats::merge` (user side, never by the kernel): requests of the flow
/// were tracked in more than one state, so a state that missed the requests another
/// one saw counts a false gap. (The kernel keeps one state per flow for all CPUs.)
const SPLIT: u8 = 4;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PsnState {
    /// The PSN the next request should carry.
    pub next: u32,
    /// PSN and DMA length of the last READ request, until the next request shows
    /// how many PSNs it used.
    pub read_psn: u32,
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

impl PsnState {
    /// Takes one RC/XRC request into account; true when its PSN reveals a gap.
    #[inline(always)]
    pub fn observe(&mut self, p: &Parsed, default_pmtu_log2: u8) -> bool {
        let opcode = p.bth.opcode;
        let psn = p.bth.psn;
        if bth::is_first_or_middle(opcode) {
            if let Some(l) = pmtu_log2(p.payload_len()) {
                self.pmtu_log2 = l;
            }
        }
        let mut gap = false;
        if self.flags & VALID != 0 {
            let ahead = psn.wrapping_sub(self.next) & PSN_MASK;
            if ahead >= PSN_HALF {
                // A retransmission: the expected PSN stays where it is.
                self.flags &= !PENDING_READ;
                return false;
            }
            if ahead != 0 {
                gap = !self.learn_from_read(psn);
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
            self.read_psn = psn;
            self.read_len = p.read_len;
        }
        gap
    }

    /// After a READ, the next request's PSN tells the READ's PSN count: if exactly one
    /// IB MTU explains it, that is the path MTU and the distance is no gap.
    #[inline(always)]
    fn learn_from_read(&mut self, psn: u32) -> bool {
        if self.flags & PENDING_READ == 0 {
            return false;
        }
        let used = psn.wrapping_sub(self.read_psn) & PSN_MASK;
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
        pkts.iter().filter(|p| st.observe(p, 12)).count() as u32
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
