//! Loss in the fabric or in the capture, live on mirror sessions (the rule:
//! `roce_common::gaps`). A mirror port is a capture point: a PSN gap of a mirrored
//! flow waits in CAPTURE_GAP_WAIT under its host pair and mirroring device until a
//! resend or NAK of a missing PSN (the fabric lost it: forgotten) or a response that
//! covers it (the copies lost it: counted in CAPTURE_GAPS on the flow's slot) decides
//! it. One gap waits per host pair and session: a newer gap takes an older one's place,
//! which stays undecided and is counted so (STAT_CAPTURE_GAPS_UNDECIDED; `analyze`,
//! with the whole capture at hand, keeps many).

use aya_ebpf::bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST};
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, HashMap, LruHashMap};
use roce_common::counters::STAT_CAPTURE_GAPS_UNDECIDED;
use roce_common::flow::{add, FlowSlot};
use roce_common::gaps::{
    decides, pair_of_request, pair_of_response, resend_decides, response_verdict, GapWait, Verdict,
};
use roce_common::nak::NakKey;
use roce_common::parsed::Parsed;

use crate::maps::{bump, FLOW_SLOTS};

#[map]
pub static CAPTURE_GAP_WAIT: LruHashMap<NakKey, GapWait> =
    LruHashMap::with_max_entries(CAPTURE_GAP_WAIT_LEN, 0);

pub const CAPTURE_GAP_WAIT_LEN: u32 = 4096;

/// At least as many as the gaps in CAPTURE_GAP_WAIT (the LRU's evictions are not
/// taken away): while it is 0, a mirrored response looks for none.
#[map]
pub static CAPTURE_GAP_WAITING: Array<u64> = Array::with_max_entries(1, 0);

/// Gaps the capture lost, by the slot of their request flow. The agent deletes a
/// flow's entry when it frees its slot.
#[map]
pub static CAPTURE_GAPS: HashMap<u32, u64> =
    HashMap::with_max_entries(CAPTURE_GAPS_LEN, BPF_F_NO_PREALLOC);

pub const CAPTURE_GAPS_LEN: u32 = 65536;

/// A mirrored flow's state before its packet `p` was counted: the PSN it expected and
/// the retransmissions it had.
#[derive(Clone, Copy)]
pub struct Before {
    pub next_psn: u32,
    pub retransmitted: u64,
}

impl Before {
    /// # Safety
    /// `slot` is a live slot of FLOW_SLOTS.
    #[inline(always)]
    pub unsafe fn of(slot: *const FlowSlot) -> Before {
        // SAFETY: the caller's promise; plain reads (another CPU counting on the flow
        // meanwhile makes this packet's verdict one packet late, or none).
        unsafe {
            Before {
                next_psn: (*slot).stats.psn.next,
                retransmitted: (*slot).stats.retransmitted_packets,
            }
        }
    }
}

/// What the mirrored packet `p`, counted on the flow in slot `index` (`slot`), says
/// about the gaps of its host pair: `gap` when it showed one itself.
///
/// # Safety
/// `slot` is a live slot of FLOW_SLOTS.
#[inline(always)]
pub unsafe fn watch(
    p: &Parsed,
    scope: u32,
    index: u32,
    slot: *const FlowSlot,
    before: Before,
    gap: bool,
) {
    if gap {
        let wait = GapWait {
            slot: index,
            first: before.next_psn,
            end: p.bth.psn,
        };
        remember(&pair_of_request(p, scope), &wait);
        return;
    }
    let Some(waiting) = CAPTURE_GAP_WAITING.get(0) else {
        return;
    };
    if *waiting == 0 {
        return;
    }
    // SAFETY: the caller's promise.
    let resent = unsafe { (*slot).stats.retransmitted_packets } != before.retransmitted;
    if resent {
        resend(&pair_of_request(p, scope), index, p.bth.psn);
    } else if let Some(verdict) = response_verdict(p) {
        respond(&pair_of_response(p, scope), verdict, p.bth.psn);
    }
}

/// Keeps the gap `wait` under `pair`, in the place of one waiting there (which is
/// then left undecided).
#[inline(never)]
fn remember(pair: &NakKey, wait: &GapWait) {
    // SAFETY: a copy of the value out of the map.
    let replaces = unsafe { CAPTURE_GAP_WAIT.get(pair) }.is_some();
    if CAPTURE_GAP_WAIT.insert(pair, wait, 0).is_err() {
        return;
    }
    if replaces {
        bump(STAT_CAPTURE_GAPS_UNDECIDED);
    } else {
        count_waiting(1);
    }
}

/// The request flow in slot `index` resent `psn`: the gap waiting under `pair`, if
/// it is that flow's and misses `psn`, was the fabric's.
#[inline(never)]
fn resend(pair: &NakKey, index: u32, psn: u32) {
    // SAFETY: a copy of the value out of the map.
    let Some(g) = (unsafe { CAPTURE_GAP_WAIT.get(pair).copied() }) else {
        return;
    };
    if g.slot == index && resend_decides(psn, g.first, g.end) {
        forget(pair);
    }
}

/// A response at `psn` saying `verdict` between the hosts of `pair`.
#[inline(never)]
fn respond(pair: &NakKey, verdict: Verdict, psn: u32) {
    // SAFETY: a copy of the value out of the map.
    let Some(g) = (unsafe { CAPTURE_GAP_WAIT.get(pair).copied() }) else {
        return;
    };
    let Some(flow) = FLOW_SLOTS.get_ptr_mut(g.slot) else {
        return;
    };
    // SAFETY: a slot of FLOW_SLOTS; a plain read, as in `Before::of`.
    let next = unsafe { (*flow).stats.psn.next };
    if !decides(verdict, psn, g.first, g.end, next) || !forget(pair) {
        return;
    }
    if verdict == Verdict::Capture {
        count_capture_gap(g.slot);
    }
}

/// Takes the gap under `pair` away: false when another CPU took it first.
#[inline(always)]
fn forget(pair: &NakKey) -> bool {
    if CAPTURE_GAP_WAIT.remove(pair).is_err() {
        return false;
    }
    count_waiting(u64::MAX);
    true
}

#[inline(always)]
fn count_waiting(n: u64) {
    if let Some(w) = CAPTURE_GAP_WAITING.get_ptr_mut(0) {
        // SAFETY: the map's one value, shared by all CPUs: added to atomically.
        unsafe { add(&mut *w, n) };
    }
}

#[inline(always)]
fn count_capture_gap(slot: u32) {
    if let Some(n) = CAPTURE_GAPS.get_ptr_mut(&slot) {
        // SAFETY: the flow's entry, shared by all CPUs: added to atomically.
        unsafe { add(&mut *n, 1) };
        return;
    }
    if CAPTURE_GAPS.insert(&slot, &1, BPF_NOEXIST as u64).is_err() {
        // Another CPU made it meanwhile.
        if let Some(n) = CAPTURE_GAPS.get_ptr_mut(&slot) {
            // SAFETY: as above.
            unsafe { add(&mut *n, 1) };
        }
    }
}
