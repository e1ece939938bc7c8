//! Reading pcap and pcapng captures in large reads (never loaded whole, never sought
//! in, so a pipe works as well as a file): the frames are handed out in [`Batch`]es,
//! borrowed from the bytes read, never copied one by one.
//!
//! Link types: Ethernet (1), and the Linux cooked captures of `tcpdump -i any`,
//! LINUX_SLL (113) and LINUX_SLL2 (276). The classifier walks from an Ethernet header,
//! so a cooked header is rewritten in place into a 14-byte Ethernet header (zero MAC
//! addresses, the cooked header's protocol as EtherType) in front of the same network
//! layer: a cooked frame's length is then what an Ethernet capture of the same packet
//! would hold (network layer + 14 bytes, + 4 for each VLAN tag the capture kept), and
//! the flows' `bytes` count it so. A pcapng interface of another link type is not
//! read: its frames are counted in [`CaptureReader::unsupported`] and skipped (they
//! keep their numbers, so the frames after them are numbered as tshark numbers them).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};
use serde::{Deserialize, Serialize};

use super::AnalyzeError;

/// The container format of a capture file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Pcap,
    Pcapng,
}

/// One frame of a capture.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// 1-based, as tshark numbers frames.
    pub number: u64,
    /// Capture timestamp, ns since the epoch.
    pub ts_ns: u64,
    /// The captured bytes, from the Ethernet header on (a cooked capture's header
    /// rewritten into an Ethernet header).
    pub data: &'a [u8],
    /// The frame's length on the wire (at least `data.len()`; for a cooked capture,
    /// counted from the Ethernet header that replaces the cooked one).
    pub wire_len: u64,
}

/// Bytes read in one go, and so about a batch: small enough that the frames are
/// still in the cache when they are parsed and walked (the kernel's copy of a large
/// read does not leave them there).
pub const READ_BYTES: usize = 256 << 10;

/// A record or block larger than this is corrupt (an Ethernet frame, even a 64 KB
/// GSO one, is far smaller): refused rather than buffered.
const MAX_RECORD: usize = 16 << 20;

/// Where one frame lies in its batch, and which worker counts it.
#[derive(Clone, Copy, Debug)]
struct FrameAt {
    start: u32,
    len: u32,
    wire_len: u32,
    owner: u16,
    /// The ICRC verdict of a RoCE frame, when computed already (see [`Batch::icrc`]).
    icrc: u8,
    ts_ns: u64,
    /// The hash of its flow key (RoCE frames), for the owner's table.
    hash: u64,
}

/// The ICRC verdict of a RoCE frame: see `tally::check_icrc`.
pub type Icrc = Option<bool>;

/// `FrameAt::icrc`: not computed yet, or the verdict.
const ICRC_LATER: u8 = 0;

fn icrc_byte(v: Icrc) -> u8 {
    match v {
        None => 1,
        Some(true) => 2,
        Some(false) => 3,
    }
}

/// Consecutive frames of a capture and the bytes they lie in; refilled by
/// [`CaptureReader::fill`], shared read-only between the workers.
pub struct Batch {
    /// Always initialised to its length; `filled` bytes of it were read.
    buf: Vec<u8>,
    filled: usize,
    frames: Vec<FrameAt>,
    /// The number of the first frame.
    first: u64,
    /// Frames skipped (a link type not read) before the frame at an index: (index,
    /// frames skipped in this batch before it), ascending; empty almost always.
    skips: Vec<(u32, u64)>,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            // Sized by the first fill.
            buf: Vec::new(),
            filled: 0,
            frames: Vec::new(),
            first: 1,
            skips: Vec::new(),
        }
    }
}

impl Batch {
    /// Frames in the batch.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Says which worker counts frame `i`, and for a RoCE frame the hash of its flow
    /// key and its ICRC verdict if computed (`None`: the worker computes it).
    pub fn assign(&mut self, i: usize, owner: u16, hash: u64, icrc: Option<Icrc>) {
        let at = &mut self.frames[i];
        at.owner = owner;
        at.hash = hash;
        at.icrc = icrc.map_or(ICRC_LATER, icrc_byte);
    }

