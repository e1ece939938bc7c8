//! Counting one RoCE packet on its flow: shared by `xdp_classify` (ingress) and
//! `tc_egress_flows` (egress), so both directions follow the same counting rules
//! (`FlowStats::record`) and emit the same sampled events (`events.rs`). Plain IPv4
//! flows live in FLOWS4 under the 16-byte key, plain IPv6 and IPv4 in VXLAN over IPv4
//! in FLOWS_MID under the 40-byte one, the others in FLOWS under the wide one; all
//! three point into FLOW_SLOTS, where the counters are.

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_jiffies64;
use aya_ebpf::maps::HashMap;
use roce_common::config::{RuntimeConfig, CONFIG_NO_RTT};
use roce_common::counters::{STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED};
use roce_common::event::{Trouble, EVENTS_OFF, EVENT_PSN_GAP};
use roce_common::flow::FlowSlot;
use roce_common::flow::{SLOT_FREE, SLOT_LIVE};
use roce_common::key::{FlowKey, FlowKey4, FlowKeyMid, FlowKeyMirror, KEY4_EGRESS, KEY_EGRESS};
use roce_common::mirror::MirrorTag;
use roce_common::nak::mirror_scope;
use roce_common::parsed::Parsed;

use crate::cnp;
use crate::events::{emit, FrameHead};
use crate::gaps;
use crate::kernel::coarse_ns;
use crate::maps::{
    bump, NakMap, RttMap, FLOWS, FLOWS4, FLOWS_MID, FLOWS_MIRROR, FLOW_FREE, FLOW_SLOTS,
    MIRROR_TAGS, TUNNEL_PORTS,
};

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
    mirror: Option<&MirrorTag>,
) {
    // Plain IPv4: no flag set by the classifier (a mirrored flow has KEY_MIRROR).
    let slot = if parsed.key.flags == 0 {
        let key = FlowKey4 {
            src: parsed.key.src[3],
            dst: parsed.key.dst[3],
            qp_dir: parsed.key.dest_qp | if egress { KEY4_EGRESS } else { 0 },
            ifindex,
        };
        flow_slot(&FLOWS4, &key, || key.widen(), |_| ())
    } else {
        let mut key: FlowKey = parsed.key;
        key.ifindex = ifindex;
        if egress {
            key.flags |= KEY_EGRESS;
        }
        // None, a constant, outside `xdp_mirror`: this branch is not compiled there.
        if let Some(tag) = mirror {
            let mk = FlowKeyMirror { key, tag: *tag };
            // The session goes into its slot before the key makes the slot live.
            flow_slot(
                &FLOWS_MIRROR,
                &mk,
                || key,
                |index| {
                    if let Some(t) = MIRROR_TAGS.get_ptr_mut(index) {
                        // SAFETY: the slot's entry, this CPU's until the insert.
                        unsafe { *t = *tag };
                    }
                    note_outer_port(index, parsed);
                },
            )
        } else {
            let taken = |index| note_outer_port(index, parsed);
            match FlowKeyMid::narrow(&key) {
                Some(mid) => flow_slot(&FLOWS_MID, &mid, || key, taken),
                None => flow_slot(&FLOWS, &key, || key, taken),
            }
        }
    };
    let Some((index, slot)) = slot else {
        return;
    };
    // A mirror copy's NAKs answer the go-backs its own mirroring device copied.
    let scope = mirror.map_or(0, mirror_scope);
    // Requests leaving (tc) start samples, responses arriving (XDP) end them; a
    // mirror session copies both directions into XDP, where both happen.
    let sampling = cfg.flags & CONFIG_NO_RTT == 0;
    let mut rtt = RttMap {
        slot: index,
        starts: (egress || mirror.is_some()) && sampling,
        ends: !egress && sampling,
        spike_us: cfg.rtt_spike_us,
    };
    // SAFETY: a live slot of FLOW_SLOTS; other CPUs may count on it too (see `record`).
    let before = mirror.map(|_| unsafe { gaps::Before::of(slot) });
    // SAFETY: as above.
    let trouble = unsafe { record(slot, parsed, frame_len, cfg, scope, &mut rtt) };
    // Marks arrive (or are copied) at a notification point; its CNPs leave (or are).
    // SAFETY: as above.
    unsafe {
        cnp::watch(
            parsed,
            index,
            slot,
            trouble.ce,
            scope,
            egress || mirror.is_some(),
            !egress,
        )
    };
    // A mirror port is a capture point: its PSN gaps may be the copies' loss.
    if let Some(before) = before {
        // SAFETY: as above.
        unsafe {
            gaps::watch(
                parsed,
                scope,
                index,
                slot,
                before,
                trouble.kind == EVENT_PSN_GAP,
            )
        };
    }
    if !trouble.is_none() && cfg.events_sample != EVENTS_OFF {
        // The slot holds the wide key; it is read only for an event the sampling keeps.
        // SAFETY: as above; the key is written once, when the slot is taken.
        emit(
            ctx,
            trouble,
            &|| unsafe { (*slot).key },
            parsed,
            frame_len,
            cfg.events_sample,
        );
    }
}

