//! The host audit (`roce-agent check`, and `run` every interval): is this host's
//! configuration the one a lossless RoCE fabric needs?
//!
//! One module per source of facts, each turning what it read into [`Finding`]s:
//! - `link`: interfaces, MTUs and VXLAN devices over rtnetlink (`mtu`, `vxlan_overhead`);
//! - `path`: DF probes towards peers, the path MTU learnt from ICMP (`mtu_path`);
//! - `dcb`: the NIC's DCB state over dcbnl (`dcb_app`, `pfc`, `dcb_unsupported`);
//! - `rnic`: RNIC and ECN knobs in sysfs (`ecn_np`, `ecn_rp`, `cnp_dscp`, `roce_tos`), the
//!   GID tables and rdma_cm's RoCE mode against the netdevs' addresses (`roce_gid`);
//! - `watchdog`: the NICs' PFC storm watchdog, an ethtool tunable (`pfc_watchdog`).
//!
//! Reading is separate from judging: each module has a reader (netlink, sockets, files)
//! and pure functions from what was read and the policy to findings, tested on their own.
//!
//! What is audited: the interfaces asked for (`--iface`, the config's `interfaces` and
//! `vteps`), else those that carry RoCE ([`Why`]): the netdevs of RDMA devices, VXLAN
//! devices and their underlays. [`fix`] changes only interfaces asked for by name;
//! [`plan`] says what it would run, changing nothing (`check --dry-run`).
//!
//! May import `config` and `doc`; `telemetry` reads the host through its readers
//! (`dcb`, `rnic`), never the reverse.

pub mod dcb;
pub mod link;
pub mod mtu;
pub mod path;
pub mod rnic;
pub mod watchdog;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use roce_common::policy::Policy;
use serde::Serialize;

pub use crate::doc::finding::{Finding, Severity};
use link::{Link, LinkError, Rtnl};
use mtu::UnderlaySource;

/// One change `--fix` (or `run --mode enforce`) made on the host, printed before/after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The check whose finding the change answers (`mtu`, `dcb_app`, `ecn_np`, ...).
    pub check: String,
    pub interface: String,
    /// What was changed, e.g. `mtu` or `/sys/class/net/eth1/ecn/roce_np/enable/3`.
    pub what: String,
    pub before: String,
    pub after: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} {} -> {}",
            self.check, self.interface, self.what, self.before, self.after
        )
    }
}

/// `pfc_watchdog` of the audited interfaces and the RDMA netdevs (`ports`, the
/// audit's cache of them) that have the tunable.
fn watchdogs(
    sysfs_root: &std::path::Path,
    audited: &[String],
    ports: &mut rnic::PortCache,
) -> Vec<Finding> {
    let mut names: Vec<String> = audited.to_vec();
    for port in ports.ports(sysfs_root).unwrap_or_default() {
        for n in port.netdevs {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let socket = crate::sys::ethtool::EthtoolSocket::open().ok();
    names
        .iter()
        .filter_map(|n| {
            Some(watchdog::audit(
                n,
                watchdog::read(sysfs_root, socket.as_ref(), n)?,
            ))
        })
        .collect()
}

/// A finding of the audit (no flow count: that is analyze's).
pub fn finding(
    check: &str,
    interface: Option<&str>,
    severity: Severity,
    found: impl Into<String>,
    expected: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check: check.to_string(),
        interface: interface.map(str::to_string),
        severity,
        found: found.into(),
        expected: expected.into(),
        fix: fix.into(),
        flows: None,
        flow_keys: Vec::new(),
    }
}

/// What to audit and against what.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    /// The interfaces asked about; empty: those that carry RoCE (see [`Why`]).
    pub interfaces: Vec<String>,
    /// Those of `interfaces` named on the command line (`--iface`); the others came
    /// from the config. Only says why each is audited.
    pub named: Vec<String>,
    /// The netdev MTU the RoCE interfaces need.
    pub required_mtu: u32,
    /// Hosts whose path must carry `required_mtu` (DF probes).
    pub peers: Vec<IpAddr>,
    /// Stands for `/sys` (fixture trees in tests).
    pub sysfs_root: PathBuf,
    pub policy: Policy,
    /// How long a path probe waits for its ICMP answer.
    pub probe_timeout: Duration,
}

