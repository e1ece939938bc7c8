//! The flows document as the running agent keeps it between polls: one compact row per
//! flow instead of a [`Flow`] per flow, so that a million flows fit in the memory of
//! one host agent. `GET /flows` serializes it as exactly the document a [`Document`]
//! would be (each row becomes its `Flow` only while it is written), and `/metrics`
//! sums the rows without making any `Flow`.
//!
//! A row (80 bytes) holds a flow's counters as the kernel counts them, those that most
//! flows never see (Not-ECT and ECT(1) packets, CNPs, NAKs, RNR NAKs, PSN gaps) apart
//! for the rows that have any; its key in 16 bytes (a plain IPv4 flow's addresses; for
//! IPv6 and tunnelled flows an offset into `words`, where their addresses, VNI and
//! inner ECN counts lie); its interface as an index into the poll's names. Its rate is
//! the differences since the previous poll (24 bytes). Rows stay in the order the
//! kernel handed them over (hash-bucket order, the same from one poll to the next for
//! the flows that stay); `order` lists them in the document's order
//! ([`Flow::canonical_cmp`]).
//!
//! [`Builder::finish`] pairs each row with the previous poll's row of the same flow by
//! walking both tables in kernel order (no hash map of flows), takes the rates from
//! the pair, and takes the document's order from the previous poll's: only the flows
//! that are new are sorted and put in their places. A poll after which most flows are
//! new sorts everything (a 128-bit integer key per row).

use std::collections::HashMap;
use std::net::IpAddr;

use roce_common::flow::FlowStats;

use roce_common::key::{FlowKey, KEY_EGRESS, KEY_INNER_V6, KEY_OUTER_V6, KEY_TUNNELLED};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::doc::{key_addr, Counters, Direction, Document, Ecn, Flow};
use crate::telemetry::rates::{self, Totals};

/// The flows document of the running agent (see the module's doc).
#[derive(Debug, Default)]
pub struct LiveDocument {
    flows: Flows,
    pub counters: Counters,
}

#[derive(Debug)]
enum Flows {
    /// What the collector makes.
    Rows(RowTable),
    /// A document made elsewhere (tests, tools), kept as it is.
    Flows(Vec<Flow>),
}

impl Default for Flows {
    fn default() -> Self {
        Flows::Flows(Vec::new())
    }
}

/// One flow: the kernel's counters, CPUs merged, and its key, compact. The counters
/// that most flows never see (see [`Rare`]) live in `RowTable::rare`.
#[derive(Clone, Copy, Debug, Default)]
struct Row {
    packets: u64,
    bytes: u64,
    /// Outer ECT(0) and CE packets (`FlowStats::ecn[2]`, `[3]`).
    ect0: u64,
    ce: u64,
    acks: u64,
    first_seen_ns: u64,
    last_seen_ns: u64,
    /// 1 + the index of the row's [`Rare`] counters in `RowTable::rare`; 0: all zero.
    rare: u32,
    /// A plain IPv4 flow's outer source address (raw, network order); for the others,
    /// where the rest of the key starts in `RowTable::words`.
    src: u32,
    /// A plain IPv4 flow's outer destination address (raw).
    dst: u32,
    dest_qp: u32,
    /// The interface's name: an index into `RowTable::names`, which is sorted.
    iface: u16,
    sport: u16,
    /// `KEY_OUTER_V6 | KEY_INNER_V6 | KEY_TUNNELLED | KEY_EGRESS` of the flow key.
    flags: u8,
    last_dscp: u8,
}

/// Key bits a row keeps (all `FlowKey::flags` has).
const ROW_FLAGS: u32 = KEY_OUTER_V6 | KEY_INNER_V6 | KEY_TUNNELLED | KEY_EGRESS;

impl Row {
    /// Whether the key lies in `words` (IPv6 or tunnelled) rather than in the row.
    fn wide(&self) -> bool {
        self.flags as u32 & (KEY_OUTER_V6 | KEY_TUNNELLED) != 0
    }
    fn tunnelled(&self) -> bool {
        self.flags as u32 & KEY_TUNNELLED != 0
    }
    fn outer_v6(&self) -> bool {
        self.flags as u32 & KEY_OUTER_V6 != 0
    }
    fn inner_v6(&self) -> bool {
        self.flags as u32 & KEY_INNER_V6 != 0
    }
    fn egress(&self) -> bool {
        self.flags as u32 & KEY_EGRESS != 0
    }
}

/// Counters that stay zero on most flows of a healthy fabric (outer Not-ECT and ECT(1)
/// packets: RoCE marks ECT(0); CNPs, NAKs, RNR NAKs, PSN gaps): kept apart, for the
/// rows that have any, so that the others take 48 bytes less.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rare {
    not_ect: u64,
    ect1: u64,
    cnps: u64,
    naks: u64,
    rnr_naks: u64,
    psn_gaps: u64,
    /// The flow's PSN state was split between CPUs (`doc::Flow::psn_split`).
    psn_split: bool,
}

impl Rare {
    fn of(st: &FlowStats) -> Rare {
        Rare {
            not_ect: st.ecn[0],
            ect1: st.ecn[1],
            cnps: st.cnps,
            naks: st.naks,
            rnr_naks: st.rnr_naks,
            psn_gaps: st.psn_gaps,
            psn_split: st.psn.split(),
        }
    }
}

/// The part of a key that does not fit in a row, read back from `words`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WideKey {
    /// Raw words as `FlowKey` holds them (IPv4 mapped).
    src: [u32; 4],
    dst: [u32; 4],
    vni: u32,
    inner_src: [u32; 4],
    inner_dst: [u32; 4],
    inner_ecn: [u64; 4],
}

