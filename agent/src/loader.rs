//! Loading the kernel object, filling CONFIG, attaching XDP, and reading FLOWS/STATS
//! (the EVENTS ring buffer is taken out by `events_reader`). Loading, attaching and
//! reading are separate steps; links detach when dropped.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

use aya::maps::{
    Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues, ProgramArray,
    RingBuf,
};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{Program, ProgramError, SchedClassifier, Xdp, XdpMode};
use aya::Ebpf;
use roce_common::config::RuntimeConfig;
use roce_common::counters::STATS_LEN;
use roce_common::event::EVENTS_RING_BYTES;
use roce_common::flow::{FlowKey, FlowKey4, FlowStats};
use roce_common::policy::{IfaceQos, Policy, VtepKey, VtepStats, IFACE_DIRECT};

use crate::batch::{self, PerCpuReader};
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
        source: crate::batch::BatchError,
    },
    #[error("counting the possible CPUs ({what}): {source}")]
    Cpus {
        what: &'static str,
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
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            flows_max_entries: 65536,
            config: RuntimeConfig::default(),
            events_ring_bytes: EVENTS_RING_BYTES,
        }
    }
}

/// How an XDP program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    Native,
    Generic,
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
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
    attached: Vec<(String, XdpLinkId)>,
    /// FLOWS4 and FLOWS are read a chunk at a time; its buffers are reused.
    reader: Mutex<PerCpuReader>,
    flows_max_entries: usize,
}

/// One entry of a flow map as read: its key as the map holds it.
#[derive(Clone, Copy, Debug)]
pub enum FlowRef<'a> {
    /// FLOWS4: a plain IPv4 flow.
    Compact(&'a FlowKey4),
    /// FLOWS: IPv6 or tunnelled (or plain IPv4 that an older kernel side put there).
    Wide(&'a FlowKey),
}

impl FlowRef<'_> {
    /// The wide key of the flow, as the flows document shows it.
    pub fn wide(&self) -> FlowKey {
        match self {
            FlowRef::Compact(k) => k.widen(),
            FlowRef::Wide(k) => **k,
        }
    }
}

