//! The API served securely and within bounds (`run --web-config-file`, exporter-toolkit's
//! format): TLS, client certificates and basic auth as curl sees them, certificates
//! swapped by SIGHUP, and a surface that idle, slow or oversized clients cannot take
//! over (header-read timeout, head and body caps, a reader that stopped reading
//! dropped, 1,000 idle connections beside a scrape).
//!
//! Every agent runs in a network namespace pair `roce-s-<pid>x<n>` (198.18.0.0/30) that
//! the test makes and deletes, also when it fails; certificates come from the test
//! kit's throwaway CA, in a temporary directory removed likewise. curl, the independent
//! client, runs inside the namespace. Root is needed; the tests are skipped without it.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{agent_in, send_roce_from, text, Agent, Pair};
use roce_testkit::netns::Netns;
use roce_testkit::pki::TestCa;
use roce_testkit::temp::TempDir;

/// The prefix of the namespaces the tests make: `roce-s-<pid>x<n>`.
const NS: &str = "roce-s-";
/// The agent's API inside its namespace (each test has namespaces of its own).
const API: &str = "127.0.0.1:9490";
const HTTPS: &str = "https://127.0.0.1:9490";
const HTTP: &str = "http://127.0.0.1:9490";
const USER: &str = "prometheus";
const PASSWORD: &str = "s3cret pass";

