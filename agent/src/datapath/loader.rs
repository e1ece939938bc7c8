//! Loading the kernel object, writing CONFIG, QOS and POLICY (a generation at a
//! time), attaching XDP, and reading the flow table and STATS (the EVENTS ring buffer is taken out
//! by `events_reader`). Loading, attaching and reading are separate steps.
//!
//! Without a pin directory the links detach when dropped. With one (`pin::PinDir`)
//! maps, programs and links are pinned there: a load reuses the pinned maps, and an
//! attach to an interface that already has a pinned link swaps the program inside
//! that link atomically, so the datapath never pauses across agent restarts.

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{
    Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues, ProgramArray,
    Queue, RingBuf,
};
use aya::programs::links::FdLink;
use aya::programs::xdp::XdpLinkId;
use aya::programs::{Program, ProgramError, SchedClassifier, Xdp, XdpMode};
use aya::Ebpf;
use roce_common::config::{Generation, RuntimeConfig, GENERATIONS, LAYOUT_VERSION};
use roce_common::counters::STATS_LEN;
use roce_common::event::EVENTS_RING_BYTES;
use roce_common::flow::{FlowSlot, FlowStats};
use roce_common::flow::{SLOT_EVICTED, SLOT_LIVE};
use roce_common::key::{FlowKey, FlowKey4, FlowKeyMid, ShapedKey};
use roce_common::policy::{
    DscpEntry, IfaceQos, Policy, QosConfig, VtepKey, VtepStats, DSCP_COUNT, IFACE_DIRECT,
};

use crate::config::Settings;
use crate::datapath::batch;
use crate::datapath::flow_table::{self, FlowSlots};
use crate::datapath::pin::{self, PinDir, PinError};
use roce_common::names::map;
pub use roce_common::names::program::{
    TC_BASELINE, TC_EGRESS, TC_EGRESS_FLOWS, TC_INGRESS, XDP_BASELINE, XDP_CLASSIFY as XDP_PROGRAM,
};
use roce_common::names::tail::TC_TAIL_EGRESS_FLOWS;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed (are you root, with CAP_BPF and CAP_NET_ADMIN?): {0}")]
    Object(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    #[error("duplicating the file descriptor of {name}: {source}")]
    Fd {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("interface {0} does not exist")]
    NoInterface(String),
    #[error("reading map {name}: {source}")]
    Batch {
        name: &'static str,
        source: crate::datapath::batch::BatchError,
    },
    #[error("counting the possible CPUs ({what}): {source}")]
    Cpus {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("FLOW_SLOTS: {0}")]
    Slots(std::io::Error),
    #[error("the flow table has no free slot for a flow made by hand")]
    SlotsFull,
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error("pinning {what} at {path}: {source}")]
    Pinning {
        what: &'static str,
        path: std::path::PathBuf,
        source: aya::pin::PinError,
    },
    #[error("{what}: {source}")]
    Link {
        what: String,
        source: std::io::Error,
    },
}

/// What to load: map sizes and the runtime configuration the programs read.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    pub flows_max_entries: u32,
    pub config: RuntimeConfig,
    /// Bytes of the EVENTS ring buffer: a power of two, a whole number of pages.
    pub events_ring_bytes: u32,
    /// Loads `tc_egress_flows` into TC_TAIL (egress flows). False loads the classifier
    /// alone, all `analyze` runs: the verifier takes 0.13-0.16 s over `tc_egress_flows`
    /// (it took 0.6-0.7 s when the program was larger).
    pub egress_flows: bool,
    /// Queues every slot of a new flow table on FLOW_FREE at load, one syscall a slot
    /// (about 30 ms at 65,536). False leaves FLOW_FREE empty for the caller to fill
    /// with [`Loaded::free_first_slots`]: `analyze`'s kernel engine, which knows from
    /// its first pass how many flows the capture holds, queues that many.
    pub queue_all_slots: bool,
}

