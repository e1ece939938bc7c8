//! Hash map entries written a chunk per syscall (BPF_MAP_UPDATE_BATCH; aya 0.14 has no
//! batch API): `Loaded::insert_flows` puts a million flow keys into FLOWS4, FLOWS_MID and FLOWS
//! in about a second, where one syscall an entry takes several.

use std::io;
use std::mem::{size_of, size_of_val};
use std::os::fd::{AsRawFd, BorrowedFd};

/// bpf(2) command (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("BPF_MAP_UPDATE_BATCH after {done} of {asked} entries: {source}")]
    Update {
        done: usize,
        asked: usize,
        source: io::Error,
    },
    #[error("the map's values are {got} bytes, {expected} expected ({per_key} a key)")]
    ValueCount {
        got: usize,
        expected: usize,
        per_key: usize,
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

/// Writes `keys.len()` entries into hash map `fd`: `values` holds `per_key` values a
/// key, key after key (1 for a plain hash map, the possible CPUs for a per-CPU one,
/// whose values are then 8-byte aligned).
pub fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
    per_key: usize,
) -> Result<(), BatchError> {
    const {
        assert!(
            size_of::<V>().is_multiple_of(8),
            "batch values are whole words"
        )
    };
    if values.len() != keys.len() * per_key {
        return Err(BatchError::ValueCount {
            got: size_of_val(values),
            expected: keys.len() * per_key * size_of::<V>(),
            per_key,
        });
    }
    let mut done = 0;
    while done < keys.len() {
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done * per_key..].as_ptr() as u64,
            count: (keys.len() - done) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: from `done` on, `keys` holds `count` keys and `values` `count *
        // per_key` values (checked above); the kernel only reads them.
        let r = unsafe { crate::sys::bpf(BPF_MAP_UPDATE_BATCH, &mut attr) };
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
    //! Against the agent's own FLOWS4 (needs root, as the other tests that load the
    //! object).
    use super::*;
    use crate::datapath::loader::{self, LoadOptions};
    use roce_common::key::FlowKey4;
    use roce_common::names::map;

    fn key(i: u32) -> FlowKey4 {
        FlowKey4 {
            src: i,
            dst: !i,
            qp_dir: i & 0xFF_FFFF,
            ifindex: 1,
        }
    }

    #[test]
    fn every_entry_goes_in_and_a_wrong_number_of_values_is_refused() {
        let loaded = loader::load(&LoadOptions {
            flows_max_entries: 1024,
            ..LoadOptions::default()
        })
        .expect("loading the object (root needed)");
        let fd = loaded.map_fd(map::FLOWS4).unwrap();
        let keys: Vec<FlowKey4> = (0..1000).map(key).collect();
        let values: Vec<u64> = (0..1000).collect();
        update_batch(fd, &keys, &values, 1).expect("batch update");
        for i in [0u32, 1, 500, 999] {
            assert_eq!(loaded.flow_index(&key(i).widen()).unwrap(), Some(i));
        }
        assert_eq!(loaded.flow_index(&key(1000).widen()).unwrap(), None);
        let e = update_batch(fd, &[key(1), key(2)], &[7u64], 1).unwrap_err();
        assert!(matches!(e, BatchError::ValueCount { .. }), "{e}");
        // More than the map holds: the kernel stops at the limit and says how far.
        let more: Vec<FlowKey4> = (1000..1100).map(key).collect();
        let e = update_batch(fd, &more, &[0u64; 100], 1).unwrap_err();
        assert!(
            matches!(e, BatchError::Update { done, asked: 100, .. } if (24..100).contains(&done)),
            "{e}"
        );
    }
}
