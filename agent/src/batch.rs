//! Whole per-CPU hash maps read and written a chunk of entries per syscall
//! (BPF_MAP_LOOKUP_BATCH, BPF_MAP_UPDATE_BATCH; aya 0.14 has no batch API).
//!
//! Reading a map of a million flows entry by entry costs two syscalls an entry (next
//! key, lookup) and several seconds; a batch returns thousands of keys and their
//! per-CPU values at once. The reader hands each entry to a callback while the chunk
//! is in its buffers, so memory stays bounded by the chunk, not by the map.
//!
//! Kernels without batch operations on the map (before 5.6, or a map type without
//! them) answer EINVAL or ENOTSUPP on the first call: the reader then walks the map
//! entry by entry (BPF_MAP_GET_NEXT_KEY + BPF_MAP_LOOKUP_ELEM).

use std::collections::HashSet;
use std::hash::Hash;
use std::io;
use std::mem::{size_of, size_of_val};
use std::os::fd::{AsRawFd, BorrowedFd};

/// bpf(2) commands (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// The kernel's internal "not supported" (include/linux/errno.h), which bpf(2) leaks.
const ENOTSUPP: i32 = 524;

/// Entries asked for per BPF_MAP_LOOKUP_BATCH call by default: 8192 flows of 160-byte
/// values on 2 CPUs are about 2.7 MB of buffers.
pub const DEFAULT_CHUNK: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("BPF_MAP_LOOKUP_BATCH: {0}")]
    Lookup(io::Error),
    #[error("BPF_MAP_UPDATE_BATCH after {done} of {asked} entries: {source}")]
    Update {
        done: usize,
        asked: usize,
        source: io::Error,
    },
    #[error("reading the map entry by entry: {0}")]
    PerEntry(io::Error),
    #[error("the map's values are {got} bytes, {expected} expected ({cpus} CPUs)")]
    ValueCount {
        got: usize,
        expected: usize,
        cpus: usize,
    },
}

/// `union bpf_attr` as BPF_MAP_*_BATCH reads it (`struct { ... } batch`).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM and BPF_MAP_GET_NEXT_KEY read it.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value_or_next_key: u64,
    flags: u64,
}

/// bpf(2) for the commands here, whose answer is only success or an error.
///
/// # Safety
/// As `sys::bpf`: the addresses in `attr` point at live buffers of the sizes `cmd`
/// reads or writes.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<()> {
    // SAFETY: the caller's promise, passed on.
    unsafe { crate::sys::bpf(cmd, attr) }.map(drop)
}

/// One BPF_MAP_LOOKUP_BATCH call: the raw syscall, replaceable in tests to play an old
/// kernel.
pub type LookupBatchCall = fn(&mut BatchArgs) -> io::Result<()>;

/// The arguments of one BPF_MAP_LOOKUP_BATCH call (what a [`LookupBatchCall`] sees).
pub struct BatchArgs {
    attr: BatchAttr,
}

impl BatchArgs {
    /// Entries asked for (in) or returned (out).
    pub fn count(&self) -> u32 {
        self.attr.count
    }
}

/// The real syscall.
pub fn lookup_batch_syscall(args: &mut BatchArgs) -> io::Result<()> {
    // SAFETY: only `PerCpuReader::read` makes BatchArgs (its field is private), with
    // the cursors and key/value buffers sized for `count` entries, alive for the call.
    unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut args.attr) }
}

/// How a map was read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Entries handed to the callback.
    pub entries: usize,
    /// bpf(2) calls made.
    pub calls: usize,
    /// Whether the map was read entry by entry (no batch operations).
    pub per_entry: bool,
}

/// Reads per-CPU hash maps in chunks. One reader per map kind; it remembers when the
/// kernel has no batch operations so that it does not ask again on every poll.
#[derive(Debug)]
pub struct PerCpuReader {
    chunk: usize,
    cpus: usize,
    batch_unsupported: bool,
    call: LookupBatchCall,
    /// Reused between reads: keys and values of one chunk.
    keys: Vec<u8>,
    values: Vec<u64>,
}

