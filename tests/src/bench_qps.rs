//! `qp_table_10k`: what one refresh of the QP table costs the agent on a host with
//! 10,000 QPs. The netlink replies are the kernel's bytes for such a host, made by the
//! agent's own encoder (`rdma::netlink::synthetic`: two mlx5-like devices, half the
//! QPs made by rdma_cm, every eighth with a bound counter of 16 names) before the
//! clock starts; the clock covers what the daemon does with them each interval:
//! decoding the replies and reading the owners (`QpTable::refresh_from`, this
//! process's own /proc entry as every QP's owner), joining the table with a live
//! document of 100,000 flows (both directions of every QP and 80,000 others), and
//! encoding `GET /qps` (JSON) and the QP families of `/metrics`.

use std::net::Ipv4Addr;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use roce_agent::doc::qp::Qp;
use roce_agent::rdma::netlink::synthetic::SynthHost;
use roce_agent::rdma::{QpTable, QpTableOptions};
use roce_agent::telemetry::live::{Beside, Builder, LiveDocument};
use roce_agent::telemetry::metrics::encode_qps;
use roce_agent::telemetry::qps::{QpRounds, TableRead, Watched};
use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey4, KEY4_EGRESS};

const QPS: usize = 10_000;
const OTHER_FLOWS: u32 = 80_000;
/// The bound: a refresh every interval must stay far below the interval.
const TARGET_MS: f64 = 100.0;
/// This host's address on both netdevs.
const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

pub struct Options {
    pub json: bool,
    pub runs: usize,
}

fn raw(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// The peer of a QP: its rdma_cm destination, else an address of its own.
fn peer_of(q: &Qp, n: u32) -> Ipv4Addr {
    match q.dst {
        Some(std::net::IpAddr::V4(a)) => a,
        _ => Ipv4Addr::new(198, 19, (n >> 8) as u8, n as u8),
    }
}

/// Both directions of every QP on its netdev (eth0 is ifindex 10, eth1 11, as the
/// synthetic ports say), then flows that belong to no QP.
fn live_flows(qps: &[Qp]) -> LiveDocument {
    let mut b = Builder::new(0, |i| Some(format!("eth{}", i.wrapping_sub(10))));
    let stats = FlowStats {
        packets: 1000,
        bytes: 1_084_000,
        ..FlowStats::default()
    };
    let mut rtt = roce_common::rtt::RttHist::default();
    for ns in [9_000, 11_000, 12_000, 40_000] {
        rtt.add(ns);
    }
    for (n, q) in qps.iter().enumerate() {
        let ifindex = if q.netdev.as_deref() == Some("eth1") {
            11
        } else {
            10
        };
        let peer = peer_of(q, n as u32);
        let ingress = FlowKey4 {
            src: raw(peer),
            dst: raw(LOCAL),
            qp_dir: q.lqpn,
            ifindex,
        };
        // The responses to the QP's requests: its round trips (roce_qp_rtt_seconds).
        b.add_flow(
            &ingress.widen(),
            &stats,
            None,
            Beside {
                rtt: Some(&rtt),
                ..Beside::default()
            },
        );
        if let Some(rqpn) = q.rqpn {
            let egress = FlowKey4 {
                src: raw(LOCAL),
                dst: raw(peer),
                qp_dir: rqpn | KEY4_EGRESS,
                ifindex,
            };
            b.add(&egress.widen(), &stats);
        }
    }
    for n in 0..OTHER_FLOWS {
        let key = FlowKey4 {
            src: raw(Ipv4Addr::new(
                198,
                19,
                128 + (n >> 16) as u8,
                (n >> 8) as u8,
            )),
            dst: raw(LOCAL),
            qp_dir: 0x80_0000 + (n & 0xff),
            ifindex: 10 + n % 2,
        };
        b.add(&key.widen(), &stats);
    }
    b.finish(&[], None)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn run(opts: &Options) -> Result<()> {
    let host = SynthHost::many_qps(QPS, Some(std::process::id()));
    let dump = host.dump();
    let reply_bytes: usize = [
        &dump.devices,
        &dump.ports,
        &dump.qps,
        &dump.cm_ids,
        &dump.qp_counters,
        &dump.port_counters,
    ]
    .iter()
    .flat_map(|replies| replies.iter().map(Vec::len))
    .sum();
    // The flows are the collector's, made before the refresh: outside the clock.
    let first = QpTable::new(QpTableOptions::default())
        .refresh_from(&dump)
        .context("decoding the synthetic replies")?;
    let flows = live_flows(&first.qps);
    let watched = Watched {
        interfaces: vec!["eth0".into(), "eth1".into()],
        mirrors: Vec::new(),
    };
    let mut table = QpTable::new(QpTableOptions::default());
    let mut rounds = QpRounds::default();
    let (mut times, mut decode_times, mut join_times, mut encode_times) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut joined, mut json_bytes, mut metrics_bytes) = (0, 0, 0);
    for _ in 0..opts.runs.max(1) {
        let start = Instant::now();
        let snapshot = table.refresh_from(&dump).context("refresh")?;
        let decoded = Instant::now();
        let read = TableRead::Read {
            qps: snapshot.qps,
            ports: snapshot.ports,
        };
        let (view, _) = rounds.round(read, &flows, &watched);
        let joined_at = Instant::now();
        let json = serde_json::to_vec(&view.document).context("GET /qps")?;
        let metrics = encode_qps(&view, &flows).context("/metrics")?;
        let end = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1000.0;
        times.push(ms(start, end));
        decode_times.push(ms(start, decoded));
        join_times.push(ms(decoded, joined_at));
        encode_times.push(ms(joined_at, end));
        joined = view.counts.joined;
        json_bytes = json.len();
        metrics_bytes = metrics.len();
        ensure!(
            view.document.qps.len() == QPS,
            "{} QPs",
            view.document.qps.len()
        );
    }
    // Each QP's two flows (the UD-free synthetic host gives every QP a remote QPN).
    ensure!(joined == 2 * QPS as u64, "{joined} flows joined");
    let value = median(times.clone());
    let line = serde_json::json!({
        "name": "qp_table_10k", "value": value, "unit": "ms",
        "target": TARGET_MS, "met": value <= TARGET_MS,
        "qps": QPS, "flows": flows.len(), "flows_joined": joined,
        "reply_bytes": reply_bytes, "qps_json_bytes": json_bytes, "metrics_bytes": metrics_bytes,
        "decode_ms": median(decode_times), "join_ms": median(join_times),
        "encode_ms": median(encode_times), "runs_ms": times,
    });
    if opts.json {
        println!("{line}");
    } else {
        println!(
            "{:<34} {:>10.1} ms  target <= {TARGET_MS} {}  (decode {:.1}, join {:.1}, encode {:.1} ms; {} flows)",
            "qp_table_10k",
            value,
            if value <= TARGET_MS { "met" } else { "MISSED" },
            line["decode_ms"].as_f64().unwrap_or_default(),
            line["join_ms"].as_f64().unwrap_or_default(),
            line["encode_ms"].as_f64().unwrap_or_default(),
            flows.len(),
        );
    }
    Ok(())
}
