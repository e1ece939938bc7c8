//! The QP table of a running agent: `GET /qps` and `roce-agent qps` (`--json` and the
//! table) on this host, whose kernel has no RDMA subsystem (no ib_core: RDMA netlink
//! is not there), and the visibility of the agent's interface in `/metrics` and the
//! log: `none` before RoCE frames cross it, `kernel_path` after. The real RDMA stack
//! (rxe, perftest) is the VM lab's.
//!
//! Namespace tests need root and skip without it; the promtool check is skipped
//! without promtool outside CI.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{agent, agent_in, send_roce, text, Agent, Pair};
use roce_testkit::netns::Netns;

/// `GET path` from inside `ns`: the body of a 200 answer (None: no answer, or
/// another status).
fn get(ns: &Netns, addr: &str, path: &str) -> Option<String> {
    let (addr, path) = (addr.to_string(), path.to_string());
    ns.enter(move || -> Option<String> {
        let mut s = TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())
            .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        (head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"))
            .then(|| body.to_string())
    })
    .ok()
    .flatten()
}

/// The value of the sample `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')
            .map(str::to_string)
    })
}

/// Scrapes until the sample `series` has `value` (10 seconds at most); the scrape.
fn wait_for_sample(agent: &Agent, ns: &Netns, api: &str, series: &str, value: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = get(ns, api, "/metrics");
        if let Some(text) = &got {
            if sample(text, series).as_deref() == Some(value) {
                return text.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{series} never was {value}: {got:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `promtool check metrics` finds nothing in `text` (skipped without promtool, except
/// under CI).
fn assert_promtool_clean(text: &str) {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing under CI"
        );
        eprintln!("promtool check skipped: no promtool (cargo xtask setup installs it)");
        return;
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n---\n{text}"
    );
}

#[test]
fn a_running_agent_serves_its_qp_table_and_the_visibility_of_its_interface() {
    require_root!();
    let pair = Pair::new("roce-q-");
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
            "--no-pin",
        ],
    );
    agent.wait_ready(&pair.a, api);

    // This kernel has no RDMA netlink: an empty table, no error, said once in the log.
    let empty =
        r#"{"qps":[],"ports":[],"error":null,"visibility":[{"ifname":"va","mode":"none"}]}"#;
    assert_eq!(get(&pair.a, api, "/qps").as_deref(), Some(empty));
    let out = agent_in(&pair.a, &["qps", "--json", "--api", api]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{empty}\n"));
    let out = agent_in(&pair.a, &["qps", "--api", api]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "no queue pairs: no RDMA device on this host\nqps 0: 0 seen on the wire, 0 offloaded, 0 not seen\nvisibility: va none\n"
    );

    // Before any RoCE: none, reported once the first interval is in.
    let scrape = wait_for_sample(
        &agent,
        &pair.a,
        api,
        r#"roce_visibility{ifname="va",mode="none"}"#,
        "1",
    );
    for mode in ["kernel_path", "offloaded", "mirror"] {
        let series = format!(r#"roce_visibility{{ifname="va",mode="{mode}"}}"#);
        assert_eq!(sample(&scrape, &series).as_deref(), Some("0"), "{scrape}");
    }
    assert!(!scrape.contains("roce_qp_info{"), "{scrape}");
    assert_promtool_clean(&scrape);
    agent.wait_for_log("RoCE visibility");
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("RoCE visibility")
            && l.contains("interface=va")
            && l.contains("visibility=none")),
        "{log}"
    );

    // RoCE frames cross va: the kernel path.
    send_roce(&pair.b, 5, 0x1234);
    let scrape = wait_for_sample(
        &agent,
        &pair.a,
        api,
        r#"roce_visibility{ifname="va",mode="kernel_path"}"#,
        "1",
    );
    assert_eq!(
        sample(&scrape, r#"roce_visibility{ifname="va",mode="none"}"#).as_deref(),
        Some("0")
    );
    assert_promtool_clean(&scrape);
    agent.wait_for_log("RoCE visibility changed");
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("RoCE visibility changed")
            && l.contains("visibility=kernel_path")
            && l.contains("before=none")),
        "{log}"
    );
    assert_eq!(
        log.matches("no RDMA devices").count(),
        1,
        "said once:\n{log}"
    );
    let out = agent_in(&pair.a, &["qps", "--json", "--api", api]);
    assert_eq!(
        text(&out.stdout),
        r#"{"qps":[],"ports":[],"error":null,"visibility":[{"ifname":"va","mode":"kernel_path"}]}"#
            .to_string()
            + "\n"
    );
    // No local QP: the flow has no owner, and says so.
    let flows = get(&pair.a, api, "/flows").expect("/flows");
    let doc: serde_json::Value = serde_json::from_str(&flows).expect("JSON");
    let flow = &doc["flows"][0];
    assert_eq!(flow["dest_qp"], 0x1234, "{doc}");
    assert!(flow["owner"].is_null(), "{doc}");

    assert!(agent.terminate().success(), "{}", agent.log());
}

