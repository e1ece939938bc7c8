//! The JSON document that `GET /flows`, `roce-agent flows --json` and `analyze --json`
//! print: one record per flow and the classifier's counters.
//!
//! The field names are a public contract (README, "The flow document"): fields may be
//! added, never renamed. Readers ignore fields they do not know, so a newer agent stays
//! readable by an older `flows`.
//!
//! The folder holds what the agent prints and serves: this flows document, its text
//! table (`table`), findings (`finding`), sampled events (`event`) and their pcapng form
//! (`pcapng`). Imports nothing of the crate: every other folder may use it.

pub mod event;
pub mod finding;
pub mod pcapng;
pub mod qp;
pub mod table;
pub mod tunnel;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce_common::counters::{
    STAT_CAPTURE_GAPS_UNDECIDED, STAT_CLASS_BASE, STAT_FLOW_CREATED, STAT_FLOW_INSERT_FAILED,
    STAT_REASON_BASE,
};

use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, FlowKeyMirror};
use roce_common::mirror::MirrorTag;
use roce_common::parsed::{CLASS_NAMES, REASON_NAMES};
use roce_common::policy::{VtepKey, VtepStats};
use roce_common::wire::{ECN_CE, ECN_ECT0, ECN_ECT1, ECN_NOT_ECT};
use serde::{Deserialize, Serialize};

/// The whole document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub flows: Vec<Flow>,
    pub counters: Counters,
}

/// Which way a packet crossed the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// Which program counted a flow: `tc_egress` sets `KEY_EGRESS`, XDP (ingress) does not.
    pub fn of_key(key: &FlowKey) -> Direction {
        if key.egress() {
            Direction::Egress
        } else {
            Direction::Ingress
        }
    }
}

/// An IP address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

/// Packets per ECN codepoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ecn {
    pub not_ect: u64,
    pub ect1: u64,
    pub ect0: u64,
    pub ce: u64,
}

impl Ecn {
    /// From counts indexed by codepoint, as `FlowStats` keeps them.
    pub fn from_codepoints(c: &[u64; 4]) -> Ecn {
        Ecn {
            not_ect: c[ECN_NOT_ECT as usize],
            ect1: c[ECN_ECT1 as usize],
            ect0: c[ECN_ECT0 as usize],
            ce: c[ECN_CE as usize],
        }
    }

    pub fn total(&self) -> u64 {
        self.not_ect + self.ect1 + self.ect0 + self.ce
    }
}

/// One direction of one queue pair (on one interface, live).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Flow {
    /// The interface it was seen on; null in `analyze`.
    pub ifname: Option<String>,
    /// null in `analyze`.
    pub direction: Option<Direction>,
    /// Outer address family.
    pub family: Family,
    /// Outer addresses.
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The RoCE UDP source port (the inner one when tunnelled) of the last packet.
    pub sport: u16,
    /// null when not tunnelled.
    pub vni: Option<u32>,
    pub inner_family: Option<Family>,
    pub inner_src: Option<IpAddr>,
    pub inner_dst: Option<IpAddr>,
    /// BTH destination QP. The JSON carries it twice: `dest_qp`, the number, then
    /// (added) `dest_qp_hex`, the same number as people, tshark and perftest write QPs
    /// (`"0x1234"`). Reading takes `dest_qp` and does without `dest_qp_hex` (an older
    /// agent's document has none).
    #[serde(flatten, with = "dest_qp_json")]
    pub dest_qp: u32,
    pub packets: u64,
    /// Frame bytes from the Ethernet header on, no FCS.
    pub bytes: u64,
    /// Codepoints of the outer IP header.
    pub ecn: Ecn,
    /// Codepoints of the inner IP header; null when not tunnelled.
    pub inner_ecn: Option<Ecn>,
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
    /// Added, present only when true: the flow's requests were counted on more than
    /// one CPU (RSS or RPS spreading one queue pair), each CPU with its own PSN state,
    /// so `psn_gaps` may include false gaps.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub psn_split: bool,
    /// Outer DSCP of the last packet.
    pub last_dscp: u8,
    /// Added: requests whose PSN was at or before one the flow had already carried
    /// (sent again: a go-back after a NAK or a timeout, or a READ re-issued), and
    /// their frame bytes.
    #[serde(default)]
    pub retransmitted_packets: u64,
    #[serde(default)]
    pub retransmitted_bytes: u64,
    /// Added: go-backs (the first retransmission after new requests, or one at or
    /// before the previous one) that followed no NAK or RNR NAK of their PSN between
    /// the two hosts: the requester's ACK timeout fired.
    #[serde(default)]
    pub retransmit_timeouts: u64,
    /// Added: when the flow's first packet was counted, in ns since the Unix epoch
    /// (1970-01-01 UTC), live and in `analyze` alike. Live, the kernel stamps flows
    /// with its monotonic clock read at most once a tick (1 to 10 ms of resolution) and
    /// the collector turns that into wall-clock time at each poll (adding the wall clock
    /// minus the monotonic clock at that moment: a step of the wall clock moves
    /// every flow's times with it). In `analyze`, the capture's own timestamps. 0:
    /// unknown (an older agent's document).
    #[serde(default)]
    pub first_seen_ns: u64,
    /// Added: when the flow's last packet was counted, on the clock of `first_seen_ns`.
    #[serde(default)]
    pub last_seen_ns: u64,
    /// Added: rates over the last collector interval; null in `analyze` and for a flow
    /// the collector sees for the first time.
    #[serde(default)]
    pub rates: Option<Rates>,
    /// Added: the mirror session the flow's packets arrived in (ERSPAN or GRE on a
    /// mirror collector interface, or in a capture of one); null otherwise.
    #[serde(default)]
    pub mirror: Option<Mirror>,
    /// Added: the owner of the flow's queue pair on this host, from the QP table
    /// (RDMA netlink); null when no local QP matches (or no table).
    #[serde(default)]
    pub owner: Option<qp::QpOwner>,
    /// Added: round trips of the requests this flow's responses answered (the flow
    /// that carries ACKs and READ responses to the requester: `roce_common::rtt`);
    /// null without a sample. Live only where both directions cross the agent.
    #[serde(default)]
    pub rtt: Option<Rtt>,
    /// Added: the go-backs that followed a NAK, and the time from the NAK to the first
    /// resend (the requester's reaction where the NAK arrives; plus the way back where
    /// it leaves); null when none.
    #[serde(default)]
    pub nak_to_resend: Option<Durations>,
    /// Added: go-back-N recoveries, from the first resend to the first request beyond
    /// where the flow had been; null when none ended.
    #[serde(default)]
    pub recovery: Option<Durations>,
    /// Added: the flow's PSN gaps (of `psn_gaps`) that later responses of its queue
    /// pair covered with no NAK and no resend of the missing PSNs: lost by the capture
    /// point (a sniffer, a mirror port), not by the fabric (`roce_common::gaps`).
    /// Measured in `analyze` and on live mirror sessions; null elsewhere.
    #[serde(default)]
    pub capture_gaps: Option<u64>,
    /// Added: the flow's CNPs (of `cnps`) on an outer DSCP other than the policy's CNP
    /// DSCP (`roce_common::cnp`: the `cnp_wrong_class` verdict), live and in `analyze`;
    /// and those DSCPs, lowest first.
    #[serde(default)]
    pub cnps_wrong_class: u64,
    #[serde(default)]
    pub cnp_wrong_dscps: Vec<u8>,
    /// Added: on a flow that carries CNPs, the time from the first CE-marked packet
    /// between its hosts that no CNP had answered to the CNP that answered it, and the
    /// time between its successive CNPs (the notification point's pacing), as
    /// `rtt` summarises round trips; null without CNPs. Live, a CNP leaving answers the
    /// marks that arrived (the notification point is this host), and on a mirror
    /// session the copies of both; every CNP is paced.
    #[serde(default)]
    pub ce_to_cnp: Option<Rtt>,
    #[serde(default)]
    pub cnp_interval: Option<Rtt>,
    /// Added: a tunnelled flow's outer UDP source port, the one its VTEP chose and the
    /// underlay's ECMP hashes on, from the flow's first packet (a VTEP keeps one port
    /// per inner flow); null when not tunnelled.
    #[serde(default)]
    pub outer_sport: Option<u16>,
}

