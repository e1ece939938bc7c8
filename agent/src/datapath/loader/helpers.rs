//! The helpers newer than the oldest kernel the agent runs on (5.10) that the programs
//! call where the kernel has them: probed before loading with aya's
//! `is_helper_supported` (it loads a two-instruction program that calls the helper,
//! as libbpf's `libbpf_probe_bpf_helper` does: backports count, version numbers do
//! not), the answers written into the object's read-only globals
//! (`roce_common::names::global`, read by `ebpf/src/kernel.rs`).

use aya::programs::ProgramType;
use aya::sys::{is_helper_supported, BpfHelper};
use roce_common::names::global;

/// What the kernel offers; each helper it lacks selects the programs' fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelHelpers {
    /// bpf_ktime_get_coarse_ns (5.11): flows' first and last seen, the events'
    /// rate-limit window. Without it: bpf_ktime_get_ns, the same clock
    /// (CLOCK_MONOTONIC) at full resolution, a costlier call made at most once a tick
    /// per flow.
    pub ktime_coarse: bool,
    /// bpf_xdp_load_bytes (5.18): the frame head an XDP event carries. Without it: the
    /// same bytes read from packet memory, a word at a time.
    pub xdp_load_bytes: bool,
}

impl KernelHelpers {
    /// Every helper (5.18 and later).
    pub const ALL: KernelHelpers = KernelHelpers {
        ktime_coarse: true,
        xdp_load_bytes: true,
    };

    /// None of them (5.10): tests load the fallbacks on a newer kernel with it.
    pub const NONE: KernelHelpers = KernelHelpers {
        ktime_coarse: false,
        xdp_load_bytes: false,
    };

    /// Asks the running kernel. A probe that fails for another reason than a missing
    /// helper counts as missing (the fallbacks load on every kernel) and is logged.
    pub fn probe() -> KernelHelpers {
        KernelHelpers {
            ktime_coarse: probe(
                BpfHelper::BPF_FUNC_ktime_get_coarse_ns,
                "bpf_ktime_get_coarse_ns",
            ),
            xdp_load_bytes: probe(BpfHelper::BPF_FUNC_xdp_load_bytes, "bpf_xdp_load_bytes"),
        }
    }

    /// The object's globals and their values: 1 where the kernel has the helper.
    pub(super) fn globals(&self) -> [(&'static str, u32); 2] {
        [
            (global::HAS_KTIME_COARSE, self.ktime_coarse as u32),
            (global::HAS_XDP_LOAD_BYTES, self.xdp_load_bytes as u32),
        ]
    }

    /// Says at info level which fallbacks the programs use.
    pub(super) fn log_fallbacks(&self) {
        if !self.ktime_coarse {
            tracing::info!(
                "kernel without bpf_ktime_get_coarse_ns (5.11+): using bpf_ktime_get_ns for flow timestamps"
            );
        }
        if !self.xdp_load_bytes {
            tracing::info!(
                "kernel without bpf_xdp_load_bytes (5.18+): events read the frame head from XDP packet memory"
            );
        }
    }
}

/// Whether XDP programs may call `helper` (named `name` in the log).
fn probe(helper: BpfHelper, name: &str) -> bool {
    match is_helper_supported(ProgramType::Xdp, helper) {
        Ok(has) => has,
        Err(e) => {
            tracing::warn!(helper = name, error = %e, "probing for a BPF helper failed: the programs do without it");
            false
        }
    }
}
