//! `Packet` over the kernel's `data..data_end`: every read is checked against
//! `data_end` where it happens, and offsets are capped so the verifier can bound them.

use core::mem::size_of;

use roce_common::packet::Packet;
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

impl Packet for KernelPacket {
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
fn opaque(mut x: usize) -> usize {
    // SAFETY: a register move to itself; it only claims to modify x.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) x, options(pure, nomem, nostack, preserves_flags))
    };
    x
}
