//! Judges a boot's results on the host, after the guest powered off: each
//! scenario's agent flows against tshark's decode of the captures taken in the
//! guest (`roce_testkit::lab::oracle`), flow for flow, plus what its check adds
//! (the DSCP on the wire, the loss figures, the lifecycle's own checks). The
//! scenarios with checks of their own are judged in `host` (RDMA devices), `qp` (the
//! QP table), `mirror` (mirror sessions) and `overhead`.
//!
//! Where the agent's flows meet the captures: a capture on veth0 sees veth0's
//! egress (frames from 198.18.0.1, after tc egress) and its ingress (frames from
//! 198.18.0.2, as XDP saw them); the same on veth1 with the addresses swapped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use roce_testkit::lab::oracle::{self, FlowCounts, FlowTable};
use roce_testkit::tshark;

use super::Scenario;

/// The checks a scenario may name in scenarios.list.
pub const CHECKS: [&str; 10] = [
    "flows",
    "qos",
    "netem",
    "lifecycle",
    "rnic_metrics",
    "check_rdma",
    "qp_table",
    "mirror",
    "rtt",
    "overhead",
];

const ADDR0: &str = "198.18.0.1";
const ADDR1: &str = "198.18.0.2";
/// The lossless class of the default policy, and the CNPs' DSCP.
const ROCE_DSCP: u64 = 26;
const CNP_DSCP: u64 = 48;

/// What one scenario came to.
#[derive(Debug, Default)]
pub struct Outcome {
    pub name: String,
    /// The guest's exit code of the scenario (None: it did not run).
    pub rc: Option<i32>,
    pub secs: Option<f64>,
    /// RoCE frames in the veth0 capture.
    pub frames: u64,
    /// Agent flows compared.
    pub flows: usize,
    /// Figures compared (a counter of a flow, a frame's DSCP, a check).
    pub figures: u64,
    pub mismatches: u64,
    /// What did not agree, one line each.
    pub problems: Vec<String>,
    /// Figures worth reading beside the verdict (loss counters, attach mode).
    pub notes: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.rc == Some(0) && self.mismatches == 0 && self.problems.is_empty()
    }

    pub(super) fn problem(&mut self, line: String) {
        self.mismatches += 1;
        self.problems.push(line);
    }
}

/// Judges every scenario of `plan` in `out` (the share's out/).
pub fn judge_all(out: &Path, plan: &[Scenario]) -> Result<Vec<Outcome>> {
    let secs = scenario_seconds(out);
    let mut all = Vec::new();
    for s in plan {
        let dir = out.join(&s.name);
        let mut o = Outcome {
            name: s.name.clone(),
            rc: std::fs::read_to_string(dir.join("rc"))
                .ok()
                .and_then(|t| t.trim().parse().ok()),
            secs: secs.get(&s.name).copied(),
            ..Default::default()
        };
        if o.rc.is_none() {
            o.problems.push("did not run".to_string());
        } else if o.rc != Some(0) && !dir.join("flows.json").exists() {
            // Failed before the agent served its flows: nothing to judge.
        } else if let Err(e) = judge(&dir, &s.check, &mut o) {
            o.problem(format!("could not judge: {e:#}"));
        }
        if o.rc.is_some_and(|rc| rc != 0) {
            o.problems.push(format!(
                "the scenario failed in the guest (exit {}); its log ends:\n{}",
                o.rc.unwrap_or_default(),
                super::qemu::tail(&dir.join("scenario.log"), 8)
            ));
        }
        all.push(o);
    }
    Ok(all)
}

