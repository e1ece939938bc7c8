//! End-to-end host QoS in network namespaces (roce_testkit::lab: two namespaces, a veth pair,
//! VXLAN devices over it), with tshark and the kernel as oracles:
//!
//! - VTEP propagation: a `tos 0` VXLAN tunnel plus our tc program gives, for all 64
//!   DSCP x 4 ECN inner markings, the outer TOS that the kernel's `tos inherit` tunnel
//!   gives (mode `kernel`), and a copy with CE (mode `rfc6040`); TCX and clsact.
//! - Remarking: non-RoCE UDP on DSCP 26 leaves with DSCP 0, RoCE keeps 26, CNPs get 48;
//!   the iptables `DSCP` target doing the same remark gives the same bytes.
//! - Audit mode changes no byte and counts what enforce mode changed.
//! - Detaching removes the programs and the clsact qdisc the agent added.
//!
//! The programs are loaded and attached by the agent's own library on a thread inside
//! the namespace; traffic comes from sockets in that namespace. Needs root, tcpdump,
//! tshark and iptables.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use aya::programs::tc::{NlOptions, TcAttachOptions};
use aya::programs::{LinkOrder, TcAttachType};
use roce_agent::config::{EcnPropagation, HostMode, Settings};
use roce_agent::datapath::attach::Attachments;
use roce_agent::datapath::loader::{self, LoadOptions};
use roce_agent::datapath::qos::TcMechanism;
use roce_common::counters::*;
use roce_common::policy::ecn_encapsulate;
use roce_common::policy::{ECN_KERNEL, ECN_RFC6040};
use roce_testkit::frame::{cnp, roce_frame, udp_frame, Eth, RoceMsg, L3};
use roce_testkit::lab::{in_namespace, Lab, LabOptions};
use roce_testkit::sock::set_int_option;
use roce_testkit::tshark;

fn lab(vxlan: bool, tos_inherit: bool) -> Lab {
    match Lab::new(LabOptions {
        vxlan,
        tos_inherit,
        ipv6: false,
        ..LabOptions::default()
    }) {
        Ok(l) => l,
        Err(e) => panic!("building the namespace lab (needs root and iproute2): {e:#}"),
    }
}

fn settings(ifaces: &[&str], vteps: &[&str], mode: HostMode, ecn: EcnPropagation) -> Settings {
    Settings {
        interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
        vteps: vteps.iter().map(|s| s.to_string()).collect(),
        mode,
        ecn_propagation: ecn,
        ..Settings::default()
    }
}

/// Loads the programs inside namespace `ns`, attaches them as `settings` say, runs
/// `traffic` there, and returns STATS (summed over CPUs). Everything is detached when
/// this returns, also on error. Returns what `tc qdisc show` printed while attached.
fn with_programs(
    ns: &str,
    settings: Settings,
    how: TcMechanism,
    traffic: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<(Vec<u64>, String)> {
    in_namespace(ns, move || {
        let mut loaded = loader::load(&LoadOptions::default()).context("loading")?;
        let attached = Attachments::tc_only(&mut loaded, &settings, how).context("attaching")?;
        let dev = attached
            .tc_interfaces()
            .next()
            .map(|i| i.ifname.clone())
            .unwrap_or_default();
        let qdiscs = output(Command::new("tc").args(["qdisc", "show", "dev", &dev]))?;
        traffic()?;
        let stats = loaded.stats()?;
        drop(attached);
        Ok((stats, qdiscs))
    })
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One UDP datagram per TOS value, from a socket with IP_TOS set (UDP keeps the ECN bits).
fn send_every_tos(dst: Ipv4Addr, port: u16) -> Result<()> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    for tos in 0..=255u8 {
        set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, tos as i32)
            .with_context(|| format!("IP_TOS {tos}"))?;
        sock.send_to(&[tos; 16], SocketAddrV4::new(dst, port))?;
    }
    Ok(())
}

