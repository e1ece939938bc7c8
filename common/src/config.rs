//! The CONFIG map's single entry: what the agent tells the kernel programs.

use crate::event::EVENTS_OFF;
use crate::wire::{DEFAULT_ROCE_PORT, DEFAULT_VXLAN_PORT};

/// The version of the kernel/agent map layout (names, types, key and value sizes of
/// the maps in `names::map`). Pinned maps carry it in GENERATION: a binary that finds
/// another version in a pin directory refuses to adopt it instead of misreading it.
/// Raise it with every change of a map's type, key or value.
pub const LAYOUT_VERSION: u32 = 8;

/// CONFIG, QOS and POLICY hold two generations: the agent writes the one the programs
/// do not read, then switches GENERATION, so no packet sees half a policy.
pub const GENERATIONS: u32 = 2;

/// GENERATION's single entry. Its two fields stay first in every layout version, so
/// that any binary can read the version of a pin it finds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// The generation (0 or 1) of CONFIG, QOS and POLICY the programs read.
    pub active: u32,
    /// `LAYOUT_VERSION` of the agent that created the maps (0: not written yet).
    pub layout: u32,
}

/// Path MTU (log2) assumed for READ requests until a flow's own is learnt: 4096.
pub const DEFAULT_PMTU_LOG2: u8 = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub roce_port: u16,
    pub vxlan_port: u16,
    /// log2 of the default path MTU (8..=12).
    pub default_pmtu_log2: u8,
    pub _pad: [u8; 3],
    /// `CONFIG_*` flags.
    pub flags: u32,
    /// Sampled events: 1 in this many of each kind per CPU is written to the EVENTS
    /// ring (`event::EVENTS_OFF`, 0: none, the default here; `run --events-sample`).
    pub events_sample: u32,
    /// A round trip longer than this many µs is an `rtt_spike` event (0: none).
    pub rtt_spike_us: u32,
}

/// `RuntimeConfig::flags`: no round-trip samples (`rtt`) are started or ended; what
/// the benchmarks measure the sampling's cost against, in the same run.
pub const CONFIG_NO_RTT: u32 = 1;

/// `RuntimeConfig::rtt_spike_us` unless configured: a millisecond, a hundred times
/// what a RoCE round trip takes in one data-centre fabric without queueing.
pub const DEFAULT_RTT_SPIKE_US: u32 = 1000;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            roce_port: DEFAULT_ROCE_PORT,
            vxlan_port: DEFAULT_VXLAN_PORT,
            default_pmtu_log2: DEFAULT_PMTU_LOG2,
            _pad: [0; 3],
            flags: 0,
            events_sample: EVENTS_OFF,
            rtt_spike_us: DEFAULT_RTT_SPIKE_US,
        }
    }
}

/// The RoCE path MTU and the netdev MTU: RoCE cannot fragment, so the RNIC picks the
/// largest IB MTU whose packet, headers and all, fits the netdev MTU (the kernel's
/// `iboe_get_mtu()`).
/// What `iboe_get_mtu()` subtracts from the netdev MTU: GRH 40, UDP 8, BTH 12, XRC
/// extended header 4, AtomicETH 28, ICRC 4.
pub const ROCE_HEADROOM: u32 = 40 + 8 + 12 + 4 + 28 + 4;

/// The InfiniBand MTUs.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// The RoCE path MTU a netdev MTU carries, as the kernel computes it (None below 256).
pub fn roce_path_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(ROCE_HEADROOM)?;
    IB_MTUS.into_iter().rev().find(|m| *m <= room)
}

/// The netdev MTU that carries a RoCE path MTU of `ib_mtu` bytes (4096 -> 4192).
pub fn netdev_mtu_for(ib_mtu: u32) -> u32 {
    ib_mtu + ROCE_HEADROOM
}

/// The IB MTUs, as log2: 256, 512, 1024, 2048, 4096.
pub const IB_MTU_LOG2: [u8; 5] = [8, 9, 10, 11, 12];

/// log2 of an IB MTU in bytes, or None when it is not one of the five.
pub fn pmtu_log2(bytes: u32) -> Option<u8> {
    IB_MTU_LOG2.into_iter().find(|l| 1u32 << l == bytes)
}
