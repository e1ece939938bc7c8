//! The `roce-agent` binary as users run it: help texts, exit codes, configuration
//! errors, and real agent runs inside network namespaces that the tests create (and
//! delete again, also when a test fails). Runs that load BPF need root; without it
//! they are skipped with a note on stderr.
//!
//! Nothing here touches the root namespace's interfaces: every interface an agent
//! attaches to lives in a namespace named `roce-t-<pid>x<n>` (the test kit's
//! `netns::Netns`).

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{agent, new_ns, send_roce, send_roce_from, text, wait_for_flows, Agent, Pair, BIN};
use roce_testkit::netns::Netns;

/// The prefix of the namespaces the tests make: `roce-t-<pid>x<n>`.
const NS: &str = "roce-t-";

/// Whether an XDP program is attached to `dev` in `ns` (as `ip link` shows it).
fn has_xdp(ns: &Netns, dev: &str) -> bool {
    ns.ip_ok(&["link", "show", "dev", dev]).contains("xdp")
}

#[test]
fn run_help_shows_iface_and_listen() {
    let out = agent(&["run", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--iface",
        "--listen",
        "--config",
        "--interval",
        "127.0.0.1:9473",
        "--pin-dir",
        "/sys/fs/bpf/roce-agent",
        "--no-pin",
        "SIGHUP",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn flows_help_shows_json_and_api() {
    let out = agent(&["flows", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in ["--json", "--api", "127.0.0.1:9473"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn usage_errors_exit_2() {
    let out = agent(&["run", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let out = agent(&["run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--iface"),
        "{}",
        text(&out.stderr)
    );
    let out = agent(&["run", "--iface", "lo", "--interval", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--interval"));
}

#[test]
fn flows_without_an_agent_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = agent(&["flows", "--api", &format!("127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("no roce-agent answers at 127.0.0.1:"), "{err}");
}

#[test]
fn bad_config_exits_2_naming_line_and_column_and_attaches_nothing() {
    require_root!();
    let ns = new_ns(NS);
    // `run --config FILE ARGS` with `text` in FILE: exit 2, nothing attached; returns
    // stderr and the file's path.
    let refused = |name: &str, contents: &str, args: &[&str]| {
        let file = roce_testkit::temp::TempFile::new(name, contents);
        let mut all = vec!["run", "--config", file.arg()];
        all.extend_from_slice(args);
        let out = ns.cmd(BIN, &all).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(!has_xdp(&ns, "lo"));
        (text(&out.stderr), file.arg().to_string())
    };
    let (err, path) = refused(
        "bad.toml",
        "# comment\nlisten = \"127.0.0.1:9473\"\ndefault_pmtu = 1500\n",
        &["--iface", "lo"],
    );
    assert!(err.contains(&format!("{path}:3:16: default_pmtu")), "{err}");

    let (err, path) = refused(
        "syntax.toml",
        "interfaces = [\"lo\"\nroce_port = 4791\n",
        &[],
    );
    assert!(err.contains(&format!("{path}:2:1: ")), "{err}");

    // An interface the host does not have, named by the file: where it is named.
    let (err, path) = refused(
        "unknown-if.toml",
        "interfaces = [\"lo\", \"nosuch0\"]\n",
        &[],
    );
    assert!(
        err.contains(&format!(
            "{path}:1:21: interfaces: no such interface: nosuch0"
        )),
        "{err}"
    );
}

#[test]
fn missing_interface_exits_2_and_attaches_nothing() {
    require_root!();
    let ns = new_ns(NS);
    let out = ns
        .cmd(
            BIN,
            &[
                "run",
                "--iface",
                "lo",
                "--iface",
                "roce-missing0",
                "--listen",
                "127.0.0.1:0",
            ],
        )
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("no such interface: roce-missing0"), "{err}");
    assert!(
        !has_xdp(&ns, "lo"),
        "lo was attached although roce-missing0 is missing"
    );
}

#[test]
fn no_bpf_permission_exits_1_with_a_hint() {
    require_root!();
    let ns = new_ns(NS);
    // `roce-agent run` as nobody, without any capability.
    let as_nobody = |extra: &[&str]| {
        let mut args = vec![
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "run",
            "--iface",
            "lo",
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let out = ns.cmd("setpriv", &args).output().expect("run setpriv");
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        text(&out.stderr)
    };
    let err = as_nobody(&["--no-pin"]);
    assert!(err.contains("are you root"), "{err}");
    assert!(!has_xdp(&ns, "lo"));

    // Pinning (the default) needs a bpffs first; mounting one needs CAP_SYS_ADMIN.
    let err = as_nobody(&[]);
    assert!(
        err.contains("mount -t bpf bpf /sys/fs/bpf") && err.contains("--no-pin"),
        "{err}"
    );
    assert!(!has_xdp(&ns, "lo"));
}

#[test]
fn agent_in_a_namespace_serves_flows_and_with_no_pin_detaches_on_sigterm() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9474";
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.1",
            "--no-pin",
        ],
    );
    let first = agent.wait_ready(&pair.a, api);
    assert!(first.flows.is_empty(), "{first:?}");
    assert!(has_xdp(&pair.a, "va"), "{}", agent.log());

    let sport = send_roce(&pair.b, 5, 0x1234);

    // The agent polls every 100 ms: wait for the flow to show up complete (it must
    // also read back as the documented document).
    let json = wait_for_flows(&agent, &pair.a, api, |v| {
        v["flows"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["packets"] == 5))
    });
    let flows = json["flows"].as_array().expect("flows array");
    assert_eq!(flows.len(), 1, "{json}");
    let f = &flows[0];
    assert_eq!(f["ifname"], "va");
    assert_eq!(f["direction"], "ingress");
    assert_eq!(f["family"], "ipv4");
    assert_eq!(f["src"], "198.18.0.2");
    assert_eq!(f["dst"], "198.18.0.1");
    assert_eq!(f["sport"], sport);
    assert_eq!(f["dest_qp"], 0x1234);
    // 14 Ethernet + 20 IPv4 + 8 UDP + 12 BTH + 4 ICRC.
    assert_eq!(f["bytes"], 5 * 58);
    assert_eq!(
        f["ecn"],
        serde_json::json!({"not_ect": 0, "ect1": 0, "ect0": 5, "ce": 0})
    );
    assert_eq!(f["last_dscp"], 26);
    assert_eq!(f["psn_gaps"], 0);
    for k in ["vni", "inner_family", "inner_src", "inner_dst", "inner_ecn"] {
        assert!(f[k].is_null(), "{k} should be null: {f}");
    }
    assert_eq!(json["counters"]["roce"], 5);

    let out = pair
        .a
        .cmd(BIN, &["flows", "--api", api])
        .output()
        .expect("flows");
    assert!(out.status.success());
    let table = text(&out.stdout);
    assert!(table.contains("va/in"), "{table}");
    assert!(table.contains("198.18.0.2→198.18.0.1"), "{table}");
    assert!(table.contains("0x1234"), "QP in hex: {table}");

    let st = agent.terminate();
    assert_eq!(st.code(), Some(0), "{}", agent.log());
    assert!(
        !has_xdp(&pair.a, "va"),
        "XDP left attached:\n{}",
        pair.a.ip_ok(&["link", "show", "dev", "va"])
    );
    assert!(agent.log().contains("detached"), "{}", agent.log());
}

#[test]
fn ce_marked_roce_in_and_out_comes_out_of_get_events_and_the_event_counters() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9478";
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.1",
            "--events-sample",
            "1",
        ],
    );
    agent.wait_ready(&pair.a, api);
    // GET /events streams what is published after the request: follow first, and
    // send probes (QP 0x999) until the follower shows one, so it surely listens.
    let mut follower = pair
        .a
        .cmd(BIN, &["events", "--json", "--duration", "8", "--api", api])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("roce-agent events");
    let stdout = follower.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel::<serde_json::Value>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let v = serde_json::from_str(&line).expect("a JSON line");
            if lines_tx.send(v).is_err() {
                break;
            }
        }
    });
    let ce = (26 << 2) | 0b11;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut probes = 0;
    loop {
        send_roce_from(&pair.b, "198.18.0.2", "198.18.0.1", ce, 1, 0x999);
        probes += 1;
        if lines.recv_timeout(Duration::from_millis(200)).is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no event reached `roce-agent events`:\n{}",
            agent.log()
        );
    }
    // CE-marked RoCE arriving on va (XDP) and leaving it (tc_egress).
    let sport_in = send_roce_from(&pair.b, "198.18.0.2", "198.18.0.1", ce, 5, 0x1234);
    let sport_out = send_roce_from(&pair.a, "198.18.0.1", "198.18.0.2", ce, 3, 0x77);
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while events.len() < 8 && Instant::now() < deadline {
        if let Ok(v) = lines.recv_timeout(Duration::from_millis(100)) {
            if v["dest_qp"] != 0x999 {
                events.push(v);
            }
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    drop(lines);
    let _ = reader.join();
    let of = |dir: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["direction"] == dir).collect()
    };
    let (ingress, egress) = (of("ingress"), of("egress"));
    assert_eq!(
        (ingress.len(), egress.len()),
        (5, 3),
        "{events:#?}\n{}",
        agent.log()
    );
    for (i, e) in ingress.iter().enumerate() {
        assert_eq!(e["ifname"], "va");
        assert_eq!(e["kind"], "ce");
        assert_eq!(
            (&e["src"], &e["dst"]),
            (&"198.18.0.2".into(), &"198.18.0.1".into())
        );
        assert_eq!(e["sport"], sport_in);
        assert_eq!(e["dest_qp"], 0x1234);
        assert_eq!(e["opcode"], 4);
        assert_eq!(e["psn"], i);
        assert_eq!((&e["dscp"], &e["ecn"]), (&26.into(), &"ce".into()));
        assert_eq!(e["sample"], 1);
        // 14 Ethernet + 20 IPv4 + 8 UDP + 12 BTH + 4 ICRC on the wire; the event keeps
        // the headers only (events_payload_bytes = 0): the ICRC is not one.
        assert_eq!(e["packet_len"], 58);
        assert_eq!(e["packet"].as_str().map(str::len), Some(2 * 54));
        assert!(e["time_unix_ns"].as_u64().is_some_and(|t| t > 0));
    }
    for e in &egress {
        assert_eq!((&e["ifname"], &e["kind"]), (&"va".into(), &"ce".into()));
        assert_eq!(
            (&e["src"], &e["sport"]),
            (&"198.18.0.1".into(), &sport_out.into())
        );
        assert_eq!(e["dest_qp"], 0x77);
    }
    let json = wait_for_flows(&agent, &pair.a, api, |v| {
        v["counters"]["events"]["ce"] == 8 + probes
    });
    assert_eq!(
        json["counters"]["events_dropped"],
        serde_json::json!({"rate_limit": 0, "ring_full": 0})
    );
    let st = agent.terminate();
    assert_eq!(st.code(), Some(0), "{}", agent.log());
}

#[test]
fn roce_sent_from_the_agents_namespace_is_an_egress_flow_with_the_dscp_enforce_wrote() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9476";
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.1",
            "--mode",
            "enforce",
        ],
    );
    agent.wait_ready(&pair.a, api);

    // DSCP 10 / ECT(0) from the socket; enforce rewrites RoCE data to DSCP 26 on va's
    // egress, and the egress flow counts what left.
    let sport = send_roce_from(
        &pair.a,
        "198.18.0.1",
        "198.18.0.2",
        (10 << 2) | 0b10,
        7,
        0x77,
    );
    let json = wait_for_flows(&agent, &pair.a, api, |v| {
        v["flows"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["packets"] == 7))
    });
    let egress: Vec<&serde_json::Value> = json["flows"]
        .as_array()
        .expect("flows array")
        .iter()
        .filter(|f| f["direction"] == "egress")
        .collect();
    assert_eq!(egress.len(), 1, "{json}");
    let f = egress[0];
    assert_eq!(f["ifname"], "va");
    assert_eq!(f["src"], "198.18.0.1");
    assert_eq!(f["dst"], "198.18.0.2");
    assert_eq!(f["sport"], sport);
    assert_eq!(f["dest_qp"], 0x77);
    assert_eq!(f["packets"], 7);
    // 14 Ethernet + 20 IPv4 + 8 UDP + 12 BTH + 4 ICRC.
    assert_eq!(f["bytes"], 7 * 58);
    assert_eq!(
        f["ecn"],
        serde_json::json!({"not_ect": 0, "ect1": 0, "ect0": 7, "ce": 0})
    );
    assert_eq!(f["last_dscp"], 26, "the DSCP as written: {f}");
    assert_eq!(f["psn_gaps"], 0);
    // Egress frames are not in the class counters (those count what XDP saw arrive).
    assert_eq!(json["counters"]["roce"], 0, "{json}");
    assert_eq!(json["counters"]["qos"]["roce_rewritten"], 7, "{json}");

    let out = pair
        .a
        .cmd(BIN, &["flows", "--api", api])
        .output()
        .expect("flows");
    assert!(
        text(&out.stdout).contains("va/out"),
        "{}",
        text(&out.stdout)
    );
    let st = agent.terminate();
    assert_eq!(st.code(), Some(0), "{}", agent.log());
}

