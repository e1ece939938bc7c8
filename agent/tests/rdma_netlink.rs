//! The QP table from RDMA netlink on the fixtures of `tests/fixtures/rdma/` (see its
//! README: encoded as Linux 6.1's nldev.c fills its replies, not recorded from
//! hardware): the kernel's numbers against the C headers, the replies decoded with
//! exact values (per-QP counters as mlx5 binds them, an rxe host with rdma_cm), the
//! table joined with owners from a fixture `/proc`, QPs that go, and malformed input.

// Test code: a failed unwrap, expect or panic is a failed test (see [workspace.lints]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use roce_agent::doc::qp::{Qp, RdmaPort};
use roce_agent::rdma::netlink::attrs::*;
use roce_agent::rdma::netlink::decode::{self, CmIdRecord, CounterRecord, QpRecord};
use roce_agent::rdma::netlink::synthetic;
use roce_agent::rdma::netlink::wire::{messages, Writer};
use roce_agent::rdma::owner::{Owner, OwnerReader};
use roce_agent::rdma::{BoundCounter, Dump, QpTable, QpTableOptions, RdmaError};

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/rdma")
        .join(path)
}

/// The datagrams of an annotated hex file: `@datagram` opens one, `#` comments.
fn hex_datagrams(path: &str) -> Vec<Vec<u8>> {
    let text = std::fs::read_to_string(fixture(path)).unwrap();
    let mut out: Vec<Vec<u8>> = Vec::new();
    for line in text.lines() {
        let data = line.split('#').next().unwrap().trim();
        if data == "@datagram" {
            out.push(Vec::new());
            continue;
        }
        for byte in data.split_whitespace() {
            out.last_mut()
                .unwrap()
                .push(u8::from_str_radix(byte, 16).unwrap());
        }
    }
    out
}

fn host_dump(host: &str) -> Dump {
    Dump {
        devices: hex_datagrams(&format!("{host}/devices.hex")),
        ports: hex_datagrams(&format!("{host}/ports.hex")),
        qps: hex_datagrams(&format!("{host}/qps.hex")),
        cm_ids: hex_datagrams(&format!("{host}/cm_ids.hex")),
        qp_counters: hex_datagrams(&format!("{host}/qp_counters.hex")),
        port_counters: hex_datagrams(&format!("{host}/port_counters.hex")),
    }
}

fn slices(v: &[Vec<u8>]) -> impl Iterator<Item = &[u8]> {
    v.iter().map(Vec::as_slice)
}

fn table() -> QpTable {
    QpTable::new(QpTableOptions {
        proc_root: fixture("proc"),
    })
}

// ---------------------------------------------------------------------------------
// The kernel's numbers

