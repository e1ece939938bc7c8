//! The maps shared with the agent. Their names are declared once in `roce_common::names` (a test checks them against this object).

use crate::packet::opaque;
use aya_ebpf::bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST};
use aya_ebpf::helpers::bpf_ktime_get_ns;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{
    Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, ProgramArray, Queue,
};
use roce_common::config::{Generation, RuntimeConfig, GENERATIONS};
use roce_common::counters::{STATS_LEN, STAT_RTT_OTHER_QP, STAT_RTT_SHARED_PSN};
use roce_common::flow::{add, add32, FlowSlot};
use roce_common::key::{FlowKey, FlowKey4, FlowKeyMid, FlowKeyMirror};
use roce_common::mirror::{MirrorScratch, MirrorTag};
use roce_common::nak::{NakKey, NakMemory};
pub use roce_common::names::tail::{
    TC_TAIL_EGRESS_FLOWS, TC_TAIL_LEN, XDP_TAIL_CLASSIFY, XDP_TAIL_COUNT, XDP_TAIL_COUNT_MIRROR,
    XDP_TAIL_LEN, XDP_TAIL_MIRROR_FLOWS,
};
use roce_common::parsed::CountScratch;
use roce_common::policy::{
    DscpEntry, DscpTable, IfaceQos, QosConfig, VtepKey, VtepStats, DSCP_COUNT, IFACE_DIRECT,
};
use roce_common::rtt::{bucket_of, pair_with, RttHist, RttMemory, RttWait, RTT_BUCKETS};

/// Tunnels with IPv6 outside or inside: key -> index of the flow's slot in FLOW_SLOTS
/// (a u64: the agent writes the tables with batch calls, whose values are whole
/// words). The agent sizes FLOWS, FLOWS4, FLOWS_MID, FLOW_SLOTS and FLOW_FREE alike
/// from its configuration.
#[map]
pub static FLOWS: HashMap<FlowKey, u64> = HashMap::with_max_entries(65536, 0);

/// Plain IPv4 flows under the compact key (the common case hashes 16 bytes instead of
/// 80) -> slot index.
#[map]
pub static FLOWS4: HashMap<FlowKey4, u64> = HashMap::with_max_entries(65536, 0);

/// Plain IPv6 flows and IPv4 in VXLAN over IPv4, under the 40-byte key -> slot index.
#[map]
pub static FLOWS_MID: HashMap<FlowKeyMid, u64> = HashMap::with_max_entries(65536, 0);

/// Mirrored flows (`xdp_mirror`), under the mirrored packet's key and its session ->
/// slot index. A table of their own: the other tables' keys stay short. Not
/// preallocated: a host without mirror interfaces pays only its buckets.
#[map]
pub static FLOWS_MIRROR: HashMap<FlowKeyMirror, u64> =
    HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// The mirror session of a FLOW_SLOTS slot whose key has KEY_MIRROR (same index):
/// the slot's key is the mirrored packet's, its session lives here. Mmapable, so that
/// the agent reads it as it reads the slots.
#[map]
pub static MIRROR_TAGS: Array<MirrorTag> = Array::with_max_entries(65536, BPF_F_MMAPABLE);

/// The outer UDP source port of each FLOW_SLOTS slot that holds a tunnelled flow
/// (same index), from the flow's first packet: the port its VTEP chose, the one the
/// underlay's ECMP hashes on. Written when the slot is taken (a packet pays nothing);
/// mmapable, as MIRROR_TAGS. A u64: an array's entries lie 8 bytes apart whatever
/// their size, and the agent reads them as memory.
#[map]
pub static TUNNEL_PORTS: Array<u64> = Array::with_max_entries(65536, BPF_F_MMAPABLE);

/// What `xdp_mirror` found, for the program it tail-calls (one entry per CPU).
#[map]
pub static MIRROR_SCRATCH: PerCpuArray<MirrorScratch> = PerCpuArray::with_max_entries(1, 0);

