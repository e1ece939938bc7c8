//! The nldev replies read into plain records, attribute by attribute as
//! `drivers/infiniband/core/nldev.c` fills them (`fill_dev_info`, `fill_port_info`,
//! `fill_res_qp_entry`, `fill_res_cm_id_entry`, `fill_res_counter_entry`,
//! `stat_get_doit_default_counter`). Attributes a record does not use (PDN, driver
//! tables, GUIDs, ...) are skipped, as are attributes newer kernels add; a missing
//! attribute the kernel always sends, a wrong size or a length that does not fit is
//! [`RdmaError::Malformed`]; an NLMSG_ERROR, or an NLMSG_DONE carrying an error, is
//! [`RdmaError::Kernel`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::attrs::*;
use super::wire::{attrs, messages, Attr, Message};
use crate::rdma::RdmaError;

/// An RDMA device (RDMA_NLDEV_CMD_GET).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceRecord {
    pub index: u32,
    pub name: String,
    /// The number of ports (PORT_INDEX carries `rdma_end_port()` here).
    pub ports: u32,
}

/// A port of a device (RDMA_NLDEV_CMD_PORT_GET).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRecord {
    pub device_index: u32,
    pub device: String,
    pub port: u32,
    /// enum ib_port_state (4 = ACTIVE), when sent.
    pub state: Option<u8>,
    pub phys_state: Option<u8>,
    /// The netdev under the port (RoCE, iWARP), when it is in the caller's netns.
    pub netdev_index: Option<u32>,
    pub netdev: Option<String>,
}

/// A queue pair (RDMA_NLDEV_CMD_RES_QP_GET).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpRecord {
    pub device_index: u32,
    pub device: String,
    /// Absent while the QP has no port yet (after create, before INIT).
    pub port: Option<u32>,
    pub lqpn: u32,
    /// The protection domain's number, sent for QPs of user processes.
    pub pdn: Option<u32>,
    /// Sent for RC and UC only.
    pub rqpn: Option<u32>,
    /// Sent for RC and UC only.
    pub rq_psn: Option<u32>,
    pub sq_psn: Option<u32>,
    /// Sent for RC, UC, XRC only.
    pub path_mig_state: Option<u8>,
    /// enum ib_qp_type ([`qp_type_name`]).
    pub qp_type: u8,
    /// enum ib_qp_state ([`qp_state_name`]).
    pub state: u8,
    /// The creating process, in the pid namespace of the socket's reader; absent for
    /// kernel QPs and for processes outside that namespace or already gone.
    pub pid: Option<u32>,
    /// The kernel user that made a kernel QP ("ib_core" for the GSI QP).
    pub kern_name: Option<String>,
}

/// An rdma_cm identifier (RDMA_NLDEV_CMD_RES_CM_ID_GET).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmIdRecord {
    pub device_index: u32,
    pub device: String,
    pub port: Option<u32>,
    /// The QP the cm_id made; absent for listeners and before the QP exists.
    pub lqpn: Option<u32>,
    pub qp_type: Option<u8>,
    /// enum rdma_ucm_port_space (RDMA_PS_TCP for RC, RDMA_PS_UDP for UD, ...).
    pub ps: u32,
    /// enum rdma_cm_state (5 CONNECT, 8 LISTEN, ...).
    pub state: u8,
    /// Addresses the kernel sent in an AF_INET or AF_INET6 sockaddr; an AF_IB one (or
    /// none) is None.
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub cm_idn: Option<u32>,
    pub pid: Option<u32>,
    pub kern_name: Option<String>,
}

/// A hardware counter bound to QPs (RDMA_NLDEV_CMD_STAT_GET dump, STAT_RES = RES_QP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterRecord {
    pub device_index: u32,
    pub device: String,
    pub port: u32,
    pub id: u32,
    /// enum rdma_nl_counter_mode.
    pub mode: u32,
    /// The QP type of an auto counter bound by type, when sent.
    pub auto_qp_type: Option<u8>,
    /// The QPs bound to it.
    pub lqpns: Vec<u32>,
    /// The driver's counters by name, in the kernel's order.
    pub hwcounters: Vec<(String, u64)>,
}

/// A port's hardware counters (RDMA_NLDEV_CMD_STAT_GET doit, `rdma statistic show
/// link DEV/PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortCountersRecord {
    pub device_index: u32,
    pub device: String,
    pub port: u32,
    pub hwcounters: Vec<(String, u64)>,
}

