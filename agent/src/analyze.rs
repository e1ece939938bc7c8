//! `roce-agent analyze`: the flow table of a pcap or pcapng capture, with the same
//! classifier and the same counting rules as the live agent.
//!
//! The capture is streamed frame by frame (never loaded whole). Each frame goes
//! through one of two engines that both end in `(FlowKey, FlowStats)` pairs and the
//! STATS vector:
//! - `kernel`: the real `xdp_classify` program, run on the frame through
//!   BPF_PROG_TEST_RUN, its FLOWS and STATS maps read at the end;
//! - `reference`: [`ReferenceTable`], the same `classify` and `FlowStats::record`
//!   in user space.
//!
//! Beside the engine, a user-space [`Tally`] sees every frame (classified by the
//! reference classifier) for what the kernel cannot know offline: capture
//! timestamps (first/last seen), the ICRC of every RoCE packet, bytes cut off by the
//! capture's snap length, and the DSCP observations that [`crate::findings`] reports.
//! Both engines therefore print byte-identical JSON for the same capture.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, PcapError, TsResolution};
use roce_common::bth::{self, ICRC_LEN};
use roce_common::classify::{classify, Outcome, Parsed};
use roce_common::config::RuntimeConfig;
use roce_common::counters::{reason_index, Class, Reason, STATS_LEN};
use roce_common::flow::{FlowKey, FlowStats, KEY_EGRESS};
use roce_common::packet::SlicePacket;
use roce_common::reference::ReferenceTable;
use roce_common::wire::*;
use serde::{Deserialize, Serialize};

use crate::doc::{Counters, Document, Flow};
use crate::findings::{self, Finding, Policy};
use crate::loader::{self, LoadError, LoadOptions, Loaded};
use crate::testrun::{test_run, TestRun};

/// Frames shorter than this cannot go through BPF_PROG_TEST_RUN (EINVAL); both
/// engines count them as `truncated_eth` without classifying them.
pub const MIN_TEST_RUN_LEN: usize = ETH_HLEN;

/// Which classifier engine counts the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// The real XDP program, run on each frame through BPF_PROG_TEST_RUN.
    Kernel,
    /// The reference classifier of `roce_common` (no privileges needed).
    Reference,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Kernel => "kernel",
            Engine::Reference => "reference",
        })
    }
}

/// Why an analysis failed or stopped early.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("{}: cannot open the capture: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("{}: not a pcap or pcapng file ({detail})", path.display())]
    NotACapture { path: PathBuf, detail: String },
    #[error(
        "{}: link type {linktype} is not Ethernet: analyze reads Ethernet captures \
         (capture on the interface itself, e.g. `tcpdump -i eth1 -w FILE`, not `-i any`)",
        path.display()
    )]
    LinkType { path: PathBuf, linktype: String },
    #[error("{}: frame {frame}: the capture is truncated or corrupt: {detail}", path.display())]
    Corrupt {
        path: PathBuf,
        /// The frame that could not be read (1-based, as tshark numbers them).
        frame: u64,
        detail: String,
    },
    #[error("the kernel engine cannot run (use --engine reference): {0}")]
    Load(#[from] LoadError),
    #[error("frame {frame}: BPF_PROG_TEST_RUN failed: {source}")]
    TestRun { frame: u64, source: io::Error },
}

// ---------------------------------------------------------------------------------
// Reading captures

/// The container format of a capture file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Pcap,
    Pcapng,
}

/// A `Read` that counts the bytes read through it (for the progress bar).
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

type Input = Counting<BufReader<File>>;

enum Inner {
    Pcap {
        reader: PcapReader<Input>,
        nanos: bool,
    },
    PcapNg {
        reader: PcapNgReader<Input>,
    },
}

/// One frame of a capture.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// 1-based, as tshark numbers frames.
    pub number: u64,
    /// Capture timestamp, ns since the epoch.
    pub ts_ns: u64,
    /// The captured bytes, from the Ethernet header on.
    pub data: &'a [u8],
    /// The frame's length on the wire (at least `data.len()`).
    pub wire_len: u64,
}

/// Streams the frames of a pcap or pcapng file.
pub struct CaptureReader {
    path: PathBuf,
    inner: Inner,
    buf: Vec<u8>,
    frames: u64,
    read: Rc<Cell<u64>>,
    size: u64,
    format: Format,
}