/// What `xdp_classify` found of a RoCE packet, for the `xdp_count` it tail-calls.
#[map]
pub static COUNT_SCRATCH: PerCpuArray<CountScratch> = PerCpuArray::with_max_entries(1, 0);

/// Programs `xdp_mirror` tail-calls, filled by the agent when it loads them.
#[map]
pub static XDP_TAIL: ProgramArray = ProgramArray::with_max_entries(XDP_TAIL_LEN, 0);

/// The flows' counters and keys, one value shared by all CPUs (so its size does not
/// grow with them); mmapable, so that the agent reads it as memory, in order, instead
/// of a hash entry at a time.
#[map]
pub static FLOW_SLOTS: Array<FlowSlot> = Array::with_max_entries(65536, BPF_F_MMAPABLE);

/// Indexes of free FLOW_SLOTS: a new flow takes one. The agent fills it at load and
/// gives back the slots of flows it evicts.
#[map]
pub static FLOW_FREE: Queue<u32> = Queue::with_max_entries(65536, 0);

/// NAKs and RNR NAKs waiting for the go-back they ask for (`roce_common::nak`): the
/// requester's and responder's addresses and the PSN -> when it was seen (the
/// monotonic clock, for the NAK-to-resend time). Shared by all CPUs and
/// both directions; the least recently used is forgotten when it is full (a NAK whose
/// go-back this host never sees).
#[map]
pub static NAK_PSNS: LruHashMap<NakKey, u64> = LruHashMap::with_max_entries(NAK_PSNS_LEN, 0);

/// NAKs NAK_PSNS holds.
pub const NAK_PSNS_LEN: u32 = 8192;

/// At least as many as the NAKs in NAK_PSNS (counted before one goes in, taken away
/// after one was taken out; the LRU's evictions are not taken away): while it is 0,
/// a go-back finds no NAK without looking (a hash of 80 bytes and a bucket lock), so
/// a host that NAKs nothing pays for its go-backs only their counts.
#[map]
pub static NAK_WAITING: Array<u64> = Array::with_max_entries(1, 0);

/// The kernel's NAK memory, for packets of `scope` (`roce_common::nak::mirror_scope`).
pub struct NakMap {
    pub scope: u32,
}

impl NakMemory for NakMap {
    #[inline(always)]
    fn scope(&self) -> u32 {
        self.scope
    }
    #[inline(always)]
    fn now_ns(&self) -> u64 {
        // SAFETY: no arguments.
        unsafe { bpf_ktime_get_ns() }
    }
    #[inline(always)]
    fn remember(&mut self, key: &NakKey) {
        nak_remember(key);
    }
    #[inline(always)]
    fn take(&mut self, key: &NakKey) -> Option<u64> {
        // No NAK waits (a host that NAKs nothing): no call, no look.
        let n = NAK_WAITING.get_ptr_mut(0)?;
        // SAFETY: the map's one value; a plain read (see `nak_take`).
        if unsafe { *n } == 0 {
            return None;
        }
        match nak_take(key) {
            0 => None,
            seen => Some(seen),
        }
    }
}

/// [`NakMap::remember`]. BPF subprograms, this and [`nak_take`], as the round-trip
/// ones (`end_sample`): inlined, the verifier walks their branches once for every
/// path through the classifier that reaches them.
#[inline(never)]
fn nak_remember(key: &NakKey) {
    if let Some(n) = NAK_WAITING.get_ptr_mut(0) {
        // SAFETY: the map's one value, shared by all CPUs: added to atomically.
        unsafe { add(&mut *n, 1) };
    }
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = NAK_PSNS.insert(key, &now.max(1), 0);
}