/// The kernel's name of an nldev command, for errors.
pub fn command_name(op: u16) -> &'static str {
    match op {
        RDMA_NLDEV_CMD_GET => "RDMA_NLDEV_CMD_GET",
        RDMA_NLDEV_CMD_PORT_GET => "RDMA_NLDEV_CMD_PORT_GET",
        RDMA_NLDEV_CMD_RES_QP_GET => "RDMA_NLDEV_CMD_RES_QP_GET",
        RDMA_NLDEV_CMD_RES_CM_ID_GET => "RDMA_NLDEV_CMD_RES_CM_ID_GET",
        RDMA_NLDEV_CMD_STAT_GET => "RDMA_NLDEV_CMD_STAT_GET",
        _ => "an nldev command",
    }
}

fn malformed(what: &'static str, detail: impl Into<String>) -> RdmaError {
    RdmaError::Malformed {
        what,
        detail: detail.into(),
    }
}

fn missing(what: &'static str, attr: &'static str) -> RdmaError {
    malformed(what, format!("no {attr}"))
}

/// Hands every reply message of command `op` in `datagrams` to `each`: NLMSG_DONE
/// ends nothing here (the socket stopped at it) and is skipped when it carries no
/// error; an ack is skipped; any other type is an error.
pub fn for_each_reply<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
    op: u16,
    mut each: impl FnMut(&Message<'a>) -> Result<(), RdmaError>,
) -> Result<(), RdmaError> {
    for datagram in datagrams {
        for message in messages(datagram) {
            let message = message?;
            match message.errno()? {
                Some(0) => continue,
                Some(errno) => {
                    return Err(RdmaError::Kernel {
                        request: command_name(op),
                        errno,
                    })
                }
                None => {}
            }
            if message.nldev_op() != Some(op) {
                return Err(malformed(
                    "nldev reply",
                    format!(
                        "message type {:#x} in the reply to {}",
                        message.kind,
                        command_name(op)
                    ),
                ));
            }
            each(&message)?;
        }
    }
    Ok(())
}

/// The device handle every nldev reply opens with (`fill_nldev_handle`).
#[derive(Default)]
struct Handle {
    index: Option<u32>,
    name: Option<String>,
}

impl Handle {
    /// Takes DEV_INDEX and DEV_NAME; false for any other attribute.
    fn take(&mut self, a: &Attr<'_>) -> Result<bool, RdmaError> {
        match a.kind {
            RDMA_NLDEV_ATTR_DEV_INDEX => self.index = Some(a.u32("device index")?),
            RDMA_NLDEV_ATTR_DEV_NAME => self.name = Some(a.string()),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn finish(self, what: &'static str) -> Result<(u32, String), RdmaError> {
        match (self.index, self.name) {
            (Some(index), Some(name)) => Ok((index, name)),
            (None, _) => Err(missing(what, "RDMA_NLDEV_ATTR_DEV_INDEX")),
            (_, None) => Err(missing(what, "RDMA_NLDEV_ATTR_DEV_NAME")),
        }
    }
}

/// RDMA_NLDEV_CMD_GET dump replies.
pub fn devices<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<DeviceRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_GET, |m| {
        let mut handle = Handle::default();
        let mut ports = None;
        for a in attrs(m.payload) {
            let a = a?;
            if !handle.take(&a)? && a.kind == RDMA_NLDEV_ATTR_PORT_INDEX {
                ports = Some(a.u32("port count")?);
            }
        }
        let (index, name) = handle.finish("device")?;
        out.push(DeviceRecord {
            index,
            name,
            ports: ports.unwrap_or(0),
        });
        Ok(())
    })?;
    Ok(out)
}

/// RDMA_NLDEV_CMD_PORT_GET dump replies.
pub fn ports<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<PortRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_PORT_GET, |m| {
        let mut handle = Handle::default();
        let (mut port, mut state, mut phys_state, mut netdev_index, mut netdev) =
            (None, None, None, None, None);
        for a in attrs(m.payload) {
            let a = a?;
            if handle.take(&a)? {
                continue;
            }
            match a.kind {
                RDMA_NLDEV_ATTR_PORT_INDEX => port = Some(a.u32("port index")?),
                RDMA_NLDEV_ATTR_PORT_STATE => state = Some(a.u8("port state")?),
                RDMA_NLDEV_ATTR_PORT_PHYS_STATE => phys_state = Some(a.u8("port phys state")?),
                RDMA_NLDEV_ATTR_NDEV_INDEX => netdev_index = Some(a.u32("netdev index")?),
                RDMA_NLDEV_ATTR_NDEV_NAME => netdev = Some(a.string()),
                _ => {}
            }
        }
        let (device_index, device) = handle.finish("port")?;
        out.push(PortRecord {
            device_index,
            device,
            port: port.ok_or_else(|| missing("port", "RDMA_NLDEV_ATTR_PORT_INDEX"))?,
            state,
            phys_state,
            netdev_index,
            netdev,
        });
        Ok(())
    })?;
    Ok(out)
}

