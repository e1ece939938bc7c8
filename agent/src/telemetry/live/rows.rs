//! The rows of one poll: each flow's counters as the kernel counts them and its key,
//! compact, and how a row reads back as the document's [`Flow`], as the [`Figures`]
//! `/metrics` sums, as its rate and as its place in the document's order.
//!
//! A row (80 bytes) holds a flow's counters, those that most flows never see (Not-ECT
//! and ECT(1) packets, CNPs, NAKs, RNR NAKs, PSN gaps, retransmissions) apart for the
//! rows that have any; its key in 16 bytes (a plain IPv4 flow's addresses; for IPv6 and tunnelled
//! flows an offset into `words`, where their addresses, VNI, inner ECN counts and outer
//! port lie);
//! its interface as an index into the poll's names. Its rate is the differences since
//! the previous poll (24 bytes). Rows stay in the order the kernel handed them over
//! (hash-bucket order, the same from one poll to the next for the flows that stay);
//! `order` lists them in the document's order ([`Flow::canonical_cmp`]).

use roce_common::cnp::CnpWrongClass;
use roce_common::flow::FlowStats;
use roce_common::key::{
    FlowKey, FlowKeyMirror, KEY_EGRESS, KEY_INNER_V6, KEY_MIRROR, KEY_OUTER_V6, KEY_TUNNELLED,
};
use roce_common::mirror::{
    MirrorTag, MIRROR_ERSPAN2, MIRROR_ERSPAN3, MIRROR_GRE, MIRROR_KIND_MASK, MIRROR_SOURCE_V6,
};
use roce_common::rtt::{RttHist, RTT_OCTAVES, RTT_SUB_BUCKETS};

use super::Figures;
use crate::doc::{key_addr, Direction, Ecn, Flow, Rtt};
use crate::telemetry::rates::{self, Totals};

/// One flow: the kernel's counters, CPUs merged, and its key, compact. The counters
/// that most flows never see (see [`Rare`]) live in `RowTable::rare`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Row {
    pub(super) packets: u64,
    pub(super) bytes: u64,
    /// Outer ECT(0) and CE packets (`FlowStats::ecn[2]`, `[3]`).
    pub(super) ect0: u64,
    pub(super) ce: u64,
    pub(super) acks: u64,
    pub(super) first_seen_ns: u64,
    pub(super) last_seen_ns: u64,
    /// 1 + the index of the row's [`Rare`] counters in `RowTable::rare`; 0: all zero.
    pub(super) rare: u32,
    /// A plain IPv4 flow's outer source address (raw, network order); for the others,
    /// where the rest of the key starts in `RowTable::words`.
    pub(super) src: u32,
    /// A plain IPv4 flow's outer destination address (raw).
    pub(super) dst: u32,
    pub(super) dest_qp: u32,
    /// The interface's name: an index into `RowTable::names`, which is sorted.
    pub(super) iface: u16,
    pub(super) sport: u16,
    /// `KEY_OUTER_V6 | KEY_INNER_V6 | KEY_TUNNELLED | KEY_EGRESS | KEY_MIRROR` of the
    /// flow key.
    pub(super) flags: u8,
    pub(super) last_dscp: u8,
}

/// Key bits a row keeps (all `FlowKey::flags` has).
pub(super) const ROW_FLAGS: u32 =
    KEY_OUTER_V6 | KEY_INNER_V6 | KEY_TUNNELLED | KEY_EGRESS | KEY_MIRROR;

impl Row {
    /// Whether the key lies in `words` (IPv6, tunnelled or mirrored) rather than in
    /// the row.
    pub(super) fn wide(&self) -> bool {
        self.flags as u32 & (KEY_OUTER_V6 | KEY_TUNNELLED | KEY_MIRROR) != 0
    }
    /// A mirrored flow: its session's words (kind, session, sender) come first in
    /// `words`, before the rest of the key.
    pub(super) fn mirrored(&self) -> bool {
        self.flags as u32 & KEY_MIRROR != 0
    }
    pub(super) fn tunnelled(&self) -> bool {
        self.flags as u32 & KEY_TUNNELLED != 0
    }
    pub(super) fn outer_v6(&self) -> bool {
        self.flags as u32 & KEY_OUTER_V6 != 0
    }
    pub(super) fn inner_v6(&self) -> bool {
        self.flags as u32 & KEY_INNER_V6 != 0
    }
    pub(super) fn egress(&self) -> bool {
        self.flags as u32 & KEY_EGRESS != 0
    }
}

