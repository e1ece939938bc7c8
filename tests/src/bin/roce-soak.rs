//! `roce-soak` (run by `cargo xtask soak`): the agent under a long, hostile day in the
//! namespace lab. Traffic flows all the time (roce-gen bursts from namespace A to the
//! agent's veth in B, every burst's report kept as the truth); the configuration is
//! reloaded every minute (SIGHUP, the lossless set toggled); the agent is killed with
//! SIGKILL twice and started again on its pinned datapath; the veth pair is deleted and
//! made again once. At the end:
//!
//! - every flow holds exactly what was sent (packets, bytes, CE, CNPs), summed over the
//!   interfaces it was counted on: no count lost, none reset, none doubled;
//! - each agent process's RSS stays within 10 % of what it was once warm;
//! - every reload was applied.
//!
//! Prints a table (or `--json`); exit 1 when a check fails. Needs root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use roce_testkit::bpffs::Bpffs;
use roce_testkit::lab::oracle::{self, FlowId};
use roce_testkit::lab::{Lab, LabOptions, Proc};
use serde_json::{json, Value};

const API: &str = "127.0.0.1:9473";

#[derive(Parser)]
#[command(about = "Soak the agent: traffic, reloads, kill -9 restarts, an interface re-created")]
struct Args {
    /// How long (minutes)
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Where roce-agent and roce-gen are [default: next to this binary]
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// One JSON object with the figures
    #[arg(long)]
    json: bool,
}

/// What a flow was sent, or what the agent holds for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    packets: u64,
    bytes: u64,
    ce: u64,
    cnps: u64,
}

impl Totals {
    fn add(&mut self, c: &oracle::FlowCounts) {
        self.packets += c.packets;
        self.bytes += c.bytes;
        self.ce += c.ecn.ce;
        self.cnps += c.cnps;
    }
}

/// Per-flow totals of a `flows` array (an agent document or a roce-gen report), summed
/// over interfaces: a flow re-created on a new ifindex is the same queue pair.
fn totals(doc: &Value, ingress_only: bool) -> Result<BTreeMap<FlowId, Totals>> {
    let flows = doc["flows"].as_array().context("no flows array")?;
    let mut out: BTreeMap<FlowId, Totals> = BTreeMap::new();
    for f in flows {
        if ingress_only && f["direction"] != "ingress" {
            continue;
        }
        let (id, c) = oracle::flow_from_json(f)?;
        out.entry(id).or_default().add(&c);
    }
    Ok(out)
}

/// One agent process: its pid, and RSS samples once warm.
struct Life {
    pid: u32,
    started: Instant,
    rss_kb: Vec<u64>,
}

struct Soak {
    lab: Lab,
    bpffs: Bpffs,
    bin: PathBuf,
    config: PathBuf,
    agent: Option<Proc>,
    lives: Vec<Life>,
    sent: BTreeMap<FlowId, Totals>,
    bursts: u64,
    reloads: u64,
    lossless_24: bool,
}

impl Soak {
    fn write_config(&self) -> Result<()> {
        let lossless = if self.lossless_24 { "24, 26" } else { "26" };
        let text = format!(
            "interfaces = [\"{}\"]\nmode = \"enforce\"\nevents_sample = 100\n\n[qos]\nlossless_dscps = [{lossless}]\n",
            self.lab.b.veth
        );
        std::fs::write(&self.config, text).context("writing the config")
    }

    fn start_agent(&mut self) -> Result<()> {
        let args = [
            "--config".to_string(),
            self.config.display().to_string(),
            "--listen".to_string(),
            API.to_string(),
            "--interval".to_string(),
            "0.5".to_string(),
            "--pin-dir".to_string(),
            self.bpffs.pin_arg(),
        ];
        let name = format!("roce-agent-{}", self.lives.len() + 1);
        let agent =
            self.lab
                .start_agent(&self.lab.b.ns, &self.bin.join("roce-agent"), &name, &args)?;
        let pid = agent.pid().context("no pid")?;
        self.lives.push(Life {
            pid,
            started: Instant::now(),
            rss_kb: Vec::new(),
        });
        self.agent = Some(agent);
        Ok(())
    }

    fn agent(&mut self) -> Result<&mut Proc> {
        self.agent.as_mut().context("no agent")
    }

    fn signal(&mut self, signal: i32) -> Result<()> {
        self.agent()?.signal(signal)
    }

