//! Counting one RoCE packet on its flow: shared by `xdp_classify` (ingress) and
//! `tc_egress_flows` (egress), so both directions follow the same counting rules
//! (`FlowStats::record`) and emit the same sampled events (`events.rs`). Plain IPv4
//! flows live in FLOWS4 under the 16-byte key, the others in FLOWS under the wide one.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};
use aya_ebpf::maps::LruPerCpuHashMap;
use roce_common::classify::Parsed;
use roce_common::config::RuntimeConfig;
use roce_common::counters::{STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED};
use roce_common::event::{Trouble, EVENTS_OFF};
use roce_common::flow::{FlowKey, FlowKey4, FlowStats, KEY4_EGRESS, KEY_EGRESS};

use crate::events::{emit, FrameHead};
use crate::maps::{bump, FLOWS, FLOWS4};

/// A zeroed value to insert new flows with, kept off the 512-byte stack.
static EMPTY_FLOW: FlowStats = unsafe { core::mem::zeroed() };

/// Counts `parsed` (a frame of `frame_len` bytes) on the flow of its key seen on
/// `ifindex`, on egress when `egress`, then writes the events the packet calls for
/// (`events::emit`).
#[inline(always)]
pub fn count_on_flow<C: FrameHead>(
    ctx: &C,
    parsed: &Parsed,
    ifindex: u32,
    egress: bool,
    frame_len: u32,
    cfg: &RuntimeConfig,
) {
    // Plain IPv4: no flag set by the classifier.
    if parsed.key.flags == 0 {
        let key = FlowKey4 {
            src: parsed.key.src[3],
            dst: parsed.key.dst[3],
            qp_dir: parsed.key.dest_qp | if egress { KEY4_EGRESS } else { 0 },
            ifindex,
        };
        let Some(stats) = flow_entry(&FLOWS4, &key) else {
            return;
        };
        // SAFETY: a per-CPU value of this CPU.
        let trouble = unsafe { record(stats, parsed, frame_len, cfg) };
        if !trouble.is_none() && cfg.events_sample != EVENTS_OFF {
            // The wide key is built only for an event kept by the sampling.
            emit(
                ctx,
                trouble,
                &|| key.widen(),
                parsed,
                frame_len,
                cfg.events_sample,
            );
        }
    } else {
        let mut key: FlowKey = parsed.key;
        key.ifindex = ifindex;
        if egress {
            key.flags |= KEY_EGRESS;
        }
        let Some(stats) = flow_entry(&FLOWS, &key) else {
            return;
        };
        // SAFETY: as above.
        let trouble = unsafe { record(stats, parsed, frame_len, cfg) };
        if !trouble.is_none() && cfg.events_sample != EVENTS_OFF {
            emit(ctx, trouble, &|| key, parsed, frame_len, cfg.events_sample);
        }
    }
}

/// This CPU's value of `key`'s flow in `map`, inserted zeroed when new.
#[inline(always)]
fn flow_entry<K>(map: &LruPerCpuHashMap<K, FlowStats>, key: &K) -> Option<*mut FlowStats> {
    if let Some(s) = map.get_ptr_mut(key) {
        return Some(s);
    }
    if map.insert(key, &EMPTY_FLOW, BPF_NOEXIST as u64).is_ok() {
        bump(STAT_FLOW_CREATED);
    }
    let s = map.get_ptr_mut(key);
    if s.is_none() {
        bump(STAT_FLOW_INSERT_FAILED);
    }
    s
}

/// Counts on a flow's value; first/last seen from the coarse clock (ms resolution is
/// plenty).
///
/// # Safety
/// `stats` is this CPU's value of a per-CPU map, valid for this program run.
#[inline(always)]
unsafe fn record(
    stats: *mut FlowStats,
    parsed: &Parsed,
    frame_len: u32,
    cfg: &RuntimeConfig,
) -> Trouble {
    // SAFETY: the caller's promise; the clock helpers take no arguments. The
    // verifier inlines bpf_jiffies64 (a load); the coarse clock is a real call, made
    // only when the tick moved.
    unsafe {
        (*stats).record(
            parsed,
            frame_len,
            bpf_jiffies64() as u32,
            || bpf_ktime_get_coarse_ns(),
            cfg.default_pmtu_log2,
        )
    }
}