fn linktype_name(l: DataLink) -> String {
    format!("{l:?} ({})", u32::from(l))
}

/// Units per second of a pcapng `if_tsresol` value.
fn tsresol_units(v: u8) -> u64 {
    let exp = (v & 0x7F) as u32;
    if v & 0x80 != 0 {
        1u64.checked_shl(exp).unwrap_or(u64::MAX)
    } else {
        10u64.checked_pow(exp).unwrap_or(u64::MAX)
    }
}

impl CaptureReader {
    /// Opens a capture and reads its file header. Refuses anything but Ethernet.
    pub fn open(path: &Path) -> Result<CaptureReader, AnalyzeError> {
        let open = |p: &Path| {
            File::open(p).map_err(|source| AnalyzeError::Open {
                path: p.to_path_buf(),
                source,
            })
        };
        let file = open(path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut magic = [0u8; 4];
        {
            let mut f = &file;
            f.read_exact(&mut magic)
                .map_err(|e| AnalyzeError::NotACapture {
                    path: path.to_path_buf(),
                    detail: format!("cannot read its first 4 bytes: {e}"),
                })?;
        }
        let file = open(path)?;
        let read = Rc::new(Cell::new(0));
        let input = Counting {
            inner: BufReader::with_capacity(1 << 20, file),
            read: read.clone(),
        };
        let not_capture = |e: PcapError| AnalyzeError::NotACapture {
            path: path.to_path_buf(),
            detail: e.to_string(),
        };
        let (inner, format) = if magic == [0x0A, 0x0D, 0x0D, 0x0A] {
            let reader = PcapNgReader::new(input).map_err(not_capture)?;
            (Inner::PcapNg { reader }, Format::Pcapng)
        } else {
            let reader = PcapReader::new(input).map_err(not_capture)?;
            let h = reader.header();
            if h.datalink != DataLink::ETHERNET {
                return Err(AnalyzeError::LinkType {
                    path: path.to_path_buf(),
                    linktype: linktype_name(h.datalink),
                });
            }
            let nanos = h.ts_resolution == TsResolution::NanoSecond;
            (Inner::Pcap { reader, nanos }, Format::Pcap)
        };
        Ok(CaptureReader {
            path: path.to_path_buf(),
            inner,
            buf: Vec::with_capacity(16384),
            frames: 0,
            read,
            size,
            format,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// File bytes read so far and the file's size.
    pub fn position(&self) -> (u64, u64) {
        (self.read.get(), self.size)
    }

    /// Frames returned so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    fn corrupt(&self, e: PcapError) -> AnalyzeError {
        let detail = match e {
            PcapError::IoError(io) if io.kind() == io::ErrorKind::UnexpectedEof => {
                "the file ends in the middle of a record".to_string()
            }
            PcapError::IoError(io) => format!("read error: {io}"),
            other => other.to_string(),
        };
        AnalyzeError::Corrupt {
            path: self.path.clone(),
            frame: self.frames + 1,
            detail,
        }
    }

    /// The next frame, `None` at the end of the file.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, AnalyzeError> {
        let (ts_ns, wire_len) = match &mut self.inner {
            Inner::Pcap { reader, nanos } => {
                let nanos = *nanos;
                let raw = match reader.next_raw_packet() {
                    None => return Ok(None),
                    Some(Ok(raw)) => raw,
                    Some(Err(e)) => return Err(self.corrupt(e)),
                };
                let frac = if nanos {
                    raw.ts_frac as u64
                } else {
                    raw.ts_frac as u64 * 1000
                };
                self.buf.clear();
                self.buf.extend_from_slice(&raw.data);
                (
                    raw.ts_sec as u64 * 1_000_000_000 + frac,
                    (raw.orig_len as u64).max(raw.data.len() as u64),
                )
            }
            Inner::PcapNg { reader } => loop {
                let block = match reader.next_block() {
                    None => return Ok(None),
                    Some(Ok(b)) => b,
                    Some(Err(e)) => {
                        let e = AnalyzeError::Corrupt {
                            path: self.path.clone(),
                            frame: self.frames + 1,
                            detail: match e {
                                PcapError::IoError(io)
                                    if io.kind() == io::ErrorKind::UnexpectedEof =>
                                {
                                    "the file ends in the middle of a block".to_string()
                                }
                                other => other.to_string(),
                            },
                        };
                        return Err(e);
                    }
                };
                let (iface, raw_ts, orig) = match &block {
                    Block::EnhancedPacket(p) => (
                        p.interface_id,
                        p.timestamp.as_nanos() as u64,
                        p.original_len,
                    ),
                    Block::SimplePacket(p) => (0, 0, p.original_len),
                    Block::Packet(p) => (p.interface_id as u32, p.timestamp, p.original_len),
                    _ => continue,
                };
                let data: &[u8] = match &block {
                    Block::EnhancedPacket(p) => &p.data,
                    Block::SimplePacket(p) => &p.data,
                    Block::Packet(p) => &p.data,
                    _ => &[],
                };
                self.buf.clear();
                self.buf.extend_from_slice(data);
                drop(block);
                let Some(idb) = reader.interfaces().get(iface as usize) else {
                    return Err(AnalyzeError::Corrupt {
                        path: self.path.clone(),
                        frame: self.frames + 1,
                        detail: format!(
                            "packet of interface {iface}, which the file never described"
                        ),
                    });
                };
                if idb.linktype != DataLink::ETHERNET {
                    return Err(AnalyzeError::LinkType {
                        path: self.path.clone(),
                        linktype: linktype_name(idb.linktype),
                    });
                }
                let units = idb
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(v) => Some(tsresol_units(*v)),
                        _ => None,
                    })
                    .unwrap_or(1_000_000);
                let ts = if units == 1_000_000_000 {
                    raw_ts
                } else {
                    ((raw_ts as u128 * 1_000_000_000) / units.max(1) as u128) as u64
                };
                break (ts, (orig as u64).max(self.buf.len() as u64));
            },
        };
        self.frames += 1;
        Ok(Some(Frame {
            number: self.frames,
            ts_ns,
            data: &self.buf,
            wire_len,
        }))
    }
}

