//! The human view of a flow [`Document`]: one line per flow, the most congested
//! (highest share of CE-marked packets) first, then the busiest; and a summary of
//! the classifier's counters.
//!
//! How a person reads numbers here and in every other human view (`top`, `events`):
//! QPs in hex (`0x1234`), as tshark and perftest print them; sizes and rates with SI
//! prefixes, k = 1000 (`15.9k` bytes, as `1.65M` bits/s), which the byte column's
//! title says.

use std::fmt::Write as _;

use crate::doc::{Direction, Document, Flow, MirrorKind};

const HEADERS: [&str; 13] = [
    "iface",
    "src→dst",
    "vni",
    "inner",
    "qp",
    "pkts",
    BYTES_TITLE,
    "CE",
    "CE%",
    "CNPs",
    "ACK/NAK/RNR",
    "gaps",
    "dscp",
];

/// The byte column's title, which says what its prefixes mean.
pub const BYTES_TITLE: &str = "bytes(k=1000)";

/// Columns that hold numbers are right-aligned.
const RIGHT: [bool; 13] = [
    false, false, true, false, true, true, true, true, true, true, true, true, true,
];

/// Renders the table and the counters line, each line ending in a newline.
pub fn render(doc: &Document) -> String {
    let mut flows: Vec<&Flow> = doc.flows.iter().collect();
    flows.sort_by(|a, b| {
        b.ce_ratio()
            .total_cmp(&a.ce_ratio())
            .then(b.bytes.cmp(&a.bytes))
            .then(a.canonical_cmp(b))
    });
    // A mirror column only when a flow came from mirror copies, a retransmission
    // column only when a flow resent something: the table of a host without mirror
    // interfaces, of a fabric that loses nothing, stays as it always was.
    let mirrors = flows.iter().any(|f| f.mirror.is_some());
    let resends = flows.iter().any(|f| f.retransmitted_packets > 0);
    let rtts = flows.iter().any(|f| f.rtt.is_some());
    let rows: Vec<Vec<String>> = flows
        .iter()
        .map(|f| {
            let mut r = row(f).to_vec();
            if resends {
                r.insert(RESENT_AT, resent_cell(f));
            }
            if rtts {
                r.push(rtt_cell(f));
            }
            if mirrors {
                r.push(mirror_cell(f));
            }
            r
        })
        .collect();
    let mut headers: Vec<&str> = HEADERS.to_vec();
    let mut right = RIGHT.to_vec();
    if resends {
        headers.insert(RESENT_AT, RESENT_TITLE);
        right.insert(RESENT_AT, true);
    }
    if rtts {
        headers.push(RTT_TITLE);
        right.push(true);
    }
    if mirrors {
        headers.push(MIRROR_TITLE);
        right.push(false);
    }

    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no RoCE flows seen\n");
    } else {
        out.push_str(&aligned(&headers, &right, &rows));
    }
    if !doc.counters.tunnels.is_empty() {
        out.push('\n');
        out.push_str(&tunnel_table(&doc.counters.tunnels));
    }
    out.push_str(&counters_line(doc));
    out.push('\n');
    out
}

/// The VXLAN tunnels (`counters.tunnels`): one line per tunnel, its CE marks by
/// header and its PSN gaps on the underlay, on the inner side and made in the VTEP.
fn tunnel_table(tunnels: &[super::tunnel::TunnelRecord]) -> String {
    const HEADERS: [&str; 10] = [
        "tunnel on",
        "VTEPs",
        "vni",
        "flows",
        "pkts",
        "CE outer/inner",
        "gaps",
        "inner side",
        "inner gaps",
        "gaps in VTEP",
    ];
    const RIGHT: [bool; 10] = [
        false, false, true, true, true, true, true, false, true, true,
    ];
    let dash = || "-".to_string();
    let opt = |v: Option<u64>| v.map_or_else(dash, |v| v.to_string());
    let rows: Vec<Vec<String>> = tunnels
        .iter()
        .map(|t| {
            vec![
                iface_cell(t.ifname.as_deref(), t.direction),
                format!("{}→{}", t.src, t.dst),
                t.vni.to_string(),
                t.flows.to_string(),
                t.packets.to_string(),
                format!("{}/{}", t.ce, t.inner_ce),
                t.psn_gaps.to_string(),
                t.inner_ifname.clone().unwrap_or_else(dash),
                opt(t.inner_psn_gaps),
                opt(t.vtep_psn_gaps),
            ]
        })
        .collect();
    aligned(&HEADERS, &RIGHT, &rows)
}