#[test]
fn every_kernel_number_equals_the_c_headers() {
    let header = Path::new("/usr/include/rdma/rdma_netlink.h");
    if !header.exists() {
        eprintln!(
            "SKIPPED: {} is missing (Debian: linux-libc-dev; `cargo xtask setup` installs it)",
            header.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-rdma-numbers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <stdio.h>\n#include <linux/netlink.h>\n#include <rdma/rdma_netlink.h>\n\
         #include <rdma/ib_user_ioctl_verbs.h>\n#include <rdma/rdma_user_cm.h>\n\
         int main(void) {\n",
    );
    for (name, _) in KERNEL_NUMBERS {
        c.push_str(&format!(
            "  printf(\"%s %lld\\n\", \"{name}\", (long long)({name}));\n"
        ));
    }
    c.push_str("  return 0;\n}\n");
    let source = dir.join("numbers.c");
    let program = dir.join("numbers");
    std::fs::write(&source, c).unwrap();
    let built = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .expect("gcc is needed to read the kernel headers (cargo xtask setup installs it)");
    assert!(
        built.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&program).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let printed: BTreeMap<String, i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect();
    assert_eq!(printed.len(), KERNEL_NUMBERS.len());
    for (name, ours) in KERNEL_NUMBERS {
        assert_eq!(
            Some(*ours as i64),
            printed.get(*name).copied(),
            "{name}: ours against the header's"
        );
    }
    // The message types as the header's macro builds them.
    assert_eq!(
        nldev_type(RDMA_NLDEV_CMD_STAT_GET),
        (RDMA_NL_NLDEV << 10) + 17
    );
}

// ---------------------------------------------------------------------------------
// mlx5: per-QP hardware counters

/// mlx5's counter names in `mlx5_ib_fill_counters` order (the README's capabilities):
/// 23 Q counters, 4 congestion counters, 1 PPCNT counter.
const MLX5_NAMES: [&str; 28] = [
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
];

/// Counter 3 (mlx5_0/1, auto by type) and counter 5 (mlx5_1/1, manual): Q counters;
/// the congestion and PPCNT entries a bound counter reports stay 0.
const C3: [u64; 23] = [
    1843200, 12288, 0, 0, 3, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, 1, 2,
];
const C5: [u64; 23] = [
    20480, 96, 0, 17, 0, 0, 1, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0,
];
/// mlx5_0/1's port counters: every figure, the congestion ones non-zero.
const PORT1: [u64; 28] = [
    9437184, 65536, 128, 311, 42, 7, 2, 11, 6, 3, 0, 1, 0, 0, 0, 0, 12, 9, 40, 4, 9, 9, 17, 2,
    1534, 228731, 9876, 0,
];

fn bound(q: &[u64; 23]) -> Vec<(String, u64)> {
    MLX5_NAMES
        .iter()
        .zip(q.iter().chain([0u64; 5].iter()))
        .map(|(n, v)| (n.to_string(), *v))
        .collect()
}

fn as_map(pairs: &[(String, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().cloned().collect()
}

#[test]
fn per_qp_counters_as_mlx5_binds_them_decode_exactly() {
    let dump = host_dump("mlx5");
    // The QP lists and counter tables are NLA_F_NESTED (nla_nest_start): read only
    // with the flag masked off.
    let records = decode::qp_counters(slices(&dump.qp_counters)).unwrap();
    assert_eq!(
        records,
        vec![
            CounterRecord {
                device_index: 0,
                device: "mlx5_0".into(),
                port: 1,
                id: 3,
                mode: RDMA_COUNTER_MODE_AUTO,
                auto_qp_type: Some(IB_UVERBS_QPT_RC),
                lqpns: vec![0x1a4, 0x1a5],
                hwcounters: bound(&C3),
            },
            CounterRecord {
                device_index: 1,
                device: "mlx5_1".into(),
                port: 1,
                id: 5,
                mode: RDMA_COUNTER_MODE_MANUAL,
                auto_qp_type: None,
                lqpns: vec![0x88],
                hwcounters: bound(&C5),
            },
        ]
    );
    let ports = decode::port_counters(slices(&dump.port_counters)).unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!((ports[0].device.as_str(), ports[0].port), ("mlx5_0", 1));
    let expected: Vec<(String, u64)> = MLX5_NAMES
        .iter()
        .zip(PORT1)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    assert_eq!(ports[0].hwcounters, expected);
}

/// A QP as the table shows it, before owner and rdma_cm fields.
fn qp(device: &str, netdev: Option<&str>, lqpn: u32, qp_type: &str, state: &str) -> Qp {
    Qp {
        device: device.into(),
        port: Some(1),
        lqpn,
        rqpn: None,
        qp_type: qp_type.into(),
        state: state.into(),
        sq_psn: None,
        rq_psn: None,
        pid: None,
        comm: None,
        cgroup: None,
        pod_uid: None,
        container_id: None,
        src: None,
        dst: None,
        counters: BTreeMap::new(),
        counter_id: None,
        seen_on_wire: false,
        netdev: netdev.map(str::to_string),
        src_port: None,
        dst_port: None,
        gone: false,
        wire: None,
    }
}

fn gsi(device: &str, netdev: &str) -> Qp {
    Qp {
        sq_psn: Some(0),
        comm: Some("ib_core".into()),
        ..qp(device, Some(netdev), 1, "GSI", "RTS")
    }
}

const PYTHON_CGROUP: &str = "/kubepods.slice/kubepods-pod9d8e7f6a_5b4c_4d3e_8f2a_1b0c9d8e7f6a.slice/cri-containerd-11a4a60b518bf24989d481468076e5d5982884626aed9faeb35b8576fcd223e1.scope";

fn python3(mut q: Qp) -> Qp {
    q.pid = Some(41237);
    q.comm = Some("python3".into());
    q.cgroup = Some(PYTHON_CGROUP.into());
    q.pod_uid = Some("9d8e7f6a-5b4c-4d3e-8f2a-1b0c9d8e7f6a".into());
    q.container_id =
        Some("11a4a60b518bf24989d481468076e5d5982884626aed9faeb35b8576fcd223e1".into());
    q
}

fn ib_send_bw(mut q: Qp) -> Qp {
    q.pid = Some(52001);
    q.comm = Some("ib_send_bw".into());
    q.cgroup = Some("/system.slice/rdma-perftest.service".into());
    q
}

#[test]
fn the_mlx5_table_gives_bound_qps_their_counters() {
    let snapshot = table().refresh_from(&host_dump("mlx5")).unwrap();
    let c3 = as_map(&bound(&C3));
    let c5 = as_map(&bound(&C5));
    let expected = vec![
        gsi("mlx5_0", "ens1f0np0"),
        python3(Qp {
            rqpn: Some(0x1c7),
            sq_psn: Some(0x91b3c4),
            rq_psn: Some(0x5e2a71),
            counters: c3.clone(),
            counter_id: Some(3),
            ..qp("mlx5_0", Some("ens1f0np0"), 0x1a4, "RC", "RTS")
        }),
        python3(Qp {
            rqpn: Some(0x1c8),
            sq_psn: Some(0x0c44e9),
            rq_psn: Some(0x7f0012),
            counters: c3.clone(),
            counter_id: Some(3),
            ..qp("mlx5_0", Some("ens1f0np0"), 0x1a5, "RC", "RTS")
        }),
        gsi("mlx5_1", "ens1f1np1"),
        ib_send_bw(Qp {
            rqpn: Some(0x91),
            sq_psn: Some(0x2d9a10),
            rq_psn: Some(0x1b2c3d),
            counters: c5.clone(),
            counter_id: Some(5),
            ..qp("mlx5_1", Some("ens1f1np1"), 0x88, "RC", "RTS")
        }),
        ib_send_bw(Qp {
            sq_psn: Some(7),
            ..qp("mlx5_1", Some("ens1f1np1"), 0x89, "UD", "RTS")
        }),
    ];
    assert_eq!(snapshot.qps, expected);
    let port1: BTreeMap<String, u64> = MLX5_NAMES
        .iter()
        .zip(PORT1)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    assert_eq!(
        snapshot.ports,
        vec![
            RdmaPort {
                device: "mlx5_0".into(),
                port: 1,
                netdev: Some("ens1f0np0".into()),
                counters: port1,
            },
            RdmaPort {
                device: "mlx5_1".into(),
                port: 1,
                netdev: Some("ens1f1np1".into()),
                counters: BTreeMap::new(),
            },
        ]
    );
    assert_eq!(
        snapshot.bound_counters,
        vec![
            BoundCounter {
                device: "mlx5_0".into(),
                port: 1,
                id: 3,
                mode: "auto".into(),
                lqpns: vec![0x1a4, 0x1a5],
                counters: c3,
            },
            BoundCounter {
                device: "mlx5_1".into(),
                port: 1,
                id: 5,
                mode: "manual".into(),
                lqpns: vec![0x88],
                counters: c5,
            },
        ]
    );
}

// ---------------------------------------------------------------------------------
// rxe: QPs with rdma_cm addresses, owners

const RXE_NAMES: [&str; 15] = [
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];
const RXE_VALUES: [u64; 15] = [
    1048611, 1048590, 0, 2, 0, 0, 1, 3, 0, 0, 1, 0, 0, 524288, 524301,
];

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

fn owned(
    mut q: Qp,
    pid: u32,
    comm: &str,
    cgroup: &str,
    pod: Option<&str>,
    ctr: Option<&str>,
) -> Qp {
    q.pid = Some(pid);
    q.comm = Some(comm.into());
    q.cgroup = Some(cgroup.into());
    q.pod_uid = pod.map(str::to_string);
    q.container_id = ctr.map(str::to_string);
    q
}

fn rdma_cm(mut q: Qp, src: &str, src_port: u16, dst: &str, dst_port: u16) -> Qp {
    q.src = ip(src);
    q.src_port = Some(src_port);
    q.dst = ip(dst);
    q.dst_port = Some(dst_port);
    q
}

const WRITE_BW_ID: &str = "736119b3b4299584ccd62a29a0cb04647dc5d71d6392a3491ebb1e1cb4999593";
const RPING_ID: &str = "aebe2a01313476de3162e483b46bc0c4492b6bfb3187b4b449ebcf6cc3c90f2b";
const UD_ID: &str = "f0a85e81a4cdc5b0ffa6b6bae7015c00d3cc730d040c955859d3b797aaba3ce9";
const NCCL_ID: &str = "d53cb32a5dec0414b71f04427701143e4809727be5c6bef60a6c4f0d2a94f75b";

fn rxe_expected() -> Vec<Qp> {
    let veth = Some("veth0");
    vec![
        gsi("rxe0", "veth0"),
        rdma_cm(
            owned(
                Qp {
                    rqpn: Some(0x31),
                    rq_psn: Some(0x3c1f2a),
                    sq_psn: Some(0x0a7b21),
                    ..qp("rxe0", veth, 17, "RC", "RTS")
                },
                2201,
                "ib_write_bw",
                &format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_5f6a_4b7c_8d9e_0f1a2b3c4d5e.slice/cri-containerd-{WRITE_BW_ID}.scope"
                ),
                Some("1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"),
                Some(WRITE_BW_ID),
            ),
            "198.18.0.1",
            18515,
            "198.18.0.2",
            41234,
        ),
        rdma_cm(
            owned(
                Qp {
                    rqpn: Some(0x2c),
                    rq_psn: Some(0x6b1a0c),
                    sq_psn: Some(0x5d0e3f),
                    ..qp("rxe0", veth, 18, "RC", "RTS")
                },
                2305,
                "rping",
                &format!("/kubepods/burstable/pod7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d/{RPING_ID}"),
                Some("7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"),
                Some(RPING_ID),
            ),
            "2001:db8::1",
            49152,
            "2001:db8::2",
            7174,
        ),
        owned(
            Qp {
                sq_psn: Some(0xfa2),
                ..qp("rxe0", veth, 19, "UD", "RTS")
            },
            2410,
            "ibv_ud_pingpong",
            &format!("/system.slice/docker-{UD_ID}.scope"),
            None,
            Some(UD_ID),
        ),
        rdma_cm(
            owned(
                Qp {
                    rqpn: Some(0x40),
                    rq_psn: Some(0x2a9d77),
                    sq_psn: Some(0x44c801),
                    ..qp("rxe0", veth, 20, "RC", "ERR")
                },
                2202,
                "ib_write_bw",
                "/user.slice/user-0.slice/session-4.scope",
                None,
                None,
            ),
            "198.18.0.1",
            52000,
            "198.18.0.3",
            18515,
        ),
        // RESET: no port yet, and the remote QPN the kernel sends is the unset 0.
        // rxe0 has one port: its netdev is the QP's all the same.
        owned(
            Qp {
                port: None,
                rq_psn: Some(0),
                sq_psn: Some(0),
                ..qp("rxe0", veth, 21, "RC", "RESET")
            },
            2555,
            "all_reduce_perf",
            &format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3c4d5e6f_7a8b_4c9d_8e0f_1a2b3c4d5e6f.slice/crio-{NCCL_ID}.scope"
            ),
            Some("3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"),
            Some(NCCL_ID),
        ),
        // The process ended: the PID stays, its owner is unknown.
        Qp {
            rqpn: Some(0x52),
            rq_psn: Some(0x0d0e0f),
            sq_psn: Some(0x7e5a02),
            pid: Some(3999),
            ..qp("rxe0", veth, 22, "RC", "RTS")
        },
    ]
}

#[test]
fn the_rxe_table_joins_cm_ids_ports_and_owners() {
    let snapshot = table().refresh_from(&host_dump("rxe")).unwrap();
    assert_eq!(snapshot.qps, rxe_expected());
    assert_eq!(
        snapshot.ports,
        vec![RdmaPort {
            device: "rxe0".into(),
            port: 1,
            netdev: Some("veth0".into()),
            counters: RXE_NAMES
                .iter()
                .zip(RXE_VALUES)
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
        }]
    );
    assert!(snapshot.bound_counters.is_empty());
    // The document's JSON names for one of them, as GET /qps will print it.
    let json = serde_json::to_value(&snapshot.qps[1]).unwrap();
    assert_eq!(json["type"], "RC");
    assert_eq!(json["src"], "198.18.0.1");
    assert_eq!(json["dst_port"], 41234);
    assert!(json.get("gone").is_none());
}

#[test]
fn rxe_records_decode_exactly() {
    let dump = host_dump("rxe");
    let devices = decode::devices(slices(&dump.devices)).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        (devices[0].index, devices[0].name.as_str(), devices[0].ports),
        (1, "rxe0", 1)
    );
    let ports = decode::ports(slices(&dump.ports)).unwrap();
    assert_eq!(
        (
            ports[0].port,
            ports[0].state,
            ports[0].netdev_index,
            ports[0].netdev.as_deref()
        ),
        (1, Some(4), Some(3), Some("veth0"))
    );
    let qps = decode::qps(slices(&dump.qps)).unwrap();
    assert_eq!(
        qps[4],
        QpRecord {
            device_index: 1,
            device: "rxe0".into(),
            port: Some(1),
            lqpn: 20,
            pdn: Some(4),
            rqpn: Some(0x40),
            rq_psn: Some(0x2a9d77),
            sq_psn: Some(0x44c801),
            path_mig_state: Some(0),
            qp_type: IB_UVERBS_QPT_RC,
            state: 6,
            pid: Some(2202),
            kern_name: None,
        }
    );
    assert_eq!(qps[0].kern_name.as_deref(), Some("ib_core"));
    assert_eq!((qps[0].pid, qps[0].pdn), (None, None));
    assert_eq!((qps[3].rqpn, qps[3].path_mig_state), (None, None)); // UD
    let cm_ids = decode::cm_ids(slices(&dump.cm_ids)).unwrap();
    let cm = |cm_idn: u32, lqpn: Option<u32>, state: u8, pid: u32, src: &str, dst: Option<&str>| {
        CmIdRecord {
            device_index: 1,
            device: "rxe0".into(),
            port: Some(1),
            lqpn,
            qp_type: lqpn.map(|_| IB_UVERBS_QPT_RC),
            ps: RDMA_PS_TCP,
            state,
            src: Some(src.parse().unwrap()),
            dst: dst.map(|d| d.parse().unwrap()),
            cm_idn: Some(cm_idn),
            pid: Some(pid),
            kern_name: None,
        }
    };
    assert_eq!(
        cm_ids,
        vec![
            cm(0, None, 8, 2201, "198.18.0.1:18515", None),
            cm(
                1,
                Some(17),
                5,
                2201,
                "198.18.0.1:18515",
                Some("198.18.0.2:41234")
            ),
            cm(
                2,
                Some(18),
                5,
                2305,
                "[2001:db8::1]:49152",
                Some("[2001:db8::2]:7174")
            ),
            cm(
                3,
                Some(20),
                6,
                2202,
                "198.18.0.1:52000",
                Some("198.18.0.3:18515")
            ),
        ]
    );
    assert!(decode::qp_counters(slices(&dump.qp_counters))
        .unwrap()
        .is_empty());
}

// ---------------------------------------------------------------------------------
// The agent's encoder against the fixtures

/// The datagrams of `all`, one dump each (a dump ends with the datagram holding
/// NLMSG_DONE), with the sequence number they answer.
fn dumps(all: &[Vec<u8>]) -> Vec<(u32, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for datagram in all {
        let first = messages(datagram).next().unwrap().unwrap();
        let done = messages(datagram).any(|m| m.unwrap().kind == NLMSG_DONE);
        current.push(datagram.clone());
        if done {
            out.push((first.seq, std::mem::take(&mut current)));
        }
    }
    assert!(current.is_empty());
    out
}

#[test]
fn the_synthetic_encoder_writes_the_fixture_bytes() {
    for host in ["rxe", "mlx5"] {
        let dump = host_dump(host);
        for (seq, datagrams) in dumps(&dump.qps) {
            let records = decode::qps(slices(&datagrams)).unwrap();
            let dev = (records[0].device_index, records[0].device.as_str());
            assert_eq!(
                synthetic::qp_dump(dev, &records, seq),
                datagrams,
                "{host} QPs"
            );
        }
        for (seq, datagrams) in dumps(&dump.cm_ids) {
            let records = decode::cm_ids(slices(&datagrams)).unwrap();
            let dev = records
                .first()
                .map(|r| (r.device_index, r.device.as_str()))
                .unwrap_or((0, ""));
            assert_eq!(
                synthetic::cm_id_dump(dev, &records, seq),
                datagrams,
                "{host} cm_ids"
            );
        }
        for (seq, datagrams) in dumps(&dump.qp_counters) {
            let records = decode::qp_counters(slices(&datagrams)).unwrap();
            let dev = records
                .first()
                .map(|r| (r.device_index, r.device.as_str()))
                .unwrap_or((0, ""));
            assert_eq!(
                synthetic::qp_counter_dump(dev, &records, seq),
                datagrams,
                "{host} bound counters"
            );
        }
        for (seq, datagrams) in dumps(&dump.ports) {
            let records = decode::ports(slices(&datagrams)).unwrap();
            assert_eq!(
                synthetic::port_dump(&records, seq),
                datagrams,
                "{host} ports"
            );
        }
        for datagram in &dump.port_counters {
            let seq = messages(datagram).next().unwrap().unwrap().seq;
            let records = decode::port_counters([datagram.as_slice()]).unwrap();
            assert_eq!(
                &synthetic::port_counters_reply(&records[0], seq),
                datagram,
                "{host} port counters"
            );
        }
    }
    // rxe has no firmware version: its device message is the encoder's.
    let devices = host_dump("rxe").devices;
    let (seq, datagrams) = dumps(&devices).remove(0);
    let records = decode::devices(slices(&datagrams)).unwrap();
    assert_eq!(synthetic::device_dump(&records, seq), datagrams);
}

#[test]
fn large_dumps_split_where_the_kernel_splits_them_and_read_back_whole() {
    let host = synthetic::SynthHost::many_qps(10_000, None);
    let dump = host.dump();
    // 5,000 QPs a device, about 100 bytes each: many datagrams, none above the size
    // the kernel fills (the first smaller).
    assert!(dump.qps.len() > 20, "{} datagrams", dump.qps.len());
    for datagram in &dump.qps {
        assert!(
            datagram.len() <= synthetic::LATER_DATAGRAM,
            "{}",
            datagram.len()
        );
    }
    assert!(dump.qps[0].len() <= synthetic::FIRST_DATAGRAM);
    let records = decode::qps(slices(&dump.qps)).unwrap();
    let expected: Vec<QpRecord> = host.devices.iter().flat_map(|d| d.qps.clone()).collect();
    assert_eq!(records, expected);
    let snapshot = table().refresh_from(&dump).unwrap();
    assert_eq!(snapshot.qps.len(), 10_000);
    assert_eq!(snapshot.bound_counters.len(), 1_250);
    let with_cm = snapshot.qps.iter().filter(|q| q.dst.is_some()).count();
    assert_eq!(with_cm, 5_000);
    let counted = snapshot
        .qps
        .iter()
        .filter(|q| !q.counters.is_empty())
        .count();
    assert_eq!(counted, 1_250);
}

// ---------------------------------------------------------------------------------
// QPs that go

#[test]
fn a_qp_that_goes_is_shown_once_more_then_dropped() {
    let full = host_dump("rxe");
    let mut t = table();
    let first = t.refresh_from(&full).unwrap();
    let qps: Vec<QpRecord> = decode::qps(slices(&full.qps))
        .unwrap()
        .into_iter()
        .filter(|q| q.lqpn != 20)
        .collect();
    let cm_ids: Vec<CmIdRecord> = decode::cm_ids(slices(&full.cm_ids))
        .unwrap()
        .into_iter()
        .filter(|c| c.lqpn != Some(20))
        .collect();
    let without_20 = Dump {
        qps: synthetic::qp_dump((1, "rxe0"), &qps, 4),
        cm_ids: synthetic::cm_id_dump((1, "rxe0"), &cm_ids, 5),
        ..full.clone()
    };
    // A reply that does not parse fails the refresh and changes nothing.
    let mut broken = full.clone();
    broken.qps[0].truncate(30);
    assert!(matches!(
        t.refresh_from(&broken),
        Err(RdmaError::Malformed { .. })
    ));

    let second = t.refresh_from(&without_20).unwrap();
    let before = first.qps.iter().find(|q| q.lqpn == 20).unwrap();
    let after = second.qps.iter().find(|q| q.lqpn == 20).unwrap();
    assert_eq!(
        after,
        &Qp {
            gone: true,
            ..before.clone()
        }
    );
    assert_eq!(second.qps.len(), first.qps.len());
    assert_eq!(serde_json::to_value(after).unwrap()["gone"], true);
    assert_eq!(second.qps.iter().filter(|q| q.gone).count(), 1);

    let third = t.refresh_from(&without_20).unwrap();
    assert!(third.qps.iter().all(|q| q.lqpn != 20 && !q.gone));
    assert_eq!(third.qps.len(), first.qps.len() - 1);

    // Back again: there, not gone.
    let fourth = t.refresh_from(&full).unwrap();
    assert_eq!(fourth.qps, first.qps);
}

// ---------------------------------------------------------------------------------
// Owners

#[test]
fn owners_from_the_proc_fixture() {
    let mut owners = OwnerReader::new(fixture("proc"));
    assert_eq!(
        owners.owner(2201).clone(),
        Owner {
            comm: Some("ib_write_bw".into()),
            cgroup: Some(format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_5f6a_4b7c_8d9e_0f1a2b3c4d5e.slice/cri-containerd-{WRITE_BW_ID}.scope"
            )),
            pod_uid: Some("1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e".into()),
            container_id: Some(WRITE_BW_ID.into()),
        }
    );
    let cgroupfs = owners.owner(2305).clone();
    assert_eq!(
        cgroupfs.pod_uid.as_deref(),
        Some("7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d")
    );
    assert_eq!(cgroupfs.container_id.as_deref(), Some(RPING_ID));
    let docker = owners.owner(2410).clone();
    assert_eq!(
        (docker.pod_uid, docker.container_id.as_deref()),
        (None, Some(UD_ID))
    );
    assert_eq!(
        owners.owner(2202).clone(),
        Owner {
            comm: Some("ib_write_bw".into()),
            cgroup: Some("/user.slice/user-0.slice/session-4.scope".into()),
            pod_uid: None,
            container_id: None,
        }
    );
    let hybrid = owners.owner(2555).clone();
    assert_eq!(
        hybrid.pod_uid.as_deref(),
        Some("3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f")
    );
    assert_eq!(hybrid.container_id.as_deref(), Some(NCCL_ID));
    assert_eq!(owners.owner(3999).clone(), Owner::default());
}

