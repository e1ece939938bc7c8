//! Replies encoded as ib_core fills them (Linux 6.1, `drivers/infiniband/core/nldev.c`
//! and `net/netlink/af_netlink.c: netlink_dump`), for tests and the bench
//! (`qp_table_10k`): the same records [`decode`](super::decode) reads, written
//! attribute by attribute in the kernel's order with the attributes the agent does
//! not read (capability flags, GUIDs, protocol), split into datagrams where the
//! kernel splits a dump, each dump ended by an NLMSG_DONE datagram.
//!
//! Not the agent's own path: nothing outside tests and benchmarks calls it.

use std::net::SocketAddr;

use super::attrs::*;
use super::decode::{
    CmIdRecord, CounterRecord, DeviceRecord, PortCountersRecord, PortRecord, QpRecord,
};
use super::wire::Writer;
use super::Dump;

/// The port id the kernel addresses replies to (the reader's socket; any will do).
pub const READER_PORT_ID: u32 = 0x2a5;
/// The first datagram of a dump is filled in the sender's context before any
/// receive: NLMSG_GOODSIZE, `SKB_WITH_OVERHEAD(4096)` on x86_64.
pub const FIRST_DATAGRAM: usize = 3776;
/// Later ones are as large as the reader's receives so far, capped at
/// `SKB_WITH_OVERHEAD(32768)`: the agent receives into 64 KiB.
pub const LATER_DATAGRAM: usize = 32448;

/// The device records of a dump, each holding what the kernel lists under it.
#[derive(Clone, Debug, Default)]
pub struct SynthDevice {
    pub device: DeviceRecord,
    pub ports: Vec<PortRecord>,
    pub qps: Vec<QpRecord>,
    pub cm_ids: Vec<CmIdRecord>,
    pub counters: Vec<CounterRecord>,
    /// Ports with hardware counters (a port not listed answers EINVAL, which the
    /// reading skips: it is left out of the dump).
    pub port_counters: Vec<PortCountersRecord>,
}

/// A host: its RDMA devices.
#[derive(Clone, Debug, Default)]
pub struct SynthHost {
    pub devices: Vec<SynthDevice>,
}

/// Collects the datagrams of one dump: messages are packed as `netlink_dump` packs
/// them, one dump call per datagram, the first [`FIRST_DATAGRAM`] bytes, later ones
/// [`LATER_DATAGRAM`].
struct DumpOut {
    datagrams: Vec<Vec<u8>>,
    seq: u32,
}

impl DumpOut {
    fn new(seq: u32) -> DumpOut {
        DumpOut {
            datagrams: Vec::new(),
            seq,
        }
    }

    fn room(&self) -> usize {
        if self.datagrams.is_empty() {
            FIRST_DATAGRAM
        } else {
            LATER_DATAGRAM
        }
    }

    /// NLMSG_DONE with a zero errno, in a datagram of its own (the dump call that
    /// finds nothing more ends the dump).
    fn done(mut self) -> Vec<Vec<u8>> {
        let mut buf = Vec::new();
        let mut w = Writer::message(&mut buf, NLMSG_DONE, NLM_F_MULTI, self.seq, READER_PORT_ID);
        w.raw(&0i32.to_ne_bytes());
        w.finish();
        self.datagrams.push(buf);
        self.datagrams
    }
}

fn handle(w: &mut Writer<'_>, index: u32, name: &str) {
    w.u32(RDMA_NLDEV_ATTR_DEV_INDEX, index);
    w.string(RDMA_NLDEV_ATTR_DEV_NAME, name);
}

/// `fill_res_name_pid`.
fn name_pid(w: &mut Writer<'_>, pid: Option<u32>, kern_name: Option<&str>) {
    if let Some(name) = kern_name {
        w.string(RDMA_NLDEV_ATTR_RES_KERN_NAME, name);
    } else if let Some(pid) = pid {
        w.u32(RDMA_NLDEV_ATTR_RES_PID, pid);
    }
}