/// tshark's view of a VXLAN capture: inner TOS -> outer TOS (one entry per probe).
fn outer_by_inner(pcap: &Path) -> Result<BTreeMap<u8, u8>> {
    let rows = tshark::Fields::new(&["ip.dsfield"])
        .filter("vxlan && udp.dstport == 7777")
        .run(pcap)?;
    let mut map = BTreeMap::new();
    for row in rows.iter().filter(|r| !r.is_empty()) {
        let v: Vec<u8> = row
            .all(0)
            .iter()
            .map(|h| Ok(tshark::number(h)? as u8))
            .collect::<Result<_>>()
            .with_context(|| format!("tshark line {:?}", row.line))?;
        let [outer, inner] = v[..] else {
            bail!("expected outer and inner dsfield, got {:?}", row.line);
        };
        if map.insert(inner, outer).is_some() {
            bail!("inner TOS {inner} seen twice");
        }
    }
    Ok(map)
}

/// Sends the 256 probes over lab's VXLAN from side A, captured on B's veth.
fn probe_vxlan_once(
    l: &Lab,
    name: &str,
    attach: Option<(Settings, TcMechanism)>,
) -> Result<(BTreeMap<u8, u8>, Vec<u64>, String)> {
    let filter = format!("udp dst port 4789 and dst host {}", l.b.ip4);
    let cap = l.capture(&l.b.ns, &l.b.veth, name, true, &filter)?;
    let dst = l.b.vxlan_ip4.context("lab without VXLAN")?;
    let (stats, qdiscs) = match attach {
        Some((s, how)) => with_programs(&l.a.ns, s, how, move || send_every_tos(dst, 7777))?,
        None => {
            in_namespace(&l.a.ns, move || send_every_tos(dst, 7777))?;
            (Vec::new(), String::new())
        }
    };
    let pcap = cap.finish()?;
    Ok((outer_by_inner(&pcap)?, stats, qdiscs))
}

/// `probe_vxlan_once`, again when tcpdump itself lost a packet (a loaded machine): the
/// capture is the oracle's eyes, not the thing under test.
fn probe_vxlan(
    l: &Lab,
    name: &str,
    attach: Option<(Settings, TcMechanism)>,
) -> Result<(BTreeMap<u8, u8>, Vec<u64>, String)> {
    let mut tries = 0;
    loop {
        tries += 1;
        match probe_vxlan_once(l, &format!("{name}{tries}"), attach.clone()) {
            Err(e) if tries < 3 && format!("{e:#}").contains("tcpdump captured") => {
                eprintln!("{name}: {e:#}; probing again");
            }
            r => return r,
        }
    }
}

#[test]
fn vtep_outer_tos_equals_kernel_tos_inherit_for_all_64_dscp_x_4_ecn_tcx_and_clsact() {
    let inherit = lab(true, true);
    let ours = lab(true, false);
    let (kernel, _, _) =
        probe_vxlan(&inherit, "inherit", None).expect("probing the tos inherit tunnel");
    assert_eq!(kernel.len(), 256, "{kernel:?}");
    // The kernel itself, as the kernel documents `tos inherit`: DSCP copied, inner CE -> outer ECT(0).
    for (inner, outer) in &kernel {
        assert_eq!(
            *outer,
            (inner & 0xFC) | ecn_encapsulate(inner & 3, ECN_KERNEL),
            "kernel, inner {inner}"
        );
    }
    // Without our program the `tos 0` tunnel loses the DSCP: the test can fail.
    let (plain, _, _) = probe_vxlan(&ours, "tos0", None).expect("probing the tos 0 tunnel");
    assert!(plain.iter().any(|(i, o)| kernel[i] != *o));

    for how in [TcMechanism::Tcx, TcMechanism::Clsact] {
        let s = settings(
            &[],
            &[&ours.a.veth],
            HostMode::Audit,
            EcnPropagation::Kernel,
        );
        let (got, stats, qdiscs) =
            probe_vxlan(&ours, &format!("{how:?}"), Some((s, how))).expect("probing our tunnel");
        assert_eq!(
            got, kernel,
            "{how:?}: our outer TOS differs from tos inherit"
        );
        assert_eq!(stats[STAT_VTEP_PACKETS as usize], 256, "{how:?}");
        assert_eq!(
            qdiscs.contains("clsact"),
            how == TcMechanism::Clsact,
            "{how:?}: {qdiscs}"
        );
    }

    let s = settings(
        &[],
        &[&ours.a.veth],
        HostMode::Audit,
        EcnPropagation::Rfc6040,
    );
    let (got, _, _) =
        probe_vxlan(&ours, "rfc6040", Some((s, TcMechanism::Auto))).expect("rfc6040 probe");
    for (inner, outer) in &got {
        assert_eq!(
            *outer,
            (inner & 0xFC) | ecn_encapsulate(inner & 3, ECN_RFC6040),
            "rfc6040, inner {inner}"
        );
    }
    assert_eq!(got.len(), 256);
    // Detached: the clsact qdisc the agent added is gone again.
    let q = inherit_free_qdiscs(&ours);
    assert!(!q.contains("clsact"), "clsact left behind: {q}");
}

