//! The two engines that count a capture's frames. Both end in `(FlowKey, FlowStats)`
//! pairs and the STATS vector:
//! - `kernel`: the real `xdp_classify` program, run on each frame through
//!   BPF_PROG_TEST_RUN, its FLOWS and STATS maps read at the end;
//! - `reference`: [`ReferenceTable`], the same `classify` and `FlowStats::record`
//!   in user space.

use std::collections::HashMap;

use roce_common::classify::{walk, Layers, Outcome, Walk};
use roce_common::config::RuntimeConfig;
use roce_common::counters::{reason_index, Reason, STATS_LEN};
use roce_common::flow::{FlowKey, FlowStats};
use roce_common::packet::SlicePacket;
use roce_common::reference::ReferenceTable;
use roce_common::wire::ETH_HLEN;

use super::capture::Frame;
use super::AnalyzeError;
use crate::loader::{self, LoadOptions, Loaded};
use crate::testrun::{test_run, TestRun};

/// Frames shorter than this cannot go through BPF_PROG_TEST_RUN (EINVAL); both
/// engines count them as `truncated_eth` without classifying them.
pub const MIN_TEST_RUN_LEN: usize = ETH_HLEN;

/// Which classifier engine counts the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// The real XDP program, run on each frame through BPF_PROG_TEST_RUN.
    Kernel,
    /// The reference classifier of `roce_common` (no privileges needed).
    Reference,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Kernel => "kernel",
            Engine::Reference => "reference",
        })
    }
}

/// What an engine counted: flows (keys normalised: no interface, no direction) and
/// the STATS vector.
pub struct Counted {
    pub flows: Vec<(FlowKey, FlowStats)>,
    pub stats: Vec<u64>,
}

/// One engine, fed frame by frame.
pub enum Counter {
    Reference(Box<ReferenceTable>),
    Kernel {
        loaded: Box<Loaded>,
        /// Frames too short for BPF_PROG_TEST_RUN.
        short: u64,
        /// The CPU affinity to restore at the end.
        affinity: Option<libc::cpu_set_t>,
    },
}

/// Pins the calling thread to the CPU it runs on: FLOWS is a per-CPU map, and one
/// flow's PSN state must not be split between CPUs. Returns the previous mask.
fn pin_to_current_cpu() -> Option<libc::cpu_set_t> {
    // SAFETY: plain libc calls on a zeroed cpu_set_t of the right size.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) != 0 {
            return None;
        }
        Some(old)
    }
}

fn restore_affinity(old: &libc::cpu_set_t) {
    // SAFETY: restores a mask that sched_getaffinity returned.
    unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), old);
    }
}

impl Counter {
    pub fn new(engine: Engine, opts: &LoadOptions) -> Result<Counter, AnalyzeError> {
        Ok(match engine {
            Engine::Reference => Counter::Reference(Box::new(ReferenceTable::new(opts.config))),
            Engine::Kernel => {
                // No ring-buffer reader here: the program emits no events.
                let opts = LoadOptions {
                    config: RuntimeConfig {
                        events_sample: roce_common::event::EVENTS_OFF,
                        ..opts.config
                    },
                    ..*opts
                };
                let loaded = loader::load(&opts)?;
                Counter::Kernel {
                    loaded: Box::new(loaded),
                    short: 0,
                    affinity: pin_to_current_cpu(),
                }
            }
        })
    }

    /// Counts one frame; returns the reference classifier's walk of it for the tally
    /// (computed once: the reference engine returns its own).
    pub fn frame(&mut self, f: &Frame<'_>, cfg: &RuntimeConfig) -> Result<Walk, AnalyzeError> {
        match self {
            Counter::Reference(t) => Ok(t.process(f.data, 0, f.ts_ns)),
            Counter::Kernel { loaded, short, .. } => {
                if f.data.len() < MIN_TEST_RUN_LEN {
                    *short += 1;
                    return Ok(Walk {
                        outcome: Outcome::Malformed(Reason::TruncatedEth),
                        layers: Layers::default(),
                    });
                }
                let fd = loaded.xdp_fd()?;
                test_run(
                    fd,
                    &TestRun {
                        data: f.data,
                        repeat: 1,
                        ..Default::default()
                    },
                )
                .map_err(|source| AnalyzeError::TestRun {
                    frame: f.number,
                    source,
                })?;
                Ok(walk(&SlicePacket(f.data), cfg))
            }
        }
    }

    pub fn finish(self) -> Result<Counted, AnalyzeError> {
        match self {
            Counter::Reference(t) => Ok(Counted {
                flows: t.flows.into_iter().collect(),
                stats: t.stats.to_vec(),
            }),
            Counter::Kernel {
                loaded,
                short,
                affinity,
            } => {
                if let Some(old) = &affinity {
                    restore_affinity(old);
                }
                let mut stats = loaded.stats()?;
                stats.resize(STATS_LEN as usize, 0);
                stats[reason_index(Reason::TruncatedEth) as usize] += short;
                // Test runs arrive on the loopback device: drop the interface.
                let mut merged: HashMap<FlowKey, FlowStats> = HashMap::new();
                for (mut k, st) in loaded.flows()? {
                    k.ifindex = 0;
                    merged.entry(k).or_default().merge(&st);
                }
                Ok(Counted {
                    flows: merged.into_iter().collect(),
                    stats,
                })
            }
        }
    }
}
