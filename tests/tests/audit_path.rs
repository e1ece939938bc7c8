//! The `mtu_path` probe against real kernels' forwarding: four namespaces the test
//! creates, host A — router R1 — router R2 — host B, with A's and B's interfaces at
//! MTU 9000 and the link between the routers at 1500 (both ends): only a probe of
//! the path finds that. Variations of it: all links at 9000 (carried), A's own
//! interface at 1500 (local), R1's end towards A at 1500 (a silent L2-style drop),
//! blackhole / unreachable / prohibit routes on R1 (silence, ICMP unreachable, a
//! filter), and the narrow link raised to 9000 while A still caches path MTU 1500.
//! Every namespace (and with it every link) is deleted when the test ends, also when
//! it fails. Needs root.
//!
//! ```text
//!  A a0 ══9000══ r1a R1 r1b ──1500── r2a R2 r2b ══9000══ b0 B
//!    198.18.1.1     .1.254  198.18.2.1  198.18.2.2  .3.254  198.18.3.2
//!    2001:db8:1::1  1::fe   2::1        2::2        3::fe   2001:db8:3::2
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use roce_agent::audit::path::{audit, probe, PathError, Probe};
use roce_agent::audit::Severity;
use roce_testkit::netns::{unique_name, Netns};

const R1_TO_A4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);
const B4: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 2);
const R1_TO_A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xfe);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 3, 0, 0, 0, 0, 2);

/// Long enough for an answer under load; a black hole costs all of it.
const TIMEOUT: Duration = Duration::from_millis(2500);

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the path MTU tests need root (network namespaces)"
    );
}

fn new_ns() -> Netns {
    let (name, _) = unique_name("roce-pm-");
    Netns::create(name).unwrap_or_else(|e| panic!("creating a namespace: {e:#}"))
}

/// A veth pair from `x` (end `x_end`) to `y` (end `y_end`), both ends at `mtu`, up,
/// with the addresses given. IPv6 without DAD, usable at once; link-local addresses
/// set by hand (fe80::1, fe80::2): a router resolves the next hop of a packet it
/// forwards from its link-local address, and sends no solicitation without one.
fn link(x: &Netns, x_end: &str, y: &Netns, y_end: &str, mtu: u32, addrs: [(&str, &str); 2]) {
    let mtu = mtu.to_string();
    x.ip_ok(&[
        "link",
        "add",
        x_end,
        "mtu",
        &mtu,
        "type",
        "veth",
        "peer",
        "name",
        y_end,
        "mtu",
        &mtu,
        "netns",
        y.name(),
    ]);
    let ends = [
        (x, x_end, addrs[0], "fe80::1/64"),
        (y, y_end, addrs[1], "fe80::2/64"),
    ];
    for (ns, end, (v4, v6), link_local) in ends {
        ns.ip_ok(&["addr", "add", v4, "dev", end]);
        for v6 in [v6, link_local] {
            ns.ip_ok(&["-6", "addr", "add", v6, "dev", end, "nodad"]);
        }
        ns.ip_ok(&["link", "set", end, "addrgenmode", "none", "up"]);
    }
}

fn forward(router: &Netns) {
    router
        .exec(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
            ],
        )
        .unwrap_or_else(|e| panic!("enabling forwarding: {e:#}"));
}

/// A — R1 — R2 — B, the routers' link at `middle_mtu`. Fields drop (and delete their
/// namespaces) in order.
struct Path {
    a: Netns,
    r1: Netns,
    r2: Netns,
    b: Netns,
}