/// [`NakMap::take`]: when the NAK under `key` was seen, 0 when none waits.
#[inline(never)]
fn nak_take(key: &NakKey) -> u64 {
    let Some(n) = NAK_WAITING.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: as above; a plain read, another CPU may change it meanwhile (a NAK
    // counted after this read is one this go-back came before).
    if unsafe { *n } == 0 {
        return 0;
    }
    // SAFETY: a copy of the value out of the map.
    let Some(seen) = (unsafe { NAK_PSNS.get(key).copied() }) else {
        return 0;
    };
    if NAK_PSNS.remove(key).is_err() {
        // Another CPU's go-back took it first.
        return 0;
    }
    // SAFETY: as above.
    unsafe { add(&mut *n, u64::MAX) };
    seen
}

/// The error a BPF_NOEXIST insert returns when the key is there already.
const EEXIST: i32 = 17;

/// Round-trip samples waiting for their response (`roce_common::rtt`): a request
/// leaving through tc starts one, the response arriving in XDP ends it.
#[map]
pub static RTT_WAIT: LruHashMap<NakKey, RttWait> = LruHashMap::with_max_entries(RTT_WAIT_LEN, 0);

/// Samples RTT_WAIT holds: one per active request flow (a flow keeps one outstanding).
pub const RTT_WAIT_LEN: u32 = 16384;

/// How many samples wait at each PSN modulo its size: a response whose entry is 0
/// ends no sample without hashing its key. Samples the LRU forgets leave their count:
/// such an entry only costs its responses a look.
#[map]
pub static RTT_WAIT_PSNS: Array<u64> = Array::with_max_entries(RTT_WAIT_PSNS_LEN, 0);

pub const RTT_WAIT_PSNS_LEN: u32 = 4096;

/// Round trips of the flows that have any: slot index -> histogram. Without
/// preallocation: the memory is that of the flows that answer samples (the requester
/// QPs' inbound flows). The agent deletes a flow's entry when it frees its slot.
#[map]
pub static RTT_HIST: HashMap<u32, RttHist> =
    HashMap::with_max_entries(RTT_HIST_LEN, BPF_F_NO_PREALLOC);

pub const RTT_HIST_LEN: u32 = 65536;

/// A zeroed histogram to copy a flow's first one from.
#[map]
pub static RTT_HIST_ZERO: Array<RttHist> = Array::with_max_entries(1, 0);

/// The kernel's round-trip memory, for the flow in slot `slot` counted by a program
/// that `starts` samples (tc egress, mirror) and/or `ends` them (XDP, mirror).
pub struct RttMap {
    pub slot: u32,
    pub starts: bool,
    pub ends: bool,
    /// `RuntimeConfig::rtt_spike_us`.
    pub spike_us: u32,
}

#[inline(always)]
fn psn_count(psn: u32) -> Option<*mut u64> {
    RTT_WAIT_PSNS.get_ptr_mut(psn % RTT_WAIT_PSNS_LEN)
}

impl RttMemory for RttMap {
    #[inline(always)]
    fn starts(&self) -> bool {
        self.starts
    }
    #[inline(always)]
    fn ends(&self) -> bool {
        self.ends
    }
    #[inline(always)]
    fn spike_us(&self) -> u32 {
        self.spike_us
    }
    #[inline(always)]
    fn may_end(&self, psn: u32) -> bool {
        // SAFETY: an entry of the array; a plain read (a sample started meanwhile on
        // another CPU is one this response came before).
        psn_count(psn).is_some_and(|n| unsafe { *n } != 0)
    }
    #[inline(always)]
    fn start(&mut self, key: &NakKey) -> bool {
        start_sample(self.slot, key) != 0
    }
    #[inline(always)]
    fn cancel(&mut self, key: &NakKey) {
        if RTT_WAIT.remove(key).is_ok() {
            if let Some(n) = psn_count(key.psn) {
                // SAFETY: as above.
                unsafe { add(&mut *n, u64::MAX) };
            }
        }
    }
    #[inline(always)]
    fn end(&mut self, key: &NakKey, qp: u32) -> Option<u64> {
        match end_sample(self.slot, key, qp) {
            0 => None,
            ns => Some(ns),
        }
    }
}

/// [`RttMap::start`] for the request flow in `slot`: 1 when a sample started, 0 when
/// one waits under `key` already. A subprogram, as [`end_sample`].
#[inline(never)]
fn start_sample(slot: u32, key: &NakKey) -> u32 {
    let wait = RttWait {
        // SAFETY: no arguments.
        sent_ns: unsafe { bpf_ktime_get_ns() },
        slot,
        psn: key.psn,
    };
    if let Err(e) = RTT_WAIT.insert(key, &wait, BPF_NOEXIST as u64) {
        // A sample of another flow waits under the key (the flow's own stale one was
        // cancelled before): that pairing would be a guess.
        if e == -EEXIST {
            bump(STAT_RTT_SHARED_PSN);
        }
        return 0;
    }
    if let Some(n) = psn_count(key.psn) {
        // SAFETY: an entry of the array, shared by all CPUs: added to atomically.
        unsafe { add(&mut *n, 1) };
    }
    1
}

/// [`RttMap::end`] for the flow in `slot`, a response to `qp`: the round trip in ns
/// (at least 1), 0 when no sample of a request flow answering to `qp` waits under
/// `key`. A BPF subprogram, not inlined: the programs call it from every path through
/// the classifier that ends on a response, and inlined, the verifier walked its
/// branches once for each (four times the instructions).
#[inline(never)]
fn end_sample(slot: u32, key: &NakKey, qp: u32) -> u64 {
    end_sample_inline(slot, key, qp).map_or(0, |ns| ns.max(1))
}

#[inline(always)]
fn end_sample_inline(slot: u32, key: &NakKey, qp: u32) -> Option<u64> {
    let n = psn_count(key.psn)?;
    // SAFETY: as above; a plain read (a sample started meanwhile on another CPU is
    // one this response came before).
    if unsafe { *n } == 0 {
        return None;
    }
    // SAFETY: a copy of the entry out of the map.
    let wait = unsafe { *RTT_WAIT.get(key)? };
    let request = FLOW_SLOTS.get_ptr_mut(wait.slot)?;
    // SAFETY: a slot of FLOW_SLOTS; its pairing is written once (racing responses of
    // one pair write the same value), and zeroed with the slot.
    let peer = unsafe { (*request).rtt_peer_qp };
    let Some(paired) = pair_with(peer, qp) else {
        bump(STAT_RTT_OTHER_QP);
        return None;
    };
    if RTT_WAIT.remove(key).is_err() {
        // Another CPU ended it first.
        return None;
    }
    // SAFETY: as above.
    unsafe { add(&mut *n, u64::MAX) };
    // SAFETY: no arguments.
    let rtt = unsafe { bpf_ktime_get_ns() }.saturating_sub(wait.sent_ns);
    // SAFETY: as above; the request flow's CPU may write the marker meanwhile (a
    // stale sample's restart), then the next response sets it right.
    unsafe {
        (*request).rtt_peer_qp = paired;
        (*request).stats.rtt_sample_ended(wait.psn);
    }
    let hist = entry_or_insert(&RTT_HIST, &slot, || RTT_HIST_ZERO.get(0))?;
    // SAFETY: the flow's entry of RTT_HIST.
    unsafe { hist_add(hist, rtt) };
    Some(rtt)
}

/// The entry of `key` in `map`; when there is none, one is made first from `empty`
/// (read only then: a map's zeroed value may be larger than the stack), or by another
/// CPU meanwhile, whose entry is then the one. None when the map is full.
#[inline(always)]
pub fn entry_or_insert<'a, K, V: 'a>(
    map: &HashMap<K, V>,
    key: &K,
    empty: impl FnOnce() -> Option<&'a V>,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, empty()?, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

/// Adds a sample of `ns` to a histogram of a map (RTT_HIST, CNP_TIMES).
///
/// # Safety
/// `hist` is a map value, shared with other CPUs counting on the same flow: its counts
/// are added atomically, min and max written racily (a sample of two ending at once may
/// be lost from them, not from the counts).
#[inline(always)]
pub unsafe fn hist_add(hist: *mut RttHist, ns: u64) {
    // SAFETY: the caller's promise.
    unsafe {
        let h = &mut *hist;
        add(&mut h.samples, 1);
        add(&mut h.sum_ns, ns);
        if h.min_ns == 0 || ns < h.min_ns {
            h.min_ns = ns;
        }
        if ns > h.max_ns {
            h.max_ns = ns;
        }
        // Hidden, so that the compiler keeps the bound the verifier needs.
        let i = opaque(bucket_of(ns));
        if i < RTT_BUCKETS {
            add32(&mut h.buckets[i], 1);
        }
    }
}

/// Per-class, per-reason and flow-table counters (see `roce_common::counters`).
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STATS_LEN, 0);

/// Which generation of CONFIG, QOS and POLICY the programs read (the agent writes
/// the other one, then switches), and the layout version of the maps.
#[map]
pub static GENERATION: Array<Generation> = Array::with_max_entries(1, 0);

/// Ports and defaults, one entry per generation, written by the agent.
#[map]
pub static CONFIG: Array<RuntimeConfig> = Array::with_max_entries(GENERATIONS, 0);

#[inline(always)]
pub fn bump(index: u32) {
    if let Some(c) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU while it runs this program.
        unsafe { *c += 1 };
    }
}