impl AuditOptions {
    /// What the audit of a running agent or of `check` looks at, from resolved
    /// settings: the interfaces and VTEPs (none: those that carry RoCE).
    pub fn for_settings(
        settings: &crate::config::Settings,
        sysfs_root: &std::path::Path,
        probe_timeout: Duration,
    ) -> AuditOptions {
        let mut interfaces = settings.interfaces.clone();
        for v in &settings.vteps {
            if !interfaces.contains(v) {
                interfaces.push(v.clone());
            }
        }
        AuditOptions {
            interfaces,
            named: Vec::new(),
            required_mtu: settings.required_mtu(),
            peers: settings.peers.clone(),
            sysfs_root: sysfs_root.to_path_buf(),
            policy: settings.policy,
            probe_timeout,
        }
    }
}

/// Why the audit itself could not run (exit 2), as opposed to what it found.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("no such interface: {}", .0.join(", "))]
    NoInterface(Vec<String>),
    #[error(
        "no interface to audit: none carries RoCE (no netdev of an RDMA device in {}, no \
         VXLAN device); name the interfaces to audit with --iface IF (or `interfaces` in --config)",
        .sysfs_root.join("class/infiniband").display()
    )]
    NothingToAudit { sysfs_root: PathBuf },
    /// The RDMA devices could not be read, so the interfaces that carry RoCE are unknown.
    #[error(
        "finding the interfaces that carry RoCE: {0}; name the interfaces to audit with --iface IF"
    )]
    RdmaDevices(#[from] rnic::RnicError),
    /// `fix` without interfaces named: it would change interfaces nobody asked about.
    #[error(
        "check --fix changes only interfaces you name: add --iface IF (or `interfaces` in \
         --config); check --dry-run prints what it would change"
    )]
    FixNeedsNamedInterfaces,
    #[error(transparent)]
    Netlink(#[from] LinkError),
    #[error("--sysfs-root {}: not a directory", .0.display())]
    NoSysfsRoot(PathBuf),
}

/// A VXLAN device and the underlay it sends through.
#[derive(Clone, Debug)]
pub struct VxlanPath {
    pub vxlan: Link,
    pub underlay: Link,
    pub source: UnderlaySource,
}

/// Why an interface is audited (`check --json`: `"why"`, with `rdma_device` or
/// `underlay_of` where they apply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Why {
    /// Named on the command line (`--iface`).
    Named,
    /// In the config's `interfaces` or `vteps`.
    Config,
    /// None asked for: a netdev in this RDMA device's GID table.
    RdmaDevice { rdma_device: String },
    /// None asked for: a VXLAN device.
    Vxlan,
    /// None asked for: the underlay of this VXLAN device.
    Underlay { underlay_of: String },
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Named => f.write_str("--iface"),
            Why::Config => f.write_str("config"),
            Why::RdmaDevice { rdma_device } => write!(f, "RDMA device {rdma_device}"),
            Why::Vxlan => f.write_str("VXLAN"),
            Why::Underlay { underlay_of } => write!(f, "underlay of {underlay_of}"),
        }
    }
}

/// One audited interface and why (`check --json`: `"interfaces"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditedInterface {
    pub ifname: String,
    #[serde(flatten)]
    pub why: Why,
}

/// What the audit read and what it found.
#[derive(Clone, Debug, Default)]
pub struct Audit {
    /// The interfaces audited, in the order asked (or found).
    pub audited: Vec<Link>,
    /// Why each of `audited` is, in the same order.
    pub why: Vec<AuditedInterface>,
    /// The VXLAN devices that are audited or run over an audited underlay.
    pub vxlans: Vec<VxlanPath>,
    pub findings: Vec<Finding>,
}

impl Audit {
    /// Whether any finding is at error level (exit 1).
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }
}

/// Reads this host's state and judges it (changes nothing).
pub fn audit(opts: &AuditOptions) -> Result<Audit, AuditError> {
    audit_with(opts, &mut rnic::PortCache::uncached())
}