impl PerCpuReader {
    /// A reader of `chunk` entries per call for a machine of `cpus` possible CPUs
    /// (`aya::util::nr_cpus`: the kernel sizes per-CPU values by possible CPUs).
    pub fn new(chunk: usize, cpus: usize) -> PerCpuReader {
        PerCpuReader {
            chunk: chunk.max(1),
            cpus: cpus.max(1),
            batch_unsupported: false,
            call: lookup_batch_syscall,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// The same reader with another batch call (tests play old kernels with it).
    pub fn with_call(mut self, call: LookupBatchCall) -> PerCpuReader {
        self.call = call;
        self
    }

    /// Whether the kernel refused batch operations (then every read is per entry).
    pub fn batch_unsupported(&self) -> bool {
        self.batch_unsupported
    }

    /// Calls `f(key, per_cpu_values)` for every entry of per-CPU hash map `fd` whose
    /// keys are `K` and values `V` (`cpus` values an entry). `max_entries` bounds a
    /// per-entry walk (see [`Self::read_per_entry`]).
    ///
    /// Entries inserted or evicted while the map is read may be seen or not; none is
    /// seen twice (the batch cursor is a hash bucket, and it only moves forward).
    pub fn read<K, V>(
        &mut self,
        fd: BorrowedFd<'_>,
        max_entries: usize,
        mut f: impl FnMut(&K, &[V]),
    ) -> Result<ReadStats, BatchError>
    where
        K: aya::Pod + Eq + Hash,
        V: aya::Pod,
    {
        const {
            assert!(
                size_of::<V>().is_multiple_of(8),
                "per-CPU values are 8-byte aligned"
            )
        };
        if self.batch_unsupported {
            return self.read_per_entry(fd, max_entries, f);
        }
        let ks = size_of::<K>();
        let vs = size_of::<V>();
        let mut stats = ReadStats::default();
        let mut chunk = self.chunk;
        let mut cursor = [0u64; 2];
        let mut next = [0u64; 2];
        let mut first = true;
        loop {
            self.keys.resize(chunk * ks, 0);
            self.values.resize(chunk * self.cpus * vs / 8, 0);
            let mut args = BatchArgs {
                attr: BatchAttr {
                    in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
                    out_batch: next.as_mut_ptr() as u64,
                    keys: self.keys.as_mut_ptr() as u64,
                    values: self.values.as_mut_ptr() as u64,
                    count: chunk as u32,
                    map_fd: fd.as_raw_fd() as u32,
                    ..BatchAttr::default()
                },
            };
            let result = (self.call)(&mut args);
            stats.calls += 1;
            let got = (args.attr.count as usize).min(chunk);
            let done = match result {
                Ok(()) => got == 0, // no progress: never loop on it
                // ENOENT: the end of the map; `count` entries came with it.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
                // ENOSPC with nothing returned: one bucket holds more entries than the
                // chunk. Ask again for more, from the same bucket.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 => {
                    if chunk >= max_entries.max(self.chunk) {
                        return Err(BatchError::Lookup(e));
                    }
                    chunk = (chunk * 2).min(max_entries.max(self.chunk));
                    continue;
                }
                Err(e)
                    if first
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
                        ) =>
                {
                    tracing::info!(error = %e, "no BPF_MAP_LOOKUP_BATCH here: reading flow maps entry by entry");
                    self.batch_unsupported = true;
                    return self.read_per_entry(fd, max_entries, f);
                }
                Err(e) => return Err(BatchError::Lookup(e)),
            };
            self.deliver(got, &mut f);
            stats.entries += got;
            if done {
                return Ok(stats);
            }
            cursor = next;
            first = false;
        }
    }

