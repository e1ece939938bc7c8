//! The `roce_gid` check: does RoCE v2 reach each address of a RoCE netdev?
//!
//! A RoCE port's GID table (`ports/N/gids/IDX`, `gid_attrs/types/IDX`,
//! `gid_attrs/ndevs/IDX`) holds one entry per address of its netdev and RoCE version:
//! the IPv4 address as `::ffff:A.B.C.D`, the IPv6 address as itself, each as
//! `IB/RoCE v1` and `RoCE v2` on a device that offers both. Traffic on a RoCE v1 GID is
//! an Ethernet frame of EtherType 0x8915: it is not routed, not UDP 4791, and neither
//! the agent nor the fabric's DSCP QoS sees it. So a netdev address without a RoCE v2
//! GID, or rdma_cm's default RoCE mode (configfs `default_roce_mode`) set to v1, is a
//! warning: RoCE v1 may be intended on a legacy layer-2 fabric. IPv6 link-local
//! addresses are left out: they are not routed whatever the GID type, and the RDMA
//! core's default GID (fe80:: from the MAC) stands beside them.
//!
//! Reading (the GID entries, in [`super::read_rnic_ports`]; the addresses come from
//! rtnetlink, `crate::audit::link`) is separate from judging ([`judge_gids`],
//! [`judge_roce_mode`]: pure).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use super::{audited_ports, read_text, Knob, RnicError, RnicPort};
use crate::audit::{finding, Finding, Severity};

/// The check's name.
pub const CHECK: &str = "roce_gid";

/// A GID's RoCE version as the kernel prints it (`gid_attrs/types/IDX`, and rdma_cm's
/// `default_roce_mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GidType {
    /// `IB/RoCE v1`: an InfiniBand GID, or RoCE v1 on an Ethernet port.
    RoceV1,
    /// `RoCE v2`: RoCE over UDP/IP (port 4791).
    RoceV2,
    /// Anything else, as read.
    Other(String),
}

impl GidType {
    pub fn parse(text: &str) -> GidType {
        match text.trim() {
            "IB/RoCE v1" => GidType::RoceV1,
            "RoCE v2" => GidType::RoceV2,
            other => GidType::Other(other.to_string()),
        }
    }

    /// As the kernel prints it.
    pub fn as_str(&self) -> &str {
        match self {
            GidType::RoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
            GidType::Other(s) => s,
        }
    }
}

/// One used entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Ipv6Addr,
    pub gid_type: GidType,
    /// `gid_attrs/ndevs/IDX`: the netdev whose address (or MAC) the GID stands for.
    pub netdev: String,
}

/// rdma_cm's default RoCE mode of a port (configfs
/// `rdma_cm/DEV/ports/N/default_roce_mode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoceMode {
    /// No `rdma_cm/DEV` group: rdma_cm uses RoCE v2 where the port offers it (the
    /// kernel's `CMA_PREFERRED_ROCE_GID_TYPE`), unless a mode was set through a group
    /// since removed (the mode lives in the device, not in the group).
    Unset,
    Set(GidType),
}

pub(super) fn roce_mode_knob(device: &str, port: u32) -> Knob {
    Knob::new(format!(
        "kernel/config/rdma_cm/{device}/ports/{port}/default_roce_mode"
    ))
}

/// The GID entry `index` of a port whose netdev read as `netdev`; None when its GID
/// does not read as one (a slot freed between the reads).
pub(super) fn read_gid_entry(port_dir: &Path, index: u32, netdev: &str) -> Option<GidEntry> {
    let gid = read_text(&port_dir.join(format!("gids/{index}")))
        .ok()?
        .parse()
        .ok()?;
    let gid_type = read_text(&port_dir.join(format!("gid_attrs/types/{index}")))
        .map_or_else(|e| GidType::Other(e.to_string()), |t| GidType::parse(&t));
    Some(GidEntry {
        index,
        gid,
        gid_type,
        netdev: netdev.to_string(),
    })
}

