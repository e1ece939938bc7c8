//! `roce-agent check` on real devices: veth and VXLAN devices in network namespaces
//! that each test creates (and deletes, also when it fails), read through rtnetlink by
//! the agent and checked against `ip link`, an independent reader. Needs root for the
//! namespaces; without it the tests are skipped with a note.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_in, check_json_in, fixture, new_ns, text, veth, BIN};
use roce_agent::audit::Finding;
use roce_testkit::netns::Netns;

/// The prefix of the namespaces the tests make: `roce-t-<pid>x<n>`.
const NS: &str = "roce-t-";

/// What `check --json` prints, as far as these tests read it.
#[derive(serde::Deserialize)]
struct CheckJson {
    findings: Vec<Finding>,
}

/// `check --json ARGS` in `ns`: its findings and exit code.
fn findings_in(ns: &Netns, args: &[&str]) -> (Vec<Finding>, i32) {
    let (doc, code) = check_json_in(ns, args);
    let doc: CheckJson =
        serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc}"));
    (doc.findings, code)
}

/// The findings of one check at error level.
fn errors<'a>(findings: &'a [Finding], check: &str) -> Vec<&'a Finding> {
    findings
        .iter()
        .filter(|f| f.check == check && f.severity == roce_agent::audit::Severity::Error)
        .collect()
}

#[test]
fn veth_below_the_required_mtu_is_an_error_and_fix_sets_it() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");

    let (f, code) = findings_in(&ns, &["--iface", "va", "--mtu", "9000"]);
    assert_eq!(code, 1, "{f:?}");
    let mtu = errors(&f, "mtu");
    assert_eq!(mtu.len(), 1, "{f:?}");
    assert_eq!(mtu[0].interface.as_deref(), Some("va"));
    assert_eq!(mtu[0].found, "MTU 1500 (RoCE path MTU 1024)");
    assert_eq!(mtu[0].expected, "MTU >= 9000 (RoCE path MTU 4096)");
    assert_eq!(mtu[0].fix, "ip link set dev va mtu 9000");
    // Without --fix nothing on the host changed.
    assert_eq!(ns.link_mtu("va"), 1500);

    let out = agent_in(&ns, &["check", "--iface", "va", "--mtu", "9000", "--fix"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("changed: mtu va: mtu 1500 -> 9000"),
        "{stdout}"
    );
    assert_eq!(ns.link_mtu("va"), 9000);
    // Only the interface asked about.
    assert_eq!(ns.link_mtu("vb"), 1500);

    let (f, code) = findings_in(&ns, &["--iface", "va", "--mtu", "9000"]);
    assert_eq!(code, 0, "{f:?}");
    assert!(errors(&f, "mtu").is_empty());
}

#[test]
fn default_required_mtu_carries_a_4096_roce_path_mtu() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "4191");
    let (f, code) = findings_in(&ns, &["--iface", "va"]);
    assert_eq!(code, 1);
    assert_eq!(errors(&f, "mtu")[0].found, "MTU 4191 (RoCE path MTU 2048)");
    assert_eq!(
        errors(&f, "mtu")[0].expected,
        "MTU >= 4192 (RoCE path MTU 4096)"
    );
    ns.ip_ok(&["link", "set", "va", "mtu", "4192"]);
    let (f, code) = findings_in(&ns, &["--iface", "va"]);
    assert_eq!(code, 0, "{f:?}");
    let info: Vec<_> = f.iter().filter(|f| f.check == "mtu").collect();
    assert_eq!(info[0].found, "MTU 4192 (RoCE path MTU 4096)");
}

#[test]
fn the_interfaces_named_are_audited_and_no_other() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "9000");
    // A pair not named: not audited (without --iface, see check_fix.rs).
    ns.ip_ok(&[
        "link", "add", "down0", "type", "veth", "peer", "name", "down1",
    ]);
    let (f, code) = findings_in(&ns, &["--iface", "va", "--iface", "vb", "--mtu", "9000"]);
    assert_eq!(code, 0, "{f:?}");
    let mut names: Vec<&str> = f
        .iter()
        .filter(|f| f.check == "mtu")
        .filter_map(|f| f.interface.as_deref())
        .collect();
    names.sort();
    assert_eq!(names, ["va", "vb"]);
    // veth has no DCB: the kernel answers EOPNOTSUPP, which is information, not an error.
    for dev in ["va", "vb"] {
        let d: Vec<_> = f
            .iter()
            .filter(|f| f.check == "dcb_unsupported" && f.interface.as_deref() == Some(dev))
            .collect();
        assert_eq!(d.len(), 1, "{f:?}");
        assert_eq!(d[0].severity, roce_agent::audit::Severity::Info);
    }
}

