//! The RNIC audit on the sysfs fixture trees of `tests/fixtures/sysfs/` (see its
//! README), and on scratch copies of them made wrong in one way each.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use roce_agent::audit::rnic::{
    fix, gid, plan_fix, read_ecn_knobs, read_rnic_ports, roce_netdevs, GidEntry, GidType,
    RnicError, RnicPort, RoceMode, RoceTos,
};
use roce_agent::audit::{finding, Change, Finding, Severity};
use roce_common::policy::Policy;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs")
        .join(name)
}

/// The RNIC audit with no netdev address known (the GID part has nothing to look up).
fn audit(root: &Path, interfaces: &[String], policy: &Policy) -> Vec<Finding> {
    roce_agent::audit::rnic::audit(root, interfaces, policy, &BTreeMap::new())
}

fn eth1() -> Vec<String> {
    vec!["eth1".to_string()]
}

static SCRATCH_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A copy of a fixture tree in a scratch directory of this test process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn copy_of(name: &str) -> Scratch {
        let n = SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("roce-rnic-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        roce_testkit::temp::copy_tree(&fixture(name), &dir).expect("copying the fixture");
        Scratch(dir)
    }
    fn root(&self) -> &Path {
        &self.0
    }
    /// A file of the tree, by its path under /sys.
    fn file(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
    fn write(&self, rel: &str, content: &str) {
        fs::write(self.file(rel), content).expect("write scratch file");
    }
    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.file(rel)).expect("read scratch file")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const NP3: &str = "class/net/eth1/ecn/roce_np/enable/3";
const RP3: &str = "class/net/eth1/ecn/roce_rp/enable/3";
const CNP_DSCP: &str = "class/net/eth1/ecn/roce_np/cnp_dscp";
const ROCE_TOS: &str = "kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos";
const TOS_FIX: &str = "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && \
                       echo 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos";

fn errors(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect()
}

fn checks(findings: &[Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.check.as_str()).collect()
}

#[test]
fn fixtures_read_as_one_mlx5_port_with_eth1() {
    let ports = read_rnic_ports(&fixture("mlx5-good")).expect("read good fixture");
    assert_eq!(
        ports,
        [RnicPort {
            device: "mlx5_0".to_string(),
            port: 1,
            link_layer: Some("Ethernet".to_string()),
            // Four GID entries name eth1; the empty slots name nothing.
            netdevs: eth1(),
            gids: vec![
                gid_entry(0, "fe80::ba59:9fff:fe1a:2b3c", GidType::RoceV1, "eth1"),
                gid_entry(1, "fe80::ba59:9fff:fe1a:2b3c", GidType::RoceV2, "eth1"),
                gid_entry(2, "::ffff:198.18.0.1", GidType::RoceV1, "eth1"),
                gid_entry(3, "::ffff:198.18.0.1", GidType::RoceV2, "eth1"),
            ],
            default_roce_tos: Ok(RoceTos::Set(106)),
            default_roce_mode: Ok(RoceMode::Set(GidType::RoceV2)),
        }]
    );
    let bad = read_rnic_ports(&fixture("mlx5-bad")).expect("read bad fixture");
    assert_eq!(bad[0].default_roce_tos, Ok(RoceTos::Unset));
    assert_eq!(bad[0].default_roce_mode, Ok(RoceMode::Unset));
    for tree in ["mlx5-good", "mlx5-bad"] {
        assert_eq!(roce_netdevs(&fixture(tree)), Ok(eth1()));
    }
    let knobs = read_ecn_knobs(&fixture("mlx5-good"), "eth1")
        .expect("eth1 is a name")
        .expect("eth1 has ECN knobs");
    assert!(knobs.np_enable.iter().all(|e| *e == Ok(true)));
    assert_eq!((knobs.cnp_dscp, knobs.cnp_802p_prio), (Ok(48), Ok(6)));
}

#[test]
fn a_root_without_rdma_has_no_ports_and_no_roce_netdevs() {
    let empty = std::env::temp_dir().join(format!("roce-rnic-none-{}", std::process::id()));
    assert_eq!(read_rnic_ports(&empty), Ok(vec![]));
    assert_eq!(roce_netdevs(&empty), Ok(vec![]));
}

#[test]
fn the_good_fixture_gives_no_findings() {
    assert_eq!(
        audit(&fixture("mlx5-good"), &eth1(), &Policy::default()),
        []
    );
}

#[test]
fn the_bad_fixture_gives_one_finding_per_wrong_knob_with_its_fix() {
    let findings = audit(&fixture("mlx5-bad"), &eth1(), &Policy::default());
    assert_eq!(
        findings,
        [
            finding(
                "ecn_np",
                Some("eth1"),
                Severity::Error,
                "ECN notification point off on priority 3",
                "on for priority 3",
                "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3",
            ),
            finding(
                "cnp_dscp",
                Some("eth1"),
                Severity::Error,
                "CNP DSCP 46",
                "48",
                "echo 48 > /sys/class/net/eth1/ecn/roce_np/cnp_dscp",
            ),
            finding(
                "roce_tos",
                Some("eth1"),
                Severity::Error,
                "default_roce_tos 0 (DSCP 0, Not-ECT): rdma_cm's default, \
                 /sys/kernel/config/rdma_cm/mlx5_0 does not exist (a ToS set before the \
                 group was removed still applies: make it to read the ToS in use)",
                "106 (DSCP 26, ECT(0))",
                TOS_FIX,
            ),
        ]
    );
}

#[test]
fn a_netdev_without_ecn_knobs_gets_an_info_and_no_roce_tos_finding() {
    let eth0 = vec!["eth0".to_string()];
    let findings = audit(&fixture("mlx5-bad"), &eth0, &Policy::default());
    assert_eq!(checks(&findings), ["ecn_np"]);
    assert_eq!(findings[0].severity, Severity::Info);
    assert_eq!(
        findings[0].found,
        "no ECN knobs: /sys/class/net/eth0/ecn does not exist"
    );
    // A name that is not in the tree at all reads the same way.
    let missing = audit(
        &fixture("mlx5-good"),
        &["eth9".to_string()],
        &Policy::default(),
    );
    assert!(errors(&missing).is_empty());
}

#[test]
fn a_name_that_leaves_class_net_is_an_error_not_a_path() {
    let findings = audit(
        &fixture("mlx5-good"),
        &["../..".to_string()],
        &Policy::default(),
    );
    assert_eq!(
        findings
            .iter()
            .map(|f| (f.severity, f.found.as_str()))
            .collect::<Vec<_>>(),
        [(Severity::Error, "'../..' is not a network interface name")]
    );
    assert_eq!(
        fix(
            &fixture("mlx5-good"),
            &["../..".to_string()],
            &Policy::default()
        ),
        [Err(RnicError::NotAnInterfaceName("../..".to_string()))]
    );
}

#[test]
fn a_repeated_interface_is_audited_once() {
    let twice = vec!["eth1".to_string(), "eth1".to_string()];
    assert_eq!(
        audit(&fixture("mlx5-bad"), &twice, &Policy::default()).len(),
        3
    );
}

#[test]
fn garbage_in_a_knob_is_an_error_finding_naming_the_file() {
    let cases: [(&str, &str, &str, &str); 6] = [
        (NP3, "abc\n", "ecn_np", "'abc' is not a number"),
        (NP3, "", "ecn_np", "'' is not a number"),
        (RP3, "2\n", "ecn_rp", "2 is not an enable flag (0 or 1)"),
        (CNP_DSCP, "300\n", "cnp_dscp", "300 is not a DSCP (0-63)"),
        (
            CNP_DSCP,
            "forty-eight",
            "cnp_dscp",
            "'forty-eight' is not a number",
        ),
        (ROCE_TOS, "0x6a\n", "roce_tos", "'0x6a' is not a number"),
    ];
    for (rel, content, check, problem) in cases {
        let tree = Scratch::copy_of("mlx5-good");
        tree.write(rel, content);
        let findings = audit(tree.root(), &eth1(), &Policy::default());
        let want = format!("unreadable: {}: {problem}", tree.file(rel).display());
        assert_eq!(
            findings
                .iter()
                .map(|f| (f.check.as_str(), f.severity, f.found.as_str()))
                .collect::<Vec<_>>(),
            [(check, Severity::Error, want.as_str())],
            "{rel} holding {content:?}"
        );
        // The fix still names the host's file.
        assert!(findings[0].fix.contains(" > /sys/"), "{}", findings[0].fix);
    }
}

#[test]
fn garbage_where_the_policy_does_not_look_is_no_finding() {
    let tree = Scratch::copy_of("mlx5-good");
    tree.write("class/net/eth1/ecn/roce_np/enable/5", "abc\n");
    tree.write("class/net/eth1/ecn/roce_np/cnp_802p_prio", "\u{0}\u{0}");
    tree.write(
        "class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/5",
        "not a/netdev\n",
    );
    assert_eq!(audit(tree.root(), &eth1(), &Policy::default()), []);
}

#[test]
fn missing_knob_files_are_errors_naming_them() {
    let tree = Scratch::copy_of("mlx5-good");
    fs::remove_file(tree.file(CNP_DSCP)).expect("remove cnp_dscp");
    fs::remove_file(tree.file(ROCE_TOS)).expect("remove default_roce_tos");
    let findings = audit(tree.root(), &eth1(), &Policy::default());
    assert_eq!(checks(&findings), ["cnp_dscp", "roce_tos"]);
    for (f, rel) in findings.iter().zip([CNP_DSCP, ROCE_TOS]) {
        assert_eq!(
            f.found,
            format!(
                "unreadable: {}: No such file or directory (os error 2)",
                tree.file(rel).display()
            )
        );
    }
}

#[test]
fn an_explicit_tos_of_zero_reads_as_set_not_as_the_default() {
    let tree = Scratch::copy_of("mlx5-good");
    tree.write(ROCE_TOS, "0\n");
    let findings = audit(tree.root(), &eth1(), &Policy::default());
    assert_eq!(
        findings,
        [finding(
            "roce_tos",
            Some("eth1"),
            Severity::Error,
            "default_roce_tos 0 (DSCP 0, Not-ECT)",
            "106 (DSCP 26, ECT(0))",
            TOS_FIX,
        )]
    );
}

#[test]
fn policy_variants_change_what_is_expected() {
    let good = fixture("mlx5-good");
    let bad = fixture("mlx5-bad");
    // Lossless DSCP 24 is priority 3 too: the same ECN finding on the bad tree.
    let mut dscp24 = Policy::default();
    dscp24.set_lossless(&[24]);
    assert_eq!(
        checks(&audit(&bad, &eth1(), &dscp24)),
        ["ecn_np", "cnp_dscp", "roce_tos"]
    );
    assert_eq!(audit(&good, &eth1(), &dscp24), []);
    // RoCE on DSCP 24: the good tree's ToS 106 is now wrong.
    dscp24.qos.roce_dscp = 24;
    let findings = audit(&good, &eth1(), &dscp24);
    assert_eq!(
        findings
            .iter()
            .map(|f| (f.check.as_str(), f.found.as_str(), f.expected.as_str()))
            .collect::<Vec<_>>(),
        [(
            "roce_tos",
            "default_roce_tos 106 (DSCP 26, ECT(0))",
            "98 (DSCP 24, ECT(0))"
        )]
    );
    // DSCP 26 on priority 4: the bad tree's priority 3 no longer matters.
    let mut prio4 = Policy::default();
    prio4.table[26].priority = 4;
    assert_eq!(
        checks(&audit(&bad, &eth1(), &prio4)),
        ["cnp_dscp", "roce_tos"]
    );
    // CNPs on 46: the bad tree's CNP DSCP is right, the good tree's is wrong.
    let mut cnp46 = Policy::default();
    cnp46.qos.cnp_dscp = 46;
    assert_eq!(
        checks(&audit(&bad, &eth1(), &cnp46)),
        ["ecn_np", "roce_tos"]
    );
    let good_cnp = audit(&good, &eth1(), &cnp46);
    assert_eq!(
        good_cnp
            .iter()
            .map(|f| f.found.as_str())
            .collect::<Vec<_>>(),
        ["CNP DSCP 48"]
    );
    // A second lossless DSCP on priority 5, with its ECN off: both sides are flagged.
    let tree = Scratch::copy_of("mlx5-good");
    tree.write("class/net/eth1/ecn/roce_np/enable/5", "0\n");
    tree.write("class/net/eth1/ecn/roce_rp/enable/5", "0\n");
    let mut two = Policy::default();
    two.set_lossless(&[26, 40]);
    let findings = audit(tree.root(), &eth1(), &two);
    assert_eq!(
        findings
            .iter()
            .map(|f| (f.check.as_str(), f.found.as_str()))
            .collect::<Vec<_>>(),
        [
            ("ecn_np", "ECN notification point off on priority 5"),
            ("ecn_rp", "ECN reaction point off on priority 5"),
        ]
    );
}

#[test]
fn fix_writes_the_bad_knobs_and_a_second_audit_finds_nothing() {
    let tree = Scratch::copy_of("mlx5-bad");
    let changes = fix(tree.root(), &eth1(), &Policy::default());
    let change = |check: &str, what: &str, before: &str, after: &str| {
        Ok(Change {
            check: check.to_string(),
            interface: "eth1".to_string(),
            what: what.to_string(),
            before: before.to_string(),
            after: after.to_string(),
        })
    };
    assert_eq!(
        changes,
        [
            change(
                "ecn_np",
                "/sys/class/net/eth1/ecn/roce_np/enable/3",
                "0",
                "1"
            ),
            change(
                "cnp_dscp",
                "/sys/class/net/eth1/ecn/roce_np/cnp_dscp",
                "46",
                "48"
            ),
            change(
                "roce_tos",
                "/sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos",
                "0 (unset)",
                "106"
            ),
        ]
    );
    assert_eq!(
        (tree.read(NP3), tree.read(CNP_DSCP), tree.read(ROCE_TOS)),
        ("1\n".to_string(), "48\n".to_string(), "106\n".to_string())
    );
    assert_eq!(audit(tree.root(), &eth1(), &Policy::default()), []);
    // Nothing left to do.
    assert_eq!(fix(tree.root(), &eth1(), &Policy::default()), []);
}

#[test]
fn fix_touches_only_the_interfaces_it_is_given() {
    let tree = Scratch::copy_of("mlx5-bad");
    assert_eq!(
        fix(tree.root(), &["eth0".to_string()], &Policy::default()),
        []
    );
    assert_eq!(fix(tree.root(), &[], &Policy::default()), []);
    assert_eq!(
        errors(&audit(tree.root(), &eth1(), &Policy::default())).len(),
        3
    );
    assert!(!tree.file("kernel/config/rdma_cm/mlx5_0").exists());
}

#[test]
fn fix_rewrites_garbage_and_a_shorter_value_leaves_no_tail() {
    let tree = Scratch::copy_of("mlx5-good");
    tree.write(NP3, "abc\n");
    tree.write(ROCE_TOS, "0000000000\n");
    let changes = fix(tree.root(), &eth1(), &Policy::default());
    let befores: Vec<_> = changes
        .iter()
        .map(|c| c.as_ref().map(|c| c.before.as_str()))
        .collect();
    assert_eq!(befores, [Ok("unreadable ('abc' is not a number)"), Ok("0")]);
    assert_eq!(tree.read(ROCE_TOS), "106\n");
    assert_eq!(audit(tree.root(), &eth1(), &Policy::default()), []);
}

#[test]
fn a_knob_that_cannot_be_written_is_reported_and_the_others_are_still_fixed() {
    let tree = Scratch::copy_of("mlx5-bad");
    // A directory where the knob should be: opening it for writing fails (root or not).
    fs::remove_file(tree.file(NP3)).expect("remove enable/3");
    fs::create_dir(tree.file(NP3)).expect("make enable/3 a directory");
    let results = fix(tree.root(), &eth1(), &Policy::default());
    assert_eq!(results.len(), 3);
    match &results[0] {
        Err(RnicError::NotWritten { path, reason }) => {
            assert_eq!(path, &tree.file(NP3));
            assert!(reason.contains("directory"), "{reason}");
        }
        other => panic!("enable/3 should not be written: {other:?}"),
    }
    let written: Vec<_> = results[1..]
        .iter()
        .map(|r| r.as_ref().map(|c| c.check.as_str()))
        .collect();
    assert_eq!(written, [Ok("cnp_dscp"), Ok("roce_tos")]);
    assert_eq!(
        checks(&audit(tree.root(), &eth1(), &Policy::default())),
        ["ecn_np"]
    );
}

#[test]
fn a_missing_knob_is_not_created() {
    let tree = Scratch::copy_of("mlx5-bad");
    let plan = plan_fix(tree.root(), &eth1(), &Policy::default());
    let np3 = plan[0].as_ref().expect("enable/3 planned").clone();
    fs::remove_file(&np3.path).expect("remove enable/3");
    match np3.apply() {
        Err(RnicError::NotWritten { path, reason }) => {
            assert_eq!(path, tree.file(NP3));
            assert!(reason.contains("No such file"), "{reason}");
        }
        other => panic!("a missing knob should not be written: {other:?}"),
    }
    assert!(!tree.file(NP3).exists());
}

#[test]
fn the_dry_run_commands_are_the_findings_fixes_and_write_nothing() {
    let root = fixture("mlx5-bad");
    let commands: Vec<String> = plan_fix(&root, &eth1(), &Policy::default())
        .into_iter()
        .map(|w| w.expect("planned").command())
        .collect();
    assert_eq!(
        commands,
        [
            "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3",
            "echo 48 > /sys/class/net/eth1/ecn/roce_np/cnp_dscp",
            "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && echo 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos",
        ]
    );
    let fixes: Vec<String> = audit(&root, &eth1(), &Policy::default())
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.fix)
        .collect();
    for c in &commands {
        assert!(fixes.contains(c), "{c} not in {fixes:?}");
    }
    // Planning read the tree and wrote nothing.
    assert!(!root.join("kernel/config/rdma_cm/mlx5_0").exists());
}

