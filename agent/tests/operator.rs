//! Operator conventions of the `roce-agent` binary: exit codes that mean one thing (0
//! success, 1 runtime error, 2 usage or configuration error), addresses (`:PORT`),
//! `--json` compact or `--pretty`, `run --peer`, a SIGHUP without a config file, and
//! logs machines read (`--log-format json|logfmt`, no timestamp on the journal, one
//! record a refused reload).
//!
//! Runs of the agent itself happen in network namespaces `roce-o-<pid>x<n>` that the
//! tests make (and delete, also when a test fails); they need root and are skipped
//! without it. The rest runs anywhere.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{agent, text, Agent, Pair, BIN};
use roce_testkit::netns::Netns;
use roce_testkit::temp::TempFile;

/// The prefix of the namespaces the tests make: `roce-o-<pid>x<n>`.
const NS: &str = "roce-o-";

/// A port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

// ---------------------------------------------------------------------------------
// logfmt, read back

/// The pairs of one logfmt line; an error for anything that is not logfmt (a key
/// without `=`, an unterminated or badly escaped quote, a bare value with `"` or `=`).
fn logfmt(line: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if_eq(&' ').is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && *c != ' ') {
            if c == '"' || c.is_control() {
                return Err(format!("a key with {c:?}: {line}"));
            }
            key.push(c);
        }
        if key.is_empty() || chars.next() != Some('=') {
            return Err(format!("a key without a value after {key:?}: {line}"));
        }
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("unterminated quote in {key}: {line}")),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('"') => value.push('"'),
                        Some('\\') => value.push('\\'),
                        Some('n') => value.push('\n'),
                        Some('r') => value.push('\r'),
                        Some('t') => value.push('\t'),
                        Some('u') => {
                            let hex: String = chars.by_ref().take(4).collect();
                            let c = u32::from_str_radix(&hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .ok_or_else(|| format!("bad \\u{hex} in {key}: {line}"))?;
                            value.push(c);
                        }
                        other => return Err(format!("bad escape {other:?} in {key}: {line}")),
                    },
                    Some(c) if c.is_control() => {
                        return Err(format!("a raw control character in {key}: {line}"))
                    }
                    Some(c) => value.push(c),
                }
            }
            if chars.peek().is_some_and(|c| *c != ' ') {
                return Err(format!("text after the quote of {key}: {line}"));
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ' ') {
                if c == '"' || c == '=' || c.is_control() {
                    return Err(format!("a bare value with {c:?} in {key}: {line}"));
                }
                value.push(c);
            }
        }
        pairs.push((key, value));
    }
}

#[test]
fn the_tests_logfmt_reader_reads_logfmt_and_refuses_the_rest() {
    let pairs = logfmt(r#"level=info msg="a b \"c\"\nd" n=3 empty="""#).unwrap();
    let expected = [
        ("level", "info"),
        ("msg", "a b \"c\"\nd"),
        ("n", "3"),
        ("empty", ""),
    ];
    assert_eq!(pairs, expected.map(|(k, v)| (k.to_string(), v.to_string())));
    for bad in [
        "level",
        "msg=a b",
        "msg=\"open",
        "msg=a\"b",
        "=x",
        "a=\"x\"y",
        "k=1=2",
    ] {
        assert!(logfmt(bad).is_err(), "{bad}");
    }
}

/// The value of `key` in a logfmt record.
fn field<'a>(record: &'a [(String, String)], key: &str) -> Option<&'a str> {
    record
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `DEVICE:INODE` of `path`, as systemd sets `JOURNAL_STREAM` for a service's stderr.
fn journal_stream_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).expect("stat the log file");
    format!("{}:{}", m.dev(), m.ino())
}

// ---------------------------------------------------------------------------------
// Exit codes and addresses