/// How many times something took how long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Durations {
    pub count: u64,
    pub mean_us: f64,
    /// The longest (whole µs); null where not kept.
    pub max_us: Option<f64>,
}

impl Durations {
    /// `count` durations summing to `sum_ns` (None when none).
    pub fn of(count: u64, sum_ns: u64, max_us: Option<u32>) -> Option<Durations> {
        (count > 0).then(|| Durations {
            count,
            // µs to the ns.
            mean_us: (sum_ns as f64 / count as f64).round() / 1000.0,
            max_us: max_us.map(f64::from),
        })
    }
}

/// Round-trip times of one flow, from the requests' leaving to their responses'
/// arriving (at the agent's interface or in the capture).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rtt {
    pub samples: u64,
    /// Microseconds, to the nanosecond: the shortest exactly; p50 and p99 read from
    /// the histogram, to within 3.1%.
    pub min_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Rtt {
    /// The summary of a histogram; None without samples.
    pub fn of(h: &roce_common::rtt::RttHist) -> Option<Rtt> {
        Some(Rtt::from_ns(
            h.samples,
            h.min_ns,
            h.quantile_ns(0.5)?,
            h.quantile_ns(0.99)?,
        ))
    }

    /// The figures in ns, as the document writes them (µs).
    pub fn from_ns(samples: u64, min_ns: u64, p50_ns: u64, p99_ns: u64) -> Rtt {
        let us = |ns: u64| ns as f64 / 1000.0;
        Rtt {
            samples,
            min_us: us(min_ns),
            p50_us: us(p50_ns),
            p99_us: us(p99_ns),
        }
    }
}

/// The mirror session a mirrored flow arrived in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Mirror {
    /// "erspan2" | "erspan3" | "gre".
    pub kind: MirrorKind,
    /// ERSPAN session ID, or the GRE key (0 when the GRE header has none).
    pub session: u32,
    /// The mirroring device's address (the outer IP source).
    pub source: IpAddr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MirrorKind {
    Erspan2,
    Erspan3,
    Gre,
}

/// `Flow::dest_qp` in JSON: `"dest_qp": 4660, "dest_qp_hex": "0x1234"` written as
/// two entries of the flow's object (the field is flattened), `dest_qp` read back.
/// For any record with a `dest_qp`: `#[serde(flatten, with = "crate::doc::dest_qp_json")]`.
pub(crate) mod dest_qp_json {
    use serde::ser::SerializeMap as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(qp: &u32, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("dest_qp", qp)?;
        // Written straight into the output: no string made per flow.
        map.serialize_entry("dest_qp_hex", &format_args!("{qp:#x}"))?;
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        #[derive(Deserialize)]
        struct Qp {
            dest_qp: u32,
        }
        Qp::deserialize(d).map(|q| q.dest_qp)
    }
}

