//! Bounds-checked reads from a packet, the one primitive the parser is built on.
//!
//! The kernel implements [`Packet`] over `data..data_end` (every read is checked
//! against `data_end` right where it happens, which is what the verifier needs);
//! the user side implements it over a byte slice.

use crate::wire::MAX_PARSE_OFFSET;

/// A header whose whole length was checked once: its fields are read with no check
/// of their own (one bounds check per header, not one per field). A field beyond the
/// checked length reads as zero; every call site reads constant offsets inside a
/// constant length, so the compiler removes that test.
pub trait Header: Copy {
    fn u8(&self, k: usize) -> u8;
    /// A big-endian 16-bit field.
    fn be16(&self, k: usize) -> u16;
    /// A big-endian 32-bit field.
    fn be32(&self, k: usize) -> u32;
    /// Four bytes as they lie in memory.
    fn raw32(&self, k: usize) -> u32;
}

/// Read access to the bytes of one frame, starting at the Ethernet header.
pub trait Packet {
    type Header: Header;

    /// The `n` bytes at `off` as a header, when the frame holds them all (`n` is a
    /// constant at every call: the kernel's verifier needs a constant range).
    fn header(&self, off: usize, n: usize) -> Option<Self::Header>;

    /// Frame length in bytes.
    fn len(&self) -> usize;
    fn u8_at(&self, off: usize) -> Option<u8>;
    /// A big-endian 16-bit field.
    fn be16_at(&self, off: usize) -> Option<u16>;
    /// A big-endian 32-bit field.
    fn be32_at(&self, off: usize) -> Option<u32>;
    /// Four bytes as they lie in memory (addresses are kept in network order).
    fn raw32_at(&self, off: usize) -> Option<u32>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An IPv6 address as four raw words.
    #[inline(always)]
    fn addr6_at(&self, off: usize) -> Option<[u32; 4]> {
        // One bounds check for the whole address; the reads below cannot fail then.
        self.raw32_at(off + 12)?;
        Some([
            self.raw32_at(off)?,
            self.raw32_at(off + 4)?,
            self.raw32_at(off + 8)?,
            self.raw32_at(off + 12)?,
        ])
    }
}

/// A frame held in a byte slice (captures, tests, the reference classifier).
#[derive(Clone, Copy, Debug)]
pub struct SlicePacket<'a>(pub &'a [u8]);

impl SlicePacket<'_> {
    #[inline(always)]
    fn bytes<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        // Same bound as the kernel reader, so both stop at the same depth.
        if off > MAX_PARSE_OFFSET {
            return None;
        }
        let b = self.0.get(off..off.checked_add(N)?)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Some(out)
    }
}

/// A header of a [`SlicePacket`].
#[derive(Clone, Copy, Debug)]
pub struct SliceHeader<'a>(&'a [u8]);

impl SliceHeader<'_> {
    #[inline(always)]
    fn bytes<const N: usize>(&self, k: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(b) = self.0.get(k..k + N) {
            out.copy_from_slice(b);
        }
        out
    }
}

impl Header for SliceHeader<'_> {
    #[inline(always)]
    fn u8(&self, k: usize) -> u8 {
        self.0.get(k).copied().unwrap_or(0)
    }
    #[inline(always)]
    fn be16(&self, k: usize) -> u16 {
        u16::from_be_bytes(self.bytes(k))
    }
    #[inline(always)]
    fn be32(&self, k: usize) -> u32 {
        u32::from_be_bytes(self.bytes(k))
    }
    #[inline(always)]
    fn raw32(&self, k: usize) -> u32 {
        u32::from_ne_bytes(self.bytes(k))
    }
}

// Inlined across crates: `analyze` walks every frame of a capture through these, and
// a call per header field would cost `analyze` much of its time.
impl<'a> Packet for SlicePacket<'a> {
    type Header = SliceHeader<'a>;

    #[inline(always)]
    fn header(&self, off: usize, n: usize) -> Option<SliceHeader<'a>> {
        if off > MAX_PARSE_OFFSET {
            return None;
        }
        self.0.get(off..off.checked_add(n)?).map(SliceHeader)
    }

    #[inline]
    fn len(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn u8_at(&self, off: usize) -> Option<u8> {
        self.bytes::<1>(off).map(|b| b[0])
    }
    #[inline]
    fn be16_at(&self, off: usize) -> Option<u16> {
        self.bytes::<2>(off).map(u16::from_be_bytes)
    }
    #[inline]
    fn be32_at(&self, off: usize) -> Option<u32> {
        self.bytes::<4>(off).map(u32::from_be_bytes)
    }
    #[inline]
    fn raw32_at(&self, off: usize) -> Option<u32> {
        self.bytes::<4>(off).map(u32::from_ne_bytes)
    }
}
