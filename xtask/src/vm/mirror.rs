//! Judges the `mirror` scenario: RoCE on veth0 mirrored by tc (`matchall` +
//! `mirred`) into six tunnels, ERSPAN II and III over IPv4 and IPv6 and GRE (TEB)
//! with and without a key, towards a collector namespace whose agent runs
//! `run --mirror mir1`.
//!
//! Three decodes of the same copies are compared, session by session (kind, session
//! ID or GRE key, the mirroring address), flow for flow: tshark's of the copies the
//! collector received (captured on mir1 after the agent's XDP program, which passes
//! every frame on), the collector agent's flows, and `roce-agent analyze` of that
//! capture. The copies as sent (captured on mir0, the link's other end) equal, per
//! session, tshark's decode of veth0's own capture: every frame mirrored, none twice. A copy counts as the mirrored frame: its
//! addresses, QP, ECN, DSCP and opcodes, and its length from the Ethernet header
//! on, taken from the IP header's length (what the frame had before any truncation).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use roce_testkit::lab::oracle::{self, Ecn, FlowCounts, FlowId, FlowTable};
use roce_testkit::tshark;
use serde_json::Value;

use super::judge::{self, Compare, Outcome};

/// One mirror session as the agent's `mirror` object names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Session {
    /// "erspan2", "erspan3" or "gre".
    pub kind: String,
    /// ERSPAN session ID or GRE key (0 without a key).
    pub session: u64,
    /// The outer IP source: the mirroring device.
    pub source: String,
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} from {}", self.kind, self.session, self.source)
    }
}

/// The sessions the guest makes (tests/vm/scenarios.sh, MIRRORS): device, kind,
/// session, source, the device's MTU (ERSPAN truncates longer copies to it + 14).
const SESSIONS: [(&str, &str, u64, &str, u32); 7] = [
    ("ers2", "erspan2", 101, "198.19.0.1", 3200),
    ("ers3", "erspan3", 102, "198.19.0.1", 3200),
    ("ers62", "erspan2", 103, "2001:db8:19::1", 3200),
    ("ers63", "erspan3", 104, "2001:db8:19::1", 3200),
    ("gtk", "gre", 105, "198.19.0.1", 3200),
    ("gt0", "gre", 0, "198.19.0.1", 3200),
    ("erst", "erspan2", 106, "198.19.0.1", 200),
];

/// The session whose copies are truncated.
const TRUNCATING: u64 = 106;

/// The collector's interface.
const COLLECTOR: &str = "mir1";
/// Its peer in the mirroring namespace, where the copies are captured as sent.
const COLLECTOR_PEER: &str = "mir0";

/// Flow tables by mirror session.
type SessionTables = BTreeMap<Session, FlowTable>;

/// GRE protocol types: ERSPAN type II, type III, transparent Ethernet bridging.
const GRE_ERSPAN2: u64 = 0x88be;
const GRE_ERSPAN3: u64 = 0x22eb;
const GRE_TEB: u64 = 0x6558;