    /// Hands the first `n` entries of the buffers to `f`.
    fn deliver<K: aya::Pod, V: aya::Pod>(&self, n: usize, f: &mut impl FnMut(&K, &[V])) {
        let ks = size_of::<K>();
        let per_entry = self.cpus * size_of::<V>() / 8;
        for i in 0..n {
            // SAFETY: the kernel wrote `n` keys of `ks` bytes (K is Pod: any bytes are
            // a valid K); read_unaligned because the byte buffer has no K alignment.
            let key: K = unsafe { std::ptr::read_unaligned(self.keys.as_ptr().add(i * ks).cast()) };
            let words = &self.values[i * per_entry..(i + 1) * per_entry];
            // SAFETY: `words` holds `cpus` values of V back to back (V's size is a
            // multiple of 8, so no padding between them), 8-byte aligned (u64
            // storage), and V is Pod.
            let values: &[V] =
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), self.cpus) };
            f(&key, values);
        }
    }

    /// The per-entry walk of kernels without batch operations: next key, then its
    /// values. A key deleted under the walk makes the kernel start again from the first
    /// key, so keys already seen are skipped, and the walk stops after twice
    /// `max_entries` steps: it ends even when the map changes all the time, and under
    /// heavy churn it may end before the last entries.
    pub fn read_per_entry<K, V>(
        &mut self,
        fd: BorrowedFd<'_>,
        max_entries: usize,
        mut f: impl FnMut(&K, &[V]),
    ) -> Result<ReadStats, BatchError>
    where
        K: aya::Pod + Eq + Hash,
        V: aya::Pod,
    {
        let mut stats = ReadStats {
            per_entry: true,
            ..ReadStats::default()
        };
        let mut seen: HashSet<K> = HashSet::new();
        let mut values: Vec<V> = Vec::with_capacity(self.cpus);
        // SAFETY: V is Pod: all-zero bytes are a valid V.
        values.resize(self.cpus, unsafe { std::mem::zeroed() });
        let mut key: Option<K> = None;
        // SAFETY: as above, for K.
        let mut next: K = unsafe { std::mem::zeroed() };
        for _ in 0..max_entries.saturating_mul(2).max(16) {
            let mut attr = ElemAttr {
                map_fd: fd.as_raw_fd() as u32,
                key: key.as_ref().map_or(0, |k| k as *const K as u64),
                value_or_next_key: &mut next as *mut K as u64,
                ..ElemAttr::default()
            };
            stats.calls += 1;
            // SAFETY: `key` (when set) and `next` are K-sized values alive for the call.
            match unsafe { bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(stats),
                Err(e) => return Err(BatchError::PerEntry(e)),
            }
            key = Some(next);
            if seen.contains(&next) {
                continue; // the walk started again after a deletion
            }
            let mut attr = ElemAttr {
                map_fd: fd.as_raw_fd() as u32,
                key: &next as *const K as u64,
                value_or_next_key: values.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            stats.calls += 1;
            // SAFETY: `next` is a K; `values` holds `cpus` values of V, as a per-CPU
            // map's lookup writes.
            match unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
                Ok(()) => {}
                // Evicted between the two calls: it is gone, nothing to report.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(BatchError::PerEntry(e)),
            }
            seen.insert(next);
            stats.entries += 1;
            f(&next, &values);
            if seen.len() >= max_entries {
                break;
            }
        }
        Ok(stats)
    }
}