/// [`audit`] with the RDMA ports from `ports`, which may keep their GID tables between
/// rounds (`run` audits every interval: see `rnic::PortCache`).
pub fn audit_with(opts: &AuditOptions, ports: &mut rnic::PortCache) -> Result<Audit, AuditError> {
    // A mistyped root would otherwise read as a host without RNICs.
    if !opts.sysfs_root.is_dir() {
        return Err(AuditError::NoSysfsRoot(opts.sysfs_root.clone()));
    }
    let mut rtnl = Rtnl::open()?;
    let links = rtnl.links()?;
    let chosen = choose(&mut rtnl, &links, opts, ports)?;
    let audited: Vec<Link> = chosen.iter().map(|(l, _)| l.clone()).collect();
    let names: BTreeSet<&str> = audited.iter().map(|l| l.name.as_str()).collect();

    let mut out = Audit::default();
    for l in &audited {
        out.findings.push(mtu::audit_link(l, opts.required_mtu));
    }
    for v in links.iter().filter(|l| l.vxlan.is_some()) {
        match underlay_of(&mut rtnl, &links, v) {
            Ok(Some((underlay, source))) => {
                if !names.contains(v.name.as_str()) && !names.contains(underlay.name.as_str()) {
                    continue;
                }
                out.findings.extend(mtu::audit_vxlan(v, &underlay, source));
                // A VXLAN device's RoCE path MTU is what its underlay leaves it.
                if let Some(info) = out.findings.iter_mut().find(|f| {
                    f.check == "mtu" && f.severity == Severity::Info && f.interface.as_deref() == Some(&v.name)
                }) {
                    info.found = format!(
                        "MTU {} over {} MTU {} (RoCE path MTU {})",
                        v.mtu,
                        underlay.name,
                        underlay.mtu,
                        mtu::vxlan_roce_path_mtu(v, &underlay).map_or("none".to_string(), |m| m.to_string())
                    );
                }
                out.vxlans.push(VxlanPath { vxlan: v.clone(), underlay, source });
            }
            Ok(None) if names.contains(v.name.as_str()) => out.findings.push(finding(
                "vxlan_overhead",
                Some(&v.name),
                Severity::Warning,
                "underlay unknown: no dev, and no route to its remote or interface with its local address",
                "a VXLAN device whose underlay can be found",
                format!("ip link show dev {}   # recreate it with `dev UNDERLAY`", v.name),
            )),
            Ok(None) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for l in &audited {
        out.findings
            .extend(dcb::audit(&l.name, &dcb::query(&l.name), &opts.policy));
    }
    let audited_names: Vec<String> = audited.iter().map(|l| l.name.clone()).collect();
    // The path beyond this host: DF probes of the required size, through audited
    // interfaces only.
    for &peer in &opts.peers {
        out.findings.extend(probe_audited_peer(
            &mut rtnl,
            &links,
            peer,
            opts,
            &audited_names,
        ));
    }
    let addresses = addresses_by_name(&mut rtnl, &links)?;
    out.findings.extend(rnic::audit_cached(
        &opts.sysfs_root,
        &audited_names,
        &opts.policy,
        &addresses,
        ports,
    ));
    out.findings
        .extend(watchdogs(&opts.sysfs_root, &audited_names, ports));
    out.why = chosen
        .into_iter()
        .map(|(l, why)| AuditedInterface {
            ifname: l.name,
            why,
        })
        .collect();
    out.audited = audited;
    sort(&mut out.findings);
    Ok(out)
}

/// The addresses of each interface, by name.
fn addresses_by_name(
    rtnl: &mut Rtnl,
    links: &[Link],
) -> Result<std::collections::BTreeMap<String, Vec<IpAddr>>, LinkError> {
    let mut out: std::collections::BTreeMap<String, Vec<IpAddr>> = Default::default();
    for (index, address) in rtnl.addresses()? {
        if let Some(l) = links.iter().find(|l| l.index == index) {
            out.entry(l.name.clone()).or_default().push(address);
        }
    }
    Ok(out)
}

/// The `mtu_path` finding for `peer` when the route towards it leaves through one of
/// `audited`; when it leaves through another interface, an info saying so and no
/// probe (a finding is only ever about an audited interface).
fn probe_audited_peer(
    rtnl: &mut Rtnl,
    links: &[Link],
    peer: IpAddr,
    opts: &AuditOptions,
    audited: &[String],
) -> Option<Finding> {
    let via = route_interface(rtnl, links, peer);
    match via {
        Some(via) if !audited.contains(&via) => Some(not_audited_path(peer, &via, audited)),
        _ => {
            let result = path::probe(peer, opts.required_mtu, opts.probe_timeout);
            path::audit(peer, opts.required_mtu, via.as_deref(), &result)
        }
    }
}

/// The info for a peer whose route leaves through `via`, which is not audited.
fn not_audited_path(peer: IpAddr, via: &str, audited: &[String]) -> Finding {
    finding(
        "mtu_path",
        None,
        Severity::Info,
        format!(
            "{peer} not probed: the route towards it leaves through {via}, which is not audited"
        ),
        format!(
            "a peer reached through an audited interface ({})",
            audited.join(", ")
        ),
        format!("add --iface {via} to probe the path through it"),
    )
}

/// The name of the interface the route towards `peer` leaves through, when known.
fn route_interface(rtnl: &mut Rtnl, links: &[Link], peer: IpAddr) -> Option<String> {
    rtnl.route_interface(peer)
        .ok()
        .flatten()
        .and_then(|i| links.iter().find(|l| l.index == i))
        .map(|l| l.name.clone())
}

/// The `mtu_path` finding for `peer` (None: the path carries the required MTU). Blocks
/// for up to `opts.probe_timeout`.
pub fn probe_peer(
    rtnl: &mut Rtnl,
    links: &[Link],
    peer: IpAddr,
    opts: &AuditOptions,
) -> Option<Finding> {
    let via = route_interface(rtnl, links, peer);
    let result = path::probe(peer, opts.required_mtu, opts.probe_timeout);
    path::audit(peer, opts.required_mtu, via.as_deref(), &result)
}

/// The interfaces to audit and why: those asked for, else those that carry RoCE.
fn choose(
    rtnl: &mut Rtnl,
    links: &[Link],
    opts: &AuditOptions,
    ports: &mut rnic::PortCache,
) -> Result<Vec<(Link, Why)>, AuditError> {
    if opts.interfaces.is_empty() {
        return carrying_roce(rtnl, links, &opts.sysfs_root, ports);
    }
    Ok(select(links, &opts.interfaces)?
        .into_iter()
        .map(|l| {
            let why = if opts.named.contains(&l.name) {
                Why::Named
            } else {
                Why::Config
            };
            (l, why)
        })
        .collect())
}

/// The interfaces that carry RoCE, none being named: the netdevs of the RDMA devices'
/// GID tables (under `sysfs_root`), then the VXLAN devices, then their underlays; each
/// once, with the first reason found. Loopback never.
fn carrying_roce(
    rtnl: &mut Rtnl,
    links: &[Link],
    sysfs_root: &std::path::Path,
    ports: &mut rnic::PortCache,
) -> Result<Vec<(Link, Why)>, AuditError> {
    fn add(chosen: &mut Vec<(Link, Why)>, l: &Link, why: Why) {
        if !l.loopback && !chosen.iter().any(|(c, _)| c.index == l.index) {
            chosen.push((l.clone(), why));
        }
    }
    let mut chosen: Vec<(Link, Why)> = Vec::new();
    for port in ports.ports(sysfs_root)? {
        for netdev in &port.netdevs {
            // A netdev of another network namespace is not this audit's.
            if let Some(l) = links.iter().find(|l| &l.name == netdev) {
                let why = Why::RdmaDevice {
                    rdma_device: port.device.clone(),
                };
                add(&mut chosen, l, why);
            }
        }
    }
    let vxlans: Vec<&Link> = links.iter().filter(|l| l.vxlan.is_some()).collect();
    for v in &vxlans {
        add(&mut chosen, v, Why::Vxlan);
    }
    for v in &vxlans {
        if let Some((underlay, _)) = underlay_of(rtnl, links, v)? {
            let why = Why::Underlay {
                underlay_of: v.name.clone(),
            };
            add(&mut chosen, &underlay, why);
        }
    }
    if chosen.is_empty() {
        return Err(AuditError::NothingToAudit {
            sysfs_root: sysfs_root.to_path_buf(),
        });
    }
    Ok(chosen)
}

/// The links asked for (all must exist), each once, in the order asked.
fn select(links: &[Link], asked: &[String]) -> Result<Vec<Link>, AuditError> {
    let missing: Vec<String> = asked
        .iter()
        .filter(|a| !links.iter().any(|l| &l.name == *a))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(AuditError::NoInterface(missing));
    }
    let mut seen = BTreeSet::new();
    Ok(asked
        .iter()
        .filter(|a| seen.insert(a.as_str()))
        .filter_map(|a| links.iter().find(|l| &l.name == a).cloned())
        .collect())
}

/// A VXLAN device's underlay: its `dev`, else the route to its remote, else the
/// interface holding its local address.
fn underlay_of(
    rtnl: &mut Rtnl,
    links: &[Link],
    v: &Link,
) -> Result<Option<(Link, UnderlaySource)>, LinkError> {
    let Some(params) = &v.vxlan else {
        return Ok(None);
    };
    let by_index = |i: u32| links.iter().find(|l| l.index == i).cloned();
    if let Some(l) = params.underlay.and_then(by_index) {
        return Ok(Some((l, UnderlaySource::Link)));
    }
    if let Some(remote) = params.remote {
        if let Some(l) = rtnl.route_interface(remote)?.and_then(by_index) {
            if l.index != v.index {
                return Ok(Some((l, UnderlaySource::Route)));
            }
        }
    }
    if let Some(local) = params.local {
        if let Some(l) = rtnl.address_interface(local)?.and_then(by_index) {
            return Ok(Some((l, UnderlaySource::LocalAddress)));
        }
    }
    Ok(None)
}

/// Most severe first, then by check and interface: the table an operator reads top-down.
pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.check.cmp(&b.check))
            .then_with(|| a.interface.cmp(&b.interface))
    });
}

