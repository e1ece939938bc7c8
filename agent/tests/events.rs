//! `GET /events` and `roce-agent events` against a real HTTP server of the agent's own
//! router in this process, fed with events whose packets are real RoCE frames (the
//! test kit's frame builder): human lines, JSON lines, kind filters, and pcapng that
//! tshark decodes as RoCE. Then a real agent in a namespace pair (root): its events
//! carry the frames' headers and none of their payload unless `events_payload_bytes`
//! asks for some.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

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
        rtt_us: None,
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

// ---------------------------------------------------------------------------------
// A real agent: headers, not payload

/// What the payload of every SEND and WRITE repeats: a byte of it in an event is a leak.
const PATTERN: &str = "ROCEPAYLOADPATTERN";

/// Payload bytes of the SENDs and WRITEs sent: their frames are longer than 128 bytes.
const PAYLOAD: usize = 200;

#[derive(clap::Parser)]
struct GenCli {
    #[command(flatten)]
    gen: roce_testkit::gen::GenArgs,
}

/// Sends 10 SENDs and 10 WRITEs, all CE-marked (so each is an event), of [`PAYLOAD`]
/// bytes of [`PATTERN`], from `vb` of `pair` to the agent's side.
fn send_patterned(pair: &common::Pair) {
    use clap::Parser as _;
    let cli = GenCli::try_parse_from([
        "roce-gen",
        "--iface",
        "vb",
        "--via",
        "udp",
        "--dst",
        "198.18.0.1",
        "--ops",
        "send,write",
        "--count",
        "20",
        "--ce",
        "20",
        "--payload",
        &PAYLOAD.to_string(),
        "--payload-pattern",
        PATTERN,
        "--cpu",
        "any",
    ])
    .expect("roce-gen arguments");
    let report = pair
        .b
        .enter(move || {
            roce_testkit::gen::run(&cli.gen, &std::sync::atomic::AtomicBool::new(false))
                .map_err(|e| e.to_string())
        })
        .expect("enter the namespace")
        .unwrap_or_else(|e| panic!("roce-gen: {e}"));
    assert_eq!(report.packets, 20);
}

/// What three followers of the agent at `api` got while [`send_patterned`] sent: the
/// body of `GET /events` (curl), `roce-agent events --json` and the pcapng file of
/// `roce-agent events --pcapng`.
struct Followed {
    raw: String,
    json: Vec<Event>,
    pcapng: Vec<u8>,
    path: roce_testkit::temp::TempFile,
}

fn follow_while_sending(pair: &common::Pair, agent: &common::Agent, api: &str) -> Followed {
    let path = roce_testkit::temp::TempFile::new("events.pcapng", "");
    let url = format!("http://{api}/events");
    let spawn = |program: &str, args: &[&str]| {
        pair.a
            .cmd(program, args)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    };
    let raw = spawn("curl", &["-sN", "--max-time", "4", &url]);
    let json = spawn(
        common::BIN,
        &["events", "--api", api, "--json", "--duration", "4"],
    );
    let pcap = spawn(
        common::BIN,
        &[
            "events",
            "--api",
            api,
            "--pcapng",
            path.arg(),
            "--duration",
            "4",
        ],
    );
    // All three subscribed before the first packet.
    agent.wait_for_subscribers(&pair.a, api, 3);
    send_patterned(pair);
    let done = |child: std::process::Child, what: &str| {
        let out = child.wait_with_output().expect("wait");
        // curl ends at --max-time with 28: the stream never ends on its own.
        assert!(
            out.status.success() || out.status.code() == Some(28),
            "{what}: {}\n{}",
            common::text(&out.stderr),
            agent.log()
        );
        common::text(&out.stdout)
    };
    let raw = done(raw, "curl GET /events");
    let json = done(json, "roce-agent events --json")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    done(pcap, "roce-agent events --pcapng");
    let pcapng = std::fs::read(path.path()).expect("the pcapng file");
    Followed {
        raw,
        json,
        pcapng,
        path,
    }
}