/// Writes `keys.len()` entries into per-CPU hash map `fd` in one BPF_MAP_UPDATE_BATCH
/// call: `values` holds `cpus` values per key, key after key. For tests and benchmarks
/// that fill a flow table faster than packets could.
pub fn update_percpu_batch<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
    cpus: usize,
) -> Result<(), BatchError> {
    const {
        assert!(
            size_of::<V>().is_multiple_of(8),
            "per-CPU values are 8-byte aligned"
        )
    };
    if values.len() != keys.len() * cpus {
        return Err(BatchError::ValueCount {
            got: size_of_val(values),
            expected: keys.len() * cpus * size_of::<V>(),
            cpus,
        });
    }
    let mut done = 0;
    while done < keys.len() {
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done * cpus..].as_ptr() as u64,
            count: (keys.len() - done) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: from `done` on, `keys` holds `count` keys and `values` `count * cpus`
        // values (checked above); the kernel only reads them.
        let r = unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) };
        // `count` says how many entries went in, also on error.
        done += attr.count as usize;
        if let Err(source) = r {
            return Err(BatchError::Update {
                done,
                asked: keys.len(),
                source,
            });
        }
        if attr.count == 0 {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Against real maps: the agent's own FLOWS4 and FLOWS (needs root, as the other
    //! tests that load the object).
    use super::*;
    use crate::loader::{self, LoadOptions, Loaded};
    use roce_common::flow::{FlowKey, FlowKey4, FlowStats};
    use roce_common::names::map;
    use std::collections::HashMap;
    use std::os::fd::AsFd;

    fn cpus() -> usize {
        aya::util::nr_cpus().expect("possible CPUs")
    }

    fn load(max: u32) -> Loaded {
        loader::load(&LoadOptions {
            flows_max_entries: max,
            ..LoadOptions::default()
        })
        .expect("loading the object (root needed)")
    }

    fn key(i: u32) -> FlowKey4 {
        FlowKey4 {
            src: i,
            dst: !i,
            qp_dir: i & 0xFF_FFFF,
            ifindex: 1,
        }
    }

    /// Per-CPU values of entry `i`: each CPU's packets say which entry and CPU they are.
    fn values(i: u32, cpus: usize) -> Vec<FlowStats> {
        (0..cpus as u64)
            .map(|c| FlowStats {
                packets: i as u64 * 100 + c,
                last_dscp: c as u8,
                ..FlowStats::default()
            })
            .collect()
    }

    fn fill(loaded: &Loaded, range: std::ops::Range<u32>) {
        let cpus = cpus();
        let keys: Vec<FlowKey4> = range.clone().map(key).collect();
        let vals: Vec<FlowStats> = range.flat_map(|i| values(i, cpus)).collect();
        update_percpu_batch(loaded.map_fd(map::FLOWS4).unwrap(), &keys, &vals, cpus).unwrap();
    }

    /// Reads FLOWS4 into key -> per-CPU values, failing on any key seen twice.
    fn read_all(
        reader: &mut PerCpuReader,
        fd: BorrowedFd<'_>,
        max: usize,
    ) -> (HashMap<u32, Vec<FlowStats>>, ReadStats) {
        let mut out = HashMap::new();
        let stats = reader
            .read::<FlowKey4, FlowStats>(fd, max, |k, v| {
                assert!(
                    out.insert(k.src, v.to_vec()).is_none(),
                    "key {} seen twice",
                    k.src
                );
            })
            .unwrap();
        (out, stats)
    }

    #[test]
    fn an_empty_map_reads_as_nothing_in_one_call() {
        let loaded = load(1024);
        let mut reader = PerCpuReader::new(64, cpus());
        for name in [map::FLOWS4, map::FLOWS] {
            let fd = loaded.map_fd(name).unwrap();
            let stats = if name == map::FLOWS4 {
                reader
                    .read::<FlowKey4, FlowStats>(fd, 1024, |_, _| panic!("an entry"))
                    .unwrap()
            } else {
                reader
                    .read::<FlowKey, FlowStats>(fd, 1024, |_, _| panic!("an entry"))
                    .unwrap()
            };
            assert_eq!(
                (stats.entries, stats.calls, stats.per_entry),
                (0, 1, false),
                "{name}"
            );
        }
    }

    #[test]
    fn every_entry_is_read_once_with_each_cpus_values_whatever_the_chunk() {
        let loaded = load(8192);
        fill(&loaded, 0..5000);
        let fd = loaded.map_fd(map::FLOWS4).unwrap();
        // A chunk of 1 is smaller than many buckets: the kernel answers ENOSPC and the
        // reader asks again for more.
        for chunk in [1, 7, 256, 8192] {
            let mut reader = PerCpuReader::new(chunk, cpus());
            let (got, stats) = read_all(&mut reader, fd, 8192);
            assert_eq!(got.len(), 5000, "chunk {chunk}");
            for (i, v) in &got {
                assert_eq!(v, &values(*i, cpus()), "entry {i}, chunk {chunk}");
            }
            assert!(!stats.per_entry);
            if chunk == 256 {
                assert!(stats.calls >= 5000 / 256, "{stats:?}");
            }
        }
    }

    fn playing_an_old_kernel(_: &mut BatchArgs) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    #[test]
    fn a_kernel_without_batch_lookups_is_read_entry_by_entry() {
        let loaded = load(4096);
        fill(&loaded, 0..1500);
        let fd = loaded.map_fd(map::FLOWS4).unwrap();
        let mut reader = PerCpuReader::new(256, cpus()).with_call(playing_an_old_kernel);
        for round in 0..2 {
            let (got, stats) = read_all(&mut reader, fd, 4096);
            assert_eq!(got.len(), 1500, "round {round}");
            assert!(got.iter().all(|(i, v)| *v == values(*i, cpus())));
            assert!(stats.per_entry && reader.batch_unsupported(), "{stats:?}");
            // Two syscalls an entry, and one to find the end.
            assert_eq!(stats.calls, 2 * 1500 + 1, "round {round}");
        }
    }

    fn no_space(args: &mut BatchArgs) -> io::Result<()> {
        args.attr.count = 0;
        Err(io::Error::from_raw_os_error(libc::ENOSPC))
    }

    #[test]
    fn enospc_that_never_ends_is_an_error_not_a_loop() {
        let loaded = load(1024);
        fill(&loaded, 0..10);
        let mut reader = PerCpuReader::new(4, cpus()).with_call(no_space);
        let e = reader
            .read::<FlowKey4, FlowStats>(loaded.map_fd(map::FLOWS4).unwrap(), 1024, |_, _| {})
            .unwrap_err();
        assert!(matches!(e, BatchError::Lookup(_)), "{e}");
        assert!(!reader.batch_unsupported());
    }

    fn delete(fd: BorrowedFd<'_>, k: &FlowKey4) {
        let mut attr = ElemAttr {
            map_fd: fd.as_raw_fd() as u32,
            key: k as *const FlowKey4 as u64,
            ..ElemAttr::default()
        };
        // BPF_MAP_DELETE_ELEM; ENOENT when already gone is fine.
        // SAFETY: `key` points at `k`, alive for the call; the kernel only reads it.
        let _ = unsafe { bpf(3, &mut attr) };
    }

    /// Sets the flag when dropped: a failed assertion stops the churn thread, so that
    /// the scope ends and the test fails instead of hanging.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_map_that_changes_while_read_is_read_to_its_end_each_key_once() {
        let loaded = load(16384);
        // 0..1000 stay; 1000..3000 are deleted and inserted again all the time.
        fill(&loaded, 0..3000);
        let fd = loaded.map_fd(map::FLOWS4).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        // Stable keys each batch read missed (LRU may evict one: see below).
        let mut missed = std::collections::BTreeSet::new();
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            s.spawn(|| {
                let fd = fd.as_fd();
                let cpus = cpus();
                let mut round = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for i in 1000..3000 {
                        if (i + round).is_multiple_of(3) {
                            delete(fd, &key(i));
                        } else {
                            let _ = update_percpu_batch(fd, &[key(i)], &values(i, cpus), cpus);
                        }
                    }
                    round += 1;
                }
            });
            for chunk in [3, 64] {
                for per_entry in [false, true] {
                    let mut reader = PerCpuReader::new(chunk, cpus());
                    if per_entry {
                        reader = reader.with_call(playing_an_old_kernel);
                    }
                    for _ in 0..10 {
                        // Ends; no key twice (read_all); every value the right one.
                        let (got, _) = read_all(&mut reader, fd, 16384);
                        assert!(got.len() <= 3000);
                        assert!(got.iter().all(|(i, v)| *v == values(*i, cpus())));
                        // A walk entry by entry starts again after each deletion under
                        // it and is bounded, so it may end before the last entries; a
                        // batch read walks buckets and misses no entry that stays.
                        if !per_entry {
                            missed.extend((0..1000).filter(|i| !got.contains_key(i)));
                        }
                    }
                }
            }
        });
        // The LRU map may evict an entry before it is full (free nodes cached per
        // CPU): a stable key a read missed must be gone for good, never back.
        let (now, _) = read_all(&mut PerCpuReader::new(64, cpus()), fd, 16384);
        let back: Vec<_> = missed.iter().filter(|i| now.contains_key(i)).collect();
        assert!(
            back.is_empty(),
            "batch reads missed keys that stayed: {back:?}"
        );
    }

    #[test]
    fn an_update_with_the_wrong_number_of_values_is_refused() {
        let loaded = load(1024);
        let e = update_percpu_batch(
            loaded.map_fd(map::FLOWS4).unwrap(),
            &[key(1), key(2)],
            &values(1, cpus()),
            cpus(),
        )
        .unwrap_err();
        assert!(matches!(e, BatchError::ValueCount { .. }), "{e}");
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::loader::{self, LoadOptions};
    use roce_common::flow::{FlowKey4, FlowStats};
    use roce_common::names::map;

    /// Not a test of correctness: how long reading a large FLOWS4 takes per chunk size
    /// (`cargo test -p roce-agent --release --lib batch_read_time -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn batch_read_time_of_a_large_map() {
        let cpus = aya::util::nr_cpus().unwrap();
        for (n, max) in [
            (500_000u32, 1u32 << 20),
            (50_000, 1 << 16),
            (5_000, 1 << 13),
        ] {
            let loaded = loader::load(&LoadOptions {
                flows_max_entries: max,
                ..LoadOptions::default()
            })
            .unwrap();
            let fd = loaded.map_fd(map::FLOWS4).unwrap();
            for start in (0..n).step_by(8192) {
                let end = (start + 8192).min(n);
                let keys: Vec<FlowKey4> = (start..end)
                    .map(|i| FlowKey4 {
                        src: i,
                        dst: 7,
                        qp_dir: i,
                        ifindex: 1,
                    })
                    .collect();
                let vals = vec![
                    FlowStats {
                        packets: 1,
                        ..FlowStats::default()
                    };
                    keys.len() * cpus
                ];
                update_percpu_batch(fd, &keys, &vals, cpus).unwrap();
            }
            for chunk in [256, 8192, 65536] {
                let mut reader = PerCpuReader::new(chunk, cpus);
                let t = std::time::Instant::now();
                let mut count = 0;
                let stats = reader
                    .read::<FlowKey4, FlowStats>(fd, max as usize, |_, _| count += 1)
                    .unwrap();
                println!(
                    "{n} entries in a map of {max}: chunk {chunk}: {:?}, {} calls, {count}",
                    t.elapsed(),
                    stats.calls
                );
            }
        }
    }
}
