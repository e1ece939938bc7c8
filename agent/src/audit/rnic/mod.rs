//! RNIC and ECN knobs in sysfs: `ecn_np`, `ecn_rp`, `cnp_dscp`, `roce_tos`, and the GID
//! table and RoCE mode of each RDMA port (`roce_gid`, in [`gid`]).
//!
//! Everything is read under a root that stands for `/sys` (`check --sysfs-root`), so the
//! tests run on the trees of `tests/fixtures/sysfs/` (these machines have no RDMA).
//! Files read, relative to the root:
//! - `class/infiniband/DEV/ports/N/link_layer` and `.../gid_attrs/ndevs/IDX`: the RDMA
//!   ports and the netdevs of their GID tables (an unused slot fails to read, EINVAL),
//!   with each used slot's `gids/IDX` and `gid_attrs/types/IDX` (`IB/RoCE v1`, `RoCE v2`);
//! - `class/infiniband/DEV/ports/N/{hw_counters,counters}/*`: the port's counters, for
//!   `/metrics` ([`read_port_counters`]; named there, in `crate::telemetry::metrics`);
//! - `class/net/IF/ecn/roce_np/{enable/P,cnp_dscp,cnp_802p_prio}` and
//!   `class/net/IF/ecn/roce_rp/enable/P` (P = priority 0..7): the ECN knobs of NVIDIA's
//!   mlx5 driver as MLNX_OFED / DOCA-OFED ships it. Other NICs, VLAN devices and mainline
//!   mlx5 (whose congestion parameters are in debugfs) have no `ecn` directory. On a VF
//!   the knobs are read-only;
//! - `kernel/config/rdma_cm/DEV/ports/N/default_roce_tos` (configfs): the ToS rdma_cm gives
//!   RoCE connections. `DEV` exists only once an operator made it; without it, ToS 0.
//!   Beside it `default_roce_mode`: the RoCE version rdma_cm uses (without `DEV`, v2).
//!
//! Paths: a finding's fix and a [`Change`]'s `what` name the file as an operator types it
//! on the host, under `/sys`, whatever the root (in a container the root may be
//! `/host/sys`; with a fixture it is a test tree). An [`RnicError`] names the file that
//! was actually read or written, under the root: that is the file to look at.
//!
//! Reading ([`read_rnic_ports`], [`read_ecn_knobs`]) is separate from judging
//! ([`judge_ecn`], [`judge_roce_tos`]); [`audit`] composes them, [`plan_fix`] and [`fix`]
//! write what the judges would flag.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use roce_common::policy::Policy;
use roce_common::wire::{ECN_ECT0, ECN_ECT1, ECN_NOT_ECT};

use super::{finding, Change, Finding, Severity};
use crate::config::check_ifname;

mod cache;
mod fix;
pub mod gid;
pub use cache::{PortCache, GID_TABLES_MAX_AGE};
pub use fix::{fix, plan_fix, KnobWrite};
pub use gid::{GidEntry, GidType, RoceMode};

/// The path `/sys` the audit reads on a real host, and that fixes name.
pub const HOST_SYSFS: &str = "/sys";

/// Priorities the ECN knobs are kept for (`enable/0` .. `enable/7`).
pub const PRIORITIES: usize = 8;

/// Why a knob could not be read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RnicError {
    /// A file or directory that could not be read, or whose content is not what the
    /// kernel writes there.
    #[error("unreadable: {}: {problem}", path.display())]
    Unreadable { path: PathBuf, problem: Problem },
    /// `fix` could not write a knob (missing, read-only on a VF, refused by the driver).
    #[error("not written: {}: {reason}", path.display())]
    NotWritten { path: PathBuf, reason: String },
    /// Written, but reading it back gives another value: the driver did not take it.
    #[error("not applied: {}: wrote {wrote}, reads back {reads}", path.display())]
    NotApplied {
        path: PathBuf,
        wrote: u8,
        reads: String,
    },
    /// Not a name a netdev can have: it would lead out of `class/net`.
    #[error("'{0}' is not a network interface name")]
    NotAnInterfaceName(String),
}

/// What was wrong with a file's content (or why it could not be read at all).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The read failed: the io error's text (e.g. "No such file or directory (os error 2)").
    #[error("{0}")]
    Io(String),
    /// The content, trimmed and shortened, as it will be quoted.
    #[error("'{0}' is not a number")]
    NotANumber(String),
    /// A number outside what the knob holds; `expected` says what, e.g. "a DSCP (0-63)".
    #[error("{value} is not {expected}")]
    OutOfRange { value: u64, expected: &'static str },
}

