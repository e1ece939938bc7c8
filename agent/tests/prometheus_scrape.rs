//! A real Prometheus server (Debian's `prometheus` package, which `cargo xtask setup`
//! installs) scrapes a real agent over TLS, with a client certificate and basic auth,
//! as the README's `scrape_config` says: the target is up and the sums it stored equal
//! the packets sent. Needs root (namespaces); without the `prometheus` binary the test
//! is skipped with a note, except under CI (`CI` set), where it fails.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{roce_datagram, send_datagrams, send_datagrams_to, send_roce, text, Agent, Pair};
use roce_testkit::netns::Netns;
use roce_testkit::pki::TestCa;
use roce_testkit::temp::TempDir;

const NS: &str = "roce-ps-";

/// A bcrypt hash made once for the test (cost 4: fast, and as valid as cost 10).
fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash(password, 4).expect("bcrypt")
}

/// The Prometheus server, killed on drop (also when the test fails).
struct Prometheus {
    child: Child,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(ns: &Netns, dir: &Path, config: &Path, listen: &str) -> Prometheus {
        let log = dir.join("prometheus.log");
        let err = std::fs::File::create(&log).expect("log file");
        let storage = dir.join("tsdb");
        let child = ns
            .cmd(
                "prometheus",
                &[
                    &format!("--config.file={}", config.display()),
                    &format!("--storage.tsdb.path={}", storage.display()),
                    &format!("--web.listen-address={listen}"),
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The answer of Prometheus' instant query API to `promql` (None: no answer).
fn instant_query(ns: &Netns, server: &str, promql: &str) -> Option<serde_json::Value> {
    let out = ns
        .cmd(
            "curl",
            &[
                "-sS",
                "--max-time",
                "2",
                "-G",
                &format!("http://{server}/api/v1/query"),
                "--data-urlencode",
                &format!("query={promql}"),
            ],
        )
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The value of an instant query's single result (None: no result yet, or no answer).
fn query(ns: &Netns, server: &str, promql: &str) -> Option<f64> {
    let v = instant_query(ns, server, promql)?;
    let result = v["data"]["result"].as_array()?;
    let [one] = result.as_slice() else {
        return None;
    };
    one["value"][1].as_str()?.parse().ok()
}

fn have_prometheus() -> bool {
    let found = std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus is missing under CI: `cargo xtask setup` installs Debian's prometheus package"
        );
        eprintln!(
            "skipped: prometheus not found (apt-get install prometheus, or cargo xtask setup)"
        );
    }
    found
}

#[test]
fn prometheus_scrapes_the_agent_over_mutual_tls_with_basic_auth() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    if !have_prometheus() {
        return;
    }
    let dir = TempDir::new("roce-prom-tls");
    let ca = TestCa::new("roce-agent test CA");
    let ca_file = ca.write(dir.path(), "ca");
    let (cert, key) = ca
        .server(&["198.18.0.1"], 0x2901)
        .write(dir.path(), "agent");
    let (client_cert, client_key) = ca.client("prometheus", 0x2902).write(dir.path(), "prom");
    let password = "scrape-secret-2901";
    std::fs::write(dir.path().join("password"), password).expect("password file");
    let web = dir.path().join("web-config.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_ca_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS12\nbasic_auth_users:\n  prometheus: {}\n",
            cert.display(),
            key.display(),
            ca_file.display(),
            bcrypt_hash(password)
        ),
    )
    .expect("web config");
    let scrape = dir.path().join("prometheus.yml");
    std::fs::write(
        &scrape,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: roce-agent\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n      cert_file: {cc}\n      key_file: {ck}\n    basic_auth:\n      username: prometheus\n      password_file: {pw}\n    static_configs:\n      - targets: ['198.18.0.1:9476']\n",
            ca = ca_file.display(),
            cc = client_cert.display(),
            ck = client_key.display(),
            pw = dir.path().join("password").display(),
        ),
    )
    .expect("prometheus config");

    let pair = Pair::new(NS);
    let agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--no-pin",
            "--listen",
            "198.18.0.1:9476",
            "--interval",
            "0.2",
            "--web-config-file",
            web.to_str().expect("utf-8 path"),
        ],
    );
    agent.wait_for_log("serving");
    let sent = 37;
    send_roce(&pair.b, sent, 0x2901);

    let server = "127.0.0.1:19090";
    let prom = Prometheus::start(&pair.a, dir.path(), &scrape, server);
    let deadline = Instant::now() + Duration::from_secs(60);
    let total = r#"sum(roce_packets_total{job="roce-agent",ifname="va",direction="ingress"})"#;
    loop {
        let up = query(&pair.a, server, r#"up{job="roce-agent"}"#);
        let packets = query(&pair.a, server, total);
        if up == Some(1.0) && packets == Some(sent as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "up = {up:?}, packets = {packets:?} (want 1 and {sent})\nprometheus:\n{}\nagent:\n{}",
            prom.log(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The scrape was refused to no one else: the same endpoint without the client
    // certificate is not even a TLS session, and with it but without the password a 401.
    let no_cert = pair
        .a
        .cmd(
            "curl",
            &[
                "-sS",
                "--cacert",
                ca_file.to_str().unwrap(),
                "https://198.18.0.1:9476/metrics",
            ],
        )
        .output()
        .expect("curl");
    assert!(!no_cert.status.success(), "{}", text(&no_cert.stdout));
    let no_password = pair
        .a
        .cmd(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
                ca_file.to_str().unwrap(),
                "--cert",
                client_cert.to_str().unwrap(),
                "--key",
                client_key.to_str().unwrap(),
                "https://198.18.0.1:9476/metrics",
            ],
        )
        .output()
        .expect("curl");
    assert_eq!(text(&no_password.stdout), "401");
}

/// The Grafana dashboard's queries (`deploy/grafana/roce-agent.json`), each panel's
/// title with its targets' expressions.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/roce-agent.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target's expr");
            out.push((
                p["title"].as_str().unwrap_or("?").to_string(),
                expr.to_string(),
            ));
        }
    }
    out
}