/// A change `--fix` could not make.
#[derive(Debug, thiserror::Error)]
#[error("{check}{}{interface}: {what} not changed: {reason}", if interface.is_empty() { "" } else { " " })]
pub struct FixFailure {
    pub check: String,
    pub interface: String,
    pub what: String,
    pub reason: String,
}

/// What `fix` did and could not do.
#[derive(Debug, Default)]
pub struct Fixed {
    pub changes: Vec<Change>,
    pub failures: Vec<FixFailure>,
}

/// One MTU change the audit calls for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MtuChange {
    pub check: &'static str,
    pub link: Link,
    pub mtu: u32,
}

/// The MTU changes that answer `audit`'s `mtu` and `vxlan_overhead` errors, on audited
/// interfaces only, underlays before the VXLAN devices on them (a VXLAN device with a
/// `dev` refuses an MTU its underlay cannot carry).
pub fn mtu_plan(audit: &Audit, required: u32) -> (Vec<MtuChange>, Vec<FixFailure>) {
    let audited = |name: &str| audit.audited.iter().any(|l| l.name == name);
    let mut target: Vec<MtuChange> = Vec::new();
    let mut failures = Vec::new();
    let mut raise = |check: &'static str, link: &Link, mtu: u32| match target
        .iter_mut()
        .find(|c| c.link.index == link.index)
    {
        Some(c) => c.mtu = c.mtu.max(mtu),
        None => target.push(MtuChange {
            check,
            link: link.clone(),
            mtu,
        }),
    };
    for l in audit.audited.iter().filter(|l| l.mtu < required) {
        raise("mtu", l, required);
    }
    for p in &audit.vxlans {
        let overhead = if p.vxlan.vxlan.as_ref().is_some_and(|v| v.ipv6()) {
            mtu::VXLAN_OVERHEAD_V6
        } else {
            mtu::VXLAN_OVERHEAD_V4
        };
        // The VXLAN MTU it will have once its own `mtu` fix (if any) is made.
        let vxlan_mtu = if audited(&p.vxlan.name) {
            p.vxlan.mtu.max(required)
        } else {
            p.vxlan.mtu
        };
        let needed = vxlan_mtu.saturating_add(overhead);
        if p.underlay.mtu >= needed {
            continue;
        }
        if audited(&p.underlay.name) {
            raise("vxlan_overhead", &p.underlay, needed);
        } else {
            failures.push(FixFailure {
                check: "vxlan_overhead".into(),
                interface: p.vxlan.name.clone(),
                what: format!("MTU of underlay {}", p.underlay.name),
                reason: format!(
                    "{} is not audited; --fix changes only the interfaces asked about (add --iface {})",
                    p.underlay.name, p.underlay.name
                ),
            });
        }
    }
    let is_vxlan = |c: &MtuChange| c.link.vxlan.is_some();
    target.sort_by_key(|c| is_vxlan(c));
    (target, failures)
}