/// Loads the object built from `ebpf/`, writes CONFIG, loads `xdp_classify` (not
/// attached yet) and `tc_egress_flows` (never attached: `tc_egress` tail-calls it
/// through TC_TAIL, filled here).
pub fn load(opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let mut ebpf = aya::EbpfLoader::new()
        .map_max_entries(map::FLOWS, opts.flows_max_entries)
        .map_max_entries(map::FLOWS4, opts.flows_max_entries)
        .map_max_entries(map::EVENTS, opts.events_ring_bytes)
        .load(crate::EBPF_OBJECT)?;
    let mut config: Array<&mut MapData, RuntimeConfig> = typed_map_mut(&mut ebpf, map::CONFIG)?;
    config
        .set(0, opts.config, 0)
        .map_err(map_error(map::CONFIG))?;
    let prog: &mut Xdp = typed_program_mut(&mut ebpf, XDP_PROGRAM)?;
    prog.load().map_err(program_error(XDP_PROGRAM))?;
    let flows: &mut SchedClassifier = typed_program_mut(&mut ebpf, TC_EGRESS_FLOWS)?;
    flows.load().map_err(program_error(TC_EGRESS_FLOWS))?;
    let flows_fd = flows
        .fd()
        .map_err(program_error(TC_EGRESS_FLOWS))?
        .try_clone()
        .map_err(|source| LoadError::Fd {
            name: TC_EGRESS_FLOWS,
            source,
        })?;
    let mut tail: ProgramArray<&mut MapData> = typed_map_mut(&mut ebpf, map::TC_TAIL)?;
    tail.set(TC_TAIL_EGRESS_FLOWS, &flows_fd, 0)
        .map_err(map_error(map::TC_TAIL))?;
    let cpus = aya::util::nr_cpus().map_err(|(what, source)| LoadError::Cpus { what, source })?;
    Ok(Loaded {
        ebpf,
        attached: Vec::new(),
        reader: Mutex::new(PerCpuReader::new(batch::DEFAULT_CHUNK, cpus)),
        flows_max_entries: opts.flows_max_entries as usize,
    })
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
    /// driver has no native XDP.
    pub fn attach_xdp(&mut self, ifname: &str) -> Result<AttachMode, LoadError> {
        if crate::netif::index_of(ifname).is_none() {
            return Err(LoadError::NoInterface(ifname.to_string()));
        }
        let prog = self.xdp()?;
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
        self.attached.push((ifname.to_string(), link));
        Ok(mode)
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

    /// The file descriptor of map `name` (batch reads and writes on it).
    pub fn map_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, LoadError> {
        match self.ebpf.map(name).ok_or(LoadError::Missing(name))? {
            Map::PerCpuLruHashMap(data)
            | Map::PerCpuHashMap(data)
            | Map::LruHashMap(data)
            | Map::HashMap(data) => Ok(data.fd().as_fd()),
            _ => Err(LoadError::Missing(name)),
        }
    }

    /// Every flow of FLOWS4 and FLOWS with its CPUs merged, under its wide key.
    pub fn flows(&self) -> Result<Vec<(FlowKey, FlowStats)>, LoadError> {
        let mut out = Vec::new();
        self.for_each_flow(|key, stats| out.push((key.wide(), *stats)))?;
        Ok(out)
    }

    /// Calls `f` with every entry of FLOWS4 and then FLOWS, its CPUs merged; returns
    /// how many entries there were. Read a chunk of entries per syscall, so that the
    /// memory it takes does not grow with the tables.
    pub fn for_each_flow(
        &self,
        mut f: impl FnMut(FlowRef<'_>, &FlowStats),
    ) -> Result<usize, LoadError> {
        // A poisoned lock only means a reader panicked mid-read: its buffers are fine.
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let max = self.flows_max_entries;
        let compact = reader
            .read::<FlowKey4, FlowStats>(self.map_fd(map::FLOWS4)?, max, |k, per_cpu| {
                f(FlowRef::Compact(k), &merge_cpu_slice(per_cpu))
            })
            .map_err(|source| LoadError::Batch {
                name: map::FLOWS4,
                source,
            })?;
        let wide = reader
            .read::<FlowKey, FlowStats>(self.map_fd(map::FLOWS)?, max, |k, per_cpu| {
                f(FlowRef::Wide(k), &merge_cpu_slice(per_cpu))
            })
            .map_err(|source| LoadError::Batch {
                name: map::FLOWS,
                source,
            })?;
        Ok(compact.entries + wide.entries)
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

    /// Empties FLOWS and zeroes STATS (tests run many cases through one load).
    pub fn reset(&mut self) -> Result<(), LoadError> {
        self.empty_flow_map::<FlowKey4>(map::FLOWS4)?;
        self.empty_flow_map::<FlowKey>(map::FLOWS)?;
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

    /// Writes the host QoS policy: QOS (DSCPs written) and POLICY (per-DSCP entries).
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), LoadError> {
        let mut qos: Array<&mut MapData, roce_common::policy::QosConfig> =
            typed_map_mut(&mut self.ebpf, map::QOS)?;
        qos.set(0, policy.qos, 0).map_err(map_error(map::QOS))?;
        let mut table: Array<&mut MapData, roce_common::policy::DscpEntry> =
            typed_map_mut(&mut self.ebpf, map::POLICY)?;
        for (dscp, entry) in policy.table.iter().enumerate() {
            table
                .set(dscp as u32, *entry, 0)
                .map_err(map_error(map::POLICY))?;
        }
        Ok(())
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
    /// `events_sample`).
    pub fn set_config(&mut self, config: &RuntimeConfig) -> Result<(), LoadError> {
        let mut map: Array<&mut MapData, RuntimeConfig> =
            typed_map_mut(&mut self.ebpf, map::CONFIG)?;
        map.set(0, *config, 0).map_err(map_error(map::CONFIG))
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
    /// Removes every entry of one flow map.
    fn empty_flow_map<K: aya::Pod>(&mut self, name: &'static str) -> Result<(), LoadError> {
        let keys: Vec<K> = {
            let map: PerCpuHashMap<&MapData, K, FlowStats> = typed_map(&self.ebpf, name)?;
            map.keys().filter_map(Result::ok).collect()
        };
        let mut flows: PerCpuHashMap<&mut MapData, K, FlowStats> =
            typed_map_mut(&mut self.ebpf, name)?;
        for k in keys {
            // An LRU entry may already be gone; that is what we want anyway.
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

/// Merges one flow's per-CPU values.
pub fn merge_cpus(per_cpu: &PerCpuValues<FlowStats>) -> FlowStats {
    merge_cpu_slice(per_cpu)
}

/// Merges one flow's per-CPU values, as a batch read hands them over.
pub fn merge_cpu_slice(per_cpu: &[FlowStats]) -> FlowStats {
    let mut total = FlowStats::default();
    for v in per_cpu {
        total.merge(v);
    }
    total
}