/// Counters that stay zero on most flows of a healthy fabric (outer Not-ECT and ECT(1)
/// packets: RoCE marks ECT(0); CNPs, NAKs, RNR NAKs, PSN gaps, retransmissions): kept
/// apart, for the rows that have any, so that the others take 72 bytes less.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Rare {
    not_ect: u64,
    ect1: u64,
    cnps: u64,
    naks: u64,
    rnr_naks: u64,
    psn_gaps: u64,
    retransmitted_packets: u64,
    retransmitted_bytes: u64,
    retransmit_timeouts: u64,
    nak_resends: u32,
    recoveries: u32,
    recovery_max_us: u32,
    nak_to_resend_ns: u64,
    recovery_ns: u64,
    /// The flow's PSN state was split between CPUs (`doc::Flow::psn_split`).
    psn_split: bool,
    /// The flow's round trips (`doc::Flow::rtt`), read from its histogram.
    pub(super) rtt: Option<RttNs>,
    /// A mirrored flow's gaps lost by the copies (`doc::Flow::capture_gaps`).
    pub(super) capture_gaps: u64,
    /// The flow's CNPs off the CNP DSCP (`doc::Flow::cnps_wrong_class`).
    pub(super) cnps_wrong_class: CnpWrongClass,
    /// A CNP flow's ECN -> CNP times (`doc::Flow::ce_to_cnp`, `cnp_interval`).
    pub(super) ce_to_cnp: Option<TimesNs>,
    pub(super) cnp_interval: Option<TimesNs>,
}

/// A histogram (round trips, CE to CNP, CNP intervals) summed up as the document shows
/// it (`doc::Rtt`), in whole ns (a row's figures compare exactly).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TimesNs {
    samples: u64,
    min_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
}

impl TimesNs {
    pub(super) fn of(h: &RttHist) -> Option<TimesNs> {
        Some(TimesNs {
            samples: h.samples,
            min_ns: h.min_ns,
            p50_ns: h.quantile_ns(0.5)?,
            p99_ns: h.quantile_ns(0.99)?,
        })
    }

    fn doc(&self) -> Rtt {
        Rtt::from_ns(self.samples, self.min_ns, self.p50_ns, self.p99_ns)
    }
}

/// A flow's round trips: their summary ([`TimesNs`]), with the histogram by octave and
/// the sum (`roce_qp_rtt_seconds`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RttNs {
    summary: TimesNs,
    pub(super) sum_ns: u64,
    pub(super) octaves: [u32; RTT_OCTAVES],
}

impl RttNs {
    pub(super) fn of(h: &RttHist) -> Option<RttNs> {
        let mut octaves = [0u32; RTT_OCTAVES];
        for (i, n) in h.buckets.iter().enumerate() {
            octaves[i / RTT_SUB_BUCKETS] = octaves[i / RTT_SUB_BUCKETS].saturating_add(*n);
        }
        Some(RttNs {
            summary: TimesNs::of(h)?,
            sum_ns: h.sum_ns,
            octaves,
        })
    }

    fn doc(&self) -> Rtt {
        self.summary.doc()
    }
}

impl Rare {
    pub(super) fn of(st: &FlowStats) -> Rare {
        Rare {
            not_ect: st.ecn[0],
            ect1: st.ecn[1],
            cnps: st.cnps,
            naks: st.naks,
            rnr_naks: st.rnr_naks,
            psn_gaps: st.psn_gaps,
            retransmitted_packets: st.retransmitted_packets,
            retransmitted_bytes: st.retransmitted_bytes,
            retransmit_timeouts: st.retransmit_timeouts,
            nak_resends: st.nak_resends,
            recoveries: st.recoveries,
            recovery_max_us: st.recovery_max_us,
            nak_to_resend_ns: st.nak_to_resend_ns,
            recovery_ns: st.recovery_ns,
            psn_split: st.psn.split(),
            rtt: None,
            capture_gaps: 0,
            cnps_wrong_class: CnpWrongClass::default(),
            ce_to_cnp: None,
            cnp_interval: None,
        }
    }
}

