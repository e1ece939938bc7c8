//! The two engines that count a capture's frames, and the workers that run them on
//! their share of the frames. Both engines end in `(FlowKey, FlowStats)` pairs and
//! the STATS vector:
//! - `reference` ([`Worker`]): the same `walk`, STATS counting
//!   (`roce_common::reference`) and `FlowStats::record` as the kernel program, in
//!   user space, with the tally of each frame;
//! - `kernel` ([`KernelWorker`]): the real `xdp_mirror` program (`xdp_classify` and
//!   the decapsulation of mirror copies), run on each frame
//!   through BPF_PROG_TEST_RUN, its FLOWS and STATS maps read at the end (the tally
//!   comes from a reference pass, run while the programs load).
//!
//! Work is split by host pair ([`Split`]): a worker owns the flows between the pairs
//! of hosts that hash to it, both directions, and sees their frames in capture order
//! (PSN tracking and first/last seen depend on the order within a flow; NAKs and the
//! go-backs they ask for, and the capture's gaps and the responses that decide them,
//! on the order of the two directions of a queue pair, on nothing else), so the
//! workers' tables merge into what one pass would count.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use roce_common::classify::{walk_mirror, MirrorWalk};

use roce_common::config::RuntimeConfig;
use roce_common::counters::{reason_index, STATS_LEN, STAT_FLOW_CREATED};
use roce_common::event::EVENT_PSN_GAP;
use roce_common::flow::FlowStats;
use roce_common::key::FlowKey;
use roce_common::mirror::{MirrorCopy, MirrorTag};
use roce_common::nak::{mirror_scope, NakSet, NAK_KEY_FLAGS};
use roce_common::parsed::Outcome;
use roce_common::parsed::Reason;
use roce_common::policy::Policy;
use roce_common::reference::count_stats;
use roce_common::rtt::RttBook;
use roce_common::wire::ETH_HLEN;

use super::capture::Batch;
use super::cnp_timing::CnpTiming;
use super::gaps::{GapWatch, Verdict};
use super::tally::{check_icrc, FlowExtra, Talker, Talkers};
use super::AnalyzeError;
use crate::datapath::loader::{self, LoadError, LoadOptions, Loaded};
use crate::datapath::testrun::run_once;

/// Frames shorter than this cannot go through BPF_PROG_TEST_RUN (EINVAL); both
/// engines count them as `truncated_eth` without classifying them.
pub const MIN_TEST_RUN_LEN: usize = ETH_HLEN;

/// Which classifier engine counts the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// The real XDP program, run on each frame through BPF_PROG_TEST_RUN.
    Kernel,
    /// The reference classifier of `roce_common` (no privileges needed).
    Reference,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Kernel => "kernel",
            Engine::Reference => "reference",
        })
    }
}

/// What an engine counted: flows (keys normalised: no interface, no direction) and
/// the STATS vector.
pub struct Counted {
    pub flows: Vec<(FlowId, FlowStats)>,
    pub stats: Vec<u64>,
}

/// A flow's identity in a capture: its key and, for the flow of mirror copies
/// (analyze always decapsulates them, as `xdp_mirror` does), their session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId {
    pub key: FlowKey,
    pub mirror: Option<MirrorTag>,
}

impl FlowId {
    pub fn plain(key: FlowKey) -> FlowId {
        FlowId { key, mirror: None }
    }
}

/// A mirror copy's bytes to count and whether its ICRC may be checked: a copy the
/// switch cut (the T bit, or less of the datagram than its IP header declares) is
/// counted with its original length and never checked.
#[inline]
fn copy_length(copy: &MirrorCopy, frame: &[u8]) -> (u32, bool) {
    let kept = frame.len().saturating_sub(copy.eth) as u64;
    let cut = copy.truncated || u64::from(copy.wire_len) > kept;
    (copy.wire_len, !cut)
}

/// The hasher of talkers (rare: non-RoCE frames on a lossless DSCP).
type TalkerHash = foldhash::fast::RandomState;

