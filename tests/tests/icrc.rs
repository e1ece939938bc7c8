//! The ICRC and the classifier against traffic nobody on this project generated: the
//! real soft-RoCE captures in `shared/captures` (see its README for provenance).
//!
//! - Every RoCE frame's ICRC (last 4 bytes of the UDP payload, little-endian as rxe
//!   stores it) is what `roce_common::icrc::icrc` computes, and the masked fields are
//!   exactly the variant ones.
//! - The captures through the real XDP program give the same flows and STATS as the
//!   reference classifier, and the counts tshark reports.
//! - When scapy is installed, its `contrib.roce` ICRC agrees with our builder's.
//!
//! The capture checks always run: a missing captures folder fails them
//! (`ROCE_CAPTURES` points elsewhere). The XDP check needs root.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

use roce_common::config::RuntimeConfig;
use roce_common::counters::class_index;
use roce_common::icrc::icrc;
use roce_common::parsed::Class;
use roce_common::reference::ReferenceTable;
use roce_testkit::frame::{cnp, opcode, roce_frame, vxlan_frame, Eth, RoceMsg, VlanTag, L3};
use roce_testkit::tshark;
use roce_tests::expect::{compare_with_reference, describe, TEST_RUN_IFINDEX};
use roce_tests::harness::Harness;
use roce_tests::hex;
use roce_tests::pcap::{self, capture_files, captures_dir, LINKTYPE_ETHERNET};

/// What tshark 4.0 reports for each capture, the independent oracle:
/// frames (`tshark -r F | wc -l`), RoCE frames (`-Y udp.dstport==4791`), TCP frames
/// (`-Y tcp`), ACKNOWLEDGE frames (`-Y infiniband.bth.opcode==17`, all of syndrome
/// class ACK), and distinct (ip.src, ip.dst, infiniband.bth.destqp) triples.
struct Expected {
    file: &'static str,
    frames: usize,
    roce: u64,
    tcp: u64,
    acks: u64,
    flows: usize,
}

const EXPECTED: [Expected; 8] = [
    Expected {
        file: "rxe-atomic.pcap",
        frames: 48,
        roce: 10,
        tcp: 38,
        acks: 0,
        flows: 2,
    },
    Expected {
        file: "rxe-nccl-allreduce.pcap",
        frames: 954,
        roce: 184,
        tcp: 770,
        acks: 64,
        flows: 4,
    },
    Expected {
        file: "rxe-nccl-tree.pcap",
        frames: 168,
        roce: 124,
        tcp: 44,
        acks: 16,
        flows: 8,
    },
    Expected {
        file: "rxe-rdmacm-send-write.pcap",
        frames: 96,
        roce: 96,
        tcp: 0,
        acks: 37,
        flows: 6,
    },
    Expected {
        file: "rxe-read.pcap",
        frames: 60,
        roce: 20,
        tcp: 40,
        acks: 0,
        flows: 2,
    },
    Expected {
        file: "rxe-rping.pcap",
        frames: 65,
        roce: 65,
        tcp: 0,
        acks: 25,
        flows: 4,
    },
    Expected {
        file: "rxe-uc.pcap",
        frames: 21,
        roce: 10,
        tcp: 11,
        acks: 0,
        flows: 2,
    },
    Expected {
        file: "rxe-ud.pcap",
        frames: 21,
        roce: 10,
        tcp: 11,
        acks: 0,
        flows: 2,
    },
];

/// Offsets of a RoCEv2 frame over untagged IPv4: (IP header, UDP header, end of the
/// UDP datagram). None for anything else.
fn roce_v4_offsets(f: &[u8]) -> Option<(usize, usize, usize)> {
    if f.len() < 14 + 20 + 8 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 || f[23] != 17 {
        return None;
    }
    let l4 = 14 + (f[14] & 0x0F) as usize * 4;
    let dport = u16::from_be_bytes([*f.get(l4 + 2)?, *f.get(l4 + 3)?]);
    if dport != 4791 {
        return None;
    }
    let udp_len = u16::from_be_bytes([*f.get(l4 + 4)?, *f.get(l4 + 5)?]) as usize;
    Some((14, l4, l4 + udp_len))
}