fn inherit_free_qdiscs(l: &Lab) -> String {
    match l.exec(&l.a.ns, "tc", &["qdisc", "show", "dev", &l.a.veth]) {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => panic!("tc qdisc show: {e:#}"),
    }
}

// ---------------------------------------------------------------------------------
// Host remarking

/// The probes of the remarking tests, as IPv4 packets for a raw socket: fixed IP IDs,
/// so that two runs send identical bytes.
fn host_probes(src: Ipv4Addr, dst: Ipv4Addr, with_cnp: bool) -> Vec<(&'static str, Vec<u8>)> {
    let eth = Eth::default();
    let l3 = |tos: u8| L3::v4(src, dst).with_tos(tos);
    let mut out = vec![
        (
            "intruder_ect0",
            udp_frame(&eth, &l3(106), 40000, 5001, &[1; 64]),
        ),
        (
            "intruder_ce",
            udp_frame(&eth, &l3(107), 40001, 5001, &[2; 64]),
        ),
        (
            "other_af41",
            udp_frame(&eth, &l3(34 << 2), 40002, 5001, &[3; 64]),
        ),
        (
            "roce",
            roce_frame(&eth, &l3(106), 0xC000, &RoceMsg::write_only(0x12, 5, 64)),
        ),
        (
            "roce_wrong_dscp",
            roce_frame(&eth, &l3(2), 0xC000, &RoceMsg::write_only(0x12, 6, 64)),
        ),
    ];
    if with_cnp {
        out.push(("cnp", roce_frame(&eth, &l3(106), 0xC000, &cnp(0x12))));
    }
    for (i, (_, f)) in out.iter_mut().enumerate() {
        f.drain(..14);
        f[4..6].copy_from_slice(&(0x100 + i as u16).to_be_bytes());
    }
    out
}

fn send_raw(packets: Vec<Vec<u8>>, dst: Ipv4Addr) -> Result<()> {
    // SAFETY: plain socket calls on buffers we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        if fd < 0 {
            bail!("raw socket: {}", std::io::Error::last_os_error());
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.octets()),
            },
            sin_zero: [0; 8],
        };
        for p in &packets {
            let n = libc::sendto(
                fd,
                p.as_ptr() as *const libc::c_void,
                p.len(),
                0,
                &addr as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            );
            if n < 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                bail!("sendto: {e}");
            }
        }
        libc::close(fd);
    }
    Ok(())
}

/// Captured frames on B's veth from A, in order.
fn frames(pcap: &Path) -> Vec<Vec<u8>> {
    match roce_tests::pcap::read(pcap) {
        Ok(c) => c.records.into_iter().map(|r| r.data).collect(),
        Err(e) => panic!("reading {}: {e}", pcap.display()),
    }
}

