//! The flow table's upkeep on a loaded object: reading the live flows out of
//! FLOW_SLOTS, evicting the least recently seen when free slots run short (what to
//! evict is `flow_table`'s), giving evicted slots back through FLOW_FREE, and flows
//! put in by hand (benchmarks, tests of a full table).

use std::os::fd::AsFd;

use aya::maps::{Array, HashMap, Map, MapData, MapError, Queue};
use aya::Ebpf;
use aya::Pod;
use roce_common::cnp::{CnpTimes, CnpWrongClass};
use roce_common::flow::{FlowSlot, FlowStats, SLOT_EVICTED, SLOT_LIVE};
use roce_common::key::{FlowKey, FlowKey4, FlowKeyMid, FlowKeyMirror, ShapedKey};
use roce_common::mirror::MirrorTag;
use roce_common::nak::NakKey;
use roce_common::names::map;
use roce_common::rtt::RttHist;

use super::{map_error, typed_map, typed_map_mut, LoadError, LoadOptions, Loaded};
use crate::datapath::batch;
use crate::datapath::flow_table::{self, FlowSlots, SlotSide};

/// The kernel memory of the flow table at `entries` flows on a host of `cpus` possible
/// CPUs: FLOWS4, FLOWS_MID and FLOWS (hash maps allocate every entry up front, plus
/// one spare a CPU), FLOWS_MIRROR's buckets (its entries come with mirrored flows),
/// FLOW_SLOTS (320 bytes a flow, shared by all CPUs), MIRROR_TAGS (24 bytes a flow),
/// TUNNEL_PORTS (8 bytes a flow) and FLOW_FREE.
/// 65,536 flows cost about 40 MB whatever the CPU count. `tests/tests/names.rs` holds this against
/// the kernel's own figure (a map's `memlock` in fdinfo).
pub fn flow_tables_kernel_bytes(entries: u32, cpus: usize) -> u64 {
    // struct htab_elem before the key (hash node, LRU node and hash), and a hash
    // bucket (list head and lock) per entry rounded up to a power of two.
    const ELEMENT_HEAD: u64 = 48;
    const BUCKET: u64 = 16;
    let n = entries as u64;
    let table = |key: usize| {
        (n + cpus as u64) * (ELEMENT_HEAD + (key as u64).next_multiple_of(8) + 8)
            + n.next_power_of_two() * BUCKET
    };
    let slots = (n * size_of::<FlowSlot>() as u64).next_multiple_of(4096);
    let tags = (n * size_of::<MirrorTag>() as u64).next_multiple_of(4096);
    let ports = (n * 8).next_multiple_of(4096);
    let free = (n + 1) * 4;
    table(size_of::<FlowKey4>())
        + table(size_of::<FlowKeyMid>())
        + table(size_of::<FlowKey>())
        // Not preallocated: its buckets; each mirrored flow adds about 170 bytes.
        + n.next_power_of_two() * BUCKET
        + slots
        + tags
        + ports
        + free
}

/// FLOW_SLOTS of `ebpf`, all its entries (an adopted table keeps the size it was
/// made with).
pub(super) fn map_slots(ebpf: &Ebpf) -> Result<FlowSlots, LoadError> {
    let Some(Map::Array(data)) = ebpf.map(map::FLOW_SLOTS) else {
        return Err(LoadError::Missing(map::FLOW_SLOTS));
    };
    let entries = data
        .info()
        .map_err(map_error(map::FLOW_SLOTS))?
        .max_entries();
    let slots = FlowSlots::new(data.fd().as_fd(), entries as usize).map_err(LoadError::Slots)?;
    let Some(Map::Array(tags)) = ebpf.map(map::MIRROR_TAGS) else {
        return Err(LoadError::Missing(map::MIRROR_TAGS));
    };
    let Some(Map::Array(ports)) = ebpf.map(map::TUNNEL_PORTS) else {
        return Err(LoadError::Missing(map::TUNNEL_PORTS));
    };
    slots
        .with_tags(tags.fd().as_fd())
        .and_then(|s| s.with_tunnel_ports(ports.fd().as_fd()))
        .map_err(LoadError::Slots)
}