impl Path {
    fn new(middle_mtu: u32) -> Path {
        let (a, r1, r2, b) = (new_ns(), new_ns(), new_ns(), new_ns());
        link(
            &a,
            "a0",
            &r1,
            "r1a",
            9000,
            [
                ("198.18.1.1/24", "2001:db8:1::1/64"),
                ("198.18.1.254/24", "2001:db8:1::fe/64"),
            ],
        );
        link(
            &r1,
            "r1b",
            &r2,
            "r2a",
            middle_mtu,
            [
                ("198.18.2.1/24", "2001:db8:2::1/64"),
                ("198.18.2.2/24", "2001:db8:2::2/64"),
            ],
        );
        link(
            &r2,
            "r2b",
            &b,
            "b0",
            9000,
            [
                ("198.18.3.254/24", "2001:db8:3::fe/64"),
                ("198.18.3.2/24", "2001:db8:3::2/64"),
            ],
        );
        forward(&r1);
        forward(&r2);
        a.ip_ok(&["route", "add", "198.18.0.0/15", "via", "198.18.1.254"]);
        a.ip_ok(&[
            "-6",
            "route",
            "add",
            "2001:db8::/32",
            "via",
            "2001:db8:1::fe",
        ]);
        r1.ip_ok(&["route", "add", "198.18.3.0/24", "via", "198.18.2.2"]);
        r1.ip_ok(&[
            "-6",
            "route",
            "add",
            "2001:db8:3::/64",
            "via",
            "2001:db8:2::2",
        ]);
        r2.ip_ok(&["route", "add", "198.18.1.0/24", "via", "198.18.2.1"]);
        r2.ip_ok(&[
            "-6",
            "route",
            "add",
            "2001:db8:1::/64",
            "via",
            "2001:db8:2::1",
        ]);
        b.ip_ok(&["route", "add", "198.18.0.0/15", "via", "198.18.3.254"]);
        b.ip_ok(&[
            "-6",
            "route",
            "add",
            "2001:db8::/32",
            "via",
            "2001:db8:3::fe",
        ]);
        Path { a, r1, r2, b }
    }

    /// `probe(peer, size)` run inside A.
    fn probe_from_a(&self, peer: impl Into<IpAddr>, size: u32) -> Result<Probe, PathError> {
        let peer = peer.into();
        self.a
            .enter(|| probe(peer, size, TIMEOUT))
            .unwrap_or_else(|e| panic!("entering A: {e:#}"))
    }

    fn set_middle_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        self.r1.ip_ok(&["link", "set", "r1b", "mtu", &mtu]);
        self.r2.ip_ok(&["link", "set", "r2a", "mtu", &mtu]);
    }
}

#[test]
fn a_narrow_router_between_jumbo_hosts_is_found_over_ipv4_and_ipv6() {
    require_root();
    let path = Path::new(1500);
    for (peer, hop) in [
        (IpAddr::from(B4), R1_TO_A4.into()),
        (B6.into(), R1_TO_A6.into()),
    ] {
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::TooBig {
                path_mtu: Some(1500),
                reported_by: Some(hop),
            }),
            "probe of 9000 bytes to {peer}: {result:?}"
        );
        let f = audit(peer, 9000, Some("a0"), &result).expect("a finding");
        assert_eq!(f.check, "mtu_path");
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(
            f.found,
            format!("path MTU 1500 towards {peer} (ICMP from {hop})")
        );
        assert_eq!(f.expected, "path MTU >= 9000");
        assert!(f.fix.contains(&format!("router at {hop}")), "{}", f.fix);

        // What the narrow link carries arrives.
        let result = path.probe_from_a(peer, 1500);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::Carried),
            "1500 to {peer}: {result:?}"
        );
        assert_eq!(audit(peer, 1500, Some("a0"), &result), None);
    }
}

#[test]
fn a_fixed_router_is_seen_at_once_despite_the_cached_path_mtu() {
    require_root();
    let path = Path::new(1500);
    for peer in [IpAddr::from(B4), B6.into()] {
        assert!(matches!(
            path.probe_from_a(peer, 9000),
            Ok(Probe::TooBig {
                path_mtu: Some(1500),
                ..
            })
        ));
    }
    // A's kernel now holds path MTU 1500 for B (for 10 minutes): a DO socket would
    // refuse to send 9000 bytes; the probe must not.
    let cached = path.a.ip_ok(&["route", "get", &B4.to_string()]);
    assert!(cached.contains("mtu 1500"), "A's route to B: {cached}");
    path.set_middle_mtu(9000);
    for peer in [IpAddr::from(B4), B6.into()] {
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::Carried),
            "{peer}: {result:?}"
        );
    }
}

