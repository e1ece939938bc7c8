//! `cargo xtask demo`: the agent watching RoCEv2 traffic in a namespace lab.
//!
//! Builds the release binaries, builds a lab (two namespaces, a veth pair, a VXLAN
//! pair with `tos inherit`), starts `roce-agent run` on the receiver's veth, drives
//! several `roce-gen`s at once for `--duration` seconds (plain RoCEv2 from crafted
//! frames and from a UDP socket, RoCE through the kernel's VXLAN device, crafted VXLAN
//! whose outer header an underlay switch marked CE; CE marks, CNPs, ACK/NAKs), shows
//! the agent's flow table every second on stderr, and finally compares the agent's
//! table with what the generators say they sent. Exit status 0 only when every flow
//! matches. Everything is torn down at the end, on error, and on Ctrl-C / SIGTERM.
//!
//! With `--json`, stdout holds only the agent's final flow document (as `roce-agent
//! flows --json` prints it) plus a `demo` object: what was sent and whether it matched.

use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use xtask::lab::oracle::{self, FlowTable};
use xtask::lab::{bins, namespace_exists, Lab, LabOptions, Proc};

/// The agent's API inside the receiver's namespace.
const API: &str = "127.0.0.1:9473";

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

/// One generator run: a name and its arguments.
struct GenRun {
    name: &'static str,
    args: Vec<String>,
}

