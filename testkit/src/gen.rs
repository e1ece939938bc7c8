//! `roce-gen`: a RoCEv2 traffic generator for probing a setup and for the lab tests.
//!
//! It sends RoCEv2 packets of one or more queue pairs and prints, per flow, exactly
//! what it sent: packets, bytes, ECN codepoints (outer and inner), CE marks, CNPs,
//! ACKs/NAKs, injected PSN gaps, VNI and destination QP, in the same field names as
//! the agent's flow document, so that `roce-agent flows --json` on the receiver can be
//! compared flow by flow.
//!
//! Three ways to put packets on the wire:
//! - `--via raw` (default): whole Ethernet frames built with [`crate::frame`] and
//!   sent on an `AF_PACKET` socket (pnet's datalink channel). Any opcode, any TOS,
//!   correct ICRC. Needs the next hop's MAC (`--dst-mac`, or a neighbour entry).
//! - `--via udp`: a UDP socket with `IP_TOS` / `IPV6_TCLASS` set per packet; the kernel
//!   writes Ethernet/IP/UDP, the generator the BTH, extension headers and ICRC.
//! - Through a VXLAN device: give a VXLAN device as `--iface` (either `--via`); the
//!   kernel encapsulates (its `tos` setting decides the outer DSCP; the outer ECN is
//!   the inner one, with inner CE written as outer ECT(0)). The VNI and underlay
//!   addresses are read from the device. Or craft VXLAN yourself on a plain
//!   interface with `--vni N --outer-src A --outer-dst B` (`--via raw`), which can
//!   also mark the outer header CE (`--outer-ce`), as a congested underlay switch does.
//!
//! Packets of a flow: `--count` data packets cycling through `--ops`, `--ce` of
//! them CE-marked (spread evenly), plus `--cnp` CNPs interleaved; `--flows N` sends
//! the same to N consecutive QPs. `--rate` or `--duration` paces the whole run.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use pnet::datalink::{self, Channel, DataLinkSender, NetworkInterface};
use pnet::util::MacAddr;
use serde::Serialize;

use crate::frame::{self, cnp, Eth, Ipv4Hdr, Ipv6Hdr, RoceMsg, L3};
use crate::sock;
use roce_common::bth;
use roce_common::wire::{DEFAULT_ROCE_PORT, DEFAULT_VXLAN_PORT, ECN_CE, ECN_ECT0};

/// Why the generator could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("interface {0} does not exist (in this network namespace)")]
    NoInterface(String),
    #[error("{what}: permission denied; sending raw frames and binding to a device need root (CAP_NET_RAW, CAP_NET_ADMIN)")]
    Permission { what: String },
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> GenError {
    let what = what.into();
    move |source| {
        if source.kind() == io::ErrorKind::PermissionDenied || source.raw_os_error() == Some(1) {
            GenError::Permission { what }
        } else {
            GenError::Io { what, source }
        }
    }
}

fn usage(msg: impl Into<String>) -> GenError {
    GenError::Usage(msg.into())
}

/// How packets leave the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// Crafted Ethernet frames on an AF_PACKET socket.
    Raw,
    /// A UDP socket with IP_TOS / IPV6_TCLASS; the kernel writes Ethernet/IP/UDP.
    Udp,
}

/// The operations data packets cycle through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// RC SEND_ONLY with --payload bytes.
    Send,
    /// RC RDMA_WRITE_ONLY (RETH) with --payload bytes.
    Write,
    /// RC RDMA_READ_REQUEST (RETH) of --read-len bytes (uses ceil(len/--pmtu) PSNs).
    Read,
    /// RC ACKNOWLEDGE, AETH syndrome ACK (0x1F).
    Ack,
    /// RC ACKNOWLEDGE, AETH syndrome NAK PSN sequence error (0x60).
    Nak,
    /// RC ACKNOWLEDGE, AETH syndrome RNR NAK (0x2E).
    RnrNak,
}

/// An ECN codepoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Ecn {
    NotEct,
    Ect1,
    Ect0,
    Ce,
}

impl Ecn {
    pub fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }
}