/// The entries of a resource dump message: the handle, then the table `table` of
/// nested `entry` attributes (`res_get_common_dumpit`).
fn table_entries<'a>(
    m: &Message<'a>,
    what: &'static str,
    table: u16,
    entry: u16,
    mut each: impl FnMut(u32, &str, &'a [u8]) -> Result<(), RdmaError>,
) -> Result<(), RdmaError> {
    let mut handle = Handle::default();
    let mut found = None;
    for a in attrs(m.payload) {
        let a = a?;
        if !handle.take(&a)? && a.kind == table {
            found = Some(a.payload);
        }
    }
    let (index, name) = handle.finish(what)?;
    let Some(table) = found else {
        return Err(missing(what, "resource table"));
    };
    for a in attrs(table) {
        let a = a?;
        if a.kind == entry {
            each(index, &name, a.payload)?;
        }
    }
    Ok(())
}

/// RDMA_NLDEV_CMD_RES_QP_GET dump replies.
pub fn qps<'a>(datagrams: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<QpRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_RES_QP_GET, |m| {
        table_entries(
            m,
            "QP",
            RDMA_NLDEV_ATTR_RES_QP,
            RDMA_NLDEV_ATTR_RES_QP_ENTRY,
            |device_index, device, entry| {
                out.push(qp(device_index, device, entry)?);
                Ok(())
            },
        )
    })?;
    Ok(out)
}

fn qp(device_index: u32, device: &str, entry: &[u8]) -> Result<QpRecord, RdmaError> {
    let (mut port, mut lqpn, mut pdn, mut rqpn, mut rq_psn) = (None, None, None, None, None);
    let (mut sq_psn, mut path_mig_state, mut qp_type, mut state) = (None, None, None, None);
    let (mut pid, mut kern_name) = (None, None);
    for a in attrs(entry) {
        let a = a?;
        match a.kind {
            RDMA_NLDEV_ATTR_PORT_INDEX => port = Some(a.u32("QP port")?),
            RDMA_NLDEV_ATTR_RES_LQPN => lqpn = Some(a.u32("QP lqpn")?),
            RDMA_NLDEV_ATTR_RES_PDN => pdn = Some(a.u32("QP pdn")?),
            RDMA_NLDEV_ATTR_RES_RQPN => rqpn = Some(a.u32("QP rqpn")?),
            RDMA_NLDEV_ATTR_RES_RQ_PSN => rq_psn = Some(a.u32("QP rq_psn")?),
            RDMA_NLDEV_ATTR_RES_SQ_PSN => sq_psn = Some(a.u32("QP sq_psn")?),
            RDMA_NLDEV_ATTR_RES_PATH_MIG_STATE => path_mig_state = Some(a.u8("QP path mig")?),
            RDMA_NLDEV_ATTR_RES_TYPE => qp_type = Some(a.u8("QP type")?),
            RDMA_NLDEV_ATTR_RES_STATE => state = Some(a.u8("QP state")?),
            RDMA_NLDEV_ATTR_RES_PID => pid = Some(a.u32("QP pid")?),
            RDMA_NLDEV_ATTR_RES_KERN_NAME => kern_name = Some(a.string()),
            _ => {}
        }
    }
    Ok(QpRecord {
        device_index,
        device: device.to_string(),
        port,
        lqpn: lqpn.ok_or_else(|| missing("QP", "RDMA_NLDEV_ATTR_RES_LQPN"))?,
        pdn,
        rqpn,
        rq_psn,
        sq_psn,
        path_mig_state,
        qp_type: qp_type.ok_or_else(|| missing("QP", "RDMA_NLDEV_ATTR_RES_TYPE"))?,
        state: state.ok_or_else(|| missing("QP", "RDMA_NLDEV_ATTR_RES_STATE"))?,
        pid,
        kern_name,
    })
}

/// RDMA_NLDEV_CMD_RES_CM_ID_GET dump replies.
pub fn cm_ids<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<CmIdRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_RES_CM_ID_GET, |m| {
        table_entries(
            m,
            "cm_id",
            RDMA_NLDEV_ATTR_RES_CM_ID,
            RDMA_NLDEV_ATTR_RES_CM_ID_ENTRY,
            |device_index, device, entry| {
                out.push(cm_id(device_index, device, entry)?);
                Ok(())
            },
        )
    })?;
    Ok(out)
}