    /// One burst of four flows with CE marks and CNPs; its report joins the truth.
    fn burst(&mut self) -> Result<()> {
        let dst = self.lab.b.ip4.to_string();
        let mut cmd = self.lab.command(&self.lab.a.ns, self.bin.join("roce-gen"));
        cmd.args([
            "--iface",
            &self.lab.a.veth,
            "--dst",
            &dst,
            "--dst-mac",
            &self.lab.b.mac,
        ])
        .args(["--flows", "4", "--count", "400", "--ce", "8", "--cnp", "4"])
        .args(["--rate", "8000", "--json"]);
        let out = cmd.output().context("roce-gen")?;
        ensure!(
            out.status.success(),
            "roce-gen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).context("roce-gen JSON")?;
        for (id, t) in totals(&report, false)? {
            let e = self.sent.entry(id).or_default();
            e.packets += t.packets;
            e.bytes += t.bytes;
            e.ce += t.ce;
            e.cnps += t.cnps;
        }
        self.bursts += 1;
        Ok(())
    }

    fn reload(&mut self) -> Result<()> {
        self.lossless_24 = !self.lossless_24;
        self.write_config()?;
        let before = self
            .agent()?
            .stderr_text()
            .matches("configuration reloaded")
            .count();
        self.signal(libc::SIGHUP)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .agent()?
            .stderr_text()
            .matches("configuration reloaded")
            .count()
            == before
        {
            ensure!(
                Instant::now() < deadline,
                "reload not applied:\n{}",
                self.agent()?.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.reloads += 1;
        Ok(())
    }

    fn sample_rss(&mut self) {
        let Some(life) = self.lives.last_mut() else {
            return;
        };
        // Warm: the first poll, audit and scrape have run.
        if life.started.elapsed() < Duration::from_secs(20) {
            return;
        }
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", life.pid)).unwrap_or_default();
        if let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
        {
            life.rss_kb.push(kb);
        }
    }

    fn agent_doc(&self) -> Result<Value> {
        let out = self.lab.exec(
            &self.lab.b.ns,
            &self.bin.join("roce-agent").to_string_lossy(),
            &["flows", "--json", "--api", API],
        )?;
        serde_json::from_slice(&out.stdout).context("flows --json")
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "the soak needs root (namespaces, bpffs, XDP)"
    );
    let bin = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .context("the binary's directory")?,
    };
    let lab = Lab::new(LabOptions {
        vxlan: false,
        ipv6: false,
        ..LabOptions::default()
    })?;
    let bpffs = Bpffs::new(&bin.join("roce-agent"))?;
    let config = lab.dir.join("soak.toml");
    let mut soak = Soak {
        lab,
        bpffs,
        bin,
        config,
        agent: None,
        lives: Vec::new(),
        sent: BTreeMap::new(),
        bursts: 0,
        reloads: 0,
        lossless_24: false,
    };
    soak.write_config()?;
    soak.start_agent()?;

    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let kills = [total.mul_f64(0.3), total.mul_f64(0.6)];
    let recreate = total.mul_f64(0.45);
    let (mut killed, mut recreated) = (0usize, false);
    let start = Instant::now();
    let mut next_reload = Duration::from_secs(60);
    let mut last_progress = Instant::now();
    while start.elapsed() < total {
        let t = start.elapsed();
        soak.burst()?;
        soak.sample_rss();
        if t >= next_reload {
            soak.reload()?;
            next_reload += Duration::from_secs(60);
        }
        if killed < kills.len() && t >= kills[killed] {
            if let Some(mut a) = soak.agent.take() {
                a.stop_with(libc::SIGKILL, Duration::from_secs(5))?;
            }
            // Traffic while no agent runs: the pinned datapath counts it.
            for _ in 0..3 {
                soak.burst()?;
                std::thread::sleep(Duration::from_millis(300));
            }
            soak.start_agent()?;
            killed += 1;
        }
        if !recreated && t >= recreate {
            soak.lab.recreate_veth()?;
            // The agent follows the new ifindex within an interval.
            std::thread::sleep(Duration::from_secs(2));
            recreated = true;
        }
        if last_progress.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "[soak] {:.0}/{:.0} s: {} bursts, {} reloads, {} kills, veth re-created: {recreated}",
                t.as_secs_f64(),
                total.as_secs_f64(),
                soak.bursts,
                soak.reloads,
                killed
            );
            last_progress = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // The agent's table must settle at exactly what was sent.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (doc, got) = loop {
        let doc = soak.agent_doc()?;
        let got = totals(&doc, true)?;
        if got == soak.sent || Instant::now() > deadline {
            break (doc, got);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // Every sampled event is in the pinned ring (or counted as dropped) and every
    // record was read, by the agent alive when it was written or by the next one.
    let events = soak.lab.events_read(
        &soak.lab.b.ns,
        API,
        || Ok(doc.clone()),
        Duration::from_secs(15),
    )?;
    let sent_packets: u64 = soak.sent.values().map(|t| t.packets).sum();
    let got_packets: u64 = got.values().map(|t| t.packets).sum();
    let rss: Vec<Value> = soak
        .lives
        .iter()
        .map(|l| {
            let (min, max) = (
                l.rss_kb.iter().min().copied().unwrap_or(0),
                l.rss_kb.iter().max().copied().unwrap_or(0),
            );
            json!({"pid": l.pid, "samples": l.rss_kb.len(), "rss_kb_min": min, "rss_kb_max": max,
                   "growth": if min > 0 { max as f64 / min as f64 - 1.0 } else { 0.0 }})
        })
        .collect();
    let worst_growth = rss
        .iter()
        .filter_map(|r| r["growth"].as_f64())
        .fold(0.0f64, f64::max);
    let figures = json!({
        "name": "soak",
        "minutes": args.minutes,
        "bursts": soak.bursts,
        "packets_sent": sent_packets,
        "packets_counted": got_packets,
        "flows_equal": got == soak.sent,
        "reloads": soak.reloads,
        "kill9_restarts": killed,
        "veth_recreated": recreated,
        "rss": rss,
        "worst_rss_growth": worst_growth,
        "events": doc["counters"]["events"],
        "events_dropped": doc["counters"]["events_dropped"],
        "events_ring_written": events.written,
        "events_ring_read": events.read,
        "events_all_read": events.all_read(),
        "flows_created": doc["counters"]["flows_created"],
    });
    if args.json {
        println!("{figures}");
    } else {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    }
    if got != soak.sent {
        bail!(
            "the agent's flows differ from what was sent:\nagent {got:#?}\nsent  {:#?}",
            soak.sent
        );
    }
    ensure!(
        events.emitted > 0 && events.all_read(),
        "sampled events lost: {events:?} (emitted: counters.events; written and read: the EVENTS ring)"
    );
    ensure!(
        worst_growth <= 0.10,
        "RSS grew by {:.1} % in one agent's life",
        worst_growth * 100.0
    );
    if let Some(mut a) = soak.agent.take() {
        a.stop_with(libc::SIGTERM, Duration::from_secs(10))?;
    }
    Ok(())
}