/// True when the frame's stored ICRC is what we compute.
fn icrc_matches(f: &[u8], l3: usize, l4: usize, end: usize) -> bool {
    if end > f.len() || end < l4 + 8 + 12 + 4 {
        return false;
    }
    match icrc(&f[l3..l4], &f[l4..end - 4]) {
        Some(c) => f[end - 4..end] == c.to_le_bytes(),
        None => false,
    }
}

fn load_capture(path: &Path) -> pcap::Capture {
    let cap = match pcap::read(path) {
        Ok(c) => c,
        Err(e) => panic!("{}: {e}", path.display()),
    };
    assert_eq!(cap.linktype, LINKTYPE_ETHERNET, "{}", path.display());
    for (i, r) in cap.records.iter().enumerate() {
        assert_eq!(
            r.data.len() as u32,
            r.orig_len,
            "{} frame {} was snapped",
            path.display(),
            i + 1
        );
    }
    cap
}

fn files() -> Vec<std::path::PathBuf> {
    let files = match capture_files() {
        Ok(f) => f,
        Err(e) => panic!(
            "the real captures are missing from {} ({e}); set ROCE_CAPTURES",
            captures_dir().display()
        ),
    };
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let want: Vec<&str> = EXPECTED.iter().map(|e| e.file).collect();
    assert_eq!(names, want, "captures in {}", captures_dir().display());
    files
}

#[test]
fn every_roce_frame_of_the_real_captures_carries_the_icrc_we_compute() {
    let mut total = 0;
    for (path, exp) in files().iter().zip(EXPECTED.iter()) {
        let cap = load_capture(path);
        assert_eq!(cap.records.len(), exp.frames, "{}", exp.file);
        let mut roce = 0;
        for (i, r) in cap.records.iter().enumerate() {
            let Some((l3, l4, end)) = roce_v4_offsets(&r.data) else {
                continue;
            };
            roce += 1;
            assert!(
                icrc_matches(&r.data, l3, l4, end),
                "{} frame {}: ICRC mismatch\n{}",
                exp.file,
                i + 1,
                hex(&r.data)
            );
        }
        assert_eq!(roce, exp.roce, "{}: RoCE frames", exp.file);
        println!("{}: {roce} RoCE frames, every ICRC right", exp.file);
        total += roce;
    }
    assert_eq!(total, 519);
}

#[test]
fn icrc_of_real_frames_masks_exactly_the_variant_fields() {
    for path in files() {
        let cap = load_capture(&path);
        // The first RoCE frame of each capture, every byte flipped in turn.
        let Some((f, (l3, l4, end))) = cap
            .records
            .iter()
            .find_map(|r| roce_v4_offsets(&r.data).map(|o| (r.data.clone(), o)))
        else {
            panic!("{}: no RoCE frame", path.display());
        };
        // IPv4 TOS (1), TTL (8), header checksum (10, 11); UDP checksum (6, 7); BTH byte 4.
        let masked: Vec<usize> =
            [l3 + 1, l3 + 8, l3 + 10, l3 + 11, l4 + 6, l4 + 7, l4 + 8 + 4].to_vec();
        for at in l3..end - 4 {
            let mut g = f.clone();
            g[at] ^= 0x01;
            let ok = icrc_matches(&g, l3, l4, end);
            // (A flipped IHL bit is judged on the original offsets: it breaks the ICRC.)
            assert_eq!(
                ok,
                masked.contains(&at),
                "{}: flipping byte {at} {} the ICRC",
                path.display(),
                if ok { "kept" } else { "broke" }
            );
        }
    }
}

