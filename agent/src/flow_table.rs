//! The user side of the kernel's flow table (docs/architecture.md, "The flow table").
//!
//! FLOWS4 and FLOWS map a flow's key to a slot of FLOW_SLOTS, which holds the flow's
//! counters (one value for all CPUs, added to atomically) and its wide key. FLOW_FREE
//! queues the free slots; a program takes one for a new flow. The agent:
//! - maps FLOW_SLOTS into its memory and reads it in order ([`FlowSlots`]): a million
//!   flows in tens of milliseconds, where batch reads of per-CPU hash maps took a
//!   second (BENCHMARKS.md, "Flow slots");
//! - fills FLOW_FREE when the table is new, and gives evicted flows' slots back;
//! - evicts the least recently seen flows when free slots run short
//!   ([`flows_to_evict`]): the hash maps do not evict on their own.
//!
//! An evicted flow's slot waits one poll interval ([`SLOT_EVICTED`]) before it is
//! zeroed and queued again: a program that looked the flow up just before its key went
//! may still be counting on it, and must not count into the next flow's counters.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use roce_common::flow::{FlowSlot, SLOT_EVICTED, SLOT_LIVE};

/// FLOW_SLOTS mapped into this process (read and written: the agent zeroes the slots
/// it gives back). The kernel programs write it at the same time, so every access is
/// a volatile copy of a whole slot or of one field; a u64 counter is read whole (an
/// aligned load), a slot's counters may be a packet apart from each other.
pub struct FlowSlots {
    base: NonNull<FlowSlot>,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is plain shared memory, valid until drop; every access is a
// volatile copy, and nothing hands out references into it.
unsafe impl Send for FlowSlots {}
// SAFETY: as above.
unsafe impl Sync for FlowSlots {}

impl FlowSlots {
    /// Maps the `len` slots of the mmapable array map `fd`.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<FlowSlots> {
        // SAFETY: sysconf has no memory arguments.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let bytes = (len.max(1) * size_of::<FlowSlot>()).next_multiple_of(page);
        // SAFETY: a new shared mapping of the map's pages (the kernel checks the size
        // against the map); no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<FlowSlot>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(FlowSlots { base, len, bytes })
    }

    /// Slots in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, i: usize) -> *mut FlowSlot {
        assert!(i < self.len, "slot {i} of {}", self.len);
        // SAFETY: within the mapping (checked above).
        unsafe { self.base.as_ptr().add(i) }
    }

    /// A copy of slot `i`.
    pub fn read(&self, i: usize) -> FlowSlot {
        // SAFETY: an aligned slot of the live mapping.
        unsafe { std::ptr::read_volatile(self.at(i)) }
    }

    /// The state of slot `i` (`SLOT_*`).
    pub fn state(&self, i: usize) -> u32 {
        // SAFETY: as in `read`, one field.
        unsafe { std::ptr::read_volatile(&raw const (*self.at(i)).state) }
    }

    /// Sets the state of slot `i`.
    pub fn set_state(&self, i: usize, state: u32) {
        // SAFETY: as in `read`, one field.
        unsafe { std::ptr::write_volatile(&raw mut (*self.at(i)).state, state) }
    }

    /// Writes slot `i` whole (a zeroed one to give it back, or a flow made by hand).
    pub fn write(&self, i: usize, slot: &FlowSlot) {
        // SAFETY: as in `read`.
        unsafe { std::ptr::write_volatile(self.at(i), *slot) }
    }

    /// Calls `f(index, slot)` for every live slot, in order; returns how many there were.
    pub fn for_each_live(&self, mut f: impl FnMut(usize, &FlowSlot)) -> usize {
        let mut live = 0;
        for i in 0..self.len {
            // The state alone first: most slots of a roomy table are free.
            if self.state(i) != SLOT_LIVE {
                continue;
            }
            let slot = self.read(i);
            // Evicted (or freed by a program that lost a race) in between.
            if slot.state != SLOT_LIVE {
                continue;
            }
            live += 1;
            f(i, &slot);
        }
        live
    }

    /// Indexes of the slots in state [`SLOT_EVICTED`] (an earlier agent's, on adoption).
    pub fn evicted(&self) -> Vec<u32> {
        (0..self.len)
            .filter(|&i| self.state(i) == SLOT_EVICTED)
            .map(|i| i as u32)
            .collect()
    }
}

impl Drop for FlowSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `bytes` bytes, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

impl std::fmt::Debug for FlowSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowSlots").field("len", &self.len).finish()
    }
}

/// How many flows to evict from a table of `capacity` slots with `live` flows and
/// `waiting` slots still waiting to be given back: none while a sixteenth of the
/// table is free, else enough to free an eighth of it (so that evictions come in
/// batches, a few polls apart, not a handful every poll).
pub fn flows_to_evict(capacity: usize, live: usize, waiting: usize) -> usize {
    let low = (capacity / 16).max(1);
    let target = (capacity / 8).max(1);
    let free = capacity.saturating_sub(live + waiting);
    if free >= low {
        return 0;
    }
    (target - free).min(live)
}

/// The `n` least recently seen of `candidates` (last seen, slot index), oldest first.
pub fn least_recently_seen(candidates: &mut [(u64, u32)], n: usize) -> &[(u64, u32)] {
    let n = n.min(candidates.len());
    if n == 0 {
        return &[];
    }
    if n < candidates.len() {
        candidates.select_nth_unstable(n - 1);
    }
    let chosen = &mut candidates[..n];
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_starts_below_a_sixteenth_free_and_frees_an_eighth() {
        // 1,024 slots: evict when fewer than 64 are free, up to 128 free.
        assert_eq!(flows_to_evict(1024, 900, 0), 0);
        assert_eq!(flows_to_evict(1024, 960, 0), 0, "64 free: enough");
        assert_eq!(flows_to_evict(1024, 961, 0), 65);
        assert_eq!(flows_to_evict(1024, 1024, 0), 128);
        // Slots waiting to be given back are not free yet.
        assert_eq!(flows_to_evict(1024, 900, 100), 104);
        // A tiny table still frees a slot.
        assert_eq!(flows_to_evict(4, 4, 0), 1);
        assert_eq!(flows_to_evict(0, 0, 0), 0);
    }

    #[test]
    fn the_least_recently_seen_are_chosen_oldest_first() {
        let mut c = vec![(50, 0), (10, 1), (40, 2), (20, 3), (30, 4)];
        assert_eq!(least_recently_seen(&mut c, 2), &[(10, 1), (20, 3)]);
        let mut c = vec![(5, 9), (1, 8)];
        assert_eq!(least_recently_seen(&mut c, 5), &[(1, 8), (5, 9)]);
        assert!(least_recently_seen(&mut c, 0).is_empty());
    }
}