#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = (a as u128) * (b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The two hashes of a flow's identity, 16 bytes per multiply (the folded multiply of
/// foldhash), computed once per RoCE frame by the reader: its host pair's, which picks
/// the worker, and its own, for the worker's table. `seed` is random per run, so that
/// a crafted capture cannot aim its keys at one bucket (the report does not depend on
/// it). The pair's is the same for both directions of every queue pair between two
/// hosts (its two ends, each an outer and an inner address, combined in either order;
/// the VNI, the key's shape, and for mirror copies their sender as the NAK memory
/// scopes them), so that one worker sees both directions in capture order: NAKs and
/// the go-backs they ask for (`roce_common::nak`), the capture's gaps and the
/// responses that decide them (`gaps`). The flow's own folds in the rest of its
/// identity.
#[inline]
pub fn split_hashes(id: &FlowId, seed: u64) -> (u64, u64) {
    const C: [u64; 4] = [
        0x243F_6A88_85A3_08D3,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    ];
    let k = &id.key;
    let w = |a: u32, b: u32| u64::from(a) | (u64::from(b) << 32);
    // One end of the pair: its outer and inner address, seeded, 16 bytes a multiply.
    let end = |a: &[u32; 4], i: &[u32; 4]| {
        let x = fold(w(a[0], a[1]) ^ seed, w(a[2], a[3]) ^ C[0]);
        fold(x ^ w(i[0], i[1]), w(i[2], i[3]) ^ C[1])
    };
    let (s, d) = (end(&k.src, &k.inner_src), end(&k.dst, &k.inner_dst));
    let scope = id.mirror.as_ref().map_or(0, mirror_scope);
    // The two ends combined in a way that does not depend on their order.
    let pair = fold(
        s ^ d ^ w(k.vni, k.flags & NAK_KEY_FLAGS),
        s.wrapping_add(d) ^ w(scope, 0) ^ C[2],
    );
    // The flow: its ends in order, its QP, its flags and interface.
    let mut flow = fold(
        s ^ w(k.dest_qp, k.flags) ^ C[3],
        d.rotate_left(29) ^ w(k.ifindex, k.vni),
    );
    if let Some(t) = &id.mirror {
        let x = fold(
            flow ^ w(t.source[0], t.source[1]),
            w(t.source[2], t.source[3]),
        );
        flow = fold(x ^ 0x9E37_79B9_7F4A_7C15, w(t.session, t.kind) ^ seed);
    }
    (pair, flow)
}

/// A flow key with its hash, as the workers' tables hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keyed {
    pub hash: u64,
    pub key: FlowId,
}

impl Hash for Keyed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher of [`Keyed`]: its hash is already computed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in rather than lose it.
        for b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type PrehashedState = BuildHasherDefault<Prehashed>;

/// One flow of a worker: the reference engine's counters and the tally's.
#[derive(Clone, Copy, Debug, Default)]
pub struct FlowEntry {
    pub stats: FlowStats,
    pub extra: FlowExtra,
}

/// What one worker counted and tallied.
pub struct Shard {
    pub flows: HashMap<Keyed, FlowEntry, PrehashedState>,
    /// STATS as the reference engine counts them.
    pub stats: [u64; STATS_LEN as usize],
    pub talkers: Talkers,
    pub icrc_checked: u64,
    /// NAKs waiting for their go-back, as the kernel's NAK_PSNS holds them.
    pub naks: NakSet,
    /// PSN gaps waiting for the verdict of the other direction.
    pub gaps: GapWatch<Keyed>,
    /// Round-trip samples waiting for their response, and each flow's round trips
    /// (`roce_common::rtt`): a capture sees both directions.
    pub rtt: RttBook<Keyed>,
    /// CE marks waiting for their CNP, and the CNP flows' times (`cnp_timing`).
    pub cnps: CnpTiming<Keyed>,
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            flows: HashMap::default(),
            stats: [0; STATS_LEN as usize],
            talkers: Talkers::default(),
            icrc_checked: 0,
            naks: NakSet::default(),
            gaps: GapWatch::default(),
            rtt: RttBook::default(),
            cnps: CnpTiming::default(),
        }
    }
}

/// Which worker counts each frame: the one its flow key (RoCE), its talker
/// (non-RoCE IP on a lossless DSCP) or, for frames that count in STATS only, its
/// number points to. Run by the reader on every batch, so that a worker walks only
/// its own frames.
pub struct Split<'a> {
    workers: u64,
    cfg: RuntimeConfig,
    policy: &'a Policy,
    seed: u64,
    talker: TalkerHash,
}

impl<'a> Split<'a> {
    pub fn new(workers: usize, cfg: RuntimeConfig, policy: &'a Policy) -> Self {
        Split {
            workers: workers.max(1) as u64,
            cfg,
            policy,
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            talker: TalkerHash::default(),
        }
    }