    /// The worker that counts frame `i` (0 until [`Batch::assign`]).
    #[inline]
    pub fn owner(&self, i: usize) -> u16 {
        self.frames[i].owner
    }

    /// Frame `i`'s ICRC verdict, when [`Batch::assign`] was given it.
    #[inline]
    pub fn icrc(&self, i: usize) -> Option<Icrc> {
        match self.frames[i].icrc {
            ICRC_LATER => None,
            1 => Some(None),
            2 => Some(Some(true)),
            _ => Some(Some(false)),
        }
    }

    /// The hash of frame `i`'s flow key (as [`Batch::assign`] set it).
    #[inline]
    pub fn hash(&self, i: usize) -> u64 {
        self.frames[i].hash
    }

    /// Records that a frame was skipped before the next frame of the batch.
    fn skip(&mut self) {
        let next = self.frames.len() as u32;
        match self.skips.last_mut() {
            Some((at, n)) if *at == next => *n += 1,
            last => {
                let before = last.map_or(0, |s| s.1);
                self.skips.push((next, before + 1));
            }
        }
    }

    /// The `i`-th frame (`i < len()`).
    pub fn frame(&self, i: usize) -> Frame<'_> {
        let at = self.frames[i];
        let start = at.start as usize;
        let skipped = if self.skips.is_empty() {
            0
        } else {
            let k = self.skips.partition_point(|s| s.0 as usize <= i);
            k.checked_sub(1).map_or(0, |k| self.skips[k].1)
        };
        Frame {
            number: self.first + i as u64 + skipped,
            ts_ns: at.ts_ns,
            data: &self.buf[start..start + at.len as usize],
            wire_len: at.wire_len as u64,
        }
    }
}

/// A link type that analyze reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Ethernet,
    /// LINUX_SLL (113): packet type u16, ARPHRD u16, address length u16, address
    /// (8 bytes), protocol u16.
    Sll,
    /// LINUX_SLL2 (276): protocol u16, reserved u16, interface index u32, ARPHRD u16,
    /// packet type u8, address length u8, address (8 bytes).
    Sll2,
}

/// The link types read, for messages.
pub const LINK_TYPES_READ: &str = "Ethernet (1) and Linux cooked captures (113, 276)";

const ETH_HLEN: usize = 14;
/// ARPHRD_NETLINK: the cooked header's protocol is a netlink family, not an EtherType.
const ARPHRD_NETLINK: u16 = 824;

impl Link {
    fn of(l: DataLink) -> Option<Link> {
        match l {
            DataLink::ETHERNET => Some(Link::Ethernet),
            DataLink::LINUX_SLL => Some(Link::Sll),
            DataLink::LINUX_SLL2 => Some(Link::Sll2),
            _ => None,
        }
    }

    /// Makes the record at `buf[start..start + len]`, `orig` bytes long on the wire,
    /// an Ethernet frame: a cooked header is rewritten in place into an Ethernet
    /// header (zero addresses, its protocol as EtherType) that ends where it ended.
    /// Returns the frame's start, captured length and wire length. A record shorter
    /// than its cooked header becomes an empty frame (`truncated_eth`).
    fn to_ethernet(
        self,
        buf: &mut [u8],
        start: usize,
        len: usize,
        orig: u32,
    ) -> (usize, usize, u32) {
        let (hlen, proto_at, arphrd_at) = match self {
            Link::Ethernet => return (start, len, orig.max(len as u32)),
            Link::Sll => (16, 14, 2),
            Link::Sll2 => (20, 0, 8),
        };
        if len < hlen {
            return (start, 0, 0);
        }
        let rec = &mut buf[start..start + hlen];
        let arphrd = u16::from_be_bytes([rec[arphrd_at], rec[arphrd_at + 1]]);
        let proto = if arphrd == ARPHRD_NETLINK {
            [0, 0]
        } else {
            [rec[proto_at], rec[proto_at + 1]]
        };
        let eth = &mut rec[hlen - ETH_HLEN..];
        eth[..12].fill(0);
        eth[12..].copy_from_slice(&proto);
        let len = len - hlen + ETH_HLEN;
        let wire = (orig.saturating_sub(hlen as u32) + ETH_HLEN as u32).max(len as u32);
        (start + hlen - ETH_HLEN, len, wire)
    }
}

