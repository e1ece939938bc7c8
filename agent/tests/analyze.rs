//! `roce-agent analyze` as users run it, on captures built here with the project's
//! frame builder and on the real soft-RoCE captures in ../shared/captures/:
//! exact expected tables, tshark's decode of the same files as an independent oracle,
//! the kernel engine (XDP through BPF_PROG_TEST_RUN) against the reference engine
//! (byte-identical JSON), ICRC checks (and scapy's ICRC when scapy is installed),
//! truncated files and link types not read, Linux cooked captures (tcpdump -i any),
//! standard input, the exit status by finding level (`--fail-on`) and `--pretty`.
//!
//! Tests that need BPF (the kernel engine) or tshark say so on stderr and skip that
//! part when it is not available.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{agent, text, BIN};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::{DataLink, TsResolution};
use roce_testkit::frame::*;
use roce_testkit::tshark;
use serde_json::Value;

static FILE_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A scratch directory of this test process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("roce-analyze-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Capture start: 2023-11-14 22:13:20 UTC.
const T0_NS: u64 = 1_700_000_000_000_000_000;

/// Frames with timestamps 1 µs apart.
#[derive(Default)]
struct Frames(Vec<Vec<u8>>);

impl Frames {
    fn push(&mut self, f: Vec<u8>) {
        self.0.push(f);
    }
    fn ts(i: usize) -> Duration {
        Duration::from_nanos(T0_NS + i as u64 * 1000)
    }
    fn write_pcap(&self, path: &Path) {
        let header = PcapHeader {
            ts_resolution: TsResolution::NanoSecond,
            snaplen: 65535,
            ..Default::default()
        };
        let file = fs::File::create(path).expect("create pcap");
        let mut w = PcapWriter::with_header(file, header).expect("pcap header");
        for (i, f) in self.0.iter().enumerate() {
            w.write_packet(&PcapPacket::new(Self::ts(i), f.len() as u32, f))
                .expect("write packet");
        }
    }
    fn write_pcapng(&self, path: &Path) {
        let file = fs::File::create(path).expect("create pcapng");
        let mut w = PcapNgWriter::new(file).expect("pcapng header");
        // Nanosecond timestamps (if_tsresol 9), as pcap-file writes them.
        let mut idb = InterfaceDescriptionBlock::new(DataLink::ETHERNET, 65535);
        idb.options.push(
            pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption::IfTsResol(
                9,
            ),
        );
        w.write_pcapng_block(idb).expect("idb");
        for (i, f) in self.0.iter().enumerate() {
            let epb = EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Self::ts(i),
                original_len: f.len() as u32,
                data: std::borrow::Cow::Borrowed(f),
                options: vec![],
            };
            w.write_pcapng_block(epb).expect("epb");
        }
    }
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().expect("IPv4 literal")
}
fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("IPv6 literal")
}

const TOS_DATA: u8 = 106; // DSCP 26, ECT(0)
const TOS_CE: u8 = 107; // DSCP 26, CE
const TOS_CNP: u8 = 192; // DSCP 48, Not-ECT

fn plain(tos: u8) -> L3 {
    L3::v4(v4("198.18.0.1"), v4("198.18.0.2")).with_tos(tos)
}
fn plain_back(tos: u8) -> L3 {
    L3::v4(v4("198.18.0.2"), v4("198.18.0.1")).with_tos(tos)
}

fn with_payload(op: u8, qp: u32, psn: u32, len: usize) -> RoceMsg {
    RoceMsg::new(op, qp, psn).with_payload(len)
}
/// The scenario capture: every opcode family, CNPs plain and in VXLAN, IPv6, one and
/// two VLAN tags, IPv4 options, VXLAN over IPv4 and IPv6 underlays, the same inner
/// flow on two VNIs, a PSN wrap, a READ with a multi-packet response, a loss with its
/// NAK and retransmissions, jumbo frames, a bad ICRC, and non-RoCE traffic: the
/// committed captures but `malformed`, one after the other.
fn scenario() -> Frames {
    let mut f = Frames::default();
    for part in [opcodes(), vlan_psn(), ipv6_vxlan(), jumbo()] {
        f.0.extend(part.0);
    }
    f
}

/// Every opcode family on one RC connection (requests on qp 0x100, responses and
/// plain CNPs 0x81 and 0x80 on qp 0x200, a READ of 3000 bytes at path MTU 1024
/// answered by READ RESPONSE FIRST/MIDDLE/LAST), RC, UC and UD behind IPv4 options
/// on DSCP 0, XRC, a bad ICRC, and non-RoCE traffic (TCP on the lossless DSCP, DNS,
/// ARP).
fn opcodes() -> Frames {
    use opcode::*;
    let eth = Eth::default();
    let mut f = Frames::default();
    let sp = 0xC000;

    // qp 0x100, A->B: RC requests of every family; 2 CE marks. READ of 3000 bytes at
    // path MTU 1024 uses PSNs 8, 9, 10.
    let reqs = [
        (
            RoceMsg::new(RC_WRITE_FIRST, 0x100, 0)
                .with_reth(0x1000, 1, 2148)
                .with_payload(1024),
            TOS_DATA,
        ),
        (with_payload(RC_WRITE_MIDDLE, 0x100, 1, 1024), TOS_DATA),
        (with_payload(RC_WRITE_LAST, 0x100, 2, 100), TOS_DATA),
        (with_payload(RC_SEND_FIRST, 0x100, 3, 1024), TOS_DATA),
        (with_payload(RC_SEND_MIDDLE, 0x100, 4, 1024), TOS_DATA),
        (with_payload(RC_SEND_LAST_IMM, 0x100, 5, 10), TOS_CE),
        (RoceMsg::send_only(0x100, 6, 64), TOS_CE),
        (
            RoceMsg::new(RC_WRITE_ONLY_IMM, 0x100, 7)
                .with_reth(0x1000, 1, 8)
                .with_payload(8),
            TOS_DATA,
        ),
        (RoceMsg::read_request(0x100, 8, 3000), TOS_DATA),
        (RoceMsg::new(RC_FETCH_ADD, 0x100, 11), TOS_DATA),
        (RoceMsg::new(RC_COMPARE_SWAP, 0x100, 12), TOS_DATA),
        (with_payload(RC_SEND_ONLY_INV, 0x100, 13, 32), TOS_DATA),
    ];
    for (m, tos) in reqs {
        f.push(roce_frame(&eth, &plain(tos), sp, &m));
    }
    // qp 0x200, B->A: responses. 2 ACKs, 1 RNR NAK; READ response FIRST/MIDDLE/LAST and
    // an ATOMIC ACKNOWLEDGE carry AETHs but are no ACKNOWLEDGE; CNP 0x81 on DSCP 48 and
    // CNP 0x80 on DSCP 26 (the wrong DSCP).
    let resps = [
        (RoceMsg::ack(0x200, 2, 0x1F), TOS_DATA),
        (
            with_payload(RC_READ_RESPONSE_FIRST, 0x200, 8, 1024).with_syndrome(0x1F),
            TOS_DATA,
        ),
        (
            with_payload(RC_READ_RESPONSE_MIDDLE, 0x200, 9, 1024),
            TOS_DATA,
        ),
        (
            with_payload(RC_READ_RESPONSE_LAST, 0x200, 10, 952).with_syndrome(0x1F),
            TOS_DATA,
        ),
        (
            RoceMsg::new(RC_ATOMIC_ACKNOWLEDGE, 0x200, 11).with_syndrome(0x1F),
            TOS_DATA,
        ),
        (RoceMsg::ack(0x200, 13, 0x1F), TOS_DATA),
        (RoceMsg::ack(0x200, 13, 0x21), TOS_DATA),
        (cnp(0x200), TOS_CNP),
        (
            RoceMsg {
                opcode: CNP_ALT,
                ..cnp(0x200)
            },
            TOS_DATA,
        ),
    ];
    for (m, tos) in resps {
        f.push(roce_frame(&eth, &plain_back(tos), sp, &m));
    }

    // IPv4 options (router alert), DSCP 0 / Not-ECT: RC, UC and UD.
    let opts = plain(0).with_options(&[0x94, 0x04, 0x00, 0x00]);
    f.push(roce_frame(
        &eth,
        &opts,
        69,
        &RoceMsg::write_only(0x600, 0, 64),
    ));
    f.push(roce_frame(
        &eth,
        &opts,
        69,
        &with_payload(UC_SEND_ONLY, 0x601, 5, 20),
    ));
    f.push(roce_frame(
        &eth,
        &opts,
        69,
        &with_payload(UD_SEND_ONLY, 0x602, 9, 20),
    ));
    // XRC SEND ONLY.
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &with_payload(XRC | 0x04, 0xA00, 0, 40),
    ));

    // qp 0xC00: the second packet's ICRC is corrupt.
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &RoceMsg::send_only(0xC00, 0, 64),
    ));
    let mut bad = roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &RoceMsg::send_only(0xC00, 1, 64),
    );
    let last = bad.len() - 1;
    bad[last] ^= 0xFF;
    f.push(bad);

    // Non-RoCE: TCP on the lossless DSCP (2 frames), DNS on DSCP 0, ARP.
    let tcp = vec![0u8; 20];
    f.push(ip_frame(&eth, &plain(104), 6, &tcp));
    f.push(ip_frame(&eth, &plain(104), 6, &tcp));
    f.push(udp_frame(&eth, &plain(0), 5353, 53, &[0u8; 12]));
    f.push(eth_frame(&eth, 0x0806, &[0u8; 28]));
    f
}

/// One VLAN tag with a PSN wrap, two tags (802.1ad + 802.1Q) with a lost PSN, its
/// NAK and the retransmissions.
fn vlan_psn() -> Frames {
    let mut f = Frames::default();
    let sp = 0xC000;

    // qp 0x300, one VLAN tag: a PSN wrap, no gap.
    let tagged = Eth::default().with_vlan(VlanTag::dot1q(100));
    for psn in [0xFF_FFFE, 0xFF_FFFF, 0, 1] {
        f.push(roce_frame(
            &tagged,
            &plain(TOS_DATA),
            sp,
            &RoceMsg::send_only(0x300, psn, 16),
        ));
    }

    // qp 0x400, two VLAN tags: PSN 12 lost (1 gap), NAK from B (qp 0x401), then 12
    // and 13 retransmitted (no further gap) and 14.
    let qinq = Eth::default()
        .with_vlan(VlanTag::dot1ad(10))
        .with_vlan(VlanTag::dot1q(20));
    for psn in [10, 11, 13] {
        f.push(roce_frame(
            &qinq,
            &plain(TOS_DATA),
            sp,
            &RoceMsg::send_only(0x400, psn, 16),
        ));
    }
    f.push(roce_frame(
        &qinq,
        &plain_back(TOS_DATA),
        sp,
        &RoceMsg::ack(0x401, 12, 0x60),
    ));
    for psn in [12, 13, 14] {
        f.push(roce_frame(
            &qinq,
            &plain(TOS_DATA),
            sp,
            &RoceMsg::send_only(0x400, psn, 16),
        ));
    }
    f
}

/// IPv6, RoCE in VXLAN over IPv4 and IPv6 underlays (inner IPv4 and IPv6), the
/// same inner flow on two VNIs, a CE mark on the outer header, a CNP in VXLAN.
fn ipv6_vxlan() -> Frames {
    let eth = Eth::default();
    let mut f = Frames::default();
    let sp = 0xC000;

    // IPv6: qp 0x700, one CE of three.
    let l6 = |tos| L3::v6(v6("fd00::1"), v6("fd00::2")).with_tos(tos);
    for (psn, tos) in [(0, TOS_DATA), (1, TOS_CE), (2, TOS_DATA)] {
        f.push(roce_frame(
            &eth,
            &l6(tos),
            sp,
            &RoceMsg::send_only(0x700, psn, 100),
        ));
    }

    // VXLAN over IPv4, VNI 5001: qp 0x800, the second outer CE-marked; the same inner
    // flow on VNI 5002 (a separate flow); a CNP back in VXLAN (qp 0x801).
    let outer = |tos| L3::v4(v4("10.0.0.1"), v4("10.0.0.2")).with_tos(tos);
    let outer_back = L3::v4(v4("10.0.0.2"), v4("10.0.0.1")).with_tos(TOS_CNP);
    let inner = L3::v4(v4("198.19.0.1"), v4("198.19.0.2")).with_tos(TOS_DATA);
    let inner_back = L3::v4(v4("198.19.0.2"), v4("198.19.0.1")).with_tos(TOS_CNP);
    for (psn, tos) in [(0, TOS_DATA), (1, TOS_CE), (2, TOS_DATA)] {
        let i = roce_frame(&eth, &inner, sp, &RoceMsg::write_only(0x800, psn, 256));
        f.push(vxlan_frame(
            &eth,
            &outer(tos),
            0xD000 + psn as u16,
            5001,
            &i,
        ));
    }
    for psn in [0, 1] {
        let i = roce_frame(&eth, &inner, sp, &RoceMsg::write_only(0x800, psn, 256));
        f.push(vxlan_frame(&eth, &outer(TOS_DATA), 0xD100, 5002, &i));
    }
    let i = roce_frame(&eth, &inner_back, sp, &cnp(0x801));
    f.push(vxlan_frame(&eth, &outer_back, 0xD200, 5001, &i));

    // VXLAN over IPv6, VNI 6000: inner IPv4 (qp 0x900) and inner IPv6 (qp 0x901).
    let outer6 = L3::v6(v6("fd00::a"), v6("fd00::b")).with_tos(TOS_DATA);
    for psn in [0, 1] {
        let i = roce_frame(
            &eth,
            &L3::v4(v4("198.19.1.1"), v4("198.19.1.2")).with_tos(TOS_DATA),
            sp,
            &RoceMsg::send_only(0x900, psn, 48),
        );
        f.push(vxlan_frame(&eth, &outer6, 0xD300, 6000, &i));
    }
    let i = roce_frame(
        &eth,
        &L3::v6(v6("fd01::1"), v6("fd01::2")).with_tos(TOS_DATA),
        sp,
        &RoceMsg::send_only(0x901, 0, 48),
    );
    f.push(vxlan_frame(&eth, &outer6, 0xD300, 6000, &i));
    f
}

/// Jumbo frames at path MTU 4096 (over 1500 bytes: a veth needs a larger MTU to
/// carry them).
fn jumbo() -> Frames {
    use opcode::*;
    let eth = Eth::default();
    let mut f = Frames::default();
    let sp = 0xC000;

    // Jumbo frames at path MTU 4096: qp 0xB00.
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &RoceMsg::new(RC_WRITE_FIRST, 0xB00, 0)
            .with_reth(0, 1, 8292)
            .with_payload(4096),
    ));
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &with_payload(RC_WRITE_MIDDLE, 0xB00, 1, 4096),
    ));
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        sp,
        &with_payload(RC_WRITE_LAST, 0xB00, 2, 100),
    ));
    f
}