/// A flow's rates over the last collector interval (live only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// The interval the rates are over, in seconds.
    pub interval_s: f64,
    pub packets_per_s: f64,
    /// Frame bits (Ethernet header on, no FCS) per second.
    pub bits_per_s: f64,
    /// Packets with outer CE per second.
    pub ce_per_s: f64,
    /// Outer CE packets / packets over the interval (0 when no packet).
    pub ce_ratio: f64,
    pub cnps_per_s: f64,
    /// NAKs and RNR NAKs per second.
    pub naks_per_s: f64,
}

impl Flow {
    /// Fraction of packets whose outer ECN was CE (0 when there were none).
    pub fn ce_ratio(&self) -> f64 {
        let total = self.ecn.total();
        if total == 0 {
            0.0
        } else {
            self.ecn.ce as f64 / total as f64
        }
    }

    /// The document's order: interface, direction, outer addresses, VNI, inner
    /// addresses, destination QP.
    pub fn canonical_cmp(&self, other: &Flow) -> Ordering {
        self.ifname
            .cmp(&other.ifname)
            .then(self.direction.cmp(&other.direction))
            .then(self.family.cmp(&other.family))
            .then(self.src.cmp(&other.src))
            .then(self.dst.cmp(&other.dst))
            .then(self.vni.cmp(&other.vni))
            .then(self.inner_src.cmp(&other.inner_src))
            .then(self.inner_dst.cmp(&other.inner_dst))
            .then(self.dest_qp.cmp(&other.dest_qp))
            .then(self.mirror.cmp(&other.mirror))
    }
}

/// What the classifier made of every frame, whether or not it made a flow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub roce: u64,
    pub roce_in_vxlan: u64,
    pub vxlan_other: u64,
    pub other_udp: u64,
    pub other_ip: u64,
    pub non_ip: u64,
    /// Added: mirror copies (GRE, ERSPAN II/III on a mirror interface, or in
    /// `analyze`) whose mirrored frame is not RoCE.
    #[serde(default)]
    pub mirror_other: u64,
    /// Added: mirror copies cut before their mirrored frame's BTH.
    #[serde(default)]
    pub mirror_truncated: u64,
    /// Frames that could not be parsed as far as the BTH, by reason (every reason
    /// is present, zero or not).
    pub parse_errors: BTreeMap<String, u64>,
    /// Added: flow entries created.
    #[serde(default)]
    pub flows_created: u64,
    /// Added: flow entries that could not be inserted (their packets are counted
    /// under their class but on no flow).
    #[serde(default)]
    pub flow_insert_failed: u64,
    /// Added: flows created but no longer in the table (evicted by the agent to make
    /// room, the least recently seen first); 0 in `analyze`.
    #[serde(default)]
    pub flows_evicted: u64,
    /// Added: what the tc QoS programs did (all zero when none is attached, and in `analyze`).
    #[serde(default)]
    pub qos: QosCounters,
    /// Added: sampled events written for `GET /events`, by kind (all zero when events
    /// are off, and in `analyze`).
    #[serde(default)]
    pub events: EventCounters,
    /// Added: sampled events lost, by reason (`rate_limit`, `ring_full`).
    #[serde(default)]
    pub events_dropped: EventDropCounters,
    /// Added: round-trip samples not taken because the wire did not tie a response to
    /// its request flow (`shared_psn`, `other_qp`: `roce_common::rtt`).
    #[serde(default)]
    pub rtt_unpaired: RttUnpairedCounters,
    /// Added: PSN gaps of mirrored flows left without a verdict (fabric or capture)
    /// because a newer gap of the same host pair took their place in the watch (live:
    /// one per host pair and session; `analyze`: 256 per host pair).
    #[serde(default)]
    pub capture_gaps_undecided: u64,
    /// Added: the RoCE of each VXLAN tunnel (interface, direction, VTEPs, VNI), with
    /// the PSN gaps of its inner side where the agent sees that too (`tunnel`).
    #[serde(default)]
    pub tunnels: Vec<tunnel::TunnelRecord>,
}