// ---------------------------------------------------------------------------------
// Malformed input: errors, never panics

/// Every decoder over `datagrams`, and the table over a dump holding them in every
/// field: what it returns is the caller's; a panic fails the test.
fn decode_everything(datagrams: &[Vec<u8>]) -> usize {
    let mut errors = 0;
    errors += decode::devices(slices(datagrams)).is_err() as usize;
    errors += decode::ports(slices(datagrams)).is_err() as usize;
    errors += decode::qps(slices(datagrams)).is_err() as usize;
    errors += decode::cm_ids(slices(datagrams)).is_err() as usize;
    errors += decode::qp_counters(slices(datagrams)).is_err() as usize;
    errors += decode::port_counters(slices(datagrams)).is_err() as usize;
    let dump = Dump {
        devices: datagrams.to_vec(),
        ports: datagrams.to_vec(),
        qps: datagrams.to_vec(),
        cm_ids: datagrams.to_vec(),
        qp_counters: datagrams.to_vec(),
        port_counters: datagrams.to_vec(),
    };
    errors += table().refresh_from(&dump).is_err() as usize;
    errors
}

fn all_fixture_datagrams() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for host in ["rxe", "mlx5"] {
        for kind in [
            "devices",
            "ports",
            "qps",
            "cm_ids",
            "qp_counters",
            "port_counters",
        ] {
            let name = format!("{host}/{kind}.hex");
            for d in hex_datagrams(&name) {
                out.push((name.clone(), d));
            }
        }
    }
    out
}