#[test]
fn captures_through_xdp_match_the_reference_and_tshark() {
    let mut h = Harness::load();
    for (path, exp) in files().iter().zip(EXPECTED.iter()) {
        let cap = load_capture(path);
        h.reset();
        let mut reference = ReferenceTable::new(RuntimeConfig::default());
        for r in &cap.records {
            h.pass(&r.data);
            reference.process(&r.data, TEST_RUN_IFINDEX, r.ts_ns);
        }
        let flows = h.flows();
        let stats = h.stats();
        if let Err(d) = compare_with_reference(&flows, &stats, &reference) {
            panic!("{}: kernel and reference differ: {d}", exp.file);
        }
        let ctx = format!("{}: {}", exp.file, describe(&stats));
        assert_eq!(stats[class_index(Class::Roce) as usize], exp.roce, "{ctx}");
        assert_eq!(
            stats[class_index(Class::OtherIp) as usize],
            exp.tcp,
            "{ctx}"
        );
        assert_eq!(
            stats.iter().sum::<u64>(),
            exp.frames as u64 + exp.flows as u64,
            "{ctx}"
        );
        assert_eq!(flows.len(), exp.flows, "{ctx}");
        let sum = |f: fn(&roce_common::flow::FlowStats) -> u64| flows.values().map(f).sum::<u64>();
        assert_eq!(sum(|s| s.packets), exp.roce, "{ctx}");
        assert_eq!(sum(|s| s.acks), exp.acks, "{ctx}");
        assert_eq!(
            (sum(|s| s.naks), sum(|s| s.rnr_naks), sum(|s| s.cnps)),
            (0, 0, 0),
            "{ctx}"
        );
        // soft-RoCE marks nothing: DSCP 0, Not-ECT on every packet.
        assert_eq!(sum(|s| s.ecn[0]), exp.roce, "{ctx}");
        assert!(
            flows
                .values()
                .all(|s| s.last_dscp == 0 && s.inner_ecn == [0; 4]),
            "{ctx}"
        );
        // No capture loses a packet: retransmissions (nccl-tree) and multi-PSN READs
        // (rxe-read: 3000 bytes at PMTU 1024 take 3 PSNs) are no gap.
        assert_eq!(sum(|s| s.psn_gaps), 0, "{ctx}");
        if exp.file == "rxe-read.pcap" {
            let learnt: BTreeMap<u32, u8> = flows
                .iter()
                .map(|(k, s)| (k.dest_qp, s.psn.pmtu_log2))
                .collect();
            assert_eq!(
                learnt.get(&0x1c),
                Some(&10),
                "{ctx}: PMTU of the READ requester"
            );
        }
        println!("{ctx}");
    }
}

/// The counts above are tshark's: checked again against the tshark installed here
/// (skipped, saying so, without one).
#[test]
fn expected_counts_are_what_tshark_decodes() {
    if !tshark::available() {
        eprintln!("skipped: tshark is not installed");
        return;
    }
    let fields = tshark::Fields::new(&[
        "frame.protocols",
        "udp.dstport",
        "infiniband.bth.opcode",
        "ip.src",
        "ip.dst",
        "infiniband.bth.destqp",
    ]);
    for (path, exp) in files().iter().zip(EXPECTED.iter()) {
        let rows = fields
            .run(path)
            .unwrap_or_else(|e| panic!("{}: {e:#}", exp.file));
        let count = |f: &dyn Fn(&tshark::Row) -> bool| rows.iter().filter(|r| f(r)).count() as u64;
        let roce = count(&|r| r.all(1).iter().any(|p| p == "4791"));
        let tcp = count(&|r| r.first(0).is_some_and(|p| p.split(':').any(|l| l == "tcp")));
        let acks = count(&|r| r.all(2).iter().any(|o| o == "17"));
        let flows: std::collections::BTreeSet<(&str, &str, &str)> = rows
            .iter()
            .filter_map(|r| Some((r.first(3)?, r.first(4)?, r.first(5)?)))
            .collect();
        assert_eq!(
            (rows.len(), roce, tcp, acks, flows.len()),
            (exp.frames, exp.roce, exp.tcp, exp.acks, exp.flows),
            "{}: (frames, RoCE, TCP, ACKs, flows) by tshark",
            exp.file
        );
    }
}