fn cm_id(device_index: u32, device: &str, entry: &[u8]) -> Result<CmIdRecord, RdmaError> {
    let (mut port, mut lqpn, mut qp_type, mut ps, mut state) = (None, None, None, None, None);
    let (mut src, mut dst, mut cm_idn, mut pid, mut kern_name) = (None, None, None, None, None);
    for a in attrs(entry) {
        let a = a?;
        match a.kind {
            RDMA_NLDEV_ATTR_PORT_INDEX => port = Some(a.u32("cm_id port")?),
            RDMA_NLDEV_ATTR_RES_LQPN => lqpn = Some(a.u32("cm_id lqpn")?),
            RDMA_NLDEV_ATTR_RES_TYPE => qp_type = Some(a.u8("cm_id QP type")?),
            RDMA_NLDEV_ATTR_RES_PS => ps = Some(a.u32("cm_id port space")?),
            RDMA_NLDEV_ATTR_RES_STATE => state = Some(a.u8("cm_id state")?),
            RDMA_NLDEV_ATTR_RES_SRC_ADDR => src = sockaddr(a.payload)?,
            RDMA_NLDEV_ATTR_RES_DST_ADDR => dst = sockaddr(a.payload)?,
            RDMA_NLDEV_ATTR_RES_CM_IDN => cm_idn = Some(a.u32("cm_id number")?),
            RDMA_NLDEV_ATTR_RES_PID => pid = Some(a.u32("cm_id pid")?),
            RDMA_NLDEV_ATTR_RES_KERN_NAME => kern_name = Some(a.string()),
            _ => {}
        }
    }
    Ok(CmIdRecord {
        device_index,
        device: device.to_string(),
        port,
        lqpn,
        qp_type,
        ps: ps.ok_or_else(|| missing("cm_id", "RDMA_NLDEV_ATTR_RES_PS"))?,
        state: state.ok_or_else(|| missing("cm_id", "RDMA_NLDEV_ATTR_RES_STATE"))?,
        src,
        dst,
        cm_idn,
        pid,
        kern_name,
    })
}

/// A `struct __kernel_sockaddr_storage` as the kernel copies it (128 bytes): the
/// family in host order, then `sockaddr_in` / `sockaddr_in6` with the port and
/// address in network order. Other families (AF_IB) are no IP address: None.
pub fn sockaddr(b: &[u8]) -> Result<Option<SocketAddr>, RdmaError> {
    let Some(family) = b.get(..2) else {
        return Err(malformed(
            "cm_id address",
            format!("{} bytes, no family", b.len()),
        ));
    };
    let family = i32::from(u16::from_ne_bytes([family[0], family[1]]));
    let need = |n: usize| {
        b.get(..n).ok_or_else(|| {
            malformed(
                "cm_id address",
                format!("family {family} in {} bytes where {n} are needed", b.len()),
            )
        })
    };
    if family == libc::AF_INET {
        let s = need(8)?;
        let port = u16::from_be_bytes([s[2], s[3]]);
        let ip = Ipv4Addr::new(s[4], s[5], s[6], s[7]);
        Ok(Some(SocketAddr::new(IpAddr::V4(ip), port)))
    } else if family == libc::AF_INET6 {
        let s = need(24)?;
        let port = u16::from_be_bytes([s[2], s[3]]);
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&s[8..24]);
        Ok(Some(SocketAddr::new(
            IpAddr::V6(Ipv6Addr::from(octets)),
            port,
        )))
    } else {
        Ok(None)
    }
}

/// The entries of STAT_HWCOUNTERS: name and value each.
fn hwcounters(table: &[u8]) -> Result<Vec<(String, u64)>, RdmaError> {
    let mut out = Vec::new();
    for a in attrs(table) {
        let a = a?;
        if a.kind != RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY {
            continue;
        }
        let (mut name, mut value) = (None, None);
        for b in attrs(a.payload) {
            let b = b?;
            match b.kind {
                RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME => name = Some(b.string()),
                RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE => {
                    value = Some(b.u64("hardware counter value")?)
                }
                _ => {}
            }
        }
        match (name, value) {
            (Some(name), Some(value)) => out.push((name, value)),
            _ => {
                return Err(missing(
                    "hardware counter",
                    "name or value in a STAT_HWCOUNTER_ENTRY",
                ))
            }
        }
    }
    Ok(out)
}

