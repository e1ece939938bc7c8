//! How far the EVENTS ring buffer has been written and read, from the kernel's own
//! positions: the producer position (page 1 of the map) and the consumer position
//! (page 0), both byte counts that only grow from the map's creation. They live in the
//! map, not in the agent, so they continue across agent restarts while the datapath
//! stays pinned: `written - read` is what no agent has read yet, and `read == written`
//! after a drain proves that no record was lost between two agents.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use roce_common::event::EventRecord;

/// Bytes one record takes in the ring: the kernel's 8-byte record header, then the
/// record, rounded up to 8 (`BPF_RINGBUF_HDR_SZ`, and the kernel's rounding in
/// `__bpf_ringbuf_reserve`). The programs write only `EventRecord`s and discard none.
pub const RECORD_STRIDE: u64 = (8 + size_of::<EventRecord>() as u64).next_multiple_of(8);

/// Why the positions cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RingProgressError {
    #[error("mapping page {page} of the EVENTS ring buffer read-only: {source}")]
    Map {
        page: usize,
        #[source]
        source: std::io::Error,
    },
}

/// Records written into and read out of the ring since it was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub written: u64,
    pub read: u64,
}

impl Progress {
    /// Records waiting for a reader.
    pub fn unread(&self) -> u64 {
        self.written.saturating_sub(self.read)
    }
}

/// Read-only mappings of a ring buffer's consumer and producer pages.
#[derive(Debug)]
pub struct RingProgress {
    consumer: Page,
    producer: Page,
}

impl RingProgress {
    /// Maps the two position pages of the ring buffer map `fd` (the mappings keep the
    /// map alive; `fd` may be closed afterwards).
    pub fn map(fd: BorrowedFd<'_>) -> Result<Self, RingProgressError> {
        Ok(RingProgress {
            consumer: Page::map(fd, 0)?,
            producer: Page::map(fd, 1)?,
        })
    }

    pub fn read(&self) -> Progress {
        // The producer first: a record read between the two loads then never shows as
        // read before it was written.
        let produced = self.producer.position();
        let consumed = self.consumer.position();
        Progress {
            written: produced / RECORD_STRIDE,
            read: consumed.min(produced) / RECORD_STRIDE,
        }
    }
}

/// One page of the map, mapped read-only; its first 8 bytes are the position.
#[derive(Debug)]
struct Page {
    addr: std::ptr::NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the mapping is only ever read, through atomic loads.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn map(fd: BorrowedFd<'_>, page: usize) -> Result<Self, RingProgressError> {
        // SAFETY: sysconf has no preconditions.
        let len = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let offset = libc::off_t::try_from(page * len).unwrap_or(libc::off_t::MAX);
        // SAFETY: a new shared read-only mapping of a BPF map fd; nothing else is
        // touched. The kernel allows read-only mappings of every page of a ring buffer.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(RingProgressError::Map {
                page,
                source: std::io::Error::last_os_error(),
            });
        }
        let addr = std::ptr::NonNull::new(addr).ok_or(RingProgressError::Map {
            page,
            source: std::io::Error::other("mmap returned a null address"),
        })?;
        Ok(Page { addr, len })
    }

    fn position(&self) -> u64 {
        // SAFETY: the page is mapped for as long as `self` lives, page-aligned (so the
        // u64 is aligned), and the kernel and the reader update the position with
        // atomic stores (smp_store_release).
        let atomic = unsafe { AtomicU64::from_ptr(self.addr.as_ptr().cast::<u64>()) };
        atomic.load(Ordering::Acquire)
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; nothing refers to it after.
        unsafe {
            libc::munmap(self.addr.as_ptr(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_takes_its_header_and_rounds_to_eight() {
        assert_eq!(RECORD_STRIDE % 8, 0);
        assert!(RECORD_STRIDE >= 8 + size_of::<EventRecord>() as u64);
        assert!(RECORD_STRIDE < 16 + size_of::<EventRecord>() as u64);
    }

    #[test]
    fn unread_never_underflows() {
        let p = Progress {
            written: 3,
            read: 5,
        };
        assert_eq!(p.unread(), 0);
    }
}
