//! Live equals offline: a capture replayed with `tcpreplay` onto a veth that
//! `roce-agent run --iface` watches gives the same flows and counters from
//! `roce-agent flows --json` as `roce-agent analyze --json` gives for the file
//! (`ifname` and `direction` aside, which only the live agent knows, and first/last
//! seen and `icrc_errors`, which analyze takes from the capture).
//!
//! Each capture gets its own pair of network namespaces `roce-rp-<pid>x<n>a|b` joined
//! by a veth pair: tcpreplay sends from `ra` in A, the agent attaches XDP to `rb` in B
//! (XDP sees every frame, whatever its MACs). No addresses, IPv6 off: nothing but the
//! replayed frames crosses the link. The namespaces (with their links) are deleted and
//! the agent stopped also when an assertion fails; nothing touches the root namespace.
//!
//! Needs root (namespaces, XDP) and tcpreplay; without them the tests say so on
//! stderr and pass.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{is_root, quiet_pair, text, BIN};
use roce_agent::analyze::CaptureReader;
use roce_testkit::netns::Netns;
use serde_json::Value;

/// The agent's API inside namespace B (each namespace has its own loopback).
const API: &str = "127.0.0.1:9473";
/// Ethernet header bytes on top of the MTU.
const ETH_HLEN: usize = 14;

/// Whether this test can run here: root, tcpreplay and taskset.
fn can_run() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces, XDP)");
        return false;
    }
    for tool in ["tcpreplay", "taskset"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("skipped: {tool} is not installed");
            return false;
        }
    }
    true
}

/// The running agent: SIGTERM on drop (it detaches), SIGKILL if it lingers.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.log);
    }
}

/// Namespaces A and B, the veth pair `ra`/`rb` and the agent on `rb`. Fields drop in
/// order: the agent before the namespaces.
struct Rig {
    agent: Agent,
    a: Netns,
    b: Netns,
}

impl Rig {
    fn new(mtu: u32) -> Rig {
        let (a, b) = quiet_pair("roce-rp-");
        let mtu = mtu.to_string();
        a.ip_ok(&["link", "set", "ra", "mtu", &mtu, "up"]);
        b.ip_ok(&["link", "set", "rb", "mtu", &mtu, "up"]);
        let log = std::env::temp_dir().join(format!("{}-agent.log", b.name()));
        let err = File::create(&log).expect("agent log file");
        let child = b
            .cmd(
                BIN,
                &["run", "--iface", "rb", "--listen", API, "--interval", "0.2"],
            )
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start roce-agent");
        let mut rig = Rig {
            agent: Agent { child, log },
            a,
            b,
        };
        rig.wait_ready();
        rig
    }