impl LoadOptions {
    /// What a configured agent loads: its flow table size and runtime configuration.
    pub fn for_settings(settings: &Settings) -> Self {
        LoadOptions {
            flows_max_entries: settings.flows_map_size,
            config: settings.runtime_config(),
            ..LoadOptions::default()
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flows_max_entries: 65536,
            config: RuntimeConfig::default(),
            events_ring_bytes: EVENTS_RING_BYTES,
            egress_flows: true,
            queue_all_slots: true,
        }
    }
}

/// The kernel memory of the flow table at `entries` flows on a host of `cpus` possible
/// CPUs: FLOWS4, FLOWS_MID and FLOWS (hash maps allocate every entry up front, plus
/// one spare a CPU), FLOW_SLOTS (256 bytes a flow, shared by all CPUs) and FLOW_FREE.
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
    let free = (n + 1) * 4;
    table(size_of::<FlowKey4>())
        + table(size_of::<FlowKeyMid>())
        + table(size_of::<FlowKey>())
        + slots
        + free
}

/// How an XDP program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    Native,
    Generic,
    /// A pinned link of an earlier agent now runs this program (its mode unchanged).
    Adopted,
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Adopted => "adopted",
        })
    }
}

/// `LoadError::Map` for map `name` (a `map_err` argument).
fn map_error(name: &'static str) -> impl Fn(MapError) -> LoadError {
    move |source| LoadError::Map { name, source }
}

/// `LoadError::Program` for program `name` (a `map_err` argument).
fn program_error(name: &'static str) -> impl Fn(ProgramError) -> LoadError {
    move |source| LoadError::Program { name, source }
}

/// Map `name` of `ebpf` as the typed map `T` (e.g. `PerCpuArray<&MapData, u64>`).
fn typed_map<'a, T>(ebpf: &'a Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<&'a Map, Error = MapError>,
{
    let map = ebpf.map(name).ok_or(LoadError::Missing(name))?;
    T::try_from(map).map_err(map_error(name))
}

/// Map `name` of `ebpf` as the writable typed map `T`.
fn typed_map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<&'a mut Map, Error = MapError>,
{
    let map = ebpf.map_mut(name).ok_or(LoadError::Missing(name))?;
    T::try_from(map).map_err(map_error(name))
}

/// Program `name` of `ebpf` as its type (`&Xdp`, `&SchedClassifier`).
fn typed_program<'a, T>(ebpf: &'a Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<&'a Program, Error = ProgramError>,
{
    let prog = ebpf.program(name).ok_or(LoadError::Missing(name))?;
    T::try_from(prog).map_err(program_error(name))
}

/// Program `name` of `ebpf` as its mutable type (`&mut Xdp`, `&mut SchedClassifier`).
fn typed_program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, LoadError>
where
    T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or(LoadError::Missing(name))?;
    T::try_from(prog).map_err(program_error(name))
}

/// The loaded kernel programs and maps.
pub struct Loaded {
    ebpf: Ebpf,
    /// XDP links this process owns (unpinned: they detach with it).
    attached: Vec<(String, XdpLinkId)>,
    /// Where maps, programs and links are pinned (None: nothing is).
    pins: Option<PinDir>,
    /// FLOW_SLOTS, read through mapped windows.
    slots: FlowSlots,
    /// Slots of flows evicted at the last poll: given back at the next
    /// (`flow_table`).
    evicted: Vec<u32>,
    /// Flows evicted by this process, in all.
    evictions: u64,
}

/// Loads the object built from `ebpf/`, writes CONFIG, loads `xdp_classify` (not
/// attached yet) and, unless `opts.egress_flows` is false, `tc_egress_flows` (never
/// attached: `tc_egress` tail-calls it through TC_TAIL, filled here). Nothing is pinned.
pub fn load(opts: &LoadOptions) -> Result<Loaded, LoadError> {
    load_into(opts, None)
}

/// As [`load`], with every map pinned under `pins` (the pinned ones reused: their
/// counters go on), and every program pinned there too. Refuses maps of another
/// layout version.
pub fn load_pinned(opts: &LoadOptions, pins: PinDir) -> Result<Loaded, LoadError> {
    load_into(opts, Some(pins))
}