#[test]
fn agent_with_the_lab_config_listens_on_the_default_port() {
    require_root!();
    let pair = Pair::new(NS);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/lab.toml");
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--iface",
            "va",
            "--no-pin",
        ],
    );
    agent.wait_ready(&pair.a, "127.0.0.1:9473");
    // `flows` with no --api finds it too.
    let out = pair.a.cmd(BIN, &["flows"]).output().expect("flows");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("flows 0;"),
        "{}",
        text(&out.stdout)
    );
    let st = agent.terminate();
    assert_eq!(st.code(), Some(0), "{}", agent.log());
    assert!(!has_xdp(&pair.a, "va"));
}

#[test]
fn attach_failure_on_a_later_interface_detaches_the_earlier_ones() {
    require_root!();
    let pair = Pair::new(NS);
    // An XDP link is exclusive (and native and generic XDP cannot coexist): a first
    // agent holds `va2`, so a second agent asked for `va` then `va2` attaches `va`,
    // fails on `va2`, and must leave `va` detached again.
    pair.a
        .ip_ok(&["link", "add", "va2", "type", "veth", "peer", "name", "vb2"]);
    pair.a.ip_ok(&["link", "set", "va2", "up"]);
    pair.a.ip_ok(&["link", "set", "vb2", "up"]);
    let mut first = Agent::start(
        &pair.a,
        &["run", "--iface", "va2", "--listen", "127.0.0.1:9475"],
    );
    first.wait_ready(&pair.a, "127.0.0.1:9475");
    let out = pair
        .a
        .cmd(
            BIN,
            &[
                "run",
                "--iface",
                "va",
                "--iface",
                "va2",
                "--listen",
                "127.0.0.1:9476",
            ],
        )
        .output()
        .expect("second agent");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    eprintln!("second agent: {err}");
    assert!(err.contains("attaching XDP to va2"), "{err}");
    assert!(
        !has_xdp(&pair.a, "va"),
        "va left attached after a failed start"
    );
    assert!(
        has_xdp(&pair.a, "va2"),
        "the first agent's program was removed"
    );
    assert_eq!(first.terminate().code(), Some(0), "{}", first.log());
}

