//! roce-bench's `agent` section: the agent at a million flows. How long one collector
//! interval takes (`Collector::poll`: the kernel flow table and STATS read into the
//! flows document, interfaces named, rates against the previous poll), how much
//! memory the agent holds, and how long a `GET /metrics` scrape takes, with
//! `--agent-flows` (default 1,000,000) flows in the kernel tables.
//!
//! It runs in a child process (`roce-bench --agent-child`), so that its RSS is the
//! agent's alone. The child loads the real object with its flow table sized for the
//! flows (and a sixteenth more), fills it from user space through
//! `Loaded::insert_flows` (each flow takes a free slot of FLOW_SLOTS, as a program
//! would, and its key goes into FLOWS4 or FLOWS_MID by batch update): half the flows
//! plain IPv4, the other half a half IPv4 in VXLAN over IPv4, a half IPv6; 4,096
//! peers, each flow one queue pair to one of them, a quarter on egress; CE marks on a
//! seventh of the flows, CNPs on a tenth (on all with `--agent-troubled`). Then it
//! does what `roce-agent run` does each interval: polls on one thread pinned to one
//! CPU and publishes the document through the same `watch` channel the API serves,
//! while the API (`api::server::router` and `api::server::metrics_router`) listens on
//! loopback. Figures: the median poll after the first (the first has no rates to
//! make), VmRSS and VmHWM from /proc/self/status after the polls and scrapes, and the
//! median of `GET /metrics` through HTTP; then one `GET /flows` of the whole table (its
//! time, and VmHWM after it).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use roce_agent::datapath::loader::{self, LoadOptions};
use roce_agent::telemetry::collector::Collector;
use roce_common::flow::FlowStats;
use roce_common::key::{addr_v4_mapped, FlowKey};
use roce_common::key::{KEY_EGRESS, KEY_OUTER_V6, KEY_TUNNELLED};

use crate::median;

/// The targets (BENCHMARKS.md).
pub const TARGET_POLL_MS: f64 = 250.0;
pub const TARGET_RSS_MB: f64 = 300.0;
pub const TARGET_SCRAPE_MS: f64 = 100.0;

/// What the child measures.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub json: bool,
    pub flows: u32,
    /// Every flow with CNPs (a congested fabric), not a tenth of them.
    pub troubled: bool,
    pub polls: usize,
    pub scrapes: usize,
}

/// Runs the section in a child process of this binary (`--agent-child`); its lines go
/// to this process's stdout.
pub fn run(opts: &Options) -> Result<()> {
    let exe = std::env::current_exe().context("finding roce-bench itself")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--agent-child")
        .arg("--agent-flows")
        .arg(opts.flows.to_string())
        .arg("--agent-polls")
        .arg(opts.polls.to_string())
        .arg("--agent-scrapes")
        .arg(opts.scrapes.to_string());
    if opts.json {
        cmd.arg("--json");
    }
    if opts.troubled {
        cmd.arg("--agent-troubled");
    }
    let status = cmd.status().context("running the agent section's child")?;
    if !status.success() {
        bail!("the agent section's child failed: {status}");
    }
    Ok(())
}

/// Interfaces the flows are counted on: the first two that exist (names resolved as the
/// agent resolves them).
fn interfaces() -> Vec<u32> {
    let found: Vec<u32> = (1..64)
        .filter(|i| roce_agent::sys::netif::name_of(*i).is_some())
        .take(2)
        .collect();
    if found.is_empty() {
        vec![1]
    } else {
        found
    }
}

