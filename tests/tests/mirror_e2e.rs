//! Mirror collectors end to end (needs root, tshark, tcpreplay and scapy: `cargo xtask
//! setup`): scapy crafts mirror copies of a RoCE mix (`tests/mirror/craft_mirrors.py`:
//! GRE with and without a key, ERSPAN II, ERSPAN III with and without the platform
//! subheader, over IPv4 and IPv6, and ERSPAN copies truncated to 64, 128 and 256 bytes
//! with T set), tcpreplay sends them into namespace B's veth, where `roce-agent run
//! --mirror` counts them with XDP. The agent's flow table must equal tshark's decode of
//! the same pcap, flow for flow, session and sender included, truncated copies with
//! their original length (exact bytes); `analyze` of the pcap, with either engine, must
//! give the same table. This host's kernel has no erspan or gretap devices: the VM lab
//! mirrors with real ones.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use roce_testkit::lab::{bins, Lab, LabOptions, Proc};
use roce_testkit::tshark::{self, Fields};
use serde_json::Value;

const API: &str = "127.0.0.1:9473";
const CRAFT: &str = include_str!("../mirror/craft_mirrors.py");

/// A mirrored flow as both sides name it: the session, then the mirrored packet's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct MirrorFlow {
    kind: String,
    session: u64,
    source: String,
    src: String,
    dst: String,
    vni: Option<u64>,
    inner_src: Option<String>,
    inner_dst: Option<String>,
    dest_qp: u64,
}

/// Packets and bytes of each mirrored flow.
type Table = BTreeMap<MirrorFlow, (u64, u64)>;

/// What tshark makes of the copies: the mirrored flows, and the copies without RoCE
/// (`mirror_other`) and cut before their BTH (`mirror_truncated`).
struct Decoded {
    flows: Table,
    other: u64,
    truncated: u64,
    /// Packets of the flows that came in truncated copies (T set, BTH kept).
    cut_packets: u64,
}

fn require_tools() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the mirror end-to-end test needs root (ip netns, XDP attach)"
    );
    assert!(
        tshark::available(),
        "tshark is missing: run `cargo xtask setup`"
    );
    let ok = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
    assert!(
        ok(Command::new("tcpreplay").arg("--version")),
        "tcpreplay is missing: run `cargo xtask setup`"
    );
    assert!(
        ok(Command::new("python3").args(["-c", "import scapy.contrib.erspan, scapy.contrib.roce"])),
        "scapy (with its ERSPAN and RoCE layers) is missing: run `cargo xtask setup`"
    );
}

