//! What `/metrics` reads from the host at scrape time: the RNIC port counters (sysfs)
//! and the PFC pause counters (ethtool statistics, else DCB) of the configured
//! interfaces and the RNICs' netdevs.

use std::path::PathBuf;

use crate::audit::rnic::{self, PortCounter};
use crate::telemetry::ethtool::{self, PfcCounters};

/// The counters of one RDMA port, as read for a scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RnicPortCounters {
    pub device: String,
    pub port: u32,
    /// The port's first netdev (GID index order); empty on an InfiniBand port.
    pub netdev: String,
    pub counters: Vec<PortCounter>,
}

/// What the host is asked at scrape time.
#[derive(Clone, Debug)]
pub struct HostSources {
    /// The directory that stands for `/sys` (`--sysfs-root`).
    pub sysfs_root: PathBuf,
    /// Interfaces whose PFC counters are read (the RNIC netdevs are added).
    pub interfaces: Vec<String>,
}

/// What [`HostSources::read`] found.
#[derive(Clone, Debug, Default)]
pub struct HostReadings {
    pub rnic: Vec<RnicPortCounters>,
    pub pfc: Vec<PfcCounters>,
}

impl HostSources {
    /// Reads the RNIC port counters and the PFC counters. A source that cannot be read
    /// (no RDMA, no such interface, no DCB) contributes nothing and is logged at debug
    /// level: a scrape never fails for want of hardware.
    pub fn read(&self) -> HostReadings {
        self.read_with(|port| rnic::read_port_counters(&self.sysfs_root, port))
    }

    /// [`Self::read`] with only the RDMA ports' `hw_counters` named `names` (the fabric
    /// verdicts read a few every round, not every file a scrape shows).
    pub fn read_hw_counters(&self, names: &[&str]) -> HostReadings {
        self.read_with(|port| Ok(rnic::read_hw_counters(&self.sysfs_root, port, names)))
    }

    fn read_with(
        &self,
        counters_of: impl Fn(&rnic::RnicPort) -> Result<Vec<PortCounter>, rnic::RnicError>,
    ) -> HostReadings {
        let ports = rnic::read_rnic_ports(&self.sysfs_root).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "RDMA ports not read");
            Vec::new()
        });
        let mut readings = HostReadings::default();
        for port in &ports {
            match counters_of(port) {
                Ok(counters) => readings.rnic.push(RnicPortCounters {
                    device: port.device.clone(),
                    port: port.port,
                    netdev: port.netdevs.first().cloned().unwrap_or_default(),
                    counters,
                }),
                Err(e) => tracing::debug!(error = %e, "RNIC counters not read"),
            }
        }
        readings.pfc = self.read_pfc_of(&ports);
        readings
    }

    /// The PFC counters of the interfaces and of `ports`' netdevs.
    fn read_pfc_of(&self, ports: &[rnic::RnicPort]) -> Vec<PfcCounters> {
        let mut interfaces: Vec<&String> = Vec::new();
        for n in self
            .interfaces
            .iter()
            .chain(ports.iter().flat_map(|p| &p.netdevs))
        {
            if !interfaces.contains(&n) {
                interfaces.push(n);
            }
        }
        let socket = ethtool::EthtoolSocket::open()
            .map_err(|e| tracing::debug!(error = %e, "no ethtool statistics"))
            .ok();
        interfaces
            .into_iter()
            .filter_map(|ifname| {
                read_pfc_fixture(&self.sysfs_root, ifname)
                    .or_else(|| read_pfc(socket.as_ref(), ifname))
            })
            .collect()
    }
}

/// The PFC counters of `ifname` from a fixture tree (`--sysfs-root` other than /sys:
/// `class/net/IF/ethtool-S`, what `ethtool -S IF` printed on the host recorded), which
/// stands for the NIC's statistics where the machine has no such NIC.
fn read_pfc_fixture(sysfs_root: &std::path::Path, ifname: &str) -> Option<PfcCounters> {
    let path = crate::sys::ethtool::fixture_file(sysfs_root, ifname, "ethtool-S")?;
    let text = std::fs::read_to_string(path).ok()?;
    let pfc = ethtool::pfc_from_stats(ifname, &ethtool::stats_from_text(&text));
    (!pfc.is_empty()).then_some(pfc)
}

/// The PFC counters of `ifname`: mlx5's ethtool statistics (frames and durations), else
/// the DCB PFC reply (frames only; veth, vxlan and most virtual devices have neither).
fn read_pfc(socket: Option<&ethtool::EthtoolSocket>, ifname: &str) -> Option<PfcCounters> {
    if let Some(socket) = socket {
        match socket.stats(ifname) {
            Ok(stats) => {
                let pfc = ethtool::pfc_from_stats(ifname, &stats);
                if !pfc.is_empty() {
                    return Some(pfc);
                }
            }
            Err(e) => tracing::debug!(error = %e, "ethtool statistics not read"),
        }
    }
    match crate::audit::dcb::query(ifname) {
        Ok(state) => state.pfc.map(|p| ethtool::pfc_from_dcb(ifname, &p)),
        Err(e) => {
            tracing::debug!(interface = %ifname, error = %e, "no DCB PFC counters");
            None
        }
    }
}