#[test]
fn qps_without_an_agent_is_a_runtime_error_and_a_bad_address_a_usage_error() {
    // Nothing listens on port 1 of this host.
    let out = agent(&["qps", "--api", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("roce-agent: error: "),
        "{}",
        text(&out.stderr)
    );
    let out = agent(&["qps", "--api", "9473"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = agent(&["qps", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "--json",
        "--api",
        "offloaded",
        "not seen",
        "ROCE_AGENT_AUTH",
        "Exit status",
    ] {
        assert!(help.contains(word), "{word}: {help}");
    }
}

/// An API (the agent's own routes) serving `view` as its QP table, or no QP table
/// (an older agent), on 127.0.0.1 until the returned sender is dropped.
fn fake_agent(
    view: Option<roce_agent::telemetry::qps::QpView>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let (_ftx, flows) = tokio::sync::watch::channel(Arc::new(
                roce_agent::telemetry::live::LiveDocument::default(),
            ));
            let (_dtx, findings) = tokio::sync::watch::channel(Arc::new(
                roce_agent::doc::finding::Findings::default(),
            ));
            let present = view.is_some();
            let (_qtx, qps) = tokio::sync::watch::channel(Arc::new(view.unwrap_or_default()));
            let routes = roce_agent::api::server::router_with_qps(
                flows,
                findings,
                None,
                present.then_some(qps),
            );
            axum::serve(listener, routes)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("serving");
        });
    });
    (addr, stop, thread)
}

#[test]
fn qps_prints_the_agents_table_and_names_an_agent_without_one() {
    use roce_agent::doc::qp::{Qp, QpDocument, QpWire};
    use roce_agent::telemetry::qps::{Mode, QpView};
    let qp = Qp {
        device: "rxe0".into(),
        port: Some(1),
        lqpn: 17,
        rqpn: Some(18),
        qp_type: "RC".into(),
        state: "RTS".into(),
        sq_psn: Some(0),
        rq_psn: Some(0),
        pid: Some(577),
        comm: Some("ib_write_bw".into()),
        cgroup: Some("/kubepods.slice/pod1.slice".into()),
        pod_uid: Some("1111".into()),
        container_id: None,
        src: Some("198.18.0.1".parse().unwrap()),
        dst: Some("198.18.0.2".parse().unwrap()),
        counters: Default::default(),
        counter_id: None,
        seen_on_wire: true,
        netdev: Some("va".into()),
        src_port: None,
        dst_port: None,
        gone: false,
        wire: Some(QpWire {
            flows: 2,
            tx_packets: 10,
            rx_packets: 12,
            ..QpWire::default()
        }),
    };
    let view = QpView {
        document: QpDocument {
            qps: vec![qp.clone()],
            ports: Vec::new(),
            error: None,
        },
        visibility: vec![("va".to_string(), Mode::KernelPath)],
        ..QpView::default()
    };
    let (addr, stop, thread) = fake_agent(Some(view));
    let out = agent(&["qps", "--api", &addr]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "\
device/port  lqpn  rqpn  type  state  owner             pod   src→dst                wire tx/rx pkts  RTT p99  hw counters
rxe0/1       0x11  0x12  RC    RTS    ib_write_bw[577]  1111  198.18.0.1→198.18.0.2            10/12        -            0
qps 1: 1 seen on the wire, 0 offloaded, 0 not seen
visibility: va kernel_path
"
    );
    let out = agent(&["qps", "--json", "--api", &addr]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // The public fields, as the design names them.
    let q = &v["qps"][0];
    for (field, want) in [
        ("device", serde_json::json!("rxe0")),
        ("port", 1.into()),
        ("lqpn", 17.into()),
        ("rqpn", 18.into()),
        ("type", "RC".into()),
        ("state", "RTS".into()),
        ("sq_psn", 0.into()),
        ("rq_psn", 0.into()),
        ("pid", 577.into()),
        ("comm", "ib_write_bw".into()),
        ("cgroup", "/kubepods.slice/pod1.slice".into()),
        ("pod_uid", "1111".into()),
        ("container_id", serde_json::Value::Null),
        ("src", "198.18.0.1".into()),
        ("dst", "198.18.0.2".into()),
        ("counters", serde_json::json!({})),
        ("seen_on_wire", true.into()),
    ] {
        assert_eq!(q[field], want, "{field}: {v}");
    }
    assert_eq!(
        v["visibility"],
        serde_json::json!([{"ifname": "va", "mode": "kernel_path"}])
    );
    drop(stop);
    thread.join().expect("the fake agent");

    let (addr, stop, thread) = fake_agent(None);
    let out = agent(&["qps", "--api", &addr]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("has no QP table (an older roce-agent)"),
        "{}",
        text(&out.stderr)
    );
    drop(stop);
    thread.join().expect("the fake agent");
}

#[test]
fn qps_is_behind_the_web_configs_basic_auth_like_every_endpoint() {
    require_root!();
    let pair = Pair::new("roce-qa-");
    let api = "127.0.0.1:9477";
    let web = std::env::temp_dir().join(format!("roce-qps-web-{}.yml", std::process::id()));
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(web.clone());
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  ops: {}\n",
            bcrypt::hash("secret", 4).expect("bcrypt")
        ),
    )
    .expect("web config");
    let web_arg = web.to_string_lossy().into_owned();
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
            "--web-config-file",
            &web_arg,
        ],
    );
    agent.wait_for_log("serving GET /flows");
    // The raw route refuses without credentials.
    assert_eq!(get(&pair.a, api, "/qps"), None);
    let out = agent_in(&pair.a, &["qps", "--api", api]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let out = pair
        .a
        .cmd(common::BIN, &["qps", "--json", "--api", api])
        .env("ROCE_AGENT_AUTH", "ops:secret")
        .output()
        .expect("run qps");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(r#"{"qps":[],"ports":[],"error":null,"#),
        "{}",
        text(&out.stdout)
    );
    assert!(agent.terminate().success(), "{}", agent.log());
}
