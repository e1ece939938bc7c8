//! One poll's [`LiveDocument`] from the kernel's entries: [`Builder::add`] turns each
//! entry into a row; [`Builder::finish`] pairs each row with the previous poll's row of
//! the same flow by walking both tables in kernel order (no hash map of flows), takes
//! the rates from the pair, and takes the document's order from the previous poll's:
//! only the flows that are new are sorted and put in their places. A poll after which
//! most flows are new sorts everything (a 128-bit integer key per row).

use std::collections::HashMap;

use roce_common::cnp::{CnpTimes, CnpWrongClass};
use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, KEY_INNER_V6, KEY_MIRROR, KEY_TUNNELLED};
use roce_common::mirror::MirrorTag;
use roce_common::rtt::RttHist;

use super::rows::{
    push_addr, push_mirror, Delta, DeltaState, MirrorOrder, Rare, Row, RowTable, RttNs, Tail,
    TimesNs, ROW_FLAGS,
};
use super::{Flows, LiveDocument};
use crate::doc::Counters;

/// What the kernel keeps of a flow beside its slot, in hashes by slot index: its round
/// trips (RTT_HIST), a mirrored flow's gaps lost by the copies (CAPTURE_GAPS) and its
/// CNPs off the CNP DSCP (CNP_WRONG_CLASS).
#[derive(Clone, Copy, Debug, Default)]
pub struct Beside<'a> {
    pub rtt: Option<&'a RttHist>,
    pub capture_gaps: u64,
    pub cnps_wrong_class: Option<&'a CnpWrongClass>,
    /// A tunnelled flow's outer UDP source port (TUNNEL_PORTS).
    pub outer_sport: Option<u16>,
    /// A CNP flow's ECN -> CNP times (CNP_TIMES).
    pub cnp_times: Option<&'a CnpTimes>,
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
    /// Added to the kernel's first/last-seen times: see [`Builder::unix_offset_ns`].
    unix_offset_ns: i128,
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
            unix_offset_ns: 0,
        }
    }

    /// The wall clock minus the kernel's monotonic clock now
    /// (`doc::event::monotonic_to_unix_offset_ns`): the flows' `first_seen_ns` and
    /// `last_seen_ns`, which the kernel stamps on its monotonic clock, are written as
    /// ns since the Unix epoch, as `analyze` writes them. Without it (0) they stay as
    /// the kernel counted them.
    pub fn unix_offset_ns(mut self, offset: i128) -> Self {
        self.unix_offset_ns = offset;
        self
    }

    /// A kernel time on the clock of the document.
    fn seen(&self, kernel_ns: u64) -> u64 {
        if self.unix_offset_ns == 0 {
            return kernel_ns;
        }
        u64::try_from(kernel_ns as i128 + self.unix_offset_ns).unwrap_or(0)
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
        self.add_tagged(k, st, None);
    }

    /// [`Self::add`], with a mirrored flow's session (`Loaded::for_each_flow_tagged`).
    /// A key with KEY_MIRROR but no session is shown as the flow it is, without one.
    pub fn add_tagged(&mut self, k: &FlowKey, st: &FlowStats, mirror: Option<&MirrorTag>) {
        self.add_flow(k, st, mirror, Beside::default());
    }

    /// [`Self::add_tagged`], with what the kernel keeps of the flow beside its slot.
    pub fn add_flow(
        &mut self,
        k: &FlowKey,
        st: &FlowStats,
        mirror: Option<&MirrorTag>,
        beside: Beside<'_>,
    ) {
        self.entries += 1;
        if st.packets == 0 {
            return;
        }
        let mut rare = Rare::of(st);
        rare.rtt = beside.rtt.and_then(RttNs::of);
        rare.capture_gaps = beside.capture_gaps;
        rare.cnps_wrong_class = beside.cnps_wrong_class.copied().unwrap_or_default();
        if let Some(t) = beside.cnp_times {
            rare.ce_to_cnp = TimesNs::of(&t.ce_to_cnp);
            rare.cnp_interval = TimesNs::of(&t.interval);
        }
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
            first_seen_ns: self.seen(st.first_seen_ns),
            last_seen_ns: self.seen(st.last_seen_ns),
            sport: st.sport,
            last_dscp: st.last_dscp,
            ..Row::default()
        };
        let mut flags = k.flags & ROW_FLAGS;
        if flags & KEY_TUNNELLED == 0 {
            flags &= !KEY_INNER_V6; // no inner header, no inner family
        }
        let mirror = mirror.filter(|_| k.mirrored());
        if mirror.is_none() {
            flags &= !KEY_MIRROR;
        }
        row.flags = flags as u8;
        row.dest_qp = k.dest_qp;
        row.iface = self.iface(k.ifindex);
        if row.wide() {
            row.src = self.words.len() as u32;
            if let Some(tag) = mirror {
                push_mirror(&mut self.words, tag);
            }
            push_addr(&mut self.words, &k.src, k.outer_v6());
            push_addr(&mut self.words, &k.dst, k.outer_v6());
            if k.tunnelled() {
                self.words.push(k.vni);
                push_addr(&mut self.words, &k.inner_src, k.inner_v6());
                push_addr(&mut self.words, &k.inner_dst, k.inner_v6());
                for c in st.inner_ecn {
                    self.words.extend([c as u32, (c >> 32) as u32]);
                }
                self.words.push(u32::from(beside.outer_sport.unwrap_or(0)));
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
            rtt: Vec::new(),
        }
    }
}

