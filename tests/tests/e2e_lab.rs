//! End-to-end in a namespace lab (needs root): the real `roce-agent` binary attached
//! with XDP on the receiving veth in namespace B, `roce-gen` sending from namespace A
//! (crafted frames and UDP sockets with IP_TOS; plain RoCEv2, RoCE through the kernel's
//! VXLAN devices, and crafted VXLAN with outer CE marks), tcpdump capturing on the
//! same receiving interface. The agent's flow table must equal what the generator
//! says it sent AND tshark's decode of the capture, flow by flow.
//! A second rig gives the agent a table too small for its traffic: its evictions keep
//! the counts right.
//!
//! Everything lives in the lab's namespaces and temporary directory, which the lab
//! removes also when an assertion fails (set ROCE_LAB_KEEP=1 to keep the captures).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use roce_testkit::lab::oracle::{self, FlowTable};
use roce_testkit::lab::{bins, Lab, LabOptions, Proc};
use serde_json::Value;

const API: &str = "127.0.0.1:9473";

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the namespace end-to-end tests need root (ip netns, XDP attach, raw sockets)"
    );
}

/// The lab with the agent running on B's veth and a capture on the same interface.
/// Fields drop in order: the agent (SIGTERM, it detaches) before the lab.
struct Rig {
    agent: Option<Proc>,
    lab: Lab,
    bin: PathBuf,
}

impl Rig {
    fn new(options: LabOptions) -> Result<Rig> {
        let bin = bins::agent_bins_for_test()?;
        let lab = Lab::new(options)?;
        Ok(Rig {
            lab,
            bin,
            agent: None,
        })
    }

