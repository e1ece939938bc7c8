//! CNPs per flow, where every RoCE packet is counted on its flow: arriving (XDP),
//! leaving (tc, as written) and on mirror sessions.
//! - Off the policy's CNP class (the rule: `roce_common::cnp`; a CNP the host policy
//!   moved to the CNP DSCP is not off it).
//! - The ECN -> CNP loop timed (`roce_common::cnp::CnpTimes`): a CE-marked packet
//!   arriving (or in a mirror session's copies) starts the wait of its host pair when
//!   none waits; a CNP leaving (or in the copies) the other way ends it, on the CNP's
//!   flow; every CNP times the one before it on its flow.
//!
//! Only CNPs and CE-marked packets look: the cost of the lookups is theirs.

use aya_ebpf::bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST};
use aya_ebpf::helpers::bpf_ktime_get_ns;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, HashMap, LruHashMap, PerCpuArray};
use roce_common::cnp::{dscp_bit, wrong_class, CnpScratch, CnpTimes, CnpWrongClass};
use roce_common::flow::add;
use roce_common::flow::FlowSlot;
use roce_common::nak::{NakKey, NAK_KEY_FLAGS};
use roce_common::parsed::Parsed;

use crate::maps::{entry_or_insert, generation, hist_add, qos_config};

/// CNPs off the CNP DSCP, by the slot of their flow. The agent deletes a flow's entry
/// when it frees its slot.
#[map]
pub static CNP_WRONG_CLASS: HashMap<u32, CnpWrongClass> =
    HashMap::with_max_entries(CNP_WRONG_CLASS_LEN, BPF_F_NO_PREALLOC);

pub const CNP_WRONG_CLASS_LEN: u32 = 65536;

/// Watches the packet `p` of the flow in slot `slot`, which showed CE (`ce`): a CNP is
/// counted when off the policy's CNP DSCP and timed; `answers`: a CNP here answers
/// marks seen here (it leaves, or the copies hold both directions); `marks`: a mark
/// here waits for one (it arrived). Other packets pay a compare or two. What the work
/// needs goes into CNP_SCRATCH here, and one subprogram takes it from there: the
/// counting programs' stacks have no room for more of their values, nor their
/// subprograms for keys of their own.
///
/// A congested path marks most packets: a flow whose host pair has a mark waiting
/// (as of the last answer: `FlowStats::ce_wait_tag` against CE_ANSWERS) does not look
/// again.
///
/// # Safety
/// `flow` is the live slot of the packet's flow (index `slot`).
#[inline(always)]
pub unsafe fn watch(
    p: &Parsed,
    slot: u32,
    flow: *mut FlowSlot,
    ce: bool,
    scope: u32,
    answers: bool,
    marks: bool,
) {
    let cnp = roce_common::bth::is_cnp(p.bth.opcode);
    if !cnp {
        if !(ce && marks) {
            return;
        }
        let Some(answered) = CE_ANSWERS.get(0) else {
            return;
        };
        let tag = (*answered as u8).wrapping_add(1).max(1);
        // SAFETY: the caller's promise; a byte of the slot, written plainly (two
        // CPUs' marks of one flow may both look, once).
        unsafe {
            if (*flow).stats.ce_wait_tag == tag {
                return;
            }
            (*flow).stats.ce_wait_tag = tag;
        }
    }
    let Some(s) = CNP_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let key = &p.key;
    // The marks a CNP answers travelled the other way.
    let (from, to, inner_from, inner_to) = if cnp {
        (&key.dst, &key.src, &key.inner_dst, &key.inner_src)
    } else {
        (&key.src, &key.dst, &key.inner_src, &key.inner_dst)
    };
    // SAFETY: this CPU's entry, for the length of this program run.
    unsafe {
        let k = &raw mut (*s).pair;
        (*k).requester = *from;
        (*k).responder = *to;
        (*k).inner_requester = *inner_from;
        (*k).inner_responder = *inner_to;
        (*k).vni = key.vni;
        (*k).psn = 0;
        (*k).flags = key.flags & NAK_KEY_FLAGS;
        (*k).scope = scope;
        (*s).slot = slot;
        (*s).opcode = p.bth.opcode;
        (*s).dscp = p.outer_tos >> 2;
        (*s).answers = answers;
    }
    seen(s);
}

/// A CNP or a CE mark, as `watch` left it in this CPU's scratch `s`.
#[inline(never)]
fn seen(s: *mut CnpScratch) {
    // SAFETY: this CPU's scratch (`watch`); the map helpers read keys and values there.
    unsafe {
        if roce_common::bth::is_cnp((*s).opcode) {
            (*s).now_ns = bpf_ktime_get_ns();
            off_class(s);
            timed(s);
        } else if CE_WAIT.get(&(*s).pair).is_none() {
            // A mark: its host pair waits from now, unless one waits already (most
            // marks of a congested path find one: the clock is read for the first),
            // or another CPU's mark of the same pair came first: it stays.
            (*s).now_ns = bpf_ktime_get_ns();
            let _ = CE_WAIT.insert(&(*s).pair, &(*s).now_ns, BPF_NOEXIST as u64);
        }
    }
}