fn gid_entry(index: u32, gid: &str, gid_type: GidType, netdev: &str) -> GidEntry {
    GidEntry {
        index,
        gid: gid.parse().expect("a GID"),
        gid_type,
        netdev: netdev.to_string(),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

/// The lab's addresses: 198.18.0.1 on veth0 (rxe0), 198.18.0.2 on veth1 (rxe1).
fn lab_addresses() -> BTreeMap<String, Vec<IpAddr>> {
    [
        ("veth0".to_string(), vec![ip("198.18.0.1")]),
        ("veth1".to_string(), vec![ip("198.18.0.2")]),
    ]
    .into()
}

/// The `roce_gid` findings on the tree at `root`.
fn gid_audit(
    root: &Path,
    interfaces: &[String],
    addresses: &BTreeMap<String, Vec<IpAddr>>,
) -> Vec<Finding> {
    let ports = read_rnic_ports(root).expect("read the tree's RDMA ports");
    let names: Vec<&str> = interfaces.iter().map(String::as_str).collect();
    gid::audit(&ports, &names, addresses)
}

fn veths() -> Vec<String> {
    vec!["veth0".to_string(), "veth1".to_string()]
}

const RXE1_TYPE1: &str = "devices/virtual/infiniband/rxe1/ports/1/gid_attrs/types/1";
const RXE1_MODE: &str = "kernel/config/rdma_cm/rxe1/ports/1/default_roce_mode";

#[test]
fn the_rxe_fixture_reads_as_two_roce_v2_ports_behind_veth0_and_veth1() {
    let ports = read_rnic_ports(&fixture("rxe")).expect("read rxe fixture");
    let got: Vec<(&str, &[String], usize)> = ports
        .iter()
        .map(|p| (p.device.as_str(), p.netdevs.as_slice(), p.gids.len()))
        .collect();
    assert_eq!(
        got,
        [
            ("rxe0", &["veth0".to_string()][..], 2),
            ("rxe1", &["veth1".to_string()][..], 2)
        ]
    );
    // rxe (6.1) offers RoCE v2 only: the MAC's link-local GID, then the IPv4 one.
    assert_eq!(
        ports[1].gids,
        [
            gid_entry(0, "fe80::ec77:2fff:feb2:aa9c", GidType::RoceV2, "veth1"),
            gid_entry(1, "::ffff:198.18.0.2", GidType::RoceV2, "veth1"),
        ]
    );
    assert_eq!(
        ports[1].default_roce_mode,
        Ok(RoceMode::Set(GidType::RoceV2))
    );
    assert_eq!(ports[1].default_roce_tos, Ok(RoceTos::Set(106)));
    assert_eq!(roce_netdevs(&fixture("rxe")), Ok(veths()));
}

#[test]
fn roce_gid_finds_nothing_where_every_address_has_a_roce_v2_gid() {
    assert!(gid_audit(&fixture("rxe"), &veths(), &lab_addresses()).is_empty());
    // mlx5 offers both versions: 198.18.0.1 has its v2 GID at index 3.
    let eth1_addr = [("eth1".to_string(), vec![ip("198.18.0.1")])].into();
    assert!(gid_audit(&fixture("mlx5-good"), &eth1(), &eth1_addr).is_empty());
    // Link-local IPv6 addresses are not looked up.
    let link_local = [("veth0".to_string(), vec![ip("fe80::1")])].into();
    assert!(gid_audit(&fixture("rxe"), &veths(), &link_local).is_empty());
}

#[test]
fn an_address_whose_gid_is_roce_v1_only_is_a_roce_gid_warning() {
    let tree = Scratch::copy_of("rxe");
    tree.write(RXE1_TYPE1, "IB/RoCE v1\n");
    let findings = gid_audit(tree.root(), &veths(), &lab_addresses());
    assert_eq!(
        findings,
        [finding(
            "roce_gid",
            Some("veth1"),
            Severity::Warning,
            "198.18.0.2 has no RoCE v2 GID in rxe1 port 1 (only IB/RoCE v1 at index 1): RoCE v1 \
             is neither routed nor UDP 4791, so the agent and the fabric's DSCP QoS never see its traffic",
            "a RoCE v2 GID for 198.18.0.2",
            "enable RoCE v2 in the driver or firmware of rxe1 (a device that offers only RoCE v1 \
             cannot carry routable RoCE); the GID types are in \
             /sys/class/infiniband/rxe1/ports/1/gid_attrs/types",
        )]
    );
}

#[test]
fn an_address_missing_from_the_gid_table_and_a_netdev_not_audited() {
    let mut addresses = lab_addresses();
    addresses.insert(
        "veth0".to_string(),
        vec![ip("198.18.0.9"), ip("198.18.0.1")],
    );
    let findings = gid_audit(&fixture("rxe"), &veths(), &addresses);
    assert_eq!(
        findings
            .iter()
            .map(|f| f.found.as_str())
            .collect::<Vec<_>>(),
        ["no GID for 198.18.0.9 in the GID table of rxe0 port 1: RoCE cannot use this address"]
    );
    // veth0 not audited: its addresses are not looked at.
    let only_veth1 = vec!["veth1".to_string()];
    assert!(gid_audit(&fixture("rxe"), &only_veth1, &addresses).is_empty());
}

#[test]
fn rdma_cm_in_roce_v1_mode_or_another_is_a_roce_gid_warning() {
    let tree = Scratch::copy_of("rxe");
    tree.write(RXE1_MODE, "IB/RoCE v1\n");
    let findings = gid_audit(tree.root(), &veths(), &lab_addresses());
    assert_eq!(
        findings
            .iter()
            .map(|f| (f.interface.as_deref(), f.fix.as_str()))
            .collect::<Vec<_>>(),
        [(
            Some("veth1"),
            "echo \"RoCE v2\" > /sys/kernel/config/rdma_cm/rxe1/ports/1/default_roce_mode   \
             # MLNX_OFED's cma_roce_mode -d rxe1 -p 1 -m 2 does the same"
        )]
    );
    // A mode that does not read is a warning naming the file; a group without the file
    // (a fixture's) says nothing.
    tree.write(RXE1_MODE, "");
    let findings = gid_audit(tree.root(), &veths(), &lab_addresses());
    assert_eq!(
        findings
            .iter()
            .map(|f| f.found.as_str())
            .collect::<Vec<_>>(),
        ["rdma_cm's default RoCE mode on rxe1 port 1 reads '', not RoCE v2"]
    );
    fs::remove_file(tree.file(RXE1_MODE)).expect("remove default_roce_mode");
    assert!(gid_audit(tree.root(), &veths(), &lab_addresses()).is_empty());
    // Without the group, rdma_cm prefers v2: nothing to say.
    fs::remove_dir_all(tree.file("kernel/config/rdma_cm/rxe1")).expect("remove group");
    assert!(gid_audit(tree.root(), &veths(), &lab_addresses()).is_empty());
}