/// `END name rc secs` lines of the guest's progress file.
fn scenario_seconds(out: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(out.join("progress")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["END", name, _, secs] => Some((name.to_string(), secs.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

fn judge(dir: &Path, check: &str, o: &mut Outcome) -> Result<()> {
    // The scenarios without captures, judged on what they left.
    match check {
        "rnic_metrics" => return super::host::rnic_metrics(dir, o),
        "check_rdma" => return super::host::check_rdma(dir, o),
        "qp_table" => return super::qp::qp_table(dir, o),
        "mirror" => return super::mirror::mirror(dir, o),
        "overhead" => return super::overhead::judge(dir, o),
        "rtt" => return super::rtt::netem_delay(dir, o),
        _ => {}
    }
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("flows.json")).context("reading the agent's flows.json")?,
    )
    .context("flows.json is not JSON")?;
    let agent = |ifname: &str, direction: &str| {
        oracle::flows_from_doc(&doc, |f| {
            f.get("ifname").and_then(|v| v.as_str()) == Some(ifname)
                && f.get("direction").and_then(|v| v.as_str()) == Some(direction)
        })
    };
    let w0 = oracle::tshark_flows(&dir.join("veth0.pcap"))?;
    let w1 = oracle::tshark_flows(&dir.join("veth1.pcap"))?;
    o.frames = w0.values().map(|c| c.packets).sum();
    for ifname in ["veth0", "veth1"] {
        let dropped = tcpdump_dropped(&dir.join(format!("tcpdump-{ifname}.txt")));
        if dropped > 0 {
            o.problem(format!(
                "tcpdump on {ifname} dropped {dropped} frames: the capture is short, the comparison void"
            ));
        }
    }
    // veth0 egress is compared exactly but where netem drops after tc egress.
    let veth0_egress = if check == "netem" {
        Compare::AgentSeesMore
    } else {
        Compare::Exact
    };
    let a0e = agent("veth0", "egress")?;
    compare("veth0 egress", &a0e, &from(&w0, ADDR0), veth0_egress, o);
    compare(
        "veth0 ingress",
        &agent("veth0", "ingress")?,
        &from(&w0, ADDR1),
        Compare::Exact,
        o,
    );
    let a1e = agent("veth1", "egress")?;
    compare("veth1 egress", &a1e, &from(&w1, ADDR1), Compare::Exact, o);
    let a1i = agent("veth1", "ingress")?;
    compare("veth1 ingress", &a1i, &from(&w1, ADDR0), Compare::Exact, o);
    match check {
        "qos" => {
            for ifname in ["veth0", "veth1"] {
                wire_dscp(&dir.join(format!("{ifname}.pcap")), ifname, o)?;
            }
            let metrics = std::fs::read_to_string(dir.join("flows.metrics")).unwrap_or_default();
            for l in metrics
                .lines()
                .filter(|l| l.starts_with("roce_qos_packets_total"))
            {
                o.notes.push(l.to_string());
            }
        }
        "netem" => netem(dir, &a0e, &from(&w0, ADDR0), &a1i, o)?,
        "lifecycle" => lifecycle(dir, o),
        _ => {}
    }
    Ok(())
}

/// The flows of `table` sent from `src`.
fn from(table: &FlowTable, src: &str) -> FlowTable {
    table
        .iter()
        .filter(|(id, _)| id.src == src)
        .map(|(id, c)| (id.clone(), c.clone()))
        .collect()
}

/// The frames tcpdump lost, from its exit report: those "dropped by kernel" (its
/// ring was full) and those "received by filter" but never "captured" (still in
/// the ring when it was stopped).
pub(super) fn tcpdump_dropped(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let figure = |suffix: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_suffix(suffix))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    let captured = figure(" packets captured");
    let received = figure(" packets received by filter");
    figure(" packets dropped by kernel") + received.saturating_sub(captured)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Compare {
    /// Every figure equal.
    Exact,
    /// The agent counts before a loss the capture comes after: packets and bytes
    /// at least the capture's, the rest not compared.
    AgentSeesMore,
}

/// The figures of one flow compared, by name.
fn figures(c: &FlowCounts) -> [(&'static str, u64); 12] {
    [
        ("packets", c.packets),
        ("bytes", c.bytes),
        ("ecn.not_ect", c.ecn.not_ect),
        ("ecn.ect1", c.ecn.ect1),
        ("ecn.ect0", c.ecn.ect0),
        ("ecn.ce", c.ecn.ce),
        ("cnps", c.cnps),
        ("acks", c.acks),
        ("naks", c.naks),
        ("rnr_naks", c.rnr_naks),
        ("last_dscp", u64::from(c.last_dscp)),
        ("sport", u64::from(c.sport)),
    ]
}

pub(super) fn compare(
    where_: &str,
    agent: &FlowTable,
    wire: &FlowTable,
    how: Compare,
    o: &mut Outcome,
) {
    o.flows += agent.len();
    for (id, a) in agent {
        let Some(w) = wire.get(id) else {
            o.problem(format!(
                "{where_}: flow {id} counted by the agent, not on the wire"
            ));
            continue;
        };
        for ((name, av), (_, wv)) in figures(a).into_iter().zip(figures(w)) {
            let ok = match how {
                Compare::Exact => av == wv,
                Compare::AgentSeesMore => {
                    if name != "packets" && name != "bytes" {
                        continue;
                    }
                    av >= wv
                }
            };
            o.figures += 1;
            if !ok {
                o.problem(format!(
                    "{where_}: flow {id}: {name} agent {av}, tshark {wv}"
                ));
            }
        }
    }
    for id in wire.keys().filter(|id| !agent.contains_key(*id)) {
        o.problem(format!(
            "{where_}: flow {id} on the wire, not counted by the agent"
        ));
    }
}

/// Every RoCE frame of a capture carries the policy's DSCP (CNPs theirs).
fn wire_dscp(pcap: &Path, ifname: &str, o: &mut Outcome) -> Result<()> {
    let rows = tshark::Fields::new(&["ip.dsfield.dscp", "infiniband.bth.opcode"])
        .filter("infiniband")
        .run(pcap)?;
    let mut wrong = BTreeMap::<u64, u64>::new();
    for row in &rows {
        let dscp = tshark::number(row.first(0).unwrap_or("-1"))?;
        let opcode = tshark::number(row.last(1).unwrap_or("0"))?;
        let want = if opcode == 0x81 { CNP_DSCP } else { ROCE_DSCP };
        o.figures += 1;
        if dscp != want {
            *wrong.entry(dscp).or_default() += 1;
        }
    }
    for (dscp, n) in wrong {
        o.mismatches += n;
        o.problems.push(format!(
            "{ifname}: {n} RoCE frames on the wire with DSCP {dscp}, not the policy's"
        ));
    }
    o.notes.push(format!(
        "{ifname}: {} RoCE frames' DSCP checked",
        rows.len()
    ));
    Ok(())
}

/// Per-port counters of `rdma statistic show` (`link DEV/PORT name value ...`).
fn rdma_stats(path: &Path) -> BTreeMap<String, BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() != Some(&"link") || w.len() < 2 {
            continue;
        }
        let dev = w[1].split('/').next().unwrap_or_default().to_string();
        let counters = w[2..]
            .chunks(2)
            .filter_map(|p| Some((p.first()?.to_string(), p.get(1)?.parse().ok()?)))
            .collect();
        out.insert(dev, counters);
    }
    out
}

/// The loss figures of the netem scenario: requests lost on veth0 after tc egress
/// (agent's veth0 egress minus the capture), rxe1's out-of-sequence requests, the
/// agent's PSN gaps at veth1 ingress (what rxe1 received), NAKs.
fn netem(
    dir: &Path,
    agent_egress: &FlowTable,
    wire_egress: &FlowTable,
    agent_rx: &FlowTable,
    o: &mut Outcome,
) -> Result<()> {
    let before = rdma_stats(&dir.join("rdma-before.txt"));
    let after = rdma_stats(&dir.join("rdma-after.txt"));
    let delta = |dev: &str, name: &str| {
        let get = |m: &BTreeMap<String, BTreeMap<String, u64>>| {
            m.get(dev).and_then(|c| c.get(name)).copied().unwrap_or(0)
        };
        get(&after).saturating_sub(get(&before))
    };
    let sent: u64 = agent_egress.values().map(|c| c.packets).sum();
    let seen: u64 = wire_egress.values().map(|c| c.packets).sum();
    let lost = sent.saturating_sub(seen);
    let gaps: u64 = agent_rx.values().filter_map(|c| c.psn_gaps).sum();
    let oos = delta("rxe1", "out_of_seq_request");
    let naks = {
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("flows.json"))?)?;
        let t = oracle::flows_from_doc(&doc, |f| {
            f.get("ifname").and_then(|v| v.as_str()) == Some("veth1")
                && f.get("direction").and_then(|v| v.as_str()) == Some("egress")
        })?;
        t.values().map(|c| c.naks).sum::<u64>()
    };
    // The requester's go-backs: rxe0's completer retries once per NAK it takes and
    // per timeout; the agent sees the NAKs arrive on veth0 and counts the go-backs
    // that followed none as timeouts (veth0 egress).
    let (resent, timeouts, naks_in) = {
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("flows.json"))?)?;
        let sum = |direction: &str, field: &str| -> u64 {
            doc["flows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f["ifname"] == "veth0" && f["direction"] == direction)
                .filter_map(|f| f[field].as_u64())
                .sum()
        };
        (
            sum("egress", "retransmitted_packets"),
            sum("egress", "retransmit_timeouts"),
            sum("ingress", "naks"),
        )
    };
    let retries = delta("rxe0", "completer_retry_err");
    o.notes.push(format!(
        "requester rxe0 on veth0: agent retransmitted_packets {resent}, retransmit_timeouts {timeouts}, NAKs in {naks_in}; rxe0 completer_retry_err {retries}"
    ));
    let netem = std::fs::read_to_string(dir.join("netem.txt")).unwrap_or_default();
    let netem_dropped = netem
        .split_whitespace()
        .skip_while(|w| w.trim_start_matches('(') != "dropped")
        .nth(1)
        .and_then(|n| n.trim_end_matches(',').parse::<u64>().ok());
    o.notes.push(format!(
        "lost after tc egress {lost} (netem dropped {}, all protocols); agent psn_gaps {gaps}, naks {naks}; \
         rxe1 out_of_seq_request {oos}, duplicate_request {}; rxe0 rcvd_seq_err {}, completer_retry_err {}",
        netem_dropped.map_or("?".to_string(), |n| n.to_string()),
        delta("rxe1", "duplicate_request"),
        delta("rxe0", "rcvd_seq_err"),
        delta("rxe0", "completer_retry_err"),
    ));
    let mut require = |ok: bool, what: &str| {
        o.figures += 1;
        if !ok {
            o.problem(format!("loss figures: {what}"));
        }
    };
    require(
        lost > 0,
        "netem dropped no RoCE request: the loss path was not exercised",
    );
    require(
        netem_dropped.is_none_or(|d| lost <= d),
        "the agent counts more frames lost after tc egress than netem dropped",
    );
    // rxe's responder counts one out_of_seq_request per sequence error and answers
    // it with one NAK (later packets of the same episode are dropped silently);
    // the agent counts every packet ahead of its expected PSN, so it may count
    // more gaps than rxe counts episodes, never a gap where rxe saw none.
    require(
        naks == oos,
        "the agent's NAKs (veth1 egress) differ from rxe1's out_of_seq_request",
    );
    require(
        (gaps > 0) == (oos > 0),
        "agent PSN gaps and rxe1's out_of_seq_request disagree on whether there was a gap",
    );
    require(
        naks_in + timeouts == retries,
        "the go-backs the agent saw (NAKs arriving on veth0 + timeouts) differ from rxe0's completer_retry_err",
    );
    require(
        (resent > 0) == (retries > 0),
        "agent retransmissions and rxe0's completer retries disagree on whether there was a resend",
    );
    Ok(())
}

