//! The real programs with their EVENTS ring buffer taken out and read by the test:
//! frames through `xdp_classify` and `tc_egress` (BPF_PROG_TEST_RUN), then the records
//! they wrote and the STATS they counted.

use aya::maps::{MapData, RingBuf};
use roce_agent::datapath::loader::{load, KernelHelpers, LoadOptions, Loaded, TC_EGRESS};
use roce_agent::datapath::testrun::{test_run, TestRun};
use roce_common::config::RuntimeConfig;
use roce_common::counters::{
    STAT_EVENTS_CE, STAT_EVENTS_DROPPED_RATE_LIMIT, STAT_EVENTS_DROPPED_RING_FULL,
    STAT_EVENTS_PSN_GAP,
};
use roce_common::event::{EventRecord, EVENTS_RING_BYTES, EVENT_KIND_COUNT};
use roce_common::policy::{IfaceQos, Policy};

use crate::harness::{pin_to_current_cpu, XDP_PASS};
use crate::hex;
use crate::tc::{SKB_CTX_LEN, TC_NEXT, TEST_RUN_IFINDEX};

/// Options of one harness.
#[derive(Clone, Copy, Debug)]
pub struct EventsOptions {
    /// `RuntimeConfig::events_sample`.
    pub sample: u32,
    /// `RuntimeConfig::rtt_spike_us`.
    pub rtt_spike_us: u32,
    pub ring_bytes: u32,
    /// What `tc_egress` does on the test interface (loopback).
    pub iface: IfaceQos,
    /// `LoadOptions::helpers` (None: this kernel's).
    pub helpers: Option<KernelHelpers>,
}

impl Default for EventsOptions {
    fn default() -> Self {
        EventsOptions {
            sample: 1,
            rtt_spike_us: roce_common::config::DEFAULT_RTT_SPIKE_US,
            ring_bytes: EVENTS_RING_BYTES,
            iface: IfaceQos::default(),
            helpers: None,
        }
    }
}

/// Events counted in STATS: written by kind (ce .. rtt_spike), dropped by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventStats {
    pub emitted: [u64; EVENT_KIND_COUNT],
    pub rate_limit: u64,
    pub ring_full: u64,
}

impl EventStats {
    pub fn emitted_total(&self) -> u64 {
        self.emitted.iter().sum()
    }
}

pub struct EventsHarness {
    loaded: Loaded,
    ring: RingBuf<MapData>,
}

impl EventsHarness {
    /// Loads the object with events on (`opts.sample`), `tc_egress` configured on the
    /// test interface, and takes the ring buffer. Panics without root.
    pub fn load(opts: EventsOptions) -> Self {
        pin_to_current_cpu();
        let load_opts = LoadOptions {
            config: RuntimeConfig {
                events_sample: opts.sample,
                rtt_spike_us: opts.rtt_spike_us,
                ..RuntimeConfig::default()
            },
            events_ring_bytes: opts.ring_bytes,
            helpers: opts.helpers,
            ..LoadOptions::default()
        };
        let mut loaded = match load(&load_opts) {
            Ok(l) => l,
            Err(e) => panic!("loading the eBPF object (these tests need root): {e}"),
        };
        if let Err(e) = loaded.tc_fd(TC_EGRESS) {
            panic!("loading tc_egress: {e}");
        }
        if let Err(e) = loaded.set_policy(&Policy::default()) {
            panic!("writing the policy: {e}");
        }
        if let Err(e) = loaded.set_iface_qos(TEST_RUN_IFINDEX, Some(opts.iface)) {
            panic!("writing IFACE_QOS: {e}");
        }
        let ring = match loaded.take_events() {
            Ok(r) => r,
            Err(e) => panic!("taking EVENTS: {e}"),
        };
        EventsHarness { loaded, ring }
    }

    /// Runs `xdp_classify` `repeat` times on `frame`; asserts XDP_PASS and the packet
    /// unchanged (events never alter packets).
    pub fn xdp(&self, frame: &[u8], repeat: u32) {
        let fd = match self.loaded.xdp_fd() {
            Ok(fd) => fd,
            Err(e) => panic!("{e}"),
        };
        let run = TestRun {
            data: frame,
            repeat,
            ..Default::default()
        };
        let out = match test_run(fd, &run) {
            Ok(out) => out,
            Err(e) => panic!("BPF_PROG_TEST_RUN failed: {e}\n{}", hex(frame)),
        };
        assert_eq!(out.retval, XDP_PASS, "verdict\n{}", hex(frame));
        assert!(out.data == frame, "XDP changed the packet\n{}", hex(frame));
    }

    /// Runs `tc_egress` once on `frame`; asserts TC_NEXT and returns the bytes it left.
    pub fn tc_egress(&mut self, frame: &[u8]) -> Vec<u8> {
        let ctx = [0u8; SKB_CTX_LEN];
        let fd = match self.loaded.tc_fd(TC_EGRESS) {
            Ok(fd) => fd,
            Err(e) => panic!("{e}"),
        };
        let run = TestRun {
            data: frame,
            repeat: 1,
            ctx_in: Some(&ctx),
            ctx_out_len: SKB_CTX_LEN,
        };
        let out = match test_run(fd, &run) {
            Ok(out) => out,
            Err(e) => panic!("BPF_PROG_TEST_RUN of tc_egress failed: {e}\n{}", hex(frame)),
        };
        assert_eq!(out.retval, TC_NEXT, "verdict\n{}", hex(frame));
        out.data
    }

    /// Records written into and read out of the ring, from the kernel's positions.
    pub fn progress(&self) -> roce_agent::telemetry::ring_progress::Progress {
        use std::os::fd::AsFd;
        match roce_agent::telemetry::ring_progress::RingProgress::map(self.ring.as_fd()) {
            Ok(p) => p.read(),
            Err(e) => panic!("{e}"),
        }
    }

    /// Every record in the ring now, oldest first (the ring is empty afterwards).
    pub fn drain(&mut self) -> Vec<EventRecord> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            match roce_agent::telemetry::events_reader::decode(&item) {
                Some(rec) => out.push(rec),
                None => panic!("a ring item of {} bytes is no EventRecord", item.len()),
            }
        }
        out
    }

    pub fn stats(&self) -> EventStats {
        let v = match self.loaded.stats() {
            Ok(v) => v,
            Err(e) => panic!("reading STATS: {e}"),
        };
        let mut s = EventStats::default();
        for (i, slot) in s.emitted.iter_mut().enumerate() {
            *slot = v[STAT_EVENTS_CE as usize + i];
        }
        assert_eq!(STAT_EVENTS_CE + 4, STAT_EVENTS_PSN_GAP);
        assert_eq!(
            STAT_EVENTS_CE as usize + EVENT_KIND_COUNT,
            STAT_EVENTS_DROPPED_RATE_LIMIT as usize
        );
        s.rate_limit = v[STAT_EVENTS_DROPPED_RATE_LIMIT as usize];
        s.ring_full = v[STAT_EVENTS_DROPPED_RING_FULL as usize];
        s
    }

    pub fn loaded_mut(&mut self) -> &mut Loaded {
        &mut self.loaded
    }
}
