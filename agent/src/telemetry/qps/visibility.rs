//! What the agent can see of RoCE on each of its interfaces (`roce_visibility`, the
//! log, `top`'s header): the evidence gathered since the agent started, and the mode
//! it makes ([`decide`], pure).

use std::collections::{BTreeMap, HashMap};

use crate::doc::qp::RdmaPort;

use super::join::WireSeen;

/// How RoCE shows on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// RoCE packets cross the kernel's stack here: XDP and tc count them.
    KernelPath,
    /// An RDMA device's port has this netdev and its counters move, but no RoCE packet
    /// reached XDP or tc: the RNIC handles RoCE in hardware.
    Offloaded,
    /// A mirror collector interface: the RoCE counted here is copies of other hosts'.
    Mirror,
    /// Nothing of RoCE seen yet.
    None,
}

impl Mode {
    /// Every mode, in the order `/metrics` writes the state set.
    pub const ALL: [Mode; 4] = [Mode::KernelPath, Mode::Offloaded, Mode::Mirror, Mode::None];

    /// The name in `/metrics`, `GET /qps` and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::KernelPath => "kernel_path",
            Mode::Offloaded => "offloaded",
            Mode::Mirror => "mirror",
            Mode::None => "none",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What has been seen on one interface since the agent started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Configured as a mirror collector (`--mirror`, `mirror_interfaces`).
    pub mirror_interface: bool,
    /// Flows of mirrored traffic (ERSPAN, GRE) were counted on it.
    pub mirrored_flows: bool,
    /// RoCE packets were counted on flows of it (not mirrored).
    pub roce_packets: bool,
    /// The hardware counters of an RDMA port whose netdev it is moved between two
    /// refreshes of the QP table.
    pub port_counters_moved: bool,
}

/// The mode the evidence makes: a mirror collector is `mirror` whatever crosses it;
/// RoCE packets counted make `kernel_path`; else an RDMA port whose counters move
/// makes `offloaded`; else `none`.
pub fn decide(e: Evidence) -> Mode {
    if e.mirror_interface || e.mirrored_flows {
        Mode::Mirror
    } else if e.roce_packets {
        Mode::KernelPath
    } else if e.port_counters_moved {
        Mode::Offloaded
    } else {
        Mode::None
    }
}

/// Port counters that say nothing about traffic (a setting sysfs and some drivers
/// list among the counters).
const NOT_TRAFFIC: [&str; 1] = ["lifespan"];

/// The interfaces whose visibility is reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watched {
    /// The interfaces the classifier is on (`--iface`).
    pub interfaces: Vec<String>,
    /// Mirror collector interfaces (`--mirror`).
    pub mirrors: Vec<String>,
}

impl Watched {
    /// Every watched interface once, the classifier's first, and whether it is a
    /// mirror collector.
    fn each(&self) -> Vec<(&str, bool)> {
        let mut out: Vec<(&str, bool)> = Vec::new();
        for name in self.interfaces.iter().chain(&self.mirrors) {
            if !out.iter().any(|(n, _)| *n == name.as_str()) {
                out.push((name, self.mirrors.contains(name)));
            }
        }
        out
    }
}

/// An interface's mode as reported, and the one before (None: the first report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub ifname: String,
    pub before: Option<Mode>,
    pub now: Mode,
}

/// The evidence since the start, refresh after refresh.
#[derive(Debug, Default)]
pub struct Tracker {
    /// By interface name; an interface never loses what it showed once.
    evidence: BTreeMap<String, Evidence>,
    /// The counters of each (device, port) at the last refresh.
    last_counters: HashMap<(String, u32), BTreeMap<String, u64>>,
    /// The modes last reported; None until the first interval is in (two refreshes:
    /// port counters move between readings).
    reported: Option<BTreeMap<String, Mode>>,
    refreshes: u64,
}

impl Tracker {
    /// Takes one refresh's evidence: what the flows showed on each interface and the
    /// RDMA ports' counters. Returns what to report: every watched interface once the
    /// first interval is in, then the ones whose mode changed.
    pub fn observe(
        &mut self,
        watched: &Watched,
        wire: &BTreeMap<String, WireSeen>,
        ports: &[RdmaPort],
    ) -> Vec<Change> {
        for (ifname, seen) in wire {
            let e = self.evidence.entry(ifname.clone()).or_default();
            e.roce_packets |= seen.roce_packets;
            e.mirrored_flows |= seen.mirrored;
        }
        let mut counters = HashMap::with_capacity(ports.len());
        for port in ports {
            let key = (port.device.clone(), port.port);
            if let (Some(netdev), Some(before)) = (&port.netdev, self.last_counters.get(&key)) {
                if moved(before, &port.counters) {
                    self.evidence
                        .entry(netdev.clone())
                        .or_default()
                        .port_counters_moved = true;
                }
            }
            counters.insert(key, port.counters.clone());
        }
        self.last_counters = counters;
        self.refreshes += 1;
        if self.refreshes < 2 {
            return Vec::new();
        }
        let now: BTreeMap<String, Mode> = self.modes(watched).into_iter().collect();
        let before = self.reported.replace(now.clone()).unwrap_or_default();
        self.modes(watched)
            .into_iter()
            .filter(|(ifname, mode)| before.get(ifname) != Some(mode))
            .map(|(ifname, now)| Change {
                before: before.get(&ifname).copied(),
                ifname,
                now,
            })
            .collect()
    }

