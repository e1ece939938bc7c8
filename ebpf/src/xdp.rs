//! `xdp_classify`: parse, look up, count. Never drops: always XDP_PASS.

use aya_ebpf::bindings::xdp_action;
use aya_ebpf::helpers::bpf_xdp_adjust_head;
use aya_ebpf::macros::xdp;
use aya_ebpf::programs::XdpContext;
use roce_common::classify::{
    classify_from_into, classify_into, mirror_start, MirrorStart, NotFlowSink,
};
use roce_common::counters::{class_index, stat_indices, STAT_FLOW_INSERT_FAILED};
use roce_common::mirror::{MirrorScratch, MirrorTag};
use roce_common::packet::Packet as _;
use roce_common::parsed::{Class, CountScratch, Outcome, Parsed};
use roce_common::wire::ETH_HLEN;

use crate::flow::count_on_flow;
use crate::maps::{
    bump, generation, runtime_config, COUNT_SCRATCH, MIRROR_SCRATCH, XDP_TAIL, XDP_TAIL_CLASSIFY,
    XDP_TAIL_COUNT, XDP_TAIL_COUNT_MIRROR, XDP_TAIL_MIRROR_FLOWS,
};
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
    // The program is not multi-buffer aware (no xdp.frags), so the kernel hands it
    // only linear frames and data_end bounds the whole frame. (BPF_PROG_TEST_RUN
    // splits inputs over ~3.5 KB into fragments: `analyze` takes bytes from the capture.)
    let frame_len = || (ctx.data_end() - ctx.data()) as u32;
    hand_to_count(ctx, &outcome, parsed, frame_len, XDP_TAIL_COUNT);
}

/// Counts the class of a RoCE packet (`outcome`, whose flow is `parsed`) and hands it,
/// through COUNT_SCRATCH, to the counting program in XDP_TAIL's `slot`. `frame_len` is
/// read after the class is counted (earlier, it cost the verifier 3,000 instructions).
#[inline(always)]
fn hand_to_count(
    ctx: &XdpContext,
    outcome: &Outcome,
    parsed: Parsed,
    frame_len: impl FnOnce() -> u32,
    slot: u32,
) {
    let (main, extra) = stat_indices(outcome);
    bump(main);
    if let Some(e) = extra {
        bump(e);
    }
    // SAFETY: ctx.ctx points at the kernel's xdp_md for this invocation.
    let ifindex = unsafe { (*ctx.ctx).ingress_ifindex };
    let frame_len = frame_len();
    let Some(scratch) = COUNT_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's entry, read by the program tail-called next on this CPU.
    unsafe {
        *scratch = CountScratch {
            parsed,
            ifindex,
            frame_len,
        }
    };
    // SAFETY: XDP_TAIL holds XDP programs only (the agent fills it); the call returns
    // only when the slot is empty: the packet is not counted on a flow.
    let _ = unsafe { XDP_TAIL.tail_call(ctx, slot) };
    bump(STAT_FLOW_INSERT_FAILED);
}

/// Counts the packet COUNT_SCRATCH holds on its flow (of the session `mirror` when a
/// mirror copy).
#[inline(always)]
fn count_scratched(ctx: &XdpContext, mirror: Option<&MirrorTag>) {
    let Some(scratch) = COUNT_SCRATCH.get(0) else {
        return;
    };
    let cfg = runtime_config(generation());
    count_on_flow(
        ctx,
        &scratch.parsed,
        scratch.ifindex,
        false,
        scratch.frame_len,
        &cfg,
        mirror,
    );
}

/// The second step of `xdp_classify` for a RoCE packet: counts it on its flow, as
/// COUNT_SCRATCH says it is.
#[xdp]
pub fn xdp_count(ctx: XdpContext) -> u32 {
    count_scratched(&ctx, None);
    xdp_action::XDP_PASS
}