/// The part of a key that does not fit in a row, read back from `words`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct WideKey {
    /// Raw words as `FlowKey` holds them (IPv4 mapped).
    pub(super) src: [u32; 4],
    pub(super) dst: [u32; 4],
    pub(super) vni: u32,
    pub(super) inner_src: [u32; 4],
    pub(super) inner_dst: [u32; 4],
    pub(super) inner_ecn: [u64; 4],
    /// A tunnelled flow's outer UDP source port (None: not known).
    pub(super) outer_sport: Option<u16>,
}

/// Words of one address in `words`: one for IPv4, four for IPv6.
fn addr_words(v6: bool) -> usize {
    if v6 {
        4
    } else {
        1
    }
}

/// A mirrored row's session words: kind (with `MIRROR_SOURCE_V6`), session, sender.
pub(super) fn push_mirror(words: &mut Vec<u32>, tag: &MirrorTag) {
    words.extend([tag.kind, tag.session]);
    push_addr(words, &tag.source, tag.source_v6());
}

/// Words of a mirrored row's session whose kind word is `kind`.
fn mirror_words(kind: u32) -> usize {
    2 + addr_words(kind & MIRROR_SOURCE_V6 != 0)
}

/// A mirror session as numbers that order as the document's `mirror` orders: kind
/// (erspan2, erspan3, gre), session, sender (IPv4 before IPv6, then by value).
pub(super) type MirrorOrder = (u8, u32, bool, u128);

pub(super) fn push_addr(words: &mut Vec<u32>, a: &[u32; 4], v6: bool) {
    if v6 {
        words.extend_from_slice(a);
    } else {
        words.push(a[3]);
    }
}

fn read_addr(words: &[u32], v6: bool) -> [u32; 4] {
    if v6 {
        [words[0], words[1], words[2], words[3]]
    } else {
        roce_common::key::addr_v4_mapped(words[0])
    }
}

/// The address at the start of `words` (1 word for IPv4, 4 for IPv6) as a number that
/// orders as `IpAddr` orders addresses of one family.
fn word_value(words: &[u32], v6: bool) -> u128 {
    if v6 {
        words[..4]
            .iter()
            .fold(0u128, |acc, w| (acc << 32) | u32::from_be(*w) as u128)
    } else {
        u32::from_be(words[0]) as u128
    }
}

/// A tunnelled flow's VNI, inner family (IPv6?) and inner addresses as numbers: the
/// order of the document's `vni`, `inner_src`, `inner_dst`.
pub(super) type Tail = (u32, bool, u128, u128);

/// A flow's place in the document's order, comparable across polls: interface name,
/// direction, outer family and addresses, VNI, inner addresses, QP (the fields of
/// `Flow::canonical_cmp`, in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct CanonKey<'a> {
    name: &'a str,
    egress: bool,
    v6: bool,
    src: u128,
    dst: u128,
    vni: Option<u32>,
    /// (inner family is IPv6, inner source, inner destination) when tunnelled.
    inner: Option<(bool, u128, u128)>,
    dest_qp: u32,
    mirror: Option<MirrorOrder>,
}

/// The rows of one poll.
#[derive(Debug, Default)]
pub(super) struct RowTable {
    /// In the order the kernel handed them over.
    pub(super) rows: Vec<Row>,
    /// Row indexes in the document's order.
    pub(super) order: Vec<u32>,
    /// Keys of IPv6 and tunnelled flows: outer addresses (1 or 4 words each), and when
    /// tunnelled the VNI, inner addresses, inner ECN counts (8 words) and the outer
    /// UDP source port (a word, 0: not known).
    pub(super) words: Vec<u32>,
    /// Interface names, sorted: a row's `iface` orders as its name.
    pub(super) names: Vec<String>,
    /// The [`Rare`] counters of the rows that have any.
    pub(super) rare: Vec<Rare>,
    /// Rates: the counts since the previous poll, per row (empty: no previous poll).
    pub(super) deltas: Vec<Delta>,
    /// Differences too large for a `Delta`, by row.
    pub(super) big: Vec<(u32, Totals)>,
    /// Seconds since the previous poll.
    pub(super) interval_s: f64,
}