#[test]
fn every_truncation_is_an_error_except_at_a_message_boundary() {
    for (name, datagram) in all_fixture_datagrams() {
        let mut boundaries = HashSet::from([0usize]);
        let mut at = 0;
        for m in messages(&datagram) {
            at += 16 + m.unwrap().payload.len();
            boundaries.insert(at);
        }
        let decoder = |d: &[u8]| -> Result<(), RdmaError> {
            // The decoder of the file's kind.
            match name.rsplit('/').next().unwrap() {
                "devices.hex" => decode::devices([d]).map(drop),
                "ports.hex" => decode::ports([d]).map(drop),
                "qps.hex" => decode::qps([d]).map(drop),
                "cm_ids.hex" => decode::cm_ids([d]).map(drop),
                "qp_counters.hex" => decode::qp_counters([d]).map(drop),
                "port_counters.hex" => decode::port_counters([d]).map(drop),
                other => panic!("{other}"),
            }
        };
        decoder(&datagram).unwrap();
        for len in 0..datagram.len() {
            let r = decoder(&datagram[..len]);
            if boundaries.contains(&len) {
                assert!(r.is_ok(), "{name}: cut at {len}: {r:?}");
            } else {
                assert!(
                    matches!(r, Err(RdmaError::Malformed { .. })),
                    "{name}: cut at {len}: {r:?}"
                );
            }
        }
    }
}