    /// `0..workers` from a hash: a multiply mixes every bit of it into the high half
    /// (the table of the worker uses the low bits), which is scaled down.
    #[inline]
    fn of_hash(&self, h: u64) -> u16 {
        let mixed = h.wrapping_mul(0x9FB2_1C65_1E98_DF25) >> 32;
        ((mixed * self.workers) >> 32) as u16
    }

    /// Assigns every frame of `b` to its worker, with the key's hash, and when `icrc`
    /// the ICRC verdicts too (work that needs no flow state: done here, where the
    /// frame is walked first, when the workers are the slower side).
    pub fn assign(&self, b: &mut Batch, icrc: bool) {
        for i in 0..b.len() {
            let f = b.frame(i);
            let MirrorWalk { walk: w, copy } = walk_mirror(f.data, &self.cfg);
            let (owner, hash, icrc) = match &w.outcome {
                Outcome::Flow(p) => {
                    let id = FlowId {
                        key: p.key,
                        mirror: copy.map(|c| c.tag),
                    };
                    let (pair, h) = split_hashes(&id, self.seed);
                    let checkable = copy.is_none_or(|c| copy_length(&c, f.data).1);
                    let icrc = icrc.then(|| {
                        if checkable {
                            check_icrc(f.data, p, w.layers.roce_ip(p.tunnelled))
                        } else {
                            None
                        }
                    });
                    (self.of_hash(pair), h, icrc)
                }
                _ => match Talker::of(&f, &w, self.policy) {
                    Some(t) => (self.of_hash(self.talker.hash_one(t)), 0, None),
                    None => ((f.number % self.workers) as u16, 0, None),
                },
            };
            b.assign(i, owner, hash, icrc);
        }
    }
}

/// A worker's share of the work: the frames of a batch that [`Split`] gave it.
pub trait Work: Send {
    fn process(&mut self, b: &Batch) -> Result<(), AnalyzeError>;
}

/// A reference-engine worker: counts its frames and tallies them.
pub struct Worker<'a> {
    index: u16,
    cfg: RuntimeConfig,
    policy: &'a Policy,
    pub shard: Shard,
}

impl<'a> Worker<'a> {
    /// Worker `index`.
    pub fn new(index: usize, cfg: RuntimeConfig, policy: &'a Policy) -> Self {
        Worker {
            index: index as u16,
            cfg,
            policy,
            shard: Shard::default(),
        }
    }
}

impl Work for Worker<'_> {
    /// Counts the frames of `b` that are this worker's.
    fn process(&mut self, b: &Batch) -> Result<(), AnalyzeError> {
        for i in 0..b.len() {
            if b.owner(i) != self.index {
                continue;
            }
            let f = b.frame(i);
            let MirrorWalk { walk: w, copy } = walk_mirror(f.data, &self.cfg);
            let shard = &mut self.shard;
            count_stats(&mut shard.stats, &w.outcome);
            match &w.outcome {
                Outcome::Flow(p) => {
                    let key = Keyed {
                        hash: b.hash(i),
                        key: FlowId {
                            key: p.key,
                            mirror: copy.map(|c| c.tag),
                        },
                    };
                    // A copy counts the mirrored frame's original length.
                    let (len, checkable) = match &copy {
                        Some(c) => copy_length(c, f.data),
                        None => (f.data.len() as u32, true),
                    };
                    let e = shard.flows.entry(key).or_insert_with(|| {
                        shard.stats[STAT_FLOW_CREATED as usize] += 1;
                        FlowEntry::default()
                    });
                    // A tick that moves with every frame: first/last seen exact.
                    let tick = e.stats.packets as u32;
                    let ts = f.ts_ns;
                    let scope = copy.map_or(0, |c| mirror_scope(&c.tag));
                    shard.naks.scope = scope;
                    shard.naks.now_ns = ts;
                    let (next, resent) = (e.stats.psn.next, e.stats.retransmitted_packets);
                    shard.rtt.counting(&key, ts);
                    let trouble = e.stats.record(
                        p,
                        len,
                        tick,
                        || ts,
                        self.cfg.default_pmtu_log2,
                        &mut shard.naks,
                        &mut shard.rtt,
                    );
                    let resent = e.stats.retransmitted_packets != resent;
                    let icrc = match b.icrc(i) {
                        Some(v) => v,
                        None if checkable => check_icrc(f.data, p, w.layers.roce_ip(p.tunnelled)),
                        None => None,
                    };
                    let counted = copy.map(|_| len);
                    e.extra.observe(&f, p, icrc, counted, self.policy);
                    if icrc.is_some() {
                        shard.icrc_checked += 1;
                    }
                    shard.cnps.packet(p, &key, ts, scope);
                    if let Some((request, psn)) = shard.rtt.ended() {
                        if let Some(r) = shard.flows.get_mut(&request) {
                            r.stats.rtt_sample_ended(psn);
                        }
                    }
                    if trouble.kind == EVENT_PSN_GAP {
                        shard.gaps.gap(p, scope, key, next);
                    } else if !shard.gaps.is_empty() {
                        watch_gaps(shard, p, scope, &key, resent);
                    }
                }
                _ => {
                    if let Some(t) = Talker::of(&f, &w, self.policy) {
                        shard.talkers.observe(t, f.number);
                    }
                }
            }
        }
        Ok(())
    }
}

