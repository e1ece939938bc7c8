//! The pause verdicts of a running agent (`pause_storm`, `slow_receiver`): veth has no
//! PFC, so the agent reads a copy of the mlx5 fixture tree (`--sysfs-root`), whose
//! port's `ethtool-S` stands for the NIC's statistics, and the test moves its pause
//! counters on as a NIC's would move: first short of each verdict (the near misses),
//! then past it. Needs root (namespaces, XDP).

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Agent, Pair};
use roce_agent::doc::finding::Finding;
use roce_testkit::netns::Netns;
use roce_testkit::temp::{copy_tree, TempDir};

const NS: &str = "roce-vd-";
const API: &str = "127.0.0.1:9478";
/// The fixture port's `ethtool-S`, from the tree's root.
const STATS: &str = "class/net/eth1/ethtool-S";

/// `GET /findings` of the agent at `api`, the findings named `check`.
fn findings_at(ns: &Netns, api: &str, check: &str) -> Vec<Finding> {
    let body = ns
        .enter(|| roce_agent::api::client::get_body(api, "/findings", Duration::from_secs(5)))
        .expect("enter the namespace")
        .expect("GET /findings");
    let doc: roce_agent::doc::finding::Findings =
        serde_json::from_slice(&body).expect("findings JSON");
    doc.findings
        .into_iter()
        .filter(|f| f.check == check)
        .collect()
}

fn findings(ns: &Netns, check: &str) -> Vec<Finding> {
    findings_at(ns, API, check)
}

/// Reads again every 100 ms until `done` holds of what `read` returns, `limit` at
/// most: what it read last (the caller's assertions judge it).
fn read_until<T>(limit: Duration, mut read: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let start = Instant::now();
    loop {
        let got = read();
        if done(&got) || start.elapsed() > limit {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A copy of fixture tree `name` under `dir` (the agent's `--sysfs-root`), and the
/// agent running on `pair`'s `va` with it, answering at `api` once ready.
fn agent_on_fixture(
    dir: &TempDir,
    name: &str,
    pair: &Pair,
    api: &str,
) -> (std::path::PathBuf, Agent) {
    agent_on_fixture_with(dir, name, pair, api, &[])
}

/// [`agent_on_fixture`] with `extra` arguments.
fn agent_on_fixture_with(
    dir: &TempDir,
    name: &str,
    pair: &Pair,
    api: &str,
    extra: &[&str],
) -> (std::path::PathBuf, Agent) {
    let root = dir.path().join("sys");
    copy_tree(Path::new(&common::fixture(name)), &root).expect("copying the fixture");
    let mut args = vec!["--sysfs-root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut agent = Agent::run_on_va(&pair.a, api, &args);
    agent.wait_ready(&pair.a, api);
    (root, agent)
}

/// Writes the port's priority-3 pause counters (the others zero), whole: the agent
/// never reads half a file.
fn write_pauses(root: &Path, rx_paused_us: u64, tx_frames: u64) {
    let mut text = String::from("NIC statistics:\n");
    for p in 0..8 {
        let (us, tx) = if p == 3 {
            (rx_paused_us, tx_frames)
        } else {
            (0, 0)
        };
        text.push_str(&format!(
            "     rx_prio{p}_pause: {}\n     rx_prio{p}_pause_duration: {us}\n     tx_prio{p}_pause: {tx}\n     tx_prio{p}_pause_duration: 0\n",
            us / 100
        ));
    }
    let path = root.join(STATS);
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).expect("writing the statistics");
    std::fs::rename(&tmp, &path).expect("replacing the statistics");
}

/// The port's counters moving on as a NIC's would, every 50 ms in a thread of their
/// own, until stopped: a verdict judged round by round (a storm) stands only while
/// they move.
struct MovingNic {
    stop: Arc<AtomicBool>,
    writer: std::thread::JoinHandle<(u64, u64)>,
}

impl MovingNic {
    /// Paused `paused` of the time and `frames_per_s` pause frames sent, from
    /// `(us, frames)`.
    fn start(root: &Path, paused: f64, frames_per_s: f64, from: (u64, u64)) -> MovingNic {
        let stop = Arc::new(AtomicBool::new(false));
        let root = root.to_path_buf();
        let stopped = stop.clone();
        let writer = std::thread::spawn(move || {
            let start = Instant::now();
            let mut at = from;
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let t = start.elapsed().as_secs_f64();
                at = (
                    from.0 + (t * paused * 1e6) as u64,
                    from.1 + (t * frames_per_s) as u64,
                );
                write_pauses(&root, at.0, at.1);
            }
            at
        });
        MovingNic { stop, writer }
    }

    /// Stops the counters; where they ended.
    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.writer.join().expect("the counter writer")
    }
}

#[test]
fn a_port_paused_round_after_round_is_a_storm_and_one_pausing_thousands_a_second_a_slow_receiver() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = TempDir::new("roce-verdicts");
    let pair = Pair::new(NS);
    let (root, mut agent) = agent_on_fixture(&dir, "mlx5-good", &pair, API);
    write_pauses(&root, 0, 0);
    // Near misses: paused 30% of the time, 600 pause frames a second sent, for 2 s
    // (10 rounds), and no verdict at any moment.
    let nic = MovingNic::start(&root, 0.3, 600.0, (0, 0));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert!(findings(&pair.a, "pause_storm").is_empty(), "30% paused");
        assert!(
            findings(&pair.a, "slow_receiver").is_empty(),
            "600 frames/s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let at = nic.stop();
    // Paused 90% of the time, 5,000 pause frames a second: both verdicts, on eth1,
    // while the counters move (a storm needs 3 rounds running).
    let nic = MovingNic::start(&root, 0.9, 5000.0, at);
    let (storm, slow) = read_until(
        Duration::from_secs(10),
        || {
            (
                findings(&pair.a, "pause_storm"),
                findings(&pair.a, "slow_receiver"),
            )
        },
        |(storm, slow)| !storm.is_empty() && !slow.is_empty(),
    );
    nic.stop();
    assert_eq!(storm.len(), 1, "{storm:?}\n{}", agent.log());
    assert_eq!(storm[0].interface.as_deref(), Some("eth1"));
    assert!(
        storm[0].found.starts_with("priority 3 of eth1 paused "),
        "{}",
        storm[0].found
    );
    assert_eq!(slow.len(), 1, "{slow:?}");
    assert!(slow[0].found.starts_with("eth1 sent "), "{}", slow[0].found);
    assert!(
        slow[0]
            .found
            .contains(" pause frames on priority 3 in the last "),
        "{}",
        slow[0].found
    );
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}

/// The fixture port's notification-point counters, from the tree's root.
const NP: &str = "class/infiniband/mlx5_0/ports/1/hw_counters";

/// Writes one counter file whole, as the kernel shows it.
fn write_counter(root: &Path, name: &str, value: u64) {
    let path = root.join(NP).join(name);
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, format!("{value}\n")).expect("writing the counter");
    std::fs::rename(&tmp, &path).expect("replacing the counter");
}

#[test]
fn an_offloading_rnic_that_counts_marks_and_sends_no_cnp_leaves_them_unanswered() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = TempDir::new("roce-verdicts-np");
    let pair = Pair::new("roce-vn-");
    let api = "127.0.0.1:9479";
    // mlx5-bad's port: 18,240 marks received, no CNP sent (its notification point off).
    let (root, mut agent) = agent_on_fixture(&dir, "mlx5-bad", &pair, api);
    let findings = |ns: &Netns| findings_at(ns, api, "ce_unanswered");
    // Standing counters say nothing of now; 9 new marks are too few.
    std::thread::sleep(Duration::from_millis(600));
    write_counter(&root, "np_ecn_marked_roce_packets", 18_249);
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        findings(&pair.a).is_empty(),
        "9 marks: {:?}",
        findings(&pair.a)
    );
    // 240 more marks and still no CNP: unanswered, on the port's netdev.
    write_counter(&root, "np_ecn_marked_roce_packets", 18_489);
    let found = read_until(
        Duration::from_secs(5),
        || findings(&pair.a),
        |f| !f.is_empty(),
    );
    assert_eq!(found.len(), 1, "{found:?}\n{}", agent.log());
    assert_eq!(found[0].interface.as_deref(), Some("eth1"));
    assert!(
        found[0]
            .found
            .starts_with("mlx5_0 port 1 (eth1) received 2")
            && found[0]
                .found
                .contains(" CE-marked RoCE packets in the last ")
            && found[0]
                .found
                .ends_with(" and sent no CNP (np_ecn_marked_roce_packets, np_cnp_sent)"),
        "{}",
        found[0].found
    );
    // One CNP sent in the window: the notification point answers.
    write_counter(&root, "np_cnp_sent", 1);
    let left = read_until(Duration::from_secs(5), || findings(&pair.a), Vec::is_empty);
    assert!(left.is_empty(), "a CNP sent: {left:?}");
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}