impl Loaded {
    /// Every flow of the table but the mirrored ones, under its wide key (a mirrored
    /// flow is known by its key and session: [`Self::mirrored_flows`]).
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowStats)>, LoadError> {
        let mut out = Vec::new();
        self.for_each_flow(|key, stats| {
            if !key.mirrored() {
                out.push((*key, *stats));
            }
        })?;
        Ok(out)
    }

    /// Calls `f` with every live flow of FLOW_SLOTS, in slot order; returns how many
    /// there were. The array is read as memory, a mapped window at a time: no copy
    /// of the table, a syscall per 4,096 slots.
    pub fn for_each_flow(
        &self,
        mut f: impl FnMut(&FlowKey, &FlowStats),
    ) -> Result<usize, LoadError> {
        self.slots
            .for_each_live(|_, slot| f(&slot.key, &slot.stats))
            .map_err(LoadError::Slots)
    }

    /// [`Self::for_each_flow`], with the mirror session of each mirrored flow (its
    /// key has `KEY_MIRROR`; None for the others).
    pub fn for_each_flow_tagged(
        &self,
        mut f: impl FnMut(&FlowKey, &FlowStats, Option<&MirrorTag>),
    ) -> Result<usize, LoadError> {
        self.slots
            .for_each_live_beside(|_, slot, side| f(&slot.key, &slot.stats, side.tag.as_ref()))
            .map_err(LoadError::Slots)
    }

    /// [`Self::for_each_flow`], with each flow's slot index and what the kernel keeps
    /// beside its slot (a mirrored flow's session, a tunnelled flow's outer port).
    pub fn for_each_flow_indexed(
        &self,
        mut f: impl FnMut(u32, &FlowKey, &FlowStats, &SlotSide),
    ) -> Result<usize, LoadError> {
        self.slots
            .for_each_live_beside(|i, slot, side| f(i as u32, &slot.key, &slot.stats, side))
            .map_err(LoadError::Slots)
    }

    /// The round trips of the flows that have any (RTT_HIST), by slot index.
    pub fn rtt_hists(&self) -> Result<std::collections::HashMap<u32, RttHist>, LoadError> {
        self.by_slot(map::RTT_HIST)
    }

    /// The gaps the capture lost, of the mirrored flows that have any (CAPTURE_GAPS),
    /// by slot index.
    pub fn capture_gaps(&self) -> Result<std::collections::HashMap<u32, u64>, LoadError> {
        self.by_slot(map::CAPTURE_GAPS)
    }

    /// The CNPs off the policy's CNP DSCP, of the flows that have any
    /// (CNP_WRONG_CLASS), by slot index.
    pub fn cnps_wrong_class(
        &self,
    ) -> Result<std::collections::HashMap<u32, CnpWrongClass>, LoadError> {
        self.by_slot(map::CNP_WRONG_CLASS)
    }

    /// The ECN -> CNP times of the flows that carried CNPs (CNP_TIMES), by slot index.
    pub fn cnp_times(&self) -> Result<std::collections::HashMap<u32, CnpTimes>, LoadError> {
        self.by_slot(map::CNP_TIMES)
    }

    /// The entries of `name`, a hash of the flows that have one, by slot index.
    fn by_slot<V: Pod>(
        &self,
        name: &'static str,
    ) -> Result<std::collections::HashMap<u32, V>, LoadError> {
        let entries: HashMap<&MapData, u32, V> = typed_map(&self.ebpf, name)?;
        let mut out = std::collections::HashMap::new();
        for entry in entries.iter() {
            match entry {
                Ok((slot, v)) => {
                    out.insert(slot, v);
                }
                // Deleted between the key and its value: the slot was given back.
                Err(MapError::KeyNotFound) => {}
                Err(source) => return Err(map_error(name)(source)),
            }
        }
        Ok(out)
    }

    /// Every mirrored flow of the table, under its key and session.
    pub fn mirrored_flows(&self) -> Result<Vec<(FlowKeyMirror, FlowStats)>, LoadError> {
        let mut out = Vec::new();
        self.for_each_flow_tagged(|key, stats, tag| {
            if let Some(tag) = tag {
                out.push((
                    FlowKeyMirror {
                        key: *key,
                        tag: *tag,
                    },
                    *stats,
                ));
            }
        })?;
        Ok(out)
    }

    /// The FLOW_SLOTS index that FLOWS4, FLOWS_MID or FLOWS (by the key's shape) gives
    /// `key`'s flow, if it is in the table. A mirrored flow's key is
    /// [`Self::mirrored_flow_index`]'s.
    pub fn flow_index(&self, key: &FlowKey) -> Result<Option<u32>, LoadError> {
        match ShapedKey::of(key) {
            ShapedKey::Plain4(k) => self.index_in(map::FLOWS4, &k),
            ShapedKey::Mid(k) => self.index_in(map::FLOWS_MID, &k),
            ShapedKey::Wide(k) => self.index_in(map::FLOWS, &k),
        }
    }

    /// The FLOW_SLOTS index FLOWS_MIRROR gives a mirrored flow, if it is there.
    pub fn mirrored_flow_index(&self, key: &FlowKeyMirror) -> Result<Option<u32>, LoadError> {
        self.index_in(map::FLOWS_MIRROR, key)
    }

    /// The table key of the flow in slot `i`, whose wide key is `key`: for a mirrored
    /// flow with its session from MIRROR_TAGS.
    fn index_of_slot(&self, i: u32, key: &FlowKey) -> Result<Option<u32>, LoadError> {
        if !key.mirrored() {
            return self.flow_index(key);
        }
        let tag = self.read_tag(i)?;
        self.mirrored_flow_index(&FlowKeyMirror { key: *key, tag })
    }

    /// The mirror session of slot `i` (MIRROR_TAGS).
    fn read_tag(&self, i: u32) -> Result<MirrorTag, LoadError> {
        let tags: Array<&MapData, MirrorTag> = typed_map(&self.ebpf, map::MIRROR_TAGS)?;
        tags.get(&i, 0).map_err(map_error(map::MIRROR_TAGS))
    }

    /// The slot index flow table `name` holds under `key`.
    fn index_in<K: aya::Pod>(&self, name: &'static str, key: &K) -> Result<Option<u32>, LoadError> {
        let m: HashMap<&MapData, K, u64> = typed_map(&self.ebpf, name)?;
        match m.get(key, 0) {
            Ok(i) => Ok(Some(i as u32)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(map_error(name)(source)),
        }
    }

    /// Slots of the flow table (its capacity in flows).
    pub fn flow_capacity(&self) -> usize {
        self.slots.len()
    }

    /// Flows evicted by this process so far (`flow_table`: the least recently seen,
    /// when free slots ran short).
    pub fn flows_evicted_here(&self) -> u64 {
        self.evictions
    }

    /// Once a poll, after reading the flows (`live` of them): gives back the slots
    /// evicted at the last poll, then evicts the least recently seen flows if free
    /// slots run short. Returns how many flows it evicted now.
    pub fn maintain_flows(&mut self, live: usize) -> Result<usize, LoadError> {
        let waiting = std::mem::take(&mut self.evicted);
        self.give_back(&waiting)?;
        let n = flow_table::flows_to_evict(self.slots.len(), live, 0);
        if n == 0 {
            return Ok(0);
        }
        // A slot without a packet yet is a flow being made (or a program's lost race
        // for one, about to go back on FLOW_FREE): never a candidate.
        let mut candidates = Vec::with_capacity(live);
        self.slots
            .for_each_live(|i, slot| {
                if slot.stats.packets != 0 {
                    candidates.push((slot.stats.last_seen_ns, i as u32));
                }
            })
            .map_err(LoadError::Slots)?;
        let chosen: Vec<u32> = flow_table::least_recently_seen(&mut candidates, n)
            .iter()
            .map(|&(_, i)| i)
            .collect();
        for &i in &chosen {
            let mut slot = self.read_slot(i)?;
            // The key first: from then on no new packet finds the slot. A key that
            // points elsewhere (or nowhere) is not this slot's to delete: the slot was
            // left live by an agent that died mid-eviction, and is taken back all the
            // same.
            if self.index_of_slot(i, &slot.key)? == Some(i) {
                self.forget_key(i, &slot.key)?;
            }
            slot.state = SLOT_EVICTED;
            self.write_slot(i, &slot)?;
        }
        self.evictions += chosen.len() as u64;
        tracing::info!(
            evicted = chosen.len(),
            capacity = self.slots.len(),
            "flow table short of free slots: evicted the least recently seen flows"
        );
        self.evicted = chosen;
        Ok(self.evicted.len())
    }

    /// Removes `key`, the key of slot `i`, from its flow table (already gone is fine).
    fn forget_key(&mut self, i: u32, key: &FlowKey) -> Result<(), LoadError> {
        if key.mirrored() {
            let tag = self.read_tag(i)?;
            return self.remove_from(map::FLOWS_MIRROR, &FlowKeyMirror { key: *key, tag });
        }
        match ShapedKey::of(key) {
            ShapedKey::Plain4(k) => self.remove_from(map::FLOWS4, &k),
            ShapedKey::Mid(k) => self.remove_from(map::FLOWS_MID, &k),
            ShapedKey::Wide(k) => self.remove_from(map::FLOWS, &k),
        }
    }

    fn remove_from<K: aya::Pod>(&mut self, name: &'static str, key: &K) -> Result<(), LoadError> {
        let mut m: HashMap<&mut MapData, K, u64> = typed_map_mut(&mut self.ebpf, name)?;
        match m.remove(key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(map_error(name)(source)),
        }
    }

    /// Zeroes slots `indexes` and queues them on FLOW_FREE.
    pub(super) fn give_back(&mut self, indexes: &[u32]) -> Result<(), LoadError> {
        self.zero_slots(indexes)?;
        self.queue_free(indexes)
    }

    /// A copy of slot `i` of FLOW_SLOTS.
    fn read_slot(&self, i: u32) -> Result<FlowSlot, LoadError> {
        let slots: Array<&MapData, FlowSlot> = typed_map(&self.ebpf, map::FLOW_SLOTS)?;
        slots.get(&i, 0).map_err(map_error(map::FLOW_SLOTS))
    }

    /// Writes slot `i` of FLOW_SLOTS whole.
    fn write_slot(&mut self, i: u32, slot: &FlowSlot) -> Result<(), LoadError> {
        let mut slots: Array<&mut MapData, FlowSlot> =
            typed_map_mut(&mut self.ebpf, map::FLOW_SLOTS)?;
        slots.set(i, slot, 0).map_err(map_error(map::FLOW_SLOTS))
    }

    /// Zeroes slots `indexes`, and forgets their round trips, capture gaps, CNPs off
    /// class and CNP times.
    fn zero_slots(&mut self, indexes: &[u32]) -> Result<(), LoadError> {
        for &i in indexes {
            self.write_slot(i, &FlowSlot::default())?;
        }
        self.forget_slots::<RttHist>(map::RTT_HIST, indexes)?;
        self.forget_slots::<u64>(map::CAPTURE_GAPS, indexes)?;
        self.forget_slots::<CnpWrongClass>(map::CNP_WRONG_CLASS, indexes)?;
        self.forget_slots::<CnpTimes>(map::CNP_TIMES, indexes)
    }

    /// Deletes the entries of slots `indexes` from `name`, a hash by slot index.
    fn forget_slots<V: Pod>(
        &mut self,
        name: &'static str,
        indexes: &[u32],
    ) -> Result<(), LoadError> {
        let mut entries: HashMap<&mut MapData, u32, V> = typed_map_mut(&mut self.ebpf, name)?;
        // Most flows have none: only the slots that do cost a delete.
        let present: std::collections::HashSet<u32> =
            entries.keys().filter_map(Result::ok).collect();
        for i in indexes.iter().filter(|i| present.contains(i)) {
            match entries.remove(i) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                // Given back by the kernel's own delete in between.
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => return Err(map_error(name)(source)),
            }
        }
        Ok(())
    }

    /// Queues the first `count` slots of a new table (all zero) on FLOW_FREE, at
    /// most as many as there are; for a table loaded without them
    /// (`LoadOptions::queue_all_slots` false), once.
    pub fn free_first_slots(&mut self, count: usize) -> Result<(), LoadError> {
        let first: Vec<u32> = (0..count.min(self.slots.len()) as u32).collect();
        self.queue_free(&first)
    }

    /// Queues slots `indexes` (zero already) on FLOW_FREE.
    fn queue_free(&mut self, indexes: &[u32]) -> Result<(), LoadError> {
        let mut free: Queue<&mut MapData, u32> = typed_map_mut(&mut self.ebpf, map::FLOW_FREE)?;
        for &i in indexes {
            free.push(i, 0).map_err(map_error(map::FLOW_FREE))?;
        }
        Ok(())
    }

    /// Puts flows into the table from user space, as the programs would have counted
    /// them (benchmarks and tests of a full table): each takes a free slot. Flows whose
    /// key is already there (or earlier in `flows`) are skipped. Returns how many went
    /// in; when the free slots run out, those before go in and the answer is
    /// `LoadError::SlotsFull`.
    pub fn insert_flows(&mut self, flows: &[(FlowKey, FlowStats)]) -> Result<usize, LoadError> {
        let mut seen = std::collections::HashSet::with_capacity(flows.len());
        let mut new = Vec::with_capacity(flows.len());
        for (key, stats) in flows {
            if seen.insert(*key) && self.flow_index(key)?.is_none() {
                new.push((key, stats));
            }
        }
        let (mut keys4, mut index4) = (Vec::new(), Vec::new());
        let (mut keys_mid, mut index_mid) = (Vec::new(), Vec::new());
        let (mut keys, mut index) = (Vec::new(), Vec::new());
        let mut taken = Vec::with_capacity(new.len());
        {
            let mut free: Queue<&mut MapData, u32> = typed_map_mut(&mut self.ebpf, map::FLOW_FREE)?;
            while taken.len() < new.len() {
                match free.pop(0) {
                    Ok(i) => taken.push(i),
                    Err(MapError::ElementNotFound) => break,
                    Err(source) => return Err(map_error(map::FLOW_FREE)(source)),
                }
            }
        }
        let full = taken.len() < new.len();
        for (&i, (key, stats)) in taken.iter().zip(new) {
            let slot = FlowSlot {
                stats: *stats,
                key: *key,
                state: SLOT_LIVE,
                ..FlowSlot::default()
            };
            self.write_slot(i, &slot)?;
            match ShapedKey::of(key) {
                ShapedKey::Plain4(k) => (keys4.push(k), index4.push(i as u64)),
                ShapedKey::Mid(k) => (keys_mid.push(k), index_mid.push(i as u64)),
                ShapedKey::Wide(k) => (keys.push(k), index.push(i as u64)),
            };
        }
        self.update_flow_map(map::FLOWS4, &keys4, &index4)?;
        self.update_flow_map(map::FLOWS_MID, &keys_mid, &index_mid)?;
        self.update_flow_map(map::FLOWS, &keys, &index)?;
        if full {
            return Err(LoadError::SlotsFull);
        }
        Ok(keys4.len() + keys_mid.len() + keys.len())
    }

    /// Writes `keys` -> `indexes` into flow table `name` in one batch call.
    fn update_flow_map<K: aya::Pod>(
        &self,
        name: &'static str,
        keys: &[K],
        indexes: &[u64],
    ) -> Result<(), LoadError> {
        batch::update_batch(self.map_fd(name)?, keys, indexes, 1)
            .map_err(|source| LoadError::Batch { name, source })
    }

    /// Empties the flow table and zeroes STATS (tests run many cases through one load).
    pub fn reset(&mut self) -> Result<(), LoadError> {
        self.empty_flow_map::<FlowKey4>(map::FLOWS4)?;
        self.empty_flow_map::<FlowKeyMid>(map::FLOWS_MID)?;
        self.empty_flow_map::<FlowKey>(map::FLOWS)?;
        self.empty_flow_map::<FlowKeyMirror>(map::FLOWS_MIRROR)?;
        // NAKs of the flows gone wait for no go-back.
        self.empty_flow_map::<NakKey>(map::NAK_PSNS)?;
        {
            let mut waiting: Array<&mut MapData, u64> =
                typed_map_mut(&mut self.ebpf, map::NAK_WAITING)?;
            waiting.set(0, 0, 0).map_err(map_error(map::NAK_WAITING))?;
        }
        let mut used = self.slots.evicted().map_err(LoadError::Slots)?;
        self.slots
            .for_each_live(|i, _| used.push(i as u32))
            .map_err(LoadError::Slots)?;
        self.zero_slots(&used)?;
        {
            let mut free: Queue<&mut MapData, u32> = typed_map_mut(&mut self.ebpf, map::FLOW_FREE)?;
            while free.pop(0).is_ok() {}
        }
        self.evicted.clear();
        let all: Vec<u32> = (0..self.slots.len() as u32).collect();
        self.queue_free(&all)?;
        self.zero_stats()
    }

    /// Removes every entry of one flow map (or of NAK_PSNS: its values are words too).
    fn empty_flow_map<K: aya::Pod>(&mut self, name: &'static str) -> Result<(), LoadError> {
        let keys: Vec<K> = {
            let map: HashMap<&MapData, K, u64> = typed_map(&self.ebpf, name)?;
            map.keys().filter_map(Result::ok).collect()
        };
        let mut flows: HashMap<&mut MapData, K, u64> = typed_map_mut(&mut self.ebpf, name)?;
        for k in keys {
            let _ = flows.remove(&k);
        }
        Ok(())
    }

    /// Uses the sizes of adopted flow tables (they keep the size they were made with)
    /// and says so when the configuration asks for another.
    pub(super) fn warn_on_pinned_sizes(&mut self, opts: &LoadOptions) {
        let pinned = self.slots.len();
        if pinned != opts.flows_max_entries as usize {
            tracing::warn!(
                map = map::FLOW_SLOTS,
                pinned,
                configured = opts.flows_max_entries,
                "the adopted flow table keeps its size; `roce-agent detach` and a restart apply the new one (counters restart)"
            );
        }
    }
}
