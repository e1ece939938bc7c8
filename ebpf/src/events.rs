//! Sampled events into the EVENTS ring buffer (`roce_common::event`): after a packet
//! was counted on its flow, each kind of trouble it showed is kept 1 in
//! `events_sample` times per CPU, within the per-CPU rate limit, and written straight
//! into reserved ring memory (no record on the stack). The clean path costs one test
//! of `Trouble` in `flow.rs`.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use aya_ebpf::helpers::generated::{bpf_skb_load_bytes, bpf_xdp_load_bytes};
use aya_ebpf::macros::map;
use aya_ebpf::maps::{PerCpuArray, RingBuf};
use aya_ebpf::programs::{TcContext, XdpContext};
use roce_common::counters::{
    event_index, STAT_EVENTS_DROPPED_RATE_LIMIT, STAT_EVENTS_DROPPED_RING_FULL,
};
use roce_common::event::{
    captured_len, EventRecord, Trouble, EVENTS_OFF, EVENTS_PER_CPU_PER_WINDOW, EVENTS_RING_BYTES,
    EVENT_CE, EVENT_KIND_COUNT, EVENT_NONE, EVENT_PACKET_BYTES, EVENT_WINDOW_NS,
};
use roce_common::key::FlowKey;
use roce_common::parsed::Parsed;

use crate::kernel::{coarse_ns, has_xdp_load_bytes};
use crate::maps::bump;
use crate::packet::KernelPacket;

/// Sampled events for the agent. The agent sizes it before loading.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Per CPU: the sampling countdowns and the rate limit's window.
#[map]
pub static EVENT_BUDGET: PerCpuArray<EventBudget> = PerCpuArray::with_max_entries(1, 0);

/// One CPU's sampling and rate-limit state.
#[repr(C)]
pub struct EventBudget {
    /// Per kind: events still to leave out before the next one is kept (1 in N).
    skip: [u32; EVENT_KIND_COUNT],
    /// Events kept in the current window.
    window_count: u32,
    /// Start of the current window (`kernel::coarse_ns`).
    window_start_ns: u64,
}

/// Where the first bytes of the frame come from: the program's context.
pub trait FrameHead {
    /// Copies the first `len` (1..=128) bytes of the frame to `to`; false on failure.
    fn copy_head(&self, to: *mut u8, len: u32) -> bool;
}

impl FrameHead for XdpContext {
    #[inline(always)]
    fn copy_head(&self, to: *mut u8, len: u32) -> bool {
        if !has_xdp_load_bytes() {
            // Before 5.18: from packet memory, which holds the whole frame (the program
            // is not multi-buffer aware).
            return KernelPacket::new(self.data(), self.data_end()).copy_head(to, len as usize);
        }
        // SAFETY: `to` is reserved ring memory of at least EVENT_PACKET_BYTES >= len.
        unsafe { bpf_xdp_load_bytes(self.ctx, 0, to.cast(), len) == 0 }
    }
}

impl FrameHead for TcContext {
    #[inline(always)]
    fn copy_head(&self, to: *mut u8, len: u32) -> bool {
        // SAFETY: as above; bpf_skb_load_bytes reads non-linear data too.
        unsafe { bpf_skb_load_bytes(self.skb.skb as *const _, 0, to.cast(), len) == 0 }
    }
}

/// The events of one packet counted on its flow: its CE event and its opcode-kind
/// event, each sampled and rate-limited on its own.
///
/// `key` makes the flow key only for an event that is kept, since building it for
/// every packet costs the CE path.
///
/// Inlined: as a BPF subprogram it would need the packet's fields passed through the
/// stack (five arguments at most), which brings `xdp_classify` to the 512-byte stack
/// limit, and it would verify no faster.
#[inline(always)]
pub fn emit<C: FrameHead, K: Fn() -> FlowKey>(
    ctx: &C,
    trouble: Trouble,
    key: &K,
    parsed: &Parsed,
    frame_len: u32,
    sample: u32,
) {
    if sample == EVENTS_OFF {
        return;
    }
    if trouble.ce {
        emit_one(ctx, EVENT_CE, key, parsed, frame_len, sample, 0);
    }
    if trouble.kind != EVENT_NONE {
        emit_one(
            ctx,
            trouble.kind,
            key,
            parsed,
            frame_len,
            sample,
            trouble.rtt_us,
        );
    }
}

#[inline(always)]
fn emit_one<C: FrameHead, K: Fn() -> FlowKey>(
    ctx: &C,
    kind: u8,
    key: &K,
    parsed: &Parsed,
    frame_len: u32,
    sample: u32,
    rtt_us: u32,
) {
    let Some(budget) = EVENT_BUDGET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's entry, touched by nothing else while this program runs.
    let budget = unsafe { &mut *budget };
    let Some(skip) = budget.skip.get_mut(kind as usize) else {
        return;
    };
    // 1 in `sample`: a countdown per kind. A countdown left from a larger `sample`
    // (the agent lowered it) restarts at once.
    if *skip != 0 && *skip < sample {
        *skip -= 1;
        return;
    }
    *skip = sample - 1;
    // The rate limit: at most EVENTS_PER_CPU_PER_WINDOW per window on this CPU.
    let now = coarse_ns();
    if now.wrapping_sub(budget.window_start_ns) >= EVENT_WINDOW_NS {
        budget.window_start_ns = now;
        budget.window_count = 0;
    }
    if budget.window_count >= EVENTS_PER_CPU_PER_WINDOW {
        bump(STAT_EVENTS_DROPPED_RATE_LIMIT);
        return;
    }
    budget.window_count += 1;
    let Some(mut entry) = EVENTS.reserve::<EventRecord>(0) else {
        bump(STAT_EVENTS_DROPPED_RING_FULL);
        return;
    };
    let rec = entry.as_mut_ptr();
    let len = captured_len(frame_len);
    // SAFETY: `rec` is reserved ring memory of size_of::<EventRecord>(), ours until
    // submitted; every field is written before it is.
    unsafe {
        (*rec).ts_ns = bpf_ktime_get_ns();
        (*rec).key = key();
        (*rec).psn = parsed.bth.psn;
        (*rec).frame_len = frame_len;
        (*rec).sample = sample;
        (*rec).sport = parsed.sport;
        (*rec).kind = kind;
        (*rec).opcode = parsed.bth.opcode;
        (*rec).outer_tos = parsed.outer_tos;
        (*rec).inner_tos = parsed.inner_tos;
        (*rec)._pad = 0;
        (*rec).rtt_us = rtt_us;
        // 1..=128 in a form the verifier bounds (a `len != 0` test alone it lost).
        let n = (len.wrapping_sub(1) & (EVENT_PACKET_BYTES as u32 - 1)) + 1;
        let copied = len != 0 && ctx.copy_head((*rec).packet.as_mut_ptr(), n);
        (*rec).captured = if copied { n as u8 } else { 0 };
    }
    entry.submit(0);
    bump(event_index(kind));
}
