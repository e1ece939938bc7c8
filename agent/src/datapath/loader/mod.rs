//! Loading the kernel object: its maps (sized by [`LoadOptions`], reused from the pin
//! directory when one is given, refused when of another layout version), its
//! programs, and the first generation of CONFIG, QOS and POLICY. What the loaded
//! object then does lives beside this file, each an `impl Loaded` of its own:
//!
//! - `programs`: program fds, attaching XDP, pinned links, detaching, TC_TAIL.
//! - `flows`: the flow table's upkeep (reading, evicting, giving slots back).
//! - `policy`: CONFIG, QOS, POLICY a generation at a time, and IFACE_QOS.
//! - `counters`: what the programs report (STATS, VTEPS, the EVENTS ring buffer).
//! - `helpers`: the helpers newer than 5.10 the kernel has, probed before loading.
//!
//! Loading, attaching and reading are separate steps. Without a pin directory the
//! links detach when dropped. With one (`pin::PinDir`) maps, programs and links are
//! pinned there: a load reuses the pinned maps, and an attach to an interface that
//! already has a pinned link swaps the program inside that link atomically, so the
//! datapath never pauses across agent restarts.

mod counters;
mod flows;
mod helpers;
mod policy;
mod programs;

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{Map, MapError};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{Program, ProgramError, SchedClassifier, Xdp};
use aya::Ebpf;
use roce_common::config::RuntimeConfig;
use roce_common::event::EVENTS_RING_BYTES;
use roce_common::names::map;
pub use roce_common::names::program::{
    TC_BASELINE, TC_EGRESS, TC_EGRESS_FLOWS, TC_INGRESS, XDP_BASELINE, XDP_CLASSIFY as XDP_PROGRAM,
    XDP_MIRROR,
};

use crate::config::Settings;
use crate::datapath::flow_table::FlowSlots;
use crate::datapath::pin::{PinDir, PinError};

pub use flows::flow_tables_kernel_bytes;
pub use helpers::KernelHelpers;
pub use programs::AttachMode;

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
    /// The helpers newer than 5.10 the programs may call. None probes the running
    /// kernel (the agent); tests force `KernelHelpers::NONE` to run the fallbacks.
    pub helpers: Option<KernelHelpers>,
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
            helpers: None,
        }
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
    /// XDP links this process owns (unpinned: they detach with it): interface,
    /// program, link.
    attached: Vec<(String, &'static str, XdpLinkId)>,
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
    let helpers = opts.helpers.unwrap_or_else(KernelHelpers::probe);
    helpers.log_fallbacks();
    let globals = helpers.globals();
    let mut loader = aya::EbpfLoader::new();
    for (name, value) in &globals {
        loader.override_global(name, value, true);
    }
    loader
        .map_max_entries(map::FLOWS, opts.flows_max_entries)
        .map_max_entries(map::FLOWS4, opts.flows_max_entries)
        .map_max_entries(map::FLOWS_MID, opts.flows_max_entries)
        .map_max_entries(map::FLOWS_MIRROR, opts.flows_max_entries)
        .map_max_entries(map::MIRROR_TAGS, opts.flows_max_entries)
        .map_max_entries(map::TUNNEL_PORTS, opts.flows_max_entries)
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
    // What it tail-calls to count a RoCE packet.
    programs::load_xdp_count(&mut ebpf)?;
    // A pinned datapath always has it: `pin_programs` pins it, and an adopted
    // `tc_egress` tail-calls it.
    if opts.egress_flows || pins.is_some() {
        let flows: &mut SchedClassifier = typed_program_mut(&mut ebpf, TC_EGRESS_FLOWS)?;
        flows.load().map_err(program_error(TC_EGRESS_FLOWS))?;
        programs::set_egress_flows_slot(&mut ebpf, true)?;
    }
    let slots = flows::map_slots(&ebpf)?;
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

impl Loaded {
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

impl Drop for Loaded {
    fn drop(&mut self) {
        self.detach_all();
    }
}