/// Frames of a pcapng interface whose link type analyze does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedLink {
    /// The interface's number in the file (0-based, as tshark's `frame.interface_id`).
    pub interface: u32,
    /// The link type's number and name, e.g. "127 (IEEE802_11_RADIOTAP)".
    pub linktype: String,
    pub frames: u64,
}

enum Kind {
    Pcap {
        nanos: bool,
        big_endian: bool,
        link: Link,
    },
    PcapNg {
        parser: Box<PcapNgParser>,
    },
}

/// Why parsing a batch stopped.
enum Stop {
    /// The rest of the buffer holds no whole record.
    Incomplete,
    /// The frames asked for are read ([`CaptureReader::limit_frames`]).
    Limit,
    /// A record that cannot be read.
    Bad(AnalyzeError),
}

/// The name of standard input in messages.
pub const STDIN_NAME: &str = "standard input";

/// Reads the frames of a pcap or pcapng file or stream.
pub struct CaptureReader {
    /// The file's path, or [`STDIN_NAME`]: for messages.
    path: PathBuf,
    input: Box<dyn Read + Send>,
    kind: Kind,
    format: Format,
    /// Bytes of a record that the last read cut off, for the next batch.
    carry: Vec<u8>,
    eof: bool,
    /// An error met after the frames already handed out; returned next.
    pending: Option<AnalyzeError>,
    frames: u64,
    /// Frames to read at most.
    limit: u64,
    read: u64,
    size: u64,
    /// For [`CaptureReader::next_frame`]: the batch being handed out and the next index.
    current: Batch,
    next: usize,
    /// Frames skipped, by pcapng interface.
    unsupported: Vec<UnsupportedLink>,
}