/// Declares a struct of counters from one list of STATS counters in `roce_common`
/// (`for_each_*_counter!`): a field per counter (its JSON name), filled from its index.
macro_rules! stat_counters_struct {
    ($(#[$sm:meta])* $S:ident; $( $(#[$m:meta])* $konst:ident => $name:ident ),* $(,)?) => {
        $(#[$sm])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct $S {
            $( $(#[$m])* pub $name: u64, )*
        }

        impl $S {
            pub fn from_stats(stats: &[u64]) -> $S {
                use roce_common::counters::*;
                let at = |i: u32| stats.get(i as usize).copied().unwrap_or(0);
                $S { $( $name: at($konst), )* }
            }

            /// The counters by name (metric labels, logs).
            pub fn named(&self) -> BTreeMap<&'static str, u64> {
                BTreeMap::from([$( (stringify!($name), self.$name) ),*])
            }

            pub fn total(&self) -> u64 {
                0 $( + self.$name )*
            }
        }
    };
}

macro_rules! event_counters_struct {
    ($($t:tt)*) => {
        stat_counters_struct! {
            /// Sampled events written into the EVENTS ring, by kind (`counters.events`).
            EventCounters; $($t)*
        }
    };
}
roce_common::for_each_event_counter!(event_counters_struct);

macro_rules! event_drop_counters_struct {
    ($($t:tt)*) => {
        stat_counters_struct! {
            /// Sampled events lost, by reason (`counters.events_dropped`); events the
            /// sampling left out are not lost and not counted.
            EventDropCounters; $($t)*
        }
    };
}
roce_common::for_each_event_drop_counter!(event_drop_counters_struct);

macro_rules! rtt_unpaired_counters_struct {
    ($($t:tt)*) => {
        stat_counters_struct! {
            /// Round-trip samples not taken, by reason (`counters.rtt_unpaired`): the
            /// pairing of a response with its request flow would have been a guess.
            RttUnpairedCounters; $($t)*
        }
    };
}
roce_common::for_each_rtt_unpaired_counter!(rtt_unpaired_counters_struct);

/// Declares [`QosCounters`] from the one list of QoS counters in `roce_common`:
/// a field per counter (its JSON name), filled from its STATS index.
macro_rules! qos_counters_struct {
    ($( $(#[$m:meta])* $konst:ident => $name:ident ),* $(,)?) => {
        /// The host QoS counters (the STATS entries of `for_each_qos_counter!`) and the
        /// decapsulation-side counters per remote VTEP.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct QosCounters {
            $( $(#[$m])* pub $name: u64, )*
            /// Per remote VTEP (outer source address), what arrived on VTEP underlays.
            pub vteps: Vec<VtepRecord>,
        }

        impl QosCounters {
            pub fn from_stats(stats: &[u64]) -> QosCounters {
                use roce_common::counters::*;
                let at = |i: u32| stats.get(i as usize).copied().unwrap_or(0);
                QosCounters {
                    $( $name: at($konst), )*
                    vteps: Vec::new(),
                }
            }

            /// The scalar counters by name (logs, change detection).
            pub fn named(&self) -> BTreeMap<&'static str, u64> {
                BTreeMap::from([$( (stringify!($name), self.$name) ),*])
            }
        }
    };
}
roce_common::for_each_qos_counter!(qos_counters_struct);

/// What arrived from one remote VTEP.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VtepRecord {
    /// Outer source address of the VXLAN packets.
    pub remote: String,
    /// Their VNI: a remote VTEP has a record per VNI it sends.
    pub vni: u32,
    pub packets: u64,
    pub dscp_mismatch: u64,
    pub ce_over_ect: u64,
    pub ce_over_not_ect: u64,
    /// Inner CE: marked before encapsulation (`ce_over_ect` and `ce_over_not_ect`
    /// are the underlay's marks).
    pub inner_ce: u64,
    pub last_outer_dscp: u8,
    pub last_inner_dscp: u8,
}

impl VtepRecord {
    pub fn from_entry(k: &VtepKey, s: &VtepStats) -> VtepRecord {
        let v4 =
            k.addr[0] == 0 && k.addr[1] == 0 && k.addr[2] == u32::from_ne_bytes([0, 0, 0xFF, 0xFF]);
        VtepRecord {
            remote: key_addr(&k.addr, !v4).to_string(),
            vni: k.vni,
            packets: s.packets,
            dscp_mismatch: s.dscp_mismatch,
            ce_over_ect: s.ce_over_ect,
            ce_over_not_ect: s.ce_over_not_ect,
            inner_ce: s.inner_ce,
            last_outer_dscp: s.last_outer_tos >> 2,
            last_inner_dscp: s.last_inner_tos >> 2,
        }
    }
}

impl Counters {
    /// From the STATS array (summed over CPUs); `present` is the number of flows in
    /// the table now. Entries past the end of `stats` count as zero.
    pub fn from_stats(stats: &[u64], present: usize) -> Counters {
        let at = |i: u32| stats.get(i as usize).copied().unwrap_or(0);
        let class = |name: &str| {
            CLASS_NAMES
                .iter()
                .position(|n| *n == name)
                .map_or(0, |i| at(STAT_CLASS_BASE + i as u32))
        };
        let parse_errors = REASON_NAMES
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), at(STAT_REASON_BASE + i as u32)))
            .collect();
        let created = at(STAT_FLOW_CREATED);
        Counters {
            roce: class("roce"),
            roce_in_vxlan: class("roce_in_vxlan"),
            vxlan_other: class("vxlan_other"),
            other_udp: class("other_udp"),
            other_ip: class("other_ip"),
            non_ip: class("non_ip"),
            mirror_other: class("mirror_other"),
            mirror_truncated: class("mirror_truncated"),
            parse_errors,
            flows_created: created,
            flow_insert_failed: at(STAT_FLOW_INSERT_FAILED),
            flows_evicted: created.saturating_sub(present as u64),
            qos: QosCounters::from_stats(stats),
            events: EventCounters::from_stats(stats),
            events_dropped: EventDropCounters::from_stats(stats),
            rtt_unpaired: RttUnpairedCounters::from_stats(stats),
            capture_gaps_undecided: at(STAT_CAPTURE_GAPS_UNDECIDED),
            tunnels: Vec::new(),
        }
    }

    /// Frames counted under any parse-error reason.
    pub fn parse_errors_total(&self) -> u64 {
        self.parse_errors.values().sum()
    }
}

/// An address of a `FlowKey` (four raw network-order words, IPv4 stored mapped).
pub fn key_addr(words: &[u32; 4], v6: bool) -> IpAddr {
    let mut b = [0u8; 16];
    for (chunk, w) in b.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    if v6 {
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    }
}

fn family(v6: bool) -> Family {
    if v6 {
        Family::Ipv6
    } else {
        Family::Ipv4
    }
}

/// Turns an interface index into its name. `None` (as in `analyze`) leaves
/// `ifname` and `direction` null.
pub type IfnameResolver<'a> = &'a dyn Fn(u32) -> Option<String>;

