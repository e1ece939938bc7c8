//! The families of the QP table and of the interfaces' visibility (`QpView`): how
//! many QPs by device, port, type, state and owner (`roce_qp_info`), the per-QP
//! hardware counters summed per owner (`roce_qp_<counter>_total`), the flows the join
//! could not give one QP (`roce_qp_unjoined_flows`), and `roce_visibility`, a state
//! set. Labels stay bounded: the owner is its command and its pod UID, never the PID.

use std::collections::{BTreeMap, HashSet};

use super::encode::encode_snapshot;
use super::snapshot::{HistogramFamily, HistogramValue, Kind, Snapshot, Value};
use super::MetricsError;
use crate::telemetry::live::rtt_totals::octave_bound_seconds;
use crate::telemetry::live::LiveDocument;
use crate::telemetry::qps::{Mode, QpView};
use roce_common::rtt::RTT_OCTAVES;

impl Snapshot {
    /// The QP and visibility families of `view`.
    pub(super) fn qp_families(&mut self, view: &QpView) {
        self.qp_info_family(view);
        self.qp_counter_families(view);
        let unjoined = self.family(
            "roce_qp_unjoined_flows",
            Kind::Gauge,
            "Flows of the last poll that the QP join could not give one local QP, by reason: tie (an ingress flow whose QPN several local QPs have on its interface), ambiguous (an egress flow whose remote QPN several local QPs have on its interface, no remote address telling them apart).",
        );
        for (reason, n) in [
            ("tie", view.counts.ties),
            ("ambiguous", view.counts.ambiguous),
        ] {
            unjoined
                .samples
                .push((vec![("reason", reason.to_string())], Value::Int(n)));
        }
        let visibility = self.family(
            "roce_visibility",
            Kind::Gauge,
            "What the agent sees of RoCE on each of its interfaces, one sample per mode, 1 for the current one: kernel_path (RoCE packets counted by XDP or tc since the start), offloaded (an RDMA port on this netdev moved traffic, no RoCE packet reached XDP or tc), mirror (a mirror collector interface), none (no RoCE seen yet).",
        );
        for (ifname, current) in &view.visibility {
            for mode in Mode::ALL {
                visibility.samples.push((
                    vec![
                        ("ifname", ifname.clone()),
                        ("mode", mode.as_str().to_string()),
                    ],
                    Value::Int(u64::from(mode == *current)),
                ));
            }
        }
    }

    fn qp_info_family(&mut self, view: &QpView) {
        type Key<'a> = (&'a str, Option<u32>, &'a str, &'a str, &'a str, &'a str);
        let mut counts: BTreeMap<Key<'_>, u64> = BTreeMap::new();
        for qp in view.document.qps.iter().filter(|q| !q.gone) {
            let key = (
                qp.device.as_str(),
                qp.port,
                qp.qp_type.as_str(),
                qp.state.as_str(),
                qp.comm.as_deref().unwrap_or(""),
                qp.pod_uid.as_deref().unwrap_or(""),
            );
            *counts.entry(key).or_default() += 1;
        }
        let info = self.family(
            "roce_qp_info",
            Kind::Gauge,
            "Queue pairs of the host's RDMA devices (RDMA netlink, as `rdma resource show qp` lists them) by device, port (empty before the QP has one), type, state, the owner's command (comm) and its pod UID (empty outside a pod): the value is how many. QP counts by device, type or state are sums of it, e.g. sum by (device, state) (roce_qp_info).",
        );
        for ((device, port, qp_type, state, comm, pod), n) in counts {
            info.samples.push((
                vec![
                    ("device", device.to_string()),
                    ("port", port.map(|p| p.to_string()).unwrap_or_default()),
                    ("type", qp_type.to_string()),
                    ("state", state.to_string()),
                    ("comm", comm.to_string()),
                    ("pod", pod.to_string()),
                ],
                Value::Int(n),
            ));
        }
    }

    fn qp_counter_families(&mut self, view: &QpView) {
        // name -> (pod, comm, device) -> sum. QPs bound to one counter share its
        // figures: each owner counts each of its counters once.
        let mut sums: BTreeMap<String, BTreeMap<(&str, &str, &str), u64>> = BTreeMap::new();
        let mut counted: HashSet<(&str, &str, &str, u32)> = HashSet::new();
        for qp in &view.document.qps {
            let owner = (
                qp.pod_uid.as_deref().unwrap_or(""),
                qp.comm.as_deref().unwrap_or(""),
                qp.device.as_str(),
            );
            if let Some(id) = qp.counter_id {
                if !counted.insert((owner.0, owner.1, owner.2, id)) {
                    continue;
                }
            }
            for (counter, v) in &qp.counters {
                let Some(name) = metric_name(counter) else {
                    continue;
                };
                let sum = sums.entry(name).or_default().entry(owner).or_default();
                *sum = sum.saturating_add(*v);
            }
        }
        for (name, by_owner) in sums {
            let help = format!(
                "Per-QP hardware counter {name} of the driver (RDMA netlink, `rdma statistic qp`), summed over the QPs of each owner (pod UID, empty outside a pod; command) on each device, each bound counter once (QPs bound to one counter share it). A QP that goes leaves the sum: read it with rate() or increase()."
            );
            let family = self.family(format!("roce_qp_{name}"), Kind::Counter, help);
            for ((pod, comm, device), v) in by_owner {
                family.samples.push((
                    vec![
                        ("pod", pod.to_string()),
                        ("comm", comm.to_string()),
                        ("device", device.to_string()),
                    ],
                    Value::Int(v),
                ));
            }
        }
    }
}