// ---------------------------------------------------------------------------------
// Engines

/// What an engine counted: flows (keys normalised: no interface, no direction) and
/// the STATS vector.
pub struct Counted {
    pub flows: Vec<(FlowKey, FlowStats)>,
    pub stats: Vec<u64>,
}

enum Counter {
    Reference(Box<ReferenceTable>),
    Kernel {
        loaded: Box<Loaded>,
        /// Frames too short for BPF_PROG_TEST_RUN.
        short: u64,
        /// The CPU affinity to restore at the end.
        affinity: Option<libc::cpu_set_t>,
    },
}

/// Pins the calling thread to the CPU it runs on: FLOWS is a per-CPU map, and one
/// flow's PSN state must not be split between CPUs. Returns the previous mask.
fn pin_to_current_cpu() -> Option<libc::cpu_set_t> {
    // SAFETY: plain libc calls on a zeroed cpu_set_t of the right size.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) != 0 {
            return None;
        }
        Some(old)
    }
}

fn restore_affinity(old: &libc::cpu_set_t) {
    // SAFETY: restores a mask that sched_getaffinity returned.
    unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), old);
    }
}

impl Counter {
    fn new(engine: Engine, opts: &LoadOptions) -> Result<Counter, AnalyzeError> {
        Ok(match engine {
            Engine::Reference => Counter::Reference(Box::new(ReferenceTable::new(opts.config))),
            Engine::Kernel => {
                let loaded = loader::load(opts)?;
                Counter::Kernel {
                    loaded: Box::new(loaded),
                    short: 0,
                    affinity: pin_to_current_cpu(),
                }
            }
        })
    }

    /// Counts one frame; returns the reference classifier's outcome for the tally
    /// (computed once: the reference engine returns its own).
    fn frame(&mut self, f: &Frame<'_>, cfg: &RuntimeConfig) -> Result<Outcome, AnalyzeError> {
        match self {
            Counter::Reference(t) => Ok(t.process(f.data, 0, false, f.ts_ns)),
            Counter::Kernel { loaded, short, .. } => {
                if f.data.len() < MIN_TEST_RUN_LEN {
                    *short += 1;
                    return Ok(Outcome::Malformed(Reason::TruncatedEth));
                }
                let fd = loaded.xdp_fd()?;
                test_run(
                    fd,
                    &TestRun {
                        data: f.data,
                        repeat: 1,
                        ..Default::default()
                    },
                )
                .map_err(|source| AnalyzeError::TestRun {
                    frame: f.number,
                    source,
                })?;
                Ok(classify(&SlicePacket(f.data), cfg))
            }
        }
    }

