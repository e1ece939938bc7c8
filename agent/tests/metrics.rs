//! `GET /metrics` as Prometheus reads it: `promtool check metrics` finds nothing in the
//! exposition of a realistic document (both directions, VXLAN, IPv6, event counters,
//! findings, the RNIC counters of a fixture tree) nor in a whole scrape (with the
//! `process_*` families of the process that makes it); the fleet alert rules pass
//! `promtool check rules` and their unit tests; ethtool statistics are read through
//! the real ioctl on a veth; and a real agent in a namespace serves exact values
//! after RoCE packets cross it.
//!
//! promtool comes with Debian's `prometheus` package (`cargo xtask setup` installs it).
//! Without it the promtool tests are skipped with a note, except under CI (`CI` set),
//! where a missing promtool fails them. Namespace tests need root and skip without it.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixture, Agent, Pair};
use roce_agent::doc::finding::Severity;
use roce_agent::doc::{Counters, Direction, Document, Ecn, Family, Flow};
use roce_agent::telemetry::metrics::{self, EventCounts, HostSources, Inputs};
use roce_testkit::netns::Netns;
use roce_testkit::sock::set_int_option;

/// The prefix of the namespaces the tests make: `roce-m-<pid>x<n>`.
const NS: &str = "roce-m-";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether promtool can be run; under CI its absence is a failure, not a skip.
fn have_promtool() -> bool {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing under CI: `cargo xtask setup` installs Debian's prometheus package"
        );
        eprintln!("skipped: promtool not found (apt-get install prometheus, or cargo xtask setup)");
    }
    found
}

/// `promtool check metrics` on `text`: its exit status and everything it printed.
fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// That `promtool check metrics` finds nothing in `text` (skipped without promtool
/// outside CI, see [`have_promtool`]).
fn assert_promtool_clean(text: &str) {
    if !have_promtool() {
        return;
    }
    let (ok, said) = promtool_check_metrics(text);
    assert!(
        ok && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n---\n{text}"
    );
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')
            .map(str::to_string)
    })
}

/// The value of label `name` in the sample line `line`.
fn label(line: &str, name: &str) -> String {
    let at = line
        .find(&format!("{{{name}=\""))
        .or_else(|| line.find(&format!(",{name}=\"")))
        .unwrap_or_else(|| panic!("no label {name} in {line}"))
        + name.len()
        + 3;
    line[at..].split('"').next().expect("a value").to_string()
}

fn ecn(not_ect: u64, ect0: u64, ce: u64) -> Ecn {
    Ecn {
        not_ect,
        ect1: 0,
        ect0,
        ce,
    }
}

