//! The QP table: the kernel's QPs joined with their rdma_cm identifiers (addresses
//! and ports, by device and local QPN), the counters bound to them, their ports'
//! netdevs, and their owners; ports with their netdevs and counters. A QP gone since
//! the last refresh is shown once more, marked `gone`, with its last figures.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use super::netlink::attrs::{
    qp_state_name, qp_type_name, QP_STATE_INIT, QP_STATE_RESET, RDMA_COUNTER_MODE_AUTO,
    RDMA_COUNTER_MODE_MANUAL, RDMA_COUNTER_MODE_NONE,
};
use super::netlink::decode::{self, CmIdRecord, QpRecord};
use super::netlink::Dump;
use super::owner::OwnerReader;
use super::RdmaError;
use crate::doc::qp::{Qp, RdmaPort};

/// Where the table reads owners.
#[derive(Clone, Debug)]
pub struct QpTableOptions {
    /// Stands for `/proc` (tests point it at a fixture tree).
    pub proc_root: PathBuf,
}

impl Default for QpTableOptions {
    fn default() -> Self {
        QpTableOptions {
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// One refresh's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QpSnapshot {
    /// By device, then local QPN; the gone ones among them.
    pub qps: Vec<Qp>,
    /// By device, then port.
    pub ports: Vec<RdmaPort>,
    /// The hardware counters bound to QPs, by device, port and id: each QP's
    /// `counters` are its counter's figures, and QPs bound to one counter share them
    /// (auto mode binds every QP of a type, or of a process, on a port to one counter),
    /// so sums over owners go per counter, not per QP.
    pub bound_counters: Vec<BoundCounter>,
}

/// A hardware counter bound to QPs (`rdma statistic qp show`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundCounter {
    pub device: String,
    pub port: u32,
    /// The counter's id on its device (cntn).
    pub id: u32,
    /// "auto" (bound by the port's auto mode), "manual" (bound by `rdma statistic qp
    /// bind`), or "none".
    pub mode: String,
    /// The QPs bound to it.
    pub lqpns: Vec<u32>,
    /// The driver's counters by name.
    pub counters: BTreeMap<String, u64>,
}

/// The netdev of `device`'s port when the device has exactly one port.
fn only_port_netdev(ports: &BTreeMap<(String, u32), RdmaPort>, device: &str) -> Option<String> {
    let mut of_device = ports.values().filter(|p| p.device == device);
    match (of_device.next(), of_device.next()) {
        (Some(only), None) => only.netdev.clone(),
        _ => None,
    }
}

/// A QP's identity on the host: its device and local QPN.
type Key = (String, u32);

/// The table across refreshes.
#[derive(Debug)]
pub struct QpTable {
    owners: OwnerReader,
    /// The QPs of the last refresh that were there (not gone).
    last: HashMap<Key, Qp>,
}

/// enum rdma_nl_counter_mode as `rdma statistic` shows it.
fn counter_mode_name(mode: u32) -> String {
    match mode {
        RDMA_COUNTER_MODE_NONE => "none".to_string(),
        RDMA_COUNTER_MODE_AUTO => "auto".to_string(),
        RDMA_COUNTER_MODE_MANUAL => "manual".to_string(),
        n => format!("unknown({n})"),
    }
}

impl QpTable {
    pub fn new(opts: QpTableOptions) -> QpTable {
        QpTable {
            owners: OwnerReader::new(opts.proc_root),
            last: HashMap::new(),
        }
    }

    /// Dumps the kernel's tables now: QPs joined with their cm_ids (src/dst/ports by
    /// device+lqpn), bound per-QP counters, ports with netdev and counters, owners.
    /// A QP that was in the previous refresh and is not in this one is kept once more,
    /// with `gone: true` and its last figures; then dropped.
    /// [`RdmaError::NoRdmaSubsystem`] when the kernel has no RDMA netlink at all (no
    /// ib_core): no RDMA devices. A failed refresh leaves the table as it was.
    pub fn refresh(&mut self) -> Result<QpSnapshot, RdmaError> {
        let dump = Dump::read()?;
        self.refresh_from(&dump)
    }

