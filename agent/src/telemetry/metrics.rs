//! `GET /metrics`: the Prometheus text exposition (format 0.0.4), built at scrape time
//! from what the agent already holds (the latest flow [`Document`], the findings of
//! the last audit) and from what is read for the scrape (RNIC port counters in sysfs,
//! PFC pause counters from ethtool statistics or DCB).
//!
//! Cardinality stays bounded whatever the table holds: flows are summed per interface,
//! direction and encapsulation in one pass; only the K flows with the most problems
//! (`top_flows`, default 10) get series of their own.
//!
//! Encoding: prometheus-client's registry and its `encoding::prometheus_text::encode`
//! (new in 0.26), not its default `encoding::text` (OpenMetrics: `# EOF`, and counter
//! families named without `_total`, which `promtool check metrics` rejects as "no help
//! text"). The 0.0.4 encoder names the family of a counter `x_total`, as its samples,
//! so HELP, TYPE and samples agree; counters are registered without the suffix (the
//! encoder adds it; 0.26 panics in debug builds on a registered `_total`). The families
//! themselves are written by one `Collector` from a snapshot made per scrape, with
//! `ConstCounter`/`ConstGauge` values: no atomics, no label-set hash maps.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::PathBuf;

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use roce_common::counters::STAT_NAMES_OTHER;
use roce_common::parsed::CLASS_NAMES;

use crate::audit::rnic::{self, CounterDir, PortCounter};
use crate::doc::finding::{Finding, Severity};
use crate::doc::{Counters, Direction, Flow};
use crate::telemetry::ethtool::{self, PauseDirection, PfcCounters};
use crate::telemetry::live::{Figures, LiveDocument};

/// The `Content-Type` of `GET /metrics`: the text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The agent's version, as `roce_agent_build_info` shows it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `ifname` of counters the kernel keeps per host, not per interface.
pub const ALL_INTERFACES: &str = "all";

/// Why the exposition could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("encoding the metrics failed")]
    Encode(#[from] std::fmt::Error),
}

/// The sampled-event counters of the document (`counters.events` by kind,
/// `counters.events_dropped` by reason), when it has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub by_kind: BTreeMap<String, u64>,
    pub dropped: BTreeMap<String, u64>,
}

/// The sampled-event counters of `counters` (`counters.events` by kind,
/// `counters.events_dropped` by reason; zero when the agent has events off).
pub fn event_counts(counters: &crate::doc::Counters) -> Option<EventCounts> {
    let owned = |m: BTreeMap<&'static str, u64>| {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<BTreeMap<String, u64>>()
    };
    Some(EventCounts {
        by_kind: owned(counters.events.named()),
        dropped: owned(counters.events_dropped.named()),
    })
}

/// The counters of one RDMA port, as read for a scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RnicPortCounters {
    pub device: String,
    pub port: u32,
    /// The port's first netdev (GID index order); empty on an InfiniBand port.
    pub netdev: String,
    pub counters: Vec<PortCounter>,
}

/// What the host is asked at scrape time.
#[derive(Clone, Debug)]
pub struct HostSources {
    /// The directory that stands for `/sys` (`--sysfs-root`).
    pub sysfs_root: PathBuf,
    /// Interfaces whose PFC counters are read (the RNIC netdevs are added).
    pub interfaces: Vec<String>,
}

/// What [`HostSources::read`] found.
#[derive(Clone, Debug, Default)]
pub struct HostReadings {
    pub rnic: Vec<RnicPortCounters>,
    pub pfc: Vec<PfcCounters>,
}

impl HostSources {
    /// Reads the RNIC port counters and the PFC counters. A source that cannot be read
    /// (no RDMA, no such interface, no DCB) contributes nothing and is logged at debug
    /// level: a scrape never fails for want of hardware.
    pub fn read(&self) -> HostReadings {
        let ports = rnic::read_rnic_ports(&self.sysfs_root).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "RDMA ports not read");
            Vec::new()
        });
        let mut readings = HostReadings::default();
        let mut pfc_interfaces: Vec<&String> = Vec::new();
        for n in self
            .interfaces
            .iter()
            .chain(ports.iter().flat_map(|p| &p.netdevs))
        {
            if !pfc_interfaces.contains(&n) {
                pfc_interfaces.push(n);
            }
        }
        for port in &ports {
            match rnic::read_port_counters(&self.sysfs_root, port) {
                Ok(counters) => readings.rnic.push(RnicPortCounters {
                    device: port.device.clone(),
                    port: port.port,
                    netdev: port.netdevs.first().cloned().unwrap_or_default(),
                    counters,
                }),
                Err(e) => tracing::debug!(error = %e, "RNIC counters not read"),
            }
        }
        let socket = ethtool::EthtoolSocket::open()
            .map_err(|e| tracing::debug!(error = %e, "no ethtool statistics"))
            .ok();
        for ifname in &pfc_interfaces {
            if let Some(pfc) = read_pfc(socket.as_ref(), ifname) {
                readings.pfc.push(pfc);
            }
        }
        readings
    }
}

/// The PFC counters of `ifname`: mlx5's ethtool statistics (frames and durations), else
/// the DCB PFC reply (frames only; veth, vxlan and most virtual devices have neither).
fn read_pfc(socket: Option<&ethtool::EthtoolSocket>, ifname: &str) -> Option<PfcCounters> {
    if let Some(socket) = socket {
        match socket.stats(ifname) {
            Ok(stats) => {
                let pfc = ethtool::pfc_from_stats(ifname, &stats);
                if !pfc.is_empty() {
                    return Some(pfc);
                }
            }
            Err(e) => tracing::debug!(error = %e, "ethtool statistics not read"),
        }
    }
    match crate::audit::dcb::query(ifname) {
        Ok(state) => state.pfc.map(|p| ethtool::pfc_from_dcb(ifname, &p)),
        Err(e) => {
            tracing::debug!(interface = %ifname, error = %e, "no DCB PFC counters");
            None
        }
    }
}

/// Everything one exposition is made of.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub document: &'a LiveDocument,
    pub findings: &'a [Finding],
    /// None: the document has no event counters (no `roce_events_*` series).
    pub events: Option<&'a EventCounts>,
    pub rnic: &'a [RnicPortCounters],
    pub pfc: &'a [PfcCounters],
    /// How many flows get `roce_top_flow_*` series.
    pub top_flows: usize,
}

/// Makes `GET /metrics` for a running agent: the host sources and K.
#[derive(Debug)]
pub struct Exporter {
    /// A reload changes its interfaces ([`Exporter::set_interfaces`]).
    pub host: std::sync::RwLock<HostSources>,
    pub top_flows: usize,
    /// Configuration reloads (SIGHUP) so far.
    pub reloads: Arc<ReloadCounts>,
    /// The EVENTS ring's positions, for `roce_agent_events_ring_*` (None: no reader).
    pub events_ring: Option<Arc<crate::telemetry::ring_progress::RingProgress>>,
}

/// What the reloads of the configuration file did, for `roce_agent_config_*`.
#[derive(Debug)]
pub struct ReloadCounts {
    pub succeeded: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
    /// Whether the last reload succeeded (true before the first).
    pub last_ok: std::sync::atomic::AtomicBool,
}