/// `headers` and `rows` in columns two spaces apart, those `right` right-aligned, each
/// line trimmed at its end: every human table of the agent (flows, tunnels, `qps`).
pub fn aligned<R: AsRef<[String]>>(headers: &[&str], right: &[bool], rows: &[R]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows.iter().map(AsRef::as_ref) {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for r in std::iter::once(header.as_slice()).chain(rows.iter().map(AsRef::as_ref)) {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if right[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The title of the retransmission column: requests sent again, and go-backs after a
/// timeout (no NAK).
pub const RESENT_TITLE: &str = "resent/TO";

/// Where the retransmission column goes: after the gaps.
const RESENT_AT: usize = 12;

/// `12/1`: retransmitted packets, retransmit timeouts.
pub fn resent_cell(f: &Flow) -> String {
    format!("{}/{}", f.retransmitted_packets, f.retransmit_timeouts)
}

/// The title of the round-trip column (only when a flow has round trips).
pub const RTT_TITLE: &str = "RTT p50/p99";

/// `96µs/573µs`, `-` without round trips.
pub fn rtt_cell(f: &Flow) -> String {
    match &f.rtt {
        Some(r) => format!("{}/{}", round_trip(r.p50_us), round_trip(r.p99_us)),
        None => "-".to_string(),
    }
}

/// A round trip of `us` microseconds: µs below a millisecond, then ms, then s.
pub fn round_trip(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

/// The title of the column of mirrored flows' sessions.
pub const MIRROR_TITLE: &str = "mirror";

/// A mirrored flow's session as `KIND:SESSION@SENDER` (`erspan3:17@198.18.9.1`),
/// `-` for the others.
pub fn mirror_cell(f: &Flow) -> String {
    match &f.mirror {
        Some(m) => {
            let kind = match m.kind {
                MirrorKind::Erspan2 => "erspan2",
                MirrorKind::Erspan3 => "erspan3",
                MirrorKind::Gre => "gre",
            };
            format!("{kind}:{}@{}", m.session, m.source)
        }
        None => "-".to_string(),
    }
}

/// `eth1/in`, `eth1/out`; `-` in `analyze`.
fn iface_cell(ifname: Option<&str>, direction: Option<Direction>) -> String {
    match (ifname, direction) {
        (Some(n), Some(Direction::Ingress)) => format!("{n}/in"),
        (Some(n), Some(Direction::Egress)) => format!("{n}/out"),
        (Some(n), None) => n.to_string(),
        (None, _) => "-".to_string(),
    }
}

fn row(f: &Flow) -> [String; 13] {
    let iface = iface_cell(f.ifname.as_deref(), f.direction);
    let inner = match (f.inner_src, f.inner_dst) {
        (Some(s), Some(d)) => format!("{s}→{d}"),
        _ => "-".to_string(),
    };
    [
        iface,
        format!("{}→{}", f.src, f.dst),
        f.vni.map_or_else(|| "-".to_string(), |v| v.to_string()),
        inner,
        // Hex, as the findings, `top`, `events`, tshark and perftest print QPs.
        format!("{:#x}", f.dest_qp),
        f.packets.to_string(),
        human_bytes(f.bytes),
        f.ecn.ce.to_string(),
        format!("{:.1}", f.ce_ratio() * 100.0),
        f.cnps.to_string(),
        format!("{}/{}/{}", f.acks, f.naks, f.rnr_naks),
        f.psn_gaps.to_string(),
        f.last_dscp.to_string(),
    ]
}

/// A size in bytes with an SI prefix (k = 1000, as the rates): exact below 1000, then
/// one decimal below 100 of a unit: `370`, `12840` -> `12.8k`, `500000000` -> `500M`.
pub fn human_bytes(n: u64) -> String {
    const PREFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    if n < 1000 {
        return n.to_string();
    }
    let mut v = n as f64 / 1000.0;
    let mut prefix = 0;
    // 999.5k would print as 1000k: it is 1.0M.
    while v >= 999.5 && prefix + 1 < PREFIXES.len() {
        v /= 1000.0;
        prefix += 1;
    }
    if v < 99.95 {
        format!("{v:.1}{}", PREFIXES[prefix])
    } else {
        format!("{v:.0}{}", PREFIXES[prefix])
    }
}

/// `flows 3; roce 10, roce_in_vxlan 0, ...; parse errors 2 (truncated_bth 2)`.
pub fn counters_line(doc: &Document) -> String {
    let c = &doc.counters;
    let mut s = format!(
        "flows {}; frames: roce {}, roce_in_vxlan {}, vxlan_other {}, other_udp {}, other_ip {}, non_ip {}; parse errors {}",
        doc.flows.len(),
        c.roce,
        c.roce_in_vxlan,
        c.vxlan_other,
        c.other_udp,
        c.other_ip,
        c.non_ip,
        c.parse_errors_total()
    );
    let nonzero: Vec<String> = c
        .parse_errors
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if !nonzero.is_empty() {
        let _ = write!(s, " ({})", nonzero.join(", "));
    }
    if c.mirror_other > 0 || c.mirror_truncated > 0 {
        let _ = write!(
            s,
            "; mirror copies without RoCE: mirror_other {}, mirror_truncated {}",
            c.mirror_other, c.mirror_truncated
        );
    }
    if c.flows_evicted > 0 {
        let _ = write!(s, "; flows evicted {}", c.flows_evicted);
    }
    if c.flow_insert_failed > 0 {
        let _ = write!(s, "; flow inserts failed {}", c.flow_insert_failed);
    }
    let (events, dropped) = (c.events.total(), c.events_dropped.total());
    if events > 0 || dropped > 0 {
        let _ = write!(s, "; events {events}");
        if dropped > 0 {
            let _ = write!(s, " (dropped {dropped})");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{test_flow, Counters, Ecn};

    fn flow(src: &str, qp: u32, bytes: u64, ce: u64, total: u64) -> Flow {
        Flow {
            packets: total,
            bytes,
            ecn: Ecn {
                ect0: total - ce,
                ce,
                ..Default::default()
            },
            cnps: 1,
            acks: 2,
            naks: 3,
            rnr_naks: 4,
            psn_gaps: 5,
            ..test_flow("eth1", src, "198.18.0.2", qp)
        }
    }

    #[test]
    fn sorted_by_ce_ratio_then_bytes() {
        let doc = Document {
            flows: vec![
                flow("198.18.0.1", 1, 100, 0, 10),
                flow("198.18.0.3", 3, 5000, 0, 10),
                flow("198.18.0.4", 4, 10, 5, 10),
                flow("198.18.0.5", 5, 20, 1, 10),
            ],
            counters: Counters::default(),
        };
        let text = render(&doc);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("iface"), "{text}");
        let qps: Vec<&str> = lines[1..5]
            .iter()
            .map(|l| l.split_whitespace().nth(4).unwrap())
            .collect();
        assert_eq!(qps, vec!["0x4", "0x5", "0x3", "0x1"], "{text}");
        assert!(lines[1].contains("50.0"), "{text}");
        assert!(lines[1].contains("2/3/4"), "ACK/NAK/RNR column: {text}");
        assert!(lines[1].contains("eth1/in"));
        assert!(lines[1].contains("198.18.0.4→198.18.0.2"));
        assert!(lines[3].contains("5.0k"), "{text}");
        assert!(lines[0].contains("  bytes(k=1000)  "), "{text}");
        assert!(lines[5].starts_with("flows 4; frames: roce 0"), "{text}");
    }

    #[test]
    fn mirrored_flows_get_a_column_and_the_others_a_dash() {
        use crate::doc::Mirror;
        let plain = flow("198.18.0.1", 1, 100, 0, 10);
        let text = render(&Document {
            flows: vec![plain.clone()],
            counters: Counters::default(),
        });
        assert!(!text.contains(MIRROR_TITLE), "no mirror, no column: {text}");
        let mirrored = Flow {
            mirror: Some(Mirror {
                kind: MirrorKind::Erspan3,
                session: 17,
                source: "198.18.9.1".parse().unwrap(),
            }),
            ..flow("198.18.0.3", 3, 5000, 0, 10)
        };
        let doc = Document {
            flows: vec![plain, mirrored],
            counters: Counters {
                mirror_truncated: 4,
                ..Counters::default()
            },
        };
        let text = render(&doc);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("  mirror"), "{text}");
        assert!(lines[1].ends_with("  erspan3:17@198.18.9.1"), "{text}");
        assert!(lines[2].ends_with("  -"), "{text}");
        assert!(
            lines[3].contains("; mirror copies without RoCE: mirror_other 0, mirror_truncated 4"),
            "{text}"
        );
    }

    #[test]
    fn a_round_trip_column_only_when_a_flow_has_round_trips() {
        let plain = flow("198.18.0.1", 1, 100, 0, 10);
        let text = render(&Document {
            flows: vec![plain.clone()],
            counters: Counters::default(),
        });
        assert!(!text.contains(RTT_TITLE), "{text}");
        let acks = Flow {
            rtt: Some(crate::doc::Rtt {
                samples: 50,
                min_us: 80.0,
                p50_us: 96.4,
                p99_us: 20_441.0,
            }),
            ..flow("198.18.0.3", 3, 5000, 0, 10)
        };
        let text = render(&Document {
            flows: vec![plain, acks],
            counters: Counters::default(),
        });
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("  RTT p50/p99"), "{text}");
        assert!(lines[1].ends_with("  96µs/20.44ms"), "{text}");
        assert!(lines[2].ends_with("  -"), "{text}");
        assert_eq!(round_trip(999.4), "999µs");
        assert_eq!(round_trip(2_500_000.0), "2.50s");
    }

    #[test]
    fn a_retransmission_column_only_when_a_flow_resent() {
        let plain = flow("198.18.0.1", 1, 100, 0, 10);
        let text = render(&Document {
            flows: vec![plain.clone()],
            counters: Counters::default(),
        });
        assert!(!text.contains(RESENT_TITLE), "{text}");
        let resent = Flow {
            retransmitted_packets: 12,
            retransmitted_bytes: 12_000,
            retransmit_timeouts: 3,
            ..flow("198.18.0.3", 3, 5000, 0, 10)
        };
        let text = render(&Document {
            flows: vec![plain, resent],
            counters: Counters::default(),
        });
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("  gaps  resent/TO  dscp"), "{text}");
        // Right-aligned under its title, after the gaps (5).
        assert!(lines[1].contains("  5       12/3  "), "{text}");
        assert!(lines[2].contains("  5        0/0  "), "{text}");
    }

    #[test]
    fn columns_line_up() {
        let mut a = flow("198.18.0.1", 1, 100, 0, 10);
        a.vni = Some(5001);
        a.inner_src = Some("198.19.0.1".parse().unwrap());
        a.inner_dst = Some("198.19.0.2".parse().unwrap());
        let doc = Document {
            flows: vec![a, flow("2001:db8::1", 123456, 1, 0, 1)],
            counters: Counters::default(),
        };
        let text = render(&doc);
        let lines: Vec<Vec<char>> = text.lines().take(3).map(|l| l.chars().collect()).collect();
        // The pkts column is right-aligned under its header.
        let header: String = lines[0].iter().collect();
        let end = header[..header.find("pkts").unwrap()].chars().count() + "pkts".len();
        for l in &lines[1..] {
            assert!(l[end - 1].is_ascii_digit() && l[end] == ' ', "{text}");
        }
        assert!(text.contains("198.19.0.1→198.19.0.2"));
        assert!(text.contains("5001"));
    }

    #[test]
    fn empty_document_and_counters() {
        let mut c = Counters {
            roce: 7,
            flows_evicted: 3,
            ..Default::default()
        };
        c.parse_errors.insert("truncated_bth".into(), 2);
        c.parse_errors.insert("bad_vxlan_flags".into(), 0);
        let text = render(&Document {
            flows: vec![],
            counters: c,
        });
        assert_eq!(
            text,
            "no RoCE flows seen\nflows 0; frames: roce 7, roce_in_vxlan 0, vxlan_other 0, other_udp 0, other_ip 0, non_ip 0; parse errors 2 (truncated_bth 2); flows evicted 3\n"
        );
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(0), "0");
        assert_eq!(human_bytes(999), "999");
        assert_eq!(human_bytes(1000), "1.0k");
        assert_eq!(human_bytes(12840), "12.8k");
        assert_eq!(human_bytes(15910), "15.9k");
        assert_eq!(human_bytes(99_949), "99.9k");
        assert_eq!(human_bytes(99_950), "100k");
        assert_eq!(human_bytes(999_499), "999k");
        assert_eq!(human_bytes(999_500), "1.0M");
        assert_eq!(human_bytes(500_000_000), "500M");
        assert_eq!(human_bytes(u64::MAX), "18.4E");
    }

    #[test]
    fn sizes_are_si_like_the_rates_and_the_title_says_so() {
        let doc = Document {
            flows: vec![flow("198.18.0.1", 0x1e, 15910, 0, 15)],
            counters: Counters::default(),
        };
        let text = render(&doc);
        let lines: Vec<&str> = text.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        let at = header
            .iter()
            .position(|h| *h == "bytes(k=1000)")
            .expect("the byte column");
        assert_eq!(row[at], "15.9k", "{text}");
        assert_eq!(row[4], "0x1e", "QP in hex: {text}");
    }
}