/// The generation this packet reads: read once per program run.
#[inline(always)]
pub fn generation() -> u32 {
    match GENERATION.get(0) {
        Some(g) => g.active & 1,
        None => 0,
    }
}

#[inline(always)]
pub fn runtime_config(generation: u32) -> RuntimeConfig {
    match CONFIG.get(generation) {
        Some(c) => *c,
        None => RuntimeConfig::default(),
    }
}

// ---------------------------------------------------------------------------------
// Host QoS (tc programs, see `roce_common::policy`), written by the agent.

/// DSCP -> priority, lossless flag and VTEP outer DSCP: generation * 64 + DSCP.
#[map]
pub static POLICY: Array<DscpEntry> = Array::with_max_entries(DSCP_COUNT * GENERATIONS, 0);

/// The DSCPs the host policy writes (RoCE data, CNP, remark target), per generation.
#[map]
pub static QOS: Array<QosConfig> = Array::with_max_entries(GENERATIONS, 0);

/// ifindex -> what the tc programs do there, for ifindex < IFACE_DIRECT (all zero:
/// untouched). An array: the lookup on every packet is the cheap kind.
#[map]
pub static IFACE_QOS_DIRECT: Array<IfaceQos> = Array::with_max_entries(IFACE_DIRECT, 0);