/// True when `needle` is somewhere in `hay`.
fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `(captured, on the wire, opcode)` of each frame of a pcapng file, as tshark reads it.
fn tshark_lengths(path: &std::path::Path) -> Vec<(usize, usize, u8)> {
    let rows =
        roce_testkit::tshark::Fields::new(&["frame.cap_len", "frame.len", "infiniband.bth.opcode"])
            .run(path)
            .expect("tshark reads the file");
    rows.iter()
        .map(|r| {
            let n = |i: usize| r.first(i).unwrap_or_default().parse().unwrap_or(0);
            (n(0), n(1), n(2) as u8)
        })
        .collect()
}

#[test]
fn a_real_agents_events_carry_headers_and_payload_only_when_the_config_asks() {
    require_root!();
    if !roce_testkit::tshark::available() {
        panic!("tshark is missing: `cargo xtask setup` installs it");
    }
    let pair = common::Pair::new("roce-ev-");
    let api = "127.0.0.1:9483";
    let config = roce_testkit::temp::TempFile::new("events.toml", "interfaces = [\"va\"]\n");
    let mut agent = common::Agent::start(
        &pair.a,
        &[
            "run",
            "--config",
            config.arg(),
            "--listen",
            api,
            "--no-pin",
            "--interval",
            "0.2",
        ],
    );
    agent.wait_ready(&pair.a, api);
    let pattern_hex = hex(PATTERN.as_bytes());
    // Ethernet 14, IPv4 20, UDP 8, BTH 12 (+ RETH 16 for a WRITE); payload; ICRC 4.
    let headers = |opcode: u8| if opcode == 0x0A { 70 } else { 54 };
    let wire = |opcode: u8| headers(opcode) + PAYLOAD + 4;

    // By default: the headers, and not one byte of payload, anywhere.
    let got = follow_while_sending(&pair, &agent, api);
    assert_eq!(got.json.len(), 20, "{:?}\n{}", got.json, agent.log());
    for ev in &got.json {
        assert_eq!(ev.kind, EventKind::Ce);
        let bytes = ev.packet_bytes().expect("hex");
        assert_eq!(bytes.len(), headers(ev.opcode), "{ev:?}");
        assert_eq!(ev.packet_len as usize, wire(ev.opcode), "{ev:?}");
    }
    let raw_lines = got.raw.lines().filter(|l| l.contains("\"kind\":\"ce\""));
    assert_eq!(raw_lines.count(), 20, "GET /events:\n{}", got.raw);
    for (what, text) in [
        ("GET /events", got.raw.clone()),
        (
            "events --json",
            got.json
                .iter()
                .map(|e| serde_json::to_string(e).unwrap())
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    ] {
        assert!(
            !text.contains(&pattern_hex) && !text.contains(PATTERN),
            "{what} carries payload:\n{text}"
        );
    }
    assert!(
        !holds(&got.pcapng, PATTERN.as_bytes()),
        "pcapng carries payload"
    );
    let frames = tshark_lengths(got.path.path());
    assert_eq!(frames.len(), 20, "{frames:?}");
    for (captured, len, opcode) in &frames {
        assert!(matches!(opcode, 0x04 | 0x0A), "{frames:?}");
        assert_eq!(
            (*captured, *len),
            (headers(*opcode), wire(*opcode)),
            "opcode {opcode}: captured / on the wire"
        );
    }

    // events_payload_bytes = 64, by a reload: 64 bytes of payload (within the 128).
    std::fs::write(
        config.path(),
        "interfaces = [\"va\"]\nevents_payload_bytes = 64\n",
    )
    .expect("rewrite the config");
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("configuration reloaded");
    let got = follow_while_sending(&pair, &agent, api);
    assert_eq!(got.json.len(), 20, "{:?}\n{}", got.json, agent.log());
    for ev in &got.json {
        let bytes = ev.packet_bytes().expect("hex");
        assert_eq!(bytes.len(), (headers(ev.opcode) + 64).min(128), "{ev:?}");
        assert!(holds(&bytes, PATTERN.as_bytes()), "{ev:?}");
    }
    assert!(got.raw.contains(&pattern_hex), "GET /events:\n{}", got.raw);
    assert!(
        holds(&got.pcapng, PATTERN.as_bytes()),
        "pcapng without payload"
    );
    for (captured, len, opcode) in tshark_lengths(got.path.path()) {
        assert_eq!(
            (captured, len),
            ((headers(opcode) + 64).min(128), wire(opcode)),
            "opcode {opcode}"
        );
    }
    assert!(agent.terminate().success(), "{}", agent.log());
}
