//! Passive round-trip times (the `rtt` rule in the README, "The flow document"): a
//! request leaving the host is answered by a response arriving on the other flow of
//! its queue pair, and the time between the two is the round trip as the host sees it
//! (network both ways, the responder's turnaround, no requester software).
//!
//! Which response answers which request: the responder's ACK carries the PSN of the
//! request it acknowledges (READ and atomic responses the PSN of their request), and
//! PSNs start at random in a 24-bit space. So a sample is kept under the two hosts'
//! addresses and the request's PSN (the [`NakKey`] a NAK would be kept under), and the
//! response that names that PSN between the same two hosts ends it. Each request flow
//! keeps one sample outstanding (as ePPing does per TCP flow), on a request that asks
//! for a response (AckReq, READ, atomics); a request flow whose sample no response
//! named (a coalesced ACK acknowledged a later PSN) starts another after
//! [`RTT_SAMPLE_STALE_NS`]. Karn's rule: a retransmission while a sample waits voids
//! it, as the response may answer either copy.
//!
//! Pairing, never guessed: a request flow's responses all go to one QP (its
//! requester's), which the requests do not name. The first response that ends one of
//! the flow's samples names it ([`RTT_PEER_KNOWN`]: the kernel keeps it in the
//! request flow's slot); from then on a response to another QP that happens to name a
//! waiting sample's hosts and PSN ends nothing (`other_qp`). Where two queue pairs
//! between the same hosts sample one PSN at once, the second starts none
//! (`shared_psn`). Both are counted (`counters.rtt_unpaired`): samples not taken,
//! never samples of the wrong pair. Where the host has a QP table, `qps` pairs the
//! two directions from it exactly.
//!
//! The sample lands on the flow the response travels in (the requester's QP's inbound
//! flow): a histogram of log-linear buckets ([`RttHist`]), sixteen to an octave from
//! 1 µs, from which the p50 and p99 are read (to within 3.1%).

use crate::nak::NakKey;

/// The request flow's requester QP is known (`FlowSlot::rtt_peer_qp`: this bit and
/// the QPN; 0 before its first sample ended).
pub const RTT_PEER_KNOWN: u32 = 1 << 31;

/// What a response whose destination QP is `qp` makes of a waiting sample of a
/// request flow whose requester QP reads `peer` (`FlowSlot::rtt_peer_qp`): the value
/// to keep when it ends the sample, `None` when the flow answers to another QP.
#[inline(always)]
pub fn pair_with(peer: u32, qp: u32) -> Option<u32> {
    let mine = qp | RTT_PEER_KNOWN;
    if peer == 0 || peer == mine {
        Some(mine)
    } else {
        None
    }
}

/// A request flow whose sample no response ended within this long starts another.
pub const RTT_SAMPLE_STALE_NS: u64 = 1_000_000_000;

/// Buckets per octave, of equal width in each: 6.25% of the octave's start wide at
/// most, so a bucket's middle is within 3.1% of any time in it.
pub const RTT_SUB_BUCKETS: usize = 16;
const RTT_SUB_BITS: u32 = 4;
/// Octaves from 2^10 ns (about 1 µs) on: the last bucket ends at 2^32 ns (4.3 s) and
/// takes all longer times; the first takes all shorter ones too.
pub const RTT_OCTAVES: usize = 22;
pub const RTT_BUCKETS: usize = RTT_SUB_BUCKETS * RTT_OCTAVES;
/// log2 of the first bucket's lower bound in ns.
const RTT_FIRST_OCTAVE_LOG2: u32 = 10;

/// One flow's round-trip times. Whole words; 1,440 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RttHist {
    pub samples: u64,
    /// The shortest and longest sample, ns (min is 0 before the first).
    pub min_ns: u64,
    pub max_ns: u64,
    pub sum_ns: u64,
    /// Samples by [`bucket_of`].
    pub buckets: [u32; RTT_BUCKETS],
}

impl Default for RttHist {
    fn default() -> Self {
        RttHist {
            samples: 0,
            min_ns: 0,
            max_ns: 0,
            sum_ns: 0,
            buckets: [0; RTT_BUCKETS],
        }
    }
}

/// A sample waiting in the kernel's RTT_WAIT: when its request left
/// (bpf_ktime_get_ns), the request flow's slot and the PSN.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttWait {
    pub sent_ns: u64,
    pub slot: u32,
    pub psn: u32,
}