/// RDMA_NLDEV_CMD_GET dump (`_nldev_get_dumpit`, `fill_dev_info` of a RoCE device
/// with no firmware version: rxe; a device with firmware adds FW_VERSION).
pub fn device_dump(devices: &[DeviceRecord], seq: u32) -> Vec<Vec<u8>> {
    let mut out = DumpOut::new(seq);
    let mut buf = Vec::new();
    for d in devices {
        let mut w = Writer::nldev(
            &mut buf,
            RDMA_NLDEV_CMD_GET,
            NLM_F_MULTI,
            seq,
            READER_PORT_ID,
        );
        handle(&mut w, d.index, &d.name);
        w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, d.ports);
        w.u64(RDMA_NLDEV_ATTR_CAP_FLAGS, 0x0000_0000_0020_1c06);
        w.u64(RDMA_NLDEV_ATTR_NODE_GUID, 0x5054_00ff_fe12_3456);
        w.u64(RDMA_NLDEV_ATTR_SYS_IMAGE_GUID, 0x5054_00ff_fe12_3456);
        w.u8(RDMA_NLDEV_ATTR_DEV_NODE_TYPE, 1); // RDMA_NODE_IB_CA
        w.u8(RDMA_NLDEV_ATTR_DEV_DIM, 0);
        w.string(RDMA_NLDEV_ATTR_DEV_PROTOCOL, "roce");
        w.finish();
    }
    if !devices.is_empty() {
        out.datagrams.push(buf);
    }
    out.done()
}

/// RDMA_NLDEV_CMD_PORT_GET dump of one device (`nldev_port_get_dumpit`,
/// `fill_port_info` of a RoCE port: no IB capability flags, LID or subnet prefix).
pub fn port_dump(ports: &[PortRecord], seq: u32) -> Vec<Vec<u8>> {
    let mut out = DumpOut::new(seq);
    let mut buf = Vec::new();
    for p in ports {
        let mut w = Writer::nldev(
            &mut buf,
            RDMA_NLDEV_CMD_PORT_GET,
            NLM_F_MULTI,
            seq,
            READER_PORT_ID,
        );
        handle(&mut w, p.device_index, &p.device);
        w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, p.port);
        w.u8(RDMA_NLDEV_ATTR_PORT_STATE, p.state.unwrap_or(4)); // IB_PORT_ACTIVE
        w.u8(RDMA_NLDEV_ATTR_PORT_PHYS_STATE, p.phys_state.unwrap_or(5)); // LINK_UP
        if let (Some(index), Some(name)) = (p.netdev_index, &p.netdev) {
            w.u32(RDMA_NLDEV_ATTR_NDEV_INDEX, index);
            w.string(RDMA_NLDEV_ATTR_NDEV_NAME, name);
        }
        w.finish();
    }
    if !ports.is_empty() {
        out.datagrams.push(buf);
    }
    out.done()
}