#[test]
fn mutated_replies_give_errors_never_panics() {
    // xorshift64: the same mutations every run.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let corpus = all_fixture_datagrams();
    let (mut runs, mut errors) = (0, 0);
    for _ in 0..3000 {
        let (_, original) = &corpus[(next() % corpus.len() as u64) as usize];
        let mut d = original.clone();
        for _ in 0..=(next() % 4) {
            let at = (next() % d.len() as u64) as usize;
            // Lengths and types are the bytes that matter: often 0, 0xff or small.
            d[at] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                2 => (next() % 8) as u8,
                _ => next() as u8,
            };
        }
        errors += decode_everything(&[d]);
        runs += 7;
    }
    // Each run decodes with six decoders of which at most one is of the right kind.
    assert!(errors > runs / 2, "{errors} errors in {runs} decodes");
}

/// An RES_QP_GET reply holding one QP entry whose attributes `entry` writes.
fn qp_reply(entry: impl FnOnce(&mut Writer<'_>)) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = Writer::nldev(&mut buf, RDMA_NLDEV_CMD_RES_QP_GET, NLM_F_MULTI, 4, 1);
    w.u32(RDMA_NLDEV_ATTR_DEV_INDEX, 1);
    w.string(RDMA_NLDEV_ATTR_DEV_NAME, "rxe0");
    let table = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP, false);
    let e = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP_ENTRY, false);
    entry(&mut w);
    w.end_nest(e);
    w.end_nest(table);
    w.finish();
    buf
}