/// What `fix` would do, as commands an operator could type, and what it could not do.
#[derive(Debug, Default)]
pub struct Plan {
    /// In the order `fix` makes the changes: `ip link set dev IF mtu N`, `dcb app ...`,
    /// `dcb pfc ...`, `echo V > /sys/...`.
    pub commands: Vec<String>,
    pub not_planned: Vec<FixFailure>,
}

/// What [`fix`] would change on the audited interfaces, changing nothing (`check
/// --dry-run`). `fix` itself works over netlink and sysfs; the commands do the same.
pub fn plan(opts: &AuditOptions, audit: &Audit) -> Plan {
    let mut out = Plan::default();
    let (mtus, failures) = mtu_plan(audit, opts.required_mtu);
    out.not_planned.extend(failures);
    out.commands.extend(
        mtus.iter()
            .map(|c| format!("ip link set dev {} mtu {}", c.link.name, c.mtu)),
    );
    for l in &audit.audited {
        if let Ok(state) = dcb::query(&l.name) {
            out.commands
                .extend(dcb::fix_commands(&l.name, &state, &opts.policy));
        }
    }
    let names: Vec<String> = audit.audited.iter().map(|l| l.name.clone()).collect();
    for w in rnic::plan_fix(&opts.sysfs_root, &names, &opts.policy) {
        match w {
            Ok(w) => out.commands.push(w.command()),
            Err(e) => out.not_planned.push(knob_failure(&e)),
        }
    }
    out
}