/// Counters of flow `i`: tens of thousands of packets, an ECN-capable
/// transport with CE marks on a seventh of the flows, CNPs on a tenth (`troubled`: on
/// all), now and then a NAK or a PSN gap.
fn stats_of(i: u32, tunnelled: bool, troubled: bool) -> FlowStats {
    let packets = 1_000 + ((i.wrapping_mul(2_654_435_761) >> 8) % 50_000) as u64;
    let ce = if i.is_multiple_of(7) {
        (i % 50) as u64 + 1
    } else {
        0
    };
    let mut s = FlowStats {
        packets,
        bytes: packets * 1_084,
        ecn: [0, 0, packets - ce, ce],
        cnps: if troubled || i.is_multiple_of(10) {
            (i % 30) as u64 + 1
        } else {
            0
        },
        acks: packets / 16,
        naks: i.is_multiple_of(97) as u64,
        psn_gaps: i.is_multiple_of(89) as u64,
        first_seen_ns: 1_000_000_000 + i as u64,
        last_seen_ns: 9_000_000_000 + i as u64,
        sport: 49152 + (i % 16_384) as u16,
        last_dscp: 26,
        ..FlowStats::default()
    };
    if tunnelled {
        s.inner_ecn = [0, 0, packets - ce, ce];
    }
    s
}

/// Peers the host talks to: each flow is one queue pair to one of them.
const PEERS: u32 = 4096;

fn ip4(host: u32) -> u32 {
    u32::from_ne_bytes(Ipv4Addr::from(0x0A00_0000 | (host & 0x00FF_FFFF)).octets())
}

fn ip6_words(host: u32) -> [u32; 4] {
    let a = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, (host >> 16) as u16, host as u16);
    let o = a.octets();
    std::array::from_fn(|w| {
        u32::from_ne_bytes([o[w * 4], o[w * 4 + 1], o[w * 4 + 2], o[w * 4 + 3]])
    })
}

/// The host's own address on interface `slot` (hosts 1, 2, ...; peers from 256 on).
const LOCAL: u32 = 1;
/// Remote VTEPs the VXLAN flows come from or go to.
const VTEPS: u32 = 64;

/// Flow `i` of a table: peer `i % PEERS`, queue pair `i / PEERS + 1` (so every key is
/// distinct), on egress for a quarter of the flows. Returns (interface slot, local,
/// peer, QP, egress).
fn shape(i: u32) -> (usize, u32, u32, u32, bool) {
    let peer = 256 + i % PEERS;
    let slot = (peer % 2) as usize;
    (
        slot,
        LOCAL + slot as u32,
        peer,
        i / PEERS + 1,
        (i >> 1) % 4 == 1,
    )
}

/// Fills the flow table with `n4` plain IPv4 flows and `nw` others (half VXLAN, half
/// IPv6), CHUNK flows a call of `Loaded::insert_flows` (each takes a free slot, as a
/// program would; its key goes into FLOWS4 or FLOWS_MID by batch update).
fn fill(loaded: &mut loader::Loaded, n4: u32, nw: u32, troubled: bool) -> Result<()> {
    const CHUNK: u32 = 8192;
    let ifs = interfaces();
    let ifindex = |slot: usize| ifs[slot % ifs.len()];
    let mut flows = Vec::with_capacity(CHUNK as usize);
    for start in (0..n4).step_by(CHUNK as usize) {
        flows.clear();
        flows.extend((start..(start + CHUNK).min(n4)).map(|i| {
            let (slot, local, peer, qp, egress) = shape(i);
            let (src, dst) = if egress { (local, peer) } else { (peer, local) };
            let key = FlowKey {
                src: addr_v4_mapped(ip4(src)),
                dst: addr_v4_mapped(ip4(dst)),
                dest_qp: qp,
                ifindex: ifindex(slot),
                flags: if egress { KEY_EGRESS } else { 0 },
                ..FlowKey::default()
            };
            (key, stats_of(i, false, troubled))
        }));
        loaded
            .insert_flows(&flows)
            .context("filling the plain IPv4 flows")?;
    }
    for start in (0..nw).step_by(CHUNK as usize) {
        flows.clear();
        flows.extend((start..(start + CHUNK).min(nw)).map(|i| {
            // Alternate halves of the peers: VXLAN to even peers, IPv6 to odd ones.
            let tunnelled = i % 2 == 0;
            let (slot, local, peer, qp, egress) = shape(i);
            let (src, dst) = if egress { (local, peer) } else { (peer, local) };
            let flags = if egress { KEY_EGRESS } else { 0 };
            let key = if tunnelled {
                let vtep = 0x10_0000 + peer % VTEPS;
                let here = 0x10_0000 + VTEPS;
                let (osrc, odst) = if egress { (here, vtep) } else { (vtep, here) };
                FlowKey {
                    src: addr_v4_mapped(ip4(osrc)),
                    dst: addr_v4_mapped(ip4(odst)),
                    inner_src: addr_v4_mapped(ip4(0x20_0000 + src)),
                    inner_dst: addr_v4_mapped(ip4(0x20_0000 + dst)),
                    vni: 5000 + peer % 16,
                    dest_qp: qp,
                    ifindex: ifindex(slot),
                    flags: KEY_TUNNELLED | flags,
                }
            } else {
                FlowKey {
                    src: ip6_words(src),
                    dst: ip6_words(dst),
                    dest_qp: qp,
                    ifindex: ifindex(slot),
                    flags: KEY_OUTER_V6 | flags,
                    ..FlowKey::default()
                }
            };
            (key, stats_of(i, tunnelled, troubled))
        }));
        loaded
            .insert_flows(&flows)
            .context("filling the IPv6 and VXLAN flows")?;
    }
    Ok(())
}