    fn exe(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    fn start_agent(&mut self) -> Result<()> {
        self.start_agent_with(&[])
    }

    /// Starts the agent with `extra` arguments after the usual ones.
    fn start_agent_with(&mut self, extra: &[&str]) -> Result<()> {
        let mut cmd = self.lab.command(&self.lab.b.ns, self.exe("roce-agent"));
        // --no-pin: the programs go with the agent (stop_agent checks that).
        cmd.args([
            "run",
            "--iface",
            &self.lab.b.veth,
            "--listen",
            API,
            "--no-pin",
        ])
        .args(["--interval", "0.2"])
        .args(extra)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
        let mut agent = self.lab.spawn("roce-agent", cmd)?;
        agent.wait_for_output("serving GET /flows", Duration::from_secs(20))?;
        self.agent = Some(agent);
        Ok(())
    }

    /// Runs roce-gen in namespace A with `args` (+ `--json`) and returns its report.
    fn gen(&self, args: &[String]) -> Result<Value> {
        self.gen_in(&self.lab.a.ns, args)
    }

    /// Runs roce-gen in namespace B (through the agent's tc) with `args` (+ `--json`).
    fn gen_b(&self, args: &[String]) -> Result<Value> {
        self.gen_in(&self.lab.b.ns, args)
    }

    fn gen_in(&self, ns: &str, args: &[String]) -> Result<Value> {
        let mut cmd = self.lab.command(ns, self.exe("roce-gen"));
        cmd.args(args).arg("--json");
        let out = cmd.output().context("running roce-gen")?;
        if !out.status.success() {
            bail!(
                "roce-gen {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "roce-gen printed no JSON: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `roce-agent flows --json` in namespace B.
    fn agent_doc(&self) -> Result<Value> {
        let out = self.lab.exec(
            &self.lab.b.ns,
            &self.exe("roce-agent").to_string_lossy(),
            &["flows", "--json", "--api", API],
        )?;
        serde_json::from_slice(&out.stdout).context("roce-agent flows --json printed no JSON")
    }

    /// The agent's flows on B's veth, ingress.
    fn agent_flows(&self, doc: &Value) -> Result<FlowTable> {
        let ifname = self.lab.b.veth.clone();
        oracle::flows_from_doc(doc, |f| {
            f.get("ifname").and_then(Value::as_str) == Some(ifname.as_str())
                && f.get("direction").and_then(Value::as_str) == Some("ingress")
        })
    }

    /// Polls the agent until its flows on B's veth hold `packets` packets (or 10 s pass).
    fn agent_table_settled(&self, packets: u64) -> Result<(Value, FlowTable)> {
        let start = Instant::now();
        loop {
            let doc = self.agent_doc()?;
            let table = self.agent_flows(&doc)?;
            let n: u64 = table.values().map(|c| c.packets).sum();
            if n >= packets || start.elapsed() > Duration::from_secs(10) {
                return Ok((doc, table));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the agent with SIGINT; it must exit 0 and leave no XDP program on B's veth.
    fn stop_agent(&mut self) -> Result<()> {
        let Some(mut agent) = self.agent.take() else {
            return Ok(());
        };
        let st = agent.stop_with(libc::SIGINT, Duration::from_secs(10))?;
        if !st.success() {
            bail!(
                "roce-agent exited {st} on SIGINT; its stderr:\n{}",
                agent.stderr_text()
            );
        }
        let out = self.lab.exec(
            &self.lab.b.ns,
            "ip",
            &["-d", "link", "show", "dev", &self.lab.b.veth],
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("xdp") {
            bail!("an XDP program is still attached after the agent stopped:\n{text}");
        }
        Ok(())
    }
}

/// Splits a command line on whitespace (the arguments here hold no spaces).
fn argv(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

/// Merges generator reports into one table (each report's flows are distinct).
fn generator_table(reports: &[Value]) -> Result<FlowTable> {
    let mut all = FlowTable::new();
    for r in reports {
        for (id, c) in oracle::flows_from_doc(r, |_| true)? {
            if all.insert(id.clone(), c).is_some() {
                bail!("two generator runs sent flow {id}: make their QPs distinct");
            }
        }
    }
    Ok(all)
}

fn counter(doc: &Value, name: &str) -> Result<u64> {
    doc.get("counters")
        .and_then(|c| c.get(name))
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("agent document without counters.{name}"))
}

fn check_three_way(
    gen: &FlowTable,
    agent: &FlowTable,
    wire: &FlowTable,
    capture: &Path,
) -> Result<()> {
    let mut problems = oracle::differences("generator", gen, "agent", agent);
    problems.extend(oracle::differences("tshark", wire, "agent", agent));
    if !problems.is_empty() {
        bail!(
            "flow tables differ ({} problems; capture {}):\n{}",
            problems.len(),
            capture.display(),
            problems.join("\n")
        );
    }
    Ok(())
}

#[test]
fn roce_plain_and_in_vxlan_agent_equals_generator_and_tshark() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions::default())?;
    let (a, b) = (rig.lab.a.clone(), rig.lab.b.clone());
    let vx_a = a
        .vxlan
        .clone()
        .ok_or_else(|| anyhow!("lab without VXLAN"))?;
    let vx_b_ip = b.vxlan_ip4.ok_or_else(|| anyhow!("lab without VXLAN"))?;
    let b_ip6 = b.ip6.ok_or_else(|| anyhow!("lab without IPv6"))?;
    rig.start_agent()?;
    let filter = format!("udp and (dst host {} or dst host {b_ip6})", b.ip4);
    let capture = rig.lab.capture(&b.ns, &b.veth, "receiver", true, &filter)?;

    let veth = a.veth.as_str();
    let b4 = b.ip4.to_string();
    let b6 = b_ip6.to_string();
    let vxd = vx_b_ip.to_string();
    let (bmac, a4) = (&b.mac, a.ip4);
    let runs: Vec<Vec<String>> = [
        // Crafted frames: every operation, CE marks, CNPs and PSN gaps on one QP.
        format!(
            "-i {veth} --dst {b4} --dst-mac {bmac} --qp 0x100 \
             --ops send,write,read,ack,nak,rnr-nak --count 30 --ce 7 --cnp 5 --psn-gaps 2"
        ),
        // UDP sockets with IP_TOS: two QPs, CE and CNPs.
        format!(
            "-i {veth} --via udp --dst {b4} --qp 0x200 --flows 2 --sport 50000 \
             --count 20 --ce 5 --cnp 3"
        ),
        // IPv6, UDP socket with IPV6_TCLASS.
        format!(
            "-i {veth} --via udp --dst {b6} --qp 0x300 --sport 50100 \
             --count 10 --ce 2 --cnp 1 --ops write"
        ),
        // Through the kernel's VXLAN device (tos inherit): crafted inner frames ...
        format!("-i {vx_a} --dst {vxd} --qp 0x400 --ops send,write --count 25 --ce 6 --cnp 4"),
        // ... and a UDP socket whose packets the kernel routes into the tunnel.
        format!(
            "-i {vx_a} --via udp --dst {vxd} --qp 0x500 --sport 50200 \
             --count 12 --ce 3 --cnp 2"
        ),
        // Crafted VXLAN (another VNI) whose outer header an underlay switch marked CE.
        format!(
            "-i {veth} --dst-mac {bmac} --vni 7001 --outer-src {a4} --outer-dst {b4} \
             --src 198.19.200.1 --dst 198.19.200.2 --qp 0x600 \
             --count 16 --ce 2 --outer-ce 5 --cnp 2"
        ),
    ]
    .iter()
    .map(|l| argv(l))
    .collect();
    let mut reports = Vec::new();
    for args in &runs {
        reports.push(rig.gen(args)?);
    }
    let gen = generator_table(&reports)?;
    let sent: u64 = gen.values().map(|c| c.packets).sum();
    let sent_tunnelled: u64 = gen
        .iter()
        .filter(|(id, _)| id.vni.is_some())
        .map(|(_, c)| c.packets)
        .sum();

    let (doc, agent) = rig.agent_table_settled(sent)?;
    let pcap = capture.finish()?;
    let wire = oracle::tshark_flows(&pcap)?;

    // The scenario really has what it claims: CE and CNPs on plain and tunnelled
    // flows, outer CE only where the underlay marked it, the kernel's CE -> ECT(0).
    assert_eq!(gen.len(), 7, "{gen:#?}");
    assert!(gen.values().all(|c| c.cnps > 0));
    let kernel_vx = gen
        .iter()
        .find(|(id, _)| id.vni == Some(rig.lab.vni) && id.dest_qp == 0x400)
        .map(|(_, c)| c.clone())
        .ok_or_else(|| anyhow!("no kernel-VXLAN flow in the generator's report"))?;
    assert_eq!(kernel_vx.inner_ecn.map(|e| e.ce), Some(6));
    assert_eq!(kernel_vx.ecn.ce, 0, "Linux never writes outer CE");
    let crafted = gen
        .iter()
        .find(|(id, _)| id.vni == Some(7001))
        .map(|(_, c)| c.clone())
        .ok_or_else(|| anyhow!("no crafted-VXLAN flow"))?;
    assert_eq!(
        (crafted.ecn.ce, crafted.inner_ecn.map(|e| e.ce)),
        (5, Some(2))
    );

    check_three_way(&gen, &agent, &wire, &pcap)?;

    assert_eq!(counter(&doc, "roce")?, sent - sent_tunnelled);
    assert_eq!(counter(&doc, "roce_in_vxlan")?, sent_tunnelled);
    let errors = doc
        .get("counters")
        .and_then(|c| c.get("parse_errors"))
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow!("no parse_errors"))?;
    let nonzero: Vec<_> = errors
        .iter()
        .filter(|(_, v)| v.as_u64() != Some(0))
        .collect();
    assert!(nonzero.is_empty(), "parse errors: {nonzero:?}");

    rig.stop_agent()?;
    Ok(())
}

#[test]
fn vxlan_without_tos_inherit_has_outer_dscp_zero_and_still_maps_ecn() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions {
        tos_inherit: false,
        ipv6: false,
        ..LabOptions::default()
    })?;
    let (a, b) = (rig.lab.a.clone(), rig.lab.b.clone());
    let vx_a = a
        .vxlan
        .clone()
        .ok_or_else(|| anyhow!("lab without VXLAN"))?;
    let vxd = b
        .vxlan_ip4
        .ok_or_else(|| anyhow!("lab without VXLAN"))?
        .to_string();
    rig.start_agent()?;
    let filter = format!("udp and dst host {}", b.ip4);
    let capture = rig.lab.capture(&b.ns, &b.veth, "receiver", true, &filter)?;
    let report = rig.gen(&argv(&format!(
        "-i {vx_a} --dst {vxd} --qp 0x700 --count 9 --ce 4"
    )))?;
    let gen = generator_table(&[report])?;
    let (_, agent) = rig.agent_table_settled(9)?;
    let pcap = capture.finish()?;
    let wire = oracle::tshark_flows(&pcap)?;
    let flow = gen
        .values()
        .next()
        .ok_or_else(|| anyhow!("generator reported no flow"))?;
    assert_eq!(flow.last_dscp, 0, "outer DSCP without tos inherit");
    assert_eq!(
        flow.ecn.ect0, 9,
        "inner ECT(0) and CE both leave as outer ECT(0)"
    );
    check_three_way(&gen, &agent, &wire, &pcap)?;
    rig.stop_agent()?;
    Ok(())
}

/// `(dest_qp, packets)` of the agent's flows on B's veth, ingress, and its
/// `flows_evicted` counter.
fn qp_packets(rig: &Rig) -> Result<(Vec<(u64, u64)>, u64)> {
    let doc = rig.agent_doc()?;
    let flows = doc
        .get("flows")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("document without a flows array"))?;
    let veth = rig.lab.b.veth.as_str();
    let mut out = Vec::new();
    for f in flows {
        if f.get("ifname").and_then(Value::as_str) != Some(veth)
            || f.get("direction").and_then(Value::as_str) != Some("ingress")
        {
            continue;
        }
        let field = |name: &str| {
            f.get(name)
                .and_then(Value::as_u64)
                .ok_or_else(|| anyhow!("flow without {name}: {f}"))
        };
        out.push((field("dest_qp")?, field("packets")?));
    }
    Ok((out, counter(&doc, "flows_evicted")?))
}

/// Polls the agent until `cond(flows, evicted)` holds (see [`qp_packets`]), for 15 s.
fn wait_for(rig: &Rig, what: &str, cond: impl Fn(&[(u64, u64)], u64) -> bool) -> Result<()> {
    let start = Instant::now();
    loop {
        let (flows, evicted) = qp_packets(rig)?;
        if cond(&flows, evicted) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(15) {
            bail!("{what}: not after 15 s; flows {flows:?}, evicted {evicted}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A flow table of 64 flows under traffic of 96: the running agent evicts the least
/// recently seen flows each time free slots run short, the flows that found no slot
/// are counted as such, and no flow ever shows a count that is not its own (a slot
/// comes back zeroed).
#[test]
fn a_table_too_small_for_the_traffic_evicts_the_oldest_flows_and_mixes_no_counts() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions {
        vxlan: false,
        ipv6: false,
        ..LabOptions::default()
    })?;
    let config = rig.lab.dir.join("small-table.toml");
    std::fs::write(&config, "flows_map_size = 64\n").context("writing the config")?;
    rig.start_agent_with(&["--config", &config.display().to_string()])?;
    let (a, b) = (rig.lab.a.clone(), rig.lab.b.clone());
    let send = |qp: u32, count: u32| {
        rig.gen(&argv(&format!(
            "-i {} --dst {} --dst-mac {} --qp {qp:#x} --flows 48 --count {count} --ops ack",
            a.veth, b.ip4, b.mac
        )))
    };
    const OLD: u64 = 0x1000;
    const NEW: u64 = 0x2000;
    let old = |qp: u64| (OLD..OLD + 48).contains(&qp);

    // 48 flows of 7 packets: all fit.
    send(OLD as u32, 7)?;
    wait_for(&rig, "48 flows of 7 packets", |f, _| {
        f.len() == 48 && f.iter().all(|&(_, p)| p == 7)
    })?;
    // 48 newer flows of 3: 16 fit, the rest find no slot until the agent evicts the
    // eight oldest; then the same again, so that the given-back slots are reused.
    send(NEW as u32, 3)?;
    wait_for(&rig, "a first eviction", |_, e| e >= 8)?;
    std::thread::sleep(Duration::from_millis(600));
    send(NEW as u32, 3)?;
    wait_for(&rig, "a second eviction", |_, e| e >= 16)?;

    let (flows, evicted) = qp_packets(&rig)?;
    let doc = rig.agent_doc()?;
    assert!(flows.len() <= 64, "{} flows in a table of 64", flows.len());
    assert!(counter(&doc, "flow_insert_failed")? > 0);
    for &(qp, packets) in &flows {
        if old(qp) {
            assert_eq!(packets, 7, "old flow {qp:#x}");
        } else {
            // At most the 6 sent; 8 or more would hold an old flow's 7.
            assert!(
                (NEW..NEW + 48).contains(&qp) && (1..=6).contains(&packets),
                "new flow {qp:#x} with {packets} packets: at most 6 are its own"
            );
        }
    }
    // Only old flows were evicted: every one evicted is an old one that is gone.
    let old_left = flows.iter().filter(|&&(qp, _)| old(qp)).count() as u64;
    assert_eq!(old_left + evicted, 48, "flows {flows:?}, evicted {evicted}");
    rig.stop_agent()?;
    Ok(())
}

/// `GET /findings` of the agent in namespace B.
fn agent_findings(rig: &Rig) -> Result<Vec<Value>> {
    let out = rig.lab.exec(
        &rig.lab.b.ns,
        "curl",
        &["-s", &format!("http://{API}/findings")],
    )?;
    let doc: Value = serde_json::from_slice(&out.stdout).context("GET /findings is not JSON")?;
    doc["findings"]
        .as_array()
        .cloned()
        .ok_or_else(|| anyhow!("GET /findings without a findings array: {doc}"))
}

/// Polls `GET /findings` until `want` holds of the findings named `check` (10 s at most).
fn wait_for_findings(
    rig: &Rig,
    check: &str,
    what: &str,
    want: impl Fn(&[Value]) -> bool,
) -> Result<Vec<Value>> {
    let start = Instant::now();
    loop {
        let named: Vec<Value> = agent_findings(rig)?
            .into_iter()
            .filter(|f| f["check"] == check)
            .collect();
        if want(&named) {
            return Ok(named);
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("{what}: after 10 s the {check} findings are {named:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for exactly one finding named `check`, its text as `text` wants (a round in
/// the middle of the traffic may judge part of it), prints it and checks its severity
/// and interface.
fn one_finding(
    rig: &Rig,
    check: &str,
    what: &str,
    severity: &str,
    iface: &str,
    text: impl Fn(&str) -> bool,
) -> Result<Value> {
    let found = wait_for_findings(rig, check, what, |f| {
        f.len() == 1 && f[0]["found"].as_str().is_some_and(&text)
    })?;
    let f = found[0].clone();
    println!("{f}");
    ensure!(f["severity"] == severity && f["interface"] == iface, "{f}");
    Ok(f)
}

#[test]
fn unanswered_ce_marks_and_queue_pairs_on_one_port_are_live_verdicts() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions::default())?;
    rig.start_agent()?;
    let (a, b) = (rig.lab.a.ip4.to_string(), rig.lab.b.ip4.to_string());
    let veth_a = rig.lab.a.veth.clone();
    let veth_b = rig.lab.b.veth.clone();
    // From B, through the agent's tc: ACKs (and later a CNP) back to A's QP 0x21.
    let from_b = |extra: &str| {
        rig.gen_b(&argv(&format!(
            "--iface {veth_b} --dst {a} --qp 0x21 {extra}"
        )))
        .map(drop)
    };
    // 20 CE-marked writes to B's QP 0x20, 20 ACKs back, no CNP: the loop is broken.
    rig.gen(&argv(&format!(
        "--iface {veth_a} --dst {b} --qp 0x20 --ops write --count 20 --ce 20"
    )))?;
    from_b("--ops ack --count 20")?;
    one_finding(
        &rig,
        "ce_unanswered",
        "20 marks, no CNP",
        "error",
        &veth_b,
        |text| {
            text.starts_with(&format!("20 CE-marked RoCE packets {a}→{b} in the last "))
                && text.ends_with(&format!("no CNP back among the 20 RoCE packets {b}→{a}"))
        },
    )?;
    // One CNP back within the window: the notification point answers, the verdict goes.
    from_b("--ops ack --count 1 --cnp 1")?;
    wait_for_findings(&rig, "ce_unanswered", "a CNP back", |f| f.is_empty())?;
    // And the loop is timed on the CNP's flow, leaving B: from the first of the 20
    // marks (the wait they started) to the CNP.
    let doc = rig.agent_doc()?;
    let cnp_flow = doc["flows"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["dest_qp"] == 0x21 && f["direction"] == "egress" && f["cnps"] == 1)
        })
        .ok_or_else(|| anyhow!("no flow of the CNP: {doc}"))?;
    println!("ce_to_cnp {}", cnp_flow["ce_to_cnp"]);
    ensure!(
        cnp_flow["ce_to_cnp"]["samples"] == 1
            && cnp_flow["ce_to_cnp"]["min_us"]
                .as_f64()
                .is_some_and(|us| us > 0.0)
            && cnp_flow["cnp_interval"].is_null(),
        "{cnp_flow}"
    );

    // Eight QPs from A on one UDP source port; then eight more, each on its own port:
    // 17 QPs on 10 ports between the same hosts is spread enough.
    for qp in 0..8 {
        rig.gen(&argv(&format!(
            "--iface {veth_a} --dst {b} --qp {} --sport 50000 --count 2",
            0x100 + qp
        )))?;
    }
    // With the first test's QP 0x20 on port 49152: 9 QPs on 2 ports (8 already make a
    // finding, so a round between two of the runs may judge those).
    let want = format!(
        "9 queue pairs {a}→{b} on 2 UDP source ports (49152, 50000): ECMP spreads them over 2 paths at most"
    );
    let found = wait_for_findings(&rig, "ecmp_low_entropy", "9 QPs on 2 ports", |f| {
        f.len() == 1 && f[0]["found"] == want.as_str()
    })?;
    println!("{}", found[0]);
    rig.gen(&argv(&format!(
        "--iface {veth_a} --dst {b} --qp 0x200 --flows 8 --sport 51000 --count 2"
    )))?;
    wait_for_findings(&rig, "ecmp_low_entropy", "17 QPs on 10 ports", |f| {
        f.is_empty()
    })?;
    rig.stop_agent()
}

#[test]
fn cnps_off_the_cnp_dscp_are_a_live_verdict_arriving_and_leaving() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions::default())?;
    rig.start_agent()?;
    let (a, b) = (rig.lab.a.ip4.to_string(), rig.lab.b.ip4.to_string());
    let veth_a = rig.lab.a.veth.clone();
    let veth_b = rig.lab.b.veth.clone();
    // The near miss first: CNPs on the CNP DSCP (48) both ways.
    rig.gen(&argv(&format!(
        "--iface {veth_a} --dst {b} --qp 0x30 --count 1 --cnp 5"
    )))?;
    let from_b = |extra: &str| {
        rig.gen_b(&argv(&format!(
            "--iface {veth_b} --dst {a} --qp 0x31 {extra}"
        )))
        .map(drop)
    };
    from_b("--count 1 --cnp 5")?;
    // Two rounds (0.2 s each) with the CNPs in the table and nothing to say.
    std::thread::sleep(Duration::from_millis(600));
    let none = wait_for_findings(&rig, "cnp_wrong_class", "CNPs on DSCP 48", |f| f.is_empty())?;
    ensure!(none.is_empty());
    // A's notification point marks its CNPs DSCP 26 (priority 3, the data's queue).
    rig.gen(&argv(&format!(
        "--iface {veth_a} --dst {b} --qp 0x30 --count 1 --cnp 4 --cnp-dscp 26"
    )))?;
    // Of all the CNPs in the window: with the first five, when the window began
    // before them.
    let f = one_finding(
        &rig,
        "cnp_wrong_class",
        "4 CNPs on DSCP 26 arriving",
        "error",
        &veth_b,
        |text| {
            text.starts_with("4 of ")
                && text.contains(&format!(" CNPs {a}→{b} arriving in the last "))
                && text.ends_with(" on DSCP 26 (priority 3)")
        },
    )?;
    ensure!(
        f["fix"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("at {a}, the host that sends them")),
        "{f}"
    );
    // This host's CNPs on DSCP 49: priority 6 as the CNP DSCP, only the DSCP is off.
    from_b("--count 1 --cnp 2 --cnp-dscp 49")?;
    let found = wait_for_findings(&rig, "cnp_wrong_class", "2 CNPs on DSCP 49 leaving", |f| {
        f.len() == 2
    })?;
    let leaving = found
        .iter()
        .find(|f| f["found"].as_str().is_some_and(|t| t.contains(" leaving ")))
        .ok_or_else(|| anyhow!("no finding of the CNPs leaving: {found:?}"))?;
    println!("{leaving}");
    ensure!(leaving["severity"] == "warning", "{leaving}");
    ensure!(
        leaving["found"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(" CNPs {b}→{a} leaving in the last ")),
        "{leaving}"
    );
    rig.stop_agent()
}

#[test]
fn outer_ce_over_a_not_ect_inner_header_at_a_vtep_is_a_live_verdict() -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions::default())?;
    let veth_b = rig.lab.b.veth.clone();
    rig.start_agent_with(&["--vtep", &veth_b])?;
    let (a, b) = (rig.lab.a.ip4.to_string(), rig.lab.b.ip4.to_string());
    let veth_a = rig.lab.a.veth.clone();
    let vxlan = |extra: &str| {
        rig.gen(&argv(&format!(
            "--iface {veth_a} --vni 5001 --outer-src {a} --outer-dst {b} --src 198.19.0.1 --dst 198.19.0.2 --count 5 {extra}"
        )))
    };
    // The near miss: outer CE over ECT(0) inner headers, which decapsulation carries.
    vxlan("--outer-ce 5")?;
    std::thread::sleep(Duration::from_secs(1));
    let named: Vec<Value> = agent_findings(&rig)?
        .into_iter()
        .filter(|f| f["check"] == "inner_ce_lost")
        .collect();
    ensure!(named.is_empty(), "CE over ECT: {named:?}");
    // Outer CE over Not-ECT inner headers: dropped at decapsulation, mark and packet.
    vxlan("--outer-ce 5 --ecn not-ect")?;
    // Of the VXLAN packets the window holds (the near miss's among them), the five.
    let whole = |text: &str| {
        text.starts_with("5 of ")
            && text.contains(&format!(
                " VXLAN packets from VTEP {a} (vni 5001) in the last "
            ))
    };
    let found = wait_for_findings(&rig, "inner_ce_lost", "CE over Not-ECT", |f| {
        f.len() == 1 && f[0]["found"].as_str().is_some_and(whole)
    })?;
    ensure!(found[0]["severity"] == "error", "{}", found[0]);
    rig.stop_agent()
}

