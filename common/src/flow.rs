//! The flow table's slots and counters, and the one function that counts a packet on a flow.

use crate::bth::{self, SyndromeClass};
use crate::event::{
    Trouble, EVENT_CNP, EVENT_NAK, EVENT_NONE, EVENT_PSN_GAP, EVENT_RNR_NAK, EVENT_RTT_SPIKE,
};
use crate::key::FlowKey;
use crate::nak::{NakKey, NakMemory};
use crate::parsed::Parsed;
use crate::psn::{self, Seen};
use crate::rtt::{RttMemory, RTT_SAMPLE_STALE_NS};
use crate::wire::ECN_CE;

/// The counters of one flow. In the kernel one value is shared by all CPUs (a slot of
/// FLOW_SLOTS): its counts are added atomically, the rest (clock, PSN state, last DSCP
/// and port) is written by whichever CPU counts the packet. [`FlowStats::merge`] adds
/// the values of one flow kept apart (other tables, other engines).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub packets: u64,
    /// Frame bytes from the Ethernet header on, no FCS.
    pub bytes: u64,
    /// Outer ECN codepoints, indexed by codepoint (Not-ECT, ECT(1), ECT(0), CE).
    pub ecn: [u64; 4],
    /// Inner ECN codepoints (tunnelled flows only).
    pub inner_ecn: [u64; 4],
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    /// PSN tracking state (see `psn`).
    pub psn: psn::PsnState,
    pub sport: u16,
    /// Outer DSCP of the last packet.
    pub last_dscp: u8,
    /// The kernel's CNP timing (`ebpf/src/cnp.rs`): a CE mark of this flow's host pair
    /// is known to wait for its CNP as of the count of answered waits whose low byte,
    /// plus one, this is (0: not known). While it holds, the flow's marks do not look.
    pub ce_wait_tag: u8,
    /// The clock tick (jiffies, low 32 bits, in the kernel) `last_seen_ns` was read
    /// in: the clock is read again only when the tick changed (see `record`).
    pub seen_tick: u32,
    /// Requests whose PSN was behind the flow's expected one (sent before), and their
    /// frame bytes. Written only by retransmissions, after the lines every packet
    /// writes.
    pub retransmitted_packets: u64,
    pub retransmitted_bytes: u64,
    /// Go-backs that no NAK or RNR NAK asked for: the requester's ACK timeout fired
    /// (`nak`).
    pub retransmit_timeouts: u64,
    /// The request flow's last round-trip sample (`rtt`): when it started (the flow's
    /// `last_seen_ns` then, low bit clear; 0: never), the low bit set while it waits
    /// for its response; and its PSN. Written only by the requests that start one and
    /// the responses that end one.
    pub rtt_sample_ns: u64,
    pub rtt_sample_psn: u32,
    /// Go-backs that took a NAK, and the time from each NAK to its first resend
    /// (`naks.now_ns()` clock), summed.
    pub nak_resends: u32,
    pub nak_to_resend_ns: u64,
    /// The go-back-N recovery under way: when its first resend was seen (0: none).
    pub recovery_start_ns: u64,
    /// Recoveries that ended (a request beyond where the flow had been before going
    /// back), their durations summed, and the longest, µs.
    pub recovery_ns: u64,
    pub recoveries: u32,
    pub recovery_max_us: u32,
}

/// Adds `n` to a counter (wrapping: `u64::MAX` takes one away). In the kernel another
/// CPU may count on the same flow at the same time, so the add is atomic there (a
/// `lock xadd`); the user side's values are its own. The kernel's NAK memory counts
/// with it too (`ebpf/src/maps.rs: NakMap`).
#[inline(always)]
pub fn add(counter: &mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: `counter` is a valid, aligned u64 (a field of a map value).
    unsafe {
        use core::intrinsics::{atomic_xadd, AtomicOrdering};
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, n);
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        *counter = counter.wrapping_add(n);
    }
}

/// `FlowStats::rtt_sample_ns`: the flow's sample waits for its response.
const RTT_WAITING: u64 = 1;

