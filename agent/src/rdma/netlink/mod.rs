//! RDMA netlink's nldev client, the one `rdma resource` and `rdma statistic` use:
//! the kernel's numbers (`attrs`), framing (`wire`), replies read into records
//! (`decode`), the socket (`socket`), and replies encoded as the kernel fills them
//! (`synthetic`, for tests and the bench).
//!
//! [`Dump`] is what one reading of the host brings back: the raw reply datagrams of
//! each request kind, as received. The table decodes a `Dump` whether it was read
//! now ([`Dump::read`]) or recorded.

pub mod attrs;
pub mod decode;
pub mod socket;
#[doc(hidden)]
pub mod synthetic;
pub mod wire;

use attrs::*;
use socket::NldevSocket;

use crate::rdma::RdmaError;

/// The raw replies of one reading of the host's RDMA devices: each field holds the
/// reply datagrams of one request kind, for every device (each message names its
/// device), dumps with their NLMSG_DONE.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dump {
    /// RDMA_NLDEV_CMD_GET, dumped: the devices.
    pub devices: Vec<Vec<u8>>,
    /// RDMA_NLDEV_CMD_PORT_GET, dumped per device: the ports and their netdevs.
    pub ports: Vec<Vec<u8>>,
    /// RDMA_NLDEV_CMD_RES_QP_GET, dumped per device.
    pub qps: Vec<Vec<u8>>,
    /// RDMA_NLDEV_CMD_RES_CM_ID_GET, dumped per device.
    pub cm_ids: Vec<Vec<u8>>,
    /// RDMA_NLDEV_CMD_STAT_GET with STAT_RES = RES_QP, dumped per device: the
    /// counters bound to QPs.
    pub qp_counters: Vec<Vec<u8>>,
    /// RDMA_NLDEV_CMD_STAT_GET per port (`rdma statistic show link DEV/PORT`): the
    /// port's hardware counters; none for a port whose driver has none.
    pub port_counters: Vec<Vec<u8>>,
}

/// What a per-device or per-port request may meet without the reading failing: the
/// device went away between the device dump and this request (EINVAL, ENODEV: the
/// kernel's `ib_device_get_by_index` failing), or the driver has no counters
/// (EINVAL, EOPNOTSUPP: `stat_get_doit_default_counter`).
fn absent(e: &RdmaError) -> bool {
    matches!(e, RdmaError::Kernel { errno, .. }
        if [libc::EINVAL, libc::ENODEV, libc::EOPNOTSUPP].contains(errno))
}

/// `r`, with an absent device or feature taken as no reply at all.
fn unless_absent<T>(r: Result<T, RdmaError>, what: &str) -> Result<Option<T>, RdmaError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if absent(&e) => {
            tracing::debug!("RDMA netlink: {what}: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Dump {
    /// Reads the host now: the devices, then per device its ports, QPs, cm_ids and
    /// bound counters, then per port its counters. Needs no privilege (see
    /// `socket`). [`RdmaError::NoRdmaSubsystem`] when the kernel has no RDMA netlink.
    pub fn read() -> Result<Dump, RdmaError> {
        let mut socket = NldevSocket::open()?;
        let mut dump = Dump {
            devices: socket.dump(RDMA_NLDEV_CMD_GET, &[])?,
            ..Dump::default()
        };
        let devices = decode::devices(dump.devices.iter().map(Vec::as_slice))?;
        for device in &devices {
            let dev = (RDMA_NLDEV_ATTR_DEV_INDEX, device.index);
            let name = &device.name;
            let Some(ports) = unless_absent(
                socket.dump(RDMA_NLDEV_CMD_PORT_GET, &[dev]),
                &format!("ports of {name}"),
            )?
            else {
                continue; // the device is gone
            };
            let port_numbers: Vec<u32> = decode::ports(ports.iter().map(Vec::as_slice))?
                .iter()
                .map(|p| p.port)
                .collect();
            dump.ports.extend(ports);
            let per_device = [
                (RDMA_NLDEV_CMD_RES_QP_GET, None, &mut dump.qps, "QPs"),
                (
                    RDMA_NLDEV_CMD_RES_CM_ID_GET,
                    None,
                    &mut dump.cm_ids,
                    "cm_ids",
                ),
                (
                    RDMA_NLDEV_CMD_STAT_GET,
                    Some((RDMA_NLDEV_ATTR_STAT_RES, u32::from(RDMA_NLDEV_ATTR_RES_QP))),
                    &mut dump.qp_counters,
                    "bound counters",
                ),
            ];
            for (op, extra, into, what) in per_device {
                let request: Vec<(u16, u32)> = std::iter::once(dev).chain(extra).collect();
                let reply = socket.dump(op, &request);
                if let Some(datagrams) = unless_absent(reply, &format!("{what} of {name}"))? {
                    into.extend(datagrams);
                }
            }
            for port in port_numbers {
                let reply = socket.get(
                    RDMA_NLDEV_CMD_STAT_GET,
                    &[dev, (RDMA_NLDEV_ATTR_PORT_INDEX, port)],
                );
                let what = format!("counters of {name}/{port}");
                if let Some(datagram) = unless_absent(reply, &what)? {
                    dump.port_counters.push(datagram);
                }
            }
        }
        Ok(dump)
    }
}