/// `roce-gen`'s options (the binary is a thin wrapper around [`run`]).
#[derive(Clone, Debug, Args)]
pub struct GenArgs {
    /// Interface to send on: an Ethernet-like device (veth, NIC, mirror port), or a
    /// VXLAN device, whose VNI and underlay addresses are then read from the device
    /// and the kernel encapsulates.
    #[arg(long, short = 'i')]
    pub iface: String,
    /// raw: crafted Ethernet frames (AF_PACKET). udp: a UDP socket with IP_TOS set.
    #[arg(long, value_enum, default_value_t = Via::Raw)]
    pub via: Via,
    /// Source IP address (of the RoCE packet; the inner one when tunnelled). Default:
    /// the interface's first address of the destination's family.
    #[arg(long)]
    pub src: Option<IpAddr>,
    /// Destination IP address (of the RoCE packet; the inner one when tunnelled).
    #[arg(long)]
    pub dst: IpAddr,
    /// Destination MAC of crafted frames (the next hop; with a VXLAN device the inner
    /// destination). Default: the neighbour table's entry for --dst (or --outer-dst).
    #[arg(long)]
    pub dst_mac: Option<MacAddr>,
    /// Source MAC of crafted frames. Default: the interface's.
    #[arg(long)]
    pub src_mac: Option<MacAddr>,
    /// Destination QP (24 bits, decimal or 0x-hex) of the first flow.
    #[arg(long, default_value = "0x12", value_parser = parse_u24)]
    pub qp: u32,
    /// Number of flows: QPs --qp, --qp + 1, ...; flow i uses UDP source port --sport + i.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub flows: u32,
    /// UDP source port of the first flow (RoCE flow entropy).
    #[arg(long, default_value_t = 49152)]
    pub sport: u16,
    /// UDP destination port.
    #[arg(long, default_value_t = DEFAULT_ROCE_PORT)]
    pub dport: u16,
    /// Data packets per flow (CNPs come on top).
    #[arg(long, default_value_t = 10)]
    pub count: u64,
    /// Operations the data packets cycle through, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "send")]
    pub ops: Vec<Op>,
    /// Of each flow's data packets, this many carry ECN CE (spread evenly) in the
    /// header the generator writes (the inner one when tunnelled).
    #[arg(long, default_value_t = 0)]
    pub ce: u64,
    /// CNPs per flow (opcode 0x81, BECN, destination QP = the flow's QP), interleaved.
    #[arg(long, default_value_t = 0)]
    pub cnp: u64,
    /// Request packets per flow whose PSN skips one ahead (a PSN gap each; never the
    /// first request nor one right after a READ, whose PSN distance tells the receiver
    /// the path MTU).
    #[arg(long, default_value_t = 0)]
    pub psn_gaps: u64,
    /// First PSN of each flow (24 bits).
    #[arg(long, default_value = "0", value_parser = parse_u24)]
    pub psn: u32,
    /// DSCP of data packets.
    #[arg(long, default_value_t = 26, value_parser = clap::value_parser!(u8).range(0..64))]
    pub dscp: u8,
    /// ECN of data packets that are not CE-marked.
    #[arg(long, value_enum, default_value_t = Ecn::Ect0)]
    pub ecn: Ecn,
    /// DSCP of CNPs (their ECN is Not-ECT).
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u8).range(0..64))]
    pub cnp_dscp: u8,
    /// Payload bytes of SEND and WRITE packets.
    #[arg(long, default_value_t = 256)]
    pub payload: usize,
    /// Text the payload of SEND and WRITE packets repeats (cut at --payload bytes).
    /// Default: a counting pattern 0, 1, 2, ...
    #[arg(long, value_name = "TEXT")]
    pub payload_pattern: Option<String>,
    /// DMA length of READ requests.
    #[arg(long, default_value_t = 4096)]
    pub read_len: u32,
    /// Path MTU used to advance the PSN after a READ request (256..4096).
    #[arg(long, default_value_t = 4096)]
    pub pmtu: u32,
    /// Packets per second over all flows; 0 sends as fast as the socket takes them.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Spread all packets evenly over this many seconds (overrides --rate).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Craft VXLAN with this VNI around the RoCE frame (--via raw on a plain
    /// interface; needs --outer-src and --outer-dst). With a VXLAN device as --iface:
    /// only checks that the device has this VNI.
    #[arg(long, value_parser = parse_u24)]
    pub vni: Option<u32>,
    /// Underlay source address of crafted VXLAN.
    #[arg(long)]
    pub outer_src: Option<IpAddr>,
    /// Underlay destination address of crafted VXLAN.
    #[arg(long)]
    pub outer_dst: Option<IpAddr>,
    /// Outer DSCP of crafted VXLAN. Default: the inner DSCP (like `tos inherit`).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..64))]
    pub outer_dscp: Option<u8>,
    /// Of each flow's data packets, this many get an outer CE mark (crafted VXLAN
    /// only), as an underlay switch marks; the others' outer ECN follows the inner one
    /// as Linux encapsulates (inner CE -> outer ECT(0)).
    #[arg(long, default_value_t = 0)]
    pub outer_ce: u64,
    /// CPU to send from: a number, `current` (the one it starts on) or `any` (no
    /// pinning). A NIC's RSS keeps a flow on one receive queue and CPU; a veth whose
    /// peer has XDP receives in one NAPI context, run on the CPU that scheduled it, so
    /// when several generators feed one veth, give them all the same CPU to keep each
    /// flow on one CPU (per-CPU flow state such as PSN tracking depends on it).
    #[arg(long, default_value = "current", value_parser = parse_cpu)]
    pub cpu: CpuChoice,
    /// Print the report as JSON (one document on stdout).
    #[arg(long)]
    pub json: bool,
}

/// Where the generator runs (see `--cpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuChoice {
    Current,
    Any,
    Cpu(usize),
}

fn parse_cpu(s: &str) -> Result<CpuChoice, String> {
    match s {
        "current" => Ok(CpuChoice::Current),
        "any" => Ok(CpuChoice::Any),
        n => n
            .parse::<usize>()
            .map(CpuChoice::Cpu)
            .map_err(|_| format!("{s:?} is not a CPU number, `current` or `any`")),
    }
}

/// Pins the calling thread to one CPU (see `--cpu`); returns the CPU.
fn pin(choice: CpuChoice) -> Result<Option<usize>, GenError> {
    let cpu = match choice {
        CpuChoice::Any => return Ok(None),
        CpuChoice::Cpu(n) => n,
        CpuChoice::Current => {
            // SAFETY: sched_getcpu has no preconditions.
            let c = unsafe { libc::sched_getcpu() };
            if c < 0 {
                return Err(io_err("sched_getcpu")(io::Error::last_os_error()));
            }
            c as usize
        }
    };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(usage(format!("--cpu {cpu} is out of range")));
    }
    sock::pin_thread_to_cpu(cpu).map_err(io_err(format!("pinning to CPU {cpu} (--cpu)")))?;
    Ok(Some(cpu))
}

fn parse_u24(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse::<u32>(),
    }
    .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if v > 0x00FF_FFFF {
        return Err(format!("{s} does not fit in 24 bits"));
    }
    Ok(v)
}