#[test]
fn a_client_address_that_is_not_one_exits_2_and_an_unanswered_one_exits_1() {
    for sub in ["flows", "events", "top"] {
        let out = agent(&[sub, "--api", "9473"]);
        assert_eq!(out.status.code(), Some(2), "{sub}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("\"9473\" is not HOST:PORT")
                && err.contains(":9473 for the agent on this host"),
            "{sub}: {err}"
        );
    }
    // `:PORT` is the agent on this host: nothing answers there, a runtime error.
    let port = closed_port();
    let out = agent(&["flows", "--api", &format!(":{port}")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("no roce-agent answers at 127.0.0.1:{port}")),
        "{}",
        text(&out.stderr)
    );
    // Well-formed, but the name has no address: runtime as well.
    let out = agent(&["flows", "--api", "nosuchhost.invalid:9473"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot resolve nosuchhost.invalid:9473"),
        "{}",
        text(&out.stderr)
    );
    // The daemon's own address: the same rule.
    let out = agent(&["run", "--iface", "lo", "--listen", "9473"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn a_missing_interface_exits_2_from_the_flags_and_from_the_file() {
    // Refused before anything is loaded: no root needed, nothing touched.
    let out = agent(&["run", "--iface", "roce-nosuch0", "--no-pin"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("roce-agent: error: no such interface: roce-nosuch0"),
        "{}",
        text(&out.stderr)
    );
    let file = TempFile::new("missing.toml", "interfaces = [\"roce-nosuch0\"]\n");
    let out = agent(&["run", "--config", file.arg(), "--no-pin"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "{}:1:15: interfaces: no such interface: roce-nosuch0",
            file.arg()
        )),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------
// --json and --pretty

/// Serves `body` as the answer to `connections` requests on 127.0.0.1; its address.
fn serve_once(body: Vec<u8>, connections: usize) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let server = std::thread::spawn(move || {
        for _ in 0..connections {
            let (mut s, _) = listener.accept().expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).expect("read the request");
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).expect("write");
            s.write_all(&body).expect("write");
        }
    });
    (addr, server)
}

#[test]
fn flows_json_is_the_served_line_and_pretty_indents_it_in_the_same_order() {
    let doc = roce_agent::doc::Document::default();
    let body = serde_json::to_vec(&doc).expect("JSON");
    let (addr, server) = serve_once(body.clone(), 2);

    let out = agent(&["flows", "--json", "--api", &addr]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut expected = body.clone();
    expected.push(b'\n');
    assert_eq!(text(&out.stdout), text(&expected));

    let out = agent(&["flows", "--json", "--pretty", "--api", &addr]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pretty = text(&out.stdout);
    // As serde_json indents the document, its keys in the served order.
    assert_eq!(
        pretty,
        format!("{}\n", serde_json::to_string_pretty(&doc).unwrap())
    );
    assert!(
        pretty.starts_with("{\n  \"flows\": [],\n  \"counters\": {\n    \""),
        "{pretty}"
    );
    server.join().expect("server");

    // --pretty is a way of printing --json.
    let out = agent(&["flows", "--pretty", "--api", &addr]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn detach_json_is_one_line_and_pretty_indents_it() {
    let nothing = roce_testkit::temp::unique_path("no-pins");
    let dir = nothing.to_str().expect("UTF-8");
    let out = agent(&["detach", "--pin-dir", dir, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\"links\":[],\"filters\":[],\"qdiscs\":[],\"programs\":[],\"maps\":[]}\n"
    );
    let out = agent(&["detach", "--pin-dir", dir, "--json", "--pretty"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "{\n  \"links\": [],\n  \"filters\": [],\n  \"qdiscs\": [],\n  \"programs\": [],\n  \"maps\": []\n}\n"
    );
}

// ---------------------------------------------------------------------------------
// Log formats of runs that stop at once (no root: refused before anything loads)

#[test]
fn a_refused_config_is_one_json_record_with_its_caret_block_in_a_field() {
    let file = TempFile::new("syntax.toml", "interfaces = [\"lo\"]\nroce_port = = 4\n");
    let out = agent(&["run", "--config", file.arg(), "--log-format", "json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one record:\n{err}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
    assert_eq!(v["level"], "error", "{v}");
    assert_eq!(v["msg"], "roce-agent: error", "{v}");
    assert_eq!(v["exit_code"], 2, "{v}");
    let error = v["error"].as_str().expect("error");
    assert!(
        error.starts_with(&format!("{}:2:13: roce_port: ", file.arg())),
        "{error}"
    );
    assert!(
        !error.contains('^'),
        "the caret block is a field of its own: {error}"
    );
    assert_eq!(
        v["excerpt"], "    | roce_port = = 4\n    |             ^",
        "{v}"
    );
    assert!(v["ts"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
}

#[test]
fn logfmt_from_the_file_or_the_flag_quotes_values_and_has_no_timestamp_on_the_journal() {
    // The file asks for logfmt and is refused for a value: its format still applies.
    let file = TempFile::new(
        "logfmt.toml",
        "log_format = \"logfmt\"\ninterfaces = [\"lo\"]\ndefault_pmtu = 1500\n",
    );
    let log = TempFile::new("stderr.log", "");
    let run = |journal: Option<&str>, extra: &[&str]| -> String {
        let mut args = vec!["run", "--config", file.arg()];
        args.extend_from_slice(extra);
        let mut cmd = Command::new(BIN);
        cmd.args(&args)
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .stderr(std::fs::File::create(log.path()).expect("log file"));
        if let Some(j) = journal {
            cmd.env("JOURNAL_STREAM", j);
        }
        let st = cmd.status().expect("run roce-agent");
        assert_eq!(st.code(), Some(2));
        std::fs::read_to_string(log.path()).expect("the log")
    };
    let err = run(None, &[]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one record:\n{err}");
    let record = logfmt(lines[0]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record[0].0, "ts", "{err}");
    assert_eq!(field(&record, "level"), Some("error"), "{err}");
    assert_eq!(field(&record, "exit_code"), Some("2"), "{err}");
    assert!(
        field(&record, "error").is_some_and(|e| e.starts_with(&format!(
            "{}:3:16: default_pmtu: 1500 is not an InfiniBand MTU",
            file.arg()
        ))),
        "{err}"
    );
    // Values with spaces are quoted.
    assert!(lines[0].contains(" msg=\"roce-agent: error\" "), "{err}");

    // stderr is the journal: no timestamp.
    let journal = journal_stream_of(log.path());
    let err = run(Some(&journal), &[]);
    let record = logfmt(err.trim_end()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        record[0],
        ("level".to_string(), "error".to_string()),
        "{err}"
    );
    assert!(field(&record, "ts").is_none(), "{err}");
    // Another stream is not the journal.
    let err = run(Some("1:1"), &[]);
    assert!(err.starts_with("ts="), "{err}");

    // The flag wins over the file.
    let err = run(None, &["--log-format", "json"]);
    let v: serde_json::Value = serde_json::from_str(err.trim_end()).expect("a JSON line");
    assert_eq!(v["level"], "error", "{err}");
    let err = run(None, &["--log-format", "text"]);
    assert!(err.starts_with("roce-agent: error: "), "{err}");
}

// ---------------------------------------------------------------------------------
// Real agents in namespaces

/// Starts `roce-agent ARGS` in `ns`; with `journal`, its stderr is "the journal"
/// (JOURNAL_STREAM names its log file).
fn start_agent(ns: &Netns, args: &[&str], journal: bool) -> Agent {
    Agent::start_with(ns, args, |cmd, log| {
        if journal {
            cmd.env("JOURNAL_STREAM", journal_stream_of(log));
        }
    })
}

/// `GET path` of the agent at `api`, from inside `ns`.
fn get(ns: &Netns, api: &str, path: &str) -> String {
    let (api, path) = (api.to_string(), path.to_string());
    let body = ns
        .enter(move || roce_agent::api::client::get_body(&api, &path, Duration::from_secs(5)))
        .expect("enter the namespace")
        .unwrap_or_else(|e| panic!("GET: {e}"));
    text(&body)
}

/// The value of the sample `series` (no labels) in an exposition.
fn sample(exposition: &str, series: &str) -> Option<String> {
    exposition.lines().find_map(|l| {
        let (name, value) = l.split_once(' ')?;
        (name == series).then(|| value.to_string())
    })
}

/// The three `roce_agent_config_*` samples: (reloads, failures, last successful).
fn reload_metrics(ns: &Netns, api: &str) -> (String, String, String) {
    let m = get(ns, api, "/metrics");
    let v = |s: &str| sample(&m, s).unwrap_or_else(|| panic!("no {s} in\n{m}"));
    (
        v("roce_agent_config_reloads_total"),
        v("roce_agent_config_reload_failures_total"),
        v("roce_agent_config_last_reload_successful"),
    )
}

#[test]
fn colon_port_listens_on_every_address_and_peer_is_probed() {
    require_root!();
    let pair = Pair::new(NS);
    // va's MTU 1500 cannot carry the 9000 asked for: the path to the peer fails.
    let mut agent = start_agent(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            ":9481",
            "--no-pin",
            "--peer",
            "198.18.0.2",
            "--mtu",
            "9000",
        ],
        true,
    );
    agent.wait_ready(&pair.a, "127.0.0.1:9481");
    // The clients' `:PORT` is this host's agent; the other host reaches it too.
    let out = pair
        .a
        .cmd(BIN, &["flows", "--api", ":9481"])
        .output()
        .expect("flows");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = pair
        .b
        .cmd(BIN, &["flows", "--json", "--api", "198.18.0.1:9481"])
        .output()
        .expect("flows from b");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = agent.log();
    assert!(log.contains("reachable from other hosts"), "{log}");

    let findings: roce_agent::doc::finding::Findings =
        serde_json::from_str(&get(&pair.a, "127.0.0.1:9481", "/findings")).expect("findings");
    let path: Vec<_> = findings
        .findings
        .iter()
        .filter(|f| f.check == "mtu_path")
        .collect();
    assert_eq!(path.len(), 1, "{findings:?}");
    assert!(path[0].found.contains("198.18.0.2"), "{:?}", path[0]);
    assert!(path[0].found.contains("va, MTU 1500"), "{:?}", path[0]);

    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
    // Text on the journal: no line starts with a timestamp, each with its level.
    let log = agent.log();
    assert!(log.contains("INFO"), "{log}");
    for line in log.lines() {
        let line = line.trim_start();
        assert!(
            ["ERROR", "WARN", "INFO"]
                .iter()
                .any(|l| line.starts_with(l)),
            "a line that does not start with its level on the journal: {line}\n{log}"
        );
    }
}

#[test]
fn sighup_without_a_config_changes_no_reload_metric_and_logfmt_lines_parse() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9482";
    let mut agent = start_agent(
        &pair.a,
        &[
            "run",
            "--iface",
            "va",
            "--listen",
            api,
            "--no-pin",
            "--log-format",
            "logfmt",
            "--mtu",
            "9000",
        ],
        false,
    );
    agent.wait_ready(&pair.a, api);
    assert_eq!(
        reload_metrics(&pair.a, api),
        ("0".into(), "0".into(), "1".into())
    );
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("nothing to reload");
    assert_eq!(
        reload_metrics(&pair.a, api),
        ("0".into(), "0".into(), "1".into()),
        "{}",
        agent.log()
    );
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());

    let log = agent.log();
    let records: Vec<Vec<(String, String)>> = log
        .lines()
        .map(|l| logfmt(l).unwrap_or_else(|e| panic!("{e}\n{log}")))
        .collect();
    for r in &records {
        assert_eq!(r[0].0, "ts", "{r:?}");
        let level = field(r, "level").unwrap_or_default();
        assert!(["error", "warn", "info"].contains(&level), "{r:?}");
    }
    let with = |msg: &str| {
        records
            .iter()
            .find(|r| field(r, "msg") == Some(msg))
            .unwrap_or_else(|| panic!("no record {msg:?}:\n{log}"))
    };
    let hup = with("SIGHUP: the agent runs without --config: nothing to reload");
    assert_eq!(field(hup, "level"), Some("info"));
    // Enums in lowercase, one way.
    let tc = with("tc QoS programs attached");
    assert_eq!(field(tc, "mode"), Some("audit"), "{tc:?}");
    assert_eq!(field(tc, "ecn_propagation"), Some("kernel"), "{tc:?}");
    let finding = with("audit finding");
    assert_eq!(field(finding, "severity"), Some("error"), "{finding:?}");
    assert!(log.contains(" msg=\"audit finding\" "), "{log}");
}

#[test]
fn a_refused_reload_is_one_record_and_counts_as_a_failure() {
    require_root!();
    let pair = Pair::new(NS);
    let api = "127.0.0.1:9483";
    let good = format!("interfaces = [\"va\"]\nlisten = \"{api}\"\nlog_format = \"json\"\n");
    let file = TempFile::new("reload.toml", &good);
    let mut agent = start_agent(&pair.a, &["run", "--config", file.arg(), "--no-pin"], false);
    agent.wait_ready(&pair.a, api);

    std::fs::write(file.path(), format!("{good}roce_port = = 4\n")).expect("write");
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("the configuration was refused");
    assert_eq!(
        reload_metrics(&pair.a, api),
        ("0".into(), "1".into(), "0".into())
    );
    std::fs::write(file.path(), &good).expect("write");
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("configuration reloaded");
    assert_eq!(
        reload_metrics(&pair.a, api),
        ("1".into(), "1".into(), "1".into())
    );
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());

    let log = agent.log();
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{log}")))
        .collect();
    let refused: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| {
            r["msg"]
                .as_str()
                .is_some_and(|m| m.contains("the configuration was refused"))
        })
        .collect();
    assert_eq!(refused.len(), 1, "{log}");
    let r = refused[0];
    assert_eq!(r["level"], "error");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.starts_with(&format!("{}:4:13: roce_port: ", file.arg()))),
        "{r}"
    );
    assert_eq!(
        r["excerpt"], "    | roce_port = = 4\n    |             ^",
        "{r}"
    );
    assert_eq!(
        log.matches("roce_port = = 4").count(),
        1,
        "the excerpt once, in the record:\n{log}"
    );
}