fn load_into(opts: &LoadOptions, pins: Option<PinDir>) -> Result<Loaded, LoadError> {
    let adopted = match &pins {
        Some(p) => p.check_layout()?.is_some(),
        None => false,
    };
    let mut loader = aya::EbpfLoader::new();
    loader
        .map_max_entries(map::FLOWS, opts.flows_max_entries)
        .map_max_entries(map::FLOWS4, opts.flows_max_entries)
        .map_max_entries(map::FLOWS_MID, opts.flows_max_entries)
        .map_max_entries(map::FLOW_SLOTS, opts.flows_max_entries)
        .map_max_entries(map::FLOW_FREE, opts.flows_max_entries)
        .map_max_entries(map::EVENTS, opts.events_ring_bytes);
    if let Some(p) = &pins {
        for name in map::ALL {
            loader.map_pin_path(name, p.map(name));
        }
    }
    let mut ebpf = loader.load(crate::EBPF_OBJECT)?;
    let prog: &mut Xdp = typed_program_mut(&mut ebpf, XDP_PROGRAM)?;
    prog.load().map_err(program_error(XDP_PROGRAM))?;
    // A pinned datapath always has it: `pin_programs` pins it, and an adopted
    // `tc_egress` tail-calls it.
    if opts.egress_flows || pins.is_some() {
        let flows: &mut SchedClassifier = typed_program_mut(&mut ebpf, TC_EGRESS_FLOWS)?;
        flows.load().map_err(program_error(TC_EGRESS_FLOWS))?;
        set_egress_flows_slot(&mut ebpf, true)?;
    }
    let slots = map_slots(&ebpf)?;
    let mut loaded = Loaded {
        ebpf,
        attached: Vec::new(),
        pins,
        slots,
        evicted: Vec::new(),
        evictions: 0,
    };
    if adopted {
        loaded.warn_on_pinned_sizes(opts);
        // An earlier agent's evicted slots: long enough ago to give back now.
        let waiting = loaded.slots.evicted().map_err(LoadError::Slots)?;
        loaded.give_back(&waiting)?;
    } else if opts.queue_all_slots {
        // A new table: every slot is free (and zero).
        loaded.free_first_slots(loaded.slots.len())?;
    }
    // The policy in force stays (an adopted datapath keeps enforcing it) until the
    // caller commits its own; a fresh one starts with an empty policy.
    let policy = loaded.active()?;
    loaded.commit(&opts.config, &policy)?;
    if loaded.pins.is_some() {
        loaded.pin_programs()?;
    }
    Ok(loaded)
}

/// FLOW_SLOTS of `ebpf`, all its entries (an adopted table keeps the size it was
/// made with).
fn map_slots(ebpf: &Ebpf) -> Result<FlowSlots, LoadError> {
    let Some(Map::Array(data)) = ebpf.map(map::FLOW_SLOTS) else {
        return Err(LoadError::Missing(map::FLOW_SLOTS));
    };
    let entries = data
        .info()
        .map_err(map_error(map::FLOW_SLOTS))?
        .max_entries();
    FlowSlots::new(data.fd().as_fd(), entries as usize).map_err(LoadError::Slots)
}

/// Fills TC_TAIL's `tc_egress_flows` slot with the loaded program (`on`), or empties it.
fn set_egress_flows_slot(ebpf: &mut Ebpf, on: bool) -> Result<(), LoadError> {
    let flows_fd = if on {
        let prog: &SchedClassifier = typed_program(ebpf, TC_EGRESS_FLOWS)?;
        let fd = prog.fd().map_err(program_error(TC_EGRESS_FLOWS))?;
        Some(fd.try_clone().map_err(|source| LoadError::Fd {
            name: TC_EGRESS_FLOWS,
            source,
        })?)
    } else {
        None
    };
    let mut tail: ProgramArray<&mut MapData> = typed_map_mut(ebpf, map::TC_TAIL)?;
    match flows_fd {
        Some(fd) => tail.set(TC_TAIL_EGRESS_FLOWS, &fd, 0),
        None => match tail.clear_index(&TC_TAIL_EGRESS_FLOWS) {
            Err(MapError::KeyNotFound) => Ok(()),
            other => other,
        },
    }
    .map_err(map_error(map::TC_TAIL))
}

