//! Reading pcap and pcapng captures frame by frame (never loaded whole).

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, PcapError, TsResolution};
use serde::{Deserialize, Serialize};

use super::AnalyzeError;

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