/// ECN codepoint counts, named as in the agent's flow document.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EcnCounts {
    pub not_ect: u64,
    pub ect1: u64,
    pub ect0: u64,
    pub ce: u64,
}

impl EcnCounts {
    fn add(&mut self, ecn: u8) {
        match ecn & 3 {
            0 => self.not_ect += 1,
            1 => self.ect1 += 1,
            2 => self.ect0 += 1,
            _ => self.ce += 1,
        }
    }
}

/// What was sent on one flow. Field names follow the agent's flow document.
#[derive(Clone, Debug, Serialize)]
pub struct FlowReport {
    /// How the flow was carried: "plain", "vxlan-device" (the kernel encapsulated)
    /// or "vxlan-crafted".
    pub encap: &'static str,
    /// Outer family and addresses (the underlay's when tunnelled).
    pub family: &'static str,
    pub src: String,
    pub dst: String,
    /// RoCE UDP source port (the inner one when tunnelled).
    pub sport: u16,
    pub vni: Option<u32>,
    pub inner_family: Option<&'static str>,
    pub inner_src: Option<String>,
    pub inner_dst: Option<String>,
    pub dest_qp: u32,
    /// Every packet of the flow, CNPs included.
    pub packets: u64,
    /// Frame bytes as they appear on the (underlay) wire, from the Ethernet header on.
    pub bytes: u64,
    /// Outer ECN codepoints (for kernel encapsulation: what Linux writes).
    pub ecn: EcnCounts,
    pub inner_ecn: Option<EcnCounts>,
    /// CE marks the generator wrote (in the RoCE packet's own IP header).
    pub ce: u64,
    pub cnps: u64,
    pub acks: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub psn_gaps: u64,
    /// Outer DSCP of the last packet.
    pub last_dscp: u8,
    /// DSCP of the last packet's own (inner) IP header when tunnelled: what a VTEP
    /// that propagates markings copies to the outer header.
    pub last_inner_dscp: Option<u8>,
    /// Packets by opcode name.
    pub opcodes: BTreeMap<String, u64>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub iface: String,
    pub via: Via,
    pub packets: u64,
    pub elapsed_s: f64,
    /// The CPU the generator was pinned to (None: not pinned).
    pub cpu: Option<usize>,
    /// True when interrupted (SIGINT) before everything was sent.
    pub interrupted: bool,
    pub flows: Vec<FlowReport>,
}

/// A VXLAN device's settings, as `ip -d -j link show` prints them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VxlanDevice {
    pub vni: u32,
    pub local: IpAddr,
    pub remote: IpAddr,
    /// `tos inherit` (the outer DSCP is the inner one).
    pub tos_inherit: bool,
    /// The fixed outer TOS when not inherited.
    pub tos: u8,
}

/// Reads the VXLAN settings of `iface` with `ip -d -j link show`; `Ok(None)` when it is
/// not a VXLAN device.
pub fn vxlan_device(iface: &str) -> Result<Option<VxlanDevice>, GenError> {
    let out = Command::new("ip")
        .args(["-d", "-j", "link", "show", "dev", iface])
        .output()
        .map_err(io_err(
            "running `ip -d -j link show` (is iproute2 installed?)",
        ))?;
    if !out.status.success() {
        return Err(GenError::NoInterface(iface.to_string()));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| usage(format!("cannot parse `ip -d -j link show {iface}`: {e}")))?;
    let Some(info) = v.get(0).and_then(|l| l.get("linkinfo")) else {
        return Ok(None);
    };
    if info.get("info_kind").and_then(|k| k.as_str()) != Some("vxlan") {
        return Ok(None);
    }
    let data = info
        .get("info_data")
        .ok_or_else(|| usage(format!("{iface}: a VXLAN device without info_data")))?;
    let vni = data
        .get("id")
        .and_then(|x| x.as_u64())
        .ok_or_else(|| usage(format!("{iface}: VXLAN device without an id")))?;
    let addr = |keys: &[&str]| -> Option<IpAddr> {
        keys.iter()
            .filter_map(|k| data.get(*k).and_then(|x| x.as_str()))
            .find_map(|s| s.parse().ok())
    };
    let local = addr(&["local", "local6"]).ok_or_else(|| {
        usage(format!(
            "{iface}: the VXLAN device has no local address (create it with `local ADDR`)"
        ))
    })?;
    let remote = addr(&["remote", "remote6"]).ok_or_else(|| {
        usage(format!(
            "{iface}: the VXLAN device has no unicast remote (create it with `remote ADDR`)"
        ))
    })?;
    let tos = match data.get("tos") {
        None => 0,
        Some(t) => match t.as_str() {
            Some("inherit") => 1,
            Some(s) => u8::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0),
            None => t.as_u64().unwrap_or(0) as u8,
        },
    };
    Ok(Some(VxlanDevice {
        vni: vni as u32,
        local,
        remote,
        tos_inherit: tos == 1,
        tos: if tos == 1 { 0 } else { tos },
    }))
}

/// The neighbour table's MAC for `ip` on `iface` (`ip -j neigh show`).
pub fn neighbour_mac(iface: &str, ip: IpAddr) -> Result<Option<MacAddr>, GenError> {
    let out = Command::new("ip")
        .args(["-j", "neigh", "show", "to", &ip.to_string(), "dev", iface])
        .output()
        .map_err(io_err(
            "running `ip -j neigh show` (is iproute2 installed?)",
        ))?;
    if !out.status.success() {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.get("lladdr").and_then(|m| m.as_str()))
        .find_map(|m| m.parse::<MacAddr>().ok()))
}

/// One packet to send, before addressing.
#[derive(Clone, Debug)]
struct Planned {
    msg: RoceMsg,
    /// TOS of the RoCE packet's own IP header.
    tos: u8,
    /// Outer CE mark (crafted VXLAN).
    outer_ce: bool,
}

