//! The user side of the kernel's flow table (docs/architecture.md, "The flow table").
//!
//! FLOWS4, FLOWS_MID and FLOWS map a flow's key to a slot of FLOW_SLOTS, which holds the flow's
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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use roce_common::flow::{FlowSlot, SLOT_EVICTED, SLOT_LIVE};
use roce_common::mirror::MirrorTag;

/// Slots mapped at a time while the table is read: 1 MiB. A window is mapped, read and
/// unmapped in turn, so the agent's memory never holds the whole table (a million
/// flows are 256 MB of kernel memory, which a mapping would count in the agent's RSS
/// as well); mapping costs about 0.4 µs a page (BENCHMARKS.md, "Flow slots").
const WINDOW_SLOTS: usize = 4096;

/// FLOW_SLOTS as the agent reads it whole. The programs write it at the same time:
/// the table is read through mapped windows ([`Self::for_each_live`]), each slot
/// copied out with volatile loads (a u64 counter is read whole, an aligned load; a
/// slot's counters may be a packet apart from each other). Single slots are read and
/// written through the map (`Loaded`).
pub struct FlowSlots {
    fd: OwnedFd,
    /// MIRROR_TAGS: the mirror session of each slot whose key has KEY_MIRROR, mapped
    /// a window at a time beside the slots' window, when that window holds one.
    tags: Option<OwnedFd>,
    /// TUNNEL_PORTS: the outer UDP source port of each slot whose key has
    /// KEY_TUNNELLED, mapped the same way.
    ports: Option<OwnedFd>,
    len: usize,
    page: usize,
}

impl FlowSlots {
    /// FLOW_SLOTS of `len` slots, whose map fd is `fd` (duplicated: the map stays
    /// open as long as this).
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<FlowSlots> {
        // SAFETY: sysconf has no memory arguments.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        for size in [size_of::<FlowSlot>(), size_of::<MirrorTag>()] {
            if !(WINDOW_SLOTS * size).is_multiple_of(page) {
                return Err(io::Error::other(format!(
                    "a window of slots is not a whole number of {page}-byte pages"
                )));
            }
        }
        Ok(FlowSlots {
            fd: fd.try_clone_to_owned()?,
            tags: None,
            ports: None,
            len,
            page,
        })
    }

    /// The same, reading the mirror sessions of mirrored flows from MIRROR_TAGS
    /// (`tags`, as many entries as slots; duplicated).
    pub fn with_tags(mut self, tags: BorrowedFd<'_>) -> io::Result<FlowSlots> {
        self.tags = Some(tags.try_clone_to_owned()?);
        Ok(self)
    }

    /// Slots in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same, reading the outer UDP source ports of tunnelled flows from
    /// TUNNEL_PORTS (`ports`, as many entries as slots; duplicated).
    pub fn with_tunnel_ports(mut self, ports: BorrowedFd<'_>) -> io::Result<FlowSlots> {
        self.ports = Some(ports.try_clone_to_owned()?);
        Ok(self)
    }

    /// Calls `f(index, slot)` for every live slot, in order; returns how many there were.
    pub fn for_each_live(&self, mut f: impl FnMut(usize, &FlowSlot)) -> io::Result<usize> {
        self.for_each_live_beside(|i, slot, _| f(i, slot))
    }

    /// [`Self::for_each_live`], with what the kernel keeps beside each slot: the
    /// mirror session of a mirrored flow, the outer port of a tunnelled one (None for
    /// the others, and without the map). A window of either map is mapped only when
    /// the slots' window holds a flow that has an entry there.
    pub fn for_each_live_beside(
        &self,
        mut f: impl FnMut(usize, &FlowSlot, &SlotSide),
    ) -> io::Result<usize> {
        let mut live = 0;
        for start in (0..self.len).step_by(WINDOW_SLOTS) {
            let n = WINDOW_SLOTS.min(self.len - start);
            let window: Window<FlowSlot> = Window::map(&self.fd, self.page, start, n)?;
            let mut tags = BesideWindow::<MirrorTag>::new(self.tags.as_ref(), self.page, start, n);
            let mut ports = BesideWindow::<u64>::new(self.ports.as_ref(), self.page, start, n);
            for i in 0..n {
                // The state alone first: most slots of a roomy table are free.
                if window.state(i) != SLOT_LIVE {
                    continue;
                }
                let slot = window.read(i);
                // Evicted (or freed by a program that lost a race) in between.
                if slot.state != SLOT_LIVE {
                    continue;
                }
                live += 1;
                let tag = tags.entry(slot.key.mirrored(), i)?;
                // The kernel writes the port's 16 bits into a u64 (an array's entries
                // are 8 bytes apart); 0 is no port (a flow put in by hand).
                let outer_sport = ports
                    .entry(slot.key.tunnelled(), i)?
                    .map(|p| p as u16)
                    .filter(|p| *p != 0);
                f(start + i, &slot, &SlotSide { tag, outer_sport });
            }
        }
        Ok(live)
    }

    /// Indexes of the slots in state [`SLOT_EVICTED`] (an earlier agent's, on adoption).
    pub fn evicted(&self) -> io::Result<Vec<u32>> {
        let mut out = Vec::new();
        for start in (0..self.len).step_by(WINDOW_SLOTS) {
            let n = WINDOW_SLOTS.min(self.len - start);
            let window: Window<FlowSlot> = Window::map(&self.fd, self.page, start, n)?;
            out.extend(
                (0..n)
                    .filter(|&i| window.state(i) == SLOT_EVICTED)
                    .map(|i| (start + i) as u32),
            );
        }
        Ok(out)
    }
}

