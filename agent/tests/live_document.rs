//! The flows document of a real agent run, as people and scripts read it: first/last
//! seen times on the Unix epoch (the kernel stamps them on its monotonic clock), each
//! QP also in hex, and the human table's sizes in SI units. The agent runs inside a
//! network namespace that the test creates (and deletes again, also when it fails);
//! needs root (BPF), skipped with a note on stderr without it.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::UdpSocket;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use roce_agent::doc::Document;
use roce_testkit::netns::{unique_name, Netns};

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");
const API: &str = "127.0.0.1:9473";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

/// The agent, killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `flows --json` in `ns`: the document as served (None while the agent does not
/// answer yet).
fn flows_json(ns: &Netns) -> Option<serde_json::Value> {
    let out = ns
        .cmd(BIN, &["flows", "--json", "--api", API])
        .output()
        .expect("run flows --json");
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("JSON"))
}

/// Sends `count` RC SEND_ONLY packets (BTH + ICRC, 58-byte frames) to
/// 198.18.0.1:4791 from namespace `b`.
fn send_roce(b: &Netns, count: u32, dest_qp: u32) {
    b.enter(|| {
        let sock = UdpSocket::bind("198.18.0.2:0").expect("bind in the namespace");
        for psn in 0..count {
            let mut bth = [0u8; 16];
            bth[0] = 0x04; // RC SEND_ONLY
            bth[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
            bth[4..8].copy_from_slice(&(dest_qp & 0x00FF_FFFF).to_be_bytes());
            bth[8..12].copy_from_slice(&psn.to_be_bytes());
            sock.send_to(&bth, "198.18.0.1:4791").expect("send");
        }
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn live_flows_are_stamped_on_the_unix_epoch_with_the_qp_in_hex() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces, BPF)");
        return;
    }
    let a = Netns::create(unique_name("roce-t-").0).expect("a namespace");
    let b = Netns::create(unique_name("roce-t-").0).expect("a namespace");
    a.ip_ok(&[
        "link",
        "add",
        "va",
        "type",
        "veth",
        "peer",
        "name",
        "vb",
        "netns",
        b.name(),
    ]);
    a.ip_ok(&["addr", "add", "198.18.0.1/30", "dev", "va"]);
    b.ip_ok(&["addr", "add", "198.18.0.2/30", "dev", "vb"]);
    a.ip_ok(&["link", "set", "va", "up"]);
    b.ip_ok(&["link", "set", "vb", "up"]);

    let log = std::env::temp_dir().join(format!("roce-live-document-{}.log", std::process::id()));
    let mut agent = Agent(
        a.cmd(
            BIN,
            &[
                "run",
                "--iface",
                "va",
                "--listen",
                API,
                "--interval",
                "0.1",
                "--no-pin",
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start the agent"),
    );
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while flows_json(&a).is_none() {
        if let Ok(Some(st)) = agent.0.try_wait() {
            panic!("the agent exited early ({st}):\n{}", agent_log());
        }
        assert!(Instant::now() < deadline, "no answer:\n{}", agent_log());
        std::thread::sleep(Duration::from_millis(100));
    }

    let before = unix_now_ns();
    send_roce(&b, 3, 0x1234);
    std::thread::sleep(Duration::from_millis(300));
    send_roce(&b, 2, 0x1234);
    let after_sending = unix_now_ns();
    let deadline = Instant::now() + Duration::from_secs(10);
    let doc = loop {
        let v = flows_json(&a).expect("the agent answers");
        if v["flows"][0]["packets"] == 5 {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "no flow of 5 packets: {v}\n{}",
            agent_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let f = &doc["flows"][0];
    assert_eq!(f["dest_qp"], 0x1234, "{f}");
    assert_eq!(f["dest_qp_hex"], "0x1234", "{f}");
    // Nanoseconds since 1970 (not since boot), within the kernel clock's tick (at
    // most 10 ms) and the clocks' comparison of when the packets were sent.
    let slack = 50_000_000;
    let first = f["first_seen_ns"].as_u64().expect("first_seen_ns");
    let last = f["last_seen_ns"].as_u64().expect("last_seen_ns");
    assert!(
        before - slack <= first && first <= after_sending + slack,
        "first_seen_ns {first} not within [{before}, {after_sending}]: {f}"
    );
    assert!(
        first + 250_000_000 <= last && last <= after_sending + slack,
        "last_seen_ns {last}: the last packets went 300 ms after the first ({first}): {f}"
    );
    // The document reads back (the hex QP is not needed to read it).
    let d: Document = serde_json::from_value(doc.clone()).expect("a flow document");
    assert_eq!(d.flows[0].first_seen_ns, first);

    // The human table: QP in hex, sizes in SI units as its header says.
    let out = a
        .cmd(BIN, &["flows", "--api", API])
        .output()
        .expect("run flows");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let at = |title: &str| {
        header
            .iter()
            .position(|h| *h == title)
            .unwrap_or_else(|| panic!("no column {title}: {table}"))
    };
    assert_eq!(row[at("qp")], "0x1234", "{table}");
    // 5 frames of 58 bytes: under 1000, written exactly.
    assert_eq!(row[at("bytes(k=1000)")], "290", "{table}");
    let _ = std::fs::remove_file(&log);
}