fn plain_qp(w: &mut Writer<'_>) {
    w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, 1);
    w.u32(RDMA_NLDEV_ATTR_RES_LQPN, 17);
    w.u32(RDMA_NLDEV_ATTR_RES_SQ_PSN, 5);
    w.u8(RDMA_NLDEV_ATTR_RES_TYPE, IB_UVERBS_QPT_UD);
    w.u8(RDMA_NLDEV_ATTR_RES_STATE, 3);
}

#[test]
fn attributes_the_decoder_does_not_know_are_skipped() {
    let plain = decode::qps([qp_reply(plain_qp).as_slice()]).unwrap();
    let decorated = qp_reply(|w| {
        // A PAD attribute (what 32-bit kernels put before a u64), a driver table as
        // hns or cxgb4 add, and attributes of kernels newer than this decoder.
        w.bytes(RDMA_NLDEV_ATTR_PAD, &[]);
        plain_qp(w);
        let driver = w.begin_nest(RDMA_NLDEV_ATTR_DRIVER, true);
        let entry = w.begin_nest(RDMA_NLDEV_ATTR_DRIVER_ENTRY, true);
        w.string(RDMA_NLDEV_ATTR_DRIVER_STRING, "sq_wqe_cnt");
        w.u32(RDMA_NLDEV_ATTR_DRIVER_U32, 64);
        w.end_nest(entry);
        w.end_nest(driver);
        w.string(0x3f0, "subtype"); // types no kernel uses yet
        w.u64(0x3ff, 1);
    });
    assert_eq!(decode::qps([decorated.as_slice()]).unwrap(), plain);
    assert_eq!(plain[0].lqpn, 17);
}