impl std::fmt::Debug for FlowSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowSlots").field("len", &self.len).finish()
    }
}

/// The entries of an array beside FLOW_SLOTS (MIRROR_TAGS, TUNNEL_PORTS) for one window
/// of slots, mapped the first time a slot of the window needs its entry.
struct BesideWindow<'a, T> {
    fd: Option<&'a OwnedFd>,
    page: usize,
    start: usize,
    n: usize,
    window: Option<Window<T>>,
}

impl<'a, T: Copy> BesideWindow<'a, T> {
    fn new(fd: Option<&'a OwnedFd>, page: usize, start: usize, n: usize) -> Self {
        BesideWindow {
            fd,
            page,
            start,
            n,
            window: None,
        }
    }

    /// Entry `i` of the window when the slot `wants` it (None without the map).
    fn entry(&mut self, wants: bool, i: usize) -> io::Result<Option<T>> {
        let (true, Some(fd)) = (wants, self.fd) else {
            return Ok(None);
        };
        if self.window.is_none() {
            self.window = Some(Window::map(fd, self.page, self.start, self.n)?);
        }
        Ok(self.window.as_ref().map(|w| w.read(i)))
    }
}

/// What the kernel keeps of a live slot's flow beside FLOW_SLOTS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSide {
    /// A mirrored flow's session (MIRROR_TAGS).
    pub tag: Option<MirrorTag>,
    /// A tunnelled flow's outer UDP source port, from its first packet (TUNNEL_PORTS).
    pub outer_sport: Option<u16>,
}

/// Entries `start..start + n` of an mmapable array of `T` (FLOW_SLOTS, MIRROR_TAGS, TUNNEL_PORTS),
/// mapped read-only until dropped.
struct Window<T> {
    base: *const T,
    n: usize,
    bytes: usize,
}

impl<T: Copy> Window<T> {
    fn map(fd: &OwnedFd, page: usize, start: usize, n: usize) -> io::Result<Window<T>> {
        let bytes = (n * size_of::<T>()).next_multiple_of(page);
        // `start` is a multiple of WINDOW_SLOTS, whose entries fill whole pages (`new`).
        let offset = (start * size_of::<T>()) as libc::off_t;
        // SAFETY: a new shared, read-only mapping of the map's pages (the kernel checks
        // offset and size against the map); no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Window {
            base: p.cast::<T>(),
            n,
            bytes,
        })
    }

    fn at(&self, i: usize) -> *const T {
        assert!(i < self.n, "entry {i} of a window of {}", self.n);
        // SAFETY: within the mapping (checked above).
        unsafe { self.base.add(i) }
    }

    fn read(&self, i: usize) -> T {
        // SAFETY: an aligned entry of the live mapping.
        unsafe { std::ptr::read_volatile(self.at(i)) }
    }
}

impl Window<FlowSlot> {
    fn state(&self, i: usize) -> u32 {
        // SAFETY: an aligned slot of the live mapping, one field.
        unsafe { std::ptr::read_volatile(&raw const (*self.at(i)).state) }
    }
}

impl<T> Drop for Window<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `bytes` bytes, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.bytes) };
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