/// The bucket of a round trip of `ns`.
#[inline(always)]
pub fn bucket_of(ns: u64) -> usize {
    if ns < 1 << RTT_FIRST_OCTAVE_LOG2 {
        return 0;
    }
    let log2 = 63 - ns.leading_zeros();
    let octave = (log2 - RTT_FIRST_OCTAVE_LOG2) as usize;
    if octave >= RTT_OCTAVES {
        return RTT_BUCKETS - 1;
    }
    // The bits after the leading one.
    let sub = ((ns >> (log2 - RTT_SUB_BITS)) & (RTT_SUB_BUCKETS as u64 - 1)) as usize;
    octave * RTT_SUB_BUCKETS + sub
}

/// The lower bound of bucket `i`, ns.
pub fn bucket_floor_ns(i: usize) -> u64 {
    let (octave, sub) = (i / RTT_SUB_BUCKETS, i % RTT_SUB_BUCKETS);
    ((RTT_SUB_BUCKETS + sub) as u64) << (octave as u32 + RTT_FIRST_OCTAVE_LOG2 - RTT_SUB_BITS)
}

impl RttHist {
    /// Adds one sample (the user side's; the kernel adds atomically, `ebpf/src/maps.rs`).
    pub fn add(&mut self, ns: u64) {
        if self.samples == 0 || ns < self.min_ns {
            self.min_ns = ns;
        }
        self.max_ns = self.max_ns.max(ns);
        self.samples += 1;
        self.sum_ns = self.sum_ns.wrapping_add(ns);
        self.buckets[bucket_of(ns)] += 1;
    }

    /// Adds another histogram of the same flow (kept apart: other tables, workers).
    pub fn merge(&mut self, o: &RttHist) {
        if o.samples == 0 {
            return;
        }
        if self.samples == 0 || o.min_ns < self.min_ns {
            self.min_ns = o.min_ns;
        }
        self.max_ns = self.max_ns.max(o.max_ns);
        self.samples += o.samples;
        self.sum_ns = self.sum_ns.wrapping_add(o.sum_ns);
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    #[cfg(any(feature = "std", test))]
    /// The `q` quantile (0 < q <= 1), ns: the geometric middle of the bucket that holds
    /// it, kept within the shortest and longest sample (the longest itself for the last
    /// rank). None without samples.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().map(|&b| u64::from(b)).sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: the ceil(q * total)-th sample.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        // The extremes are known exactly.
        if rank == total && self.samples == total {
            return Some(self.max_ns);
        }
        let mut seen = 0u64;
        for (i, &b) in self.buckets.iter().enumerate() {
            seen += u64::from(b);
            if seen >= rank {
                let lo = bucket_floor_ns(i) as f64;
                let hi = if i + 1 < RTT_BUCKETS {
                    bucket_floor_ns(i + 1) as f64
                } else {
                    lo * 2.0
                };
                let mid = (lo * hi).sqrt() as u64;
                return Some(mid.clamp(self.min_ns, self.max_ns.max(self.min_ns)));
            }
        }
        None
    }
}

/// Where round-trip samples wait for their response. `FlowStats::record` decides which
/// request starts one and which response ends one; the memory keeps them and the
/// histograms.
pub trait RttMemory {
    /// Whether requests counted here start samples: their responses come back where
    /// samples are ended (tc egress; a mirror session and a capture see both).
    fn starts(&self) -> bool;
    /// Whether responses counted here end samples (XDP ingress; mirror; capture).
    fn ends(&self) -> bool;
    /// Starts a sample of the request under `key` on the flow being counted; false when
    /// a sample waits under that key already (another QP between the same hosts at the
    /// same PSN: counted as `shared_psn`).
    fn start(&mut self, key: &NakKey) -> bool;
    /// Whether a sample may wait at `psn` (a cheap test before [`RttMemory::end`]
    /// builds its key; false only when none does).
    fn may_end(&self, _psn: u32) -> bool {
        true
    }
    /// Forgets the sample under `key` (its request was resent, or it went stale).
    fn cancel(&mut self, key: &NakKey);
    /// Ends the sample under `key`, if one waits and its request flow answers to `qp`
    /// (the response's destination QP; [`pair_with`]: else counted as `other_qp`):
    /// adds the round trip to the flow being counted and lets the request flow start
    /// another. The round trip in ns.
    fn end(&mut self, key: &NakKey, qp: u32) -> Option<u64>;
    /// Round trips longer than this (µs) are spikes (`event::EVENT_RTT_SPIKE`); 0: none.
    fn spike_us(&self) -> u32 {
        0
    }
}