#[test]
fn jumbo_all_the_way_is_carried() {
    require_root();
    let path = Path::new(9000);
    for peer in [IpAddr::from(B4), B6.into()] {
        let started = Instant::now();
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::Carried),
            "{peer}: {result:?}"
        );
        // Answered, not timed out.
        assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
    }
}

#[test]
fn this_hosts_own_smaller_mtu_is_reported_as_local() {
    require_root();
    let path = Path::new(9000);
    path.a.ip_ok(&["link", "set", "a0", "mtu", "1500"]);
    for peer in [IpAddr::from(B4), B6.into()] {
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::LocalMtuTooSmall { mtu: 1500 }),
            "{peer}: {result:?}"
        );
        let f = audit(peer, 9000, Some("a0"), &result).expect("a finding");
        assert_eq!(f.fix, "raise the MTU of a0 to 9000 or more");
    }
}

#[test]
fn a_hop_that_drops_large_packets_silently_is_a_black_hole() {
    require_root();
    // An L2 hop with a smaller MTU sends no ICMP: a veth end at 1500 drops what is
    // larger on receipt, as a switch port does.
    let path = Path::new(9000);
    path.r1.ip_ok(&["link", "set", "r1a", "mtu", "1500"]);
    for (peer, small) in [(IpAddr::from(B4), 576), (B6.into(), 1280)] {
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::DroppedSilently {
                answered_size: small,
                tries: 4
            }),
            "{peer}: {result:?}"
        );
        let f = audit(peer, 9000, None, &result).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
    }
}

#[test]
fn silence_unreachable_and_filtered_peers_are_told_apart() {
    require_root();
    let path = Path::new(9000);
    // Behind R1: a blackhole (silent), an unreachable and a prohibited route.
    for (kind, v4, v6) in [
        ("blackhole", "198.18.9.0/24", "2001:db8:9::/64"),
        ("unreachable", "198.18.10.0/24", "2001:db8:a::/64"),
        ("prohibit", "198.18.11.0/24", "2001:db8:b::/64"),
    ] {
        path.r1.ip_ok(&["route", "add", kind, v4]);
        path.r1.ip_ok(&["-6", "route", "add", kind, v6]);
    }
    let host = |v4: [u8; 4], v6: u16| -> [IpAddr; 2] {
        [
            Ipv4Addr::from(v4).into(),
            Ipv6Addr::new(0x2001, 0xdb8, v6, 0, 0, 0, 0, 2).into(),
        ]
    };
    for peer in host([198, 18, 9, 2], 9) {
        let result = path.probe_from_a(peer, 9000);
        assert_eq!(
            result.as_ref().ok(),
            Some(&Probe::NoAnswer { tries: 3 }),
            "{peer}: {result:?}"
        );
        let f = audit(peer, 9000, None, &result).expect("a finding");
        assert_eq!(f.severity, Severity::Warning);
    }
    for (peer, hop) in host([198, 18, 10, 2], 10)
        .into_iter()
        .zip([IpAddr::from(R1_TO_A4), R1_TO_A6.into()])
    {
        let result = path.probe_from_a(peer, 9000);
        let Ok(Probe::Unreachable(icmp)) = result else {
            panic!("{peer}: {result:?}");
        };
        assert_eq!(icmp.reported_by, Some(hop));
        assert!(!icmp.is_administrative(), "{icmp}");
        let f = audit(peer, 9000, None, &result).expect("a finding");
        assert_eq!(f.severity, Severity::Error);
        assert!(f.found.contains(&format!("from {hop}")), "{}", f.found);
    }
    for peer in host([198, 18, 11, 2], 11) {
        let result = path.probe_from_a(peer, 9000);
        let Ok(Probe::Unreachable(icmp)) = result else {
            panic!("{peer}: {result:?}");
        };
        assert!(icmp.is_administrative(), "{icmp}");
        let f = audit(peer, 9000, None, &result).expect("a finding");
        assert_eq!(f.severity, Severity::Warning);
    }
}