/// Words of one address in `words`: one for IPv4, four for IPv6.
fn addr_words(v6: bool) -> usize {
    if v6 {
        4
    } else {
        1
    }
}

fn push_addr(words: &mut Vec<u32>, a: &[u32; 4], v6: bool) {
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
type Tail = (u32, bool, u128, u128);

/// A flow's place in the document's order, comparable across polls: interface name,
/// direction, outer family and addresses, VNI, inner addresses, QP (the fields of
/// `Flow::canonical_cmp`, in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct CanonKey<'a> {
    name: &'a str,
    egress: bool,
    v6: bool,
    src: u128,
    dst: u128,
    vni: Option<u32>,
    /// (inner family is IPv6, inner source, inner destination) when tunnelled.
    inner: Option<(bool, u128, u128)>,
    dest_qp: u32,
}

/// The rows of one poll.
#[derive(Debug, Default)]
struct RowTable {
    /// In the order the kernel handed them over.
    rows: Vec<Row>,
    /// Row indexes in the document's order.
    order: Vec<u32>,
    /// Keys of IPv6 and tunnelled flows: outer addresses (1 or 4 words each), and when
    /// tunnelled the VNI, inner addresses and inner ECN counts (8 words).
    words: Vec<u32>,
    /// Interface names, sorted: a row's `iface` orders as its name.
    names: Vec<String>,
    /// The [`Rare`] counters of the rows that have any.
    rare: Vec<Rare>,
    /// Rates: the counts since the previous poll, per row (empty: no previous poll).
    deltas: Vec<Delta>,
    /// Differences too large for a `Delta`, by row.
    big: Vec<(u32, Totals)>,
    /// Seconds since the previous poll.
    interval_s: f64,
}

/// A row's counts since the previous poll, in 24 bytes; larger ones are in
/// `RowTable::big`.
#[derive(Clone, Copy, Debug, Default)]
struct Delta {
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
enum DeltaState {
    /// No rate: the flow is new, or was evicted and counted anew.
    #[default]
    None = 0,
    /// The fields hold the counts.
    Inline = 1,
    /// The counts are in `RowTable::big`.
    Big = 2,
}

impl Delta {
    fn of(d: &Totals) -> Delta {
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

    fn state(&self) -> DeltaState {
        match self.naks_state >> DELTA_STATE_SHIFT {
            1 => DeltaState::Inline,
            2 => DeltaState::Big,
            _ => DeltaState::None,
        }
    }
}

impl RowTable {
    fn wide_key(&self, r: &Row) -> WideKey {
        let mut k = WideKey::default();
        if !r.wide() {
            k.src = roce_common::key::addr_v4_mapped(r.src);
            k.dst = roce_common::key::addr_v4_mapped(r.dst);
            return k;
        }
        let w = &self.words[r.src as usize..];
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
        }
        k
    }

    /// The outer addresses as numbers that order as the document orders them.
    fn outer_values(&self, r: &Row) -> (u128, u128) {
        if !r.wide() {
            return (u32::from_be(r.src) as u128, u32::from_be(r.dst) as u128);
        }
        let w = &self.words[r.src as usize..];
        let v6 = r.outer_v6();
        let n = addr_words(v6);
        (word_value(w, v6), word_value(&w[n..], v6))
    }

    /// Where a tunnelled row's VNI, inner addresses and inner ECN start in `words`.
    fn tail_at(&self, r: &Row) -> usize {
        r.src as usize + 2 * addr_words(r.outer_v6())
    }

    /// A tunnelled row's VNI and inner addresses, ordered as the document orders them.
    fn tail(&self, r: &Row) -> Tail {
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

    fn canon(&self, r: &Row) -> CanonKey<'_> {
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
        }
    }