/// One RDMA port, `class/infiniband/DEV/ports/N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RnicPort {
    /// The RDMA device, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    /// `Ethernet` on a RoCE port, `InfiniBand` on an IB one; None when unreadable.
    pub link_layer: Option<String>,
    /// The netdevs of its GID table, in GID index order, each once. Empty on IB ports.
    pub netdevs: Vec<String>,
    /// The used entries of its GID table (those whose netdev reads), in index order.
    pub gids: Vec<GidEntry>,
    /// rdma_cm's default ToS for RoCE connections on this port.
    pub default_roce_tos: Result<RoceTos, RnicError>,
    /// rdma_cm's default RoCE version on this port.
    pub default_roce_mode: Result<RoceMode, RnicError>,
}

/// rdma_cm's `default_roce_tos` of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoceTos {
    /// No `kernel/config/rdma_cm/DEV` directory: nobody configured the device, so
    /// rdma_cm uses ToS 0.
    Unset,
    Set(u8),
}

impl RoceTos {
    /// The ToS rdma_cm uses.
    pub fn value(self) -> u8 {
        match self {
            RoceTos::Unset => 0,
            RoceTos::Set(tos) => tos,
        }
    }
}

/// The ECN knobs of one netdev, each read on its own so that one bad file spoils only
/// its own check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcnKnobs {
    /// `roce_np/enable/P`: this host sends CNPs for CE-marked packets of priority P.
    pub np_enable: [Result<bool, RnicError>; PRIORITIES],
    /// `roce_rp/enable/P`: this host slows down on CNPs for priority P.
    pub rp_enable: [Result<bool, RnicError>; PRIORITIES],
    /// `roce_np/cnp_dscp`: the DSCP of the CNPs this host sends.
    pub cnp_dscp: Result<u8, RnicError>,
    /// `roce_np/cnp_802p_prio`: the CNPs' PCP. Read for the record, not judged: it only
    /// matters under PCP trust.
    pub cnp_802p_prio: Result<u8, RnicError>,
}

/// The two ends of DCQCN, each with its own `enable/P` knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Notification point (`roce_np`): the receiver, which answers CE marks with CNPs.
    Np,
    /// Reaction point (`roce_rp`): the sender, which slows down on CNPs.
    Rp,
}

impl Side {
    /// The check that judges this side's knobs.
    pub fn check(self) -> &'static str {
        match self {
            Side::Np => "ecn_np",
            Side::Rp => "ecn_rp",
        }
    }
    fn role(self) -> &'static str {
        match self {
            Side::Np => "notification point",
            Side::Rp => "reaction point",
        }
    }
    fn enable_knob(self, netdev: &str, priority: usize) -> Knob {
        let dir = match self {
            Side::Np => "roce_np",
            Side::Rp => "roce_rp",
        };
        ecn_knob(netdev, dir, &format!("enable/{priority}"))
    }
}

impl EcnKnobs {
    /// The `enable/P` knobs of one side.
    pub fn enable(&self, side: Side) -> &[Result<bool, RnicError>; PRIORITIES] {
        match side {
            Side::Np => &self.np_enable,
            Side::Rp => &self.rp_enable,
        }
    }
}

// ---------------------------------------------------------------------------------
// Reading

/// A file under the root, and the same file as the host names it.
struct Knob {
    rel: String,
}

impl Knob {
    fn new(rel: impl Into<String>) -> Knob {
        Knob { rel: rel.into() }
    }
    fn under(&self, root: &Path) -> PathBuf {
        root.join(&self.rel)
    }
    fn on_host(&self) -> PathBuf {
        Path::new(HOST_SYSFS).join(&self.rel)
    }
}

fn ecn_knob(netdev: &str, side: &str, leaf: &str) -> Knob {
    Knob::new(format!("class/net/{netdev}/ecn/{side}/{leaf}"))
}

fn cnp_dscp_knob(netdev: &str) -> Knob {
    ecn_knob(netdev, "roce_np", "cnp_dscp")
}

fn rdma_cm_dir(device: &str) -> Knob {
    Knob::new(format!("kernel/config/rdma_cm/{device}"))
}

fn roce_tos_knob(device: &str, port: u32) -> Knob {
    Knob::new(format!(
        "kernel/config/rdma_cm/{device}/ports/{port}/default_roce_tos"
    ))
}

