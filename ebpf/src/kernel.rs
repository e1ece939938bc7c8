//! What the kernel the object is loaded into offers, among the helpers newer than the
//! oldest kernel the agent runs on (5.10): the agent probes for each and writes the
//! answers into these globals before loading (`roce_common::names::global`). They sit
//! in `.rodata`, which aya freezes before the programs load, so the verifier knows
//! their values: it walks only the branch they choose (the other may call a helper
//! this kernel does not know) and removes the other. A kernel that has the helper pays
//! one constant load where the choice is made.

use aya_ebpf::helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns};
use aya_ebpf::Global;

/// 1 when the kernel has bpf_ktime_get_coarse_ns (5.11+), 0 when it does not.
#[unsafe(no_mangle)]
static HAS_KTIME_COARSE: Global<u32> = Global::new(1);

/// 1 when the kernel has bpf_xdp_load_bytes (5.18+), 0 when it does not.
#[unsafe(no_mangle)]
static HAS_XDP_LOAD_BYTES: Global<u32> = Global::new(1);

/// The monotonic clock (CLOCK_MONOTONIC's time since boot, in ns) at the resolution
/// first/last seen and the events' rate limit need: the coarse clock (one tick) where
/// the kernel has it, else bpf_ktime_get_ns, the same clock at full resolution and a
/// costlier call. The agent turns both into wall-clock time alike.
#[inline(always)]
pub fn coarse_ns() -> u64 {
    // SAFETY: helpers without arguments; the coarse one is called only where the
    // kernel has it (the verifier never sees the call otherwise).
    unsafe {
        if HAS_KTIME_COARSE.load() != 0 {
            bpf_ktime_get_coarse_ns()
        } else {
            bpf_ktime_get_ns()
        }
    }
}

/// Whether XDP programs may call bpf_xdp_load_bytes.
#[inline(always)]
pub fn has_xdp_load_bytes() -> bool {
    HAS_XDP_LOAD_BYTES.load() != 0
}