/// "127 (IEEE802_11_RADIOTAP)", or "1234" for a number pcap-file does not name.
pub fn linktype_name(l: DataLink) -> String {
    match l {
        DataLink::Unknown(n) => n.to_string(),
        l => format!("{} ({l:?})", u32::from(l)),
    }
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

/// The error for the record after the `frames` read so far.
fn corrupt(path: &Path, frames: u64, detail: String) -> AnalyzeError {
    AnalyzeError::Corrupt {
        path: path.to_path_buf(),
        frame: frames + 1,
        detail,
    }
}

fn u32_at(b: &[u8], at: usize, big_endian: bool) -> u32 {
    let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
    if big_endian {
        u32::from_be_bytes(w)
    } else {
        u32::from_le_bytes(w)
    }
}

/// The total length of the pcapng block at the start of `b`, when its first 12 bytes
/// are there (a section header says its own byte order).
fn block_len(b: &[u8], section: Endianness) -> Option<usize> {
    if b.len() < 12 {
        return None;
    }
    let big = if b[..4] == [0x0A, 0x0D, 0x0D, 0x0A] {
        b[8..12] == [0x1A, 0x2B, 0x3C, 0x4D]
    } else {
        section == Endianness::Big
    };
    Some(u32_at(b, 4, big) as usize)
}

impl CaptureReader {
    /// Opens a capture file and reads its file header.
    pub fn open(path: &Path) -> Result<CaptureReader, AnalyzeError> {
        let file = File::open(path).map_err(|source| AnalyzeError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        CaptureReader::from_reader(path, Box::new(file), size)
    }

    /// Reads a capture from standard input (a pipe or a file), as it comes.
    pub fn stdin() -> Result<CaptureReader, AnalyzeError> {
        let file = stdin_file()?;
        // Of a file: what is left of it, for the progress bar.
        let size = match (file.metadata(), io::Seek::stream_position(&mut &file)) {
            (Ok(m), Ok(at)) if m.is_file() => m.len().saturating_sub(at),
            _ => 0,
        };
        CaptureReader::from_reader(Path::new(STDIN_NAME), Box::new(file), size)
    }

    /// Reads a capture from `input`, which holds `size` bytes (0: unknown), named
    /// `name` in messages. Reads its file header; refuses a pcap file of a link type
    /// it does not read.
    pub fn from_reader(
        name: &Path,
        mut input: Box<dyn Read + Send>,
        size: u64,
    ) -> Result<CaptureReader, AnalyzeError> {
        let path = name;
        let not_capture = |detail: String| AnalyzeError::NotACapture {
            path: path.to_path_buf(),
            detail,
        };
        // The file header, and the first blocks of a pcapng file (a section header
        // has options of any length): read what the first read gives.
        let mut head = vec![0u8; READ_BYTES];
        let mut n = 0;
        while n < head.len() {
            match input.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(not_capture(format!("cannot read it: {e}"))),
            }
        }
        head.truncate(n);
        if n < 4 {
            return Err(not_capture(format!(
                "cannot read its first 4 bytes: {}",
                io::Error::from(io::ErrorKind::UnexpectedEof)
            )));
        }
        let eof = n < READ_BYTES;
        let (kind, format, used) = if head[..4] == [0x0A, 0x0D, 0x0D, 0x0A] {
            let (rest, parser) = PcapNgParser::new(&head).map_err(|e| match e {
                PcapError::IncompleteBuffer => {
                    not_capture("the file ends inside its section header".to_string())
                }
                e => not_capture(e.to_string()),
            })?;
            let used = n - rest.len();
            (
                Kind::PcapNg {
                    parser: Box::new(parser),
                },
                Format::Pcapng,
                used,
            )
        } else {
            let (rest, parser) = PcapParser::new(&head).map_err(|e| match e {
                PcapError::IncompleteBuffer => {
                    not_capture("the file ends inside its file header".to_string())
                }
                e => not_capture(e.to_string()),
            })?;
            let h = parser.header();
            let Some(link) = Link::of(h.datalink) else {
                return Err(AnalyzeError::LinkType {
                    path: path.to_path_buf(),
                    linktype: linktype_name(h.datalink),
                });
            };
            (
                Kind::Pcap {
                    nanos: h.ts_resolution == TsResolution::NanoSecond,
                    big_endian: h.endianness == Endianness::Big,
                    link,
                },
                Format::Pcap,
                n - rest.len(),
            )
        };
        head.drain(..used);
        Ok(CaptureReader {
            path: path.to_path_buf(),
            input,
            kind,
            format,
            carry: head,
            eof,
            pending: None,
            frames: 0,
            limit: u64::MAX,
            read: n as u64,
            size,
            current: Batch::default(),
            next: 0,
            unsupported: Vec::new(),
        })
    }

    /// The frames skipped so far because their pcapng interface's link type is not
    /// one analyze reads, by interface.
    pub fn unsupported(&self) -> &[UnsupportedLink] {
        &self.unsupported
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// File bytes read so far and the file's size (0 when unknown: a pipe).
    pub fn position(&self) -> (u64, u64) {
        (self.read, self.size)
    }

    /// Frames read so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Reads no more than `n` frames: the end of the file comes after them.
    pub fn limit_frames(&mut self, n: u64) {
        self.limit = n;
    }

    fn corrupt(&self, detail: String) -> AnalyzeError {
        corrupt(&self.path, self.frames, detail)
    }

    /// The next frame, `None` at the end of the file.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, AnalyzeError> {
        if self.next >= self.current.len() {
            let mut b = std::mem::take(&mut self.current);
            let more = self.fill(&mut b);
            self.current = b;
            self.next = 0;
            if !more? {
                return Ok(None);
            }
        }
        let i = self.next;
        self.next += 1;
        Ok(Some(self.current.frame(i)))
    }

    /// Refills `b` with the next frames: `Ok(false)` at the end of the file. An error
    /// met after some frames comes back from the next call, so that the frames
    /// before it are counted first.
    pub fn fill(&mut self, b: &mut Batch) -> Result<bool, AnalyzeError> {
        b.frames.clear();
        b.skips.clear();
        b.first = self.frames + 1;
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.frames >= self.limit {
            return Ok(false);
        }
        if b.buf.len() < self.carry.len() + READ_BYTES {
            b.buf.resize(self.carry.len() + READ_BYTES, 0);
        }
        b.buf[..self.carry.len()].copy_from_slice(&self.carry);
        b.filled = self.carry.len();
        self.carry.clear();
        let mut pos = 0;
        loop {
            while b.filled < b.buf.len() && !self.eof {
                match self.input.read(&mut b.buf[b.filled..]) {
                    Ok(0) => self.eof = true,
                    Ok(n) => {
                        b.filled += n;
                        self.read += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.pending = Some(self.corrupt(format!("read error: {e}")));
                        break;
                    }
                }
            }
            if self.pending.is_some() {
                break;
            }
            match self.parse(b, &mut pos) {
                Stop::Limit => break,
                Stop::Bad(e) => {
                    self.pending = Some(e);
                    break;
                }
                Stop::Incomplete if self.eof => {
                    if pos < b.filled {
                        let what = match self.format {
                            Format::Pcap => "record",
                            Format::Pcapng => "block",
                        };
                        self.pending =
                            Some(self.corrupt(format!("the file ends in the middle of a {what}")));
                    }
                    break;
                }
                Stop::Incomplete if !b.frames.is_empty() => break,
                Stop::Incomplete => {
                    // No whole frame in the buffer: keep the unread bytes, read more.
                    b.buf.copy_within(pos..b.filled, 0);
                    b.filled -= pos;
                    pos = 0;
                    if b.filled == b.buf.len() {
                        if b.buf.len() >= MAX_RECORD {
                            self.pending =
                                Some(self.corrupt(format!(
                                    "a record longer than {} MiB",
                                    MAX_RECORD >> 20
                                )));
                            break;
                        }
                        b.buf.resize(b.buf.len() * 2, 0);
                    }
                }
            }
        }
        self.carry.extend_from_slice(&b.buf[pos..b.filled]);
        b.filled = pos;
        if b.frames.is_empty() {
            return match self.pending.take() {
                Some(e) => Err(e),
                None => Ok(false),
            };
        }
        Ok(true)
    }

    /// Parses whole records of `b` from `pos` on into its frame list.
    fn parse(&mut self, b: &mut Batch, pos: &mut usize) -> Stop {
        match &self.kind {
            Kind::Pcap {
                nanos,
                big_endian,
                link,
            } => {
                let (nanos, big, link) = (*nanos, *big_endian, *link);
                loop {
                    if self.frames >= self.limit {
                        return Stop::Limit;
                    }
                    let rest = &b.buf[*pos..b.filled];
                    if rest.len() < 16 {
                        return Stop::Incomplete;
                    }
                    let incl = u32_at(rest, 8, big) as usize;
                    if incl > MAX_RECORD {
                        return Stop::Bad(
                            self.corrupt(format!(
                                "a record of {incl} bytes, longer than any frame"
                            )),
                        );
                    }
                    if rest.len() < 16 + incl {
                        return Stop::Incomplete;
                    }
                    let (sec, frac) = (u32_at(rest, 0, big) as u64, u32_at(rest, 4, big) as u64);
                    let frac = if nanos { frac } else { frac * 1000 };
                    let orig = u32_at(rest, 12, big);
                    let (start, len, wire_len) =
                        link.to_ethernet(&mut b.buf, *pos + 16, incl, orig);
                    b.frames.push(FrameAt {
                        start: start as u32,
                        len: len as u32,
                        wire_len,
                        owner: 0,
                        icrc: ICRC_LATER,
                        ts_ns: sec * 1_000_000_000 + frac,
                        hash: 0,
                    });
                    self.frames += 1;
                    *pos += 16 + incl;
                }
            }
            Kind::PcapNg { .. } => self.parse_pcapng(b, pos),
        }
    }

    fn parse_pcapng(&mut self, b: &mut Batch, pos: &mut usize) -> Stop {
        let CaptureReader {
            kind: Kind::PcapNg { parser },
            path,
            frames,
            limit,
            unsupported,
            ..
        } = self
        else {
            return Stop::Incomplete;
        };
        loop {
            if *frames >= *limit {
                return Stop::Limit;
            }
            let bad = |detail: String| Stop::Bad(corrupt(path, *frames, detail));
            let rest = &b.buf[*pos..b.filled];
            let Some(len) = block_len(rest, parser.section().endianness) else {
                return Stop::Incomplete;
            };
            if len > MAX_RECORD {
                return bad(format!("a block of {len} bytes, longer than any frame"));
            }
            if rest.len() < len {
                return Stop::Incomplete;
            }
            // The whole block is here: what its parser misses is corruption.
            let block = match parser.next_block(&rest[..len]) {
                Ok((_, block)) => block,
                Err(PcapError::IncompleteBuffer) => {
                    return bad("a block shorter than its contents".to_string())
                }
                Err(e) => return bad(e.to_string()),
            };
            let (iface, raw_ts, orig, data): (u32, u64, u32, &[u8]) = match &block {
                Block::EnhancedPacket(p) => (
                    p.interface_id,
                    p.timestamp.as_nanos() as u64,
                    p.original_len,
                    &p.data,
                ),
                Block::SimplePacket(p) => (0, 0, p.original_len, &p.data),
                Block::Packet(p) => (p.interface_id as u32, p.timestamp, p.original_len, &p.data),
                _ => {
                    *pos += len;
                    continue;
                }
            };
            // The packet's bytes lie in the block, so in the buffer.
            let start = (data.as_ptr() as usize).wrapping_sub(b.buf.as_ptr() as usize);
            let data_len = data.len();
            drop(block);
            if start < *pos || start + data_len > *pos + len {
                return bad("a packet outside its block".to_string());
            }
            let Some(idb) = parser.interfaces().get(iface as usize) else {
                return bad(format!(
                    "packet of interface {iface}, which the file never described"
                ));
            };
            let Some(link) = Link::of(idb.linktype) else {
                match unsupported.iter_mut().find(|u| u.interface == iface) {
                    Some(u) => u.frames += 1,
                    None => unsupported.push(UnsupportedLink {
                        interface: iface,
                        linktype: linktype_name(idb.linktype),
                        frames: 1,
                    }),
                }
                b.skip();
                *frames += 1;
                *pos += len;
                continue;
            };
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
            let (start, data_len, wire_len) = link.to_ethernet(&mut b.buf, start, data_len, orig);
            b.frames.push(FrameAt {
                start: start as u32,
                len: data_len as u32,
                wire_len,
                owner: 0,
                icrc: ICRC_LATER,
                ts_ns: ts,
                hash: 0,
            });
            *frames += 1;
            *pos += len;
        }
    }
}

/// Standard input as a file of its own (a duplicate of descriptor 0).
pub fn stdin_file() -> Result<File, AnalyzeError> {
    io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|source| AnalyzeError::Open {
            path: PathBuf::from(STDIN_NAME),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;

    /// An IPv4 frame's network layer (only its first bytes matter here).
    const L3: [u8; 4] = [0x45, 0x00, 0x00, 0x14];

    #[test]
    fn sll_header_becomes_an_ethernet_header_in_place() {
        // packet type 0, ARPHRD 1, address length 6, address, protocol 0x8100 (a tag).
        let mut rec = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x81, 0x00];
        rec.extend_from_slice(&[0x00, 0x64, 0x08, 0x00]);
        rec.extend_from_slice(&L3);
        let len = rec.len();
        let mut buf = vec![0xEE; 3];
        buf.extend_from_slice(&rec);
        let (start, n, wire) = Link::Sll.to_ethernet(&mut buf, 3, len, len as u32 + 100);
        assert_eq!((start, n, wire), (5, len - 2, len as u32 - 2 + 100));
        let mut want = vec![0u8; 12];
        want.extend_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x08, 0x00]);
        want.extend_from_slice(&L3);
        assert_eq!(&buf[start..start + n], &want[..]);
        assert_eq!(&buf[..3], &[0xEE; 3], "bytes before the record untouched");
    }

    #[test]
    fn sll2_header_becomes_an_ethernet_header_in_place() {
        // protocol 0x86DD, reserved, ifindex 7, ARPHRD 1, type 4, addr len 6, addr.
        let mut rec = vec![
            0x86, 0xDD, 0, 0, 0, 0, 0, 7, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0,
        ];
        rec.extend_from_slice(&L3);
        let len = rec.len();
        let (start, n, wire) = Link::Sll2.to_ethernet(&mut rec, 0, len, len as u32);
        assert_eq!((start, n, wire), (6, len - 6, len as u32 - 6));
        let mut want = vec![0u8; 12];
        want.extend_from_slice(&[0x86, 0xDD]);
        want.extend_from_slice(&L3);
        assert_eq!(&rec[start..start + n], &want[..]);
    }

    #[test]
    fn short_and_netlink_cooked_records() {
        let mut short = vec![0u8; 15];
        assert_eq!(Link::Sll.to_ethernet(&mut short, 0, 15, 15).1, 0);
        let mut short2 = vec![0u8; 19];
        assert_eq!(Link::Sll2.to_ethernet(&mut short2, 0, 19, 19).1, 0);
        // ARPHRD_NETLINK, protocol 0x0800 by coincidence: EtherType 0 (not IP).
        let mut nl = vec![0, 4, 0x03, 0x38, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
        nl.extend_from_slice(&L3);
        let len = nl.len();
        let (start, _, _) = Link::Sll.to_ethernet(&mut nl, 0, len, len as u32);
        assert_eq!(&nl[start + 12..start + 14], &[0, 0]);
        // Ethernet is left alone.
        let mut eth = vec![1u8; 20];
        assert_eq!(Link::Ethernet.to_ethernet(&mut eth, 0, 20, 10), (0, 20, 20));
        assert_eq!(eth, vec![1u8; 20]);
    }

    #[test]
    fn linktype_names() {
        assert_eq!(
            linktype_name(DataLink::IEEE802_11_RADIOTAP),
            "127 (IEEE802_11_RADIOTAP)"
        );
        assert_eq!(linktype_name(DataLink::from(4242)), "4242");
    }

    /// A pcapng stream (no file) with an Ethernet, a radiotap and a LINUX_SLL2
    /// interface: the radiotap frames are skipped and counted, the others numbered
    /// as tshark numbers them, the cooked ones with an Ethernet header.
    #[test]
    fn pcapng_stream_skips_unsupported_interfaces_and_keeps_frame_numbers() -> Result<(), String> {
        let mut bytes = Vec::new();
        {
            let mut w = PcapNgWriter::new(&mut bytes).map_err(|e| e.to_string())?;
            for l in [
                DataLink::ETHERNET,
                DataLink::IEEE802_11_RADIOTAP,
                DataLink::LINUX_SLL2,
            ] {
                w.write_pcapng_block(InterfaceDescriptionBlock::new(l, 65535))
                    .map_err(|e| e.to_string())?;
            }
            // Frames 1-6: eth, radio, radio, sll2, radio, eth; then 40,000 radio and
            // an eth frame (many batches of skipped frames before it).
            let mut ifaces = vec![0u32, 1, 1, 2, 1, 0];
            ifaces.extend(std::iter::repeat_n(1, 40_000));
            ifaces.push(0);
            for (i, iface) in ifaces.iter().enumerate() {
                let data = match iface {
                    2 => {
                        let mut d = vec![0x08, 0x00, 0, 0, 0, 0, 0, 7, 0, 1, 0, 6];
                        d.extend_from_slice(&[0; 8]);
                        d.extend_from_slice(&L3);
                        d
                    }
                    _ => {
                        let mut d = vec![i as u8; 12];
                        d.extend_from_slice(&[0x08, 0x00]);
                        d.extend_from_slice(&L3);
                        d
                    }
                };
                let epb = EnhancedPacketBlock {
                    interface_id: *iface,
                    timestamp: std::time::Duration::from_micros(i as u64),
                    original_len: data.len() as u32,
                    data: std::borrow::Cow::Owned(data),
                    options: vec![],
                };
                w.write_pcapng_block(epb).map_err(|e| e.to_string())?;
            }
        }
        let input = Box::new(io::Cursor::new(bytes));
        let mut r =
            CaptureReader::from_reader(Path::new("stream"), input, 0).map_err(|e| e.to_string())?;
        let mut seen = Vec::new();
        while let Some(f) = r.next_frame().map_err(|e| e.to_string())? {
            seen.push((f.number, f.data.len(), f.data[..12].iter().all(|b| *b == 0)));
        }
        assert_eq!(
            seen,
            vec![
                (1, 18, true),
                (4, 18, true),
                (6, 18, false),
                (40_007, 18, false)
            ]
        );
        assert_eq!(r.frames(), 40_007);
        assert_eq!(
            r.unsupported(),
            &[UnsupportedLink {
                interface: 1,
                linktype: "127 (IEEE802_11_RADIOTAP)".to_string(),
                frames: 40_003,
            }]
        );
        Ok(())
    }
}