/// A driver's counter name as a metric name's part: lower case, `[a-z0-9_]`, without
/// a `_total` of its own (the encoder adds it); None when nothing is left.
fn metric_name(counter: &str) -> Option<String> {
    let mut name: String = counter
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    while let Some(stripped) = name.strip_suffix("_total") {
        name.truncate(stripped.len());
    }
    let name = name.trim_matches('_').to_string();
    (!name.is_empty()).then_some(name)
}

/// The text format 0.0.4 of the QP and visibility families of `view`, and the round
/// trips of `document`'s flows by owner.
pub fn encode_qps(view: &QpView, document: &LiveDocument) -> Result<String, MetricsError> {
    let mut snapshot = Snapshot::default();
    snapshot.qp_families(view);
    snapshot.owner_rtt_family(view, document);
    encode_snapshot(snapshot)
}

impl Snapshot {
    /// `roce_qp_rtt_seconds{comm,pod}`: the round trips of the flows the QP table gives
    /// an owner (the responses to its QPs' requests), summed over the flows in the
    /// table now: unlike `roce_rtt_seconds`, a flow's part leaves with it.
    fn owner_rtt_family(&mut self, view: &QpView, document: &LiveDocument) {
        type Owner = (String, String);
        let mut sums: BTreeMap<Owner, ([u64; RTT_OCTAVES], u64, u64)> = BTreeMap::new();
        for (flow, octaves, sum_ns) in document.round_trips() {
            let Some(o) = view.owners.owner_of(&flow) else {
                continue;
            };
            let key = (
                o.comm.clone().unwrap_or_default(),
                o.pod_uid.clone().unwrap_or_default(),
            );
            let s = sums.entry(key).or_insert(([0; RTT_OCTAVES], 0, 0));
            for (a, n) in s.0.iter_mut().zip(octaves) {
                *a += u64::from(n);
            }
            s.1 += octaves.iter().map(|&n| u64::from(n)).sum::<u64>();
            s.2 = s.2.saturating_add(sum_ns);
        }
        let samples = sums
            .into_iter()
            .map(|((comm, pod), (octaves, count, sum_ns))| {
                let buckets = octaves
                    .iter()
                    .enumerate()
                    .map(|(o, &n)| (octave_bound_seconds(o), n))
                    .collect();
                (
                    vec![("comm", comm), ("pod", pod)],
                    HistogramValue {
                        buckets,
                        count,
                        sum: sum_ns as f64 / 1e9,
                    },
                )
            })
            .collect();
        self.histograms.push(HistogramFamily {
            name: "roce_qp_rtt_seconds".into(),
            help: "Round trips of the requests of each owner's QPs (the QP table's command and pod UID), from the flows in the table now: a flow's part leaves with it.".into(),
            samples,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::qp::{Qp, QpDocument};
    use crate::telemetry::qps::join::tests::qp;
    use crate::telemetry::qps::JoinCounts;

    #[test]
    fn round_trips_by_owner_from_the_flows_the_qp_table_gives_one() {
        use crate::telemetry::live::{Beside, Builder};
        use roce_common::flow::FlowStats;
        use roce_common::key::{addr_v4_mapped, FlowKey};
        use roce_common::rtt::RttHist;
        // Two ingress flows (ACKs) on eth1 to local QPs 10 and 11 of one owner, one to
        // QP 99 that no QP of the table has.
        let key = |qp: u32| FlowKey {
            src: addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 2])),
            dst: addr_v4_mapped(u32::from_ne_bytes([198, 18, 0, 1])),
            dest_qp: qp,
            ifindex: 7,
            ..FlowKey::default()
        };
        let stats = FlowStats {
            packets: 10,
            bytes: 600,
            ..FlowStats::default()
        };
        let hist = |samples: &[u64]| {
            let mut h = RttHist::default();
            for &s in samples {
                h.add(s);
            }
            h
        };
        let mut b = Builder::new(4, |_| Some("eth1".to_string()));
        b.add_flow(
            &key(10),
            &stats,
            None,
            Beside {
                rtt: Some(&hist(&[3_000, 600_000])),
                ..Beside::default()
            },
        );
        b.add_flow(
            &key(11),
            &stats,
            None,
            Beside {
                rtt: Some(&hist(&[700_000])),
                ..Beside::default()
            },
        );
        b.add_flow(
            &key(99),
            &stats,
            None,
            Beside {
                rtt: Some(&hist(&[5_000])),
                ..Beside::default()
            },
        );
        let doc = b.finish(&[], None);
        let pod = "0f3c2a7e-1111-2222-3333-444455556666";
        let joined = crate::telemetry::qps::join::join(
            vec![
                owned(qp("rxe0", "eth1", 10, Some(20)), "nccl", Some(pod)),
                owned(qp("rxe0", "eth1", 11, Some(21)), "nccl", Some(pod)),
            ],
            doc.flows(),
        );
        let view = QpView {
            document: QpDocument::default(),
            owners: joined.owners,
            counts: joined.counts,
            visibility: Vec::new(),
        };
        let text = encode_qps(&view, &doc).unwrap();
        let labels = format!(r#"comm="nccl",pod="{pod}""#);
        let line = |s: &str| {
            text.lines()
                .find(|l| l.starts_with(s))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
        };
        assert!(
            text.contains("# TYPE roce_qp_rtt_seconds histogram"),
            "{text}"
        );
        assert_eq!(
            line(&format!("roce_qp_rtt_seconds_count{{{labels}}}")).as_deref(),
            Some("3"),
            "{text}"
        );
        // 3 µs in the 4.096 µs bucket; 600 and 700 µs under 1.048576 ms.
        assert_eq!(
            line(&format!(
                r#"roce_qp_rtt_seconds_bucket{{{labels},le="4.096e-06"}}"#
            ))
            .as_deref(),
            Some("1"),
            "{text}"
        );
        assert_eq!(
            line(&format!(
                r#"roce_qp_rtt_seconds_bucket{{{labels},le="0.001048576"}}"#
            ))
            .as_deref(),
            Some("3"),
            "{text}"
        );
        assert_eq!(
            text.matches("roce_qp_rtt_seconds_count{").count(),
            1,
            "QP 99 has no owner: {text}"
        );
    }

    fn owned(mut q: Qp, comm: &str, pod: Option<&str>) -> Qp {
        q.comm = Some(comm.to_string());
        q.pod_uid = pod.map(String::from);
        q
    }

    fn view() -> QpView {
        let pod = "0f3c2a7e-1111-2222-3333-444455556666";
        let mut a = owned(qp("mlx5_0", "eth1", 10, Some(20)), "nccl", Some(pod));
        a.counters.insert("rx_write_requests".into(), 5);
        a.counters.insert("np_cnp_sent".into(), 2);
        let mut b = owned(qp("mlx5_0", "eth1", 11, Some(21)), "nccl", Some(pod));
        b.counters.insert("rx_write_requests".into(), 7);
        // A counter name a driver could write that is no metric name as it is.
        b.counters.insert("Out-Of-Sequence.total".into(), 1);
        let mut c = owned(qp("mlx5_0", "eth1", 12, None), "ib_write_bw", None);
        c.state = "INIT".into();
        c.counters.insert("rx_write_requests".into(), 1);
        // Gone: no longer counted as a QP, its counters still in the sums.
        let mut d = owned(qp("mlx5_0", "eth1", 13, Some(23)), "nccl", Some(pod));
        d.gone = true;
        d.counters.insert("rx_write_requests".into(), 100);
        let mut e = owned(qp("rxe0", "eth2", 1, None), "ib_core", None);
        e.qp_type = "GSI".into();
        e.pid = None;
        let mut f = owned(qp("rxe0", "eth2", 14, None), "app", None);
        f.port = None;
        f.state = "RESET".into();
        QpView {
            document: QpDocument {
                qps: vec![a, b, c, d, e, f],
                ports: Vec::new(),
                error: None,
            },
            counts: JoinCounts {
                joined: 4,
                ties: 1,
                ambiguous: 2,
            },
            visibility: vec![
                ("eth1".to_string(), Mode::Offloaded),
                ("eth2".to_string(), Mode::KernelPath),
            ],
            ..QpView::default()
        }
    }

    #[test]
    fn qp_families_as_written() {
        let text = encode_qps(&view(), &LiveDocument::default()).unwrap();
        let pod = "0f3c2a7e-1111-2222-3333-444455556666";
        let want = format!(
            r#"# HELP roce_qp_info Queue pairs of the host's RDMA devices (RDMA netlink, as `rdma resource show qp` lists them) by device, port (empty before the QP has one), type, state, the owner's command (comm) and its pod UID (empty outside a pod): the value is how many. QP counts by device, type or state are sums of it, e.g. sum by (device, state) (roce_qp_info).
# TYPE roce_qp_info gauge
roce_qp_info{{device="mlx5_0",port="1",type="RC",state="INIT",comm="ib_write_bw",pod=""}} 1
roce_qp_info{{device="mlx5_0",port="1",type="RC",state="RTS",comm="nccl",pod="{pod}"}} 2
roce_qp_info{{device="rxe0",port="",type="RC",state="RESET",comm="app",pod=""}} 1
roce_qp_info{{device="rxe0",port="1",type="GSI",state="RTS",comm="ib_core",pod=""}} 1
# HELP roce_qp_np_cnp_sent_total Per-QP hardware counter np_cnp_sent of the driver (RDMA netlink, `rdma statistic qp`), summed over the QPs of each owner (pod UID, empty outside a pod; command) on each device, each bound counter once (QPs bound to one counter share it). A QP that goes leaves the sum: read it with rate() or increase().
# TYPE roce_qp_np_cnp_sent_total counter
roce_qp_np_cnp_sent_total{{pod="{pod}",comm="nccl",device="mlx5_0"}} 2
# HELP roce_qp_out_of_sequence_total Per-QP hardware counter out_of_sequence of the driver (RDMA netlink, `rdma statistic qp`), summed over the QPs of each owner (pod UID, empty outside a pod; command) on each device, each bound counter once (QPs bound to one counter share it). A QP that goes leaves the sum: read it with rate() or increase().
# TYPE roce_qp_out_of_sequence_total counter
roce_qp_out_of_sequence_total{{pod="{pod}",comm="nccl",device="mlx5_0"}} 1
# HELP roce_qp_rx_write_requests_total Per-QP hardware counter rx_write_requests of the driver (RDMA netlink, `rdma statistic qp`), summed over the QPs of each owner (pod UID, empty outside a pod; command) on each device, each bound counter once (QPs bound to one counter share it). A QP that goes leaves the sum: read it with rate() or increase().
# TYPE roce_qp_rx_write_requests_total counter
roce_qp_rx_write_requests_total{{pod="",comm="ib_write_bw",device="mlx5_0"}} 1
roce_qp_rx_write_requests_total{{pod="{pod}",comm="nccl",device="mlx5_0"}} 112
# HELP roce_qp_unjoined_flows Flows of the last poll that the QP join could not give one local QP, by reason: tie (an ingress flow whose QPN several local QPs have on its interface), ambiguous (an egress flow whose remote QPN several local QPs have on its interface, no remote address telling them apart).
# TYPE roce_qp_unjoined_flows gauge
roce_qp_unjoined_flows{{reason="tie"}} 1
roce_qp_unjoined_flows{{reason="ambiguous"}} 2
# HELP roce_visibility What the agent sees of RoCE on each of its interfaces, one sample per mode, 1 for the current one: kernel_path (RoCE packets counted by XDP or tc since the start), offloaded (an RDMA port on this netdev moved traffic, no RoCE packet reached XDP or tc), mirror (a mirror collector interface), none (no RoCE seen yet).
# TYPE roce_visibility gauge
roce_visibility{{ifname="eth1",mode="kernel_path"}} 0
roce_visibility{{ifname="eth1",mode="offloaded"}} 1
roce_visibility{{ifname="eth1",mode="mirror"}} 0
roce_visibility{{ifname="eth1",mode="none"}} 0
roce_visibility{{ifname="eth2",mode="kernel_path"}} 1
roce_visibility{{ifname="eth2",mode="offloaded"}} 0
roce_visibility{{ifname="eth2",mode="mirror"}} 0
roce_visibility{{ifname="eth2",mode="none"}} 0
"#
        );
        assert_eq!(text, want);
        // The PID is never a label.
        assert!(!text.contains("pid"), "{text}");
    }

    #[test]
    fn qps_bound_to_one_counter_count_it_once_per_owner() {
        // Auto mode binds QPs to one counter, and each QP shows its figures.
        let shared = |lqpn: u32, comm: &str| {
            let mut q = owned(qp("mlx5_0", "eth1", lqpn, Some(lqpn + 100)), comm, None);
            q.counter_id = Some(7);
            q.counters.insert("out_of_sequence".into(), 50);
            q
        };
        let mut own = shared(12, "nccl");
        own.counter_id = Some(8);
        own.counters.insert("out_of_sequence".into(), 3);
        let v = QpView {
            document: QpDocument {
                qps: vec![
                    shared(10, "nccl"),
                    shared(11, "nccl"),
                    own,
                    shared(20, "ib_write_bw"),
                ],
                ..QpDocument::default()
            },
            ..QpView::default()
        };
        let text = encode_qps(&v, &LiveDocument::default()).unwrap();
        assert!(
            text.contains(
                "roce_qp_out_of_sequence_total{pod=\"\",comm=\"nccl\",device=\"mlx5_0\"} 53\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "roce_qp_out_of_sequence_total{pod=\"\",comm=\"ib_write_bw\",device=\"mlx5_0\"} 50\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn an_empty_table_writes_only_the_join_and_the_visibility() {
        let v = QpView {
            visibility: vec![("vb".to_string(), Mode::None)],
            ..QpView::default()
        };
        let text = encode_qps(&v, &LiveDocument::default()).unwrap();
        assert!(!text.contains("roce_qp_info"), "{text}");
        assert!(text.contains("roce_visibility{ifname=\"vb\",mode=\"none\"} 1\n"));
        assert!(text.contains("roce_qp_unjoined_flows{reason=\"tie\"} 0\n"));
    }

    #[test]
    fn counter_names_become_metric_names() {
        assert_eq!(
            metric_name("rx_write_requests").as_deref(),
            Some("rx_write_requests")
        );
        assert_eq!(
            metric_name("Out-Of-Sequence").as_deref(),
            Some("out_of_sequence")
        );
        assert_eq!(metric_name("retries_total").as_deref(), Some("retries"));
        assert_eq!(metric_name("a_total_total").as_deref(), Some("a"));
        assert_eq!(metric_name("__").as_deref(), None);
        assert_eq!(metric_name("").as_deref(), None);
        assert_eq!(metric_name("_total").as_deref(), None);
    }
}