/// `GET /findings` of the agent at `api` in `ns`.
fn findings(ns: &Netns, api: &str) -> Vec<roce_agent::audit::Finding> {
    let api = api.to_string();
    let body = ns
        .enter(move || roce_agent::api::client::get_body(&api, "/findings", Duration::from_secs(5)))
        .expect("enter the namespace")
        .expect("GET /findings");
    let doc: roce_agent::doc::finding::Findings =
        serde_json::from_slice(&body).expect("findings JSON");
    doc.findings
}

#[test]
fn enforce_mode_sets_a_drifted_mtu_back_and_audit_mode_reports_it() {
    require_root!();
    let pair = Pair::new(NS);
    pair.a.ip_ok(&["link", "set", "va", "mtu", "9000"]);
    let api = "127.0.0.1:9475";
    let interval = 0.3;
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.3",
            "--mode",
            "enforce",
            "--mtu",
            "9000",
        ],
    );
    agent.wait_ready(&pair.a, api);
    assert!(findings(&pair.a, api)
        .iter()
        .all(|f| f.severity != roce_agent::audit::Severity::Error));

    // Behind the agent's back.
    pair.a.ip_ok(&["link", "set", "va", "mtu", "1500"]);
    // Set back by the next audit round (every 0.3 s); how soon is a figure, not the
    // test's verdict: a loaded machine may delay a round.
    let changed = Instant::now();
    let deadline = changed + Duration::from_secs(10);
    while pair.a.link_mtu("va") != 9000 {
        assert!(
            Instant::now() < deadline,
            "MTU not set back within 10 s:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "MTU set back {:?} after the change (interval {interval} s)",
        changed.elapsed()
    );
    // The log says what it changed.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !agent.log().contains("set back") {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        agent.log().contains("before=1500 after=9000"),
        "{}",
        agent.log()
    );
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());

    // Audit mode changes nothing and serves the finding instead.
    let mut agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--interval",
            "0.3",
            "--mtu",
            "9000",
        ],
    );
    agent.wait_ready(&pair.a, api);
    pair.a.ip_ok(&["link", "set", "va", "mtu", "1500"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let f = loop {
        let f = findings(&pair.a, api);
        if let Some(e) = f
            .iter()
            .find(|f| f.check == "mtu" && f.severity == roce_agent::audit::Severity::Error)
        {
            break e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no mtu finding: {f:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(f.interface.as_deref(), Some("va"));
    assert_eq!(f.found, "MTU 1500 (RoCE path MTU 1024)");
    assert_eq!(f.expected, "MTU >= 9000 (RoCE path MTU 4096)");
    std::thread::sleep(Duration::from_secs_f64(interval * 2.0));
    assert_eq!(pair.a.link_mtu("va"), 1500, "audit mode changed the MTU");
    assert!(agent.log().contains("audit finding"), "{}", agent.log());
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}
