//! The exposition itself: which families it has and what fills them (the flows' sums
//! and top K, the classifier's counters, the sampled events, the findings, the RNIC and
//! PFC counters, the agent's own `roce_agent_*` families), and the text they make.
//!
//! Encoding: prometheus-client's registry and its `encoding::prometheus_text::encode`
//! (new in 0.26), not its default `encoding::text` (OpenMetrics: `# EOF`, and counter
//! families named without `_total`, which `promtool check metrics` rejects as "no help
//! text"). The 0.0.4 encoder names the family of a counter `x_total`, as its samples,
//! so HELP, TYPE and samples agree; counters are registered without the suffix (the
//! encoder adds it; 0.26 panics in debug builds on a registered `_total`). The families
//! themselves are written by one `Collector` from a snapshot made per scrape
//! (`snapshot`).

use std::collections::BTreeMap;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use roce_common::counters::STAT_NAMES_OTHER;
use roce_common::parsed::CLASS_NAMES;

use super::flow_pass::{direction_label, merged, problems, total, FlowPass, FlowSums, CODEPOINTS};
use super::rnic_names::RnicMetric;
use super::snapshot::{Family, HistogramFamily, HistogramValue, Kind, Labels, Snapshot, Value};
use super::{EventCounts, Inputs, MetricsError, ReloadCounts, RnicPortCounters, VERSION};
use crate::doc::finding::{Finding, Severity};
use crate::doc::{Counters, Flow};
use crate::telemetry::ethtool::{PauseDirection, PfcCounters, StormLevel};
use crate::telemetry::live::rtt_totals::octave_bound_seconds;
use crate::telemetry::live::LiveDocument;

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

/// The text format 0.0.4 of the families of `snapshot` (those with samples).
pub(super) fn encode_snapshot(snapshot: Snapshot) -> Result<String, MetricsError> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    exposition(&registry)
}

/// The text format 0.0.4 of `registry` (see the module comment).
fn exposition(registry: &Registry) -> Result<String, MetricsError> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

