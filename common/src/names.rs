//! The names of the kernel object's maps, programs and globals, declared once: the
//! kernel side names its statics the same (aya names a map or program after its static
//! or function), the agent finds them by these constants, and a test checks that every
//! name here is in the object and every map of the object is here (the loader refuses
//! an object without one of the globals).

/// Map names (`ebpf/src/maps.rs`).
pub mod map {
    /// Wide flow key (a tunnel with IPv6 outside or inside) -> index of its slot in
    /// FLOW_SLOTS.
    pub const FLOWS: &str = "FLOWS";
    /// Compact key of a plain IPv4 flow (`flow::FlowKey4`) -> index in FLOW_SLOTS.
    pub const FLOWS4: &str = "FLOWS4";
    /// 40-byte key of a plain IPv6 flow or of IPv4 in VXLAN over IPv4
    /// (`flow::FlowKeyMid`) -> index in FLOW_SLOTS.
    pub const FLOWS_MID: &str = "FLOWS_MID";
    /// Key of a mirrored flow (`key::FlowKeyMirror`: the mirrored packet's wide key
    /// and its mirror session) -> index in FLOW_SLOTS.
    pub const FLOWS_MIRROR: &str = "FLOWS_MIRROR";
    /// The mirror session of each FLOW_SLOTS slot that holds a mirrored flow
    /// (`mirror::MirrorTag`, same index), written when the slot is taken.
    pub const MIRROR_TAGS: &str = "MIRROR_TAGS";
    /// The outer UDP source port of each FLOW_SLOTS slot that holds a tunnelled flow
    /// (a u64, same index), written when the slot is taken.
    pub const TUNNEL_PORTS: &str = "TUNNEL_PORTS";
    /// What `xdp_mirror` hands `xdp_mirror_flows` (`mirror::MirrorScratch`), per CPU.
    pub const MIRROR_SCRATCH: &str = "MIRROR_SCRATCH";
    /// Programs `xdp_mirror` tail-calls (`tail::XDP_TAIL_MIRROR_FLOWS`,
    /// `tail::XDP_TAIL_CLASSIFY`).
    pub const XDP_TAIL: &str = "XDP_TAIL";
    /// What `xdp_classify` found of a RoCE packet, for `xdp_count` (one per CPU).
    pub const COUNT_SCRATCH: &str = "COUNT_SCRATCH";
    /// The flows' counters and keys (`flow::FlowSlot`), shared by all CPUs; the agent
    /// maps it into its memory.
    pub const FLOW_SLOTS: &str = "FLOW_SLOTS";
    /// Queue of the FLOW_SLOTS indexes free for new flows (filled and refilled by the agent).
    pub const FLOW_FREE: &str = "FLOW_FREE";
    /// Per-CPU counters by index (`counters`).
    pub const STATS: &str = "STATS";
    /// The active generation of CONFIG, QOS and POLICY, and the layout version.
    pub const GENERATION: &str = "GENERATION";
    /// RuntimeConfig, one entry per generation.
    pub const CONFIG: &str = "CONFIG";
    /// DSCP -> DscpEntry (priority, VTEP outer DSCP, lossless flag), 64 entries per
    /// generation.
    pub const POLICY: &str = "POLICY";
    /// QosConfig (RoCE, CNP and remark DSCPs), one entry per generation.
    pub const QOS: &str = "QOS";
    /// ifindex -> IfaceQos for ifindex below `policy::IFACE_DIRECT`.
    pub const IFACE_QOS_DIRECT: &str = "IFACE_QOS_DIRECT";
    /// ifindex -> IfaceQos for larger ifindexes.
    pub const IFACE_QOS: &str = "IFACE_QOS";
    /// Remote VTEP -> per-CPU decapsulation counters.
    pub const VTEPS: &str = "VTEPS";
    /// Ring buffer of sampled events (`event::EventRecord`).
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU sampling countdowns and rate-limit window of the events.
    pub const EVENT_BUDGET: &str = "EVENT_BUDGET";
    /// NAKs waiting for the go-back they ask for (`nak::NakKey` -> 1), an LRU hash.
    pub const NAK_PSNS: &str = "NAK_PSNS";
    /// At least as many as the NAKs in NAK_PSNS (one u64): 0 spares a go-back the look.
    pub const NAK_WAITING: &str = "NAK_WAITING";
    /// Round-trip samples waiting for their response (`nak::NakKey` ->
    /// `rtt::RttWait`), an LRU hash.
    pub const RTT_WAIT: &str = "RTT_WAIT";
    /// Samples in RTT_WAIT by PSN modulo its size (u64 counts): 0 spares a response the
    /// look.
    pub const RTT_WAIT_PSNS: &str = "RTT_WAIT_PSNS";
    /// Round trips per flow: FLOW_SLOTS index -> `rtt::RttHist`, for the flows that
    /// have any (a hash without preallocation).
    pub const RTT_HIST: &str = "RTT_HIST";
    /// One zeroed `rtt::RttHist`: a flow's first histogram is copied from it (it is
    /// larger than the programs' stack).
    pub const RTT_HIST_ZERO: &str = "RTT_HIST_ZERO";

