//! Loss in the fabric or in the capture: the rule that decides where a PSN gap's
//! missing requests were lost, for `analyze` (`agent/src/analyze/gaps.rs`, which keeps
//! many gaps per host pair) and for live mirror sessions (the kernel keeps one per
//! host pair and mirroring device, `ebpf/src/gaps.rs`). A PSN gap seen at a capture
//! point says that requests did not reach it; whether they reached the responder, the
//! other direction of the queue pair says, later:
//! - a retransmission of a missing PSN on the gap's flow, or a NAK or RNR NAK of one
//!   (or of the PSN that showed the gap): the requester had to resend, the fabric lost
//!   them ([`Verdict::Fabric`]);
//! - else a positive response (ACK, READ response, ATOMIC ACKNOWLEDGE) whose PSN lies
//!   from the first missing one up to the flow's next expected PSN: the responder took
//!   the missing requests (responses are cumulative and in order), so only the capture
//!   lost them ([`Verdict::Capture`]).
//!
//! Responses travel to the requester's QP, which the wire does not tie to the
//! responder's, so they are matched by host pair ([`NakKey`] with PSN 0) and by PSN
//! window, as NAKs are matched to go-backs (`nak`).

use crate::bth::{self, SyndromeClass};
use crate::nak::NakKey;
use crate::parsed::Parsed;
use crate::psn::{PSN_HALF, PSN_MASK};

/// Where a gap's missing requests were lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Resent, or NAKed: the fabric lost them.
    Fabric,
    /// Acknowledged with no NAK and no resend: the capture lost them.
    Capture,
}

/// A gap waiting for its verdict, as the kernel keeps it (CAPTURE_GAP_WAIT): the
/// request flow's slot, the first missing PSN and the PSN that showed the gap (the
/// missing ones lie from `first` up to, not including, `end`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapWait {
    pub slot: u32,
    pub first: u32,
    pub end: u32,
}

/// The host pair a gap of the request `p` waits under (its requests' direction).
#[inline(always)]
pub fn pair_of_request(p: &Parsed, scope: u32) -> NakKey {
    NakKey::of_request(&p.key, 0, scope)
}

/// The host pair of the gaps the response `p` may decide.
#[inline(always)]
pub fn pair_of_response(p: &Parsed, scope: u32) -> NakKey {
    NakKey::of_nak(&p.key, 0, scope)
}

/// `psn` lies in the window from `from` (included) `len` PSNs on (24-bit arithmetic).
#[inline(always)]
pub fn within(psn: u32, from: u32, len: u32) -> bool {
    psn.wrapping_sub(from) & PSN_MASK < len
}

/// `psn` lies from `from` (included) up to `to` (not included), `to` being after
/// `from` by less than half the PSN space.
#[inline(always)]
pub fn between(psn: u32, from: u32, to: u32) -> bool {
    let len = to.wrapping_sub(from) & PSN_MASK;
    len < PSN_HALF && within(psn, from, len)
}

/// What the response `p` (an RC or XRC response opcode) says of the gaps of its host
/// pair, if anything: a NAK or RNR NAK says fabric, any positive response capture.
#[inline(always)]
pub fn response_verdict(p: &Parsed) -> Option<Verdict> {
    if !bth::is_response(p.bth.opcode) {
        return None;
    }
    let class = match p.syndrome() {
        Some(s) => bth::syndrome_class(s),
        // READ RESPONSE MIDDLE: no AETH, a response all the same.
        None => SyndromeClass::Ack,
    };
    match class {
        SyndromeClass::Ack => Some(Verdict::Capture),
        SyndromeClass::Nak | SyndromeClass::RnrNak => Some(Verdict::Fabric),
        SyndromeClass::Reserved => None,
    }
}

/// Whether a response at `psn` with `verdict` decides the gap from `first` to `end`
/// of a request flow whose next expected PSN is `next`.
#[inline(always)]
pub fn decides(verdict: Verdict, psn: u32, first: u32, end: u32, next: u32) -> bool {
    match verdict {
        // A NAK of a missing PSN (or of the one that showed the gap).
        Verdict::Fabric => between(psn, first, end.wrapping_add(1) & PSN_MASK),
        // A response from the first missing PSN to the flow's next one.
        Verdict::Capture => between(psn, first, next),
    }
}

/// Whether the retransmission of `psn` decides the gap from `first` to `end` (on the
/// gap's own flow): one of its missing PSNs was resent.
#[inline(always)]
pub fn resend_decides(psn: u32, first: u32, end: u32) -> bool {
    between(psn, first, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_wrap_at_24_bits() {
        assert!(between(0xFF_FFFF, 0xFF_FFFE, 2));
        assert!(between(0, 0xFF_FFFE, 2));
        assert!(!between(2, 0xFF_FFFE, 2));
        assert!(!between(5, 10, 4), "a window running backwards is empty");
        assert!(
            decides(Verdict::Fabric, 12, 10, 12, 13),
            "NAK of the PSN that showed it"
        );
        assert!(
            !decides(Verdict::Capture, 13, 10, 12, 13),
            "beyond the flow's next"
        );
        assert!(decides(Verdict::Capture, 12, 10, 12, 13));
        assert!(resend_decides(11, 10, 12) && !resend_decides(12, 10, 12));
    }
}