/// No round trips: for callers that count a flow without its other direction.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRtt;

impl RttMemory for NoRtt {
    fn starts(&self) -> bool {
        false
    }
    fn ends(&self) -> bool {
        false
    }
    fn start(&mut self, _: &NakKey) -> bool {
        false
    }
    fn cancel(&mut self, _: &NakKey) {}
    fn end(&mut self, _: &NakKey, _: u32) -> Option<u64> {
        None
    }
}

/// The user side's memory, for flows named by `K`: the samples waiting, each flow's
/// histogram, and the clock (the capture's time of the frame being counted). The
/// caller says which flow is counted ([`RttBook::counting`]) and, after the count,
/// clears the sample marker of the request flow whose sample a response ended
/// ([`RttBook::ended`]).
#[cfg(any(feature = "std", test))]
#[derive(Clone, Debug)]
pub struct RttBook<K> {
    /// Sample key -> (start, the request flow).
    waiting: std::collections::HashMap<NakKey, (u64, K)>,
    pub hists: std::collections::HashMap<K, RttHist>,
    /// The flow being counted and the time of its frame.
    current: Option<K>,
    now_ns: u64,
    /// Whether samples start and end here.
    pub enabled: bool,
    /// The request flow and PSN of the sample the last count ended.
    ended: Option<(K, u32)>,
    /// Each request flow's requester QP, as [`pair_with`] keeps it.
    peers: std::collections::HashMap<K, u32>,
    /// Samples not taken, as the kernel counts them (`counters.rtt_unpaired`).
    pub shared_psn: u64,
    pub other_qp: u64,
}

#[cfg(any(feature = "std", test))]
impl<K> Default for RttBook<K> {
    fn default() -> Self {
        RttBook {
            waiting: Default::default(),
            hists: Default::default(),
            current: None,
            now_ns: 0,
            enabled: true,
            ended: None,
            peers: Default::default(),
            shared_psn: 0,
            other_qp: 0,
        }
    }
}

/// Samples the user side's memory keeps waiting at most (the kernel's LRU, RTT_WAIT,
/// forgets the least recently used): beyond, all are forgotten, a burst of missed
/// samples rather than a memory that grows with a capture.
#[cfg(any(feature = "std", test))]
pub const RTT_BOOK_MAX_WAITING: usize = 1 << 16;

#[cfg(any(feature = "std", test))]
impl<K: Clone + Eq + core::hash::Hash> RttBook<K> {
    /// The next count is of flow `k`'s frame at `now_ns`.
    pub fn counting(&mut self, k: &K, now_ns: u64) {
        self.current = Some(k.clone());
        self.now_ns = now_ns;
    }

    /// The request flow and PSN whose sample the last count ended, once.
    pub fn ended(&mut self) -> Option<(K, u32)> {
        self.ended.take()
    }

    /// Samples waiting for their response.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(any(feature = "std", test))]
impl<K: Clone + Eq + core::hash::Hash> RttMemory for RttBook<K> {
    fn starts(&self) -> bool {
        self.enabled
    }
    fn ends(&self) -> bool {
        self.enabled
    }
    fn start(&mut self, key: &NakKey) -> bool {
        let Some(k) = self.current.clone() else {
            return false;
        };
        if self.waiting.contains_key(key) {
            self.shared_psn += 1;
            return false;
        }
        if self.waiting.len() >= RTT_BOOK_MAX_WAITING {
            self.waiting.clear();
        }
        self.waiting.insert(*key, (self.now_ns, k));
        true
    }
    fn cancel(&mut self, key: &NakKey) {
        self.waiting.remove(key);
    }
    fn end(&mut self, key: &NakKey, qp: u32) -> Option<u64> {
        let current = self.current.clone()?;
        let (_, request) = self.waiting.get(key)?;
        let peer = self.peers.get(request).copied().unwrap_or(0);
        let Some(paired) = pair_with(peer, qp) else {
            self.other_qp += 1;
            return None;
        };
        let (sent, request) = self.waiting.remove(key)?;
        self.peers.insert(request.clone(), paired);
        let rtt = self.now_ns.saturating_sub(sent);
        self.hists.entry(current).or_default().add(rtt);
        self.ended = Some((request, key.psn));
        Some(rtt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_sixteenths_of_octaves_from_one_microsecond() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 0);
        assert_eq!(bucket_of(1024 + 63), 0);
        assert_eq!(bucket_of(1024 + 64), 1);
        assert_eq!(bucket_of(2047), 15);
        assert_eq!(bucket_of(2048), 16);
        assert_eq!(bucket_of(u64::MAX), RTT_BUCKETS - 1);
        assert_eq!(bucket_of(1 << 32), RTT_BUCKETS - 1);
        assert_eq!(bucket_of((1 << 32) - 1), RTT_BUCKETS - 1);
        for i in 0..RTT_BUCKETS {
            let floor = bucket_floor_ns(i);
            assert_eq!(bucket_of(floor), i, "floor of {i}");
            assert_eq!(bucket_of(floor - 1), i.saturating_sub(1), "below {i}");
        }
    }

