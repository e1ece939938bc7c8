//! The `mtu` and `vxlan_overhead` checks: pure functions of the links rtnetlink listed.
//!
//! RoCE cannot fragment: the RNIC picks the largest IB MTU (256..4096) whose packet,
//! headers and all, fits the netdev MTU (the kernel's `iboe_get_mtu()`), so a netdev
//! MTU of 4191 already drops RoCE to a 2048-byte path MTU. A VXLAN device needs its
//! underlay to carry its MTU plus the outer headers.

use super::link::Link;
use super::{finding, Finding, Severity};
pub use roce_common::config::{netdev_mtu_for, roce_path_mtu, IB_MTUS, ROCE_HEADROOM};

/// Outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8.
pub const VXLAN_OVERHEAD_V4: u32 = 50;
/// Outer Ethernet 14 + IPv6 40 + UDP 8 + VXLAN 8.
pub const VXLAN_OVERHEAD_V6: u32 = 70;

fn path_text(netdev_mtu: u32) -> String {
    match roce_path_mtu(netdev_mtu) {
        Some(p) => format!("RoCE path MTU {p}"),
        None => "too small for any RoCE path MTU".to_string(),
    }
}

/// `mtu`: an error when `link` is below `required`, else the RoCE path MTU it gives (info).
pub fn audit_link(link: &Link, required: u32) -> Finding {
    if link.mtu < required {
        finding(
            "mtu",
            Some(&link.name),
            Severity::Error,
            format!("MTU {} ({})", link.mtu, path_text(link.mtu)),
            format!("MTU >= {required} ({})", path_text(required)),
            format!("ip link set dev {} mtu {required}", link.name),
        )
    } else {
        finding(
            "mtu",
            Some(&link.name),
            Severity::Info,
            format!("MTU {} ({})", link.mtu, path_text(link.mtu)),
            format!("MTU >= {required}"),
            "",
        )
    }
}

/// Where a VXLAN device's underlay was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnderlaySource {
    /// IFLA_VXLAN_LINK: the device was made with `dev`.
    Link,
    /// A route lookup towards its remote address.
    Route,
    /// The interface holding its local address.
    LocalAddress,
}

impl UnderlaySource {
    fn text(self) -> &'static str {
        match self {
            UnderlaySource::Link => "its dev",
            UnderlaySource::Route => "the route to its remote",
            UnderlaySource::LocalAddress => "its local address",
        }
    }
}

/// `vxlan_overhead`: whether `underlay` carries `vxlan`'s MTU plus the outer headers.
/// None when it does.
pub fn audit_vxlan(vxlan: &Link, underlay: &Link, source: UnderlaySource) -> Option<Finding> {
    let ipv6 = vxlan.vxlan.as_ref().is_some_and(|v| v.ipv6());
    let (overhead, family) = if ipv6 {
        (VXLAN_OVERHEAD_V6, "IPv6")
    } else {
        (VXLAN_OVERHEAD_V4, "IPv4")
    };
    let needed = vxlan.mtu.saturating_add(overhead);
    if underlay.mtu >= needed {
        return None;
    }
    let fits = underlay.mtu.saturating_sub(overhead);
    Some(finding(
        "vxlan_overhead",
        Some(&vxlan.name),
        Severity::Error,
        format!(
            "{} MTU {} over {} MTU {} ({}): {} bytes of headroom, inner frames above {} are dropped",
            vxlan.name,
            vxlan.mtu,
            underlay.name,
            underlay.mtu,
            source.text(),
            underlay.mtu as i64 - vxlan.mtu as i64,
            fits
        ),
        format!(
            "{} MTU >= {needed} ({} MTU {} + {overhead} for VXLAN over {family})",
            underlay.name, vxlan.name, vxlan.mtu
        ),
        format!(
            "ip link set dev {} mtu {needed}   # or: ip link set dev {} mtu {fits}",
            underlay.name, vxlan.name
        ),
    ))
}