/// Frames that cannot be parsed as far as the BTH, each under its reason, and two
/// good packets.
fn malformed() -> Frames {
    let eth = Eth::default();
    let mut f = Frames::default();
    let good = roce_frame(
        &eth,
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x10, 0, 16),
    );
    f.push(good.clone());
    f.push(good[..10].to_vec()); // truncated_eth (< 14: not even a test run)
    f.push(good[..13].to_vec()); // truncated_eth
    f.push(good[..14 + 20 + 8 + 6].to_vec()); // truncated_bth
    let tagged = roce_frame(
        &Eth::default().with_vlan(VlanTag::dot1q(1)),
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x10, 1, 16),
    );
    f.push(tagged[..16].to_vec()); // truncated_vlan
    let three = Eth::default()
        .with_vlan(VlanTag::dot1ad(1))
        .with_vlan(VlanTag::dot1q(2))
        .with_vlan(VlanTag::dot1q(3));
    f.push(roce_frame(
        &three,
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x10, 2, 16),
    )); // too_many_vlan_tags
    let mut frag = plain(TOS_DATA);
    if let L3::V4(h) = &mut frag {
        h.flags_frag = 0x0010; // offset 16 * 8
    }
    f.push(roce_frame(
        &eth,
        &frag,
        0xC000,
        &RoceMsg::send_only(0x10, 3, 16),
    )); // ipv4_fragment
    let inner = roce_frame(
        &eth,
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x11, 0, 16),
    );
    let mut no_i = vxlan_header(0x00, 5001).to_vec();
    no_i.extend_from_slice(&inner);
    f.push(udp_frame(
        &eth,
        &L3::v4(v4("10.0.0.1"), v4("10.0.0.2")),
        0xD000,
        4789,
        &no_i,
    )); // bad_vxlan_flags
    let vx = vxlan_frame(
        &eth,
        &L3::v4(v4("10.0.0.1"), v4("10.0.0.2")),
        0xD000,
        5001,
        &inner,
    );
    f.push(vx[..92 + 4].to_vec()); // truncated_inner_bth
                                   // An ACKNOWLEDGE cut inside its AETH: counts on its flow without an ACK class.
    let ack = roce_frame(
        &eth,
        &plain_back(TOS_DATA),
        0xC000,
        &RoceMsg::ack(0x20, 0, 0x1F),
    );
    f.push(ack[..14 + 20 + 8 + 12].to_vec());
    f.push(roce_frame(
        &eth,
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x10, 1, 16),
    ));
    f
}

/// `analyze PATH --json --pretty --engine ENGINE --fail-on never`: the document and
/// its text (indented, so that a difference between two texts shows by line).
fn analyze_json(path: &Path, engine: &str) -> (Value, String) {
    let out = agent(&[
        "analyze",
        path.to_str().expect("utf-8 path"),
        "--json",
        "--pretty",
        "--engine",
        engine,
        "--fail-on",
        "never",
    ]);
    assert!(
        out.status.success(),
        "analyze {engine} {}: {}",
        path.display(),
        text(&out.stderr)
    );
    let s = text(&out.stdout);
    (
        serde_json::from_str(&s).expect("analyze --json prints JSON"),
        s,
    )
}

/// Whether this process may load BPF programs (the kernel engine).
fn kernel_engine() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("kernel engine skipped: needs root (BPF)");
        return false;
    }
    true
}

fn flow_id(f: &Value) -> String {
    format!(
        "{}>{} vni {} {}>{} qp {}",
        f["src"].as_str().unwrap_or("?"),
        f["dst"].as_str().unwrap_or("?"),
        f["vni"],
        f["inner_src"].as_str().unwrap_or("-"),
        f["inner_dst"].as_str().unwrap_or("-"),
        f["dest_qp"]
    )
}

fn flows_by_id(doc: &Value) -> BTreeMap<String, Value> {
    doc["flows"]
        .as_array()
        .expect("flows array")
        .iter()
        .map(|f| (flow_id(f), f.clone()))
        .collect()
}

/// The counted fields of one flow, in a fixed order: packets, bytes, outer ECN
/// (not_ect, ect1, ect0, ce), inner ECN (or all -1 when not tunnelled), cnps, acks,
/// naks, rnr_naks.
fn counts(f: &Value) -> Vec<i64> {
    let n = |v: &Value| v.as_i64().unwrap_or(-1);
    let ecn = |e: &Value| -> Vec<i64> {
        if e.is_null() {
            vec![-1; 4]
        } else {
            ["not_ect", "ect1", "ect0", "ce"]
                .iter()
                .map(|k| n(&e[k]))
                .collect()
        }
    };
    let mut v = vec![n(&f["packets"]), n(&f["bytes"])];
    v.extend(ecn(&f["ecn"]));
    v.extend(ecn(&f["inner_ecn"]));
    for k in ["cnps", "acks", "naks", "rnr_naks"] {
        v.push(n(&f[k]));
    }
    v
}

// ---------------------------------------------------------------------------------
// tshark as the oracle

fn have_tshark() -> bool {
    let ok = tshark::available();
    if !ok {
        eprintln!("tshark comparison skipped: tshark is not installed");
    }
    ok
}

/// tshark's decode of a capture, aggregated with the flow key and counting
/// rules: RoCE by UDP destination port 4791 only (`-d udp.port==4791,infiniband`
/// also decodes source port 4791, which the aggregation ignores). `cooked_extra`:
/// the bytes a Linux cooked header holds beyond a 14-byte Ethernet header (2 for
/// LINUX_SLL, 6 for LINUX_SLL2), taken off tshark's `frame.len` of a cooked frame
/// (analyze counts a cooked frame from the Ethernet header that replaces it).
fn tshark_flows(path: &Path, cooked_extra: i64) -> BTreeMap<String, Vec<i64>> {
    let fields = [
        "frame.protocols",
        "frame.len",
        "ip.src",
        "ip.dst",
        "ip.dsfield.ecn",
        "ipv6.src",
        "ipv6.dst",
        "ipv6.tclass",
        "udp.dstport",
        "vxlan.vni",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.aeth.syndrome",
        "vxlan.flag_i",
    ];
    let rows = tshark::Fields::new(&fields)
        .decode_as("udp.port==4791,infiniband")
        .disable_protocol("tftp")
        .run(path)
        .unwrap_or_else(|e| panic!("tshark: {e:#}"));
    let mut flows: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for row in &rows {
        let col = |i: usize| row.all(i);
        let protos = row.first(0).unwrap_or("");
        if !protos.contains("infiniband") {
            continue;
        }
        let (mut ip4, mut ip6) = (0usize, 0usize);
        // Each IP layer in order: (src, dst, ecn).
        let mut layers: Vec<(String, String, i64)> = Vec::new();
        for p in protos.split(':') {
            match p {
                "ip" => {
                    let ecn = col(4).get(ip4).and_then(|v| v.parse().ok()).unwrap_or(-1);
                    layers.push((col(2)[ip4].to_string(), col(3)[ip4].to_string(), ecn));
                    ip4 += 1;
                }
                "ipv6" => {
                    let tc = col(7).get(ip6).and_then(|v| parse_num(v)).unwrap_or(-1);
                    layers.push((col(5)[ip6].to_string(), col(6)[ip6].to_string(), tc & 3));
                    ip6 += 1;
                }
                _ => {}
            }
        }
        let dports: Vec<i64> = col(8).iter().filter_map(|v| v.parse().ok()).collect();
        let vni = col(9).first().and_then(|v| v.parse::<i64>().ok());
        let tunnelled = vni.is_some();
        // RoCE by destination port: the last UDP layer's destination port.
        if dports.last() != Some(&4791) || layers.is_empty() {
            continue;
        }
        if tunnelled && (layers.len() < 2 || dports.first() != Some(&4789)) {
            continue;
        }
        // tshark decodes a VXLAN header without the I flag; the Linux VXLAN driver
        // drops it, and the classifier counts it as bad_vxlan_flags (no flow).
        if tunnelled && row.first(13) == Some("0") {
            continue;
        }
        // The classifier reads at most two VLAN tags (too_many_vlan_tags); tshark more.
        let tags = protos
            .split(':')
            .take_while(|p| *p != "ip" && *p != "ipv6")
            .filter(|p| *p == "vlan" || *p == "ieee8021ad")
            .count();
        if tags > 2 {
            continue;
        }
        let Some(opcode) = col(10).first().and_then(|v| v.parse::<i64>().ok()) else {
            continue;
        };
        let Some(qp) = col(11).first().and_then(|v| parse_num(v)) else {
            continue;
        };
        let outer = &layers[0];
        let key = if tunnelled {
            let inner = &layers[1];
            format!(
                "{}>{} vni {} {}>{} qp {qp}",
                outer.0,
                outer.1,
                vni.unwrap_or(0),
                inner.0,
                inner.1
            )
        } else {
            format!("{}>{} vni null ->- qp {qp}", outer.0, outer.1)
        };
        let e = flows.entry(key).or_insert_with(|| {
            let mut v = vec![0i64; 14];
            if !tunnelled {
                v[6..10].fill(-1);
            }
            v
        });
        e[0] += 1;
        e[1] += col(1)
            .first()
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        if protos.starts_with("sll:") {
            e[1] -= cooked_extra;
        }
        let ecn_index = |c: i64| -> usize {
            // not_ect, ect1, ect0, ce in the document's order.
            match c {
                0 => 0,
                1 => 1,
                2 => 2,
                _ => 3,
            }
        };
        e[2 + ecn_index(outer.2)] += 1;
        if tunnelled {
            e[6 + ecn_index(layers[1].2)] += 1;
        }
        if opcode == 0x80 || opcode == 0x81 {
            e[10] += 1;
        } else if opcode == 0x11 || opcode == 0xB1 {
            if let Some(s) = col(12).first().and_then(|v| parse_num(v)) {
                match s >> 5 {
                    0 => e[11] += 1,
                    3 => e[12] += 1,
                    1 => e[13] += 1,
                    _ => {}
                }
            }
        }
    }
    flows
}

fn parse_num(v: &str) -> Option<i64> {
    match v.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Asserts that analyze's flows equal tshark's decode, field by field.
fn assert_agrees_with_tshark(path: &Path, doc: &Value) {
    assert_agrees_with_tshark_cooked(path, doc, 0)
}

/// [`assert_agrees_with_tshark`] for a capture with Linux cooked frames, whose
/// header is `cooked_extra` bytes longer than an Ethernet header.
fn assert_agrees_with_tshark_cooked(path: &Path, doc: &Value, cooked_extra: i64) {
    let ours: BTreeMap<String, Vec<i64>> = flows_by_id(doc)
        .into_iter()
        .map(|(k, f)| (k.replace("\"", ""), counts(&f)))
        .collect();
    let theirs = tshark_flows(path, cooked_extra);
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{}: flow keys differ from tshark's",
        path.display()
    );
    for (k, v) in &ours {
        assert_eq!(
            v,
            &theirs[k],
            "{}: flow {k}: [packets, bytes, ecn x4, inner_ecn x4, cnps, acks, naks, rnr_naks] differ from tshark's",
            path.display()
        );
    }
}

fn real_captures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures");
    let mut v: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (shared/ must sit beside the clone)", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 8,
        "expected the 8 real captures in {}",
        dir.display()
    );
    v
}

// ---------------------------------------------------------------------------------
// Expected tables, held here

/// One expected flow: the committed capture it is in, its id (as [`flow_id`] writes
/// it), [packets, bytes (not checked: tshark checks them), outer ECN x4, inner ECN x4
/// (-1 when not tunnelled), cnps, acks, naks, rnr_naks], psn_gaps and icrc_errors.
struct WantFlow {
    file: &'static str,
    id: &'static str,
    counts: [i64; 14],
    gaps: i64,
    icrc: i64,
}

const N: i64 = -1;

