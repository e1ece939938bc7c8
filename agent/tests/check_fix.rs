//! `roce-agent check` chooses what it audits and never fixes an interface nobody
//! named: `--fix` without `--iface` (or the config's interfaces) is refused before
//! anything changes, `--dry-run` prints the commands and changes nothing, `--fix
//! --iface IF` changes IF alone, and without `--iface` only the interfaces that carry
//! RoCE (RDMA devices' netdevs, VXLAN devices and their underlays) are audited.
//!
//! Real devices in network namespaces that each test creates (and deletes, also when it
//! fails); MTUs read back with `ip link`, an independent reader. Needs root for the
//! namespaces; without it the tests are skipped with a note.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agent_in, check_json_in, fixture, new_ns, text, veth};
use roce_testkit::netns::Netns;
use roce_testkit::temp::TempDir;
use serde_json::{json, Value};

/// The prefix of the namespaces the tests make: `roce-cf-<pid>x<n>`.
const NS: &str = "roce-cf-";

/// An underlay veth `ul` (198.18.0.1/24; its peer `ulp`) at `mtu`, and a VXLAN device
/// `vx0` made on it towards 198.18.0.2, up.
fn vxlan_over_veth(ns: &Netns, mtu: &str) {
    veth(ns, "ul", "ulp", mtu);
    ns.ip_ok(&["addr", "add", "198.18.0.1/24", "dev", "ul"]);
    ns.ip_ok(&[
        "link",
        "add",
        "vx0",
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
    ns.ip_ok(&["link", "set", "vx0", "up"]);
}

/// The interface names of the findings (those without one left out).
fn finding_interfaces(doc: &Value) -> Vec<String> {
    let mut names: Vec<String> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["interface"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn fix_without_named_interfaces_is_refused_before_anything_changes() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    // Something the audit would flag and --fix would raise: a VXLAN device (found
    // without --iface) over an underlay below --mtu.
    vxlan_over_veth(&ns, "1500");
    let before = [ns.link_mtu("ul"), ns.link_mtu("vx0"), ns.link_mtu("ulp")];
    let empty = TempDir::new("sysfs");
    let root = empty.path().to_str().unwrap();
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec!["check", "--fix", "--mtu", "9000", "--sysfs-root", root];
        args.extend_from_slice(extra);
        let out = agent_in(&ns, &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim(),
            "roce-agent: error: check --fix changes only interfaces you name: add --iface IF \
             (or `interfaces` in --config); check --dry-run prints what it would change"
        );
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
    assert_eq!(
        [ns.link_mtu("ul"), ns.link_mtu("vx0"), ns.link_mtu("ulp")],
        before
    );
    assert_eq!(before[0], 1500);
    // Without --fix the same audit runs and finds the low MTUs: it was --fix refused.
    let (doc, code) = check_json_in(&ns, &["--mtu", "9000", "--sysfs-root", root]);
    assert_eq!(code, 1, "{doc}");
}

#[test]
fn dry_run_prints_the_mtu_command_and_changes_nothing() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    let out = agent_in(
        &ns,
        &["check", "--dry-run", "--iface", "va", "--mtu", "9000"],
    );
    let stdout = text(&out.stdout);
    // The audit's result: va is below the MTU.
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "\ndry run: --fix would run (nothing was changed):\nip link set dev va mtu 9000\n"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("changed: "), "{stdout}");
    assert_eq!(ns.link_mtu("va"), 1500);
    assert_eq!(ns.link_mtu("vb"), 1500);

    // JSON: compact (one line), the plan under "planned".
    let out = agent_in(
        &ns,
        &[
            "check",
            "--dry-run",
            "--json",
            "--iface",
            "va",
            "--mtu",
            "9000",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let doc: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(doc["planned"], json!(["ip link set dev va mtu 9000"]));
    assert_eq!(doc["not_planned"], json!([]));
    assert!(doc.get("changes").is_none(), "{doc}");
    assert_eq!(ns.link_mtu("va"), 1500);

    // --pretty indents the same document.
    let out = agent_in(
        &ns,
        &[
            "check",
            "--dry-run",
            "--json",
            "--pretty",
            "--iface",
            "va",
            "--mtu",
            "9000",
        ],
    );
    let pretty: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(text(&out.stdout).lines().count() > 10);
    assert_eq!(pretty, doc);

    // --dry-run and --fix together: a usage error, nothing changed.
    let out = agent_in(
        &ns,
        &[
            "check",
            "--dry-run",
            "--fix",
            "--iface",
            "va",
            "--mtu",
            "9000",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("the argument '--dry-run' cannot be used with '--fix'"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(ns.link_mtu("va"), 1500);
}

#[test]
fn dry_run_prints_the_sysfs_writes_and_writes_none() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    // The fixture's RoCE netdev is eth1: a veth of that name stands for it.
    veth(&ns, "eth1", "x0", "1500");
    let bad = fixture("mlx5-bad");
    let np3 = format!("{bad}/class/net/eth1/ecn/roce_np/enable/3");
    let cnp = format!("{bad}/class/net/eth1/ecn/roce_np/cnp_dscp");
    let before = (
        std::fs::read_to_string(&np3).unwrap(),
        std::fs::read_to_string(&cnp).unwrap(),
    );
    let (doc, code) = check_json_in(
        &ns,
        &[
            "--dry-run",
            "--iface",
            "eth1",
            "--mtu",
            "1500",
            "--sysfs-root",
            &bad,
        ],
    );
    assert_eq!(code, 1, "{doc}");
    assert_eq!(
        doc["planned"],
        json!([
            "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3",
            "echo 48 > /sys/class/net/eth1/ecn/roce_np/cnp_dscp",
            "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && echo 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos",
        ])
    );
    // Each planned command is the fix its finding gives.
    for c in doc["planned"].as_array().unwrap() {
        assert!(
            doc["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["fix"] == *c),
            "{c} is no finding's fix: {doc}"
        );
    }
    assert_eq!(
        (
            std::fs::read_to_string(&np3).unwrap(),
            std::fs::read_to_string(&cnp).unwrap()
        ),
        before
    );
    assert_eq!(before.0.trim(), "0");
    assert!(!std::path::Path::new(&format!("{bad}/kernel/config/rdma_cm/mlx5_0")).exists());
}

#[test]
fn fix_with_iface_changes_that_interface_alone() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    // A second pair in the same namespace, lower still: untouched.
    veth(&ns, "wa", "wb", "1280");
    let (doc, code) = check_json_in(&ns, &["--fix", "--iface", "va", "--mtu", "9000"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        doc["changes"],
        json!([{"check": "mtu", "interface": "va", "what": "mtu", "before": "1500", "after": "9000"}])
    );
    assert_eq!(doc["interfaces"], json!([{"ifname": "va", "why": "named"}]));
    assert_eq!(finding_interfaces(&doc), ["va"]);
    assert_eq!(ns.link_mtu("va"), 9000);
    assert_eq!(ns.link_mtu("vb"), 1500);
    assert_eq!(ns.link_mtu("wa"), 1280);
    assert_eq!(ns.link_mtu("wb"), 1280);
}

#[test]
fn without_iface_the_vxlan_device_and_its_underlay_are_audited_and_nothing_else() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    vxlan_over_veth(&ns, "1500");
    // Unrelated: no RDMA device, no VXLAN.
    veth(&ns, "other0", "other1", "1280");
    let empty = TempDir::new("sysfs");
    let root = empty.path().to_str().unwrap();
    let (doc, code) = check_json_in(&ns, &["--mtu", "1400", "--sysfs-root", root]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        doc["interfaces"],
        json!([
            {"ifname": "vx0", "why": "vxlan"},
            {"ifname": "ul", "why": "underlay", "underlay_of": "vx0"},
        ])
    );
    assert_eq!(finding_interfaces(&doc), ["ul", "vx0"]);
    let findings = doc["findings"].as_array().unwrap();
    let count = |s: &str| findings.iter().filter(|f| f["severity"] == s).count();
    assert_eq!(
        doc["summary"],
        json!({"error": count("error"), "warning": count("warning"), "info": count("info")})
    );
    assert!(count("info") > 0, "{doc}");

    let out = agent_in(&ns, &["check", "--mtu", "1400", "--sysfs-root", root]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout.lines().next(),
        Some("audited: vx0 (VXLAN), ul (underlay of vx0) | required MTU 1400 | peers: none")
    );
    for unrelated in ["other0", "other1", "ulp"] {
        assert!(!stdout.contains(unrelated), "{unrelated}: {stdout}");
    }

    // --dry-run without names: the plan for the interfaces found, and the --fix
    // command line that names them; nothing changed.
    let out = agent_in(
        &ns,
        &["check", "--dry-run", "--mtu", "4000", "--sysfs-root", root],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.ends_with(
            "\ndry run: `--fix --iface vx0 --iface ul` would run (nothing was changed):\n\
             ip link set dev ul mtu 4050\nip link set dev vx0 mtu 4000\n"
        ),
        "{stdout}"
    );
    assert_eq!(
        [ns.link_mtu("vx0"), ns.link_mtu("ul"), ns.link_mtu("other0")],
        [1450, 1500, 1280]
    );
}

#[test]
fn without_iface_rdma_netdevs_come_first_then_vxlan_devices_and_underlays() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    // The fixture's mlx5_0 has eth1 in its GID table.
    veth(&ns, "eth1", "x0", "9000");
    vxlan_over_veth(&ns, "9000");
    veth(&ns, "other0", "other1", "1280");
    let good = fixture("mlx5-good");
    let (doc, code) = check_json_in(&ns, &["--mtu", "1500", "--sysfs-root", &good]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        doc["interfaces"],
        json!([
            {"ifname": "eth1", "why": "rdma_device", "rdma_device": "mlx5_0"},
            {"ifname": "vx0", "why": "vxlan"},
            {"ifname": "ul", "why": "underlay", "underlay_of": "vx0"},
        ])
    );
    assert_eq!(finding_interfaces(&doc), ["eth1", "ul", "vx0"]);
    let out = agent_in(&ns, &["check", "--mtu", "1500", "--sysfs-root", &good]);
    assert_eq!(
        text(&out.stdout).lines().next(),
        Some("audited: eth1 (RDMA device mlx5_0), vx0 (VXLAN), ul (underlay of vx0) | required MTU 1500 | peers: none")
    );
}

#[test]
fn without_iface_and_nothing_carrying_roce_exits_2_naming_iface() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    let empty = TempDir::new("sysfs");
    let root = empty.path().to_str().unwrap();
    let out = agent_in(&ns, &["check", "--sysfs-root", root]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).trim(),
        format!(
            "roce-agent: error: no interface to audit: none carries RoCE (no netdev of an RDMA \
             device in {root}/class/infiniband, no VXLAN device); name the interfaces to audit \
             with --iface IF (or `interfaces` in --config)"
        )
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn config_interfaces_are_named_enough_for_fix() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    veth(&ns, "va", "vb", "1500");
    let config = roce_testkit::temp::TempFile::new("host.toml", "interfaces = [\"va\"]\n");
    let (doc, code) = check_json_in(&ns, &["--fix", "--mtu", "9000", "--config", config.arg()]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        doc["interfaces"],
        json!([{"ifname": "va", "why": "config"}])
    );
    assert_eq!(ns.link_mtu("va"), 9000);
    assert_eq!(ns.link_mtu("vb"), 1500);
}

#[test]
fn a_peer_routed_through_an_interface_not_audited_is_not_probed_nor_reported_on_it() {
    require_root!("network namespaces");
    let ns = new_ns(NS);
    // The route towards 198.18.0.9 leaves through va, which is not audited.
    veth(&ns, "va", "vb", "1500");
    ns.ip_ok(&["addr", "add", "198.18.0.1/24", "dev", "va"]);
    let (doc, code) = check_json_in(
        &ns,
        &["--iface", "lo", "--mtu", "9000", "--peer", "198.18.0.9"],
    );
    assert_eq!(code, 0, "{doc}");
    assert_eq!(finding_interfaces(&doc), ["lo"]);
    let path: Vec<&Value> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "mtu_path")
        .collect();
    assert_eq!(
        path,
        [&json!({
            "check": "mtu_path",
            "interface": null,
            "severity": "info",
            "found": "198.18.0.9 not probed: the route towards it leaves through va, which is not audited",
            "expected": "a peer reached through an audited interface (lo)",
            "fix": "add --iface va to probe the path through it",
        })]
    );
}