/// True when item `k` of `n` is one of `m` spread evenly (Bresenham).
fn spread(k: u64, m: u64, n: u64) -> bool {
    if n == 0 || m == 0 {
        return false;
    }
    (k + 1) * m / n > k * m / n
}

/// The packets of one flow, in order.
fn plan_flow(a: &GenArgs, qp: u32) -> Result<Vec<Planned>, GenError> {
    let pmtu = a.pmtu.max(1);
    let requests: Vec<u64> = (0..a.count)
        .filter(|k| {
            matches!(
                a.ops[*k as usize % a.ops.len()],
                Op::Send | Op::Write | Op::Read
            )
        })
        .collect();
    let op_of = |k: u64| a.ops[k as usize % a.ops.len()];
    // Where a gap may go: a request after the first (which only sets what the receiver
    // expects) whose previous request is not a READ. The receiver learns a flow's path
    // MTU from the PSN distance after a READ, so a gap there would read as a smaller
    // MTU, not as a gap.
    let candidates: Vec<u64> = requests
        .windows(2)
        .filter(|w| op_of(w[0]) != Op::Read)
        .map(|w| w[1])
        .collect();
    if a.psn_gaps > candidates.len() as u64 {
        return Err(usage(format!(
            "--psn-gaps {} needs as many request packets (SEND/WRITE/READ, not the first, \
             not right after a READ) per flow; --count {} with --ops {:?} has {}",
            a.psn_gaps,
            a.count,
            a.ops,
            candidates.len()
        )));
    }
    let n_cand = candidates.len() as u64;
    let gap_at: std::collections::HashSet<u64> = candidates
        .iter()
        .enumerate()
        .filter(|(i, _)| spread(*i as u64, a.psn_gaps, n_cand))
        .map(|(_, k)| *k)
        .collect();
    let total = a.count + a.cnp;
    let mut out = Vec::with_capacity(total as usize);
    let mut next_psn = a.psn & 0x00FF_FFFF;
    let mut last_req_psn = next_psn;
    let mut data_k = 0u64;
    let mut cnp_k = 0u64;
    let data_tos = a.dscp << 2;
    for slot in 0..total {
        // Interleave: CNP j goes where the evenly spread marks of `cnp` over `total` fall,
        // as long as CNPs remain and data does not run short.
        let data_left = a.count - data_k;
        let cnp_left = a.cnp - cnp_k;
        let is_cnp = cnp_left > 0 && (data_left == 0 || spread(slot, a.cnp, total));
        if is_cnp {
            cnp_k += 1;
            out.push(Planned {
                msg: cnp(qp),
                tos: a.cnp_dscp << 2,
                outer_ce: false,
            });
            continue;
        }
        let k = data_k;
        data_k += 1;
        let ecn = if spread(k, a.ce, a.count) {
            ECN_CE
        } else {
            a.ecn.bits()
        };
        let op = a.ops[k as usize % a.ops.len()];
        let msg = match op {
            Op::Send | Op::Write | Op::Read => {
                if gap_at.contains(&k) {
                    next_psn = (next_psn + 1) & 0x00FF_FFFF;
                }
                let psn = next_psn;
                last_req_psn = psn;
                let (msg, psns) = match op {
                    Op::Send => (with_pattern(RoceMsg::send_only(qp, psn, a.payload), a), 1),
                    Op::Write => (with_pattern(RoceMsg::write_only(qp, psn, a.payload), a), 1),
                    _ => (
                        RoceMsg::read_request(qp, psn, a.read_len),
                        a.read_len.div_ceil(pmtu).max(1),
                    ),
                };
                next_psn = (next_psn + psns) & 0x00FF_FFFF;
                msg
            }
            Op::Ack => RoceMsg::ack(qp, last_req_psn, 0x1F),
            Op::Nak => RoceMsg::ack(qp, last_req_psn, 0x60),
            Op::RnrNak => RoceMsg::ack(qp, last_req_psn, 0x2E),
        };
        out.push(Planned {
            msg,
            tos: data_tos | ecn,
            outer_ce: spread(k, a.outer_ce, a.count),
        });
    }
    Ok(out)
}

/// How frames are addressed and where they go.
enum Sink {
    Raw {
        tx: Box<dyn DataLinkSender>,
        eth: Eth,
    },
    Udp {
        sockets: Vec<UdpSocket>,
        dst: IpAddr,
        local: IpAddr,
        /// The TOS each socket currently has.
        tos: Vec<Option<u8>>,
    },
}

/// Where the flow's RoCE packet sits.
#[derive(Clone, Copy, Debug)]
enum Encap {
    Plain,
    Device(VxlanDevice),
    Crafted {
        outer_src: IpAddr,
        outer_dst: IpAddr,
        vni: u32,
    },
}

fn l3(src: IpAddr, dst: IpAddr, tos: u8) -> Result<L3, GenError> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ok(L3::V4(Ipv4Hdr::new(s, d)).with_tos(tos)),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ok(L3::V6(Ipv6Hdr::new(s, d)).with_tos(tos)),
        _ => Err(usage(format!(
            "source {src} and destination {dst} are of different address families"
        ))),
    }
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    }
}

fn ip_hlen(ip: IpAddr) -> u64 {
    if ip.is_ipv4() {
        20
    } else {
        40
    }
}

/// Linux's ECN encapsulation (RFC 3168 full functionality): CE becomes ECT(0).
fn encap_ecn(inner: u8) -> u8 {
    if inner & 3 == ECN_CE {
        ECN_ECT0
    } else {
        inner & 3
    }
}