/// Ends the sample the response `p` answers, if one waits: its round trip in µs (at
/// least 1, saturated), 0 when none.
#[inline(always)]
fn end_rtt(p: &Parsed, scope: u32, rtt: &mut impl RttMemory) -> u32 {
    // Most responses name no waiting sample: no key made for them.
    if !rtt.may_end(p.bth.psn) {
        return 0;
    }
    match rtt.end(&NakKey::of_nak(&p.key, p.bth.psn, scope), p.key.dest_qp) {
        Some(ns) => {
            let us = ns / 1000;
            if us >= u32::MAX as u64 {
                u32::MAX
            } else {
                (us as u32).max(1)
            }
        }
        None => 0,
    }
}

/// [`add`] for a 32-bit counter (a histogram bucket: `rtt::RttHist`).
#[inline(always)]
pub fn add32(counter: &mut u32, n: u32) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: `counter` is a valid, aligned u32 (a field of a map value).
    unsafe {
        use core::intrinsics::{atomic_xadd, AtomicOrdering};
        atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(counter, n);
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        *counter = counter.wrapping_add(n);
    }
}

/// `FlowSlot::state`: the slot is on the free queue (or on its way there).
pub const SLOT_FREE: u32 = 0;
/// `FlowSlot::state`: the slot holds a flow that FLOWS4, FLOWS_MID or FLOWS points at.
pub const SLOT_LIVE: u32 = 1;
/// `FlowSlot::state`: the agent evicted the flow (its key is gone from its flow table);
/// the slot waits a poll interval, so that no program still counting on it is left,
/// before the agent zeroes it and queues it on FLOW_FREE.
pub const SLOT_EVICTED: u32 = 2;

/// One entry of FLOW_SLOTS, the array the flow tables point into: a flow's counters
/// and its wide key, in five cache lines (320 bytes: the budget of BENCHMARKS.md, "The
/// flow slot"). What every packet writes lies in the first three; the agent maps the
/// array into its memory and reads it in order (docs/architecture.md, "The flow
/// table").
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowSlot {
    /// Written by the packets of the flow: first, so that they touch the first lines.
    pub stats: FlowStats,
    /// The flow's key as the flows document shows it (also for a FLOWS4 or FLOWS_MID flow), written
    /// once when the slot is taken.
    pub key: FlowKey,
    /// [`SLOT_FREE`], [`SLOT_LIVE`] or [`SLOT_EVICTED`].
    pub state: u32,
    /// A request flow's requester QP (`rtt::pair_with`), learnt from the first
    /// response that ended one of its round-trip samples; 0 before.
    pub rtt_peer_qp: u32,
}

