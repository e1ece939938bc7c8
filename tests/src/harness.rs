//! The real `xdp_classify` program, loaded once per harness and run on single frames
//! through BPF_PROG_TEST_RUN (no interface, no traffic, nothing pinned).
//!
//! The harness pins its thread to the CPU it is on, as one NIC queue (one CPU) carries
//! one flow in real life; STATS and the event sampling countdowns are per CPU, so a
//! test's figures then never depend on scheduling. (A flow's own counters and PSN
//! state are shared by all CPUs: `xdp_scenarios.rs` runs one flow on two CPUs.)

use std::collections::BTreeMap;

use roce_agent::datapath::loader::{load, LoadOptions, Loaded};
use roce_agent::datapath::testrun::{test_run, TestRun, TestRunOutput};
use roce_common::flow::FlowStats;
use roce_common::key::{FlowKey, FlowKeyMirror};
use roce_common::names::program::{XDP_CLASSIFY, XDP_MIRROR};

use crate::hex;

/// XDP_PASS: the only verdict `xdp_classify` ever returns.
pub const XDP_PASS: u32 = 2;

pub struct Harness {
    loaded: Loaded,
    /// The program run: `xdp_classify`, or `xdp_mirror` (`load_mirror`).
    program: &'static str,
}

impl Harness {
    /// Loads the program with default options. Panics (these are tests) when the
    /// process may not load BPF programs: run as root.
    pub fn load() -> Self {
        Self::load_with(&LoadOptions::default())
    }

    pub fn load_with(opts: &LoadOptions) -> Self {
        pin_to_current_cpu();
        let loaded = match load(opts) {
            Ok(l) => l,
            Err(e) => panic!("loading xdp_classify (these tests need root): {e}"),
        };
        Harness {
            loaded,
            program: XDP_CLASSIFY,
        }
    }

    /// The harness of `xdp_mirror`, the program of mirror collector interfaces.
    pub fn load_mirror() -> Self {
        Self::load_mirror_with(&LoadOptions::default())
    }

    pub fn load_mirror_with(opts: &LoadOptions) -> Self {
        let mut h = Self::load_with(opts);
        if let Err(e) = h.loaded.xdp_mirror_fd() {
            panic!("loading xdp_mirror: {e}");
        }
        h.program = XDP_MIRROR;
        h
    }

    /// Runs the program once on `frame`.
    pub fn run(&self, frame: &[u8]) -> TestRunOutput {
        let fd = self
            .loaded
            .loaded_xdp_fd(self.program)
            .expect("the program is loaded");
        let run = TestRun {
            data: frame,
            repeat: 1,
            ..Default::default()
        };
        match test_run(fd, &run) {
            Ok(out) => out,
            Err(e) => panic!("BPF_PROG_TEST_RUN failed: {e}\n{}", hex(frame)),
        }
    }

    /// Runs `frame` and asserts the verdict is XDP_PASS and the packet left unchanged.
    pub fn pass(&self, frame: &[u8]) {
        let out = self.run(frame);
        assert_eq!(
            out.retval,
            XDP_PASS,
            "verdict for frame of {} bytes:\n{}",
            frame.len(),
            hex(frame)
        );
        assert!(
            out.data == frame,
            "the program changed the packet\nin:\n{}out:\n{}",
            hex(frame),
            hex(&out.data)
        );
    }

    /// Every flow with CPUs merged, sorted by key.
    pub fn flows(&self) -> BTreeMap<FlowKey, FlowStats> {
        match self.loaded.flows() {
            Ok(v) => v.into_iter().collect(),
            Err(e) => panic!("reading FLOWS: {e}"),
        }
    }

    /// Every mirrored flow (FLOWS_MIRROR's, from the slots and MIRROR_TAGS), sorted.
    pub fn mirrored_flows(&self) -> BTreeMap<FlowKeyMirror, FlowStats> {
        match self.loaded.mirrored_flows() {
            Ok(v) => v.into_iter().collect(),
            Err(e) => panic!("reading the mirrored flows: {e}"),
        }
    }

    /// STATS summed over CPUs.
    pub fn stats(&self) -> Vec<u64> {
        match self.loaded.stats() {
            Ok(v) => v,
            Err(e) => panic!("reading STATS: {e}"),
        }
    }

    /// Empties the flow table and zeroes STATS.
    pub fn reset(&mut self) {
        if let Err(e) = self.loaded.reset() {
            panic!("resetting the maps: {e}");
        }
        assert!(self.flows().is_empty(), "FLOWS not empty after reset");
    }

    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The loaded programs, to drive the flow table's upkeep (`maintain_flows`).
    pub fn loaded_mut(&mut self) -> &mut Loaded {
        &mut self.loaded
    }
}

/// Pins the calling thread to the CPU it runs on.
pub fn pin_to_current_cpu() {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return;
    }
    if let Err(e) = roce_testkit::sock::pin_thread_to_cpu(cpu as usize) {
        panic!("sched_setaffinity: {e}");
    }
}