/// `xdp_classify` of mirror collector interfaces (`run --mirror`): GRE (transparent
/// Ethernet bridging) and ERSPAN II/III copies are decapsulated and the mirrored
/// packet counted on its flow, keyed also by its session (FLOWS_MIRROR) and with its
/// original length; every other frame is counted as `xdp_classify` counts it.
/// Programs of their own, so that `xdp_classify` pays nothing for mirrors: this one
/// finds whether a frame is a copy and where its mirrored frame starts, then
/// tail-calls `xdp_mirror_flows` for a copy and `xdp_classify` for any other frame
/// (one program holding the decapsulation and the walk took the verifier past its
/// limit).
#[xdp]
pub fn xdp_mirror(ctx: XdpContext) -> u32 {
    start_mirror(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn start_mirror(ctx: &XdpContext) {
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    let c = match mirror_start(&pkt) {
        MirrorStart::Copy(c, end) => (c, end),
        MirrorStart::End(outcome) => {
            bump(stat_indices(&outcome).0);
            return;
        }
        // Not a copy: `xdp_classify` counts it, as on any other interface.
        MirrorStart::Frame => {
            // SAFETY: XDP_TAIL holds XDP programs only (the agent fills it); the call
            // returns only when the slot is empty.
            let _ = unsafe { XDP_TAIL.tail_call(ctx, XDP_TAIL_CLASSIFY) };
            return;
        }
    };
    let (copy, end) = c;
    // The kernel moves the packet's start only where an Ethernet header's worth is
    // left; a shorter mirrored frame is what the walk would make of it: cut short.
    if pkt.len() < copy.eth + ETH_HLEN {
        bump(class_index(Class::MirrorTruncated));
        return;
    }
    let Some(slot) = MIRROR_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let eth = copy.eth as i32;
    // SAFETY: this CPU's entry, read by the program tail-called next on this CPU.
    unsafe {
        *slot = MirrorScratch {
            tag: copy.tag,
            eth: copy.eth as u32,
            // The mirrored frame's end, from its own first byte.
            end: (end - copy.eth) as u32,
            truncated: copy.truncated as u32,
        }
    };
    // The mirrored frame becomes the packet: `xdp_mirror_flows` walks it from offset
    // 0 as `xdp_classify` walks a frame (constant offsets, which the verifier follows
    // with far less work than offsets from a variable start), and moves the start
    // back when done: the bytes are never written, the packet leaves as it came.
    // SAFETY: ctx.ctx is this invocation's xdp_md; eth lies inside the frame.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, eth) } != 0 {
        return;
    }
    // SAFETY: as above.
    let _ = unsafe { XDP_TAIL.tail_call(ctx, XDP_TAIL_MIRROR_FLOWS) };
    restore_head(ctx, eth);
}

/// Moves the packet's start back by `eth` bytes, to where `xdp_mirror` found it.
#[inline(always)]
fn restore_head(ctx: &XdpContext, eth: i32) {
    // SAFETY: ctx.ctx is this invocation's xdp_md; the same bytes as before the move,
    // which nothing wrote.
    let _ = unsafe { bpf_xdp_adjust_head(ctx.ctx, -eth) };
}

/// The second step of `xdp_mirror` for a mirror copy: walks its mirrored frame (moved
/// to the packet's start) and hands a RoCE packet to `xdp_count_mirror`, which counts
/// it and moves the packet's start back; every other frame's start moves back here.
#[xdp]
pub fn xdp_mirror_flows(ctx: XdpContext) -> u32 {
    let Some(scratch) = MIRROR_SCRATCH.get(0).copied() else {
        return xdp_action::XDP_PASS;
    };
    walk_mirrored(&ctx, &scratch);
    restore_head(&ctx, scratch.eth as i32);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn walk_mirrored(ctx: &XdpContext, scratch: &MirrorScratch) {
    let cfg = runtime_config(generation());
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    let (outcome, wire_len) =
        classify_from_into(&pkt, &cfg, (0, scratch.end as usize, true), &mut StatsSink);
    let Outcome::Flow(parsed) = outcome else {
        return;
    };
    // A copy counts the mirrored frame as it was sent, however much was kept.
    hand_to_count(ctx, &outcome, parsed, || wire_len, XDP_TAIL_COUNT_MIRROR);
}

/// The last step of `xdp_mirror` for a mirrored RoCE packet: counts it on its
/// session's flow, as COUNT_SCRATCH and MIRROR_SCRATCH say, then moves the packet's
/// start back to where `xdp_mirror` found it. A program of its own for the verifier,
/// as `xdp_count` is: with round trips sampled, the walk and the count together took
/// it past what older kernels accept.
#[xdp]
pub fn xdp_count_mirror(ctx: XdpContext) -> u32 {
    let Some(mirror) = MIRROR_SCRATCH.get(0).copied() else {
        return xdp_action::XDP_PASS;
    };
    count_scratched(&ctx, Some(&mirror.tag));
    restore_head(&ctx, mirror.eth as i32);
    xdp_action::XDP_PASS
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
