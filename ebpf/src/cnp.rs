//! CNPs off the policy's CNP class, per flow (the rule: `roce_common::cnp`). Counted
//! where every RoCE packet is counted on its flow: arriving (XDP), leaving (tc, as
//! written: a CNP the host policy moved to the CNP DSCP is not off it) and on mirror
//! sessions. Only CNPs look: the cost of the lookups is theirs.

use aya_ebpf::bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST};
use aya_ebpf::macros::map;
use aya_ebpf::maps::HashMap;
use roce_common::cnp::{dscp_bit, wrong_class, CnpWrongClass};
use roce_common::flow::add;
use roce_common::parsed::Parsed;

use crate::maps::{generation, qos_config};

/// CNPs off the CNP DSCP, by the slot of their flow. The agent deletes a flow's entry
/// when it frees its slot.
#[map]
pub static CNP_WRONG_CLASS: HashMap<u32, CnpWrongClass> =
    HashMap::with_max_entries(CNP_WRONG_CLASS_LEN, BPF_F_NO_PREALLOC);

pub const CNP_WRONG_CLASS_LEN: u32 = 65536;

/// Counts the packet `p` of the flow in slot `slot` when it is a CNP off the policy's
/// CNP DSCP.
#[inline(always)]
pub fn watch(p: &Parsed, slot: u32) {
    if roce_common::bth::is_cnp(p.bth.opcode) {
        check(p.bth.opcode, p.outer_tos >> 2, slot);
    }
}

#[inline(never)]
fn check(opcode: u8, dscp: u8, slot: u32) {
    if !wrong_class(opcode, dscp, qos_config(generation()).cnp_dscp) {
        return;
    }
    let c = match CNP_WRONG_CLASS.get_ptr_mut(&slot) {
        Some(c) => c,
        None => {
            // The flow's first: made empty (or by another CPU meanwhile), then counted
            // on like any other.
            let _ = CNP_WRONG_CLASS.insert(&slot, &CnpWrongClass::default(), BPF_NOEXIST as u64);
            match CNP_WRONG_CLASS.get_ptr_mut(&slot) {
                Some(c) => c,
                // The map is full.
                None => return,
            }
        }
    };
    // SAFETY: the flow's entry, shared by all CPUs: the count is added atomically; the
    // DSCP bits are or-ed in plainly (a bit two CPUs set at once on one flow may wait
    // for that flow's next CNP on its DSCP).
    unsafe {
        add(&mut (*c).packets, 1);
        (*c).dscps |= dscp_bit(dscp);
    }
}