impl Flow {
    /// One flow record from a key and its merged counters.
    pub fn from_entry(key: &FlowKey, st: &FlowStats, resolve: Option<IfnameResolver<'_>>) -> Flow {
        let tunnelled = key.tunnelled();
        let (ifname, direction) = match resolve {
            Some(r) => (
                Some(r(key.ifindex).unwrap_or_else(|| format!("if#{}", key.ifindex))),
                Some(Direction::of_key(key)),
            ),
            None => (None, None),
        };
        Flow {
            ifname,
            direction,
            family: family(key.outer_v6()),
            src: key_addr(&key.src, key.outer_v6()),
            dst: key_addr(&key.dst, key.outer_v6()),
            sport: st.sport,
            vni: tunnelled.then_some(key.vni),
            inner_family: tunnelled.then(|| family(key.inner_v6())),
            inner_src: tunnelled.then(|| key_addr(&key.inner_src, key.inner_v6())),
            inner_dst: tunnelled.then(|| key_addr(&key.inner_dst, key.inner_v6())),
            dest_qp: key.dest_qp,
            packets: st.packets,
            bytes: st.bytes,
            ecn: Ecn::from_codepoints(&st.ecn),
            inner_ecn: tunnelled.then(|| Ecn::from_codepoints(&st.inner_ecn)),
            cnps: st.cnps,
            acks: st.acks,
            naks: st.naks,
            rnr_naks: st.rnr_naks,
            psn_gaps: st.psn_gaps,
            psn_split: st.psn.split(),
            last_dscp: st.last_dscp,
            retransmitted_packets: st.retransmitted_packets,
            retransmitted_bytes: st.retransmitted_bytes,
            retransmit_timeouts: st.retransmit_timeouts,
            first_seen_ns: st.first_seen_ns,
            last_seen_ns: st.last_seen_ns,
            rates: None,
            mirror: None,
            owner: None,
            rtt: None,
            nak_to_resend: Durations::of(u64::from(st.nak_resends), st.nak_to_resend_ns, None),
            recovery: Durations::of(
                u64::from(st.recoveries),
                st.recovery_ns,
                Some(st.recovery_max_us),
            ),
            capture_gaps: None,
            cnps_wrong_class: 0,
            cnp_wrong_dscps: Vec::new(),
            ce_to_cnp: None,
            cnp_interval: None,
            outer_sport: None,
        }
    }

    /// Sets the flow's CNPs off the CNP DSCP (kept apart from its counters).
    pub fn set_cnps_wrong_class(&mut self, c: &roce_common::cnp::CnpWrongClass) {
        self.cnps_wrong_class = c.packets;
        self.cnp_wrong_dscps = c.dscp_list().collect();
    }

    /// [`Flow::from_entry`] of a mirrored flow: the mirrored packet's key, and the
    /// session it arrived in.
    pub fn from_mirrored_entry(
        key: &FlowKeyMirror,
        st: &FlowStats,
        resolve: Option<IfnameResolver<'_>>,
    ) -> Flow {
        Flow {
            mirror: Mirror::from_tag(&key.tag),
            // A mirror port is a capture point: its gaps are told apart (the count is
            // kept apart from the slot, CAPTURE_GAPS; the caller sets it).
            capture_gaps: Some(0),
            ..Flow::from_entry(&key.key, st, resolve)
        }
    }
}

impl Mirror {
    /// The session of a mirror tag as the document shows it (None for a kind this
    /// agent does not know).
    pub fn from_tag(tag: &MirrorTag) -> Option<Mirror> {
        let kind = match tag.encapsulation() {
            roce_common::mirror::MIRROR_GRE => MirrorKind::Gre,
            roce_common::mirror::MIRROR_ERSPAN2 => MirrorKind::Erspan2,
            roce_common::mirror::MIRROR_ERSPAN3 => MirrorKind::Erspan3,
            _ => return None,
        };
        Some(Mirror {
            kind,
            session: tag.session,
            source: key_addr(&tag.source, tag.source_v6()),
        })
    }
}

impl Document {
    /// Builds the document from the flow table (CPUs already merged) and the STATS
    /// array, with flows in [`Flow::canonical_cmp`] order. Flows with no packet
    /// (an entry created but never counted on) are left out.
    pub fn build(
        flows: Vec<(FlowKey, FlowStats)>,
        stats: &[u64],
        resolve: Option<IfnameResolver<'_>>,
    ) -> Document {
        Document::build_with_mirrored(flows, Vec::new(), stats, resolve)
    }

    /// [`Document::build`] with the mirrored flows too (FLOWS_MIRROR, or a capture
    /// of a mirror port), each under its key and session.
    pub fn build_with_mirrored(
        flows: Vec<(FlowKey, FlowStats)>,
        mirrored: Vec<(FlowKeyMirror, FlowStats)>,
        stats: &[u64],
        resolve: Option<IfnameResolver<'_>>,
    ) -> Document {
        let present = flows.len() + mirrored.len();
        let mut out: Vec<Flow> = flows
            .iter()
            .filter(|(_, st)| st.packets > 0)
            .map(|(k, st)| Flow::from_entry(k, st, resolve))
            .chain(
                mirrored
                    .iter()
                    .filter(|(_, st)| st.packets > 0)
                    .map(|(k, st)| Flow::from_mirrored_entry(k, st, resolve)),
            )
            .collect();
        out.sort_by(Flow::canonical_cmp);
        Document {
            flows: out,
            counters: Counters::from_stats(stats, present),
        }
    }
}