/// Writes the crafted copies into `dir/mirrors.pcap`.
fn craft(dir: &Path) -> Result<PathBuf> {
    let script = dir.join("craft_mirrors.py");
    std::fs::write(&script, CRAFT).context("writing the scapy script")?;
    let pcap = dir.join("mirrors.pcap");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&pcap)
        .output()
        .context("running python3")?;
    if !out.status.success() {
        bail!(
            "craft_mirrors.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(pcap)
}

fn num(s: &str) -> Result<u64> {
    tshark::number(s)
}

/// tshark's decode of the copies: for each frame, its layers in order
/// (`frame.protocols`) say which occurrence of `ip.*` / `ipv6.*` is the sender's, the
/// mirrored packet's and a VXLAN packet's inner one.
fn tshark_table(pcap: &Path) -> Result<Decoded> {
    let fields = Fields::new(&[
        "frame.protocols",
        "ip.src",
        "ip.dst",
        "ip.len",
        "ipv6.src",
        "ipv6.dst",
        "ipv6.plen",
        "gre.key",
        "erspan.version",
        "erspan.spanid",
        "erspan.truncated",
        "vxlan.vni",
        "infiniband.bth.destqp",
    ])
    .decode_as("udp.port==4791,infiniband");
    let mut d = Decoded {
        flows: Table::new(),
        other: 0,
        truncated: 0,
        cut_packets: 0,
    };
    for row in fields.run(pcap)? {
        let protocols: Vec<&str> = row.first(0).unwrap_or("").split(':').collect();
        if !protocols.contains(&"gre") {
            continue;
        }
        // (src, dst, IP length as sent) of each IP layer, outermost first.
        let (mut v4, mut v6) = (0, 0);
        let mut ips = Vec::new();
        for p in &protocols {
            match *p {
                "ip" => {
                    let at = |i: usize| row.all(i).get(v4).cloned();
                    let len = at(3).map(|s| num(&s)).transpose()?;
                    ips.push((at(1), at(2), len.map(|l| 14 + l)));
                    v4 += 1;
                }
                "ipv6" => {
                    let at = |i: usize| row.all(i).get(v6).cloned();
                    let len = at(6).map(|s| num(&s)).transpose()?;
                    ips.push((at(4), at(5), len.map(|l| 14 + 40 + l)));
                    v6 += 1;
                }
                _ => {}
            }
        }
        let (kind, session) = match row.first(8) {
            Some("1") => ("erspan2", num(row.first(9).unwrap_or("0"))?),
            Some("2") => ("erspan3", num(row.first(9).unwrap_or("0"))?),
            Some(v) => bail!("ERSPAN version {v}: {}", row.line),
            None => ("gre", row.first(7).map(num).transpose()?.unwrap_or(0)),
        };
        let Some(qp) = row.first(12) else {
            if row.first(10) == Some("1") {
                d.truncated += 1;
            } else {
                d.other += 1;
            }
            continue;
        };
        if row.first(10) == Some("1") {
            d.cut_packets += 1;
        }
        let tunnelled = protocols.contains(&"vxlan");
        let (Some((Some(source), _, _)), Some((Some(src), Some(dst), Some(bytes)))) =
            (ips.first().cloned(), ips.get(1).cloned())
        else {
            bail!("a copy without its addresses: {}", row.line);
        };
        let inner = tunnelled.then(|| ips.get(2).cloned()).flatten();
        let flow = MirrorFlow {
            kind: kind.to_string(),
            session,
            source,
            src,
            dst,
            vni: row.first(11).map(num).transpose()?,
            inner_src: inner.as_ref().and_then(|i| i.0.clone()),
            inner_dst: inner.as_ref().and_then(|i| i.1.clone()),
            dest_qp: num(qp)?,
        };
        let e = d.flows.entry(flow).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    Ok(d)
}

/// The mirrored flows of a flows document (or of `analyze --json`).
fn doc_table(doc: &Value) -> Result<Table> {
    let flows = doc
        .get("flows")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("a document without flows: {doc}"))?;
    let s = |f: &Value, k: &str| f.get(k).and_then(Value::as_str).map(str::to_string);
    let mut t = Table::new();
    for f in flows {
        let Some(m) = f.get("mirror").filter(|m| !m.is_null()) else {
            bail!("a flow without its mirror session: {f}");
        };
        let flow = MirrorFlow {
            kind: s(m, "kind").ok_or_else(|| anyhow!("no kind: {m}"))?,
            session: m.get("session").and_then(Value::as_u64).unwrap_or(u64::MAX),
            source: s(m, "source").ok_or_else(|| anyhow!("no source: {m}"))?,
            src: s(f, "src").unwrap_or_default(),
            dst: s(f, "dst").unwrap_or_default(),
            vni: f.get("vni").and_then(Value::as_u64),
            inner_src: s(f, "inner_src"),
            inner_dst: s(f, "inner_dst"),
            dest_qp: f.get("dest_qp").and_then(Value::as_u64).unwrap_or(u64::MAX),
        };
        let n = |k: &str| f.get(k).and_then(Value::as_u64).unwrap_or(0);
        if t.insert(flow.clone(), (n("packets"), n("bytes"))).is_some() {
            bail!("flow {flow:?} twice in the document");
        }
    }
    Ok(t)
}

fn counter(doc: &Value, name: &str) -> u64 {
    doc.pointer(&format!("/counters/{name}"))
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX)
}

/// Both tables, flow by flow, with what differs.
fn assert_same(what: &str, got: &Table, want: &Table) {
    let mut diff = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            Some(g) if g == v => {}
            other => diff.push(format!("{k:?}: tshark {v:?}, {what} {other:?}")),
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            diff.push(format!("{k:?}: {what} {v:?}, not in tshark's decode"));
        }
    }
    assert!(
        diff.is_empty(),
        "{what} differs from tshark:\n{}",
        diff.join("\n")
    );
}

/// The agent running with `--mirror` on B's veth; stopped (SIGINT) when dropped.
struct Collector {
    agent: Proc,
}