/// A resource dump of one device (`res_get_common_dumpit`): per datagram one message,
/// the handle and the table (`nla_nest_start_noflag`) of as many entries as fit;
/// an entry that does not fit is cancelled and opens the next datagram.
fn resource_dump<T>(
    op: u16,
    device: (u32, &str),
    table: u16,
    entry: u16,
    items: &[T],
    seq: u32,
    fill: impl Fn(&mut Writer<'_>, &T),
) -> Vec<Vec<u8>> {
    let mut out = DumpOut::new(seq);
    let mut next = 0;
    while next < items.len() {
        let room = out.room();
        let mut buf = Vec::with_capacity(room);
        let mut w = Writer::nldev(&mut buf, op, NLM_F_MULTI, seq, READER_PORT_ID);
        handle(&mut w, device.0, device.1);
        let nest = w.begin_nest(table, false);
        let mut filled = 0;
        while let Some(item) = items.get(next) {
            let mark = w.mark();
            let e = w.begin_nest(entry, false);
            fill(&mut w, item);
            w.end_nest(e);
            // The table's end and the message's must fit as well (they add no bytes).
            if w.len() > room && filled > 0 {
                w.truncate(mark);
                break;
            }
            filled += 1;
            next += 1;
        }
        w.end_nest(nest);
        w.finish();
        out.datagrams.push(buf);
    }
    out.done()
}

/// `fill_res_qp_entry` and `fill_res_qp_entry_query`.
fn fill_qp(w: &mut Writer<'_>, q: &QpRecord) {
    if let Some(port) = q.port {
        w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
    }
    w.u32(RDMA_NLDEV_ATTR_RES_LQPN, q.lqpn);
    if let Some(pdn) = q.pdn {
        w.u32(RDMA_NLDEV_ATTR_RES_PDN, pdn);
    }
    name_pid(w, q.pid, q.kern_name.as_deref());
    if let Some(rqpn) = q.rqpn {
        w.u32(RDMA_NLDEV_ATTR_RES_RQPN, rqpn);
    }
    if let Some(psn) = q.rq_psn {
        w.u32(RDMA_NLDEV_ATTR_RES_RQ_PSN, psn);
    }
    if let Some(psn) = q.sq_psn {
        w.u32(RDMA_NLDEV_ATTR_RES_SQ_PSN, psn);
    }
    if let Some(state) = q.path_mig_state {
        w.u8(RDMA_NLDEV_ATTR_RES_PATH_MIG_STATE, state);
    }
    w.u8(RDMA_NLDEV_ATTR_RES_TYPE, q.qp_type);
    w.u8(RDMA_NLDEV_ATTR_RES_STATE, q.state);
}

/// RDMA_NLDEV_CMD_RES_QP_GET dump of one device.
pub fn qp_dump(device: (u32, &str), qps: &[QpRecord], seq: u32) -> Vec<Vec<u8>> {
    resource_dump(
        RDMA_NLDEV_CMD_RES_QP_GET,
        device,
        RDMA_NLDEV_ATTR_RES_QP,
        RDMA_NLDEV_ATTR_RES_QP_ENTRY,
        qps,
        seq,
        fill_qp,
    )
}

/// A `struct __kernel_sockaddr_storage` (128 bytes) holding `addr`.
pub fn sockaddr_storage(addr: &SocketAddr) -> [u8; SOCKADDR_STORAGE_LEN] {
    let mut b = [0u8; SOCKADDR_STORAGE_LEN];
    match addr {
        SocketAddr::V4(a) => {
            b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

/// `fill_res_cm_id_entry`.
fn fill_cm_id(w: &mut Writer<'_>, c: &CmIdRecord) {
    if let Some(port) = c.port {
        w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
    }
    if let Some(lqpn) = c.lqpn {
        w.u32(RDMA_NLDEV_ATTR_RES_LQPN, lqpn);
        w.u8(
            RDMA_NLDEV_ATTR_RES_TYPE,
            c.qp_type.unwrap_or(IB_UVERBS_QPT_RC),
        );
    }
    w.u32(RDMA_NLDEV_ATTR_RES_PS, c.ps);
    w.u8(RDMA_NLDEV_ATTR_RES_STATE, c.state);
    if let Some(src) = &c.src {
        w.bytes(RDMA_NLDEV_ATTR_RES_SRC_ADDR, &sockaddr_storage(src));
    }
    if let Some(dst) = &c.dst {
        w.bytes(RDMA_NLDEV_ATTR_RES_DST_ADDR, &sockaddr_storage(dst));
    }
    if let Some(idn) = c.cm_idn {
        w.u32(RDMA_NLDEV_ATTR_RES_CM_IDN, idn);
    }
    name_pid(w, c.pid, c.kern_name.as_deref());
}

/// RDMA_NLDEV_CMD_RES_CM_ID_GET dump of one device.
pub fn cm_id_dump(device: (u32, &str), cm_ids: &[CmIdRecord], seq: u32) -> Vec<Vec<u8>> {
    resource_dump(
        RDMA_NLDEV_CMD_RES_CM_ID_GET,
        device,
        RDMA_NLDEV_ATTR_RES_CM_ID,
        RDMA_NLDEV_ATTR_RES_CM_ID_ENTRY,
        cm_ids,
        seq,
        fill_cm_id,
    )
}

/// `fill_stat_counter_hwcounters` / the table of `stat_get_doit_default_counter`:
/// flagged nests (`nla_nest_start`), each entry a name and a u64.
fn fill_hwcounters(w: &mut Writer<'_>, counters: &[(String, u64)]) {
    let table = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS, true);
    for (name, value) in counters {
        let e = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY, true);
        w.string(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME, name);
        w.u64(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE, *value);
        w.end_nest(e);
    }
    w.end_nest(table);
}

/// `fill_res_counter_entry`: port, id, mode (`fill_stat_counter_mode`), the bound
/// QPs (`fill_stat_counter_qps`), the counters.
fn fill_counter(w: &mut Writer<'_>, c: &CounterRecord) {
    w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, c.port);
    w.u32(RDMA_NLDEV_ATTR_STAT_COUNTER_ID, c.id);
    w.u32(RDMA_NLDEV_ATTR_STAT_MODE, c.mode);
    if let Some(kind) = c.auto_qp_type {
        w.u8(RDMA_NLDEV_ATTR_RES_TYPE, kind);
    }
    let table = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP, true);
    for lqpn in &c.lqpns {
        let e = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP_ENTRY, true);
        w.u32(RDMA_NLDEV_ATTR_RES_LQPN, *lqpn);
        w.end_nest(e);
    }
    w.end_nest(table);
    fill_hwcounters(w, &c.hwcounters);
}