/// Counts the CNP in scratch `s` on its flow when it is off the policy's CNP DSCP.
///
/// # Safety
/// `s` is this CPU's scratch.
#[inline(always)]
unsafe fn off_class(s: *mut CnpScratch) {
    // SAFETY: the caller's promise.
    let (opcode, dscp, slot) = unsafe { ((*s).opcode, (*s).dscp, &(*s).slot) };
    if !wrong_class(opcode, dscp, qos_config(generation()).cnp_dscp) {
        return;
    }
    // The flow's first is made empty, then counted on like any other.
    // SAFETY: as above.
    let Some(c) = entry_or_insert(&CNP_WRONG_CLASS, slot, || Some(unsafe { &(*s).zero })) else {
        return;
    };
    // SAFETY: the flow's entry, shared by all CPUs: the count is added atomically; the
    // DSCP bits are or-ed in plainly (a bit two CPUs set at once on one flow may wait
    // for that flow's next CNP on its DSCP).
    unsafe {
        add(&mut (*c).packets, 1);
        (*c).dscps |= dscp_bit(dscp);
    }
}

/// Times the CNP in scratch `s`: since its flow's last CNP, and when it answers, since
/// the first mark of its host pair that none had answered.
///
/// # Safety
/// `s` is this CPU's scratch.
#[inline(always)]
unsafe fn timed(s: *mut CnpScratch) {
    // SAFETY: the caller's promise.
    let (slot, now) = unsafe { (&(*s).slot, (*s).now_ns) };
    let Some(t) = entry_or_insert(&CNP_TIMES, slot, || CNP_TIMES_ZERO.get(0)) else {
        return;
    };
    // SAFETY: the flow's entry, shared by all CPUs: the histograms add atomically
    // (`hist_add`); the last CNP's time is written plainly (two CPUs' CNPs of one flow
    // at once may time one interval from the other's).
    unsafe {
        let last = (*t).last_cnp_ns;
        (*t).last_cnp_ns = now;
        if last != 0 {
            hist_add(&raw mut (*t).interval, now.saturating_sub(last));
        }
        if !(*s).answers {
            return;
        }
        let pair = &(*s).pair;
        let Some(first) = CE_WAIT.get(pair).copied() else {
            return;
        };
        if CE_WAIT.remove(pair).is_err() {
            // Another CPU's CNP took it.
            return;
        }
        // The flows that knew of a waiting mark look again.
        if let Some(n) = CE_ANSWERS.get_ptr_mut(0) {
            add(&mut *n, 1);
        }
        hist_add(&raw mut (*t).ce_to_cnp, now.saturating_sub(first));
    }
}

/// CE marks waiting for the CNP that answers them: the host pair in the marked
/// packets' direction (`NakKey`, PSN 0) -> when the first mark not answered yet was
/// seen (bpf_ktime_get_ns). An LRU hash: the marks of a notification point that never
/// answers give way to newer ones.
#[map]
pub static CE_WAIT: LruHashMap<NakKey, u64> = LruHashMap::with_max_entries(CE_WAIT_LEN, 0);

pub const CE_WAIT_LEN: u32 = 4096;

/// Waits CNPs answered (one u64): a flow's `ce_wait_tag` holds as long as this stays.
#[map]
pub static CE_ANSWERS: Array<u64> = Array::with_max_entries(1, 0);

/// The CNP flows' times, by FLOW_SLOTS index (the flows that carried a CNP). The agent
/// deletes a flow's entry when it frees its slot.
#[map]
pub static CNP_TIMES: HashMap<u32, CnpTimes> =
    HashMap::with_max_entries(CNP_TIMES_LEN, BPF_F_NO_PREALLOC);

pub const CNP_TIMES_LEN: u32 = 65536;

/// A zeroed entry to copy a flow's first from (larger than the programs' stack).
#[map]
pub static CNP_TIMES_ZERO: Array<CnpTimes> = Array::with_max_entries(1, 0);

/// What the timing hands the map helpers, per CPU (`roce_common::cnp::CnpScratch`):
/// keys and values on the stack of a subprogram would take the programs past their
/// 512 bytes (tc_egress_flows has 488 of its own).
#[map]
pub static CNP_SCRATCH: PerCpuArray<CnpScratch> = PerCpuArray::with_max_entries(1, 0);