fn unreadable(path: &Path, problem: Problem) -> RnicError {
    RnicError::Unreadable {
        path: path.to_path_buf(),
        problem,
    }
}

fn io_problem(path: &Path, e: &io::Error) -> RnicError {
    unreadable(path, Problem::Io(e.to_string()))
}

/// The text of a sysfs file without its trailing newline.
fn read_text(path: &Path) -> Result<String, RnicError> {
    let bytes = fs::read(path).map_err(|e| io_problem(path, &e))?;
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// Garbage as it is quoted in a finding: short, and without control characters.
fn quoted(text: &str) -> String {
    const LONGEST: usize = 32;
    let mut q: String = text
        .chars()
        .take(LONGEST)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().count() > LONGEST {
        q.push_str("...");
    }
    q
}

/// A decimal sysfs value of at most `max` (mlx5's `show` functions print `%d\n`; an
/// empty read is what the driver returns when its firmware query fails).
fn parse_number(path: &Path, text: &str, max: u8, expected: &'static str) -> Result<u8, RnicError> {
    let value: u64 = text
        .parse()
        .map_err(|_| unreadable(path, Problem::NotANumber(quoted(text))))?;
    u8::try_from(value)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| unreadable(path, Problem::OutOfRange { value, expected }))
}

fn read_number(path: &Path, max: u8, expected: &'static str) -> Result<u8, RnicError> {
    parse_number(path, &read_text(path)?, max, expected)
}

fn read_flag(path: &Path) -> Result<bool, RnicError> {
    read_number(path, 1, "an enable flag (0 or 1)").map(|v| v == 1)
}

fn read_dscp(path: &Path) -> Result<u8, RnicError> {
    read_number(path, 63, "a DSCP (0-63)")
}

fn read_tos(path: &Path) -> Result<u8, RnicError> {
    read_number(path, u8::MAX, "a ToS byte (0-255)")
}

/// The names in a directory; a missing directory has none.
fn list_dir(dir: &Path) -> Result<Vec<String>, RnicError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_problem(dir, &e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_problem(dir, &e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// The numbered entries of a directory (ports, GID indexes), in numeric order.
fn numbered_entries(dir: &Path) -> Result<Vec<u32>, RnicError> {
    let mut numbers: Vec<u32> = list_dir(dir)?
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Sort key that puts `mlx5_2` before `mlx5_10`.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem.to_string(), number.parse().unwrap_or(0))
}

/// A port's GID table: its netdevs, each once, and its used entries. Unused slots
/// (EINVAL on a real host, absent or empty in a fixture) and anything that is not a
/// netdev name are skipped; the GID and type are read only where the netdev reads (a
/// table has up to 1024 slots, most unused).
fn read_gid_table(port_dir: &Path) -> Result<(Vec<String>, Vec<GidEntry>), RnicError> {
    let ndevs = port_dir.join("gid_attrs/ndevs");
    let mut netdevs: Vec<String> = Vec::new();
    let mut gids = Vec::new();
    for index in numbered_entries(&ndevs)? {
        let Ok(name) = read_text(&ndevs.join(index.to_string())) else {
            continue;
        };
        if check_ifname(&name).is_err() {
            continue;
        }
        gids.extend(gid::read_gid_entry(port_dir, index, &name));
        if !netdevs.contains(&name) {
            netdevs.push(name);
        }
    }
    Ok((netdevs, gids))
}

fn read_roce_tos(root: &Path, device: &str, port: u32) -> Result<RoceTos, RnicError> {
    if !rdma_cm_dir(device).under(root).is_dir() {
        return Ok(RoceTos::Unset);
    }
    read_tos(&roce_tos_knob(device, port).under(root)).map(RoceTos::Set)
}

/// Every RDMA port under `root/class/infiniband` (none when the directory is missing),
/// devices in natural order, ports in numeric order.
pub fn read_rnic_ports(root: &Path) -> Result<Vec<RnicPort>, RnicError> {
    let class = root.join("class/infiniband");
    let mut devices = list_dir(&class)?;
    devices.sort_by_key(|d| natural_key(d));
    let mut ports = Vec::new();
    for device in devices {
        let device_dir = class.join(&device);
        for port in numbered_entries(&device_dir.join("ports"))? {
            let port_dir = device_dir.join(format!("ports/{port}"));
            let (netdevs, gids) = read_gid_table(&port_dir)?;
            ports.push(RnicPort {
                link_layer: read_text(&port_dir.join("link_layer")).ok(),
                netdevs,
                gids,
                default_roce_tos: read_roce_tos(root, &device, port),
                default_roce_mode: gid::read_roce_mode(root, &device, port),
                device: device.clone(),
                port,
            });
        }
    }
    Ok(ports)
}

/// Which directory of a port a counter file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CounterDir {
    /// `ports/N/hw_counters`: the driver's RoCE counters (CNPs, ECN marks, retries).
    Hw,
    /// `ports/N/counters`: the InfiniBand port counters (`port_*_data` in 4-byte words).
    Port,
}

