//! The maps shared with the agent. Their names are a contract (DESIGN.md).

use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, LruPerCpuHashMap, PerCpuArray};
use roce_common::config::RuntimeConfig;
use roce_common::counters::STATS_LEN;
use roce_common::flow::{FlowKey, FlowStats};

/// Per-flow counters. The agent resizes it from its configuration before loading.
#[map]
pub static FLOWS: LruPerCpuHashMap<FlowKey, FlowStats> =
    LruPerCpuHashMap::with_max_entries(65536, 0);

/// Per-class, per-reason and flow-table counters (see `roce_common::counters`).
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS_LEN, 0);

/// Ports and defaults, written by the agent before attaching.
#[map]
pub static CONFIG: Array<RuntimeConfig> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn bump(index: u32) {
    if let Some(c) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU while it runs this program.
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub fn runtime_config() -> RuntimeConfig {
    match CONFIG.get(0) {
        Some(c) => *c,
        None => RuntimeConfig::default(),
    }
}
