//! Counting one RoCE packet on its flow in FLOWS: shared by `xdp_classify` (ingress)
//! and `tc_egress` (egress), so both directions follow the same counting rules
//! (`FlowStats::record`) and emit the same sampled events (`events.rs`).

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use roce_common::classify::Parsed;
use roce_common::config::RuntimeConfig;
use roce_common::counters::{STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED};
use roce_common::flow::{FlowKey, FlowStats};

use crate::events::{emit, FrameHead};
use crate::maps::{bump, FLOWS};

/// A zeroed value to insert new flows with, kept off the 512-byte stack.
static EMPTY_FLOW: FlowStats = unsafe { core::mem::zeroed() };

/// Counts `parsed` (a frame of `frame_len` bytes) on the flow of its key seen on
/// `ifindex`, with `direction` (0 or `KEY_EGRESS`) added to the key's flags, then
/// writes the events the packet calls for (`events::emit`).
#[inline(always)]
pub fn count_on_flow<C: FrameHead>(
    ctx: &C,
    parsed: &Parsed,
    ifindex: u32,
    direction: u32,
    frame_len: u32,
    cfg: &RuntimeConfig,
) {
    let mut key: FlowKey = parsed.key;
    key.ifindex = ifindex;
    key.flags |= direction;
    let stats = match FLOWS.get_ptr_mut(&key) {
        Some(s) => s,
        None => {
            if FLOWS.insert(&key, &EMPTY_FLOW, BPF_NOEXIST as u64).is_ok() {
                bump(STAT_FLOW_CREATED);
            }
            match FLOWS.get_ptr_mut(&key) {
                Some(s) => s,
                None => {
                    bump(STAT_FLOW_INSERT_FAILED);
                    return;
                }
            }
        }
    };
    // SAFETY: a per-CPU value of this CPU; coarse clock (ms resolution is plenty, and cheap).
    let trouble = unsafe {
        (*stats).record(
            parsed,
            frame_len,
            bpf_ktime_get_coarse_ns(),
            cfg.default_pmtu_log2,
        )
    };
    if !trouble.is_none() {
        emit(ctx, trouble, &key, parsed, frame_len, cfg.events_sample);
    }
}
