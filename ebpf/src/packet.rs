//! `Packet` over the kernel's `data..data_end`: every read is checked against
//! `data_end` where it happens, and offsets are capped so the verifier can bound them.

use core::mem::size_of;

use roce_common::event::EVENT_PACKET_BYTES;
use roce_common::packet::{Header, Packet};
use roce_common::wire::MAX_PARSE_OFFSET;

pub struct KernelPacket {
    start: usize,
    end: usize,
}

impl KernelPacket {
    #[inline(always)]
    pub fn new(start: usize, end: usize) -> Self {
        KernelPacket { start, end }
    }

    #[inline(always)]
    fn load<T: Copy>(&self, off: usize) -> Option<T> {
        if off > MAX_PARSE_OFFSET {
            return None;
        }
        // The compiler knows `start + off + 1` cannot overflow and would fold
        // `p + 1 > end` into `p >= end`, which the verifier cannot turn into a packet
        // range when all of p's offset is variable. An opaque p keeps the `+ size`.
        let p = opaque(self.start + off);
        if p + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked just above; BPF loads from packet memory need no alignment
        // on the architectures the JIT serves, and a plain load avoids byte-wise splitting.
        Some(unsafe { *(p as *const T) })
    }
}

impl KernelPacket {
    /// Writes `v` at `off` (tc only: the verifier makes a cloned skb's head private
    /// before the program runs, so the write never reaches another skb's data).
    #[inline(always)]
    pub fn store<T: Copy>(&self, off: usize, v: T) -> Option<()> {
        if off > MAX_PARSE_OFFSET {
            return None;
        }
        let p = opaque(self.start + off);
        if p + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked just above, as in `load`.
        unsafe { *(p as *mut T) = v };
        Some(())
    }
}

impl KernelPacket {
    /// Copies the first `len` (8..=128) bytes to `to` (an event's ring memory), a word
    /// at a time: the whole words from the start, then the last 8 bytes, which overlap
    /// the last whole word unless `len` is a multiple of 8. False, with `to` partly
    /// written, when the packet is shorter or `len` out of range. For kernels without
    /// bpf_xdp_load_bytes (before 5.18).
    #[inline(always)]
    pub fn copy_head(&self, to: *mut u8, len: usize) -> bool {
        // Every bound the verifier needs is tested where the value is used, against a
        // constant: 5.10's verifier forgets the range of a scalar spilled to the stack,
        // and an opaque `len` keeps the compiler from dropping the tests as implied by
        // an earlier one.
        let len = opaque(len);
        let mut off = 0;
        while off + 8 <= EVENT_PACKET_BYTES && off + 8 <= len {
            if !self.copy_word(off, to) {
                return false;
            }
            off += 8;
        }
        let last = opaque(len).wrapping_sub(8);
        if last > EVENT_PACKET_BYTES - 8 {
            return false;
        }
        self.copy_word(last, to)
    }

    /// Copies the 8 bytes at `off` to `to + off`.
    #[inline(always)]
    fn copy_word(&self, off: usize, to: *mut u8) -> bool {
        let Some(word) = self.load::<u64>(off) else {
            return false;
        };
        // An opaque destination keeps the compiler from turning the copy into a
        // memcpy of variable length, which BPF has not.
        let dst = opaque(to as usize + off) as *mut u64;
        // SAFETY: `to` holds EVENT_PACKET_BYTES and `copy_head` passes off + 8 <= that;
        // BPF stores need no alignment on the architectures the JIT serves.
        unsafe { *dst = word };
        true
    }
}

/// A header of a [`KernelPacket`]: `n` bytes at `p`, checked against `data_end` once.
#[derive(Clone, Copy)]
pub struct KernelHeader {
    p: usize,
    n: usize,
}

impl KernelHeader {
    #[inline(always)]
    fn read<T: Copy + Default>(&self, k: usize) -> T {
        // Constant k and n at every call site: this test folds away.
        if k + size_of::<T>() > self.n {
            return T::default();
        }
        // SAFETY: p..p + n was checked against data_end in `header`, and k + size <= n.
        unsafe { *((self.p + k) as *const T) }
    }
}

impl Header for KernelHeader {
    #[inline(always)]
    fn u8(&self, k: usize) -> u8 {
        self.read::<u8>(k)
    }
    #[inline(always)]
    fn be16(&self, k: usize) -> u16 {
        u16::from_be(self.read::<u16>(k))
    }
    #[inline(always)]
    fn be32(&self, k: usize) -> u32 {
        u32::from_be(self.read::<u32>(k))
    }
    #[inline(always)]
    fn raw32(&self, k: usize) -> u32 {
        self.read::<u32>(k)
    }
}

impl Packet for KernelPacket {
    type Header = KernelHeader;

    #[inline(always)]
    fn header(&self, off: usize, n: usize) -> Option<KernelHeader> {
        if off > MAX_PARSE_OFFSET {
            return None;
        }
        // As in `load`: an opaque p keeps the `+ n` the verifier needs.
        let p = opaque(self.start + off);
        if p + n > self.end {
            return None;
        }
        Some(KernelHeader { p, n })
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.end - self.start
    }
    #[inline(always)]
    fn u8_at(&self, off: usize) -> Option<u8> {
        self.load::<u8>(off)
    }
    #[inline(always)]
    fn be16_at(&self, off: usize) -> Option<u16> {
        self.load::<u16>(off).map(u16::from_be)
    }
    #[inline(always)]
    fn be32_at(&self, off: usize) -> Option<u32> {
        self.load::<u32>(off).map(u32::from_be)
    }
    #[inline(always)]
    fn raw32_at(&self, off: usize) -> Option<u32> {
        self.load::<u32>(off)
    }
}

/// Returns `x` unchanged, hidden from the optimiser (one register move).
#[inline(always)]
pub fn opaque(mut x: usize) -> usize {
    // SAFETY: a register move to itself; it only claims to modify x.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) x, options(pure, nomem, nostack, preserves_flags))
    };
    x
}