/// A tunnelled flow's outer UDP source port, into TUNNEL_PORTS at the index of the
/// slot it takes (the agent reads it only for tunnelled slots, so a plain flow's slot
/// need not clear it).
#[inline(always)]
fn note_outer_port(index: u32, parsed: &Parsed) {
    if !parsed.tunnelled {
        return;
    }
    if let Some(p) = TUNNEL_PORTS.get_ptr_mut(index) {
        // SAFETY: the slot's entry, this CPU's until the insert makes the flow known.
        unsafe { *p = parsed.outer_sport as u64 };
    }
}

/// The slot of `key`'s flow (its index and place), taken from FLOW_FREE when the
/// flow is new.
#[inline(always)]
fn flow_slot<K>(
    map: &HashMap<K, u64>,
    key: &K,
    wide: impl FnOnce() -> FlowKey,
    taken: impl FnOnce(u32),
) -> Option<(u32, *mut FlowSlot)> {
    // SAFETY: a copy of the index out of the map.
    if let Some(index) = unsafe { map.get(key) } {
        let index = *index as u32;
        return Some((index, FLOW_SLOTS.get_ptr_mut(index)?));
    }
    new_flow(map, key, wide, taken)
}

/// Takes a free slot for `key`, writes the key into it, and makes the flow point at it.
/// Two CPUs may meet a new flow at once: the one whose insert fails gives its slot back
/// and counts on the other's.
#[inline(always)]
fn new_flow<K>(
    map: &HashMap<K, u64>,
    key: &K,
    wide: impl FnOnce() -> FlowKey,
    taken: impl FnOnce(u32),
) -> Option<(u32, *mut FlowSlot)> {
    let Ok(Some(index)) = FLOW_FREE.pop() else {
        // No free slot: the table is full until the agent evicts flows.
        bump(STAT_FLOW_INSERT_FAILED);
        return None;
    };
    let slot = FLOW_SLOTS.get_ptr_mut(index)?;
    // SAFETY: a slot this CPU owns since it took its index off the queue; the agent
    // zeroed its counters before giving it back.
    // Before the slot is live: the agent reads a live mirrored slot's session too.
    taken(index);
    unsafe {
        (*slot).key = wide();
        (*slot).state = SLOT_LIVE;
    }
    if map.insert(key, &(index as u64), BPF_NOEXIST as u64).is_ok() {
        bump(STAT_FLOW_CREATED);
        return Some((index, slot));
    }
    // SAFETY: still this CPU's slot: nothing points at it.
    unsafe { (*slot).state = SLOT_FREE };
    let _ = FLOW_FREE.push(index, 0);
    // SAFETY: as in `flow_slot`.
    match unsafe { map.get(key) } {
        Some(other) => {
            let other = *other as u32;
            Some((other, FLOW_SLOTS.get_ptr_mut(other)?))
        }
        None => {
            bump(STAT_FLOW_INSERT_FAILED);
            None
        }
    }
}

/// Counts on a flow's slot; first/last seen from the coarse clock (ms resolution is
/// plenty; `kernel::coarse_ns`); NAKs and go-backs meet in NAK_PSNS.
///
/// # Safety
/// `slot` is a live slot of FLOW_SLOTS, valid for this program run. Other CPUs may
/// count on it at the same time: `FlowStats::record` adds its counts atomically.
#[inline(always)]
unsafe fn record(
    slot: *mut FlowSlot,
    parsed: &Parsed,
    frame_len: u32,
    cfg: &RuntimeConfig,
    scope: u32,
    rtt: &mut RttMap,
) -> Trouble {
    // SAFETY: the caller's promise; bpf_jiffies64 takes no arguments. The verifier
    // inlines it (a load); the clock is a real call, made only when the tick moved.
    unsafe {
        (*slot).stats.record(
            parsed,
            frame_len,
            bpf_jiffies64() as u32,
            coarse_ns,
            cfg.default_pmtu_log2,
            &mut NakMap { scope },
            rtt,
        )
    }
}
