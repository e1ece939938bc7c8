//! `xdp_classify`: parse, look up, count. Never drops: always XDP_PASS.

use aya_ebpf::bindings::{xdp_action, BPF_NOEXIST};
use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use aya_ebpf::macros::xdp;
use aya_ebpf::programs::XdpContext;
use roce_common::classify::{classify, Outcome, Parsed};
use roce_common::counters::{stat_indices, STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED};
use roce_common::flow::{FlowKey, FlowStats};

use crate::maps::{bump, runtime_config, FLOWS};
use crate::packet::KernelPacket;

/// A zeroed value to insert new flows with, kept off the 512-byte stack.
static EMPTY_FLOW: FlowStats = unsafe { core::mem::zeroed() };

#[xdp]
pub fn xdp_classify(ctx: XdpContext) -> u32 {
    classify_and_count(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn classify_and_count(ctx: &XdpContext) {
    let cfg = runtime_config();
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    let outcome = classify(&pkt, &cfg);
    let (main, extra) = stat_indices(&outcome);
    bump(main);
    if let Some(e) = extra {
        bump(e);
    }
    if let Outcome::Flow(parsed) = outcome {
        // SAFETY: ctx.ctx points at the kernel's xdp_md for this invocation.
        let ifindex = unsafe { (*ctx.ctx).ingress_ifindex };
        // The program is not multi-buffer aware (no xdp.frags), so the kernel hands it
        // only linear frames and data_end bounds the whole frame. (BPF_PROG_TEST_RUN
        // splits inputs over ~3.5 KB into fragments: `analyze` takes bytes from the capture.)
        let frame_len = (ctx.data_end() - ctx.data()) as u32;
        count_on_flow(&parsed, ifindex, frame_len, cfg.default_pmtu_log2);
    }
}

#[inline(always)]
fn count_on_flow(parsed: &Parsed, ifindex: u32, frame_len: u32, default_pmtu_log2: u8) {
    let mut key: FlowKey = parsed.key;
    key.ifindex = ifindex;
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
    unsafe {
        (*stats).record(
            parsed,
            frame_len,
            bpf_ktime_get_coarse_ns(),
            default_pmtu_log2,
        )
    };
}

/// An empty XDP program: the baseline that benchmarks measure `xdp_classify` against.
#[xdp]
pub fn xdp_baseline(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
