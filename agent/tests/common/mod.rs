//! What the integration tests of `agent/tests/` share: the binary under test and how
//! they run it, the root check, network namespaces and veth pairs between them, a
//! running agent inside a namespace, and RoCE packets sent to it. Each test file takes
//! it with `mod common;`; the scenarios stay in the test files.

// Every test file is a crate of its own that uses part of this module; what one of them
// leaves unused is used by another, so it is not dead code.
#![allow(dead_code)]

use std::fs::File;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use roce_agent::doc::Document;
use roce_testkit::netns::{unique_name, Netns};
use roce_testkit::sock::set_int_option;

pub const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");

/// `roce-agent ARGS`, without the caller's RUST_LOG or JOURNAL_STREAM.
pub fn agent(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .output()
        .expect("run roce-agent")
}

/// `roce-agent ARGS` inside `ns`, without the caller's RUST_LOG.
pub fn agent_in(ns: &Netns, args: &[&str]) -> Output {
    ns.cmd(BIN, args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run roce-agent")
}

/// `check --json ARGS` in `ns`: the document it printed and its exit code.
pub fn check_json_in(ns: &Netns, args: &[&str]) -> (serde_json::Value, i32) {
    let mut all = vec!["check", "--json"];
    all.extend_from_slice(args);
    let out = agent_in(ns, &all);
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {} stderr {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    (doc, out.status.code().unwrap_or(-1))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Returns from the test, with a note on stderr, unless it runs as root; the note says
/// what root is needed for (network namespaces and BPF unless told).
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require_root!("network namespaces, BPF")
    };
    ($why:literal) => {
        if !$crate::common::is_root() {
            eprintln!(concat!("skipped: needs root (", $why, ")"));
            return;
        }
    };
}

/// A fixture tree laid out as an mlx5 host's /sys (`tests/fixtures/sysfs`, see its
/// README): mlx5_0 port 1, netdev eth1.
pub fn fixture(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/sysfs/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A new namespace `<prefix><pid>x<n>` (loopback up), deleted with its links on drop.
pub fn new_ns(prefix: &str) -> Netns {
    let (name, _) = unique_name(prefix);
    Netns::create(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"))
}

/// A veth pair from `ifa` in `a` to `ifb` in `b`, made in `a` with its peer put in `b`
/// directly: down, no addresses.
pub fn veth_between(a: &Netns, ifa: &str, b: &Netns, ifb: &str) {
    a.ip_ok(&[
        "link",
        "add",
        ifa,
        "type",
        "veth",
        "peer",
        "name",
        ifb,
        "netns",
        b.name(),
    ]);
}

/// A veth pair `a`/`b` inside `ns`, both up at `mtu`.
pub fn veth(ns: &Netns, a: &str, b: &str, mtu: &str) {
    ns.ip_ok(&[
        "link", "add", a, "mtu", mtu, "type", "veth", "peer", "name", b, "mtu", mtu,
    ]);
    ns.ip_ok(&["link", "set", a, "up"]);
    ns.ip_ok(&["link", "set", b, "up"]);
}

/// Namespaces `<prefix><pid>x<n>a` and `...b` without IPv6 (no router or neighbour
/// solicitations on the wire), joined by the veth pair `ra`/`rb`, down.
pub fn quiet_pair(prefix: &str) -> (Netns, Netns) {
    let (base, _) = unique_name(prefix);
    let quiet = |name: String| {
        Netns::create_without_ipv6(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"))
    };
    let a = quiet(format!("{base}a"));
    let b = quiet(format!("{base}b"));
    veth_between(&a, "ra", &b, "rb");
    (a, b)
}

/// Two namespaces joined by a veth pair: `va` in `a`, `vb` in `b`.
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
}

impl Pair {
    /// The pair up, `va` 198.18.0.1/30 and `vb` 198.18.0.2/30, in namespaces
    /// `<prefix><pid>x<n>`.
    pub fn new(prefix: &str) -> Pair {
        let pair = Pair::down(prefix);
        pair.a.ip_ok(&["addr", "add", "198.18.0.1/30", "dev", "va"]);
        pair.b.ip_ok(&["addr", "add", "198.18.0.2/30", "dev", "vb"]);
        pair.a.ip_ok(&["link", "set", "va", "up"]);
        pair.b.ip_ok(&["link", "set", "vb", "up"]);
        pair
    }

    /// The pair down and without addresses.
    pub fn down(prefix: &str) -> Pair {
        let a = new_ns(prefix);
        let b = new_ns(prefix);
        veth_between(&a, "va", &b, "vb");
        Pair { a, b }
    }
}

static LOG_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running agent, its stderr in a file of its own; killed on drop if a test left it
/// running.
pub struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// Starts `roce-agent ARGS` in `ns`.
    pub fn start(ns: &Netns, args: &[&str]) -> Agent {
        Agent::start_with(ns, args, |_, _| {})
    }

    /// Starts `roce-agent run` on a pair's `va` in `ns` (no pins, polling every 0.2 s),
    /// its API at `api`, with `extra` arguments.
    pub fn run_on_va(ns: &Netns, api: &str, extra: &[&str]) -> Agent {
        let mut args = vec![
            "run",
            "--iface",
            "va",
            "--no-pin",
            "--listen",
            api,
            "--interval",
            "0.2",
        ];
        args.extend_from_slice(extra);
        Agent::start(ns, &args)
    }

    /// Starts `roce-agent ARGS` in `ns` (without the caller's JOURNAL_STREAM), after
    /// `setup` has had the command and the path of the log file stderr goes to.
    pub fn start_with(ns: &Netns, args: &[&str], setup: impl FnOnce(&mut Command, &Path)) -> Agent {
        let log = std::env::temp_dir().join(format!(
            "roce-agent-test-{}-{}.log",
            std::process::id(),
            LOG_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let err = File::create(&log).expect("log file");
        let mut cmd = ns.cmd(BIN, args);
        cmd.env_remove("JOURNAL_STREAM");
        setup(&mut cmd, &log);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start the agent");
        Agent { child, log }
    }

    /// What the agent wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `flows --json` in `ns` until it answers a document (20 seconds at most).
    pub fn wait_ready(&mut self, ns: &Netns, api: &str) -> Document {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the agent exited early ({st}):\n{}", self.log());
            }
            let out = ns
                .cmd(BIN, &["flows", "--json", "--api", api])
                .output()
                .expect("run flows");
            if out.status.success() {
                return serde_json::from_slice(&out.stdout)
                    .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
            }
            assert!(
                Instant::now() < deadline,
                "no answer from the agent: {}\n{}",
                text(&out.stderr),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling our own child by its pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0);
    }

    /// Waits until `n` `GET /events` streams are open at `api` in `ns`, as `/metrics`
    /// counts them (10 seconds at most): each receives what is sampled from then on.
    pub fn wait_for_subscribers(&self, ns: &Netns, api: &str, n: usize) {
        let want = format!("roce_agent_events_subscribers {n}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = ns
                .enter(|| {
                    roce_agent::api::client::get_body(api, "/metrics", Duration::from_secs(5))
                })
                .expect("enter the namespace")
                .map(|b| text(&b))
                .unwrap_or_default();
            if metrics.lines().any(|l| l == want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not {want:?} in /metrics: {:?}\n{}",
                metrics
                    .lines()
                    .find(|l| l.starts_with("roce_agent_events_subscribers")),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the log has a line containing `needle` (10 seconds at most).
    pub fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits for the exit (10 seconds at most).
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "the agent ignored SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Polls `flows --json` in `ns` until `done` holds for the document, or panics after
/// 10 seconds with the last document and the agent's log.
pub fn wait_for_flows(
    agent: &Agent,
    ns: &Netns,
    api: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns
            .cmd(BIN, &["flows", "--json", "--api", api])
            .output()
            .expect("flows --json");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        if done(&v) {
            let _: Document = serde_json::from_value(v.clone()).expect("a flow document");
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "flows never got there: {v}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `count` RC SEND_ONLY packets (BTH + ICRC, 58-byte frames) to 198.18.0.1:4791
/// from namespace `b` of a [`Pair`] with DSCP 26 / ECT(0); returns the UDP source port.
pub fn send_roce(b: &Netns, count: u32, dest_qp: u32) -> u16 {
    send_roce_from(
        b,
        "198.18.0.2",
        "198.18.0.1",
        (26 << 2) | 0b10,
        count,
        dest_qp,
    )
}

/// Sends `count` RC SEND_ONLY packets (BTH + ICRC) from `src` in namespace `ns` to
/// `dst`:4791 with TOS `tos`, PSNs 0, 1, ...; returns the UDP source port.
pub fn send_roce_from(ns: &Netns, src: &str, dst: &str, tos: i32, count: u32, dest_qp: u32) -> u16 {
    let datagrams: Vec<Vec<u8>> = (0..count)
        .map(|psn| roce_datagram(0x04, dest_qp, psn, false, &[]))
        .collect();
    send_datagrams(ns, src, dst, tos, &datagrams)
}

/// A RoCE datagram: a BTH (opcode, migreq, the default P_Key, `dest_qp`, AckReq when
/// `ack_req`, `psn`), the `extra` headers after it, and a zero ICRC.
pub fn roce_datagram(opcode: u8, dest_qp: u32, psn: u32, ack_req: bool, extra: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; 12];
    d[0] = opcode;
    d[1] = 0x40; // migreq
    d[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
    d[4..8].copy_from_slice(&(dest_qp & 0x00FF_FFFF).to_be_bytes());
    if ack_req {
        d[8] = 0x80;
    }
    d[9..12].copy_from_slice(&(psn & 0x00FF_FFFF).to_be_bytes()[1..]);
    d.extend_from_slice(extra);
    d.extend_from_slice(&[0; 4]);
    d
}

/// Sends `datagrams` from `src` in namespace `ns` to `dst`:4791 with TOS `tos`, from
/// one socket; returns its UDP source port.
pub fn send_datagrams(ns: &Netns, src: &str, dst: &str, tos: i32, datagrams: &[Vec<u8>]) -> u16 {
    send_datagrams_to(ns, src, dst, 4791, tos, datagrams)
}

/// [`send_datagrams`] to UDP port `port` (4789: VXLAN, the datagrams its payloads).
pub fn send_datagrams_to(
    ns: &Netns,
    src: &str,
    dst: &str,
    port: u16,
    tos: i32,
    datagrams: &[Vec<u8>],
) -> u16 {
    ns.enter(|| {
        let sock = UdpSocket::bind(format!("{src}:0")).expect("bind in the namespace");
        set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, tos)
            .unwrap_or_else(|e| panic!("IP_TOS: {e}"));
        for d in datagrams {
            sock.send_to(d, format!("{dst}:{port}")).expect("send");
        }
        sock.local_addr().expect("local address").port()
    })
    .unwrap_or_else(|e| panic!("{e:#}"))
}
