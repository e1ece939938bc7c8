//! `cargo xtask demo`: the agent watching RoCEv2 traffic in a namespace lab, and
//! making the sending host's QoS markings right.
//!
//! Builds the release binaries, builds a lab (two namespaces, a veth pair, a VXLAN
//! pair left at the Linux default `tos 0`, so its outer DSCP is 0), and starts two
//! agents: on the sender, `roce-agent run --mode enforce --vtep` on its veth (host DSCP
//! policy and VTEP propagation on egress); on the receiver, `roce-agent run --vtep` on
//! its veth (flow table, decapsulation checks). Then it drives several `roce-gen`s at
//! once for `--duration` seconds (plain RoCEv2 from crafted frames and from a UDP
//! socket whose application set no traffic class, RoCE through the kernel's VXLAN
//! device, crafted VXLAN whose outer header an underlay switch marked CE; CE marks,
//! CNPs, ACK/NAKs) and an intruder (non-RoCE UDP on the lossless DSCP). It shows the
//! receiver's flow table every second on stderr, and finally compares the table with
//! what the generators sent after the sender's policy (RoCE data on DSCP 26, outer
//! DSCP = inner DSCP), and checks the QoS counters and the intruder's TOS as the
//! receiving socket read it. Exit status 0 only when everything matches. Everything
//! is torn down at the end, on error, and on Ctrl-C / SIGTERM.
//!
//! With `--json`, stdout holds only the receiver's final flow document (as `roce-agent
//! flows --json` prints it) plus a `demo` object: what was sent, the QoS checks, and
//! whether it all matched.

use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use roce_testkit::lab::oracle::{self, FlowTable};
use roce_testkit::lab::{bins, namespace_exists, Lab, LabOptions, Proc};
use serde_json::{json, Value};

use crate::intruder;

/// The agents' API, each inside its own namespace.
const API: &str = "127.0.0.1:9473";
/// The QoS policy's defaults, as the agents in the demo run them: RoCE data and CNP DSCPs.
const ROCE_DSCP: u8 = roce_common::policy::DEFAULT_ROCE_DSCP;
const CNP_DSCP: u8 = roce_common::policy::DEFAULT_CNP_DSCP;
/// The intruder's TOS byte: lossless DSCP 26 with ECT(0). The sender's agent must
/// remark it to DSCP 0 and keep the ECN bits: 0x02 arrives.
const INTRUDER_TOS: u8 = (ROCE_DSCP << 2) | 0b10;
const INTRUDER_TOS_REMARKED: u8 = INTRUDER_TOS & 0b11;
/// Every sender runs on this CPU. With XDP attached, a veth receives in one NAPI
/// context that runs on whichever CPU scheduled it, so senders on several CPUs would
/// spread one flow's packets over CPUs, and the per-CPU PSN state would see false
/// gaps (a NIC's RSS keeps a flow on one queue and CPU; one sending CPU does it here).
const SEND_CPU: usize = 0;

#[derive(clap::Args)]
pub struct Args {
    /// Seconds of traffic.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Print only the final JSON document on stdout (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn interrupted() -> Result<()> {
    if STOP.load(Ordering::Relaxed) {
        bail!("interrupted: tearing the lab down");
    }
    Ok(())
}

/// While alive, file descriptor 1 points at stderr, so that nothing (ours or a child's:
/// apt-get, cargo) lands on stdout; `into_stdout` gives the real stdout back.
struct StdoutToStderr {
    saved: RawFd,
}

impl StdoutToStderr {
    fn new() -> Result<Self> {
        let _ = std::io::stdout().flush();
        // SAFETY: dup/dup2 on the process's standard descriptors.
        let saved = unsafe { libc::dup(1) };
        if saved < 0 || unsafe { libc::dup2(2, 1) } < 0 {
            bail!("redirecting stdout: {}", std::io::Error::last_os_error());
        }
        Ok(StdoutToStderr { saved })
    }

    /// Restores fd 1 and returns a handle on it.
    fn into_stdout(self) -> File {
        let _ = std::io::stdout().flush();
        // SAFETY: `saved` is our duplicate of the original stdout; after dup2 it is
        // owned by the returned File alone.
        unsafe {
            libc::dup2(self.saved, 1);
            let f = File::from_raw_fd(self.saved);
            std::mem::forget(self);
            f
        }
    }
}