/// (dscp, ecn) per frame, by tshark.
fn tshark_dscp_ecn(pcap: &Path) -> Vec<(u8, u8)> {
    let rows = match tshark::Fields::new(&["ip.dsfield.dscp", "ip.dsfield.ecn"]).run(pcap) {
        Ok(r) => r,
        Err(e) => panic!("tshark: {e:#}"),
    };
    // The outermost IP header's marking; 255 where a frame has none.
    let field = |r: &tshark::Row, i: usize| r.first(i).and_then(|v| v.parse().ok()).unwrap_or(255);
    rows.iter().map(|r| (field(r, 0), field(r, 1))).collect()
}

/// Frames captured, STATS, and tshark's (DSCP, ECN) per frame.
type HostRun = (Vec<Vec<u8>>, Vec<u64>, Vec<(u8, u8)>);

fn run_host(l: &Lab, mode: Option<HostMode>, with_cnp: bool, name: &str) -> HostRun {
    let probes: Vec<Vec<u8>> = host_probes(l.a.ip4, l.b.ip4, with_cnp)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let filter = format!("src host {} and dst host {} and udp", l.a.ip4, l.b.ip4);
    let cap = match l.capture(&l.b.ns, &l.b.veth, name, true, &filter) {
        Ok(c) => c,
        Err(e) => panic!("tcpdump: {e:#}"),
    };
    let dst = l.b.ip4;
    let stats = match mode {
        Some(m) => {
            let s = settings(&[&l.a.veth], &[], m, EcnPropagation::Kernel);
            match with_programs(&l.a.ns, s, TcMechanism::Auto, move || send_raw(probes, dst)) {
                Ok((s, _)) => s,
                Err(e) => panic!("{name}: {e:#}"),
            }
        }
        None => {
            if let Err(e) = in_namespace(&l.a.ns, move || send_raw(probes, dst)) {
                panic!("{name}: {e:#}");
            }
            Vec::new()
        }
    };
    let pcap = match cap.finish() {
        Ok(p) => p,
        // tcpdump lost a packet (a loaded machine): the oracle's eyes, not our program.
        Err(e)
            if format!("{e:#}").contains("tcpdump captured") && !name.ends_with("-again-again") =>
        {
            eprintln!("{name}: {e:#}; sending again");
            return run_host(l, mode, with_cnp, &format!("{name}-again"));
        }
        Err(e) => panic!("{name}: {e:#}"),
    };
    let f = frames(&pcap);
    assert_eq!(
        f.len(),
        if with_cnp { 6 } else { 5 },
        "{name}: frames captured"
    );
    let seen = tshark_dscp_ecn(&pcap);
    assert_eq!(seen.len(), f.len());
    (f, stats, seen)
}

#[test]
fn intruders_on_dscp_26_are_remarked_to_0_roce_keeps_26_cnps_get_48_as_tshark_decodes() {
    let l = lab(false, false);
    let (got, stats, seen) = run_host(&l, Some(HostMode::Enforce), true, "enforce");
    let dscp_ecn: Vec<(u8, u8)> = got.iter().map(|f| (f[15] >> 2, f[15] & 3)).collect();
    // intruder ECT(0), intruder CE, AF41 untouched, RoCE 26, RoCE fixed to 26, CNP 48.
    let want = vec![(0, 2), (0, 3), (34, 0), (26, 2), (26, 2), (48, 2)];
    assert_eq!(dscp_ecn, want);
    assert_eq!(seen, want, "tshark");
    assert_eq!(
        (
            stats[STAT_QOS_INTRUDER_REMARKED as usize],
            stats[STAT_QOS_ROCE_REWRITTEN as usize],
            stats[STAT_QOS_PRIORITY_SET as usize]
        ),
        (2, 2, 6)
    );
}