/// What a packet that is no gap says about the gaps waiting for a verdict: a
/// retransmission of a missing PSN, or a response of the other direction
/// (`gaps::GapWatch`). The verdicts go to the request flows' tallies.
fn watch_gaps(
    shard: &mut Shard,
    p: &roce_common::parsed::Parsed,
    scope: u32,
    key: &Keyed,
    resent: bool,
) {
    let decided = if resent {
        let flows = shard.gaps.resent(p, scope, key);
        flows.into_iter().map(|k| (k, Verdict::Fabric)).collect()
    } else {
        let flows = &shard.flows;
        shard
            .gaps
            .answered(p, scope, |k| flows.get(k).map(|e| e.stats.psn.next))
    };
    for (k, verdict) in decided {
        if let Some(e) = shard.flows.get_mut(&k) {
            match verdict {
                Verdict::Capture => e.extra.capture_gaps += 1,
                Verdict::Fabric => e.extra.fabric_gaps += 1,
            }
        }
    }
}

/// A kernel-engine worker: runs its frames through `xdp_classify` and nothing else
/// (the tally comes from a reference pass). Its thread stays on one CPU
/// ([`pin_to_cpu`]), so that the workers' test runs never share one.
pub struct KernelWorker {
    index: u16,
    prog: OwnedFd,
    /// Frames too short for BPF_PROG_TEST_RUN.
    pub short: u64,
}

impl KernelWorker {
    pub fn new(index: usize, prog: OwnedFd) -> Self {
        KernelWorker {
            index: index as u16,
            prog,
            short: 0,
        }
    }
}

impl Work for KernelWorker {
    fn process(&mut self, b: &Batch) -> Result<(), AnalyzeError> {
        for i in 0..b.len() {
            if b.owner(i) != self.index {
                continue;
            }
            let f = b.frame(i);
            if f.data.len() < MIN_TEST_RUN_LEN {
                self.short += 1;
                continue;
            }
            run_once(self.prog.as_fd(), f.data).map_err(|source| AnalyzeError::TestRun {
                frame: f.number,
                source,
            })?;
        }
        Ok(())
    }
}