/// An expression as Grafana sends it, its variables set: every job and instance, a
/// rate over 30 s (the scrape interval is 1 s).
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "30s")
        .replace("$instance", ".*")
        .replace("$job", ".*")
}

/// The series with a number (not NaN) an instant query returns (None: no answer).
fn series(ns: &Netns, server: &str, promql: &str) -> Option<usize> {
    let v = instant_query(ns, server, promql)?;
    assert_ne!(v["status"], "error", "{promql}: {v}");
    let numbers = v["data"]["result"].as_array()?.iter().filter(|r| {
        r["value"][1]
            .as_str()
            .and_then(|x| x.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    });
    Some(numbers.count())
}

/// Traffic that gives every panel something: CE-marked data arriving and CNPs leaving,
/// requests asking for ACKs leaving and their ACKs arriving (round trips), a NAK and a
/// go-back, a PSN gap, RoCE in VXLAN with its inner side. One round at PSN base `psn`.
fn dashboard_traffic(pair: &Pair, psn: u32) {
    const ECT0: i32 = (26 << 2) | 0b10;
    const CE: i32 = (26 << 2) | 0b11;
    let (a, b) = ("198.18.0.1", "198.18.0.2");
    let send_only = 0x04;
    let ack = |p: u32, syndrome: u8| roce_datagram(0x11, 0x41, p, false, &[syndrome, 0, 0, 1]);
    // B's data to A's QP 0x30, CE-marked, with a PSN gap; A's CNPs back to QP 0x31.
    let data: Vec<Vec<u8>> = (0..10)
        .map(|i| roce_datagram(send_only, 0x30, psn + i + i / 5, false, &[]))
        .collect();
    send_datagrams(&pair.b, b, a, CE, &data);
    send_datagrams(
        &pair.a,
        a,
        b,
        48 << 2,
        &[roce_datagram(0x81, 0x31, 0, false, &[0; 16])],
    );
    // A's requests to B's QP 0x40, each asking for an ACK; B's ACKs to A's QP 0x41.
    for i in 0..3 {
        send_datagrams(
            &pair.a,
            a,
            b,
            ECT0,
            &[roce_datagram(send_only, 0x40, psn + i, true, &[])],
        );
        std::thread::sleep(Duration::from_millis(5));
        send_datagrams(&pair.b, b, a, ECT0, &[ack(psn + i, 0x1F)]);
        std::thread::sleep(Duration::from_millis(15));
    }
    // B's RoCE in VXLAN (VNI 5001) to A's QP 0x60, the underlay marking it CE over
    // ECT(0) inner headers; the same QP unencapsulated, as the tunnel's inner side
    // would carry it (the inner addresses are the outer ones here).
    use roce_testkit::frame::{roce_frame, vxlan_header, Eth, RoceMsg, L3};
    let (a4, b4) = ([198, 18, 0, 1].into(), [198, 18, 0, 2].into());
    let tunnelled: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let inner = L3::v4(b4, a4).with_tos(ECT0 as u8);
            let frame = roce_frame(
                &Eth::default(),
                &inner,
                0xC000,
                &RoceMsg::send_only(0x60, psn + i, 0),
            );
            [vxlan_header(0x08, 5001).as_slice(), &frame].concat()
        })
        .collect();
    send_datagrams_to(&pair.b, b, a, 4789, CE, &tunnelled);
    send_datagrams(
        &pair.b,
        b,
        a,
        ECT0,
        &[roce_datagram(send_only, 0x60, psn, false, &[])],
    );
    // A NAK of the next PSN, and A's go-back to it.
    send_datagrams(&pair.b, b, a, ECT0, &[ack(psn + 1, 0x60)]);
    send_datagrams(
        &pair.a,
        a,
        b,
        ECT0,
        &[roce_datagram(send_only, 0x40, psn + 1, true, &[])],
    );
}

#[test]
fn every_query_of_the_dashboard_returns_data_from_a_live_agent() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    if !have_prometheus() {
        return;
    }
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    let dir = TempDir::new("roce-prom-dash");
    let scrape = dir.path().join("prometheus.yml");
    std::fs::write(
        &scrape,
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: roce-agent\n    static_configs:\n      - targets: ['127.0.0.1:9477']\n",
    )
    .expect("prometheus config");
    let pair = Pair::new(NS);
    // The mlx5 fixture tree stands for the RNIC: its counters, and its port's PFC
    // pause counters (`ethtool-S`).
    let agent = Agent::start(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--vtep",
            "va",
            "--no-pin",
            "--listen",
            "127.0.0.1:9477",
            "--interval",
            "0.2",
            "--sysfs-root",
            &common::fixture("mlx5-good"),
        ],
    );
    agent.wait_for_log("serving");
    let server = "127.0.0.1:19091";
    let prom = Prometheus::start(&pair.a, dir.path(), &scrape, server);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut psn = 0x1000;
    loop {
        dashboard_traffic(&pair, psn);
        psn += 0x100;
        let empty: Vec<String> = queries
            .iter()
            .filter(|(_, q)| series(&pair.a, server, &as_grafana_sends(q)).unwrap_or(0) == 0)
            .map(|(panel, q)| format!("{panel}: {q}"))
            .collect();
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queries of the dashboard without data:\n{}\nprometheus:\n{}\nagent:\n{}",
            empty.join("\n"),
            prom.log(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