#[test]
fn the_iptables_dscp_target_doing_the_same_remark_gives_the_same_bytes() {
    let l = lab(false, false);
    let (ours, _, _) = run_host(&l, Some(HostMode::Enforce), false, "ours");
    let rule = [
        "-t",
        "mangle",
        "-A",
        "POSTROUTING",
        "-o",
        &l.a.veth,
        "-p",
        "udp",
        "!",
        "--dport",
        "4791",
        "-m",
        "dscp",
        "--dscp",
        "26",
        "-j",
        "DSCP",
        "--set-dscp",
        "0",
    ];
    if let Err(e) = l.exec(&l.a.ns, "iptables", &rule) {
        panic!("iptables: {e:#}");
    }
    let (theirs, _, _) = run_host(&l, None, false, "iptables");
    // The RoCE probe on DSCP 0 is ours alone to fix: iptables leaves it.
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        if i == 4 {
            assert_eq!((a[15], b[15]), (106, 2));
            continue;
        }
        assert!(
            a == b,
            "probe {i}: ours\n{}iptables\n{}",
            roce_tests::hex(a),
            roce_tests::hex(b)
        );
    }
}

#[test]
fn audit_mode_changes_no_byte_and_counts_what_enforce_changed() {
    let l = lab(false, false);
    let (untouched, _, _) = run_host(&l, None, true, "none");
    let (audited, audit, _) = run_host(&l, Some(HostMode::Audit), true, "audit");
    assert_eq!(audited, untouched, "audit mode changed bytes");
    let (enforced, enforce, _) = run_host(&l, Some(HostMode::Enforce), true, "enforce2");
    let changed = enforced
        .iter()
        .zip(&untouched)
        .filter(|(a, b)| a != b)
        .count() as u64;
    assert_eq!(changed, 4);
    assert_eq!(
        audit[STAT_QOS_AUDIT_ROCE_REWRITE as usize]
            + audit[STAT_QOS_AUDIT_INTRUDER_REMARK as usize],
        changed
    );
    assert_eq!(
        (
            audit[STAT_QOS_AUDIT_ROCE_REWRITE as usize],
            audit[STAT_QOS_AUDIT_INTRUDER_REMARK as usize],
            audit[STAT_QOS_AUDIT_PRIORITY as usize]
        ),
        (
            enforce[STAT_QOS_ROCE_REWRITTEN as usize],
            enforce[STAT_QOS_INTRUDER_REMARKED as usize],
            enforce[STAT_QOS_PRIORITY_SET as usize]
        )
    );
}

// ---------------------------------------------------------------------------------
// The agent binary: flags, attach, counters in `flows --json`

const API: &str = "127.0.0.1:9477";