/// A namespace pair, a CA and a directory for the certificates and the web config.
struct Lab {
    pair: Pair,
    dir: TempDir,
    ca: TestCa,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            pair: Pair::new(NS),
            dir: TempDir::new("secure-api"),
            ca: TestCa::new("roce-agent test CA"),
        };
        lab.ca.write(lab.dir.path(), "ca");
        lab
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_str().expect("UTF-8").to_string()
    }

    /// `NAME.crt` and `NAME.key`: a server certificate for the API's address.
    fn server_cert(&self, name: &str, serial: u64) {
        self.ca
            .server(&["127.0.0.1", "198.18.0.1", "localhost"], serial)
            .write(self.dir.path(), name);
    }

    fn write(&self, name: &str, contents: &str) {
        std::fs::write(self.path(name), contents).expect("writing a test file");
    }

    /// `run` on va in namespace a, the API on [`API`], with `web.yml` when `web`.
    fn start(&self, web: bool, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        self.start_with(web, extra, env, None)
    }

    /// [`Lab::start`], the agent's soft open-files limit `nofile` when given.
    fn start_with(
        &self,
        web: bool,
        extra: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Agent {
        let web_file = self.arg("web.yml");
        let mut args = vec![
            "run",
            "--iface",
            "va",
            "--listen",
            API,
            "--no-pin",
            "--interval",
            "0.2",
        ];
        if web {
            args.extend(["--web-config-file", &web_file]);
        }
        args.extend_from_slice(extra);
        let agent = Agent::start_with(&self.pair.a, &args, |cmd, _| {
            for (k, v) in env {
                cmd.env(k, v);
            }
            if let Some(soft) = nofile {
                use std::os::unix::process::CommandExt as _;
                // SAFETY: setrlimit only, between fork and exec; it allocates nothing.
                unsafe {
                    cmd.pre_exec(move || {
                        let mut limit = libc::rlimit {
                            rlim_cur: 0,
                            rlim_max: 0,
                        };
                        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        limit.rlim_cur = soft.min(limit.rlim_max);
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
        });
        agent.wait_for_log("serving GET /flows");
        agent
    }

    /// `curl -sS ARGS` in namespace a.
    fn curl(&self, args: &[&str]) -> Curl {
        curl(&self.pair.a, args)
    }

    /// The HTTP status curl got for `ARGS` ("000": none), with the CA trusted.
    fn status(&self, args: &[&str]) -> String {
        let ca = self.arg("ca.pem");
        let mut all = vec!["-o", "/dev/null", "-w", "%{http_code}", "--cacert", &ca];
        all.extend_from_slice(args);
        self.curl(&all).stdout
    }

    /// The serial number of the certificate the agent serves now (as curl prints it).
    fn served_serial(&self) -> String {
        let ca = self.arg("ca.pem");
        let out = self.curl(&[
            "-o",
            "/dev/null",
            "-w",
            "%{certs}",
            "--cacert",
            &ca,
            &format!("{HTTPS}/"),
        ]);
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix("Serial Number:"))
            .unwrap_or_else(|| panic!("no serial in {out:?}"))
            .trim()
            .to_string()
    }
}

#[derive(Debug)]
struct Curl {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `curl -sS --max-time 5 ARGS` inside `ns`.
fn curl(ns: &Netns, args: &[&str]) -> Curl {
    let out = ns
        .command("curl")
        .args(["-sS", "--max-time", "5"])
        .args(args)
        .output()
        .expect("run curl");
    Curl {
        code: out.status.code(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
    }
}

/// Sends `request` on a new connection to [`API`] from inside `ns` and reads until the
/// agent closes it (5 seconds at most): what came back, and how long that took.
fn exchange(ns: &Netns, request: Vec<u8>) -> (Vec<u8>, Duration) {
    ns.enter(move || {
        let mut s = TcpStream::connect(API).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let start = Instant::now();
        // The agent may close before it has read a refused request in full.
        let _ = s.write_all(&request);
        (read_until_closed(&mut s), start.elapsed())
    })
    .expect("enter the namespace")
}

/// What `s` delivers until the peer closes it (EOF or a reset); panics when it is
/// still open at its read timeout.
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!(
                "still open ({e}) after {} bytes: {}",
                got.len(),
                String::from_utf8_lossy(&got[..got.len().min(300)])
            ),
        }
    }
}

/// The status line of a raw answer.
fn status_line(raw: &[u8]) -> String {
    let raw = String::from_utf8_lossy(raw);
    raw.lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('\r')
        .to_string()
}

/// A bcrypt hash of `password` (the cheapest cost: the tests check the format).
fn hash(password: &str) -> String {
    bcrypt::hash(password, 4).expect("bcrypt")
}

/// One sample of the agent's metrics, read with `curl_args`.
fn metric(lab: &Lab, curl_args: &[&str], series: &str) -> String {
    let out = lab.curl(curl_args);
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in {out:?}"))
        .to_string()
}

#[test]
fn tls_and_basic_auth_refuse_without_credentials_and_serve_with_them() {
    require_root!();
    let lab = Lab::new();
    lab.server_cert("server", 0x1001);
    lab.write(
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  {USER}: {}\n\
             http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
            hash(PASSWORD)
        ),
    );
    let agent = lab.start(true, &[], &[]);
    let log = agent.log();
    assert!(log.contains("web=TLS ("), "{log}");
    assert!(log.contains("basic auth (1 user)"), "{log}");

    // No credentials, or wrong ones: 401 asking for Basic, with the configured headers.
    let metrics = format!("{HTTPS}/metrics");
    assert_eq!(lab.status(&[&metrics]), "401");
    assert_eq!(
        lab.status(&["-u", &format!("{USER}:wrong"), &metrics]),
        "401"
    );
    assert_eq!(
        lab.status(&["-u", &format!("nobody:{PASSWORD}"), &metrics]),
        "401"
    );
    let ca = lab.arg("ca.pem");
    let refused = lab.curl(&["-D", "-", "-o", "/dev/null", "--cacert", &ca, &metrics]);
    let head = refused.stdout.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 401"), "{refused:?}");
    assert!(
        head.contains("\r\nwww-authenticate: basic\r\n"),
        "{refused:?}"
    );
    assert!(
        head.contains("\r\nx-frame-options: deny\r\n"),
        "{refused:?}"
    );
    let body = lab.curl(&["--cacert", &ca, &metrics]);
    assert_eq!(body.stdout, "Unauthorized\n");

    // With them: every endpoint, with the headers.
    let user = format!("{USER}:{PASSWORD}");
    for path in ["/metrics", "/flows", "/findings", "/"] {
        assert_eq!(
            lab.status(&["-u", &user, &format!("{HTTPS}{path}")]),
            "200",
            "{path}"
        );
    }
    let served = lab.curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "--cacert",
        &ca,
        "-u",
        &user,
        &metrics,
    ]);
    assert!(
        served
            .stdout
            .to_ascii_lowercase()
            .contains("\r\nx-frame-options: deny\r\n"),
        "{served:?}"
    );

    // Plain HTTP to the TLS port: Go's answer.
    let plain = lab.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("{HTTP}/metrics"),
    ]);
    assert_eq!(plain.stdout, "400", "{plain:?}");
    let (raw, _) = exchange(
        &lab.pair.a,
        b"GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n".to_vec(),
    );
    assert_eq!(raw, roce_agent::api::listen::PLAIN_HTTP_ANSWER);

    // A client that trusts another CA refuses the agent's certificate.
    let other = TestCa::new("another CA");
    other.write(lab.dir.path(), "other-ca");
    let wrong = lab.curl(&["--cacert", &lab.arg("other-ca.pem"), "-u", &user, &metrics]);
    assert_eq!(wrong.code, Some(60), "{wrong:?}");
    assert!(wrong.stderr.contains("certificate"), "{wrong:?}");
    assert!(!agent.log().contains(PASSWORD), "{}", agent.log());
}