impl Collector {
    fn start(lab: &Lab, bin: &Path) -> Result<Collector> {
        let mut cmd = lab.command(&lab.b.ns, bin.join("roce-agent"));
        cmd.args(["run", "--mirror", &lab.b.veth, "--listen", API, "--no-pin"])
            .args(["--interval", "0.2"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        let mut agent = lab.spawn("roce-agent", cmd)?;
        agent.wait_for_output("serving GET /flows", Duration::from_secs(20))?;
        Ok(Collector { agent })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.agent.stop_with(libc::SIGINT, Duration::from_secs(10));
    }
}

/// `roce-agent flows --json` in B, polled until its flows hold `packets` packets.
fn agent_doc(lab: &Lab, bin: &Path, packets: u64) -> Result<Value> {
    let start = Instant::now();
    loop {
        let out = lab.exec(
            &lab.b.ns,
            &bin.join("roce-agent").to_string_lossy(),
            &["flows", "--json", "--api", API],
        )?;
        let doc: Value = serde_json::from_slice(&out.stdout).context("flows --json")?;
        let n: u64 = doc_table(&doc)?.values().map(|(p, _)| p).sum();
        if n >= packets || start.elapsed() > Duration::from_secs(10) {
            return Ok(doc);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn analyze(bin: &Path, pcap: &Path, engine: &str) -> Result<Value> {
    let out = Command::new(bin.join("roce-agent"))
        .arg("analyze")
        .arg(pcap)
        .args(["--json", "--engine", engine])
        .output()
        .context("running roce-agent analyze")?;
    // Findings may set the exit code; the JSON is what counts here.
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "analyze --engine {engine} printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn the_collector_and_analyze_count_the_mirrored_flows_tshark_decodes() -> Result<()> {
    require_tools();
    let bin = bins::agent_bins_for_test()?;
    let lab = Lab::new(LabOptions {
        vxlan: false,
        ipv6: false,
        ..LabOptions::default()
    })?;
    let pcap = craft(&lab.dir)?;
    let want = tshark_table(&pcap)?;
    // What the pcap holds, so that the comparison means something.
    let kinds: std::collections::BTreeSet<&str> =
        want.flows.keys().map(|k| k.kind.as_str()).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["erspan2", "erspan3", "gre"]
    );
    assert!(
        want.flows.keys().any(|k| k.source.contains(':')),
        "an IPv6 sender"
    );
    assert!(want.flows.keys().any(|k| k.vni.is_some()), "RoCE in VXLAN");
    assert_eq!((want.other, want.truncated, want.cut_packets), (5, 1, 8));
    // The truncated copies of the 1,000-byte send: 64, 128 and 256 bytes kept, each
    // counted as the 1,058 bytes the switch saw.
    let big = want
        .flows
        .iter()
        .find(|(k, _)| k.dest_qp == 0x400 && k.kind == "erspan2")
        .map(|(_, v)| *v);
    assert_eq!(big, Some((3, 3 * 1058)));

    let collector = Collector::start(&lab, &bin)?;
    lab.exec(
        &lab.a.ns,
        "tcpreplay",
        &["-q", "-i", &lab.a.veth, &pcap.to_string_lossy()],
    )?;
    let packets: u64 = want.flows.values().map(|(p, _)| p).sum();
    let doc = agent_doc(&lab, &bin, packets)?;
    let table = doc_table(&doc)?;
    assert_same("the collector", &table, &want.flows);
    for f in doc["flows"].as_array().into_iter().flatten() {
        assert_eq!(f["ifname"].as_str(), Some(lab.b.veth.as_str()));
        assert_eq!(f["direction"].as_str(), Some("ingress"), "{f}");
    }
    assert_eq!(counter(&doc, "mirror_other"), want.other);
    assert_eq!(counter(&doc, "mirror_truncated"), want.truncated);
    let parse_errors: u64 = doc["counters"]["parse_errors"]
        .as_object()
        .map_or(u64::MAX, |m| m.values().filter_map(Value::as_u64).sum());
    assert_eq!(parse_errors, 0, "truncated copies are no parse errors");
    drop(collector);

    for engine in ["reference", "kernel"] {
        let report = analyze(&bin, &pcap, engine)?;
        assert_same(
            &format!("analyze --engine {engine}"),
            &doc_table(&report)?,
            &want.flows,
        );
        assert_eq!(counter(&report, "mirror_other"), want.other);
        assert_eq!(counter(&report, "mirror_truncated"), want.truncated);
        // Every whole copy's ICRC is checked and good; no truncated one is checked.
        let whole: u64 = packets - want.cut_packets;
        assert_eq!(
            report["capture"]["icrc_checked"].as_u64(),
            Some(whole),
            "{engine}"
        );
        let bad: u64 = report["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["icrc_errors"].as_u64())
            .sum();
        assert_eq!(bad, 0);
    }
    Ok(())
}