fn start_agent(l: &Lab, bin: &Path, ns: &str, args: &[&str]) -> roce_testkit::lab::Proc {
    let mut cmd = l.command(ns, bin.join("roce-agent"));
    cmd.arg("run")
        .args(args)
        .args(["--listen", API, "--interval", "0.2"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    let mut agent = match l.spawn("roce-agent", cmd) {
        Ok(a) => a,
        Err(e) => panic!("starting roce-agent: {e:#}"),
    };
    if let Err(e) = agent.wait_for_output("serving GET /flows", std::time::Duration::from_secs(20))
    {
        panic!("roce-agent did not start: {e:#}\n{}", agent.stderr_text());
    }
    agent
}

/// `counters.qos` of the agent in `ns`, once the poll shows `ready` true (2 s at most).
fn agent_qos(
    l: &Lab,
    bin: &Path,
    ns: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let exe = bin.join("roce-agent");
    let mut last = serde_json::Value::Null;
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let out = match l.exec(
            ns,
            &exe.to_string_lossy(),
            &["flows", "--json", "--api", API],
        ) {
            Ok(o) => o,
            Err(e) => panic!("roce-agent flows: {e:#}"),
        };
        let doc: serde_json::Value = match serde_json::from_slice(&out.stdout) {
            Ok(d) => d,
            Err(e) => panic!("flows --json: {e}"),
        };
        last = doc["counters"]["qos"].clone();
        if ready(&last) {
            return last;
        }
    }
    last
}

#[test]
fn agent_run_vtep_and_enforce_flags_rewrite_and_report_decap_mismatches_per_remote_vtep() {
    let bin = match roce_testkit::lab::bins::agent_bins_for_test() {
        Ok(b) => b,
        Err(e) => panic!("building roce-agent: {e:#}"),
    };
    let l = lab(true, false);
    // No IPv6 on the VXLAN devices: no router solicitation or MLD joins the probes.
    for (ns, vx) in [(&l.a.ns, &l.a.vxlan), (&l.b.ns, &l.b.vxlan)] {
        let vx = vx.clone().unwrap_or_default();
        if let Err(e) = l.exec(
            ns,
            "sysctl",
            &["-qw", &format!("net.ipv6.conf.{vx}.disable_ipv6=1")],
        ) {
            panic!("sysctl: {e:#}");
        }
    }
    let dst = l.b.vxlan_ip4.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let send = |ns: &str| {
        if let Err(e) = in_namespace(ns, move || send_every_tos(dst, 7777)) {
            panic!("sending probes: {e:#}");
        }
    };

    // B decapsulates; A's `tos 0` tunnel loses every DSCP but 0.
    let _b = start_agent(
        &l,
        &bin,
        &l.b.ns,
        &["--iface", &l.b.veth, "--vtep", &l.b.veth],
    );
    send(&l.a.ns);
    let q = agent_qos(&l, &bin, &l.b.ns, |q| q["decap_packets"] == 256);
    assert_eq!(
        (
            q["decap_packets"].as_u64(),
            q["decap_dscp_mismatch"].as_u64()
        ),
        (Some(256), Some(252)),
        "{q:#}"
    );
    assert_eq!(q["vteps"][0]["remote"], l.a.ip4.to_string(), "{q:#}");
    assert_eq!(q["vteps"][0]["vni"], l.vni, "{q:#}");
    assert_eq!(
        (
            q["vteps"][0]["packets"].as_u64(),
            q["vteps"][0]["dscp_mismatch"].as_u64()
        ),
        (Some(256), Some(252))
    );
    assert_eq!(q["decap_ce_over_not_ect"], 0);

    // Now A propagates: B sees no new mismatch; A counts its rewrites.
    let _a = start_agent(
        &l,
        &bin,
        &l.a.ns,
        &[
            "--iface", &l.a.veth, "--vtep", &l.a.veth, "--mode", "enforce",
        ],
    );
    send(&l.a.ns);
    let q = agent_qos(&l, &bin, &l.b.ns, |q| q["decap_packets"] == 512);
    assert_eq!(
        (
            q["decap_packets"].as_u64(),
            q["decap_dscp_mismatch"].as_u64()
        ),
        (Some(512), Some(252)),
        "{q:#}"
    );
    let qa = agent_qos(&l, &bin, &l.a.ns, |q| q["vtep_packets"] == 256);
    assert_eq!(
        (qa["vtep_packets"].as_u64(), qa["vtep_rewritten"].as_u64()),
        (Some(256), Some(252)),
        "{qa:#}"
    );

    // An intruder on DSCP 26 leaving A's veth is remarked and counted.
    let (src, peer) = (l.a.ip4, l.b.ip4);
    let probes: Vec<Vec<u8>> = host_probes(src, peer, false)
        .into_iter()
        .take(2)
        .map(|(_, p)| p)
        .collect();
    if let Err(e) = in_namespace(&l.a.ns, move || send_raw(probes, peer)) {
        panic!("{e:#}");
    }
    let qa = agent_qos(&l, &bin, &l.a.ns, |q| q["intruders_remarked"] == 2);
    assert_eq!(qa["intruders_remarked"], 2, "{qa:#}");
    assert_eq!(qa["audit_intruders_would_remark"], 0);
}

// ---------------------------------------------------------------------------------
// IPv6 underlay, and a VXLAN device with a fixed `tos`

/// A VXLAN pair over the lab's IPv6 underlay: (device name in A, inner address of B).
fn vxlan6(l: &Lab, vni: u32, subnet: u8, tos: &str) -> (String, Ipv4Addr) {
    let (a6, b6) = match (l.a.ip6, l.b.ip6) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!("lab without IPv6"),
    };
    let name = |tag: &str| format!("vx{vni}{tag}");
    let mut macs = Vec::new();
    for (side, local, remote, host) in [(&l.a, a6, b6, 1u8), (&l.b, b6, a6, 2u8)] {
        let dev = name(if host == 1 { "a" } else { "b" });
        let (vni_s, local_s, remote_s) = (vni.to_string(), local.to_string(), remote.to_string());
        let addr = format!("198.19.{subnet}.{host}/24");
        let cmds: Vec<Vec<&str>> = vec![
            vec![
                "link", "add", &dev, "type", "vxlan", "id", &vni_s, "dstport", "4789", "local",
                &local_s, "remote", &remote_s, "dev", &side.veth, "tos", tos,
            ],
            vec!["addr", "add", &addr, "dev", &dev],
            vec!["link", "set", &dev, "up"],
        ];
        for c in cmds {
            if let Err(e) = l.exec(&side.ns, "ip", &c) {
                panic!("ip {c:?}: {e:#}");
            }
        }
        let _ = l.exec(
            &side.ns,
            "sysctl",
            &["-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")],
        );
        let out = match l.exec(&side.ns, "ip", &["-br", "link", "show", "dev", &dev]) {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => panic!("{e:#}"),
        };
        macs.push(
            out.split_whitespace()
                .nth(2)
                .unwrap_or_default()
                .to_string(),
        );
    }
    let b_inner = Ipv4Addr::new(198, 19, subnet, 2);
    let neigh = [
        "neigh",
        "replace",
        &b_inner.to_string(),
        "lladdr",
        &macs[1],
        "dev",
        &name("a"),
        "nud",
        "permanent",
    ];
    if let Err(e) = l.exec(&l.a.ns, "ip", &neigh) {
        panic!("{e:#}");
    }
    (name("a"), b_inner)
}