/// `n` kernel-engine workers, each with its own descriptor of `prog` (the program
/// named `name`), worker `i` pinned to `cpus[i % cpus.len()]`, none when `cpus` is
/// empty.
pub fn kernel_workers(
    prog: BorrowedFd<'_>,
    name: &'static str,
    n: usize,
    cpus: &[usize],
) -> Result<Vec<(KernelWorker, Option<usize>)>, AnalyzeError> {
    (0..n)
        .map(|i| {
            let fd = prog
                .try_clone_to_owned()
                .map_err(|source| AnalyzeError::Load(LoadError::Fd { name, source }))?;
            let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
            Ok((KernelWorker::new(i, fd), cpu))
        })
        .collect()
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills a zeroed cpu_set_t of the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu`: BPF_PROG_TEST_RUN runs the program on the
/// caller's CPU, and two workers on one CPU would only take turns.
pub fn pin_to_cpu(cpu: usize) -> Result<(), AnalyzeError> {
    // SAFETY: plain libc calls on a zeroed cpu_set_t of the right size.
    let rc = unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one)
    };
    if rc != 0 {
        return Err(AnalyzeError::Pin {
            cpu,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Loads the classifiers for the kernel engine, `xdp_mirror` too (no events: nothing reads them; no
/// egress flows: nothing leaves an interface) with no free flow slots: the caller
/// queues as many as the capture has flows (`Loaded::free_first_slots`).
pub fn load_kernel(opts: &LoadOptions) -> Result<Loaded, AnalyzeError> {
    let opts = LoadOptions {
        config: RuntimeConfig {
            events_sample: roce_common::event::EVENTS_OFF,
            ..opts.config
        },
        egress_flows: false,
        queue_all_slots: false,
        ..*opts
    };
    let mut loaded = loader::load(&opts)?;
    // The program the workers run, loaded here while the first pass reads.
    loaded.xdp_mirror_fd()?;
    Ok(loaded)
}

/// The reference engine's counts: the workers' flows (each key in one worker) and
/// their STATS summed.
pub fn counted_reference<'a>(shards: impl IntoIterator<Item = &'a Shard>) -> Counted {
    let mut stats = vec![0u64; STATS_LEN as usize];
    let mut flows = Vec::new();
    for s in shards {
        for (a, b) in stats.iter_mut().zip(s.stats.iter()) {
            *a += b;
        }
        flows.extend(s.flows.iter().map(|(k, e)| (k.key, e.stats)));
    }
    Counted { flows, stats }
}

/// The kernel engine's counts: FLOWS and STATS as the program left them, plus the
/// `short` frames too short to run.
pub fn counted_kernel(loaded: &Loaded, short: u64) -> Result<Counted, AnalyzeError> {
    let mut stats = loaded.stats()?;
    stats.resize(STATS_LEN as usize, 0);
    stats[reason_index(Reason::TruncatedEth) as usize] += short;
    // Test runs arrive on the loopback device: drop the interface.
    let mut merged: HashMap<FlowId, FlowStats> = HashMap::new();
    for (mut k, st) in loaded.flows()? {
        k.ifindex = 0;
        merged.entry(FlowId::plain(k)).or_default().merge(&st);
    }
    for (mut k, st) in loaded.mirrored_flows()? {
        k.key.ifindex = 0;
        let id = FlowId {
            key: k.key,
            mirror: Some(k.tag),
        };
        merged.entry(id).or_default().merge(&st);
    }
    Ok(Counted {
        flows: merged.into_iter().collect(),
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::key::{addr_v4_mapped, KEY_TUNNELLED};

    fn flow(src: u8, dst: u8, inner: Option<(u8, u8)>, qp: u32) -> FlowId {
        let a = |last| addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, last]));
        let mut key = FlowKey {
            src: a(src),
            dst: a(dst),
            dest_qp: qp,
            ..FlowKey::default()
        };
        if let Some((s, d)) = inner {
            let i = |last| addr_v4_mapped(u32::from_ne_bytes([198, 19, 0, last]));
            (key.inner_src, key.inner_dst, key.vni) = (i(s), i(d), 5001);
            key.flags = KEY_TUNNELLED;
        }
        FlowId::plain(key)
    }

    #[test]
    fn both_directions_of_a_host_pair_share_the_pair_hash_and_no_flow_hash() {
        let seed = 0x1234_5678_9ABC_DEF0;
        for inner in [None, Some((1, 2))] {
            let back = inner.map(|(s, d)| (d, s));
            let (p1, f1) = split_hashes(&flow(1, 2, inner, 0x11), seed);
            let (p2, f2) = split_hashes(&flow(2, 1, back, 0x22), seed);
            let (p3, f3) = split_hashes(&flow(1, 2, inner, 0x33), seed);
            assert_eq!((p1, p1), (p2, p3), "one pair, {inner:?}");
            assert!(f1 != f2 && f1 != f3 && f2 != f3, "{inner:?}");
            // The same QP the other way round is another flow.
            let (_, f4) = split_hashes(&flow(2, 1, back, 0x11), seed);
            assert_ne!(f1, f4);
            // Another pair: another hash.
            let (p5, _) = split_hashes(&flow(1, 3, inner, 0x11), seed);
            assert_ne!(p1, p5);
        }
        // Outer and inner ends swap together: an outer pair reversed around the same
        // inner direction is another pair of ends.
        let (p, _) = split_hashes(&flow(1, 2, Some((1, 2)), 1), seed);
        let (q, _) = split_hashes(&flow(2, 1, Some((1, 2)), 1), seed);
        assert_ne!(p, q);
    }
}