    /// `roce-agent flows --json` in B: the document, or why there is none.
    fn flows(&self) -> Result<Value, String> {
        let out = self
            .b
            .cmd(BIN, &["flows", "--json", "--api", API])
            .output()
            .map_err(|e| format!("roce-agent flows: {e}"))?;
        if !out.status.success() {
            return Err(text(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out.stdout)))
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = self.agent.child.try_wait() {
                panic!("the agent exited early ({st}):\n{}", self.agent.log());
            }
            match self.flows() {
                Ok(_) => return,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no answer from the agent: {e}\n{}",
                    self.agent.log()
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Replays `path` from `ra` at top speed, pinned to one CPU: FLOWS is a per-CPU map,
    /// and a flow's PSN tracking must see its packets in order on one CPU (the
    /// receiving side of a veth runs on the sender's CPU).
    fn replay(&self, path: &Path) -> String {
        let p = path.to_str().expect("utf-8 path");
        let out = self
            .a
            .cmd(
                "taskset",
                &["-c", "0", "tcpreplay", "-i", "ra", "--topspeed", p],
            )
            .output()
            .expect("run tcpreplay");
        assert!(
            out.status.success(),
            "tcpreplay {p}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Polls the agent until it has counted `want` frames (see [`frames_counted`]) and
    /// two reads in a row agree; gives up after 15 s and returns the last document.
    fn settled(&self, want: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last: Option<Value> = None;
        loop {
            let doc = self
                .flows()
                .unwrap_or_else(|e| panic!("roce-agent flows: {e}\n{}", self.agent.log()));
            let stable = last.as_ref().is_some_and(|l| l == &doc);
            if (stable && frames_counted(&doc) >= want) || Instant::now() > deadline {
                return doc;
            }
            last = Some(doc);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Every class and parse-error counter summed (a frame with a parse error after its
/// flow was counted, such as an ACK cut inside its AETH, counts twice).
fn frames_counted(doc: &Value) -> u64 {
    let c = &doc["counters"];
    let classes: u64 = [
        "roce",
        "roce_in_vxlan",
        "vxlan_other",
        "other_udp",
        "other_ip",
        "non_ip",
    ]
    .iter()
    .filter_map(|k| c[k].as_u64())
    .sum();
    let errors: u64 = c["parse_errors"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    classes + errors
}

fn flow_id(f: &Value) -> String {
    format!(
        "{}>{} vni {} {}>{} qp {}",
        f["src"].as_str().unwrap_or("?"),
        f["dst"].as_str().unwrap_or("?"),
        f["vni"],
        f["inner_src"].as_str().unwrap_or("-"),
        f["inner_dst"].as_str().unwrap_or("-"),
        f["dest_qp"]
    )
}

/// The flows of a document by id, without the fields only one side knows.
fn comparable_flows(doc: &Value) -> BTreeMap<String, Value> {
    doc["flows"]
        .as_array()
        .expect("flows array")
        .iter()
        .map(|f| {
            let mut f = f.clone();
            if let Some(o) = f.as_object_mut() {
                for k in [
                    "ifname",
                    "direction",
                    "first_seen_ns",
                    "last_seen_ns",
                    // Live only: rates over the collector's interval.
                    "rates",
                    // Analyze only: the capture's gaps, the ICRC it checked.
                    "icrc_errors",
                    "capture_gaps",
                    // CE -> CNP needs the CNPs to leave through tc (a replay only
                    // arrives: live times none).
                    "ce_to_cnp",
                    // Round trips need the requests to leave through tc; a replay
                    // only arrives (XDP).
                    "rtt",
                ] {
                    o.remove(k);
                }
                // Times are the replay's pace live, the capture's in analyze: the
                // counts compare.
                for k in ["nak_to_resend", "recovery"] {
                    if let Some(d) = o.get_mut(k) {
                        if let Some(d) = d.as_object_mut() {
                            d.retain(|name, _| name == "count");
                        }
                    }
                }
                if let Some(d) = o.get_mut("cnp_interval").and_then(Value::as_object_mut) {
                    d.retain(|name, _| name == "samples");
                }
            }
            (flow_id(&f), f)
        })
        .collect()
}

/// What a capture holds that decides how it can be replayed: its largest frame and
/// its frames shorter than an Ethernet header (a packet socket refuses to send those).
struct FileFacts {
    max_len: usize,
    runts: u64,
}

fn file_facts(path: &Path) -> FileFacts {
    let mut r = CaptureReader::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut facts = FileFacts {
        max_len: 0,
        runts: 0,
    };
    while let Some(f) = r.next_frame().unwrap_or_else(|e| panic!("{e}")) {
        facts.max_len = facts.max_len.max(f.data.len());
        if f.data.len() < ETH_HLEN {
            facts.runts += 1;
        }
    }
    facts
}

fn analyze(path: &Path) -> Value {
    let out = Command::new(BIN)
        .args(["analyze", path.to_str().expect("utf-8 path"), "--json"])
        // The captures hold error-level findings: the table is what is compared here.
        .args(["--fail-on", "never"])
        .args(["--engine", "reference"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run roce-agent analyze");
    assert!(
        out.status.success(),
        "analyze {}: {}",
        path.display(),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("analyze --json prints JSON")
}

/// Replays one capture onto a fresh rig and compares the agent's table with analyze's.
fn replay_equals_analyze(path: &Path) {
    let name = path.display();
    let facts = file_facts(path);
    // Native XDP on a veth takes frames up to about 3.5 KB (the program is not
    // multi-buffer aware); larger MTUs make the agent fall back to generic XDP.
    let mtu = if facts.max_len <= 1500 + ETH_HLEN {
        1500
    } else {
        9000
    };
    let offline = analyze(path);
    let mut want_counters = offline["counters"].clone();
    // Frames shorter than 14 bytes cannot be sent: analyze counts them as truncated_eth.
    if let Some(n) = want_counters["parse_errors"]["truncated_eth"].as_u64() {
        want_counters["parse_errors"]["truncated_eth"] = (n - facts.runts.min(n)).into();
    }
    let want_frames = frames_counted(&offline) - facts.runts;

    let rig = Rig::new(mtu);
    let sent = rig.replay(path);
    let live = rig.settled(want_frames);
    let log = rig.agent.log();
    let context = || format!("tcpreplay:\n{sent}\nagent log:\n{log}");

    for f in live["flows"].as_array().expect("flows array") {
        assert!(
            f["ifname"] == "rb" && f["direction"] == "ingress",
            "{name}: live flow {} on {} {}",
            flow_id(f),
            f["ifname"],
            f["direction"]
        );
    }
    assert_eq!(
        frames_counted(&live),
        want_frames,
        "{name}: frames the agent counted (MTU {mtu}); {}",
        context()
    );
    let (want, got) = (comparable_flows(&offline), comparable_flows(&live));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{name}: flow keys of analyze (left) and of the live agent (right); {}",
        context()
    );
    for (id, w) in &want {
        assert_eq!(
            w, &got[id],
            "{name}: flow {id}: analyze (left) and the live agent (right) differ"
        );
    }
    // Sampled events are live-only: analyze emits none, the agent's default is 1 in 1.
    // Round trips need the requests to leave through tc, so do their unpaired ones.
    let mut live_counters = live["counters"].clone();
    for c in [&mut want_counters, &mut live_counters] {
        if let Some(o) = c.as_object_mut() {
            o.remove("events");
            o.remove("events_dropped");
            o.remove("rtt_unpaired");
        }
    }
    // The live tunnels are on the replaying interface, arriving; a capture's are on none.
    for t in live_counters["tunnels"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        assert!(
            t["ifname"] == "rb" && t["direction"] == "ingress",
            "{name}: {t}"
        );
        t["ifname"] = Value::Null;
        t["direction"] = Value::Null;
    }
    assert_eq!(
        want_counters, live_counters,
        "{name}: counters of analyze (left, {} frames shorter than 14 bytes taken out of \
         truncated_eth) and of the live agent (right)",
        facts.runts
    );
    eprintln!(
        "{name}: {} flows, {want_frames} frames: live == offline (MTU {mtu})",
        want.len()
    );
}

/// The Ethernet captures of `dir`: what tcpreplay can put on a veth (the cooked
/// captures of `tcpdump -i any` hold no Ethernet header to replay).
fn captures_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .filter(|p| ethernet_only(p))
        .collect();
    v.sort();
    v
}

/// Every interface of the capture at `path` is Ethernet (link type 1).
fn ethernet_only(path: &Path) -> bool {
    use pcap_file::pcapng::{Block, PcapNgReader};
    use pcap_file::DataLink;
    let file = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|x| x == "pcap") {
        let r = pcap_file::pcap::PcapReader::new(file)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return r.header().datalink == DataLink::ETHERNET;
    }
    let mut r = PcapNgReader::new(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut all = true;
    while let Some(block) = r.next_block() {
        if let Ok(Block::InterfaceDescription(idb)) = block {
            all &= idb.linktype == DataLink::ETHERNET;
        }
    }
    all
}

#[test]
fn committed_captures_replayed_live_equal_analyze() {
    if !can_run() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/captures");
    let files = captures_in(&dir);
    assert!(
        files.len() >= 5,
        "expected the committed captures in {}",
        dir.display()
    );
    for p in files {
        replay_equals_analyze(&p);
    }
}

#[test]
fn real_captures_replayed_live_equal_analyze() {
    if !can_run() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    let files = captures_in(&dir);
    assert!(
        files.len() >= 8,
        "expected the 8 real captures in {} (shared/ sits beside the clone)",
        dir.display()
    );
    for p in files {
        replay_equals_analyze(&p);
    }
}