    fn finish(self) -> Result<Counted, AnalyzeError> {
        match self {
            Counter::Reference(t) => Ok(Counted {
                flows: t.flows.into_iter().collect(),
                stats: t.stats.to_vec(),
            }),
            Counter::Kernel {
                loaded,
                short,
                affinity,
            } => {
                if let Some(old) = &affinity {
                    restore_affinity(old);
                }
                let mut stats = loaded.stats()?;
                stats.resize(STATS_LEN as usize, 0);
                stats[reason_index(Reason::TruncatedEth) as usize] += short;
                // Test runs arrive on the loopback device: drop interface and direction.
                let mut merged: HashMap<FlowKey, FlowStats> = HashMap::new();
                for (mut k, st) in loaded.flows()? {
                    k.ifindex = 0;
                    k.flags &= !KEY_EGRESS;
                    merged.entry(k).or_default().merge(&st);
                }
                Ok(Counted {
                    flows: merged.into_iter().collect(),
                    stats,
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// The user-space tally

/// Per-flow observations that the engines do not keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowExtra {
    pub first_ns: u64,
    pub last_ns: u64,
    pub packets: u64,
    /// Bytes of the frames as captured.
    pub captured_bytes: u64,
    /// Wire bytes beyond what the capture holds (snap length).
    pub snapped_bytes: u64,
    pub icrc_errors: u64,
    /// Packets whose ICRC could not be checked (cut off by the snap length).
    pub icrc_unchecked: u64,
    /// Non-CNP packets outside the lossless DSCP set, and which DSCPs (bit mask).
    pub off_lossless: u64,
    pub off_lossless_dscps: u64,
    /// CNPs on a DSCP other than the CNP DSCP, and which DSCPs (bit mask).
    pub cnp_off_dscp: u64,
    pub cnp_dscps: u64,
    /// Packets whose outer ECN was Not-ECT (ECN off: switches cannot mark them).
    pub not_ect: u64,
}

/// Non-RoCE traffic seen on a lossless DSCP.
#[derive(Clone, Debug, Default)]
pub struct NonRoceLossless {
    pub frames: u64,
    /// By IP protocol number.
    pub by_proto: HashMap<u8, u64>,
    /// By (source, destination, protocol); bounded to [`MAX_TALKERS`] entries.
    pub talkers: HashMap<(IpAddr, IpAddr, u8), u64>,
}

/// Distinct talkers remembered for the non-RoCE-on-lossless finding.
pub const MAX_TALKERS: usize = 100_000;

/// What the user side learns from every frame.
#[derive(Debug, Default)]
pub struct Tally {
    pub flows: HashMap<FlowKey, FlowExtra>,
    pub non_roce_lossless: NonRoceLossless,
    pub icrc_checked: u64,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
}

/// The IP header and UDP datagram of a RoCE frame (the inner ones in VXLAN):
/// `(ip_start, udp_start)`, for the ICRC.
pub fn roce_offsets(frame: &[u8], tunnelled: bool) -> Option<(usize, usize)> {
    let be16 = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]))
    };
    let mut ethertype = be16(12)?;
    let mut off = ETH_HLEN;
    while ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        ethertype = be16(off + 2)?;
        off += VLAN_HLEN;
    }
    let (l3, l4) = ip_offsets(frame, off, ethertype)?;
    if !tunnelled {
        return Some((l3, l4));
    }
    let inner_eth = l4 + UDP_HLEN + VXLAN_HLEN;
    ip_offsets(frame, inner_eth + ETH_HLEN, be16(inner_eth + 12)?)
}

fn ip_offsets(frame: &[u8], off: usize, ethertype: u16) -> Option<(usize, usize)> {
    if ethertype == ETH_P_IPV4 {
        let ihl = (*frame.get(off)? & 0x0F) as usize * 4;
        return Some((off, off + ihl));
    }
    if ethertype != ETH_P_IPV6 {
        return None;
    }
    let mut next = *frame.get(off + 6)?;
    let mut l4 = off + IPV6_HLEN;
    loop {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let len = *frame.get(l4 + 1)? as usize;
                next = *frame.get(l4)?;
                l4 += (len + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                next = *frame.get(l4)?;
                l4 += 8;
            }
            _ => return Some((off, l4)),
        }
    }
}

