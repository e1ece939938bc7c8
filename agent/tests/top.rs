//! `roce-agent top` as a user runs it: in a real terminal (a tmux pane on a private
//! tmux server, killed again when a test ends, also when it fails), against a small
//! fake agent serving a fixed `/flows` and `/findings` through the agent's own
//! `api::server::router`. Keys go in with `tmux send-keys`, the screen comes out with
//! `tmux capture-pane`.
//!
//! Needs tmux (`cargo xtask setup` installs it); without it the terminal tests are
//! skipped with a note on stderr. No root needed.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_agent::api::{self};
use roce_agent::doc::finding::Findings;
use roce_agent::doc::Document;

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");
/// How long a screen may take to show what a test waits for.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(15);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn have_tmux() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

macro_rules! require_tmux {
    () => {
        if !have_tmux() {
            eprintln!("skipped: needs tmux (cargo xtask setup installs it)");
            return;
        }
    };
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A private tmux server (its own socket, no user config) with one window running a
/// shell; the server is killed and its socket removed on drop.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// A window running an interactive shell (prompt `$ `).
    fn start(width: u16, height: u16) -> Tmux {
        Tmux::start_command(width, height, "PS1='$ ' exec sh")
    }

    fn start_command(width: u16, height: u16, command: &str) -> Tmux {
        let socket = std::env::temp_dir().join(format!(
            "roce-top-test-{}-{}.tmux",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tmux = Tmux { socket };
        tmux.ok(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            command,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "tmux {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// Types `line` into the pane and presses Enter.
    fn type_line(&self, line: &str) {
        self.ok(&["send-keys", "-t", "top", "-l", line]);
        self.ok(&["send-keys", "-t", "top", "Enter"]);
    }

    /// Types `text` into the pane, character by character, without Enter.
    fn type_text(&self, text: &str) {
        self.ok(&["send-keys", "-t", "top", "-l", text]);
    }

    /// Presses keys by tmux's names (`c`, `q`, `C-c`, `Escape`).
    fn press(&self, key: &str) {
        self.ok(&["send-keys", "-t", "top", key]);
    }

    fn screen(&self) -> String {
        self.ok(&["capture-pane", "-p", "-t", "top"])
    }

    fn format(&self, format: &str) -> String {
        self.ok(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_string()
    }

    /// Waits until the screen satisfies `done`; panics with the screen after the timeout.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The agent's API (`api::server::router`) serving fixed answers on 127.0.0.1; stopped on drop.
struct FakeAgent {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAgent {
    fn serve(listener: TcpListener, doc: Document, findings: Findings) -> FakeAgent {
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let (_flows_tx, flows) = tokio::sync::watch::channel(Arc::new(
                    roce_agent::telemetry::live::LiveDocument::from(doc),
                ));
                let (_findings_tx, findings) = tokio::sync::watch::channel(Arc::new(findings));
                axum::serve(listener, api::server::router(flows, findings, None))
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("serving");
            });
        });
        FakeAgent {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Four flows whose order depends on the sort key:
/// - problems (rates first): 0x10 (CNPs and NAKs now), 0x20 (CE now), 0x30 (no rates,
///   a PSN gap in total), 0x40 (nothing);
/// - CE ratio: 0x20 (50% now), 0x10 (0.05% now), then 0x30 and 0x40 (none).
fn document() -> Document {
    let flow = |src: &str, qp: u32, packets: u64, ce: u64| {
        serde_json::json!({
            "ifname": "va", "direction": "ingress", "family": "ipv4",
            "src": src, "dst": "198.18.0.1", "sport": 49152,
            "vni": null, "inner_family": null, "inner_src": null, "inner_dst": null,
            "dest_qp": qp, "packets": packets, "bytes": packets * 1284,
            "ecn": {"not_ect": 0, "ect1": 0, "ect0": packets - ce, "ce": ce},
            "inner_ecn": null,
            "cnps": 0, "acks": 0, "naks": 0, "rnr_naks": 0, "psn_gaps": 0,
            "last_dscp": 26, "rates": null
        })
    };
    let rates = |ce_per_s: f64, ce_ratio: f64, cnps_per_s: f64, naks_per_s: f64| {
        serde_json::json!({
            "interval_s": 1.0, "packets_per_s": 1000.0, "bits_per_s": 10.3e6,
            "ce_per_s": ce_per_s, "ce_ratio": ce_ratio,
            "cnps_per_s": cnps_per_s, "naks_per_s": naks_per_s
        })
    };
    let mut a = flow("198.18.0.2", 0x10, 1000, 5);
    a["cnps"] = 100.into();
    a["naks"] = 10.into();
    a["rnr_naks"] = 2.into();
    a["rates"] = rates(0.5, 0.0005, 10.0, 1.0);
    let mut b = flow("198.18.0.3", 0x20, 100, 50);
    b["rates"] = rates(5.0, 0.5, 0.0, 0.0);
    let mut c = flow("198.18.0.4", 0x30, 1000, 0);
    c["psn_gaps"] = 1.into();
    let mut d = flow("198.18.0.5", 0x40, 1000, 0);
    d["rates"] = rates(0.0, 0.0, 0.0, 0.0);
    let mut parse_errors = serde_json::Map::new();
    parse_errors.insert("truncated_bth".into(), 7.into());
    let doc = serde_json::json!({
        "flows": [d, c, b, a],
        "counters": {"roce": 3100, "roce_in_vxlan": 0, "vxlan_other": 0, "other_udp": 12,
                     "other_ip": 0, "non_ip": 0, "parse_errors": parse_errors}
    });
    serde_json::from_value(doc).expect("a flow document")
}

fn findings() -> Findings {
    let finding = |severity: &str| {
        serde_json::json!({"check": "mtu", "interface": "va", "severity": severity,
                           "found": "MTU 1500", "expected": "MTU >= 4192",
                           "fix": "ip link set dev va mtu 4192"})
    };
    serde_json::from_value(serde_json::json!({
        "findings": [finding("error"), finding("warning"), finding("error")]
    }))
    .expect("findings")
}

/// The QP of each flow row on the screen, top to bottom.
fn qps_on(screen: &str) -> Vec<String> {
    screen
        .lines()
        .filter(|l| l.contains('→'))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("0x")))
        .map(String::from)
        .collect()
}

/// What the shell's `echo top-exit=$?` printed (the line it was typed on starts with
/// the prompt).
fn exit_status(screen: &str) -> Option<String> {
    screen
        .lines()
        .find_map(|l| l.strip_prefix("top-exit="))
        .map(|s| s.trim().to_string())
}

fn free_port() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("a free port")
}

#[test]
fn top_shows_flows_worst_first_sorts_on_keys_and_restores_the_terminal() {
    require_tmux!();
    let agent = FakeAgent::serve(free_port(), document(), findings());
    let tmux = Tmux::start(200, 30);
    tmux.wait_for("the shell prompt", |s| s.contains('$'));
    tmux.type_line(&format!(
        "{BIN} top --api {} --interval 0.2; echo top-exit=$?",
        agent.addr
    ));

    let screen = tmux.wait_for("the flows", |s| qps_on(s).len() == 4);
    assert_eq!(
        qps_on(&screen),
        ["0x10", "0x20", "0x30", "0x40"],
        "{screen}"
    );
    assert_eq!(tmux.format("#{alternate_on}"), "1", "{screen}");
    let lines: Vec<&str> = screen.lines().collect();
    assert!(
        lines[0].starts_with(&format!("roce-agent top  {}  refreshed ", agent.addr)),
        "{screen}"
    );
    assert_eq!(
        lines[1].trim_end(),
        "frames: roce 3100, roce_in_vxlan 0, parse errors 7; flows 4"
    );
    assert_eq!(
        lines[2].trim_end(),
        "rates: 3.00k pkts/s, 30.9M bits/s, CE 5.5/s, CNPs 10/s, NAKs 1.0/s"
    );
    assert_eq!(lines[3].trim_end(), "audit: 2 errors, 1 warning");
    // 0x30 has no rates: "-" in every rate column, its totals still there.
    let row = lines
        .iter()
        .find(|l| l.contains("0x30"))
        .expect("the row of 0x30");
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "va/in",
            "198.18.0.4→198.18.0.1",
            "-",
            "-",
            "0x30",
            // owner: this fake agent has no QP table
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "1000",
            "0",
            "0",
            "0/0",
            "1",
            "26",
            // RTT p99: no round trips on this flow
            "-"
        ],
        "{screen}"
    );

    tmux.press("c");
    let screen = tmux.wait_for("the CE-ratio order", |s| {
        qps_on(s) == ["0x20", "0x10", "0x30", "0x40"]
    });
    assert!(screen.contains("sort: CE ratio▼"), "{screen}");
    tmux.press("r");
    tmux.wait_for("the reversed order", |s| {
        qps_on(s) == ["0x30", "0x40", "0x10", "0x20"]
    });

    tmux.press("q");
    let screen = tmux.wait_for("top to exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&screen).as_deref(), Some("0"), "{screen}");
    assert_eq!(tmux.format("#{alternate_on}"), "0", "{screen}");
    assert_eq!(
        tmux.format("#{cursor_flag}"),
        "1",
        "cursor hidden: {screen}"
    );
    // The shell is back on the main screen, in cooked mode (a raw terminal would
    // neither echo this line nor end it on Enter).
    assert!(!qps_on(&screen).iter().any(|q| q == "0x10"), "{screen}");
    tmux.type_line("echo raw=$(stty -a | grep -c -- -icanon)");
    tmux.wait_for("the terminal to be in cooked mode", |s| s.contains("raw=0"));
}

/// The footer's line: the last line of the screen that is not blank.
fn footer(screen: &str) -> &str {
    screen
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

#[test]
fn top_filters_flows_on_slash_keeps_the_filter_on_enter_and_clears_it_on_escape() {
    require_tmux!();
    // The agent's document as an older agent wrote it (no `dest_qp_hex`): top reads it.
    let agent = FakeAgent::serve(free_port(), document(), findings());
    let tmux = Tmux::start(200, 30);
    tmux.wait_for("the shell prompt", |s| s.contains('$'));
    tmux.type_line(&format!(
        "{BIN} top --api {} --interval 0.2; echo top-exit=$?",
        agent.addr
    ));
    let screen = tmux.wait_for("the flows", |s| qps_on(s).len() == 4);
    assert!(footer(&screen).contains("/ filter"), "{screen}");

    // `/` opens the prompt; what is typed filters the rows at once.
    tmux.press("/");
    tmux.wait_for("the filter prompt", |s| {
        footer(s).starts_with("filter:") && footer(s).contains("Enter keep  Esc clear")
    });
    tmux.type_text("198.18.0.4");
    let screen = tmux.wait_for("the filtered rows", |s| qps_on(s) == ["0x30"]);
    let lines: Vec<&str> = screen.lines().collect();
    assert_eq!(
        lines[1].trim_end(),
        "frames: roce 3100, roce_in_vxlan 0, parse errors 7; 1 of 4 flows match filter \"198.18.0.4\"",
        "{screen}"
    );
    assert!(
        footer(&screen).starts_with("filter: 198.18.0.4"),
        "{screen}"
    );

    // Enter keeps it: the keys are commands again (`c` sorts, it is not typed).
    tmux.press("Enter");
    tmux.wait_for("the keys back", |s| footer(s).contains("/ filter"));
    tmux.press("c");
    let screen = tmux.wait_for("the CE-ratio order, still filtered", |s| {
        footer(s).contains("sort: CE ratio▼")
    });
    assert_eq!(qps_on(&screen), ["0x30"], "{screen}");
    assert!(
        footer(&screen).contains("filter \"198.18.0.4\"  sort: CE ratio▼  flows 1-1 of 1"),
        "{screen}"
    );

    // In the prompt, `q` is text, not quit; a filter that matches nothing says so.
    tmux.press("/");
    tmux.wait_for("the prompt with the filter in force", |s| {
        footer(s).starts_with("filter: 198.18.0.4")
    });
    tmux.type_text("q");
    let screen = tmux.wait_for("no row left", |s| s.contains("no flow matches the filter"));
    assert!(exit_status(&screen).is_none(), "{screen}");
    assert!(
        screen.contains("0 of 4 flows match filter \"198.18.0.4q\""),
        "{screen}"
    );

    // Esc clears the filter: every flow is back, in the CE-ratio order.
    tmux.press("Escape");
    // The footer too: a capture may catch a frame half drawn.
    let screen = tmux.wait_for("every flow again", |s| {
        qps_on(s) == ["0x20", "0x10", "0x30", "0x40"] && footer(s).contains("/ filter")
    });
    let lines: Vec<&str> = screen.lines().collect();
    assert!(lines[1].trim_end().ends_with("; flows 4"), "{screen}");
    assert!(footer(&screen).contains("/ filter"), "{screen}");

    tmux.press("q");
    let screen = tmux.wait_for("top to exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&screen).as_deref(), Some("0"), "{screen}");
    assert_eq!(tmux.format("#{alternate_on}"), "0", "{screen}");
}

#[test]
fn top_says_when_the_agent_is_down_keeps_trying_and_quits_on_ctrl_c() {
    require_tmux!();
    // A port with nothing behind it (yet): bind, note it, let go.
    let port = free_port();
    let addr = port.local_addr().expect("local address");
    drop(port);
    let tmux = Tmux::start(160, 24);
    tmux.wait_for("the shell prompt", |s| s.contains('$'));
    tmux.type_line(&format!(
        "{BIN} top --api {addr} --interval 0.2; echo top-exit=$?"
    ));
    let screen = tmux.wait_for("the agent-down header", |s| {
        s.contains(&format!("agent not answering at {addr}: "))
    });
    assert!(screen.contains("retrying every 0.2s"), "{screen}");
    assert!(screen.contains("no answer from the agent yet"), "{screen}");

    // The agent comes up on that port: the view picks it up on its own.
    let listener = TcpListener::bind(addr).expect("the port again");
    let agent = FakeAgent::serve(listener, document(), findings());
    let screen = tmux.wait_for("the flows", |s| qps_on(s).len() == 4);
    assert!(!screen.contains("not answering"), "{screen}");

    // It goes away again: the last answer stays, the header says so.
    drop(agent);
    let screen = tmux.wait_for("the agent-down header again", |s| {
        s.contains(&format!("agent not answering at {addr}: "))
    });
    assert!(screen.contains("(showing its answer of "), "{screen}");
    assert_eq!(qps_on(&screen).len(), 4, "{screen}");

    tmux.press("C-c");
    let screen = tmux.wait_for("top to exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&screen).as_deref(), Some("0"), "{screen}");
    assert_eq!(tmux.format("#{alternate_on}"), "0", "{screen}");
}

/// A process of ours, killed on drop if it is still there (a test that failed must
/// not leave a view running).
struct KillOnDrop(libc::pid_t);

impl KillOnDrop {
    /// Alive: it exists and is not a zombie waiting for its reaper.
    fn alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .ok()
            .and_then(|stat| {
                // The state follows the command name in parentheses.
                let after = stat.rsplit_once(')')?.1;
                after.split_whitespace().next().map(|state| state != "Z")
            })
            .unwrap_or(false)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.alive() {
            // SAFETY: signalling a process this test started, by its pid.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

#[test]
fn top_exits_when_its_terminal_goes_away() {
    require_tmux!();
    let agent = FakeAgent::serve(free_port(), document(), findings());
    let tmux = Tmux::start_command(
        160,
        24,
        &format!("exec {BIN} top --api {} --interval 0.2", agent.addr),
    );
    tmux.wait_for("the flows", |s| qps_on(s).len() == 4);
    let pid: libc::pid_t = tmux.format("#{pane_pid}").parse().expect("the pane's pid");
    let top = KillOnDrop(pid);
    assert!(top.alive());
    // The window goes away with the server: top's terminal hangs up.
    drop(tmux);
    let deadline = Instant::now() + Duration::from_secs(5);
    while top.alive() {
        assert!(
            Instant::now() < deadline,
            "top (pid {pid}) still runs 5 s after its terminal hung up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn top_quits_on_escape() {
    require_tmux!();
    let agent = FakeAgent::serve(free_port(), Document::default(), Findings::default());
    let tmux = Tmux::start(120, 20);
    tmux.wait_for("the shell prompt", |s| s.contains('$'));
    tmux.type_line(&format!(
        "{BIN} top --api {} --interval 0.2; echo top-exit=$?",
        agent.addr
    ));
    let screen = tmux.wait_for("an empty table", |s| s.contains("no RoCE flows seen"));
    assert!(screen.contains("audit: 0 errors, 0 warnings"), "{screen}");
    tmux.press("Escape");
    let screen = tmux.wait_for("top to exit", |s| exit_status(s).is_some());
    assert_eq!(exit_status(&screen).as_deref(), Some("0"), "{screen}");
    assert_eq!(tmux.format("#{alternate_on}"), "0", "{screen}");
}

#[test]
fn top_without_a_terminal_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["top", "--api", "127.0.0.1:9"])
        .output()
        .expect("run roce-agent top");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("stdout is not one"), "{err}");
    assert!(err.contains("roce-agent flows"), "{err}");
}

#[test]
fn top_help_shows_the_keys_and_examples() {
    let out = Command::new(BIN)
        .args(["top", "--help"])
        .output()
        .expect("run roce-agent top --help");
    assert!(out.status.success());
    let help = text(&out.stdout);
    for needle in [
        "--api",
        "--interval",
        "127.0.0.1:9473",
        "roce-agent top --api",
        "sort by CE ratio",
        "sort by CNPs/s",
        "sort by bits/s",
        "sort by problems",
        "reverse",
        "PgUp/PgDn",
        "Home/End",
        "q, Esc, Ctrl-C",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
    let out = Command::new(BIN)
        .args(["top", "--interval", "0"])
        .output()
        .expect("run roce-agent top");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