/// VmRSS and VmHWM of this process, in MB.
fn memory_mb() -> Result<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/self/status"))?;
        let kb: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("bad {line:?}"))?;
        Ok(kb / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The child: fill, poll, scrape, measure, print.
pub fn child(opts: &Options) -> Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let n4 = opts.flows / 2;
    let nw = opts.flows - n4;
    // Room for a sixteenth more: a table this full is not yet one that evicts.
    let mut loaded = loader::load(&LoadOptions {
        flows_max_entries: (opts.flows + opts.flows / 15).max(65_536),
        ..LoadOptions::default()
    })
    .context("loading the eBPF programs (root needed)")?;
    let fill_start = Instant::now();
    fill(&mut loaded, n4, nw, opts.troubled)?;
    let fill_s = fill_start.elapsed().as_secs_f64();
    // The poll runs on this thread, on one CPU, as `run`'s loop does.
    roce_testkit::sock::pin_thread_to_cpu(cpus - 1).context("pinning the poll thread")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut collector = Collector::new(loaded);
    let first = collector.poll().context("the first poll")?;
    let entries = first.entries;
    let mut polls = vec![first.elapsed.as_secs_f64() * 1000.0];
    let mut reads = vec![first.read.as_secs_f64() * 1000.0];
    let (tx, rx) = tokio::sync::watch::channel(first.document);
    let (_ftx, frx) =
        tokio::sync::watch::channel(Arc::new(roce_agent::doc::finding::Findings::default()));
    let exporter = Arc::new(roce_agent::telemetry::metrics::Exporter {
        host: std::sync::RwLock::new(roce_agent::telemetry::metrics::HostSources {
            sysfs_root: "/sys".into(),
            interfaces: Vec::new(),
        }),
        top_flows: 10,
        reloads: Default::default(),
        events_ring: None,
        events_feed: None,
    });
    let routes = roce_agent::api::server::router(rx.clone(), frx.clone(), None)
        .merge(roce_agent::api::server::metrics_router(rx, frx, exporter));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?.to_string();
    rt.spawn(async move { axum::serve(listener, routes).await });

    for _ in 1..opts.polls.max(2) {
        let start = Instant::now();
        let p = collector.poll().context("polling")?;
        polls.push(start.elapsed().as_secs_f64() * 1000.0);
        reads.push(p.read.as_secs_f64() * 1000.0);
        tx.send_replace(p.document);
    }
    let flows_in_document = tx.borrow().len();
    // The floor under a poll: FLOW_SLOTS read through its mapped window, no document.
    let mut bare = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        collector
            .loaded_mut()
            .for_each_flow(|_, _| {})
            .context("reading the flow maps")?;
        bare.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let mut scrapes = Vec::new();
    let mut body_len = 0;
    for _ in 0..opts.scrapes.max(1) {
        let start = Instant::now();
        let body = roce_agent::api::client::get_body(&addr, "/metrics", Duration::from_secs(60))
            .context("GET /metrics")?;
        scrapes.push(start.elapsed().as_secs_f64() * 1000.0);
        body_len = body.len();
        if !String::from_utf8_lossy(&body).contains("roce_flows{") {
            bail!("GET /metrics has no roce_flows series");
        }
    }
    let (rss, hwm) = memory_mb()?;
    // Then GET /flows once, read as it comes (the whole table is hundreds of MB of
    // JSON): what it costs and what it does to the agent's peak memory.
    let start = Instant::now();
    let mut body = roce_agent::api::client::Client::plain(&addr)
        .and_then(|c| c.get_reader("/flows", Duration::from_secs(120)))
        .context("GET /flows")?;
    let flows_bytes = std::io::copy(&mut body, &mut std::io::sink()).context("GET /flows")?;
    let flows_get_ms = start.elapsed().as_secs_f64() * 1000.0;
    let (_, hwm_after_flows) = memory_mb()?;
    let poll_ms = median(polls[1..].to_vec());
    let scrape_ms = median(scrapes.clone());
    let lines = [
        serde_json::json!({
            "name": "collector_interval_1m_flows", "value": poll_ms, "unit": "ms",
            "target": TARGET_POLL_MS, "met": poll_ms <= TARGET_POLL_MS,
            "flows": opts.flows, "entries": entries, "flows_in_document": flows_in_document,
            "first_poll_ms": polls[0], "polls_ms": polls, "read_ms": median(reads[1..].to_vec()),
            "maps_only_ms": median(bare.clone()), "troubled": opts.troubled,
            "cpus": cpus, "fill_s": fill_s,
        }),
        serde_json::json!({
            "name": "agent_rss_1m_flows", "value": rss, "unit": "MB",
            "target": TARGET_RSS_MB, "met": rss <= TARGET_RSS_MB,
            "vm_rss_mb": rss, "vm_hwm_mb": hwm, "hwm_met": hwm <= TARGET_RSS_MB,
            "flows": opts.flows,
        }),
        serde_json::json!({
            "name": "metrics_scrape_1m_flows", "value": scrape_ms, "unit": "ms",
            "target": TARGET_SCRAPE_MS, "met": scrape_ms <= TARGET_SCRAPE_MS,
            "scrapes_ms": scrapes, "bytes": body_len, "flows": opts.flows,
        }),
        serde_json::json!({
            "name": "flows_get_1m_flows", "value": flows_get_ms, "unit": "ms",
            "bytes": flows_bytes, "vm_hwm_after_mb": hwm_after_flows, "flows": opts.flows,
        }),
    ];
    for l in &lines {
        if opts.json {
            println!("{l}");
        } else {
            let verdict = match (l["target"].as_f64(), l["met"].as_bool()) {
                (Some(t), Some(true)) => format!("target <= {t:<6} met"),
                (Some(t), _) => format!("target <= {t:<6} MISSED"),
                _ => "(no target)".to_string(),
            };
            println!(
                "{:<34} {:>10.1} {:<3} {verdict}",
                l["name"].as_str().unwrap_or_default(),
                l["value"].as_f64().unwrap_or_default(),
                l["unit"].as_str().unwrap_or_default(),
            );
        }
    }
    if !opts.json {
        println!(
            "  ({} flows, {entries} entries read, fill {fill_s:.1} s; polls {:?} ms; reading the maps alone {:.0} ms; peak RSS (VmHWM) {hwm:.0} MB, {hwm_after_flows:.0} MB after GET /flows)",
            flows_in_document,
            polls.iter().map(|p| p.round()).collect::<Vec<_>>(),
            median(bare.clone()),
        );
    }
    drop(tx);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