/// A row's counts since the previous poll, in 24 bytes; larger ones are in
/// `RowTable::big`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Delta {
    bytes: u32,
    packets: u32,
    ce: u32,
    ecn_packets: u32,
    cnps: u32,
    /// NAKs and RNR NAKs below bit 30, the [`DeltaState`] above.
    naks_state: u32,
}

const DELTA_STATE_SHIFT: u32 = 30;
const DELTA_NAKS: u32 = (1 << DELTA_STATE_SHIFT) - 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum DeltaState {
    /// No rate: the flow is new, or was evicted and counted anew.
    #[default]
    None = 0,
    /// The fields hold the counts.
    Inline = 1,
    /// The counts are in `RowTable::big`.
    Big = 2,
}

impl Delta {
    pub(super) fn of(d: &Totals) -> Delta {
        let small = |v: u64| u32::try_from(v).ok();
        let naks = small(d.naks).filter(|n| *n <= DELTA_NAKS);
        match (
            small(d.bytes),
            small(d.packets),
            small(d.ce),
            small(d.ecn_packets),
            small(d.cnps),
            naks,
        ) {
            (Some(bytes), Some(packets), Some(ce), Some(ecn_packets), Some(cnps), Some(naks)) => {
                Delta {
                    bytes,
                    packets,
                    ce,
                    ecn_packets,
                    cnps,
                    naks_state: naks | (DeltaState::Inline as u32) << DELTA_STATE_SHIFT,
                }
            }
            _ => Delta {
                naks_state: (DeltaState::Big as u32) << DELTA_STATE_SHIFT,
                ..Delta::default()
            },
        }
    }

    pub(super) fn state(&self) -> DeltaState {
        match self.naks_state >> DELTA_STATE_SHIFT {
            1 => DeltaState::Inline,
            2 => DeltaState::Big,
            _ => DeltaState::None,
        }
    }
}

impl RowTable {
    /// Where a wide row's key starts in `words`: after its session, when mirrored.
    fn key_at(&self, r: &Row) -> usize {
        if r.mirrored() {
            r.src as usize + mirror_words(self.words[r.src as usize])
        } else {
            r.src as usize
        }
    }

    /// A mirrored row's session (None for the others).
    pub(super) fn mirror_tag(&self, r: &Row) -> Option<MirrorTag> {
        if !r.mirrored() {
            return None;
        }
        let w = &self.words[r.src as usize..];
        let kind = w[0];
        Some(MirrorTag {
            source: read_addr(&w[2..], kind & MIRROR_SOURCE_V6 != 0),
            session: w[1],
            kind,
        })
    }

    /// A mirrored row's session in the document's order.
    pub(super) fn mirror_order(&self, r: &Row) -> Option<MirrorOrder> {
        let tag = self.mirror_tag(r)?;
        let rank = match tag.kind & MIRROR_KIND_MASK {
            MIRROR_ERSPAN2 => 0,
            MIRROR_ERSPAN3 => 1,
            MIRROR_GRE => 2,
            _ => 3,
        };
        let v6 = tag.source_v6();
        let value = word_value(&self.words[r.src as usize + 2..], v6);
        Some((rank, tag.session, v6, value))
    }

    /// The words of a wide row's key to compare with another row's: its session (when
    /// mirrored) and its key, not the inner ECN counts after them.
    pub(super) fn key_span(&self, r: &Row) -> std::ops::Range<usize> {
        let at = r.src as usize;
        at..self.key_at(r) + key_words(r)
    }

