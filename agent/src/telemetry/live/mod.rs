//! The flows document as the running agent keeps it between polls: one compact row per
//! flow instead of a [`Flow`] per flow, so that a million flows fit in the memory of
//! one host agent. `GET /flows` serializes it as exactly the document a [`Document`]
//! would be (each row becomes its `Flow` only while it is written), and `/metrics`
//! sums the rows without making any `Flow`.
//!
//! This module holds the document as its readers see it ([`LiveDocument`]: its flows
//! one by one, their [`Figures`], their endpoints, its JSON); the parts:
//! - `rows`: the compact rows of one poll and how each reads back as its `Flow`, its
//!   figures, its rate and its place in the document's order;
//! - `builder`: one poll's document from the kernel's entries ([`Builder`]), paired
//!   with the previous poll's for the rates and the order, its first/last-seen times
//!   moved from the kernel's monotonic clock to the Unix epoch.

mod builder;
mod rows;
pub mod rtt_totals;

use std::net::IpAddr;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::doc::{key_addr, Counters, Direction, Document, Ecn, Flow};
use rows::RowTable;

pub use builder::{Beside, Builder};

/// The flows document of the running agent (see the module's doc).
#[derive(Debug, Default)]
pub struct LiveDocument {
    flows: Flows,
    pub counters: Counters,
    /// The round trips of each interface's flows since the agent started
    /// (`roce_rtt_seconds`), by interface name; not part of the JSON.
    pub rtt: Vec<(String, rtt_totals::IfaceRtt)>,
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
    pub retransmitted_packets: u64,
    pub retransmitted_bytes: u64,
    pub retransmit_timeouts: u64,
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
            retransmitted_packets: f.retransmitted_packets,
            retransmitted_bytes: f.retransmitted_bytes,
            retransmit_timeouts: f.retransmit_timeouts,
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

    /// The flows with round trips, each with its histogram by octave (bounds:
    /// `rtt_totals::octave_bound_seconds`) and the sum of its round trips in ns; the
    /// collector's documents only (a document made elsewhere has no histograms).
    pub fn round_trips(
        &self,
    ) -> Box<dyn Iterator<Item = (Flow, [u32; roce_common::rtt::RTT_OCTAVES], u64)> + '_> {
        match &self.flows {
            Flows::Rows(t) => Box::new(t.round_trips()),
            Flows::Flows(_) => Box::new(std::iter::empty()),
        }
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