/// RDMA_NLDEV_CMD_STAT_GET dump replies with STAT_RES = RES_QP: the counters bound
/// to QPs.
pub fn qp_counters<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<CounterRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_STAT_GET, |m| {
        table_entries(
            m,
            "bound counter",
            RDMA_NLDEV_ATTR_STAT_COUNTER,
            RDMA_NLDEV_ATTR_STAT_COUNTER_ENTRY,
            |device_index, device, entry| {
                out.push(counter(device_index, device, entry)?);
                Ok(())
            },
        )
    })?;
    Ok(out)
}

fn counter(device_index: u32, device: &str, entry: &[u8]) -> Result<CounterRecord, RdmaError> {
    let (mut port, mut id, mut mode, mut auto_qp_type) = (None, None, None, None);
    let mut lqpns = Vec::new();
    let mut counters = Vec::new();
    for a in attrs(entry) {
        let a = a?;
        match a.kind {
            RDMA_NLDEV_ATTR_PORT_INDEX => port = Some(a.u32("counter port")?),
            RDMA_NLDEV_ATTR_STAT_COUNTER_ID => id = Some(a.u32("counter id")?),
            RDMA_NLDEV_ATTR_STAT_MODE => mode = Some(a.u32("counter mode")?),
            RDMA_NLDEV_ATTR_RES_TYPE => auto_qp_type = Some(a.u8("counter QP type")?),
            RDMA_NLDEV_ATTR_RES_QP => {
                for q in attrs(a.payload) {
                    let q = q?;
                    if q.kind != RDMA_NLDEV_ATTR_RES_QP_ENTRY {
                        continue;
                    }
                    let mut lqpn = None;
                    for b in attrs(q.payload) {
                        let b = b?;
                        if b.kind == RDMA_NLDEV_ATTR_RES_LQPN {
                            lqpn = Some(b.u32("bound lqpn")?);
                        }
                    }
                    lqpns.push(lqpn.ok_or_else(|| {
                        missing("bound counter", "RDMA_NLDEV_ATTR_RES_LQPN in a QP entry")
                    })?);
                }
            }
            RDMA_NLDEV_ATTR_STAT_HWCOUNTERS => counters = hwcounters(a.payload)?,
            _ => {}
        }
    }
    Ok(CounterRecord {
        device_index,
        device: device.to_string(),
        port: port.ok_or_else(|| missing("bound counter", "RDMA_NLDEV_ATTR_PORT_INDEX"))?,
        id: id.ok_or_else(|| missing("bound counter", "RDMA_NLDEV_ATTR_STAT_COUNTER_ID"))?,
        mode: mode.ok_or_else(|| missing("bound counter", "RDMA_NLDEV_ATTR_STAT_MODE"))?,
        auto_qp_type,
        lqpns,
        hwcounters: counters,
    })
}

/// RDMA_NLDEV_CMD_STAT_GET doit replies (no STAT_RES): a port's counters each.
pub fn port_counters<'a>(
    datagrams: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<PortCountersRecord>, RdmaError> {
    let mut out = Vec::new();
    for_each_reply(datagrams, RDMA_NLDEV_CMD_STAT_GET, |m| {
        let mut handle = Handle::default();
        let (mut port, mut counters) = (None, None);
        for a in attrs(m.payload) {
            let a = a?;
            if handle.take(&a)? {
                continue;
            }
            match a.kind {
                RDMA_NLDEV_ATTR_PORT_INDEX => port = Some(a.u32("port index")?),
                RDMA_NLDEV_ATTR_STAT_HWCOUNTERS => counters = Some(hwcounters(a.payload)?),
                _ => {}
            }
        }
        let (device_index, device) = handle.finish("port counters")?;
        out.push(PortCountersRecord {
            device_index,
            device,
            port: port.ok_or_else(|| missing("port counters", "RDMA_NLDEV_ATTR_PORT_INDEX"))?,
            hwcounters: counters
                .ok_or_else(|| missing("port counters", "RDMA_NLDEV_ATTR_STAT_HWCOUNTERS"))?,
        });
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_read_like_ss_ntop() {
        let mut v4 = [0u8; 128];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4791u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[198, 18, 0, 1]);
        assert_eq!(
            sockaddr(&v4).unwrap(),
            Some("198.18.0.1:4791".parse().unwrap())
        );
        let mut v6 = [0u8; 128];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&20886u16.to_be_bytes());
        v6[8..24].copy_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(
            sockaddr(&v6).unwrap(),
            Some("[2001:db8::2]:20886".parse().unwrap())
        );
        let mut ib = [0u8; 128];
        ib[..2].copy_from_slice(&27u16.to_ne_bytes()); // AF_IB
        assert_eq!(sockaddr(&ib).unwrap(), None);
        assert!(sockaddr(&v6[..20]).is_err());
        assert!(sockaddr(&[2]).is_err());
    }
}