    pub(super) fn wide_key(&self, r: &Row) -> WideKey {
        let mut k = WideKey::default();
        if !r.wide() {
            k.src = roce_common::key::addr_v4_mapped(r.src);
            k.dst = roce_common::key::addr_v4_mapped(r.dst);
            return k;
        }
        let w = &self.words[self.key_at(r)..];
        let n = addr_words(r.outer_v6());
        k.src = read_addr(w, r.outer_v6());
        k.dst = read_addr(&w[n..], r.outer_v6());
        if r.tunnelled() {
            let w = &w[2 * n..];
            k.vni = w[0];
            let m = addr_words(r.inner_v6());
            k.inner_src = read_addr(&w[1..], r.inner_v6());
            k.inner_dst = read_addr(&w[1 + m..], r.inner_v6());
            let e = &w[1 + 2 * m..];
            for (i, c) in k.inner_ecn.iter_mut().enumerate() {
                *c = e[2 * i] as u64 | (e[2 * i + 1] as u64) << 32;
            }
            k.outer_sport = u16::try_from(e[8]).ok().filter(|p| *p != 0);
        }
        k
    }

    /// The outer addresses as numbers that order as the document orders them.
    pub(super) fn outer_values(&self, r: &Row) -> (u128, u128) {
        if !r.wide() {
            return (u32::from_be(r.src) as u128, u32::from_be(r.dst) as u128);
        }
        let w = &self.words[self.key_at(r)..];
        let v6 = r.outer_v6();
        let n = addr_words(v6);
        (word_value(w, v6), word_value(&w[n..], v6))
    }

    /// Where a tunnelled row's VNI, inner addresses and inner ECN start in `words`.
    fn tail_at(&self, r: &Row) -> usize {
        self.key_at(r) + 2 * addr_words(r.outer_v6())
    }

    /// A tunnelled row's VNI and inner addresses, ordered as the document orders them.
    pub(super) fn tail(&self, r: &Row) -> Tail {
        let w = &self.words[self.tail_at(r)..];
        let v6 = r.inner_v6();
        let m = addr_words(v6);
        (
            w[0],
            v6,
            word_value(&w[1..], v6),
            word_value(&w[1 + m..], v6),
        )
    }

    /// A tunnelled row's inner ECN counts.
    fn inner_ecn(&self, r: &Row) -> [u64; 4] {
        let at = self.tail_at(r) + 1 + 2 * addr_words(r.inner_v6());
        let e = &self.words[at..at + 8];
        std::array::from_fn(|i| e[2 * i] as u64 | (e[2 * i + 1] as u64) << 32)
    }