// ---------------------------------------------------------------------------------
// scapy, when installed, as an independent ICRC implementation

const SCAPY_SCRIPT: &str = r#"
import sys
try:
    from scapy.all import Ether, raw
    from scapy.contrib.roce import BTH
except Exception as e:
    print("NO-SCAPY %s" % e)
    sys.exit(0)
for line in open(sys.argv[1]):
    p = Ether(bytes.fromhex(line.strip()))
    if BTH not in p:
        print("NO-BTH")
        continue
    p[BTH].icrc = None
    print(raw(p).hex())
"#;

fn scapy_frames() -> Vec<Vec<u8>> {
    let v4 = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
    let mut v6 = L3::v6(
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    );
    if let L3::V6(h) = &mut v6 {
        h.flow_label = 0xABCDE;
        h.hop_limit = 3;
    }
    let l3s = [
        v4.clone().with_tos(106),
        v4.clone().with_tos(0xC3).with_options(&[1, 1, 1, 1]),
        v6.with_tos(0x6B),
    ];
    let msgs = [
        RoceMsg::send_only(0x12, 1, 0),
        RoceMsg::send_only(0x12, 2, 5),
        RoceMsg::write_only(0xABCDEF, 0xFF_FFFF, 64),
        RoceMsg::read_request(7, 100, 3000),
        RoceMsg::ack(7, 100, 0x61).with_fecn(true),
        cnp(0x42),
        RoceMsg::new(opcode::UD_SEND_ONLY, 1, 9).with_payload(33),
        RoceMsg::new(opcode::RC_FETCH_ADD, 3, 4).with_becn(true),
        RoceMsg::new(opcode::XRC | 0x04, 3, 4).with_payload(7),
    ];
    let mut frames = Vec::new();
    for l3 in &l3s {
        for m in &msgs {
            frames.push(roce_frame(&Eth::default(), l3, 0xC000, m));
        }
    }
    let tagged = Eth::default().with_vlan(VlanTag::dot1q(5));
    frames.push(roce_frame(&tagged, &l3s[0], 0xC001, &msgs[2]));
    let inner = roce_frame(&Eth::default(), &l3s[2], 0xC002, &msgs[4]);
    frames.push(vxlan_frame(&Eth::default(), &l3s[0], 0xD000, 5001, &inner));
    frames
}

#[test]
fn builder_icrc_agrees_with_scapy_when_scapy_is_installed() {
    let frames = scapy_frames();
    let dir = std::env::temp_dir().join(format!("roce-icrc-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    let input = dir.join("frames.hex");
    let text: String = frames.iter().map(|f| format!("{}\n", to_hex(f))).collect();
    std::fs::write(&input, text).expect("writing the frames for scapy");
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCAPY_SCRIPT)
        .arg(&input)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("python3 failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            println!("NOTE: python3 not available ({e}): scapy ICRC comparison skipped");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(line) = stdout.lines().find(|l| l.starts_with("NO-SCAPY")) {
        println!("NOTE: scapy is not installed ({line}): scapy ICRC comparison skipped; `pip install scapy` enables it");
        return;
    }
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), frames.len(), "scapy output:\n{stdout}");
    for (f, line) in frames.iter().zip(lines) {
        assert_eq!(
            line,
            to_hex(f),
            "scapy rebuilt the frame differently:\n{}",
            hex(f)
        );
    }
    println!("scapy agrees on {} frames", frames.len());
}

fn to_hex(f: &[u8]) -> String {
    f.iter().map(|b| format!("{b:02x}")).collect()
}
