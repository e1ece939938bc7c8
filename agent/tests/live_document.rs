//! The flows document of a real agent run, as people and scripts read it: first/last
//! seen times on the Unix epoch (the kernel stamps them on its monotonic clock), each
//! QP also in hex, and the human table's sizes in SI units. The agent runs inside a
//! network namespace that the test creates (and deletes again, also when it fails);
//! needs root (BPF), skipped with a note on stderr without it.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{send_roce, text, wait_for_flows, Agent, Pair, BIN};
use roce_agent::doc::Document;

const API: &str = "127.0.0.1:9473";

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

#[test]
fn live_flows_are_stamped_on_the_unix_epoch_with_the_qp_in_hex() {
    require_root!();
    let pair = Pair::new("roce-t-");
    let (a, b) = (&pair.a, &pair.b);
    let mut agent = Agent::start(
        a,
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
    );
    agent.wait_ready(a, API);

    let before = unix_now_ns();
    send_roce(b, 3, 0x1234);
    std::thread::sleep(Duration::from_millis(300));
    send_roce(b, 2, 0x1234);
    let after_sending = unix_now_ns();
    let doc = wait_for_flows(&agent, a, API, |v| v["flows"][0]["packets"] == 5);
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
}