/// Outer traffic class by inner TOS, from a capture with an IPv6 underlay.
fn outer6_by_inner(pcap: &Path) -> Result<BTreeMap<u8, u8>> {
    let rows = tshark::Fields::new(&["ipv6.tclass", "ip.dsfield"])
        .filter("vxlan && udp.dstport == 7777")
        .run(pcap)?;
    let mut map = BTreeMap::new();
    for row in rows.iter().filter(|r| !r.is_empty()) {
        let (Some(o), Some(i)) = (row.first(0), row.first(1)) else {
            bail!("tshark line {:?}: expected outer and inner TOS", row.line);
        };
        let (outer, inner) = (tshark::number(o)? as u8, tshark::number(i)? as u8);
        if map.insert(inner, outer).is_some() {
            bail!("inner TOS {inner} seen twice");
        }
    }
    Ok(map)
}

#[test]
fn vtep_on_an_ipv6_underlay_over_a_fixed_tos_device_matches_tos_inherit() {
    let l = match Lab::new(LabOptions {
        vxlan: false,
        ipv6: true,
        ..LabOptions::default()
    }) {
        Ok(l) => l,
        Err(e) => panic!("lab: {e:#}"),
    };
    let (_, inherit_dst) = vxlan6(&l, 6001, 250, "inherit");
    // A fixed DSCP 10 on the device: our program overrides whatever the device wrote.
    let (_, ours_dst) = vxlan6(&l, 6002, 251, "0x28");
    let filter = format!(
        "udp dst port 4789 and dst host {}",
        l.b.ip6.unwrap_or(std::net::Ipv6Addr::UNSPECIFIED)
    );
    let probe = |name: &str, dst: Ipv4Addr, attach: bool| -> BTreeMap<u8, u8> {
        let cap = match l.capture(&l.b.ns, &l.b.veth, name, true, &filter) {
            Ok(c) => c,
            Err(e) => panic!("{e:#}"),
        };
        let r = if attach {
            let s = settings(&[], &[&l.a.veth], HostMode::Audit, EcnPropagation::Kernel);
            with_programs(&l.a.ns, s, TcMechanism::Auto, move || {
                send_every_tos(dst, 7777)
            })
            .map(|_| ())
        } else {
            in_namespace(&l.a.ns, move || send_every_tos(dst, 7777))
        };
        if let Err(e) = r {
            panic!("{name}: {e:#}");
        }
        match cap.finish().and_then(|p| outer6_by_inner(&p)) {
            Ok(m) => m,
            Err(e) => panic!("{name}: {e:#}"),
        }
    };
    let kernel = probe("inherit6", inherit_dst, false);
    assert_eq!(kernel.len(), 256);
    let fixed = probe("fixed6", ours_dst, false);
    assert!(
        fixed.values().all(|o| o >> 2 == 10),
        "the device's own tos: {fixed:?}"
    );
    let ours = probe("ours6", ours_dst, true);
    assert_eq!(
        ours, kernel,
        "IPv6 underlay: our outer traffic class differs from tos inherit"
    );
}

