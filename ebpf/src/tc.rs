//! The tc programs: `tc_egress` (host DSCP policy, VTEP inner->outer propagation, skb
//! priority, and the egress RoCE flows of the `--iface` interfaces) and `tc_ingress`
//! (decapsulation-side checks), and `tc_egress_flows`, which `tc_egress` tail-calls to
//! count the flow. The decision is `roce_common::policy`; this file only
//! reads the maps, makes the headers readable, writes what the decision says and
//! counts it. Never drops: every path returns TC_NEXT, so later programs on the hook
//! still run.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::macros::classifier;
use aya_ebpf::programs::TcContext;
use roce_common::classify::classify;
use roce_common::counters::{STAT_TC_PULL_FAILED, STAT_TC_WRITE_FAILED};
use roce_common::packet::Packet;
use roce_common::parsed::Outcome;
use roce_common::policy::{
    action_stats, csum_replace16, decap_check, decap_stats, decide, tos_word, Action, VtepStats,
};

use crate::flow::count_on_flow;
use crate::maps::{
    bump, generation, iface_qos, qos_config, runtime_config, PolicyMap, TC_TAIL,
    TC_TAIL_EGRESS_FLOWS, VTEPS,
};
use crate::packet::KernelPacket;

/// TCX_NEXT, which is also TC_ACT_UNSPEC for clsact direct-action filters: "carry on
/// with the next program, then the default action". TC_ACT_OK would end a TCX chain.
pub const TC_NEXT: i32 = -1;

/// Bytes made linear before parsing: the deepest header the policy reads (two VLAN
/// tags, IPv6 / UDP / VXLAN / Ethernet / IPv6 / UDP / BTH, room for extension headers).
const PULL_LEN: u32 = 256;

static EMPTY_VTEP: VtepStats = unsafe { core::mem::zeroed() };

#[classifier]
pub fn tc_egress(ctx: TcContext) -> i32 {
    egress(&ctx);
    TC_NEXT
}

/// The egress flows: `tc_egress` tail-calls it for a RoCE frame leaving an `--iface`
/// interface (after its rewrite). A program of its own so that the verifier checks the
/// flow counting and its events apart from the policy: in one program each path
/// through the decision's walk would multiply those through the flow's, close to the
/// verifier's 1M-instruction limit.
#[classifier]
pub fn tc_egress_flows(ctx: TcContext) -> i32 {
    count_egress(&ctx);
    TC_NEXT
}

#[classifier]
pub fn tc_ingress(ctx: TcContext) -> i32 {
    ingress(&ctx);
    TC_NEXT
}

/// An empty tc program: the baseline that benchmarks measure the others against.
#[classifier]
pub fn tc_baseline(_ctx: TcContext) -> i32 {
    TC_NEXT
}

#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: ctx.skb.skb is the kernel's __sk_buff for this invocation.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Makes the first PULL_LEN bytes (or the whole packet when shorter) linear.
#[inline(always)]
fn pull_headers(ctx: &TcContext) -> bool {
    let len = ctx.len();
    let want = if len < PULL_LEN { len } else { PULL_LEN };
    if ctx.data_end() - ctx.data() >= want as usize {
        return true;
    }
    if ctx.pull_data(want).is_ok() {
        return true;
    }
    bump(STAT_TC_PULL_FAILED);
    false
}

#[inline(always)]
fn egress(ctx: &TcContext) {
    let ifindex = ifindex(ctx);
    let Some(iface) = iface_qos(ifindex) else {
        return;
    };
    if !pull_headers(ctx) {
        return;
    }
    // One generation for the whole decision: a policy switch never splits it.
    let generation = generation();
    let cfg = runtime_config(generation);
    let qos = qos_config(generation);
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    let action = decide(&pkt, &cfg, &qos, &PolicyMap { generation }, &iface);
    if action.writes() && write_tos(&pkt, &action).is_none() {
        bump(STAT_TC_WRITE_FAILED);
    }
    if let Some(prio) = action.sets_priority() {
        // SAFETY: tc programs may write __sk_buff.priority.
        unsafe { (*ctx.skb.skb).priority = prio };
    }
    for s in action_stats(&action).into_iter().flatten() {
        bump(s);
    }
    if action.roce && iface.counts_flows() {
        // SAFETY: the context of this program, passed on as the kernel expects. On
        // success it does not return: tc_egress_flows returns TC_NEXT in its place;
        // should the slot be empty, the frame just goes on uncounted.
        unsafe { TC_TAIL.tail_call(ctx, TC_TAIL_EGRESS_FLOWS) };
    }
}

/// Counts a RoCE frame leaving an `--iface` interface on its egress flow. It walks
/// the frame after `tc_egress` wrote it: the flow counts what leaves the wire (the
/// outer TOS as written, so `last_dscp` is the DSCP the host really sends).
#[inline(always)]
fn count_egress(ctx: &TcContext) {
    let cfg = runtime_config(generation());
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    if let Outcome::Flow(parsed) = classify(&pkt, &cfg) {
        // skb->len: the whole frame from the Ethernet header on, linear or not.
        count_on_flow(ctx, &parsed, ifindex(ctx), true, ctx.len(), &cfg, None);
    }
}

/// Writes the new TOS / traffic class in place; for IPv4 the header checksum follows
/// (RFC 1624, `csum_replace16`). Nothing else changes: length, UDP checksum and ICRC
/// stay. Direct writes (no helper calls): the headers are linear after `pull_headers`.
#[inline(always)]
fn write_tos(pkt: &KernelPacket, a: &Action) -> Option<()> {
    let b0 = pkt.u8_at(a.l3)?;
    let b1 = pkt.u8_at(a.l3 + 1)?;
    let old = u16::from_be_bytes([b0, b1]);
    let new = tos_word(b0, b1, a.v6, a.new_tos);
    if !a.v6 {
        let check = pkt.be16_at(a.l3 + 10)?;
        pkt.store::<u16>(a.l3 + 10, csum_replace16(check, old, new).to_be())?;
    }
    pkt.store::<u16>(a.l3, new.to_be())
}

#[inline(always)]
fn ingress(ctx: &TcContext) {
    let Some(iface) = iface_qos(ifindex(ctx)) else {
        return;
    };
    if iface.vtep == 0 || !pull_headers(ctx) {
        return;
    }
    let generation = generation();
    let cfg = runtime_config(generation);
    let pkt = KernelPacket::new(ctx.data(), ctx.data_end());
    let Some(check) = decap_check(&pkt, &cfg, &PolicyMap { generation }) else {
        return;
    };
    for s in decap_stats(&check).into_iter().flatten() {
        bump(s);
    }
    let stats = match VTEPS.get_ptr_mut(&check.remote) {
        Some(s) => s,
        None => {
            let _ = VTEPS.insert(&check.remote, &EMPTY_VTEP, BPF_NOEXIST as u64);
            match VTEPS.get_ptr_mut(&check.remote) {
                Some(s) => s,
                None => return,
            }
        }
    };
    // SAFETY: a per-CPU value of this CPU.
    unsafe { (*stats).record(&check) };
}