#[test]
fn client_certificates_are_required_and_checked_against_the_client_ca() {
    require_root!();
    let lab = Lab::new();
    lab.server_cert("server", 0x1001);
    lab.ca
        .client("scraper", 0x2001)
        .write(lab.dir.path(), "client");
    let other = TestCa::new("another CA");
    other
        .client("intruder", 0x3001)
        .write(lab.dir.path(), "intruder");
    lab.write(
        "web.yml",
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
    );
    let _agent = lab.start(true, &[], &[]);
    let metrics = format!("{HTTPS}/metrics");

    // No certificate: no TLS session, so no HTTP status at all.
    let ca = lab.arg("ca.pem");
    let none = lab.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        &ca,
        &metrics,
    ]);
    assert!(matches!(none.code, Some(35 | 56)), "{none:?}");
    assert_eq!(none.stdout, "000", "{none:?}");

    let (cert, key) = (lab.arg("client.crt"), lab.arg("client.key"));
    assert_eq!(
        lab.status(&["--cert", &cert, "--key", &key, &metrics]),
        "200"
    );

    let (cert, key) = (lab.arg("intruder.crt"), lab.arg("intruder.key"));
    let intruder = lab.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        &metrics,
    ]);
    assert!(matches!(intruder.code, Some(35 | 56)), "{intruder:?}");
    assert_eq!(intruder.stdout, "000", "{intruder:?}");
}

#[test]
fn sighup_swaps_the_certificate_and_a_broken_file_keeps_the_one_in_force() {
    require_root!();
    let lab = Lab::new();
    lab.server_cert("server", 0x1001);
    let web = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
    lab.write("web.yml", web);
    // No --config: SIGHUP reads the web configuration alone.
    let agent = lab.start(true, &[], &[]);
    assert_eq!(lab.served_serial(), "1001");

    // A new certificate at the same paths.
    lab.server_cert("server", 0x1002);
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("SIGHUP: web_config_file reloaded");
    assert_eq!(lab.served_serial(), "1002");

    // The file names other files.
    lab.server_cert("renewed", 0x1003);
    lab.write(
        "web.yml",
        "tls_server_config:\n  cert_file: renewed.crt\n  key_file: renewed.key\n",
    );
    agent.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.log().matches("web_config_file reloaded").count() < 2 {
        assert!(Instant::now() < deadline, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lab.served_serial(), "1003");

    // A file that names a missing key: refused, said why, the certificate stays.
    lab.write(
        "web.yml",
        "tls_server_config:\n  cert_file: renewed.crt\n  key_file: missing.key\n",
    );
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("web_config_file refused");
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("web_config_file refused"))
        .expect("the refusal");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("missing.key"), "{line}");
    assert_eq!(lab.served_serial(), "1003");

    let ca = lab.arg("ca.pem");
    let scrape = ["--cacert", ca.as_str(), "https://127.0.0.1:9490/metrics"];
    assert_eq!(
        metric(&lab, &scrape, "roce_agent_config_reloads_total"),
        "2"
    );
    assert_eq!(
        metric(&lab, &scrape, "roce_agent_config_reload_failures_total"),
        "1"
    );
    assert_eq!(
        metric(&lab, &scrape, "roce_agent_config_last_reload_successful"),
        "0"
    );
}

