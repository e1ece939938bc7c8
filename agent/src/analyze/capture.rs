//! Reading pcap and pcapng captures in large reads (never loaded whole): the frames
//! are handed out in [`Batch`]es, borrowed from the bytes read, never copied one by one.

use std::fs::File;
use std::io::{self, Read};
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
    /// The captured bytes, from the Ethernet header on.
    pub data: &'a [u8],
    /// The frame's length on the wire (at least `data.len()`).
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
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            // Sized by the first fill.
            buf: Vec::new(),
            filled: 0,
            frames: Vec::new(),
            first: 1,
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

    /// The `i`-th frame (`i < len()`).
    pub fn frame(&self, i: usize) -> Frame<'_> {
        let at = self.frames[i];
        let start = at.start as usize;
        Frame {
            number: self.first + i as u64,
            ts_ns: at.ts_ns,
            data: &self.buf[start..start + at.len as usize],
            wire_len: at.wire_len as u64,
        }
    }
}

enum Kind {
    Pcap { nanos: bool, big_endian: bool },
    PcapNg { parser: Box<PcapNgParser> },
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

/// Reads the frames of a pcap or pcapng file.
pub struct CaptureReader {
    path: PathBuf,
    file: File,
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
    /// Opens a capture and reads its file header. Refuses anything but Ethernet.
    pub fn open(path: &Path) -> Result<CaptureReader, AnalyzeError> {
        let mut file = File::open(path).map_err(|source| AnalyzeError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let not_capture = |detail: String| AnalyzeError::NotACapture {
            path: path.to_path_buf(),
            detail,
        };
        // The file header, and the first blocks of a pcapng file (a section header
        // has options of any length): read what the first read gives.
        let mut head = vec![0u8; READ_BYTES];
        let mut n = 0;
        while n < head.len() {
            match file.read(&mut head[n..]) {
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
            if h.datalink != DataLink::ETHERNET {
                return Err(AnalyzeError::LinkType {
                    path: path.to_path_buf(),
                    linktype: linktype_name(h.datalink),
                });
            }
            (
                Kind::Pcap {
                    nanos: h.ts_resolution == TsResolution::NanoSecond,
                    big_endian: h.endianness == Endianness::Big,
                },
                Format::Pcap,
                n - rest.len(),
            )
        };
        head.drain(..used);
        Ok(CaptureReader {
            path: path.to_path_buf(),
            file,
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
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// File bytes read so far and the file's size.
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
                match self.file.read(&mut b.buf[b.filled..]) {
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
            Kind::Pcap { nanos, big_endian } => {
                let (nanos, big) = (*nanos, *big_endian);
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
                    b.frames.push(FrameAt {
                        start: (*pos + 16) as u32,
                        len: incl as u32,
                        wire_len: orig.max(incl as u32),
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
            if idb.linktype != DataLink::ETHERNET {
                return Stop::Bad(AnalyzeError::LinkType {
                    path: path.clone(),
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
            b.frames.push(FrameAt {
                start: start as u32,
                len: data_len as u32,
                wire_len: orig.max(data_len as u32),
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