/// The ICRC verdict of one RoCE frame: `Some(true)` valid, `Some(false)` bad,
/// `None` when the frame does not hold the whole datagram.
pub fn check_icrc(frame: &[u8], p: &Parsed) -> Option<bool> {
    let (l3, l4) = roce_offsets(frame, p.tunnelled)?;
    let end = l4.checked_add(p.udp_len as usize)?;
    if end > frame.len() || (p.udp_len as usize) < UDP_HLEN + bth::BTH_LEN + ICRC_LEN || l3 > l4 {
        return None;
    }
    let icrc_at = end - ICRC_LEN;
    let want = roce_common::icrc::icrc(&frame[l3..l4], &frame[l4..icrc_at])?;
    Some(frame[icrc_at..end] == want.to_le_bytes())
}

/// Outer IP protocol, addresses and TOS of a non-RoCE IP frame.
fn outer_ip(frame: &[u8]) -> Option<(u8, IpAddr, IpAddr, u8)> {
    let be16 = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]))
    };
    let mut ethertype = be16(12)?;
    let mut off = ETH_HLEN;
    while ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        ethertype = be16(off + 2)?;
        off += VLAN_HLEN;
    }
    let (l3, l4) = ip_offsets(frame, off, ethertype)?;
    let hdr = frame.get(l3..l4.max(l3 + 20))?;
    if ethertype == ETH_P_IPV4 {
        let src: [u8; 4] = hdr.get(12..16)?.try_into().ok()?;
        let dst: [u8; 4] = hdr.get(16..20)?.try_into().ok()?;
        Some((hdr[9], IpAddr::from(src), IpAddr::from(dst), hdr[1]))
    } else {
        let src: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
        let dst: [u8; 16] = frame.get(l3 + 24..l3 + 40)?.try_into().ok()?;
        let w0 = u32::from_be_bytes(frame.get(l3..l3 + 4)?.try_into().ok()?);
        // The protocol after the extension headers.
        let proto = last_ipv6_proto(frame, l3).unwrap_or(hdr[6]);
        Some((
            proto,
            IpAddr::from(src),
            IpAddr::from(dst),
            (w0 >> 20) as u8,
        ))
    }
}

fn last_ipv6_proto(frame: &[u8], l3: usize) -> Option<u8> {
    let mut next = *frame.get(l3 + 6)?;
    let mut at = l3 + IPV6_HLEN;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let len = *frame.get(at + 1)? as usize;
                next = *frame.get(at)?;
                at += (len + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                next = *frame.get(at)?;
                at += 8;
            }
            _ => break,
        }
    }
    Some(next)
}

impl Tally {
    /// Takes one frame and the reference classifier's outcome for it into account.
    pub fn observe(&mut self, f: &Frame<'_>, outcome: &Outcome, policy: &Policy) {
        if self.first_ns.is_none() {
            self.first_ns = Some(f.ts_ns);
        }
        self.last_ns = Some(f.ts_ns);
        match outcome {
            Outcome::Flow(p) => {
                let e = self.flows.entry(p.key).or_default();
                if e.packets == 0 {
                    e.first_ns = f.ts_ns;
                }
                e.packets += 1;
                e.last_ns = f.ts_ns;
                e.captured_bytes += f.data.len() as u64;
                e.snapped_bytes += f.wire_len.saturating_sub(f.data.len() as u64);
                match check_icrc(f.data, p) {
                    Some(true) => self.icrc_checked += 1,
                    Some(false) => {
                        self.icrc_checked += 1;
                        e.icrc_errors += 1;
                    }
                    None => e.icrc_unchecked += 1,
                }
                let dscp = p.outer_tos >> 2;
                if p.outer_tos & 3 == ECN_NOT_ECT {
                    e.not_ect += 1;
                }
                if bth::is_cnp(p.bth.opcode) {
                    if dscp != policy.cnp_dscp {
                        e.cnp_off_dscp += 1;
                        e.cnp_dscps |= 1 << dscp;
                    }
                } else if !policy.is_lossless(dscp) {
                    e.off_lossless += 1;
                    e.off_lossless_dscps |= 1 << dscp;
                }
            }
            Outcome::Other(class) => {
                if matches!(class, Class::NonIp) || policy.lossless == 0 {
                    return;
                }
                let Some((proto, src, dst, tos)) = outer_ip(f.data) else {
                    return;
                };
                if !policy.is_lossless(tos >> 2) {
                    return;
                }
                let n = &mut self.non_roce_lossless;
                n.frames += 1;
                *n.by_proto.entry(proto).or_default() += 1;
                let key = (src, dst, proto);
                if let Some(c) = n.talkers.get_mut(&key) {
                    *c += 1;
                } else if n.talkers.len() < MAX_TALKERS {
                    n.talkers.insert(key, 1);
                }
            }
            Outcome::Malformed(_) => {}
        }
    }
}