#[test]
fn malformed_replies_are_errors() {
    let malformed = |d: Vec<u8>| {
        let r = decode::qps([d.as_slice()]);
        assert!(matches!(r, Err(RdmaError::Malformed { .. })), "{r:?}");
    };
    // An attribute of length 0 inside the entry: a careless reader loops for ever.
    malformed(qp_reply(|w| {
        plain_qp(w);
        w.raw(&[0, 0, 0x15, 0]);
    }));
    // An attribute longer than its nest.
    malformed(qp_reply(|w| {
        plain_qp(w);
        w.raw(&[0x40, 0, 0x15, 0, 1, 0, 0, 0]);
    }));
    // A u32 of 2 bytes.
    malformed(qp_reply(|w| {
        plain_qp(w);
        w.bytes(RDMA_NLDEV_ATTR_RES_PID, &[1, 2]);
    }));
    // No LQPN.
    malformed(qp_reply(|w| {
        w.u8(RDMA_NLDEV_ATTR_RES_TYPE, IB_UVERBS_QPT_UD);
        w.u8(RDMA_NLDEV_ATTR_RES_STATE, 3);
    }));
    // No device handle.
    let mut buf = Vec::new();
    let mut w = Writer::nldev(&mut buf, RDMA_NLDEV_CMD_RES_QP_GET, NLM_F_MULTI, 4, 1);
    let t = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP, false);
    w.end_nest(t);
    w.finish();
    malformed(buf);
    // A message of another command in the reply.
    let mut buf = Vec::new();
    let mut w = Writer::nldev(&mut buf, RDMA_NLDEV_CMD_GET, NLM_F_MULTI, 4, 1);
    w.u32(RDMA_NLDEV_ATTR_DEV_INDEX, 1);
    w.finish();
    malformed(buf);
    // A message length under its header.
    let mut short = qp_reply(plain_qp);
    short[..4].copy_from_slice(&12u32.to_ne_bytes());
    malformed(short);
    // A hardware counter entry without its value.
    let mut buf = Vec::new();
    let mut w = Writer::nldev(&mut buf, RDMA_NLDEV_CMD_STAT_GET, 0, 7, 1);
    w.u32(RDMA_NLDEV_ATTR_DEV_INDEX, 1);
    w.string(RDMA_NLDEV_ATTR_DEV_NAME, "rxe0");
    w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, 1);
    let t = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS, true);
    let e = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY, true);
    w.string(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME, "sent_pkts");
    w.end_nest(e);
    w.end_nest(t);
    w.finish();
    let r = decode::port_counters([buf.as_slice()]);
    assert!(matches!(r, Err(RdmaError::Malformed { .. })), "{r:?}");
}

#[test]
fn the_kernels_refusals_are_kernel_errors() {
    let refused = synthetic::error_reply(RDMA_NLDEV_CMD_RES_QP_GET, 4, libc::EINVAL);
    match decode::qps([refused.as_slice()]) {
        Err(RdmaError::Kernel { request, errno }) => {
            assert_eq!(
                (request, errno),
                ("RDMA_NLDEV_CMD_RES_QP_GET", libc::EINVAL)
            );
        }
        other => panic!("{other:?}"),
    }
    let e = decode::qps([refused.as_slice()]).unwrap_err().to_string();
    assert!(e.contains("Invalid argument"), "{e}");
    // A dump the kernel ended with an error: DONE carries -errno.
    let mut done = Vec::new();
    let mut w = Writer::message(&mut done, NLMSG_DONE, NLM_F_MULTI, 4, 1);
    w.raw(&(-libc::EMSGSIZE).to_ne_bytes());
    w.finish();
    assert!(matches!(
        decode::qps([done.as_slice()]),
        Err(RdmaError::Kernel { errno, .. }) if errno == libc::EMSGSIZE
    ));
}