    pub(super) fn canon(&self, r: &Row) -> CanonKey<'_> {
        let (src, dst) = self.outer_values(r);
        let (vni, inner) = if r.tunnelled() {
            let (vni, v6, a, b) = self.tail(r);
            (Some(vni), Some((v6, a, b)))
        } else {
            (None, None)
        };
        CanonKey {
            name: self.names.get(r.iface as usize).map_or("", String::as_str),
            egress: r.egress(),
            v6: r.outer_v6(),
            src,
            dst,
            vni,
            inner,
            dest_qp: r.dest_qp,
            mirror: self.mirror_order(r),
        }
    }

    /// Row `i` as the document's record: through `Flow::from_entry`, as a `Document`
    /// would have made it, so that every field means the same.
    pub(super) fn flow(&self, i: usize) -> Flow {
        let r = &self.rows[i];
        let w = self.wide_key(r);
        let key = FlowKey {
            src: w.src,
            dst: w.dst,
            inner_src: w.inner_src,
            inner_dst: w.inner_dst,
            vni: w.vni,
            dest_qp: r.dest_qp,
            // The name is the row's; `from_entry` asks for it by this number.
            ifindex: r.iface as u32,
            flags: r.flags as u32,
        };
        let rare = self.rare_of(r);
        let stats = FlowStats {
            packets: r.packets,
            bytes: r.bytes,
            ecn: self.ecn(r),
            inner_ecn: w.inner_ecn,
            cnps: rare.cnps,
            acks: r.acks,
            naks: rare.naks,
            rnr_naks: rare.rnr_naks,
            psn_gaps: rare.psn_gaps,
            retransmitted_packets: rare.retransmitted_packets,
            retransmitted_bytes: rare.retransmitted_bytes,
            retransmit_timeouts: rare.retransmit_timeouts,
            nak_resends: rare.nak_resends,
            recoveries: rare.recoveries,
            recovery_max_us: rare.recovery_max_us,
            nak_to_resend_ns: rare.nak_to_resend_ns,
            recovery_ns: rare.recovery_ns,
            first_seen_ns: r.first_seen_ns,
            last_seen_ns: r.last_seen_ns,
            sport: r.sport,
            last_dscp: r.last_dscp,
            ..FlowStats::default()
        };
        let name = |i: u32| self.names.get(i as usize).cloned();
        let mut f = match self.mirror_tag(r) {
            Some(tag) => {
                let mut f =
                    Flow::from_mirrored_entry(&FlowKeyMirror { key, tag }, &stats, Some(&name));
                f.capture_gaps = Some(rare.capture_gaps);
                f
            }
            None => Flow::from_entry(&key, &stats, Some(&name)),
        };
        f.psn_split = rare.psn_split;
        f.outer_sport = w.outer_sport;
        f.set_cnps_wrong_class(&rare.cnps_wrong_class);
        f.rtt = rare.rtt.map(|r| r.doc());
        f.ce_to_cnp = rare.ce_to_cnp.map(|t| t.doc());
        f.cnp_interval = rare.cnp_interval.map(|t| t.doc());
        f.rates = self.rates(i);
        f
    }

    /// The rows with round trips: each as its flow, with its histogram by octave and
    /// the sum of its round trips in ns.
    pub(super) fn round_trips(&self) -> impl Iterator<Item = (Flow, [u32; RTT_OCTAVES], u64)> + '_ {
        self.rows.iter().enumerate().filter_map(|(i, r)| {
            let rtt = self.rare_of(r).rtt?;
            Some((self.flow(i), rtt.octaves, rtt.sum_ns))
        })
    }

    fn rare_of(&self, r: &Row) -> Rare {
        (r.rare as usize)
            .checked_sub(1)
            .and_then(|i| self.rare.get(i))
            .copied()
            .unwrap_or_default()
    }

    /// Outer ECN codepoint counts, indexed as `FlowStats::ecn`.
    fn ecn(&self, r: &Row) -> [u64; 4] {
        let rare = self.rare_of(r);
        [rare.not_ect, rare.ect1, r.ect0, r.ce]
    }

    /// What rates are made from (as they were made from a `Flow`).
    pub(super) fn totals(&self, r: &Row) -> Totals {
        let rare = self.rare_of(r);
        Totals {
            packets: r.packets,
            bytes: r.bytes,
            ce: r.ce,
            ecn_packets: rare
                .not_ect
                .wrapping_add(rare.ect1)
                .wrapping_add(r.ect0)
                .wrapping_add(r.ce),
            cnps: rare.cnps,
            naks: rare.naks.wrapping_add(rare.rnr_naks),
        }
    }

    fn rates(&self, i: usize) -> Option<crate::doc::Rates> {
        let d = self.deltas.get(i)?;
        let totals = match d.state() {
            DeltaState::None => return None,
            DeltaState::Inline => Totals {
                packets: d.packets as u64,
                bytes: d.bytes as u64,
                ce: d.ce as u64,
                ecn_packets: d.ecn_packets as u64,
                cnps: d.cnps as u64,
                naks: (d.naks_state & DELTA_NAKS) as u64,
            },
            DeltaState::Big => {
                let at = self.big.binary_search_by_key(&(i as u32), |b| b.0).ok()?;
                self.big[at].1
            }
        };
        Some(rates::rates(&totals, self.interval_s))
    }

    /// What the fabric verdicts read of row `r`.
    pub(super) fn facts(&self, r: &Row) -> crate::verdict::FlowFacts<'_> {
        let k = self.wide_key(r);
        let rare = self.rare_of(r);
        let fig = self.figures_with(r, &rare);
        let tunnelled = r.tunnelled();
        let inner = |a: &[u32; 4]| tunnelled.then(|| key_addr(a, r.inner_v6()));
        crate::verdict::FlowFacts {
            ifname: fig.ifname,
            // A mirror session's copies hold both directions, as a capture does.
            direction: fig.direction.filter(|_| !r.mirrored()),
            src: key_addr(&k.src, r.outer_v6()),
            dst: key_addr(&k.dst, r.outer_v6()),
            vni: tunnelled.then_some(k.vni),
            inner_src: inner(&k.inner_src),
            inner_dst: inner(&k.inner_dst),
            dest_qp: r.dest_qp,
            sport: r.sport,
            outer_sport: k.outer_sport,
            packets: r.packets,
            ce: r.ce + fig.inner_ecn.map_or(0, |e| e.ce),
            inner_ce: fig.inner_ecn.map_or(0, |e| e.ce),
            psn_gaps: fig.psn_gaps,
            cnps: fig.cnps,
            cnps_wrong_class: rare.cnps_wrong_class,
        }
    }

    /// The tunnels of the table (`verdict::tunnels`): the tunnelled rows first, then
    /// the unencapsulated rows of their inner sides, each plain row a key and a lookup
    /// (and nothing at all without a tunnelled row).
    pub(super) fn tunnels(&self) -> Vec<crate::doc::tunnel::TunnelRecord> {
        let mut t = crate::verdict::tunnels::Tunnels::default();
        for r in self.rows.iter().filter(|r| r.tunnelled()) {
            t.add_tunnelled(&self.facts(r));
        }
        if t.is_empty() {
            return Vec::new();
        }
        for r in self.rows.iter().filter(|r| !r.tunnelled() && !r.mirrored()) {
            // A plain IPv4 row's key is the row itself: no words read.
            let k = self.wide_key(r);
            let (src, dst) = (
                key_addr(&k.src, r.outer_v6()),
                key_addr(&k.dst, r.outer_v6()),
            );
            let direction = Some(if r.egress() {
                Direction::Egress
            } else {
                Direction::Ingress
            });
            if t.wants(&(direction, src, dst, r.dest_qp)) {
                t.add_inner(&self.facts(r));
            }
        }
        t.records()
    }

    pub(super) fn figures(&self, r: &Row) -> Figures<'_> {
        self.figures_with(r, &self.rare_of(r))
    }

    /// [`Self::figures`] of a row whose rare part the caller read already.
    fn figures_with(&self, r: &Row, rare: &Rare) -> Figures<'_> {
        let tunnelled = r.tunnelled();
        Figures {
            ifname: self.names.get(r.iface as usize).map(String::as_str),
            direction: Some(if r.egress() {
                Direction::Egress
            } else {
                Direction::Ingress
            }),
            tunnelled,
            packets: r.packets,
            bytes: r.bytes,
            ecn: Ecn::from_codepoints(&self.ecn(r)),
            inner_ecn: tunnelled.then(|| Ecn::from_codepoints(&self.inner_ecn(r))),
            cnps: rare.cnps,
            acks: r.acks,
            naks: rare.naks,
            rnr_naks: rare.rnr_naks,
            psn_gaps: rare.psn_gaps,
            retransmitted_packets: rare.retransmitted_packets,
            retransmitted_bytes: rare.retransmitted_bytes,
            retransmit_timeouts: rare.retransmit_timeouts,
        }
    }
}