/// tshark's decode of a collector capture: the RoCE frames inside each mirror
/// session, grouped into flows as the mirrored frames' own (their IP addresses and
/// destination QP), and per session how many copies said they were truncated.
pub fn tshark_sessions(pcap: &Path) -> Result<(SessionTables, BTreeMap<Session, u64>)> {
    const FIELDS: [&str; 20] = [
        "frame.protocols",
        "ip.src",
        "ip.dst",
        "ip.dsfield.dscp",
        "ip.dsfield.ecn",
        "ip.len",
        "ipv6.src",
        "ipv6.dst",
        "ipv6.tclass.dscp",
        "ipv6.tclass.ecn",
        "ipv6.plen",
        "gre.proto",
        "gre.key",
        "erspan.version",
        "erspan.spanid",
        "erspan.truncated",
        "udp.srcport",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.aeth.syndrome",
    ];
    let rows = tshark::Fields::new(&FIELDS)
        .filter("infiniband")
        .run(pcap)?;
    let mut out = SessionTables::new();
    let mut truncated = BTreeMap::<Session, u64>::new();
    for row in &rows {
        let line = &row.line;
        let num = |s: &str| tshark::number(s).with_context(|| format!("in {line:?}"));
        let protocols = row.first(0).unwrap_or_default();
        let layers: Vec<&str> = protocols.split(':').collect();
        // The IP layers, outermost first, each as (is IPv6, index among its family).
        let (mut n4, mut n6) = (0usize, 0usize);
        let ips: Vec<(bool, usize)> = layers
            .iter()
            .filter_map(|p| match *p {
                "ip" => {
                    n4 += 1;
                    Some((false, n4 - 1))
                }
                "ipv6" => {
                    n6 += 1;
                    Some((true, n6 - 1))
                }
                _ => None,
            })
            .collect();
        let [outer, roce] = ips.as_slice() else {
            bail!("a RoCE frame in the collector capture without exactly two IP layers: {line:?}");
        };
        let field = |c: usize, i: usize| -> Result<&str> {
            row.all(c)
                .get(i)
                .map(String::as_str)
                .ok_or_else(|| anyhow!("field {} missing in {line:?}", FIELDS[c]))
        };
        // (src, dst, dscp, ecn) of an IP layer; its length from its Ethernet header
        // on (IPv4 total length or IPv6 payload length + 40, + 14).
        let ip = |(v6, i): (bool, usize)| -> Result<(String, String, u64, u64, u64)> {
            let base = if v6 { 6 } else { 1 };
            let len = if v6 {
                num(field(10, i)?)? + 40
            } else {
                num(field(5, i)?)?
            };
            Ok((
                norm_ip(field(base, i)?),
                norm_ip(field(base + 1, i)?),
                num(field(base + 2, i)?)?,
                num(field(base + 3, i)?)?,
                len,
            ))
        };
        let (source, ..) = ip(*outer)?;
        let (src, dst, dscp, ecn, ip_len) = ip(*roce)?;
        // 802.1Q tags between the mirrored frame's Ethernet header and its IP header.
        let last_eth = layers.iter().rposition(|p| *p == "eth").unwrap_or(0);
        let tags = layers[last_eth..].iter().filter(|p| **p == "vlan").count() as u64;
        let proto = num(row.first(11).ok_or_else(|| anyhow!("no GRE in {line:?}"))?)?;
        let (kind, session) = match proto {
            GRE_ERSPAN2 | GRE_ERSPAN3 => {
                let version = num(row.first(13).unwrap_or("-1"))?;
                let kind = match (proto, version) {
                    (GRE_ERSPAN2, 1) => "erspan2",
                    (GRE_ERSPAN3, 2) => "erspan3",
                    _ => bail!("GRE type {proto:#x} with ERSPAN version {version}: {line:?}"),
                };
                let id = row
                    .first(14)
                    .ok_or_else(|| anyhow!("ERSPAN without a session ID: {line:?}"))?;
                (kind, num(id)?)
            }
            GRE_TEB => ("gre", row.first(12).map(num).transpose()?.unwrap_or(0)),
            other => bail!("GRE type {other:#x} in the collector capture: {line:?}"),
        };
        let opcode = num(row.last(17).ok_or_else(|| anyhow!("no opcode: {line:?}"))?)?;
        let id = FlowId {
            src,
            dst,
            vni: None,
            inner_src: None,
            inner_dst: None,
            dest_qp: num(row.last(18).ok_or_else(|| anyhow!("no QP: {line:?}"))?)? as u32,
        };
        let family = if roce.0 { "ipv6" } else { "ipv4" };
        let session = Session {
            kind: kind.to_string(),
            session,
            source,
        };
        if row.first(15).map(num).transpose()?.unwrap_or(0) != 0 {
            *truncated.entry(session.clone()).or_default() += 1;
        }
        let c = out
            .entry(session)
            .or_default()
            .entry(id)
            .or_insert_with(|| FlowCounts {
                family: family.to_string(),
                ..Default::default()
            });
        c.packets += 1;
        c.bytes += 14 + 4 * tags + ip_len;
        c.sport = num(row
            .last(16)
            .ok_or_else(|| anyhow!("no UDP port: {line:?}"))?)? as u16;
        add_ecn(&mut c.ecn, ecn);
        c.last_dscp = dscp as u8;
        match opcode {
            128 | 129 => c.cnps += 1,
            17 | 177 => {
                if let Some(s) = row.last(19) {
                    match num(s)? >> 5 {
                        0 => c.acks += 1,
                        1 => c.rnr_naks += 1,
                        3 => c.naks += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok((out, truncated))
}

fn add_ecn(e: &mut Ecn, codepoint: u64) {
    match codepoint & 3 {
        0 => e.not_ect += 1,
        1 => e.ect1 += 1,
        2 => e.ect0 += 1,
        _ => e.ce += 1,
    }
}

fn norm_ip(s: &str) -> String {
    s.parse::<std::net::IpAddr>()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| s.to_string())
}

/// A flow document's mirrored flows (`mirror` not null) by session; and the flows
/// without a mirror session, counted.
fn doc_sessions(doc: &Value) -> Result<(SessionTables, usize)> {
    let flows = doc["flows"]
        .as_array()
        .ok_or_else(|| anyhow!("a document without a flows array"))?;
    let mut sessions = Vec::<Session>::new();
    let mut plain = 0;
    for f in flows {
        let m = &f["mirror"];
        if m.is_null() {
            plain += 1;
            continue;
        }
        let s = session_of(m)?;
        if !sessions.contains(&s) {
            sessions.push(s);
        }
    }
    let mut out = SessionTables::new();
    for s in sessions {
        let table =
            oracle::flows_from_doc(doc, |f| session_of(&f["mirror"]).is_ok_and(|fs| fs == s))
                .with_context(|| format!("the flows of {s}"))?;
        out.insert(s, table);
    }
    Ok((out, plain))
}

fn session_of(m: &Value) -> Result<Session> {
    Ok(Session {
        kind: m["kind"]
            .as_str()
            .ok_or_else(|| anyhow!("mirror without kind: {m}"))?
            .to_string(),
        session: m["session"]
            .as_u64()
            .ok_or_else(|| anyhow!("mirror without session: {m}"))?,
        source: norm_ip(
            m["source"]
                .as_str()
                .ok_or_else(|| anyhow!("mirror without source: {m}"))?,
        ),
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The sessions the guest made, as `Session`s.
fn expected_sessions() -> Vec<Session> {
    SESSIONS
        .iter()
        .map(|(_, kind, session, source, _)| Session {
            kind: kind.to_string(),
            session: *session,
            source: norm_ip(source),
        })
        .collect()
}

/// `source`'s tables, session by session, against tshark's.
fn compare_sessions(source: &str, got: &SessionTables, wire: &SessionTables, o: &mut Outcome) {
    for (s, w) in wire {
        let empty = FlowTable::new();
        let g = got.get(s).unwrap_or(&empty);
        judge::compare(&format!("{source}, {s}"), g, w, Compare::Exact, o);
    }
    for s in got.keys().filter(|s| !wire.contains_key(*s)) {
        o.problem(format!(
            "{source}: session {s} ({} flows) not in the capture",
            got[s].len()
        ));
    }
}

pub fn mirror(dir: &Path, o: &mut Outcome) -> Result<()> {
    // The guest's list of sessions is the judge's.
    let made = std::fs::read_to_string(dir.join("mirrors.txt")).unwrap_or_default();
    let made: Vec<Vec<&str>> = made
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|w: &Vec<&str>| !w.is_empty())
        .collect();
    let want: Vec<Vec<String>> = SESSIONS
        .iter()
        .map(|(d, k, s, _, mtu)| vec![d.to_string(), k.to_string(), s.to_string(), mtu.to_string()])
        .collect();
    o.figures += 1;
    if made != want {
        o.problem(format!(
            "the guest made the sessions {made:?}, the judge expects {want:?}"
        ));
    }

    let veth0 = oracle::tshark_flows(&dir.join("veth0.pcap"))?;
    o.frames = veth0.values().map(|c| c.packets).sum();
    let capture_dropped =
        |ifname: &str| judge::tcpdump_dropped(&dir.join(format!("tcpdump-{ifname}.txt")));
    // veth0's capture holds RoCE only: whatever it lost is a RoCE frame.
    let capture_lost = capture_dropped("veth0");
    if capture_lost > 0 {
        o.problem(format!(
            "tcpdump on veth0 dropped {capture_lost} frames: the capture is short, the comparison void"
        ));
    }
    let (sent, _) = tshark_sessions(&dir.join(format!("{COLLECTOR_PEER}.pcap")))?;
    let (wire, truncated) = tshark_sessions(&dir.join(format!("{COLLECTOR}.pcap")))?;
    // Every session carried every RoCE frame of veth0, once.
    let problems_before = o.problems.len();
    for s in expected_sessions() {
        o.figures += 1;
        let Some(t) = sent.get(&s) else {
            o.problem(format!("no copy of session {s} was sent to the collector"));
            continue;
        };
        let d = oracle::differences("veth0", &veth0, &s.to_string(), t);
        if !d.is_empty() {
            o.problem(format!(
                "session {s} did not carry veth0's RoCE frames as they were: {}",
                d.join("; ")
            ));
        }
    }
    let copies =
        |t: &SessionTables| -> u64 { t.values().flat_map(|t| t.values()).map(|c| c.packets).sum() };
    // What the collector link lost (veth drops a frame when its peer's XDP ring is
    // full) is the kernel's, not the agent's: the agent is judged on what mir1
    // received. The loss must be the veth's count, though.
    let lost = copies(&sent).saturating_sub(copies(&wire));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let dropped = veth_tx_dropped(&read("link-stats-after.txt"), COLLECTOR_PEER)
        .zip(veth_tx_dropped(
            &read("link-stats-before.txt"),
            COLLECTOR_PEER,
        ))
        .map(|(a, b)| a.saturating_sub(b));
    // The copies' captures also hold the copies of veth0's other frames (ARP, ND,
    // perftest's TCP), and tcpdump's loss report does not say which frames it lost.
    // A capture whose RoCE copies are all there lost none of those compared: on mir0,
    // every session equal to veth0; on mir1, no more missing than the veth dropped (a
    // RoCE copy mir1's capture lost beside those is still one the collector's XDP
    // counted, ahead of the capture: the exact comparison below finds it).
    let sent_complete = o.problems.len() == problems_before;
    let received_complete = sent_complete && lost <= dropped.unwrap_or(0);
    for (ifname, complete, why) in [
        (
            COLLECTOR_PEER,
            sent_complete,
            "every session holds veth0's RoCE frames",
        ),
        (
            COLLECTOR,
            received_complete,
            "no more RoCE copies are missing than the veth dropped, and the collector's counts must equal the capture",
        ),
    ] {
        let capture_lost = capture_dropped(ifname);
        if capture_lost == 0 {
            continue;
        }
        if complete {
            o.notes.push(format!(
                "tcpdump on {ifname} lost {capture_lost} frames outside the comparison: {why}"
            ));
        } else {
            o.problem(format!(
                "tcpdump on {ifname} dropped {capture_lost} frames: the capture is short, the comparison void"
            ));
        }
    }
    o.notes.push(format!(
        "veth0: {} RoCE frames in {} flows; copies sent on {COLLECTOR_PEER}: {} in {} sessions; \
         received on {COLLECTOR}: {}, truncated (T bit) {:?}",
        o.frames,
        veth0.len(),
        copies(&sent),
        sent.len(),
        copies(&wire),
        truncated
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>(),
    ));
    // The truncating session did truncate (and only it): else the original-length
    // rule went untested.
    o.figures += 1;
    if !truncated.keys().all(|s| s.session == TRUNCATING)
        || !truncated.keys().any(|s| s.session == TRUNCATING)
    {
        o.problem(format!(
            "truncated copies {truncated:?}: expected some in session {TRUNCATING} and none elsewhere"
        ));
    }
    if lost > 0 || dropped.is_some_and(|d| d > 0) {
        o.notes.push(format!(
            "the collector link lost {lost} copies; {COLLECTOR_PEER} counted {} TX drops (its peer's XDP ring full)",
            dropped.map_or("?".to_string(), |d| d.to_string())
        ));
    }
    o.figures += 1;
    if copies(&wire) > copies(&sent) || dropped.is_some_and(|d| lost > d) {
        o.problem(format!(
            "{COLLECTOR} received {} RoCE copies, {COLLECTOR_PEER} sent {}: more lost than the veth dropped ({dropped:?})",
            copies(&wire),
            copies(&sent)
        ));
    }

    collector(dir, &wire, o)?;
    analyze(dir, &wire, o)?;
    loss_and_latency(dir, o)
}

/// Loss and latency at the mirroring port (the sessions copy both directions of
/// veth0): every session's flows have round trips, none was left unpaired, and each
/// flow's `capture_gaps` is at most `analyze`'s of the copies the collector received, the
fn loss_and_latency(dir: &Path, o: &mut Outcome) -> Result<()> {
    let (Ok(live), Ok(offline)) = (
        read_json(&dir.join("flows.json")),
        read_json(&dir.join("analyze.json")),
    ) else {
        // Said already by `collector` and `analyze`.
        return Ok(());
    };
    let mut samples: BTreeMap<Session, u64> = BTreeMap::new();
    let mut live_gaps = BTreeMap::new();
    for f in live["flows"].as_array().into_iter().flatten() {
        let Ok(s) = session_of(&f["mirror"]) else {
            continue;
        };
        *samples.entry(s.clone()).or_default() += f["rtt"]["samples"].as_u64().unwrap_or(0);
        live_gaps.insert(gap_key(&s, f), f["capture_gaps"].clone());
    }
    let mut offline_gaps = BTreeMap::new();
    for f in offline["flows"].as_array().into_iter().flatten() {
        if let Ok(s) = session_of(&f["mirror"]) {
            offline_gaps.insert(gap_key(&s, f), f["capture_gaps"].clone());
        }
    }
    for s in expected_sessions() {
        o.figures += 1;
        let n = samples.get(&s).copied().unwrap_or(0);
        if n == 0 {
            o.problem(format!("{s}: the collector measured no round trip"));
        }
    }
    o.notes.push(format!(
        "collector round trips by session: {}",
        samples
            .iter()
            .map(|(s, n)| format!("{} {}: {n}", s.kind, s.session))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    o.figures += 1;
    if live["counters"]["rtt_unpaired"] != serde_json::json!({"shared_psn": 0, "other_qp": 0}) {
        o.problem(format!(
            "the collector left round trips unpaired: {}",
            live["counters"]["rtt_unpaired"]
        ));
    }
    // The live watch keeps one gap per host pair and session: a gap that a newer one
    // displaced stays undecided there (counted), where `analyze` may decide it. So each
    // flow counts at most `analyze`'s, and all of them together miss at most what the
    // collector let go.
    let undecided = live["counters"]["capture_gaps_undecided"].as_u64();
    let mut missed = 0;
    for (k, want) in &offline_gaps {
        o.figures += 1;
        let got = live_gaps.get(k).cloned().unwrap_or(Value::Null);
        match (got.as_u64(), want.as_u64()) {
            (Some(live), Some(offline)) if live <= offline => missed += offline - live,
            _ => o.problem(format!("{k}: capture_gaps live {got}, analyze {want}")),
        }
    }
    o.figures += 1;
    o.notes.push(format!(
        "capture gaps decided by analyze and not live: {missed}; gaps the collector left undecided: {}",
        undecided.map_or("none said".to_string(), |u| u.to_string())
    ));
    if undecided.is_none_or(|u| missed > u) {
        o.problem(format!(
            "live capture_gaps miss {missed} of analyze's, more than the {undecided:?} gaps the collector left undecided"
        ));
    }
    Ok(())
}

/// A mirrored flow as one line: its session and key.
fn gap_key(s: &Session, f: &Value) -> String {
    format!(
        "{s} {}>{} qp {}",
        norm_ip(f["src"].as_str().unwrap_or("?")),
        norm_ip(f["dst"].as_str().unwrap_or("?")),
        f["dest_qp"]
    )
}

/// The collector agent: only mirrored flows, all on the collector's interface, equal
/// to tshark's; and the interface's visibility in /metrics.
fn collector(dir: &Path, wire: &SessionTables, o: &mut Outcome) -> Result<()> {
    if !dir.join("flows.json").exists() {
        let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        let why = log
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("no error in its log");
        o.problem(format!(
            "the collector agent did not start: {}",
            why.chars().take(400).collect::<String>()
        ));
        return Ok(());
    }
    let doc = read_json(&dir.join("flows.json"))?;
    let (agent, plain) = doc_sessions(&doc)?;
    o.figures += 1;
    if plain > 0 {
        o.problem(format!(
            "the collector agent has {plain} flows without a mirror session"
        ));
    }
    let elsewhere: Vec<String> = doc["flows"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| f["ifname"] != COLLECTOR || f["direction"] != "ingress")
                .map(|f| format!("{} {}", f["ifname"], f["direction"]))
                .collect()
        })
        .unwrap_or_default();
    o.figures += 1;
    if !elsewhere.is_empty() {
        o.problem(format!(
            "collector flows not on {COLLECTOR} ingress: {}",
            elsewhere.join(", ")
        ));
    }
    compare_sessions("agent", &agent, wire, o);
    visibility(dir, o);
    Ok(())
}

/// `roce-agent analyze` of the capture of the copies: the same tables as tshark's.
fn analyze(dir: &Path, wire: &SessionTables, o: &mut Outcome) -> Result<()> {
    let rc = std::fs::read_to_string(dir.join("analyze.rc")).unwrap_or_default();
    o.figures += 1;
    match read_json(&dir.join("analyze.json")) {
        Err(e) => o.problem(format!(
            "analyze (exit {}): {e:#}: {}",
            rc.trim(),
            std::fs::read_to_string(dir.join("analyze.err"))
                .unwrap_or_default()
                .trim()
        )),
        Ok(doc) => {
            let (analyzed, plain) = doc_sessions(&doc)?;
            if plain > 0 {
                o.problem(format!(
                    "analyze has {plain} flows without a mirror session"
                ));
            }
            o.notes.push(format!(
                "analyze (exit {}): {} flows, {} of them mirrored; frames by class: roce {}, mirror_other {}, other_ip {}",
                rc.trim(),
                doc["flows"].as_array().map_or(0, Vec::len),
                analyzed.values().map(FlowTable::len).sum::<usize>(),
                doc["counters"]["roce"],
                doc["counters"]["mirror_other"],
                doc["counters"]["other_ip"]
            ));
            let before = o.flows;
            compare_sessions("analyze", &analyzed, wire, o);
            // Flows are the agent's: the analyze comparison is in the figures.
            o.flows = before;
            if !doc["icrc_errors"].is_null() && doc["icrc_errors"] != 0 {
                o.notes
                    .push(format!("analyze: icrc_errors {}", doc["icrc_errors"]));
            }
        }
    }
    Ok(())
}

/// The TX `dropped` counter of IFNAME in `ip -s -s link show` output: the fourth
/// figure of the line after the first "TX:" header of the interface's block.
fn veth_tx_dropped(text: &str, ifname: &str) -> Option<u64> {
    let mut lines = text.lines().skip_while(|l| {
        !l.split_whitespace()
            .nth(1)
            .is_some_and(|n| n.starts_with(&format!("{ifname}@")))
    });
    lines.find(|l| l.trim_start().starts_with("TX:"))?;
    lines.next()?.split_whitespace().nth(3)?.parse().ok()
}

/// `roce_visibility{ifname="mir1",mode="mirror"}` in the collector's /metrics.
fn visibility(dir: &Path, o: &mut Outcome) {
    let metrics = std::fs::read_to_string(dir.join("flows.metrics")).unwrap_or_default();
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("roce_visibility{"))
        .collect();
    o.figures += 1;
    let ok = lines.iter().any(|l| {
        l.contains(&format!("ifname=\"{COLLECTOR}\""))
            && l.contains("mode=\"mirror\"")
            && l.trim_end().ends_with(" 1")
    });
    if !ok {
        o.problem(format!(
            "/metrics lacks roce_visibility{{ifname=\"{COLLECTOR}\",mode=\"mirror\"}} 1: {lines:?}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_flows_group_by_session_and_unmirrored_ones_are_counted() -> Result<()> {
        let flow = |m: Value, qp: u64| {
            serde_json::json!({
                "src": "198.18.0.1", "dst": "198.18.0.2", "dest_qp": qp, "sport": 49152,
                "packets": 3, "bytes": 300, "cnps": 0, "acks": 1, "naks": 0, "rnr_naks": 0,
                "last_dscp": 26, "family": "ipv4",
                "ecn": {"not_ect": 0, "ect1": 0, "ect0": 3, "ce": 0},
                "mirror": m
            })
        };
        let ers = serde_json::json!({"kind": "erspan2", "session": 101, "source": "198.19.0.1"});
        let gre = serde_json::json!({"kind": "gre", "session": 0, "source": "2001:db8:19:0::1"});
        let doc = serde_json::json!({"flows": [
            flow(ers.clone(), 17), flow(ers, 18), flow(gre, 17), flow(Value::Null, 17)
        ]});
        let (t, plain) = doc_sessions(&doc)?;
        assert_eq!(plain, 1);
        assert_eq!(t.len(), 2);
        let g = Session {
            kind: "gre".into(),
            session: 0,
            source: "2001:db8:19::1".into(),
        };
        assert_eq!(t[&g].len(), 1);
        Ok(())
    }

    #[test]
    fn the_veth_tx_drops_are_read_from_ip_link_statistics() {
        let text = "9: mir0@if7: <BROADCAST,UP> mtu 3400 qdisc noqueue\n\
            link/ether be:6c:6b:dc:4b:ee brd ff:ff:ff:ff:ff:ff\n\
            RX:  bytes packets errors dropped  missed   mcast\n\
                 16974      80      0       5       0       0\n\
            TX:  bytes packets errors dropped carrier collsns\n\
              10427040    6923      0     137       0       0\n\
            7: mir1@if9: <BROADCAST,UP> mtu 3400\n\
            TX:  bytes packets errors dropped carrier collsns\n\
                 16974      80      0       0       0       0\n";
        assert_eq!(veth_tx_dropped(text, "mir0"), Some(137));
        assert_eq!(veth_tx_dropped(text, "mir1"), Some(0));
        assert_eq!(veth_tx_dropped(text, "mir2"), None);
    }

    #[test]
    fn the_judges_sessions_are_distinct() {
        let s = expected_sessions();
        for (i, a) in s.iter().enumerate() {
            assert!(!s[i + 1..].contains(a), "{a} twice");
        }
    }
}