/// The agent's `counters.tunnels` record of `ifname` arriving (None until there is one).
fn tunnel_arriving(rig: &Rig, ifname: &str) -> Result<Option<Value>> {
    let doc = rig.agent_doc()?;
    Ok(doc["counters"]["tunnels"].as_array().and_then(|t| {
        t.iter()
            .find(|r| r["ifname"] == ifname && r["direction"] == "ingress")
            .cloned()
    }))
}

/// Polls the agent until its tunnel record of `ifname` arriving satisfies `want` (10 s).
fn wait_for_tunnel(
    rig: &Rig,
    ifname: &str,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let start = Instant::now();
    loop {
        let t = tunnel_arriving(rig, ifname)?;
        if let Some(t) = t.as_ref().filter(|t| want(t)) {
            println!("{what}: {t}");
            return Ok(t.clone());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("{what}: after 10 s the tunnel arriving on {ifname} is {t:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn packets_the_vtep_drops_in_decapsulation_are_its_psn_gaps_and_outer_marks_the_underlays(
) -> Result<()> {
    require_root();
    let mut rig = Rig::new(LabOptions::default())?;
    let (veth_a, veth_b) = (rig.lab.a.veth.clone(), rig.lab.b.veth.clone());
    let vx_b = rig
        .lab
        .b
        .vxlan
        .clone()
        .ok_or_else(|| anyhow!("a lab without VXLAN"))?;
    // The underlay (with the decapsulation counters) and the tunnel's inner side, the
    // VXLAN device after the kernel decapsulated.
    rig.start_agent_with(&["--iface", &vx_b, "--vtep", &veth_b])?;
    let (a, b) = (rig.lab.a.ip4.to_string(), rig.lab.b.ip4.to_string());
    let inner = |side: &roce_testkit::lab::Side| side.vxlan_ip4.map(|ip| ip.to_string());
    let (inner_a, inner_b) = (
        inner(&rig.lab.a).ok_or_else(|| anyhow!("no inner address"))?,
        inner(&rig.lab.b).ok_or_else(|| anyhow!("no inner address"))?,
    );
    let vni = rig.lab.vni;
    // Crafted VXLAN from A's VTEP address to B's, writes to B's QP 0x50 from PSN 100.
    let send = |extra: &str| {
        rig.gen(&argv(&format!(
            "--iface {veth_a} --vni {vni} --outer-src {a} --outer-dst {b} --src {inner_a} --dst {inner_b} --qp 0x50 --ops write {extra}"
        )))
        .map(drop)
    };
    let tunnel = |t: &Value| {
        (
            t["src"] == a.as_str() && t["dst"] == b.as_str() && t["vni"] == vni,
            t["packets"].as_u64(),
            t["psn_gaps"].as_u64(),
            t["inner_ifname"].as_str().map(str::to_string),
            t["inner_psn_gaps"].as_u64(),
            t["vtep_psn_gaps"].as_u64(),
        )
    };
    // The near miss: 5 writes cross the VTEP whole; both sides see them in order.
    send("--count 5 --psn 100")?;
    let t = wait_for_tunnel(&rig, &veth_b, "5 writes", |t| {
        t["packets"] == 5 && t["inner_flows"] == 1
    })?;
    ensure!(
        tunnel(&t) == (true, Some(5), Some(0), Some(vx_b.clone()), Some(0), Some(0)),
        "{t}"
    );
    // 5 writes whose outer header the underlay marked CE over a Not-ECT inner header:
    // the kernel's decapsulation drops them (mark and packet). Then 5 more.
    send("--count 5 --psn 105 --outer-ce 5 --ecn not-ect")?;
    send("--count 5 --psn 110")?;
    // The underlay saw PSNs 100-114 in order; the inner side misses 105-109: one gap,
    // made in this host's VTEP.
    let t = wait_for_tunnel(&rig, &veth_b, "5 dropped in decapsulation", |t| {
        t["packets"] == 15 && t["inner_psn_gaps"] == 1
    })?;
    ensure!(
        tunnel(&t)
            == (
                true,
                Some(15),
                Some(0),
                Some(vx_b.clone()),
                Some(1),
                Some(1)
            ),
        "{t}"
    );
    // Marks: 2 by the underlay over ECT(0) (carried in), 1 before encapsulation.
    send("--count 4 --psn 115 --outer-ce 2")?;
    send("--count 1 --psn 119 --ce 1")?;
    let t = wait_for_tunnel(&rig, &veth_b, "marks", |t| t["packets"] == 20)?;
    ensure!(
        (t["ce"].as_u64(), t["inner_ce"].as_u64()) == (Some(7), Some(1)),
        "{t}"
    );
    ensure!(t["psn_gaps"] == 0 && t["vtep_psn_gaps"] == 1, "{t}");
    // The decapsulation counters of the --vtep interface say who marked, per VNI.
    let metrics = rig.lab.scrape(&rig.lab.b.ns, API)?;
    let sample = |series: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')
                .map(str::to_string)
        })
    };
    let vtep = format!(r#"remote="{a}",vni="{vni}""#);
    ensure!(
        sample(&format!(
            r#"roce_vtep_ce_packets_total{{{vtep},marked_by="underlay"}}"#
        ))
        .as_deref()
            == Some("7")
            && sample(&format!(
                r#"roce_vtep_ce_packets_total{{{vtep},marked_by="overlay"}}"#
            ))
            .as_deref()
                == Some("1"),
        "{metrics}"
    );
    let labels = format!(
        r#"ifname="{veth_b}",direction="ingress",src="{a}",dst="{b}",vni="{vni}",inner_ifname="{vx_b}""#
    );
    ensure!(
        sample(&format!("roce_tunnel_vtep_psn_gaps_total{{{labels}}}")).as_deref() == Some("1"),
        "{metrics}"
    );
    // Decapsulation carried the underlay's marks into the inner header (2), with the
    // sender's own (1): what the inner side saw.
    let doc = rig.agent_doc()?;
    let inner_flow = doc["flows"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["ifname"] == vx_b.as_str() && f["dest_qp"] == 0x50)
        })
        .ok_or_else(|| anyhow!("no flow on {vx_b}: {doc}"))?;
    ensure!(
        inner_flow["ecn"]["ce"] == 3 && inner_flow["packets"] == 15,
        "{inner_flow}"
    );
    rig.stop_agent()
}