// ---------------------------------------------------------------------------------
// The report

/// A flow of the analysis: the flow document's record plus what analyze adds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnalyzedFlow {
    #[serde(flatten)]
    pub flow: Flow,
    /// Packets whose ICRC (recomputed as WIRE.md says) did not match.
    pub icrc_errors: u64,
}

/// Facts about the capture file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureInfo {
    pub file: String,
    pub format: Format,
    /// Frames read (up to the error, when there was one).
    pub frames: u64,
    /// Capture time of the first and last frame, ns since the epoch.
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// RoCE frames whose ICRC was checked (the rest were cut off by the snap length).
    pub icrc_checked: u64,
    /// False when reading stopped at a truncated or corrupt record.
    pub complete: bool,
    /// Why reading stopped early.
    pub error: Option<String>,
}

/// What `analyze --json` prints: the flow document's fields plus `capture`,
/// per-flow `icrc_errors` and `findings`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub capture: CaptureInfo,
    pub flows: Vec<AnalyzedFlow>,
    pub counters: Counters,
    pub findings: Vec<Finding>,
}

impl Report {
    /// The plain flow document (for the shared table renderer).
    pub fn document(&self) -> Document {
        Document {
            flows: self.flows.iter().map(|f| f.flow.clone()).collect(),
            counters: self.counters.clone(),
        }
    }
}

/// How to analyze.
#[derive(Clone, Debug)]
pub struct AnalyzeOptions {
    /// `None`: the kernel engine when this process may load BPF programs, else the
    /// reference engine.
    pub engine: Option<Engine>,
    pub load: LoadOptions,
    pub policy: Policy,
    /// Show a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
}

/// An analysis: the report of everything read, and the error that stopped reading
/// early, if any (the report then covers the frames before it).
pub struct Analysis {
    pub report: Report,
    pub error: Option<AnalyzeError>,
    pub engine: Engine,
}

/// Analyzes a capture. Errors before the first frame (cannot open, not a capture,
/// wrong link type, kernel engine unavailable) are returned as `Err`; errors while
/// reading come back in [`Analysis::error`] with the report so far.
pub fn analyze(path: &Path, opts: &AnalyzeOptions) -> Result<Analysis, AnalyzeError> {
    let mut reader = CaptureReader::open(path)?;
    let cfg = opts.load.config;
    let (mut counter, engine) = match opts.engine {
        Some(e) => (Counter::new(e, &opts.load)?, e),
        None => match Counter::new(Engine::Kernel, &opts.load) {
            Ok(c) => (c, Engine::Kernel),
            Err(e) => {
                tracing::info!(error = %e, "cannot load BPF programs: using the reference classifier");
                (
                    Counter::new(Engine::Reference, &opts.load)?,
                    Engine::Reference,
                )
            }
        },
    };
    let mut tally = Tally::default();
    let progress = progress_bar(opts.progress, reader.position().1);
    let mut error = None;
    loop {
        let frame = match reader.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        let outcome = match counter.frame(&frame, &cfg) {
            Ok(o) => o,
            Err(e) => {
                error = Some(e);
                break;
            }
        };
        tally.observe(&frame, &outcome, &opts.policy);
        let n = frame.number;
        if let Some(pb) = &progress {
            if n % 4096 == 0 {
                pb.set_position(reader.position().0);
            }
        }
    }
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    let frames = reader.frames();
    let counted = counter.finish()?;
    let capture = CaptureInfo {
        file: path.display().to_string(),
        format: reader.format(),
        frames,
        first_ns: tally.first_ns,
        last_ns: tally.last_ns,
        icrc_checked: tally.icrc_checked,
        complete: error.is_none(),
        error: error.as_ref().map(|e| e.to_string()),
    };
    let report = build_report(capture, counted, &tally, opts);
    Ok(Analysis {
        report,
        error,
        engine,
    })
}