    /// The same from recorded reply bytes (tests, the bench): `Dump` holds the raw
    /// reply buffers of each request kind.
    pub fn refresh_from(&mut self, dump: &Dump) -> Result<QpSnapshot, RdmaError> {
        let qp_records = decode::qps(dump.qps.iter().map(Vec::as_slice))?;
        let cm_records = decode::cm_ids(dump.cm_ids.iter().map(Vec::as_slice))?;
        let counter_records = decode::qp_counters(dump.qp_counters.iter().map(Vec::as_slice))?;
        let port_records = decode::ports(dump.ports.iter().map(Vec::as_slice))?;
        let port_counter_records =
            decode::port_counters(dump.port_counters.iter().map(Vec::as_slice))?;

        let mut ports: BTreeMap<(String, u32), RdmaPort> = port_records
            .into_iter()
            .map(|p| {
                let key = (p.device.clone(), p.port);
                let port = RdmaPort {
                    device: p.device,
                    port: p.port,
                    netdev: p.netdev,
                    counters: BTreeMap::new(),
                };
                (key, port)
            })
            .collect();
        for record in port_counter_records {
            let key = (record.device.clone(), record.port);
            let port = ports.entry(key).or_insert_with(|| RdmaPort {
                device: record.device.clone(),
                port: record.port,
                ..RdmaPort::default()
            });
            port.counters = record.hwcounters.into_iter().collect();
        }

        // rdma_cm's identifier of each QP it made; listeners have no QP.
        let mut cm_by_qp: HashMap<Key, CmIdRecord> = HashMap::new();
        for cm in cm_records {
            if let Some(lqpn) = cm.lqpn {
                let key = (cm.device.clone(), lqpn);
                // Keep the one with addresses when the kernel lists two.
                let better = cm_by_qp
                    .get(&key)
                    .is_none_or(|old| old.dst.is_none() && cm.dst.is_some());
                if better {
                    cm_by_qp.insert(key, cm);
                }
            }
        }
        let mut counters_by_qp: HashMap<Key, (u32, BTreeMap<String, u64>)> = HashMap::new();
        let mut bound_counters = Vec::with_capacity(counter_records.len());
        for counter in counter_records {
            let values: BTreeMap<String, u64> = counter.hwcounters.into_iter().collect();
            for lqpn in &counter.lqpns {
                counters_by_qp.insert(
                    (counter.device.clone(), *lqpn),
                    (counter.id, values.clone()),
                );
            }
            bound_counters.push(BoundCounter {
                device: counter.device,
                port: counter.port,
                id: counter.id,
                mode: counter_mode_name(counter.mode),
                lqpns: counter.lqpns,
                counters: values,
            });
        }
        bound_counters.sort_by(|a, b| (&a.device, a.port, a.id).cmp(&(&b.device, b.port, b.id)));

        self.owners.start_refresh();
        let mut current: HashMap<Key, Qp> = HashMap::with_capacity(qp_records.len());
        for record in qp_records {
            let key = (record.device.clone(), record.lqpn);
            let cm = cm_by_qp.get(&key);
            let counter = counters_by_qp.remove(&key);
            let netdev = match record.port {
                Some(p) => ports
                    .get(&(record.device.clone(), p))
                    .and_then(|p| p.netdev.clone()),
                // A QP before INIT has no port, nor the GSI QP on older kernels (5.10
                // in the VM lab): on a device of one port, that port's netdev is its.
                None => only_port_netdev(&ports, &record.device),
            };
            let qp = self.qp(record, cm, counter, netdev);
            current.insert(key, qp);
        }

        let mut qps: Vec<Qp> = current.values().cloned().collect();
        for (key, mut old) in self.last.drain() {
            if !current.contains_key(&key) {
                old.gone = true;
                qps.push(old);
            }
        }
        qps.sort_by(|a, b| (&a.device, a.lqpn).cmp(&(&b.device, b.lqpn)));
        self.last = current;
        Ok(QpSnapshot {
            qps,
            ports: ports.into_values().collect(),
            bound_counters,
        })
    }

    fn qp(
        &mut self,
        r: QpRecord,
        cm: Option<&CmIdRecord>,
        counter: Option<(u32, BTreeMap<String, u64>)>,
        netdev: Option<String>,
    ) -> Qp {
        let (counter_id, counters) = match counter {
            Some((id, values)) => (Some(id), values),
            None => (None, BTreeMap::new()),
        };
        // The kernel sends dest_qp_num for every RC and UC QP; before RTR it is the
        // unset 0, not a remote QP.
        let rqpn = r
            .rqpn
            .filter(|_| r.state != QP_STATE_RESET && r.state != QP_STATE_INIT);
        let (comm, cgroup, pod_uid, container_id) = match (r.pid, r.kern_name) {
            (Some(pid), _) => {
                let o = self.owners.owner(pid);
                (
                    o.comm.clone(),
                    o.cgroup.clone(),
                    o.pod_uid.clone(),
                    o.container_id.clone(),
                )
            }
            (None, Some(kern_name)) => (Some(kern_name), None, None, None),
            (None, None) => (None, None, None, None),
        };
        Qp {
            device: r.device,
            port: r.port,
            lqpn: r.lqpn,
            rqpn,
            qp_type: qp_type_name(r.qp_type),
            state: qp_state_name(r.state),
            sq_psn: r.sq_psn,
            rq_psn: r.rq_psn,
            pid: r.pid,
            comm,
            cgroup,
            pod_uid,
            container_id,
            src: cm.and_then(|c| c.src).map(|a| a.ip()),
            dst: cm.and_then(|c| c.dst).map(|a| a.ip()),
            counters,
            counter_id,
            seen_on_wire: false,
            netdev,
            src_port: cm.and_then(|c| c.src).map(|a| a.port()),
            dst_port: cm.and_then(|c| c.dst).map(|a| a.port()),
            gone: false,
            wire: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, n: u32, netdev: &str) -> ((String, u32), RdmaPort) {
        let p = RdmaPort {
            device: device.into(),
            port: n,
            netdev: Some(netdev.into()),
            ..RdmaPort::default()
        };
        ((device.into(), n), p)
    }

    #[test]
    fn a_qp_without_a_port_has_the_netdev_of_its_device_only_port() {
        let ports: BTreeMap<(String, u32), RdmaPort> = [
            port("rxe0", 1, "veth0"),
            port("mlx5_0", 1, "eth0"),
            port("mlx5_0", 2, "eth1"),
        ]
        .into_iter()
        .collect();
        assert_eq!(only_port_netdev(&ports, "rxe0").as_deref(), Some("veth0"));
        // Two ports: which one the QP will use is not known yet.
        assert_eq!(only_port_netdev(&ports, "mlx5_0"), None);
        assert_eq!(only_port_netdev(&ports, "rxe9"), None);
    }
}
