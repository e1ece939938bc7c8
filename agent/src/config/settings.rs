//! The configuration the agent runs with: the defaults and their limits, what the
//! command line says ([`Overrides`]), and [`Settings::resolve`], which takes the
//! defaults, then the file, then the flags, and checks every value, refusing one with
//! where it came from (the file's line and column, or the flag).

use std::ops::Range;
use std::time::Duration;

use roce_common::config::{pmtu_log2, RuntimeConfig};
use roce_common::policy::Policy;
use toml::Spanned;

use super::file::{ConfigError, ConfigFile, Origin};
use super::{EcnPropagation, HostMode, LogFormat};

/// Where the JSON API listens when neither `--listen` nor `listen` says otherwise:
/// loopback only, port 9473.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9473";
/// Seconds between two polls of the flow table and STATS.
pub const DEFAULT_INTERVAL_SECS: f64 = 1.0;
/// Flows of the kernel's flow table.
pub const DEFAULT_FLOWS_MAP_SIZE: u32 = 65536;
/// Largest flow table accepted (about 500 bytes a flow: 8 GB).
pub const MAX_FLOWS_MAP_SIZE: u32 = 1 << 24;
/// Path MTU assumed until a flow's own is learnt.
pub const DEFAULT_PMTU: u32 = 4096;
/// Longest interval accepted, in seconds (one hour).
pub const MAX_INTERVAL_SECS: f64 = 3600.0;
/// Shortest interval accepted, in seconds.
pub const MIN_INTERVAL_SECS: f64 = 0.01;
/// Flows with the most problems that `GET /metrics` names one by one.
pub const DEFAULT_TOP_FLOWS: usize = 10;
/// Largest `top_flows` accepted: each is a handful of series per scrape.
pub const MAX_TOP_FLOWS: u32 = 1000;
/// Sampled events: 1 in this many of each kind per CPU (README, "Sampled events").
pub const DEFAULT_EVENTS_SAMPLE: u32 = 1;
/// Largest `events_sample` accepted (0, no events, is the smallest).
pub const MAX_EVENTS_SAMPLE: u32 = 1_000_000;
/// Linux interface names are at most 15 bytes.
const MAX_IFNAME_LEN: usize = 15;

/// What the command line says; `None`/empty means "not given".
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub interfaces: Vec<String>,
    pub listen: Option<String>,
    pub interval_secs: Option<f64>,
    pub mode: Option<HostMode>,
    /// `--vtep`: replaces `vteps` of the file when given.
    pub vteps: Vec<String>,
    /// `--mirror`: replaces `mirror_interfaces` of the file when given.
    pub mirror_interfaces: Vec<String>,
    pub ecn_propagation: Option<EcnPropagation>,
    pub mtu: Option<u32>,
    pub peers: Vec<std::net::IpAddr>,
    /// `--events-sample`.
    pub events_sample: Option<u32>,
    /// `--rtt-spike-us`.
    pub rtt_spike_us: Option<u32>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
    /// `--web-config-file`.
    pub web_config_file: Option<std::path::PathBuf>,
}

/// The configuration the agent runs with: defaults, then the file, then the flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub interfaces: Vec<String>,
    /// Mirror collector interfaces (`mirror_interfaces`, `--mirror`): XDP decapsulates
    /// GRE and ERSPAN II/III copies there (`xdp_mirror`). One that is also in
    /// `interfaces` gets the host policy's tc programs too.
    pub mirror_interfaces: Vec<String>,
    /// `HOST:PORT` of the JSON API.
    pub listen: String,
    pub interval: Duration,
    pub flows_map_size: u32,
    /// Default path MTU in bytes (the RoCE path MTU the interfaces must carry).
    pub default_pmtu: u32,
    /// The netdev MTU the RoCE interfaces need (`mtu` / `--mtu`); None: the one that
    /// carries `default_pmtu` (see `required_mtu`).
    pub mtu: Option<u32>,
    /// Hosts whose path `check` probes.
    pub peers: Vec<std::net::IpAddr>,
    /// What the kernel programs read from CONFIG (but `events_sample`, below).
    pub runtime: RuntimeConfig,
    /// Host DSCP policy mode on egress of `interfaces`.
    pub mode: HostMode,
    /// VTEP underlay interfaces.
    pub vteps: Vec<String>,
    pub ecn_propagation: EcnPropagation,
    /// DSCPs, lossless set, priority and VTEP tables (POLICY and QOS maps).
    pub policy: Policy,
    /// The K flows with the most problems that `GET /metrics` names (`roce_top_flow_*`).
    pub top_flows: usize,
    /// Sampled events: 1 in N of each kind per CPU (0: none). Apart from `runtime`,
    /// whose default (no events) is what a loader without a reader wants: `load_options`
    /// puts it in.
    pub events_sample: u32,
    /// How `run` writes its log (read at start only).
    pub log_format: LogFormat,
    /// Payload bytes a sampled event keeps after the last transport header it parsed
    /// (0, the default: headers only, no application data leaves the host).
    pub events_payload_bytes: u32,
    /// The exporter-toolkit web configuration file of the API (TLS, basic auth,
    /// response headers); None: plain HTTP without authentication. A relative path in
    /// the config file is relative to that file's directory.
    pub web_config_file: Option<std::path::PathBuf>,
    /// The fabric verdicts' thresholds (`[verdicts]`).
    pub verdicts: super::VerdictThresholds,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interfaces: Vec::new(),
            mirror_interfaces: Vec::new(),
            listen: DEFAULT_LISTEN.to_string(),
            interval: Duration::from_secs_f64(DEFAULT_INTERVAL_SECS),
            flows_map_size: DEFAULT_FLOWS_MAP_SIZE,
            default_pmtu: DEFAULT_PMTU,
            mtu: None,
            peers: Vec::new(),
            runtime: RuntimeConfig::default(),
            mode: HostMode::default(),
            vteps: Vec::new(),
            ecn_propagation: EcnPropagation::default(),
            policy: Policy::default(),
            top_flows: DEFAULT_TOP_FLOWS,
            events_sample: DEFAULT_EVENTS_SAMPLE,
            log_format: LogFormat::default(),
            events_payload_bytes: 0,
            web_config_file: None,
            verdicts: super::VerdictThresholds::default(),
        }
    }
}