fn progress_bar(wanted: bool, size: u64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal as _;
    if !wanted || !io::stderr().is_terminal() || size < (64 << 20) {
        return None;
    }
    let pb = indicatif::ProgressBar::new(size);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} analyzing [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    Some(pb)
}

/// Joins the engine's counts and the tally into the report.
pub fn build_report(
    capture: CaptureInfo,
    counted: Counted,
    tally: &Tally,
    opts: &AnalyzeOptions,
) -> Report {
    let mut flows = counted.flows;
    for (k, st) in flows.iter_mut() {
        if let Some(e) = tally.flows.get(k) {
            st.first_seen_ns = e.first_ns;
            st.last_seen_ns = e.last_ns;
            // BPF_PROG_TEST_RUN hands XDP at most ~3.5 KB of linear data (the rest of
            // a jumbo frame goes into fragments, which `data_end - data` does not
            // count): bytes are the frames' wire lengths, counted here.
            if st.bytes != e.captured_bytes {
                tracing::debug!(
                    engine_bytes = st.bytes,
                    captured_bytes = e.captured_bytes,
                    "the engine saw fewer bytes than captured (jumbo frames)"
                );
            }
            st.bytes = e.captured_bytes + e.snapped_bytes;
        }
    }
    let doc = Document::build(flows, &counted.stats, None);
    let counters = doc.counters;
    let extras: HashMap<FlowIdent, &FlowExtra> = tally
        .flows
        .iter()
        .map(|(k, e)| (FlowIdent::of_key(k), e))
        .collect();
    let mut flow_extras = Vec::with_capacity(doc.flows.len());
    let analyzed: Vec<AnalyzedFlow> = doc
        .flows
        .into_iter()
        .map(|flow| {
            let e = extras
                .get(&FlowIdent::of_flow(&flow))
                .map_or_else(FlowExtra::default, |e| **e);
            flow_extras.push(e);
            AnalyzedFlow {
                flow,
                icrc_errors: e.icrc_errors,
            }
        })
        .collect();
    let findings = findings::findings(&analyzed, &flow_extras, &counters, tally, &capture, opts);
    Report {
        capture,
        flows: analyzed,
        counters,
        findings,
    }
}

/// A flow's identity as the document shows it (to join the tally to document rows).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowIdent {
    src: IpAddr,
    dst: IpAddr,
    vni: Option<u32>,
    inner_src: Option<IpAddr>,
    inner_dst: Option<IpAddr>,
    dest_qp: u32,
}

impl FlowIdent {
    pub fn of_key(k: &FlowKey) -> FlowIdent {
        let f = Flow::from_entry(k, &FlowStats::default(), None);
        FlowIdent::of_flow(&f)
    }
    pub fn of_flow(f: &Flow) -> FlowIdent {
        FlowIdent {
            src: f.src,
            dst: f.dst,
            vni: f.vni,
            inner_src: f.inner_src,
            inner_dst: f.inner_dst,
            dest_qp: f.dest_qp,
        }
    }
}

/// Renders the human view: capture line, the flow table, findings.
pub fn render(report: &Report, engine: Engine) -> String {
    use std::fmt::Write as _;
    let c = &report.capture;
    let mut out = String::new();
    let span = match (c.first_ns, c.last_ns) {
        (Some(a), Some(b)) => format!(", {:.3} s", b.saturating_sub(a) as f64 / 1e9),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{}: {} frames ({}{span}), engine {engine}",
        c.file,
        c.frames,
        match c.format {
            Format::Pcap => "pcap",
            Format::Pcapng => "pcapng",
        }
    );
    out.push_str(&crate::table::render(&report.document()));
    let icrc: u64 = report.flows.iter().map(|f| f.icrc_errors).sum();
    let _ = writeln!(
        out,
        "ICRC: {} RoCE frames checked, {icrc} bad",
        c.icrc_checked
    );
    out.push('\n');
    out.push_str(&findings::render(&report.findings));
    out
}