impl FlowStats {
    /// Counts one packet of `frame_len` bytes on this flow (whose key is `key`: the
    /// NAK memory needs its addresses), and says what trouble it showed (the sampled
    /// events: CE in either header, CNP, NAK, RNR NAK, PSN gap). NAKs and RNR NAKs go
    /// into `naks`, and a go-back that finds none there is a timeout (`nak`).
    ///
    /// `tick` is a cheap clock (the kernel's jiffies) and `now_ns` reads the clock that
    /// first/last seen are kept in; it is called only for a flow's first packet and when
    /// the tick changed since the flow's last one. The kernel's coarse clock moves only
    /// once a tick, so this saves its helper call on all other packets; where the kernel
    /// lacks it (before 5.11) `now_ns` reads the monotonic clock at full resolution,
    /// and first/last seen keep the same one-tick resolution.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        p: &Parsed,
        frame_len: u32,
        tick: u32,
        now_ns: impl FnOnce() -> u64,
        default_pmtu_log2: u8,
        naks: &mut impl NakMemory,
        rtt: &mut impl RttMemory,
    ) -> Trouble {
        if self.packets == 0 {
            let now = now_ns();
            self.first_seen_ns = now;
            self.last_seen_ns = now;
            self.seen_tick = tick;
        } else if tick != self.seen_tick {
            self.last_seen_ns = now_ns();
            self.seen_tick = tick;
        }
        add(&mut self.packets, 1);
        add(&mut self.bytes, frame_len as u64);
        self.sport = p.sport;
        self.last_dscp = p.outer_tos >> 2;
        let outer_ecn = p.outer_tos & 3;
        add(&mut self.ecn[outer_ecn as usize], 1);
        let mut ce = outer_ecn == ECN_CE;
        if p.tunnelled {
            let inner_ecn = p.inner_tos & 3;
            add(&mut self.inner_ecn[inner_ecn as usize], 1);
            ce |= inner_ecn == ECN_CE;
        }
        let mut kind = EVENT_NONE;
        // The round trip this packet ended, µs (0: none).
        let mut rtt_us = 0u32;
        let opcode = p.bth.opcode;
        if bth::is_cnp(opcode) {
            add(&mut self.cnps, 1);
            kind = EVENT_CNP;
        } else if bth::is_acknowledge(opcode) {
            if p.has_syndrome {
                match bth::syndrome_class(p.aeth_syndrome) {
                    SyndromeClass::Ack => {
                        add(&mut self.acks, 1);
                        if rtt.ends() {
                            rtt_us = end_rtt(p, naks.scope(), rtt);
                        }
                    }
                    SyndromeClass::RnrNak => {
                        add(&mut self.rnr_naks, 1);
                        kind = EVENT_RNR_NAK;
                    }
                    SyndromeClass::Nak => {
                        add(&mut self.naks, 1);
                        kind = EVENT_NAK;
                    }
                    SyndromeClass::Reserved => {}
                }
                if kind != EVENT_NONE {
                    naks.remember(&NakKey::of_nak(&p.key, p.bth.psn, naks.scope()));
                }
            }
        } else if bth::is_tracked_request(opcode) {
            match self.psn.observe(p, default_pmtu_log2) {
                Seen::InOrder => {
                    self.end_recovery(naks);
                    self.sample_rtt(p, naks.scope(), rtt);
                }
                Seen::Gap => {
                    add(&mut self.psn_gaps, 1);
                    kind = EVENT_PSN_GAP;
                    self.end_recovery(naks);
                    self.sample_rtt(p, naks.scope(), rtt);
                }
                seen => {
                    add(&mut self.retransmitted_packets, 1);
                    add(&mut self.retransmitted_bytes, frame_len as u64);
                    if seen == Seen::GoBack {
                        // The clock only where a time is kept (a NAK taken, a recovery
                        // begun): most go-backs of a recovery need none.
                        match naks.take(&NakKey::of_request(&p.key, p.bth.psn, naks.scope())) {
                            Some(nak_seen) => {
                                add32(&mut self.nak_resends, 1);
                                let took = naks.now_ns().saturating_sub(nak_seen);
                                add(&mut self.nak_to_resend_ns, took);
                            }
                            None => add(&mut self.retransmit_timeouts, 1),
                        }
                        // A go-back within a recovery continues it.
                        if self.recovery_start_ns == 0 {
                            self.recovery_start_ns = naks.now_ns().max(1);
                        }
                    }
                    // Karn's rule: the response may answer either copy.
                    if rtt.starts() && self.rtt_sample_ns & RTT_WAITING != 0 {
                        let psn = self.rtt_sample_psn;
                        rtt.cancel(&NakKey::of_request(&p.key, psn, naks.scope()));
                        self.rtt_sample_ns &= !RTT_WAITING;
                    }
                }
            }
        } else if bth::answers_request(opcode) && rtt.ends() {
            rtt_us = end_rtt(p, naks.scope(), rtt);
        }
        let spike = rtt.spike_us();
        if spike != 0 && rtt_us > spike {
            kind = EVENT_RTT_SPIKE;
        } else {
            rtt_us = 0;
        }
        Trouble { ce, kind, rtt_us }
    }

    /// Starts a round-trip sample on this request flow when the request asks for a
    /// response, no sample of the flow waits (or the one waiting went stale), and the
    /// flow's clock moved since the last one started: at most one sample a tick of the
    /// kernel's coarse clock (1 to 4 ms) per flow, which bounds what sampling costs a
    /// fast flow (as ePPing's per-flow rate limit does); in `analyze`, whose clock is
    /// the frames' own, every response can end one.
    #[inline(always)]
    fn sample_rtt(&mut self, p: &Parsed, scope: u32, rtt: &mut impl RttMemory) {
        if !(p.bth.ack_req || bth::expects_response(p.bth.opcode)) || !rtt.starts() {
            return;
        }
        let mark = self.rtt_sample_ns;
        let now = self.last_seen_ns & !RTT_WAITING;
        if mark & RTT_WAITING != 0 {
            if now.saturating_sub(mark & !RTT_WAITING) < RTT_SAMPLE_STALE_NS {
                return;
            }
            let psn = self.rtt_sample_psn;
            rtt.cancel(&NakKey::of_request(&p.key, psn, scope));
        } else if mark != 0 && mark == now {
            return;
        }
        self.rtt_sample_ns = now;
        if rtt.start(&NakKey::of_request(&p.key, p.bth.psn, scope)) {
            self.rtt_sample_ns = now | RTT_WAITING;
            self.rtt_sample_psn = p.bth.psn;
        }
    }

    /// A new request after going back: the recovery under way, if any, ended.
    #[inline(always)]
    fn end_recovery(&mut self, naks: &impl NakMemory) {
        let start = self.recovery_start_ns;
        if start == 0 {
            return;
        }
        self.recovery_start_ns = 0;
        let took = naks.now_ns().saturating_sub(start);
        add32(&mut self.recoveries, 1);
        add(&mut self.recovery_ns, took);
        let us = (took / 1000).min(u32::MAX as u64) as u32;
        if us > self.recovery_max_us {
            self.recovery_max_us = us;
        }
    }

    /// A response ended this request flow's sample at `psn`: it may start another.
    #[inline(always)]
    pub fn rtt_sample_ended(&mut self, psn: u32) {
        if self.rtt_sample_ns & RTT_WAITING != 0 && self.rtt_sample_psn == psn {
            self.rtt_sample_ns &= !RTT_WAITING;
        }
    }

    /// Adds another CPU's (or another table's) counters of the same flow.
    pub fn merge(&mut self, o: &FlowStats) {
        if o.packets == 0 {
            return;
        }
        let split = self.psn.split()
            || o.psn.split()
            || (self.packets != 0 && self.psn.tracked() && o.psn.tracked());
        let newer = o.last_seen_ns >= self.last_seen_ns || self.packets == 0;
        if self.packets == 0 || o.first_seen_ns < self.first_seen_ns {
            self.first_seen_ns = o.first_seen_ns;
        }
        self.packets += o.packets;
        self.bytes += o.bytes;
        for i in 0..4 {
            self.ecn[i] += o.ecn[i];
            self.inner_ecn[i] += o.inner_ecn[i];
        }
        self.cnps += o.cnps;
        self.acks += o.acks;
        self.naks += o.naks;
        self.rnr_naks += o.rnr_naks;
        self.psn_gaps += o.psn_gaps;
        self.retransmitted_packets += o.retransmitted_packets;
        self.retransmitted_bytes += o.retransmitted_bytes;
        self.retransmit_timeouts += o.retransmit_timeouts;
        self.nak_resends += o.nak_resends;
        self.nak_to_resend_ns += o.nak_to_resend_ns;
        self.recoveries += o.recoveries;
        self.recovery_ns += o.recovery_ns;
        self.recovery_max_us = self.recovery_max_us.max(o.recovery_max_us);
        if newer {
            self.recovery_start_ns = o.recovery_start_ns;
            self.rtt_sample_ns = o.rtt_sample_ns;
            self.rtt_sample_psn = o.rtt_sample_psn;
            self.last_seen_ns = o.last_seen_ns;
            self.sport = o.sport;
            self.last_dscp = o.last_dscp;
            self.psn = o.psn;
        }
        if split {
            self.psn.mark_split();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nak::{NakSet, NoNaks};
    use crate::rtt::NoRtt;

    #[test]
    fn layout_is_whole_words() {
        assert_eq!(core::mem::size_of::<FlowSlot>(), 320);
        assert_eq!(core::mem::size_of::<FlowStats>(), 232);
        // What every packet writes (counters, clock, PSN state) is in the first three
        // cache lines; the retransmission counters follow.
        assert!(core::mem::offset_of!(FlowStats, seen_tick) + 4 <= 160);
        assert_eq!(core::mem::offset_of!(FlowStats, retransmitted_packets), 160);
        assert_eq!(core::mem::size_of::<FlowKey>(), 80);
        assert_eq!(core::mem::size_of::<crate::key::FlowKey4>(), 16);
        assert_eq!(core::mem::size_of::<crate::key::FlowKeyMid>(), 40);
        assert_eq!(core::mem::size_of::<FlowStats>() % 8, 0);
    }

    fn packet(opcode: u8, psn: u32, outer_tos: u8) -> Parsed {
        let mut p = Parsed::default();
        p.bth.opcode = opcode;
        p.bth.psn = psn;
        p.outer_tos = outer_tos;
        p
    }

    #[test]
    fn record_says_what_trouble_a_packet_showed() {
        use crate::event::{EVENT_CNP, EVENT_NAK, EVENT_NONE, EVENT_PSN_GAP, EVENT_RNR_NAK};
        let mut f = FlowStats::default();
        let t = |ce, kind| Trouble {
            ce,
            kind,
            rtt_us: 0,
        };
        // RC WRITE ONLY (0x0a) in order, ECT(0): nothing; CE: ce.
        assert_eq!(
            f.record(
                &packet(0x0a, 1, 0x6a),
                60,
                0,
                || 0,
                12,
                &mut NoNaks,
                &mut NoRtt
            ),
            Trouble::NONE
        );
        assert_eq!(
            f.record(
                &packet(0x0a, 2, 0x6b),
                60,
                0,
                || 0,
                12,
                &mut NoNaks,
                &mut NoRtt
            ),
            t(true, EVENT_NONE)
        );
        // A PSN ahead of the expected one, with CE: both.
        assert_eq!(
            f.record(
                &packet(0x0a, 9, 0x6b),
                60,
                0,
                || 0,
                12,
                &mut NoNaks,
                &mut NoRtt
            ),
            t(true, EVENT_PSN_GAP)
        );
        assert_eq!(
            f.record(
                &packet(0x81, 0, 0xc2),
                60,
                0,
                || 0,
                12,
                &mut NoNaks,
                &mut NoRtt
            ),
            t(false, EVENT_CNP)
        );
        let mut ack = packet(0x11, 3, 0x6a);
        ack.has_syndrome = true;
        for (syndrome, kind) in [(0x1f, EVENT_NONE), (0x21, EVENT_RNR_NAK), (0x60, EVENT_NAK)] {
            ack.aeth_syndrome = syndrome;
            assert_eq!(
                f.record(&ack, 60, 0, || 0, 12, &mut NoNaks, &mut NoRtt),
                t(false, kind),
                "{syndrome:#x}"
            );
        }
        // Inner CE of a tunnelled packet is CE too.
        let mut inner = packet(0x0a, 3, 0x6a);
        inner.tunnelled = true;
        inner.inner_tos = 0x03;
        let mut g = FlowStats::default();
        assert_eq!(
            g.record(&inner, 60, 0, || 0, 12, &mut NoNaks, &mut NoRtt),
            t(true, EVENT_NONE)
        );
        assert_eq!(
            (f.psn_gaps, f.cnps, f.naks, f.rnr_naks, f.acks),
            (1, 1, 1, 1, 1)
        );
    }

    /// A packet of the flow 198.18.0.1 -> 198.18.0.2 (the requests) or, when `back`,
    /// 198.18.0.2 -> 198.18.0.1 (the responder's ACKs and NAKs), to QP `qp`.
    fn between(back: bool, qp: u32, opcode: u8, psn: u32) -> Parsed {
        let mut p = packet(opcode, psn, 0x6a);
        let (a, b) = (
            crate::key::addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 1])),
            crate::key::addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 2])),
        );
        (p.key.src, p.key.dst) = if back { (b, a) } else { (a, b) };
        p.key.dest_qp = qp;
        p
    }

    fn nak(psn: u32, syndrome: u8) -> Parsed {
        let mut p = between(true, 0x22, 0x11, psn);
        p.has_syndrome = true;
        p.aeth_syndrome = syndrome;
        p
    }

    /// Requests (to QP 0x11) and the responder's ACKs/NAKs (to QP 0x22) through one
    /// NAK memory, as the kernel's NAK_PSNS serves both directions: the requests'
    /// flow counters.
    fn requests_and_naks(pkts: &[Parsed]) -> FlowStats {
        let (mut req, mut back) = (FlowStats::default(), FlowStats::default());
        let mut naks = NakSet::default();
        for p in pkts {
            let f = if p.key.dest_qp == 0x11 {
                &mut req
            } else {
                &mut back
            };
            f.record(p, 100, 0, || 0, 12, &mut naks, &mut NoRtt);
        }
        req
    }

    const WRITE_ONLY: u8 = 0x0a;

    #[test]
    fn nak_to_resend_and_recovery_times_on_the_memorys_clock() {
        let w = |psn| between(false, 0x11, WRITE_ONLY, psn);
        // (packet, its time in µs): 1, 2, 4 sent (3 lost), the NAK of 3 at 10 µs, the
        // go-back to 3 at 14 µs, 4 again at 15, then 5 at 19: the recovery took 5 µs.
        // Then silence: a go-back to 5 at 100 µs (a timeout), 6 at 130: 30 µs.
        let pkts = [
            (w(1), 0),
            (w(2), 1),
            (w(4), 2),
            (nak(3, 0x60), 10),
            (w(3), 14),
            (w(4), 15),
            (w(5), 19),
            (w(5), 100),
            (w(6), 130),
        ];
        let (mut req, mut back) = (FlowStats::default(), FlowStats::default());
        let mut naks = NakSet::default();
        for (p, us) in &pkts {
            naks.now_ns = us * 1000;
            let f = if p.key.dest_qp == 0x11 {
                &mut req
            } else {
                &mut back
            };
            f.record(p, 100, 0, || 0, 12, &mut naks, &mut NoRtt);
        }
        assert_eq!((req.nak_resends, req.nak_to_resend_ns), (1, 4_000));
        assert_eq!(
            (req.recoveries, req.recovery_ns, req.recovery_max_us),
            (2, 35_000, 30)
        );
        assert_eq!(req.recovery_start_ns, 0, "no recovery under way");
        assert_eq!((req.retransmit_timeouts, req.retransmitted_packets), (1, 3));
    }

    #[test]
    fn a_resend_after_silence_is_a_timeout_and_one_after_a_nak_is_not() {
        let w = |psn| between(false, 0x11, WRITE_ONLY, psn);
        // 1..=4 sent; silence; the requester goes back to 3: one timeout, 2 packets.
        let st = requests_and_naks(&[w(1), w(2), w(3), w(4), w(3), w(4), w(5)]);
        assert_eq!(
            (
                st.retransmitted_packets,
                st.retransmitted_bytes,
                st.retransmit_timeouts,
                st.psn_gaps
            ),
            (2, 200, 1, 0)
        );
        // 3 lost: 4 arrives, the responder NAKs PSN 3 (sequence error), the requester
        // goes back to 3: no timeout. RNR NAK alike.
        for syndrome in [0x60, 0x21] {
            let st = requests_and_naks(&[w(1), w(2), w(4), nak(3, syndrome), w(3), w(4), w(5)]);
            assert_eq!(
                (
                    st.retransmitted_packets,
                    st.retransmit_timeouts,
                    st.psn_gaps
                ),
                (2, 0, 1),
                "syndrome {syndrome:#x}"
            );
        }
    }

    #[test]
    fn a_nak_answers_one_go_back_to_its_psn_and_no_other() {
        let w = |psn| between(false, 0x11, WRITE_ONLY, psn);
        let st = requests_and_naks(&[
            w(1),
            w(2),
            w(3),
            nak(2, 0x60),
            // The go-back after the NAK, then (the resend lost too) the timeout's.
            w(2),
            w(3),
            w(2),
            w(3),
            w(4),
            // A NAK of PSN 4 does not answer a go-back to 3.
            nak(4, 0x60),
            w(3),
            w(4),
            w(5),
        ]);
        assert_eq!((st.retransmitted_packets, st.retransmit_timeouts), (6, 2));
    }

    #[test]
    fn a_nak_of_other_hosts_or_of_the_same_direction_answers_no_go_back() {
        let w = |psn| between(false, 0x11, WRITE_ONLY, psn);
        // The NAK travels with the requests (a -> b): it is about b's requests.
        let mut wrong_way = nak(2, 0x60);
        (wrong_way.key.src, wrong_way.key.dst) = (wrong_way.key.dst, wrong_way.key.src);
        let st = requests_and_naks(&[w(1), w(2), w(3), wrong_way, w(2), w(3)]);
        assert_eq!(st.retransmit_timeouts, 1);
        // A NAK between other hosts.
        let mut other = nak(2, 0x60);
        other.key.src[3] ^= 0x0100_0000;
        let st = requests_and_naks(&[w(1), w(2), w(3), other, w(2), w(3)]);
        assert_eq!(st.retransmit_timeouts, 1);
    }

    #[test]
    fn reads_use_their_psns_and_a_read_re_issued_within_them_is_resent() {
        let mut read = between(false, 0x11, 0x0c, 10);
        read.read_len = 3 * 4096;
        let w = |psn| between(false, 0x11, WRITE_ONLY, psn);
        // The READ takes PSNs 10..=12 at the default PMTU 4096: 13 is in order, and a
        // READ of the rest re-issued at 12 (its responses lost) is a retransmission.
        let mut rest = between(false, 0x11, 0x0c, 12);
        rest.read_len = 4096;
        let st = requests_and_naks(&[read, w(13), rest, w(14)]);
        assert_eq!(
            (
                st.psn_gaps,
                st.retransmitted_packets,
                st.retransmit_timeouts
            ),
            (0, 1, 1)
        );
    }

    #[test]
    fn merging_two_cpus_that_tracked_requests_marks_the_psn_state_split() {
        let mut one = FlowStats::default();
        let mut other = FlowStats::default();
        // PSNs 1, 2 on one CPU, 3 on the other, 4 on the first again: a false gap there.
        one.record(
            &packet(0x0a, 1, 0x6a),
            60,
            0,
            || 0,
            12,
            &mut NoNaks,
            &mut NoRtt,
        );
        one.record(
            &packet(0x0a, 2, 0x6a),
            60,
            0,
            || 0,
            12,
            &mut NoNaks,
            &mut NoRtt,
        );
        other.record(
            &packet(0x0a, 3, 0x6a),
            60,
            0,
            || 0,
            12,
            &mut NoNaks,
            &mut NoRtt,
        );
        one.record(
            &packet(0x0a, 4, 0x6a),
            60,
            0,
            || 0,
            12,
            &mut NoNaks,
            &mut NoRtt,
        );
        let mut merged = FlowStats::default();
        merged.merge(&one);
        assert!(!merged.psn.split(), "one CPU is not split");
        merged.merge(&other);
        assert!(merged.psn.split());
        assert_eq!((merged.packets, merged.psn_gaps), (4, 1));
        // A CPU that saw only ACKs or CNPs of the flow tracked nothing: not split.
        let mut acks = FlowStats::default();
        acks.record(
            &packet(0x81, 0, 0x6a),
            60,
            0,
            || 0,
            12,
            &mut NoNaks,
            &mut NoRtt,
        );
        let mut merged = FlowStats::default();
        merged.merge(&one);
        merged.merge(&acks);
        assert!(!merged.psn.split());
    }

    #[test]
    fn merge_keeps_newest_dscp_and_sums_counts() {
        let mut a = FlowStats {
            packets: 2,
            bytes: 100,
            last_seen_ns: 10,
            first_seen_ns: 5,
            last_dscp: 26,
            ..Default::default()
        };
        let b = FlowStats {
            packets: 1,
            bytes: 50,
            last_seen_ns: 20,
            first_seen_ns: 3,
            last_dscp: 0,
            ..Default::default()
        };
        a.merge(&b);
        assert_eq!(
            (
                a.packets,
                a.bytes,
                a.first_seen_ns,
                a.last_seen_ns,
                a.last_dscp
            ),
            (3, 150, 3, 20, 0)
        );
    }
}