#[test]
fn queue_pairs_a_vtep_pins_to_one_outer_port_are_low_entropy_and_its_default_spreads_them(
) -> Result<()> {
    require_root();
    // A VTEP whose outer source port range holds one port.
    let pinned = LabOptions {
        vxlan_srcport: Some((4000, 4001)),
        ..LabOptions::default()
    };
    for (options, pinned) in [(pinned, true), (LabOptions::default(), false)] {
        let mut rig = Rig::new(options)?;
        rig.start_agent()?;
        let veth_b = rig.lab.b.veth.clone();
        let vx_a = rig
            .lab
            .a
            .vxlan
            .clone()
            .ok_or_else(|| anyhow!("a lab without VXLAN"))?;
        let inner_b = rig
            .lab
            .b
            .vxlan_ip4
            .ok_or_else(|| anyhow!("no inner address"))?;
        let (a, b) = (rig.lab.a.ip4, rig.lab.b.ip4);
        // 8 queue pairs, each from its own inner port, through A's VXLAN device.
        rig.gen(&argv(&format!(
            "--iface {vx_a} --dst {inner_b} --qp 0x300 --flows 8 --sport 49152 --count 2"
        )))?;
        let (doc, _) = rig.agent_table_settled(16)?;
        let ports: std::collections::BTreeSet<u64> = doc["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["ifname"] == veth_b.as_str() && !f["vni"].is_null())
            .filter_map(|f| f["outer_sport"].as_u64())
            .collect();
        println!("outer ports (pinned: {pinned}): {ports:?}");
        if pinned {
            ensure!(ports == [4000].into(), "{ports:?}");
            let found =
                wait_for_findings(&rig, "ecmp_low_entropy", "8 QPs on outer port 4000", |f| {
                    f.len() == 1
                })?;
            println!("{}", found[0]);
            ensure!(
                found[0]["found"]
                    == format!("8 queue pairs through VTEPs {a}→{b} on 1 outer UDP source port (4000), from 8 inner ports: the underlay's ECMP spreads them over 1 path at most").as_str()
                    && found[0]["interface"] == veth_b.as_str(),
                "{}",
                found[0]
            );
            ensure!(
                found[0]["fix"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(&format!("at VTEP {a}: "))),
                "{}",
                found[0]
            );
        } else {
            // Linux hashes each inner flow into the local port range.
            ensure!(ports.len() >= 5, "{ports:?}");
            std::thread::sleep(Duration::from_secs(1));
            let named: Vec<Value> = agent_findings(&rig)?
                .into_iter()
                .filter(|f| f["check"] == "ecmp_low_entropy")
                .collect();
            ensure!(named.is_empty(), "{named:?}");
        }
        rig.stop_agent()?;
    }
    Ok(())
}