/// The guest's checks of the lifecycle scenario (`checks`: NAME PASS|FAIL), and how
/// the agent attached.
fn lifecycle(dir: &Path, o: &mut Outcome) {
    let checks = std::fs::read_to_string(dir.join("checks")).unwrap_or_default();
    if checks.trim().is_empty() {
        o.problem("the guest wrote no checks".to_string());
    }
    for line in checks.lines() {
        o.figures += 1;
        if !line.ends_with(" PASS") {
            o.problem(format!("guest check {line}"));
        }
    }
    o.notes.push(attach_summary(dir));
}

/// How the agent attached, from its log: XDP mode and the tc mechanism.
pub fn attach_summary(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let xdp = log
        .lines()
        .find(|l| l.contains("XDP classifier attached"))
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("mode=")))
        .unwrap_or("mode=?");
    let tc = if log.contains("falling back to clsact") {
        "tc: clsact (TCX refused)"
    } else {
        "tc: TCX"
    };
    format!("XDP {xdp}, {tc}")
}

/// The table of one kernel's results.
pub fn table(kernel: &str, release: &str, results: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\nkernel {release} ({kernel})");
    let _ = writeln!(
        s,
        "{:<13} {:>7} {:>6} {:>8} {:>10} {:>7}  result",
        "scenario", "frames", "flows", "figures", "mismatches", "secs"
    );
    for o in results {
        let _ = writeln!(
            s,
            "{:<13} {:>7} {:>6} {:>8} {:>10} {:>7}  {}",
            o.name,
            o.frames,
            o.flows,
            o.figures,
            o.mismatches,
            o.secs.map_or("-".to_string(), |v| format!("{v:.1}")),
            if o.passed() { "ok" } else { "FAILED" }
        );
        for n in &o.notes {
            let _ = writeln!(s, "    {n}");
        }
        for p in o.problems.iter().take(12) {
            let _ = writeln!(s, "    ! {p}");
        }
        if o.problems.len() > 12 {
            let _ = writeln!(s, "    ! ... {} more", o.problems.len() - 12);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_statistic_lines_become_counters_per_device() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("roce-vm-judge-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let f = dir.join("s.txt");
        std::fs::write(
            &f,
            "link rxe0/1 sent_pkts 10 rcvd_pkts 12 out_of_seq_request 0\n\
             link rxe1/1 sent_pkts 12 rcvd_pkts 10 out_of_seq_request 3\n",
        )?;
        let s = rdma_stats(&f);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(s["rxe1"]["out_of_seq_request"], 3);
        assert_eq!(s["rxe0"]["rcvd_pkts"], 12);
        Ok(())
    }

    #[test]
    fn a_flow_missing_on_either_side_and_each_differing_figure_is_a_mismatch() {
        let id = oracle::FlowId {
            src: ADDR0.into(),
            dst: ADDR1.into(),
            vni: None,
            inner_src: None,
            inner_dst: None,
            dest_qp: 17,
        };
        let c = FlowCounts {
            packets: 10,
            bytes: 1000,
            ..Default::default()
        };
        let agent: FlowTable = [(id.clone(), c.clone())].into();
        let mut o = Outcome::default();
        compare("x", &agent, &agent, Compare::Exact, &mut o);
        assert_eq!((o.flows, o.figures, o.mismatches), (1, 12, 0));
        let mut more = c.clone();
        more.packets = 11;
        let wire: FlowTable = [(id.clone(), more)].into();
        let mut o = Outcome::default();
        compare("x", &agent, &wire, Compare::Exact, &mut o);
        assert_eq!(o.mismatches, 1);
        let mut o = Outcome::default();
        compare("x", &wire, &agent, Compare::AgentSeesMore, &mut o);
        assert_eq!((o.figures, o.mismatches), (2, 0));
        let mut o = Outcome::default();
        compare("x", &agent, &FlowTable::new(), Compare::Exact, &mut o);
        assert_eq!(o.mismatches, 1);
    }
}