impl CounterDir {
    fn name(self) -> &'static str {
        match self {
            CounterDir::Hw => "hw_counters",
            CounterDir::Port => "counters",
        }
    }
}

/// One counter file of an RDMA port, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortCounter {
    pub dir: CounterDir,
    /// The file name, e.g. `np_cnp_sent`.
    pub name: String,
    pub value: u64,
}

/// The counter files of `port` (`hw_counters/*`, then `counters/*`, each in name
/// order). A directory that is missing has none; a file that does not read as a
/// decimal number (some counters fail to read while the port is down) is left out
/// and logged at debug level, so one bad file never hides the others.
pub fn read_port_counters(root: &Path, port: &RnicPort) -> Result<Vec<PortCounter>, RnicError> {
    let port_dir = port_dir(root, port);
    let mut counters = Vec::new();
    for dir in [CounterDir::Hw, CounterDir::Port] {
        let dir_path = port_dir.join(dir.name());
        let mut names = list_dir(&dir_path)?;
        names.sort_unstable();
        for name in names {
            let path = dir_path.join(&name);
            if path.is_file() {
                counters.extend(read_counter(&path).map(|value| PortCounter { dir, name, value }));
            }
        }
    }
    Ok(counters)
}

/// The `hw_counters` files `names` of `port` that it has and that read, in `names`'
/// order, as [`read_port_counters`] reads each (for a reader that wants a few of them,
/// often).
pub fn read_hw_counters(root: &Path, port: &RnicPort, names: &[&str]) -> Vec<PortCounter> {
    let dir_path = port_dir(root, port).join(CounterDir::Hw.name());
    names
        .iter()
        .filter_map(|name| {
            let path = dir_path.join(name);
            if !path.is_file() {
                return None;
            }
            read_counter(&path).map(|value| PortCounter {
                dir: CounterDir::Hw,
                name: name.to_string(),
                value,
            })
        })
        .collect()
}

fn port_dir(root: &Path, port: &RnicPort) -> std::path::PathBuf {
    root.join(format!(
        "class/infiniband/{}/ports/{}",
        port.device, port.port
    ))
}

/// One counter file's value; None (logged at debug level) when it does not read as a
/// decimal number.
fn read_counter(path: &Path) -> Option<u64> {
    let value = read_text(path).and_then(|text| {
        text.parse::<u64>()
            .map_err(|_| unreadable(path, Problem::NotANumber(quoted(&text))))
    });
    value
        .map_err(|e| tracing::debug!(error = %e, "RNIC counter left out"))
        .ok()
}

/// The netdevs that carry RoCE (those in some RDMA port's GID table), each once, in
/// port order: the interfaces `check` audits when none is named.
pub fn roce_netdevs(root: &Path) -> Result<Vec<String>, RnicError> {
    let mut netdevs: Vec<String> = Vec::new();
    for port in read_rnic_ports(root)? {
        for n in port.netdevs {
            if !netdevs.contains(&n) {
                netdevs.push(n);
            }
        }
    }
    Ok(netdevs)
}

/// The ECN knobs of `netdev`, or None when it has no `ecn` directory (not an mlx5
/// netdev of MLNX_OFED, or no such netdev).
pub fn read_ecn_knobs(root: &Path, netdev: &str) -> Result<Option<EcnKnobs>, RnicError> {
    check_ifname(netdev).map_err(|_| RnicError::NotAnInterfaceName(netdev.to_string()))?;
    if !root.join(format!("class/net/{netdev}/ecn")).is_dir() {
        return Ok(None);
    }
    Ok(Some(EcnKnobs {
        np_enable: std::array::from_fn(|p| read_flag(&Side::Np.enable_knob(netdev, p).under(root))),
        rp_enable: std::array::from_fn(|p| read_flag(&Side::Rp.enable_knob(netdev, p).under(root))),
        cnp_dscp: read_dscp(&cnp_dscp_knob(netdev).under(root)),
        cnp_802p_prio: read_number(
            &ecn_knob(netdev, "roce_np", "cnp_802p_prio").under(root),
            7,
            "a priority (0-7)",
        ),
    }))
}