    /// Calls `f` with what the fabric verdicts read of every flow (`verdict`), making
    /// no `Flow`; in no particular order.
    pub fn for_each_facts(&self, f: &mut dyn FnMut(crate::verdict::FlowFacts<'_>)) {
        match &self.flows {
            Flows::Rows(t) => {
                for r in &t.rows {
                    f(t.facts(r));
                }
            }
            Flows::Flows(v) => {
                for flow in v {
                    f(crate::verdict::FlowFacts::of(flow));
                }
            }
        }
    }

    /// The document's VXLAN tunnels (`verdict::tunnels`); nothing to do in a table
    /// without a tunnelled flow.
    pub fn tunnels(&self) -> Vec<crate::doc::tunnel::TunnelRecord> {
        match &self.flows {
            Flows::Rows(t) => t.tunnels(),
            Flows::Flows(v) => crate::verdict::tunnels::Tunnels::of_flows(v.iter()),
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
            rtt: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::counters::{STATS_LEN, STAT_FLOW_CREATED};
    use roce_common::flow::FlowStats;
    use roce_common::key::{
        addr_v4_mapped, FlowKey, FlowKey4, KEY_EGRESS, KEY_INNER_V6, KEY_OUTER_V6, KEY_TUNNELLED,
    };

    /// A flow map entry as the kernel holds it.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Entry {
        Compact(FlowKey4, FlowStats),
        Wide(FlowKey, FlowStats),
    }

    impl Entry {
        pub(super) fn stats_mut(&mut self) -> &mut FlowStats {
            match self {
                Entry::Compact(_, s) | Entry::Wide(_, s) => s,
            }
        }
        pub(super) fn wide(&self) -> (FlowKey, FlowStats) {
            match self {
                Entry::Compact(k, s) => (k.widen(), *s),
                Entry::Wide(k, s) => (*k, *s),
            }
        }
    }

    /// A small deterministic generator (xorshift).
    pub(super) struct Rng(pub(super) u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(super) fn below(&mut self, n: u64) -> u64 {
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
            retransmitted_packets: r.below(4) / 3 * 7,
            retransmitted_bytes: r.below(4) / 3 * 7000,
            retransmit_timeouts: r.below(4) / 3,
            first_seen_ns: r.below(1 << 40),
            last_seen_ns: r.below(1 << 41),
            sport: r.below(65536) as u16,
            last_dscp: r.below(64) as u8,
            ..FlowStats::default()
        }
    }

    /// Random entries of every key shape, on interfaces 2, 3 (named) and 9 (not).
    pub(super) fn entries(seed: u64, n: usize) -> Vec<Entry> {
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

    pub(super) fn build(
        e: &[Entry],
        st: &[u64],
        before: Option<(&LiveDocument, f64)>,
    ) -> LiveDocument {
        build_named(e, st, before, names)
    }

    pub(super) fn build_named(
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

    pub(super) fn stats_array() -> Vec<u64> {
        let mut s = vec![0u64; STATS_LEN as usize];
        s[STAT_FLOW_CREATED as usize] = 5000;
        s[0] = 77;
        s
    }

    pub(super) fn reference(e: &[Entry], st: &[u64]) -> Document {
        Document::build(e.iter().map(Entry::wide).collect(), st, Some(&names))
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

    #[test]
    fn seen_times_move_to_the_unix_epoch_and_the_json_stays_the_documents() {
        // 1.7e18 ns after the epoch is late 2023; the kernel's clock started at boot.
        let offset: i128 = 1_700_000_000_000_000_000;
        let e = entries(17, 300);
        let mut b = Builder::new(0, names).unix_offset_ns(offset);
        for x in &e {
            let (k, s) = x.wide();
            b.add(&k, &s);
        }
        let live = b.finish(&stats_array(), None);
        // The document of the same entries with their times already on the epoch.
        let shifted: Vec<Entry> = e
            .iter()
            .map(|x| {
                let mut x = *x;
                let s = x.stats_mut();
                s.first_seen_ns = (s.first_seen_ns as i128 + offset) as u64;
                s.last_seen_ns = (s.last_seen_ns as i128 + offset) as u64;
                x
            })
            .collect();
        let want = reference(&shifted, &stats_array());
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&live).unwrap()).unwrap(),
            String::from_utf8(serde_json::to_vec(&want).unwrap()).unwrap()
        );
        let raw = reference(&e, &stats_array());
        for (f, r) in live.flows().zip(&raw.flows) {
            assert_eq!(f.first_seen_ns as i128, r.first_seen_ns as i128 + offset);
            assert_eq!(f.last_seen_ns as i128, r.last_seen_ns as i128 + offset);
        }
        // Without an offset, the kernel's times as they are.
        assert_eq!(build(&e, &stats_array(), None).to_document(), raw);
    }

    #[test]
    fn the_json_has_each_qp_in_hex_right_after_the_number() {
        let e = entries(5, 200);
        let live = build(&e, &stats_array(), None);
        let text = String::from_utf8(serde_json::to_vec(&live).unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let flows = v["flows"].as_array().unwrap();
        assert_eq!(flows.len(), live.len());
        for f in flows {
            let qp = f["dest_qp"].as_u64().unwrap();
            assert_eq!(f["dest_qp_hex"], format!("{qp:#x}"), "{f}");
            assert!(
                text.contains(&format!(
                    "\"dest_qp\":{qp},\"dest_qp_hex\":\"{qp:#x}\",\"packets\":"
                )),
                "{f}"
            );
        }
        let mut pieces = Vec::new();
        live.write_flows_json(0..1, &mut pieces).unwrap();
        assert!(String::from_utf8(pieces)
            .unwrap()
            .contains("\"dest_qp_hex\":\"0x"));
        // And the document reads back whole, the hex ignored on the way in.
        let back: Document = serde_json::from_str(&text).unwrap();
        assert_eq!(back, live.to_document());
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
            assert_eq!(
                (
                    f.retransmitted_packets,
                    f.retransmitted_bytes,
                    f.retransmit_timeouts
                ),
                (
                    d.retransmitted_packets,
                    d.retransmitted_bytes,
                    d.retransmit_timeouts
                )
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
}