impl Default for ReloadCounts {
    fn default() -> Self {
        ReloadCounts {
            succeeded: Default::default(),
            failed: Default::default(),
            last_ok: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl ReloadCounts {
    pub fn record(&self, ok: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if ok {
            self.succeeded.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
        self.last_ok.store(ok, Relaxed);
    }

    /// The `roce_agent_config_*` families.
    fn encode(&self) -> Result<String, MetricsError> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut registry = Registry::default();
        registry.register(
            "roce_agent_config_reloads",
            "Configuration reloads (SIGHUP) applied",
            ConstCounter::new(self.succeeded.load(Relaxed)),
        );
        registry.register(
            "roce_agent_config_reload_failures",
            "Configuration reloads refused (the file did not validate or did not apply); the configuration in force stayed",
            ConstCounter::new(self.failed.load(Relaxed)),
        );
        registry.register(
            "roce_agent_config_last_reload_successful",
            "1 when the last reload succeeded (or none was asked for), 0 when it was refused",
            ConstGauge::new(i64::from(self.last_ok.load(Relaxed))),
        );
        exposition(&registry)
    }
}

/// The `roce_agent_events_ring_*` families: the kernel's positions in the EVENTS ring,
/// which continue across agent restarts while the datapath stays pinned.
fn encode_ring(
    progress: crate::telemetry::ring_progress::Progress,
) -> Result<String, MetricsError> {
    let mut registry = Registry::default();
    registry.register(
        "roce_agent_events_ring_written",
        "Sampled-event records the kernel programs wrote into the EVENTS ring since it was created (roce_events_total, as the ring counts them)",
        ConstCounter::new(progress.written),
    );
    registry.register(
        "roce_agent_events_ring_read",
        "Records read out of the EVENTS ring by this agent or an earlier one of the same pinned datapath; what was written while no agent ran is read at the next start",
        ConstCounter::new(progress.read),
    );
    registry.register(
        "roce_agent_events_ring_unread",
        "Records in the EVENTS ring no agent has read yet",
        ConstGauge::new(i64::try_from(progress.unread()).unwrap_or(i64::MAX)),
    );
    exposition(&registry)
}

impl Exporter {
    /// The interfaces whose PFC counters are read from now on (a reload's).
    pub fn set_interfaces(&self, interfaces: Vec<String>) {
        let mut host = self
            .host
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        host.interfaces = interfaces;
    }

    /// The exposition for `document` and `findings`, reading the host's counters now.
    /// Blocking (sysfs, ioctl, netlink): call it off the async workers.
    pub fn render(
        &self,
        document: &LiveDocument,
        findings: &[Finding],
    ) -> Result<String, MetricsError> {
        let host = self
            .host
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .read();
        let events = event_counts(&document.counters);
        let mut text = encode(&Inputs {
            document,
            findings,
            events: events.as_ref(),
            rnic: &host.rnic,
            pfc: &host.pfc,
            top_flows: self.top_flows,
        })?;
        text.push_str(&self.reloads.encode()?);
        if let Some(ring) = &self.events_ring {
            text.push_str(&encode_ring(ring.read())?);
        }
        Ok(text)
    }
}

/// The Prometheus text exposition (format 0.0.4) of `inputs`.
pub fn encode(inputs: &Inputs<'_>) -> Result<String, MetricsError> {
    let mut registry = Registry::default();
    registry.register(
        "roce_agent_build",
        "The roce-agent that serves these metrics (value 1)",
        Info::new(vec![("version", VERSION)]),
    );
    registry.register_collector(Box::new(Snapshot::of(inputs)));
    exposition(&registry)
}

/// The text format 0.0.4 of `registry` (see the module comment).
fn exposition(registry: &Registry) -> Result<String, MetricsError> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------
// The snapshot: families and samples, made once per scrape.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Int(u64),
    Float(f64),
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
struct Family {
    /// Without `_total`: the encoder adds it to counters.
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<(Labels, Value)>,
}

/// The families of one scrape, in the order they are written.
#[derive(Debug, Default)]
struct Snapshot {
    families: Vec<Family>,
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let metric_type = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, metric_type)?;
            for (labels, value) in &family.samples {
                let sample = metric.encode_family(labels)?;
                match (family.kind, *value) {
                    (Kind::Counter, Value::Int(v)) => ConstCounter::new(v).encode(sample)?,
                    (Kind::Counter, Value::Float(v)) => ConstCounter::new(v).encode(sample)?,
                    (Kind::Gauge, Value::Int(v)) => ConstGauge::new(v).encode(sample)?,
                    (Kind::Gauge, Value::Float(v)) => ConstGauge::new(v).encode(sample)?,
                }
            }
        }
        Ok(())
    }
}

impl Snapshot {
    fn family(
        &mut self,
        name: impl Into<String>,
        kind: Kind,
        help: impl Into<String>,
    ) -> &mut Family {
        self.families.push(Family {
            name: name.into(),
            help: help.into(),
            kind,
            samples: Vec::new(),
        });
        let last = self.families.len() - 1;
        &mut self.families[last]
    }

    fn of(inputs: &Inputs<'_>) -> Snapshot {
        let mut s = Snapshot::default();
        let pass = FlowPass::over(inputs.document, inputs.top_flows);
        s.flow_families(&pass);
        // Counters by name from the document's JSON form, so that the names are those
        // of the document (CLASS_NAMES, STAT_NAMES_OTHER) and no list is kept here.
        let counters = serde_json::to_value(&inputs.document.counters).unwrap_or_default();
        s.classifier_families(&inputs.document.counters, &counters);
        s.event_families(inputs.events);
        s.top_flow_families(inputs.document, &pass.top);
        s.finding_family(inputs.findings);
        s.rnic_families(inputs.rnic);
        s.pfc_families(inputs.pfc);
        s
    }
}

// ---------------------------------------------------------------------------------
// Flows: one pass, sums per (interface, direction, encapsulation), and the top K.

/// Sums over the flows of one interface, direction and encapsulation.
#[derive(Debug, Default)]
struct FlowSums<'a> {
    /// The first place in the document of a flow of the group: groups are written in
    /// the order the document meets them.
    first: usize,
    ifname: &'a str,
    direction: &'static str,
    tunnelled: bool,
    flows: u64,
    packets: u64,
    bytes: u64,
    ecn: [u64; 4],
    inner_ecn: [u64; 4],
    cnps: u64,
    acks: u64,
    naks: u64,
    rnr_naks: u64,
    psn_gaps: u64,
}

/// The ECN codepoint labels, in the order `FlowSums::ecn` keeps them.
const CODEPOINTS: [&str; 4] = ["not_ect", "ect0", "ect1", "ce"];

fn ecn_array(e: &crate::doc::Ecn) -> [u64; 4] {
    [e.not_ect, e.ect0, e.ect1, e.ce]
}

fn direction_label(d: Option<Direction>) -> &'static str {
    match d {
        Some(Direction::Ingress) => "ingress",
        Some(Direction::Egress) => "egress",
        None => "",
    }
}