impl Settings {
    /// Defaults, overridden by `file` (when given), overridden by `flags`; then checked.
    /// `require_interfaces`: refuse a result with no interface (what `run` needs).
    pub fn resolve(
        file: Option<&ConfigFile>,
        flags: &Overrides,
        require_interfaces: bool,
    ) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        let invalid = |origin: Origin, field: &'static str, message: String| ConfigError::Invalid {
            origin,
            field,
            message,
        };

        // Interfaces: the flags replace the file's list.
        let mut ifaces: Vec<(String, Origin)> = Vec::new();
        let mut ifaces_origin = Origin::Missing;
        if !flags.interfaces.is_empty() {
            ifaces_origin = Origin::Flag("--iface");
            ifaces = flags
                .interfaces
                .iter()
                .map(|i| (i.clone(), Origin::Flag("--iface")))
                .collect();
        } else if let (Some(f), Some(list)) =
            (file, &file.and_then(|f| f.values.interfaces.as_ref()))
        {
            ifaces_origin = f.origin(list.span());
            ifaces = list
                .get_ref()
                .iter()
                .map(|i| (i.get_ref().clone(), f.origin(i.span())))
                .collect();
        }
        for (i, (name, origin)) in ifaces.iter().enumerate() {
            check_ifname(name).map_err(|m| invalid(origin.clone(), "interfaces", m))?;
            if ifaces[..i].iter().any(|(n, _)| n == name) {
                return Err(invalid(
                    origin.clone(),
                    "interfaces",
                    format!("interface {name} is listed twice"),
                ));
            }
        }
        // Mirror collector interfaces: the flags replace the file's list.
        let mut mirrors: Vec<(String, Origin)> = flags
            .mirror_interfaces
            .iter()
            .map(|i| (i.clone(), Origin::Flag("--mirror")))
            .collect();
        if mirrors.is_empty() {
            if let Some((f, list)) =
                file.and_then(|f| f.values.mirror_interfaces.as_ref().map(|l| (f, l)))
            {
                mirrors = list
                    .get_ref()
                    .iter()
                    .map(|i| (i.get_ref().clone(), f.origin(i.span())))
                    .collect();
            }
        }
        for (i, (name, origin)) in mirrors.iter().enumerate() {
            check_ifname(name).map_err(|m| invalid(origin.clone(), "mirror_interfaces", m))?;
            if mirrors[..i].iter().any(|(n, _)| n == name) {
                return Err(invalid(
                    origin.clone(),
                    "mirror_interfaces",
                    format!("interface {name} is listed twice"),
                ));
            }
        }
        if require_interfaces && ifaces.is_empty() && mirrors.is_empty() {
            return Err(invalid(
                ifaces_origin,
                "interfaces",
                "no interface to attach to: give --iface IF (or --mirror IF) or set `interfaces = [\"IF\"]` in the config file"
                    .to_string(),
            ));
        }
        s.interfaces = ifaces.into_iter().map(|(n, _)| n).collect();
        s.mirror_interfaces = mirrors.into_iter().map(|(n, _)| n).collect();

        // Listen address.
        if let Some(l) = &flags.listen {
            check_listen(l).map_err(|m| invalid(Origin::Flag("--listen"), "listen", m))?;
            s.listen = l.clone();
        } else if let Some((f, l)) = file.and_then(|f| f.values.listen.as_ref().map(|l| (f, l))) {
            check_listen(l.get_ref()).map_err(|m| invalid(f.origin(l.span()), "listen", m))?;
            s.listen = l.get_ref().clone();
        }

        // Poll interval.
        if let Some(secs) = flags.interval_secs {
            s.interval = check_interval(secs)
                .map_err(|m| invalid(Origin::Flag("--interval"), "interval", m))?;
        } else if let Some((f, v)) = file.and_then(|f| f.values.interval.as_ref().map(|v| (f, v))) {
            s.interval = check_interval(*v.get_ref())
                .map_err(|m| invalid(f.origin(v.span()), "interval", m))?;
        }

        if let Some(f) = file {
            let v = &f.values;
            if let Some(n) = &v.flows_map_size {
                let size = *n.get_ref();
                if size == 0 || size > MAX_FLOWS_MAP_SIZE {
                    return Err(invalid(
                        f.origin(n.span()),
                        "flows_map_size",
                        format!("{size} is out of range (1 to {MAX_FLOWS_MAP_SIZE})"),
                    ));
                }
                s.flows_map_size = size;
            }
            if let Some(p) = &v.roce_port {
                s.runtime.roce_port = check_port(*p.get_ref())
                    .map_err(|m| invalid(f.origin(p.span()), "roce_port", m))?;
            }
            if let Some(p) = &v.vxlan_port {
                s.runtime.vxlan_port = check_port(*p.get_ref())
                    .map_err(|m| invalid(f.origin(p.span()), "vxlan_port", m))?;
            }
            check_ports_differ(file, &s.runtime)?;
            if let Some(m) = &v.default_pmtu {
                let bytes = *m.get_ref();
                s.runtime.default_pmtu_log2 = pmtu_log2(bytes).ok_or_else(|| {
                    invalid(
                        f.origin(m.span()),
                        "default_pmtu",
                        format!(
                            "{bytes} is not an InfiniBand MTU: use 256, 512, 1024, 2048 or 4096"
                        ),
                    )
                })?;
                s.default_pmtu = bytes;
            }
            if let Some(k) = &v.top_flows {
                let top = *k.get_ref();
                if top > MAX_TOP_FLOWS {
                    return Err(invalid(
                        f.origin(k.span()),
                        "top_flows",
                        format!("{top} is out of range (0 to {MAX_TOP_FLOWS})"),
                    ));
                }
                s.top_flows = top as usize;
            }
        }
        if let Some(n) = flags.events_sample {
            s.events_sample = check_events_sample(n)
                .map_err(|m| invalid(Origin::Flag("--events-sample"), "events_sample", m))?;
        } else if let Some((f, n)) =
            file.and_then(|f| f.values.events_sample.as_ref().map(|n| (f, n)))
        {
            s.events_sample = check_events_sample(*n.get_ref())
                .map_err(|m| invalid(f.origin(n.span()), "events_sample", m))?;
        }
        if let Some(us) = flags.rtt_spike_us {
            s.runtime.rtt_spike_us = us;
        } else if let Some(us) = file.and_then(|f| f.values.rtt_spike_us.as_ref()) {
            s.runtime.rtt_spike_us = *us.get_ref();
        }
        if let Some(format) = flags.log_format {
            s.log_format = format;
        } else if let Some(format) = file.and_then(|f| f.values.log_format.as_ref()) {
            s.log_format = *format.get_ref();
        }
        if let Some((f, n)) =
            file.and_then(|f| f.values.events_payload_bytes.as_ref().map(|n| (f, n)))
        {
            s.events_payload_bytes = check_events_payload_bytes(*n.get_ref())
                .map_err(|m| invalid(f.origin(n.span()), "events_payload_bytes", m))?;
        }
        if let Some(path) = &flags.web_config_file {
            s.web_config_file = Some(path.clone());
        } else if let Some((f, p)) =
            file.and_then(|f| f.values.web_config_file.as_ref().map(|p| (f, p)))
        {
            if p.get_ref().is_empty() {
                return Err(invalid(
                    f.origin(p.span()),
                    "web_config_file",
                    "is empty: name the web configuration file, or leave the key out".into(),
                ));
            }
            s.web_config_file = Some(f.relative_path(p.get_ref()));
        }
        s.resolve_host(file, flags)?;
        s.resolve_qos(file, flags)?;
        s.verdicts = super::VerdictThresholds::resolve(file)?;
        s.policy.config = s.runtime;
        Ok(s)
    }

    /// The netdev MTU the RoCE interfaces need: `mtu`, or the one carrying `default_pmtu`.
    pub fn required_mtu(&self) -> u32 {
        self.mtu
            .unwrap_or_else(|| roce_common::config::netdev_mtu_for(self.default_pmtu))
    }

    /// `mtu` and `peers` (the host audit).
    fn resolve_host(
        &mut self,
        file: Option<&ConfigFile>,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        let invalid = |origin: Origin, field: &'static str, message: String| ConfigError::Invalid {
            origin,
            field,
            message,
        };
        if let Some(m) = flags.mtu {
            self.mtu = Some(check_mtu(m).map_err(|e| invalid(Origin::Flag("--mtu"), "mtu", e))?);
        } else if let Some((f, m)) = file.and_then(|f| f.values.mtu.as_ref().map(|m| (f, m))) {
            self.mtu =
                Some(check_mtu(*m.get_ref()).map_err(|e| invalid(f.origin(m.span()), "mtu", e))?);
        }
        if !flags.peers.is_empty() {
            self.peers = flags.peers.clone();
        } else if let Some((f, list)) = file.and_then(|f| f.values.peers.as_ref().map(|l| (f, l))) {
            for p in list.get_ref() {
                let addr = p.get_ref().parse().map_err(|_| {
                    invalid(
                        f.origin(p.span()),
                        "peers",
                        format!("{:?} is not an IPv4 or IPv6 address", p.get_ref()),
                    )
                })?;
                self.peers.push(addr);
            }
        }
        Ok(())
    }

    /// Mode, VTEPs, ECN propagation and the `[qos]` table.
    fn resolve_qos(
        &mut self,
        file: Option<&ConfigFile>,
        flags: &Overrides,
    ) -> Result<(), ConfigError> {
        let invalid = |origin: Origin, field: &'static str, message: String| ConfigError::Invalid {
            origin,
            field,
            message,
        };
        let values = file.map(|f| (f, &f.values));
        if let Some(m) = flags.mode {
            self.mode = m;
        } else if let Some(m) = values.and_then(|(_, v)| v.mode.as_ref()) {
            self.mode = *m.get_ref();
        }
        if let Some(e) = flags.ecn_propagation {
            self.ecn_propagation = e;
        } else if let Some(e) = values.and_then(|(_, v)| v.ecn_propagation.as_ref()) {
            self.ecn_propagation = *e.get_ref();
        }
        let mut vteps: Vec<(String, Origin)> = flags
            .vteps
            .iter()
            .map(|i| (i.clone(), Origin::Flag("--vtep")))
            .collect();
        if vteps.is_empty() {
            if let Some((f, list)) = values.and_then(|(f, v)| v.vteps.as_ref().map(|l| (f, l))) {
                vteps = list
                    .get_ref()
                    .iter()
                    .map(|i| (i.get_ref().clone(), f.origin(i.span())))
                    .collect();
            }
        }
        for (i, (name, origin)) in vteps.iter().enumerate() {
            check_ifname(name).map_err(|m| invalid(origin.clone(), "vteps", m))?;
            if vteps[..i].iter().any(|(n, _)| n == name) {
                return Err(invalid(
                    origin.clone(),
                    "vteps",
                    format!("interface {name} is listed twice"),
                ));
            }
        }
        self.vteps = vteps.into_iter().map(|(n, _)| n).collect();

        let Some((f, q)) = values.and_then(|(f, v)| v.qos.as_ref().map(|q| (f, q))) else {
            return Ok(());
        };
        let dscp = |v: &Spanned<u8>, field: &'static str| -> Result<u8, ConfigError> {
            let d = *v.get_ref();
            if d >= 64 {
                return Err(invalid(
                    f.origin(v.span()),
                    field,
                    format!("DSCP {d} is out of range (0 to 63)"),
                ));
            }
            Ok(d)
        };
        let key_dscp =
            |k: &str, span: Range<usize>, field: &'static str| -> Result<u8, ConfigError> {
                match k.parse::<u8>() {
                    Ok(d) if d < 64 => Ok(d),
                    _ => Err(invalid(
                        f.origin(span),
                        field,
                        format!("key {k:?} is not a DSCP (0 to 63)"),
                    )),
                }
            };
        let p = &mut self.policy;
        if let Some(v) = &q.roce_dscp {
            p.qos.roce_dscp = dscp(v, "qos.roce_dscp")?;
        }
        if let Some(v) = &q.cnp_dscp {
            p.qos.cnp_dscp = dscp(v, "qos.cnp_dscp")?;
        }
        if let Some(v) = &q.remark_dscp {
            p.qos.remark_dscp = dscp(v, "qos.remark_dscp")?;
        }
        if let Some(list) = &q.lossless_dscps {
            let dscps = list
                .get_ref()
                .iter()
                .map(|v| dscp(v, "qos.lossless_dscps"))
                .collect::<Result<Vec<u8>, _>>()?;
            p.set_lossless(&dscps);
        }
        if p.table[p.qos.remark_dscp as usize].lossless() {
            // The defaults agree: one of the two is in the file. Name the later.
            let (origin, field) = f
                .last_set(&[
                    ("qos.remark_dscp", q.remark_dscp.as_ref().map(Spanned::span)),
                    (
                        "qos.lossless_dscps",
                        q.lossless_dscps.as_ref().map(Spanned::span),
                    ),
                ])
                .unwrap_or((Origin::Missing, "qos.remark_dscp"));
            return Err(invalid(
                origin,
                field,
                format!(
                    "DSCP {} is in lossless_dscps: intruders would stay in the lossless queue",
                    p.qos.remark_dscp
                ),
            ));
        }
        if let Some(map) = &q.priority {
            for (k, v) in map.get_ref() {
                let d = key_dscp(k, map.span(), "qos.priority")?;
                // The eight 802.1p priorities that PFC and the NIC's DSCP map know.
                if *v.get_ref() > 7 {
                    return Err(invalid(
                        f.origin(v.span()),
                        "qos.priority",
                        format!("priority {} is out of range (0 to 7)", v.get_ref()),
                    ));
                }
                p.table[d as usize].priority = *v.get_ref();
            }
        }
        if let Some(map) = &q.vtep_dscp {
            for (k, v) in map.get_ref() {
                let d = key_dscp(k, map.span(), "qos.vtep_dscp")?;
                p.table[d as usize].vtep_outer = dscp(v, "qos.vtep_dscp")?;
            }
        }
        Ok(())
    }

    /// The interfaces that get tc programs and whose PFC counters `/metrics` reads:
    /// `interfaces` (host policy), then the VTEPs not among them.
    pub fn tc_interfaces(&self) -> Vec<String> {
        let mut names = self.interfaces.clone();
        for v in &self.vteps {
            if !names.contains(v) {
                names.push(v.clone());
            }
        }
        names
    }

    /// CONFIG as these settings ask for it, events sampling included.
    pub fn runtime_config(&self) -> RuntimeConfig {
        RuntimeConfig {
            events_sample: self.events_sample,
            ..self.runtime
        }
    }
}