    /// Row `i` as the document's record: through `Flow::from_entry`, as a `Document`
    /// would have made it, so that every field means the same.
    fn flow(&self, i: usize) -> Flow {
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
            first_seen_ns: r.first_seen_ns,
            last_seen_ns: r.last_seen_ns,
            sport: r.sport,
            last_dscp: r.last_dscp,
            ..FlowStats::default()
        };
        let name = |i: u32| self.names.get(i as usize).cloned();
        let mut f = Flow::from_entry(&key, &stats, Some(&name));
        f.psn_split = rare.psn_split;
        f.rates = self.rates(i);
        f
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
    fn totals(&self, r: &Row) -> Totals {
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

    fn figures(&self, r: &Row) -> Figures<'_> {
        let tunnelled = r.tunnelled();
        let rare = self.rare_of(r);
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
        }
    }

    /// Whether row `i` here and row `j` of `other` are the same flow: the same
    /// interface name (`names`: this table's name index for each of `other`'s), the
    /// same key bits, QP and addresses (the words of the key, not the inner ECN
    /// counts that follow them).
    fn same_flow(&self, i: usize, other: &RowTable, j: usize, names: &[Option<u16>]) -> bool {
        let (a, b) = (&self.rows[i], &other.rows[j]);
        if a.flags != b.flags
            || a.dest_qp != b.dest_qp
            || names.get(b.iface as usize).copied().flatten() != Some(a.iface)
        {
            return false;
        }
        if !a.wide() {
            return a.src == b.src && a.dst == b.dst;
        }
        let n = key_words(a);
        self.words[a.src as usize..a.src as usize + n]
            == other.words[b.src as usize..b.src as usize + n]
    }

    /// For each row, the index of the same flow's row in `before` (u32::MAX: none).
    /// Both tables are in kernel order, in which the flows that stay keep their order:
    /// one walk pairs them, looking one row ahead on either side past a flow that came
    /// or went; rows it could not pair are matched by sorting (exact, whatever the
    /// churn).
    fn pair_with(&self, before: &RowTable) -> Vec<u32> {
        let names: Vec<Option<u16>> = before
            .names
            .iter()
            .map(|n| {
                self.names
                    .binary_search(n)
                    .ok()
                    .and_then(|p| u16::try_from(p).ok())
            })
            .collect();
        let (n, m) = (self.rows.len(), before.rows.len());
        let mut prev = vec![u32::MAX; n];
        let (mut lone_new, mut lone_old) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if self.same_flow(i, before, j, &names) {
                prev[i] = j as u32;
                (i, j) = (i + 1, j + 1);
            } else if j + 1 < m && self.same_flow(i, before, j + 1, &names) {
                lone_old.push(j as u32); // gone since
                j += 1;
            } else if i + 1 < n && self.same_flow(i + 1, before, j, &names) {
                lone_new.push(i as u32); // new since
                i += 1;
            } else {
                lone_new.push(i as u32);
                lone_old.push(j as u32);
                (i, j) = (i + 1, j + 1);
            }
        }
        lone_new.extend(i as u32..n as u32);
        lone_old.extend(j as u32..m as u32);
        if !lone_new.is_empty() && !lone_old.is_empty() {
            // The names differ between the tables: compare their keys as the document
            // orders them, names and all.
            lone_old.sort_unstable_by(|a, b| {
                before
                    .canon(&before.rows[*a as usize])
                    .cmp(&before.canon(&before.rows[*b as usize]))
            });
            for i in lone_new {
                let key = self.canon(&self.rows[i as usize]);
                if let Ok(at) =
                    lone_old.binary_search_by(|j| before.canon(&before.rows[*j as usize]).cmp(&key))
                {
                    prev[i as usize] = lone_old[at];
                }
            }
        }
        prev
    }

    /// Fills `deltas` from the rows of the same flows in the previous poll (`prev`,
    /// from [`Self::pair_with`]).
    fn rates_since(&mut self, before: &RowTable, prev: &[u32], interval_s: f64) {
        if interval_s.is_nan() || interval_s <= 0.0 {
            return;
        }
        self.interval_s = interval_s;
        let mut deltas = vec![Delta::default(); self.rows.len()];
        let mut big = Vec::new();
        for (i, (r, j)) in self.rows.iter().zip(prev).enumerate() {
            let Some(old) = before.rows.get(*j as usize) else {
                continue; // new: no rate yet
            };
            if let Some(d) = self.totals(r).since(&before.totals(old)) {
                let delta = Delta::of(&d);
                if delta.state() == DeltaState::Big {
                    big.push((i as u32, d));
                }
                deltas[i] = delta;
            }
        }
        self.deltas = deltas;
        self.big = big;
    }

    /// The document's order, from the previous poll's where it can: the rows paired
    /// with a row of `before` keep that row's order (they have the same keys), and
    /// the new ones are put in their places.
    fn order_from(&self, before: &RowTable, prev: &[u32]) -> Option<Vec<u32>> {
        let fresh: Vec<u32> = (0..self.rows.len() as u32)
            .filter(|i| prev[*i as usize] == u32::MAX)
            .collect();
        // Many new flows: sorting them all at once is cheaper than placing each.
        if fresh.len() * 16 > self.rows.len() {
            return None;
        }
        let mut now_of = vec![u32::MAX; before.rows.len()];
        for (i, j) in prev.iter().enumerate() {
            if let Some(slot) = now_of.get_mut(*j as usize) {
                *slot = i as u32;
            }
        }
        let kept: Vec<u32> = before
            .order
            .iter()
            .filter_map(|j| now_of.get(*j as usize).copied())
            .filter(|i| *i != u32::MAX)
            .collect();
        drop(now_of);
        let fresh = sorted_subset(self, fresh);
        // Each new row goes where the document's order puts it among the kept ones.
        let mut order = Vec::with_capacity(self.rows.len());
        let mut from = 0;
        for f in fresh {
            let key = self.canon(&self.rows[f as usize]);
            let at =
                from + kept[from..].partition_point(|k| self.canon(&self.rows[*k as usize]) < key);
            order.extend_from_slice(&kept[from..at]);
            order.push(f);
            from = at;
        }
        order.extend_from_slice(&kept[from..]);
        Some(order)
    }
}

/// Words of a wide row's key in `words` (outer addresses, and when tunnelled the VNI
/// and inner addresses; not the inner ECN counts after them).
fn key_words(r: &Row) -> usize {
    let outer = 2 * addr_words(r.outer_v6());
    if r.tunnelled() {
        outer + 1 + 2 * addr_words(r.inner_v6())
    } else {
        outer
    }
}

/// What `/metrics` sums of one flow.
#[derive(Clone, Copy, Debug)]
pub struct Figures<'a> {
    pub ifname: Option<&'a str>,
    pub direction: Option<Direction>,
    /// In VXLAN (the flow has a VNI).
    pub tunnelled: bool,
    pub packets: u64,
    pub bytes: u64,
    pub ecn: Ecn,
    pub inner_ecn: Option<Ecn>,
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
}

