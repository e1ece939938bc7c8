//! The datapath outlives the agent (needs root): the real `roce-agent` pinned under a
//! bpffs that the test mounts itself, in a namespace lab with `roce-gen` sending from
//! namespace A to the agent's veth in namespace B, tcpdump on A's veth as the wire.
//!
//! - kill -9 under traffic, a restart, and the same traffic again: every flow holds
//!   exactly twice the first run's figures (nothing lost while no agent ran, nothing
//!   counted twice), and non-RoCE traffic on the lossless DSCP sent while no agent ran
//!   leaves remarked;
//! - SIGHUP with a new lossless set changes the remarking on the wire; SIGHUP with a
//!   broken file changes nothing and the log names its line;
//! - `detach` leaves no program, link, qdisc or pin of the agent behind;
//! - a pin of another layout version is refused with the command that removes it.
//!
//! The bpffs is the test kit's [`Bpffs`] (under /run, outside /sys, which `ip netns
//! exec` remounts), detached and unmounted on drop, also when a test fails.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use roce_testkit::bpffs::Bpffs;
use roce_testkit::lab::oracle::{self, FlowTable};
use roce_testkit::lab::{bins, Lab, LabOptions, Proc};
use roce_testkit::sock::set_int_option;
use roce_testkit::tshark;
use serde_json::Value;

const API: &str = "127.0.0.1:9473";
/// A UDP port that is neither RoCE nor VXLAN.
const OTHER_PORT: u16 = 5201;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the pinned-datapath tests need root (bpffs, ip netns, XDP attach)"
    );
}

/// A lab, a bpffs, and the agent on B's veth pinned there. Fields drop in order: the
/// agent first, then the pins (detached), then the lab.
struct Rig {
    agent: Option<Proc>,
    bpffs: Bpffs,
    lab: Lab,
    bin: PathBuf,
    starts: u32,
    /// Environment variables of every agent started (test knobs).
    env: Vec<(&'static str, &'static str)>,
}

impl Rig {
    fn new() -> Result<Rig> {
        require_root();
        let bin = bins::agent_bins_for_test()?;
        let lab = Lab::new(LabOptions {
            vxlan: false,
            ipv6: false,
            ..LabOptions::default()
        })?;
        let bpffs = Bpffs::new(&bin.join("roce-agent"))?;
        Ok(Rig {
            agent: None,
            bpffs,
            lab,
            bin,
            starts: 0,
            env: Vec::new(),
        })
    }

    fn agent_exe(&self) -> String {
        self.bin.join("roce-agent").display().to_string()
    }

    /// Starts `roce-agent run` in B with `args` plus the pin directory and the API.
    fn start_agent(&mut self, args: &[&str]) -> Result<()> {
        let pin_dir = self.bpffs.pin_arg();
        let mut all = args.to_vec();
        all.extend(["--listen", API, "--interval", "0.2", "--pin-dir", &pin_dir]);
        self.starts += 1;
        let name = format!("roce-agent-{}", self.starts);
        let agent = self.lab.start_agent_with_env(
            &self.lab.b.ns,
            &self.bin.join("roce-agent"),
            &name,
            &all,
            &self.env,
        )?;
        self.agent = Some(agent);
        Ok(())
    }

    fn agent(&mut self) -> Result<&mut Proc> {
        self.agent.as_mut().context("no agent running")
    }

    fn signal(&mut self, signal: i32) -> Result<()> {
        self.agent()?.signal(signal)
    }

    /// kill -9: the agent gets no chance to clean up.
    fn kill_agent(&mut self) -> Result<()> {
        if let Some(mut a) = self.agent.take() {
            a.stop_with(libc::SIGKILL, Duration::from_secs(5))?;
        }
        Ok(())
    }

