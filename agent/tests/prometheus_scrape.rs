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

use common::{send_roce, text, Agent, Pair};
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

/// The value of an instant query's single result (None: no result yet, or no answer).
fn query(ns: &Netns, server: &str, promql: &str) -> Option<f64> {
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
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
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
