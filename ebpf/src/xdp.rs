//! `xdp_classify`: parse, look up, count. Never drops: always XDP_PASS.

use aya_ebpf::bindings::xdp_action;
use aya_ebpf::macros::xdp;
use aya_ebpf::programs::XdpContext;
use roce_common::classify::{classify_into, NotFlowSink};
use roce_common::counters::stat_indices;
use roce_common::parsed::Outcome;

use crate::flow::{count_on_flow, hidden_from_compiler};
use crate::maps::{bump, generation, runtime_config};
use crate::packet::KernelPacket;

#[xdp]
pub fn xdp_classify(ctx: XdpContext) -> u32 {
    classify_and_count(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn classify_and_count(ctx: &XdpContext) {
    let cfg = runtime_config(generation());
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    // Frames that are not flows are counted where their walk ends, and leave here.
    let outcome = classify_into(&pkt, &cfg, &mut StatsSink);
    let Outcome::Flow(parsed) = outcome else {
        return;
    };
    let (main, extra) = stat_indices(&outcome);
    bump(main);
    if let Some(e) = extra {
        bump(e);
    }
    // SAFETY: ctx.ctx points at the kernel's xdp_md for this invocation.
    let ifindex = unsafe { (*ctx.ctx).ingress_ifindex };
    // The program is not multi-buffer aware (no xdp.frags), so the kernel hands it
    // only linear frames and data_end bounds the whole frame. (BPF_PROG_TEST_RUN
    // splits inputs over ~3.5 KB into fragments: `analyze` takes bytes from the capture.)
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    let parsed = hidden_from_compiler(parsed);
    count_on_flow(ctx, &parsed, ifindex, false, frame_len, &cfg);
}

/// Frames that are not flows count in STATS where their walk ends.
struct StatsSink;

impl NotFlowSink for StatsSink {
    #[inline(always)]
    fn not_flow(&mut self, outcome: &Outcome) {
        bump(stat_indices(outcome).0);
    }
}

/// An empty XDP program: the baseline that benchmarks measure `xdp_classify` against.
#[xdp]
pub fn xdp_baseline(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