pub(super) fn read_roce_mode(root: &Path, device: &str, port: u32) -> Result<RoceMode, RnicError> {
    let knob = roce_mode_knob(device, port).under(root);
    // configfs makes the file with the group; a group without it is a fixture's (or
    // `check --fix`'s in one): nothing known, as without the group.
    if !super::rdma_cm_dir(device).under(root).is_dir() || !knob.exists() {
        return Ok(RoceMode::Unset);
    }
    read_text(&knob).map(|t| RoceMode::Set(GidType::parse(&t)))
}

/// The GID an address has in a RoCE GID table: IPv4 mapped into IPv6.
pub fn gid_of(address: IpAddr) -> Ipv6Addr {
    match address {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn port_name(port: &RnicPort) -> String {
    format!("{} port {}", port.device, port.port)
}

/// Whether the check looks for `address` in the GID table: not an IPv6 link-local one.
pub fn judged(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(_) => true,
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// The findings about the addresses of `netdev` (one of `port`'s netdevs) in the
/// port's GID table: one for each address with no RoCE v2 GID (IPv6 link-local ones
/// left out). Nothing on a port that is not Ethernet.
pub fn judge_gids(port: &RnicPort, netdev: &str, addresses: &[IpAddr]) -> Vec<Finding> {
    if port.link_layer.as_deref() != Some("Ethernet") {
        return Vec::new();
    }
    let table = format!(
        "/sys/class/infiniband/{}/ports/{}/gids",
        port.device, port.port
    );
    let mut findings = Vec::new();
    for &address in addresses.iter().filter(|a| judged(**a)) {
        let gid = gid_of(address);
        let entries: Vec<&GidEntry> = port
            .gids
            .iter()
            .filter(|e| e.gid == gid && e.netdev == netdev)
            .collect();
        if entries.iter().any(|e| e.gid_type == GidType::RoceV2) {
            continue;
        }
        let (found, fix) = if entries.is_empty() {
            (
                format!(
                    "no GID for {address} in the GID table of {}: RoCE cannot use this address",
                    port_name(port)
                ),
                format!(
                    "the RDMA core adds a GID for each address of the port's netdev: check that \
                     {netdev} is the netdev of {} (`rdma link show {}/{}`) and read its GID table \
                     (`grep . {table}/*`)",
                    port_name(port),
                    port.device,
                    port.port
                ),
            )
        } else {
            let kinds: Vec<String> = entries
                .iter()
                .map(|e| format!("{} at index {}", e.gid_type.as_str(), e.index))
                .collect();
            (
                format!(
                    "{address} has no RoCE v2 GID in {} (only {}): RoCE v1 is neither routed nor \
                     UDP 4791, so the agent and the fabric's DSCP QoS never see its traffic",
                    port_name(port),
                    kinds.join(", ")
                ),
                format!(
                    "enable RoCE v2 in the driver or firmware of {} (a device that offers only \
                     RoCE v1 cannot carry routable RoCE); the GID types are in \
                     /sys/class/infiniband/{}/ports/{}/gid_attrs/types",
                    port.device, port.device, port.port
                ),
            )
        };
        findings.push(finding(
            CHECK,
            Some(netdev),
            Severity::Warning,
            found,
            format!("a RoCE v2 GID for {address}"),
            fix,
        ));
    }
    findings
}

/// The finding about rdma_cm's default RoCE mode of `port`, reported on `netdev`: None
/// when it is RoCE v2 or unset (rdma_cm then prefers v2).
pub fn judge_roce_mode(port: &RnicPort, netdev: &str) -> Option<Finding> {
    let found = match &port.default_roce_mode {
        Ok(RoceMode::Unset) | Ok(RoceMode::Set(GidType::RoceV2)) => return None,
        Ok(RoceMode::Set(GidType::RoceV1)) => format!(
            "rdma_cm's default RoCE mode on {} is IB/RoCE v1: connections made through \
             rdma_cm (rping, NVMe-oF, MPI and NCCL over rdma_cm) use RoCE v1",
            port_name(port)
        ),
        Ok(RoceMode::Set(GidType::Other(text))) => format!(
            "rdma_cm's default RoCE mode on {} reads '{}', not RoCE v2",
            port_name(port),
            super::quoted(text)
        ),
        Err(e) => e.to_string(),
    };
    let knob = roce_mode_knob(&port.device, port.port).on_host();
    Some(finding(
        CHECK,
        Some(netdev),
        Severity::Warning,
        found,
        "RoCE v2",
        format!(
            "echo \"RoCE v2\" > {}   # MLNX_OFED's cma_roce_mode -d {} -p {} -m 2 does the same",
            knob.display(),
            port.device,
            port.port
        ),
    ))
}

/// The `roce_gid` findings about `ports` (as read by [`super::read_rnic_ports`]) for
/// `interfaces`, whose addresses are in `addresses` by name: every address of an
/// audited netdev without a RoCE v2 GID, and each audited port's rdma_cm default mode.
pub fn audit(
    ports: &[RnicPort],
    interfaces: &[&str],
    addresses: &BTreeMap<String, Vec<IpAddr>>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (port, first) in audited_ports(ports, interfaces) {
        for netdev in interfaces
            .iter()
            .filter(|i| port.netdevs.iter().any(|n| n == *i))
        {
            let addrs = addresses
                .get(*netdev)
                .map(Vec::as_slice)
                .unwrap_or_default();
            findings.extend(judge_gids(port, netdev, addrs));
        }
        findings.extend(judge_roce_mode(port, first));
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 1));

    fn entry(index: u32, gid: &str, gid_type: GidType) -> GidEntry {
        GidEntry {
            index,
            gid: gid.parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
            gid_type,
            netdev: "veth0".to_string(),
        }
    }

    /// rxe0's table as the VM lab reads it (tests/fixtures/sysfs/rxe): the MAC's
    /// link-local GID and 198.18.0.1, each as v1 and v2.
    fn rxe0(gids: Vec<GidEntry>, mode: Result<RoceMode, RnicError>) -> RnicPort {
        RnicPort {
            device: "rxe0".to_string(),
            port: 1,
            link_layer: Some("Ethernet".to_string()),
            netdevs: vec!["veth0".to_string()],
            gids,
            default_roce_tos: Ok(super::super::RoceTos::Set(106)),
            default_roce_mode: mode,
        }
    }

    fn both() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80::5c8d:1cff:fe5e:7a01", GidType::RoceV1),
            entry(1, "fe80::5c8d:1cff:fe5e:7a01", GidType::RoceV2),
            entry(2, "::ffff:198.18.0.1", GidType::RoceV1),
            entry(3, "::ffff:198.18.0.1", GidType::RoceV2),
        ]
    }

    #[test]
    fn the_recorded_rxe_tree_has_a_roce_v2_gid_for_each_lab_address() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/rxe");
        let ports = super::super::read_rnic_ports(&root).unwrap_or_default();
        let v2: Vec<(&str, String)> = ports
            .iter()
            .flat_map(|p| {
                p.gids
                    .iter()
                    .filter(|g| g.gid_type == GidType::RoceV2)
                    .map(move |g| (p.device.as_str(), g.gid.to_string()))
            })
            .collect();
        assert_eq!(
            v2,
            [
                ("rxe0", "fe80::8c19:36ff:fec3:b7b2".to_string()),
                ("rxe0", "::ffff:198.18.0.1".to_string()),
                ("rxe1", "fe80::ec77:2fff:feb2:aa9c".to_string()),
                ("rxe1", "::ffff:198.18.0.2".to_string()),
            ]
        );
        let v4 = |last| IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, last));
        let addresses = [
            ("veth0".to_string(), vec![v4(1)]),
            ("veth1".to_string(), vec![v4(2)]),
        ]
        .into();
        let veths = ["veth0", "veth1"];
        assert!(audit(&ports, &veths, &addresses).is_empty());
        // 198.18.0.2 is rxe1's, not rxe0's: on veth0 it has no GID.
        let swapped = [("veth0".to_string(), vec![v4(2)])].into();
        assert_eq!(audit(&ports, &veths, &swapped).len(), 1);
    }

    #[test]
    fn gid_types_parse_as_the_kernel_prints_them() {
        assert_eq!(GidType::parse("IB/RoCE v1\n"), GidType::RoceV1);
        assert_eq!(GidType::parse("RoCE v2"), GidType::RoceV2);
        assert_eq!(GidType::parse("RoCE v3"), GidType::Other("RoCE v3".into()));
        assert_eq!(GidType::RoceV1.as_str(), "IB/RoCE v1");
    }

    #[test]
    fn ipv4_addresses_are_looked_up_as_mapped_gids() {
        assert_eq!(gid_of(V4).to_string(), "::ffff:198.18.0.1");
        let v6: IpAddr = "2001:db8::2".parse().unwrap_or(V4);
        assert_eq!(gid_of(v6).to_string(), "2001:db8::2");
    }

    #[test]
    fn an_address_with_a_roce_v2_gid_is_fine() {
        let port = rxe0(both(), Ok(RoceMode::Unset));
        assert!(judge_gids(&port, "veth0", &[V4]).is_empty());
        assert_eq!(judge_roce_mode(&port, "veth0"), None);
    }

    #[test]
    fn an_address_with_only_a_roce_v1_gid_is_a_warning_naming_the_index() {
        let mut gids = both();
        gids.retain(|e| e.index != 3);
        let findings = judge_gids(&rxe0(gids, Ok(RoceMode::Unset)), "veth0", &[V4]);
        assert_eq!(findings.len(), 1);
        let f = &findings[0];
        assert_eq!(
            (f.check.as_str(), f.interface.as_deref(), f.severity),
            ("roce_gid", Some("veth0"), Severity::Warning)
        );
        assert_eq!(
            f.found,
            "198.18.0.1 has no RoCE v2 GID in rxe0 port 1 (only IB/RoCE v1 at index 2): RoCE v1 \
             is neither routed nor UDP 4791, so the agent and the fabric's DSCP QoS never see its traffic"
        );
        assert_eq!(f.expected, "a RoCE v2 GID for 198.18.0.1");
        assert!(f
            .fix
            .starts_with("enable RoCE v2 in the driver or firmware of rxe0"));
    }

    #[test]
    fn an_address_without_any_gid_is_a_warning_and_another_netdevs_gid_does_not_count() {
        let mut gids = both();
        for e in &mut gids {
            e.netdev = "veth9".to_string();
        }
        let findings = judge_gids(&rxe0(gids, Ok(RoceMode::Unset)), "veth0", &[V4]);
        assert_eq!(findings.len(), 1);
        assert_eq!(
            findings[0].found,
            "no GID for 198.18.0.1 in the GID table of rxe0 port 1: RoCE cannot use this address"
        );
    }

    #[test]
    fn ipv6_link_local_addresses_are_not_judged() {
        let link_local: IpAddr = "fe80::1".parse().unwrap_or(V4);
        let global: IpAddr = "2001:db8::2".parse().unwrap_or(V4);
        assert!(!judged(link_local) && judged(global) && judged(V4));
        let port = rxe0(both(), Ok(RoceMode::Unset));
        assert!(judge_gids(&port, "veth0", &[link_local]).is_empty());
        assert_eq!(judge_gids(&port, "veth0", &[global]).len(), 1);
    }

    #[test]
    fn an_infiniband_port_has_no_roce_gids_to_judge() {
        let mut port = rxe0(Vec::new(), Ok(RoceMode::Unset));
        port.link_layer = Some("InfiniBand".to_string());
        assert!(judge_gids(&port, "ib0", &[V4]).is_empty());
    }

    #[test]
    fn rdma_cm_in_roce_v1_mode_is_a_warning_with_the_configfs_fix() {
        let port = rxe0(both(), Ok(RoceMode::Set(GidType::RoceV1)));
        let f = judge_roce_mode(&port, "veth0");
        assert_eq!(
            f.map(|f| (f.found, f.expected, f.fix)),
            Some((
                "rdma_cm's default RoCE mode on rxe0 port 1 is IB/RoCE v1: connections made \
                 through rdma_cm (rping, NVMe-oF, MPI and NCCL over rdma_cm) use RoCE v1"
                    .to_string(),
                "RoCE v2".to_string(),
                "echo \"RoCE v2\" > /sys/kernel/config/rdma_cm/rxe0/ports/1/default_roce_mode   \
                 # MLNX_OFED's cma_roce_mode -d rxe0 -p 1 -m 2 does the same"
                    .to_string()
            ))
        );
        let v2 = rxe0(both(), Ok(RoceMode::Set(GidType::RoceV2)));
        assert_eq!(judge_roce_mode(&v2, "veth0"), None);
    }
}