fn find_interface(name: &str) -> Result<NetworkInterface, GenError> {
    datalink::interfaces()
        .into_iter()
        .find(|i| i.name == name)
        .ok_or_else(|| GenError::NoInterface(name.to_string()))
}

fn first_addr(ifc: &NetworkInterface, v4: bool) -> Option<IpAddr> {
    ifc.ips.iter().map(|n| n.ip()).find(|ip| ip.is_ipv4() == v4)
}

/// `msg` with the payload `--payload-pattern` asks for.
fn with_pattern(msg: RoceMsg, a: &GenArgs) -> RoceMsg {
    match &a.payload_pattern {
        Some(p) => msg.with_payload_pattern(p.as_bytes()),
        None => msg,
    }
}

fn set_tos(sock: &UdpSocket, v6: bool, tos: u8) -> Result<(), GenError> {
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TOS)
    };
    sock::set_int_option(sock, level, name, tos as i32)
        .map_err(io_err("setting IP_TOS / IPV6_TCLASS"))
}

/// The UDP payload (BTH .. ICRC) of `msg` as the kernel will frame it: IPv4 with
/// ID 0 and DF (what Linux writes for an unconnected socket with PMTU discovery on),
/// so that the ICRC is right on the wire.
fn udp_payload(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    msg: &RoceMsg,
) -> Result<Vec<u8>, GenError> {
    let l = l3(src, dst, 0)?;
    let f = frame::roce_frame_to(&Eth::default(), &l, sport, dport, msg);
    let at = frame::bth_offset(&Eth::default(), &l);
    Ok(f[at..].to_vec())
}

