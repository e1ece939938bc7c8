//! A minimal reader of classic pcap files (not pcapng): either byte order,
//! microsecond or nanosecond timestamps. Enough for the project's captures.

use std::path::{Path, PathBuf};

/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Timestamp in nanoseconds.
    pub ts_ns: u64,
    /// Original length on the wire.
    pub orig_len: u32,
    /// The captured bytes (may be shorter than `orig_len` when snapped).
    pub data: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct Capture {
    pub linktype: u32,
    pub snaplen: u32,
    pub records: Vec<Record>,
}

#[derive(Debug)]
pub enum PcapError {
    Io(std::io::Error),
    BadMagic(u32),
    Truncated(usize),
}

impl std::error::Error for PcapError {}

impl std::fmt::Display for PcapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PcapError::Io(e) => write!(f, "reading the capture: {e}"),
            PcapError::BadMagic(m) => write!(f, "not a classic pcap file (magic {m:#010x})"),
            PcapError::Truncated(at) => write!(f, "capture truncated at byte {at}"),
        }
    }
}

/// Parses a whole classic pcap file held in memory.
pub fn parse(bytes: &[u8]) -> Result<Capture, PcapError> {
    let u32_at = |at: usize, le: bool| -> Result<u32, PcapError> {
        let b: [u8; 4] = bytes
            .get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or(PcapError::Truncated(at))?;
        Ok(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let magic = u32_at(0, true)?;
    let (le, nanos) = match magic {
        0xA1B2_C3D4 => (true, false),
        0xA1B2_3C4D => (true, true),
        0xD4C3_B2A1 => (false, false),
        0x4D3C_B2A1 => (false, true),
        m => return Err(PcapError::BadMagic(m)),
    };
    let snaplen = u32_at(16, le)?;
    let linktype = u32_at(20, le)? & 0x0FFF_FFFF;
    let mut records = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let sec = u32_at(at, le)? as u64;
        let frac = u32_at(at + 4, le)? as u64;
        let incl = u32_at(at + 8, le)? as usize;
        let orig_len = u32_at(at + 12, le)?;
        let start = at + 16;
        let data = bytes
            .get(start..start + incl)
            .ok_or(PcapError::Truncated(start))?
            .to_vec();
        records.push(Record {
            ts_ns: sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 },
            orig_len,
            data,
        });
        at = start + incl;
    }
    Ok(Capture {
        linktype,
        snaplen,
        records,
    })
}

/// Reads and parses a classic pcap file.
pub fn read(path: &Path) -> Result<Capture, PcapError> {
    let bytes = std::fs::read(path).map_err(PcapError::Io)?;
    parse(&bytes)
}

/// The folder of the shared real captures: `$ROCE_CAPTURES`, or `shared/captures`
/// beside the repository (where the work tree and CI lay it).
pub fn captures_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ROCE_CAPTURES") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/captures")
}

/// Every `*.pcap` file in [`captures_dir`], sorted by name.
pub fn capture_files() -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(captures_dir())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_byte_orders() {
        for le in [true, false] {
            let w = |v: u32| if le { v.to_le_bytes() } else { v.to_be_bytes() };
            let mut f = Vec::new();
            f.extend(w(0xA1B2_C3D4));
            f.extend([0; 12]);
            f.extend(w(65535));
            f.extend(w(1));
            for (i, len) in [3u32, 1].into_iter().enumerate() {
                f.extend(w(7));
                f.extend(w(5));
                f.extend(w(len));
                f.extend(w(len + 1));
                f.extend(std::iter::repeat_n(i as u8, len as usize));
            }
            let c = parse(&f).unwrap();
            assert_eq!((c.linktype, c.snaplen, c.records.len()), (1, 65535, 2));
            assert_eq!(c.records[0].ts_ns, 7_000_005_000);
            assert_eq!(c.records[0].data, vec![0, 0, 0]);
            assert_eq!(
                (c.records[1].orig_len, &c.records[1].data[..]),
                (2, &[1u8][..])
            );
            assert!(matches!(
                parse(&f[..f.len() - 1]),
                Err(PcapError::Truncated(_))
            ));
        }
        assert!(matches!(parse(&[0u8; 24]), Err(PcapError::BadMagic(0))));
    }
}