impl Loaded {
    fn xdp(&mut self) -> Result<&mut Xdp, LoadError> {
        typed_program_mut(&mut self.ebpf, XDP_PROGRAM)
    }

    /// The loaded XDP program, for BPF_PROG_TEST_RUN.
    pub fn xdp_fd(&self) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &Xdp = typed_program(&self.ebpf, XDP_PROGRAM)?;
        Ok(prog.fd().map_err(program_error(XDP_PROGRAM))?.as_fd())
    }

    /// Loads the empty baseline program (benchmarks) and returns its fd.
    pub fn baseline_xdp_fd(&mut self) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, XDP_BASELINE)?;
        if prog.fd().is_err() {
            prog.load().map_err(program_error(XDP_BASELINE))?;
        }
        Ok(prog.fd().map_err(program_error(XDP_BASELINE))?.as_fd())
    }

    /// Attaches `xdp_classify` to `ifname`: native mode, or generic mode when the
    /// driver has no native XDP. With pins: a link pinned for this interface gets the
    /// new program in place (no packet goes unclassified); a new link is pinned.
    pub fn attach_xdp(&mut self, ifname: &str) -> Result<AttachMode, LoadError> {
        let Some(ifindex) = crate::sys::netif::index_of(ifname) else {
            return Err(LoadError::NoInterface(ifname.to_string()));
        };
        if self.adopt_link(XDP_PROGRAM, ifindex)? {
            return Ok(AttachMode::Adopted);
        }
        let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, XDP_PROGRAM)?;
        let (link, mode) = match prog.attach(ifname, XdpMode::Driver) {
            Ok(link) => (link, AttachMode::Native),
            Err(native) => {
                tracing::info!(interface = ifname, error = %native, "native XDP refused, falling back to generic mode");
                let link = prog
                    .attach(ifname, XdpMode::Skb)
                    .map_err(program_error(XDP_PROGRAM))?;
                (link, AttachMode::Generic)
            }
        };
        if self.pins.is_some() {
            let owned = prog.take_link(link).map_err(program_error(XDP_PROGRAM))?;
            self.pin_link(XDP_PROGRAM, ifindex, owned)?;
        } else {
            self.attached.push((ifname.to_string(), link));
        }
        Ok(mode)
    }

    /// With pins, when `program` has a live pinned link on `ifindex`: swaps the
    /// program inside it (BPF_LINK_UPDATE, atomic) and says true.
    pub fn adopt_link(&self, program: &'static str, ifindex: u32) -> Result<bool, LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(false);
        };
        let Some(link) = pins.live_link(program, ifindex)? else {
            return Ok(false);
        };
        let prog = self
            .ebpf
            .program(program)
            .ok_or(LoadError::Missing(program))?;
        let prog_fd = prog.fd().map_err(program_error(program))?;
        pin::link_update(link.as_fd(), prog_fd.as_fd()).map_err(|source| LoadError::Link {
            what: format!("updating the pinned link of {program} on ifindex {ifindex}"),
            source,
        })?;
        Ok(true)
    }

    /// Pins `link`, just made for `program` on `ifindex` (an XDP or a TCX link): it
    /// outlives this process from now on. Without pins it is dropped, and detaches.
    pub fn pin_link<L>(&self, program: &'static str, ifindex: u32, link: L) -> Result<(), LoadError>
    where
        FdLink: TryFrom<L, Error = aya::programs::links::LinkError>,
    {
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        let link = FdLink::try_from(link).map_err(|e| LoadError::Link {
            what: format!("the link of {program} on ifindex {ifindex} is not a bpf_link"),
            source: std::io::Error::other(e),
        })?;
        let path = pins.link(program, ifindex);
        link.pin(&path).map_err(|source| LoadError::Pinning {
            what: program,
            path,
            source,
        })?;
        Ok(())
    }

    /// Whether maps, programs and links are pinned.
    pub fn pinned(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    /// Detaches and unpins every pinned link that is not in `keep` (program,
    /// ifindex): interfaces that left the configuration, or went away. Returns what
    /// it removed.
    pub fn prune_links(&self, keep: &[(&str, u32)]) -> Result<Vec<String>, LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for l in pins.pinned_links()? {
            let wanted = keep
                .iter()
                .any(|(p, i)| *p == l.program && *i == l.ifindex && *i != 0);
            if !wanted {
                pin::remove_link(&l.path, l.fd.as_fd())?;
                removed.push(l.path.display().to_string());
            }
        }
        Ok(removed)
    }

    /// Loads the attachable programs and pins them (replacing an earlier agent's
    /// pins: its links keep the old programs until they are swapped).
    fn pin_programs(&mut self) -> Result<(), LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        let paths: Vec<(&'static str, std::path::PathBuf)> =
            [XDP_PROGRAM, TC_EGRESS, TC_EGRESS_FLOWS, TC_INGRESS]
                .into_iter()
                .map(|n| (n, pins.program(n)))
                .collect();
        self.tc_fd(TC_EGRESS)?;
        self.tc_fd(TC_INGRESS)?;
        for (name, path) in paths {
            if path.exists() {
                std::fs::remove_file(&path).map_err(|source| LoadError::Link {
                    what: format!("removing the old pin {}", path.display()),
                    source,
                })?;
            }
            let prog = self
                .ebpf
                .program_mut(name)
                .ok_or(LoadError::Missing(name))?;
            prog.pin(&path).map_err(|source| LoadError::Pinning {
                what: name,
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Uses the sizes of adopted flow tables (they keep the size they were made with)
    /// and says so when the configuration asks for another.
    fn warn_on_pinned_sizes(&mut self, opts: &LoadOptions) {
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

    /// Detaches the XDP link this process made on `ifname` (a pinned one stays: the
    /// caller prunes pins).
    pub fn detach_xdp(&mut self, ifname: &str) {
        let Some(at) = self.attached.iter().position(|(n, _)| n == ifname) else {
            return;
        };
        let (_, link) = self.attached.remove(at);
        if let Ok(prog) = self.xdp() {
            if let Err(e) = prog.detach(link) {
                tracing::warn!(interface = %ifname, error = %e, "detaching XDP failed");
            }
        }
    }

    /// Detaches every XDP link this process made.
    pub fn detach_all(&mut self) {
        let links: Vec<_> = self.attached.drain(..).collect();
        if let Ok(prog) = self.xdp() {
            for (ifname, link) in links {
                if let Err(e) = prog.detach(link) {
                    tracing::warn!(interface = %ifname, error = %e, "detaching XDP failed");
                }
            }
        }
    }

    /// The file descriptor of map `name` (batch reads and writes, fdinfo).
    pub fn map_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, LoadError> {
        let map = self.ebpf.map(name).ok_or(LoadError::Missing(name))?;
        let data = match map {
            Map::Array(d)
            | Map::PerCpuArray(d)
            | Map::PerCpuLruHashMap(d)
            | Map::PerCpuHashMap(d)
            | Map::LruHashMap(d)
            | Map::HashMap(d)
            | Map::Queue(d)
            | Map::ProgramArray(d)
            | Map::RingBuf(d) => d,
            _ => return Err(LoadError::Missing(name)),
        };
        Ok(data.fd().as_fd())
    }

    /// Every flow of the table, under its wide key.
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowStats)>, LoadError> {
        let mut out = Vec::new();
        self.for_each_flow(|key, stats| out.push((*key, *stats)))?;
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

    /// The FLOW_SLOTS index that FLOWS4, FLOWS_MID or FLOWS (by the key's shape) gives
    /// `key`'s flow, if it is in the table.
    pub fn flow_index(&self, key: &FlowKey) -> Result<Option<u32>, LoadError> {
        match ShapedKey::of(key) {
            ShapedKey::Plain4(k) => self.index_in(map::FLOWS4, &k),
            ShapedKey::Mid(k) => self.index_in(map::FLOWS_MID, &k),
            ShapedKey::Wide(k) => self.index_in(map::FLOWS, &k),
        }
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
            if self.flow_index(&slot.key)? == Some(i) {
                self.forget_key(&slot.key)?;
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

    /// Removes `key` from its flow table (already gone is fine).
    fn forget_key(&mut self, key: &FlowKey) -> Result<(), LoadError> {
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
    fn give_back(&mut self, indexes: &[u32]) -> Result<(), LoadError> {
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

    /// Zeroes slots `indexes`.
    fn zero_slots(&mut self, indexes: &[u32]) -> Result<(), LoadError> {
        for &i in indexes {
            self.write_slot(i, &FlowSlot::default())?;
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

    /// Empties the flow table and zeroes STATS (tests run many cases through one load).
    pub fn reset(&mut self) -> Result<(), LoadError> {
        self.empty_flow_map::<FlowKey4>(map::FLOWS4)?;
        self.empty_flow_map::<FlowKeyMid>(map::FLOWS_MID)?;
        self.empty_flow_map::<FlowKey>(map::FLOWS)?;
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

    /// Loads a tc program of the object (once) and returns its fd.
    pub fn tc_fd(&mut self, name: &'static str) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &mut SchedClassifier = typed_program_mut(&mut self.ebpf, name)?;
        if prog.fd().is_err() {
            prog.load().map_err(program_error(name))?;
        }
        Ok(prog.fd().map_err(program_error(name))?.as_fd())
    }

    /// A loaded tc program, for attaching.
    pub fn tc_program(&mut self, name: &'static str) -> Result<&mut SchedClassifier, LoadError> {
        self.tc_fd(name)?;
        typed_program_mut(&mut self.ebpf, name)
    }

    /// The generation the programs read now.
    fn generation(&self) -> Result<Generation, LoadError> {
        let g: Array<&MapData, Generation> = typed_map(&self.ebpf, map::GENERATION)?;
        g.get(&0, 0).map_err(map_error(map::GENERATION))
    }

    /// The policy the programs read now, its runtime configuration in `config`.
    pub fn active(&self) -> Result<Policy, LoadError> {
        let g = self.generation()?.active % GENERATIONS;
        let config: Array<&MapData, RuntimeConfig> = typed_map(&self.ebpf, map::CONFIG)?;
        let qos: Array<&MapData, QosConfig> = typed_map(&self.ebpf, map::QOS)?;
        let table: Array<&MapData, DscpEntry> = typed_map(&self.ebpf, map::POLICY)?;
        let mut policy = Policy {
            config: config.get(&g, 0).map_err(map_error(map::CONFIG))?,
            qos: qos.get(&g, 0).map_err(map_error(map::QOS))?,
            ..Policy::default()
        };
        for (dscp, entry) in policy.table.iter_mut().enumerate() {
            *entry = table
                .get(&(g * DSCP_COUNT + dscp as u32), 0)
                .map_err(map_error(map::POLICY))?;
        }
        Ok(policy)
    }

    /// Writes `config` and `policy` (its QOS and DSCP table) into the generation the
    /// programs do not read, then switches GENERATION to it: a packet sees the old
    /// policy or the new one, never a mix. (Two commits closer together than one
    /// packet's run could still meet one; commits come from a person or a file.)
    pub fn commit(&mut self, config: &RuntimeConfig, policy: &Policy) -> Result<(), LoadError> {
        let next = (self.generation()?.active + 1) % GENERATIONS;
        let mut c: Array<&mut MapData, RuntimeConfig> = typed_map_mut(&mut self.ebpf, map::CONFIG)?;
        c.set(next, *config, 0).map_err(map_error(map::CONFIG))?;
        let mut qos: Array<&mut MapData, QosConfig> = typed_map_mut(&mut self.ebpf, map::QOS)?;
        qos.set(next, policy.qos, 0).map_err(map_error(map::QOS))?;
        let mut table: Array<&mut MapData, DscpEntry> = typed_map_mut(&mut self.ebpf, map::POLICY)?;
        for (dscp, entry) in policy.table.iter().enumerate() {
            table
                .set(next * DSCP_COUNT + dscp as u32, *entry, 0)
                .map_err(map_error(map::POLICY))?;
        }
        let mut g: Array<&mut MapData, Generation> =
            typed_map_mut(&mut self.ebpf, map::GENERATION)?;
        let generation = Generation {
            active: next,
            layout: LAYOUT_VERSION,
        };
        g.set(0, generation, 0).map_err(map_error(map::GENERATION))
    }

    /// Writes the host QoS policy (QOS and POLICY); the runtime configuration stays.
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), LoadError> {
        let config = self.active()?.config;
        self.commit(&config, policy)
    }

    /// Sets what the tc programs do on interface `ifindex` (None: nothing): in
    /// IFACE_QOS_DIRECT below `IFACE_DIRECT`, in the IFACE_QOS hash above.
    pub fn set_iface_qos(&mut self, ifindex: u32, qos: Option<IfaceQos>) -> Result<(), LoadError> {
        if ifindex < IFACE_DIRECT {
            let mut direct: Array<&mut MapData, IfaceQos> =
                typed_map_mut(&mut self.ebpf, map::IFACE_QOS_DIRECT)?;
            return direct
                .set(ifindex, qos.unwrap_or_default(), 0)
                .map_err(map_error(map::IFACE_QOS_DIRECT));
        }
        let mut ifaces: HashMap<&mut MapData, u32, IfaceQos> =
            typed_map_mut(&mut self.ebpf, map::IFACE_QOS)?;
        match qos {
            Some(q) => ifaces
                .insert(ifindex, q, 0)
                .map_err(map_error(map::IFACE_QOS)),
            None => match ifaces.remove(&ifindex) {
                Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
                Err(source) => Err(map_error(map::IFACE_QOS)(source)),
            },
        }
    }

    /// Fills (or empties) the TC_TAIL slot of `tc_egress_flows`. Emptied, `tc_egress`
    /// decides and rewrites as before but counts no egress flow (its tail call finds
    /// nothing): the benchmarks measure the policy decision alone that way. A load
    /// fills it.
    pub fn set_egress_flow_counting(&mut self, on: bool) -> Result<(), LoadError> {
        set_egress_flows_slot(&mut self.ebpf, on)
    }

    /// The interfaces IFACE_QOS_DIRECT and IFACE_QOS give something to do.
    pub fn iface_qos_indexes(&self) -> Result<Vec<u32>, LoadError> {
        let direct: Array<&MapData, IfaceQos> = typed_map(&self.ebpf, map::IFACE_QOS_DIRECT)?;
        let mut out = Vec::new();
        for i in 0..IFACE_DIRECT {
            let q = direct
                .get(&i, 0)
                .map_err(map_error(map::IFACE_QOS_DIRECT))?;
            if !q.is_off() {
                out.push(i);
            }
        }
        let hashed: HashMap<&MapData, u32, IfaceQos> = typed_map(&self.ebpf, map::IFACE_QOS)?;
        for key in hashed.keys() {
            out.push(key.map_err(map_error(map::IFACE_QOS))?);
        }
        Ok(out)
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

    /// Writes CONFIG: the programs read it on their next packet (e.g. a new
    /// `events_sample`); the policy stays.
    pub fn set_config(&mut self, config: &RuntimeConfig) -> Result<(), LoadError> {
        let policy = self.active()?;
        self.commit(config, &policy)
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

    /// The names of the object's maps and programs (sorted), to check them against
    /// `roce_common::names`.
    pub fn object_names(&self) -> (Vec<String>, Vec<String>) {
        let mut maps: Vec<String> = self.ebpf.maps().map(|(n, _)| n.to_string()).collect();
        let mut programs: Vec<String> = self.ebpf.programs().map(|(n, _)| n.to_string()).collect();
        maps.sort();
        programs.sort();
        (maps, programs)
    }
}

impl Loaded {
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

    /// Removes every entry of one flow map.
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
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.detach_all();
    }
}