/// An underlay `ul` (198.18.0.1/24, 2001:db8::1/64) at `underlay_mtu` in `ns`.
fn underlay(ns: &Netns, underlay_mtu: &str) {
    ns.ip_ok(&[
        "link",
        "add",
        "ul",
        "mtu",
        underlay_mtu,
        "type",
        "veth",
        "peer",
        "name",
        "ulp",
    ]);
    ns.ip_ok(&["link", "set", "ul", "up"]);
    ns.ip_ok(&["link", "set", "ulp", "up"]);
    ns.ip_ok(&["addr", "add", "198.18.0.1/24", "dev", "ul"]);
    ns.ip_ok(&["addr", "add", "2001:db8::1/64", "dev", "ul", "nodad"]);
}

#[test]
fn vxlan_headroom_over_ipv4_and_ipv6_underlays() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    underlay(&ns, "9000");
    // Made on their underlay: the kernel gives them 8950 and 8930.
    ns.ip_ok(&[
        "link",
        "add",
        "vx4",
        "type",
        "vxlan",
        "id",
        "5001",
        "dstport",
        "4789",
        "remote",
        "198.18.0.2",
        "local",
        "198.18.0.1",
        "dev",
        "ul",
    ]);
    ns.ip_ok(&[
        "link",
        "add",
        "vx6",
        "type",
        "vxlan",
        "id",
        "5002",
        "dstport",
        "4789",
        "remote",
        "2001:db8::2",
        "local",
        "2001:db8::1",
        "dev",
        "ul",
    ]);
    assert_eq!(ns.link_mtu("vx4"), 8950);
    assert_eq!(ns.link_mtu("vx6"), 8930);
    let (f, code) = findings_in(&ns, &["--iface", "vx4", "--iface", "vx6", "--mtu", "8900"]);
    assert_eq!(code, 0, "{f:?}");
    assert!(errors(&f, "vxlan_overhead").is_empty());

    // The trap: the underlay lowered after the devices were made; they keep their MTU.
    ns.ip_ok(&["link", "set", "ul", "mtu", "1500"]);
    assert_eq!(ns.link_mtu("vx4"), 8950);
    let (f, code) = findings_in(&ns, &["--iface", "vx4", "--iface", "vx6", "--mtu", "8900"]);
    assert_eq!(code, 1);
    let v = errors(&f, "vxlan_overhead");
    assert_eq!(v.len(), 2, "{f:?}");
    let v4 = v
        .iter()
        .find(|f| f.interface.as_deref() == Some("vx4"))
        .unwrap();
    assert_eq!(v4.found, "vx4 MTU 8950 over ul MTU 1500 (its dev): -7450 bytes of headroom, inner frames above 1450 are dropped");
    assert_eq!(
        v4.expected,
        "ul MTU >= 9000 (vx4 MTU 8950 + 50 for VXLAN over IPv4)"
    );
    let v6 = v
        .iter()
        .find(|f| f.interface.as_deref() == Some("vx6"))
        .unwrap();
    assert_eq!(v6.found, "vx6 MTU 8930 over ul MTU 1500 (its dev): -7430 bytes of headroom, inner frames above 1430 are dropped");
    assert_eq!(
        v6.expected,
        "ul MTU >= 9000 (vx6 MTU 8930 + 70 for VXLAN over IPv6)"
    );
    // Auditing the underlay alone finds the VXLAN devices that run over it.
    let (f, _) = findings_in(&ns, &["--iface", "ul", "--mtu", "1500"]);
    assert_eq!(errors(&f, "vxlan_overhead").len(), 2, "{f:?}");
}