    #[test]
    fn quantiles_are_within_five_percent() {
        for d in [
            3_000u64,
            57_000,
            1_050_000,
            5_020_000,
            20_100_000,
            900_000_000,
        ] {
            let mut h = RttHist::default();
            // A spread of +-1% around d, and one outlier far above.
            for i in 0..99 {
                h.add(d - d / 100 + d * i / 4900);
            }
            h.add(d * 40);
            let p50 = h.quantile_ns(0.5).unwrap() as f64;
            assert!((p50 / d as f64 - 1.0).abs() < 0.05, "p50 {p50} of {d}");
            let p99 = h.quantile_ns(0.99).unwrap() as f64;
            assert!((p99 / d as f64 - 1.0).abs() < 0.05, "p99 {p99} of {d}");
            assert_eq!(h.quantile_ns(1.0), Some(d * 40));
            assert_eq!(h.samples, 100);
            assert_eq!(h.min_ns, d - d / 100);
        }
        assert_eq!(RttHist::default().quantile_ns(0.5), None);
    }

    #[test]
    fn a_book_ends_a_sample_once_on_the_response_flow() {
        let mut b = RttBook::<&str>::default();
        let key = NakKey {
            psn: 7,
            ..Default::default()
        };
        b.counting(&"requests", 1_000);
        assert!(b.start(&key));
        assert!(!b.start(&key), "one sample a key");
        assert_eq!(b.shared_psn, 1);
        b.counting(&"acks", 51_000);
        assert_eq!(b.end(&key, 17), Some(50_000));
        assert_eq!(b.ended(), Some(("requests", 7)));
        assert_eq!(b.end(&key, 17), None, "ended once");
        assert_eq!(b.hists["acks"].samples, 1);
        assert!(!b.hists.contains_key("requests"));
        b.counting(&"requests", 60_000);
        assert!(b.start(&key));
        b.cancel(&key);
        assert_eq!(b.end(&key, 17), None);
        assert_eq!(b.other_qp, 0);
    }

    #[test]
    fn a_request_flow_pairs_with_the_qp_its_first_sample_answered() {
        let mut b = RttBook::<&str>::default();
        let at = |psn| NakKey {
            psn,
            ..Default::default()
        };
        b.counting(&"requests", 0);
        assert!(b.start(&at(100)));
        b.counting(&"acks to 17", 10_000);
        assert_eq!(b.end(&at(100), 17), Some(10_000));
        // Another QP's ACK at the PSN the flow samples next ends nothing, and the
        // sample still waits for its own response.
        b.counting(&"requests", 20_000);
        assert!(b.start(&at(200)));
        b.counting(&"acks to 18", 25_000);
        assert_eq!(b.end(&at(200), 18), None);
        assert_eq!(b.other_qp, 1);
        assert_eq!(b.waiting(), 1);
        b.counting(&"acks to 17", 30_000);
        assert_eq!(b.end(&at(200), 17), Some(10_000));
        assert!(!b.hists.contains_key("acks to 18"));
        assert_eq!(pair_with(0, 17), Some(17 | RTT_PEER_KNOWN));
        assert_eq!(
            pair_with(17 | RTT_PEER_KNOWN, 17),
            Some(17 | RTT_PEER_KNOWN)
        );
        assert_eq!(pair_with(17 | RTT_PEER_KNOWN, 0), None);
    }
}