/// An RNIC knob that could not be read or written (the error names the knob's file).
fn knob_failure(e: &rnic::RnicError) -> FixFailure {
    FixFailure {
        check: "rnic".into(),
        interface: String::new(),
        what: "sysfs knob".into(),
        reason: e.to_string(),
    }
}

/// Makes the changes the audit calls for on the audited interfaces: MTUs, DCB app
/// entries and PFC (devices with DCB), RNIC knobs. Refused when no interface was asked
/// for by name (`opts.interfaces` empty): it would change interfaces nobody named.
pub fn fix(opts: &AuditOptions, audit: &Audit) -> Result<Fixed, AuditError> {
    if opts.interfaces.is_empty() {
        return Err(AuditError::FixNeedsNamedInterfaces);
    }
    let mut fixed = Fixed::default();
    fix_mtu(audit, opts.required_mtu, &mut fixed)?;
    // DCB only where the device has it (a GET that answers).
    for l in &audit.audited {
        if let Ok(state) = dcb::query(&l.name) {
            let (changes, result) = dcb::fix(&l.name, &state, &opts.policy);
            fixed.changes.extend(changes);
            if let Err(e) = result {
                fixed.failures.push(FixFailure {
                    check: "dcb_app".into(),
                    interface: l.name.clone(),
                    what: "DCB app table / PFC".into(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let names: Vec<String> = audit.audited.iter().map(|l| l.name.clone()).collect();
    for r in rnic::fix(&opts.sysfs_root, &names, &opts.policy) {
        match r {
            Ok(c) => fixed.changes.push(c),
            Err(e) => fixed.failures.push(knob_failure(&e)),
        }
    }
    Ok(fixed)
}

/// The MTU part of `fix` alone (what `run --mode enforce` keeps enforced).
pub fn fix_mtu_only(audit: &Audit, required: u32) -> Result<Fixed, AuditError> {
    let mut fixed = Fixed::default();
    fix_mtu(audit, required, &mut fixed)?;
    Ok(fixed)
}

/// Applies the MTU plan through rtnetlink; each change read back.
fn fix_mtu(audit: &Audit, required: u32, fixed: &mut Fixed) -> Result<(), AuditError> {
    let (plan, failures) = mtu_plan(audit, required);
    fixed.failures.extend(failures);
    if plan.is_empty() {
        return Ok(());
    }
    let mut rtnl = Rtnl::open()?;
    for c in plan {
        match rtnl.set_mtu(c.link.index, c.mtu) {
            Ok(()) => {
                let now = rtnl
                    .links()?
                    .into_iter()
                    .find(|l| l.index == c.link.index)
                    .map_or(0, |l| l.mtu);
                fixed.changes.push(Change {
                    check: c.check.into(),
                    interface: c.link.name.clone(),
                    what: "mtu".into(),
                    before: c.link.mtu.to_string(),
                    after: now.to_string(),
                });
            }
            Err(e) => fixed.failures.push(FixFailure {
                check: c.check.into(),
                interface: c.link.name.clone(),
                what: format!("mtu {} -> {}", c.link.mtu, c.mtu),
                reason: if e.errno() == Some(libc::EPERM) {
                    "permission denied: changing an MTU needs CAP_NET_ADMIN".into()
                } else {
                    e.to_string()
                },
            }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audited(ifname: &str, why: Why) -> String {
        serde_json::to_string(&AuditedInterface {
            ifname: ifname.to_string(),
            why,
        })
        .unwrap_or_default()
    }

    #[test]
    fn each_audited_interface_says_why_in_json_and_in_the_table() {
        assert_eq!(
            audited(
                "eth1",
                Why::RdmaDevice {
                    rdma_device: "mlx5_0".into()
                }
            ),
            r#"{"ifname":"eth1","why":"rdma_device","rdma_device":"mlx5_0"}"#
        );
        assert_eq!(
            audited(
                "eth0",
                Why::Underlay {
                    underlay_of: "vxlan0".into()
                }
            ),
            r#"{"ifname":"eth0","why":"underlay","underlay_of":"vxlan0"}"#
        );
        assert_eq!(
            audited("vxlan0", Why::Vxlan),
            r#"{"ifname":"vxlan0","why":"vxlan"}"#
        );
        assert_eq!(
            audited("va", Why::Named),
            r#"{"ifname":"va","why":"named"}"#
        );
        assert_eq!(
            audited("va", Why::Config),
            r#"{"ifname":"va","why":"config"}"#
        );
        assert_eq!(
            Why::RdmaDevice {
                rdma_device: "mlx5_0".into()
            }
            .to_string(),
            "RDMA device mlx5_0"
        );
        assert_eq!(
            Why::Underlay {
                underlay_of: "vxlan0".into()
            }
            .to_string(),
            "underlay of vxlan0"
        );
    }

    #[test]
    fn a_peer_beyond_an_interface_not_audited_is_an_info_on_no_interface() {
        let f = not_audited_path(
            IpAddr::from([198, 18, 0, 9]),
            "eth0",
            &["eth1".to_string(), "vx0".to_string()],
        );
        assert_eq!(
            (f.check.as_str(), f.interface, f.severity),
            ("mtu_path", None, Severity::Info)
        );
        assert_eq!(
            f.found,
            "198.18.0.9 not probed: the route towards it leaves through eth0, which is not audited"
        );
        assert_eq!(
            f.expected,
            "a peer reached through an audited interface (eth1, vx0)"
        );
        assert_eq!(f.fix, "add --iface eth0 to probe the path through it");
    }

    #[test]
    fn fix_refuses_interfaces_nobody_named() {
        let opts = AuditOptions::for_settings(
            &crate::config::Settings::default(),
            std::path::Path::new("/sys"),
            Duration::from_secs(1),
        );
        assert!(opts.interfaces.is_empty());
        let err = fix(&opts, &Audit::default()).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "check --fix changes only interfaces you name: add --iface IF (or `interfaces` \
                 in --config); check --dry-run prints what it would change"
            )
        );
    }
}