#[test]
fn vxlan_without_dev_is_checked_against_the_route_to_its_remote() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    underlay(&ns, "1500");
    // No `dev`: the kernel starts it at 1500 and takes 9000 unchecked.
    ns.ip_ok(&[
        "link",
        "add",
        "vx4",
        "type",
        "vxlan",
        "id",
        "5001",
        "dstport",
        "4789",
        "remote",
        "198.18.0.2",
    ]);
    ns.ip_ok(&[
        "link",
        "add",
        "vx6",
        "type",
        "vxlan",
        "id",
        "5002",
        "dstport",
        "4789",
        "remote",
        "2001:db8::2",
    ]);
    ns.ip_ok(&["link", "set", "vx4", "mtu", "9000"]);
    ns.ip_ok(&["link", "set", "vx6", "mtu", "1450"]);
    let (f, code) = findings_in(&ns, &["--iface", "vx4", "--iface", "vx6", "--mtu", "1400"]);
    assert_eq!(code, 1, "{f:?}");
    let v = errors(&f, "vxlan_overhead");
    assert_eq!(v.len(), 2, "{f:?}");
    let v4 = v
        .iter()
        .find(|f| f.interface.as_deref() == Some("vx4"))
        .unwrap();
    assert_eq!(v4.found, "vx4 MTU 9000 over ul MTU 1500 (the route to its remote): -7500 bytes of headroom, inner frames above 1450 are dropped");
    let v6 = v
        .iter()
        .find(|f| f.interface.as_deref() == Some("vx6"))
        .unwrap();
    assert_eq!(v6.found, "vx6 MTU 1450 over ul MTU 1500 (the route to its remote): 50 bytes of headroom, inner frames above 1430 are dropped");
    assert_eq!(
        v6.expected,
        "ul MTU >= 1520 (vx6 MTU 1450 + 70 for VXLAN over IPv6)"
    );

    // --fix raises the underlay only when it is audited too.
    let out = agent_in(&ns, &["check", "--iface", "vx4", "--mtu", "1400", "--fix"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(
            "NOT changed: vxlan_overhead vx4: MTU of underlay ul not changed: ul is not audited"
        ),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(ns.link_mtu("ul"), 1500);
    let out = agent_in(
        &ns,
        &[
            "check", "--iface", "vx4", "--iface", "vx6", "--iface", "ul", "--mtu", "1400", "--fix",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(ns.link_mtu("ul"), 9050);
}

#[test]
fn a_missing_interface_exits_2_naming_it() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    let out = agent_in(&ns, &["check", "--iface", "nosuch0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        "roce-agent: error: no such interface: nosuch0"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_namespace_with_only_loopback_has_nothing_to_audit() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    let out = agent_in(&ns, &["check"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no interface to audit"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn without_privilege_the_audit_reads_and_fix_names_the_capability_it_needs() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    // As nobody, with no capability: reading needs none.
    let out = ns
        .cmd(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                BIN,
                "check",
                "--iface",
                "va",
                "--mtu",
                "9000",
                "--fix",
            ],
        )
        .env_remove("RUST_LOG")
        .output()
        .expect("run setpriv");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("NOT changed: mtu va: mtu 1500 -> 9000 not changed: permission denied: changing an MTU needs CAP_NET_ADMIN"),
        "{stdout}"
    );
    assert!(stdout.contains("MTU 1500 (RoCE path MTU 1024)"), "{stdout}");
    assert_eq!(ns.link_mtu("va"), 1500);
}

#[test]
fn rnic_knobs_from_a_sysfs_fixture_one_finding_each_with_its_fix() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    // The fixture's RoCE netdev is eth1: a veth of that name stands for it.
    ns.ip_ok(&[
        "link", "add", "eth1", "type", "veth", "peer", "name", "eth0",
    ]);
    ns.ip_ok(&["link", "set", "eth1", "up"]);
    let bad = fixture("mlx5-bad");
    let out = agent_in(
        &ns,
        &[
            "check",
            "--json",
            "--iface",
            "eth1",
            "--mtu",
            "1500",
            "--sysfs-root",
            &bad,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let doc: CheckJson = serde_json::from_slice(&out.stdout).expect("JSON");
    let got: Vec<(&str, &str, &str, &str)> = doc
        .findings
        .iter()
        .filter(|f| f.severity == roce_agent::audit::Severity::Error)
        .map(|f| {
            (
                f.check.as_str(),
                f.found.as_str(),
                f.expected.as_str(),
                f.fix.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("cnp_dscp", "CNP DSCP 46", "48", "echo 48 > /sys/class/net/eth1/ecn/roce_np/cnp_dscp"),
            ("ecn_np", "ECN notification point off on priority 3", "on for priority 3", "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3"),
            (
                "roce_tos",
                "default_roce_tos 0 (DSCP 0, Not-ECT): rdma_cm's default, /sys/kernel/config/rdma_cm/mlx5_0 does not exist (a ToS set before the group was removed still applies: make it to read the ToS in use)",
                "106 (DSCP 26, ECT(0))",
                "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && echo 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos"
            ),
        ]
    );
    // The PFC storm watchdog left at the firmware's 8 s: a warning, not an error.
    let watchdog: Vec<&Finding> = doc
        .findings
        .iter()
        .filter(|f| f.check == "pfc_watchdog")
        .collect();
    assert_eq!(watchdog.len(), 1, "{watchdog:?}");
    assert_eq!(watchdog[0].severity, roce_agent::audit::Severity::Warning);
    assert_eq!(watchdog[0].interface.as_deref(), Some("eth1"));
    assert_eq!(
        watchdog[0].fix,
        "ethtool --set-tunable eth1 pfc-prevention-tout 100"
    );
    let (f, code) = {
        let out = agent_in(
            &ns,
            &[
                "check",
                "--json",
                "--iface",
                "eth1",
                "--mtu",
                "1500",
                "--sysfs-root",
                &fixture("mlx5-good"),
            ],
        );
        let doc: CheckJson = serde_json::from_slice(&out.stdout).expect("JSON");
        (doc.findings, out.status.code())
    };
    assert_eq!(code, Some(0), "{f:?}");
    assert!(
        f.iter()
            .all(|f| f.severity == roce_agent::audit::Severity::Info),
        "{f:?}"
    );
    assert!(
        f.iter()
            .any(|f| f.check == "pfc_watchdog" && f.found == "pfc-prevention-tout 100 ms"),
        "{f:?}"
    );
}

#[test]
fn bad_input_exits_2_with_a_message_naming_it() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    let wrong_type =
        roce_testkit::temp::TempFile::new("type.toml", "interfaces = [\"va\"]\nmtu = \"big\"\n");
    let bad_peer = roce_testkit::temp::TempFile::new(
        "peer.toml",
        "peers = [\"198.18.0.2\", \"not-an-address\"]\n",
    );
    let bad_mtu = roce_testkit::temp::TempFile::new("mtu.toml", "mtu = 40\n");
    let bad_pmtu = roce_testkit::temp::TempFile::new("pmtu.toml", "default_pmtu = 4000\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--iface", "nosuch0"], "no such interface: nosuch0"),
        (
            vec!["--iface", "va", "--iface", "nosuch1", "--iface", "nosuch2"],
            "no such interface: nosuch1, nosuch2",
        ),
        (vec!["--mtu", "0"], "--mtu: 0 is out of range (68 to 65535)"),
        (
            vec!["--mtu", "70000"],
            "--mtu: 70000 is out of range (68 to 65535)",
        ),
        (vec!["--mtu", "x"], "invalid value 'x' for '--mtu <BYTES>'"),
        (
            vec!["--peer", "not-an-address"],
            "invalid value 'not-an-address' for '--peer <ADDR>'",
        ),
        (
            vec!["--probe-timeout", "0"],
            "--probe-timeout: 0 is out of range (0.01 to 60 seconds)",
        ),
        (
            vec!["--sysfs-root", "/nonexistent-sysfs"],
            "--sysfs-root /nonexistent-sysfs: not a directory",
        ),
        (
            vec!["--config", "/nonexistent/host.toml"],
            "/nonexistent/host.toml",
        ),
        (
            vec!["--config", wrong_type.arg()],
            ":2:7: mtu: invalid type: string \"big\", expected u32",
        ),
        (
            vec!["--config", bad_peer.arg()],
            "peers: \"not-an-address\" is not an IPv4 or IPv6 address",
        ),
        (
            vec!["--config", bad_mtu.arg()],
            ":1:7: mtu: 40 is out of range (68 to 65535)",
        ),
        (
            vec!["--config", bad_pmtu.arg()],
            "4000 is not an InfiniBand MTU",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec!["check"];
        all.extend_from_slice(&args);
        let out = agent_in(&ns, &all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{args:?}: expected {message:?} in {stderr:?}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: printed {}",
            text(&out.stdout)
        );
    }
    // Nothing was changed by any of them.
    assert_eq!(ns.link_mtu("va"), 1500);
}

#[test]
fn a_sysfs_knob_with_garbage_is_a_finding_naming_the_file() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    ns.ip_ok(&[
        "link", "add", "eth1", "type", "veth", "peer", "name", "eth0",
    ]);
    ns.ip_ok(&["link", "set", "eth1", "up"]);
    // A minimal tree: the ECN knobs of eth1, the CNP DSCP garbage.
    let dir = roce_testkit::temp::TempDir::new("sysfs");
    let root = dir.path().to_path_buf();
    let ecn = root.join("class/net/eth1/ecn");
    for side in ["roce_np", "roce_rp"] {
        std::fs::create_dir_all(ecn.join(side).join("enable")).unwrap();
        for p in 0..8 {
            std::fs::write(ecn.join(side).join("enable").join(p.to_string()), "1\n").unwrap();
        }
    }
    std::fs::write(ecn.join("roce_np/cnp_dscp"), "forty-eight\n").unwrap();
    let root_text = root.to_str().unwrap();
    let out = agent_in(
        &ns,
        &[
            "check",
            "--json",
            "--iface",
            "eth1",
            "--mtu",
            "1500",
            "--sysfs-root",
            root_text,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: CheckJson = serde_json::from_slice(&out.stdout).expect("JSON");
    let e = errors(&doc.findings, "cnp_dscp");
    assert_eq!(e.len(), 1, "{:?}", doc.findings);
    assert_eq!(
        e[0].found,
        format!("unreadable: {root_text}/class/net/eth1/ecn/roce_np/cnp_dscp: 'forty-eight' is not a number")
    );
}