/// Every flow of the scenario (the committed captures but `malformed`).
const SCENARIO_FLOWS: &[WantFlow] = &[
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 256",
        counts: [12, 0, 0, 0, 10, 2, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.2>198.18.0.1 vni null ->- qp 512",
        counts: [9, 0, 1, 0, 8, 0, N, N, N, N, 2, 2, 0, 1],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 1536",
        counts: [1, 0, 1, 0, 0, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 1537",
        counts: [1, 0, 1, 0, 0, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 1538",
        counts: [1, 0, 1, 0, 0, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 2560",
        counts: [1, 0, 0, 0, 1, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "opcodes.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 3072",
        counts: [2, 0, 0, 0, 2, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 1,
    },
    WantFlow {
        file: "vlan_psn.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 768",
        counts: [4, 0, 0, 0, 4, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "vlan_psn.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 1024",
        counts: [6, 0, 0, 0, 6, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 1,
        icrc: 0,
    },
    WantFlow {
        file: "vlan_psn.pcap",
        id: "198.18.0.2>198.18.0.1 vni null ->- qp 1025",
        counts: [1, 0, 0, 0, 1, 0, N, N, N, N, 0, 0, 1, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "fd00::1>fd00::2 vni null ->- qp 1792",
        counts: [3, 0, 0, 0, 2, 1, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "10.0.0.1>10.0.0.2 vni 5001 198.19.0.1>198.19.0.2 qp 2048",
        counts: [3, 0, 0, 0, 2, 1, 0, 0, 3, 0, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "10.0.0.1>10.0.0.2 vni 5002 198.19.0.1>198.19.0.2 qp 2048",
        counts: [2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "10.0.0.2>10.0.0.1 vni 5001 198.19.0.2>198.19.0.1 qp 2049",
        counts: [1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "fd00::a>fd00::b vni 6000 198.19.1.1>198.19.1.2 qp 2304",
        counts: [2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "ipv6_vxlan.pcap",
        id: "fd00::a>fd00::b vni 6000 fd01::1>fd01::2 qp 2305",
        counts: [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "jumbo.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 2816",
        counts: [3, 0, 0, 0, 3, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
];

/// The flows of `malformed()`: the good sends and the ACK cut inside its AETH
/// (counted on its flow, without an ACK class).
const MALFORMED_FLOWS: &[WantFlow] = &[
    WantFlow {
        file: "malformed.pcap",
        id: "198.18.0.1>198.18.0.2 vni null ->- qp 16",
        counts: [2, 0, 0, 0, 2, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
    WantFlow {
        file: "malformed.pcap",
        id: "198.18.0.2>198.18.0.1 vni null ->- qp 32",
        counts: [1, 0, 0, 0, 1, 0, N, N, N, N, 0, 0, 0, 0],
        gaps: 0,
        icrc: 0,
    },
];

/// Asserts one flow of an analyze document against its expected row.
fn check_flow(f: &Value, w: &WantFlow) {
    let id = w.id;
    let c = counts(f);
    assert_eq!(c[0], w.counts[0], "{id}: packets");
    assert_eq!(
        &c[2..],
        &w.counts[2..],
        "{id}: [ecn x4, inner_ecn x4, cnps, acks, naks, rnr_naks]"
    );
    assert_eq!(f["psn_gaps"], w.gaps, "{id}: psn_gaps");
    assert_eq!(f["icrc_errors"], w.icrc, "{id}: icrc_errors");
    assert!(
        f["ifname"].is_null() && f["direction"].is_null(),
        "{id}: analyze has no interface or direction"
    );
}

// ---------------------------------------------------------------------------------
// The committed captures (tests/captures/)

/// The command that rewrites the committed captures and their expected JSON.
const REGENERATE: &str = "cargo test -p roce-agent --test analyze -- --ignored write_test_captures";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate sits in the workspace")
        .to_path_buf()
}

/// tests/captures/, relative to the workspace root (as the expected JSON names files).
const CAPTURES: &str = "tests/captures";

/// The committed captures: file name and the frames the generator writes into it.
fn committed_captures() -> Vec<(&'static str, Frames)> {
    vec![
        ("opcodes.pcap", opcodes()),
        ("vlan_psn.pcap", vlan_psn()),
        ("ipv6_vxlan.pcap", ipv6_vxlan()),
        ("jumbo.pcap", jumbo()),
        ("malformed.pcap", malformed()),
        ("vlan_psn_ng.pcapng", vlan_psn()),
    ]
}

/// `opcodes.pcap` -> `opcodes.expected.json`.
fn expected_name(capture: &str) -> String {
    let stem = capture.rsplit_once('.').map_or(capture, |(s, _)| s);
    format!("{stem}.expected.json")
}

impl Frames {
    fn write(&self, path: &Path) {
        if path.extension().is_some_and(|e| e == "pcapng") {
            self.write_pcapng(path)
        } else {
            self.write_pcap(path)
        }
    }
}

/// `roce-agent analyze tests/captures/NAME --json --pretty --engine ENGINE --fail-on
/// never`, run from the workspace root as the issue writes it: the JSON text (the
/// expected files are indented, to be read and diffed).
fn analyze_committed(name: &str, engine: &str) -> String {
    let rel = format!("{CAPTURES}/{name}");
    let out = Command::new(BIN)
        .args(["analyze", &rel, "--json", "--pretty", "--engine", engine])
        .args(["--fail-on", "never"])
        .current_dir(workspace_root())
        .env_remove("RUST_LOG")
        .output()
        .expect("run roce-agent");
    assert!(
        out.status.success(),
        "roce-agent analyze {rel} --json --pretty --engine {engine}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The first lines where two texts differ, for a failure message.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let at = w
        .iter()
        .zip(&g)
        .position(|(a, b)| a != b)
        .unwrap_or(w.len().min(g.len()));
    let from = at.saturating_sub(5);
    format!(
        "first difference at line {}:\nexpected:\n{}\ngot:\n{}",
        at + 1,
        w[from.min(w.len())..(at + 3).min(w.len())].join("\n"),
        g[from.min(g.len())..(at + 3).min(g.len())].join("\n")
    )
}

/// Writes the committed captures and their expected JSON (the reference engine's
/// `analyze --json`, run from the workspace root). Not run by default: run it after
/// changing the generator, then review the diff of tests/captures/ (the tests below
/// check the new files against the tables held here and against tshark):
/// `cargo test -p roce-agent --test analyze -- --ignored write_test_captures`.
#[test]
#[ignore]
fn write_test_captures() {
    let dir = workspace_root().join(CAPTURES);
    fs::create_dir_all(&dir).expect("create tests/captures");
    for (name, frames) in committed_captures() {
        frames.write(&dir.join(name));
        let json = analyze_committed(name, "reference");
        fs::write(dir.join(expected_name(name)), json).expect("write the expected JSON");
        eprintln!("wrote {CAPTURES}/{name} and {}", expected_name(name));
    }
}

#[test]
fn committed_captures_are_what_the_generator_writes() {
    let s = Scratch::new();
    for (name, frames) in committed_captures() {
        let fresh = s.path(name);
        frames.write(&fresh);
        let committed = workspace_root().join(CAPTURES).join(name);
        let want = fs::read(&committed).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write it with `{REGENERATE}`)",
                committed.display()
            )
        });
        assert!(
            fs::read(&fresh).expect("read the fresh capture") == want,
            "{CAPTURES}/{name} is not what the generator writes now: regenerate with \
             `{REGENERATE}` and review the diff"
        );
    }
}

/// Whether `got` holds everything `want` holds, with equal values: objects may have
/// more keys (listed in `added`), arrays and scalars must match. Err: where they differ.
fn json_contains(
    got: &Value,
    want: &Value,
    at: &str,
    added: &mut Vec<String>,
) -> Result<(), String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let path = format!("{at}.{k}");
                let gv = g.get(k).ok_or_else(|| format!("{path} (missing)"))?;
                json_contains(gv, wv, &path, added)?;
            }
            added.extend(
                g.keys()
                    .filter(|k| !w.contains_key(*k))
                    .map(|k| format!("{at}.{k}")),
            );
            Ok(())
        }
        (Value::Array(g), Value::Array(w)) => {
            if g.len() != w.len() {
                return Err(format!("{at} ({} elements, expected {})", g.len(), w.len()));
            }
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                json_contains(gv, wv, &format!("{at}[{i}]"), added)?;
            }
            Ok(())
        }
        _ if got == want => Ok(()),
        _ => Err(format!("{at}: {got} (expected {want})")),
    }
}

#[test]
fn committed_captures_give_the_expected_json_with_both_engines() {
    let mut engines = vec!["reference"];
    if kernel_engine() {
        engines.push("kernel");
    }
    for (name, _) in committed_captures() {
        let path = workspace_root().join(CAPTURES).join(expected_name(name));
        let want = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (write it with `{REGENERATE}`)", path.display()));
        let want_doc: Value =
            serde_json::from_str(&want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for engine in &engines {
            let got = analyze_committed(name, engine);
            if got == want {
                continue;
            }
            // The document's contract: later fields may be added, but no name may change meaning.
            // Every expected field must be there with its value; an added field is
            // allowed and reported (regenerate to take it into the expected file).
            let got_doc: Value = serde_json::from_str(&got).expect("analyze --json prints JSON");
            let mut added = Vec::new();
            if let Err(at) = json_contains(&got_doc, &want_doc, "", &mut added) {
                panic!(
                    "roce-agent analyze {CAPTURES}/{name} --json --engine {engine} differs from \
                     {CAPTURES}/{} at {at}: {}",
                    expected_name(name),
                    first_difference(&want, &got)
                );
            }
            eprintln!(
                "{CAPTURES}/{name} ({engine}): fields added since {} was written: {} \
                 (regenerate with `{REGENERATE}`)",
                expected_name(name),
                added.join(", ")
            );
        }
    }
}

#[test]
fn committed_captures_give_the_tables_held_here() {
    for (name, _) in committed_captures() {
        let doc: Value = serde_json::from_str(&analyze_committed(name, "reference"))
            .expect("analyze --json prints JSON");
        let flows = flows_by_id(&doc);
        let file = name.replace("_ng.pcapng", ".pcap");
        let want: Vec<&WantFlow> = SCENARIO_FLOWS
            .iter()
            .chain(MALFORMED_FLOWS)
            .filter(|w| w.file == file)
            .collect();
        assert_eq!(
            flows.keys().collect::<Vec<_>>(),
            {
                let mut ids: Vec<&str> = want.iter().map(|w| w.id).collect();
                ids.sort_unstable();
                ids
            },
            "{name}: flows"
        );
        for w in want {
            check_flow(&flows[w.id], w);
        }
        assert_eq!(doc["capture"]["complete"], true, "{name}");
        assert_eq!(doc["capture"]["file"], format!("{CAPTURES}/{name}"));
    }
}

#[test]
fn committed_captures_agree_with_tshark() {
    if !have_tshark() {
        return;
    }
    for (name, _) in committed_captures() {
        let doc: Value = serde_json::from_str(&analyze_committed(name, "reference"))
            .expect("analyze --json prints JSON");
        assert_agrees_with_tshark(&workspace_root().join(CAPTURES).join(name), &doc);
    }
}

// ---------------------------------------------------------------------------------
// Tests

#[test]
fn scenario_capture_gives_the_expected_table() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    let flows = flows_by_id(&doc);
    let get = |id: &str| -> &Value {
        flows
            .get(id)
            .unwrap_or_else(|| panic!("no flow {id}; flows: {:?}", flows.keys()))
    };
    for w in SCENARIO_FLOWS {
        check_flow(get(w.id), w);
    }
    assert_eq!(flows.len(), SCENARIO_FLOWS.len(), "{:?}", flows.keys());
    // Bytes are frame lengths: a CNP over IPv4 is 74 bytes.
    let cnps_vx = get("10.0.0.2>10.0.0.1 vni 5001 198.19.0.2>198.19.0.1 qp 2049");
    assert_eq!(cnps_vx["bytes"], 74 + 50);
    let c = &doc["counters"];
    assert_eq!(
        (c["roce"].as_u64(), c["roce_in_vxlan"].as_u64()),
        (Some(44), Some(9))
    );
    assert_eq!(
        (
            c["other_ip"].as_u64(),
            c["other_udp"].as_u64(),
            c["non_ip"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(c["flows_created"], 17);
    // Capture timestamps, not the kernel's clock.
    let f = get("198.18.0.1>198.18.0.2 vni null ->- qp 256");
    assert_eq!(f["first_seen_ns"].as_u64(), Some(T0_NS));
    assert_eq!(f["last_seen_ns"].as_u64(), Some(T0_NS + 11_000));
    assert_eq!(doc["capture"]["frames"], 57);
    assert_eq!(doc["capture"]["icrc_checked"], 53);
    // Findings an operator needs.
    let checks: Vec<&str> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["check"].as_str().unwrap_or(""))
        .collect();
    for want in [
        "psn_gaps",
        "naks",
        "icrc_errors",
        "roce_outside_lossless_dscp",
        "cnp_wrong_class",
        "non_roce_on_lossless_dscp",
        "ce_marked",
    ] {
        assert!(checks.contains(&want), "missing finding {want}: {checks:?}");
    }
    let find = |name: &str| {
        doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == name)
            .cloned()
            .unwrap()
    };
    let off = find("roce_outside_lossless_dscp");
    assert_eq!(off["flows"], 3, "{off}"); // the DSCP 0 RC, UC and UD flows
    assert!(off["interface"].is_null());
    let cnp = find("cnp_wrong_class");
    let found = cnp["found"].as_str().unwrap();
    assert!(
        found.starts_with("1 of 2 CNPs 198.18.0.2→198.18.0.1 in the capture (")
            && found.ends_with(") on DSCP 26 (priority 3)"),
        "{cnp}"
    );
    // Priority 3 is not the CNP DSCP's 6: another queue.
    assert_eq!(
        (&cnp["severity"], &cnp["flows"]),
        (&"error".into(), &1.into())
    );
    let other = find("non_roce_on_lossless_dscp");
    assert!(
        other["found"]
            .as_str()
            .unwrap()
            .starts_with("2 non-RoCE frames"),
        "{other}"
    );
    assert!(
        other["found"]
            .as_str()
            .unwrap()
            .contains("198.18.0.1→198.18.0.2 TCP (2 frames)"),
        "{other}"
    );
    let gaps = find("psn_gaps");
    assert_eq!(gaps["severity"], "error");
    assert_eq!(gaps["flows"], 1);
}

#[test]
fn scenario_capture_agrees_with_tshark() {
    if !have_tshark() {
        return;
    }
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    assert_agrees_with_tshark(&p, &doc);
}

#[test]
fn malformed_frames_count_under_their_reason_and_make_no_flow() {
    let s = Scratch::new();
    let p = s.path("malformed.pcap");
    malformed().write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    let pe = &doc["counters"]["parse_errors"];
    for (reason, n) in [
        ("truncated_eth", 2),
        ("truncated_bth", 1),
        ("truncated_vlan", 1),
        ("too_many_vlan_tags", 1),
        ("ipv4_fragment", 1),
        ("bad_vxlan_flags", 1),
        ("truncated_inner_bth", 1),
        ("truncated_ext_header", 1),
    ] {
        assert_eq!(pe[reason], n, "{reason}: {pe}");
    }
    let total: u64 = pe
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(total, 9, "{pe}");
    // Two flows only: the good sends (qp 0x10) and the cut ACK (counted, no ACK class).
    let flows = flows_by_id(&doc);
    assert_eq!(flows.len(), 2, "{:?}", flows.keys());
    let sends = &flows["198.18.0.1>198.18.0.2 vni null ->- qp 16"];
    assert_eq!(
        (sends["packets"].as_u64(), sends["psn_gaps"].as_u64()),
        (Some(2), Some(0))
    );
    let ack = &flows["198.18.0.2>198.18.0.1 vni null ->- qp 32"];
    assert_eq!(
        (ack["packets"].as_u64(), ack["acks"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(doc["counters"]["roce"], 3);
    // The cut ACK has no ICRC to check.
    assert_eq!(doc["capture"]["icrc_checked"], 2);
    assert!(doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["check"] == "parse_errors"));
}

#[test]
fn both_engines_print_byte_identical_json() {
    if !kernel_engine() {
        return;
    }
    let s = Scratch::new();
    let mut files = vec![
        s.path("scenario.pcap"),
        s.path("malformed.pcap"),
        s.path("scenario.pcapng"),
    ];
    scenario().write_pcap(&files[0]);
    malformed().write_pcap(&files[1]);
    scenario().write_pcapng(&files[2]);
    files.extend(real_captures());
    for p in &files {
        let (_, k) = analyze_json(p, "kernel");
        let (_, r) = analyze_json(p, "reference");
        if k != r {
            let (kl, rl): (Vec<&str>, Vec<&str>) = (k.lines().collect(), r.lines().collect());
            let at = kl
                .iter()
                .zip(&rl)
                .position(|(a, b)| a != b)
                .unwrap_or(kl.len().min(rl.len()));
            let from = at.saturating_sub(30);
            panic!(
                "{}: kernel and reference engines differ at line {at}:\nkernel:\n{}\nreference:\n{}",
                p.display(),
                kl[from..(at + 3).min(kl.len())].join("\n"),
                rl[from..(at + 3).min(rl.len())].join("\n")
            );
        }
    }
}

#[test]
fn default_engine_is_the_reference_and_kernel_stays_available() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let out = agent(&["analyze", p.to_str().unwrap(), "--fail-on", "never"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = text(&out.stdout).lines().next().unwrap_or("").to_string();
    assert!(first.ends_with("engine reference"), "{first}");
    if !kernel_engine() {
        return;
    }
    let out = agent(&[
        "analyze",
        p.to_str().unwrap(),
        "--engine",
        "kernel",
        "--fail-on",
        "never",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = text(&out.stdout).lines().next().unwrap_or("").to_string();
    assert!(first.ends_with("engine kernel"), "{first}");
}

/// `analyze --json --engine ENGINE --workers N` of `path`, as printed.
fn analyze_workers(path: &Path, engine: &str, workers: usize) -> String {
    let n = workers.to_string();
    let out = agent(&[
        "analyze",
        path.to_str().expect("utf-8 path"),
        "--json",
        "--engine",
        engine,
        "--workers",
        &n,
    ]);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "analyze {engine} --workers {workers} {}: {}",
        path.display(),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Many flows and talkers at once, interleaved: 600 queue pairs plain, in VXLAN and
/// over IPv6, with PSN gaps, retransmissions and READs (whose PSN use teaches the
/// path MTU), CE marks, CNPs, NAKs, jumbo frames, bad ICRCs, frames cut by a snap
/// length, and non-RoCE traffic from 300 talkers on the lossless DSCP.
fn many_flows() -> Frames {
    let eth = Eth::default();
    let underlay = L3::v4(v4("10.9.0.1"), v4("10.9.0.2")).with_tos(TOS_DATA);
    let mut f = Frames::default();
    let mut psn = vec![0u32; 600];
    for i in 0..12_000usize {
        let qp = (i * 7919) % 600;
        let tos = if i % 37 == 0 { TOS_CE } else { TOS_DATA };
        let l3 = if qp % 5 == 4 {
            L3::v6(
                v6("2001:db8::1"),
                format!("2001:db8::{:x}", 0x100 + qp).parse().expect("IPv6"),
            )
            .with_tos(tos)
        } else {
            L3::v4(
                v4("198.18.4.1"),
                Ipv4Addr::new(198, 18, 5, (qp % 200) as u8),
            )
            .with_tos(tos)
        };
        let msg = match i % 13 {
            0 => RoceMsg::ack(qp as u32, psn[qp], if i % 91 == 0 { 0x61 } else { 0x1F }),
            1 => cnp(qp as u32),
            2 => {
                // A READ of 3000 bytes: 3 PSNs at path MTU 1024.
                let m = RoceMsg::read_request(qp as u32, psn[qp], 3000);
                psn[qp] = (psn[qp] + 3) & 0xFF_FFFF;
                m
            }
            3 if i % 3 == 0 => {
                // A gap of 2 PSNs.
                psn[qp] = (psn[qp] + 3) & 0xFF_FFFF;
                RoceMsg::send_only(qp as u32, psn[qp], 64)
            }
            4 => RoceMsg::send_only(qp as u32, psn[qp].saturating_sub(1), 64),
            _ => {
                psn[qp] = (psn[qp] + 1) & 0xFF_FFFF;
                RoceMsg::send_only(qp as u32, psn[qp], 64 + (i % 9) * 500)
            }
        };
        let mut frame = roce_frame(&eth, &l3, 0xC000 + (i % 7) as u16, &msg);
        if i % 211 == 0 {
            let n = frame.len();
            frame[n - 1] ^= 0xFF; // a bad ICRC
        }
        if qp % 3 == 0 {
            frame = vxlan_frame(&eth, &underlay, 0xD000, 7000 + (qp as u32 % 4), &frame);
        }
        if i % 997 == 0 {
            frame.truncate(frame.len().min(80)); // a snap length
        }
        f.push(frame);
        if i % 4 == 0 {
            let talker = L3::v4(
                Ipv4Addr::new(10, 1, (i % 300 / 100) as u8, (i % 100) as u8),
                v4("10.2.0.1"),
            )
            .with_tos(TOS_DATA);
            f.push(udp_frame(&eth, &talker, 5000, 53, &[0u8; 32]));
        }
    }
    f
}

#[test]
fn any_number_of_workers_prints_the_same_report() {
    let s = Scratch::new();
    let mut files = vec![
        s.path("many.pcap"),
        s.path("many.pcapng"),
        s.path("scenario.pcap"),
        s.path("malformed.pcap"),
    ];
    many_flows().write_pcap(&files[0]);
    many_flows().write_pcapng(&files[1]);
    scenario().write_pcap(&files[2]);
    malformed().write_pcap(&files[3]);
    // A file cut inside its last record: the frames before it, from every worker.
    let cut = s.path("many-cut.pcap");
    let bytes = fs::read(&files[0]).expect("read");
    fs::write(&cut, &bytes[..bytes.len() - 30]).expect("write");
    files.push(cut);
    let generated = files.len();
    files.extend(real_captures());
    // The generated capture has what depends on order within a flow, and more.
    let (doc, _) = analyze_json(&files[0], "reference");
    let sum = |field: &str| -> u64 {
        doc["flows"]
            .as_array()
            .map_or(0, |v| v.iter().filter_map(|f| f[field].as_u64()).sum())
    };
    assert_eq!(doc["flows"].as_array().map(Vec::len), Some(600));
    for field in ["psn_gaps", "naks", "cnps", "icrc_errors"] {
        assert!(sum(field) > 0, "no {field} in the generated capture");
    }
    assert!(doc["findings"]
        .as_array()
        .is_some_and(|v| v.iter().any(|f| f["check"] == "non_roce_on_lossless_dscp")));
    let kernel = kernel_engine();
    for (i, p) in files.iter().enumerate() {
        let one = analyze_workers(p, "reference", 1);
        assert!(one.contains("\"flows\""), "{}: {one}", p.display());
        for n in [2, 3, 7] {
            let got = analyze_workers(p, "reference", n);
            assert!(
                got == one,
                "{}: --workers {n} differs from 1 at: {}",
                p.display(),
                first_difference(&one, &got)
            );
        }
        // The kernel engine loads its programs for each run: the generated files only.
        if kernel && i < generated {
            for n in [1, 3] {
                let got = analyze_workers(p, "kernel", n);
                assert!(
                    got == one,
                    "{}: the kernel engine with --workers {n} differs at: {}",
                    p.display(),
                    first_difference(&one, &got)
                );
            }
        }
    }
}

#[test]
fn the_first_talkers_are_kept_whatever_the_workers() {
    // More distinct non-RoCE talkers on the lossless DSCP than the finding keeps: one
    // pass keeps the first 100,000; a talker first seen after them is not listed,
    // however many frames it sends.
    let eth = Eth::default();
    let mut f = Frames::default();
    let talker = |i: u32| {
        let [_, a, b, c] = i.to_be_bytes();
        L3::v4(Ipv4Addr::new(10, a, b, c), v4("10.255.0.1")).with_tos(TOS_DATA)
    };
    for i in 0..100_000 {
        f.push(udp_frame(&eth, &talker(i), 5000, 53, &[]));
    }
    for _ in 0..5 {
        f.push(udp_frame(&eth, &talker(100_000), 5000, 53, &[]));
    }
    for _ in 0..3 {
        f.push(udp_frame(&eth, &talker(77), 5000, 53, &[]));
    }
    let s = Scratch::new();
    let p = s.path("talkers.pcap");
    f.write_pcap(&p);
    let one = analyze_workers(&p, "reference", 1);
    let doc: Value = serde_json::from_str(&one).expect("JSON");
    let finding = doc["findings"]
        .as_array()
        .and_then(|v| v.iter().find(|f| f["check"] == "non_roce_on_lossless_dscp"))
        .and_then(|f| f["found"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        finding.contains("10.0.0.77→10.255.0.1 UDP (4 frames)"),
        "{finding}"
    );
    assert!(!finding.contains("10.1.134.160"), "{finding}");
    for n in [2, 4] {
        let got = analyze_workers(&p, "reference", n);
        assert!(
            got == one,
            "--workers {n} differs from 1 at: {}",
            first_difference(&one, &got)
        );
    }
}

#[test]
fn pcapng_gives_the_same_flows_as_pcap() {
    let s = Scratch::new();
    let (a, b) = (s.path("scenario.pcap"), s.path("scenario.pcapng"));
    scenario().write_pcap(&a);
    scenario().write_pcapng(&b);
    let (da, _) = analyze_json(&a, "reference");
    let (db, _) = analyze_json(&b, "reference");
    assert_eq!(da["flows"], db["flows"]);
    assert_eq!(da["counters"], db["counters"]);
    assert_eq!(da["findings"], db["findings"]);
    assert_eq!(db["capture"]["format"], "pcapng");
    assert_eq!(db["capture"]["first_ns"].as_u64(), Some(T0_NS));
}

#[test]
fn human_output_is_a_table_sorted_by_ce_ratio_with_findings() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    // The scenario holds a PSN gap (an error): exit 1, the findings in the output
    // and no second message.
    let out = agent(&["analyze", p.to_str().unwrap(), "--engine", "reference"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    let t = text(&out.stdout);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("57 frames (pcap, "), "{t}");
    assert!(
        lines[1].starts_with("iface") && lines[1].contains("CE%") && lines[1].contains("gaps"),
        "{t}"
    );
    // Highest CE ratio first: the VXLAN flow on VNI 5001 (1 of 3) and IPv6 (1 of 3),
    // the bigger one first, then qp 0x100 (2 of 12).
    assert!(
        lines[2].contains("10.0.0.1→10.0.0.2") && lines[2].contains("33.3"),
        "{t}"
    );
    assert!(
        lines[3].contains("fd00::1→fd00::2") && lines[3].contains("33.3"),
        "{t}"
    );
    assert!(
        lines[4].contains("198.18.0.1→198.18.0.2") && lines[4].contains("16.7"),
        "{t}"
    );
    assert!(t.contains("ICRC: 53 RoCE frames checked, 1 bad"), "{t}");
    assert!(
        t.contains("findings:\n  ERROR psn_gaps: 1 PSN gaps on 1 flows"),
        "{t}"
    );
    assert!(t.contains("WARN  non_roce_on_lossless_dscp"), "{t}");
}

#[test]
fn real_captures_agree_with_tshark_and_show_no_psn_gap() {
    let tshark = have_tshark();
    for p in real_captures() {
        let (doc, _) = analyze_json(&p, "reference");
        let flows = flows_by_id(&doc);
        assert!(!flows.is_empty(), "{}: no flows", p.display());
        for (id, f) in &flows {
            assert_eq!(
                f["psn_gaps"],
                0,
                "{}: {id}: READs and retransmissions are no gap",
                p.display()
            );
            assert_eq!(
                f["icrc_errors"],
                0,
                "{}: {id}: real ICRCs are valid",
                p.display()
            );
        }
        let roce = doc["counters"]["roce"].as_u64().unwrap_or(0);
        assert_eq!(
            doc["capture"]["icrc_checked"].as_u64(),
            Some(roce),
            "{}",
            p.display()
        );
        let checks: Vec<&str> = doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["check"].as_str())
            .collect();
        assert!(
            checks.contains(&"roce_outside_lossless_dscp") && checks.contains(&"roce_not_ect"),
            "{}: DSCP 0 / Not-ECT must be reported: {checks:?}",
            p.display()
        );
        assert!(!checks.contains(&"psn_gaps"), "{}", p.display());
        if tshark {
            assert_agrees_with_tshark(&p, &doc);
        }
    }
}

#[test]
fn real_read_capture_learns_path_mtu_1024() {
    let p = real_captures()
        .into_iter()
        .find(|p| p.ends_with("rxe-read.pcap"))
        .expect("rxe-read.pcap");
    let (doc, _) = analyze_json(&p, "reference");
    let flows = flows_by_id(&doc);
    // 5 READ requests of 3000 bytes (3 PSNs each) and their 15 responses.
    let reqs: Vec<&Value> = flows.values().filter(|f| f["packets"] == 5).collect();
    assert_eq!(reqs.len(), 1, "{flows:?}");
    assert_eq!(reqs[0]["psn_gaps"], 0);
    assert!(flows.values().any(|f| f["packets"] == 15));
}

#[test]
fn truncated_file_reports_the_frame_and_still_prints_the_flows() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let bytes = fs::read(&p).unwrap();
    // Cut in the middle of the last record's data.
    let cut = s.path("cut.pcap");
    fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let out = agent(&[
        "analyze",
        cut.to_str().unwrap(),
        "--json",
        "--engine",
        "reference",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("frame 57") && err.contains("truncated or corrupt"),
        "{err}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON despite the error");
    assert_eq!(doc["capture"]["frames"], 56);
    assert_eq!(doc["capture"]["complete"], false);
    assert_eq!(flows_by_id(&doc).len(), 17);
    // Human output too.
    let out = agent(&["analyze", cut.to_str().unwrap(), "--engine", "reference"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("capture_incomplete"),
        "{}",
        text(&out.stdout)
    );
    // A corrupt record header (captured length > snap length) inside the file.
    let mut bad = bytes.clone();
    let rec1 = 24; // the first record header
    bad[rec1 + 8..rec1 + 12].copy_from_slice(&0x7FFF_FFF0u32.to_le_bytes());
    let badp = s.path("bad.pcap");
    fs::write(&badp, &bad).unwrap();
    let out = agent(&["analyze", badp.to_str().unwrap(), "--engine", "reference"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("frame 1"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("no RoCE flows seen"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn unsupported_link_types_and_non_capture_files_are_refused_clearly() {
    let s = Scratch::new();
    let p = s.path("radiotap.pcap");
    let header = PcapHeader {
        datalink: DataLink::IEEE802_11_RADIOTAP,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(fs::File::create(&p).unwrap(), header).unwrap();
    w.write_packet(&PcapPacket::new(Duration::ZERO, 20, &[0u8; 20]))
        .unwrap();
    drop(w);
    let out = agent(&["analyze", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "link type 127 (IEEE802_11_RADIOTAP) is not supported: roce-agent reads \
             Ethernet (1) and Linux cooked captures (113, 276)"
        ),
        "{err}"
    );
    assert!(
        !err.contains("truncated") && !err.contains("incomplete"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // A number pcap-file has no name for.
    let p = s.path("odd.pcap");
    let header = PcapHeader {
        datalink: DataLink::from(4242),
        ..Default::default()
    };
    drop(PcapWriter::with_header(fs::File::create(&p).unwrap(), header).unwrap());
    let out = agent(&["analyze", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("link type 4242 is not supported"),
        "{}",
        text(&out.stderr)
    );

    let junk = s.path("junk.pcap");
    fs::write(&junk, b"this is not a capture file at all").unwrap();
    let out = agent(&["analyze", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a pcap or pcapng file"),
        "{}",
        text(&out.stderr)
    );

    let out = agent(&["analyze", s.path("missing.pcap").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot open the capture"),
        "{}",
        text(&out.stderr)
    );
}

/// The kernel engine with a flow table smaller than the capture's 17 flows: the flows
/// that found no slot are in a `flow_table_full` finding, not silently missing.
#[test]
fn a_kernel_flow_table_too_small_for_the_capture_is_a_finding() {
    if !kernel_engine() {
        return;
    }
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let cfg = s.path("small.toml");
    fs::write(&cfg, "flows_map_size = 4\n").unwrap();
    let args = [
        "analyze",
        p.to_str().unwrap(),
        "--json",
        "--engine",
        "kernel",
        "--workers",
        "1",
        "--config",
        cfg.to_str().unwrap(),
        "--fail-on",
        "never",
    ];
    let out = agent(&args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["flows"].as_array().unwrap().len(), 4);
    assert_eq!(doc["counters"]["flows_created"], 4);
    let failed = doc["counters"]["flow_insert_failed"].as_u64().unwrap();
    assert!(failed > 0);
    let full = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "flow_table_full")
        .cloned()
        .expect("a flow_table_full finding");
    assert!(
        full["found"]
            .as_str()
            .unwrap()
            .starts_with(&format!("the flow table holds 4 flows: {failed} packets")),
        "{full}"
    );
}

#[test]
fn config_and_policy_flags_apply() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    // `analyze --json --engine reference` of the scenario with `extra` arguments.
    let analyze = |extra: &[&str]| -> Value {
        let mut args = vec![
            "analyze",
            p.to_str().unwrap(),
            "--json",
            "--engine",
            "reference",
            "--fail-on",
            "never",
        ];
        args.extend_from_slice(extra);
        let out = agent(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let finding = |doc: &Value, check: &str| -> Option<Value> {
        doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .cloned()
    };
    // RoCE on port 4792 only: nothing on 4791 is RoCE any more.
    let cfg = s.path("c.toml");
    fs::write(&cfg, "roce_port = 4792\n").unwrap();
    let doc = analyze(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(doc["flows"].as_array().unwrap().len(), 0);
    // DSCP 0 and 26 lossless, CNPs expected on 26: the DSCP findings change.
    let doc = analyze(&["--lossless-dscp", "0,26", "--cnp-dscp", "26"]);
    assert_eq!(finding(&doc, "roce_outside_lossless_dscp"), None);
    let cnp = finding(&doc, "cnp_wrong_class").unwrap();
    assert!(
        cnp["found"]
            .as_str()
            .unwrap()
            .contains("on DSCP 48 (priority 6)"),
        "{cnp}"
    );
    // The same policy from the config's [qos] table gives the same findings; a flag
    // still overrides the file.
    let qos = s.path("qos.toml");
    fs::write(
        &qos,
        "[qos]\nlossless_dscps = [0, 26]\ncnp_dscp = 26\nremark_dscp = 8\n",
    )
    .unwrap();
    let from_file = analyze(&["--config", qos.to_str().unwrap()]);
    // All but the advice on other traffic: the file's remark DSCP 8 is outside the
    // lossless set, the flags' default 0 is in it (no remarking can help there).
    let advice = |d: &Value| finding(d, "non_roce_on_lossless_dscp").unwrap()["fix"].clone();
    assert!(advice(&from_file)
        .as_str()
        .unwrap()
        .starts_with("remark other traffic to DSCP 8 "));
    assert!(advice(&doc)
        .as_str()
        .unwrap()
        .contains("remark DSCP 0 is itself lossless"));
    let without_advice = |d: &Value| {
        let mut f = d["findings"].clone();
        for x in f.as_array_mut().unwrap() {
            if x["check"] == "non_roce_on_lossless_dscp" {
                x["fix"] = Value::Null;
            }
        }
        f
    };
    assert_eq!(without_advice(&from_file), without_advice(&doc));
    let overridden = analyze(&["--config", qos.to_str().unwrap(), "--cnp-dscp", "48"]);
    let cnp = finding(&overridden, "cnp_wrong_class").unwrap();
    assert!(
        cnp["expected"].as_str().unwrap().contains("DSCP 48")
            && cnp["found"].as_str().unwrap().contains("on DSCP 26"),
        "{cnp}"
    );
    // A bad DSCP is a usage error.
    let out = agent(&["analyze", p.to_str().unwrap(), "--lossless-dscp", "64"]);
    assert_eq!(out.status.code(), Some(2));
}

/// scapy's contrib.roce computes the ICRC the way soft-RoCE does: frames built by
/// scapy must pass our check, and a flipped byte must not.
#[test]
fn icrc_check_agrees_with_scapy() {
    let probe = Command::new("python3")
        .args(["-c", "import scapy.contrib.roce"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("scapy comparison skipped: scapy is not installed (pip install scapy)");
        return;
    }
    let s = Scratch::new();
    let p = s.path("scapy.pcap");
    let script = r#"
import sys
from scapy.all import Ether, IP, IPv6, UDP, Raw, wrpcap
from scapy.contrib.roce import BTH, AETH, opcode
frames = []
for i in range(8):
    pl = bytes(range(i * 8, i * 8 + 16))
    frames.append(Ether()/IP(src="10.9.0.1", dst="10.9.0.2", tos=106, ttl=17 + i)/UDP(sport=0xC000 + i, dport=4791, chksum=0)/BTH(opcode=opcode('RC', 'SEND_ONLY')[0], dqpn=0x55, psn=i, becn=i % 2)/Raw(pl))
for i in range(4):
    frames.append(Ether()/IPv6(src="fd09::1", dst="fd09::2", tc=106, fl=i)/UDP(sport=0xC100, dport=4791)/BTH(opcode=opcode('RC', 'ACKNOWLEDGE')[0], dqpn=0x66, psn=i)/AETH(syndrome=0x1f, msn=i))
bad = Ether(bytes(frames[0]))
raw = bytearray(bytes(bad))
raw[-5] ^= 0x01   # a payload byte: the ICRC no longer matches
frames.append(Ether(bytes(raw)))
wrpcap(sys.argv[1], frames)
"#;
    let out = Command::new("python3")
        .args(["-c", script, p.to_str().unwrap()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "scapy: {}", text(&out.stderr));
    let (doc, _) = analyze_json(&p, "reference");
    assert_eq!(doc["capture"]["icrc_checked"], 13, "{doc}");
    let flows = flows_by_id(&doc);
    let v4 = &flows["10.9.0.1>10.9.0.2 vni null ->- qp 85"];
    assert_eq!(
        (v4["packets"].as_u64(), v4["icrc_errors"].as_u64()),
        (Some(9), Some(1))
    );
    let v6 = &flows["fd09::1>fd09::2 vni null ->- qp 102"];
    assert_eq!(
        (
            v6["packets"].as_u64(),
            v6["icrc_errors"].as_u64(),
            v6["acks"].as_u64()
        ),
        (Some(4), Some(0), Some(4))
    );
}

/// Writes a large capture for measuring analyze's speed (not run by default):
/// `ROCE_BENCH_PCAP=/tmp/big.pcap ROCE_BENCH_FRAMES=1000000 cargo test --release -p
/// roce-agent --test analyze -- --ignored write_large_capture`. 1,024 queue pairs,
/// plain and in VXLAN, sizes from a CNP to 1 KB of payload, a CE mark in every 50.
#[test]
#[ignore]
fn write_large_capture() {
    let Some(path) = std::env::var_os("ROCE_BENCH_PCAP") else {
        eprintln!("set ROCE_BENCH_PCAP to the file to write");
        return;
    };
    let n: usize = std::env::var("ROCE_BENCH_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let eth = Eth::default();
    let header = PcapHeader {
        ts_resolution: TsResolution::NanoSecond,
        snaplen: 65535,
        ..Default::default()
    };
    let file = std::io::BufWriter::new(fs::File::create(&path).expect("create"));
    let mut w = PcapWriter::with_header(file, header).expect("header");
    let mut psn = vec![0u32; 1024];
    let outer = L3::v4(v4("10.0.0.1"), v4("10.0.0.2")).with_tos(TOS_DATA);
    for i in 0..n {
        let qp = (i * 7919) % 1024;
        let tos = if i % 50 == 0 { TOS_CE } else { TOS_DATA };
        let l3 = L3::v4(
            v4("198.18.0.1"),
            Ipv4Addr::new(198, 18, 1, (qp % 250) as u8),
        )
        .with_tos(tos);
        let msg = match i % 10 {
            0 => RoceMsg::ack(qp as u32, psn[qp], 0x1F),
            1 => cnp(qp as u32),
            _ => {
                psn[qp] = (psn[qp] + 1) & 0xFF_FFFF;
                RoceMsg::send_only(qp as u32, psn[qp], 64 + (i % 8) * 128)
            }
        };
        let frame = roce_frame(&eth, &l3, 0xC000, &msg);
        let frame = if qp % 4 == 0 {
            vxlan_frame(&eth, &outer, 0xD000, 5000 + (qp as u32 % 8), &frame)
        } else {
            frame
        };
        w.write_packet(&PcapPacket::new(Frames::ts(i), frame.len() as u32, &frame))
            .expect("write");
    }
}

// ---------------------------------------------------------------------------------
// Linux cooked captures (tcpdump -i any), link types not read, standard input,
// --fail-on and --pretty (issue 34)

/// The two Linux cooked link types.
#[derive(Clone, Copy, Debug)]
enum Cooked {
    /// LINUX_SLL (113): a 16-byte header, 2 bytes more than Ethernet's.
    Sll,
    /// LINUX_SLL2 (276): a 20-byte header, 6 bytes more.
    Sll2,
}

impl Cooked {
    fn datalink(self) -> DataLink {
        match self {
            Cooked::Sll => DataLink::LINUX_SLL,
            Cooked::Sll2 => DataLink::LINUX_SLL2,
        }
    }
    /// Header bytes beyond a 14-byte Ethernet header.
    fn extra(self) -> i64 {
        match self {
            Cooked::Sll => 2,
            Cooked::Sll2 => 6,
        }
    }
    /// An Ethernet frame as `tcpdump -i any` writes an incoming packet: the
    /// Ethernet header replaced by the cooked header (packet type 0 = to us, ARPHRD 1
    /// = Ethernet, the source MAC as address, the EtherType as protocol), the VLAN
    /// tags left in front of the network layer as libpcap puts them back (LINUX_SLL).
    fn cook(self, eth: &[u8]) -> Vec<u8> {
        let (src, proto, rest) = (&eth[6..12], &eth[12..14], &eth[14..]);
        let mut addr = [0u8; 8];
        addr[..6].copy_from_slice(src);
        let mut out = Vec::with_capacity(eth.len() + 6);
        match self {
            Cooked::Sll => {
                out.extend_from_slice(&[0, 0, 0, 1, 0, 6]);
                out.extend_from_slice(&addr);
                out.extend_from_slice(proto);
            }
            Cooked::Sll2 => {
                out.extend_from_slice(proto);
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&7u32.to_be_bytes());
                out.extend_from_slice(&[0, 1, 0, 6]);
                out.extend_from_slice(&addr);
            }
        }
        out.extend_from_slice(rest);
        out
    }
}

impl Frames {
    /// Writes the frames as a pcap of link type `link` (they must be of that type).
    fn write_pcap_link(&self, path: &Path, link: DataLink) {
        let header = PcapHeader {
            ts_resolution: TsResolution::NanoSecond,
            snaplen: 65535,
            datalink: link,
            ..Default::default()
        };
        let file = fs::File::create(path).expect("create pcap");
        let mut w = PcapWriter::with_header(file, header).expect("pcap header");
        for (i, f) in self.0.iter().enumerate() {
            w.write_packet(&PcapPacket::new(Self::ts(i), f.len() as u32, f))
                .expect("write packet");
        }
    }

    fn cooked(&self, c: Cooked) -> Frames {
        Frames(self.0.iter().map(|f| c.cook(f)).collect())
    }
}

/// A pcapng file of several interfaces: `links[i]` is interface i's link type, and
/// each frame names its interface.
fn write_pcapng_interfaces(path: &Path, links: &[DataLink], frames: &[(u32, Vec<u8>)]) {
    let file = fs::File::create(path).expect("create pcapng");
    let mut w = PcapNgWriter::new(file).expect("pcapng header");
    for l in links {
        // Nanosecond timestamps (if_tsresol 9), as pcap-file writes them.
        let mut idb = InterfaceDescriptionBlock::new(*l, 65535);
        idb.options.push(
            pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption::IfTsResol(
                9,
            ),
        );
        w.write_pcapng_block(idb).expect("idb");
    }
    for (i, (iface, f)) in frames.iter().enumerate() {
        let epb = EnhancedPacketBlock {
            interface_id: *iface,
            timestamp: Frames::ts(i),
            original_len: f.len() as u32,
            data: std::borrow::Cow::Borrowed(f),
            options: vec![],
        };
        w.write_pcapng_block(epb).expect("epb");
    }
}

/// The scenario and the malformed frames that hold an Ethernet header.
fn ethernet_frames() -> Frames {
    let mut f = scenario();
    f.0.extend(malformed().0.into_iter().filter(|f| f.len() >= 14));
    f
}

/// A flow without its timestamps (a capture of the same frames at another time).
fn timeless(doc: &Value) -> BTreeMap<String, Value> {
    flows_by_id(doc)
        .into_iter()
        .map(|(k, mut f)| {
            if let Some(o) = f.as_object_mut() {
                o.remove("first_seen_ns");
                o.remove("last_seen_ns");
                // Times between frames: the counts compare.
                for k in ["ce_to_cnp", "cnp_interval"] {
                    if let Some(t) = o.get_mut(k).and_then(Value::as_object_mut) {
                        t.retain(|name, _| name == "samples");
                    }
                }
            }
            (k, f)
        })
        .collect()
}

fn check_names(doc: &Value) -> Vec<String> {
    doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["check"].as_str().map(str::to_string))
        .collect()
}

/// The same frames written as Ethernet, LINUX_SLL and LINUX_SLL2 (pcap and pcapng)
/// give the same flows, counters and findings: bytes are counted from the Ethernet
/// header that replaces the cooked one. tshark decodes each cooked file to the
/// same flows (its frame lengths less the cooked header's extra bytes).
#[test]
fn cooked_captures_give_the_table_of_the_ethernet_capture_of_the_same_frames() {
    let s = Scratch::new();
    let frames = ethernet_frames();
    let eth = s.path("eth.pcap");
    frames.write_pcap(&eth);
    let (want, _) = analyze_json(&eth, "reference");
    assert!(flows_by_id(&want).len() > 10);
    let mut engines = vec!["reference"];
    if kernel_engine() {
        engines.push("kernel");
    }
    for c in [Cooked::Sll, Cooked::Sll2] {
        let cooked = frames.cooked(c);
        let p = s.path(&format!("{c:?}.pcap"));
        cooked.write_pcap_link(&p, c.datalink());
        let ng = s.path(&format!("{c:?}.pcapng"));
        let tagged: Vec<(u32, Vec<u8>)> = cooked.0.iter().map(|f| (0, f.clone())).collect();
        write_pcapng_interfaces(&ng, &[c.datalink()], &tagged);
        for file in [&p, &ng] {
            for engine in &engines {
                let (got, _) = analyze_json(file, engine);
                assert_eq!(
                    got["flows"],
                    want["flows"],
                    "{c:?} {engine} {}",
                    file.display()
                );
                assert_eq!(got["counters"], want["counters"], "{c:?} {engine}");
                assert_eq!(got["findings"], want["findings"], "{c:?} {engine}");
                assert_eq!(got["capture"]["frames"], want["capture"]["frames"]);
                assert_eq!(
                    got["capture"]["icrc_checked"],
                    want["capture"]["icrc_checked"]
                );
                assert_eq!(got["capture"]["complete"], true);
            }
            if have_tshark() {
                let (got, _) = analyze_json(file, "reference");
                assert_agrees_with_tshark_cooked(file, &got, c.extra());
            }
        }
    }
}

/// A cooked frame shorter than its header, or than its header and an Ethernet-sized
/// rest, counts as `truncated_eth` like a runt Ethernet frame, and a netlink frame
/// (ARPHRD_NETLINK: the protocol field is a netlink family) is not IP.
#[test]
fn short_and_netlink_cooked_frames_are_no_flow() {
    let s = Scratch::new();
    let good = roce_frame(
        &Eth::default(),
        &plain(TOS_DATA),
        0xC000,
        &RoceMsg::send_only(0x10, 1, 16),
    );
    let mut netlink = Cooked::Sll.cook(&good);
    netlink[2..4].copy_from_slice(&824u16.to_be_bytes());
    // The protocol 0x0800 stays, but the netlink payload is what follows.
    let frames = Frames(vec![
        Cooked::Sll.cook(&good),
        Cooked::Sll.cook(&good)[..10].to_vec(),
        netlink,
    ]);
    let p = s.path("short.pcap");
    frames.write_pcap_link(&p, DataLink::LINUX_SLL);
    let (doc, _) = analyze_json(&p, "reference");
    assert_eq!(flows_by_id(&doc).len(), 1, "{doc}");
    assert_eq!(doc["counters"]["roce"], 1);
    assert_eq!(doc["counters"]["parse_errors"]["truncated_eth"], 1, "{doc}");
    assert_eq!(doc["counters"]["non_ip"], 1, "{doc}");
    if kernel_engine() {
        let (k, _) = analyze_json(&p, "kernel");
        assert_eq!(k["counters"], doc["counters"]);
        assert_eq!(k["flows"], doc["flows"]);
    }
}

/// The tcpdump captures in tests/captures (`tcpdump -i any -y LINUX_SLL|LINUX_SLL2`
/// of the Ethernet captures replayed over a veth): the Ethernet capture's table
/// where the packets are the same. A single 802.1Q tag is kept by LINUX_SLL and
/// dropped by LINUX_SLL2 (4 bytes less a packet); of a double-tagged frame the
/// capture keeps a broken inner tag (libpcap on veth), so neither tshark nor analyze
/// finds RoCE in it: the flow is not there.
#[test]
fn tcpdump_any_captures_give_the_table_of_the_ethernet_capture() {
    let dir = workspace_root().join(CAPTURES);
    for name in ["opcodes", "ipv6_vxlan", "jumbo", "vlan_psn"] {
        let (eth, _) = analyze_json(&dir.join(format!("{name}.pcap")), "reference");
        let want = timeless(&eth);
        for c in [Cooked::Sll, Cooked::Sll2] {
            let file = dir.join(format!("{name}_{}.pcap", format!("{c:?}").to_lowercase()));
            let (doc, _) = analyze_json(&file, "reference");
            assert_eq!(doc["capture"]["complete"], true);
            assert_eq!(
                doc["capture"]["frames"],
                eth["capture"]["frames"],
                "{}",
                file.display()
            );
            let got = timeless(&doc);
            if name != "vlan_psn" {
                assert_eq!(got, want, "{}", file.display());
                assert_eq!(doc["counters"], eth["counters"], "{}", file.display());
                continue;
            }
            // vlan_psn: the 802.1Q flow (PSN wrap), and the double-tagged one lost.
            let id = "198.18.0.1>198.18.0.2 vni null ->- qp 768";
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                vec![id],
                "{}",
                file.display()
            );
            let (w, g) = (&want[id], &got[id]);
            let tag = match c {
                Cooked::Sll => 0,
                Cooked::Sll2 => 4,
            };
            assert_eq!(g["packets"], w["packets"]);
            assert_eq!(
                g["bytes"].as_i64().unwrap(),
                w["bytes"].as_i64().unwrap() - tag * w["packets"].as_i64().unwrap(),
                "{}",
                file.display()
            );
            assert_eq!(g["psn_gaps"], 0);
            assert_eq!(g["ecn"], w["ecn"]);
        }
    }
}

/// Every cooked capture in tests/captures against tshark's decode of it.
#[test]
fn tcpdump_any_captures_agree_with_tshark() {
    if !have_tshark() {
        return;
    }
    let dir = workspace_root().join(CAPTURES);
    for name in ["opcodes", "ipv6_vxlan", "jumbo", "vlan_psn"] {
        for c in [Cooked::Sll, Cooked::Sll2] {
            let file = dir.join(format!("{name}_{}.pcap", format!("{c:?}").to_lowercase()));
            let (doc, _) = analyze_json(&file, "reference");
            assert_agrees_with_tshark_cooked(&file, &doc, c.extra());
        }
    }
    // dumpcap on the veth (Ethernet) and on `any` (LINUX_SLL) at once: every packet twice.
    let file = dir.join("ipv6_vxlan_eth_and_sll.pcapng");
    let (doc, _) = analyze_json(&file, "reference");
    assert_agrees_with_tshark_cooked(&file, &doc, Cooked::Sll.extra());
}

/// A pcapng file with an Ethernet and a LINUX_SLL interface (dumpcap -i rb -i any):
/// each interface's link type applies to its frames, so every packet counts twice.
#[test]
fn pcapng_interfaces_each_have_their_link_type() {
    let dir = workspace_root().join(CAPTURES);
    let (eth, _) = analyze_json(&dir.join("ipv6_vxlan.pcap"), "reference");
    let (both, _) = analyze_json(&dir.join("ipv6_vxlan_eth_and_sll.pcapng"), "reference");
    assert_eq!(both["capture"]["frames"], 24);
    assert_eq!(both["capture"]["complete"], true);
    let (want, got) = (timeless(&eth), timeless(&both));
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>()
    );
    for (id, w) in &want {
        for k in ["packets", "bytes", "cnps"] {
            assert_eq!(
                got[id][k].as_u64(),
                w[k].as_u64().map(|n| 2 * n),
                "{id} {k}"
            );
        }
    }
}

/// Frames of a pcapng interface whose link type is not read are skipped and named
/// in a finding (a warning beside frames that were read, an error when nothing
/// was): never `capture_incomplete`, never "copy the file again".
#[test]
fn unsupported_pcapng_interfaces_are_a_finding_not_an_incomplete_capture() {
    // mergecap of ipv6_vxlan_sll2.pcap and vlan_psn.pcap relabelled as radiotap.
    let dir = workspace_root().join(CAPTURES);
    let mixed = dir.join("ipv6_vxlan_sll2_and_radiotap.pcapng");
    let (sll2, _) = analyze_json(&dir.join("ipv6_vxlan_sll2.pcap"), "reference");
    let (doc, _) = analyze_json(&mixed, "reference");
    assert_eq!(doc["capture"]["frames"], 23);
    assert_eq!(doc["capture"]["complete"], true);
    assert_eq!(doc["capture"]["error"], Value::Null);
    assert_eq!(timeless(&doc), timeless(&sll2));
    assert_eq!(doc["counters"], sll2["counters"]);
    let checks = check_names(&doc);
    assert!(
        !checks.contains(&"capture_incomplete".to_string()),
        "{checks:?}"
    );
    let f = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "link_type_unsupported")
        .cloned()
        .expect("a link_type_unsupported finding");
    assert_eq!(f["severity"], "warning");
    assert_eq!(
        f["found"],
        "11 of 23 frames were not analyzed, their link type is not supported: \
         interface 1, link type 127 (IEEE802_11_RADIOTAP): 11 frames"
    );
    assert_eq!(
        f["expected"],
        "frames of a link type roce-agent reads: Ethernet (1) and Linux cooked captures (113, 276)"
    );
    // A warning: exit 0 by default, 1 with --fail-on warning.
    let m = mixed.to_str().unwrap();
    assert_eq!(agent(&["analyze", m]).status.code(), Some(0));
    let out = agent(&["analyze", m, "--fail-on", "warning"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "");
    assert!(text(&out.stdout).contains("WARN  link_type_unsupported: 11 of 23 frames"));
    if kernel_engine() {
        let (k, _) = analyze_json(&mixed, "kernel");
        assert_eq!(k, doc);
    }

    // Nothing readable: an error, exit 1, no second message.
    let s = Scratch::new();
    let p = s.path("radiotap.pcapng");
    let frames: Vec<(u32, Vec<u8>)> = vlan_psn().0.into_iter().map(|f| (0, f)).collect();
    write_pcapng_interfaces(&p, &[DataLink::IEEE802_11_RADIOTAP], &frames);
    let out = agent(&["analyze", p.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["capture"]["complete"], true);
    assert_eq!(doc["findings"][0]["check"], "link_type_unsupported");
    assert_eq!(doc["findings"][0]["severity"], "error");
    assert_eq!(check_names(&doc), vec!["link_type_unsupported"]);

    // Skipped frames keep their numbers: a truncated block after them is named by
    // its number in the file (as tshark numbers it).
    let p = s.path("skipped_then_cut.pcapng");
    let mut frames: Vec<(u32, Vec<u8>)> = vlan_psn().0.into_iter().map(|f| (0, f)).collect();
    frames.extend(opcodes().0.into_iter().take(5).map(|f| (1, f)));
    write_pcapng_interfaces(
        &p,
        &[DataLink::IEEE802_11_RADIOTAP, DataLink::ETHERNET],
        &frames,
    );
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    let out = agent(&["analyze", p.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(": frame 16: the capture is truncated or corrupt"),
        "{}",
        text(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["capture"]["frames"], 15);
}

/// `roce-agent analyze ARGS` with `stdin` as standard input.
fn agent_stdin(args: &[&str], stdin: std::process::Stdio) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(stdin)
        .output()
        .expect("run roce-agent")
}

/// `roce-agent ARGS` with `bytes` written into a pipe on its standard input.
fn agent_piped(args: &[&str], bytes: Vec<u8>) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run roce-agent");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        // The agent may stop reading early (an error): a broken pipe is its answer.
        let _ = stdin.write_all(&bytes);
    });
    let out = child.wait_with_output().expect("wait for roce-agent");
    writer.join().expect("writer thread");
    out
}

/// `analyze -` reads standard input, a pipe or a file, pcap or pcapng, Ethernet or
/// cooked, with either engine (the kernel engine reads a pipe from a copy in the
/// temporary directory): the report of the file, `capture.file` "-".
#[test]
fn standard_input_is_read_as_a_stream() {
    let s = Scratch::new();
    let files = {
        let (a, b, c) = (s.path("s.pcap"), s.path("s.pcapng"), s.path("s_sll2.pcap"));
        scenario().write_pcap(&a);
        scenario().write_pcapng(&b);
        scenario()
            .cooked(Cooked::Sll2)
            .write_pcap_link(&c, DataLink::LINUX_SLL2);
        [a, b, c]
    };
    let mut engines = vec!["reference"];
    if kernel_engine() {
        engines.push("kernel");
    }
    for f in &files {
        let (mut want, _) = analyze_json(f, "reference");
        want["capture"]["file"] = Value::from("-");
        for engine in &engines {
            let args = [
                "analyze",
                "-",
                "--json",
                "--engine",
                *engine,
                "--fail-on",
                "never",
            ];
            let out = agent_piped(&args, fs::read(f).unwrap());
            assert!(
                out.status.success(),
                "{} {engine}: {}",
                f.display(),
                text(&out.stderr)
            );
            let got: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(got, want, "{} piped, {engine}", f.display());
            let out = agent_stdin(&args, fs::File::open(f).unwrap().into());
            assert!(
                out.status.success(),
                "{} {engine}: {}",
                f.display(),
                text(&out.stderr)
            );
            let got: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(got, want, "{} redirected, {engine}", f.display());
        }
    }
    // A truncated capture on standard input: named so, its frame, exit 1.
    let bytes = fs::read(&files[0]).unwrap();
    let out = agent_piped(
        &["analyze", "-", "--json", "--fail-on", "never"],
        bytes[..bytes.len() - 20].to_vec(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("standard input: frame 57: the capture is truncated"),
        "{}",
        text(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["capture"]["frames"], 56);
    // Nothing on standard input.
    let out = agent_piped(&["analyze", "-"], Vec::new());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("standard input: not a pcap or pcapng file"),
        "{}",
        text(&out.stderr)
    );
}

/// `roce-agent analyze ARG --json --fail-on never --engine ENGINE`, with `pipe`
/// copied into its standard input when given: the document and the peak RSS in MB.
// The child is reaped by wait4 (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn analyze_measured(arg: &str, engine: &str, pipe: Option<&Path>) -> (Value, usize) {
    let mut child = Command::new(BIN)
        .args([
            "analyze",
            arg,
            "--json",
            "--fail-on",
            "never",
            "--engine",
            engine,
        ])
        .env_remove("RUST_LOG")
        .stdin(if pipe.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("run roce-agent");
    let writer = pipe.map(|p| {
        let mut from = fs::File::open(p).expect("open the capture");
        let mut to = child.stdin.take().expect("stdin");
        std::thread::spawn(move || std::io::copy(&mut from, &mut to))
    });
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
    });
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers to status and rusage.
    let rc = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    assert_eq!(rc, child.id() as libc::pid_t);
    if let Some(w) = writer {
        w.join().unwrap().expect("write the capture");
    }
    let out = reader.join().unwrap().expect("read the report");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    let doc = serde_json::from_slice(&out).expect("analyze --json prints JSON");
    (doc, ru.ru_maxrss as usize / 1024)
}

/// A capture piped into `analyze -` is read as it comes: the agent's peak memory is
/// that of the same analysis of the file (within a few MB), far below the capture's
/// size (the kernel engine's copy of a pipe goes to a file, not to memory).
#[test]
fn a_large_capture_on_a_pipe_is_not_held_in_memory() {
    use std::io::Write as _;
    // 36,000 jumbo frames (about 100 MB): a nanosecond pcap, written here.
    let s = Scratch::new();
    let path = s.path("large.pcap");
    let mut w = std::io::BufWriter::new(fs::File::create(&path).expect("create"));
    for word in [0xA1B2_3C4Du32, 0x0004_0002, 0, 0, 65535, 1] {
        w.write_all(&word.to_le_bytes()).unwrap();
    }
    let rounds = 12_000;
    let jumbo = jumbo();
    for round in 0..rounds {
        for (i, f) in jumbo.0.iter().enumerate() {
            let ts = Frames::ts(round * 3 + i);
            let len = f.len() as u32;
            for word in [ts.as_secs() as u32, ts.subsec_nanos(), len, len] {
                w.write_all(&word.to_le_bytes()).unwrap();
            }
            w.write_all(f).unwrap();
        }
    }
    drop(w);
    let size = (fs::metadata(&path).unwrap().len() >> 20) as usize;
    let mut engines = vec!["reference"];
    if kernel_engine() {
        engines.push("kernel");
    }
    for engine in engines {
        let (file_doc, file_mb) = analyze_measured(path.to_str().unwrap(), engine, None);
        let (doc, piped_mb) = analyze_measured("-", engine, Some(&path));
        eprintln!(
            "{engine}: {size} MB capture, peak RSS {file_mb} MB from the file, \
             {piped_mb} MB from a pipe"
        );
        assert_eq!(doc["capture"]["frames"], 3 * rounds as u64);
        assert_eq!(doc["flows"], file_doc["flows"]);
        // Held in memory, the capture alone would take its size; the peak from the
        // file varies by several MB from run to run, so it is reported, not compared.
        assert!(
            piped_mb * 2 < size,
            "{engine}: peak RSS {piped_mb} MB for a {size} MB capture on a pipe \
             ({file_mb} MB from the file)"
        );
    }
}

/// `--fail-on error|warning|never`: exit 1 when a finding is at that level or
/// above (default error), no second message; the output is printed either way.
#[test]
fn fail_on_sets_the_exit_status_by_finding_level() {
    let s = Scratch::new();
    let run = |p: &Path, extra: &[&str]| -> (Option<i32>, String, String) {
        let mut args = vec!["analyze", p.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = agent(&args);
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    // Errors (a PSN gap, a bad ICRC, ...).
    let errors = s.path("scenario.pcap");
    scenario().write_pcap(&errors);
    // Only a warning: RoCE on the lossless DSCP 26 but Not-ECT.
    let warning = s.path("not_ect.pcap");
    let mut f = Frames::default();
    for psn in 1..=3 {
        f.push(roce_frame(
            &Eth::default(),
            &plain(104),
            0xC000,
            &RoceMsg::send_only(0x10, psn, 64),
        ));
    }
    f.write_pcap(&warning);
    // Only an info: CE marks on ECT traffic.
    let info = s.path("ce.pcap");
    let mut f = Frames::default();
    for psn in 1..=3 {
        let tos = if psn == 2 { TOS_CE } else { TOS_DATA };
        f.push(roce_frame(
            &Eth::default(),
            &plain(tos),
            0xC000,
            &RoceMsg::send_only(0x10, psn, 64),
        ));
    }
    f.write_pcap(&info);

    let (code, out, err) = run(&errors, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(err, "", "a failing finding gets no second message");
    assert!(out.contains("ERROR psn_gaps"), "{out}");
    let (code, out, err) = run(&errors, &["--json"]);
    assert_eq!((code, err.as_str()), (Some(1), ""));
    let doc: Value = serde_json::from_str(&out).expect("the JSON is printed");
    assert!(check_names(&doc).contains(&"psn_gaps".to_string()));
    assert_eq!(run(&errors, &["--fail-on", "error"]).0, Some(1));
    assert_eq!(run(&errors, &["--fail-on", "warning"]).0, Some(1));
    assert_eq!(run(&errors, &["--fail-on", "never"]).0, Some(0));

    let (code, out, _) = run(&warning, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("WARN  roce_not_ect"), "{out}");
    assert!(!out.contains("ERROR"), "{out}");
    assert_eq!(run(&warning, &["--fail-on", "warning"]).0, Some(1));
    assert_eq!(run(&warning, &["--fail-on", "never"]).0, Some(0));

    let (code, out, _) = run(&info, &["--fail-on", "warning"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("INFO  ce_marked"), "{out}");

    // A truncated capture exits 1 whatever --fail-on says, with its message.
    let bytes = fs::read(&info).unwrap();
    let cut = s.path("cut.pcap");
    fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let (code, _, err) = run(&cut, &["--fail-on", "never"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("truncated or corrupt"), "{err}");

    // Not a level: a usage error.
    assert_eq!(run(&info, &["--fail-on", "info"]).0, Some(2));
}

/// `--json` prints one line; `--pretty` indents the same document; `--pretty`
/// alone is a usage error.
#[test]
fn json_is_compact_unless_pretty() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let path = p.to_str().unwrap();
    let compact = agent(&["analyze", path, "--json", "--fail-on", "never"]);
    assert!(compact.status.success(), "{}", text(&compact.stderr));
    let c = text(&compact.stdout);
    assert_eq!(c.lines().count(), 1, "{c}");
    assert!(c.ends_with("}\n") && c.starts_with("{\"capture\":{"), "{c}");
    let pretty = agent(&["analyze", path, "--json", "--pretty", "--fail-on", "never"]);
    assert!(pretty.status.success(), "{}", text(&pretty.stderr));
    let pt = text(&pretty.stdout);
    assert!(
        pt.lines().count() > 100 && pt.starts_with("{\n  \"capture\": {"),
        "{pt}"
    );
    let (cv, pv): (Value, Value) = (
        serde_json::from_str(&c).unwrap(),
        serde_json::from_str(&pt).unwrap(),
    );
    assert_eq!(cv, pv);
    let alone = agent(&["analyze", path, "--pretty"]);
    assert_eq!(alone.status.code(), Some(2), "{}", text(&alone.stderr));
}

/// Real tools end to end (root, tcpdump, tcpreplay): the Ethernet captures replayed
/// over a veth and captured on the other side with `tcpdump -i any` in both cooked
/// link types read as the Ethernet captures (as the committed `*_sll*.pcap` were made).
#[test]
fn tcpdump_any_of_a_replay_reads_as_the_ethernet_capture() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("tcpdump test skipped: needs root (namespaces)");
        return;
    }
    for tool in ["tcpdump", "tcpreplay", "timeout"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("tcpdump test skipped: {tool} is not installed");
            return;
        }
    }
    let (a, b) = common::quiet_pair("roce-sll-");
    a.ip_ok(&["link", "set", "ra", "mtu", "9000", "up"]);
    b.ip_ok(&["link", "set", "rb", "mtu", "9000", "up"]);
    let s = Scratch::new();
    let dir = workspace_root().join(CAPTURES);
    for name in ["opcodes", "ipv6_vxlan", "jumbo"] {
        let src = dir.join(format!("{name}.pcap"));
        let (eth, _) = analyze_json(&src, "reference");
        let n = eth["capture"]["frames"].as_u64().unwrap().to_string();
        for (dlt, c) in [("LINUX_SLL", Cooked::Sll), ("LINUX_SLL2", Cooked::Sll2)] {
            let out = s.path(&format!("{name}.{dlt}.pcap"));
            let o = out.to_str().unwrap();
            use std::io::BufRead as _;
            let mut tcpdump = b
                .cmd(
                    "timeout",
                    &[
                        "20", "tcpdump", "-i", "any", "-y", dlt, "-s", "0", "-c", &n, "-w", o,
                    ],
                )
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start tcpdump");
            // tcpdump says "listening on any" once it captures.
            let mut err = std::io::BufReader::new(tcpdump.stderr.take().expect("stderr"));
            let mut said = String::new();
            while !said.contains("listening on") {
                let mut line = String::new();
                if err.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                said.push_str(&line);
            }
            assert!(said.contains("listening on any"), "tcpdump: {said}");
            let sent = a
                .exec("tcpreplay", &["-q", "-i", "ra", src.to_str().unwrap()])
                .expect("tcpreplay");
            assert!(sent.status.success(), "tcpreplay: {}", text(&sent.stderr));
            // tcpdump exits after n packets (timeout kills it after 20 s).
            let _ = std::io::Read::read_to_string(&mut err, &mut said);
            let st = tcpdump.wait().expect("wait for tcpdump");
            assert!(st.success(), "{name} {dlt}: tcpdump ({st}): {said}");
            let (doc, _) = analyze_json(&out, "reference");
            assert_eq!(doc["capture"]["frames"].as_u64().unwrap().to_string(), n);
            assert_eq!(timeless(&doc), timeless(&eth), "{name} {dlt}");
            assert_eq!(doc["counters"], eth["counters"], "{name} {dlt}");
            if have_tshark() {
                assert_agrees_with_tshark_cooked(&out, &doc, c.extra());
            }
        }
    }
}

/// A finding about flows lists them by key (`flow_keys`): each key is a flow of the
/// same document, in the order the finding's text names them, and `flows` counts them.
#[test]
fn findings_list_their_flows_by_key() {
    let s = Scratch::new();
    let p = s.path("scenario.pcap");
    scenario().write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    let flows = doc["flows"].as_array().unwrap();
    let key = |v: &Value| {
        (
            v["src"].clone(),
            v["dst"].clone(),
            v["vni"].clone(),
            v["inner_src"].clone(),
            v["inner_dst"].clone(),
            v["dest_qp"].clone(),
        )
    };
    let mut listed = 0;
    for f in doc["findings"].as_array().unwrap() {
        let Some(keys) = f.get("flow_keys").and_then(Value::as_array) else {
            continue;
        };
        listed += 1;
        assert_eq!(keys.len() as u64, f["flows"].as_u64().unwrap(), "{f}");
        for k in keys {
            assert!(
                flows.iter().any(|fl| key(fl) == key(k)),
                "{k} is no flow of the document"
            );
            let qp = k["dest_qp"].as_u64().unwrap();
            assert_eq!(k["dest_qp_hex"], format!("{qp:#x}"));
        }
        // The first flow the text names is the first key.
        let first = &keys[0];
        let qp = format!("qp {:#x}", first["dest_qp"].as_u64().unwrap());
        let text = f["found"].as_str().unwrap();
        assert!(text.contains(&qp), "{text} does not name {qp} first");
    }
    assert!(listed >= 4, "the scenario's findings about flows: {listed}");
    // A finding about no flow (other traffic on a lossless DSCP) lists none.
    for f in doc["findings"].as_array().unwrap() {
        if f["flows"] == 0 {
            assert!(f.get("flow_keys").is_none(), "{f}");
        }
    }
}

// ---------------------------------------------------------------------------------
// Loss in the fabric or in the capture, and retransmissions

/// Requester 198.18.6.1, responder 198.18.6.2: three queue pairs, each with its own
/// PSN space (as rdma_cm picks them, far apart), their responses to the requester's
/// QPs (0x501, 0x511, 0x521); and one queue pair between two other hosts whose other
/// direction the capture does not hold.
/// - QP 0x500: the capture lost two requests (PSNs 1004 and 1007) that the fabric
///   delivered: the responder's ACK of 1009 covers them, with no NAK and no resend.
///   2 PSN gaps, both the capture's.
/// - QP 0x510: the fabric lost 0x50002: the responder NAKs it (sequence error) when
///   0x50003 arrives, the requester goes back to it, resends 0x50002 and 0x50003,
///   then sends 0x50004. 1 PSN gap, the fabric's; 2 retransmissions, no timeout.
/// - QP 0x520: the fabric lost the ACK of 0x900002-0x900003: the requester's timeout
///   fires and it resends both. No gap; 2 retransmissions, 1 timeout.
/// - QP 0x530 (198.18.7.1 -> 198.18.7.2): PSN 8 missing, nothing of the other
///   direction: 1 gap, undecided.
fn loss() -> Frames {
    let eth = Eth::default();
    let a_b = L3::v4(v4("198.18.6.1"), v4("198.18.6.2")).with_tos(TOS_DATA);
    let b_a = L3::v4(v4("198.18.6.2"), v4("198.18.6.1")).with_tos(TOS_DATA);
    let other = L3::v4(v4("198.18.7.1"), v4("198.18.7.2")).with_tos(TOS_DATA);
    let req = |l3: &L3, qp, psn| roce_frame(&eth, l3, 0xC000, &RoceMsg::send_only(qp, psn, 256));
    let ack = |qp, psn, syndrome| roce_frame(&eth, &b_a, 0xC001, &RoceMsg::ack(qp, psn, syndrome));
    let mut f = Frames::default();
    // Interleaved, as a sniffer sees several queue pairs at once.
    for psn in 1000..1004 {
        f.push(req(&a_b, 0x500, psn));
    }
    f.push(ack(0x501, 1002, 0x1F));
    for psn in [0x50000, 0x50001, 0x50003] {
        f.push(req(&a_b, 0x510, psn));
    }
    f.push(ack(0x511, 0x50002, 0x60));
    // 1004 and 1007 sent, but not captured.
    for psn in [1005, 1006, 1008, 1009] {
        f.push(req(&a_b, 0x500, psn));
    }
    for psn in [0x50002, 0x50003, 0x50004] {
        f.push(req(&a_b, 0x510, psn));
    }
    for psn in 0x90_0000..0x90_0004 {
        f.push(req(&a_b, 0x520, psn));
    }
    f.push(req(&other, 0x530, 7));
    f.push(ack(0x501, 1009, 0x1F));
    f.push(ack(0x511, 0x50004, 0x1F));
    f.push(ack(0x521, 0x90_0001, 0x1F));
    f.push(req(&other, 0x530, 9));
    // The ACK of 0x900003 was lost in the fabric: the requester times out.
    for psn in [0x90_0002, 0x90_0003] {
        f.push(req(&a_b, 0x520, psn));
    }
    f.push(ack(0x521, 0x90_0003, 0x1F));
    f
}

/// (psn_gaps, capture_gaps, retransmitted_packets, retransmit_timeouts) of a flow.
fn loss_of(f: &Value) -> [u64; 4] {
    let n = |k: &str| f[k].as_u64().unwrap_or_else(|| panic!("{k} in {f}"));
    [
        n("psn_gaps"),
        n("capture_gaps"),
        n("retransmitted_packets"),
        n("retransmit_timeouts"),
    ]
}

#[test]
fn gaps_the_capture_lost_are_told_from_the_fabrics_and_resends_counted() {
    let s = Scratch::new();
    let p = s.path("loss.pcap");
    loss().write_pcap(&p);
    let mut engines = vec!["reference"];
    if kernel_engine() {
        engines.push("kernel");
    }
    let mut texts = Vec::new();
    for engine in engines {
        let (doc, text) = analyze_json(&p, engine);
        texts.push(text);
        let flows = flows_by_id(&doc);
        let get = |id: &str| {
            flows
                .get(id)
                .unwrap_or_else(|| panic!("{engine}: no flow {id}: {:?}", flows.keys()))
        };
        let req = |qp: u32| get(&format!("198.18.6.1>198.18.6.2 vni null ->- qp {qp}"));
        assert_eq!(loss_of(req(0x500)), [2, 2, 0, 0], "{engine}: qp 0x500");
        assert_eq!(loss_of(req(0x510)), [1, 0, 2, 0], "{engine}: qp 0x510");
        assert_eq!(loss_of(req(0x520)), [0, 0, 2, 1], "{engine}: qp 0x520");
        assert_eq!(
            loss_of(get("198.18.7.1>198.18.7.2 vni null ->- qp 1328")),
            [1, 0, 0, 0],
            "{engine}: qp 0x530"
        );
        let len = roce_frame(
            &Eth::default(),
            &plain(TOS_DATA),
            0xC000,
            &RoceMsg::send_only(0x510, 0, 256),
        )
        .len() as u64;
        assert_eq!(req(0x510)["retransmitted_bytes"], 2 * len);
        // The responses are no requests: nothing resent, no gap.
        for qp in [0x501, 0x511, 0x521] {
            let back = get(&format!("198.18.6.2>198.18.6.1 vni null ->- qp {qp}"));
            assert_eq!(loss_of(back), [0, 0, 0, 0], "{engine}: qp {qp:#x}");
        }
        let find = |check: &str| {
            doc["findings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["check"] == check)
                .cloned()
                .unwrap_or_else(|| panic!("{engine}: no {check} finding: {}", doc["findings"]))
        };
        let capture = find("capture_gaps");
        assert_eq!(capture["severity"], "warning");
        assert_eq!(capture["flows"], 1);
        let found = capture["found"].as_str().unwrap();
        assert!(
            found.starts_with("2 PSN gaps on 1 flows were lost by the capture, not the fabric"),
            "{found}"
        );
        let fabric = find("psn_gaps");
        assert_eq!(fabric["severity"], "error");
        assert_eq!(fabric["flows"], 2, "{fabric}");
        let found = fabric["found"].as_str().unwrap();
        assert!(
            found.starts_with("2 PSN gaps on 2 flows (packets lost before the capture point; 1 of them resent or NAKed: lost in the fabric; 1 with no later response"),
            "{found}"
        );
        let resent = find("retransmissions");
        assert_eq!(resent["flows"], 2);
        let found = resent["found"].as_str().unwrap();
        assert!(
            found.starts_with(&format!(
                "4 requests ({} bytes) sent again on 2 flows; 1 go-backs followed no NAK",
                4 * len
            )),
            "{found}"
        );
    }
    if let [r, k] = &texts[..] {
        assert!(r == k, "engines differ: {}", first_difference(r, k));
    }
    // Any number of workers: both directions of a queue pair meet in one.
    let one = analyze_workers(&p, "reference", 1);
    for n in [2, 3, 7] {
        let got = analyze_workers(&p, "reference", n);
        assert!(
            got == one,
            "--workers {n}: {}",
            first_difference(&one, &got)
        );
    }
    // The table shows the retransmissions.
    let out = agent(&["analyze", p.to_str().unwrap(), "--fail-on", "never"]);
    let t = text(&out.stdout);
    assert!(t.contains("  gaps  resent/TO  dscp"), "{t}");
    assert!(
        t.contains("WARN  capture_gaps: 2 PSN gaps on 1 flows"),
        "{t}"
    );
}

/// A real capture with request frames taken out, as a sniffer that drops frames
/// leaves it: `rxe-nccl-tree.pcap` (NCCL tree all-reduce over soft-RoCE) without
/// frames 60, 90 and 140, checked by hand with tshark:
/// - frame 60: 172.30.0.11 -> .12 WRITE MIDDLE to QP 0x2c, PSN 8 (of 1-24); frame 78,
///   .12 -> .11 ACK to QP 0x25 PSN 24, acknowledges it;
/// - frame 90: .12 -> .25 WRITE MIDDLE to QP 0x26, PSN 10 (of 1-24); frame 105, ACK to
///   QP 0x2b PSN 24;
/// - frame 140: .12 -> .11 WRITE MIDDLE to QP 0x27, PSN 10 (of 1-24); frame 155, ACK
///   to QP 0x2d PSN 24.
///
/// No NAK and no resend anywhere in the capture: 3 PSN gaps, all 3 the capture's,
/// and no psn_gaps finding (the fabric lost nothing). The whole capture: no gap.
#[test]
fn a_real_capture_with_frames_dropped_by_the_sniffer_shows_capture_gaps_only() {
    use pcap_file::pcap::PcapReader;
    let real = real_captures()
        .into_iter()
        .find(|p| p.ends_with("rxe-nccl-tree.pcap"))
        .expect("rxe-nccl-tree.pcap");
    let s = Scratch::new();
    let cut = s.path("nccl-tree-sniffer-loss.pcap");
    {
        let mut r = PcapReader::new(fs::File::open(&real).expect("open")).expect("a pcap");
        let header = r.header();
        let mut w = PcapWriter::with_header(fs::File::create(&cut).expect("create"), header)
            .expect("pcap header");
        let mut number = 0;
        while let Some(pkt) = r.next_packet() {
            number += 1;
            let pkt = pkt.expect("a record");
            if ![60, 90, 140].contains(&number) {
                w.write_packet(&pkt).expect("write");
            }
        }
        assert_eq!(number, 168);
    }
    let (whole, _) = analyze_json(&real, "reference");
    let (doc, _) = analyze_json(&cut, "reference");
    let sum = |d: &Value, k: &str| -> u64 {
        d["flows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f[k].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(
        (sum(&whole, "psn_gaps"), sum(&whole, "capture_gaps")),
        (0, 0)
    );
    assert_eq!(sum(&whole, "retransmitted_packets"), 0);
    assert_eq!((sum(&doc, "psn_gaps"), sum(&doc, "capture_gaps")), (3, 3));
    assert_eq!(sum(&doc, "retransmitted_packets"), 0);
    let flows = flows_by_id(&doc);
    for (id, gaps) in [
        ("172.30.0.11>172.30.0.12 vni null ->- qp 44", 1),
        ("172.30.0.12>172.30.0.25 vni null ->- qp 38", 1),
        ("172.30.0.12>172.30.0.11 vni null ->- qp 39", 1),
    ] {
        let f = &flows[id];
        assert_eq!(loss_of(f), [gaps, gaps, 0, 0], "{id}");
    }
    let checks = check_names(&doc);
    assert!(checks.contains(&"capture_gaps".to_string()), "{checks:?}");
    assert!(!checks.contains(&"psn_gaps".to_string()), "{checks:?}");
}

/// Round trips at the capture point: frames 1 µs apart, so each sample is known
/// exactly. QP 0x600's requests ask for ACKs; the responder ACKs PSN 1 three frames
/// after it (3 µs), coalesces 2 and 3 into an ACK of 3 (which ends no sample: 2 and 3
/// were not sampled, one waits at a time), and ACKs 4 five frames after it (5 µs).
/// PSN 5 is resent before its ACK (Karn's rule: no sample).
fn round_trips() -> Frames {
    let eth = Eth::default();
    let a_b = L3::v4(v4("198.18.8.1"), v4("198.18.8.2")).with_tos(TOS_DATA);
    let b_a = L3::v4(v4("198.18.8.2"), v4("198.18.8.1")).with_tos(TOS_DATA);
    let req = |psn| {
        roce_frame(
            &eth,
            &a_b,
            0xC000,
            &RoceMsg::send_only(0x600, psn, 256).with_ack_req(true),
        )
    };
    let ack = |psn| roce_frame(&eth, &b_a, 0xC001, &RoceMsg::ack(0x601, psn, 0x1F));
    let mut f = Frames::default();
    f.push(req(1)); // 0: sampled
    f.push(req(2)); // 1
    f.push(req(3)); // 2
    f.push(ack(1)); // 3: 3 µs
    f.push(ack(3)); // 4: coalesced, ends nothing
    f.push(req(4)); // 5: sampled
    f.push(req(5)); // 6
    f.push(req(6)); // 7
    f.push(req(7)); // 8
    f.push(req(8)); // 9
    f.push(ack(4)); // 10: 5 µs
    f.push(req(9)); // 11: sampled
    f.push(req(9)); // 12: resent: the sample is void
    f.push(ack(9)); // 13: ends nothing
    f
}

#[test]
fn round_trips_are_measured_at_the_capture_point() {
    let s = Scratch::new();
    let p = s.path("rtt.pcap");
    round_trips().write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    let flows = flows_by_id(&doc);
    let acks = &flows["198.18.8.2>198.18.8.1 vni null ->- qp 1537"];
    let rtt = &acks["rtt"];
    assert_eq!(rtt["samples"], 2, "{acks}");
    assert_eq!(rtt["min_us"], 3.0, "{acks}");
    // p50 is the middle of the first sample's bucket (within 3.1% of 3 µs), p99 the
    // longest sample.
    let p50 = rtt["p50_us"].as_f64().unwrap_or_default();
    assert!((p50 / 3.0 - 1.0).abs() < 0.031, "{acks}");
    assert_eq!(rtt["p99_us"], 5.0, "{acks}");
    let requests = &flows["198.18.8.1>198.18.8.2 vni null ->- qp 1536"];
    assert!(requests["rtt"].is_null(), "{requests}");
}

/// A capture whose every RoCE frame has lost its ICRC (zeroed, as a path that does not
/// keep it hands frames over), PSNs in sequence: the capture path, not the fabric.
/// The same frames with one bad ICRC among good ones: corruption.
#[test]
fn an_icrc_no_frame_kept_is_the_capture_paths_not_the_fabrics() {
    let eth = Eth::default();
    let a_b = L3::v4(v4("198.18.9.1"), v4("198.18.9.2")).with_tos(TOS_DATA);
    let b_a = L3::v4(v4("198.18.9.2"), v4("198.18.9.1")).with_tos(TOS_DATA);
    let frames = |zeroed: &dyn Fn(usize) -> bool| {
        let mut f = Frames::default();
        for psn in 0..12u32 {
            f.push(roce_frame(
                &eth,
                &a_b,
                0xC000,
                &RoceMsg::send_only(0x700, psn, 128),
            ));
            f.push(roce_frame(
                &eth,
                &b_a,
                0xC001,
                &RoceMsg::ack(0x701, psn, 0x1F),
            ));
        }
        for (i, frame) in f.0.iter_mut().enumerate() {
            if zeroed(i) {
                let n = frame.len();
                frame[n - 4..].fill(0);
            }
        }
        f
    };
    let s = Scratch::new();
    let checks = |doc: &Value| -> Vec<String> {
        doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["check"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let all = s.path("icrc-all.pcap");
    frames(&|_| true).write_pcap(&all);
    let (doc, _) = analyze_json(&all, "reference");
    let found = checks(&doc);
    assert!(
        found.contains(&"icrc_not_preserved".to_string()),
        "{found:?}"
    );
    assert!(!found.contains(&"icrc_errors".to_string()), "{found:?}");
    let one = s.path("icrc-one.pcap");
    frames(&|i| i == 5).write_pcap(&one);
    let (doc, _) = analyze_json(&one, "reference");
    let found = checks(&doc);
    assert!(found.contains(&"icrc_errors".to_string()), "{found:?}");
    assert!(
        !found.contains(&"icrc_not_preserved".to_string()),
        "{found:?}"
    );
}

/// The ECN -> CNP loop in a capture: `marks` CE-marked writes 198.18.0.1 -> .2 on QP
/// 0x600, ACKs back on QP 0x601, and `cnps` CNPs back to QP 0x601.
fn ce_loop(marks: u32, cnps: u32) -> Frames {
    let eth = Eth::default();
    let mut f = Frames::default();
    for psn in 0..20 {
        let tos = if psn < marks { TOS_CE } else { TOS_DATA };
        f.push(roce_frame(
            &eth,
            &plain(tos),
            0xC000,
            &RoceMsg::write_only(0x600, psn, 256),
        ));
        f.push(roce_frame(
            &eth,
            &plain_back(TOS_DATA),
            0xC001,
            &RoceMsg::ack(0x601, psn, 0x1F),
        ));
    }
    for _ in 0..cnps {
        f.push(roce_frame(&eth, &plain_back(TOS_CNP), 0xC001, &cnp(0x601)));
    }
    f
}

/// The findings of `frames` named `check`, with the reference engine.
fn findings_named(frames: &Frames, check: &str) -> Vec<Value> {
    let s = Scratch::new();
    let p = s.path("verdict.pcap");
    frames.write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check)
        .cloned()
        .collect()
}

#[test]
fn ce_marks_that_no_cnp_answers_are_a_broken_loop_and_the_near_misses_are_not() {
    let found = findings_named(&ce_loop(10, 0), "ce_unanswered");
    assert_eq!(found.len(), 1, "{found:?}");
    let f = &found[0];
    assert_eq!(f["severity"], "error");
    assert_eq!(f["flows"], 1);
    assert_eq!(f["interface"], Value::Null);
    let text = f["found"].as_str().unwrap();
    // 40 frames 1 µs apart.
    assert!(
        text.starts_with("10 CE-marked RoCE packets 198.18.0.1→198.18.0.2 in the capture (39 µs)"),
        "{text}"
    );
    assert!(
        text.ends_with("no CNP back among the 20 RoCE packets 198.18.0.2→198.18.0.1"),
        "{text}"
    );
    assert!(f["fix"].as_str().unwrap().contains("roce_np"), "{f}");
    // Nine marks are too few to say; one CNP answers them.
    assert!(findings_named(&ce_loop(9, 0), "ce_unanswered").is_empty());
    assert!(findings_named(&ce_loop(20, 1), "ce_unanswered").is_empty());
    // A config whose [verdicts] asks for 5 marks says it of nine.
    let s = Scratch::new();
    let (p, cfg) = (s.path("nine.pcap"), s.path("verdicts.toml"));
    ce_loop(9, 0).write_pcap(&p);
    fs::write(&cfg, "[verdicts]\nmin_ce = 5\n").unwrap();
    let out = agent(&[
        "analyze",
        p.to_str().unwrap(),
        "--json",
        "--fail-on",
        "never",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: Vec<&Value> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "ce_unanswered")
        .collect();
    assert_eq!(found.len(), 1, "{doc}");
    assert!(
        found[0]["found"]
            .as_str()
            .unwrap()
            .starts_with("9 CE-marked"),
        "{}",
        found[0]
    );
}

#[test]
fn a_cnp_flow_times_its_answer_to_the_first_unanswered_mark_and_its_spacing() {
    // ce_loop(10, 2): 20 writes (the first 10 CE-marked) each with its ACK, frames
    // 1 µs apart (0 to 39 µs), then 2 CNPs back on the ACKs' flow at 40 and 41 µs.
    let s = Scratch::new();
    let p = s.path("cnp_times.pcap");
    ce_loop(10, 2).write_pcap(&p);
    let (doc, _) = analyze_json(&p, "reference");
    let flows = doc["flows"].as_array().expect("flows");
    let cnp_flow = flows
        .iter()
        .find(|f| f["cnps"] == 2)
        .expect("the flow of the CNPs");
    // The first mark was the first frame (0 µs), the first CNP came at 40 µs; the
    // second CNP answers no new mark.
    assert_eq!(cnp_flow["ce_to_cnp"]["samples"], 1, "{cnp_flow}");
    assert_eq!(cnp_flow["ce_to_cnp"]["min_us"], 40.0, "{cnp_flow}");
    assert_eq!(cnp_flow["cnp_interval"]["samples"], 1, "{cnp_flow}");
    assert_eq!(cnp_flow["cnp_interval"]["min_us"], 1.0, "{cnp_flow}");
    // Flows without CNPs have neither.
    for f in flows.iter().filter(|f| f["cnps"] == 0) {
        assert!(
            f["ce_to_cnp"].is_null() && f["cnp_interval"].is_null(),
            "{f}"
        );
    }
}

#[test]
fn many_queue_pairs_on_one_source_port_are_low_ecmp_entropy() {
    let eth = Eth::default();
    let frames = |ports: u16| {
        let mut f = Frames::default();
        for qp in 0..8u32 {
            let sport = 0xC000 + (qp as u16 % ports);
            f.push(roce_frame(
                &eth,
                &plain(TOS_DATA),
                sport,
                &RoceMsg::write_only(0x700 + qp, 1, 64),
            ));
        }
        f
    };
    let found = findings_named(&frames(1), "ecmp_low_entropy");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["severity"], "warning");
    assert_eq!(found[0]["flows"], 8);
    assert_eq!(
        found[0]["found"],
        "8 queue pairs 198.18.0.1→198.18.0.2 on 1 UDP source port (49152): ECMP spreads them over 1 path at most"
    );
    assert!(findings_named(&frames(2), "ecmp_low_entropy").len() == 1);
    assert!(findings_named(&frames(3), "ecmp_low_entropy").is_empty());
}

#[test]
fn real_captures_have_no_ce_so_no_loop_verdict_and_a_source_port_per_queue_pair() {
    for p in real_captures() {
        let (doc, _) = analyze_json(&p, "reference");
        let flows = doc["flows"].as_array().expect("flows");
        let ce: u64 = flows
            .iter()
            .map(|f| f["ecn"]["ce"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            ce,
            0,
            "{}: soft-RoCE on a quiet link marks nothing",
            p.display()
        );
        // Per path: the queue pairs and their source ports (rdma_rxe derives the port
        // from the QP).
        let mut paths: BTreeMap<(String, String), (BTreeSet<u64>, BTreeSet<u64>)> = BTreeMap::new();
        for f in flows {
            let e = paths
                .entry((f["src"].to_string(), f["dst"].to_string()))
                .or_default();
            e.0.insert(f["dest_qp"].as_u64().unwrap());
            e.1.insert(f["sport"].as_u64().unwrap());
        }
        for (path, (qps, ports)) in &paths {
            assert_eq!(qps.len(), ports.len(), "{}: {path:?}", p.display());
        }
        let verdicts: Vec<&Value> = doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| {
                ["ce_unanswered", "ecmp_low_entropy", "inner_ce_lost"]
                    .contains(&f["check"].as_str().unwrap_or(""))
            })
            .collect();
        assert!(verdicts.is_empty(), "{}: {verdicts:?}", p.display());
    }
}