    /// Programs `tc_egress` tail-calls (`tail`).
    pub const TC_TAIL: &str = "TC_TAIL";

    /// PSN gaps of mirrored flows waiting for their verdict (`gaps`): host pair and
    /// mirroring device (`nak::NakKey`, PSN 0) -> `gaps::GapWait`, an LRU hash.
    pub const CAPTURE_GAP_WAIT: &str = "CAPTURE_GAP_WAIT";
    /// At least as many as the gaps in CAPTURE_GAP_WAIT (one u64): 0 spares a
    /// mirrored response the look.
    pub const CAPTURE_GAP_WAITING: &str = "CAPTURE_GAP_WAITING";
    /// Gaps the capture lost, per mirrored flow: FLOW_SLOTS index -> u64, for the
    /// flows that have any (a hash without preallocation).
    pub const CAPTURE_GAPS: &str = "CAPTURE_GAPS";
    /// CNPs off the policy's CNP DSCP, per flow: FLOW_SLOTS index ->
    /// `cnp::CnpWrongClass`, for the flows that have any (a hash without
    /// preallocation).
    pub const CNP_WRONG_CLASS: &str = "CNP_WRONG_CLASS";
    /// CE marks waiting for their CNP: host pair in the marks' direction
    /// (`nak::NakKey`, PSN 0) -> when the first arrived, an LRU hash.
    pub const CE_WAIT: &str = "CE_WAIT";
    /// The ECN -> CNP times per CNP flow: FLOW_SLOTS index -> `cnp::CnpTimes`, for the
    /// flows that carried a CNP (a hash without preallocation).
    pub const CNP_TIMES: &str = "CNP_TIMES";
    /// One zeroed `cnp::CnpTimes`: a flow's first entry is copied from it.
    pub const CNP_TIMES_ZERO: &str = "CNP_TIMES_ZERO";
    /// Waits for a CNP that CNPs answered (one u64): a flow's `ce_wait_tag` holds while
    /// it stays.
    pub const CE_ANSWERS: &str = "CE_ANSWERS";
    /// What the CNP timing hands the map helpers (`cnp::CnpScratch`), per CPU.
    pub const CNP_SCRATCH: &str = "CNP_SCRATCH";

    /// Every map of the object.
    pub const ALL: [&str; 37] = [
        FLOWS,
        FLOWS4,
        FLOWS_MID,
        FLOWS_MIRROR,
        MIRROR_TAGS,
        TUNNEL_PORTS,
        MIRROR_SCRATCH,
        XDP_TAIL,
        FLOW_SLOTS,
        FLOW_FREE,
        STATS,
        GENERATION,
        CONFIG,
        POLICY,
        QOS,
        IFACE_QOS_DIRECT,
        IFACE_QOS,
        VTEPS,
        EVENTS,
        EVENT_BUDGET,
        NAK_PSNS,
        NAK_WAITING,
        RTT_WAIT,
        RTT_WAIT_PSNS,
        RTT_HIST,
        RTT_HIST_ZERO,
        COUNT_SCRATCH,
        TC_TAIL,
        CAPTURE_GAP_WAIT,
        CAPTURE_GAP_WAITING,
        CAPTURE_GAPS,
        CNP_WRONG_CLASS,
        CE_WAIT,
        CNP_TIMES,
        CNP_TIMES_ZERO,
        CNP_SCRATCH,
        CE_ANSWERS,
    ];
}