fn flow(ifname: &str, direction: Direction, src: &str, dst: &str, qp: u32) -> Flow {
    let src: IpAddr = src.parse().expect("address");
    Flow {
        ifname: Some(ifname.to_string()),
        direction: Some(direction),
        family: if src.is_ipv6() {
            Family::Ipv6
        } else {
            Family::Ipv4
        },
        src,
        dst: dst.parse().expect("address"),
        sport: 49152,
        vni: None,
        inner_family: None,
        inner_src: None,
        inner_dst: None,
        dest_qp: qp,
        packets: 100,
        bytes: 100 * 1082,
        ecn: ecn(0, 100, 0),
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
        first_seen_ns: 1,
        last_seen_ns: 2,
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

fn in_vxlan(mut f: Flow, vni: u32, inner_src: &str, inner_dst: &str) -> Flow {
    f.vni = Some(vni);
    f.inner_family = Some(Family::Ipv4);
    f.inner_src = Some(inner_src.parse().expect("address"));
    f.inner_dst = Some(inner_dst.parse().expect("address"));
    f.inner_ecn = Some(ecn(0, f.packets, 0));
    f
}

/// Flows an SRE would see on a VTEP-facing host: both directions, plain and VXLAN
/// (two inner hosts behind one VTEP pair using the same QP number), IPv6, congestion
/// and loss on some.
fn realistic_document() -> Document {
    let mut congested = flow(
        "eth1",
        Direction::Ingress,
        "198.18.0.2",
        "198.18.0.1",
        0x1234,
    );
    congested.ecn = ecn(0, 80, 20);
    congested.cnps = 15;
    let mut lossy = flow("eth1", Direction::Egress, "198.18.0.1", "198.18.0.2", 0x99);
    lossy.naks = 3;
    lossy.rnr_naks = 1;
    lossy.psn_gaps = 4;
    lossy.acks = 40;
    let mut tunnelled_a = in_vxlan(
        flow("eth2", Direction::Ingress, "10.0.0.2", "10.0.0.1", 17),
        5001,
        "198.19.0.2",
        "198.19.0.1",
    );
    tunnelled_a.inner_ecn = Some(ecn(0, 90, 10));
    let mut tunnelled_b = in_vxlan(
        flow("eth2", Direction::Ingress, "10.0.0.2", "10.0.0.1", 17),
        5001,
        "198.19.0.3",
        "198.19.0.1",
    );
    tunnelled_b.ecn = ecn(0, 99, 1);
    let v6 = flow("eth2", Direction::Egress, "fd00::1", "fd00::2", 5);
    let mut counters = Counters::from_stats(&[], 5);
    counters.roce = 300;
    counters.roce_in_vxlan = 200;
    counters.other_udp = 7;
    counters.flows_created = 9;
    counters.flows_evicted = 4;
    counters.flow_insert_failed = 1;
    counters.qos.audit_roce_would_rewrite = 12;
    if let Some(n) = counters.parse_errors.get_mut("truncated_bth") {
        *n = 2;
    }
    let mut flows = vec![congested, lossy, tunnelled_a, tunnelled_b, v6];
    flows.sort_by(Flow::canonical_cmp);
    Document { flows, counters }
}

fn realistic_findings() -> Vec<roce_agent::doc::finding::Finding> {
    use roce_agent::audit::finding;
    vec![
        finding(
            "ecn_np",
            Some("eth1"),
            Severity::Error,
            "off",
            "on",
            "echo 1 > x",
        ),
        finding(
            "cnp_dscp",
            Some("eth1"),
            Severity::Error,
            "46",
            "48",
            "echo 48 > y",
        ),
        finding(
            "dcb_unsupported",
            Some("veth0"),
            Severity::Info,
            "none",
            "DCB",
            "-",
        ),
        finding(
            "audit",
            None,
            Severity::Warning,
            "slow",
            "fast",
            "see the log",
        ),
    ]
}

fn realistic_events() -> EventCounts {
    EventCounts {
        by_kind: [
            ("ce", 31),
            ("cnp", 15),
            ("nak", 3),
            ("rnr_nak", 1),
            ("psn_gap", 4),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect(),
        dropped: [("rate_limit", 2), ("ring_full", 0)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
    }
}

#[test]
fn exposition_of_a_realistic_document_is_promtool_clean() {
    let doc = roce_agent::telemetry::live::LiveDocument::from(realistic_document());
    let findings = realistic_findings();
    let events = realistic_events();
    // The RNIC counters as a scrape reads them from a fixture tree.
    let host = HostSources {
        sysfs_root: fixture("mlx5-bad").into(),
        interfaces: Vec::new(),
    }
    .read();
    assert_eq!(host.rnic.len(), 1, "{host:?}");
    let mut pfc = roce_agent::telemetry::ethtool::PfcCounters {
        ifname: "eth1".to_string(),
        ..Default::default()
    };
    pfc.frames[0][3] = Some(120);
    pfc.frames[1][3] = Some(4);
    pfc.duration_us[0][3] = Some(2_500);
    let text = metrics::encode(&Inputs {
        document: &doc,
        findings: &findings,
        events: Some(&events),
        rnic: &host.rnic,
        pfc: std::slice::from_ref(&pfc),
        top_flows: 10,
    })
    .expect("encode");

    // Every family of DESIGN.md is there.
    for family in [
        "roce_packets_total",
        "roce_bytes_total",
        "roce_ecn_packets_total",
        "roce_cnp_packets_total",
        "roce_ack_packets_total",
        "roce_nak_packets_total",
        "roce_psn_gaps_total",
        "roce_frames_total",
        "roce_parse_errors_total",
        "roce_qos_packets_total",
        "roce_flows",
        "roce_flows_created_total",
        "roce_flow_insert_failed_total",
        "roce_flows_evicted_total",
        "roce_events_total",
        "roce_events_dropped_total",
        "roce_top_flow_problems_total",
        "roce_check_findings",
        "roce_rnic_np_cnp_packets_sent_total",
        "roce_pfc_pause_frames_total",
        "roce_pfc_pause_duration_seconds_total",
        "roce_agent_build_info",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "no family {family} in\n{text}"
        );
    }
    let v =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    assert_eq!(
        v(r#"roce_packets_total{ifname="eth2",direction="ingress",encap="vxlan"}"#),
        "200"
    );
    assert_eq!(
        v(
            r#"roce_ecn_packets_total{ifname="eth2",direction="ingress",header="inner",codepoint="ce"}"#
        ),
        "10"
    );
    assert_eq!(
        v(r#"roce_nak_packets_total{ifname="eth1",direction="egress",kind="rnr_nak"}"#),
        "1"
    );
    assert_eq!(
        v(
            r#"roce_rnic_np_ecn_marked_roce_packets_received_total{device="mlx5_0",port="1",netdev="eth1"}"#
        ),
        "18240"
    );
    assert_eq!(
        v(r#"roce_rnic_port_data_transmitted_bytes_total{device="mlx5_0",port="1",netdev="eth1"}"#),
        "2500000000000"
    );
    assert_eq!(
        v(r#"roce_pfc_pause_duration_seconds_total{ifname="eth1",direction="rx",priority="3"}"#),
        "0.0025"
    );
    assert_eq!(
        v(r#"roce_check_findings{check="audit",ifname="",severity="warning"}"#),
        "1"
    );
    // The two tunnelled flows that share outer addresses, VNI and QP stay two series.
    let shared = text
        .lines()
        .filter(|l| l.starts_with("roce_top_flow_problems_total{") && l.contains(r#"vni="5001""#))
        .count();
    assert_eq!(shared, 2, "{text}");
    // Findings by ifname, like every other family; no placeholder interface anywhere.
    assert_eq!(
        v(r#"roce_check_findings{check="ecn_np",ifname="eth1",severity="error"}"#),
        "1"
    );
    let findings_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("roce_check_findings{"))
        .collect();
    assert_eq!(findings_lines.len(), 4, "{text}");
    for line in &findings_lines {
        assert!(
            line.contains(",ifname=\"") && !line.contains("interface="),
            "{line}"
        );
    }
    assert!(!text.contains(r#"ifname="all""#), "{text}");
    assert_eq!(v(r#"roce_frames_total{class="roce"}"#), "300");
    assert_eq!(
        v(r#"roce_qos_packets_total{action="audit_roce_would_rewrite"}"#),
        "12"
    );
    // Every top flow names its QP in decimal and, beside it, in hex.
    let top_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("roce_top_flow_"))
        .collect();
    assert!(!top_lines.is_empty());
    for line in &top_lines {
        let qp: u32 = label(line, "dest_qp").parse().expect("a decimal QP");
        assert_eq!(label(line, "dest_qp_hex"), format!("{qp:#x}"), "{line}");
    }
    assert_eq!(
        v(
            r#"roce_top_flow_cnp_packets_total{ifname="eth1",direction="ingress",src="198.18.0.2",dst="198.18.0.1",vni="",inner_src="",inner_dst="",dest_qp="4660",dest_qp_hex="0x1234"}"#
        ),
        "15"
    );

    assert_promtool_clean(&text);
}

/// An exporter of a realistic host: the RNIC counters of a fixture tree, no PFC.
fn exporter(tree: &str) -> metrics::Exporter {
    metrics::Exporter {
        host: std::sync::RwLock::new(HostSources {
            sysfs_root: fixture(tree).into(),
            interfaces: Vec::new(),
        }),
        top_flows: 10,
        reloads: Default::default(),
        events_ring: None,
        events_feed: None,
    }
}

#[test]
fn a_whole_scrape_with_the_process_families_is_promtool_clean() {
    let doc = roce_agent::telemetry::live::LiveDocument::from(realistic_document());
    let text = exporter("mlx5-bad")
        .render(&doc, &realistic_findings())
        .expect("render");
    let v =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    let number = |series: &str| -> f64 { v(series).parse().expect("a number") };
    for (family, kind) in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_start_time_seconds", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("roce_agent_config_reloads_total", "counter"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "no {family} {kind} in\n{text}"
        );
    }
    // This test's process: it has memory, and it started within the hour.
    assert!(number("process_resident_memory_bytes") > 0.0);
    assert!(number("process_virtual_memory_bytes") >= number("process_resident_memory_bytes"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let start = number("process_start_time_seconds");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );
    assert!(number("process_open_fds") >= 3.0);
    assert!(number("process_max_fds") >= number("process_open_fds"));
    assert!(number("process_cpu_seconds_total") >= 0.0);
    // Each family once: the process families are not written twice.
    assert_eq!(
        text.matches("# TYPE process_open_fds ").count(),
        1,
        "{text}"
    );

    assert_promtool_clean(&text);
}

#[test]
fn promtool_rejects_what_the_default_openmetrics_encoder_writes() {
    // Why /metrics uses prometheus-client's prometheus_text encoder: the default one
    // (OpenMetrics) names a counter family `x` with samples `x_total`, which promtool
    // rejects ("no help text"). This also shows the check above can fail.
    if !have_promtool() {
        return;
    }
    use prometheus_client::metrics::counter::Counter;
    let mut registry = prometheus_client::registry::Registry::default();
    let counter: Counter = Counter::default();
    counter.inc();
    registry.register("roce_example", "An example counter", counter);
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &registry).expect("encode");
    let (ok, said) = promtool_check_metrics(&openmetrics);
    assert!(
        !ok && said.contains("no help text"),
        "{said}\n---\n{openmetrics}"
    );
    let mut text_0_0_4 = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text_0_0_4, &registry)
        .expect("encode");
    let (ok, said) = promtool_check_metrics(&text_0_0_4);
    assert!(ok && said.trim().is_empty(), "{said}\n---\n{text_0_0_4}");
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    if !have_promtool() {
        return;
    }
    let dir = repo().join("configs/prometheus");
    for args in [
        ["check", "rules", "roce-alerts.yml"],
        ["test", "rules", "roce-alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every fabric verdict the agent names has its alert.
    let rules = std::fs::read_to_string(dir.join("roce-alerts.yml")).expect("the rules");
    for check in [
        "ce_unanswered",
        "ecmp_low_entropy",
        "inner_ce_lost",
        "cnp_wrong_class",
        "pause_storm",
        "slow_receiver",
        "pfc_watchdog",
    ] {
        assert!(
            rules.contains(&format!("check=\"{check}\"")),
            "no alert rule for {check}"
        );
    }
    // And loss made in a VTEP, which is numbers, not a finding.
    assert!(rules.contains("rate(roce_tunnel_vtep_psn_gaps_total[5m])"));
}

#[test]
fn rnic_counters_of_both_fixture_trees_are_read_through_the_audit_discovery() {
    for (tree, cnps_sent) in [("mlx5-good", 18234), ("mlx5-bad", 0)] {
        let host = HostSources {
            sysfs_root: fixture(tree).into(),
            interfaces: Vec::new(),
        }
        .read();
        let port = &host.rnic[0];
        assert_eq!(
            (port.device.as_str(), port.port, port.netdev.as_str()),
            ("mlx5_0", 1, "eth1")
        );
        let value = |name: &str| {
            port.counters
                .iter()
                .find(|c| c.name == name)
                .map(|c| c.value)
        };
        assert_eq!(value("np_cnp_sent"), Some(cnps_sent), "{tree}");
        assert_eq!(value("port_rcv_data"), Some(612345678901), "{tree}");
        assert_eq!(value("rp_cnp_handled"), Some(17911), "{tree}");
    }
    let none = HostSources {
        sysfs_root: PathBuf::from("/nonexistent-sysfs-root"),
        interfaces: Vec::new(),
    }
    .read();
    assert!(none.rnic.is_empty() && none.pfc.is_empty());
}

// ---------------------------------------------------------------------------------
// Namespaces: the ethtool ioctl on a veth, and a real agent.

fn ifindex(ns: &Netns, dev: &str) -> u64 {
    let out = ns.ip_ok(&["-o", "link", "show", "dev", dev]);
    out.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ifindex in {out:?}"))
}

#[test]
fn ethtool_statistics_of_a_veth_match_ethtool_dash_s() {
    require_root!();
    // Links down: no traffic, so two reads of the statistics agree.
    let pair = Pair::down(NS);
    let peer = ifindex(&pair.b, "vb");
    let stats = pair
        .a
        .enter(|| roce_agent::telemetry::ethtool::stats("va"))
        .expect("enter namespace a")
        .expect("ethtool statistics of va");
    let value = |name: &str| stats.iter().find(|s| s.name == name).map(|s| s.value);
    assert_eq!(value("peer_ifindex"), Some(peer), "{stats:?}");
    assert_eq!(value("rx_queue_0_xdp_packets"), Some(0), "{stats:?}");

    // The same list, in the same order, as `ethtool -S` prints it.
    if let Ok(out) = pair.a.exec("ethtool", &["-S", "va"]) {
        let printed: Vec<(String, u64)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1) // "NIC statistics:"
            .filter_map(|l| {
                let (name, value) = l.trim().rsplit_once(':')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect();
        let ours: Vec<(String, u64)> = stats.iter().map(|s| (s.name.clone(), s.value)).collect();
        assert_eq!(ours, printed);
    } else {
        eprintln!("note: no ethtool binary; compared with peer_ifindex only");
    }

    // lo has no driver statistics; a missing device is named as such.
    let lo = pair
        .a
        .enter(|| roce_agent::telemetry::ethtool::stats("lo"))
        .expect("enter");
    assert!(
        matches!(
            lo,
            Err(roce_agent::telemetry::ethtool::EthtoolError::Unsupported { .. })
        ),
        "{lo:?}"
    );
    let missing = pair
        .a
        .enter(|| roce_agent::telemetry::ethtool::stats("vb"))
        .expect("enter");
    assert!(
        matches!(
            missing,
            Err(roce_agent::telemetry::ethtool::EthtoolError::NoDevice { .. })
        ),
        "{missing:?}"
    );
    // veth has neither mlx5 pause statistics nor DCB: no PFC counters, no error.
    let host = pair
        .a
        .enter(|| {
            HostSources {
                sysfs_root: PathBuf::from("/nonexistent-sysfs-root"),
                interfaces: vec!["va".to_string()],
            }
            .read()
        })
        .expect("enter");
    assert!(host.pfc.is_empty(), "{:?}", host.pfc);
}

/// `GET /metrics` from inside `ns`: the Content-Type and the body (None: no answer).
fn scrape(ns: &Netns, addr: &str) -> Option<(String, String)> {
    let addr = addr.to_string();
    ns.enter(move || -> Option<(String, String)> {
        let mut s = TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
            .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        let content_type = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-type")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        Some((content_type, body.to_string()))
    })
    .ok()
    .flatten()
}

/// Sends RC SEND_ONLY packets (`count`, PSNs from 0) or one CNP to 198.18.0.1:4791
/// from namespace `b`, with DSCP 26 and ECN `ecn`.
fn send(b: &Netns, count: u32, dest_qp: u32, ecn: i32, cnp: bool) {
    b.enter(|| {
        let sock = UdpSocket::bind("198.18.0.2:0").expect("bind in namespace b");
        set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, (26 << 2) | ecn)
            .unwrap_or_else(|e| panic!("IP_TOS: {e}"));
        for psn in 0..count {
            // BTH (12) + ICRC (4); a CNP has 16 reserved bytes before its ICRC.
            let mut packet = vec![0u8; if cnp { 32 } else { 16 }];
            packet[0] = if cnp { 0x81 } else { 0x04 };
            packet[1] = 0x40;
            packet[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
            packet[4..8].copy_from_slice(&(dest_qp & 0x00FF_FFFF).to_be_bytes());
            packet[8..12].copy_from_slice(&(psn & 0x00FF_FFFF).to_be_bytes());
            sock.send_to(&packet, "198.18.0.1:4791").expect("send");
        }
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn a_running_agent_serves_exact_metrics_that_promtool_accepts() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9475";
    let root = fixture("mlx5-good");
    let agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.1",
            "--sysfs-root",
            &root,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(&pair.a, api).is_none() {
        assert!(Instant::now() < deadline, "no /metrics:\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }

    send(&pair.b, 5, 0x1234, 0b10, false); // ECT(0)
    send(&pair.b, 3, 0x77, 0b11, false); // CE
    send(&pair.b, 1, 0x77, 0b10, true); // a CNP towards QP 0x77

    let series = |name: &str| format!(r#"{name}{{ifname="va",direction="ingress"}}"#);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (content_type, text) = loop {
        let got = scrape(&pair.a, api);
        if let Some((_, text)) = &got {
            if sample(text, &series("roce_cnp_packets_total")).as_deref() == Some("1") {
                break got.expect("checked");
            }
        }
        assert!(
            Instant::now() < deadline,
            "the packets never showed up: {got:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let v = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    assert_eq!(
        v(r#"roce_packets_total{ifname="va",direction="ingress",encap="none"}"#),
        "9"
    );
    // 14 Ethernet + 20 IPv4 + 8 UDP + 16 (BTH, ICRC); the CNP has 16 bytes more.
    assert_eq!(
        v(r#"roce_bytes_total{ifname="va",direction="ingress",encap="none"}"#),
        (8 * 58 + 74).to_string()
    );
    assert_eq!(
        v(
            r#"roce_ecn_packets_total{ifname="va",direction="ingress",header="outer",codepoint="ce"}"#
        ),
        "3"
    );
    assert_eq!(
        v(
            r#"roce_ecn_packets_total{ifname="va",direction="ingress",header="outer",codepoint="ect0"}"#
        ),
        "6"
    );
    assert_eq!(v(r#"roce_flows{ifname="va"}"#), "2");
    assert_eq!(v(r#"roce_frames_total{class="roce"}"#), "9");
    assert_eq!(v(&series("roce_psn_gaps_total")), "0");
    // QP 0x77 has 3 CE + 1 CNP = 4 problems; QP 0x1234 none, so it is nobody's top flow.
    let top = r#"{ifname="va",direction="ingress",src="198.18.0.2",dst="198.18.0.1",vni="",inner_src="",inner_dst="",dest_qp="119",dest_qp_hex="0x77"}"#;
    assert_eq!(v(&format!("roce_top_flow_problems_total{top}")), "4");
    assert_eq!(v(&format!("roce_top_flow_ce_packets_total{top}")), "3");
    assert_eq!(
        text.matches("roce_top_flow_packets_total{").count(),
        1,
        "{text}"
    );
    // The RNIC counters of --sysfs-root, and the audit's findings about veth.
    assert_eq!(
        v(r#"roce_rnic_np_cnp_packets_sent_total{device="mlx5_0",port="1",netdev="eth1"}"#),
        "18234"
    );
    assert_eq!(
        v(r#"roce_check_findings{check="dcb_unsupported",ifname="va",severity="info"}"#),
        "1"
    );
    let build = format!(
        "roce_agent_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&build), "{text}");
    assert!(!text.contains(r#"ifname="all""#), "{text}");
    // The agent's own process: resident, started within the hour.
    assert!(
        v("process_resident_memory_bytes")
            .parse::<f64>()
            .expect("a number")
            > 0.0
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let start: f64 = v("process_start_time_seconds").parse().expect("a number");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );

    assert_promtool_clean(&text);
}