fn demo(args: &Args) -> Result<Value> {
    xtask::setup::ensure_all()?;
    interrupted()?;
    say("building release binaries (cargo build --release -p roce-agent)");
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
    let mut lab = Lab::new(LabOptions::default())?;
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
        "lab {}: {} {} ({}) --veth-- {} {} ({}); VXLAN VNI {} {} -> {}",
        lab.name, a.ns, a.veth, a.ip4, b.ns, b.veth, b.ip4, lab.vni, vx_a, vx_b_ip
    ));

    let mut agent_cmd = lab.command(&b.ns, agent_bin);
    agent_cmd
        .args([
            "run",
            "--iface",
            &b.veth,
            "--listen",
            API,
            "--interval",
            "0.5",
        ])
        .env("NO_COLOR", "1");
    let mut agent = lab.spawn("roce-agent", agent_cmd)?;
    agent.wait_for_output("serving GET /flows", Duration::from_secs(30))?;
    say(&format!(
        "roce-agent attached to {} in {}; API {API} there",
        b.veth, b.ns
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
        },
        GenRun {
            name: "plain-udp",
            args: argv(&format!(
                "-i {veth} --via udp --dst {b4} --qp 0x200 --sport 50000 \
                 --count {} --ce {} --cnp {}",
                n(10),
                n(3),
                n(1)
            )),
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
        },
    ];
    let mut gens: Vec<(&'static str, Proc)> = Vec::new();
    for r in &runs {
        let mut cmd = lab.command(&a.ns, gen_bin);
        cmd.args(&r.args).args(["--duration", &dur, "--json"]);
        gens.push((r.name, lab.spawn(&format!("roce-gen-{}", r.name), cmd)?));
    }
    say(&format!(
        "{} generators sending for {d} s: plain RoCEv2 (crafted frames and a UDP socket), RoCE through VXLAN device {vx_a} (VNI {}), crafted VXLAN VNI 7001 with outer CE",
        gens.len(),
        lab.vni
    ));

    // Live view until every generator is done.
    let start = Instant::now();
    let mut next_view = start + Duration::from_secs(1);
    loop {
        interrupted()?;
        let mut running = 0;
        for (name, g) in gens.iter_mut() {
            match g.try_status()? {
                None => running += 1,
                Some(st) if st.success() => {}
                Some(st) => bail!("roce-gen {name} failed ({st}): {}", g.stderr_text().trim()),
            }
        }
        if let Some(st) = agent.try_status()? {
            bail!("roce-agent exited ({st}): {}", agent.stderr_text());
        }
        if running == 0 {
            break;
        }
        if Instant::now() >= next_view {
            next_view += Duration::from_secs(1);
            let table = flows_table(lab, agent_bin)?;
            eprintln!(
                "--- t = {:>2} s ---------------------------------------------------------------\n{}",
                start.elapsed().as_secs(),
                table.trim_end()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // What the generators sent.
    let mut reports = Vec::new();
    for (name, g) in &gens {
        let r: Value = serde_json::from_str(&g.stdout_text())
            .with_context(|| format!("roce-gen {name} printed no JSON report"))?;
        reports.push(r);
    }
    let mut sent = FlowTable::new();
    let mut sent_flows = Vec::new();
    for r in &reports {
        if let Some(fl) = r.get("flows").and_then(Value::as_array) {
            sent_flows.extend(fl.iter().cloned());
        }
        for (id, c) in oracle::flows_from_doc(r, |_| true)? {
            if sent.insert(id.clone(), c).is_some() {
                bail!("two generators sent flow {id}");
            }
        }
    }
    let total: u64 = sent.values().map(|c| c.packets).sum();

    // The agent's table once it has read everything (it polls every 0.5 s).
    let ifname = b.veth.clone();
    let keep = |f: &Value| {
        f.get("ifname").and_then(Value::as_str) == Some(ifname.as_str())
            && f.get("direction").and_then(Value::as_str) == Some("ingress")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (doc, seen) = loop {
        interrupted()?;
        let doc = flows_json(lab, agent_bin)?;
        let seen = oracle::flows_from_doc(&doc, keep)?;
        let n: u64 = seen.values().map(|c| c.packets).sum();
        if n >= total || Instant::now() > deadline {
            break (doc, seen);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let final_table = flows_table(lab, agent_bin)?;
    let problems = oracle::differences("roce-gen", &sent, "roce-agent", &seen);

    let st = agent.stop_with(libc::SIGINT, Duration::from_secs(10))?;
    if !st.success() {
        bail!("roce-agent exited {st} on SIGINT: {}", agent.stderr_text());
    }

    if !args.json {
        println!("Final flow table of roce-agent on {} ({}):", b.veth, b.ns);
        println!("{}", final_table.trim_end());
        println!();
        println!("Compared with what roce-gen sent:");
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
                "  {:<5} {id}: sent {} packets, {ce}, {} CNPs, {} PSN gaps",
                if ok { "ok" } else { "DIFF" },
                c.packets,
                c.cnps,
                c.psn_gaps.unwrap_or(0)
            );
        }
        if problems.is_empty() {
            println!("MATCH: roce-agent counted exactly what roce-gen sent.");
        } else {
            println!("MISMATCH: see the differences on stderr.");
        }
    }
    if problems.is_empty() {
        say(&format!(
            "MATCH: the agent counted exactly what the generators sent on {} flows ({total} packets; packets, bytes, ECN, CE, CNPs, ACK/NAKs, PSN gaps, VNI, QP)",
            sent.len()
        ));
    } else {
        say(&format!(
            "MISMATCH between roce-gen and roce-agent:\n{}",
            problems.join("\n")
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
                "matches": problems.is_empty(),
                "differences": problems,
            }),
        );
    }
    Ok(doc)
}

/// Splits a command line on whitespace (the arguments here hold no spaces).
fn argv(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

fn flows_json(lab: &Lab, agent_bin: &Path) -> Result<Value> {
    let out = lab.exec(
        &lab.b.ns,
        &agent_bin.to_string_lossy(),
        &["flows", "--json", "--api", API],
    )?;
    serde_json::from_slice(&out.stdout).context("roce-agent flows --json printed no JSON")
}

fn flows_table(lab: &Lab, agent_bin: &Path) -> Result<String> {
    let out = lab.exec(
        &lab.b.ns,
        &agent_bin.to_string_lossy(),
        &["flows", "--api", API],
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