impl RowTable {
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
        // Equal flags: the same shape, but a session's sender may be of another
        // family, which `key_span` reads from the first word.
        if a.mirrored() && self.words[a.src as usize] != other.words[b.src as usize] {
            return false;
        }
        self.words[self.key_span(a)] == other.words[other.key_span(b)]
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

/// Rows `subset` of `t` in the document's order. Each row gets a 128-bit key whose
/// order is the document's up to the QP (names by rank, IPv4 addresses by value, IPv6
/// addresses and tunnel ends by their rank among the subset's distinct ones), then the
/// QP and the row's index: integers only, the cheapest keys to sort.
fn sorted_subset(t: &RowTable, subset: Vec<u32>) -> Vec<u32> {
    // Distinct IPv6 outer addresses and tunnel ends (VNI, inner addresses), ranked.
    // (The std hasher: addresses come from the network, a weak hash could be attacked.)
    let mut v6: HashMap<u128, u32> = HashMap::new();
    let mut tails: HashMap<Tail, u32> = HashMap::new();
    let mut mirrors: HashMap<MirrorOrder, u32> = HashMap::new();
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
        if let Some(m) = t.mirror_order(r) {
            mirrors.insert(m, 0);
        }
    }
    rank_in_place(&mut v6);
    rank_in_place(&mut tails);
    rank_in_place(&mut mirrors);
    let rank = |m: &HashMap<u128, u32>, v: u128| m.get(&v).copied().unwrap_or(0);

    // After the QP, the mirror session (none first, then by rank), then the row.
    let mut keys: Vec<(u128, u64, u32)> = rows()
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
            let mirror = t
                .mirror_order(r)
                .map_or(0, |m| 1 + mirrors.get(&m).copied().unwrap_or(0) as u64);
            (hi, (r.dest_qp as u64) << 32 | mirror, i)
        })
        .collect();
    drop(subset);
    keys.sort_unstable();
    keys.iter().map(|(_, _, i)| *i).collect()
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
    use crate::doc::{Direction, Document, Flow, Rates};
    use crate::telemetry::live::tests::{
        build, build_named, entries, reference, stats_array, Entry, Rng,
    };
    use crate::telemetry::rates::{self, Totals};
    use roce_common::key::FlowKey4;
    use std::collections::HashMap as Map;
    use std::net::IpAddr;

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

    /// The reference rates: each flow of `now` against the same flow of `before`,
    /// found in a hash map of `before`'s flows by their key.
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
}