// ---------------------------------------------------------------------------------
// Judging (pure)

/// The priorities of the policy's lossless DSCPs, each once, ascending. A priority
/// above 7 has no ECN knob and is left out.
pub fn lossless_priorities(policy: &Policy) -> Vec<usize> {
    let mut priorities: Vec<usize> = (0..64u8)
        .filter(|d| policy.is_lossless(*d))
        .map(|d| policy.table[d as usize].priority as usize)
        .filter(|p| *p < PRIORITIES)
        .collect();
    priorities.sort_unstable();
    priorities.dedup();
    priorities
}

/// The ToS a RoCE connection should get: the RoCE DSCP with ECT(0), so that switches
/// mark it CE rather than drop it (26 -> 106).
pub fn roce_tos_for(dscp: u8) -> u8 {
    ((dscp & 0x3F) << 2) | ECN_ECT0
}

fn ecn_name(tos: u8) -> &'static str {
    match tos & 3 {
        ECN_NOT_ECT => "Not-ECT",
        ECN_ECT1 => "ECT(1)",
        ECN_ECT0 => "ECT(0)",
        _ => "CE",
    }
}

/// A ToS byte as `106 (DSCP 26, ECT(0))`.
pub fn describe_tos(tos: u8) -> String {
    format!("{tos} (DSCP {}, {})", tos >> 2, ecn_name(tos))
}

fn echo(value: u8, knob: &Knob) -> String {
    format!("echo {value} > {}", knob.on_host().display())
}

/// The findings about one netdev's ECN knobs (None: it has none, an info).
pub fn judge_ecn(netdev: &str, knobs: Option<&EcnKnobs>, policy: &Policy) -> Vec<Finding> {
    let Some(knobs) = knobs else {
        return vec![finding(
            "ecn_np",
            Some(netdev),
            Severity::Info,
            format!(
                "no ECN knobs: {} does not exist",
                Knob::new(format!("class/net/{netdev}/ecn"))
                    .on_host()
                    .display()
            ),
            "ECN knobs, if this is an NVIDIA RoCE netdev (MLNX_OFED mlx5)",
            "none if it carries no RoCE; otherwise enable ECN with the NIC vendor's tools",
        )];
    };
    let mut findings = Vec::new();
    for side in [Side::Np, Side::Rp] {
        for p in lossless_priorities(policy) {
            let found = match &knobs.enable(side)[p] {
                Ok(true) => continue,
                Ok(false) => format!("ECN {} off on priority {p}", side.role()),
                Err(e) => e.to_string(),
            };
            findings.push(finding(
                side.check(),
                Some(netdev),
                Severity::Error,
                found,
                format!("on for priority {p}"),
                echo(1, &side.enable_knob(netdev, p)),
            ));
        }
    }
    let want = policy.qos.cnp_dscp;
    let found = match &knobs.cnp_dscp {
        Ok(dscp) if *dscp == want => None,
        Ok(dscp) => Some(format!("CNP DSCP {dscp}")),
        Err(e) => Some(e.to_string()),
    };
    if let Some(found) = found {
        findings.push(finding(
            "cnp_dscp",
            Some(netdev),
            Severity::Error,
            found,
            want.to_string(),
            echo(want, &cnp_dscp_knob(netdev)),
        ));
    }
    findings
}

/// The finding about a port's rdma_cm default ToS, reported on `interface` (one of the
/// port's netdevs), or None when it is the policy's.
pub fn judge_roce_tos(port: &RnicPort, interface: &str, policy: &Policy) -> Option<Finding> {
    let want = roce_tos_for(policy.qos.roce_dscp);
    let dir = rdma_cm_dir(&port.device);
    let found = match &port.default_roce_tos {
        Ok(tos) if tos.value() == want => return None,
        Ok(RoceTos::Set(tos)) => format!("default_roce_tos {}", describe_tos(*tos)),
        // The ToS lives in the RDMA device, not in the group: removing the group keeps
        // a ToS set through it (checked in the VM lab), so "unset" is only likely 0.
        Ok(RoceTos::Unset) => format!(
            "default_roce_tos {}: rdma_cm's default, {} does not exist (a ToS set before \
             the group was removed still applies: make it to read the ToS in use)",
            describe_tos(0),
            dir.on_host().display()
        ),
        Err(e) => e.to_string(),
    };
    Some(finding(
        "roce_tos",
        Some(interface),
        Severity::Error,
        found,
        describe_tos(want),
        format!(
            "mkdir -p {} && {}",
            dir.on_host().display(),
            echo(want, &roce_tos_knob(&port.device, port.port))
        ),
    ))
}