/// `roce-agent check --json ARGS` run inside A: the mtu_path findings and the exit code.
fn check_from_a(path: &Path, args: &[&str]) -> (Vec<roce_agent::audit::Finding>, Option<i32>) {
    let bin = roce_testkit::lab::bins::agent_bins_for_test()
        .unwrap_or_else(|e| panic!("building roce-agent: {e:#}"))
        .join("roce-agent");
    let mut all = vec!["check", "--json"];
    all.extend_from_slice(args);
    let out = path
        .a
        .command(&bin)
        .args(&all)
        .env_remove("RUST_LOG")
        .output()
        .expect("run roce-agent check");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let findings: Vec<roce_agent::audit::Finding> = serde_json::from_value(doc["findings"].clone())
        .expect("findings as check --json prints them");
    let path_findings = findings
        .into_iter()
        .filter(|f| f.check == "mtu_path")
        .collect();
    (path_findings, out.status.code())
}

#[test]
fn check_with_peers_reports_the_narrow_router_and_nothing_when_jumbo_all_the_way() {
    require_root();
    let path = Path::new(1500);
    let args = [
        "--iface",
        "a0",
        "--mtu",
        "9000",
        "--peer",
        "198.18.3.2",
        "--peer",
        "2001:db8:3::2",
    ];
    let (f, code) = check_from_a(&path, &args);
    assert_eq!(code, Some(1), "{f:?}");
    assert_eq!(f.len(), 2, "{f:?}");
    for (finding, hop) in f.iter().zip(["198.18.1.254", "2001:db8:1::fe"]) {
        assert_eq!(finding.severity, Severity::Error);
        assert_eq!(finding.interface.as_deref(), Some("a0"));
        assert!(
            finding.found.starts_with("path MTU 1500 towards"),
            "{finding:?}"
        );
        assert!(finding.found.contains(hop), "{finding:?}");
        assert_eq!(finding.expected, "path MTU >= 9000");
    }
    path.set_middle_mtu(9000);
    let (f, code) = check_from_a(&path, &args);
    assert_eq!(code, Some(0), "{f:?}");
    assert!(f.is_empty(), "{f:?}");
}

/// Kills the agent if a test left it running.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn run_probes_the_remote_ends_of_its_flows_when_asked() {
    require_root();
    let path = Path::new(1500);
    let bin = roce_testkit::lab::bins::agent_bins_for_test()
        .unwrap_or_else(|e| panic!("building roce-agent: {e:#}"))
        .join("roce-agent");
    let api = "127.0.0.1:9476";
    let _agent = Running(
        path.a
            .command(&bin)
            .args([
                "run",
                "--iface",
                "a0",
                "--listen",
                api,
                "--interval",
                "0.2",
                "--mtu",
                "9000",
                "--probe-flow-peers",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start roce-agent run"),
    );
    let get_findings = || -> Option<Vec<roce_agent::audit::Finding>> {
        let body = path
            .a
            .enter(|| roce_agent::api::client::get_body(api, "/findings", Duration::from_secs(2)))
            .ok()?
            .ok()?;
        let doc: roce_agent::doc::finding::Findings = serde_json::from_slice(&body).ok()?;
        Some(doc.findings)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while get_findings().is_none() {
        assert!(Instant::now() < deadline, "the agent does not answer");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A RoCE packet from B makes a flow whose remote end is B.
    path.b
        .enter(|| {
            let sock = std::net::UdpSocket::bind("198.18.3.2:0").expect("bind in B");
            let mut bth = [0u8; 16];
            bth[0] = 0x04; // RC SEND_ONLY
            bth[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
            bth[7] = 0x11; // destination QP 0x11
            for _ in 0..3 {
                sock.send_to(&bth, "198.18.1.1:4791").expect("send");
            }
        })
        .expect("enter B");
    let found = loop {
        let f = get_findings().unwrap_or_default();
        if let Some(p) = f.into_iter().find(|f| f.check == "mtu_path") {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no mtu_path finding for the flow's peer"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(found.severity, Severity::Error);
    assert!(
        found.found.starts_with("path MTU 1500 towards 198.18.3.2"),
        "{found:?}"
    );
}