// ---------------------------------------------------------------------------------
// Chaining: our programs return TCX_NEXT / TC_ACT_UNSPEC, so programs after them run

#[test]
fn a_program_attached_after_ours_still_sees_every_packet_tcx_and_clsact() {
    let l = lab(false, false);
    for how in [TcMechanism::Tcx, TcMechanism::Clsact] {
        let s = settings(&[&l.a.veth], &[], HostMode::Enforce, EcnPropagation::Kernel);
        let (src, dst) = (l.a.ip4, l.b.ip4);
        let veth = l.a.veth.clone();
        let r = in_namespace(&l.a.ns, move || {
            // Two independent loads (own maps): ours, then the same program attached
            // after it as another tool would (straight through aya: the agent would
            // take a filter named like its own over).
            let mut first = loader::load(&LoadOptions::default())?;
            let mut second = loader::load(&LoadOptions::default())?;
            let a1 = Attachments::tc_only(&mut first, &s, how)?;
            second.set_policy(&s.policy)?;
            let index = roce_agent::sys::netif::index_of(&veth).context("no veth")?;
            second.set_iface_qos(index, Some(roce_agent::datapath::qos::iface_qos(&s, &veth)))?;
            let options = match how {
                TcMechanism::Clsact => TcAttachOptions::Netlink(NlOptions::default()),
                _ => TcAttachOptions::TcxOrder(LinkOrder::default()),
            };
            second.tc_program(loader::TC_EGRESS)?.attach_with_options(
                &veth,
                TcAttachType::Egress,
                options,
            )?;
            let probes: Vec<Vec<u8>> = host_probes(src, dst, true)
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            send_raw(probes, dst)?;
            let counts = (first.stats()?, second.stats()?);
            // The other program goes first: ours then leaves no clsact qdisc behind.
            drop(second);
            drop(a1);
            Ok(counts)
        });
        let (first, second) = match r {
            Ok(c) => c,
            Err(e) => panic!("{how:?}: {e:#}"),
        };
        // Whichever runs first (clsact puts a later filter in front) remarks both
        // intruders and fixes the RoCE DSCP; the other, seeing rewritten packets, has
        // nothing left to change but still runs and sets their priority.
        let remarks = |s: &[u64]| {
            (
                s[STAT_QOS_INTRUDER_REMARKED as usize],
                s[STAT_QOS_ROCE_REWRITTEN as usize],
            )
        };
        let mut both = [remarks(&first), remarks(&second)];
        both.sort();
        assert_eq!(both, [(0, 0), (2, 2)], "{how:?}");
        for s in [&first, &second] {
            assert!(
                s[STAT_QOS_PRIORITY_SET as usize] >= 6,
                "{how:?}: a program did not run"
            );
        }
    }
    let q = inherit_free_qdiscs(&l);
    assert!(!q.contains("clsact"), "clsact left behind: {q}");
}