    /// The mode of every watched interface now.
    pub fn modes(&self, watched: &Watched) -> Vec<(String, Mode)> {
        watched
            .each()
            .into_iter()
            .map(|(ifname, mirror)| {
                let e = Evidence {
                    mirror_interface: mirror,
                    ..self.evidence.get(ifname).copied().unwrap_or_default()
                };
                (ifname.to_string(), decide(e))
            })
            .collect()
    }
}

/// Whether a traffic counter grew between two readings of a port.
fn moved(before: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>) -> bool {
    now.iter()
        .filter(|(name, _)| !NOT_TRAFFIC.contains(&name.as_str()))
        .any(|(name, v)| before.get(name).is_some_and(|b| v > b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_the_strongest_evidence() {
        let e = Evidence::default();
        assert_eq!(decide(e), Mode::None);
        let offloaded = Evidence {
            port_counters_moved: true,
            ..e
        };
        assert_eq!(decide(offloaded), Mode::Offloaded);
        // RoCE counted in XDP/tc: the kernel path, RDMA device or not.
        let kernel = Evidence {
            roce_packets: true,
            ..offloaded
        };
        assert_eq!(decide(kernel), Mode::KernelPath);
        for mirror in [
            Evidence {
                mirror_interface: true,
                ..kernel
            },
            Evidence {
                mirrored_flows: true,
                ..e
            },
        ] {
            assert_eq!(decide(mirror), Mode::Mirror, "{mirror:?}");
        }
        let names: Vec<&str> = Mode::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names, ["kernel_path", "offloaded", "mirror", "none"]);
    }

    fn port(netdev: &str, counters: &[(&str, u64)]) -> RdmaPort {
        RdmaPort {
            device: "mlx5_0".into(),
            port: 1,
            netdev: Some(netdev.into()),
            counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn watched(interfaces: &[&str], mirrors: &[&str]) -> Watched {
        Watched {
            interfaces: interfaces.iter().map(|s| s.to_string()).collect(),
            mirrors: mirrors.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn change(ifname: &str, before: Option<Mode>, now: Mode) -> Change {
        Change {
            ifname: ifname.into(),
            before,
            now,
        }
    }

    #[test]
    fn moving_port_counters_without_packets_are_offloaded_reported_after_the_first_interval() {
        let w = watched(&["eth1", "eth2"], &["eth3"]);
        let none = BTreeMap::new();
        let mut t = Tracker::default();
        let p = |v| [port("eth1", &[("rx_write_requests", v), ("lifespan", 10)])];
        assert_eq!(t.observe(&w, &none, &p(100)), vec![]);
        // The first interval: every watched interface is reported.
        assert_eq!(
            t.observe(&w, &none, &p(100)),
            vec![
                change("eth1", None, Mode::None),
                change("eth2", None, Mode::None),
                change("eth3", None, Mode::Mirror)
            ]
        );
        assert_eq!(t.observe(&w, &none, &p(100)), vec![]);
        // The RNIC moves RDMA traffic XDP never saw.
        assert_eq!(
            t.observe(&w, &none, &p(250)),
            vec![change("eth1", Some(Mode::None), Mode::Offloaded)]
        );
        // It stays so while idle.
        assert_eq!(t.observe(&w, &none, &p(250)), vec![]);
        assert_eq!(
            t.modes(&w),
            vec![
                ("eth1".to_string(), Mode::Offloaded),
                ("eth2".to_string(), Mode::None),
                ("eth3".to_string(), Mode::Mirror)
            ]
        );
        // RoCE counted by XDP: the kernel path.
        let wire = BTreeMap::from([(
            "eth1".to_string(),
            WireSeen {
                roce_packets: true,
                mirrored: false,
            },
        )]);
        assert_eq!(
            t.observe(&w, &wire, &p(300)),
            vec![change("eth1", Some(Mode::Offloaded), Mode::KernelPath)]
        );
    }

    #[test]
    fn a_setting_among_the_counters_is_no_movement() {
        let w = watched(&["eth1"], &[]);
        let mut t = Tracker::default();
        let none = BTreeMap::new();
        t.observe(&w, &none, &[port("eth1", &[("lifespan", 10)])]);
        t.observe(&w, &none, &[port("eth1", &[("lifespan", 20)])]);
        assert_eq!(t.modes(&w), vec![("eth1".to_string(), Mode::None)]);
        // Nor does a counter that went down (a reset) or a new one.
        t.observe(&w, &none, &[port("eth1", &[("rx_pkts", 5)])]);
        t.observe(&w, &none, &[port("eth1", &[("rx_pkts", 1)])]);
        assert_eq!(t.modes(&w), vec![("eth1".to_string(), Mode::None)]);
    }

    #[test]
    fn mirrored_flows_make_a_mirror_and_interfaces_added_later_are_reported() {
        let mut t = Tracker::default();
        let w = watched(&["eth1"], &[]);
        let wire = BTreeMap::from([(
            "eth1".to_string(),
            WireSeen {
                roce_packets: true,
                mirrored: true,
            },
        )]);
        t.observe(&w, &wire, &[]);
        assert_eq!(
            t.observe(&w, &BTreeMap::new(), &[]),
            vec![change("eth1", None, Mode::Mirror)]
        );
        let w = watched(&["eth1", "eth4"], &[]);
        assert_eq!(
            t.observe(&w, &BTreeMap::new(), &[]),
            vec![change("eth4", None, Mode::None)]
        );
    }
}