#[test]
fn a_reload_keeps_the_verdicts_window_and_applies_its_thresholds() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = TempDir::new("roce-verdicts-reload");
    let config = dir.path().join("agent.toml");
    let write = |min_ce: u32| {
        std::fs::write(&config, format!("[verdicts]\nmin_ce = {min_ce}\n")).expect("the config")
    };
    write(10);
    let pair = Pair::new("roce-vr-");
    let api = "127.0.0.1:9480";
    let (root, mut agent) = agent_on_fixture_with(
        &dir,
        "mlx5-bad",
        &pair,
        api,
        &["--config", config.to_str().unwrap()],
    );
    let findings = |ns: &Netns| findings_at(ns, api, "ce_unanswered");
    // 249 marks counted after the first reading, no CNP: unanswered.
    std::thread::sleep(Duration::from_millis(600));
    write_counter(&root, "np_ecn_marked_roce_packets", 18_489);
    let found = read_until(
        Duration::from_secs(5),
        || findings(&pair.a),
        |f| !f.is_empty(),
    );
    assert!(!found.is_empty(), "{}", agent.log());
    // A reload whose threshold the marks still pass: the window keeps them, so the
    // verdict stands round after round (a new window would start empty).
    write(100);
    agent.signal(libc::SIGHUP);
    agent.wait_for_log("configuration reloaded");
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let found = findings(&pair.a);
        assert_eq!(
            found.len(),
            1,
            "after the reload: {found:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A threshold above them: the same window, judged by the new one, says nothing.
    write(1000);
    agent.signal(libc::SIGHUP);
    let left = read_until(Duration::from_secs(5), || findings(&pair.a), Vec::is_empty);
    assert!(left.is_empty(), "min_ce 1000: {left:?}\n{}", agent.log());
    assert_eq!(agent.terminate().code(), Some(0), "{}", agent.log());
}