/// RDMA_NLDEV_CMD_STAT_GET dump with STAT_RES = RES_QP of one device
/// (`nldev_res_get_counter_dumpit`).
pub fn qp_counter_dump(device: (u32, &str), counters: &[CounterRecord], seq: u32) -> Vec<Vec<u8>> {
    resource_dump(
        RDMA_NLDEV_CMD_STAT_GET,
        device,
        RDMA_NLDEV_ATTR_STAT_COUNTER,
        RDMA_NLDEV_ATTR_STAT_COUNTER_ENTRY,
        counters,
        seq,
        fill_counter,
    )
}

/// RDMA_NLDEV_CMD_STAT_GET's answer for one port (`stat_get_doit_default_counter`).
pub fn port_counters_reply(p: &PortCountersRecord, seq: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = Writer::nldev(&mut buf, RDMA_NLDEV_CMD_STAT_GET, 0, seq, READER_PORT_ID);
    handle(&mut w, p.device_index, &p.device);
    w.u32(RDMA_NLDEV_ATTR_PORT_INDEX, p.port);
    fill_hwcounters(&mut w, &p.hwcounters);
    w.finish();
    buf
}

/// The NLMSG_ERROR `netlink_ack` sends for a refused request of command `op`
/// (`errno` positive), capped: the request's header only.
pub fn error_reply(op: u16, seq: u32, errno: i32) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = Writer::message(&mut buf, NLMSG_ERROR, NLM_F_CAPPED, seq, READER_PORT_ID);
    w.raw(&(-errno).to_ne_bytes());
    w.raw(&16u32.to_ne_bytes());
    w.raw(&nldev_type(op).to_ne_bytes());
    w.raw(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    w.raw(&seq.to_ne_bytes());
    w.raw(&READER_PORT_ID.to_ne_bytes());
    w.finish();
    buf
}