impl ReloadCounts {
    /// The `roce_agent_config_*` families.
    pub(super) fn encode(&self) -> Result<String, MetricsError> {
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
pub(super) fn encode_ring(
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

/// `roce_agent_events_subscribers`: the `GET /events` streams open now.
pub(super) fn encode_subscribers(subscribers: usize) -> Result<String, MetricsError> {
    let mut registry = Registry::default();
    registry.register(
        "roce_agent_events_subscribers",
        "GET /events streams open now (roce-agent events, curl): each receives the events sampled from its subscription on",
        ConstGauge::new(i64::try_from(subscribers).unwrap_or(i64::MAX)),
    );
    exposition(&registry)
}

impl Snapshot {
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
        s.rtt_family(inputs.document);
        s.tunnel_families(&inputs.document.counters);
        s
    }

    /// The VXLAN tunnels' families: per tunnel of the flows (`counters.tunnels`) its
    /// CE marks by header and its PSN gaps, outer and made in this host's VTEP; per
    /// remote VTEP and VNI of a `--vtep` interface (`counters.qos.vteps`, every VXLAN
    /// packet) the CE marks by who made them.
    fn tunnel_families(&mut self, counters: &Counters) {
        let labels = |t: &crate::doc::tunnel::TunnelRecord| -> Labels {
            vec![
                ("ifname", t.ifname.clone().unwrap_or_default()),
                ("direction", direction_label(t.direction).to_string()),
                ("src", t.src.to_string()),
                ("dst", t.dst.to_string()),
                ("vni", t.vni.to_string()),
            ]
        };
        let ce = self.family(
            "roce_tunnel_ce_packets",
            Kind::Counter,
            "RoCE packets in VXLAN with CE, per tunnel (interface, direction, VTEPs src and dst, VNI), by header: outer (the underlay's marks, and the sender's where its VTEP copies an inner CE outwards as RFC 6040 does; Linux encapsulates inner CE as ECT(0)), inner (marked before encapsulation).",
        );
        for t in &counters.tunnels {
            for (header, v) in [("outer", t.ce), ("inner", t.inner_ce)] {
                let mut l = labels(t);
                l.push(("header", header.to_string()));
                ce.samples.push((l, Value::Int(v)));
            }
        }
        let gaps = self.family(
            "roce_tunnel_psn_gaps",
            Kind::Counter,
            "PSN gaps of the RoCE flows in VXLAN, per tunnel: arriving, requests lost before they reached this host (the sender, its VTEP or the underlay); leaving, before they left it.",
        );
        for t in &counters.tunnels {
            gaps.samples.push((labels(t), Value::Int(t.psn_gaps)));
        }
        let vtep = self.family(
            "roce_tunnel_vtep_psn_gaps",
            Kind::Counter,
            "PSN gaps made in this host's VTEP, per tunnel whose inner side the agent sees too (inner_ifname): arriving, inner gaps beyond the outer ones (lost in decapsulation); leaving, outer beyond inner (lost in encapsulation).",
        );
        for t in &counters.tunnels {
            if let Some(v) = t.vtep_psn_gaps {
                let mut l = labels(t);
                l.push(("inner_ifname", t.inner_ifname.clone().unwrap_or_default()));
                vtep.samples.push((l, Value::Int(v)));
            }
        }
        let marked = self.family(
            "roce_vtep_ce_packets",
            Kind::Counter,
            "VXLAN packets arriving on a --vtep interface with CE, per remote VTEP and VNI, by who marked them: underlay (outer CE over an inner header without), overlay (inner CE: marked before encapsulation).",
        );
        for v in &counters.qos.vteps {
            for (by, n) in [
                ("underlay", v.ce_over_ect.saturating_add(v.ce_over_not_ect)),
                ("overlay", v.inner_ce),
            ] {
                marked.samples.push((
                    vec![
                        ("remote", v.remote.clone()),
                        ("vni", v.vni.to_string()),
                        ("marked_by", by.to_string()),
                    ],
                    Value::Int(n),
                ));
            }
        }
    }

    /// `roce_rtt_seconds{ifname}`: the collector's running sums (`live::rtt_totals`).
    fn rtt_family(&mut self, doc: &LiveDocument) {
        let samples = doc
            .rtt
            .iter()
            .map(|(ifname, t)| {
                let buckets = t
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(o, &n)| (octave_bound_seconds(o), n))
                    .collect();
                (
                    vec![("ifname", ifname.clone())],
                    HistogramValue {
                        buckets,
                        count: t.count,
                        sum: t.sum_seconds,
                    },
                )
            })
            .collect();
        self.histograms.push(HistogramFamily {
            name: "roce_rtt_seconds".into(),
            help: "Round trips of RoCE requests to their responses (ACK, READ or atomic response) as the agent saw them leave and arrive, by interface (passive: at most one sample outstanding per request flow; the last finite bucket ends at 2^31 ns).".into(),
            samples,
        });
    }

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
        let simple: [(&str, &str, Field); 6] = [
            ("roce_cnp_packets", "CNPs (congestion notification packets) counted on the flows they throttle.", |g| g.cnps),
            ("roce_ack_packets", "RoCE ACKNOWLEDGE packets with an ACK syndrome.", |g| g.acks),
            ("roce_psn_gaps", "RoCE request packets whose PSN was ahead of the one their flow expected (lost packets).", |g| g.psn_gaps),
            ("roce_retransmitted_packets", "RoCE request packets whose PSN was at or before one their flow had already carried (sent again).", |g| g.retransmitted_packets),
            ("roce_retransmitted_bytes", "Frame bytes of the retransmitted RoCE request packets.", |g| g.retransmitted_bytes),
            ("roce_retransmit_timeouts", "Go-backs of RoCE requesters that followed no NAK or RNR NAK of their PSN: the requester's ACK timeout fired.", |g| g.retransmit_timeouts),
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
            "Frames the classifier saw, by class, on all the agent's interfaces together (the kernel counts them per host, so the family has no ifname).",
        );
        for class in CLASS_NAMES {
            if let Some(v) = counter(class) {
                frames
                    .samples
                    .push((vec![("class", class.to_string())], Value::Int(v)));
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
            "What the tc QoS programs did (enforce) or would have done (audit_*), by action, on all the agent's interfaces together (the kernel counts them per host, so the family has no ifname).",
        );
        for (action, v) in document.qos.named() {
            qos.samples
                .push((vec![("action", action.to_string())], Value::Int(v)));
        }
        let unpaired = self.family(
            "roce_rtt_unpaired",
            Kind::Counter,
            "Round-trip samples not taken because the wire did not tie a response to its request flow, by reason: shared_psn (two queue pairs between the same hosts sampled one PSN at once), other_qp (a response to another QP named a waiting sample's hosts and PSN).",
        );
        for (reason, v) in document.rtt_unpaired.named() {
            unpaired
                .samples
                .push((vec![("reason", reason.to_string())], Value::Int(v)));
        }
        let undecided = self.family(
            "roce_capture_gaps_undecided",
            Kind::Counter,
            "PSN gaps of mirrored flows left without a verdict (lost by the fabric or by the capture) because a newer gap between the same hosts, in the same session, took their place in the watch.",
        );
        undecided
            .samples
            .push((Vec::new(), Value::Int(document.capture_gaps_undecided)));
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
                ("dest_qp_hex", format!("{:#x}", f.dest_qp)),
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
            "Findings of the agent's last host audit (GET /findings), by check, interface (ifname; empty for a finding about no interface) and severity.",
        );
        for ((check, ifname, severity), n) in counts {
            family.samples.push((
                vec![
                    ("check", check.to_string()),
                    ("ifname", ifname.to_string()),
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
        let storms = self.family(
            "roce_pfc_pause_storm_events",
            Kind::Counter,
            "Times the port kept sending PFC pauses past its storm watchdog's warning threshold (level=warning), and past its timeout, after which it stopped pausing (level=error): mlx5's tx_pause_storm_*_events.",
        );
        for pfc in interfaces {
            for level in [StormLevel::Warning, StormLevel::Error] {
                if let Some(v) = pfc.storm_events[level as usize] {
                    storms.samples.push((
                        vec![
                            ("ifname", pfc.ifname.clone()),
                            ("level", level.as_str().to_string()),
                        ],
                        Value::Int(v),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Document, Ecn};
    use crate::telemetry::metrics::tests::{flow, inputs, sample};

    #[test]
    fn tunnels_show_their_marks_by_header_and_their_gaps_by_where_they_were_made() {
        let mut tunnelled = flow("eth1", "198.18.0.1", 3, Some(5001));
        tunnelled.ecn.ce = 2;
        tunnelled.inner_ecn = Some(Ecn {
            ce: 7,
            ..Ecn::default()
        });
        tunnelled.psn_gaps = 1;
        // The same queue pair after decapsulation, on the VXLAN device.
        let mut inner = flow("vx0", "198.19.0.1", 3, None);
        inner.dst = "198.19.0.2".parse().unwrap();
        inner.psn_gaps = 4;
        let mut doc = LiveDocument::from(Document {
            flows: vec![tunnelled, inner],
            counters: Counters::default(),
        });
        doc.counters.tunnels = doc.tunnels();
        doc.counters.qos.vteps = vec![crate::doc::VtepRecord {
            remote: "198.18.0.1".into(),
            vni: 5001,
            packets: 50,
            ce_over_ect: 3,
            ce_over_not_ect: 1,
            inner_ce: 7,
            ..Default::default()
        }];
        let text = encode(&inputs(&doc, &[], 10)).unwrap();
        let v = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
        let tunnel =
            r#"ifname="eth1",direction="ingress",src="198.18.0.1",dst="198.18.0.2",vni="5001""#;
        assert_eq!(
            v(&format!(
                r#"roce_tunnel_ce_packets_total{{{tunnel},header="outer"}}"#
            )),
            "2"
        );
        assert_eq!(
            v(&format!(
                r#"roce_tunnel_ce_packets_total{{{tunnel},header="inner"}}"#
            )),
            "7"
        );
        assert_eq!(v(&format!("roce_tunnel_psn_gaps_total{{{tunnel}}}")), "1");
        assert_eq!(
            v(&format!(
                r#"roce_tunnel_vtep_psn_gaps_total{{{tunnel},inner_ifname="vx0"}}"#
            )),
            "3"
        );
        let vtep = r#"remote="198.18.0.1",vni="5001""#;
        assert_eq!(
            v(&format!(
                r#"roce_vtep_ce_packets_total{{{vtep},marked_by="underlay"}}"#
            )),
            "4"
        );
        assert_eq!(
            v(&format!(
                r#"roce_vtep_ce_packets_total{{{vtep},marked_by="overlay"}}"#
            )),
            "7"
        );
        // Without an inner side, no VTEP gaps are claimed.
        let mut alone = LiveDocument::from(Document {
            flows: vec![flow("eth1", "198.18.0.1", 3, Some(5001))],
            counters: Counters::default(),
        });
        alone.counters.tunnels = alone.tunnels();
        let text = encode(&inputs(&alone, &[], 10)).unwrap();
        assert!(sample(&text, &format!("roce_tunnel_psn_gaps_total{{{tunnel}}}")).is_some());
        assert!(!text.contains("roce_tunnel_vtep_psn_gaps_total"), "{text}");
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
        a.retransmitted_packets = 8;
        a.retransmitted_bytes = 8000;
        a.retransmit_timeouts = 2;
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
        for (name, want) in [
            ("roce_retransmitted_packets_total", "8"),
            ("roce_retransmitted_bytes_total", "8000"),
            ("roce_retransmit_timeouts_total", "2"),
        ] {
            assert_eq!(
                v(&format!(r#"{name}{{ifname="eth1",direction="ingress"}}"#)),
                want
            );
            assert_eq!(
                v(&format!(r#"{name}{{ifname="eth2",direction="ingress"}}"#)),
                "0"
            );
        }
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
    fn findings_are_counted_per_check_ifname_and_severity() {
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
            v(r#"roce_check_findings{check="ecn_np",ifname="eth1",severity="error"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            v(r#"roce_check_findings{check="audit",ifname="",severity="error"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            v(r#"roce_check_findings{check="dcb_unsupported",ifname="veth0",severity="info"}"#)
                .as_deref(),
            Some("1")
        );
        assert!(text.contains("# TYPE roce_check_findings gauge\n"));
        assert!(!text.contains("interface="), "the label is ifname:\n{text}");
    }

    #[test]
    fn top_flows_name_their_qp_in_decimal_and_in_hex() {
        let mut flows: Vec<Flow> = [0x1234u32, 0xFF_FFFF, 0, 17]
            .iter()
            .enumerate()
            .map(|(i, &qp)| flow("eth1", &format!("198.18.0.{}", i + 1), qp, None))
            .collect();
        for f in &mut flows {
            f.cnps = 1;
        }
        let doc = LiveDocument::from(Document {
            flows,
            counters: Counters::default(),
        });
        let text = encode(&inputs(&doc, &[], 10)).unwrap();
        let top: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("roce_top_flow_"))
            .collect();
        assert_eq!(top.len(), 4 * 8, "{text}"); // no inner CE family without VXLAN
        let label = |line: &str, name: &str| -> String {
            let at = line.find(&format!(",{name}=\"")).unwrap() + name.len() + 3;
            line[at..].split('"').next().unwrap().to_string()
        };
        for line in &top {
            let qp: u32 = label(line, "dest_qp").parse().unwrap();
            assert_eq!(label(line, "dest_qp_hex"), format!("{qp:#x}"), "{line}");
        }
        assert!(
            text.contains(r#"dest_qp="4660",dest_qp_hex="0x1234"}"#),
            "{text}"
        );
        assert!(text.contains(r#"dest_qp="16777215",dest_qp_hex="0xffffff"}"#));
        assert!(text.contains(r#"dest_qp="0",dest_qp_hex="0x0"}"#));
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
            let series = format!(r#"roce_frames_total{{class="{class}"}}"#);
            assert!(sample(&text, &series).is_some(), "{series}");
        }
        assert_eq!(
            sample(&text, r#"roce_frames_total{class="roce_in_vxlan"}"#).as_deref(),
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
            sample(&text, r#"roce_qos_packets_total{action="roce_rewritten"}"#).as_deref(),
            Some("3")
        );
        // Per-host counters carry no ifname: no placeholder interface anywhere.
        assert!(!text.contains(r#"ifname="all""#), "{text}");
        assert!(
            !text.contains("roce_events"),
            "no event counters in this document"
        );
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
        pfc.storm_events[StormLevel::Error as usize] = Some(2);
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
        assert_eq!(
            sample(
                &text,
                r#"roce_pfc_pause_storm_events_total{ifname="eth1",level="error"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert!(
            !text.contains(r#"level="warning""#),
            "not counted, not shown"
        );
    }

    #[test]
    fn round_trips_are_a_histogram_per_interface_in_seconds() {
        use crate::telemetry::live::rtt_totals::IfaceRtt;
        let mut t = IfaceRtt {
            count: 3,
            sum_seconds: 0.0021,
            ..IfaceRtt::default()
        };
        // Octave 9: up to 2^20 ns (1.048576 ms); octave 10: up to 2.097152 ms.
        t.buckets[9] = 2;
        t.buckets[10] = 1;
        let mut doc = LiveDocument::default();
        doc.rtt = vec![("eth1".to_string(), t)];
        let text = encode(&inputs(&doc, &[], 10)).unwrap();
        assert!(text.contains("# TYPE roce_rtt_seconds histogram"), "{text}");
        let bucket = |le: &str| {
            sample(
                &text,
                &format!(r#"roce_rtt_seconds_bucket{{ifname="eth1",le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.000524288").as_deref(), Some("0"));
        assert_eq!(bucket("0.001048576").as_deref(), Some("2"));
        assert_eq!(bucket("0.002097152").as_deref(), Some("3"));
        assert_eq!(bucket("+Inf").as_deref(), Some("3"));
        assert_eq!(
            sample(&text, r#"roce_rtt_seconds_count{ifname="eth1"}"#).as_deref(),
            Some("3")
        );
        assert_eq!(
            sample(&text, r#"roce_rtt_seconds_sum{ifname="eth1"}"#).as_deref(),
            Some("0.0021")
        );
        assert_eq!(text.matches("roce_rtt_seconds_bucket{").count(), 22);
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