/// Refuses a RoCEv2 port equal to the VXLAN port. Of the two keys, names the one the
/// file sets last (the line a reader fixes), or the one it sets when the other is the
/// default; with neither in the file, no position.
fn check_ports_differ(
    file: Option<&ConfigFile>,
    runtime: &RuntimeConfig,
) -> Result<(), ConfigError> {
    if runtime.roce_port != runtime.vxlan_port {
        return Ok(());
    }
    let set = file.and_then(|f| {
        f.last_set(&[
            ("roce_port", f.values.roce_port.as_ref().map(Spanned::span)),
            (
                "vxlan_port",
                f.values.vxlan_port.as_ref().map(Spanned::span),
            ),
        ])
    });
    let (origin, field) = set.unwrap_or((Origin::Missing, "vxlan_port"));
    Err(ConfigError::Invalid {
        origin,
        field,
        message: format!(
            "roce_port and vxlan_port are both {}: they must differ",
            runtime.roce_port
        ),
    })
}

pub(crate) fn check_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an interface name is empty".to_string());
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(format!(
            "interface name {name:?} is longer than {MAX_IFNAME_LEN} bytes"
        ));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}

fn check_listen(addr: &str) -> Result<(), String> {
    if addr.parse::<std::net::SocketAddr>().is_ok() || all_addresses_port(addr).is_some() {
        return Ok(());
    }
    match addr.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{addr:?} is not HOST:PORT (e.g. 127.0.0.1:9473, [::1]:9473, localhost:9473, or :9473 for every address)"
        )),
    }
}