impl<'a> Figures<'a> {
    pub(crate) fn of(f: &'a Flow) -> Figures<'a> {
        Figures {
            ifname: f.ifname.as_deref(),
            direction: f.direction,
            tunnelled: f.vni.is_some(),
            packets: f.packets,
            bytes: f.bytes,
            ecn: f.ecn,
            inner_ecn: f.inner_ecn,
            cnps: f.cnps,
            acks: f.acks,
            naks: f.naks,
            rnr_naks: f.rnr_naks,
            psn_gaps: f.psn_gaps,
        }
    }
}

impl LiveDocument {
    /// Flows in the document.
    pub fn len(&self) -> usize {
        match &self.flows {
            Flows::Rows(t) => t.rows.len(),
            Flows::Flows(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flow `i` (in the document's order) as its record, or None past the end.
    pub fn flow(&self, i: usize) -> Option<Flow> {
        match &self.flows {
            Flows::Rows(t) => t.order.get(i).map(|r| t.flow(*r as usize)),
            Flows::Flows(v) => v.get(i).cloned(),
        }
    }

    /// Every flow as its record, in the document's order (each made when reached).
    pub fn flows(&self) -> impl Iterator<Item = Flow> + '_ {
        (0..self.len()).filter_map(|i| self.flow(i))
    }

    /// Calls `f` with the summed figures of every flow and its place in the document,
    /// making no `Flow`. The flows come in no particular order (the order they lie in
    /// memory, which is the fast one).
    pub fn for_each_figures<'a>(&'a self, mut f: impl FnMut(usize, Figures<'a>)) {
        match &self.flows {
            Flows::Rows(t) => {
                let mut place = vec![0u32; t.rows.len()];
                for (p, r) in t.order.iter().enumerate() {
                    if let Some(slot) = place.get_mut(*r as usize) {
                        *slot = p as u32;
                    }
                }
                for (r, p) in t.rows.iter().zip(&place) {
                    f(*p as usize, t.figures(r));
                }
            }
            Flows::Flows(v) => {
                for (i, flow) in v.iter().enumerate() {
                    f(i, Figures::of(flow));
                }
            }
        }
    }

    /// Calls `f` with every flow's direction and outer addresses, in order, until it
    /// says to stop.
    pub fn for_each_endpoints(
        &self,
        mut f: impl FnMut(Option<Direction>, IpAddr, IpAddr) -> std::ops::ControlFlow<()>,
    ) {
        match &self.flows {
            Flows::Rows(t) => {
                for r in t.order.iter().filter_map(|i| t.rows.get(*i as usize)) {
                    let k = t.wide_key(r);
                    let dir = Some(if r.egress() {
                        Direction::Egress
                    } else {
                        Direction::Ingress
                    });
                    let (src, dst) = (
                        key_addr(&k.src, r.outer_v6()),
                        key_addr(&k.dst, r.outer_v6()),
                    );
                    if f(dir, src, dst).is_break() {
                        return;
                    }
                }
            }
            Flows::Flows(v) => {
                for flow in v {
                    if f(flow.direction, flow.src, flow.dst).is_break() {
                        return;
                    }
                }
            }
        }
    }

    /// The same document as a [`Document`] (every flow made at once: tests and tools).
    pub fn to_document(&self) -> Document {
        Document {
            flows: self.flows().collect(),
            counters: self.counters.clone(),
        }
    }

    /// Writes flows `range` as JSON objects, each followed by a comma except the last
    /// flow of the document: the pieces of a streamed `"flows"` array.
    pub fn write_flows_json(
        &self,
        range: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), serde_json::Error> {
        let len = self.len();
        for i in range.start.min(len)..range.end.min(len) {
            if let Some(f) = self.flow(i) {
                serde_json::to_writer(&mut *out, &f)?;
            }
            if i + 1 < len {
                out.push(b',');
            }
        }
        Ok(())
    }
}

impl From<Document> for LiveDocument {
    fn from(d: Document) -> LiveDocument {
        LiveDocument {
            flows: Flows::Flows(d.flows),
            counters: d.counters,
        }
    }
}

/// The JSON of the document: the same bytes `serde_json` writes for a [`Document`].
impl Serialize for LiveDocument {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct FlowSeq<'a>(&'a LiveDocument);
        impl Serialize for FlowSeq<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for f in self.0.flows() {
                    seq.serialize_element(&f)?;
                }
                seq.end()
            }
        }
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("flows", &FlowSeq(self))?;
        map.serialize_entry("counters", &self.counters)?;
        map.end()
    }
}

/// Makes one poll's [`LiveDocument`] from the kernel's entries.
pub struct Builder<R: FnMut(u32) -> Option<String>> {
    rows: Vec<Row>,
    words: Vec<u32>,
    rare: Vec<Rare>,
    /// Names in the order first met; rows point here until `finish` sorts them.
    names: Vec<String>,
    /// ifindex -> index in `names`, for the interfaces met in this poll.
    by_ifindex: Vec<(u32, u16)>,
    resolve: R,
    entries: usize,
}

impl<R: FnMut(u32) -> Option<String>> Builder<R> {
    /// A builder for about `capacity` flows; `resolve` names an interface index (None:
    /// it is named `if#N`, as `Flow::from_entry` names it), once per index per poll.
    pub fn new(capacity: usize, resolve: R) -> Self {
        Builder {
            rows: Vec::with_capacity(capacity),
            rare: Vec::new(),
            words: Vec::new(),
            names: Vec::new(),
            by_ifindex: Vec::new(),
            resolve,
            entries: 0,
        }
    }

    /// Entries added so far, with or without packets.
    pub fn entries(&self) -> usize {
        self.entries
    }