/// The same for larger ifindexes. An interface without an entry is untouched.
#[map]
pub static IFACE_QOS: HashMap<u32, IfaceQos> = HashMap::with_max_entries(256, 0);

/// What the tc programs do on `ifindex`; None when nothing.
#[inline(always)]
pub fn iface_qos(ifindex: u32) -> Option<IfaceQos> {
    let q = if ifindex < IFACE_DIRECT {
        *IFACE_QOS_DIRECT.get(ifindex)?
    } else {
        // SAFETY: a plain value copy out of the map.
        *unsafe { IFACE_QOS.get(&ifindex) }?
    };
    if q.is_off() {
        None
    } else {
        Some(q)
    }
}

/// Programs `tc_egress` tail-calls, filled by the agent when it loads the object.
#[map]
pub static TC_TAIL: ProgramArray = ProgramArray::with_max_entries(TC_TAIL_LEN, 0);

/// Decapsulation-side counters per remote VTEP (outer source address).
#[map]
pub static VTEPS: LruPerCpuHashMap<VtepKey, VtepStats> =
    LruPerCpuHashMap::with_max_entries(4096, 0);

/// One generation of POLICY as the shared decision code reads it.
pub struct PolicyMap {
    pub generation: u32,
}

impl DscpTable for PolicyMap {
    #[inline(always)]
    fn entry(&self, dscp: u8) -> Option<DscpEntry> {
        POLICY
            .get(self.generation * DSCP_COUNT + (dscp as u32 & (DSCP_COUNT - 1)))
            .copied()
    }
}

#[inline(always)]
pub fn qos_config(generation: u32) -> QosConfig {
    match QOS.get(generation) {
        Some(c) => *c,
        None => QosConfig::default(),
    }
}