/// The port of `:PORT`, the exporters' way of saying every address (IPv6 and IPv4).
fn all_addresses_port(addr: &str) -> Option<u16> {
    addr.strip_prefix(':')?.parse().ok()
}

/// What the API binds for a checked `listen` address, in the order to try: `:PORT` is
/// `[::]:PORT` (IPv6 and, where the host maps them, IPv4), then `0.0.0.0:PORT` on a host
/// without IPv6; any other address is itself.
pub fn bind_addresses(listen: &str) -> Vec<String> {
    match all_addresses_port(listen) {
        Some(port) => vec![format!("[::]:{port}"), format!("0.0.0.0:{port}")],
        None => vec![listen.to_string()],
    }
}

fn check_interval(secs: f64) -> Result<Duration, String> {
    if !secs.is_finite() || !(MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(&secs) {
        return Err(format!(
            "{secs} seconds is out of range ({MIN_INTERVAL_SECS} to {MAX_INTERVAL_SECS})"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The range Linux accepts for an Ethernet MTU (68 is IPv4's minimum; 65535 the largest).
fn check_mtu(mtu: u32) -> Result<u32, String> {
    if (68..=65535).contains(&mtu) {
        Ok(mtu)
    } else {
        Err(format!("{mtu} is out of range (68 to 65535)"))
    }
}

/// Largest `events_payload_bytes`: a sample is at most 128 bytes of the frame.
pub const MAX_EVENTS_PAYLOAD_BYTES: u32 = 128;

fn check_events_payload_bytes(n: u32) -> Result<u32, String> {
    if n > MAX_EVENTS_PAYLOAD_BYTES {
        return Err(format!(
            "{n} is out of range (0 to {MAX_EVENTS_PAYLOAD_BYTES}: a sampled event holds at most the first 128 bytes of the frame)"
        ));
    }
    Ok(n)
}

fn check_events_sample(n: u32) -> Result<u32, String> {
    if n > MAX_EVENTS_SAMPLE {
        return Err(format!(
            "{n} is out of range (0 to {MAX_EVENTS_SAMPLE}; 0 emits no events)"
        ));
    }
    Ok(n)
}

fn check_port(port: u16) -> Result<u16, String> {
    if port == 0 {
        return Err("port 0 is not a valid UDP destination port".to_string());
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(Path::new("t.toml"), text.to_string())
    }

    fn resolve(text: &str, flags: &Overrides) -> Result<Settings, ConfigError> {
        let f = parse(text)?;
        Settings::resolve(Some(&f), flags, true)
    }

    fn iface(name: &str) -> Overrides {
        Overrides {
            interfaces: vec![name.to_string()],
            ..Default::default()
        }
    }

    #[test]
    fn no_file_gives_defaults() {
        let s = Settings::resolve(None, &iface("eth1"), true).unwrap();
        assert_eq!(s.interfaces, vec!["eth1"]);
        assert_eq!(s.listen, "127.0.0.1:9473");
        assert_eq!(s.interval, Duration::from_secs(1));
        assert_eq!(s.flows_map_size, 65536);
        assert_eq!(s.runtime, RuntimeConfig::default());
        assert_eq!(s.events_sample, 1);
        assert_eq!(s.default_pmtu, 4096);
    }

    #[test]
    fn full_file_is_read() {
        let s = resolve(
            "interfaces = [\"eth1\", \"eth2\"]\nlisten = \"[::1]:9000\"\ninterval = 0.5\n\
             flows_map_size = 1024\nroce_port = 4792\nvxlan_port = 8472\ndefault_pmtu = 1024\n",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.interfaces, vec!["eth1", "eth2"]);
        assert_eq!(s.listen, "[::1]:9000");
        assert_eq!(s.interval, Duration::from_millis(500));
        assert_eq!(s.flows_map_size, 1024);
        assert_eq!((s.runtime.roce_port, s.runtime.vxlan_port), (4792, 8472));
        assert_eq!(s.runtime.default_pmtu_log2, 10);
    }

    #[test]
    fn integer_interval_is_accepted() {
        let s = resolve("interval = 2", &iface("eth1")).unwrap();
        assert_eq!(s.interval, Duration::from_secs(2));
    }

    #[test]
    fn flags_override_the_file() {
        let flags = Overrides {
            interfaces: vec!["veth0".into()],
            listen: Some("127.0.0.1:1".into()),
            interval_secs: Some(3.0),
            ..Default::default()
        };
        let s = resolve(
            "interfaces = [\"eth1\"]\nlisten = \"127.0.0.1:2\"\ninterval = 5\n",
            &flags,
        )
        .unwrap();
        assert_eq!(s.interfaces, vec!["veth0"]);
        assert_eq!(s.listen, "127.0.0.1:1");
        assert_eq!(s.interval, Duration::from_secs(3));
    }

    #[test]
    fn bad_mtu_is_refused_with_its_position() {
        let e = resolve("\ndefault_pmtu = 1500\n", &iface("eth1")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:2:16: default_pmtu: 1500 is not an InfiniBand MTU: use 256, 512, 1024, 2048 or 4096"
        );
    }

    #[test]
    fn port_zero_is_refused() {
        let e = resolve("roce_port = 0\n", &iface("eth1")).unwrap_err();
        assert!(
            e.to_string().starts_with("t.toml:1:13: roce_port: port 0"),
            "{e}"
        );
    }

    /// Equal ports are refused at the key the file sets last, whichever it is; at the
    /// one it sets when the other is the default; with no position when neither is in
    /// the file (as a value that no file set: `Origin::Missing`).
    #[test]
    fn equal_ports_name_the_line_of_the_later_key() {
        let cases = [
            (
                "roce_port = 4000\nvxlan_port = 4000\n",
                "t.toml:2:14: vxlan_port: roce_port and vxlan_port are both 4000: they must differ",
            ),
            (
                "vxlan_port = 4000\n\nroce_port = 4000\n",
                "t.toml:3:13: roce_port: roce_port and vxlan_port are both 4000: they must differ",
            ),
            (
                "interval = 1\nroce_port = 4789\n",
                "t.toml:2:13: roce_port: roce_port and vxlan_port are both 4789: they must differ",
            ),
            (
                "vxlan_port = 4791\ninterval = 1\n",
                "t.toml:1:14: vxlan_port: roce_port and vxlan_port are both 4791: they must differ",
            ),
        ];
        for (text, expected) in cases {
            let e = resolve(text, &iface("eth1")).unwrap_err();
            assert_eq!(e.to_string(), expected, "{text}");
        }
        // Neither key in the file (no flag sets them either; the defaults differ, so
        // only a changed default could get here).
        let equal = RuntimeConfig {
            roce_port: 4789,
            ..RuntimeConfig::default()
        };
        let f = parse("interval = 1\n").unwrap();
        for file in [None, Some(&f)] {
            let e = check_ports_differ(file, &equal).unwrap_err();
            assert_eq!(
                e.to_string(),
                "vxlan_port: roce_port and vxlan_port are both 4789: they must differ"
            );
        }
        assert!(check_ports_differ(Some(&f), &RuntimeConfig::default()).is_ok());
    }

    /// The same for `remark_dscp` in `lossless_dscps`: the later key, or the one set.
    #[test]
    fn remark_dscp_in_the_lossless_set_names_the_later_key() {
        let cases = [
            (
                "[qos]\nremark_dscp = 26\n",
                "t.toml:2:15: qos.remark_dscp: DSCP 26 is in lossless_dscps",
            ),
            (
                "[qos]\nlossless_dscps = [0, 26]\n",
                "t.toml:2:18: qos.lossless_dscps: DSCP 0 is in lossless_dscps",
            ),
            (
                "[qos]\nremark_dscp = 8\nlossless_dscps = [8]\n",
                "t.toml:3:18: qos.lossless_dscps: DSCP 8 is in lossless_dscps",
            ),
            (
                "[qos]\nlossless_dscps = [8]\nremark_dscp = 8\n",
                "t.toml:3:15: qos.remark_dscp: DSCP 8 is in lossless_dscps",
            ),
        ];
        for (text, expected) in cases {
            let e = resolve(text, &iface("eth1")).unwrap_err();
            assert!(e.to_string().starts_with(expected), "{text}=> {e}");
        }
    }

    #[test]
    fn empty_interface_list_is_refused_unless_flags_give_one() {
        let e = resolve("interfaces = []\n", &Overrides::default()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.toml:1:14: interfaces: no interface"),
            "{e}"
        );
        let e = Settings::resolve(None, &Overrides::default(), true).unwrap_err();
        assert!(e.to_string().contains("--iface"), "{e}");
        assert!(resolve("interfaces = []\n", &iface("eth1")).is_ok());
        assert!(Settings::resolve(None, &Overrides::default(), false).is_ok());
    }

    #[test]
    fn duplicate_interfaces_are_refused() {
        let e = resolve("interfaces = [\"eth1\", \"eth1\"]\n", &Overrides::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:1:23: interfaces: interface eth1 is listed twice"
        );
        let flags = Overrides {
            interfaces: vec!["a".into(), "a".into()],
            ..Default::default()
        };
        let e = Settings::resolve(None, &flags, true).unwrap_err();
        assert_eq!(e.to_string(), "--iface: interface a is listed twice");
    }

    #[test]
    fn mirror_interfaces_come_from_the_file_or_the_flag_and_suffice_alone() {
        // A pure collector: no `interfaces`, mirror interfaces only.
        let s = resolve(
            "mirror_interfaces = [\"mir0\", \"mir1\"]\n",
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.mirror_interfaces, vec!["mir0", "mir1"]);
        assert!(s.interfaces.is_empty());
        // The flag replaces the file's list; an interface may be both.
        let flags = Overrides {
            interfaces: vec!["eth1".into()],
            mirror_interfaces: vec!["eth1".into()],
            ..Default::default()
        };
        let s = resolve("mirror_interfaces = [\"mir0\"]\n", &flags).unwrap();
        assert_eq!(
            (s.interfaces, s.mirror_interfaces),
            (vec!["eth1".to_string()], vec!["eth1".to_string()])
        );
        let e = resolve(
            "mirror_interfaces = [\"m\", \"m\"]\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:1:27: mirror_interfaces: interface m is listed twice"
        );
        let e = resolve("mirror_interfaces = [\"a/b\"]\n", &Overrides::default()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t.toml:1:22: mirror_interfaces: "),
            "{e}"
        );
        // Neither list: still refused.
        let e = resolve("mirror_interfaces = []\n", &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("--mirror IF"), "{e}");
    }

    #[test]
    fn colon_port_listens_on_every_address_from_the_file_and_the_flag() {
        let s = resolve("listen = \":9473\"\n", &iface("e")).unwrap();
        assert_eq!(s.listen, ":9473");
        assert_eq!(bind_addresses(&s.listen), ["[::]:9473", "0.0.0.0:9473"]);
        let flags = Overrides {
            listen: Some(":1".into()),
            ..iface("e")
        };
        assert_eq!(Settings::resolve(None, &flags, true).unwrap().listen, ":1");
        assert_eq!(bind_addresses("127.0.0.1:9473"), ["127.0.0.1:9473"]);
        for bad in [":", ":port", ":70000", "::9473"] {
            let e = resolve(&format!("listen = {bad:?}\n"), &iface("e")).unwrap_err();
            assert!(
                e.to_string().contains(":9473 for every address"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn log_format_comes_from_the_file_and_the_flag_wins() {
        let s = resolve("", &iface("e")).unwrap();
        assert_eq!(s.log_format, LogFormat::Text);
        let s = resolve("log_format = \"json\"\n", &iface("e")).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
        let flags = Overrides {
            log_format: Some(LogFormat::Logfmt),
            ..iface("e")
        };
        let s = resolve("log_format = \"json\"\n", &flags).unwrap();
        assert_eq!(s.log_format, LogFormat::Logfmt);
        let e = resolve("log_format = \"xml\"\n", &iface("e")).unwrap_err();
        assert!(
            e.to_string().starts_with("t.toml:1:14: log_format: "),
            "{e}"
        );
    }

    #[test]
    fn bad_listen_and_interval_are_refused() {
        assert!(resolve("listen = \"nonsense\"\n", &iface("e")).is_err());
        assert!(resolve("listen = \"localhost:9473\"\n", &iface("e")).is_ok());
        assert!(resolve("interval = 0\n", &iface("e")).is_err());
        let flags = Overrides {
            interfaces: vec!["e".into()],
            interval_secs: Some(f64::NAN),
            ..Default::default()
        };
        let e = Settings::resolve(None, &flags, true).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--interval: NaN seconds is out of range"),
            "{e}"
        );
        let e = resolve("flows_map_size = 0\n", &iface("e")).unwrap_err();
        assert!(e.to_string().contains("flows_map_size"), "{e}");
    }

    #[test]
    fn long_interface_name_is_refused() {
        let e = Settings::resolve(None, &iface("a-very-long-interface"), true).unwrap_err();
        assert!(e.to_string().contains("longer than 15"), "{e}");
    }

    #[test]
    fn qos_defaults_are_audit_kernel_and_the_documented_policy() {
        let s = Settings::resolve(None, &iface("eth1"), true).unwrap();
        assert_eq!(
            (s.mode, s.ecn_propagation),
            (HostMode::Audit, EcnPropagation::Kernel)
        );
        assert!(s.vteps.is_empty());
        assert_eq!(s.policy, Policy::default());
        assert_eq!(
            (
                s.policy.qos.roce_dscp,
                s.policy.qos.cnp_dscp,
                s.policy.qos.remark_dscp
            ),
            (26, 48, 0)
        );
        assert_eq!(s.policy.table[26].priority, 3);
        assert!(s.policy.table[26].lossless() && !s.policy.table[48].lossless());
    }

    #[test]
    fn qos_table_and_modes_come_from_the_file_and_flags_win() {
        let text = "interfaces = [\"eth1\"]\nmode = \"enforce\"\nvteps = [\"eth0\"]\n\
                    ecn_propagation = \"rfc6040\"\nroce_port = 4792\n[qos]\nroce_dscp = 24\ncnp_dscp = 56\n\
                    lossless_dscps = [24, 46]\nremark_dscp = 8\npriority = { \"24\" = 4, \"56\" = 7 }\n\
                    vtep_dscp = { \"10\" = 26 }\n";
        let s = resolve(text, &Overrides::default()).unwrap();
        assert_eq!(
            (s.mode, s.ecn_propagation),
            (HostMode::Enforce, EcnPropagation::Rfc6040)
        );
        assert_eq!(s.vteps, vec!["eth0"]);
        let p = &s.policy;
        assert_eq!(
            (p.qos.roce_dscp, p.qos.cnp_dscp, p.qos.remark_dscp),
            (24, 56, 8)
        );
        assert!(p.table[24].lossless() && p.table[46].lossless() && !p.table[26].lossless());
        assert_eq!(
            (
                p.table[24].priority,
                p.table[56].priority,
                p.table[26].priority
            ),
            (4, 7, 3)
        );
        assert_eq!((p.table[10].vtep_outer, p.table[11].vtep_outer), (26, 11));
        assert_eq!(p.config.roce_port, 4792);
        let flags = Overrides {
            mode: Some(HostMode::Audit),
            vteps: vec!["eth9".into()],
            ecn_propagation: Some(EcnPropagation::Kernel),
            ..Default::default()
        };
        let s = resolve(text, &flags).unwrap();
        assert_eq!(
            (s.mode, s.ecn_propagation, s.vteps),
            (
                HostMode::Audit,
                EcnPropagation::Kernel,
                vec!["eth9".to_string()]
            )
        );
    }

    #[test]
    fn bad_qos_values_are_refused_with_their_position() {
        let e = resolve(
            "interfaces = [\"e\"]\n[qos]\nroce_dscp = 64\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:3:13: qos.roce_dscp: DSCP 64 is out of range (0 to 63)"
        );
        let e = resolve(
            "interfaces = [\"e\"]\n[qos]\npriority = { \"x\" = 1 }\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("qos.priority: key \"x\" is not a DSCP"),
            "{e}"
        );
        let e = resolve(
            "interfaces = [\"e\"]\n[qos]\nremark_dscp = 26\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("lossless"), "{e}");
        let e = resolve(
            "interfaces = [\"e\"]\nmode = \"strict\"\n",
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("t.toml:2:"), "{e}");
    }

    #[test]
    fn events_sample_defaults_to_one_the_flag_wins_and_it_is_bounded() {
        let s = resolve("", &iface("e")).unwrap();
        assert_eq!(s.events_sample, 1);
        assert_eq!(s.runtime_config().events_sample, 1);
        let s = resolve("events_sample = 0\n", &iface("e")).unwrap();
        assert_eq!(s.runtime_config().events_sample, 0);
        let flag = Overrides {
            events_sample: Some(1000),
            ..iface("e")
        };
        let s = resolve("events_sample = 10\n", &flag).unwrap();
        assert_eq!(s.events_sample, 1000);
        let e = resolve("interval = 1\nevents_sample = 1000001\n", &iface("e")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:2:17: events_sample: 1000001 is out of range (0 to 1000000; 0 emits no events)"
        );
        let flag = Overrides {
            events_sample: Some(2_000_000),
            ..iface("e")
        };
        let e = resolve("", &flag).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--events-sample: 2000000 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn events_payload_bytes_defaults_to_headers_only_and_is_bounded_by_the_sample() {
        let s = resolve("", &iface("e")).unwrap();
        assert_eq!(s.events_payload_bytes, 0);
        let s = resolve("events_payload_bytes = 64\n", &iface("e")).unwrap();
        assert_eq!(s.events_payload_bytes, 64);
        let s = resolve("events_payload_bytes = 128\n", &iface("e")).unwrap();
        assert_eq!(s.events_payload_bytes, 128);
        // The kernel programs are not told: what an event keeps is the agent's business.
        assert_eq!(
            s.runtime_config(),
            resolve("", &iface("e")).unwrap().runtime_config()
        );
        let e = resolve("interval = 1\nevents_payload_bytes = 129\n", &iface("e")).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("t.toml:2:24: events_payload_bytes: 129 is out of range (0 to 128"),
            "{e}"
        );
        let e = resolve("events_payload_bytes = -1\n", &iface("e")).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("t.toml:1:24: ") && e.contains("events_payload_bytes"),
            "{e}"
        );
    }

    #[test]
    fn verdict_thresholds_default_to_the_anchors_and_are_checked_where_written() {
        let s = Settings::resolve(None, &iface("eth1"), true).unwrap();
        assert_eq!(s.verdicts, super::super::VerdictThresholds::default());
        assert_eq!(s.verdicts.min_ce, 10);
        let s = resolve(
            "[verdicts]\nwindow_secs = 5\nmin_ce = 3\npause_storm_share = 0.8\nslow_receiver_pauses_per_s = 250.0\necmp_qps_per_port = 2\n",
            &iface("e"),
        )
        .unwrap();
        assert_eq!(s.verdicts.window, Duration::from_secs(5));
        assert_eq!(
            (
                s.verdicts.min_ce,
                s.verdicts.pause_storm_share,
                s.verdicts.ecmp_qps_per_port
            ),
            (3, 0.8, 2)
        );
        assert_eq!(s.verdicts.slow_receiver_pauses_per_s, 250.0);
        assert_eq!(s.verdicts.pause_storm_rounds, 3, "the default stays");
        let e = resolve("[verdicts]\nmin_ce = 0\n", &iface("e"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.toml:2:10: min_ce: 0 is out of range (1 or more)"),
            "{e}"
        );
        let e = resolve("[verdicts]\npause_storm_share = 1.0\n", &iface("e"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pause_storm_share: 1 is out of range"), "{e}");
        let e = resolve("[verdicts]\nstorm = 1\n", &iface("e"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("storm"), "an unknown key: {e}");
    }

    #[test]
    fn top_flows_defaults_to_ten_and_is_bounded() {
        let s = Settings::resolve(None, &iface("eth1"), true).unwrap();
        assert_eq!(s.top_flows, 10);
        assert_eq!(
            resolve("top_flows = 0\n", &iface("e")).unwrap().top_flows,
            0
        );
        assert_eq!(
            resolve("top_flows = 1000\n", &iface("e"))
                .unwrap()
                .top_flows,
            1000
        );
        let e = resolve("interval = 1\ntop_flows = 1001\n", &iface("e")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml:2:13: top_flows: 1001 is out of range (0 to 1000)"
        );
        let e = parse("top_flows = -1\n").unwrap_err();
        assert!(e.to_string().starts_with("t.toml:1:13: "), "{e}");
    }

    /// Every kind of bad file is refused with FILE:LINE:COLUMN and the key's name,
    /// before anything is loaded or attached (`Settings::resolve` runs first in `run`).
    #[test]
    fn every_bad_config_is_refused_with_its_position_and_key() {
        let cases: &[(&str, &str, &str)] = &[
            // (file, position, the key named)
            ("rocee_port = 4791\n", "1:1", "rocee_port"),
            ("[qos]\nlossles_dscps = [26]\n", "2:1", "qos.lossles_dscps"),
            ("[qoss]\nroce_dscp = 26\n", "1:2", "qoss"),
            ("roce_port = \"4791\"\n", "1:13", "roce_port"),
            ("interval = \"1s\"\n", "1:12", "interval"),
            ("interfaces = \"eth1\"\n", "1:14", "interfaces"),
            ("[qos]\nroce_dscp = 64\n", "2:13", "qos.roce_dscp"),
            ("[qos]\ncnp_dscp = 99\n", "2:12", "qos.cnp_dscp"),
            (
                "[qos]\nlossless_dscps = [26, 64]\n",
                "2:23",
                "qos.lossless_dscps",
            ),
            ("[qos]\nremark_dscp = 26\n", "2:15", "qos.remark_dscp"),
            ("[qos]\npriority = { \"26\" = 8 }\n", "2:21", "qos.priority"),
            ("[qos]\npriority = { \"x\" = 1 }\n", "2:", "qos.priority"),
            (
                "[qos]\nvtep_dscp = { \"10\" = 64 }\n",
                "2:",
                "qos.vtep_dscp",
            ),
            ("roce_port = 4789\n", "1:13", "roce_port"),
            ("vxlan_port = 4000\nroce_port = 4000\n", "2:13", "roce_port"),
            (
                "[qos]\nlossless_dscps = [0]\n",
                "2:18",
                "qos.lossless_dscps",
            ),
            ("roce_port = 0\n", "1:13", "roce_port"),
            ("vxlan_port = 70000\n", "1:14", "vxlan_port"),
            ("mode = \"strict\"\n", "1:8", "mode"),
            ("ecn_propagation = \"always\"\n", "1:19", "ecn_propagation"),
            ("roce_port = 4791\nroce_port = 4792\n", "2:1", "roce_port"),
            (
                "listen = \"127.0.0.1:9473\"\nroce_port = = 4\n",
                "2:13",
                "roce_port",
            ),
            ("[qos\nroce_dscp = 26\n", "1:5", ""),
            ("interfaces = [\"eth1\", \"eth1\"]\n", "1:23", "interfaces"),
            (
                "interfaces = [\"a-very-long-interface\"]\n",
                "1:15",
                "interfaces",
            ),
            ("default_pmtu = 1500\n", "1:16", "default_pmtu"),
            ("mtu = 70000\n", "1:7", "mtu"),
            ("interval = 0\n", "1:12", "interval"),
            ("flows_map_size = 0\n", "1:18", "flows_map_size"),
            ("listen = \"nonsense\"\n", "1:10", "listen"),
            ("top_flows = 1001\n", "1:13", "top_flows"),
            ("events_sample = -1\n", "1:17", "events_sample"),
            (
                "events_payload_bytes = 129\n",
                "1:24",
                "events_payload_bytes",
            ),
            ("peers = [\"not a host!\"]\n", "1:", "peers"),
        ];
        let mut wrong = Vec::new();
        for (text, at, key) in cases {
            // Flags' interfaces replace the file's: give none where the file has its own.
            let flags = if text.starts_with("interfaces") {
                Overrides::default()
            } else {
                iface("e")
            };
            match resolve(text, &flags) {
                Ok(_) => wrong.push(format!("accepted:\n{text}")),
                Err(e) => {
                    let e = e.to_string();
                    let named = e.contains(&format!("{key}:")) || e.contains(&format!("`{key}`"));
                    if !e.starts_with(&format!("t.toml:{at}")) || !named {
                        wrong.push(format!("{text}=> {e}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
        assert!(cases.len() >= 30);
    }
}