    fn iface(&mut self, ifindex: u32) -> u16 {
        if let Some((_, at)) = self.by_ifindex.iter().find(|(i, _)| *i == ifindex) {
            return *at;
        }
        let name = (self.resolve)(ifindex).unwrap_or_else(|| format!("if#{ifindex}"));
        // Two indexes with one name (a rename between two lookups) are one name, as
        // the document compares names.
        let at = match self.names.iter().position(|n| *n == name) {
            Some(p) => p,
            None => {
                self.names.push(name);
                self.names.len() - 1
            }
        };
        // More distinct names than a u16 holds cannot happen on a host; the last one
        // stands for the rest rather than failing a poll.
        let at = u16::try_from(at).unwrap_or(u16::MAX);
        self.by_ifindex.push((ifindex, at));
        at
    }

    /// Adds one flow of the table. Entries without a packet are counted as present and
    /// left out, as `Document::build` leaves them out.
    pub fn add(&mut self, k: &FlowKey, st: &FlowStats) {
        self.entries += 1;
        if st.packets == 0 {
            return;
        }
        let rare = Rare::of(st);
        if rare != Rare::default() {
            self.rare.push(rare);
        }
        let mut row = Row {
            packets: st.packets,
            bytes: st.bytes,
            ect0: st.ecn[2],
            ce: st.ecn[3],
            acks: st.acks,
            // 1-based: 0 says "none" (more rows than u32 holds cannot be read anyway).
            rare: if rare == Rare::default() {
                0
            } else {
                u32::try_from(self.rare.len()).unwrap_or(0)
            },
            first_seen_ns: st.first_seen_ns,
            last_seen_ns: st.last_seen_ns,
            sport: st.sport,
            last_dscp: st.last_dscp,
            ..Row::default()
        };
        let mut flags = k.flags & ROW_FLAGS;
        if flags & KEY_TUNNELLED == 0 {
            flags &= !KEY_INNER_V6; // no inner header, no inner family
        }
        row.flags = flags as u8;
        row.dest_qp = k.dest_qp;
        row.iface = self.iface(k.ifindex);
        if row.wide() {
            row.src = self.words.len() as u32;
            push_addr(&mut self.words, &k.src, k.outer_v6());
            push_addr(&mut self.words, &k.dst, k.outer_v6());
            if k.tunnelled() {
                self.words.push(k.vni);
                push_addr(&mut self.words, &k.inner_src, k.inner_v6());
                push_addr(&mut self.words, &k.inner_dst, k.inner_v6());
                for c in st.inner_ecn {
                    self.words.extend([c as u32, (c >> 32) as u32]);
                }
            }
        } else {
            // Plain IPv4: the addresses in the row itself.
            row.src = k.src[3];
            row.dst = k.dst[3];
        }
        self.rows.push(row);
    }

    /// The document: counters from STATS (`stats`, CPUs summed), the flows in the
    /// document's order, and their rates against `before` (the previous poll's
    /// document, `interval_s` seconds ago).
    pub fn finish(mut self, stats: &[u64], before: Option<(&LiveDocument, f64)>) -> LiveDocument {
        // Names sorted: a row's index then orders as its name.
        let mut by_name: Vec<usize> = (0..self.names.len()).collect();
        by_name.sort_by(|a, b| self.names[*a].cmp(&self.names[*b]));
        let mut rank = vec![0u16; self.names.len()];
        for (r, i) in by_name.iter().enumerate() {
            rank[*i] = u16::try_from(r).unwrap_or(u16::MAX);
        }
        let names: Vec<String> = by_name
            .iter()
            .map(|i| std::mem::take(&mut self.names[*i]))
            .collect();
        for row in &mut self.rows {
            if let Some(r) = rank.get(row.iface as usize) {
                row.iface = *r;
            }
        }
        let mut table = RowTable {
            rows: self.rows,
            words: self.words,
            rare: self.rare,
            names,
            ..RowTable::default()
        };
        let before = match before {
            Some((
                LiveDocument {
                    flows: Flows::Rows(t),
                    ..
                },
                interval_s,
            )) => Some((t, interval_s)),
            _ => None,
        };
        let mut order = None;
        if let Some((prev_table, interval_s)) = before {
            let prev = table.pair_with(prev_table);
            table.rates_since(prev_table, &prev, interval_s);
            order = table.order_from(prev_table, &prev);
        }
        table.order = order.unwrap_or_else(|| {
            let all = (0..table.rows.len() as u32).collect();
            sorted_subset(&table, all)
        });
        LiveDocument {
            flows: Flows::Rows(table),
            counters: Counters::from_stats(stats, self.entries),
        }
    }
}

/// Rows `subset` of `t` in the document's order. Each row gets a 128-bit key whose
/// order is the document's up to the QP (names by rank, IPv4 addresses by value, IPv6
/// addresses and tunnel ends by their rank among the subset's distinct ones), then the
/// QP and the row's index: integers only, so that a million rows sort in tens of
/// milliseconds.
fn sorted_subset(t: &RowTable, subset: Vec<u32>) -> Vec<u32> {
    // Distinct IPv6 outer addresses and tunnel ends (VNI, inner addresses), ranked.
    // (The std hasher: addresses come from the network, a weak hash could be attacked.)
    let mut v6: HashMap<u128, u32> = HashMap::new();
    let mut tails: HashMap<Tail, u32> = HashMap::new();
    let rows = || {
        subset
            .iter()
            .filter_map(|i| t.rows.get(*i as usize).map(|r| (*i, r)))
    };
    for (_, r) in rows().filter(|(_, r)| r.wide()) {
        if r.outer_v6() {
            let (a, b) = t.outer_values(r);
            v6.insert(a, 0);
            v6.insert(b, 0);
        }
        if r.tunnelled() {
            tails.insert(t.tail(r), 0);
        }
    }
    rank_in_place(&mut v6);
    rank_in_place(&mut tails);
    let rank = |m: &HashMap<u128, u32>, v: u128| m.get(&v).copied().unwrap_or(0);

    let mut keys: Vec<(u128, u64)> = rows()
        .map(|(i, r)| {
            let (a, b) = t.outer_values(r);
            // IPv4 addresses order by value, IPv6 ones by rank: both fit 32 bits.
            let (a, b) = if r.outer_v6() {
                (rank(&v6, a), rank(&v6, b))
            } else {
                (a as u32, b as u32)
            };
            let tail = if r.tunnelled() {
                1u128 << 32 | tails.get(&t.tail(r)).copied().unwrap_or(0) as u128
            } else {
                0
            };
            let hi = (r.iface as u128) << 112
                | (r.egress() as u128) << 111
                | (r.outer_v6() as u128) << 110
                | (a as u128) << 78
                | (b as u128) << 46
                | tail << 13;
            (hi, (r.dest_qp as u64) << 32 | i as u64)
        })
        .collect();
    drop(subset);
    keys.sort_unstable();
    keys.iter().map(|(_, lo)| *lo as u32).collect()
}