    /// roce-gen in A sending `traffic` (its flows, counts, marks, rate) to B's veth,
    /// reporting in JSON.
    fn gen_command(&self, traffic: &[&str]) -> std::process::Command {
        let mut cmd = self.lab.command(&self.lab.a.ns, self.bin.join("roce-gen"));
        cmd.args(["--iface", &self.lab.a.veth, "--dst"])
            .arg(self.lab.b.ip4.to_string())
            .args(["--dst-mac", &self.lab.b.mac])
            .args(traffic)
            .arg("--json");
        cmd
    }

    /// roce-gen in B sending `traffic` out of B's veth to A: `tc_egress` counts it.
    fn gen_from_b(&self, traffic: &[&str]) -> Result<u64> {
        let out = self
            .lab
            .command(&self.lab.b.ns, self.bin.join("roce-gen"))
            .args(["--iface", &self.lab.b.veth, "--dst"])
            .arg(self.lab.a.ip4.to_string())
            .args(["--dst-mac", &self.lab.a.mac])
            .args(traffic)
            .arg("--json")
            .output()
            .context("running roce-gen in B")?;
        ensure!(
            out.status.success(),
            "roce-gen in B: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value =
            serde_json::from_slice(&out.stdout).context("roce-gen printed no JSON")?;
        let sent = oracle::flows_from_doc(&report, |_| true)?;
        Ok(sent.values().map(|c| c.packets).sum())
    }

    /// Runs roce-gen with `args` ([`Rig::gen_command`]) and returns its report.
    fn gen(&self, args: &[&str]) -> Result<Value> {
        let out = self
            .gen_command(args)
            .output()
            .context("running roce-gen")?;
        if !out.status.success() {
            bail!(
                "roce-gen {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).context("roce-gen printed no JSON")
    }

    /// Waits until `n` `GET /events` streams are open, as `/metrics` counts them (10 s
    /// at most): each receives what is sampled from then on.
    fn wait_for_subscribers(&self, n: usize) -> Result<()> {
        let want = format!("roce_agent_events_subscribers {n}");
        let start = Instant::now();
        loop {
            let metrics = self.metrics()?;
            if metrics.lines().any(|l| l == want) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(10) {
                bail!(
                    "not {want:?} after 10 s: {:?}",
                    metrics
                        .lines()
                        .find(|l| l.starts_with("roce_agent_events_subscribers"))
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /metrics` of the running agent.
    fn metrics(&self) -> Result<String> {
        let out = self.lab.exec(
            &self.lab.b.ns,
            "curl",
            &["-s", &format!("http://{API}/metrics")],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `roce-agent flows --json` of the running agent.
    fn flows_doc(&self) -> Result<Value> {
        let out = self.lab.exec(
            &self.lab.b.ns,
            &self.agent_exe(),
            &["flows", "--json", "--api", API],
        )?;
        serde_json::from_slice(&out.stdout).context("flows --json")
    }

    /// The agent's ingress flows on B's veth once they hold `packets` packets.
    fn flows_settled(&self, packets: u64) -> Result<FlowTable> {
        self.settled("ingress", packets)
    }

    /// The agent's flows of `direction` on B's veth once they hold `packets` packets.
    fn settled(&self, direction: &str, packets: u64) -> Result<FlowTable> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let ifname = self.lab.b.veth.clone();
        loop {
            let doc = self.flows_doc()?;
            let table = oracle::flows_from_doc(&doc, |f| {
                f.get("ifname").and_then(Value::as_str) == Some(ifname.as_str())
                    && f.get("direction").and_then(Value::as_str) == Some(direction)
            })?;
            let n: u64 = table.values().map(|c| c.packets).sum();
            if n == packets {
                return Ok(table);
            }
            if n > packets || Instant::now() > deadline {
                bail!("the agent holds {n} packets, expected {packets}: {doc}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends `count` non-RoCE UDP datagrams from B to A with DSCP `dscp`: they leave
    /// through B's veth, where `tc_egress` applies the host policy.
    fn send_other(&self, dscp: u8, count: u32) -> Result<()> {
        let (src, dst) = (self.lab.b.ip4, self.lab.a.ip4);
        roce_testkit::lab::in_namespace(&self.lab.b.ns, move || {
            let sock = UdpSocket::bind((src, 0)).context("bind")?;
            set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, i32::from(dscp) << 2)?;
            for _ in 0..count {
                sock.send_to(b"not roce", (dst, OTHER_PORT))
                    .context("send")?;
            }
            Ok(())
        })
    }

    /// The DSCPs on the wire (A's veth) of `count` non-RoCE datagrams sent with `dscp`.
    fn wire_dscps(&self, name: &str, dscp: u8, count: u32) -> Result<Vec<u64>> {
        let filter = format!("udp dst port {OTHER_PORT}");
        let capture = self
            .lab
            .capture(&self.lab.a.ns, &self.lab.a.veth, name, true, &filter)?;
        self.send_other(dscp, count)?;
        let pcap = capture.finish()?;
        let rows = tshark::Fields::new(&["ip.dsfield.dscp"]).run(&pcap)?;
        rows.iter()
            .map(|r| tshark::number(r.first(0).unwrap_or("")))
            .collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // The agent goes first so that `detach` finds the directory unlocked.
        if let Some(mut a) = self.agent.take() {
            let _ = a.stop_with(libc::SIGKILL, Duration::from_secs(5));
        }
    }
}

/// Every flow's figures doubled, to compare a second identical run with (the
/// last DSCP, source port and families stay).
fn doubled(table: &FlowTable) -> FlowTable {
    let twice = |e: &mut oracle::Ecn| {
        e.not_ect *= 2;
        e.ect1 *= 2;
        e.ect0 *= 2;
        e.ce *= 2;
    };
    let mut out = table.clone();
    for c in out.values_mut() {
        c.packets *= 2;
        c.bytes *= 2;
        twice(&mut c.ecn);
        if let Some(e) = c.inner_ecn.as_mut() {
            twice(e);
        }
        c.cnps *= 2;
        c.acks *= 2;
        c.naks *= 2;
        c.rnr_naks *= 2;
        // PSN gaps are no sum: the second run repeats the first one's PSNs (behind
        // the expected one: retransmissions). The traffic has none.
    }
    out
}

#[test]
fn kill_9_under_traffic_loses_no_count_and_counts_nothing_twice() -> Result<()> {
    let mut rig = Rig::new()?;
    let b_veth = rig.lab.b.veth.clone();
    rig.start_agent(&["--iface", &b_veth, "--mode", "enforce"])?;
    // Three flows with CE marks and CNPs; long enough (0.4 s) to kill the agent
    // while it flows.
    let args = [
        "--flows", "3", "--count", "2000", "--ce", "50", "--cnp", "20", "--rate", "5000",
    ];
    let first = rig.gen(&args)?;
    let sent = oracle::flows_from_doc(&first, |_| true)?;
    let packets: u64 = sent.values().map(|c| c.packets).sum();
    let once = rig.flows_settled(packets)?;

    // The same traffic again, with the agent killed while it flows.
    let sender = rig.lab.spawn("roce-gen-2", rig.gen_command(&args))?;
    std::thread::sleep(Duration::from_millis(150));
    rig.kill_agent()?;
    let mut sender = sender;
    ensure!(
        sender.wait()?.success(),
        "roce-gen: {}",
        sender.stderr_text()
    );
    // Non-RoCE on the lossless DSCP while no agent runs: the pinned tc program remarks.
    let dscps = rig.wire_dscps("no-agent", 26, 20)?;
    ensure!(
        dscps == vec![0; 20],
        "DSCPs on the wire with no agent: {dscps:?}"
    );

    rig.start_agent(&["--iface", &b_veth, "--mode", "enforce"])?;
    let log = rig.agent()?.stderr_text();
    ensure!(log.contains("adopted the pinned datapath"), "{log}");
    let twice = rig.flows_settled(2 * packets)?;
    ensure!(
        twice == doubled(&once),
        "after the restart:\n{twice:#?}\nexpected twice:\n{once:#?}"
    );
    // Every sampled event (CE, CNP) is in the pinned ring, and every record in it was
    // read: those the killed agent left and those written while no agent ran too.
    let account = rig.lab.events_read(
        &rig.lab.b.ns,
        API,
        || rig.flows_doc(),
        Duration::from_secs(10),
    )?;
    ensure!(
        account.emitted > 0 && account.all_read(),
        "sampled events not all read within 10 s: {account:?}, dropped {}",
        rig.flows_doc()?["counters"]["events_dropped"]
    );
    Ok(())
}

#[test]
fn sighup_changes_remarking_on_the_wire_and_a_bad_file_changes_nothing() -> Result<()> {
    let mut rig = Rig::new()?;
    let config = rig.lab.dir.join("agent.toml");
    let veth = rig.lab.b.veth.clone();
    let write = |lossless: &str| -> Result<()> {
        let text = format!(
            "interfaces = [\"{}\"]\nmode = \"enforce\"\n\n[qos]\nlossless_dscps = [{lossless}]\nremark_dscp = 0\n",
            veth
        );
        std::fs::write(&config, text).context("writing the config")
    };
    write("26")?;
    let config_arg = config.display().to_string();
    rig.start_agent(&["--config", &config_arg])?;
    // DSCP 24 is not lossless yet: it leaves untouched.
    let before = rig.wire_dscps("before", 24, 10)?;
    ensure!(before == vec![24; 10], "before the reload: {before:?}");

    write("24, 26")?;
    rig.signal(libc::SIGHUP)?;
    rig.agent()?
        .wait_for_output("SIGHUP: configuration reloaded", Duration::from_secs(10))?;
    let after = rig.wire_dscps("after", 24, 10)?;
    ensure!(after == vec![0; 10], "after the reload: {after:?}");

    // Line 5 is wrong (DSCP 99): refused, and the policy in force stays.
    let broken = format!(
        "interfaces = [\"{}\"]\nmode = \"enforce\"\n\n[qos]\nlossless_dscps = [24, 99]\n",
        rig.lab.b.veth
    );
    std::fs::write(&config, broken)?;
    rig.signal(libc::SIGHUP)?;
    rig.agent()?
        .wait_for_output("the configuration was refused", Duration::from_secs(10))?;
    let log = rig.agent()?.stderr_text();
    ensure!(
        log.contains(&format!("{config_arg}:5:")),
        "the refusal names no line: {log}"
    );
    let still = rig.wire_dscps("refused", 24, 10)?;
    ensure!(still == vec![0; 10], "after a refused reload: {still:?}");
    let metrics = rig.metrics()?;
    for line in [
        "roce_agent_config_reloads_total 1",
        "roce_agent_config_reload_failures_total 1",
        "roce_agent_config_last_reload_successful 0",
    ] {
        ensure!(
            metrics.lines().any(|l| l == line),
            "{line} not in /metrics:\n{metrics}"
        );
    }
    Ok(())
}

#[test]
fn sighup_turns_sampled_events_on_without_a_restart() -> Result<()> {
    let mut rig = Rig::new()?;
    let config = rig.lab.dir.join("agent.toml");
    let veth = rig.lab.b.veth.clone();
    let write = |sample: u32| -> Result<()> {
        let text = format!("interfaces = [\"{veth}\"]\nevents_sample = {sample}\n");
        std::fs::write(&config, text).context("writing the config")
    };
    write(0)?;
    let config_arg = config.display().to_string();
    rig.start_agent(&["--config", &config_arg])?;
    let url = format!("http://{API}/events");
    let off = rig
        .lab
        .exec_status(&rig.lab.b.ns, "curl", &["-s", "-w", "%{http_code}", &url])?;
    let off = String::from_utf8_lossy(&off.stdout).into_owned();
    ensure!(
        off.contains("events are off") && off.ends_with("503"),
        "GET /events with events off: {off}"
    );
    let args = [
        "--flows", "1", "--count", "100", "--ce", "10", "--rate", "5000",
    ];
    rig.gen(&args)?;
    rig.flows_settled(100)?;
    let doc = rig.flows_doc()?;
    let account = rig.lab.events_account(&rig.lab.b.ns, API, &doc)?;
    ensure!(
        account.emitted == 0 && account.written == 0,
        "events while off: {account:?}"
    );

    write(1)?;
    rig.signal(libc::SIGHUP)?;
    rig.agent()?
        .wait_for_output("configuration reloaded", Duration::from_secs(10))?;
    // A subscriber of GET /events receives the ten CE events of the same traffic again.
    let mut follower = {
        let mut cmd = rig.lab.command(&rig.lab.b.ns, rig.bin.join("roce-agent"));
        cmd.args([
            "events",
            "--json",
            "--kind",
            "ce",
            "--api",
            API,
            "--duration",
            "4",
        ]);
        rig.lab.spawn("roce-agent-events", cmd)?
    };
    rig.wait_for_subscribers(1)?;
    rig.gen(&args)?;
    rig.flows_settled(200)?;
    ensure!(
        follower.wait()?.success(),
        "roce-agent events: {}",
        follower.stderr_text()
    );
    let lines = follower.stdout_text();
    let ce = lines
        .lines()
        .filter(|l| l.contains("\"kind\":\"ce\""))
        .count();
    ensure!(ce == 10, "{ce} CE events streamed, expected 10:\n{lines}");
    let doc = rig.flows_doc()?;
    let account = rig.lab.events_account(&rig.lab.b.ns, API, &doc)?;
    ensure!(
        account.emitted == 10 && account.all_read(),
        "after the reload: {account:?}"
    );
    Ok(())
}

/// The ids of the programs pinned under `dir/progs` (bpftool's JSON).
fn pinned_program_ids(dir: &Path) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir.join("progs"))? {
        ids.push(pinned_program_id(&entry?.path())?);
    }
    Ok(ids)
}

/// The id of the program pinned at `path` (bpftool's JSON).
fn pinned_program_id(path: &Path) -> Result<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show", "pinned"])
        .arg(path)
        .output()
        .context("bpftool")?;
    let v: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "bpftool on {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    v["id"].as_u64().context("no id")
}

/// Whether the kernel still has program `id` / any link of it.
fn program_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn links_of(ids: &[u64]) -> Result<Vec<Value>> {
    let out = Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()?;
    let links: Vec<Value> = serde_json::from_slice(&out.stdout).context("bpftool link show")?;
    Ok(links
        .into_iter()
        .filter(|l| l["prog_id"].as_u64().is_some_and(|p| ids.contains(&p)))
        .collect())
}

#[test]
fn sigterm_leaves_the_datapath_running_and_detach_removes_all_of_it() -> Result<()> {
    let mut rig = Rig::new()?;
    let (b_veth, a_veth) = (rig.lab.b.veth.clone(), rig.lab.a.veth.clone());
    let _ = a_veth;
    rig.start_agent(&["--iface", &b_veth, "--vtep", &b_veth, "--mode", "enforce"])?;
    let ids = pinned_program_ids(&rig.bpffs.pin_dir())?;
    ensure!(ids.len() == 4, "pinned programs: {ids:?}");
    // While it runs, the directory is its own: a second agent and `detach` are refused
    // and change nothing.
    let pin = rig.bpffs.pin_arg();
    let second = rig.lab.exec_status(
        &rig.lab.b.ns,
        &rig.agent_exe(),
        &[
            "run",
            "--iface",
            &b_veth,
            "--listen",
            "127.0.0.1:9480",
            "--pin-dir",
            &pin,
        ],
    )?;
    let err = String::from_utf8_lossy(&second.stderr).into_owned();
    ensure!(
        second.status.code() == Some(1) && err.contains("another roce-agent is running"),
        "{err}"
    );
    let refused = rig.lab.exec_status(
        &rig.lab.b.ns,
        &rig.agent_exe(),
        &["detach", "--pin-dir", &pin],
    )?;
    ensure!(
        !refused.status.success(),
        "detach under a running agent succeeded"
    );
    ensure!(
        pinned_program_ids(&rig.bpffs.pin_dir())? == ids,
        "pins changed"
    );
    rig.signal(libc::SIGTERM)?;
    let mut agent = rig.agent.take().context("agent")?;
    ensure!(agent.wait()?.success(), "{}", agent.stderr_text());
    // XDP, tc egress and tc ingress stay attached without the agent.
    let links = links_of(&ids)?;
    ensure!(links.len() == 3, "links after SIGTERM: {links:?}");
    let dscps = rig.wire_dscps("after-sigterm", 26, 5)?;
    ensure!(dscps == vec![0; 5], "no remarking after SIGTERM: {dscps:?}");

    let out = rig.lab.exec(
        &rig.lab.b.ns,
        &rig.agent_exe(),
        &["detach", "--pin-dir", &rig.bpffs.pin_arg()],
    )?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(said.contains("detached 3 links"), "{said}");
    ensure!(
        !rig.bpffs.pin_dir().exists(),
        "the pin directory is still there"
    );
    // Programs go once the kernel has let go of their last reference (RCU).
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids.iter().any(|id| program_exists(*id)) {
        ensure!(Instant::now() < deadline, "programs left: {ids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(links_of(&ids)?.is_empty(), "links left");
    let qdiscs = rig
        .lab
        .exec(&rig.lab.b.ns, "tc", &["qdisc", "show", "dev", &b_veth])?;
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout).into_owned();
    ensure!(!qdiscs.contains("clsact"), "a qdisc left: {qdiscs}");
    let dscps = rig.wire_dscps("after-detach", 26, 5)?;
    ensure!(
        dscps == vec![26; 5],
        "still remarked after detach: {dscps:?}"
    );
    // A second detach finds nothing and says so.
    let out = rig.lab.exec(
        &rig.lab.b.ns,
        &rig.agent_exe(),
        &["detach", "--pin-dir", &rig.bpffs.pin_arg()],
    )?;
    ensure!(String::from_utf8_lossy(&out.stdout).contains("nothing pinned"));
    Ok(())
}

/// The bpf filters of `dev` in `ns` on hook `direction` (`tc filter show`'s lines
/// with a handle, one a filter); none when the device has no clsact qdisc.
fn bpf_filters(lab: &Lab, ns: &str, dev: &str, direction: &str) -> Result<Vec<String>> {
    let out = lab.exec_status(ns, "tc", &["filter", "show", "dev", dev, direction])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" bpf ") && l.contains(" handle "))
        .map(str::to_string)
        .collect())
}

/// `tc qdisc show dev DEV` in `ns`.
fn qdiscs(lab: &Lab, ns: &str, dev: &str) -> Result<String> {
    let out = lab.exec(ns, "tc", &["qdisc", "show", "dev", dev])?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn clsact_after_kill_9_one_filter_counts_once_and_detach_leaves_none_of_the_agents() -> Result<()> {
    let mut rig = Rig::new()?;
    // The path of kernels without TCX (before 6.6), forced on this one.
    rig.env.push(("ROCE_AGENT_TC_MECHANISM", "clsact"));
    let (ns, veth) = (rig.lab.b.ns.clone(), rig.lab.b.veth.clone());
    let lab = |args: &[&str]| rig.lab.exec(&ns, args[0], &args[1..]).map(drop);
    // keep0 has another tool's clsact qdisc and u32 filter before the agent comes.
    lab(&[
        "ip", "link", "add", "keep0", "type", "veth", "peer", "name", "keep1",
    ])?;
    lab(&["ip", "link", "set", "keep0", "up"])?;
    lab(&["tc", "qdisc", "add", "dev", "keep0", "clsact"])?;
    lab(&[
        "tc", "filter", "add", "dev", "keep0", "ingress", "prio", "7", "protocol", "all", "u32",
        "match", "u32", "0", "0", "classid", "1:1",
    ])?;
    let agent_args = ["--iface", veth.as_str(), "--iface", "keep0"];
    let traffic = ["--flows", "2", "--count", "300", "--rate", "5000"];
    let one_filter_each = |rig: &Rig, program_id: Option<u64>| -> Result<()> {
        for dev in [veth.as_str(), "keep0"] {
            let f = bpf_filters(&rig.lab, &ns, dev, "egress")?;
            ensure!(
                f.len() == 1 && f[0].contains("tc_egress"),
                "{dev} egress: {f:#?}"
            );
            if let Some(id) = program_id {
                ensure!(
                    f[0].contains(&format!(" id {id} ")),
                    "{dev}: not program {id}: {f:?}"
                );
            }
        }
        Ok(())
    };

    rig.start_agent(&agent_args)?;
    one_filter_each(&rig, None)?;
    let n = rig.gen_from_b(&traffic)?;
    rig.settled("egress", n)?;

    // kill -9: its filter stays and counts on while no agent runs.
    rig.kill_agent()?;
    ensure!(rig.gen_from_b(&traffic)? == n);
    rig.start_agent(&agent_args)?;
    let log = rig.agent()?.stderr_text();
    ensure!(log.contains("adopted the pinned datapath"), "{log}");
    // The restarted agent's program took the dead one's filter over: one filter.
    let egress_id = pinned_program_id(&rig.bpffs.pin_dir().join("progs/tc_egress"))?;
    one_filter_each(&rig, Some(egress_id))?;
    rig.settled("egress", 2 * n)?;
    ensure!(rig.gen_from_b(&traffic)? == n);
    // Once each: a second filter would have made it 4n.
    rig.settled("egress", 3 * n)?;

    // SIGTERM: its filters go; so does the qdisc left empty, not another tool's.
    rig.signal(libc::SIGTERM)?;
    let mut agent = rig.agent.take().context("agent")?;
    ensure!(agent.wait()?.success(), "{}", agent.stderr_text());
    ensure!(!qdiscs(&rig.lab, &ns, &veth)?.contains("clsact"));
    ensure!(qdiscs(&rig.lab, &ns, "keep0")?.contains("clsact"));
    ensure!(bpf_filters(&rig.lab, &ns, "keep0", "egress")?.is_empty());

    // A third agent killed: `detach` takes its orphaned filters away.
    rig.start_agent(&agent_args)?;
    one_filter_each(&rig, None)?;
    let ids = pinned_program_ids(&rig.bpffs.pin_dir())?;
    rig.kill_agent()?;
    let out = rig.lab.exec(
        &ns,
        &rig.agent_exe(),
        &["detach", "--pin-dir", &rig.bpffs.pin_arg()],
    )?;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(said.contains("and 2 tc filters"), "{said}");
    ensure!(bpf_filters(&rig.lab, &ns, &veth, "egress")?.is_empty());
    let q = qdiscs(&rig.lab, &ns, &veth)?;
    ensure!(!q.contains("clsact"), "the agent's clsact qdisc left: {q}");
    // keep0: the other tool's qdisc and filter stay, nothing of the agent's.
    ensure!(bpf_filters(&rig.lab, &ns, "keep0", "egress")?.is_empty());
    ensure!(qdiscs(&rig.lab, &ns, "keep0")?.contains("clsact"));
    let theirs = rig
        .lab
        .exec(&ns, "tc", &["filter", "show", "dev", "keep0", "ingress"])?;
    ensure!(
        String::from_utf8_lossy(&theirs.stdout).contains("u32"),
        "the u32 filter went"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids.iter().any(|id| program_exists(*id)) {
        ensure!(Instant::now() < deadline, "programs left: {ids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn a_pin_of_another_layout_version_is_refused_with_the_command_to_run() -> Result<()> {
    let mut rig = Rig::new()?;
    let b_veth = rig.lab.b.veth.clone();
    rig.start_agent(&["--iface", &b_veth])?;
    rig.kill_agent()?;
    // GENERATION is {active: u32, layout: u32}: make the layout 999.
    let generation = rig.bpffs.pin_dir().join("maps/GENERATION");
    let out = Command::new("bpftool")
        .args(["map", "update", "pinned"])
        .arg(&generation)
        .args([
            "key", "0", "0", "0", "0", "value", "0", "0", "0", "0", "0xe7", "3", "0", "0",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = rig.lab.command(&rig.lab.b.ns, rig.bin.join("roce-agent"));
    cmd.args([
        "run",
        "--iface",
        &b_veth,
        "--listen",
        API,
        "--pin-dir",
        &rig.bpffs.pin_arg(),
    ]);
    let out = cmd.output()?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.code() == Some(1), "{err}");
    ensure!(err.contains("layout version 999"), "{err}");
    ensure!(
        err.contains(&format!(
            "roce-agent detach --pin-dir {}",
            rig.bpffs.pin_arg()
        )),
        "{err}"
    );
    // The old datapath was not touched: its XDP link is still there.
    ensure!(rig.bpffs.pin_dir().join("links").read_dir()?.count() >= 1);
    Ok(())
}

/// Whether `dev` in namespace `ns` has an XDP program (as `ip link` shows it).
fn has_xdp(lab: &Lab, ns: &str, dev: &str) -> Result<bool> {
    let out = lab.exec(ns, "ip", &["link", "show", "dev", dev])?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(" xdp"))
}

/// Polls `cond` for up to 5 s.
fn eventually(what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond()? {
        ensure!(
            Instant::now() < deadline,
            "{what} did not happen within 5 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn interfaces_that_appear_or_are_recreated_get_their_programs() -> Result<()> {
    let mut rig = Rig::new()?;
    let b_ns = rig.lab.b.ns.clone();
    let b_veth = rig.lab.b.veth.clone();
    rig.start_agent(&[
        "--iface",
        &b_veth,
        "--iface",
        "late0",
        "--wait-for-interfaces",
    ])?;
    let log = rig.agent()?.stderr_text();
    ensure!(
        log.contains("waiting for the interface to appear") && log.contains("late0"),
        "{log}"
    );
    ensure!(has_xdp(&rig.lab, &b_ns, &b_veth)?, "no XDP on {b_veth}");

    // late0 appears: attached without a restart.
    rig.lab.exec(
        &b_ns,
        "ip",
        &[
            "link", "add", "late0", "type", "veth", "peer", "name", "late1",
        ],
    )?;
    rig.lab.exec(&b_ns, "ip", &["link", "set", "late0", "up"])?;
    eventually("XDP on late0", || has_xdp(&rig.lab, &b_ns, "late0"))?;

    // The veth pair deleted and made again (a new ifindex under the same name).
    rig.lab.recreate_veth()?;
    eventually("XDP on the re-created veth", || {
        has_xdp(&rig.lab, &b_ns, &b_veth)
    })?;
    let sent = rig.gen(&["--count", "50"])?;
    let sent = oracle::flows_from_doc(&sent, |_| true)?;
    let packets: u64 = sent.values().map(|c| c.packets).sum();
    rig.flows_settled(packets)?;
    // One pinned XDP link per live interface, none left for the old ifindex.
    let links = std::fs::read_dir(rig.bpffs.pin_dir().join("links"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("xdp_classify@"))
        .count();
    ensure!(links == 2, "pinned XDP links: {links}");
    Ok(())
}