/// A flow for the tests of the modules that read documents (doc, telemetry, top): on
/// `ifname`, ingress, `src` to `dst` (the family of `src`), QP `qp`, from UDP port
/// 49152 with DSCP 26, not in VXLAN, nothing counted. A test sets what it counts with
/// `Flow { packets: 10, ..test_flow(...) }`.
#[cfg(test)]
pub(crate) fn test_flow(ifname: &str, src: &str, dst: &str, qp: u32) -> Flow {
    let src: IpAddr = src.parse().unwrap();
    Flow {
        ifname: Some(ifname.to_string()),
        direction: Some(Direction::Ingress),
        family: if src.is_ipv6() {
            Family::Ipv6
        } else {
            Family::Ipv4
        },
        src,
        dst: dst.parse().unwrap(),
        sport: 49152,
        vni: None,
        inner_family: None,
        inner_src: None,
        inner_dst: None,
        dest_qp: qp,
        packets: 0,
        bytes: 0,
        ecn: Ecn::default(),
        inner_ecn: None,
        cnps: 0,
        acks: 0,
        naks: 0,
        rnr_naks: 0,
        psn_gaps: 0,
        psn_split: false,
        last_dscp: 26,
        retransmitted_packets: 0,
        retransmitted_bytes: 0,
        retransmit_timeouts: 0,
        first_seen_ns: 0,
        last_seen_ns: 0,
        rates: None,
        mirror: None,
        owner: None,
        rtt: None,
        nak_to_resend: None,
        recovery: None,
        capture_gaps: None,
        cnps_wrong_class: 0,
        cnp_wrong_dscps: Vec::new(),
        ce_to_cnp: None,
        cnp_interval: None,
        outer_sport: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::counters::STATS_LEN;
    use roce_common::key::{addr_v4_mapped, KEY_EGRESS, KEY_INNER_V6, KEY_OUTER_V6, KEY_TUNNELLED};
    use roce_common::parsed::Reason;

    fn v4(a: [u8; 4]) -> [u32; 4] {
        addr_v4_mapped(u32::from_ne_bytes(a))
    }

    fn v6(a: Ipv6Addr) -> [u32; 4] {
        let b = a.octets();
        let mut w = [0u32; 4];
        for (i, c) in b.chunks_exact(4).enumerate() {
            w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        }
        w
    }

    fn plain_key(src: [u8; 4], dst: [u8; 4], qp: u32, ifindex: u32) -> FlowKey {
        FlowKey {
            src: v4(src),
            dst: v4(dst),
            dest_qp: qp,
            ifindex,
            ..Default::default()
        }
    }

    fn stats(packets: u64) -> FlowStats {
        FlowStats {
            packets,
            bytes: packets * 1284,
            ecn: [0, 0, packets - 1, 1],
            sport: 49152,
            last_dscp: 26,
            ..Default::default()
        }
    }

    fn names(i: u32) -> Option<String> {
        match i {
            2 => Some("eth1".into()),
            3 => Some("eth2".into()),
            _ => None,
        }
    }

    #[test]
    fn plain_ipv4_flow_matches_the_design_example() {
        let key = plain_key([198, 18, 0, 1], [198, 18, 0, 2], 4660, 2);
        let mut st = stats(10);
        st.bytes = 12840;
        st.ecn = [0, 0, 8, 2];
        let mut raw = vec![0u64; STATS_LEN as usize];
        raw[0] = 10;
        let doc = Document::build(vec![(key, st)], &raw, Some(&names));
        let v = serde_json::to_value(&doc).unwrap();
        let f = &v["flows"][0];
        assert_eq!(f["ifname"], "eth1");
        assert_eq!(f["direction"], "ingress");
        assert_eq!(f["family"], "ipv4");
        assert_eq!(f["src"], "198.18.0.1");
        assert_eq!(f["dst"], "198.18.0.2");
        assert_eq!(f["sport"], 49152);
        assert!(f["vni"].is_null());
        assert!(f["inner_family"].is_null());
        assert!(f["inner_src"].is_null());
        assert!(f["inner_dst"].is_null());
        assert!(f["inner_ecn"].is_null());
        assert_eq!(f["dest_qp"], 4660);
        assert_eq!(f["dest_qp_hex"], "0x1234");
        assert_eq!(f["packets"], 10);
        assert_eq!(f["bytes"], 12840);
        assert_eq!(
            f["ecn"],
            serde_json::json!({"not_ect": 0, "ect1": 0, "ect0": 8, "ce": 2})
        );
        for k in [
            "cnps",
            "acks",
            "naks",
            "rnr_naks",
            "psn_gaps",
            "retransmitted_packets",
            "retransmitted_bytes",
            "retransmit_timeouts",
        ] {
            assert_eq!(f[k], 0, "{k}");
        }
        assert_eq!(f["last_dscp"], 26);
        // The loss fields come from the counters of the same names.
        st.retransmitted_packets = 3;
        st.retransmitted_bytes = 3000;
        st.retransmit_timeouts = 1;
        let doc = Document::build(vec![(key, st)], &raw, Some(&names));
        let f = &serde_json::to_value(&doc).unwrap()["flows"][0];
        assert_eq!(
            (
                &f["retransmitted_packets"],
                &f["retransmitted_bytes"],
                &f["retransmit_timeouts"]
            ),
            (&3.into(), &3000.into(), &1.into())
        );
        assert_eq!(v["counters"]["roce"], 10);
        assert_eq!(v["counters"]["parse_errors"]["truncated_bth"], 0);
        assert_eq!(
            v["counters"]["parse_errors"].as_object().unwrap().len(),
            REASON_NAMES.len()
        );
    }

    #[test]
    fn tunnelled_ipv6_in_ipv4_flow() {
        let inner_src: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let inner_dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let key = FlowKey {
            src: v4([198, 18, 0, 1]),
            dst: v4([198, 18, 0, 2]),
            inner_src: v6(inner_src),
            inner_dst: v6(inner_dst),
            vni: 5001,
            dest_qp: 17,
            ifindex: 3,
            flags: KEY_TUNNELLED | KEY_INNER_V6,
        };
        let mut st = stats(4);
        st.inner_ecn = [1, 0, 3, 0];
        let doc = Document::build(vec![(key, st)], &[], Some(&names));
        let f = &doc.flows[0];
        assert_eq!(f.ifname.as_deref(), Some("eth2"));
        assert_eq!(f.direction, Some(Direction::Ingress));
        assert_eq!(f.vni, Some(5001));
        assert_eq!(f.inner_family, Some(Family::Ipv6));
        assert_eq!(f.inner_src, Some(IpAddr::V6(inner_src)));
        assert_eq!(f.inner_dst, Some(IpAddr::V6(inner_dst)));
        assert_eq!(
            f.inner_ecn,
            Some(Ecn {
                not_ect: 1,
                ect1: 0,
                ect0: 3,
                ce: 0
            })
        );
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(v["flows"][0]["inner_src"], "2001:db8::1");
        assert_eq!(v["flows"][0]["inner_family"], "ipv6");
    }

    #[test]
    fn ipv6_outer_addresses_print_as_ipv6() {
        let a: Ipv6Addr = "fd00::a".parse().unwrap();
        let key = FlowKey {
            src: v6(a),
            dst: v6("fd00::b".parse().unwrap()),
            flags: KEY_OUTER_V6,
            ..Default::default()
        };
        let f = Flow::from_entry(&key, &stats(1), None);
        assert_eq!(f.family, Family::Ipv6);
        assert_eq!(f.src.to_string(), "fd00::a");
        assert!(f.ifname.is_none() && f.direction.is_none());
    }

    #[test]
    fn an_egress_key_is_an_egress_flow_next_to_its_ingress_twin() {
        let ingress = plain_key([198, 18, 0, 1], [198, 18, 0, 2], 4660, 2);
        let egress = FlowKey {
            flags: KEY_EGRESS,
            ..ingress
        };
        let doc = Document::build(
            vec![(egress, stats(3)), (ingress, stats(2))],
            &[],
            Some(&names),
        );
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(v["flows"][0]["direction"], "ingress");
        assert_eq!(v["flows"][0]["packets"], 2);
        assert_eq!(v["flows"][1]["direction"], "egress");
        assert_eq!(v["flows"][1]["packets"], 3);
        assert_eq!(v["flows"][1]["ifname"], "eth1");
        // The direction bit is no address family: the addresses still read as IPv4.
        assert_eq!(v["flows"][1]["src"], "198.18.0.1");
    }

    #[test]
    fn event_counters_come_from_their_stats_entries_by_name() {
        use roce_common::counters::{
            STAT_EVENTS_CE, STAT_EVENTS_DROPPED_RING_FULL, STAT_EVENTS_PSN_GAP,
        };
        let mut raw = vec![0u64; STATS_LEN as usize];
        raw[STAT_EVENTS_CE as usize] = 4;
        raw[STAT_EVENTS_PSN_GAP as usize] = 2;
        raw[STAT_EVENTS_DROPPED_RING_FULL as usize] = 1;
        let doc = Document::build(vec![], &raw, None);
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(
            v["counters"]["events"],
            serde_json::json!({"ce": 4, "cnp": 0, "nak": 0, "rnr_nak": 0, "psn_gap": 2, "rtt_spike": 0})
        );
        assert_eq!(
            v["counters"]["events_dropped"],
            serde_json::json!({"rate_limit": 0, "ring_full": 1})
        );
        assert_eq!(doc.counters.events.total(), 6);
        // A document without them (an older agent) reads as zero.
        let old: Counters = serde_json::from_str(
            r#"{"roce":0,"roce_in_vxlan":0,"vxlan_other":0,"other_udp":0,"other_ip":0,"non_ip":0,"parse_errors":{}}"#,
        )
        .unwrap();
        assert_eq!(old.events, EventCounters::default());
    }

    #[test]
    fn unknown_ifindex_still_names_the_interface() {
        let key = plain_key([1, 2, 3, 4], [5, 6, 7, 8], 1, 99);
        let f = Flow::from_entry(&key, &stats(1), Some(&names));
        assert_eq!(f.ifname.as_deref(), Some("if#99"));
    }

    #[test]
    fn flows_are_sorted_deterministically() {
        let a = plain_key([198, 18, 0, 9], [198, 18, 0, 2], 5, 3);
        let b = plain_key([198, 18, 0, 10], [198, 18, 0, 2], 5, 2);
        let c = plain_key([198, 18, 0, 9], [198, 18, 0, 2], 4, 2);
        let d = plain_key([198, 18, 0, 9], [198, 18, 0, 2], 6, 2);
        let entries = vec![(a, stats(1)), (b, stats(2)), (d, stats(4)), (c, stats(3))];
        let mut rev = entries.clone();
        rev.reverse();
        let x = Document::build(entries, &[], Some(&names));
        let y = Document::build(rev, &[], Some(&names));
        assert_eq!(x, y);
        let order: Vec<_> = x
            .flows
            .iter()
            .map(|f| (f.ifname.clone().unwrap(), f.src.to_string(), f.packets))
            .collect();
        // eth1 (c, then d: same addresses, larger QP; then b: .9 < .10 numerically),
        // then eth2.
        assert_eq!(
            order,
            vec![
                ("eth1".into(), "198.18.0.9".into(), 3),
                ("eth1".into(), "198.18.0.9".into(), 4),
                ("eth1".into(), "198.18.0.10".into(), 2),
                ("eth2".into(), "198.18.0.9".into(), 1),
            ]
        );
    }

    #[test]
    fn empty_entries_are_left_out_but_counted_present() {
        let key = plain_key([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let mut raw = vec![0u64; STATS_LEN as usize];
        raw[STAT_FLOW_CREATED as usize] = 5;
        raw[STAT_FLOW_INSERT_FAILED as usize] = 1;
        raw[(STAT_REASON_BASE + Reason::BadVxlanFlags as u32) as usize] = 7;
        let doc = Document::build(vec![(key, FlowStats::default())], &raw, None);
        assert!(doc.flows.is_empty());
        assert_eq!(doc.counters.flows_created, 5);
        assert_eq!(doc.counters.flows_evicted, 4);
        assert_eq!(doc.counters.flow_insert_failed, 1);
        assert_eq!(doc.counters.parse_errors["bad_vxlan_flags"], 7);
        assert_eq!(doc.counters.parse_errors_total(), 7);
    }

    #[test]
    fn round_trips_and_tolerates_unknown_and_missing_added_fields() {
        let key = plain_key([198, 18, 0, 1], [198, 18, 0, 2], 4660, 2);
        let doc = Document::build(vec![(key, stats(3))], &[1, 2, 3], Some(&names));
        let text = serde_json::to_string(&doc).unwrap();
        let back: Document = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);

        let minimal = r#"{"flows":[{"ifname":null,"direction":null,"family":"ipv4",
            "src":"198.18.0.1","dst":"198.18.0.2","sport":1,"vni":null,"inner_family":null,
            "inner_src":null,"inner_dst":null,"dest_qp":3,"packets":1,"bytes":60,
            "ecn":{"not_ect":1,"ect1":0,"ect0":0,"ce":0},"inner_ecn":null,"cnps":0,"acks":0,
            "naks":0,"rnr_naks":0,"psn_gaps":0,"last_dscp":0,"future_field":true}],
            "counters":{"roce":1,"roce_in_vxlan":0,"vxlan_other":0,"other_udp":0,"other_ip":0,
            "non_ip":0,"parse_errors":{"truncated_bth":0}}}"#;
        let d: Document = serde_json::from_str(minimal).unwrap();
        assert_eq!(d.flows[0].dest_qp, 3);
        assert_eq!(d.counters.flows_created, 0);
    }

    #[test]
    fn the_qp_is_written_in_hex_right_after_the_number_and_read_without_it() {
        let key = plain_key([198, 18, 0, 1], [198, 18, 0, 2], 0x00ab_cdef, 2);
        let doc = Document::build(vec![(key, stats(3))], &[], Some(&names));
        let text = serde_json::to_string(&doc).unwrap();
        assert!(
            text.contains(r#""dest_qp":11259375,"dest_qp_hex":"0xabcdef","packets":3,"#),
            "{text}"
        );
        let back: Document = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);

        // An older agent's flow: no `dest_qp_hex`, nor any other added field.
        let old = r#"{"ifname":"eth1","direction":"ingress","family":"ipv4",
            "src":"198.18.0.1","dst":"198.18.0.2","sport":1,"vni":null,"inner_family":null,
            "inner_src":null,"inner_dst":null,"dest_qp":4660,"packets":1,"bytes":60,
            "ecn":{"not_ect":1,"ect1":0,"ect0":0,"ce":0},"inner_ecn":null,"cnps":0,"acks":0,
            "naks":0,"rnr_naks":0,"psn_gaps":0,"last_dscp":0}"#;
        let f: Flow = serde_json::from_str(old).unwrap();
        assert_eq!(f.dest_qp, 0x1234);
        assert_eq!((f.first_seen_ns, f.last_seen_ns, f.rates), (0, 0, None));
        // Written again, it gains the hex.
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["dest_qp_hex"], "0x1234");
        // `dest_qp` is the number that counts; a flow without it is refused.
        let wrong = old.replace(r#""dest_qp":4660"#, r#""dest_qp":4660,"dest_qp_hex":"0x1""#);
        assert_eq!(
            serde_json::from_str::<Flow>(&wrong).unwrap().dest_qp,
            0x1234
        );
        let none = old.replace(r#""dest_qp":4660,"#, r#""dest_qp_hex":"0x1234","#);
        let err = serde_json::from_str::<Flow>(&none).unwrap_err().to_string();
        assert!(err.contains("dest_qp"), "{err}");
    }

    #[test]
    fn a_flow_inside_another_record_keeps_its_hex_qp() {
        // `analyze --json` flattens the flow into its own record.
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Wrapped {
            #[serde(flatten)]
            flow: Flow,
            extra: u64,
        }
        let key = plain_key([198, 18, 0, 1], [198, 18, 0, 2], 0x1e, 2);
        let w = Wrapped {
            flow: Flow::from_entry(&key, &stats(2), None),
            extra: 7,
        };
        let text = serde_json::to_string(&w).unwrap();
        assert!(
            text.contains(r#""dest_qp":30,"dest_qp_hex":"0x1e","packets":2"#),
            "{text}"
        );
        assert!(
            text.ends_with(
                r#""rates":null,"mirror":null,"owner":null,"rtt":null,"nak_to_resend":null,"recovery":null,"capture_gaps":null,"cnps_wrong_class":0,"cnp_wrong_dscps":[],"ce_to_cnp":null,"cnp_interval":null,"outer_sport":null,"extra":7}"#
            ),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Wrapped>(&text).unwrap(), w);
    }

    #[test]
    fn ce_ratio() {
        let key = plain_key([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        let f = Flow::from_entry(&key, &stats(4), None);
        assert_eq!(f.ce_ratio(), 0.25);
        let f = Flow::from_entry(&key, &FlowStats::default(), None);
        assert_eq!(f.ce_ratio(), 0.0);
    }
}