/// Replaces each key's value by the key's rank among all the keys.
fn rank_in_place<K: Ord + Copy + std::hash::Hash>(m: &mut HashMap<K, u32>) {
    let mut sorted: Vec<K> = m.keys().copied().collect();
    sorted.sort_unstable();
    for (rank, k) in sorted.iter().enumerate() {
        if let Some(v) = m.get_mut(k) {
            *v = rank as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::Rates;
    use crate::telemetry::rates;
    use roce_common::counters::{STATS_LEN, STAT_FLOW_CREATED};
    use roce_common::key::{addr_v4_mapped, FlowKey4};
    use std::collections::HashMap as Map;
    use std::net::IpAddr;

    /// A flow map entry as the kernel holds it.
    #[derive(Clone, Copy, Debug)]
    enum Entry {
        Compact(FlowKey4, FlowStats),
        Wide(FlowKey, FlowStats),
    }

    impl Entry {
        fn stats_mut(&mut self) -> &mut FlowStats {
            match self {
                Entry::Compact(_, s) | Entry::Wide(_, s) => s,
            }
        }
        fn wide(&self) -> (FlowKey, FlowStats) {
            match self {
                Entry::Compact(k, s) => (k.widen(), *s),
                Entry::Wide(k, s) => (*k, *s),
            }
        }
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn v4(r: &mut Rng) -> u32 {
        // Few addresses, so that flows share them and the order needs every field.
        u32::from_ne_bytes([10, 0, r.below(3) as u8, r.below(4) as u8])
    }

    fn v6(r: &mut Rng) -> [u32; 4] {
        let a: std::net::Ipv6Addr = format!("2001:db8::{:x}:{:x}", r.below(3), r.below(3))
            .parse()
            .unwrap();
        let o = a.octets();
        std::array::from_fn(|w| {
            u32::from_ne_bytes([o[w * 4], o[w * 4 + 1], o[w * 4 + 2], o[w * 4 + 3]])
        })
    }

    fn stats(r: &mut Rng) -> FlowStats {
        let packets = if r.below(10) == 0 {
            0
        } else {
            1 + r.below(1000)
        };
        let ce = packets.min(r.below(5));
        FlowStats {
            packets,
            bytes: packets * (60 + r.below(1000)),
            ecn: [r.below(2), r.below(3) / 2, packets - ce, ce],
            inner_ecn: [r.below(3), 0, r.below(9), r.below(2)],
            cnps: r.below(3),
            acks: r.below(50),
            naks: r.below(2),
            rnr_naks: r.below(2),
            psn_gaps: r.below(2),
            first_seen_ns: r.below(1 << 40),
            last_seen_ns: r.below(1 << 41),
            sport: r.below(65536) as u16,
            last_dscp: r.below(64) as u8,
            ..FlowStats::default()
        }
    }

    /// Random entries of every key shape, on interfaces 2, 3 (named) and 9 (not).
    fn entries(seed: u64, n: usize) -> Vec<Entry> {
        let mut r = Rng(seed);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        while out.len() < n {
            let ifindex = [2, 3, 9][r.below(3) as usize];
            let egress = if r.below(2) == 0 { KEY_EGRESS } else { 0 };
            let qp = r.below(4) as u32;
            let st = stats(&mut r);
            let e = match r.below(6) {
                0 | 1 => Entry::Compact(
                    FlowKey4 {
                        src: v4(&mut r),
                        dst: v4(&mut r),
                        qp_dir: qp
                            | if egress != 0 {
                                roce_common::key::KEY4_EGRESS
                            } else {
                                0
                            },
                        ifindex,
                    },
                    st,
                ),
                2 => Entry::Wide(
                    FlowKey {
                        src: v6(&mut r),
                        dst: v6(&mut r),
                        dest_qp: qp,
                        ifindex,
                        flags: KEY_OUTER_V6 | egress,
                        ..FlowKey::default()
                    },
                    st,
                ),
                3 | 4 => {
                    let inner6 = r.below(2) == 0;
                    let outer6 = r.below(3) == 0;
                    let addr =
                        |r: &mut Rng, six: bool| if six { v6(r) } else { addr_v4_mapped(v4(r)) };
                    Entry::Wide(
                        FlowKey {
                            src: addr(&mut r, outer6),
                            dst: addr(&mut r, outer6),
                            inner_src: addr(&mut r, inner6),
                            inner_dst: addr(&mut r, inner6),
                            vni: 5000 + r.below(2) as u32,
                            dest_qp: qp,
                            ifindex,
                            flags: KEY_TUNNELLED
                                | egress
                                | if inner6 { KEY_INNER_V6 } else { 0 }
                                | if outer6 { KEY_OUTER_V6 } else { 0 },
                        },
                        st,
                    )
                }
                // Plain IPv4 under the wide key, as an older kernel side kept it.
                _ => Entry::Wide(
                    FlowKey {
                        src: addr_v4_mapped(v4(&mut r)),
                        dst: addr_v4_mapped(v4(&mut r)),
                        dest_qp: qp,
                        ifindex,
                        flags: egress,
                        ..FlowKey::default()
                    },
                    st,
                ),
            };
            // Distinct flows as the document tells them apart.
            let (k, _) = e.wide();
            if seen.insert(FlowKey4::narrow(&k).map(|n| n.widen()).unwrap_or(k)) {
                out.push(e);
            }
        }
        out
    }

    fn names(i: u32) -> Option<String> {
        match i {
            2 => Some("eth1".into()),
            3 => Some("eth0".into()),
            _ => None,
        }
    }

    fn build(e: &[Entry], st: &[u64], before: Option<(&LiveDocument, f64)>) -> LiveDocument {
        build_named(e, st, before, names)
    }

    fn build_named(
        e: &[Entry],
        st: &[u64],
        before: Option<(&LiveDocument, f64)>,
        resolve: fn(u32) -> Option<String>,
    ) -> LiveDocument {
        let mut b = Builder::new(0, resolve);
        for x in e {
            match x {
                Entry::Compact(k, s) => b.add(&k.widen(), s),
                Entry::Wide(k, s) => b.add(k, s),
            }
        }
        b.finish(st, before)
    }

    fn stats_array() -> Vec<u64> {
        let mut s = vec![0u64; STATS_LEN as usize];
        s[STAT_FLOW_CREATED as usize] = 5000;
        s[0] = 77;
        s
    }

    fn reference(e: &[Entry], st: &[u64]) -> Document {
        Document::build(e.iter().map(Entry::wide).collect(), st, Some(&names))
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

    #[test]
    fn the_json_is_byte_for_byte_the_documents_whole_and_in_pieces() {
        let e = entries(7, 500);
        let live = build(&e, &stats_array(), None);
        let want = serde_json::to_vec(&reference(&e, &stats_array())).unwrap();
        assert_eq!(serde_json::to_vec(&live).unwrap(), want);
        let mut pieces = b"{\"flows\":[".to_vec();
        for start in (0..live.len()).step_by(33) {
            live.write_flows_json(start..start + 33, &mut pieces)
                .unwrap();
        }
        pieces.extend(b"],\"counters\":");
        pieces.extend(serde_json::to_vec(&live.counters).unwrap());
        pieces.push(b'}');
        assert_eq!(
            String::from_utf8(pieces).unwrap(),
            String::from_utf8(want).unwrap()
        );
        // And an empty table.
        let empty = build(&[], &[], None);
        assert_eq!(
            serde_json::to_vec(&empty).unwrap(),
            serde_json::to_vec(&Document::build(Vec::new(), &[], None)).unwrap()
        );
    }

    type FlowId = (
        Option<String>,
        Option<Direction>,
        IpAddr,
        IpAddr,
        Option<u32>,
        Option<IpAddr>,
        Option<IpAddr>,
        u32,
    );

    fn id(f: &Flow) -> FlowId {
        (
            f.ifname.clone(),
            f.direction,
            f.src,
            f.dst,
            f.vni,
            f.inner_src,
            f.inner_dst,
            f.dest_qp,
        )
    }

    fn totals(f: &Flow) -> Totals {
        Totals {
            packets: f.packets,
            bytes: f.bytes,
            ce: f.ecn.ce,
            ecn_packets: f.ecn.total(),
            cnps: f.cnps,
            naks: f.naks + f.rnr_naks,
        }
    }

    /// The rates the agent computed before rows: a hash map of the previous
    /// document's flows by their key.
    fn reference_rates(before: &Document, now: &Document, s: f64) -> Vec<Option<Rates>> {
        let old: Map<FlowId, Totals> = before.flows.iter().map(|f| (id(f), totals(f))).collect();
        now.flows
            .iter()
            .map(|f| {
                let d = totals(f).since(old.get(&id(f))?)?;
                Some(rates::rates(&d, s))
            })
            .collect()
    }

    /// The next poll's entries: counts up, some flows gone, some new, one counted
    /// anew, one with more than 2^32 packets more; `shuffle` changes the kernel's order.
    fn next_poll(e: &[Entry], seed: u64, gone: usize, new: usize, shuffle: bool) -> Vec<Entry> {
        let mut r = Rng(seed);
        let mut out: Vec<Entry> = e
            .iter()
            .enumerate()
            .filter(|(i, _)| *i % (e.len() / gone.max(1)).max(1) != 1 || gone == 0)
            .map(|(_, x)| *x)
            .collect();
        for x in &mut out {
            let s = x.stats_mut();
            if s.packets > 0 {
                let more = r.below(100);
                s.packets += more;
                s.bytes += more * 1000;
                s.ecn[2] += more;
                s.cnps += r.below(2);
            }
        }
        if let Some(x) = out.get_mut(3) {
            x.stats_mut().packets = 1; // evicted and counted anew
        }
        if let Some(x) = out.get_mut(5) {
            let s = x.stats_mut();
            s.packets += 5 << 32;
            s.ecn[2] += 5 << 32;
        }
        // New flows, each put among the old ones as a hash bucket would.
        for (k, n) in entries(seed ^ 0xabcd, new + e.len())
            .into_iter()
            .skip(e.len())
            .enumerate()
        {
            let (wk, _) = n.wide();
            let dup = out.iter().any(|o| {
                let (ok, _) = o.wide();
                FlowKey4::narrow(&ok).map(|x| x.widen()).unwrap_or(ok)
                    == FlowKey4::narrow(&wk).map(|x| x.widen()).unwrap_or(wk)
            });
            if !dup {
                let at = (k * 7919) % (out.len() + 1);
                out.insert(at, n);
            }
        }
        if shuffle {
            for i in (1..out.len()).rev() {
                out.swap(i, r.below(i as u64 + 1) as usize);
            }
        }
        out
    }

    #[test]
    fn rates_and_order_match_a_fresh_sort_and_the_hash_map_of_before() {
        let st = stats_array();
        let first = entries(11, 3000);
        let doc0 = build(&first, &st, None);
        // (gone, new, shuffled): a steady table, a little churn, much churn (a full
        // sort), the kernel's order changed (pairs found by sorting).
        for (gone, new, shuffle) in [
            (0, 0, false),
            (30, 40, false),
            (600, 900, false),
            (10, 10, true),
        ] {
            let second = next_poll(&first, 5 + gone as u64, gone, new, shuffle);
            let live = build(&second, &st, Some((&doc0, 2.0)));
            let fresh = build(&second, &st, None);
            let got = live.to_document();
            let mut want = fresh.to_document();
            assert_eq!(want, reference(&second, &st));
            let rates = reference_rates(&doc0.to_document(), &want, 2.0);
            assert!(rates.iter().filter(|r| r.is_some()).count() > want.flows.len() / 2);
            for (f, r) in want.flows.iter_mut().zip(rates) {
                f.rates = r;
            }
            assert_eq!(got, want, "gone {gone} new {new} shuffled {shuffle}");
        }
    }

    #[test]
    fn renamed_interfaces_pair_by_name_and_get_their_place() {
        fn renamed(i: u32) -> Option<String> {
            match i {
                2 => Some("eth1".into()),
                3 => Some("zz0".into()), // eth0 became zz0: its flows are new
                9 => Some("a9".into()),  // if#9 got a name
                _ => None,
            }
        }
        let st = stats_array();
        let first = entries(21, 1000);
        let doc0 = build(&first, &st, None);
        let second = next_poll(&first, 3, 0, 0, false);
        let live = build_named(&second, &st, Some((&doc0, 1.0)), renamed);
        let want = Document::build(
            second.iter().map(Entry::wide).collect(),
            &st,
            Some(&renamed),
        );
        let rates = reference_rates(&doc0.to_document(), &want, 1.0);
        let got = live.to_document();
        assert_eq!(got.flows.len(), want.flows.len());
        for ((g, w), r) in got.flows.iter().zip(&want.flows).zip(rates) {
            assert_eq!(id(g), id(w));
            assert_eq!(g.rates, r, "{:?}", id(g));
            assert_eq!(
                g.rates.is_some(),
                g.ifname.as_deref() == Some("eth1") && g.packets > 1
            );
        }
    }

    #[test]
    fn no_rates_without_a_previous_poll_or_time_between() {
        let e = entries(4, 200);
        let doc0 = build(&e, &[], None);
        assert!(doc0.flows().all(|f| f.rates.is_none()));
        let doc1 = build(&e, &[], Some((&doc0, 0.0)));
        assert!(doc1.flows().all(|f| f.rates.is_none()));
        let doc2 = build(&e, &[], Some((&doc1, 1.0)));
        let r = doc2.flow(0).and_then(|f| f.rates).expect("a rate");
        assert_eq!((r.packets_per_s, r.interval_s), (0.0, 1.0));
    }

    #[test]
    fn figures_and_endpoints_are_the_flows() {
        let e = entries(9, 400);
        let live = build(&e, &stats_array(), None);
        let doc = live.to_document();
        let mut seen = vec![false; doc.flows.len()];
        live.for_each_figures(|p, f| {
            let d = &doc.flows[p];
            assert!(!std::mem::replace(&mut seen[p], true), "{p} twice");
            assert_eq!(f.ifname, d.ifname.as_deref());
            assert_eq!(f.direction, d.direction);
            assert_eq!(f.tunnelled, d.vni.is_some());
            assert_eq!(
                (f.packets, f.bytes, f.ecn, f.inner_ecn),
                (d.packets, d.bytes, d.ecn, d.inner_ecn)
            );
            assert_eq!(
                (f.cnps, f.acks, f.naks, f.rnr_naks, f.psn_gaps),
                (d.cnps, d.acks, d.naks, d.rnr_naks, d.psn_gaps)
            );
        });
        assert!(seen.iter().all(|s| *s));
        let mut ends = Vec::new();
        live.for_each_endpoints(|dir, src, dst| {
            ends.push((dir, src, dst));
            std::ops::ControlFlow::Continue(())
        });
        let want: Vec<_> = doc
            .flows
            .iter()
            .map(|f| (f.direction, f.src, f.dst))
            .collect();
        assert_eq!(ends, want);
    }

    #[test]
    fn a_document_made_elsewhere_is_kept_as_it_is() {
        let doc = reference(&entries(3, 50), &stats_array());
        let live = LiveDocument::from(doc.clone());
        assert_eq!(live.to_document(), doc);
        assert_eq!(
            serde_json::to_vec(&live).unwrap(),
            serde_json::to_vec(&doc).unwrap()
        );
    }

    #[test]
    fn a_row_is_80_bytes_and_its_rate_24() {
        assert_eq!(std::mem::size_of::<Row>(), 80);
        assert_eq!(std::mem::size_of::<Delta>(), 24);
    }
}