#[test]
fn a_config_reload_that_names_another_web_config_file_reads_it() {
    require_root!();
    let lab = Lab::new();
    lab.server_cert("server", 0x1001);
    lab.server_cert("other", 0x1002);
    lab.write(
        "web.yml",
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
    );
    lab.write(
        "web2.yml",
        "tls_server_config:\n  cert_file: other.crt\n  key_file: other.key\n",
    );
    // Relative to the config file.
    let config = |web: &str| format!("interfaces = [\"va\"]\nlisten = \"{API}\"\n{web}");
    lab.write("agent.toml", &config("web_config_file = \"web.yml\"\n"));
    let agent = Agent::start(
        &lab.pair.a,
        &["run", "--config", &lab.arg("agent.toml"), "--no-pin"],
    );
    agent.wait_for_log("serving GET /flows");
    assert_eq!(lab.served_serial(), "1001");

    lab.write("agent.toml", &config("web_config_file = \"web2.yml\"\n"));
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("web_config_file reloaded");
    assert!(
        agent.log().contains("configuration reloaded"),
        "{}",
        agent.log()
    );
    assert_eq!(lab.served_serial(), "1002");

    // A refused config keeps its web configuration, read again.
    lab.write("agent.toml", &config("web_config_file = \"\"\n"));
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("the configuration was refused");
    assert_eq!(lab.served_serial(), "1002");

    // No web_config_file any more: plain HTTP.
    lab.write("agent.toml", &config(""));
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("no web_config_file any more");
    assert_eq!(lab.status(&[&format!("{HTTP}/metrics")]), "200");
    let scrape = [format!("{HTTP}/metrics")];
    let scrape: Vec<&str> = scrape.iter().map(String::as_str).collect();
    assert_eq!(
        metric(&lab, &scrape, "roce_agent_config_reloads_total"),
        "2"
    );
    assert_eq!(
        metric(&lab, &scrape, "roce_agent_config_reload_failures_total"),
        "1"
    );
}