/// What the top-K ranking counts as a flow's problems: CE marks (outer and inner
/// header), CNPs, NAKs, RNR NAKs and PSN gaps.
pub fn problems(f: &Flow) -> u64 {
    problems_of(&Figures::of(f))
}

fn problems_of(f: &Figures<'_>) -> u64 {
    let inner_ce = f.inner_ecn.map_or(0, |e| e.ce);
    [f.ecn.ce, inner_ce, f.cnps, f.naks, f.rnr_naks, f.psn_gaps]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
}

struct FlowPass<'a> {
    sums: Vec<FlowSums<'a>>,
    /// Indexes into the document's flows, most problems first.
    top: Vec<usize>,
}

impl<'a> FlowPass<'a> {
    fn over(document: &'a LiveDocument, k: usize) -> FlowPass<'a> {
        let mut sums: Vec<FlowSums<'a>> = Vec::new();
        let mut last = usize::MAX;
        // Min-heap of the K best (problems, earlier in the document wins a tie).
        let mut heap: BinaryHeap<Reverse<(u64, Reverse<usize>)>> = BinaryHeap::with_capacity(k + 1);
        document.for_each_figures(|i, f| {
            let ifname = f.ifname.unwrap_or("");
            let direction = direction_label(f.direction);
            let tunnelled = f.tunnelled;
            // Few groups (interfaces x directions x encapsulations): the previous
            // flow's is often the right one, else a short search.
            let same = |g: &FlowSums<'_>| {
                g.tunnelled == tunnelled && g.direction == direction && g.ifname == ifname
            };
            let at = if sums.get(last).is_some_and(same) {
                last
            } else if let Some(p) = sums.iter().position(same) {
                p
            } else {
                sums.push(FlowSums {
                    first: i,
                    ifname,
                    direction,
                    tunnelled,
                    ..FlowSums::default()
                });
                sums.len() - 1
            };
            last = at;
            let g = &mut sums[at];
            g.first = g.first.min(i);
            g.flows += 1;
            g.packets = g.packets.wrapping_add(f.packets);
            g.bytes = g.bytes.wrapping_add(f.bytes);
            for (sum, v) in g.ecn.iter_mut().zip(ecn_array(&f.ecn)) {
                *sum = sum.wrapping_add(v);
            }
            if let Some(inner) = &f.inner_ecn {
                for (sum, v) in g.inner_ecn.iter_mut().zip(ecn_array(inner)) {
                    *sum = sum.wrapping_add(v);
                }
            }
            g.cnps = g.cnps.wrapping_add(f.cnps);
            g.acks = g.acks.wrapping_add(f.acks);
            g.naks = g.naks.wrapping_add(f.naks);
            g.rnr_naks = g.rnr_naks.wrapping_add(f.rnr_naks);
            g.psn_gaps = g.psn_gaps.wrapping_add(f.psn_gaps);

            if k == 0 {
                return;
            }
            let score = problems_of(&f);
            if score == 0 {
                return; // a flow without problems is nobody's top flow
            }
            let entry = Reverse((score, Reverse(i)));
            if heap.len() < k {
                heap.push(entry);
            } else if heap.peek().is_some_and(|worst| entry < *worst) {
                heap.pop();
                heap.push(entry);
            }
        });
        // The flows came in memory order: the groups go in the document's.
        sums.sort_by_key(|g| g.first);
        let mut top: Vec<(u64, Reverse<usize>)> = heap.into_iter().map(|Reverse(e)| e).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        FlowPass {
            sums,
            top: top.into_iter().map(|(_, Reverse(i))| i).collect(),
        }
    }
}