/// Program names (`ebpf/src/xdp.rs`, `ebpf/src/tc.rs`).
pub mod program {
    /// The XDP classifier (ingress flows).
    pub const XDP_CLASSIFY: &str = "xdp_classify";
    /// The XDP classifier of mirror collector interfaces: decapsulates GRE and
    /// ERSPAN II/III copies and counts the mirrored flows, and every other frame as
    /// `xdp_classify` does.
    pub const XDP_MIRROR: &str = "xdp_mirror";
    /// The second step of `xdp_mirror` for a mirror copy, tail-called through XDP_TAIL
    /// (never attached): walks the copy's mirrored frame and counts its flow. Two
    /// programs, so that each verifies well inside the verifier's limits.
    pub const XDP_MIRROR_FLOWS: &str = "xdp_mirror_flows";
    /// The second step of `xdp_classify` for a RoCE packet, tail-called through
    /// XDP_TAIL (never attached): counts it on its flow (COUNT_SCRATCH holds what the
    /// classifier found). A program of its own, verified once: inlined in
    /// `xdp_classify`, the counting was verified once for every path through the
    /// classifier, past the million instructions 5.10 allows.
    pub const XDP_COUNT: &str = "xdp_count";
    /// `xdp_count` for a mirror copy, tail-called by `xdp_mirror_flows` (never
    /// attached): counts the mirrored packet on its session's flow, where requests
    /// start round-trip samples and responses end them (a session copies both
    /// directions), then moves the packet's start back.
    pub const XDP_COUNT_MIRROR: &str = "xdp_count_mirror";
    /// An empty XDP program: the benchmarks' baseline.
    pub const XDP_BASELINE: &str = "xdp_baseline";
    /// Host DSCP policy and VTEP propagation on egress.
    pub const TC_EGRESS: &str = "tc_egress";
    /// Egress flows and their events, tail-called by `tc_egress` (never attached).
    pub const TC_EGRESS_FLOWS: &str = "tc_egress_flows";
    /// Decapsulation-side checks on VTEP underlays.
    pub const TC_INGRESS: &str = "tc_ingress";
    /// An empty tc program: the benchmarks' baseline.
    pub const TC_BASELINE: &str = "tc_baseline";

    /// Every program of the object.
    pub const ALL: [&str; 10] = [
        XDP_CLASSIFY,
        XDP_COUNT,
        XDP_COUNT_MIRROR,
        XDP_MIRROR,
        XDP_MIRROR_FLOWS,
        XDP_BASELINE,
        TC_EGRESS,
        TC_EGRESS_FLOWS,
        TC_INGRESS,
        TC_BASELINE,
    ];
}

/// Read-only globals of the object (`ebpf/src/kernel.rs`, in `.rodata`), each a u32
/// the agent writes before loading: 1 when the kernel has a helper newer than the
/// oldest kernel the agent runs on (5.10), 0 when the programs must do without.
pub mod global {
    /// bpf_ktime_get_coarse_ns (Linux 5.11).
    pub const HAS_KTIME_COARSE: &str = "HAS_KTIME_COARSE";
    /// bpf_xdp_load_bytes (Linux 5.18).
    pub const HAS_XDP_LOAD_BYTES: &str = "HAS_XDP_LOAD_BYTES";
}

/// Slots of the TC_TAIL program array.
pub mod tail {
    /// `program::TC_EGRESS_FLOWS`.
    pub const TC_TAIL_EGRESS_FLOWS: u32 = 0;
    /// Slots in TC_TAIL.
    pub const TC_TAIL_LEN: u32 = 1;
    /// `program::XDP_MIRROR_FLOWS` in XDP_TAIL (a mirror copy's second step).
    pub const XDP_TAIL_MIRROR_FLOWS: u32 = 0;
    /// `program::XDP_CLASSIFY` in XDP_TAIL (any other frame on a mirror interface).
    pub const XDP_TAIL_CLASSIFY: u32 = 1;
    /// `program::XDP_COUNT` in XDP_TAIL (a RoCE packet's count, from `xdp_classify`).
    pub const XDP_TAIL_COUNT: u32 = 2;
    /// `program::XDP_COUNT_MIRROR` in XDP_TAIL (a mirrored RoCE packet's count, from
    /// `xdp_mirror_flows`).
    pub const XDP_TAIL_COUNT_MIRROR: u32 = 3;
    /// Slots in XDP_TAIL.
    pub const XDP_TAIL_LEN: u32 = 4;
}