#[test]
fn a_bad_web_config_refuses_the_start_naming_the_file_and_the_cause() {
    require_root!();
    let lab = Lab::new();
    lab.write(
        "web.yml",
        "tls_server_config:\n  cert_file: none.crt\n  key_file: none.key\n",
    );
    let web = lab.arg("web.yml");
    let out = agent_in(
        &lab.pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            API,
            "--no-pin",
            "--web-config-file",
            &web,
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--web-config-file"), "{stderr}");
    assert!(stderr.contains(&web), "{stderr}");
    assert!(stderr.contains("none.crt"), "{stderr}");
    // Nothing was attached.
    let link = lab.pair.a.ip_ok(&["link", "show", "dev", "va"]);
    assert!(!link.contains("xdp"), "{link}");
}

/// 1,000 connections that send nothing, to an agent started with a soft limit of
/// 1,024 open files; then a scrape. With TLS when `tls`.
fn idle_connections_leave_metrics_answering(tls: bool) {
    let lab = Lab::new();
    if tls {
        lab.server_cert("server", 0x1001);
        lab.write(
            "web.yml",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n",
        );
    }
    let agent = lab.start_with(tls, &[], &[], Some(1024));
    // This process opens as many.
    roce_agent::api::listen::raise_open_files_limit().expect("raising the open files limit");
    let idle: Vec<TcpStream> = lab
        .pair
        .a
        .enter(|| {
            (0..1000)
                .map(|_| TcpStream::connect(API).expect("connect"))
                .collect()
        })
        .expect("enter the namespace");

    // The agent accepted them all (it holds their sockets).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ss = lab
            .pair
            .a
            .exec(
                "ss",
                &["-tnpH", "state", "established", "( sport = :9490 )"],
            )
            .expect("ss");
        let held = text(&ss.stdout).matches("roce-agent").count();
        if held >= 1000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent holds {held} of 1000 connections:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let url = format!("{}/metrics", if tls { HTTPS } else { HTTP });
    // curl gives up after 5 s ("000"): an API the idle connections starve fails here.
    for _ in 0..3 {
        let start = Instant::now();
        let status = lab.status(&[&url]);
        assert_eq!(status, "200", "{}", agent.log());
        println!(
            "/metrics beside 1,000 idle connections: {:?} (curl's start included)",
            start.elapsed()
        );
    }
    assert!(!agent.log().contains("over the cap"), "{}", agent.log());
    drop(idle);
}

#[test]
fn a_thousand_idle_connections_do_not_stop_metrics_answering_within_a_second() {
    require_root!();
    idle_connections_leave_metrics_answering(false);
}

#[test]
fn a_thousand_idle_tls_connections_do_not_stop_metrics_answering_within_a_second() {
    require_root!();
    idle_connections_leave_metrics_answering(true);
}

#[test]
fn a_partial_head_an_idle_connection_and_a_kept_alive_one_are_closed_at_the_header_timeout() {
    require_root!();
    let lab = Lab::new();
    let _agent = lab.start(false, &[], &[("ROCE_AGENT_HEADER_TIMEOUT_MS", "500")]);
    let close = Duration::from_millis(400)..Duration::from_secs(3);

    let (raw, took) = exchange(&lab.pair.a, b"GET /metrics HTTP/1.1\r\nHost: ag".to_vec());
    assert!(close.contains(&took), "{took:?}");
    assert!(!status_line(&raw).contains("200"), "{raw:?}");

    let (raw, took) = exchange(&lab.pair.a, Vec::new());
    assert!(close.contains(&took), "{took:?}");
    assert!(raw.is_empty(), "{raw:?}");

    // One request answered, then nothing: closed at the timeout too.
    let (raw, took) = exchange(
        &lab.pair.a,
        b"GET /findings HTTP/1.1\r\nHost: agent\r\n\r\n".to_vec(),
    );
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");
    assert!(close.contains(&took), "{took:?}");
}

#[test]
fn a_head_over_the_cap_is_431_and_a_request_body_413() {
    require_root!();
    let lab = Lab::new();
    let _agent = lab.start(false, &[], &[]);
    let request = |extra: &str, body: &str| {
        format!("GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n{extra}\r\n{body}")
            .into_bytes()
    };

    let big = format!("X-Big: {}\r\n", "a".repeat(20 * 1024));
    let (raw, _) = exchange(&lab.pair.a, request(&big, ""));
    assert_eq!(
        status_line(&raw),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );

    let (raw, _) = exchange(&lab.pair.a, request("Content-Length: 100000\r\n", ""));
    assert_eq!(status_line(&raw), "HTTP/1.1 413 Payload Too Large");
    let (raw, _) = exchange(
        &lab.pair.a,
        request("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    );
    assert_eq!(status_line(&raw), "HTTP/1.1 413 Payload Too Large");

    // A small body is no reason to refuse; a head under the cap is served.
    let (raw, _) = exchange(&lab.pair.a, request("Content-Length: 5\r\n", "hello"));
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");
    let fine = format!("X-Fine: {}\r\n", "a".repeat(8 * 1024));
    let (raw, _) = exchange(&lab.pair.a, request(&fine, ""));
    assert_eq!(status_line(&raw), "HTTP/1.1 200 OK");
}

#[test]
fn an_events_reader_that_stops_reading_is_dropped_and_others_are_served() {
    require_root!();
    let lab = Lab::new();
    // Small socket buffers in the agent's namespace: a reader that stops fills them soon.
    lab.pair
        .a
        .exec(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.tcp_rmem=4096 8192 16384",
                "net.ipv4.tcp_wmem=4096 8192 16384",
            ],
        )
        .expect("sysctl");
    // A write timeout longer than curl's 5 s: a scrape the blocked writer held would
    // fail below, with no bound on how fast a loaded machine answers.
    let agent = lab.start(
        false,
        &["--events-sample", "1"],
        &[("ROCE_AGENT_WRITE_TIMEOUT_MS", "6000")],
    );
    // The sleeper asks for events and reads none.
    let mut sleeper = lab
        .pair
        .a
        .enter(|| {
            let mut s = TcpStream::connect(API).expect("connect");
            s.write_all(b"GET /events HTTP/1.1\r\nHost: agent\r\n\r\n")
                .expect("request");
            s
        })
        .expect("enter the namespace");

    // CE-marked RoCE, sampled into events, until the agent gives up on the sleeper;
    // the API answers meanwhile.
    let ce = (26 << 2) | 0b11;
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut scrapes = 0;
    while !agent.log().contains("took nothing of its response") {
        send_roce_from(&lab.pair.b, "198.18.0.2", "198.18.0.1", ce, 300, 0x1234);
        assert_eq!(lab.status(&[&format!("{HTTP}/metrics")]), "200");
        scrapes += 1;
        assert!(
            Instant::now() < deadline,
            "the sleeper was never dropped:\n{}",
            agent.log()
        );
    }
    assert!(scrapes > 1, "dropped before its buffers could fill");

    // The sleeper wakes up: what was sent before, then the end of the connection.
    sleeper
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let got = read_until_closed(&mut sleeper);
    assert_eq!(status_line(&got), "HTTP/1.1 200 OK");
    assert!(
        String::from_utf8_lossy(&got).contains("\"kind\":\"ce\""),
        "{} bytes",
        got.len()
    );
}