/// The RoCE path MTU through a VXLAN device: what its own MTU and its underlay allow.
pub fn vxlan_roce_path_mtu(vxlan: &Link, underlay: &Link) -> Option<u32> {
    let overhead = if vxlan.vxlan.as_ref().is_some_and(|v| v.ipv6()) {
        VXLAN_OVERHEAD_V6
    } else {
        VXLAN_OVERHEAD_V4
    };
    roce_path_mtu(vxlan.mtu.min(underlay.mtu.saturating_sub(overhead)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::link::Vxlan;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn link(name: &str, mtu: u32) -> Link {
        Link {
            index: 1,
            name: name.into(),
            mtu,
            up: true,
            loopback: false,
            kind: None,
            vxlan: None,
        }
    }

    fn vxlan(name: &str, mtu: u32, remote: IpAddr) -> Link {
        Link {
            kind: Some("vxlan".into()),
            vxlan: Some(Vxlan {
                vni: Some(5001),
                port: Some(4789),
                underlay: None,
                local: None,
                remote: Some(remote),
            }),
            ..link(name, mtu)
        }
    }

    #[test]
    fn path_mtu_follows_iboe_get_mtu() {
        assert_eq!(roce_path_mtu(4192), Some(4096));
        assert_eq!(roce_path_mtu(4191), Some(2048));
        assert_eq!(roce_path_mtu(9000), Some(4096));
        assert_eq!(roce_path_mtu(1500), Some(1024));
        assert_eq!(roce_path_mtu(351), None);
        assert_eq!(roce_path_mtu(352), Some(256));
        assert_eq!(roce_path_mtu(0), None);
        assert_eq!(netdev_mtu_for(4096), 4192);
        for m in IB_MTUS {
            assert_eq!(roce_path_mtu(netdev_mtu_for(m)), Some(m));
        }
    }

    #[test]
    fn an_interface_below_the_required_mtu_is_an_error_with_its_fix() {
        let f = audit_link(&link("eth1", 1500), 9000);
        assert_eq!(f.severity, Severity::Error);
        assert_eq!(f.found, "MTU 1500 (RoCE path MTU 1024)");
        assert_eq!(f.expected, "MTU >= 9000 (RoCE path MTU 4096)");
        assert_eq!(f.fix, "ip link set dev eth1 mtu 9000");
        let ok = audit_link(&link("eth1", 9000), 9000);
        assert_eq!(ok.severity, Severity::Info);
        assert_eq!(ok.found, "MTU 9000 (RoCE path MTU 4096)");
    }

    #[test]
    fn vxlan_headroom_is_50_over_ipv4_and_70_over_ipv6() {
        let v4 = vxlan("vx0", 8950, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(
            audit_vxlan(&v4, &link("eth0", 9000), UnderlaySource::Link),
            None
        );
        let f = audit_vxlan(&v4, &link("eth0", 8999), UnderlaySource::Link).unwrap();
        assert_eq!(
            f.expected,
            "eth0 MTU >= 9000 (vx0 MTU 8950 + 50 for VXLAN over IPv4)"
        );

        let v6 = vxlan("vx6", 8950, IpAddr::V6(Ipv6Addr::LOCALHOST));
        let f = audit_vxlan(&v6, &link("eth0", 9000), UnderlaySource::Route).unwrap();
        assert_eq!(f.check, "vxlan_overhead");
        assert_eq!(f.interface.as_deref(), Some("vx6"));
        assert_eq!(
            f.found,
            "vx6 MTU 8950 over eth0 MTU 9000 (the route to its remote): 50 bytes of headroom, inner frames above 8930 are dropped"
        );
        assert_eq!(
            f.expected,
            "eth0 MTU >= 9020 (vx6 MTU 8950 + 70 for VXLAN over IPv6)"
        );
        assert_eq!(
            f.fix,
            "ip link set dev eth0 mtu 9020   # or: ip link set dev vx6 mtu 8930"
        );
        assert_eq!(
            audit_vxlan(
                &vxlan("vx6", 8930, IpAddr::V6(Ipv6Addr::LOCALHOST)),
                &link("eth0", 9000),
                UnderlaySource::Route
            ),
            None
        );
    }

    #[test]
    fn a_lowered_underlay_shows_negative_headroom() {
        let v = vxlan("vx0", 8950, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        let f = audit_vxlan(&v, &link("eth0", 1500), UnderlaySource::Link).unwrap();
        assert_eq!(
            f.found,
            "vx0 MTU 8950 over eth0 MTU 1500 (its dev): -7450 bytes of headroom, inner frames above 1450 are dropped"
        );
        assert_eq!(vxlan_roce_path_mtu(&v, &link("eth0", 1500)), Some(1024));
        assert_eq!(vxlan_roce_path_mtu(&v, &link("eth0", 9000)), Some(4096));
    }
}