/// Sends what `args` asks for; stops early (reporting what went out) when `stop` is set.
pub fn run(args: &GenArgs, stop: &AtomicBool) -> Result<Report, GenError> {
    if args.ops.is_empty() {
        return Err(usage("--ops needs at least one operation"));
    }
    if !matches!(args.pmtu, 256 | 512 | 1024 | 2048 | 4096) {
        return Err(usage(format!(
            "--pmtu {} is not an IB MTU (256, 512, 1024, 2048, 4096)",
            args.pmtu
        )));
    }
    if args.ce > args.count || args.outer_ce > args.count {
        return Err(usage(format!(
            "--ce / --outer-ce cannot exceed --count ({})",
            args.count
        )));
    }
    if args.qp as u64 + args.flows as u64 - 1 > 0x00FF_FFFF {
        return Err(usage("--qp + --flows runs past the 24-bit QP space"));
    }
    if args.sport as u64 + args.flows as u64 - 1 > 0xFFFF {
        return Err(usage("--sport + --flows runs past port 65535"));
    }
    let cpu = pin(args.cpu)?;
    let ifc = find_interface(&args.iface)?;
    let device = vxlan_device(&args.iface)?;
    let encap = match (&device, args.vni) {
        (Some(d), Some(v)) if d.vni != v => {
            return Err(usage(format!(
                "{} is a VXLAN device with VNI {}, not {v}",
                args.iface, d.vni
            )))
        }
        (Some(d), _) => Encap::Device(*d),
        (None, Some(vni)) => {
            if args.via != Via::Raw {
                return Err(usage(
                    "crafted VXLAN (--vni on a plain interface) needs --via raw",
                ));
            }
            let (Some(outer_src), Some(outer_dst)) = (args.outer_src, args.outer_dst) else {
                return Err(usage(
                    "crafted VXLAN (--vni on a plain interface) needs --outer-src and --outer-dst",
                ));
            };
            Encap::Crafted {
                outer_src,
                outer_dst,
                vni,
            }
        }
        (None, None) => Encap::Plain,
    };
    if args.outer_ce > 0 && !matches!(encap, Encap::Crafted { .. }) {
        return Err(usage(
            "--outer-ce needs crafted VXLAN (--vni on a plain interface)",
        ));
    }
    let src = match args.src {
        Some(s) => s,
        None => first_addr(&ifc, args.dst.is_ipv4()).ok_or_else(|| {
            usage(format!(
                "{} has no {} address: pass --src",
                args.iface,
                family(args.dst)
            ))
        })?,
    };
    l3(src, args.dst, 0)?;
    // Plan every flow before touching a socket: plan errors are usage errors.
    let plans = (0..args.flows)
        .map(|i| plan_flow(args, args.qp + i))
        .collect::<Result<Vec<_>, _>>()?;

    let mut sink = match args.via {
        Via::Raw => {
            let src_mac = match (args.src_mac, ifc.mac) {
                (Some(m), _) | (None, Some(m)) => m,
                (None, None) => {
                    return Err(usage(format!(
                        "{} has no MAC address: pass --src-mac",
                        args.iface
                    )))
                }
            };
            let next_hop = match encap {
                Encap::Crafted { outer_dst, .. } => outer_dst,
                _ => args.dst,
            };
            let dst_mac = match args.dst_mac {
                Some(m) => m,
                None => neighbour_mac(&args.iface, next_hop)?.ok_or_else(|| {
                    usage(format!(
                        "no neighbour entry for {next_hop} on {}: pass --dst-mac (or reach it once, e.g. ping, so the kernel learns its MAC)",
                        args.iface
                    ))
                })?,
            };
            let config = datalink::Config {
                promiscuous: false,
                write_buffer_size: 16384,
                read_buffer_size: 2048,
                write_timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            };
            let tx = match datalink::channel(&ifc, config) {
                Ok(Channel::Ethernet(tx, _rx)) => tx,
                Ok(_) => return Err(usage(format!("{}: not an Ethernet channel", args.iface))),
                Err(e) => return Err(io_err(format!("opening a raw socket on {}", args.iface))(e)),
            };
            Sink::Raw {
                tx,
                eth: Eth::new(src_mac.octets(), dst_mac.octets()),
            }
        }
        Via::Udp => {
            let mut sockets = Vec::new();
            for i in 0..args.flows {
                let port = args.sport + i as u16;
                let sock = UdpSocket::bind(SocketAddr::new(src, port))
                    .map_err(io_err(format!("binding a UDP socket to {src} port {port}")))?;
                sock::bind_to_device(&sock, &args.iface)
                    .map_err(io_err(format!("binding a UDP socket to {}", args.iface)))?;
                if src.is_ipv4() {
                    sock::set_int_option(
                        &sock,
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        libc::IP_PMTUDISC_DO,
                    )
                    .map_err(io_err("setting IP_MTU_DISCOVER"))?;
                }
                sockets.push(sock);
            }
            let n = sockets.len();
            Sink::Udp {
                sockets,
                dst: args.dst,
                local: src,
                tos: vec![None; n],
            }
        }
    };

    // Plans and reports per flow.
    let mut reports = Vec::new();
    for i in 0..args.flows {
        let qp = args.qp + i;
        let (fam, osrc, odst, vni, inner) = match encap {
            Encap::Plain => (family(src), src, args.dst, None, false),
            Encap::Device(d) => (family(d.local), d.local, d.remote, Some(d.vni), true),
            Encap::Crafted {
                outer_src,
                outer_dst,
                vni,
            } => (family(outer_src), outer_src, outer_dst, Some(vni), true),
        };
        reports.push(FlowReport {
            encap: match encap {
                Encap::Plain => "plain",
                Encap::Device(_) => "vxlan-device",
                Encap::Crafted { .. } => "vxlan-crafted",
            },
            family: fam,
            src: osrc.to_string(),
            dst: odst.to_string(),
            sport: args.sport + i as u16,
            vni,
            inner_family: inner.then(|| family(src)),
            inner_src: inner.then(|| src.to_string()),
            inner_dst: inner.then(|| args.dst.to_string()),
            dest_qp: qp,
            packets: 0,
            bytes: 0,
            ecn: EcnCounts::default(),
            inner_ecn: inner.then(EcnCounts::default),
            ce: 0,
            cnps: 0,
            acks: 0,
            naks: 0,
            rnr_naks: 0,
            psn_gaps: 0,
            last_dscp: 0,
            last_inner_dscp: None,
            opcodes: BTreeMap::new(),
        });
    }
    // PSN gaps are counted from the plan: a request whose PSN is ahead of the last one's next.
    let total: u64 = plans.iter().map(|p| p.len() as u64).sum();
    let rate = match args.duration {
        Some(d) if d > 0.0 => total as f64 / d,
        Some(_) => return Err(usage("--duration must be positive")),
        None => args.rate,
    };
    let start = Instant::now();
    let mut sent = 0u64;
    let mut interrupted = false;
    let longest = plans.iter().map(Vec::len).max().unwrap_or(0);
    let mut expected_next: Vec<Option<u32>> = vec![None; plans.len()];
    'rounds: for round in 0..longest {
        for (fi, plan) in plans.iter().enumerate() {
            let Some(p) = plan.get(round) else { continue };
            if stop.load(Ordering::Relaxed) {
                interrupted = true;
                break 'rounds;
            }
            if rate > 0.0 {
                let due = start + Duration::from_secs_f64(sent as f64 / rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            let sport = args.sport + fi as u16;
            let wire_len = send_one(&mut sink, &encap, args, src, sport, fi, p)?;
            sent += 1;
            let r = &mut reports[fi];
            r.packets += 1;
            r.bytes += wire_len;
            let inner_ecn = p.tos & 3;
            let (outer_ecn, outer_dscp) = match encap {
                Encap::Plain => (inner_ecn, p.tos >> 2),
                Encap::Device(d) => (
                    encap_ecn(inner_ecn),
                    if d.tos_inherit {
                        p.tos >> 2
                    } else {
                        d.tos >> 2
                    },
                ),
                Encap::Crafted { .. } => (
                    if p.outer_ce {
                        ECN_CE
                    } else {
                        encap_ecn(inner_ecn)
                    },
                    args.outer_dscp.unwrap_or(p.tos >> 2),
                ),
            };
            r.ecn.add(outer_ecn);
            if let Some(ie) = r.inner_ecn.as_mut() {
                ie.add(inner_ecn);
            }
            if inner_ecn == ECN_CE {
                r.ce += 1;
            }
            r.last_dscp = outer_dscp;
            if r.inner_ecn.is_some() {
                r.last_inner_dscp = Some(p.tos >> 2);
            }
            let op = p.msg.opcode;
            *r.opcodes
                .entry(bth::opcode_name(op).to_string())
                .or_default() += 1;
            if bth::is_cnp(op) {
                r.cnps += 1;
            } else if bth::is_acknowledge(op) {
                match bth::syndrome_class(p.msg.syndrome) {
                    bth::SyndromeClass::Ack => r.acks += 1,
                    bth::SyndromeClass::RnrNak => r.rnr_naks += 1,
                    bth::SyndromeClass::Nak => r.naks += 1,
                    bth::SyndromeClass::Reserved => {}
                }
            } else if bth::is_tracked_request(op) {
                let psn = p.msg.psn;
                if let Some(exp) = expected_next[fi] {
                    let ahead = psn.wrapping_sub(exp) & 0x00FF_FFFF;
                    if ahead != 0 && ahead < 0x0080_0000 {
                        r.psn_gaps += 1;
                    }
                }
                let psns = if op & 0x1F == bth::op::READ_REQUEST {
                    p.msg.reth.dma_len.div_ceil(args.pmtu).max(1)
                } else {
                    1
                };
                expected_next[fi] = Some((psn + psns) & 0x00FF_FFFF);
            }
        }
    }
    Ok(Report {
        iface: args.iface.clone(),
        via: args.via,
        packets: sent,
        elapsed_s: start.elapsed().as_secs_f64(),
        cpu,
        interrupted,
        flows: reports,
    })
}

/// Sends one packet; returns its length on the (underlay) wire.
fn send_one(
    sink: &mut Sink,
    encap: &Encap,
    args: &GenArgs,
    src: IpAddr,
    sport: u16,
    flow: usize,
    p: &Planned,
) -> Result<u64, GenError> {
    let underlay_extra = match encap {
        Encap::Device(d) => 14 + ip_hlen(d.local) + 8 + 8,
        _ => 0,
    };
    match sink {
        Sink::Raw { tx, eth } => {
            let frame = match encap {
                Encap::Plain | Encap::Device(_) => {
                    frame::roce_frame_to(eth, &l3(src, args.dst, p.tos)?, sport, args.dport, &p.msg)
                }
                Encap::Crafted {
                    outer_src,
                    outer_dst,
                    vni,
                } => {
                    let inner_eth = Eth::default();
                    let inner = frame::roce_frame_to(
                        &inner_eth,
                        &l3(src, args.dst, p.tos)?,
                        sport,
                        args.dport,
                        &p.msg,
                    );
                    let ecn = if p.outer_ce {
                        ECN_CE
                    } else {
                        encap_ecn(p.tos & 3)
                    };
                    let outer_tos = (args.outer_dscp.unwrap_or(p.tos >> 2) << 2) | ecn;
                    // Outer source port: entropy from the inner flow, as Linux does.
                    let osport = 0xC000 | (sport ^ (p.msg.dest_qp as u16)) & 0x3FFF;
                    let outer = l3(*outer_src, *outer_dst, outer_tos)?;
                    let mut f = frame::vxlan_frame(eth, &outer, osport, *vni, &inner);
                    // vxlan_frame always uses 4789; that is what --vni promises.
                    debug_assert_eq!(DEFAULT_VXLAN_PORT, 4789);
                    f.shrink_to_fit();
                    f
                }
            };
            match tx.send_to(&frame, None) {
                Some(Ok(())) => Ok(frame.len() as u64 + underlay_extra),
                Some(Err(e)) => Err(io_err(format!("sending on {}", args.iface))(e)),
                None => Err(usage("the datalink channel could not send")),
            }
        }
        Sink::Udp {
            sockets,
            dst,
            local,
            tos,
        } => {
            let sock = &sockets[flow];
            if tos[flow] != Some(p.tos) {
                set_tos(sock, dst.is_ipv6(), p.tos)?;
                tos[flow] = Some(p.tos);
            }
            let payload = udp_payload(*local, *dst, sport, args.dport, &p.msg)?;
            let n = sock
                .send_to(&payload, SocketAddr::new(*dst, args.dport))
                .map_err(io_err(format!("sending to {dst} port {}", args.dport)))?;
            if n != payload.len() {
                return Err(usage(format!("short send: {n} of {} bytes", payload.len())));
            }
            Ok(14 + ip_hlen(*dst) + 8 + payload.len() as u64 + underlay_extra)
        }
    }
}

/// The report as a human-readable table.
pub fn render_table(r: &Report) -> String {
    let mut s = format!(
        "sent {} packets on {} (via {:?}) in {:.3} s{}\n",
        r.packets,
        r.iface,
        r.via,
        r.elapsed_s,
        if r.interrupted { " (interrupted)" } else { "" }
    );
    s.push_str(&format!(
        "{:<14} {:<16} {:<16} {:>6} {:>8} {:>10} {:>8} {:>6} {:>6} {:>6} {:>6} {:>5}\n",
        "encap",
        "src",
        "dst",
        "vni",
        "qp",
        "packets",
        "bytes",
        "ce",
        "cnps",
        "acks",
        "naks",
        "gaps"
    ));
    for f in &r.flows {
        let (src, dst) = match (&f.inner_src, &f.inner_dst) {
            (Some(s), Some(d)) => (s.to_string(), d.to_string()),
            _ => (f.src.clone(), f.dst.clone()),
        };
        s.push_str(&format!(
            "{:<14} {:<16} {:<16} {:>6} {:>#8x} {:>10} {:>8} {:>6} {:>6} {:>6} {:>6} {:>5}\n",
            f.encap,
            src,
            dst,
            f.vni.map_or("-".to_string(), |v| v.to_string()),
            f.dest_qp,
            f.packets,
            f.bytes,
            f.ce,
            f.cnps,
            f.acks,
            f.naks + f.rnr_naks,
            f.psn_gaps
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::opcode;
    use clap::Parser;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: GenArgs,
    }

    fn args(extra: &[&str]) -> GenArgs {
        let mut v = vec!["roce-gen", "--iface", "lo", "--dst", "198.18.0.2"];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).expect("valid args").a
    }

    #[test]
    fn spread_marks_exactly_m_of_n() {
        for n in 0..40u64 {
            for m in 0..=n {
                assert_eq!((0..n).filter(|k| spread(*k, m, n)).count() as u64, m);
            }
        }
    }

    #[test]
    fn payload_pattern_fills_sends_and_writes() {
        let a = args(&[
            "--count",
            "3",
            "--ops",
            "send,write,ack",
            "--payload",
            "20",
            "--payload-pattern",
            "ROCE",
        ]);
        let p = plan_flow(&a, 7).expect("plan");
        let payloads: Vec<Vec<u8>> = p
            .iter()
            .map(|x| {
                let b = x.msg.encode();
                let headers = 12
                    + frame::ext_headers(x.msg.opcode)
                        .iter()
                        .map(|e| e.len())
                        .sum::<usize>();
                b[headers..headers + x.msg.payload_len].to_vec()
            })
            .collect();
        assert_eq!(payloads[0], b"ROCEROCEROCEROCEROCE");
        assert_eq!(payloads[1], b"ROCEROCEROCEROCEROCE");
        assert!(payloads[2].is_empty(), "an ACK has no payload");
        // Without it: the counting pattern.
        let p = plan_flow(&args(&["--count", "1", "--payload", "4"]), 7).expect("plan");
        assert_eq!(&p[0].msg.encode()[12..16], &[0, 1, 2, 3]);
    }

    #[test]
    fn plan_has_count_data_packets_ce_marks_and_cnps() {
        let a = args(&[
            "--count",
            "10",
            "--ce",
            "3",
            "--cnp",
            "4",
            "--ops",
            "send,write,read,ack,nak,rnr-nak",
        ]);
        let p = plan_flow(&a, 7).expect("plan");
        assert_eq!(p.len(), 14);
        assert_eq!(p.iter().filter(|x| bth::is_cnp(x.msg.opcode)).count(), 4);
        assert_eq!(p.iter().filter(|x| x.tos & 3 == 3).count(), 3);
        assert!(p.iter().all(|x| x.msg.dest_qp == 7));
        // CNPs are interleaved, not bunched at one end.
        assert!(!bth::is_cnp(p[0].msg.opcode) || !bth::is_cnp(p[1].msg.opcode));
    }

    #[test]
    fn psn_gaps_are_planned_on_requests_only() {
        let a = args(&[
            "--count",
            "12",
            "--psn-gaps",
            "2",
            "--ops",
            "send,read,ack",
            "--read-len",
            "10000",
            "--pmtu",
            "4096",
        ]);
        let p = plan_flow(&a, 1).expect("plan");
        let mut exp: Option<u32> = None;
        let mut gaps = 0;
        for x in p.iter().filter(|x| bth::is_tracked_request(x.msg.opcode)) {
            if let Some(e) = exp {
                if x.msg.psn != e {
                    gaps += 1;
                }
            }
            let n = if x.msg.opcode == opcode::RC_READ_REQUEST {
                3
            } else {
                1
            };
            exp = Some(x.msg.psn + n);
        }
        assert_eq!(gaps, 2);
        let too_many = args(&["--count", "2", "--psn-gaps", "2"]);
        assert!(plan_flow(&too_many, 1).is_err());
    }

    /// The reference classifier (the agent's counting rules) finds exactly the gaps
    /// the generator plans, whatever the mix, READs (which teach the path MTU) included.
    #[test]
    fn reference_classifier_counts_exactly_the_planned_gaps() {
        use roce_common::config::RuntimeConfig;
        use roce_common::reference::ReferenceTable;
        let mixes = [
            "send",
            "read",
            "send,write,read,ack,nak",
            "read,read,send",
            "write,read",
            "send,read,ack,rnr-nak",
        ];
        for ops in mixes {
            for read_len in ["4096", "10000", "300"] {
                let a = args(&[
                    "--count",
                    "40",
                    "--psn-gaps",
                    "3",
                    "--ops",
                    ops,
                    "--read-len",
                    read_len,
                    "--cnp",
                    "4",
                    "--psn",
                    "0xfffff0",
                ]);
                let plan = match plan_flow(&a, 9) {
                    Ok(p) => p,
                    Err(e) if ops == "read" => {
                        assert!(e.to_string().contains("--psn-gaps"), "{e}");
                        continue;
                    }
                    Err(e) => panic!("{ops}: {e}"),
                };
                let mut t = ReferenceTable::new(RuntimeConfig::default());
                let l3 = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
                for p in &plan {
                    let f =
                        frame::roce_frame(&Eth::default(), &l3.clone().with_tos(p.tos), 1, &p.msg);
                    t.process(&f, 1, 0);
                }
                let gaps: u64 = t.flows.values().map(|s| s.psn_gaps).sum();
                assert_eq!(gaps, 3, "ops {ops}, read-len {read_len}");
            }
        }
    }

    #[test]
    fn qp_parses_hex_and_rejects_25_bits() {
        assert_eq!(parse_u24("0x1234"), Ok(0x1234));
        assert_eq!(parse_u24("4660"), Ok(4660));
        assert!(parse_u24("0x1000000").is_err());
        assert!(parse_u24("qp").is_err());
    }

    #[test]
    fn missing_interface_is_a_clear_error() {
        let mut a = args(&[]);
        a.iface = "no-such-if0".into();
        let e = run(&a, &AtomicBool::new(false)).expect_err("no interface");
        assert!(e.to_string().contains("no-such-if0 does not exist"), "{e}");
    }

    #[test]
    fn udp_payload_carries_a_valid_icrc_for_the_kernels_header() {
        let src = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let dst = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        let msg = RoceMsg::send_only(5, 9, 33);
        let pl = udp_payload(src, dst, 49152, 4791, &msg).expect("payload");
        // The frame the kernel will write: ID 0, DF, any TTL/TOS (both masked).
        let mut h = Ipv4Hdr::new(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        h.ttl = 1;
        h.tos = 0x6b;
        let f = frame::udp_frame(&Eth::default(), &L3::V4(h), 49152, 4791, &pl);
        assert!(frame::icrc_ok(&f, 14, 34));
        let v6 = udp_payload(
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            1,
            4791,
            &msg,
        )
        .expect("v6");
        assert_eq!(v6.len(), pl.len());
    }
}
