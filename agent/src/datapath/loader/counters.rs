//! What the programs report: STATS (summed over CPUs), the decapsulation-side
//! counters per remote VTEP, and the EVENTS ring buffer handed to its one reader.

use aya::maps::{MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf};
use roce_common::counters::STATS_LEN;
use roce_common::names::map;
use roce_common::policy::{VtepKey, VtepStats};

use super::{map_error, typed_map, typed_map_mut, LoadError, Loaded};

impl Loaded {
    /// STATS summed over CPUs.
    pub fn stats(&self) -> Result<Vec<u64>, LoadError> {
        let stats: PerCpuArray<&MapData, u64> = typed_map(&self.ebpf, map::STATS)?;
        let mut out = vec![0u64; STATS_LEN as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let v = stats.get(&(i as u32), 0).map_err(map_error(map::STATS))?;
            *slot = v.iter().sum();
        }
        Ok(out)
    }

    /// Zeroes STATS on every CPU.
    pub(super) fn zero_stats(&mut self) -> Result<(), LoadError> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| MapError::IoError(e))
            .map_err(map_error(map::STATS))?;
        let mut stats: PerCpuArray<&mut MapData, u64> = typed_map_mut(&mut self.ebpf, map::STATS)?;
        for i in 0..STATS_LEN {
            let zeros = PerCpuValues::try_from(vec![0u64; cpus])
                .map_err(MapError::IoError)
                .map_err(map_error(map::STATS))?;
            stats.set(i, zeros, 0).map_err(map_error(map::STATS))?;
        }
        Ok(())
    }

    /// Decapsulation-side counters per remote VTEP, CPUs merged.
    pub fn vteps(&self) -> Result<Vec<(VtepKey, VtepStats)>, LoadError> {
        let vteps: PerCpuHashMap<&MapData, VtepKey, VtepStats> = typed_map(&self.ebpf, map::VTEPS)?;
        let mut out = Vec::new();
        for entry in vteps.iter() {
            let (key, per_cpu) = entry.map_err(map_error(map::VTEPS))?;
            let mut total = VtepStats::default();
            for v in per_cpu.iter() {
                total.merge(v);
            }
            out.push((key, total));
        }
        out.sort_by_key(|(k, _)| *k);
        Ok(out)
    }

    /// Empties VTEPS (tests run many cases through one load).
    pub fn reset_vteps(&mut self) -> Result<(), LoadError> {
        let keys: Vec<VtepKey> = self.vteps()?.into_iter().map(|(k, _)| k).collect();
        let mut vteps: PerCpuHashMap<&mut MapData, VtepKey, VtepStats> =
            typed_map_mut(&mut self.ebpf, map::VTEPS)?;
        for k in keys {
            let _ = vteps.remove(&k);
        }
        Ok(())
    }

    /// Takes the EVENTS ring buffer out of the object, for its one reader
    /// (`events_reader`). The programs keep writing into it; a second call finds it
    /// gone (`LoadError::Missing`).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, LoadError> {
        let map = self
            .ebpf
            .take_map(map::EVENTS)
            .ok_or(LoadError::Missing(map::EVENTS))?;
        RingBuf::try_from(map).map_err(map_error(map::EVENTS))
    }
}