/// Sums of the groups that share a key (e.g. both encapsulations of one interface and
/// direction), in first-seen order.
fn merged<'a, K: PartialEq + Clone>(
    sums: &'a [FlowSums<'a>],
    key: impl Fn(&FlowSums<'a>) -> K,
) -> Vec<(K, Vec<&'a FlowSums<'a>>)> {
    let mut out: Vec<(K, Vec<&FlowSums<'a>>)> = Vec::new();
    for g in sums {
        let k = key(g);
        match out.iter_mut().find(|(other, _)| *other == k) {
            Some((_, members)) => members.push(g),
            None => out.push((k, vec![g])),
        }
    }
    out
}

fn total(members: &[&FlowSums<'_>], field: impl Fn(&FlowSums<'_>) -> u64) -> u64 {
    members.iter().fold(0u64, |a, g| a.wrapping_add(field(g)))
}

impl Snapshot {
    fn flow_families(&mut self, pass: &FlowPass<'_>) {
        let if_dir_encap = |g: &FlowSums<'_>| -> Labels {
            vec![
                ("ifname", g.ifname.to_string()),
                ("direction", g.direction.to_string()),
                (
                    "encap",
                    if g.tunnelled { "vxlan" } else { "none" }.to_string(),
                ),
            ]
        };
        let packets = self.family(
            "roce_packets",
            Kind::Counter,
            "RoCE packets counted on flows (encap: vxlan when the RoCE packet travelled in VXLAN).",
        );
        for g in &pass.sums {
            packets
                .samples
                .push((if_dir_encap(g), Value::Int(g.packets)));
        }
        let bytes = self.family(
            "roce_bytes",
            Kind::Counter,
            "Bytes of the RoCE packets counted on flows (frame length from the Ethernet header on, no FCS).",
        );
        for g in &pass.sums {
            bytes.samples.push((if_dir_encap(g), Value::Int(g.bytes)));
        }

        let by_if_dir = merged(&pass.sums, |g| (g.ifname, g.direction));
        let if_dir = |(ifname, direction): (&str, &str)| -> Labels {
            vec![
                ("ifname", ifname.to_string()),
                ("direction", direction.to_string()),
            ]
        };
        let ecn = self.family(
            "roce_ecn_packets",
            Kind::Counter,
            "RoCE packets by ECN codepoint of the outer IP header and, for packets in VXLAN, of the inner one.",
        );
        for (key, members) in &by_if_dir {
            for (c, name) in CODEPOINTS.iter().enumerate() {
                let mut labels = if_dir(*key);
                labels.extend([
                    ("header", "outer".to_string()),
                    ("codepoint", name.to_string()),
                ]);
                ecn.samples
                    .push((labels, Value::Int(total(members, |g| g.ecn[c]))));
            }
            if members.iter().any(|g| g.tunnelled) {
                for (c, name) in CODEPOINTS.iter().enumerate() {
                    let mut labels = if_dir(*key);
                    labels.extend([
                        ("header", "inner".to_string()),
                        ("codepoint", name.to_string()),
                    ]);
                    ecn.samples
                        .push((labels, Value::Int(total(members, |g| g.inner_ecn[c]))));
                }
            }
        }
        type Field = fn(&FlowSums<'_>) -> u64;
        let simple: [(&str, &str, Field); 3] = [
            ("roce_cnp_packets", "CNPs (congestion notification packets) counted on the flows they throttle.", |g| g.cnps),
            ("roce_ack_packets", "RoCE ACKNOWLEDGE packets with an ACK syndrome.", |g| g.acks),
            ("roce_psn_gaps", "RoCE request packets whose PSN was ahead of the one their flow expected (lost packets).", |g| g.psn_gaps),
        ];
        for (name, help, field) in simple {
            let family = self.family(name, Kind::Counter, help);
            for (key, members) in &by_if_dir {
                family
                    .samples
                    .push((if_dir(*key), Value::Int(total(members, field))));
            }
        }
        let naks = self.family(
            "roce_nak_packets",
            Kind::Counter,
            "RoCE ACKNOWLEDGE packets with a NAK syndrome (kind nak) or an RNR NAK syndrome (kind rnr_nak).",
        );
        for (key, members) in &by_if_dir {
            for (kind, field) in [("nak", (|g| g.naks) as Field), ("rnr_nak", |g| g.rnr_naks)] {
                let mut labels = if_dir(*key);
                labels.push(("kind", kind.to_string()));
                naks.samples
                    .push((labels, Value::Int(total(members, field))));
            }
        }
        let flows = self.family(
            "roce_flows",
            Kind::Gauge,
            "Flows (one direction of one queue pair) with at least one packet in the flow table.",
        );
        for (ifname, members) in merged(&pass.sums, |g| g.ifname) {
            flows.samples.push((
                vec![("ifname", ifname.to_string())],
                Value::Int(total(&members, |g| g.flows)),
            ));
        }
    }

    fn classifier_families(&mut self, document: &Counters, counters: &serde_json::Value) {
        let counter = |name: &str| counters.get(name).and_then(serde_json::Value::as_u64);
        let frames = self.family(
            "roce_frames",
            Kind::Counter,
            "Frames the classifier saw, by class. The kernel keeps these per host, not per interface: ifname is \"all\".",
        );
        for class in CLASS_NAMES {
            if let Some(v) = counter(class) {
                frames.samples.push((
                    vec![
                        ("ifname", ALL_INTERFACES.to_string()),
                        ("class", class.to_string()),
                    ],
                    Value::Int(v),
                ));
            }
        }
        let errors = self.family(
            "roce_parse_errors",
            Kind::Counter,
            "Frames that could not be parsed as far as the BTH, by reason (counted and passed, never dropped).",
        );
        for (reason, v) in &document.parse_errors {
            errors
                .samples
                .push((vec![("reason", reason.clone())], Value::Int(*v)));
        }
        // Flow-table pressure: the kernel's counters, and the evictions they imply.
        let pressure = STAT_NAMES_OTHER
            .iter()
            .map(|(_, name)| *name)
            .chain(["flows_evicted"]);
        for name in pressure {
            let help = match name {
                "flows_created" => "Flow entries created in the kernel's flow table.",
                "flow_insert_failed" => "Flow entries that could not be inserted (their packets are counted under their class, on no flow).",
                "flows_evicted" => "Flow entries created that are no longer in the table (evicted, least recently seen first, to make room: the table is small for the flows).",
                _ => "Flow table counter of the kernel.",
            };
            if let Some(v) = counter(name) {
                let family = self.family(format!("roce_{name}"), Kind::Counter, help);
                family.samples.push((Vec::new(), Value::Int(v)));
            }
        }
        let qos = self.family(
            "roce_qos_packets",
            Kind::Counter,
            "What the tc QoS programs did (enforce) or would have done (audit_*), by action. Kept per host, not per interface: ifname is \"all\".",
        );
        for (action, v) in document.qos.named() {
            qos.samples.push((
                vec![
                    ("ifname", ALL_INTERFACES.to_string()),
                    ("action", action.to_string()),
                ],
                Value::Int(v),
            ));
        }
    }

    fn event_families(&mut self, events: Option<&EventCounts>) {
        let Some(events) = events else {
            return;
        };
        let kinds = self.family(
            "roce_events",
            Kind::Counter,
            "Sampled events (GET /events) by kind: ce, cnp, nak, rnr_nak, psn_gap.",
        );
        for (kind, v) in &events.by_kind {
            kinds
                .samples
                .push((vec![("kind", kind.clone())], Value::Int(*v)));
        }
        let dropped = self.family(
            "roce_events_dropped",
            Kind::Counter,
            "Sampled events lost in the kernel, by reason: rate_limit (over the per-CPU rate limit), ring_full (the ring buffer was full). A slow GET /events reader is told what it lost instead.",
        );
        for (reason, v) in &events.dropped {
            dropped
                .samples
                .push((vec![("reason", reason.clone())], Value::Int(*v)));
        }
    }

    fn top_flow_families(&mut self, document: &LiveDocument, top: &[usize]) {
        let labels = |f: &Flow| -> Labels {
            let opt = |a: Option<std::net::IpAddr>| a.map(|a| a.to_string()).unwrap_or_default();
            vec![
                ("ifname", f.ifname.clone().unwrap_or_default()),
                ("direction", direction_label(f.direction).to_string()),
                ("src", f.src.to_string()),
                ("dst", f.dst.to_string()),
                ("vni", f.vni.map(|v| v.to_string()).unwrap_or_default()),
                ("inner_src", opt(f.inner_src)),
                ("inner_dst", opt(f.inner_dst)),
                ("dest_qp", f.dest_qp.to_string()),
            ]
        };
        type Field = fn(&Flow) -> Option<u64>;
        let families: [(&str, &str, Field); 9] = [
            ("roce_top_flow_problems", "Problems of the flows with the most (CE outer and inner + CNPs + NAKs + RNR NAKs + PSN gaps); top_flows of them.", |f| Some(problems(f))),
            ("roce_top_flow_packets", "Packets of a top flow.", |f| Some(f.packets)),
            ("roce_top_flow_bytes", "Bytes of a top flow.", |f| Some(f.bytes)),
            ("roce_top_flow_ce_packets", "Packets of a top flow with CE in the outer IP header.", |f| Some(f.ecn.ce)),
            ("roce_top_flow_inner_ce_packets", "Packets of a top flow in VXLAN with CE in the inner IP header.", |f| f.inner_ecn.map(|e| e.ce)),
            ("roce_top_flow_cnp_packets", "CNPs counted on a top flow.", |f| Some(f.cnps)),
            ("roce_top_flow_nak_packets", "NAKs counted on a top flow.", |f| Some(f.naks)),
            ("roce_top_flow_rnr_nak_packets", "RNR NAKs counted on a top flow.", |f| Some(f.rnr_naks)),
            ("roce_top_flow_psn_gaps", "PSN gaps counted on a top flow.", |f| Some(f.psn_gaps)),
        ];
        let flows: Vec<Flow> = top.iter().filter_map(|&i| document.flow(i)).collect();
        let chosen: Vec<(&Flow, Labels)> = flows.iter().map(|f| (f, labels(f))).collect();
        for (name, help, field) in families {
            let family = self.family(name, Kind::Counter, help);
            for (f, labels) in &chosen {
                if let Some(v) = field(f) {
                    family.samples.push((labels.clone(), Value::Int(v)));
                }
            }
        }
    }

    fn finding_family(&mut self, findings: &[Finding]) {
        let mut counts: BTreeMap<(&str, &str, &'static str), u64> = BTreeMap::new();
        for f in findings {
            let severity = match f.severity {
                Severity::Info => "info",
                Severity::Warning => "warning",
                Severity::Error => "error",
            };
            *counts
                .entry((&f.check, f.interface.as_deref().unwrap_or(""), severity))
                .or_default() += 1;
        }
        let family = self.family(
            "roce_check_findings",
            Kind::Gauge,
            "Findings of the agent's last host audit (GET /findings), by check, interface and severity.",
        );
        for ((check, interface, severity), n) in counts {
            family.samples.push((
                vec![
                    ("check", check.to_string()),
                    ("interface", interface.to_string()),
                    ("severity", severity.to_string()),
                ],
                Value::Int(n),
            ));
        }
    }

    fn rnic_families(&mut self, ports: &[RnicPortCounters]) {
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        for port in ports {
            let mut seen: Vec<String> = Vec::new();
            for c in &port.counters {
                let metric = RnicMetric::of(c);
                let name = format!("roce_rnic_{}", metric.name);
                if seen.contains(&name) {
                    continue; // one name from two files of a port: the first wins
                }
                seen.push(name.clone());
                let family = families.entry(name.clone()).or_insert_with(|| Family {
                    name,
                    help: metric.help,
                    kind: metric.kind,
                    samples: Vec::new(),
                });
                family.samples.push((
                    vec![
                        ("device", port.device.clone()),
                        ("port", port.port.to_string()),
                        ("netdev", port.netdev.clone()),
                    ],
                    metric.value,
                ));
            }
        }
        self.families.extend(families.into_values());
    }

    fn pfc_families(&mut self, interfaces: &[PfcCounters]) {
        let labels = |ifname: &str, d: usize, p: usize| -> Labels {
            let direction = if d == PauseDirection::Rx as usize {
                PauseDirection::Rx
            } else {
                PauseDirection::Tx
            };
            vec![
                ("ifname", ifname.to_string()),
                ("direction", direction.as_str().to_string()),
                ("priority", p.to_string()),
            ]
        };
        let frames = self.family(
            "roce_pfc_pause_frames",
            Kind::Counter,
            "PFC pause frames by priority: rx received from the link partner (it paused this port), tx sent by this port (its receive buffer filled). From ethtool statistics (mlx5) or the DCB PFC state.",
        );
        for pfc in interfaces {
            for (d, per_priority) in pfc.frames.iter().enumerate() {
                for (p, v) in per_priority.iter().enumerate() {
                    if let Some(v) = v {
                        frames
                            .samples
                            .push((labels(&pfc.ifname, d, p), Value::Int(*v)));
                    }
                }
            }
        }
        let duration = self.family(
            "roce_pfc_pause_duration_seconds",
            Kind::Counter,
            "Time spent paused by PFC, by priority and direction (mlx5 ethtool statistics, kept in microseconds).",
        );
        for pfc in interfaces {
            for (d, per_priority) in pfc.duration_us.iter().enumerate() {
                for (p, v) in per_priority.iter().enumerate() {
                    if let Some(us) = v {
                        duration
                            .samples
                            .push((labels(&pfc.ifname, d, p), Value::Float(*us as f64 / 1e6)));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// RNIC counter names: node_exporter's infiniband collector (v1.11) for the files it
// knows, a generic rule for the others.

/// How a counter file's value becomes a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conversion {
    AsIs,
    /// `port_rcv_data` / `port_xmit_data`: 4-byte words -> bytes.
    WordsToBytes,
    /// `lifespan` (ms) -> a gauge in seconds.
    MillisecondsToSeconds,
}

/// (file, dir, metric name without `roce_rnic_` and `_total`, conversion, help).
#[rustfmt::skip]
const RNIC_NAMES: &[(&str, CounterDir, &str, Conversion, &str)] = {
    use Conversion::*;
    use CounterDir::{Hw, Port};
    &[
        ("duplicate_request", Hw, "duplicate_requests_packets", AsIs, "Received packets that repeated a request already executed."),
        ("implied_nak_seq_err", Hw, "implied_nak_seq_errors", AsIs, "ACKs with a PSN beyond the expected one for a READ or atomic response (implied NAK)."),
        ("lifespan", Hw, "lifespan_seconds", MillisecondsToSeconds, "How long the driver keeps hw_counters readings before reading the hardware again."),
        ("local_ack_timeout_err", Hw, "local_ack_timeout_errors", AsIs, "Times a QP's ACK timer expired at the sender (still within the retry limit)."),
        ("np_cnp_sent", Hw, "np_cnp_packets_sent", AsIs, "CNPs sent by the notification point for CE-marked RoCEv2 packets it received."),
        ("np_ecn_marked_roce_packets", Hw, "np_ecn_marked_roce_packets_received", AsIs, "RoCEv2 packets received with CE (ECN 11) in the IP header."),
        ("out_of_buffer", Hw, "out_of_buffer_drops", AsIs, "Packets dropped for lack of a receive WQE on their QP."),
        ("out_of_sequence", Hw, "out_of_sequence_packets_received", AsIs, "Out-of-sequence packets received."),
        ("packet_seq_err", Hw, "packet_sequence_errors", AsIs, "NAK sequence error packets received (still within the retry limit)."),
        ("req_cqe_error", Hw, "req_cqes_errors", AsIs, "Requester CQEs completed with an error."),
        ("req_cqe_flush_error", Hw, "req_cqes_flush_errors", AsIs, "Requester CQEs completed with a flush error."),
        ("req_remote_access_errors", Hw, "req_remote_access_errors", AsIs, "Remote access errors seen by the requester."),
        ("req_remote_invalid_request", Hw, "req_remote_invalid_request_errors", AsIs, "Remote invalid request errors seen by the requester."),
        ("resp_cqe_error", Hw, "resp_cqes_errors", AsIs, "Responder CQEs completed with an error."),
        ("resp_cqe_flush_error", Hw, "resp_cqes_flush_errors", AsIs, "Responder CQEs completed with a flush error."),
        ("resp_local_length_error", Hw, "resp_local_length_errors", AsIs, "Local length errors seen by the responder."),
        ("resp_remote_access_errors", Hw, "resp_remote_access_errors", AsIs, "Remote access errors seen by the responder."),
        ("rnr_nak_retry_err", Hw, "rnr_nak_retry_packets_received", AsIs, "RNR NAKs received (still within the retry limit)."),
        ("roce_adp_retrans", Hw, "roce_adp_retransmits", AsIs, "Adaptive retransmissions of RoCE traffic."),
        ("roce_adp_retrans_to", Hw, "roce_adp_retransmits_timeout", AsIs, "Times RoCE traffic reached a timeout under adaptive retransmission."),
        ("roce_slow_restart", Hw, "roce_slow_restart_used", AsIs, "Times RoCE slow restart was used."),
        ("roce_slow_restart_cnps", Hw, "roce_slow_restart_cnps", AsIs, "CNPs that RoCE slow restart generated."),
        ("roce_slow_restart_trans", Hw, "roce_slow_restart", AsIs, "Times RoCE slow restart changed state to slow restart."),
        ("rp_cnp_handled", Hw, "rp_cnp_packets_handled", AsIs, "CNPs the reaction point handled by slowing down."),
        ("rp_cnp_ignored", Hw, "rp_cnp_ignored_packets_received", AsIs, "CNPs received and ignored by the reaction point (is ECN on for their priority?)."),
        ("rx_atomic_requests", Hw, "rx_atomic_requests", AsIs, "ATOMIC requests received."),
        ("rx_dct_connect", Hw, "rx_dct_connect_requests", AsIs, "DCT connection requests received."),
        ("rx_read_requests", Hw, "rx_read_requests", AsIs, "READ requests received."),
        ("rx_write_requests", Hw, "rx_write_requests", AsIs, "WRITE requests received."),
        ("rx_icrc_encapsulated", Hw, "rx_icrc_encapsulated_errors", AsIs, "RoCE packets received with an ICRC error."),
        ("excessive_buffer_overrun_errors", Port, "excessive_buffer_overrun_errors", AsIs, "Flow control update periods in a row with a buffer overrun."),
        ("link_downed", Port, "link_downed", AsIs, "Times the link failed to recover from an error and went down."),
        ("link_error_recovery", Port, "link_error_recovery", AsIs, "Times the link recovered from an error."),
        ("local_link_integrity_errors", Port, "local_link_integrity_errors", AsIs, "Times local physical errors exceeded their threshold."),
        ("multicast_rcv_packets", Port, "multicast_packets_received", AsIs, "Multicast packets received (errors included)."),
        ("multicast_xmit_packets", Port, "multicast_packets_transmitted", AsIs, "Multicast packets sent (errors included)."),
        ("port_rcv_constraint_errors", Port, "port_constraint_errors_received", AsIs, "Packets received that the port discarded for a constraint."),
        ("port_xmit_constraint_errors", Port, "port_constraint_errors_transmitted", AsIs, "Packets not sent for a constraint."),
        ("port_rcv_data", Port, "port_data_received_bytes", WordsToBytes, "Data bytes received (the port counts 4-byte words)."),
        ("port_xmit_data", Port, "port_data_transmitted_bytes", WordsToBytes, "Data bytes sent (the port counts 4-byte words)."),
        ("port_rcv_discards", Port, "port_discards_received", AsIs, "Packets received and discarded (port down or congested)."),
        ("port_xmit_discards", Port, "port_discards_transmitted", AsIs, "Packets discarded instead of sent (port down or congested)."),
        ("port_rcv_errors", Port, "port_errors_received", AsIs, "Packets received with an error."),
        ("port_rcv_packets", Port, "port_packets_received", AsIs, "Packets received (errors included)."),
        ("port_xmit_packets", Port, "port_packets_transmitted", AsIs, "Packets sent (errors included)."),
        ("port_xmit_wait", Port, "port_transmit_wait", AsIs, "Ticks during which the port had data to send but sent none."),
        ("unicast_rcv_packets", Port, "unicast_packets_received", AsIs, "Unicast packets received (errors included)."),
        ("unicast_xmit_packets", Port, "unicast_packets_transmitted", AsIs, "Unicast packets sent (errors included)."),
        ("port_rcv_remote_physical_errors", Port, "port_receive_remote_physical_errors", AsIs, "Packets received marked with the EBP delimiter."),
        ("port_rcv_switch_relay_errors", Port, "port_receive_switch_relay_errors", AsIs, "Packets a switch could not forward."),
        ("symbol_error", Port, "symbol_error", AsIs, "Minor link errors on one or more physical lanes."),
        ("VL15_dropped", Port, "vl15_dropped", AsIs, "VL15 packets dropped for lack of resources."),
    ]
};

/// One RNIC counter as a sample of its family.
#[derive(Debug)]
struct RnicMetric {
    /// Without `roce_rnic_` and `_total`.
    name: String,
    help: String,
    kind: Kind,
    value: Value,
}

impl RnicMetric {
    fn of(c: &PortCounter) -> RnicMetric {
        let known = RNIC_NAMES
            .iter()
            .find(|(file, dir, ..)| *file == c.name && *dir == c.dir);
        match known {
            Some((_, _, name, conversion, help)) => {
                let (kind, value) = match conversion {
                    Conversion::AsIs => (Kind::Counter, Value::Int(c.value)),
                    Conversion::WordsToBytes => {
                        (Kind::Counter, Value::Int(c.value.wrapping_mul(4)))
                    }
                    Conversion::MillisecondsToSeconds => {
                        (Kind::Gauge, Value::Float(c.value as f64 / 1000.0))
                    }
                };
                RnicMetric {
                    name: name.to_string(),
                    help: help.to_string(),
                    kind,
                    value,
                }
            }
            None => {
                let dir = match c.dir {
                    CounterDir::Hw => "hw_counters",
                    CounterDir::Port => "counters",
                };
                RnicMetric {
                    name: generic_rnic_name(&c.name),
                    help: format!(
                        "The RNIC port counter {dir}/{} as the driver counts it.",
                        c.name
                    ),
                    kind: Kind::Counter,
                    value: Value::Int(c.value),
                }
            }
        }
    }
}

/// A metric name for a counter file nobody named: lower case, anything but
/// `[a-z0-9_]` turned into `_`, without a trailing `_total` (the encoder adds it).
fn generic_rnic_name(file: &str) -> String {
    let mut name: String = file
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    while name.ends_with("_total") {
        name.truncate(name.len() - "_total".len());
    }
    if name.is_empty() {
        name.push_str("unnamed");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Document, Ecn};
    use std::net::IpAddr;

    fn flow(ifname: &str, src: &str, qp: u32, vni: Option<u32>) -> Flow {
        Flow {
            ifname: Some(ifname.to_string()),
            direction: Some(Direction::Ingress),
            family: crate::doc::Family::Ipv4,
            src: src.parse().unwrap(),
            dst: "198.18.0.2".parse().unwrap(),
            sport: 49152,
            vni,
            inner_family: vni.map(|_| crate::doc::Family::Ipv4),
            inner_src: vni.map(|_| "198.19.0.1".parse::<IpAddr>().unwrap()),
            inner_dst: vni.map(|_| "198.19.0.2".parse::<IpAddr>().unwrap()),
            dest_qp: qp,
            packets: 10,
            bytes: 1000,
            ecn: Ecn {
                not_ect: 0,
                ect1: 0,
                ect0: 10,
                ce: 0,
            },
            inner_ecn: vni.map(|_| Ecn {
                ect0: 10,
                ..Ecn::default()
            }),
            cnps: 0,
            acks: 0,
            naks: 0,
            rnr_naks: 0,
            psn_gaps: 0,
            psn_split: false,
            last_dscp: 26,
            first_seen_ns: 0,
            last_seen_ns: 0,
            rates: None,
        }
    }

    fn inputs<'a>(doc: &'a LiveDocument, findings: &'a [Finding], k: usize) -> Inputs<'a> {
        Inputs {
            document: doc,
            findings,
            events: None,
            rnic: &[],
            pfc: &[],
            top_flows: k,
        }
    }

    /// The value of the sample `name{labels}` (labels as they are written).
    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')
                .map(str::to_string)
        })
    }

    #[test]
    fn flows_sum_per_interface_direction_and_encapsulation() {
        let mut a = flow("eth1", "198.18.0.1", 1, None);
        a.ecn.ce = 2;
        a.cnps = 3;
        a.naks = 1;
        a.rnr_naks = 4;
        a.psn_gaps = 5;
        a.acks = 6;
        let b = flow("eth1", "198.18.0.3", 2, None);
        let mut c = flow("eth1", "198.18.0.1", 3, Some(5001));
        c.inner_ecn = Some(Ecn {
            ce: 7,
            ect0: 3,
            ..Ecn::default()
        });
        let d = flow("eth2", "198.18.0.1", 1, None);
        let doc = LiveDocument::from(Document {
            flows: vec![a, b, c, d],
            counters: Counters::default(),
        });
        let text = encode(&inputs(&doc, &[], 10)).unwrap();
        let v = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
        assert_eq!(
            v(r#"roce_packets_total{ifname="eth1",direction="ingress",encap="none"}"#),
            "20"
        );
        assert_eq!(
            v(r#"roce_packets_total{ifname="eth1",direction="ingress",encap="vxlan"}"#),
            "10"
        );
        assert_eq!(
            v(r#"roce_bytes_total{ifname="eth2",direction="ingress",encap="none"}"#),
            "1000"
        );
        assert_eq!(
            v(
                r#"roce_ecn_packets_total{ifname="eth1",direction="ingress",header="outer",codepoint="ce"}"#
            ),
            "2"
        );
        assert_eq!(
            v(
                r#"roce_ecn_packets_total{ifname="eth1",direction="ingress",header="outer",codepoint="ect0"}"#
            ),
            "30"
        );
        assert_eq!(
            v(
                r#"roce_ecn_packets_total{ifname="eth1",direction="ingress",header="inner",codepoint="ce"}"#
            ),
            "7"
        );
        assert!(
            sample(&text, r#"roce_ecn_packets_total{ifname="eth2",direction="ingress",header="inner",codepoint="ce"}"#).is_none(),
            "no inner header without VXLAN flows"
        );
        assert_eq!(
            v(r#"roce_cnp_packets_total{ifname="eth1",direction="ingress"}"#),
            "3"
        );
        assert_eq!(
            v(r#"roce_ack_packets_total{ifname="eth1",direction="ingress"}"#),
            "6"
        );
        assert_eq!(
            v(r#"roce_nak_packets_total{ifname="eth1",direction="ingress",kind="nak"}"#),
            "1"
        );
        assert_eq!(
            v(r#"roce_nak_packets_total{ifname="eth1",direction="ingress",kind="rnr_nak"}"#),
            "4"
        );
        assert_eq!(
            v(r#"roce_psn_gaps_total{ifname="eth1",direction="ingress"}"#),
            "5"
        );
        assert_eq!(
            v(r#"roce_psn_gaps_total{ifname="eth2",direction="ingress"}"#),
            "0"
        );
        assert_eq!(v(r#"roce_flows{ifname="eth1"}"#), "3");
        assert_eq!(v(r#"roce_flows{ifname="eth2"}"#), "1");
        assert!(
            text.contains("# TYPE roce_packets_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE roce_flows gauge\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        let build = format!("roce_agent_build_info{{version=\"{VERSION}\"}} 1\n");
        assert!(text.contains(&build), "{text}");
    }

    #[test]
    fn top_flows_are_the_k_with_most_problems_ties_in_document_order() {
        let mut flows: Vec<Flow> = (0..6)
            .map(|i| flow("eth1", &format!("198.18.0.{}", i + 1), i, None))
            .collect();
        flows[0].cnps = 1; // 1
        flows[1].psn_gaps = 5; // 5
        flows[2].ecn.ce = 2;
        flows[2].naks = 1; // 3
        flows[3].rnr_naks = 3; // 3 (after flows[2] in the document)
                               // flows[4]: none; flows[5]: inner CE
        flows[5].vni = Some(7);
        flows[5].inner_src = Some("10.0.0.1".parse().unwrap());
        flows[5].inner_dst = Some("10.0.0.2".parse().unwrap());
        flows[5].inner_ecn = Some(Ecn {
            ce: 4,
            ..Ecn::default()
        });
        let doc = LiveDocument::from(Document {
            flows,
            counters: Counters::default(),
        });
        let pass = FlowPass::over(&doc, 3);
        assert_eq!(pass.top, [1, 5, 2]);
        assert_eq!(FlowPass::over(&doc, 10).top, [1, 5, 2, 3, 0]);
        assert!(FlowPass::over(&doc, 0).top.is_empty());

        let text = encode(&inputs(&doc, &[], 3)).unwrap();
        let problem_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("roce_top_flow_problems_total{"))
            .collect();
        assert_eq!(problem_lines.len(), 3, "{text}");
        assert_eq!(
            problem_lines[0],
            r#"roce_top_flow_problems_total{ifname="eth1",direction="ingress",src="198.18.0.2",dst="198.18.0.2",vni="",inner_src="",inner_dst="",dest_qp="1"} 5"#
        );
        assert_eq!(
            sample(&text, r#"roce_top_flow_inner_ce_packets_total{ifname="eth1",direction="ingress",src="198.18.0.6",dst="198.18.0.2",vni="7",inner_src="10.0.0.1",inner_dst="10.0.0.2",dest_qp="5"}"#).as_deref(),
            Some("4")
        );
        let inner_ce_lines = text
            .lines()
            .filter(|l| l.starts_with("roce_top_flow_inner_ce_packets_total{"))
            .count();
        assert_eq!(
            inner_ce_lines, 1,
            "only tunnelled flows have an inner header"
        );
    }

    #[test]
    fn findings_are_counted_per_check_interface_and_severity() {
        let f = |check: &str, iface: Option<&str>, severity| {
            crate::audit::finding(check, iface, severity, "x", "y", "z")
        };
        let findings = [
            f("mtu", Some("eth1"), Severity::Error),
            f("ecn_np", Some("eth1"), Severity::Error),
            f("ecn_np", Some("eth1"), Severity::Error),
            f("dcb_unsupported", Some("veth0"), Severity::Info),
            f("audit", None, Severity::Error),
        ];
        let doc = LiveDocument::default();
        let text = encode(&inputs(&doc, &findings, 10)).unwrap();
        let v = |s: &str| sample(&text, s);
        assert_eq!(
            v(r#"roce_check_findings{check="ecn_np",interface="eth1",severity="error"}"#)
                .as_deref(),
            Some("2")
        );
        assert_eq!(
            v(r#"roce_check_findings{check="audit",interface="",severity="error"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            v(r#"roce_check_findings{check="dcb_unsupported",interface="veth0",severity="info"}"#)
                .as_deref(),
            Some("1")
        );
        assert!(text.contains("# TYPE roce_check_findings gauge\n"));
    }

    #[test]
    fn classifier_counters_come_from_the_documents_names() {
        let mut doc = Document {
            counters: Counters::from_stats(&[], 0),
            ..Document::default()
        };
        doc.counters.roce_in_vxlan = 12;
        doc.counters.flows_created = 9;
        doc.counters.flow_insert_failed = 2;
        doc.counters.flows_evicted = 4;
        doc.counters.qos.roce_rewritten = 3;
        let doc = LiveDocument::from(doc);
        let text = encode(&inputs(&doc, &[], 10)).unwrap();
        for class in CLASS_NAMES {
            let series = format!(r#"roce_frames_total{{ifname="all",class="{class}"}}"#);
            assert!(sample(&text, &series).is_some(), "{series}");
        }
        assert_eq!(
            sample(
                &text,
                r#"roce_frames_total{ifname="all",class="roce_in_vxlan"}"#
            )
            .as_deref(),
            Some("12")
        );
        for reason in roce_common::parsed::REASON_NAMES {
            let series = format!(r#"roce_parse_errors_total{{reason="{reason}"}}"#);
            assert_eq!(sample(&text, &series).as_deref(), Some("0"), "{series}");
        }
        assert_eq!(
            sample(&text, "roce_flows_created_total").as_deref(),
            Some("9")
        );
        assert_eq!(
            sample(&text, "roce_flow_insert_failed_total").as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(&text, "roce_flows_evicted_total").as_deref(),
            Some("4")
        );
        assert_eq!(
            sample(
                &text,
                r#"roce_qos_packets_total{ifname="all",action="roce_rewritten"}"#
            )
            .as_deref(),
            Some("3")
        );
        assert!(
            !text.contains("roce_events"),
            "no event counters in this document"
        );
    }

    #[test]
    fn event_counters_are_read_from_the_document() {
        let mut counters = Counters::default();
        counters.events.ce = 4;
        counters.events.cnp = 2;
        counters.events_dropped.rate_limit = 1;
        let events = event_counts(&counters).unwrap();
        assert_eq!(events.by_kind["ce"], 4);
        assert_eq!(events.by_kind["psn_gap"], 0);
        assert_eq!(events.dropped["rate_limit"], 1);
        assert_eq!(events.dropped["ring_full"], 0);
        // Every kind and reason, zero or not: the series exist from the start.
        let zero = event_counts(&Counters::default()).unwrap();
        assert_eq!(zero.by_kind.len(), 5);
        assert_eq!(zero.dropped.len(), 2);
        let doc = LiveDocument::default();
        let text = encode(&Inputs {
            events: Some(&events),
            ..inputs(&doc, &[], 10)
        })
        .unwrap();
        assert_eq!(
            sample(&text, r#"roce_events_total{kind="ce"}"#).as_deref(),
            Some("4")
        );
        assert_eq!(
            sample(&text, r#"roce_events_dropped_total{reason="rate_limit"}"#).as_deref(),
            Some("1")
        );
    }

    #[test]
    fn rnic_counters_are_named_as_node_exporter_names_them() {
        let c = |dir, name: &str, value| PortCounter {
            dir,
            name: name.to_string(),
            value,
        };
        let ports = [RnicPortCounters {
            device: "mlx5_0".to_string(),
            port: 1,
            netdev: "eth1".to_string(),
            counters: vec![
                c(CounterDir::Hw, "np_cnp_sent", 18234),
                c(CounterDir::Hw, "lifespan", 10),
                c(CounterDir::Hw, "vendor-Thing_total", 5),
                c(CounterDir::Port, "port_rcv_data", 100),
                c(CounterDir::Port, "VL15_dropped", 1),
            ],
        }];
        let doc = LiveDocument::default();
        let text = encode(&Inputs {
            rnic: &ports,
            ..inputs(&doc, &[], 10)
        })
        .unwrap();
        let labels = r#"{device="mlx5_0",port="1",netdev="eth1"}"#;
        let v = |name: &str| sample(&text, &format!("{name}{labels}"));
        assert_eq!(
            v("roce_rnic_np_cnp_packets_sent_total").as_deref(),
            Some("18234")
        );
        assert_eq!(
            v("roce_rnic_port_data_received_bytes_total").as_deref(),
            Some("400")
        );
        assert_eq!(v("roce_rnic_lifespan_seconds").as_deref(), Some("0.01"));
        assert_eq!(v("roce_rnic_vendor_thing_total").as_deref(), Some("5"));
        assert_eq!(v("roce_rnic_vl15_dropped_total").as_deref(), Some("1"));
        assert!(text.contains("# TYPE roce_rnic_lifespan_seconds gauge\n"));
        assert!(text.contains("# TYPE roce_rnic_np_cnp_packets_sent_total counter\n"));
    }

    #[test]
    fn generic_rnic_names_are_sanitized() {
        assert_eq!(generic_rnic_name("rx_foo"), "rx_foo");
        assert_eq!(generic_rnic_name("Rx-Foo.bar"), "rx_foo_bar");
        assert_eq!(generic_rnic_name("x_total"), "x");
        assert_eq!(generic_rnic_name("_total"), "unnamed");
    }

    #[test]
    fn pfc_frames_and_durations_in_seconds() {
        let mut pfc = PfcCounters {
            ifname: "eth1".to_string(),
            ..PfcCounters::default()
        };
        pfc.frames[PauseDirection::Rx as usize][3] = Some(7);
        pfc.frames[PauseDirection::Tx as usize][3] = Some(2);
        pfc.duration_us[PauseDirection::Rx as usize][3] = Some(1_500_000);
        let doc = LiveDocument::default();
        let text = encode(&Inputs {
            pfc: std::slice::from_ref(&pfc),
            ..inputs(&doc, &[], 10)
        })
        .unwrap();
        assert_eq!(
            sample(
                &text,
                r#"roce_pfc_pause_frames_total{ifname="eth1",direction="rx",priority="3"}"#
            )
            .as_deref(),
            Some("7")
        );
        assert_eq!(
            sample(
                &text,
                r#"roce_pfc_pause_frames_total{ifname="eth1",direction="tx",priority="3"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(&text, r#"roce_pfc_pause_duration_seconds_total{ifname="eth1",direction="rx",priority="3"}"#).as_deref(),
            Some("1.5")
        );
        assert_eq!(text.matches("roce_pfc_pause_frames_total{").count(), 2);
    }

    /// Not a test of correctness: how long a scrape of a large document takes
    /// (`cargo test -p roce-agent --release --lib scrape_time -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn scrape_time_of_a_large_table() {
        for n in [100_000usize, 1_000_000] {
            let flows: Vec<Flow> = (0..n)
                .map(|i| {
                    let mut f = flow(
                        if i % 2 == 0 { "eth1" } else { "eth2" },
                        &format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
                        i as u32,
                        (i % 3 == 0).then_some(5001),
                    );
                    f.ecn.ce = (i % 7) as u64;
                    f.cnps = (i % 5) as u64;
                    f
                })
                .collect();
            let doc = LiveDocument::from(Document {
                flows,
                counters: Counters::from_stats(&[], 0),
            });
            let mut best = std::time::Duration::MAX;
            let mut len = 0;
            for _ in 0..5 {
                let start = std::time::Instant::now();
                len = encode(&inputs(&doc, &[], 10)).unwrap().len();
                best = best.min(start.elapsed());
            }
            println!("scrape of {n} flows: {best:?} (best of 5), {len} bytes");
        }
    }
}