impl SynthHost {
    /// The replies [`Dump::read`] would receive from a host holding these devices.
    pub fn dump(&self) -> Dump {
        let mut seq = 1;
        let mut next_seq = || {
            seq += 1;
            seq
        };
        let records: Vec<DeviceRecord> = self.devices.iter().map(|d| d.device.clone()).collect();
        let mut dump = Dump {
            devices: device_dump(&records, next_seq()),
            ..Dump::default()
        };
        for d in &self.devices {
            let dev = (d.device.index, d.device.name.as_str());
            dump.ports.extend(port_dump(&d.ports, next_seq()));
            dump.qps.extend(qp_dump(dev, &d.qps, next_seq()));
            dump.cm_ids.extend(cm_id_dump(dev, &d.cm_ids, next_seq()));
            dump.qp_counters
                .extend(qp_counter_dump(dev, &d.counters, next_seq()));
            for p in &d.port_counters {
                dump.port_counters.push(port_counters_reply(p, next_seq()));
            }
        }
        dump
    }

    /// A host with `qps` RC QPs spread over two mlx5-like devices of one port each,
    /// for the bench: every QP owned by `pid` (one the caller picks so that its
    /// `/proc` entry exists; None leaves the owners out), every other QP made by
    /// rdma_cm (IPv4 addresses from 198.18.0.0/15), every eighth with a bound counter
    /// of 16 names.
    pub fn many_qps(qps: usize, pid: Option<u32>) -> SynthHost {
        const NAMES: [&str; 16] = [
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
        ];
        let mut devices: Vec<SynthDevice> = (0..2u32)
            .map(|i| {
                let name = format!("mlx5_{i}");
                SynthDevice {
                    device: DeviceRecord {
                        index: i + 1,
                        name: name.clone(),
                        ports: 1,
                    },
                    ports: vec![PortRecord {
                        device_index: i + 1,
                        device: name.clone(),
                        port: 1,
                        state: Some(4),
                        phys_state: Some(5),
                        netdev_index: Some(10 + i),
                        netdev: Some(format!("eth{i}")),
                    }],
                    ..SynthDevice::default()
                }
            })
            .collect();
        for n in 0..qps {
            let Some(d) = devices.get_mut(n % 2) else {
                continue;
            };
            let (index, name) = (d.device.index, d.device.name.clone());
            let n32 = u32::try_from(n).unwrap_or(u32::MAX);
            let lqpn = 0x100 + n32;
            d.qps.push(QpRecord {
                device_index: index,
                device: name.clone(),
                port: Some(1),
                lqpn,
                pdn: Some(n32 % 64),
                rqpn: Some(0x20_0000 + n32),
                rq_psn: Some(n32.wrapping_mul(7919) & 0xff_ffff),
                sq_psn: Some(n32.wrapping_mul(104_729) & 0xff_ffff),
                path_mig_state: Some(0),
                qp_type: IB_UVERBS_QPT_RC,
                state: 3,
                pid,
                kern_name: None,
            });
            if n % 2 == 0 {
                let a = 2 + n32 % 250;
                d.cm_ids.push(CmIdRecord {
                    device_index: index,
                    device: name.clone(),
                    port: Some(1),
                    lqpn: Some(lqpn),
                    qp_type: Some(IB_UVERBS_QPT_RC),
                    ps: RDMA_PS_TCP,
                    state: 5,
                    src: Some(SocketAddr::from((
                        [198, 18, 0, 1],
                        20_000 + (n32 % 40_000) as u16,
                    ))),
                    dst: Some(SocketAddr::from(([198, 18, 1, a as u8], 4791))),
                    cm_idn: Some(n32),
                    pid,
                    kern_name: None,
                });
            }
            if n % 8 == 0 {
                d.counters.push(CounterRecord {
                    device_index: index,
                    device: name,
                    port: 1,
                    id: n32 / 8 + 1,
                    mode: RDMA_COUNTER_MODE_MANUAL,
                    auto_qp_type: None,
                    lqpns: vec![lqpn],
                    hwcounters: NAMES
                        .iter()
                        .enumerate()
                        .map(|(k, name)| ((*name).to_string(), u64::from(n32) * 16 + k as u64))
                        .collect(),
                });
            }
        }
        SynthHost { devices }
    }
}