/// Each name once, in the order given.
fn distinct(interfaces: &[String]) -> Vec<&str> {
    let mut seen: Vec<&str> = Vec::new();
    for i in interfaces {
        if !seen.contains(&i.as_str()) {
            seen.push(i);
        }
    }
    seen
}

/// The ports with a netdev among `interfaces`, each with the first such netdev.
fn audited_ports<'a>(
    ports: &'a [RnicPort],
    interfaces: &[&'a str],
) -> Vec<(&'a RnicPort, &'a str)> {
    ports
        .iter()
        .filter_map(|port| {
            let netdev = interfaces
                .iter()
                .find(|i| port.netdevs.iter().any(|n| n == *i))?;
            Some((port, *netdev))
        })
        .collect()
}

/// The RNIC audit of `interfaces` against `policy`, reading under `root` (`/sys` on a
/// host): their ECN knobs, then the rdma_cm ToS of every RDMA port they belong to, and
/// the ports' GID tables against the interfaces' `addresses` (by name; [`gid`]).
pub fn audit(
    root: &Path,
    interfaces: &[String],
    policy: &Policy,
    addresses: &BTreeMap<String, Vec<IpAddr>>,
) -> Vec<Finding> {
    audit_cached(
        root,
        interfaces,
        policy,
        addresses,
        &mut PortCache::uncached(),
    )
}

/// [`audit`] with the ports from `ports`, which may keep GID tables between rounds
/// (`run`); a `roce_gid` finding from a kept table is checked on the tables read anew.
pub fn audit_cached(
    root: &Path,
    interfaces: &[String],
    policy: &Policy,
    addresses: &BTreeMap<String, Vec<IpAddr>>,
    ports: &mut PortCache,
) -> Vec<Finding> {
    let interfaces = distinct(interfaces);
    let mut findings = Vec::new();
    for netdev in &interfaces {
        match read_ecn_knobs(root, netdev) {
            Ok(knobs) => findings.extend(judge_ecn(netdev, knobs.as_ref(), policy)),
            Err(e) => findings.push(finding(
                "ecn_np",
                Some(netdev),
                Severity::Error,
                e.to_string(),
                "a network interface name",
                "name an interface as `ip link` lists it",
            )),
        }
    }
    let read = ports.ports(root).and_then(|read| {
        let gids = gid::audit(&read, &interfaces, addresses);
        if gids.is_empty() || !ports.served_kept() {
            return Ok((read, gids));
        }
        let read = ports.reread(root)?;
        let gids = gid::audit(&read, &interfaces, addresses);
        Ok((read, gids))
    });
    match read {
        Ok((read, gids)) => {
            findings.extend(
                audited_ports(&read, &interfaces)
                    .into_iter()
                    .filter_map(|(port, netdev)| judge_roce_tos(port, netdev, policy)),
            );
            findings.extend(gids);
        }
        Err(e) => findings.push(finding(
            "roce_tos",
            None,
            Severity::Error,
            e.to_string(),
            "the RDMA devices in /sys/class/infiniband",
            "run the audit as a user that can read /sys/class/infiniband",
        )),
    }
    findings
}

