//! The deployable units in `deploy/`: the systemd unit passes `systemd-analyze verify`,
//! and the agent runs as an unprivileged user with exactly the capabilities the unit
//! grants (and not with one fewer). Needs root (namespaces, setpriv).

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roce_testkit::netns::{unique_name, Netns};
use roce_testkit::temp::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn unit_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/roce-agent.service");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The capabilities of the unit's AmbientCapabilities=, as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let text = unit_text();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("the unit grants ambient capabilities");
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect()
}

#[test]
fn systemd_unit_verifies() {
    let dir = TempDir::new("roce-unit");
    // verify checks that ExecStart's program exists: point it at the built binary.
    let unit = unit_text().replace("/usr/local/bin/roce-agent", BIN);
    let path = dir.path().join("roce-agent.service");
    std::fs::write(&path, unit).expect("writing the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd) must be installed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("roce-agent.service"), "{stderr}");
}

/// The agent under setpriv as nobody, with `caps` as its only capabilities.
fn spawn_unprivileged(ns: &Netns, caps: &[String], listen: &str) -> Child {
    let set = caps
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(",");
    ns.cmd(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps=-all,{set}"),
            &format!("--ambient-caps=-all,{set}"),
            &format!("--bounding-set=-all,{set}"),
            BIN,
            "run",
            "--iface",
            "va",
            "--mode",
            "enforce",
            "--listen",
            listen,
            "--interval",
            "0.2",
        ],
    )
    .env_remove("RUST_LOG")
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawning setpriv")
}

/// Kills the agent when the test ends, however it ends.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn agent_runs_as_nobody_with_exactly_the_units_capabilities() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces, setpriv)");
        return;
    }
    let caps = unit_capabilities();
    assert_eq!(caps, ["bpf", "net_admin", "perfmon"]);
    let (name, _) = unique_name("roce-t-");
    let ns = Netns::create(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"));
    ns.ip_ok(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    ns.ip_ok(&["link", "set", "va", "up"]);
    ns.ip_ok(&["link", "set", "vb", "up"]);
    let listen = "127.0.0.1:9479";

    let mut agent = Reap(spawn_unprivileged(&ns, &caps, listen));
    let start = Instant::now();
    let body = loop {
        let got = ns
            .enter(|| roce_agent::api::get_body(listen, "/flows", Duration::from_secs(1)))
            .expect("entering the namespace");
        if let Ok(body) = got {
            break body;
        }
        if let Ok(Some(status)) = agent.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = agent.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the agent exited ({status}) as nobody with {caps:?}:\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no API after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let doc: serde_json::Value = serde_json::from_slice(&body).expect("GET /flows is JSON");
    assert!(doc["counters"].is_object(), "{doc}");
    assert!(ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let mut log = String::new();
    if let Some(mut e) = agent.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut log);
    }
    assert!(log.contains("tc QoS programs attached"), "{log}");
    drop(agent);

    // One capability fewer: refused at load, with the kernel's reason.
    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let out = spawn_unprivileged(&ns, &fewer, listen)
            .wait_with_output()
            .expect("waiting for the agent");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "ran without {missing}");
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "without {missing}: {err}"
        );
    }
    assert!(!ns.ip_ok(&["link", "show", "va"]).contains(" xdp"));
}
