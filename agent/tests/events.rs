//! `GET /events` and `roce-agent events` against a real HTTP server of the agent's own
//! router in this process, fed with events whose packets are real RoCE frames (the
//! test kit's frame builder): human lines, JSON lines, kind filters, and pcapng that
//! tshark decodes as RoCE.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use roce_agent::api::{self};
use roce_agent::doc::event::{hex, Event, EventKind};
use roce_agent::doc::finding::Findings;
use roce_agent::doc::{Direction, Family};
use roce_testkit::frame::{cnp, roce_frame, Eth, RoceMsg, L3};
use tokio::sync::{broadcast, watch};

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");

fn event(kind: EventKind, psn: u32, frame: &[u8]) -> Event {
    Event {
        ts_ns: 1_000_000 + u64::from(psn),
        ifname: "eth1".into(),
        direction: Direction::Ingress,
        kind,
        family: Family::Ipv4,
        src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        sport: 49152,
        vni: None,
        inner_family: None,
        inner_src: None,
        inner_dst: None,
        dest_qp: 0x1234,
        opcode: frame[42],
        psn,
        dscp: 26,
        ecn: if kind == EventKind::Ce {
            "ce".into()
        } else {
            "ect0".into()
        },
        inner_ecn: None,
        sample: 1,
        packet_len: frame.len() as u32,
        packet: hex(&frame[..frame.len().min(128)]),
        time_unix_ns: 1_764_000_000_000_000_000 + u64::from(psn),
    }
}

/// A CE-marked SEND and a CNP, as frames.
fn frames() -> (Vec<u8>, Vec<u8>) {
    let eth = Eth::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let l3 =
        L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)).with_tos((26 << 2) | 3);
    let send = roce_frame(&eth, &l3, 49152, &RoceMsg::send_only(0x1234, 7, 300));
    let cnp = roce_frame(&eth, &l3.clone().with_tos(48 << 2), 49152, &cnp(0x1234));
    (send, cnp)
}

/// A server of the agent's router on a free port that publishes a CE event and a CNP
/// event every 20 ms; dropped with the runtime.
fn serve() -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (tx, _) = broadcast::channel::<Arc<Event>>(1024);
    let (_ftx, frx) = watch::channel(Arc::new(Findings::default()));
    let (_dtx, drx) = watch::channel(Arc::new(
        roce_agent::telemetry::live::LiveDocument::default(),
    ));
    let feed = api::server::EventFeed {
        sender: tx.clone(),
        sample: Arc::new(std::sync::atomic::AtomicU32::new(1)),
    };
    let router = api::server::router(drx, frx, Some(feed));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    rt.spawn(async move { axum::serve(listener, router).await });
    let (send, cnp) = frames();
    rt.spawn(async move {
        let mut psn = 0;
        loop {
            let _ = tx.send(Arc::new(event(EventKind::Ce, psn, &send)));
            let _ = tx.send(Arc::new(event(EventKind::Cnp, psn + 1, &cnp)));
            psn += 2;
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Keep the watch senders alive with the publisher.
            let _ = (&_ftx, &_dtx);
        }
    });
    (rt, addr)
}

fn events(addr: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["events", "--api", addr])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run roce-agent events")
}

#[test]
fn json_lines_are_the_events_and_kind_filters_them() {
    let (_rt, addr) = serve();
    let out = events(&addr, &["--json", "--duration", "0.5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Event> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 10, "{} events in 0.5 s", lines.len());
    assert!(lines.iter().any(|e| e.kind == EventKind::Ce));
    assert!(lines.iter().any(|e| e.kind == EventKind::Cnp));

    let out = events(&addr, &["--json", "--duration", "0.5", "--kind", "cnp"]);
    let kinds: Vec<EventKind> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Event>(l).expect("event").kind)
        .collect();
    assert!(!kinds.is_empty());
    assert!(kinds.iter().all(|k| *k == EventKind::Cnp), "{kinds:?}");
}

#[test]
fn human_lines_name_the_kind_flow_and_bth_fields() {
    let (_rt, addr) = serve();
    let out = events(&addr, &["--duration", "0.3", "--kind", "ce"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no line: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(first.contains("eth1/in ce"), "{first}");
    assert!(
        first.contains("198.18.0.1→198.18.0.2 qp 0x1234 opcode 0x04"),
        "{first}"
    );
    assert!(first.contains("dscp 26 ecn ce 1/1"), "{first}");
}

#[test]
fn bad_kind_and_no_agent_are_clear_errors() {
    let out = events("127.0.0.1:1", &["--kind", "ce,bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown event kind \"bogus\""));
    let out = events("127.0.0.1:1", &["--duration", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no roce-agent answers at 127.0.0.1:1"));
}

#[test]
fn pcapng_opens_in_tshark_as_roce_with_the_kind_in_a_comment() {
    if !roce_testkit::tshark::available() {
        panic!("tshark is missing: `cargo xtask setup` installs it");
    }
    let (_rt, addr) = serve();
    let path = std::env::temp_dir().join(format!("roce-events-{}.pcapng", std::process::id()));
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _guard = Remove(path.clone());
    let out = events(
        &addr,
        &[
            "--pcapng",
            path.to_str().expect("path"),
            "--duration",
            "0.5",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("events written to"));
    let fields = roce_testkit::tshark::Fields::new(&[
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "frame.comment",
        "frame.time_epoch",
        "frame.interface_name",
    ]);
    let rows = fields.run(&path).expect("tshark reads the file");
    assert!(rows.len() >= 10, "{} rows", rows.len());
    for r in &rows {
        assert_eq!(r.first(1), Some("0x001234"), "{r:?}");
        let comment = r.first(2).unwrap_or("");
        let opcode = r.first(0).unwrap_or("");
        match opcode {
            "4" => assert!(comment.contains("event: ce"), "{r:?}"),
            "129" => assert!(comment.contains("event: cnp"), "{r:?}"),
            other => panic!("opcode {other}: {r:?}"),
        }
        // Nanosecond timestamps: 2025-11-24T... plus the PSN in ns.
        assert!(
            r.first(3).unwrap_or("").starts_with("1764000000.000000"),
            "{r:?}"
        );
        assert_eq!(r.first(4), Some("eth1"));
    }
}