impl Drop for StdoutToStderr {
    fn drop(&mut self) {
        // SAFETY: as in into_stdout.
        unsafe {
            libc::dup2(self.saved, 1);
            libc::close(self.saved);
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.duration == 0 {
        bail!("--duration must be at least 1 second");
    }
    // SAFETY: handlers that only store an atomic flag.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let redirect = if args.json {
        Some(StdoutToStderr::new()?)
    } else {
        None
    };
    let outcome = demo(&args);
    match (outcome, redirect) {
        (Ok(doc), Some(r)) => {
            let mut out = r.into_stdout();
            let text = serde_json::to_string_pretty(&doc).context("encoding the document")?;
            writeln!(out, "{text}").context("writing to stdout")?;
            verdict(&doc)
        }
        (Ok(doc), None) => verdict(&doc),
        (Err(e), _) => Err(e),
    }
}

fn verdict(doc: &Value) -> Result<()> {
    if doc
        .get("demo")
        .and_then(|d| d.get("matches"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        Ok(())
    } else {
        bail!("the agent's flow table does not match what the generators sent (see above)")
    }
}

fn say(msg: &str) {
    eprintln!("[demo] {msg}");
}

/// What the sender's QoS policy does to a generator's packets, so what the receiver
/// should count.
#[derive(Clone, Copy)]
enum Expect {
    /// Nothing changes: the markings are already right.
    AsSent,
    /// Plain RoCE whose data packets carry this (wrong) DSCP: the host policy
    /// rewrites them to the RoCE DSCP (CNPs already carry the CNP DSCP).
    HostRewrites { data_dscp: u8 },
    /// Through a VXLAN device without `tos inherit`: the VTEP program gives the outer
    /// header the inner DSCP (identity table).
    VtepPropagates,
}

impl Expect {
    /// The flow of a roce-gen report as the receiver should see it.
    fn apply(self, flow: &mut Value) {
        let last = flow.get("last_dscp").and_then(Value::as_u64);
        let want = match self {
            Expect::AsSent => None,
            Expect::HostRewrites { data_dscp } => {
                (last == Some(u64::from(data_dscp))).then_some(u64::from(ROCE_DSCP))
            }
            Expect::VtepPropagates => flow.get("last_inner_dscp").and_then(Value::as_u64),
        };
        if let (Some(w), Some(obj)) = (want, flow.as_object_mut()) {
            obj.insert("last_dscp".into(), json!(w));
        }
    }
}

/// One generator run: a name, its arguments, and what the sender's policy does to it.
struct GenRun {
    name: &'static str,
    args: Vec<String>,
    expect: Expect,
}

fn demo(args: &Args) -> Result<Value> {
    xtask::setup::ensure_all()?;
    interrupted()?;
    say("building release binaries (cargo build --release -p roce-agent -p roce-testkit)");
    let bin_dir = bins::build_agent(true)?;
    interrupted()?;
    let agent_bin = bin_dir.join("roce-agent");
    let gen_bin = bin_dir.join("roce-gen");
    let removed = Lab::remove_stale()?;
    if !removed.is_empty() {
        say(&format!(
            "removed namespaces of earlier, killed labs: {removed:?}"
        ));
    }
    // No `tos inherit`: the Linux default, whose outer DSCP 0 the VTEP program fixes.
    let mut lab = Lab::new(LabOptions {
        tos_inherit: false,
        ..LabOptions::default()
    })?;
    let (ns_a, ns_b) = (lab.a.ns.clone(), lab.b.ns.clone());
    let result = drive(&lab, args, &agent_bin, &gen_bin);
    let teardown = lab.teardown();
    drop(lab);
    let left: Vec<&String> = [&ns_a, &ns_b]
        .into_iter()
        .filter(|ns| namespace_exists(ns))
        .collect();
    if !left.is_empty() {
        bail!("teardown left namespaces behind: {left:?}");
    }
    teardown?;
    say("lab torn down: namespaces, links and the agent's programs are gone");
    result
}

fn drive(lab: &Lab, args: &Args, agent_bin: &Path, gen_bin: &Path) -> Result<Value> {
    let (a, b) = (&lab.a, &lab.b);
    let vx_a = a
        .vxlan
        .clone()
        .ok_or_else(|| anyhow!("lab without VXLAN"))?;
    let vx_b_ip = b
        .vxlan_ip4
        .ok_or_else(|| anyhow!("lab without VXLAN"))?
        .to_string();
    say(&format!(
        "lab {}: {} {} ({}) --veth-- {} {} ({}); VXLAN VNI {} {} -> {} (tos 0: outer DSCP 0)",
        lab.name, a.ns, a.veth, a.ip4, b.ns, b.veth, b.ip4, lab.vni, vx_a, vx_b_ip
    ));

    // The receiver: flow table (XDP), decapsulation checks (--vtep: tc ingress).
    let mut receiver = start_agent(lab, agent_bin, "roce-agent-receiver", &b.ns, &b.veth, &[])?;
    say(&format!(
        "roce-agent (receiver) on {} in {}: flow table and VXLAN decap checks; API {API} there",
        b.veth, b.ns
    ));
    // The sender: host DSCP policy enforced, VTEP propagation on its underlay.
    let mut sender = start_agent(
        lab,
        agent_bin,
        "roce-agent-sender",
        &a.ns,
        &a.veth,
        &["--mode", "enforce"],
    )?;
    say(&format!(
        "roce-agent (sender) on {} in {}: --mode enforce --vtep {}: RoCE data -> DSCP {ROCE_DSCP}, CNPs -> {CNP_DSCP}, intruders on DSCP {ROCE_DSCP} -> 0, outer DSCP = inner",
        a.veth, a.ns, a.veth
    ));

    let d = args.duration;
    let dur = d.to_string();
    let n = |per_s: u64| per_s * d;
    let b4 = b.ip4.to_string();
    let (veth, bmac, a4) = (&a.veth, &b.mac, a.ip4);
    let runs = vec![
        GenRun {
            name: "plain-raw",
            args: argv(&format!(
                "-i {veth} --dst {b4} --dst-mac {bmac} --qp 0x100 --flows 2 \
                 --ops send,write,read,ack,nak --count {} --ce {} --cnp {} --psn-gaps {}",
                n(20),
                n(4),
                n(2),
                n(1)
            )),
            expect: Expect::AsSent,
        },
        GenRun {
            // An application that set no traffic class (NCCL without NCCL_IB_TC).
            name: "plain-udp",
            args: argv(&format!(
                "-i {veth} --via udp --dst {b4} --qp 0x200 --sport 50000 --dscp 0 \
                 --count {} --ce {} --cnp {}",
                n(10),
                n(3),
                n(1)
            )),
            expect: Expect::HostRewrites { data_dscp: 0 },
        },
        GenRun {
            name: "vxlan-device",
            args: argv(&format!(
                "-i {vx_a} --dst {vx_b_ip} --qp 0x400 --ops send,write \
                 --count {} --ce {} --cnp {}",
                n(20),
                n(5),
                n(2)
            )),
            expect: Expect::VtepPropagates,
        },
        GenRun {
            name: "vxlan-crafted",
            args: argv(&format!(
                "-i {veth} --dst-mac {bmac} --vni 7001 --outer-src {a4} --outer-dst {b4} \
                 --src 198.19.200.1 --dst 198.19.200.2 --qp 0x600 \
                 --count {} --ce {} --outer-ce {} --cnp {}",
                n(10),
                n(1),
                n(2),
                n(1)
            )),
            expect: Expect::AsSent,
        },
    ];
    let intruder_rx = intruder::Receiver::start(&b.ns, b.ip4)?;
    let mut gens: Vec<(&GenRun, Proc)> = Vec::new();
    for r in &runs {
        let mut cmd = lab.command(&a.ns, gen_bin);
        cmd.args(&r.args)
            .args(["--duration", &dur, "--json", "--cpu", &SEND_CPU.to_string()]);
        gens.push((r, lab.spawn(&format!("roce-gen-{}", r.name), cmd)?));
    }
    let intruder_tx = intruder::Sender::start(
        &a.ns,
        a.ip4,
        b.ip4,
        INTRUDER_TOS,
        SEND_CPU,
        n(10),
        Duration::from_secs(d),
    );
    say(&format!(
        "{} generators sending for {d} s: plain RoCEv2 (crafted frames, and a UDP socket on DSCP 0), RoCE through VXLAN device {vx_a} (VNI {}), crafted VXLAN VNI 7001 with outer CE; and an intruder: UDP to port {} on DSCP {ROCE_DSCP}",
        gens.len(),
        lab.vni,
        intruder::PORT
    ));

    // Live view until every generator is done.
    let start = Instant::now();
    let mut next_view = start + Duration::from_secs(1);
    loop {
        interrupted()?;
        let mut running = usize::from(!intruder_tx.is_finished());
        for (r, g) in gens.iter_mut() {
            match g.try_status()? {
                None => running += 1,
                Some(st) if st.success() => {}
                Some(st) => bail!(
                    "roce-gen {} failed ({st}): {}",
                    r.name,
                    g.stderr_text().trim()
                ),
            }
        }
        for (name, agent) in [("receiver", &mut receiver), ("sender", &mut sender)] {
            if let Some(st) = agent.try_status()? {
                bail!("roce-agent ({name}) exited ({st}): {}", agent.stderr_text());
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() >= next_view {
            next_view += Duration::from_secs(1);
            let table = flows_table(lab, &b.ns, agent_bin)?;
            eprintln!(
                "--- t = {:>2} s ---------------------------------------------------------------\n{}",
                start.elapsed().as_secs(),
                table.trim_end()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let intruder_sent = intruder_tx.finish()?;

    // What the generators sent, what the receiver should see after the policy, and
    // what the sender's agent should count.
    let mut sent = FlowTable::new();
    let mut sent_flows = Vec::new();
    let mut want = QosWant {
        intruders: intruder_sent,
        ..QosWant::default()
    };
    for (run, g) in &gens {
        let mut report: Value = serde_json::from_str(&g.stdout_text())
            .with_context(|| format!("roce-gen {} printed no JSON report", run.name))?;
        if let Some(flows) = report.get_mut("flows").and_then(Value::as_array_mut) {
            for f in flows.iter_mut() {
                sent_flows.push(f.clone());
                want.add_flow(run.expect, f);
                run.expect.apply(f);
            }
        }
        for (id, c) in oracle::flows_from_doc(&report, |_| true)? {
            if sent.insert(id.clone(), c).is_some() {
                bail!("two generators sent flow {id}");
            }
        }
    }
    let total: u64 = sent.values().map(|c| c.packets).sum();

    // The receiver's table once it has read everything (it polls every 0.5 s).
    let ifname = b.veth.clone();
    let keep = |f: &Value| {
        f.get("ifname").and_then(Value::as_str) == Some(ifname.as_str())
            && f.get("direction").and_then(Value::as_str) == Some("ingress")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (doc, seen) = loop {
        interrupted()?;
        let doc = flows_json(lab, &b.ns, agent_bin)?;
        let seen = oracle::flows_from_doc(&doc, keep)?;
        let n: u64 = seen.values().map(|c| c.packets).sum();
        if n >= total || Instant::now() > deadline {
            break (doc, seen);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let final_table = flows_table(lab, &b.ns, agent_bin)?;
    let problems = oracle::differences("roce-gen", &sent, "roce-agent", &seen);

    // What the sender's agent did, and what arrived.
    let sender_qos = wait_for_qos(lab, &a.ns, agent_bin, &want)?;
    let received = intruder_rx.finish()?;
    let remote = IpAddr::V4(a.ip4).to_string();
    // The receiver keeps a record per remote VTEP and VNI: the sender's VXLAN device
    // and the crafted VXLAN come in two VNIs.
    let receiver_vtep: Vec<Value> = doc
        .pointer("/counters/qos/vteps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r.get("remote").and_then(Value::as_str) == Some(remote.as_str()))
        .cloned()
        .collect();
    let checks = qos_checks(
        &want,
        &sender_qos,
        &received,
        &receiver_vtep,
        &remote,
        &vx_a,
    );

    for (name, agent) in [("receiver", &mut receiver), ("sender", &mut sender)] {
        let st = agent.stop_with(libc::SIGINT, Duration::from_secs(10))?;
        if !st.success() {
            bail!(
                "roce-agent ({name}) exited {st} on SIGINT: {}",
                agent.stderr_text()
            );
        }
    }

    let qos_ok = checks.iter().all(|c| c.ok);
    let audit = audit_lab(lab, agent_bin)?;
    if !args.json {
        println!("Final flow table of roce-agent on {} ({}):", b.veth, b.ns);
        println!("{}", final_table.trim_end());
        println!();
        println!("Compared with what roce-gen sent (after the sender's QoS policy):");
        for (id, c) in &sent {
            let ok = seen.get(id).is_some_and(|s| {
                let one = |x: &oracle::FlowCounts| FlowTable::from([(id.clone(), x.clone())]);
                oracle::differences("sent", &one(c), "seen", &one(s)).is_empty()
            });
            let ce = match c.inner_ecn {
                Some(inner) => format!("{} inner CE, {} outer CE", inner.ce, c.ecn.ce),
                None => format!("{} CE", c.ecn.ce),
            };
            println!(
                "  {:<5} {id}: sent {} packets, {ce}, {} CNPs, {} PSN gaps, last DSCP {}",
                if ok { "ok" } else { "DIFF" },
                c.packets,
                c.cnps,
                c.psn_gaps.unwrap_or(0),
                c.last_dscp
            );
        }
        println!();
        println!(
            "Host QoS: roce-agent --mode enforce --vtep {} on the sender ({}):",
            a.veth, a.ns
        );
        for c in &checks {
            println!("  {:<5} {}", if c.ok { "ok" } else { "DIFF" }, c.detail);
        }
        println!();
        println!("Host audit: {} (exit {}):", audit.command, audit.exit);
        for line in audit.table.lines() {
            println!("  {line}");
        }
        println!(
            "  {:<5} {}",
            if audit.ok { "ok" } else { "DIFF" },
            audit.explanation
        );
        if problems.is_empty() && qos_ok && audit.ok {
            println!("MATCH: roce-agent counted exactly what roce-gen sent, the sender's markings arrived corrected, and the audit found the one mismatch planted.");
        } else {
            println!("MISMATCH: see the lines marked DIFF and the differences on stderr.");
        }
    }
    if problems.is_empty() {
        say(&format!(
            "MATCH: the agent counted exactly what the generators sent on {} flows ({total} packets; packets, bytes, ECN, CE, CNPs, ACK/NAKs, PSN gaps, DSCP, VNI, QP)",
            sent.len()
        ));
    } else {
        say(&format!(
            "MISMATCH between roce-gen and roce-agent:\n{}",
            problems.join("\n")
        ));
    }
    if !qos_ok {
        say(&format!(
            "QoS checks failed; the sender's counters: {sender_qos}; the receiver's records of {remote}: {}",
            Value::from(receiver_vtep.clone())
        ));
    }
    let mut doc = doc;
    if let Some(obj) = doc.as_object_mut() {
        obj.insert(
            "demo".into(),
            json!({
                "duration_s": d,
                "interface": b.veth,
                "namespace": b.ns,
                "sent": sent_flows,
                "packets_sent": total,
                "qos": {
                    "sender": {
                        "namespace": a.ns,
                        "interface": a.veth,
                        "mode": "enforce",
                        "vtep": true,
                        "counters": sender_qos,
                    },
                    "intruder": {
                        "port": intruder::PORT,
                        "tos_sent": INTRUDER_TOS,
                        "sent": intruder_sent,
                        "received_by_tos": received
                            .iter()
                            .map(|(tos, n)| (format!("{tos:#04x}"), json!(n)))
                            .collect::<serde_json::Map<_, _>>(),
                    },
                    // Added: one record per VNI; the first stays where it was.
                    "receiver_vtep_record": receiver_vtep.first().cloned().unwrap_or(Value::Null),
                    "receiver_vtep_records": receiver_vtep,
                    "checks": checks.iter().map(|c| json!({
                        "name": c.name, "ok": c.ok, "detail": c.detail,
                    })).collect::<Vec<_>>(),
                },
                "audit": {
                    "command": audit.command,
                    "exit": audit.exit,
                    "findings": audit.findings,
                    "planted": audit.explanation,
                    "ok": audit.ok,
                },
                "matches": problems.is_empty() && qos_ok && audit.ok,
                "differences": problems,
            }),
        );
    }
    Ok(doc)
}

/// Starts `roce-agent run --iface IF --vtep IF` in `ns` and waits until it serves.
fn start_agent(
    lab: &Lab,
    agent_bin: &Path,
    name: &str,
    ns: &str,
    iface: &str,
    extra: &[&str],
) -> Result<Proc> {
    let mut cmd = lab.command(ns, agent_bin);
    cmd.args([
        "run",
        "--iface",
        iface,
        "--vtep",
        iface,
        "--listen",
        API,
        "--interval",
        "0.5",
    ])
    .args(extra)
    .env("NO_COLOR", "1");
    let mut agent = lab.spawn(name, cmd)?;
    agent.wait_for_output("serving GET /flows", Duration::from_secs(30))?;
    Ok(agent)
}

/// What the sender's agent must have counted.
#[derive(Default)]
struct QosWant {
    /// RoCE data packets sent on a wrong DSCP.
    roce_rewritten: u64,
    /// Intruder datagrams sent.
    intruders: u64,
    /// Packets through the VXLAN device (outer DSCP 0, inner DSCP not 0).
    vtep_rewritten: u64,
    /// All VXLAN packets the receiver's decap check sees from the sender.
    vxlan_packets: u64,
}

impl QosWant {
    /// Adds one flow of a roce-gen report, as sent (before `expect` is applied).
    fn add_flow(&mut self, expect: Expect, flow: &Value) {
        let n = |k: &str| flow.get(k).and_then(Value::as_u64).unwrap_or(0);
        match expect {
            Expect::HostRewrites { .. } => self.roce_rewritten += n("packets") - n("cnps"),
            Expect::VtepPropagates => self.vtep_rewritten += n("packets"),
            Expect::AsSent => {}
        }
        if flow.get("vni").is_some_and(|v| !v.is_null()) {
            self.vxlan_packets += n("packets");
        }
    }
}

struct QosCheck {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// The sender's `counters.qos` once they reach `want` (or after 10 s).
fn wait_for_qos(lab: &Lab, ns: &str, agent_bin: &Path, want: &QosWant) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        interrupted()?;
        let doc = flows_json(lab, ns, agent_bin)?;
        let qos = doc.pointer("/counters/qos").cloned().unwrap_or(Value::Null);
        let get = |k: &str| qos.get(k).and_then(Value::as_u64).unwrap_or(0);
        let reached = get("roce_rewritten") >= want.roce_rewritten
            && get("intruders_remarked") >= want.intruders
            && get("vtep_rewritten") >= want.vtep_rewritten;
        if reached || Instant::now() > deadline {
            return Ok(qos);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn qos_checks(
    want: &QosWant,
    sender: &Value,
    received: &intruder::TosCounts,
    receiver_vtep: &[Value],
    remote: &str,
    vxlan_dev: &str,
) -> Vec<QosCheck> {
    let get = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let rewritten = get(sender, "roce_rewritten");
    let remarked = get(sender, "intruders_remarked");
    let vtep = get(sender, "vtep_rewritten");
    let arrived: u64 = received.values().sum();
    let arrived_right = received.get(&INTRUDER_TOS_REMARKED).copied().unwrap_or(0);
    // Summed over the VNIs the sender's VTEP sent.
    let total = |k: &str| receiver_vtep.iter().map(|r| get(r, k)).sum::<u64>();
    let (decap_packets, decap_mismatch) = (total("packets"), total("dscp_mismatch"));
    vec![
        QosCheck {
            name: "roce_data_rewritten",
            ok: rewritten == want.roce_rewritten,
            detail: format!(
                "RoCE data sent on DSCP 0 (qp 0x200): {rewritten} of {} packets left on DSCP {ROCE_DSCP} (roce_rewritten), ECN kept",
                want.roce_rewritten
            ),
        },
        QosCheck {
            name: "intruder_remarked",
            ok: remarked == want.intruders
                && arrived == want.intruders
                && arrived_right == arrived,
            detail: format!(
                "intruder, UDP port {} on lossless DSCP {ROCE_DSCP} (TOS {INTRUDER_TOS:#04x}): {remarked} of {} remarked (intruders_remarked); the receiving socket read TOS {INTRUDER_TOS_REMARKED:#04x} (DSCP 0, ECT(0) kept) on {arrived_right} of {arrived} datagrams",
                intruder::PORT,
                want.intruders
            ),
        },
        QosCheck {
            name: "outer_dscp_corrected",
            ok: vtep == want.vtep_rewritten
                && decap_packets >= want.vxlan_packets
                && decap_mismatch == 0,
            detail: format!(
                "VXLAN device {vxlan_dev} (tos 0) writes outer DSCP 0: {vtep} of {} packets left with the inner DSCP (vtep_rewritten); the receiver's decap check found {decap_mismatch} lost DSCPs in {decap_packets} VXLAN packets from {remote}",
                want.vtep_rewritten
            ),
        },
    ]
}

/// The host audit at the end of the demo and what it was expected to find.
struct LabAudit {
    command: String,
    exit: i32,
    table: String,
    findings: Value,
    explanation: String,
    ok: bool,
}

/// `roce-agent check` on the receiver's underlay and VXLAN device, after one planted
/// mismatch: the underlay lowered by 40 bytes after the VXLAN device was made on it
/// (the kernel keeps the VXLAN MTU, so inner frames above 1440 would be dropped). The
/// audit must find exactly that at error level, and nothing else.
fn audit_lab(lab: &Lab, agent_bin: &Path) -> Result<LabAudit> {
    let b = &lab.b;
    let vx = b
        .vxlan
        .clone()
        .ok_or_else(|| anyhow!("lab without VXLAN"))?;
    lab.exec(&b.ns, "ip", &["link", "set", "dev", &b.veth, "mtu", "1490"])?;
    // The lab's traffic is small: require an MTU both devices have (RoCE path MTU 1024).
    let args = [
        "check",
        "--iface",
        b.veth.as_str(),
        "--iface",
        vx.as_str(),
        "--mtu",
        "1400",
    ];
    let command = format!("roce-agent {}", args.join(" "));
    say(&format!(
        "host audit in {}: {command} (after lowering {} to MTU 1490)",
        b.ns, b.veth
    ));
    let bin = agent_bin.to_string_lossy();
    let table = lab.exec_status(&b.ns, &bin, &args)?;
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = lab.exec_status(&b.ns, &bin, &json_args)?;
    let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "roce-agent check --json printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let findings = doc.get("findings").cloned().unwrap_or(Value::Null);
    let errors: Vec<(&str, &str)> = findings
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f.get("severity").and_then(Value::as_str) == Some("error"))
        .map(|f| {
            (
                f.get("check").and_then(Value::as_str).unwrap_or(""),
                f.get("interface").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect();
    let exit = table.status.code().unwrap_or(-1);
    let ok = errors == [("vxlan_overhead", vx.as_str())] && exit == 1;
    let explanation = format!(
        "planted: {} lowered to 1490 after {vx} (MTU 1450) was made on it; VXLAN over IPv4 needs 50 bytes: {} found at error level{}",
        b.veth,
        if errors.is_empty() {
            "nothing".to_string()
        } else {
            errors.iter().map(|(c, i)| format!("{c} on {i}")).collect::<Vec<_>>().join(", ")
        },
        if ok { ", exactly that" } else { ", expected vxlan_overhead on the VXLAN device alone" }
    );
    Ok(LabAudit {
        command,
        exit,
        table: String::from_utf8_lossy(&table.stdout).into_owned(),
        findings,
        explanation,
        ok,
    })
}

/// Splits a command line on whitespace (the arguments here hold no spaces).
fn argv(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

fn flows_json(lab: &Lab, ns: &str, agent_bin: &Path) -> Result<Value> {
    let out = lab.exec(
        ns,
        &agent_bin.to_string_lossy(),
        &["flows", "--json", "--api", API],
    )?;
    serde_json::from_slice(&out.stdout).context("roce-agent flows --json printed no JSON")
}

fn flows_table(lab: &Lab, ns: &str, agent_bin: &Path) -> Result<String> {
    let out = lab.exec(ns, &agent_bin.to_string_lossy(), &["flows", "--api", API])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