// ---------------------------------------------------------------------------------
// Fixing

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> PathBuf {
        PathBuf::from(text)
    }

    fn knobs(np: [bool; 8], rp: [bool; 8], cnp_dscp: u8) -> EcnKnobs {
        EcnKnobs {
            np_enable: np.map(Ok),
            rp_enable: rp.map(Ok),
            cnp_dscp: Ok(cnp_dscp),
            cnp_802p_prio: Ok(6),
        }
    }

    const ALL_ON: [bool; 8] = [true; 8];

    fn port(tos: Result<RoceTos, RnicError>) -> RnicPort {
        RnicPort {
            device: "mlx5_0".to_string(),
            port: 1,
            link_layer: Some("Ethernet".to_string()),
            netdevs: vec!["eth1".to_string()],
            gids: Vec::new(),
            default_roce_tos: tos,
            default_roce_mode: Ok(RoceMode::Unset),
        }
    }

    #[test]
    fn numbers_parse_as_the_kernel_prints_them_and_garbage_says_what_it_is() {
        let f = p("/x/y/z");
        assert_eq!(parse_number(&f, "48", 63, "a DSCP (0-63)"), Ok(48));
        let long = "z".repeat(100);
        let long_quoted = format!("'{}...' is not a number", "z".repeat(32));
        let cases: [(&str, u8, &str, &str); 8] = [
            ("abc", 63, "a DSCP (0-63)", "'abc' is not a number"),
            ("", 63, "a DSCP (0-63)", "'' is not a number"),
            ("300", 63, "a DSCP (0-63)", "300 is not a DSCP (0-63)"),
            (
                "99999999999999999999999",
                63,
                "a DSCP (0-63)",
                "'99999999999999999999999' is not a number",
            ),
            (
                "2",
                1,
                "an enable flag (0 or 1)",
                "2 is not an enable flag (0 or 1)",
            ),
            ("-1", 1, "an enable flag (0 or 1)", "'-1' is not a number"),
            ("a\u{0}b\tc", 1, "x", "'a\\0b\\tc' is not a number"),
            (&long, 1, "x", &long_quoted),
        ];
        for (text, max, expected, problem) in cases {
            assert_eq!(
                parse_number(&f, text, max, expected).map_err(|e| e.to_string()),
                Err(format!("unreadable: /x/y/z: {problem}")),
                "{text:?}"
            );
        }
    }

    #[test]
    fn lossless_priorities_follow_the_table_skip_those_above_seven_and_repeat_none() {
        assert_eq!(lossless_priorities(&Policy::default()), [3]);
        let mut policy = Policy::default();
        policy.set_lossless(&[24, 26, 46, 10]);
        policy.table[10].priority = 9;
        assert_eq!(lossless_priorities(&policy), [3, 5]);
        policy.set_lossless(&[]);
        assert!(lossless_priorities(&policy).is_empty());
    }

    #[test]
    fn roce_tos_is_the_dscp_with_ect0() {
        assert_eq!(roce_tos_for(26), 106);
        assert_eq!(roce_tos_for(24), 98);
        assert_eq!(roce_tos_for(63), 254);
        assert_eq!(describe_tos(106), "106 (DSCP 26, ECT(0))");
        assert_eq!(describe_tos(0), "0 (DSCP 0, Not-ECT)");
        assert_eq!(describe_tos(107), "107 (DSCP 26, CE)");
        assert_eq!(describe_tos(105), "105 (DSCP 26, ECT(1))");
    }

    #[test]
    fn ecn_off_only_matters_on_a_lossless_priority() {
        let policy = Policy::default();
        let mut np = ALL_ON;
        np[0] = false;
        np[5] = false;
        assert!(judge_ecn("eth1", Some(&knobs(np, ALL_ON, 48)), &policy).is_empty());
        np[3] = false;
        let mut rp = ALL_ON;
        rp[3] = false;
        let findings = judge_ecn("eth1", Some(&knobs(np, rp, 48)), &policy);
        assert_eq!(
            findings,
            [
                finding(
                    "ecn_np",
                    Some("eth1"),
                    Severity::Error,
                    "ECN notification point off on priority 3",
                    "on for priority 3",
                    "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3",
                ),
                finding(
                    "ecn_rp",
                    Some("eth1"),
                    Severity::Error,
                    "ECN reaction point off on priority 3",
                    "on for priority 3",
                    "echo 1 > /sys/class/net/eth1/ecn/roce_rp/enable/3",
                ),
            ]
        );
    }

    #[test]
    fn a_custom_priority_map_moves_the_ecn_check() {
        let mut policy = Policy::default();
        policy.table[26].priority = 4;
        let mut np = ALL_ON;
        np[3] = false;
        assert!(judge_ecn("eth1", Some(&knobs(np, ALL_ON, 48)), &policy).is_empty());
        np[4] = false;
        let findings = judge_ecn("eth1", Some(&knobs(np, ALL_ON, 48)), &policy);
        assert_eq!(findings.len(), 1);
        assert_eq!(
            findings[0].found,
            "ECN notification point off on priority 4"
        );
    }

    #[test]
    fn cnp_dscp_is_compared_with_the_policy() {
        let findings = judge_ecn("eth1", Some(&knobs(ALL_ON, ALL_ON, 46)), &Policy::default());
        assert_eq!(
            findings,
            [finding(
                "cnp_dscp",
                Some("eth1"),
                Severity::Error,
                "CNP DSCP 46",
                "48",
                "echo 48 > /sys/class/net/eth1/ecn/roce_np/cnp_dscp",
            )]
        );
        let mut policy = Policy::default();
        policy.qos.cnp_dscp = 46;
        assert!(judge_ecn("eth1", Some(&knobs(ALL_ON, ALL_ON, 46)), &policy).is_empty());
    }

    #[test]
    fn an_unreadable_knob_is_an_error_only_where_the_policy_looks() {
        let garbage = || {
            Err(unreadable(
                &p("/t/class/net/eth1/ecn/roce_np/enable/3"),
                Problem::NotANumber("abc".to_string()),
            ))
        };
        let mut k = knobs(ALL_ON, ALL_ON, 48);
        k.np_enable[5] = garbage();
        k.cnp_802p_prio = garbage().map(u8::from);
        assert!(judge_ecn("eth1", Some(&k), &Policy::default()).is_empty());
        k.np_enable[3] = garbage();
        let findings = judge_ecn("eth1", Some(&k), &Policy::default());
        assert_eq!(
            findings,
            [finding(
                "ecn_np",
                Some("eth1"),
                Severity::Error,
                "unreadable: /t/class/net/eth1/ecn/roce_np/enable/3: 'abc' is not a number",
                "on for priority 3",
                "echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3",
            )]
        );
    }

    #[test]
    fn a_netdev_without_ecn_knobs_gets_one_info() {
        let findings = judge_ecn("veth0", None, &Policy::default());
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Info);
        assert_eq!(
            findings[0].found,
            "no ECN knobs: /sys/class/net/veth0/ecn does not exist"
        );
    }

    #[test]
    fn roce_tos_findings_say_the_tos_its_dscp_and_ecn() {
        let policy = Policy::default();
        assert_eq!(
            judge_roce_tos(&port(Ok(RoceTos::Set(106))), "eth1", &policy),
            None
        );
        let fix = "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && \
                   echo 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos";
        assert_eq!(
            judge_roce_tos(&port(Ok(RoceTos::Set(0))), "eth1", &policy),
            Some(finding(
                "roce_tos",
                Some("eth1"),
                Severity::Error,
                "default_roce_tos 0 (DSCP 0, Not-ECT)",
                "106 (DSCP 26, ECT(0))",
                fix,
            ))
        );
        let right_dscp_no_ecn = judge_roce_tos(&port(Ok(RoceTos::Set(104))), "eth1", &policy);
        assert_eq!(
            right_dscp_no_ecn.map(|f| f.found),
            Some("default_roce_tos 104 (DSCP 26, Not-ECT)".to_string())
        );
        let unset = judge_roce_tos(&port(Ok(RoceTos::Unset)), "eth1", &policy);
        assert_eq!(
            unset.map(|f| (f.found, f.fix)),
            Some((
                "default_roce_tos 0 (DSCP 0, Not-ECT): rdma_cm's default, \
                 /sys/kernel/config/rdma_cm/mlx5_0 does not exist (a ToS set before the \
                 group was removed still applies: make it to read the ToS in use)"
                    .to_string(),
                fix.to_string()
            ))
        );
        let mut dscp24 = Policy::default();
        dscp24.qos.roce_dscp = 24;
        let f = judge_roce_tos(&port(Ok(RoceTos::Set(106))), "eth1", &dscp24);
        assert_eq!(
            f.map(|f| (f.found, f.expected)),
            Some((
                "default_roce_tos 106 (DSCP 26, ECT(0))".to_string(),
                "98 (DSCP 24, ECT(0))".to_string()
            ))
        );
    }

    #[test]
    fn interface_names_that_leave_class_net_are_refused() {
        let root = p("/nonexistent-root");
        for bad in ["..", "../../etc", "a/b", "", "x y"] {
            assert_eq!(
                read_ecn_knobs(&root, bad),
                Err(RnicError::NotAnInterfaceName(bad.to_string()))
            );
        }
        assert_eq!(read_ecn_knobs(&root, "eth1"), Ok(None));
    }

    #[test]
    fn devices_sort_naturally() {
        let mut names = vec!["mlx5_10", "mlx5_2", "bnxt_re0", "mlx5_0"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["bnxt_re0", "mlx5_0", "mlx5_2", "mlx5_10"]);
    }
}