/// Words of a wide row's key in `words` (outer addresses, and when tunnelled the VNI
/// and inner addresses; not the inner ECN counts after them).
pub(super) fn key_words(r: &Row) -> usize {
    let outer = 2 * addr_words(r.outer_v6());
    if r.tunnelled() {
        outer + 1 + 2 * addr_words(r.inner_v6())
    } else {
        outer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::live::tests::{build, entries, reference, stats_array};

    #[test]
    fn the_tables_tunnels_are_those_of_the_documents_flows() {
        let mut matched = 0;
        for seed in [1, 2, 3] {
            let e = entries(seed, 2000);
            let live = build(&e, &stats_array(), None);
            let doc = reference(&e, &stats_array());
            let want = crate::verdict::tunnels::Tunnels::of_flows(doc.flows.iter());
            assert!(want.len() > 10, "seed {seed}: {} tunnels", want.len());
            matched += want.iter().filter(|t| t.inner_flows.is_some()).count();
            assert_eq!(live.tunnels(), want, "seed {seed}");
        }
        // The few addresses of the entries make inner sides to match.
        assert!(matched > 10, "{matched} tunnels with an inner side");
    }

    #[test]
    fn rows_read_back_as_the_document_builds_them() {
        for seed in [1, 2, 3] {
            let e = entries(seed, 2000);
            let live = build(&e, &stats_array(), None);
            let doc = reference(&e, &stats_array());
            assert!(doc.flows.len() > 1500);
            assert_eq!(live.len(), doc.flows.len());
            assert_eq!(live.to_document(), doc, "seed {seed}");
            assert_eq!(live.counters.flows_evicted, 5000 - e.len() as u64);
        }
    }

    /// Mirrored twins of some of `e`'s flows: the same keys with KEY_MIRROR, each in
    /// two or three sessions (ERSPAN II/III, GRE; IPv4 and IPv6 senders), so that
    /// only the session tells some of them apart.
    fn mirrored(e: &[crate::telemetry::live::tests::Entry]) -> Vec<(FlowKeyMirror, FlowStats)> {
        use roce_common::key::addr_v4_mapped;
        let v6 = [
            u32::from_ne_bytes([0x20, 1, 0x0d, 0xb8]),
            0,
            0,
            9u32.to_be(),
        ];
        let tags = [
            MirrorTag {
                source: addr_v4_mapped(u32::from_ne_bytes([198, 18, 9, 1])),
                session: 17,
                kind: MIRROR_ERSPAN3,
            },
            MirrorTag {
                source: addr_v4_mapped(u32::from_ne_bytes([198, 18, 9, 1])),
                session: 18,
                kind: MIRROR_ERSPAN2,
            },
            MirrorTag {
                source: v6,
                session: 0xA1B2_C3D4,
                kind: MIRROR_GRE | MIRROR_SOURCE_V6,
            },
        ];
        let mut out = Vec::new();
        for (i, x) in e.iter().enumerate().filter(|(i, _)| i % 7 == 0) {
            let (mut key, mut st) = x.wide();
            key.flags = (key.flags & !KEY_EGRESS) | KEY_MIRROR;
            for tag in &tags[..2 + i % 2] {
                st.bytes += 1;
                out.push((FlowKeyMirror { key, tag: *tag }, st));
            }
        }
        out
    }

    #[test]
    fn mirrored_rows_read_back_as_the_document_builds_them_and_pair_across_polls() {
        use crate::telemetry::live::tests::stats_array;
        use crate::telemetry::live::Builder;
        let names = |i: u32| (i == 2).then(|| "eth1".to_string());
        let e = entries(5, 1500);
        let m = mirrored(&e);
        assert!(m.len() > 300);
        let build = |before: Option<(&crate::telemetry::live::LiveDocument, f64)>| {
            let mut b = Builder::new(0, names);
            // Interleaved, as the kernel's slots hold them.
            let mut mi = m.iter();
            for x in &e {
                let (k, st) = x.wide();
                b.add(&k, &st);
                if let Some((mk, mst)) = mi.next() {
                    b.add_tagged(&mk.key, mst, Some(&mk.tag));
                }
            }
            for (mk, mst) in mi {
                b.add_tagged(&mk.key, mst, Some(&mk.tag));
            }
            b.finish(&stats_array(), before)
        };
        let live = build(None);
        let doc = crate::doc::Document::build_with_mirrored(
            e.iter().map(|x| x.wide()).collect(),
            m.clone(),
            &stats_array(),
            Some(&names),
        );
        assert_eq!(live.to_document(), doc);
        assert!(doc.flows.iter().filter(|f| f.mirror.is_some()).count() > 300);
        // The next poll pairs every mirrored row with its own session's.
        let again = build(Some((&live, 1.0)));
        let d = again.to_document();
        assert_eq!(d.flows.len(), doc.flows.len());
        for f in d
            .flows
            .iter()
            .filter(|f| f.mirror.is_some() && f.packets > 0)
        {
            assert!(f.rates.is_some(), "a mirrored flow without its rate: {f:?}");
        }
    }

    #[test]
    fn a_row_is_80_bytes_and_its_rate_24() {
        assert_eq!(std::mem::size_of::<Row>(), 80);
        assert_eq!(std::mem::size_of::<Delta>(), 24);
    }
}
